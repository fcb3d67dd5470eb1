"""create_buffer with a 'dataset' section: the buffer is built without it and filled; the section's keys are
checked; a failing load closes the new buffer and raises; with 'distributed' it is refused."""

import numpy as np
import pytest
from dataset_files import assert_transition, d4rl_arrays, d4rl_expected, dingengine_transitions, pickle_file, write_h5

from ding_buffer import create_buffer, get_buffer_cls


@pytest.fixture
def d4rl_file(tmp_path):
    arrays = d4rl_arrays(np.random.default_rng(0))
    return write_h5(tmp_path / 'hopper.hdf5', arrays), arrays


def test_the_section_fills_the_buffer(d4rl_file):
    path, arrays = d4rl_file
    cfg = dict(type='naive', replay_buffer_size=10**3, dataset=dict(path=str(path), format='d4rl', chunk_size=4))
    buffer = create_buffer(cfg)
    assert 'dataset' not in buffer.cfg and 'dataset' in cfg  # removed from what the preset saw, not from the caller's
    expected = d4rl_expected(arrays)
    batch = buffer.sample(len(expected))  # list storage, every item once
    assert len(batch) == len(expected)
    got = sorted(batch, key=lambda t: float(t['reward']))
    for i, (g, w) in enumerate(zip(got, sorted(expected, key=lambda t: float(t['reward'])))):
        assert_transition(g, w, f'transition {i}')


def test_the_path_may_be_a_pathlib_path_as_load_dataset_takes_it(d4rl_file):
    path, arrays = d4rl_file
    buffer = create_buffer(dict(type='naive', replay_buffer_size=10**3, dataset=dict(path=path, format='d4rl')))
    assert buffer.count() == len(d4rl_expected(arrays))


def test_a_none_section_is_no_dataset():
    assert create_buffer(dict(type='naive', dataset=None)).count() == 0


def test_unknown_key_names_the_closest(d4rl_file):
    with pytest.raises(
        ValueError, match=r"unknown config key 'dataset.chunksize' \(value 4\); did you mean 'dataset.chunk_size'"
    ):
        create_buffer(dict(type='naive', dataset=dict(path=str(d4rl_file[0]), chunksize=4)))
    with pytest.raises(ValueError, match=r"config key 'dataset.path' is required"):
        create_buffer(dict(type='naive', dataset=dict(format='d4rl')))
    with pytest.raises(ValueError, match=r"config key 'dataset' must be a dict"):
        create_buffer(dict(type='naive', dataset='hopper.hdf5'))


def test_allow_pickle_comes_from_the_config(tmp_path):
    path = str(pickle_file(tmp_path / 'expert.pkl', dingengine_transitions(np.random.default_rng(1))))
    with pytest.raises(ValueError, match='allow_pickle=True'):
        create_buffer(dict(type='naive', dataset=dict(path=path)))
    assert create_buffer(dict(type='naive', dataset=dict(path=path, allow_pickle=True))).count() == 7


def test_a_failing_load_closes_the_new_buffer_and_raises(tmp_path, monkeypatch):
    arrays = d4rl_arrays(np.random.default_rng(2))
    del arrays['rewards']
    path = str(write_h5(tmp_path / 'bad.hdf5', arrays))
    cls = get_buffer_cls(dict(type='advanced'))
    closed = []
    original = cls.close
    monkeypatch.setattr(cls, 'close', lambda self: closed.append(self) or original(self))
    with pytest.raises(ValueError, match=r"key 'rewards' is missing"):
        create_buffer(dict(type='advanced', dataset=dict(path=path)))
    assert len(closed) == 1


def test_with_distributed_it_is_refused(d4rl_file):
    cfg = dict(type='naive', dataset=dict(path=str(d4rl_file[0])), distributed=dict(backend='torch'))
    with pytest.raises(ValueError, match=r"config keys 'dataset' and 'distributed' do not combine"):
        create_buffer(cfg)

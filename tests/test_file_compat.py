"""Files written by the version before the composable engine (``tests/data/v0``, made by commit 70d9a36 with
the configs below) still load: contents, ids, counters and priorities come back, and the buffer works on."""

import json
import os
import pathlib

import numpy as np
import pytest
import torch

from ding_buffer import create_buffer

DATA = pathlib.Path(__file__).resolve().parent / 'data' / 'v0'
EXPECTED = json.loads((DATA / 'expected.json').read_text())


def item(i):
    return {'obs': torch.tensor([float(i), 1.0]), 'action': torch.tensor(i % 3), 'collect_iter': i}


@pytest.mark.parametrize('kind', ['list', 'tensor'])
def test_naive_file(kind):
    buf = create_buffer(dict(type='naive', replay_buffer_size=6, seed=1, storage=dict(type=kind)))
    buf.load_data(str(DATA / f'naive_{kind}.pt'), allow_pickle=kind == 'list')
    want = EXPECTED[f'naive_{kind}']
    assert buf.count() == want['count'] and buf.push_count == want['push_count']
    assert buf.stats()['push_items'] == 9 and buf.stats()['remove_count'] == 3  # derived from the saved ring
    out = buf.sample(6)
    obs = [float(x['obs'][0]) for x in out] if kind == 'list' else out['obs'][:, 0].tolist()
    assert sorted(obs) == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert buf.push(item(9)) == 1 and buf.count() == 6


@pytest.mark.parametrize('kind', ['list', 'tensor'])
def test_advanced_file(kind):
    buf = create_buffer(dict(type='advanced', replay_buffer_size=6, seed=1, storage=dict(type=kind)))
    buf.load_data(str(DATA / f'advanced_{kind}.pt'), allow_pickle=kind == 'list')
    want = EXPECTED[f'advanced_{kind}']
    stats = buf.stats()
    assert buf.count() == want['count']
    for key, value in want['stats'].items():
        assert stats[key] == pytest.approx(value), key
    out = buf.sample(6)  # stratified over the priority mass: the largest priority is drawn
    use = out['use'].tolist() if kind == 'tensor' else [x['use'] for x in out]
    assert min(use) >= 1  # use counts restored and counted on
    priority = out['priority'].tolist() if kind == 'tensor' else [x['priority'] for x in out]
    assert max(priority) == pytest.approx(5.0 + 1e-5, rel=1e-4)  # the saved update survives


@pytest.mark.parametrize('kind', ['list', 'tensor'])
def test_episode_file(kind):
    buf = create_buffer(dict(type='episode', replay_buffer_size=4, max_transitions=30, seed=1, storage=dict(type=kind)))
    buf.load_data(str(DATA / f'episode_{kind}.pt'), allow_pickle=kind == 'list')
    want = EXPECTED[f'episode_{kind}']
    assert buf.count() == want['count'] and buf.episode_len == want['episode_len']
    out = buf.sample(4, unroll_len=3, replace=True)
    assert out is not None
    buf.push({'obs': torch.zeros(4, 1)})
    assert buf.count() == min(want['count'] + 1, 4)


@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_gflownet_file(btype):
    buf = create_buffer(dict(type=btype, replay_buffer_size=5, seed=1))
    buf.load_data(str(DATA / f'{btype}.pt'))
    want = EXPECTED[btype]
    assert buf.count() == want['count']
    assert np.allclose(sorted(buf.log_rewards().tolist()), want['log_rewards'])
    assert buf.sample(3)['state'].shape == (3, 3)
    state = buf.state_dict()
    other = create_buffer(dict(type=btype, replay_buffer_size=5, seed=1))
    other.load_state_dict(state)  # re-saved in the current layout, it round-trips
    assert torch.equal(other.sample(4)['state'], buf.sample(4)['state'])


@pytest.mark.parametrize('umask', [0o022, 0o027, 0o002])
def test_saved_files_follow_the_umask(tmp_path, umask):
    """save_data (and the checkpoints built on it) create files as open() would: 0666 minus the umask, not the
    0600 of a temporary file."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor')))
    buf.push({'x': torch.zeros(2)})
    old = os.umask(umask)
    try:
        buf.save_data(str(tmp_path / 'buf.pt'))
    finally:
        os.umask(old)
    assert (tmp_path / 'buf.pt').stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_chunk_file_with_numpy_arrays_written_under_numpy_1_loads(tmp_path):
    """``tests/data/numpy1/chunk_disk.pt``: a chunk buffer with a disk store saved under numpy 1.26, whose arrays'
    pickles name ``numpy.core.multiarray`` (numpy 2's are ``numpy._core.multiarray``): both names are read."""
    buf = create_buffer(
        dict(type='chunk', fragments_per_chunk=2, seed=0, store=dict(type='disk', path=str(tmp_path / 'store')))
    )
    buf.load_data(str(DATA.parent / 'numpy1' / 'chunk_disk.pt'))
    fragments = sorted(buf.sample(4), key=lambda f: f['fid'])
    assert [f['fid'] for f in fragments] == [0, 1, 2, 3]
    for k, f in enumerate(fragments):
        assert isinstance(f['data']['obs'], np.ndarray) and f['data']['act'] == k
        np.testing.assert_array_equal(f['data']['obs'], np.arange(6, dtype=np.float32).reshape(2, 3) + k)

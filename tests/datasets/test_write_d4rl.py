"""write_d4rl writes the D4RL layout from a dict of arrays or a list of episodes, atomically; load_dataset reads
back what it wrote."""

import os

import numpy as np
import pytest
import torch
from dataset_files import assert_transition, d4rl_expected, stored_episodes, stored_transitions
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.datasets import load_dataset, write_d4rl

h5py = pytest.importorskip('h5py')


def read(path):
    with h5py.File(path, 'r') as f:
        return {k: f[k][:] for k in f.keys()}


def test_dict_of_arrays_in_either_names(tmp_path):
    rng = np.random.default_rng(0)
    data = dict(
        obs=rng.standard_normal((5, 3)), action=torch.zeros(5, 2), reward=[1.0, 2, 3, 4, 5], done=[0, 0, 1, 0, 0]
    )
    assert write_d4rl(tmp_path / 'a.hdf5', data) == 5
    got = read(tmp_path / 'a.hdf5')
    assert sorted(got) == ['actions', 'observations', 'rewards', 'terminals', 'timeouts']
    assert np.array_equal(got['observations'], data['obs']) and got['terminals'].dtype == np.bool_
    assert not got['timeouts'].any()
    buffer = create_buffer(dict(type='naive', storage=dict(type='tensor')))
    assert load_dataset(buffer, tmp_path / 'a.hdf5', progress=False) == 4  # the unfinished last step is dropped
    for i, (g, w) in enumerate(zip(stored_transitions(buffer), d4rl_expected(got))):
        assert_transition(g, w, f'transition {i}')


def test_a_list_of_episodes_round_trips_as_episodes(tmp_path):
    rng = np.random.default_rng(1)
    as_dicts = [  # a policy's episodes: one terminated, one cut by a time limit, one just stopped
        {'obs': rng.standard_normal((n, 2)), 'action': rng.integers(0, 3, n), 'reward': rng.standard_normal(n),
         'next_obs': rng.standard_normal((n, 2)), 'done': np.arange(n) == n - 1 if end == 'done' else np.zeros(n, bool),
         'timeout': np.arange(n) == n - 1 if end == 'timeout' else np.zeros(n, bool)}
        for n, end in ((3, 'done'), (4, 'timeout'), (2, None))
    ]  # fmt: skip
    as_steps = [[{k: v[t] for k, v in ep.items()} for t in range(len(ep['obs']))] for ep in as_dicts]
    empty = {k: v[:0] for k, v in as_dicts[0].items()}  # episodes with no step, in each form, are skipped
    for data in (as_dicts, as_steps, [[], empty] + as_dicts[:2] + [{}] + as_dicts[2:]):
        write_d4rl(tmp_path / 'eps.hdf5', data)
        got = read(tmp_path / 'eps.hdf5')
        assert got['timeouts'].tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 1]  # the stopped episode ends with a timeout
        buffer = create_buffer(dict(type='episode', max_transitions=100, storage=dict(type='tensor')))
        assert load_dataset(buffer, tmp_path / 'eps.hdf5', progress=False) == 3
        episodes = stored_episodes(buffer)
        assert [len(e['obs']) for e in episodes] == [3, 4, 2]
        for ep, want in zip(episodes, as_dicts):
            assert torch.equal(ep['obs'], torch.from_numpy(want['obs']))
            assert torch.equal(ep['next_obs'], torch.from_numpy(want['next_obs']))


def test_bad_input_writes_nothing_and_keeps_the_old_file(tmp_path):
    path = tmp_path / 'keep.hdf5'
    write_d4rl(path, dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=np.zeros(2), done=[0, 1]))
    before = path.read_bytes()
    for data, match in (
        (dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=np.zeros(2)), r"missing 'terminals'"),
        (dict(obs=np.zeros((2, 1)), action=np.zeros(3), reward=np.zeros(2), done=[0, 1]), r"'actions' has \(3,\) rows"),
        (dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=['a', 'b'], done=[0, 1]), r"key 'reward' has dtype <U1"),
        (
            dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=np.zeros(2), done=[0, 2]),
            r"'terminals' must hold one bool",
        ),
        (
            dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=np.zeros(2), done=[0, 1], info=[1, 2]),
            r"has key 'info'",
        ),
        ('episodes', r'expected a dict of arrays or a list of episodes'),
        (dict(obs=np.zeros((0, 3)), action=np.zeros(0), reward=np.zeros(0), done=[]), r"holds no step"),
        (dict(obs=1.0, action=[1.0], reward=[1.0], done=[0]), r"'observations' is one number"),
    ):
        with pytest.raises(ValueError, match=match):
            write_d4rl(path, data)
    assert path.read_bytes() == before


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / 'keep.hdf5'
    data = dict(obs=np.zeros((2, 1)), action=np.zeros(2), reward=np.zeros(2), done=[0, 1])
    write_d4rl(path, data)
    before = path.read_bytes()

    def broken(self, *args, **kwargs):
        raise OSError('disk full')

    monkeypatch.setattr(h5py.Group, 'create_dataset', broken)
    with pytest.raises(OSError, match='disk full'):
        write_d4rl(path, data)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ['keep.hdf5']


def test_steps_with_other_keys_than_their_episodes_first_are_named(tmp_path):
    """Episodes as lists of step dicts: a step missing a key, or with one more, is a ValueError naming the episode,
    the step and the keys (a raw KeyError, or a key silently dropped, before)."""
    step = dict(obs=np.zeros(2, np.float32), action=0, reward=1.0, next_obs=np.zeros(2, np.float32), done=False)
    for bad in ({k: v for k, v in step.items() if k != 'next_obs'}, dict(step, info=1)):
        episode = [dict(step), dict(step), dict(step, done=True)]
        episode[1] = bad
        with pytest.raises(ValueError, match=r"episode 0 step 1 has keys"):
            write_d4rl(str(tmp_path / 'x.hdf5'), [episode])


def test_a_damaged_byte_in_the_data_of_a_written_file_is_refused(tmp_path):
    """Every dataset carries HDF5's per-chunk checksum: a flipped bit in the values (not only in a header) is
    refused, naming the file and key, with nothing stored."""
    obs = np.arange(1000 * 11, dtype=np.float32).reshape(1000, 11)
    done = np.zeros(1000, bool)
    done[199::200] = True
    path = tmp_path / 'a.hdf5'
    write_d4rl(path, dict(obs=obs, action=np.zeros((1000, 3), np.float32), reward=np.zeros(1000), done=done))
    raw = bytearray(path.read_bytes())
    at = raw.find(obs.reshape(-1)[5000:5003].tobytes())  # observation values, stored where HDF5 put them
    assert at > 0
    raw[at + 2] ^= 0x10
    path.write_bytes(bytes(raw))
    buffer = create_buffer(dict(type='naive', replay_buffer_size=2000, storage=dict(type='tensor')))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=r"a\.hdf5': key 'observations' cannot be read"):
        load_dataset(buffer, path, progress=False)
    assert_same(buffer.state_dict(), before)


def test_an_episode_mixing_tensors_arrays_and_numbers_is_written(tmp_path):
    """Steps of a list episode whose field is a tensor in one step and an array in the next raised a bare
    AttributeError; a dtype numpy lacks (bfloat16) raised torch's TypeError without naming the field."""
    path = str(tmp_path / 'mixed.hdf5')
    episode = [
        dict(obs=torch.zeros(3), action=0, reward=torch.tensor(1.0), next_obs=np.ones(3, np.float32), done=False),
        dict(obs=np.ones(3, np.float32), action=1, reward=2.0, next_obs=-torch.ones(3), done=True),
    ]
    assert write_d4rl(path, [episode]) == 2
    got = read(path)
    assert got['observations'].tolist() == [[0.0] * 3, [1.0] * 3]
    assert got['next_observations'].tolist() == [[1.0] * 3, [-1.0] * 3]
    assert got['rewards'].tolist() == [1.0, 2.0] and got['terminals'].tolist() == [False, True]
    bad = [dict(step, obs=torch.zeros(3, dtype=torch.bfloat16)) for step in episode]
    with pytest.raises(ValueError, match="obs.*not an array of numbers of one shape"):
        write_d4rl(str(tmp_path / 'bad.hdf5'), [bad])
    assert not os.path.exists(tmp_path / 'bad.hdf5')


def test_a_damaged_chunk_index_of_a_written_file_is_refused_not_read_as_zeros(tmp_path):
    """A flipped bit in a column's chunk index (its B-tree node's count of entries) made HDF5 miss the chunk and
    read its fill value, checksums unchecked: ``terminals`` all false (two episodes read as one), or zeroed
    observations. Each damaged file is refused, naming the key, with nothing stored."""
    done = np.zeros(40, bool)
    done[[19, 38]] = True
    path = tmp_path / 'a.hdf5'
    write_d4rl(path, dict(obs=np.ones((40, 3), np.float32), action=np.ones((40, 2)), reward=np.ones(40), done=done))
    raw = path.read_bytes()
    nodes = [i for i in range(len(raw)) if raw.startswith(b'TREE', i) and raw[i + 4] == 1]  # (type 1: chunk index)
    assert len(nodes) == 5
    buffer = create_buffer(dict(type='episode', max_transitions=100, storage=dict(type='tensor')))
    before = buffer.state_dict()
    for at in nodes:
        damaged = bytearray(raw)
        damaged[at + 6] ^= 0x02  # the entries-used count: 1 -> 3
        path.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match=r"a\.hdf5': key '\w+' has 3 stored chunks .* which needs 1"):
            load_dataset(buffer, path, progress=False)
        assert_same(buffer.state_dict(), before)


def test_extended_precision_floats_are_refused_naming_the_field(tmp_path):
    path = tmp_path / 'x.hdf5'
    data = dict(obs=np.zeros((3, 2), np.float32), action=np.zeros(3), reward=np.zeros(3, np.longdouble), done=[0, 0, 1])
    with pytest.raises(
        ValueError, match=r"write_d4rl: data: key 'reward' has dtype float128; expected .*at most 64 bits"
    ):
        write_d4rl(path, data)
    write_d4rl(path, dict(data, reward=np.zeros(3)))
    with h5py.File(path, 'r+') as f:  # another writer's file
        del f['rewards']
        f['rewards'] = np.zeros(3, np.longdouble)
    buffer = create_buffer(dict(type='naive', storage=dict(type='tensor')))
    with pytest.raises(ValueError, match=r"x\.hdf5': key 'rewards' has dtype float128, expected .*at most 64 bits"):
        load_dataset(buffer, path, progress=False)
    assert len(buffer) == 0


def test_a_key_mismatch_names_the_callers_episodes_past_an_empty_one(tmp_path):
    step = dict(obs=np.zeros(2, np.float32), action=0, reward=1.0, done=True)
    with pytest.raises(ValueError, match=r"episode 2 has the keys .*, episode 1 "):
        write_d4rl(tmp_path / 'x.hdf5', [[], [step], [dict(step, next_obs=np.zeros(2, np.float32))]])


def test_another_writers_column_with_unwritten_chunks_loads_as_its_fill_value(tmp_path):
    """HDF5 leaves chunks never written out of the index (they read as the fill value): a flag column written only
    where true is a valid file, unlike ``write_d4rl``'s, whose checksummed columns store every chunk."""
    path = tmp_path / 'sparse.hdf5'
    with h5py.File(path, 'w') as f:
        f['observations'] = np.zeros((1000, 2), np.float32)
        f['actions'] = np.zeros(1000, np.int64)
        f['rewards'] = np.zeros(1000, np.float32)
        t = f.create_dataset('terminals', shape=(1000,), dtype=bool, chunks=(100,), compression='gzip')
        t[199] = t[499] = t[999] = True
    episodes = create_buffer(dict(type='episode', max_transitions=2000, storage=dict(type='tensor')))
    assert load_dataset(episodes, path, progress=False) == 3
    assert episodes.episode_len == [200, 300, 500]


def test_a_file_larger_than_the_room_is_refused_before_writing(tmp_path):
    """HDF5 crashes the process when a write fails at its close: the room is checked first."""
    import resource
    import signal

    path = str(tmp_path / 'd.hdf5')
    n = 5000
    data = dict(obs=np.zeros((n, 17), np.float32), action=np.zeros((n, 6), np.float32), reward=np.zeros(n))
    data['done'] = np.zeros(n, bool)
    write_d4rl(path, {k: v[:10] for k, v in data.items()})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
    try:
        with pytest.raises(OSError, match='limited to 200000') as err:
            write_d4rl(path, data)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert err.value.filename == path and os.listdir(tmp_path) == ['d.hdf5']
    buffer = create_buffer(dict(type='naive', replay_buffer_size=100))
    assert load_dataset(buffer, path, progress=False) == 9  # (the unfinished last step is dropped)

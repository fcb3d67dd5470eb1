"""load_dataset stores every transition of every layout, as each buffer type takes them, and each stored item equals
the file's (read back through state_dict(), or sampling everything for frames)."""

import numpy as np
import pytest
import torch
from dataset_files import (
    assert_episode,
    assert_transition,
    d4rl_arrays,
    d4rl_expected,
    dingengine_arrays,
    dingengine_expected,
    dingengine_transitions,
    episodes_of,
    minari_expected,
    minari_file,
    pickle_file,
    stored_episodes,
    stored_transitions,
    write_h5,
)
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.datasets import load_dataset, write_d4rl

SLOT_TYPES = [('naive', 'list'), ('naive', 'tensor'), ('advanced', 'list'), ('advanced', 'tensor')]
EPISODE_TYPES = [('episode', 'list'), ('episode', 'tensor')]


def make(kind, storage, **extra):
    cfg = dict(type=kind, replay_buffer_size=100, storage=dict(type=storage), **extra)
    if kind == 'episode' and storage == 'tensor':
        cfg['max_transitions'] = 1000
    return create_buffer(cfg)


def check_slots(buffer, expected):
    got = stored_transitions(buffer)
    assert len(got) == len(expected), (len(got), len(expected))
    for i, (g, w) in enumerate(zip(got, expected)):
        assert_transition(g, w, f'transition {i}')


def check_episodes(buffer, expected):
    want = episodes_of(expected)
    got = stored_episodes(buffer)
    assert len(got) == len(want), (len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        assert_episode(g, w, f'episode {i}')


def check(buffer, expected, returned):
    if buffer.capabilities()['item_kind'] == 'episode':
        check_episodes(buffer, expected)
        assert returned == len(episodes_of(expected))
    else:
        check_slots(buffer, expected)
        assert returned == len(expected)


@pytest.mark.parametrize('next_obs', [True, False], ids=['next_observations', 'shifted'])
@pytest.mark.parametrize('kind,storage', SLOT_TYPES + EPISODE_TYPES)
def test_d4rl_every_transition(tmp_path, kind, storage, next_obs):
    rng = np.random.default_rng(0)
    arrays = d4rl_arrays(rng, next_obs=next_obs)
    path = write_h5(tmp_path / 'hopper.hdf5', arrays)
    buffer = make(kind, storage)
    returned = load_dataset(buffer, path, format='d4rl', chunk_size=4, progress=False)  # episodes span chunks
    check(buffer, d4rl_expected(arrays), returned)


def test_d4rl_without_next_observations_drops_timeout_steps_and_marks_the_step_before(tmp_path):
    # episodes: terminal after 3, timeout after 4, terminal after 1, unfinished 3 -> 11 rows, 9 transitions
    arrays = d4rl_arrays(np.random.default_rng(1), next_obs=False)
    path = write_h5(tmp_path / 'd.hdf5', arrays)
    buffer = make('naive', 'tensor')
    assert load_dataset(buffer, path, progress=False) == 9  # format told from the file
    got = stored_transitions(buffer)
    obs = arrays['observations']
    # the terminal step keeps its step, next_obs zeros (done masks it)
    assert bool(got[2]['done']) and torch.equal(got[2]['next_obs'], torch.zeros(3))
    # the timeout step (row 6) is gone; row 5 now ends its episode with timeout set and its real next obs
    assert torch.equal(got[5]['obs'], torch.from_numpy(obs[5])) and bool(got[5]['timeout'])
    assert torch.equal(got[5]['next_obs'], torch.from_numpy(obs[6])) and not bool(got[5]['done'])
    assert torch.equal(got[6]['obs'], torch.from_numpy(obs[7]))  # the one-step terminal episode
    # the file's last row has no next observation: dropped, the one before marked
    assert torch.equal(got[-1]['obs'], torch.from_numpy(obs[9])) and bool(got[-1]['timeout'])


def test_d4rl_without_timeouts_key(tmp_path):
    arrays = d4rl_arrays(np.random.default_rng(2), ends=(('t', 2), (None, 3)))
    del arrays['timeouts']
    path = write_h5(tmp_path / 'old.hdf5', arrays)
    buffer = make('naive', 'list')
    load_dataset(buffer, path, progress=False)
    check_slots(buffer, d4rl_expected(dict(arrays, timeouts=np.zeros(5, bool))))


@pytest.mark.parametrize('kind,storage', SLOT_TYPES + EPISODE_TYPES)
def test_minari_nested_observations(tmp_path, kind, storage):
    rng = np.random.default_rng(3)
    episodes = minari_file(tmp_path / 'main_data.hdf5', rng)
    buffer = make(kind, storage)
    returned = load_dataset(buffer, tmp_path / 'main_data.hdf5', chunk_size=2, progress=False)
    check(buffer, minari_expected(episodes), returned)  # episode_10 last: ids in numeric order


@pytest.mark.parametrize('kind,storage', SLOT_TYPES + EPISODE_TYPES)
def test_dingengine_hdf5(tmp_path, kind, storage):
    arrays = dingengine_arrays(np.random.default_rng(4))
    path = write_h5(tmp_path / 'expert_demos.hdf5', arrays)
    buffer = make(kind, storage)
    returned = load_dataset(buffer, path, chunk_size=4, progress=False)
    check(buffer, dingengine_expected(arrays), returned)


@pytest.mark.parametrize('kind,storage', SLOT_TYPES + EPISODE_TYPES)
def test_dingengine_pickle(tmp_path, kind, storage):
    items = dingengine_transitions(np.random.default_rng(5))
    path = pickle_file(tmp_path / 'expert.pkl', items)
    buffer = make(kind, storage)
    returned = load_dataset(buffer, path, chunk_size=3, allow_pickle=True, progress=False)
    last = len(items) - 1
    expected = [dict(t, done=torch.tensor(t['done']), _end=t['done'] or i == last) for i, t in enumerate(items)]
    if storage == 'list':  # list storage keeps the file's objects as they are
        expected = [dict(t, _end=e['_end']) for t, e in zip(items, expected)]
    check(buffer, expected, returned)


@pytest.mark.parametrize('kind', ['elastic', 'sequence', 'deque', 'prioritized_episode'])
def test_the_other_types_of_transitions_and_episodes(tmp_path, kind):
    arrays = d4rl_arrays(np.random.default_rng(6))
    path = write_h5(tmp_path / 'd.hdf5', arrays)
    extra = dict(max_transitions=100) if kind == 'prioritized_episode' else {}
    buffer = create_buffer(dict(type=kind, replay_buffer_size=100, storage=dict(type='tensor'), **extra))
    expected = d4rl_expected(arrays)
    n = load_dataset(buffer, path, chunk_size=5, progress=False)
    assert n == (len(episodes_of(expected)) if kind == 'prioritized_episode' else len(expected))
    assert buffer.count() == n


def stacks(n_frames, stack=3, shape=(2, 2), seed=7):
    frames = np.random.default_rng(seed).integers(0, 255, (n_frames, *shape), dtype=np.uint8)
    return np.stack([frames[i : i + stack] for i in range(n_frames - stack + 1)])


@pytest.mark.parametrize('kind', ['naive', 'episode'])
@pytest.mark.parametrize('next_obs', [True, False], ids=['next_observations', 'shifted'])
def test_frames_buffer_gets_streams(tmp_path, kind, next_obs):
    """obs stacks whose frames overlap: each episode is one stream; the time-limit flag is the frames' truncated."""
    rng = np.random.default_rng(8)
    # two episodes in one run of frames: terminal after 4 steps, then 4 steps to a timeout (its own frames)
    first, second = stacks(7, seed=1), stacks(8, seed=2)
    obs = np.concatenate([first[:4], second[:5]])
    arrays = {
        'observations': obs,
        'actions': rng.integers(0, 3, 9),
        'rewards': rng.standard_normal(9).astype(np.float32),
        'terminals': np.array([0, 0, 0, 1, 0, 0, 0, 0, 0], bool),
        'timeouts': np.array([0, 0, 0, 0, 0, 0, 0, 0, 1], bool),
    }
    if next_obs:
        arrays['next_observations'] = np.concatenate([first[1:5], second[1:6]])
    path = write_h5(tmp_path / 'atari.hdf5', arrays)
    extra = dict(max_transitions=100) if kind == 'episode' else {}
    buffer = create_buffer(
        dict(type=kind, replay_buffer_size=100, storage=dict(type='tensor', frames=dict(stack=3)), **extra)
    )
    load_dataset(buffer, path, chunk_size=4, progress=False)
    expected = d4rl_expected(arrays, timeout_key='truncated', frames=True)
    if kind == 'naive':
        got = stored_transitions(buffer)
        assert len(got) == len(expected)
        for i, (g, w) in enumerate(zip(got, expected)):
            assert_transition(g, w, f'transition {i}')
    else:
        check_episodes(buffer, expected)


def test_memmap_storage(tmp_path):
    arrays = d4rl_arrays(np.random.default_rng(9), ends=(('t', 40), ('o', 30), (None, 30)))
    path = write_h5(tmp_path / 'big.hdf5', arrays)
    buffer = create_buffer(
        dict(type='naive', replay_buffer_size=200, storage=dict(type='tensor', memmap_dir=str(tmp_path / 'mm')))
    )
    assert load_dataset(buffer, path, chunk_size=16, progress=False) == 100
    check_slots(buffer, d4rl_expected(arrays))
    buffer.close()


def test_limit_and_a_buffer_already_holding_items(tmp_path):
    arrays = d4rl_arrays(np.random.default_rng(10))
    path = write_h5(tmp_path / 'd.hdf5', arrays)
    buffer = make('naive', 'list')
    buffer.push({'earlier': 1})
    assert load_dataset(buffer, path, limit=5, chunk_size=2, progress=False) == 5
    got = stored_transitions(buffer)
    assert got[0] == {'earlier': 1}
    for i, (g, w) in enumerate(zip(got[1:], d4rl_expected(arrays)[:5])):
        assert_transition(g, w, f'transition {i}')
    episodes = make('episode', 'tensor')
    assert load_dataset(episodes, path, limit=5, progress=False) == 2  # 3 steps, then 2 of the next: an episode
    assert [len(e['obs']) for e in stored_episodes(episodes)] == [3, 2]


def test_progress_bar_counts_the_transitions(tmp_path, capsys):
    pytest.importorskip('tqdm')
    path = write_h5(tmp_path / 'd.hdf5', d4rl_arrays(np.random.default_rng(11)))
    load_dataset(make('naive', 'tensor'), path, progress=True)
    assert '11/11' in capsys.readouterr().err  # 11 rows, 11 transitions


@pytest.mark.parametrize('layout', ['minari', 'dingengine_hdf5', 'dingengine_pkl'])
def test_frames_buffer_gets_streams_from_the_other_layouts(tmp_path, layout):
    """Minari's and DI-engine's files of frame stacks fill a buffer with storage.frames too, every transition as in the
    file (Minari's truncation is the frames' truncated; DI-engine's episodes end after done)."""
    rng = np.random.default_rng(9)
    first, second = stacks(6, seed=3), stacks(7, seed=4)  # two runs of frames: 4 and 5 steps
    if layout == 'minari':
        episodes = []
        for eid, (run, n) in enumerate(((first, 3), (second, 4))):
            term, trunc = np.zeros(n, bool), np.zeros(n, bool)
            (term if eid == 0 else trunc)[-1] = True
            episodes.append(
                {
                    'observations': run[: n + 1],
                    'actions': rng.integers(0, 4, n),
                    'rewards': rng.standard_normal(n),
                    'terminations': term,
                    'truncations': trunc,
                }
            )
        write_h5(tmp_path / 'main_data.hdf5', {f'episode_{i}': ep for i, ep in enumerate(episodes)})
        path = tmp_path / 'main_data.hdf5'
        expected = [
            {('truncated' if k == 'timeout' else k): v for k, v in t.items()} for t in minari_expected(episodes)
        ]
    else:
        n1, n2 = 3, 4
        arrays = {
            'obs': np.concatenate([first[:n1], second[:n2]]),
            'action': rng.integers(0, 2, n1 + n2),
            'reward': rng.standard_normal(n1 + n2).astype(np.float32),
            'done': np.array([0, 0, 1, 0, 0, 0, 1], bool),
            'next_obs': np.concatenate([first[1 : n1 + 1], second[1 : n2 + 1]]),
        }
        expected = dingengine_expected(arrays)
        if layout == 'dingengine_hdf5':
            path = write_h5(tmp_path / 'expert_demos.hdf5', arrays)
        else:  # a list of transition dicts of tensors, as DI-engine's collectors pickle them
            rows = [{k: torch.from_numpy(np.asarray(v)) for k, v in t.items() if k != '_end'} for t in expected]
            path = pickle_file(tmp_path / 'expert.pkl', rows)
    buffer = create_buffer(
        dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor', frames=dict(stack=3)))
    )
    pickled = layout == 'dingengine_pkl'
    assert load_dataset(buffer, path, format=layout, chunk_size=2, allow_pickle=pickled, progress=False) == len(
        expected
    )
    got = stored_transitions(buffer)
    assert len(got) == len(expected)
    for i, (g, w) in enumerate(zip(got, expected)):
        assert_transition(g, w, f'{layout} transition {i}')
    buffer.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('chunk_size', [1, 2, 10])
def test_a_chunk_whose_rows_are_all_dropped_is_skipped(tmp_path, storage, chunk_size):
    """D4RL without next_observations drops each time-limit row (its next observation is unknown); a chunk holding
    only such rows pushed an empty batch, and tensor storage refused the whole load. Every chunk size loads the
    same 6 transitions."""
    n = 8
    timeouts = np.zeros(n, bool)
    timeouts[[4, 5]] = True  # row 5: a one-step episode ending by time limit
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    path = str(tmp_path / 'd.hdf5')
    write_d4rl(
        path,
        dict(
            observations=np.arange(2 * n, dtype=np.float32).reshape(n, 2),
            actions=np.zeros(n),
            rewards=np.zeros(n, np.float32),
            terminals=terminals,
            timeouts=timeouts,
        ),
    )
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, storage=dict(type=storage)))
    assert load_dataset(buf, path, chunk_size=chunk_size) == 6
    assert buf.count() == 6


@pytest.mark.parametrize('buffer_type', ['naive', 'episode'])
def test_columns_in_the_other_byte_order_load_as_native_values(tmp_path, buffer_type):
    """An HDF5 column written big-endian (another machine's file, or numpy's '>f4') loads with its values; torch
    holds only this machine's byte order, and the load failed midway naming the buffer."""
    n = 4
    obs = np.arange(2 * n, dtype='>f4').reshape(n, 2)
    terminals = np.zeros(n, bool)
    terminals[-1] = True
    path = str(tmp_path / 'be.hdf5')
    data = dict(observations=obs, actions=np.zeros(n), rewards=np.ones(n, '>f4'), terminals=terminals)
    write_d4rl(path, dict(data, next_observations=obs + 1))
    cfg = dict(type=buffer_type, replay_buffer_size=10, storage=dict(type='tensor'))
    if buffer_type == 'episode':
        cfg['max_transitions'] = 100
    buf = create_buffer(cfg)
    assert load_dataset(buf, path) == (n if buffer_type == 'naive' else 1)
    got = buf.sample(n)['obs'] if buffer_type == 'naive' else buf.sample(1)[0]['obs']
    assert sorted(got.reshape(-1).tolist()) == list(range(2 * n))


def test_an_hdf5_file_with_a_user_block_is_recognised(tmp_path):
    """HDF5 puts its signature after a user block (at 512, 1024, ...): the format is told from it, as from a file
    without one."""
    h5py = pytest.importorskip('h5py')
    n = 5
    path = str(tmp_path / 'ub.hdf5')
    with h5py.File(path, 'w', userblock_size=512) as f:
        f['observations'] = np.zeros((n, 2), np.float32)
        f['actions'] = np.zeros(n)
        f['rewards'] = np.zeros(n, np.float32)
        f['terminals'] = np.array([False] * (n - 1) + [True])
        f['next_observations'] = np.ones((n, 2), np.float32)
    buf = create_buffer(dict(type='naive', replay_buffer_size=10))
    assert load_dataset(buf, path) == n


def _stacks(start, n, stack=2):
    """``n`` stacks of ``stack`` consecutive 3x3 frames (frame value = its index from ``start``), and the next ones."""
    frames = np.arange(start, start + n + stack, dtype=np.uint8)[:, None, None].repeat(3, 1).repeat(3, 2)
    return tuple(np.stack([frames[t + a : t + a + stack] for t in range(n)]) for a in (0, 1))


def test_a_load_ending_on_an_unfinished_episode_leaves_no_frame_stream_open(tmp_path):
    """storage.frames: a file whose last episode is unfinished (or a load cut by `limit`) left the frame stream
    open, so the next load, or the first online step after a reset, was refused as not continuing it."""
    obs, nxt = _stacks(10, 6)
    terminals = np.zeros(6, bool)
    terminals[2] = True  # episode 1: rows 0-2; episode 2: rows 3-5, unfinished
    path = str(tmp_path / 'frames.hdf5')
    data = dict(observations=obs, next_observations=nxt, actions=np.zeros(6, np.int64), rewards=np.zeros(6, np.float32))
    write_d4rl(path, dict(data, terminals=terminals))
    cfg = dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor', frames=dict(stack=2)))
    buf = create_buffer(cfg)
    assert load_dataset(buf, path) == 6 and load_dataset(buf, path) == 6
    cut = create_buffer(cfg)
    assert load_dataset(cut, path, limit=2) == 2
    o, n = _stacks(200, 1)
    step = dict(obs=torch.from_numpy(o[0]), next_obs=torch.from_numpy(n[0]), action=torch.tensor(0))
    assert cut.push(dict(step, reward=torch.tensor(0.0), done=torch.tensor(False), truncated=torch.tensor(False))) == 1


def _two_episodes(tmp_path, rewards=None):
    """A D4RL file of two 3-step episodes of frame stacks (terminals after steps 2 and 5), the second's frames not
    continuing the first's; returns its path and the terminals."""
    obs, nxt = _stacks(10, 6)
    terminals = np.zeros(6, bool)
    terminals[[2, 5]] = True
    obs[3:] += 50
    nxt[3:] += 50
    path = str(tmp_path / 'frames.hdf5')
    rewards = np.zeros(6, np.float32) if rewards is None else rewards
    data = dict(observations=obs, next_observations=nxt, actions=np.zeros(6, np.int64), rewards=rewards)
    write_d4rl(path, dict(data, terminals=terminals))
    return path, terminals


def test_a_frames_buffer_reads_the_terminal_flag_under_its_done_key(tmp_path):
    """storage.frames.done_key names the terminal flag the streams end at; a dataset's terminals were always
    written as 'done', so with done_key='terminated' an episode's end was never seen and the next episode's first
    step was refused as not continuing it. An env_key (no dataset field names an environment) is refused first."""
    path, _ = _two_episodes(tmp_path)
    frames = dict(stack=2, done_key='terminated')
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor', frames=frames)))
    assert load_dataset(buf, path) == 6
    assert sorted(buf.sample(6)['terminated'].tolist()) == [False] * 4 + [True] * 2
    with_env = dict(frames, env_key='env_id')
    other = create_buffer(dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor', frames=with_env)))
    with pytest.raises(ValueError, match="storage.frames.env_key"):
        load_dataset(other, path)
    assert other.count() == 0


def test_a_frames_buffer_with_an_open_online_episode_takes_a_file_whose_first_step_starts_one(tmp_path):
    """The file's first step starts an episode: a load ends the buffer's open stream first (it was taken as the
    next step of that stream and refused), as it ends the streams after it."""
    import h5py

    def stk(ids):
        return np.array(ids, np.uint8)[:, None, None].repeat(2, 1).repeat(2, 2)

    n = 6
    path = tmp_path / 'frames.hdf5'
    with h5py.File(path, 'w') as f:
        f['observations'] = np.stack([stk([t + 1, t + 2, t + 3]) for t in range(n)])
        f['next_observations'] = np.stack([stk([t + 2, t + 3, t + 4]) for t in range(n)])
        f['actions'], f['rewards'] = np.zeros(n, np.float32), np.zeros(n, np.float32)
        f['terminals'] = np.arange(n) == n - 1
    cfg = dict(type='naive', replay_buffer_size=50, storage=dict(type='tensor', frames=dict(stack=3)))
    buf = create_buffer(cfg)
    online = dict(obs=stk([50, 50, 50]), action=np.float32(0), reward=np.float32(0), next_obs=stk([50, 50, 51]))
    buf.push(dict(online, done=False, truncated=False))  # an online episode in progress
    assert load_dataset(buf, path, progress=False) == n and buf.count() == n + 1
    fresh = create_buffer(cfg)
    load_dataset(fresh, path, progress=False)
    got = sorted(bytes(o) for o in buf.sample(n + 1, replace=False)['obs'].numpy())
    want = sorted([bytes(o) for o in fresh.sample(n, replace=False)['obs'].numpy()] + [bytes(stk([50, 50, 50]))])
    assert got == want  # the file's steps as a fresh buffer stores them, and the online one


def test_a_minari_episode_ending_without_a_flag_ends_its_frame_stream(tmp_path):
    """Each Minari group is an episode, but a group whose last step has neither termination nor truncation left
    the frame stream open: the next group's first step was refused as not continuing it, and the load failed."""
    import h5py

    def group(start, n, terminated):
        obs, nxt = _stacks(start, n)
        term = np.zeros(n, bool)
        term[-1] = terminated
        observations = np.concatenate([obs, nxt[-1:]])  # n + 1 rows
        return dict(
            observations=observations,
            actions=np.zeros(n, np.int64),
            rewards=np.ones(n, np.float32),
            terminations=term,
            truncations=np.zeros(n, bool),
        )

    path = tmp_path / 'main_data.hdf5'
    with h5py.File(path, 'w') as f:
        for i, ep in enumerate([group(10, 4, False), group(100, 3, True)]):
            for k, v in ep.items():
                f.create_dataset(f'episode_{i}/{k}', data=v)
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, storage=dict(type='tensor', frames=dict(stack=2))))
    assert load_dataset(buf, str(path), progress=False) == 7
    out = buf.sample(7, replace=False)
    flags = sorted(zip(out['obs'][:, 0, 0, 0].tolist(), out['done'].tolist(), out['truncated'].tolist()))
    assert flags[3] == (13, False, True) and flags[-1] == (102, True, False)  # each group's last step
    assert sum(t for _, _, t in flags) == 1 and sum(d for _, d, _ in flags) == 1


def test_an_episode_buffer_with_frames_stores_the_terminal_flag_under_its_done_key(tmp_path):
    """A frames buffer keeps the terminal flag under its done_key; episode buffers stored it as 'done', so an
    online episode with the configured name was refused after a load (or a load after one)."""
    path, _ = _two_episodes(tmp_path)
    frames = dict(stack=2, done_key='terminated', truncated_key='trunc')
    for kind, extra in (('episode', {}), ('prioritized_episode', dict(sampler=dict(type='prioritized', unroll_len=2)))):
        storage = dict(type='tensor', frames=frames)
        buf = create_buffer(dict(type=kind, replay_buffer_size=10, max_transitions=50, storage=storage, **extra))
        assert load_dataset(buf, path, progress=False) == 2
        keys = set(buf.sample(1, unroll_len=2))
        assert {'terminated', 'trunc'} <= keys and 'done' not in keys, sorted(keys)
        o, n = _stacks(200, 2)
        steps = dict(obs=torch.from_numpy(o), next_obs=torch.from_numpy(n), action=torch.zeros(2, dtype=torch.int64))
        flags = dict(reward=torch.zeros(2), terminated=torch.tensor([False, True]), trunc=torch.zeros(2, dtype=bool))
        assert buf.push(dict(steps, **flags)) == 1


def test_frames_flag_names_are_renamed_together_and_never_replace_a_field(tmp_path):
    """The flags go under storage.frames' done_key / truncated_key, renamed at once: truncated_key='done' turned
    the terminal flags into time-limit ones (D4RL: a bare TypeError), a done_key naming another field of the file
    replaced its values, and done_key=None (streams that never end at a terminal flag) failed mid-load."""
    path, terminals = _two_episodes(tmp_path, rewards=np.arange(6, dtype=np.float32))

    def frames_buffer(**frames):
        return create_buffer(
            dict(
                type='naive', replay_buffer_size=20, seed=0, storage=dict(type='tensor', frames=dict(stack=2, **frames))
            )
        )

    swapped = frames_buffer(done_key='terminal', truncated_key='done')
    assert load_dataset(swapped, path, progress=False) == 6
    out = swapped.sample(6, replace=False)
    order = out['reward'].argsort()
    assert out['terminal'][order].tolist() == terminals.tolist() and not out['done'].any()
    for frames, match in (
        (dict(done_key='reward'), "'storage.frames.done_key' is 'reward', a field the dataset holds too"),
        (dict(done_key=None), "'storage.frames.done_key' is None"),
        (dict(truncated_key=None), "'storage.frames.truncated_key' is None"),
    ):
        buf = frames_buffer(**frames)
        before = buf.state_dict()
        with pytest.raises(ValueError, match=match):
            load_dataset(buf, path, progress=False)
        assert_same(buf.state_dict(), before)


def test_a_dingengine_file_keeps_its_own_fields_and_a_flag_name_clash_is_refused_before_the_load(tmp_path):
    """DI-engine's files have no time-limit flag: a frames buffer with truncated_key=None takes them, and their own
    'timeout' array stays a field of that name. A done_key naming another array of the file is refused before
    anything changes, atomic or not (an online stream left open stays open)."""
    import h5py

    obs, nxt = _stacks(10, 6)
    obs[3:] += 50
    nxt[3:] += 50
    path = tmp_path / 'de.hdf5'
    with h5py.File(path, 'w') as f:
        f['obs'], f['next_obs'] = obs, nxt
        f['action'], f['reward'] = np.zeros(6, np.int64), np.arange(6, dtype=np.float32)
        f['done'] = np.arange(6) % 3 == 2
        f['timeout'] = f['terminated'] = np.full(6, 7, np.int64)

    def frames_buffer(**frames):
        return create_buffer(
            dict(
                type='naive', replay_buffer_size=20, seed=0, storage=dict(type='tensor', frames=dict(stack=2, **frames))
            )
        )

    buf = frames_buffer(truncated_key=None)
    assert load_dataset(buf, str(path), progress=False) == 6
    out = buf.sample(6, replace=False)
    assert out['timeout'].tolist() == [7] * 6 and sorted(out['done'].tolist()) == [False] * 4 + [True] * 2
    clash = frames_buffer(done_key='terminated')
    o, n = _stacks(200, 1)
    step = dict(obs=torch.from_numpy(o[0]), next_obs=torch.from_numpy(n[0]), action=torch.tensor(0), reward=0.0)
    clash.push(dict(step, terminated=False, truncated=False))  # an online episode left open
    before = clash.state_dict()
    with pytest.raises(ValueError, match="'storage.frames.done_key' is 'terminated', a field the dataset holds too"):
        load_dataset(clash, str(path), progress=False, atomic=False)
    assert_same(clash.state_dict(), before)

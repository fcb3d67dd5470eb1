"""storage.frames on the episode tables (``episode``, ``prioritized_episode``): every frame stored once, each
pushed episode a stream of its own; windows and whole episodes rebuilt exactly as pushed, through evictions by
episodes, transitions and frames, removals from the middle (max_use), restores and memmap files."""

import os

import numpy as np
import pytest
from helpers import FrameEnvs, assert_same

from ding_buffer import create_buffer

STACK, SIDE = 4, 5


def cfg_of(type_='episode', episodes=6, transitions=30, spare=None, **extra):
    frames = {} if spare is None else dict(spare=spare)
    cfg = dict(
        type=type_,
        replay_buffer_size=episodes,
        max_transitions=transitions,
        seed=0,
        storage=dict(type='tensor', frames=frames),
        **extra,
    )
    if type_ == 'prioritized_episode':
        cfg['sampler'] = dict(unroll_len=3)
    return cfg


class Episodes:
    """Whole episodes of one synthetic environment (random frames, repeated reset frames, ends by termination
    or truncation), each step with a unique ``step``."""

    def __init__(self, seed=0, max_len=9):
        self.envs = FrameEnvs(n_envs=1, seed=seed, max_len=max_len, side=SIDE)
        self.pushed = {}

    def one(self, as_dict=False):
        steps = []
        while True:
            s = self.envs.step(0)
            s['reward'] = np.float32(s['reward'])
            steps.append(s)
            self.pushed[s['step']] = s
            if s['done'] or s['truncated']:
                break
        if not as_dict:
            return steps
        return {k: np.stack([np.asarray(s[k]) for s in steps]) for k in steps[0]}


def check_windows(out, pushed, unroll_len):
    mask = out['mask']
    assert out['obs'].shape[1:] == (unroll_len, STACK, SIDE, SIDE)
    for i in range(mask.shape[0]):
        prev = None
        for j in range(unroll_len):
            if not mask[i, j]:
                assert not out['obs'][i, j].any() and not out['next_obs'][i, j].any()
                continue
            s = pushed[out['step'][i, j].item()]
            assert np.array_equal(out['obs'][i, j].numpy(), s['obs']), f"obs of step {s['step']}"
            assert np.array_equal(out['next_obs'][i, j].numpy(), s['next_obs']), f"next_obs of step {s['step']}"
            if prev is not None:  # a window is consecutive steps of one episode
                assert s['step'] == prev + 1
            prev = s['step']


def check_episodes(episodes, pushed):
    for ep in episodes:
        steps = ep['step'].tolist()
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        assert pushed[steps[-1]]['done'] or pushed[steps[-1]]['truncated']
        for t, s in enumerate(steps):
            assert np.array_equal(ep['obs'][t].numpy(), pushed[s]['obs'])
            assert np.array_equal(ep['next_obs'][t].numpy(), pushed[s]['next_obs'])


@pytest.mark.parametrize('spare', [None, 3], ids=['default-room', 'frames-short'])
@pytest.mark.parametrize('type_', ['episode', 'prioritized_episode'])
def test_windows_and_episodes_equal_the_pushed_steps_through_every_eviction(type_, spare):
    """Pushes of 1-3 episodes, as lists of steps and as dicts of time-stacked fields, with max_use removing
    episodes from the middle: every sampled window and whole episode equals what was pushed, and the table never
    holds more transitions or episodes than configured. With a tight frame ring (spare=3) the oldest episodes
    leave when the frames run short, before the transitions do."""
    eps = Episodes(seed=1)
    buf = create_buffer(cfg_of(type_, spare=spare, max_use=3))
    rows = 30 + (6 * STACK if spare is None else spare)  # the frame ring
    checked = 0
    for k in range(60):
        batch = [eps.one(as_dict=bool((k + j) % 2)) for j in range(1 + k % 3)]
        assert buf.push(batch) == len(batch)
        assert buf.count() <= 6 and buf.transition_count <= 30
        # each stored episode holds its steps' new frames plus one reset frame: all of them fit in the ring
        assert buf.transition_count + buf.count() <= rows
        out = buf.sample(4, unroll_len=3) if type_ == 'episode' else buf.sample(4)
        if out is not None:  # (None: no stored episode offers a window of 3 steps)
            check_windows(out, eps.pushed, 3)
            checked += 1
        if type_ == 'episode' and buf.count() >= 2:
            check_episodes(buf.sample(2), eps.pushed)
    assert checked > 40 and buf.stats()['removed_by_use'] > 0
    buf.close()


def test_each_frame_is_stored_once():
    """A frame is stored once: the bytes a transition takes are about one frame, not two stacks of four."""
    eps = Episodes(seed=2, max_len=30)
    buf = create_buffer(cfg_of(episodes=8, transitions=200))
    for _ in range(20):
        buf.push([eps.one()])
    per_item = buf.storage.nbytes_per_item()
    assert SIDE * SIDE <= per_item < 2 * SIDE * SIDE + 100, per_item
    buf.close()


def test_a_broken_episode_is_refused_and_a_push_stores_all_or_nothing():
    """An episode whose obs does not follow the previous step's next_obs, or whose next_obs is not obs shifted by
    one frame, is refused naming the item; a push with one such episode stores none of its episodes."""
    eps = Episodes(seed=3, max_len=6)
    buf = create_buffer(cfg_of())
    buf.push([eps.one()])
    before = buf.state_dict()
    good, bad = eps.one(), eps.one()
    while len(bad) < 2:
        bad = eps.one()
    bad[1] = dict(bad[1], obs=np.zeros_like(bad[1]['obs']) + 7)
    with pytest.raises(ValueError, match='episode 1: item 1'):
        buf.push([good, bad])
    assert_same(buf.state_dict(), before)
    shifted = [dict(s) for s in good]
    shifted[0]['next_obs'] = np.zeros_like(shifted[0]['next_obs']) + 9
    with pytest.raises(ValueError, match='shifted by one frame'):
        buf.push([shifted])
    assert_same(buf.state_dict(), before)
    other = [dict(s, obs=s['obs'][:, :3], next_obs=s['next_obs'][:, :3]) for s in eps.one()]
    with pytest.raises(ValueError, match='episode 1'):
        create_buffer(cfg_of()).push([eps.one(), other])
    buf.push([good])  # the table takes the next good episode
    check_episodes(buf.sample(2), eps.pushed)
    buf.close()


@pytest.mark.parametrize('type_', ['episode', 'prioritized_episode'])
def test_state_round_trip_and_memmap(type_, tmp_path):
    """A restored table samples the same and goes on identically; with memmap_dir the frames live in a file that
    close removes."""
    eps = Episodes(seed=4)
    cfg = cfg_of(type_)
    cfg['storage']['memmap_dir'] = str(tmp_path)
    buf = create_buffer(cfg)
    for _ in range(12):
        buf.push([eps.one()])
    assert any('frames' in f for f in os.listdir(tmp_path))
    state = buf.state_dict()
    again = create_buffer(cfg_of(type_))
    again.load_state_dict(state)
    assert_same(again.state_dict(), state)
    nxt = [eps.one()]
    buf.push(nxt)
    again.push(nxt)
    assert_same(again.state_dict(), buf.state_dict())
    out = again.sample(3, unroll_len=3) if type_ == 'episode' else again.sample(3)
    check_windows(out, eps.pushed, 3)
    if type_ == 'prioritized_episode':
        ids = {k: out[k] for k in ('replay_unique_id', 'replay_buffer_idx')}
        res = again.update(dict(ids, priority=np.ones((3, 3))))
        assert res['updated'] > 0
    buf.close()
    again.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    'cfg, needle',
    [
        (dict(cfg_of(), storage=dict(type='tensor', frames=dict(n_step=3))), "'storage.frames.n_step' is 3"),
        (dict(cfg_of(), storage=dict(type='list', frames={})), "'storage.frames' needs storage.type='tensor'"),
    ],
)
def test_what_an_episode_table_cannot_take_is_refused_by_name(cfg, needle):
    with pytest.raises(ValueError, match=needle):
        create_buffer(cfg)


@pytest.mark.parametrize('stack, length', [(2, 2), (4, 3)])
def test_a_refused_episode_is_told_the_frames_it_needs(stack, length):
    """In a ring smaller than a stack, the count was of stacks stored again (5 for a 2-step episode of 3 frames)."""
    frames = [np.full((2, 2), k, np.uint8) for k in range(length + 1)]
    padded = [frames[0]] * (stack - 1) + frames  # the reset frame repeated: one frame
    episode = [
        dict(
            obs=np.stack(padded[t : t + stack]),
            next_obs=np.stack(padded[t + 1 : t + 1 + stack]),
            reward=0.0,
            done=t == length - 1,
        )
        for t in range(length)
    ]
    for spare, fits in ((0, False), (1, True)):
        frames_cfg = dict(spare=spare)
        buf = create_buffer(
            dict(
                type='episode',
                replay_buffer_size=1,
                max_transitions=length,
                seed=0,
                storage=dict(type='tensor', frames=frames_cfg),
            )
        )
        if fits:
            assert buf.push([episode]) == 1
        else:
            with pytest.raises(ValueError, match=f'needs {length + 1} frames; the frame ring has {length} rows'):
                buf.push([episode])


def test_an_episode_larger_than_the_frame_ring_is_refused_before_anything_changes():
    """With a frame ring too small for an episode's frames (a spare below its first stack), the episode is
    refused naming storage.frames.spare, and the stored episodes stay as they were."""
    eps = Episodes(seed=5, max_len=3)
    buf = create_buffer(cfg_of(episodes=4, transitions=8, spare=1))
    buf.push([eps.one()])
    before = buf.state_dict()
    long = []
    while len(long) < 8:
        long = eps.one()
        eps.envs.max_len = 8
    long = [dict(s) for s in long[:8]]
    long[0]['obs'] = np.stack([np.full((SIDE, SIDE), k, np.uint8) for k in range(STACK)])  # 4 distinct frames
    for t in range(1, 8):  # (a consistent episode: every obs the previous next_obs)
        long[t - 1]['next_obs'] = np.concatenate([long[t - 1]['obs'][1:], long[t - 1]['next_obs'][-1:]])
        long[t]['obs'] = long[t - 1]['next_obs']
    long[7]['next_obs'] = np.concatenate([long[7]['obs'][1:], long[7]['next_obs'][-1:]])
    # (4 + 8 frames: the count of the episode's own frames, not of stacks stored again in a ring too small)
    with pytest.raises(ValueError, match=r'needs 12 frames; the frame ring has 9 rows .*storage.frames.spare'):
        buf.push([long])
    assert_same(buf.state_dict(), before)
    check_episodes(buf.sample(1), eps.pushed)

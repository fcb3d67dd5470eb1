"""``storage.frames`` with frame dtypes numpy lacks (``bfloat16``, ``float8``): stored as their bit patterns and
sampled back bit-exactly -- NaN payloads, -0.0, infinities and subnormals included -- through single and batched
pushes, n-step, episode tables, memmap files and save / load round trips. Was: refused at the first push
("must hold numbers numpy can hold"), while docs/storages.md promises any frame dtype."""

import numpy as np
import pytest
import torch
from helpers import FrameEnvs, assert_same, n_step_reference

from ding_buffer import create_buffer

# 256 bit patterns for the 256 values a synthetic uint8 frame takes: specials first, then random ones
_SPECIAL = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFC3, 0x0001, 0x8001, 0x007F, 0x3F80, 0xBF80]
_RNG = np.random.default_rng(123)
BITS16 = np.array(_SPECIAL + _RNG.integers(0, 1 << 16, 256 - len(_SPECIAL)).tolist(), dtype=np.uint16).view(np.int16)
BITS8 = np.array([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81] + _RNG.integers(0, 256, 250).tolist(), np.uint8)


def as_dtype(frames, dtype):
    """A uint8 frame stack as frames of ``dtype`` (one bit pattern per uint8 value)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(BITS16[frames]).view(dtype)
    return torch.from_numpy(BITS8[frames]).view(dtype)


def bits(t):
    """The bit patterns of frames of a 16- or 8-bit dtype, as numpy ints (NaN == NaN, -0.0 != 0.0)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()


def converted(steps, dtype):
    return [dict(s, obs=as_dtype(s['obs'], dtype), next_obs=as_dtype(s['next_obs'], dtype)) for s in steps]


def frames_cfg(type_='naive', size=32, **frames):
    return dict(
        type=type_,
        replay_buffer_size=size,
        seed=0,
        storage=dict(type='tensor', frames=dict(env_key='env_id', **frames)),
    )


def check_rows(out, pushed, dtype, next_obs=True):
    assert out['obs'].dtype == dtype and out['next_obs'].dtype == dtype
    steps = out['step'].reshape(-1).tolist()
    obs = out['obs'].reshape(-1, *out['obs'].shape[-3:])
    nxt = out['next_obs'].reshape(-1, *out['next_obs'].shape[-3:])
    for j, s in enumerate(steps):
        assert np.array_equal(bits(obs[j]), bits(pushed[s]['obs'])), f"obs of step {s}"
        if next_obs:
            assert np.array_equal(bits(nxt[j]), bits(pushed[s]['next_obs'])), f"next_obs of step {s}"
    return steps


def push_all(buf, steps, batched):
    if not batched:
        for t in steps:
            buf.push(t)
        return
    for i in range(0, len(steps), 3):  # one row per env, as a vectorised collector pushes
        chunk = steps[i : i + 3]
        buf.extend({k: torch.stack([torch.as_tensor(t[k]) for t in chunk]) for k in chunk[0]})


DTYPES = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('batched', [False, True], ids=['single', 'batched'])
@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_frames_numpy_lacks_round_trip_bit_exactly(type_, batched, dtype):
    steps = converted(FrameEnvs(seed=1).steps(150), dtype)  # capacity 32: the ring wraps, episodes end
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg(type_, spare=64))
    push_all(buf, steps, batched)
    assert buf.count() == 32
    out = buf.sample(32, replace=False) if type_ == 'naive' else buf.sample(32)
    got = check_rows(out, pushed, dtype)
    assert set(got) <= set(range(150 - 32, 150))
    assert buf.storage.nbytes_per_item() < 2 * 4 * 5 * 5 * out['obs'].element_size()  # still stored once
    buf.close()


def test_bfloat16_frames_are_not_int16_frames():
    """Frames are kept as their 16-bit patterns; an int16 stack after bfloat16 ones (or the reverse) is another
    dtype all the same, refused naming both."""
    steps = FrameEnvs(seed=2).steps(4)
    buf = create_buffer(frames_cfg())
    buf.push(converted(steps[:1], torch.bfloat16)[0])
    as_int16 = dict(steps[1], obs=bits(as_dtype(steps[1]['obs'], torch.bfloat16)))
    as_int16['next_obs'] = bits(as_dtype(steps[1]['next_obs'], torch.bfloat16))
    before = buf.state_dict()
    with pytest.raises(ValueError, match='dtype int16, expected .* bfloat16'):
        buf.push(as_int16)
    assert_same(buf.state_dict(), before)
    other = create_buffer(frames_cfg())
    other.push(dict(as_int16, env_id=0))
    with pytest.raises(ValueError, match='dtype bfloat16, expected .* int16'):
        other.push(converted(steps[2:3], torch.bfloat16)[0])
    assert other.count() == 1


def test_bfloat16_n_step_returns_and_stacks_are_exact():
    steps = converted(FrameEnvs(seed=3, max_len=7).steps(120), torch.bfloat16)
    buf = create_buffer(frames_cfg('naive', size=40, spare=64, n_step=3, gamma=0.9))
    push_all(buf, steps, batched=False)
    ref = n_step_reference(steps, 3, 0.9)
    out = buf.sample(40, replace=False)
    check_rows(out, {t['step']: t for t in steps}, torch.bfloat16, next_obs=False)
    for j, s in enumerate(out['step'].tolist()):
        ret, nxt, done, trunc, k = ref[s]
        assert np.array_equal(bits(out['next_obs'][j]), bits(nxt)), f"n-step next_obs of step {s}"
        assert out['reward'][j].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert (bool(out['done'][j]), bool(out['truncated'][j]), out['n_step'][j].item()) == (done, trunc, k)


@pytest.mark.parametrize('n_step', [1, 3])
def test_bfloat16_frames_survive_save_and_load_and_streams_go_on(tmp_path, n_step):
    steps = converted(FrameEnvs(seed=4, max_len=12).steps(90), torch.bfloat16)
    pushed = {t['step']: t for t in steps}
    cfg = frames_cfg('naive', size=48, n_step=n_step)
    buf = create_buffer(cfg)
    push_all(buf, steps[:60], batched=False)
    state = buf.state_dict()
    assert state['storage']['frames']['data'].dtype == torch.bfloat16
    path = str(tmp_path / 'buf.pt')
    buf.save_data(path)
    other = create_buffer(cfg)
    other.load_data(path)
    assert_same(other.state_dict(), buf.state_dict())
    assert_same(other.sample(16), buf.sample(16), 'sample')
    for t in steps[60:]:  # each env's next step continues its stream in both
        buf.push(t)
        other.push(t)
    assert_same(other.state_dict(), buf.state_dict())
    check_rows(other.sample(other.count(), replace=False), pushed, torch.bfloat16, next_obs=n_step == 1)
    empty = create_buffer(cfg)
    empty.push(steps[0])
    empty.clear()
    fresh = create_buffer(cfg)
    fresh.load_state_dict(empty.state_dict())  # no frames kept: the first push must still be bfloat16
    with pytest.raises(ValueError, match='expected .* bfloat16'):
        fresh.push(dict(steps[0], obs=bits(steps[0]['obs']), next_obs=bits(steps[0]['next_obs'])))


def test_bfloat16_frames_in_a_memmap_file(tmp_path):
    steps = converted(FrameEnvs(seed=5).steps(40), torch.bfloat16)
    cfg = frames_cfg('naive', size=48)
    cfg['storage']['memmap_dir'] = str(tmp_path)
    buf = create_buffer(cfg)
    push_all(buf, steps, batched=True)
    check_rows(buf.sample(39, replace=False), {t['step']: t for t in steps}, torch.bfloat16)
    buf.close()


@pytest.mark.parametrize('type_', ['episode', 'prioritized_episode'])
def test_bfloat16_episodes_come_back_exactly(type_):
    envs = FrameEnvs(n_envs=1, seed=6, max_len=6)
    cfg = dict(type=type_, replay_buffer_size=4, max_transitions=20, seed=0, storage=dict(type='tensor', frames={}))
    if type_ == 'prioritized_episode':
        cfg['sampler'] = dict(unroll_len=3)
    buf = create_buffer(cfg)
    pushed = {}
    for _ in range(8):
        episode = []
        while not episode or not (episode[-1]['done'] or episode[-1]['truncated']):
            episode.append(converted([envs.step(0)], torch.bfloat16)[0])
        pushed.update({s['step']: s for s in episode})
        buf.push({k: torch.stack([torch.as_tensor(s[k]) for s in episode]) for k in episode[0]})
    out = buf.sample(3, unroll_len=3) if type_ == 'episode' else buf.sample(3)
    mask = out['mask'].reshape(-1)
    steps = out['step'].reshape(-1)[mask].tolist()
    obs = out['obs'].reshape(-1, 4, 5, 5)[mask]
    nxt = out['next_obs'].reshape(-1, 4, 5, 5)[mask]
    assert out['obs'].dtype == torch.bfloat16 and steps
    for j, s in enumerate(steps):
        assert np.array_equal(bits(obs[j]), bits(pushed[s]['obs'])) and np.array_equal(
            bits(nxt[j]), bits(pushed[s]['next_obs'])
        ), f"step {s}"


@pytest.mark.parametrize('dtype', [torch.uint8, torch.bfloat16])
@pytest.mark.parametrize('type_', ['episode', 'prioritized_episode'])
def test_several_frame_episodes_in_one_push_are_stored_like_one_at_a_time(type_, dtype):
    """A list of episodes in one push to a fresh frames episode table (it raised "episode 1: unhashable type:
    'dict'") stores what pushing them one by one stores."""
    envs = FrameEnvs(n_envs=1, seed=7, max_len=5)
    episodes = []
    for _ in range(3):
        episode = []
        while not episode or not (episode[-1]['done'] or episode[-1]['truncated']):
            episode.append(converted([envs.step(0)], dtype)[0] if dtype != torch.uint8 else envs.step(0))
        episodes.append({k: torch.stack([torch.as_tensor(s[k]) for s in episode]) for k in episode[0]})
    cfg = dict(type=type_, replay_buffer_size=4, max_transitions=40, seed=0, storage=dict(type='tensor', frames={}))
    together, apart = create_buffer(cfg), create_buffer(cfg)
    together.push(episodes)
    for ep in episodes:
        apart.push(ep)
    assert together.count() == apart.count() == 3
    assert_same(together.state_dict(), apart.state_dict())
    together.close()
    apart.close()


@pytest.mark.parametrize('kind', ['numpy', 'torch'])
def test_complex_frames_are_refused_as_not_real_numbers_with_nothing_stored(kind):
    """The docs promise any real frame dtype; a complex stack is refused, and the numpy message said "must hold
    numbers" of complex values (which are numbers)."""
    buf = create_buffer(frames_cfg())
    good = {'obs': np.zeros((2, 3), np.float32), 'next_obs': np.zeros((2, 3), np.float32), 'env_id': 0, 'done': False}
    buf.push(dict(good, done=True))
    before = buf.state_dict()
    stack = np.zeros((2, 3), np.complex64)
    stack = torch.from_numpy(stack) if kind == 'torch' else stack
    with pytest.raises(ValueError, match=r"field 'obs' must hold real numbers \(frames\), got dtype .*complex64"):
        buf.push(dict(good, obs=stack, next_obs=stack))
    assert_same(buf.state_dict(), before)

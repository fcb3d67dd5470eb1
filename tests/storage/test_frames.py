"""``storage.frames``: image observations stored one frame a transition, stacks rebuilt at sample time.

Brute-force reference: every pushed transition carries a unique ``step`` id and the test keeps its full ``obs`` /
``next_obs`` stacks; whatever a buffer returns must equal them exactly, for every transition preset, uniform and
prioritized draws, single and batched (vectorised-env) pushes, interleaved environments, episode ends
(terminated and truncated) and ring wrap-around. Bad streams are refused with nothing changed.
"""

import copy

import numpy as np
import pytest
import torch
from helpers import FrameEnvs as Envs
from helpers import assert_same, n_step_reference

from ding_buffer import create_buffer

H = 5  # frame side (small: the rules do not depend on it)


def frames_cfg(type_, size=32, spare=None, **extra):
    frames = dict(env_key='env_id')
    if spare is not None:
        frames['spare'] = spare
    return dict(type=type_, replay_buffer_size=size, seed=0, storage=dict(type='tensor', frames=frames), **extra)


def check_rows(out, pushed):
    """Every returned row equals the pushed transition with its ``step``."""
    steps = out['step'].reshape(-1).tolist()
    obs = out['obs'].reshape(-1, *out['obs'].shape[-3:])
    nxt = out['next_obs'].reshape(-1, *out['next_obs'].shape[-3:])
    for j, s in enumerate(steps):
        ref = pushed[s]
        assert np.array_equal(obs[j].numpy(), ref['obs']), f"obs of step {s}"
        assert np.array_equal(nxt[j].numpy(), ref['next_obs']), f"next_obs of step {s}"
        for k in ('action', 'done', 'truncated', 'env_id'):
            assert out[k].reshape(-1)[j].item() == ref[k], f"{k} of step {s}"
    return steps


def push_all(buf, steps, batched):
    if not batched:
        for t in steps:
            buf.push(t)
        return
    for i in range(0, len(steps), 3):  # one row per env: what a vectorised collector pushes
        chunk = steps[i : i + 3]
        buf.extend({k: np.stack([np.asarray(t[k]) for t in chunk]) for k in chunk[0]})


@pytest.mark.parametrize('batched', [False, True], ids=['single', 'batched'])
@pytest.mark.parametrize('type_', ['naive', 'advanced', 'elastic', 'deque'])
def test_samples_equal_the_pushed_stacks_through_wraparound_and_episode_ends(type_, batched):
    envs = Envs(seed=1)
    steps = envs.steps(150)  # capacity 32: the ring wraps several times, episodes of 1..9 steps
    pushed = {t['step']: t for t in steps}
    cfg = frames_cfg(type_, spare=64)
    if type_ == 'deque':
        cfg = dict(cfg, storage=dict(cfg['storage'], output='batch'))
    buf = create_buffer(cfg)
    push_all(buf, steps, batched)
    assert buf.count() == 32
    if type_ == 'deque':
        out = buf.sample(32, 0)  # (storage.output='batch': one dict of batched tensors)
    else:
        out = buf.sample(32, replace=False) if type_ != 'advanced' else buf.sample(32)
    got = check_rows(out, pushed)
    if type_ != 'advanced':  # without replacement: exactly the newest 32 transitions
        assert sorted(got) == list(range(150 - 32, 150))
    else:
        assert set(got) <= set(range(150 - 32, 150))


def test_prioritized_draws_follow_the_priorities_and_return_exact_stacks():
    envs = Envs(seed=2)
    steps = envs.steps(40)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('advanced', size=40, alpha=1.0))
    for t in steps:
        buf.push(dict(t, priority=100.0 if t['step'] == 7 else 0.01))
    seen = []
    for _ in range(20):
        seen += check_rows(buf.sample(8), pushed)
    assert seen.count(7) > 0.9 * len(seen)  # 100 against 39 * 0.01: p(7) = 0.996


def test_sequence_runs_rebuild_every_step_of_every_run():
    envs = Envs(n_envs=1, seed=3, max_len=50)
    steps = envs.steps(60)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('sequence', size=40))
    for t in steps:
        buf.push(t)
    out = buf.sample(4, sequence=5)
    assert tuple(out['obs'].shape[:3]) == (4, 5, 4)
    check_rows(out, pushed)
    assert (torch.diff(out['step'], dim=1) == 1).all()  # runs of consecutive steps


def test_one_frame_a_transition_plus_the_first_frame_of_each_episode():
    envs = Envs(n_envs=2, seed=4, side=84)
    steps = envs.steps(100)
    starts = sum(1 for t in steps if np.array_equal(t['obs'][0], t['obs'][-1]))  # reset padding: first steps
    buf = create_buffer(frames_cfg('naive', size=128))
    push_all(buf, steps, batched=False)
    assert buf.storage.frames_stored() == 100 + starts
    full = 2 * 4 * 84 * 84  # obs and next_obs in full (Atari's 84 x 84, stacks of 4)
    assert buf.storage.nbytes_per_item() < 1.2 * 84 * 84 < full / 6


@pytest.mark.parametrize('check', [True, False])
def test_steps_of_one_environment_in_one_push_share_frames_with_the_push_before(check):
    """A push of several consecutive steps of an environment whose stream began in an earlier push: each step's
    obs is its previous next_obs, partly written already and partly pending in this push (with or without the
    check that they are equal)."""
    envs = Envs(n_envs=1, seed=9, side=H, max_len=100)  # one episode
    steps = envs.steps(7)
    cfg = frames_cfg('naive', size=16)
    cfg['storage']['frames']['check'] = check
    buf = create_buffer(cfg)
    for lo, hi in ((0, 1), (1, 4), (4, 7)):
        buf.extend({k: np.stack([np.asarray(t[k]) for t in steps[lo:hi]]) for k in steps[0]})
    assert buf.storage.frames_stored() == 1 + 7  # the reset frame (repeated in the first stack), then one a step
    assert sorted(check_rows(buf.sample(7), steps)) == list(range(7))


def test_a_batch_with_nested_fields_is_stored_as_its_steps_one_at_a_time_are():
    envs = Envs(n_envs=2, seed=11, side=H)
    steps = [dict(t, next={'reward': np.float32(t['reward']), 'step': t['step']}) for t in envs.steps(12)]
    one, batched = create_buffer(frames_cfg('naive')), create_buffer(frames_cfg('naive'))
    for t in steps:
        one.push(t)
    for i in range(0, len(steps), 4):
        chunk = steps[i : i + 4]
        batch = {k: np.stack([np.asarray(t[k]) for t in chunk]) for k in chunk[0] if k != 'next'}
        batch['next'] = {k: np.stack([t['next'][k] for t in chunk]) for k in ('reward', 'step')}
        batched.extend(batch)
    assert batched.storage.frames_stored() == one.storage.frames_stored()
    out = batched.sample(12)
    assert sorted(check_rows(out, steps)) == list(range(12))
    assert out['next']['step'].tolist() == out['step'].tolist()


def test_float_frames_are_compared_bit_for_bit_nan_pixels_and_signed_zeros_included():
    buf = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0, storage=dict(type='tensor', frames={})))
    f = [torch.tensor([float(i), 0.0]) for i in range(5)]
    f[2][1] = float('nan')  # a NaN pixel: the stack that holds it still continues the stream
    f[3][1] = -0.0  # a signed zero comes back with its sign
    stacks = [torch.stack([f[0], f[0], f[1], f[2]]), torch.stack([f[0], f[1], f[2], f[3]])]
    stacks.append(torch.stack([f[1], f[2], f[3], f[4]]))
    buf.push(dict(obs=stacks[0], next_obs=stacks[1], reward=0.0, done=False))
    buf.push(dict(obs=stacks[1], next_obs=stacks[2], reward=0.0, done=False))
    assert buf.count() == 2 and buf.storage.frames_stored() == 5  # f0 f1 f2 f3 f4: the reset frame repeats once
    out = buf.sample(2)
    order = out['replay_unique_id'].argsort()
    for got, want in zip(out['obs'][order], stacks[:2]):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit for bit
    flipped = stacks[2].clone()
    flipped[2, 1] = 0.0  # +0.0 where the stored frame holds -0.0: not the previous next_obs
    with pytest.raises(ValueError, match='does not continue environment'):
        buf.push(dict(obs=flipped, next_obs=torch.stack([f[2], f[3], f[4], f[0]]), reward=0.0, done=False))


def test_items_whose_frames_were_overwritten_are_removed_and_counted():
    """Episodes of one step cost two frames a transition; with no spare rows the oldest transitions lose frames
    before the ring reaches them: they leave (removed_by_frames) and what stays is exact."""
    envs = Envs(n_envs=1, seed=5, max_len=1)
    steps = envs.steps(100)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('advanced', size=20, spare=0))
    for t in steps:
        buf.push(t)
    stats = buf.stats()
    assert stats['removed_by_frames'] > 0
    assert buf.count() == 10  # 20 frame rows, two frames a transition
    got = check_rows(buf.sample(10), pushed)
    assert set(got) <= set(range(90, 100))


def _stack(*values):
    return np.stack([np.full((H, H), v % 256, np.uint8) for v in values])


def _numbered_step(env, t, tag, base=1, reward=0.0, done=False):
    """Step ``t`` of environment ``env``: a stack of 4 frames numbered from ``base + t``, one new frame a step."""
    o = [base + t + k for k in range(4)]
    return dict(
        obs=_stack(*o),
        next_obs=_stack(*o[1:], o[-1] + 1),
        action=0,
        reward=reward,
        done=done,
        truncated=False,
        env_id=env,
        step=tag,
    )


@pytest.mark.parametrize('check', [True, False])
@pytest.mark.parametrize('pushes', ['single', 'list', 'first push'])
def test_a_stream_whose_frames_are_the_oldest_in_the_ring_goes_on_storing_its_steps(check, pushes):
    """One environment waits while another fills the ring to its oldest frames: its next steps reused those
    frames, the step's own new frame overwrote the oldest of them, and the step (then the next ``stack - 1``) was
    removed as it was written (push returned 1, removed_by_frames grew)."""
    cfg = frames_cfg('naive', size=16)  # 16 items: 32 frame rows
    cfg['storage']['frames'].update(check=check)
    buf = create_buffer(cfg)

    pushed = [_numbered_step(0, 0, 0)] + [
        _numbered_step(1, j, 1 + j, base=100) for j in range(24)
    ]  # env 1 fills 28 of the 32 rows
    later = [_numbered_step(0, t, 1000 + t) for t in range(1, 7)]  # env 0 goes on
    if pushes == 'first push':  # (the frame ring is made by this push: the rows it will have count)
        assert buf.push(pushed + later) == 31
    else:
        for t in pushed:
            buf.push(t)
        if pushes == 'single':
            assert [buf.push(t) for t in later] == [1] * 6
        else:
            assert buf.push(later) == 6
    assert buf.stats()['removed_by_frames'] == 0
    got = check_rows(buf.sample(16, replace=False), {t['step']: t for t in pushed + later})
    assert set(got) == set(range(15, 25)) | set(range(1001, 1007))  # the 16 newest


def test_an_n_step_return_sums_in_float64_and_rounds_once():
    """Each discounted term was rounded to float32 before it was added (numpy 2 keeps a float times a float32
    array in float32): 54 float32 steps off here."""
    cfg = frames_cfg('naive', size=8)
    cfg['storage']['frames'].update(n_step=3, gamma=0.9)
    buf = create_buffer(cfg)
    for t, r in enumerate([0.5, -1.0, 0.5, 0.0]):
        buf.push(_numbered_step(0, t, t, reward=r))
    out = buf.sample(4, replace=False)
    first = out['step'].tolist().index(0)
    assert out['reward'][first].item() == float(np.float32(0.5 + 0.9 * -1.0 + 0.9 * 0.9 * 0.5))


@pytest.mark.parametrize('field', ['reward', 'done'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float8_e4m3fn])
def test_n_step_returns_read_rewards_and_flags_of_dtypes_numpy_lacks(field, dtype):
    """Such a reward / done column was pushed, then every sample raised numpy's bare TypeError."""
    cfg = frames_cfg('naive', size=8)
    cfg['storage']['frames'].update(n_step=3, gamma=0.5)
    buf = create_buffer(cfg)
    for t in range(4):
        step = _numbered_step(0, t, t, reward=0.5, done=t == 1)
        step[field] = torch.tensor(step[field], dtype=dtype)
        buf.push(step)
    out = buf.sample(4, replace=False)
    first = out['step'].tolist().index(0)  # steps 0, 1 (done): 0.5 + 0.5 * 0.5
    assert out['reward'][first].item() == 0.75 and out['n_step'][first].item() == 2
    assert bool(out['done'][first]) and out['reward'].dtype == (dtype if field == 'reward' else torch.float32)


def _bad(base, **change):
    return dict(base, **change)


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
@pytest.mark.parametrize(
    'make, needles',
    [
        (lambda t, p: _bad(t, obs=np.zeros_like(t['obs'])), ("'obs' does not continue environment 0",)),
        (lambda t, p: _bad(t, next_obs=np.roll(t['next_obs'], 1, axis=0)), ("'next_obs' is not 'obs' shifted",)),
        (lambda t, p: _bad(t, obs=t['obs'][:3], next_obs=t['next_obs'][:3]), ('stack of 3 frames, expected 4',)),
        (lambda t, p: _bad(t, obs=t['obs'].astype(np.float32)), ('dtype float32, expected', 'uint8')),
        (lambda t, p: {k: v for k, v in t.items() if k != 'env_id'}, ("no field 'env_id'",)),
        (lambda t, p: {k: v for k, v in t.items() if k != 'next_obs'}, ("no field 'next_obs'",)),
        (lambda t, p: _bad(t, done='yes'), ("field 'done' must be a bool",)),
    ],
)
def test_a_push_that_breaks_a_stream_is_refused_and_changes_nothing(type_, make, needles):
    envs = Envs(n_envs=1, seed=6, max_len=50)
    steps = envs.steps(6)
    buf = create_buffer(frames_cfg(type_))
    for t in steps[:5]:
        buf.push(t)
    before = buf.state_dict()
    with pytest.raises(ValueError) as err:
        buf.push(make(steps[5], steps[4]))
    for needle in needles:
        assert needle in str(err.value), str(err.value)
    assert_same(buf.state_dict(), before)
    buf.push(steps[5])  # the right step is still taken: the stream goes on
    check_rows(buf.sample(6, replace=False) if type_ == 'naive' else buf.sample(6), {t['step']: t for t in steps})


def test_a_batch_with_one_bad_row_stores_nothing():
    envs = Envs(seed=7, max_len=50)
    steps = envs.steps(9)
    buf = create_buffer(frames_cfg('naive'))
    push_all(buf, steps[:6], batched=True)
    before = buf.state_dict()
    rows = steps[6:]
    rows[2] = dict(rows[2], obs=np.zeros_like(rows[2]['obs']))
    with pytest.raises(ValueError, match='item 2'):
        buf.extend({k: np.stack([np.asarray(t[k]) for t in rows]) for k in rows[0]})
    assert_same(buf.state_dict(), before)


def test_a_new_episode_may_start_anywhere_after_done_or_truncated():
    """After a step that ended its episode the next obs is a reset: no continuity is asked of it."""
    envs = Envs(n_envs=1, seed=8, max_len=3)
    steps = envs.steps(30)
    buf = create_buffer(frames_cfg('naive', size=64))
    for t in steps:
        buf.push(t)
    check_rows(buf.sample(30, replace=False), {t['step']: t for t in steps})


def test_a_failed_push_leaves_the_stream_able_to_go_on():
    """A prioritized push refused for its priority (after the frames were matched) does not break the stream:
    the same step pushed again with a valid priority is taken, and so are the next."""
    envs = Envs(n_envs=1, seed=9, max_len=50)
    steps = envs.steps(8)
    buf = create_buffer(frames_cfg('advanced'))
    for t in steps[:4]:
        buf.push(t)
    before = buf.state_dict()
    with pytest.raises(ValueError):
        buf.push(dict(steps[4], priority=-1.0))
    assert_same(buf.state_dict(), before)
    for t in steps[4:]:
        buf.push(t)
    check_rows(buf.sample(8), {t['step']: t for t in steps})


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_state_round_trip_samples_the_same_and_streams_go_on(type_, tmp_path):
    envs = Envs(seed=10, max_len=12)
    steps = envs.steps(90)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg(type_, size=48))
    push_all(buf, steps[:60], batched=False)
    path = str(tmp_path / 'buf.pt')
    buf.save_data(path)
    other = create_buffer(frames_cfg(type_, size=48))
    other.load_data(path)
    assert_same(other.state_dict(), buf.state_dict())
    a, b = buf.sample(16), other.sample(16)
    assert_same(a, b, 'sample')
    for t in steps[60:]:  # each env's next step continues its stream in both
        buf.push(t)
        other.push(t)
    assert_same(other.state_dict(), buf.state_dict())
    a, b = buf.sample(16), other.sample(16)
    assert_same(a, b, 'sample')
    check_rows(b, pushed)


@pytest.mark.parametrize('extra', [{}, dict(max_use=2)], ids=['plain', 'max_use'])
@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_a_restored_frame_ring_overwrites_where_the_saved_one_would(type_, extra, tmp_path):
    """Frames no stored item refers to any more still take rows of the ring: a state kept only the used ones,
    packed, so the reloaded buffer lost its transitions to the frame ring later than the saved one did."""
    envs = Envs(n_envs=3, seed=21, max_len=8)
    order = np.random.default_rng(21).choice(3, size=120, p=[0.45, 0.45, 0.1])  # an env idle for a while
    steps = [envs.step(int(e)) for e in order]
    cfg = frames_cfg(type_, size=12, spare=6, **extra)
    buf = create_buffer(cfg)
    for t in steps[:50]:
        buf.push(t)
        if extra:
            buf.sample(2)  # items leave by use: their frames stay in the ring, unused
    loaded, path = create_buffer(cfg), str(tmp_path / 'buf.pt')
    loaded.load_state_dict(buf.state_dict())
    buf.save_data(path)
    from_file = create_buffer(cfg)
    from_file.load_data(path)
    for t in steps[50:]:
        for b in (buf, loaded, from_file):
            b.push(t)
        assert loaded.stats() == buf.stats() == from_file.stats()
        out = buf.sample(3)
        assert_same(loaded.sample(3), out, 'sample')
        assert_same(from_file.sample(3), out, 'sample')
    assert buf.stats()['removed_by_frames'] > 0


def test_a_frames_state_without_the_ring_places_loads_packed_and_a_bad_next_is_refused():
    """States of earlier versions have no ``next``: their frames load packed, in order (the same samples); a
    ``next`` that is not an int above every saved frame id and below 2**63 (0 without frames) is refused naming it,
    with nothing changed."""
    envs = Envs(seed=22, max_len=8)
    buf = create_buffer(frames_cfg('naive', size=12, spare=6))
    push_all(buf, envs.steps(40), batched=False)
    state = buf.state_dict()
    old = copy.deepcopy(state)
    del old['storage']['frames']['next']
    loaded = create_buffer(frames_cfg('naive', size=12, spare=6))
    loaded.load_state_dict(old)
    assert_same(loaded.sample(8), buf.sample(8), 'sample')
    empty = create_buffer(frames_cfg('naive', size=12, spare=6)).state_dict()
    last = int(state['storage']['frames']['ids'][-1])
    for base, bad in [(state, last), (state, 2.5), (state, '7'), (state, 2**63), (empty, 'abc'), (empty, 3)]:
        base = copy.deepcopy(base)
        base['storage']['frames']['next'] = bad
        target = create_buffer(frames_cfg('naive', size=12, spare=6))
        before = target.state_dict()
        with pytest.raises(ValueError, match="saved frame 'next' is"):
            target.load_state_dict(base)
        assert_same(target.state_dict(), before)


def test_a_frames_state_numbered_near_the_int64_limit_loads_renumbered():
    """Frame ids are renumbered from 0 at load, places kept: a state whose ids sit near 2**63 loaded as given, and
    pushes then overflowed the ids."""
    envs, cfg = Envs(seed=22, max_len=8), frames_cfg('naive', size=12, spare=6)
    steps = envs.steps(80)
    buf = create_buffer(cfg)
    push_all(buf, steps[:40], batched=False)
    state, off = copy.deepcopy(buf.state_dict()), 2**63 - 40
    frames = state['storage']['frames']
    frames['ids'], frames['next'] = frames['ids'] + off, frames['next'] + off
    frames['streams'] = [[env, [x + off for x in sids], ended] for env, sids, ended in frames['streams']]
    for i, (name, _, _) in enumerate(state['storage']['schema']):
        if name[0] in ('obs:frames', 'next_obs:frame'):
            state['storage']['fields'][i] = state['storage']['fields'][i] + off
    loaded = create_buffer(cfg)
    loaded.load_state_dict(state)
    assert_same(loaded.state_dict(), buf.state_dict())
    for t in steps[40:]:
        loaded.push(t)
        buf.push(t)
    assert_same(loaded.sample(8), buf.sample(8), 'sample')


def test_a_frame_ring_too_small_for_one_transition_is_refused():
    """A ring of ``replay_buffer_size + spare`` rows below one transition's ``stack + 1`` frames lost every
    transition as it was stored: each push returned 1 and the buffer stayed empty."""
    with pytest.raises(ValueError, match=r"'storage.frames.spare' is 0: .* 4 rows .* 5 frames"):
        create_buffer(
            dict(frames_cfg('naive', size=4, spare=0), storage=dict(type='tensor', frames=dict(stack=4, spare=0)))
        )
    buf = create_buffer(frames_cfg('naive', size=4, spare=0))  # the stack is read from the first push
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"'storage.frames.spare' is 0: .* 4 rows .* 5 frames"):
        buf.push(Envs(seed=3).steps(1)[0])
    assert_same(buf.state_dict(), before)
    saved = create_buffer(frames_cfg('naive', size=4, spare=6))  # a state whose stack needs a larger ring
    push_all(saved, Envs(seed=3).steps(2), batched=False)
    target = create_buffer(frames_cfg('naive', size=4, spare=0))
    with pytest.raises(ValueError, match=r"'storage.frames.spare' is 0: .* 4 rows .* 5 frames"):
        target.load_state_dict(saved.state_dict())
    assert_same(target.state_dict(), before)
    small = create_buffer(frames_cfg('naive', size=4, spare=1))  # room for one: the newest transitions stay
    for t in Envs(n_envs=1, seed=3, max_len=50).steps(10):
        assert small.push(t) == 1 and small.count() >= 1


def test_a_state_with_frames_needs_the_frames_layout_and_a_broken_one_is_refused():
    envs = Envs(seed=11)
    buf = create_buffer(frames_cfg('naive'))
    push_all(buf, envs.steps(20), batched=False)
    state = buf.state_dict()
    plain = create_buffer(dict(type='naive', replay_buffer_size=32, storage=dict(type='tensor')))
    with pytest.raises(ValueError, match="storage.frames"):
        plain.load_state_dict(state)
    broken = create_buffer(frames_cfg('naive'))
    bad = dict(state, storage=dict(state['storage'], frames=dict(state['storage']['frames'])))
    bad['storage']['frames']['ids'] = bad['storage']['frames']['ids'][1:]
    bad['storage']['frames']['data'] = bad['storage']['frames']['data'][1:]
    before = broken.state_dict()
    with pytest.raises(ValueError, match='frames the saved state does not hold'):
        broken.load_state_dict(bad)
    assert_same(broken.state_dict(), before)


def _two_streams(per_env, pushed):
    """A frames buffer (stack 1, 3-step returns) holding the first ``pushed`` of two environments' ``per_env``
    steps, interleaved; every frame distinct (env 0's pixels count from 0, env 1's from 100)."""
    cfg = dict(
        type='naive',
        replay_buffer_size=16,
        seed=0,
        storage=dict(type='tensor', frames=dict(env_key='env_id', stack=1, n_step=3, gamma=0.5)),
    )

    def steps(env, base):
        fr = [torch.full((1, 2, 2), base + k, dtype=torch.uint8) for k in range(per_env + 1)]
        return [
            {'obs': fr[t], 'next_obs': fr[t + 1], 'reward': float(base + t), 'done': False, 'env_id': env}
            for t in range(per_env)
        ]

    a, c = steps(0, 0), steps(1, 100)
    buf = create_buffer(cfg)
    buf.push([x for pair in zip(a[:pushed], c[:pushed]) for x in pair])
    return buf, cfg, a, c


@pytest.mark.parametrize('edit', ['successor of another env', 'successor id', 'stream end', 'stream frames'])
def test_a_frames_state_whose_links_contradict_its_frames_is_refused(edit):
    """The saved successor links and stream ends were only range-checked: a link to another environment's step
    loaded and a 3-step return added that environment's rewards; a wrong successor id cut returns short; a stream
    end naming an older item linked the next push to it; a stream whose frames are not its last item's loaded and
    refused the environment's next honest push."""
    buf, cfg, a, c = _two_streams(6, 5)
    state = copy.deepcopy(buf.state_dict())
    links, uid = state['storage']['links'], state['storage']['ring']['uid']
    if edit == 'successor of another env':  # env 0's step 0 -> env 1's step 1
        links['succ'][0], links['succ_uid'][0] = 3, int(uid[3])
    elif edit == 'successor id':
        links['succ_uid'][0] += 1
    elif edit == 'stream end':  # env 0's last is its step 4 (slot 8); name its step 3 (slot 6)
        links['last'] = [[0, 6, 6] if e[0] == 0 else e for e in links['last']]
    else:
        streams = state['storage']['frames']['streams']
        streams[:] = [[e[0], [e[1][0] - 1], e[2]] if e[0] == 1 else e for e in streams]
    target = create_buffer(cfg)
    before = target.state_dict()
    with pytest.raises(ValueError, match='saved links give|saved stream of environment'):
        target.load_state_dict(state)
    assert_same(target.state_dict(), before)
    honest = create_buffer(cfg)  # the unedited state loads, and the streams go on
    honest.load_state_dict(buf.state_dict())
    assert honest.push([a[5], c[5]]) == 2 and honest.count() == 12
    buf.storage.end_streams()  # (as a dataset load does): ended streams have no last item, and the state loads
    ended = create_buffer(cfg)
    ended.load_state_dict(buf.state_dict())
    assert_same(ended.state_dict(), buf.state_dict())


@pytest.mark.parametrize(
    'path', [('storage', 'links'), ('storage', 'frames', 'shape'), ('storage', 'links', 'last'), ('removed_by_frames',)]
)
def test_a_frames_state_with_a_renamed_key_is_refused(path):
    """Entries a frames state may lack (older layouts: links, the frame shape, the frames counter), renamed by a
    damaged byte, must not load as missing ones."""
    buf = create_buffer(frames_cfg('naive'))
    push_all(buf, Envs(seed=11).steps(20), batched=False)
    bad = copy.deepcopy(buf.state_dict())
    parent = bad['counters'] if path == ('removed_by_frames',) else bad
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1] + 'x'] = parent.pop(path[-1])
    target = create_buffer(frames_cfg('naive'))
    before = target.state_dict()
    with pytest.raises(ValueError, match=f"unknown key.*'{path[-1]}x'|with succ, succ_uid and last"):
        target.load_state_dict(bad)
    assert_same(target.state_dict(), before)


@pytest.mark.parametrize('where', ['streams', 'links'])
def test_a_frames_state_naming_one_environment_twice_is_refused(where):
    """Saved streams (and stream ends) are one an environment: a second entry for one replaced the first, a stream
    was lost, and the next push of the other environment was refused."""

    def steps(n, env_id, base):
        fr = [torch.full((2, 2), base + k, dtype=torch.uint8) for k in range(n + 2)]
        return [
            {'obs': torch.stack(fr[t : t + 2]), 'next_obs': torch.stack(fr[t + 1 : t + 3]), 'reward': 1.0,
             'done': False, 'env_id': env_id}
            for t in range(n)
        ]  # fmt: skip

    cfg = dict(type='naive', replay_buffer_size=16, seed=0, storage=dict(type='tensor', frames=dict(env_key='env_id')))
    a, c = steps(3, 0, 0), steps(3, 1, 100)
    buf = create_buffer(cfg)
    buf.push([a[0], c[0], a[1], c[1]])
    state = buf.state_dict()
    entries = state['storage']['frames']['streams'] if where == 'streams' else state['storage']['links']['last']
    entries[1][0] = entries[0][0]
    fresh = create_buffer(cfg)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match='name environment 0 twice'):
        fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), before)


def test_a_frames_state_holding_a_frame_nothing_refers_to_is_refused():
    """A state holds the frames its items and streams refer to: an extra one means a reference was damaged (it was
    dropped and the ids renumbered without a word)."""
    buf = create_buffer(frames_cfg('naive'))
    push_all(buf, Envs(seed=11).steps(6), batched=False)
    state = buf.state_dict()
    frames = state['storage']['frames']
    frames['ids'] = torch.arange(len(frames['ids']) + 1)
    frames['data'] = torch.cat([frames['data'], frames['data'][:1]])
    target = create_buffer(frames_cfg('naive'))
    before = target.state_dict()
    with pytest.raises(ValueError, match='1 frame.s. that no item or stream refers to'):
        target.load_state_dict(state)
    assert_same(target.state_dict(), before)


@pytest.mark.parametrize('type_', ['naive', 'episode'])
def test_a_state_whose_slots_left_the_ring_order_is_refused(type_):
    """Storage slots permuted (still exactly the valid ones) were accepted, and the next push failed on an
    assertion: a frame storage's streams follow the ring's order."""
    cfg = frames_cfg(type_, size=8, max_transitions=40) if type_ == 'episode' else frames_cfg(type_)
    buf = create_buffer(cfg)
    if type_ == 'episode':
        cfg['storage']['frames'] = {}
        buf = create_buffer(cfg)
        rng = np.random.default_rng(5)
        for n in (6, 5, 4, 6, 4, 4):  # episodes of one stream each: frame t + 1 starts the next stack
            fr = [torch.from_numpy(rng.integers(0, 255, (6, 6), dtype=np.uint8)) for _ in range(n + 4)]
            buf.push(
                [[dict(obs=torch.stack(fr[t : t + 4]), next_obs=torch.stack(fr[t + 1 : t + 5])) for t in range(n)]]
            )
    else:
        push_all(buf, Envs(seed=12, max_len=6).steps(30), batched=False)
    state = buf.state_dict()
    section = state['episodes']['storage'] if type_ == 'episode' else state['storage']
    section['slots'] = torch.as_tensor(section['slots']).flip(0)
    other = create_buffer(cfg)
    before = other.state_dict()
    with pytest.raises(ValueError, match="not in the ring's order"):
        other.load_state_dict(state)
    assert_same(other.state_dict(), before)


def test_memmap_keeps_the_frames_in_a_file_removed_at_close(tmp_path):
    import os

    envs = Envs(seed=12)
    steps = envs.steps(20)
    cfg = frames_cfg('naive')
    cfg['storage']['memmap_dir'] = str(tmp_path)
    buf = create_buffer(cfg)
    push_all(buf, steps, batched=False)
    files = os.listdir(tmp_path)
    assert any('frames' in f for f in files), files
    check_rows(buf.sample(20, replace=False), {t['step']: t for t in steps})
    buf.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    'frames, needle',
    [
        (dict(stack=0), "'storage.frames.stack'"),
        (dict(spare=-1), "'storage.frames.spare'"),
        (dict(spare=2**50), "'storage.frames.spare'"),  # (a typo: accepted, every push failed to allocate)
        (dict(stack=2**50), "'storage.frames.stack'"),
        (dict(check='yes'), "'storage.frames.check'"),
        (dict(keyy='obs'), "unknown config key 'storage.frames.keyy'"),
        (dict(key='obs', next_key='obs'), 'both'),
        ('obs', "'storage.frames' must be None or a dict"),
    ],
)
def test_bad_frames_config_names_the_key(frames, needle):
    with pytest.raises(ValueError, match=needle):
        create_buffer(dict(type='naive', storage=dict(type='tensor', frames=frames)))


@pytest.mark.parametrize(
    'cfg, needle',
    [
        (dict(type='naive', storage=dict(type='list', frames={})), "needs storage.type='tensor'"),
        (dict(type='episode', storage=dict(type='list', frames={})), "needs storage.type='tensor'"),
        (dict(type='gfn', storage=dict(type='tensor', frames={})), "unknown config key 'storage'"),
    ],
)
def test_frames_on_a_table_that_cannot_take_them_is_refused(cfg, needle):
    with pytest.raises(ValueError, match=needle):
        create_buffer(cfg)


# ================================================================================ n-step returns at sample time
def check_n_step(out, ref, gamma):
    for j, s in enumerate(out['step'].reshape(-1).tolist()):
        ret, nxt, done, trunc, k = ref[s]
        assert out['reward'].reshape(-1)[j].item() == pytest.approx(ret, rel=1e-5, abs=1e-5), f"return of step {s}"
        assert np.array_equal(out['next_obs'].reshape(-1, 4, H, H)[j].numpy(), nxt), f"next_obs of step {s}"
        assert bool(out['done'].reshape(-1)[j]) == done and bool(out['truncated'].reshape(-1)[j]) == trunc
        assert out['n_step'].reshape(-1)[j].item() == k
        assert out['n_step_discount'].reshape(-1)[j].item() == pytest.approx(gamma**k, rel=1e-6)


@pytest.mark.parametrize('batched', [False, True], ids=['single', 'batched'])
@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_n_step_returns_equal_the_reference_through_wraparound_and_episode_ends(type_, batched):
    envs = Envs(seed=13, max_len=7)
    steps = envs.steps(120)
    cfg = frames_cfg(type_, size=40, spare=64)
    cfg['storage']['frames'].update(n_step=3, gamma=0.9)
    buf = create_buffer(cfg)
    push_all(buf, steps, batched)
    ref = n_step_reference(steps, 3, 0.9)
    out = buf.sample(40, replace=False) if type_ == 'naive' else buf.sample(40)
    check_rows(_one_step_view(out, steps), {t['step']: t for t in steps})  # obs and the other fields as pushed
    check_n_step(out, ref, 0.9)
    if type_ == 'advanced':  # update's identity check works on n-step samples as on any
        info = {k: out[k] for k in ('replay_unique_id', 'replay_buffer_idx')}
        buf.update(dict(info, priority=torch.full((40,), 5.0)))
        updated = set(info['replay_unique_id'].tolist())
        again = buf.sample(40)
        for uid, p in zip(again['replay_unique_id'].tolist(), again['priority'].tolist()):
            assert (abs(p - 5.0) < 1e-3) == (uid in updated)


def _one_step_view(out, steps):
    """The fields an n-step sample leaves as pushed (obs, action, env_id), with next_obs / done / truncated taken
    from the pushed steps themselves, for ``check_rows``."""
    pushed = {t['step']: t for t in steps}
    ids = out['step'].reshape(-1).tolist()
    return {
        **out,
        'next_obs': torch.from_numpy(np.stack([pushed[s]['next_obs'] for s in ids])),
        'done': torch.tensor([pushed[s]['done'] for s in ids]),
        'truncated': torch.tensor([pushed[s]['truncated'] for s in ids]),
    }


def test_n_step_state_round_trip_keeps_the_chains():
    envs = Envs(seed=14, max_len=12)
    steps = envs.steps(60)
    cfg = frames_cfg('naive', size=64)
    cfg['storage']['frames'].update(n_step=4, gamma=0.95)
    buf = create_buffer(cfg)
    push_all(buf, steps[:30], batched=False)
    other = create_buffer(cfg)
    other.load_state_dict(buf.state_dict())
    for t in steps[30:]:
        other.push(t)
    check_n_step(other.sample(60, replace=False), n_step_reference(steps, 4, 0.95), 0.95)


@pytest.mark.parametrize(
    'item, needle',
    [
        (lambda t: {k: v for k, v in t.items() if k != 'reward'}, "sums the field 'reward'"),
        (lambda t: dict(t, n_step=1), "field 'n_step' is reserved"),
    ],
)
def test_n_step_refuses_items_it_cannot_sum(item, needle):
    envs = Envs(seed=15)
    cfg = frames_cfg('naive')
    cfg['storage']['frames'].update(n_step=2)
    buf = create_buffer(cfg)
    with pytest.raises(ValueError, match=needle):
        buf.push(item(envs.step(0)))
    assert buf.count() == 0


# ================================================================================ the engine's parts on the layout
def test_max_use_and_staleness_remove_items_and_the_rest_stays_exact():
    envs = Envs(seed=16, max_len=20)
    steps = [dict(t, collect_iter=t['step'] // 10) for t in envs.steps(40)]
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('naive', size=64, max_use=1, max_staleness=2))
    push_all(buf, steps, batched=False)
    out = buf.sample(10, cur_learner_iter=3, replace=False)
    got = check_rows(out, pushed)
    assert all(pushed[s]['collect_iter'] >= 2 for s in got)  # staleness < 2 at learner iteration 3
    # the stale ones (collect_iter 0 and 1) were removed, and each item drawn once (max_use=1)
    assert buf.count() == 40 - 20 - 10
    again = check_rows(buf.sample(10, cur_learner_iter=3, replace=False), pushed)
    assert not set(again) & set(got)


def test_min_priority_capacity_rule_keeps_the_highest_and_their_frames():
    envs = Envs(n_envs=1, seed=17, max_len=200)
    steps = envs.steps(60)
    pushed = {t['step']: t for t in steps}
    cfg = frames_cfg('advanced', size=20, spare=200, removers=[dict(type='min_priority')])
    buf = create_buffer(cfg)
    for t in steps:
        buf.push(dict(t, priority=float(t['step'] % 7 + 1)))
    out = buf.sample(20)
    got = set(check_rows(out, pushed))
    kept_priorities = sorted(pushed[s]['step'] % 7 + 1 for s in got)
    assert min(kept_priorities) >= 4  # of 60 items with priorities 1..7, the best 20 are 5s, 6s, 7s (and some 4s)


def test_a_push_the_rate_limiter_refuses_restarts_its_stream():
    envs = Envs(n_envs=1, seed=18, max_len=200)
    steps = envs.steps(12)
    pushed = {t['step']: t for t in steps}
    cfg = frames_cfg(
        'naive', size=64, thruput_controller=dict(push_sample_rate_limit=dict(max=5, min=0), window_seconds=100)
    )
    buf = create_buffer(cfg)
    n = sum(buf.push(t) for t in steps[:6])
    buf.sample(1)  # pushed / sampled = 6 > 5 from now on: pushes are refused until more is sampled
    n += sum(buf.push(t) for t in steps[6:])
    assert n < 12, n  # some refused
    got = check_rows(buf.sample(n, replace=False), pushed)  # what was taken is exact, refused steps are absent
    assert len(got) == n


def test_per_item_output_rebuilds_each_item():
    envs = Envs(seed=19)
    steps = envs.steps(20)
    cfg = frames_cfg('advanced')
    cfg['storage']['output'] = 'items'
    buf = create_buffer(cfg)
    push_all(buf, steps, batched=False)
    items = buf.sample(8)
    assert isinstance(items, list) and len(items) == 8
    pushed = {t['step']: t for t in steps}
    for it in items:
        ref = pushed[it['step']]
        assert np.array_equal(it['obs'].numpy(), ref['obs']) and np.array_equal(it['next_obs'].numpy(), ref['next_obs'])


@pytest.mark.parametrize('batched', [False, True], ids=['single', 'batched'])
def test_tensordict_steps_come_back_as_tensordicts_with_exact_stacks(batched):
    """TorchRL-style TensorDict steps (one at a time, or a TensorDict batch of one row per environment): the
    frames are stored once and samples are TensorDicts whose stacks equal the pushed ones."""
    tensordict = pytest.importorskip('tensordict')
    envs = Envs(seed=20)
    steps = envs.steps(60)

    def td(rows):
        leaves = {k: torch.as_tensor(np.stack([np.asarray(t[k]) for t in rows])) for k in rows[0]}
        return tensordict.TensorDict(leaves, batch_size=[len(rows)])

    buf = create_buffer(frames_cfg('naive', size=64))
    if batched:
        for i in range(0, len(steps), 3):
            buf.extend(td(steps[i : i + 3]))
    else:
        for t in steps:
            buf.push(td([t])[0])
    assert buf.count() == 60
    out = buf.sample(32, replace=False)
    assert isinstance(out, tensordict.TensorDictBase) and out.batch_size == torch.Size([32])
    check_rows(out, {t['step']: t for t in steps})
    assert buf.storage.nbytes_per_item() < 2 * H * H + 100
    again = create_buffer(frames_cfg('naive', size=64))
    again.load_state_dict(buf.state_dict())
    assert isinstance(again.sample(4), tensordict.TensorDictBase)


# ================================================================================ regressions (adversarial review)
def _tiny(v):
    return np.full((2, 2), v, np.uint8)


def _step(env, a, b, c, done=False):
    return dict(obs=np.stack([_tiny(a), _tiny(b)]), next_obs=np.stack([_tiny(b), _tiny(c)]), done=done, env=env)


def test_a_capacity_rule_refusing_some_new_items_keeps_the_rest_exact_and_streams_going():
    envs = Envs(n_envs=2, seed=21, max_len=30)
    steps = envs.steps(40)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('advanced', size=4, spare=64, removers=[dict(type='keep_best')]))
    for i in range(0, 40, 2):  # pairs (one step of each env), priorities that make keep_best refuse some
        pair = [dict(t, priority=float((t['step'] * 7) % 5 + 1)) for t in steps[i : i + 2]]
        buf.push(pair)
    assert buf.stats()['refused_by_keep_best'] > 0
    got = check_rows(buf.sample(4), pushed)
    assert all(pushed[s]['step'] * 7 % 5 + 1 >= 4 for s in got)  # the best ones stayed
    other = create_buffer(frames_cfg('advanced', size=4, spare=64, removers=[dict(type='keep_best')]))
    other.load_state_dict(buf.state_dict())
    assert_same(other.state_dict(), buf.state_dict())


def test_a_stalled_stream_whose_frames_left_the_ring_starts_again_and_samples_stay_exact():
    cfg = dict(
        type='naive', replay_buffer_size=2, storage=dict(type='tensor', frames=dict(env_key='env', stack=2, spare=3))
    )
    buf = create_buffer(cfg)
    steps = [_step(0, 10, 10, 11), _step(1, 20, 20, 21), _step(1, 20, 21, 22), _step(0, 10, 11, 12)]
    for t in steps:
        buf.push(t)
    out = buf.sample(buf.count(), replace=False)
    for j in range(len(out['env'])):
        match = [t for t in steps if np.array_equal(t['obs'], out['obs'][j].numpy())]
        assert match and np.array_equal(match[-1]['next_obs'], out['next_obs'][j].numpy())
    buf.state_dict()  # (refers only to frames the ring holds)


def test_refused_pushes_leave_the_state_alone_and_a_rate_limited_one_lets_the_stream_go_on(tmp_path):
    envs = Envs(n_envs=1, seed=22, max_len=200)
    steps = envs.steps(10)
    buf = create_buffer(frames_cfg('advanced', size=64))
    for t in steps[:4]:
        buf.push(t)
    with pytest.raises(ValueError):
        buf.push(dict(steps[4], priority=-1.0))
    before = buf.state_dict()
    with pytest.raises(ValueError):
        buf.push(dict(steps[4], next_obs=np.roll(steps[4]['next_obs'], 1, axis=0)))
    assert_same(buf.state_dict(), before)
    # a push the rate limiter refuses: the next step of the stream is still taken, also after a save and load
    cfg = frames_cfg('naive', size=64, thruput_controller=dict(push_sample_rate_limit=dict(max=3, min=0)))
    lim = create_buffer(cfg)
    for t in steps[:3]:
        assert lim.push(t) == 1
    lim.sample(1)
    assert lim.push(steps[3]) == 0  # 4 / 1 > 3: refused
    path = str(tmp_path / 'lim.pt')
    lim.save_data(path)
    again = create_buffer(cfg)
    again.load_data(path)
    for b in (lim, again):
        b.sample(3)  # room under the limit again
        assert b.push(steps[4]) == 1  # continues the refused step's next_obs
    assert_same(again.state_dict(), lim.state_dict())
    check_rows(lim.sample(4, replace=False), {t['step']: t for t in steps})


def test_n_step_sums_integer_rewards_as_floats():
    envs = Envs(n_envs=1, seed=23, max_len=200)
    steps = [dict(t, reward=1) for t in envs.steps(10)]
    cfg = frames_cfg('naive', size=16)
    cfg['storage']['frames'].update(n_step=3, gamma=0.5)
    buf = create_buffer(cfg)
    for t in steps:
        buf.push(t)
    out = buf.sample(10, replace=False)
    for s, r in zip(out['step'].tolist(), out['reward'].tolist()):
        assert r == pytest.approx(sum(0.5**j for j in range(min(3, 10 - s))))
    assert out['reward'].dtype == torch.float32


def test_states_a_frames_table_cannot_use_are_refused():
    envs = Envs(seed=24)
    buf = create_buffer(frames_cfg('naive'))
    push_all(buf, envs.steps(12), batched=False)
    state = buf.state_dict()
    fresh = create_buffer(frames_cfg('naive'))
    before = fresh.state_dict()
    bad = dict(state, storage=dict(state['storage'], frames=dict(state['storage']['frames'], stack=3)))
    with pytest.raises(ValueError):
        fresh.load_state_dict(bad)
    assert_same(fresh.state_dict(), before)
    cfg = frames_cfg('naive')
    cfg['storage']['frames'].update(n_step=3, reward_key='return_to_go')  # the saved items have no such field
    nstep = create_buffer(cfg)
    with pytest.raises(ValueError, match='return_to_go'):
        nstep.load_state_dict(state)


def test_a_push_of_more_new_frames_than_rows_keeps_only_what_fits():
    envs = Envs(n_envs=1, seed=25, max_len=1)  # one-step episodes: two frames a transition
    steps = envs.steps(30)
    pushed = {t['step']: t for t in steps}
    buf = create_buffer(frames_cfg('naive', size=8, spare=2))  # 10 frame rows, a push of 30 steps = 60 frames
    buf.push(steps)
    got = check_rows(buf.sample(buf.count(), replace=False), pushed)
    assert got and set(got) <= set(range(25, 30))


@pytest.mark.parametrize('key', ['key', 'next_key', 'done_key', 'reward_key'])
def test_a_frames_field_named_like_a_field_a_sample_adds_is_refused(key):
    """key='replay_unique_id' was accepted, and every sample returned frame stacks under the ids' name, so update
    failed; 'priority' failed every push of an advanced buffer with a message that did not name storage.frames."""
    for name in ('replay_unique_id', 'replay_buffer_idx', 'priority', 'collect_iter'):
        cfg = frames_cfg('advanced')
        cfg['storage']['frames'][key] = name
        with pytest.raises(ValueError, match=f"'storage.frames.{key}' has invalid value '{name}'"):
            create_buffer(cfg)


def test_streams_of_environments_long_gone_are_forgotten_and_live_ones_go_on():
    """A new environment id per episode (respawned actors): the state named the last item of every id ever seen
    (and memory held its stream), growing without bound at a fixed capacity. Only streams whose frames the ring
    still holds are kept; a stream that lives through the forgetting keeps its n-step successors."""
    cfg = dict(
        type='naive',
        replay_buffer_size=16,
        seed=0,
        storage=dict(type='tensor', frames=dict(env_key='env_id', stack=1, n_step=3, gamma=0.5)),
    )
    buf = create_buffer(cfg)
    pixel = iter(range(10**9))

    def frame():
        return torch.full((1, 2, 2), next(pixel) % 256, dtype=torch.uint8)

    live = frame()
    for ep in range(300):  # one short episode of a new environment, then one step of the live one
        obs = frame()
        for t in range(2):
            nxt = frame()
            buf.push({'obs': obs, 'next_obs': nxt, 'reward': 0.0, 'done': t == 1, 'env_id': 1000 + ep})
            obs = nxt
        nxt = frame()
        buf.push({'obs': live, 'next_obs': nxt, 'reward': 1.0, 'done': False, 'env_id': 0})
        live = nxt
    state = buf.state_dict()
    streams, last = state['storage']['frames']['streams'], state['storage']['links']['last']
    assert {e[0] for e in last} <= {e[0] for e in streams} and len(last) <= 16
    out = buf.sample(buf.count(), replace=False)
    rows = zip(out['env_id'].tolist(), out['replay_unique_id'].tolist(), out['n_step'].tolist())
    ks = [n for _, n in sorted((uid, n) for env, uid, n in rows if env == 0)]  # the live stream's, oldest first
    assert ks[:-2] == [3] * (len(ks) - 2) and ks[-2:] == [2, 1]  # the live stream's successors all kept
    again = create_buffer(cfg)
    again.load_state_dict(state)
    assert_same(again.state_dict(), state)


@pytest.mark.parametrize('btype', ['naive', 'episode'])
def test_big_endian_frame_stacks_are_stored_as_their_native_values(btype):
    """h5py and ``np.load`` hand out big-endian arrays: frames take them as the same values, as tensor storage
    does, mixed with native steps in one stream."""

    def step(t, order):
        s = _numbered_step(0, t, t)
        return dict(s, obs=s['obs'].astype(order + 'f4'), next_obs=s['next_obs'].astype(order + 'f4'))

    extra = dict(max_transitions=32) if btype == 'episode' else {}
    bufs = [create_buffer(frames_cfg(btype, **extra)) for _ in range(2)]
    orders = [['<'] * 4, ['>', '<', '>', '>']]
    for buf, order in zip(bufs, orders):
        steps = [step(t, o) for t, o in enumerate(order)]
        buf.push([steps] if btype == 'episode' else steps)
    assert_same(bufs[1].state_dict(), bufs[0].state_dict())
    if btype == 'naive':
        out = bufs[1].sample(4)
        assert out['obs'].dtype == torch.float32 and sorted(out['obs'][:, 0, 0, 0].tolist()) == [1, 2, 3, 4]

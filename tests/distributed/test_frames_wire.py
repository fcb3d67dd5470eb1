"""Frames on the wire: workers of a frames-once manager (storage.frames) send each step's new frame instead of its
two stacks, and the manager rebuilds them before its buffer sees the push. Checked against what the workers
pushed (every sampled stack equal to the pushed one), byte for byte on the wire, and against hostile or
out-of-step pushes (refused, nothing stored, the worker's pipeline resending in full where it can)."""

import numpy as np
import pytest
import torch
from easydict import EasyDict
from helpers import FrameEnvs, assert_same
from in_process import in_process_job

from ding_buffer import FramesOutOfStepError, create_buffer
from ding_buffer.distributed import ManagerCore, build_manager_buffer
from ding_buffer.distributed.frames_wire import FramesWireDecoder, FramesWireEncoder
from ding_buffer.storage.frames import frame_spec

SPEC = frame_spec(dict(env_key='env_id'))


def cfg_of(size=256, frames=None, n_step=1, **dist):
    frames = dict(env_key='env_id', n_step=n_step, gamma=0.5) if frames is None else frames
    return EasyDict(
        type='advanced',
        replay_buffer_size=size,
        seed=0,
        storage=dict(type='tensor', frames=frames),
        distributed=dict(backend='torch', timeout=10.0, heartbeat_seconds=5.0, **dist),
    )


def batches(steps, n_envs):
    """The steps as a vectorised collector pushes them: one row per environment."""
    for i in range(0, len(steps), n_envs):
        chunk = steps[i : i + n_envs]
        yield {k: np.stack([np.asarray(t[k]) for t in chunk]) for k in chunk[0]}


def check_sampled(out, pushed):
    for j, s in enumerate(out['step'].tolist()):
        ref = pushed[s]
        assert np.array_equal(out['obs'][j].numpy(), ref['obs']), f"obs of step {s}"
        assert np.array_equal(out['next_obs'][j].numpy(), ref['next_obs']), f"next_obs of step {s}"
        for k in ('env_id', 'done', 'truncated', 'action'):
            assert out[k][j].item() == ref[k], f"{k} of step {s}"


def manager_side(like=None, batched=False, budget=1 << 20):
    """A frames buffer and the decoder a manager of it has (it checks pushes against the buffer's frames). The
    buffer first stores ``like``'s first step (as another environment), so it knows the stack and frames (until
    then the decoder rebuilds nothing)."""
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=4096, seed=0, storage=dict(type='tensor', frames=dict(env_key='env_id')))
    )
    if like is not None:
        if batched:
            first = {k: v[:1] for k, v in like.items()}
            first['env_id'] = first['env_id'] * 0 - 999
            first['step'] = first['step'] * 0 - 1
        else:
            first = dict((like if isinstance(like, list) else [like])[0], env_id=-999, step=-1)
        buf.push(first, batched=batched)
    return buf, FramesWireDecoder(SPEC, budget, lambda: buf.storage)


def roundtrip(enc, dec, buf, data, batched, seq, client='w'):
    """Encode on the worker, rebuild on the manager, store, and move the worker's chain on (as the manager does)."""
    wire, meta = enc.encode(data, batched, seq)
    full, commit = dec.expand(client, seq, wire, batched, meta)
    buf.push(full, batched=batched)
    commit()
    return wire, meta, full


def assert_rows_equal(got, want, batched):
    if batched:
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(np.asarray(got[k]), np.asarray(want[k])), k
        return
    got, want = (got, want) if isinstance(want, list) else ([got], [want])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            assert np.array_equal(np.asarray(g[k]), np.asarray(w[k])), k


@pytest.mark.parametrize('form', ['item', 'list', 'batch', 'torch_batch'])
def test_the_decoder_rebuilds_exactly_what_was_pushed(form):
    """Random streams of 3 environments with terminations, truncations and repeated reset frames: whatever the
    push form, the manager's side rebuilds every field of every step exactly, and continuing steps travel
    without obs and with one frame of next_obs."""
    envs = FrameEnvs(n_envs=3, seed=1, max_len=6)
    enc = FramesWireEncoder(SPEC)
    steps = envs.steps(240)
    if form == 'item':
        pushes = [(s, False) for s in steps]
    elif form == 'list':
        pushes = [(steps[i : i + 5], False) for i in range(0, len(steps), 5)]
    else:
        pushes = [(b, True) for b in batches(steps, 3)]
        if form == 'torch_batch':
            pushes = [({k: torch.as_tensor(v) for k, v in b.items()}, True) for b, _ in pushes]
    buf, dec = manager_side(*pushes[0])
    for seq, (data, batched) in enumerate(pushes):
        wire, meta, full = roundtrip(enc, dec, buf, data, batched, seq)
        want = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in data.items()} if batched else data
        assert_rows_equal(full, want, batched)
        assert meta['shift'] is True and meta['base'] == (seq - 1 if seq else None)
    assert enc.stats['steps'] == len(steps) and enc.stats['next_as_frame'] == len(steps)
    # every step but the first of each episode leaves its obs out
    starts = sum(1 for i, s in enumerate(steps) if i < 3 or steps[i - 3]['done'] or steps[i - 3]['truncated'])
    assert enc.stats['obs_omitted'] == len(steps) - starts


def test_a_push_the_manager_cannot_chain_is_refused_and_changes_nothing():
    """A push on top of a push the manager does not hold (skipped, forgotten, or a base from the future) raises
    FramesOutOfStepError; malformed meta or fields raise ValueError; the decoder then still takes the chain it
    holds."""
    envs = FrameEnvs(n_envs=2, seed=2, max_len=50)
    enc = FramesWireEncoder(SPEC)
    first = envs.steps(2)
    buf, dec = manager_side(first)
    roundtrip(enc, dec, buf, first, False, 0)
    second = envs.steps(2)
    wire, meta = enc.encode(second, False, 1)
    assert meta['cont'] == [True, True]
    with pytest.raises(FramesOutOfStepError, match='does not hold'):
        dec.expand('w', 5, wire, False, dict(meta, base=3))  # the manager holds push 0, not 3
    with pytest.raises(FramesOutOfStepError):
        dec.expand('other', 1, wire, False, meta)  # another worker's chain: none
    bad = [
        (wire, dict(meta, v=2), 'frames'),
        (wire, dict(meta, cont=[True]), '1 flags for 2 items'),
        (wire, dict(meta, cont=['yes', True]), 'frames'),
        (wire, dict(meta, base=1), 'below'),
        (wire, {**meta, 'extra': 1}, 'frames'),
        ([], dict(meta, cont=[]), 'at least one step'),
        ([dict(wire[0], obs=second[0]['obs']), wire[1]], meta, 'leaves it out'),
        ([dict(wire[0], next_obs=second[0]['next_obs']), wire[1]], meta, 'stack of 4 frames, expected 1'),
        ([dict(wire[0], next_obs=np.zeros((1, 3, 3), np.uint8)), wire[1]], meta, 'shape'),
        ([dict(wire[0], env_id=7), wire[1]], meta, 'no step before it'),
    ]
    for data, m, needle in bad:
        with pytest.raises(ValueError, match=needle):
            dec.expand('w', 1, data, False, m)
    full, _ = dec.expand('w', 1, wire, False, meta)  # the chain it holds still works
    assert_rows_equal(full, second, False)


def test_a_budget_too_small_forgets_workers_and_their_pushes_come_again_in_full():
    """frames_wire_mb=0: the manager forgets every worker's stacks after each push; each continuing push is
    refused out of step and the worker sends it again in full, transparently: samples stay exact."""
    cfg = cfg_of(frames_wire_mb=0.0)
    mgr, out, th, (w,) = in_process_job(cfg, n_workers=1)
    envs = FrameEnvs(n_envs=2, seed=3, max_len=8)
    pushed = {}
    for s in envs.steps(40):
        w.push(s)
        pushed[s['step']] = s
    got = w.sample(40)
    check_sampled(got, pushed)
    assert w.pushes.frames.stats['resent_full'] > 0
    assert w.stats()['manager/frames_wire_out_of_step'] == w.pushes.frames.stats['resent_full']
    w.close()
    th.join(20)
    assert out['lost'] == {}, out


def _wire_bytes(frames_wire, side=84, n=64, n_step=1):
    cfg = cfg_of(frames=dict(env_key='env_id', n_step=n_step, gamma=0.5), frames_wire=frames_wire)
    mgr, out, th, (a, b) = in_process_job(cfg, n_workers=2)
    pushed = {}
    for e, w in ((0, a), (1, b)):
        envs = FrameEnvs(n_envs=1, seed=10 + e, max_len=1000, side=side)
        for s in envs.steps(n):
            s = dict(s, env_id=e, step=1000 * e + s['step'])
            w.push(s)
            pushed[s['step']] = s
    got = a.sample(2 * n)
    check_sampled(got, pushed)
    sent = a._channel.transport.sent_bytes + b._channel.transport.sent_bytes
    a.close()
    b.close()
    th.join(20)
    assert out['lost'] == {}, out
    return sent


def test_two_workers_send_one_frame_a_step_and_samples_are_exact():
    """Two workers, each its own environment, 64 steps of 84x84 stacks of 4: with frames_wire the bytes sent
    by the workers are over 6x fewer than with full stacks (8 frames a step against 1, plus headers and each
    episode's first stack), and what a worker samples is exactly what was pushed."""
    full = _wire_bytes(False)
    compact = _wire_bytes(True)
    frame = 84 * 84
    assert full > 2 * 64 * 8 * frame  # both stacks travelled
    assert compact < 2 * 64 * frame * 1.3  # about one frame a step
    assert full / compact > 6


def test_n_step_returns_through_the_wire_equal_the_local_buffer():
    """The same vectorised pushes, once into a local buffer and once through a worker (frames_wire on): the
    manager's state equals the local buffer's (frames, links, n-step chains)."""
    cfg = cfg_of(size=64, n_step=3)
    local = create_buffer(EasyDict({k: v for k, v in cfg.items() if k != 'distributed'}))
    mgr, out, th, (w,) = in_process_job(cfg, n_workers=1)
    steps = FrameEnvs(n_envs=3, seed=4, max_len=7).steps(150)
    for b in batches(steps, 3):
        local.extend(b)
        w.extend(b)
    assert w.pushes.frames.stats['obs_omitted'] > 100
    assert_same(w.state_dict(), local.state_dict())
    w.close()
    th.join(20)
    local.close()


def test_a_worker_without_frames_wire_and_a_manager_without_frames():
    """A push without 'frames' ends the worker's chain (its next continuing push would be refused); a manager
    whose buffer stores stacks refuses 'frames' by name and stores nothing."""
    buf, dcfg, key = build_manager_buffer(cfg_of())
    core = ManagerCore(buf, dcfg, key)
    enc = FramesWireEncoder(SPEC)
    envs = FrameEnvs(n_envs=1, seed=5, max_len=100)
    s0, s1 = envs.steps(2)

    def push(seq, data, meta=None):
        args = dict(data=data, client='c', seq=seq)
        if meta is not None:
            args['frames'] = meta
        return core.handle(1, {'op': 'push', 'id': seq, 'shard': 0, 'args': args})

    buf.push(dict(s0, env_id=-999, step=-1))  # (the buffer holds frames: the manager rebuilds to its stack)
    wire, meta = enc.encode(s0, False, 0)
    assert push(0, wire, meta)['ok']
    assert push(1, s1)['ok']  # sent as pushed: the chain ends
    s2 = envs.steps(1)[0]
    enc.reset()
    enc.encode(s1, False, 1)
    wire, meta = enc.encode(s2, False, 2)
    before = buf.state_dict()
    reply = push(2, wire, meta)
    assert not reply['ok'] and reply['error'] == 'FramesOutOfStepError', reply
    assert_same(buf.state_dict(), before)

    plain = dict(cfg_of(), storage=dict(type='tensor'))
    buf2, dcfg2, key2 = build_manager_buffer(EasyDict(plain))
    core2 = ManagerCore(buf2, dcfg2, key2)
    wire, meta = FramesWireEncoder(SPEC).encode(s0, False, 0)
    reply = core2.handle(
        1, {'op': 'push', 'id': 1, 'shard': 0, 'args': dict(data=wire, frames=meta, client='c', seq=0)}
    )
    assert not reply['ok'] and 'does not keep frames once' in reply['message']
    assert buf2.count() == 0


@pytest.mark.parametrize(
    'key, value, needle',
    [('frames_wire', 'yes', 'expected bool'), ('frames_wire_mb', -1, 'MiB'), ('frames_wire_mb', float('nan'), 'MiB')],
)
def test_bad_frames_wire_config_names_the_key(key, value, needle):
    from ding_buffer.distributed.config import build_distributed_config

    with pytest.raises(ValueError, match=f"distributed.{key}.*{needle}"):
        build_distributed_config(dict(backend='torch', **{key: value}))


@pytest.mark.parametrize('check', [True, False], ids=['checked', 'unchecked'])
def test_async_pushes_the_manager_forgets_arrive_once_in_order_from_reused_arrays(check):
    """async_score, a manager that forgets the worker between its pushes (another worker's stacks take the whole
    budget), and a caller writing every step into the same two arrays: each push that comes back out of step is
    sent again in full before the next one goes out, from what the caller pushed then. Every step is stored
    once, with its own stacks (with storage.frames.check off too, where nothing else would notice)."""
    cfg = cfg_of(frames=dict(env_key='env_id', check=check), frames_wire_mb=250 / 2**20, async_score=True)
    mgr, out, th, (a, b) = in_process_job(cfg, n_workers=2)
    envs = FrameEnvs(n_envs=2, seed=3, max_len=1000)
    other = FrameEnvs(n_envs=1, seed=9, max_len=1000)
    obs, nxt = np.zeros((4, 5, 5), np.uint8), np.zeros((4, 5, 5), np.uint8)
    pushed = {}
    for i, s in enumerate(envs.steps(12)):
        pushed[s['step']] = s
        obs[...], nxt[...] = s['obs'], s['next_obs']
        a.push(dict(s, obs=obs, next_obs=nxt))
        if i in (3, 7):  # the other worker's push: the manager forgets worker a (least recently seen)
            t = dict(other.steps(1)[0], env_id=5, step=1000 + i)
            b.push(t)
            pushed[t['step']] = t
    a.drain_pending_score(10)
    b.drain_pending_score(10)
    assert a.count() == len(pushed)
    got = a.sample(len(pushed))
    assert sorted(got['step'].tolist()) == sorted(pushed)
    check_sampled(got, pushed)
    assert a.pushes.frames.stats['resent_full'] > 0
    assert a.stats()['manager/duplicate_pushes'] == 0
    a.close()
    b.close()
    th.join(20)


def test_a_crafted_push_cannot_make_the_manager_build_large_stacks():
    """A push whose obs is a stack of 20,000 frames, followed by steps that continue it with one frame each,
    is refused against the buffer's own stack (4) before anything large is built; a push continuing a chain
    before the buffer holds any frame is out of step."""
    import tracemalloc

    buf, dcfg, key = build_manager_buffer(cfg_of())
    core = ManagerCore(buf, dcfg, key)
    honest = FrameEnvs(n_envs=1, seed=6, max_len=100, side=8).steps(3)

    def push(seq, data, meta, client='c'):
        args = dict(data=data, client=client, seq=seq, frames=meta)
        return core.handle(1, {'op': 'push', 'id': seq, 'shard': 0, 'args': args})

    early = dict(v=1, base=0, cont=[True], shift=True)
    reply = push(1, [dict(honest[0], obs=None, next_obs=honest[0]['next_obs'][-1:])], early, client='early')
    assert reply['error'] == 'FramesOutOfStepError', reply
    assert push(0, [honest[0]], dict(v=1, base=None, cont=[False], shift=False))['ok']
    n = 1500
    big = np.zeros((20000, 8, 8), np.uint8)
    items = [dict(honest[1], obs=big, next_obs=big[-1:])] + [
        {k: v for k, v in dict(honest[1], next_obs=big[-1:]).items() if k != 'obs'} for _ in range(n - 1)
    ]
    before = buf.state_dict()
    tracemalloc.start()
    reply = push(1, items, dict(v=1, base=None, cont=[False] + [True] * (n - 1), shift=True))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert not reply['ok'] and 'stack of 20000 frames, expected 4' in reply['message'], reply
    assert peak < 50 * 2**20, peak  # (rebuilt in full: 1500 x 2 x 20000 frames of 64 bytes = 3.8 GB)
    assert_same(buf.state_dict(), before)


def test_the_held_stacks_stay_within_the_budget_and_refused_pushes_add_none():
    """Many workers with many environments: what the manager holds, overheads counted, stays within
    frames_wire_mb; a push the buffer refuses leaves nothing held."""
    envs = FrameEnvs(n_envs=1, seed=7, max_len=1000, side=4)
    buf, dec = manager_side(envs.steps(1), budget=64 * 1024)
    for w in range(300):
        enc = FramesWireEncoder(SPEC)
        steps = [dict(s, env_id=w * 1000 + k, step=w * 1000 + k) for k, s in enumerate(envs.steps(5))]
        roundtrip(enc, dec, buf, steps, False, 0, client=f'w{w}')
        assert dec.held_bytes <= 64 * 1024
    assert 0 < dec.held_workers < 300
    held = dec.held_workers, dec.held_bytes
    enc = FramesWireEncoder(SPEC)
    bad = dict(envs.steps(1)[0], env_id=-1, action='x')  # the buffer refuses it (action is an int column)
    wire, meta = enc.encode(bad, False, 0)
    full, commit = dec.expand('bad', 0, wire, False, meta)
    with pytest.raises((TypeError, ValueError)):
        buf.push(full)
    assert (dec.held_workers, dec.held_bytes) == held  # (commit is called only for a push the buffer took)


def test_the_encoder_sends_what_it_cannot_read_as_it_is():
    """Malformed steps are not the encoder's to judge: sent as pushed, the buffer names the field."""
    enc = FramesWireEncoder(SPEC)
    steps = FrameEnvs(n_envs=3, seed=8).steps(3)
    batch = next(batches(steps, 3))
    for bad in (
        {k: v[:0] for k, v in batch.items()},  # an empty batch: the buffer says why
        dict(batch, env_id=batch['env_id'][:2]),  # a short env_id column
        dict(batch, done=np.bool_(False)),  # one flag for a batch
        {k: (torch.as_tensor(v).to(torch.bfloat16) if k == 'obs' else v) for k, v in batch.items()},
    ):
        wire, meta = enc.encode(bad, True, 0)
        assert meta is None and wire is bad


def test_nothing_is_rebuilt_before_the_buffer_holds_frames():
    """Until the manager's buffer holds frames (so a stack), a push of new frames is out of step: the worker's
    pipeline sends it again as it was pushed, and later pushes travel as new frames."""
    buf, dec = manager_side()  # empty: no stack yet
    enc = FramesWireEncoder(SPEC)
    steps = FrameEnvs(n_envs=1, seed=11, max_len=100).steps(3)
    wire, meta = enc.encode(steps[:2], False, 0)
    with pytest.raises(FramesOutOfStepError, match='holds no frames yet'):
        dec.expand('w', 0, wire, False, meta)
    cfg = cfg_of()
    mgr, out, th, (w,) = in_process_job(cfg, n_workers=1)
    pushed = {}
    for s in FrameEnvs(n_envs=2, seed=12, max_len=100).steps(20):
        w.push(s)
        pushed[s['step']] = s
    check_sampled(w.sample(20), pushed)
    assert w.pushes.frames.stats['resent_full'] == 1 and w.pushes.frames.stats['obs_omitted'] >= 17
    w.close()
    th.join(20)


def test_a_push_continuing_bfloat16_frames_is_refused_by_name_and_changes_nothing():
    """A manager whose buffer holds bfloat16 frames (numpy has no such dtype) checks a push that continues a chain
    against them: a continuation of other frames is refused with a clear error (it raised "Got unsupported
    ScalarType BFloat16"), the buffer is unchanged, and full bfloat16 stacks are still stored."""
    buf, dcfg, key = build_manager_buffer(cfg_of())
    core = ManagerCore(buf, dcfg, key)
    steps = FrameEnvs(n_envs=1, seed=6, max_len=100, side=8).steps(3)
    bf16 = [
        dict(
            s,
            obs=torch.from_numpy(s['obs']).to(torch.bfloat16),
            next_obs=torch.from_numpy(s['next_obs']).to(torch.bfloat16),
        )
        for s in steps
    ]

    def push(seq, data, meta, client='c'):
        args = dict(data=data, client=client, seq=seq, frames=meta)
        return core.handle(1, {'op': 'push', 'id': seq, 'shard': 0, 'args': args})

    enc = FramesWireEncoder(SPEC)
    wire, meta = enc.encode([bf16[0]], False, 0)
    assert meta is None  # the worker sends frames numpy cannot read as they are
    assert push(0, wire, meta)['ok']
    before = buf.state_dict()
    crafted = [{k: v for k, v in dict(steps[1], next_obs=steps[1]['next_obs'][-1:]).items() if k != 'obs'}]
    reply = push(1, [bf16[1], crafted[0]], dict(v=1, base=None, cont=[False, True], shift=True))
    assert not reply['ok'] and reply['error'] in ('ValueError', 'TypeError', 'FramesOutOfStepError'), reply
    assert 'ScalarType' not in reply['message'] and 'frame' in reply['message'], reply
    assert_same(buf.state_dict(), before)
    assert push(2, [bf16[1], bf16[2]], None)['ok']
    assert buf.count() == 3


def test_a_step_a_local_buffer_refuses_for_a_signed_zero_is_refused_through_the_wire():
    """The worker compared frames by value (-0.0 == 0.0), left the pushed frames out and the manager rebuilt them
    from the +0.0 ones it held: a step the buffer refuses (its checks compare bits) was stored, with other frames."""
    cfg = cfg_of(size=64, frames=dict(env_key='env_id'))
    local = create_buffer(EasyDict({k: v for k, v in cfg.items() if k != 'distributed'}))
    mgr, out, th, (worker,) = in_process_job(cfg, 1)

    def f(v):
        return np.full((2,), v, np.float32)

    def step(env, obs, nxt):
        return dict(obs=np.stack(obs), next_obs=np.stack(nxt), reward=0.0, done=False, env_id=env)

    first = [step(0, [f(1), f(2)], [f(2), f(0.0)]), step(1, [f(4), f(5)], [f(5), f(0.0)])]
    broken = [
        step(0, [f(2), f(-0.0)], [f(-0.0), f(3)]),  # obs does not continue env 0 bit for bit
        step(1, [f(5), f(0.0)], [f(-0.0), f(6)]),  # next_obs is not obs shifted bit for bit
    ]
    try:
        for buf in (local, worker):
            for s in first:
                assert buf.push(s) == 1
            for s, needle in zip(broken, ('does not continue environment 0', 'shifted by one frame')):
                with pytest.raises(ValueError, match=needle):
                    buf.push(s)
        assert worker.count() == local.count() == 2
        got = worker.sample(2)
        assert not np.signbit(got['obs'].numpy()).any() and not np.signbit(got['next_obs'].numpy()).any()
    finally:
        worker.close()
        th.join(20)


def test_a_peer_naming_another_workers_client_id_cannot_replace_its_chain():
    """The chain was keyed by the client id alone: another peer's push naming it replaced the chain, and the honest
    worker's next valid push was refused."""
    buf, dcfg, key = build_manager_buffer(cfg_of(size=64, frames=dict(env_key='env_id')))
    core = ManagerCore(buf, dcfg, key)

    def push(sender, seq, data, meta):
        args = dict(data=data, client='A', seq=seq, frames=meta)
        return core.handle(sender, {'op': 'push', 'id': seq, 'shard': 0, 'args': args})

    honest = FrameEnvs(n_envs=1, seed=1, max_len=100)
    buf.push(dict(honest.steps(1)[0], env_id=-1))  # the buffer holds frames
    enc = FramesWireEncoder(SPEC)
    for seq in range(2):
        assert push(1, seq, *enc.encode(honest.steps(1)[0], False, seq))['ok']
    other = dict(FrameEnvs(n_envs=1, seed=2, max_len=100).steps(1)[0], env_id=7)
    assert push(2, 1, [other], dict(v=1, base=None, cont=[False], shift=False))['ok']  # its own chain
    step = honest.steps(1)[0]
    reply = push(1, 2, *enc.encode(step, False, 2))
    assert reply['ok'], reply
    assert buf.count() == 5  # the first step, the honest worker's three and the other peer's one


@pytest.mark.parametrize('crafted', ['bfloat16 next_obs', 'short env column', '0-d env column'])
def test_a_crafted_batched_frames_push_is_refused_naming_what_is_wrong(crafted):
    """A batched push with 'frames' of bfloat16 frames, or with a flag column not one a row, raised a bare TypeError
    or IndexError naming nothing."""
    buf, dcfg, key = build_manager_buffer(cfg_of(size=64, frames=dict(env_key='env_id')))
    core = ManagerCore(buf, dcfg, key)
    steps = FrameEnvs(n_envs=2, seed=1, max_len=100).steps(3)
    buf.push(steps[0])  # the buffer holds frames
    batch = {k: np.stack([np.asarray(t[k]) for t in steps[1:]]) for k in steps[0]}
    data = dict(batch, next_obs=batch['next_obs'][:, -1:])
    if crafted == 'bfloat16 next_obs':
        data['next_obs'], needle = torch.from_numpy(data['next_obs']).to(torch.bfloat16), 'numpy cannot read'
    else:
        data['env_id'], needle = batch['env_id'][:1] if crafted == 'short env column' else np.int64(0), "'env_id'"
    before = buf.state_dict()
    meta = dict(v=1, base=None, cont=[False, False], shift=True)
    args = dict(data=data, client='c', seq=1, frames=meta, batched=True)
    reply = core.handle(1, {'op': 'push', 'id': 1, 'shard': 0, 'args': args})
    assert not reply['ok'] and reply['error'] == 'ValueError' and needle in reply['message'], reply
    assert_same(buf.state_dict(), before)

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

from ding_buffer import FramesOutOfStepError
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


def roundtrip(enc, dec, data, batched, seq, client='w'):
    wire, meta = enc.encode(data, batched, seq)
    return wire, meta, dec.expand(client, seq, wire, batched, meta)


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
    enc, dec = FramesWireEncoder(SPEC), FramesWireDecoder(SPEC, 1 << 20)
    steps = envs.steps(240)
    if form == 'item':
        pushes = [(s, False) for s in steps]
    elif form == 'list':
        pushes = [(steps[i : i + 5], False) for i in range(0, len(steps), 5)]
    else:
        pushes = [(b, True) for b in batches(steps, 3)]
        if form == 'torch_batch':
            pushes = [({k: torch.as_tensor(v) for k, v in b.items()}, True) for b, _ in pushes]
    for seq, (data, batched) in enumerate(pushes):
        wire, meta, full = roundtrip(enc, dec, data, batched, seq)
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
    enc, dec = FramesWireEncoder(SPEC), FramesWireDecoder(SPEC, 1 << 20)
    first = envs.steps(2)
    roundtrip(enc, dec, first, False, 0)
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
        ([dict(wire[0], obs=second[0]['obs']), wire[1]], meta, 'leaves it out'),
        ([dict(wire[0], next_obs=second[0]['next_obs']), wire[1]], meta, 'stack of 4 frames, expected 1'),
        ([dict(wire[0], next_obs=np.zeros((1, 3, 3), np.uint8)), wire[1]], meta, 'shape'),
        ([dict(wire[0], env_id=7), wire[1]], meta, 'no step before it'),
    ]
    for data, m, needle in bad:
        with pytest.raises(ValueError, match=needle):
            dec.expand('w', 1, data, False, m)
    full = dec.expand('w', 1, wire, False, meta)  # the chain it holds still works
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
    from ding_buffer import create_buffer

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

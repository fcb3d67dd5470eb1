"""One rank of a multi-process test of the distributed buffer (launched by tests/test_distributed_procs.py).

Usage: ``python rank_main.py SCENARIO BACKEND OUTDIR`` on every rank (torchrun / env:// ranks for 'torch',
mpirun for 'mpi'). Ranks 0 and 1 are workers, rank 2 (the last) the manager. Every rank writes
``OUTDIR/rank{r}.json``; a rank that fails records the traceback there and exits 1.

Scenarios: roundtrip (advanced buffer, sample/update/stats/oversized push/checkpoint), gfn_min (baseline 'min'
on a small prioritized gfn buffer), gfn_ema_async (baseline 'ema', async_score, remote_buffer_freq),
kill_worker (worker 0 SIGKILLs itself), kill_manager (the manager SIGKILLs itself).
"""
import json
import os
import signal
import sys
import threading
import time
import traceback

import torch

SCENARIO, BACKEND, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
MANAGER = 2
OVERSIZE_TIMEOUT = 6.0
T0 = time.monotonic()


def env_rank() -> int:
    keys = ('RANK', ) if BACKEND == 'torch' else ('OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'PMI_RANK')
    for key in keys:
        if key in os.environ:
            return int(os.environ[key])
    raise RuntimeError('cannot tell the rank from the environment')


RANK = env_rank()
RESULT = {'rank': RANK, 'scenario': SCENARIO, 'backend': BACKEND, 'events': []}


def write() -> None:
    tmp = os.path.join(OUT, f'rank{RANK}.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(RESULT, f, default=repr)
    os.replace(tmp, os.path.join(OUT, f'rank{RANK}.json'))


def jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, 'item') and hasattr(x, 'dtype'):  # numpy scalars
        return x.item()
    return x


def make_buffer(cfg):
    from ding_buffer import create_buffer
    return create_buffer(cfg)


# ---------------------------------------------------------------------------------------------- data
def adv_batch(rank: int, step: int, n: int = 4):
    tags = torch.tensor([rank * 10000 + step * 100 + i for i in range(n)], dtype=torch.int64)
    return {'obs': tags.float().unsqueeze(1).repeat(1, 4), 'tag': tags, 'log_reward': tags.float() / 1000}


def gfn_reward(rank: int, step: int, i: int) -> float:
    # distinct, not monotone in arrival order, exactly representable in float32
    return float(((rank * 37 + step * 11 + i * 5) % 53) - 20) / 4


def gfn_batch(rank: int, step: int, n: int):
    tags = [rank * 1000 + step * 10 + i for i in range(n)]
    state = torch.tensor([[float(t), 0.0] for t in tags])
    return {'state': state, 'log_reward': torch.tensor([gfn_reward(rank, step, i) for i in range(n)])}


ARRIVALS = []


def recorder(batch, sender=None, buffer=None):
    """Manager scoring function: records the arrival order of pushes and echoes the batch's first tag."""
    tags = batch['state'][:, 0].tolist()
    ARRIVALS.append({'sender': int(sender), 'tags': tags, 'log_rewards': batch['log_reward'].tolist()})
    return {'seq': len(ARRIVALS) - 1, 'tag': tags[0]}


# ---------------------------------------------------------------------------------------------- configs
def config():
    d = dict(backend=BACKEND, timeout=20.0, heartbeat_seconds=1.0)
    if SCENARIO == 'roundtrip':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        if RANK == MANAGER:
            d.update(checkpoint_path=os.path.join(OUT, 'ckpt.buf'), max_message_mb=1)
        elif RANK == 0:
            d.update(timeout=OVERSIZE_TIMEOUT)  # bounds the wait if the manager's error reply never matches
    elif SCENARIO == 'gfn_min':
        cfg = dict(type='gfn', prioritized_capacity=True, replay_buffer_size=8)
        d.update(baseline_strategy='min')
    elif SCENARIO == 'gfn_ema_async':
        cfg = dict(type='gfn', prioritized_capacity=True, replay_buffer_size=1000)
        d.update(baseline_strategy='ema', baseline_ema_alpha=0.3)
        if RANK == 0:
            d.update(async_score=True)
        elif RANK == 1:
            d.update(remote_buffer_freq=2)
    elif SCENARIO == 'kill_worker':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        d.update(peer_timeout=3.0, heartbeat_seconds=0.5)
    elif SCENARIO == 'kill_manager':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        d.update(timeout=5.0, heartbeat_seconds=0.5)
    else:
        raise ValueError(SCENARIO)
    if RANK == MANAGER and SCENARIO.startswith('gfn'):
        d.update(scoring_function=recorder)
    cfg['distributed'] = d
    return cfg


# ---------------------------------------------------------------------------------------------- manager
def manager(buf):
    from ding_buffer.distributed import ReplayBufferManager
    assert isinstance(buf, ReplayBufferManager), type(buf)
    if SCENARIO == 'kill_manager':
        th = threading.Thread(target=buf.run, kwargs=dict(timeout=60), daemon=True)
        th.start()
        end = time.monotonic() + 30  # die once both workers are being served (a few pushes in), whatever the load
        while buf.core.counters['push_requests'] < 8 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)
        RESULT['count_before_kill'] = buf.buffer.count()
        RESULT['killed_at'] = time.time()
        write()
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    summary = buf.run(timeout=60)
    RESULT['run_seconds'] = time.monotonic() - start
    RESULT['summary'] = jsonable(summary)
    inner = buf.buffer
    RESULT['count'] = inner.count()
    if hasattr(inner, 'log_rewards'):
        RESULT['log_rewards'] = sorted(inner.log_rewards().tolist())
    else:
        rows = inner.storage.gather(inner.storage.ring.ordered_slots())
        RESULT['tags'] = rows['tag'].tolist()
        RESULT['obs_ok'] = bool((rows['obs'] == rows['tag'].float().unsqueeze(1)).all())
    RESULT['arrivals'] = ARRIVALS
    buf.close()


# ---------------------------------------------------------------------------------------------- workers
def push_record(buf, data, **kw):
    n = buf.push(data, **kw)
    RESULT['events'].append({'pushed': n, 'score': jsonable(buf.last_score)})
    return n


def wait_pushes(buf, n, deadline=30.0):
    end = time.monotonic() + deadline
    while True:
        st = buf.stats()
        if st['manager/push_requests'] >= n or time.monotonic() > end:
            return st
        time.sleep(0.05)


def worker_roundtrip(buf):
    for step in range(5):
        push_record(buf, adv_batch(RANK, step), batched=True)
    s = buf.sample(4, timeout=10)
    RESULT['sample_tags'] = s['tag'].tolist()
    RESULT['sample_obs_ok'] = bool((s['obs'] == s['tag'].float().unsqueeze(1)).all())
    RESULT['sample_keys'] = sorted(s)
    RESULT['update'] = buf.update({'replay_unique_id': s['replay_unique_id'], 'replay_buffer_idx': s['replay_buffer_idx'],
                                   'priority': torch.full((4, ), 2.0)})
    st = wait_pushes(buf, 10)
    RESULT['stats'] = {k: v for k, v in st.items() if k.startswith('manager/') or k in ('count', 'push_count')}
    if RANK == 0:  # oversized push (manager has max_message_mb=1), then a small one
        big = adv_batch(0, 50, n=80000)  # ~2.2 MB > max_message_mb=1
        t = time.monotonic()
        try:
            buf.push(big, batched=True)
            RESULT['oversized'] = {'error': None}
        except Exception as e:
            RESULT['oversized'] = {'error': type(e).__name__, 'mro': [c.__name__ for c in type(e).__mro__],
                                   'message': str(e), 'elapsed': time.monotonic() - t}
        write()
        push_record(buf, adv_batch(0, 60, n=3), batched=True)
        RESULT['count_after_small'] = buf.count()
    buf.close()
    RESULT['closed'] = True


def worker_gfn_min(buf):
    for step in range(6):
        push_record(buf, gfn_batch(RANK, step, 3))
    buf.close()


def worker_gfn_ema_async(buf):
    if RANK == 0:
        for step in range(5):
            push_record(buf, gfn_batch(RANK, step, 3))
        RESULT['drained'] = jsonable(buf.drain_pending_score(timeout=10))
        RESULT['drained_again'] = jsonable(buf.drain_pending_score(timeout=10))
    else:
        for step in range(6):
            push_record(buf, gfn_batch(RANK, step, 2))
    buf.close()


def worker_kill_worker(buf):
    if RANK == 0:
        for step in range(3):
            push_record(buf, adv_batch(RANK, step), batched=True)
        RESULT['killed_at'] = time.time()
        write()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    end = time.monotonic() + 5.0  # keep pushing well past the manager's peer_timeout (3 s) after the kill
    step = 0
    while time.monotonic() < end:
        push_record(buf, adv_batch(RANK, step), batched=True)
        step += 1
        time.sleep(0.1)
    RESULT['steps'] = step
    buf.close()
    RESULT['closed'] = True


def worker_kill_manager(buf):
    last_ok = time.monotonic()
    step = 0
    try:
        while time.monotonic() - T0 < 120:
            push_record(buf, adv_batch(RANK, step), batched=True)
            last_ok = time.monotonic()
            step += 1
            time.sleep(0.1)
        RESULT['error'] = None
    except Exception as e:
        RESULT['error'] = {'type': type(e).__name__, 'mro': [c.__name__ for c in type(e).__mro__], 'message': str(e),
                           'elapsed': time.monotonic() - last_ok}
    RESULT['steps'] = step
    write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the manager is gone: skip interpreter teardown of the broken process group


def main() -> None:
    try:
        buf = make_buffer(config())
        RESULT['role'] = 'manager' if RANK == MANAGER else 'worker'
        RESULT['setup_seconds'] = time.monotonic() - T0
        if RANK == MANAGER:
            manager(buf)
        else:
            globals()['worker_' + SCENARIO](buf)
        RESULT['ok'] = True
    except BaseException as e:
        RESULT['ok'] = False
        RESULT['traceback'] = traceback.format_exc()
        RESULT['exception'] = type(e).__name__
        write()
        print(f'rank {RANK} failed:\n' + RESULT['traceback'], file=sys.stderr, flush=True)
        sys.exit(1)
    RESULT['seconds'] = time.monotonic() - T0
    write()


if __name__ == '__main__':
    main()

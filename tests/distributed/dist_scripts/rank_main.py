"""One rank of a multi-process test of the distributed buffer (launched by tests/distributed/test_distributed_procs.py).

Usage: ``python rank_main.py SCENARIO BACKEND OUTDIR`` on every rank (torchrun / env:// ranks for 'torch',
mpirun for 'mpi'). Ranks 0 and 1 are workers, rank 2 (the last) the manager. Every rank writes
``OUTDIR/rank{r}.json``; a rank that fails records the traceback there and exits 1.

Scenarios: roundtrip (advanced buffer, sample/update/stats/oversized push/checkpoint, torch.save of results,
file requests), gfn_min (baseline 'min' on a small prioritized gfn buffer), gfn_ema_async (baseline 'ema',
async_score, remote_buffer_freq), kill_worker (worker 0 SIGKILLs itself; kill_worker_exit: the same with a longer
distributed.timeout, to see the survivors' processes end once their work is done), kill_manager (the manager
SIGKILLs itself), hostile (rank 0 sends crafted and random bytes to the manager while rank 1 is served), freeze_manager
(rank 1 SIGSTOPs the manager for longer than the timeout while rank 0 pushes with retries), freeze_worker
(rank 1 freezes rank 0 past peer_timeout; rank 0 rejoins), freeze_worker_end (the same, but rank 1 exits while
rank 0 is frozen, so the manager ends first), frames (frames stored once, the workers sending new frames).
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
    keys = ('RANK',) if BACKEND == 'torch' else ('OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'PMI_RANK')
    for key in keys:
        if key in os.environ:
            return int(os.environ[key])
    raise RuntimeError('cannot tell the rank from the environment')


RANK = env_rank()
open(os.path.join(OUT, f'started{RANK}'), 'w').close()  # the process began (a failed launch's file list tells)
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
FREEZE_TIMEOUT = 3.0  # distributed.timeout of the freeze scenarios
KILL_EXIT_TIMEOUT = 40.0  # distributed.timeout of kill_worker_exit
FREEZE_SECONDS = 8.0


def config():
    d = dict(backend=BACKEND, timeout=20.0, heartbeat_seconds=1.0)
    if SCENARIO == 'roundtrip':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        if RANK == MANAGER:
            os.makedirs(os.path.join(OUT, 'files'), exist_ok=True)
            d.update(
                checkpoint_path=os.path.join(OUT, 'ckpt.buf'), max_message_mb=1, file_root=os.path.join(OUT, 'files')
            )
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
    elif SCENARIO in ('kill_worker', 'kill_worker_exit'):
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        d.update(peer_timeout=3.0, heartbeat_seconds=0.5)
        if SCENARIO == 'kill_worker_exit':  # the goodbye to the dead worker may take this long, and nothing more
            d.update(timeout=KILL_EXIT_TIMEOUT)
    elif SCENARIO == 'kill_manager':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor'))
        d.update(timeout=5.0, heartbeat_seconds=0.5)
    elif SCENARIO == 'hostile':
        cfg = dict(type='advanced', replay_buffer_size=1000, storage=dict(type='list'))
        d.update(max_message_mb=1, file_root=OUT, peer_timeout=None)
    elif SCENARIO == 'freeze_manager':
        cfg = dict(type='advanced', replay_buffer_size=4000, storage=dict(type='tensor'))
        d.update(timeout=FREEZE_TIMEOUT, heartbeat_seconds=0.5, peer_timeout=60.0)
    elif SCENARIO in ('partition_worker', 'partition_short', 'partition_manager', 'lossy_worker', 'kill_worker_host'):
        cfg = dict(type='advanced', replay_buffer_size=4000, storage=dict(type='tensor'))
        # lost_grace: a manager that hears nobody (its own link cut) waits for its workers to be heard again; a dead
        # host's worker holds it peer_timeout more (the default)
        grace = None if SCENARIO == 'kill_worker_host' else 30.0
        d.update(timeout=10.0, heartbeat_seconds=0.5, peer_timeout=3.0, lost_grace=grace)
    elif SCENARIO in ('freeze_worker', 'freeze_worker_end'):
        cfg = dict(type='advanced', replay_buffer_size=4000, storage=dict(type='tensor'))
        # freeze_worker_end: the manager ends once rank 1 left, without waiting for the frozen rank 0 (lost_grace 0)
        d.update(timeout=10.0, heartbeat_seconds=0.5, peer_timeout=3.0, lost_grace=0.0)
    elif SCENARIO == 'sharded':  # 4 ranks: workers 0 and 1, managers 2 (shard 0) and 3 (shard 1)
        cfg = dict(type='advanced', replay_buffer_size=1000, seed=RANK, storage=dict(type='tensor'))
        cfg['thruput_controller'] = dict(sample_min_limit_ratio=2.0)  # of the total (the client's), not a shard's
        d.update(num_shards=2)
    elif SCENARIO == 'chunk':
        cfg = dict(type='chunk', fragments_per_chunk=2, max_reuse=1, max_staleness=0, seed=0)
    elif SCENARIO == 'frames':  # frames stored once; the workers send new frames (frames_wire), 2 push pipelines
        cfg = dict(type='advanced', replay_buffer_size=512, seed=0, storage=dict(type='tensor', frames=FRAMES))
        d.update(async_score=RANK == 0, remote_buffer_freq=3 if RANK == 1 else 1)
    else:
        raise ValueError(SCENARIO)
    if RANK == MANAGER and SCENARIO.startswith('gfn'):
        d.update(scoring_function=recorder)
    cfg['distributed'] = d
    return cfg


# ---------------------------------------------------------------------------------------------- manager
def rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def flag(name: str) -> None:
    open(os.path.join(OUT, name), 'w').close()


def wait_flag(name: str, seconds: float = 60.0) -> bool:
    end = time.monotonic() + seconds
    while not os.path.exists(os.path.join(OUT, name)):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def manager(buf):
    from ding_buffer.distributed import ReplayBufferManager

    assert isinstance(buf, ReplayBufferManager), type(buf)
    with open(os.path.join(OUT, 'manager.pid'), 'w') as f:
        f.write(str(os.getpid()))
    RESULT['rss_mb_start'] = rss_mb()
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
    elif SCENARIO == 'chunk':
        RESULT['chunk_stats'] = jsonable(inner.stats())
    elif SCENARIO not in ('hostile', 'frames'):  # (list storage there: the count is checked)
        rows = inner.storage.gather(inner.storage.ring.ordered_slots())
        RESULT['tags'] = rows['tag'].tolist()
        RESULT['obs_ok'] = bool((rows['obs'] == rows['tag'].float().unsqueeze(1)).all())
    RESULT['arrivals'] = ARRIVALS
    RESULT['rss_mb_end'] = rss_mb()
    buf.close()


# ---------------------------------------------------------------------------------------------- workers
def push_record(buf, data, **kw):
    n = buf.push(data, **kw)
    RESULT['events'].append({'pushed': n, 'score': jsonable(buf.pushes.last_score)})
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
    RESULT['update'] = buf.update(
        {
            'replay_unique_id': s['replay_unique_id'],
            'replay_buffer_idx': s['replay_buffer_idx'],
            'priority': torch.full((4,), 2.0),
        }
    )
    st = wait_pushes(buf, 10)
    RESULT['stats'] = {k: v for k, v in st.items() if k.startswith('manager/') or k in ('count', 'push_count')}
    import io

    for name, obj in (('sample', buf.sample(8)), ('state_dict', buf.state_dict())):
        f = io.BytesIO()
        torch.save(obj, f)  # results must be ordinary tensors
        f.seek(0)
        back = torch.load(f, weights_only=False)
        RESULT[f'saved_{name}'] = True if name == 'state_dict' else bool(torch.equal(back['obs'], obj['obs']))
    if RANK == 1:
        RESULT['saved_to'] = buf.save_data(f'inside-{RANK}.buf')
        flag('stats_read_1')
    if RANK == 0:  # requests the manager refuses, once rank 1 has read its stats (they count errors)
        wait_flag('stats_read_1', 60)
        RESULT['file_errors'] = {}
        for name, call in (
            ('escape', lambda: buf.save_data('../outside.buf')),
            ('absolute', lambda: buf.load_data('/etc/passwd')),
            ('pickle_flag', lambda: buf.load_data('x.buf', allow_pickle=True)),
        ):
            try:
                call()
                RESULT['file_errors'][name] = None
            except Exception as e:
                RESULT['file_errors'][name] = [type(e).__name__, str(e)]
        # oversized push (manager has max_message_mb=1), then a small one
        big = adv_batch(0, 50, n=80000)  # ~2.2 MB > max_message_mb=1
        t = time.monotonic()
        try:
            buf.push(big, batched=True)
            RESULT['oversized'] = {'error': None}
        except Exception as e:
            RESULT['oversized'] = {
                'error': type(e).__name__,
                'mro': [c.__name__ for c in type(e).__mro__],
                'message': str(e),
                'elapsed': time.monotonic() - t,
            }
        write()
        push_record(buf, adv_batch(0, 60, n=3), batched=True)
        RESULT['count_after_small'] = buf.count()
    buf.close()
    RESULT['closed'] = True


FRAMES = dict(env_key='env_id', n_step=2, gamma=0.5)
FRAME_STEPS = 150  # per worker: 3 environments of its own, round robin


def frame_steps(rank: int):
    """Worker ``rank``'s steps (deterministic: every rank can rebuild every worker's), env ids and steps unique."""
    from helpers import FrameEnvs

    steps = FrameEnvs(n_envs=3, seed=100 + rank, max_len=12, side=16).steps(FRAME_STEPS)
    return [dict(t, env_id=10 * rank + t['env_id'], step=10000 * rank + t['step']) for t in steps]


def worker_frames(buf):
    """Push this worker's steps one at a time (rank 0: async scores; rank 1: three pushes a send), then sample
    the manager's buffer and compare every row with the pushed steps of both workers, n-step returns included."""
    import numpy as np
    from helpers import n_step_reference

    steps = {r: frame_steps(r) for r in (0, 1)}
    for t in steps[RANK]:
        buf.push(t)
    buf.flush()
    if RANK == 0:
        buf.drain_pending_score(20)
    RESULT['wire'] = dict(buf.pushes.frames.stats)
    end = time.monotonic() + 60
    while buf.count() < 2 * FRAME_STEPS and time.monotonic() < end:  # the other worker's pushes (n-step sums)
        time.sleep(0.1)
    RESULT['frames_count'] = buf.count()
    pushed = {t['step']: t for r in (0, 1) for t in steps[r]}
    refs = n_step_reference(steps[0] + steps[1], FRAMES['n_step'], FRAMES['gamma'])
    out = buf.sample(64)
    bad = []
    for j, s in enumerate(out['step'].tolist()):
        ret, nxt, _, _, _ = refs[s]
        if not (
            np.array_equal(out['obs'][j].numpy(), pushed[s]['obs'])
            and np.array_equal(out['next_obs'][j].numpy(), nxt)
            and abs(out['reward'][j].item() - ret) < 1e-5
        ):
            bad.append(s)
    RESULT['frames_rows'] = len(out['step'])
    RESULT['frames_bad'] = bad
    buf.close()
    RESULT['closed'] = True


def fragment(fid: int, version: int) -> dict:
    return dict(worker='env1', fid=fid, model_version=version, data=dict(obs=torch.full((3,), float(fid))))


def worker_chunk(buf):
    """The chunk protocol over the wire: rank 1 produces fragments, rank 0 learns (blocking fetch, version move)."""
    if RANK == 1:
        for fid in range(6):  # 3 chunks of model version 0
            buf.push(fragment(fid, 0))
        buf.flush()
        flag('pushed_6')
        wait_flag('version_moved', 60)
        buf.push([fragment(6, 0), fragment(7, 1), fragment(8, 1)])  # 6: stale at its queue; 7-8: a chunk
        buf.flush()
    else:
        first = buf.sample(4, timeout=30)  # waits for 2 chunks
        RESULT['first'] = [[x['worker'], x['fid'], x['use']] for x in first]
        RESULT['payloads_ok'] = all(torch.equal(x['data']['obs'], torch.full((3,), float(x['fid']))) for x in first)
        wait_flag('pushed_6', 60)
        RESULT['moved'] = jsonable(buf.update_model_version(1))
        flag('version_moved')
        second = buf.sample(2, timeout=30)
        RESULT['second'] = [[x['worker'], x['fid'], x['use']] for x in second]
    buf.close()
    RESULT['closed'] = True


def worker_sharded(buf):
    """Two managers used as one buffer: pushes alternate between the shards, samples draw from both, updates
    go back to the shard that owns each row."""
    from ding_buffer.distributed.sharded import ShardedBuffer

    assert isinstance(buf, ShardedBuffer), type(buf)
    for step in range(5):
        buf.push(adv_batch(RANK, step), batched=True)
    end = time.monotonic() + 30
    while buf.count() < 40 and time.monotonic() < end:  # both workers' 5 pushes of 4 rows
        time.sleep(0.05)
    s = buf.sample(16)
    RESULT['sample_tags'] = s['tag'].tolist()
    RESULT['sample_obs_ok'] = bool((s['obs'] == s['tag'].float().unsqueeze(1)).all())
    RESULT['sample_shards'] = s['shard'].tolist()
    RESULT['update'] = buf.update(
        {
            'shard': s['shard'],
            'replay_unique_id': s['replay_unique_id'],
            'replay_buffer_idx': s['replay_buffer_idx'],
            'priority': torch.full((16,), 2.0),
        }
    )
    st = buf.stats()
    RESULT['shard_counts'] = [st['shard0/count'], st['shard1/count']]
    flag(f'sampled_{RANK}')
    wait_flag(f'sampled_{1 - RANK}', 60)  # neither closes (ends its managers' wait) before both sampled
    if RANK == 0:  # 40 items: sample_min_limit_ratio 2 lets one buffer of them draw 20, whatever each shard holds
        RESULT['ratio_refusals'] = [buf.why_not_sample(20), sum(buf.sample(20) is None for _ in range(20))]
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


worker_kill_worker_exit = worker_kill_worker


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
        RESULT['error'] = {
            'type': type(e).__name__,
            'mro': [c.__name__ for c in type(e).__mro__],
            'message': str(e),
            'elapsed': time.monotonic() - last_ok,
        }
    RESULT['steps'] = step
    write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the manager is gone: skip interpreter teardown of the broken process group


# ---------------------------------------------------------------------------------------------- hostile peer
ID = 424242


def hostile_cases():
    """(name, header bytes, parts) sent with valid framing: every one must get an error reply with its id (the
    JSON id is ``ID``, replaced by the request's id when sent)."""
    import pickle

    import numpy as np

    class Boom:  # unpickling it would create a marker file on the manager
        def __reduce__(self):
            return (open, (os.path.join(OUT, 'pwned'), 'w'))

    def j(body, n=()):
        return json.dumps({'v': 1, 'n': list(n), 'body': body}).encode()

    def req(op, a=None, **top):
        d = [['op', op], ['id', ID], ['shard', top.pop('shard', 0)]] + [[k, v] for k, v in top.items()]
        if a is not None:
            d.append(['args', {'$d': [[k, v] for k, v in a.items()]}])
        return {'$d': d}

    evil = np.frombuffer(pickle.dumps(Boom()), np.uint8)
    with open(os.path.join(OUT, 'evil.buf'), 'wb') as f:  # a "buffer file" that runs code when unpickled
        pickle.dump({'x': Boom()}, f)
    cases = [
        ('not json', b'{not json', []),
        ('5000-digit int', b'{"v":1,"n":[],"body":' + b'9' * 5000 + b'}', []),
        ('deep nesting', b'{"v":1,"n":[],"body":' + b'[' * 100000 + b']' * 100000 + b'}', []),
        (
            'shape overflow',
            j(req('push', {'data': {'$t': [0, 'float32', [2**62, 2**62, 4]]}}), [4]),
            [np.zeros(4, np.uint8)],
        ),
        (
            'part used twice',
            j(
                req('push', {'data': {'$d': [['a', {'$t': [0, 'int64', [1]]}], ['b', {'$t': [0, 'float64', [1]]}]]}}),
                [8],
            ),
            [np.zeros(8, np.uint8)],
        ),
        ('pickled leaf', j(req('push', {'data': {'$p': 0}}), [len(evil)]), [evil]),
        ('unknown tag', j(req('push', {'data': {'$q': 1}})), []),
        ('parts missing', j(req('count'), [5, 5]), [np.zeros(5, np.uint8)]),
        ('bad dtype', j(req('push', {'data': {'$a': [0, 'O', [1]]}}), [8]), [np.zeros(8, np.uint8)]),
        ('no op', j({'$d': [['id', 0]]}), []),
        ('args not a dict', j(req('count', None, args=[1, 2])), []),
        ('sample timeout', j(req('sample', {'size': 2, 'kwargs': {'$d': [['timeout', 100]]}})), []),
        ('sample unknown kwarg', j(req('sample', {'size': 2, 'kwargs': {'$d': [['evil', 1]]}})), []),
        ('sample huge', j(req('sample', {'size': 10**30})), []),
        ('load_data allow_pickle', j(req('load_data', {'path': 'evil.buf', 'allow_pickle': True})), []),
        ('load_data pickle file', j(req('load_data', {'path': 'evil.buf'})), []),
        ('save_data escape', j(req('save_data', {'path': '../../escaped.buf'})), []),
        ('load_data absolute', j(req('load_data', {'path': '/etc/passwd'})), []),
        ('push bad seq', j(req('push', {'data': {'$d': [['obs', 1]]}, 'client': 'x', 'seq': -5})), []),
        ('unknown op', j(req('format_disk')), []),
        ('other shard', j(req('count', None, shard=5)), []),
        ('update garbage', j(req('update', {'info': {'$d': [['replay_unique_id', 'abc']]}})), []),
        ('model_version str', j(req('model_version', {'version': 'abc'})), []),
    ]
    return cases


def hostile_raw_messages():
    """Byte sequences sent as raw point-to-point messages (no framing), each at most a head long (a longer one
    would abort the manager inside gloo, see the README's security notes)."""
    import numpy as np

    from ding_buffer.distributed import framing as fr

    rng = np.random.default_rng(1234)
    msgs = [rng.integers(0, 256, int(rng.integers(1, fr.HEAD)), dtype=np.uint8) for _ in range(40)]
    msgs.append(np.zeros(fr.HEAD, np.uint8))

    def ctrl(*fields, extra=b''):
        c = np.zeros(8, np.int64)
        c[: len(fields)] = fields
        return np.concatenate([c.view(np.uint8), np.frombuffer(extra, np.uint8)])

    m = fr.MAGIC
    msgs += [
        ctrl(m, 9, 11, 64),  # unknown kind
        ctrl(m, fr.DATA, 12, 64 + 10, 5, 0, 0, 10),  # head length disagreeing with what arrived
        ctrl(m, fr.DATA, 13, 64 + 32, 3, 1, 0, 32, extra=b'\0' * 32),  # meta shorter than its table + header
        ctrl(m, fr.DATA, 14, 64 + 32, 3, 2**40, 0, 32, extra=b'\0' * 32),  # absurd part count
        ctrl(m, fr.DATA, 15, 64 + 16, 1, 0, -5, 16, extra=b'\0' * 16),  # negative body
        ctrl(
            m, fr.DATA, 16, 64 + 32, 16, 1, 100, 32, extra=np.array([50, -1], np.int64).tobytes() + b'{' * 16
        ),  # table != body
        np.array([m, fr.DATA, 69], np.int64).view(np.uint8)[:20],  # a 20-byte frame after longer ones
    ]
    return msgs


def worker_hostile(buf):
    """Rank 0: a peer that speaks our transport but lies; rank 1: a well-behaved worker."""
    import numpy as np

    if RANK == 1:
        events = []
        for step in range(40):
            push_record(buf, adv_batch(RANK, step), batched=True)
            s = buf.sample(4, timeout=10)  # list storage: a list of item dicts
            buf.update(
                {
                    'replay_unique_id': [d['replay_unique_id'] for d in s],
                    'replay_buffer_idx': [d['replay_buffer_idx'] for d in s],
                    'priority': [1.5] * 4,
                }
            )
            events.append(buf.count())
            time.sleep(0.05)
        # rank 0 sends the head of a frame and holds back its part: this worker is served meanwhile
        served = []
        if wait_flag('stalled', 120):
            for _ in range(5):
                try:
                    served.append(buf.count())
                except Exception as e:  # (a manager that waits for the stalled frame: every call times out)
                    served.append(f'{type(e).__name__}: {e}')
        RESULT['served_in_stall'] = served
        flag('served_in_stall')
        wait_flag('hostile_done', 120)
        push_record(buf, adv_batch(RANK, 99), batched=True)
        RESULT['count_final'] = buf.count()
        buf.close()
        RESULT['closed'] = True
        return
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.codec import encode
    from ding_buffer.distributed.frame_reader import MESSAGE
    from ding_buffer.distributed.peer_transports import MPITransport, TorchTransport

    T = TorchTransport if BACKEND == 'torch' else MPITransport
    t = T([MANAGER], False, 1 << 30, grace=10.0)
    t.start()
    replies = {}

    def collect(expect_id, seconds=10.0):
        """The next reply (requests go one at a time and replies come in order; a mutated JSON id may differ)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            item = t.recv(0.2)
            if item is not None and item[1] == MESSAGE and isinstance(item[2], dict):
                return item[2]
        return None

    rid = 1000
    for name, header, parts in hostile_cases():
        rid += 1
        t.send_encoded(
            MANAGER,
            header.replace(str(ID).encode(), str(rid).encode()),
            parts,
            msg_id=rid,
            deadline=time.monotonic() + 10,
        )
        r = collect(rid)
        replies[name] = None if r is None else [r.get('ok'), r.get('error'), str(r.get('message'))[:200]]
    # a random mutation fuzz of a valid request header
    rng = np.random.default_rng(7)
    base, bparts = encode({'op': 'push', 'id': ID, 'shard': 0, 'args': {'data': {'obs': 1}, 'batched': False}})
    fuzz_answered = fuzz_stored = 0
    for i in range(150):
        rid += 1
        h = bytearray(base.replace(str(ID).encode(), str(rid).encode()))
        for _ in range(int(rng.integers(1, 6))):
            h[int(rng.integers(0, len(h)))] = int(rng.integers(0, 256))
        t.send_encoded(MANAGER, bytes(h), bparts, msg_id=rid, deadline=time.monotonic() + 10)
        r = collect(rid, 5.0)
        fuzz_answered += r is not None
        if r is not None and r.get('ok') and isinstance(r.get('result'), dict):
            fuzz_stored += int(r['result'].get('stored', 0))  # a mutation can still be a valid push
    RESULT['fuzz_answered'] = fuzz_answered
    RESULT['fuzz_stored'] = fuzz_stored
    # raw bytes, no framing at all
    if BACKEND == 'torch':
        import torch.distributed as dist

        send_raw = lambda a: dist.send(torch.from_numpy(np.ascontiguousarray(a)), MANAGER, tag=fr.TAG)  # noqa: E731
    else:
        from mpi4py import MPI

        send_raw = lambda a: MPI.COMM_WORLD.Send([np.ascontiguousarray(a), MPI.BYTE], dest=MANAGER, tag=fr.TAG)  # noqa: E731
    raw = hostile_raw_messages()
    raw_answers = 0
    for a in raw:
        send_raw(a)
        raw_answers += collect(None, 2.0) is not None  # garbage is answered when nothing else waits
    # a frame stopped half-way: its head announces a 512 KiB part, sent only once rank 1 was served meanwhile
    rid += 1
    header, parts = encode({'op': 'count', 'id': rid, 'shard': 0, 'pad': np.zeros(1 << 19, np.uint8)})
    head, extra, out, _ = fr.frame(header, parts, rid)
    assert extra is None and len(out) == 1
    send_raw(head)
    flag('stalled')
    RESULT['rank1_served_first'] = wait_flag('served_in_stall', 60)
    send_raw(out[0])
    r = collect(rid, 20)
    RESULT['stalled_reply'] = None if r is None else r.get('result')
    # an honest oversized frame (2 MB > max_message_mb=1): drained, answered with its id
    rid += 1
    header, parts = encode({'op': 'push', 'id': rid, 'args': {'data': {'obs': torch.zeros(500_000)}}})
    t.send_encoded(MANAGER, header, parts, msg_id=rid, deadline=time.monotonic() + 20)
    r = collect(rid, 20)
    replies['oversized'] = None if r is None else [r.get('ok'), r.get('error'), str(r.get('message'))[:200]]
    # after all that, the same connection is still served
    rid += 1
    t.send(MANAGER, {'op': 'count', 'id': rid, 'shard': 0}, msg_id=rid, deadline=time.monotonic() + 10)
    r = collect(rid, 20)
    RESULT['served_after'] = None if r is None else r.get('result')
    RESULT['replies'] = replies
    RESULT['raw_sent'] = len(raw)
    RESULT['raw_answered'] = raw_answers
    flag('hostile_done')
    RESULT['stuck_at_close'] = t.close(10)
    RESULT['closed'] = True


# ---------------------------------------------------------------------------------------------- freezes
def retrying(buf, call, what, log):
    """Call until it succeeds, recording the duration and outcome of every attempt."""
    from ding_buffer.distributed import ManagerUnavailableError

    while True:
        t, wall = time.monotonic(), time.time()
        try:
            out = call()
            log.append({'what': what, 'ok': True, 'seconds': time.monotonic() - t, 'start': wall})
            return out
        except ManagerUnavailableError as e:
            log.append(
                {'what': what, 'ok': False, 'seconds': time.monotonic() - t, 'start': wall, 'error': str(e)[:300]}
            )
            if 'shut down' in str(e) or 'unreachable' in str(e) or time.monotonic() - T0 > 150:  # final: no retry
                raise


def worker_freeze_manager(buf):
    log = RESULT.setdefault('calls', [])
    if RANK == 0:
        for step in range(40):
            retrying(buf, lambda: buf.push(adv_batch(0, step), batched=True), f'push {step}', log)
            if step == 5:
                flag('w0_started')
            if step % 5 == 4:
                retrying(buf, buf.count, 'count', log)
            time.sleep(0.1)
        RESULT['duplicate_seen'] = buf.pushes.last_score
        RESULT['unacknowledged'] = buf.pushes.unacknowledged
        flag('w0_done')
        buf.close()
        RESULT['closed'] = True
        return
    assert wait_flag('w0_started')
    pid = int(open(os.path.join(OUT, 'manager.pid')).read())
    os.kill(pid, signal.SIGSTOP)
    RESULT['frozen_at'] = time.time()
    try:
        t = time.monotonic()
        try:
            buf.stats()
            log.append({'what': 'stats', 'ok': True, 'seconds': time.monotonic() - t})
        except Exception as e:
            log.append({'what': 'stats', 'ok': False, 'seconds': time.monotonic() - t, 'error': type(e).__name__})
        time.sleep(max(FREEZE_SECONDS - (time.monotonic() - t), 0))
    finally:
        os.kill(pid, signal.SIGCONT)
    RESULT['thawed_at'] = time.time()
    wait_flag('w0_done', 120)
    retrying(buf, buf.count, 'count after', log)
    buf.close()
    RESULT['closed'] = True


def push_until(buf, done_flag: str, log: list, progress: dict) -> None:
    """Rank 0 of the freeze / partition scenarios: push a tagged batch every 0.1 s, retrying what fails, flag
    'w0_started' after 5, until ``done_flag`` exists and at least 60 went out (``progress['step']``: how many);
    then record them and flag 'w0_done'."""
    while not os.path.exists(os.path.join(OUT, done_flag)) or progress['step'] < 60:
        step = progress['step']
        retrying(buf, lambda: buf.push(adv_batch(0, step), batched=True), f'push {step}', log)
        progress['step'] = step + 1
        if progress['step'] == 5:
            flag('w0_started')
        time.sleep(0.1)
        if time.monotonic() - T0 > 100:
            break
    RESULT['steps'] = progress['step']
    flag('w0_done')


def push_while_w0_runs(buf, most: int) -> None:
    """Rank 1 after the fault: push a tagged batch every 0.1 s until rank 0 flags 'w0_done' (at most ``most``),
    then close."""
    for step in range(most):
        push_record(buf, adv_batch(1, step), batched=True)
        if os.path.exists(os.path.join(OUT, 'w0_done')):
            break
        time.sleep(0.1)
    buf.close()
    RESULT['closed'] = True


def worker_freeze_worker(buf):
    """Rank 1 freezes rank 0 for longer than the manager's peer_timeout, then thaws it."""
    from ding_buffer.distributed import ManagerUnavailableError

    log = RESULT.setdefault('calls', [])
    if RANK == 0:
        with open(os.path.join(OUT, 'w0.pid'), 'w') as f:
            f.write(str(os.getpid()))
        progress = {'step': 0}
        try:
            push_until(buf, 'thawed', log, progress)
            buf.close()
            RESULT['closed'] = True
        except ManagerUnavailableError as e:  # freeze_worker_end: the manager shut down while this rank was frozen
            RESULT['steps'] = progress['step']
            RESULT['manager_gone'] = str(e)
            flag('w0_done')
        return
    assert wait_flag('w0_started')
    pid = int(open(os.path.join(OUT, 'w0.pid')).read())
    os.kill(pid, signal.SIGSTOP)
    RESULT['frozen_at'] = time.time()
    try:
        if SCENARIO == 'freeze_worker_end':
            buf.close()  # the manager ends while rank 0 is frozen and counted lost
            RESULT['closed'] = True
        time.sleep(6.0)  # > peer_timeout (3 s)
    finally:
        os.kill(pid, signal.SIGCONT)
    RESULT['thawed_at'] = time.time()
    flag('thawed')
    if SCENARIO == 'freeze_worker':
        push_while_w0_runs(buf, 200)
    else:
        wait_flag('w0_done', 60)


worker_freeze_worker_end = worker_freeze_worker

# longer / shorter than peer_timeout (3 s); lossy_worker: no cut (the test adds packet loss to the link)
PARTITION_SECONDS = {'partition_worker': 6.0, 'partition_short': 1.5, 'partition_manager': 6.0, 'lossy_worker': 0.0}


def _host_link(host: int, up: bool) -> None:
    """Cut or restore the link of namespaced host ``host`` (its bridge port; the harness named them)."""
    import subprocess

    port = os.environ['DING_TEST_HOST_PORTS'].split(',')[host]
    # the bridge ports live in the test's own network namespace (the harness names it)
    cmd = ['nsenter', f"--net={os.environ['DING_TEST_ROOT_NETNS']}", 'ip', 'link', 'set', port, 'up' if up else 'down']
    subprocess.run(cmd, check=True, timeout=20)


def worker_partition_worker(buf):
    """Rank 1 cuts rank 0's host (partition_manager: the manager's) off the network -- its processes keep running --
    for PARTITION_SECONDS, then heals it; rank 0 pushes all along, retrying what fails. Namespaced hosts only."""
    log = RESULT.setdefault('calls', [])
    if RANK == 0:
        push_until(buf, 'healed', log, {'step': 0})
        buf.close()
        RESULT['closed'] = True
        return
    assert wait_flag('w0_started')
    # a round trip first: Open MPI opens a pair's TCP connection at its first message, and one that opens during the
    # cut fails for good (rank 1's heartbeat may not have gone out yet on a loaded machine)
    RESULT['count_before_cut'] = buf.count()
    RESULT['cut_at'] = time.time()
    if PARTITION_SECONDS[SCENARIO]:
        cut = MANAGER if SCENARIO == 'partition_manager' else 0  # the manager's host, or rank 0's
        _host_link(cut, up=False)
        try:
            time.sleep(PARTITION_SECONDS[SCENARIO])
        finally:
            _host_link(cut, up=True)
    RESULT['healed_at'] = time.time()
    flag('healed')
    push_while_w0_runs(buf, 300)


worker_partition_short = worker_partition_manager = worker_lossy_worker = worker_partition_worker


def worker_kill_worker_host(buf):
    """Rank 0 pushes until its host dies (the test cuts the link and kills its processes); rank 1 then pushes
    for longer than peer_timeout, timing every call, and closes."""
    if RANK == 0:
        step = 0
        while True:
            push_record(buf, adv_batch(0, step), batched=True)
            step += 1
            if step == 5:
                flag('w0_started')
            time.sleep(0.05)
    assert wait_flag('host0_dead', 90)
    times, n = [], 0
    end = time.monotonic() + 5.0  # > peer_timeout (3 s)
    while time.monotonic() < end:
        t = time.monotonic()
        push_record(buf, adv_batch(1, n), batched=True)
        times.append(time.monotonic() - t)
        n += 1
        time.sleep(0.05)
    RESULT['pushes_after_death'] = n
    RESULT['seconds_per_call'] = times
    buf.close()
    RESULT['closed'] = True


def main() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(float(os.environ.get('DING_BUFFER_TEST_STACKS_AFTER', '75')), exit=False)
    try:
        if SCENARIO == 'hostile' and RANK == 0:  # no RemoteBuffer: a raw transport of its own (worker_hostile)
            from ding_buffer.distributed.startup import init_mpi, init_torch

            buf = init_torch(30.0) if BACKEND == 'torch' else init_mpi()
        else:
            buf = make_buffer(config())
        is_manager = RANK == MANAGER or (SCENARIO == 'sharded' and RANK == 3)
        RESULT['role'] = 'manager' if is_manager else 'worker'
        RESULT['setup_seconds'] = time.monotonic() - T0
        if is_manager:
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
    RESULT['ended_at'] = time.time()  # the rank's work is done: what follows is interpreter (and MPI) teardown
    write()


if __name__ == '__main__':
    main()

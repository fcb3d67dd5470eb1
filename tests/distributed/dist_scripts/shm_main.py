"""One rank of a shared-memory push test (launched by tests/distributed/test_shm_procs.py).

Usage: ``python shm_main.py SCENARIO BACKEND OUTDIR``. Ranks 0 and 1 are workers on the manager's host, rank 2
the manager (``distributed.shared_memory=True``). Every rank writes ``OUTDIR/rank{r}.json``.

Scenarios: roundtrip (rank 0 pushes single rows and a batch through its ring, samples and updates; rank 1 keeps
the wire: shared_memory False in its own config), kill_writer (rank 0 is SIGKILLed while it writes rows),
freeze_writer (rank 1 SIGSTOPs rank 0 past peer_timeout, then SIGCONTs it), lying_writer (rank 0 moves its ring's
counter past what the ring holds and announces impossible layouts), kill_manager (the manager SIGKILLs itself).
"""

import json
import os
import random
import signal
import sys
import threading
import time
import traceback

import torch

SCENARIO, BACKEND, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
MANAGER = 2
T0 = time.monotonic()
KEYS = ('RANK',) if BACKEND == 'torch' else ('OMPI_COMM_WORLD_RANK', 'PMIX_RANK', 'PMI_RANK')
RANK = int(next(os.environ[k] for k in KEYS if k in os.environ))
open(os.path.join(OUT, f'started{RANK}'), 'w').close()
RESULT = {'rank': RANK, 'scenario': SCENARIO, 'backend': BACKEND}


def write() -> None:
    tmp = os.path.join(OUT, f'rank{RANK}.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(RESULT, f, default=repr)
    os.replace(tmp, os.path.join(OUT, f'rank{RANK}.json'))


def flag(name: str, text: str = '') -> None:
    with open(os.path.join(OUT, name + '.tmp'), 'w') as f:
        f.write(text)
    os.replace(os.path.join(OUT, name + '.tmp'), os.path.join(OUT, name))


def read_flag(name: str, seconds: float = 60.0) -> str:
    end = time.monotonic() + seconds
    path = os.path.join(OUT, name)
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f'flag {name} never came')
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def ring_fds() -> int:
    """Open descriptors of ring memory files in this process (none once every ring is closed)."""
    n = 0
    for fd in os.listdir('/proc/self/fd'):
        try:
            n += 'ding_buffer_ring' in os.readlink(f'/proc/self/fd/{fd}')
        except OSError:
            pass
    return n


def item(tag: int) -> dict:
    """One transition, every field a tensor: obs repeats the tag, so a torn row would show."""
    return {'obs': torch.full((4,), float(tag)), 'tag': torch.tensor(tag), 'priority': torch.tensor(1.0 + tag % 3)}


def batch(tags) -> dict:
    t = torch.tensor(tags)
    return {'obs': t.float().unsqueeze(1).repeat(1, 4), 'tag': t, 'priority': 1.0 + (t % 3).float()}


def config() -> dict:
    d = dict(backend=BACKEND, shared_memory=True, timeout=20.0, heartbeat_seconds=0.5, peer_timeout=3.0)
    if SCENARIO == 'roundtrip' and RANK == 1:
        d.update(shared_memory=False)  # a worker on the wire next to one on shared memory
    if SCENARIO in ('kill_manager', 'lying_writer'):
        d.update(timeout=5.0)
    if SCENARIO == 'freeze_writer':
        d.update(lost_grace=30.0)  # the frozen worker comes back within it
    return dict(type='advanced', replay_buffer_size=20000, storage=dict(type='tensor'), seed=RANK, distributed=d)


def manager(buf) -> None:
    flag('manager.pid', str(os.getpid()))
    if SCENARIO == 'kill_manager':
        th = threading.Thread(target=buf.run, kwargs=dict(timeout=60), daemon=True)
        th.start()
        end = time.monotonic() + 30
        both = [os.path.join(OUT, f'w{r}.pushed') for r in (0, 1)]  # (one worker may start late on a busy machine)
        while (buf.stats()['count'] < 200 or not all(map(os.path.exists, both))) and time.monotonic() < end:
            time.sleep(0.02)
        RESULT['killed_at'] = time.time()
        write()
        os.kill(os.getpid(), signal.SIGKILL)
    summary = buf.run(timeout=90)
    RESULT['summary'] = summary
    inner = buf.buffer
    rows = inner.storage.gather(inner.storage.ring.ordered_slots())
    RESULT['tags'] = rows['tag'].tolist()
    RESULT['obs_ok'] = bool((rows['obs'] == rows['tag'].float().unsqueeze(1)).all())
    RESULT['ring_fds'] = ring_fds()  # every ring closed at the end of run()
    buf.close()


def worker_roundtrip(buf) -> None:
    base = RANK * 100000
    if RANK == 0:
        for i in range(300):
            assert buf.push(item(base + i)) == 1
        assert buf.extend(batch(list(range(base + 300, base + 350)))) == 50
        st = buf.stats()  # served after the manager committed this worker's ring: every row above is in
        RESULT['shm_rows_seen'] = st['manager/shm_rows']
        got = buf.sample(32, timeout=10)
        buf.update({'replay_unique_id': got['replay_unique_id'], 'replay_buffer_idx': got['replay_buffer_idx'],
                    'priority': torch.full((32,), 7.0)})  # fmt: skip
        again = buf.sample(300)
        RESULT['sampled_tags_known'] = bool((again['tag'] // 100000 <= 1).all())
        RESULT['last_score'] = buf.last_score
    else:
        for i in range(100):
            buf.push(item(base + i))
        RESULT['last_score'] = buf.last_score
    buf.close()


def worker_kill_writer(buf) -> None:
    base = RANK * 100000
    if RANK == 0:
        flag('w0.pid', str(os.getpid()))
        random.seed(1)
        delay = random.uniform(0.3, 0.6)
        threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        i = 0
        while True:  # killed while it writes, mostly inside a push
            buf.push(item(base + i))
            i += 1
            if i % 50 == 0:
                flag('w0.returned', str(i))
    for i in range(200):
        buf.push(item(base + i))
    buf.close()


def worker_freeze_writer(buf) -> None:
    base = RANK * 100000
    if RANK == 0:
        flag('w0.pid', str(os.getpid()))
        for i in range(200):
            buf.push(item(base + i))
            if i == 99:
                flag('w0.half')
                read_flag('w0.thawed')  # frozen by rank 1 in between (its heartbeats stop too)
        buf.close()
        return
    pid = int(read_flag('w0.pid'))
    read_flag('w0.half')
    os.kill(pid, signal.SIGSTOP)
    time.sleep(5.0)  # past peer_timeout: counted lost
    RESULT['lost_while_frozen'] = buf.stats()['manager/shm_rows']
    os.kill(pid, signal.SIGCONT)
    flag('w0.thawed')
    for i in range(100):
        buf.push(item(base + i))
    buf.close()


def worker_lying_writer(buf) -> None:
    from ding_buffer.errors import RemoteError

    base = RANK * 100000
    if RANK == 1:
        read_flag('w0.lied')
        for i in range(100):
            buf.push(item(base + i))
        RESULT['count'] = buf.count()  # served after its ring was committed
        flag('w1.done')
        buf.close()
        return
    for i in range(10):
        buf.push(item(base + i))
    RESULT['before'] = buf.stats()['manager/shm_rows']
    bad_layouts = [
        [['x', 't', 'complex64', [1]]],
        [['x', 't', 'float32', [1 << 40]]],
        [['x', 't', 'float32', [-1]]],
        [['x', 'q', 'float32', []]],
        'not a list',
        [['x', 't', 'float32', [2]], ['x', 't', 'float32', [2]]],
    ]
    refused = []
    for fields in bad_layouts:
        try:
            buf.rings.request('shm_open', client='liar', host=buf.rings.host, fields=fields)
        except (RemoteError, ValueError, TypeError) as e:
            refused.append(type(e).__name__)
    RESULT['refused_layouts'] = refused
    head = buf.rings.writer.map.head  # the lie: a counter far past what the ring holds
    head[1] = int(head[1]) + (1 << 40)
    st = buf.stats()
    RESULT['corrupt_rings'] = st['manager/shm_corrupt_rings']
    flag('w0.lied')
    try:
        buf.push(item(base + 10))
        RESULT['push_after_lie'] = 'accepted'
    except Exception as e:  # noqa: BLE001 - recorded for the test
        RESULT['push_after_lie'] = f'{type(e).__name__}: {e}'
    read_flag('w1.done')
    RESULT['count_after'] = buf.count()
    buf.close()


def worker_kill_manager(buf) -> None:
    base = RANK * 100000
    i, start = 0, None
    try:
        while True:
            start = time.monotonic()
            buf.push(item(base + i))
            i += 1
            if i == 1:
                flag(f'w{RANK}.pushed')  # the manager dies only once both workers pushed
    except Exception as e:  # noqa: BLE001 - recorded for the test
        RESULT['error'] = {'type': type(e).__name__, 'mro': [c.__name__ for c in type(e).__mro__], 'msg': str(e),
                           'elapsed': time.monotonic() - start}  # fmt: skip
    RESULT['pushed'] = i
    RESULT['ok'] = True
    write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the manager is gone: skip the teardown of the broken process group


def main() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(100, exit=False)
    try:
        from ding_buffer import create_buffer

        buf = create_buffer(config())
        RESULT['role'] = 'manager' if RANK == MANAGER else 'worker'
        manager(buf) if RANK == MANAGER else globals()['worker_' + SCENARIO](buf)
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

"""Benchmark: local actor processes pushing one transition at a time into one manager on the same host.

What is measured
    N actor processes (default 1, 2, 8 and 32) and one manager, all on this machine. Each actor pushes one
    CartPole transition per call -- ``{'obs': float32[4], 'action': int64, 'reward': float32, 'next_obs':
    float32[4], 'done': bool}`` as torch tensors -- into an ``advanced`` buffer (prioritized, tensor storage,
    capacity 1e6) owned by the manager, for ``--seconds`` after a common start (a file barrier: every process first
    builds its buffer and does 20 untimed pushes). Contenders, each a cell of its own:

    * ``torch`` / ``mpi`` / ``ray``: the distributed manager over that backend, every push a request and a reply;
    * ``torch+shm`` / ``mpi+shm`` / ``ray+shm``: the same with ``distributed.shared_memory=True`` (the pushes go
      through each actor's shared-memory ring; the rest of the protocol over the backend);
    * ``cpprb``: cpprb's ``MPPrioritizedReplayBuffer`` (capacity 1e6, the same five fields as numpy, its native
      input), created by the parent, its actors ``multiprocessing`` children calling ``add`` with one row.

    After its timed loop every actor asks the manager for ``count()`` -- for the shared-memory cells that request is
    served only after the manager committed the actor's ring, so the rows counted are stored, not just written --
    and its end time is taken after that answer. Rows/s of a cell = all actors' rows / (last end - common start).
    Nothing is asserted; the table reports each cell's rows/s and its ratio to the ``torch`` cell and to ``cpprb``
    with the same number of actors. All processes run with ``OMP_NUM_THREADS=1``.

Run
    python benchmarks/bench_local_actors.py [--actors 1,2,8,32] [--backends torch,torch+shm,mpi,mpi+shm,ray,
                                            ray+shm,cpprb] [--seconds 3] [--json PATH] [--quick]

    The markdown table goes to stdout, progress to stderr, every cell's per-actor numbers to ``--json`` (default
    ``benchmarks/results/bench_local_actors.json``). A contender that is not installed is skipped and named. The
    script re-runs itself in ``--role rank`` / ``--role ray`` inside the jobs.
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _jobs import child_env, free_port, run_cells, save, save_report  # noqa: E402
from bench_naive import cpu_model  # noqa: E402  (the CPU as every benchmark names it)

DEFAULT_JSON = os.path.join(HERE, 'results', 'bench_local_actors.json')
CAPACITY = 1_000_000
ROW_BYTES = 45  # the payload of one row: obs and next_obs 4 x float32, action int64, reward float32, done bool
WARMUP = 20


# ---------------------------------------------------------------------------------------------- barrier
def ready(d: str, who: str) -> None:
    open(os.path.join(d, f'ready.{who}'), 'w').close()


def wait_go(d: str, limit: float = 600.0) -> float:
    path, end = os.path.join(d, 'go'), time.time() + limit
    while not os.path.exists(path):
        if time.time() > end:
            raise TimeoutError('no start signal')
        time.sleep(0.005)
    with open(path) as f:
        go = float(f.read())
    while time.time() < go:
        time.sleep(0.0005)
    return go


def release(d: str, n: int, limit: float) -> float:
    """Wait until ``n`` processes are ready, then give them a common start 0.5 s ahead."""
    end = time.time() + limit
    while len([f for f in os.listdir(d) if f.startswith('ready.')]) < n:
        if time.time() > end:
            raise TimeoutError(f'only {len([f for f in os.listdir(d) if f.startswith("ready.")])} of {n} got ready')
        time.sleep(0.05)
    go = time.time() + 0.5
    with open(os.path.join(d, 'go.tmp'), 'w') as f:
        f.write(repr(go))
    os.replace(os.path.join(d, 'go.tmp'), os.path.join(d, 'go'))
    return go


# ---------------------------------------------------------------------------------------------- ours
def item():
    import torch

    return {'obs': torch.rand(4), 'action': torch.tensor(1), 'reward': torch.tensor(1.0), 'next_obs': torch.rand(4),
            'done': torch.tensor(False)}  # fmt: skip


def ding_cfg(backend: str, shm: bool) -> dict:
    d = dict(backend=backend, shared_memory=shm, timeout=120.0, startup_timeout=300.0, heartbeat_seconds=5.0,
             peer_timeout=600.0)  # fmt: skip
    return dict(type='advanced', replay_buffer_size=CAPACITY, storage=dict(type='tensor'), distributed=d)


def actor_loop(buf, d: str, who: str, seconds: float) -> dict:
    x = item()
    for _ in range(WARMUP):
        buf.push(x)
    buf.count()
    ready(d, who)
    go = wait_go(d)
    stop, n = go + seconds, 0
    while time.time() < stop:
        buf.push(x)
        n += 1
    count = buf.count()  # shared memory: answered once this actor's ring was committed
    end = time.time()
    return {'rows': n, 'go': go, 'end': end, 'count_seen': count}


def watch_manager(buffer, d: str, seconds: float, out: dict) -> None:
    """In the manager's process: its CPU time (all threads) and the rows its buffer gained over the timed
    window, for the rows stored per second of manager CPU (the window's first 90%: the actors end after it)."""
    wait_go(d)
    cpu, rows = time.process_time(), buffer.count()
    time.sleep(0.9 * seconds)
    out.update(window_cpu_s=time.process_time() - cpu, window_rows=buffer.count() - rows)


def rank_main(args) -> None:
    from ding_buffer import create_buffer
    from ding_buffer.distributed import ReplayBufferManager

    buf = create_buffer(ding_cfg(args.backend, args.shm))
    rank = os.environ.get('RANK') or os.environ.get('OMPI_COMM_WORLD_RANK') or os.environ.get('PMIX_RANK')
    if isinstance(buf, ReplayBufferManager):
        window: dict = {}
        watch = threading.Thread(target=watch_manager, args=(buf.buffer, args.dir, args.seconds, window), daemon=True)
        watch.start()
        summary = buf.run(timeout=900)
        watch.join(30)  # (a starved watcher may end after the actors)
        save(args.dir, 'manager', {'count': buf.buffer.count(), 'counters': summary['counters'], **window})
        buf.close()
        return
    rec = actor_loop(buf, args.dir, f'rank{rank}', args.seconds)
    buf.close()
    save(args.dir, f'rank{rank}', rec)


def ray_task(shm: bool, d: str, who: str, seconds: float, name: str) -> dict:
    from ding_buffer import create_buffer

    cfg = ding_cfg('ray', shm)
    cfg['distributed'].update(actor_name=name, namespace='bench_local_actors')
    buf = create_buffer(cfg)
    rec = actor_loop(buf, d, who, seconds)
    buf.close()
    return rec


def ray_main(args) -> None:
    import ray

    from ding_buffer import create_buffer

    ray.init(num_cpus=args.actors + 2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    name = f'bench_{os.getpid()}'
    cfg = ding_cfg('ray', args.shm)
    cfg['distributed'].update(actor_name=name, namespace='bench_local_actors')
    drv = create_buffer(cfg)
    task = ray.remote(num_cpus=1, max_retries=0)(ray_task)
    refs = [task.remote(args.shm, args.dir, f'task{i}', args.seconds, name) for i in range(args.actors)]
    release(args.dir, args.actors, 600)
    recs = ray.get(refs, timeout=900)
    for i, rec in enumerate(recs):
        save(args.dir, f'task{i}', rec)
    st = drv.stats()
    save(args.dir, 'manager', {'count': st['count'], 'counters': {k[8:]: v for k, v in st.items()
                                                                  if k.startswith('manager/')}})  # fmt: skip
    drv.close()
    ray.shutdown()


# ---------------------------------------------------------------------------------------------- cpprb
def cpprb_actor(rb, d: str, who: str, seconds: float) -> None:
    import numpy as np

    obs, nxt = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    row = dict(obs=obs, act=1, rew=1.0, next_obs=nxt, done=0.0)
    for _ in range(WARMUP):
        rb.add(**row)
    ready(d, who)
    go = wait_go(d)
    stop, n = go + seconds, 0
    while time.time() < stop:
        rb.add(**row)
        n += 1
    count = rb.get_stored_size()
    save(d, who, {'rows': n, 'go': go, 'end': time.time(), 'count_seen': int(count)})


def run_cpprb(actors: int, seconds: float, d: str) -> dict:
    import numpy as np
    from cpprb import MPPrioritizedReplayBuffer

    env = {'obs': {'shape': 4, 'dtype': np.float32}, 'act': {'dtype': np.int64}, 'rew': {'dtype': np.float32},
           'next_obs': {'shape': 4, 'dtype': np.float32}, 'done': {'dtype': np.float32}}  # fmt: skip
    rb = MPPrioritizedReplayBuffer(CAPACITY, env)
    procs = [mp.Process(target=cpprb_actor, args=(rb, d, f'proc{i}', seconds)) for i in range(actors)]
    for p in procs:
        p.start()
    release(d, actors, 600)
    for p in procs:
        p.join(600)
    return {'count': int(rb.get_stored_size())}


# ---------------------------------------------------------------------------------------------- orchestration
def launch(contender: str, actors: int, seconds: float, d: str) -> None:
    backend, shm = contender.replace('+shm', ''), contender.endswith('+shm')
    me = [sys.executable, os.path.abspath(__file__), '--dir', d, '--seconds', str(seconds)]
    me += ['--shm'] if shm else []
    if backend == 'cpprb':
        save(d, 'manager', run_cpprb(actors, seconds, d))
        return
    if backend == 'ray':
        proc = subprocess.Popen(me + ['--role', 'ray', '--actors', str(actors)], env=child_env(), stdout=sys.stderr)
        procs = [proc]
    elif backend == 'torch':
        port, procs = free_port(), []
        for r in range(actors + 1):
            env = child_env()
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(actors + 1), MASTER_ADDR='127.0.0.1',
                       MASTER_PORT=str(port))  # fmt: skip
            procs.append(subprocess.Popen(me + ['--role', 'rank', '--backend', 'torch'], env=env, stdout=sys.stderr))
    else:
        cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(actors + 1)]
        procs = [
            subprocess.Popen(cmd + me + ['--role', 'rank', '--backend', 'mpi'], env=child_env(), stdout=sys.stderr)
        ]
    if backend != 'ray':
        release(d, actors, 600)
    for p in procs:
        try:
            p.wait(900)
        except subprocess.TimeoutExpired:
            p.kill()
            raise


def cell(contender: str, actors: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix='bench_local_actors_')
    try:
        launch(contender, actors, seconds, d)
        recs = []
        for f in sorted(os.listdir(d)):
            if f.startswith('result.') and f.endswith('.json'):
                with open(os.path.join(d, f)) as fh:
                    recs.append((f[7:-5], json.load(fh)))
        manager = dict(recs).pop('manager', {})
        acts = [r for who, r in recs if who != 'manager']
        if len(acts) != actors:
            raise RuntimeError(f'{len(acts)} of {actors} actors reported')
        go = min(r['go'] for r in acts)
        rows = sum(r['rows'] for r in acts)
        return {
            'contender': contender,
            'actors': actors,
            'rows': rows,
            'seconds': max(r['end'] for r in acts) - go,
            'rows_per_s': rows / (max(r['end'] for r in acts) - go),
            'mb_per_s': rows * ROW_BYTES / (1 << 20) / (max(r['end'] for r in acts) - go),
            'rows_per_manager_cpu_s': (
                manager['window_rows'] / manager['window_cpu_s'] if manager.get('window_cpu_s') else None
            ),
            'manager': manager,
            'per_actor': acts,
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def available(contender: str) -> str:
    import importlib.util

    backend = contender.replace('+shm', '')
    if backend == 'mpi' and (shutil.which('mpirun') is None or importlib.util.find_spec('mpi4py') is None):
        return 'mpirun / mpi4py missing'
    if backend in ('ray', 'cpprb') and importlib.util.find_spec(backend) is None:
        return f'{backend} is not installed'
    return ''


def table(cells: list, contenders: list, actors: list) -> str:
    by = {(c['contender'], c['actors']): c for c in cells}
    lines = ['| contender | ' + ' | '.join(f'{n} actor{"s" if n > 1 else ""}' for n in actors) + ' |',
             '|---|' + '---:|' * len(actors)]  # fmt: skip
    for name in contenders:
        row = []
        for n in actors:
            c, base, peer = by.get((name, n)), by.get(('torch', n)), by.get(('cpprb', n))
            if c is None:
                row.append('-')
                continue
            text = f'{c["rows_per_s"]:,.0f}/s, {c["mb_per_s"]:.2f} MB/s'
            notes = []
            if base is not None and name != 'torch':
                notes.append(f'{c["rows_per_s"] / base["rows_per_s"]:.1f}x torch')
            if peer is not None and name != 'cpprb':
                notes.append(f'{c["rows_per_s"] / peer["rows_per_s"]:.2f}x cpprb')
            row.append(text + (f' ({", ".join(notes)})' if notes else ''))
        lines.append(f'| {name} | ' + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def cpu_table(cells: list, contenders: list, actors: list) -> str:
    """Rows the manager stored per second of its own CPU time (all its threads) in the timed window: the
    requests one manager core serves, for the wire rows (one row per request)."""
    by = {(c['contender'], c['actors']): c for c in cells}
    lines = ['| contender | ' + ' | '.join(f'{n} actor{"s" if n > 1 else ""}' for n in actors) + ' |',
             '|---|' + '---:|' * len(actors)]  # fmt: skip
    for name in contenders:
        vals = [by.get((name, n), {}).get('rows_per_manager_cpu_s') for n in actors]
        if any(v is not None for v in vals):
            lines.append(f'| {name} | ' + ' | '.join('-' if v is None else f'{v:,.0f}' for v in vals) + ' |')
    return '\n'.join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--actors', default='1,2,8,32', help='actor counts, comma-separated')
    p.add_argument('--backends', default='torch,torch+shm,mpi,mpi+shm,ray,ray+shm,cpprb', help='contenders')
    p.add_argument('--seconds', type=float, default=3.0, help='timed seconds of every cell')
    p.add_argument('--quick', action='store_true', help='smoke run: 1 and 2 actors, 1 second a cell')
    p.add_argument('--json', default=DEFAULT_JSON, help=f'JSON output (default {DEFAULT_JSON})')
    p.add_argument('--role', choices=('main', 'rank', 'ray'), default='main', help=argparse.SUPPRESS)
    p.add_argument('--backend', help=argparse.SUPPRESS)
    p.add_argument('--shm', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--dir', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == 'rank':
        return rank_main(args)
    if args.role == 'ray':
        args.actors = int(args.actors)
        return ray_main(args)
    if args.quick:
        args.actors, args.seconds = '1,2', 1.0
    actors = [int(x) for x in args.actors.split(',')]
    contenders = args.backends.split(',')
    cells, skipped = run_cells(
        actors,
        contenders,
        available,
        cell,
        args.seconds,
        'actor',
        lambda c: f'{c["rows_per_s"]:,.0f} rows/s (stored {c["manager"].get("count")})',
    )
    save_report(args.json, cpu_model(), cells, skipped)
    print('One-row pushes per second, all actors together (ratios: to the torch backend and to cpprb with as many '
          'actors)\n')  # fmt: skip
    print(table(cells, [c for c in contenders if c not in skipped], actors))
    print('\nRows stored per second of the manager process\'s CPU time (all its threads) in the timed window '
          '(torch and MPI: the manager is a rank of the job; over the wire one row is one request)\n')  # fmt: skip
    print(cpu_table(cells, [c for c in contenders if c not in skipped], actors))
    for name, why in skipped.items():
        print(f'\n- {name}: skipped ({why})')


if __name__ == '__main__':
    main()

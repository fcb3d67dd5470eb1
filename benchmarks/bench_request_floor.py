"""Benchmark: the floor of small request/reply round trips over the transports of the distributed manager.

What is measured
    N client processes (default 1, 2 and 8) and ONE server process, all on this machine. Each client sends a
    100-byte request and waits for the server's 16-byte reply, then sends the next one. Only the transports' own
    calls are used -- no ding_buffer code runs in the jobs -- so the numbers are the most any request/reply protocol
    over that transport can serve with one server process:

    * ``torch``: ``torch.distributed`` with the gloo backend, one process per rank (rank 0 the server). The server
      runs one thread per client: ``dist.recv(buf, src=client)`` then ``dist.send(reply, dst=client)``;
    * ``mpi``: mpi4py under ``mpirun`` (rank 0 the server), one thread: ``comm.Recv(buf, source=ANY_SOURCE)`` then
      ``comm.Send(reply, dest=source)``;
    * ``ray``: a plain (synchronous, one request at a time) server actor with ``take(bytes) -> int``, called by N
      client actors with ``ray.get(server.take.remote(payload))``.

    The server's timed window starts 1 s after its first request (the warm-up) and lasts ``--seconds``; over it the
    server counts the requests it served, the wall time and its own CPU time (``time.process_time()``: every thread
    of the server process; for Ray only the server actor's worker process -- the raylet, GCS and driver are not
    counted). After the window every reply carries a stop flag, and a client stops at that reply (or at a deadline,
    if the server never answers). The table reports requests/s of wall time, server CPU microseconds per request and
    requests per second of server CPU. Open MPI busy-polls while it waits, so its server CPU per request includes
    spinning: an upper bound on the work a request costs, not the work itself. Nothing is random and nothing is
    asserted. All processes run with ``OMP_NUM_THREADS=1``.

    A second table times the manager's own steps of one small request in this process, with no transport
    (``manager_steps``): the request's encode and decode, ``ManagerCore.handle`` of a one-row push, the reply's
    encode, and the buffer's ``push`` of 1, 8 and 64 rows in one call, per row -- what serving queued requests in
    one buffer call could save.

Run
    python benchmarks/bench_request_floor.py [--transports torch,mpi,ray] [--clients 1,2,8] [--seconds 3]
                                             [--json PATH] [--quick]

    The markdown table goes to stdout, progress to stderr, every cell's numbers (with each client's request count)
    to ``--json`` (default ``benchmarks/results/bench_request_floor.json``). A transport that is not installed is
    skipped and named; a job that fails or runs past its timeout is reported and the others run. The script
    re-runs itself in ``--role torch`` / ``--role mpi`` / ``--role ray`` inside the jobs.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _jobs import child_env, free_port, run_cells, save, save_report  # noqa: E402  (standard library only)

DEFAULT_JSON = os.path.join(HERE, 'results', 'bench_request_floor.json')
TRANSPORTS = ('torch', 'mpi', 'ray')
REQUEST_BYTES = 100
REPLY_BYTES = 16
WARMUP_S = 1.0  # the server's timed window starts this long after its first request
CLIENT_SLACK_S = 60.0  # a client gives up this long after warm-up + window (the server never stopped it)
JOB_TIMEOUT_S = 180.0  # one job (its start-up included), then it is killed
RPC_TIMEOUT_S = 60.0  # one blocking call of a transport that takes a timeout


# ---------------------------------------------------------------------------------------------- server window
class Window:
    """The server's timed window: starts ``warmup`` s after the first request, lasts ``seconds``. ``tick(count)``
    after every served request (``count``: requests served so far) returns True once the window is over."""

    def __init__(self, seconds: float, warmup: float = WARMUP_S):
        self.seconds, self.warmup = seconds, warmup
        self.first = self.start = self.end = None

    def tick(self, count: int) -> bool:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        elif self.start is None:
            if now - self.first >= self.warmup:
                self.start = (now, time.process_time(), count)
        elif now - self.start[0] >= self.seconds:
            self.end = (now, time.process_time(), count)
            return True
        return False

    def report(self) -> dict:
        if self.end is None:
            raise RuntimeError('the timed window did not end')
        (w0, c0, n0), (w1, c1, n1) = self.start, self.end
        n, wall, cpu = n1 - n0, w1 - w0, c1 - c0
        return {
            'requests': n,
            'wall_s': wall,
            'cpu_s': cpu,
            'requests_per_s': n / wall,
            'cpu_us_per_request': 1e6 * cpu / n if n else None,
            'requests_per_cpu_s': n / cpu if cpu > 0 else None,
        }


# ---------------------------------------------------------------------------------------------- torch (gloo)
def torch_main(args) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group('gloo', timeout=dt.timedelta(seconds=RPC_TIMEOUT_S))  # bounds every send / recv
    rank, n = dist.get_rank(), dist.get_world_size() - 1
    reply = torch.zeros(REPLY_BYTES, dtype=torch.uint8)
    stop = torch.zeros(REPLY_BYTES, dtype=torch.uint8)
    stop[0] = 1
    if rank == 0:
        window, counts, lock, done, errors = Window(args.seconds), [0] * (n + 1), threading.Lock(), [False], []

        def serve(client: int) -> None:
            buf = torch.zeros(REQUEST_BYTES, dtype=torch.uint8)
            try:
                while True:
                    dist.recv(buf, src=client)
                    counts[client] += 1
                    if done[0]:
                        dist.send(stop, dst=client)
                        return
                    with lock:
                        if not done[0]:
                            done[0] = window.tick(sum(counts))
                    dist.send(reply, dst=client)
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(f'client {client}: {type(e).__name__}: {e}')

        threads = [threading.Thread(target=serve, args=(c,), daemon=True) for c in range(1, n + 1)]
        for t in threads:
            t.start()
        limit = time.monotonic() + JOB_TIMEOUT_S
        for t in threads:
            t.join(max(0.0, limit - time.monotonic()))
        if errors or any(t.is_alive() for t in threads):
            raise RuntimeError(f'server threads failed or hung: {errors}')
        save(args.dir, 'server', {**window.report(), 'served': sum(counts)})
    else:
        msg, got = torch.full((REQUEST_BYTES,), rank, dtype=torch.uint8), torch.zeros(REPLY_BYTES, dtype=torch.uint8)
        requests, stopped, deadline = 0, False, time.monotonic() + WARMUP_S + args.seconds + CLIENT_SLACK_S
        while time.monotonic() < deadline:
            dist.send(msg, dst=0)
            dist.recv(got, src=0)
            requests += 1
            if got[0].item() == 1:
                stopped = True
                break
        save(args.dir, f'client{rank}', {'requests': requests, 'stopped': stopped})
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- MPI
def mpi_main(args) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size() - 1
    reply, stop = np.zeros(REPLY_BYTES, np.uint8), np.zeros(REPLY_BYTES, np.uint8)
    stop[0] = 1
    if rank == 0:
        buf, status, window = np.zeros(REQUEST_BYTES, np.uint8), MPI.Status(), Window(args.seconds)
        served, stopped, done = 0, 0, False
        while stopped < n:  # (blocks without a timeout of its own: the job's timeout bounds it)
            comm.Recv([buf, MPI.BYTE], source=MPI.ANY_SOURCE, tag=0, status=status)
            src = status.Get_source()
            served += 1
            if not done:
                done = window.tick(served)
            if done:
                comm.Send([stop, MPI.BYTE], dest=src, tag=1)
                stopped += 1
            else:
                comm.Send([reply, MPI.BYTE], dest=src, tag=1)
        save(args.dir, 'server', {**window.report(), 'served': served})
    else:
        msg, got = np.full(REQUEST_BYTES, rank % 256, np.uint8), np.zeros(REPLY_BYTES, np.uint8)
        requests, stopped, deadline = 0, False, time.monotonic() + WARMUP_S + args.seconds + CLIENT_SLACK_S
        while time.monotonic() < deadline:
            comm.Send([msg, MPI.BYTE], dest=0, tag=0)
            comm.Recv([got, MPI.BYTE], source=0, tag=1)
            requests += 1
            if got[0] == 1:
                stopped = True
                break
        save(args.dir, f'client{rank}', {'requests': requests, 'stopped': stopped})


# ---------------------------------------------------------------------------------------------- Ray
def ray_main(args) -> None:
    import ray

    n = int(args.clients)
    ray.init(num_cpus=n + 2, include_dashboard=False, log_to_driver=False, configure_logging=False)

    @ray.remote
    class Server:
        def __init__(self, seconds: float):
            self.window, self.served, self.done = Window(seconds), 0, False

        def take(self, request: bytes) -> int:
            self.served += 1
            if not self.done:
                self.done = self.window.tick(self.served)
            return 1 if self.done else 0

        def report(self) -> dict:
            return {**self.window.report(), 'served': self.served, 'pid': os.getpid()}

    @ray.remote
    class Client:
        def run(self, server, deadline: float) -> dict:
            payload, requests = b'x' * REQUEST_BYTES, 0
            while time.time() < deadline:
                requests += 1
                if ray.get(server.take.remote(payload), timeout=RPC_TIMEOUT_S) == 1:
                    return {'requests': requests, 'stopped': True}
            return {'requests': requests, 'stopped': False}

    server = Server.remote(args.seconds)
    clients = [Client.remote() for _ in range(n)]
    ray.get([server.__ray_ready__.remote()] + [c.__ray_ready__.remote() for c in clients], timeout=JOB_TIMEOUT_S)
    deadline = time.time() + WARMUP_S + args.seconds + CLIENT_SLACK_S
    recs = ray.get([c.run.remote(server, deadline) for c in clients], timeout=JOB_TIMEOUT_S)
    for i, rec in enumerate(recs, start=1):
        save(args.dir, f'client{i}', rec)
    save(args.dir, 'server', ray.get(server.report.remote(), timeout=RPC_TIMEOUT_S))
    ray.shutdown()


# ---------------------------------------------------------------------------------------------- orchestration
def launch(transport: str, clients: int, seconds: float, d: str) -> None:
    """One job: the server and ``clients`` clients, killed (its whole process group) after ``JOB_TIMEOUT_S``."""
    me = [sys.executable, os.path.abspath(__file__), '--dir', d, '--seconds', str(seconds), '--role', transport]
    procs = []
    if transport == 'torch':
        port = free_port()
        for r in range(clients + 1):
            env = child_env()
            env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(clients + 1), MASTER_ADDR='127.0.0.1',
                       MASTER_PORT=str(port))  # fmt: skip
            procs.append(subprocess.Popen(me, env=env, stdout=sys.stderr, start_new_session=True))
    elif transport == 'mpi':
        cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(clients + 1)]
        procs.append(subprocess.Popen(cmd + me, env=child_env(), stdout=sys.stderr, start_new_session=True))
    else:
        me += ['--clients', str(clients)]
        procs.append(subprocess.Popen(me, env=child_env(), stdout=sys.stderr, start_new_session=True))
    limit = time.monotonic() + JOB_TIMEOUT_S
    try:
        for p in procs:
            rc = p.wait(max(0.1, limit - time.monotonic()))
            if rc != 0:
                raise RuntimeError(f'a process of the job exited with {rc}')
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p)


def kill_group(p: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(grace)
            return
        except subprocess.TimeoutExpired:
            pass


def cell(transport: str, clients: int, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix='bench_request_floor_')
    try:
        launch(transport, clients, seconds, d)
        recs = {}
        for f in sorted(os.listdir(d)):
            if f.startswith('result.') and f.endswith('.json'):
                with open(os.path.join(d, f)) as fh:
                    recs[f[7:-5]] = json.load(fh)
        server = recs.pop('server', None)
        if server is None:
            raise RuntimeError('the server reported nothing')
        if len(recs) != clients:
            raise RuntimeError(f'{len(recs)} of {clients} clients reported')
        return {'transport': transport, 'clients': clients, **server, 'per_client': recs}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def available(transport: str) -> str:
    import importlib.util

    if transport == 'mpi' and (shutil.which('mpirun') is None or importlib.util.find_spec('mpi4py') is None):
        return 'mpirun / mpi4py missing'
    if transport == 'ray' and importlib.util.find_spec('ray') is None:
        return 'ray is not installed'
    return ''


def table(cells: list) -> str:
    def num(v, f):
        return '-' if v is None else format(v, f)

    lines = [
        '| transport | clients | requests/s (wall) | server CPU us per request | requests per server-CPU second |',
        '|---|---:|---:|---:|---:|',
    ]
    for c in cells:
        lines.append(
            f'| {c["transport"]} | {c["clients"]} | {c["requests_per_s"]:,.0f} | '
            f'{num(c["cpu_us_per_request"], ",.1f")} | {num(c["requests_per_cpu_s"], ",.0f")} |'
        )
    return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------- the manager's steps
def manager_steps(n: int = 20000) -> list:
    """What one small request costs the manager in one warm process, step by step, with no transport: the decode
    of a one-row push as it arrives, ``ManagerCore.handle`` (of which the buffer's ``push``), the reply's encode; and
    the buffer's ``push`` of k rows in one call, per row (what serving k queued requests in one buffer call would
    pay). An ``advanced`` buffer on tensor storage, the five CartPole fields of ``bench_local_actors``."""
    import torch

    from ding_buffer import create_buffer
    from ding_buffer.distributed.codec import decode, encode
    from ding_buffer.distributed.config import build_distributed_config
    from ding_buffer.distributed.manager import ManagerCore

    x = {'obs': torch.rand(4), 'action': torch.tensor(1), 'reward': torch.tensor(1.0), 'next_obs': torch.rand(4),
         'done': torch.tensor(False)}  # fmt: skip
    buf = create_buffer(dict(type='advanced', replay_buffer_size=n, storage=dict(type='tensor')))
    core = ManagerCore(buf, build_distributed_config(dict(backend='torch')), 'log_reward')
    rows, seq = [], iter(range(1 << 62))

    def timed(name, fn, items, per=1):
        t = time.perf_counter()
        out = [fn(it) for it in items]
        rows.append({'step': name, 'us': 1e6 * (time.perf_counter() - t) / (len(items) * per)})
        return out

    for rep in range(2):  # the first fills the storage once (page faults), the second is reported
        rows.clear()
        request = [{'id': i, 'op': 'push', 'args': {'data': [x], 'client': 'c', 'seq': next(seq)}} for i in range(n)]
        wire = timed('encode of the request (on the worker)', encode, request)
        got = timed('decode of the request', lambda m: decode(m[0], [bytearray(p) for p in m[1]]), wire)
        replies = timed('ManagerCore.handle (push, dedup, counters, reply dict)', lambda r: core.handle(0, r), got)
        refused = [r for r in replies if not r.get('ok') or r['result']['stored'] != 1]
        if refused:
            raise RuntimeError(f'the manager did not store {len(refused)} of the timed pushes: {refused[0]}')
        timed('encode of the reply', encode, replies)
        for k in (1, 8, 64):
            lists = [[r['args']['data'][0] for r in got[i : i + k]] for i in range(0, n - k + 1, k)]
            timed(f'buffer.push alone, {k} row(s) in one call, per row', buf.push, lists, per=k)
    return rows


def options(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--transports', default=','.join(TRANSPORTS), help='comma-separated, of torch,mpi,ray')
    p.add_argument('--clients', default='1,2,8', help='client counts, comma-separated')
    p.add_argument('--seconds', type=float, default=3.0, help='timed window of every cell, after a 1 s warm-up')
    p.add_argument('--quick', action='store_true', help='smoke run: 1 and 2 clients, a 1-second window')
    p.add_argument('--json', default=DEFAULT_JSON, help=f'JSON output (default {DEFAULT_JSON})')
    p.add_argument('--role', choices=('main',) + TRANSPORTS, default='main', help=argparse.SUPPRESS)
    p.add_argument('--dir', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role != 'main':
        return args
    if args.quick:
        args.clients, args.seconds = '1,2', 1.0
    args.transports = [t for t in args.transports.split(',') if t]
    bad = [t for t in args.transports if t not in TRANSPORTS]
    if bad or not args.transports:
        p.error(f'--transports: {",".join(bad) or "none given"} (choose from {",".join(TRANSPORTS)})')
    try:
        args.clients = [int(x) for x in args.clients.split(',')]
    except ValueError:
        p.error(f'--clients: {args.clients!r} is not a comma-separated list of integers')
    if not args.clients or min(args.clients) < 1:
        p.error('--clients: every count must be >= 1')
    if args.seconds <= 0:
        p.error('--seconds must be > 0')
    return args


def main(argv=None) -> None:
    args = options(argv)
    if args.role != 'main':
        return {'torch': torch_main, 'mpi': mpi_main, 'ray': ray_main}[args.role](args)
    from bench_naive import cpu_model  # the CPU as every benchmark names it (only here: the jobs import no ding_buffer)

    cells, skipped = run_cells(
        args.clients,
        args.transports,
        available,
        cell,
        args.seconds,
        'client',
        lambda c: f'{c["requests_per_s"]:,.0f} requests/s, {c["cpu_s"]:.2f} server CPU s in {c["wall_s"]:.2f} s',
    )
    order = {t: i for i, t in enumerate(args.transports)}
    cells.sort(key=lambda c: (order[c['transport']], c['clients']))
    save_report(args.json, cpu_model(), cells, skipped, warmup_s=WARMUP_S, seconds=args.seconds)
    print(f'{REQUEST_BYTES}-byte requests, {REPLY_BYTES}-byte replies, N synchronous clients, one server process; '
          f'a {args.seconds:g} s window after {WARMUP_S:g} s of warm-up. Server CPU = time.process_time() of the '
          'server process (all threads); Open MPI busy-polls, so its CPU includes spinning\n')  # fmt: skip
    print(table(cells))
    for name, why in skipped.items():
        print(f'\n- {name}: skipped ({why})')
    steps = manager_steps()
    print('\nThe manager\'s own steps of one small request, in one warm process (no transport):\n')
    print('| step | us |\n|---|---:|\n' + '\n'.join(f'| {r["step"]} | {r["us"]:.1f} |' for r in steps))
    with open(args.json) as f:
        report = json.load(f)
    report['manager_steps'] = steps
    with open(args.json, 'w') as f:
        json.dump(report, f, indent=1)


if __name__ == '__main__':
    main()

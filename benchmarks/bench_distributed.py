"""Benchmark of ``ding_buffer``'s distributed buffer: workers push batches of tensors to one manager.

What is measured
    For each backend (torch.distributed gloo under ``torchrun``, MPI under ``mpirun``, Ray) and each batch size
    (default 0.1, 1 and 5 MB; MB = 2**20 bytes of tensor payload), with 1 manager and 2 workers (and a 1-worker
    row), in one job and with the same worker processes:

    * raw transport: each worker sends one uint8 buffer of the batch's byte size to the manager and waits for a
      1-byte ack (a round trip like a synchronous push). torch: ``dist.send``/``dist.recv`` (the manager
      receives into a preallocated tensor per worker, one thread per worker as ding_buffer's transport does);
      mpi: ``comm.Send``/``comm.Recv`` of a numpy buffer (the manager receives ``ANY_SOURCE`` into a
      preallocated buffer in one thread: blocking receives in several threads would spin several cores);
      ray: ``ray.get(actor.take.remote(array))`` on an actor method returning ``len(array)``;
    * end to end: each worker pushes a dict ``{'obs': float32[rows, 128], 'log_reward': float32[rows]}`` of the
      batch's size with ``RemoteBuffer.push(batch, batched=True)`` into a ``'naive'`` buffer on tensor storage
      (capacity 4 batches) owned by the manager; synchronous pushes (``async_score=False``), plus an
      ``async_score=True`` column for the 2-worker rows (the next push is sent before the previous score is
      read; the last score is drained inside the timed region), and a shared-memory column for every row
      (``distributed.shared_memory=True``: the pushes go into the worker's ring; the clock stops when a
      ``count()`` returns, which the manager answers after committing every row; ``--no-shm`` skips it, ``--hosts``
      too);
    * torchgfn (when installed), under ``torchrun`` with 2 workers: torchgfn 2.4.1's ``ReplayBufferManager``
      (plain ``ReplayBuffer``, prioritized capacity of 4 batches) fed by ``ReplayBuffer(env,
      remote_manager_rank=...).add(container)`` on each worker, with ``StatesContainer``s of
      ``HyperGrid(ndim=64, height=8)`` states: int64 states [rows, 64] + bool is_terminating + float32 log-rewards,
      517 bytes per row vs our 516, so the tensor payload matches within 0.2%. ``add`` also keeps the worker's
      local copy, as torchgfn always does; torchgfn's wire format dill-pickles the container (env included)
      and converts the bytes to and from a Python list of ints. Its batch count is capped (see the table).

    Every cell runs ``--rounds`` times (default 3), each round measuring raw and end to end back to back, rounds
    one after another: on a shared 2-core machine a single short cell swings by tens of percent, so the tables
    show medians over the rounds and the e2e/raw column the median of the rounds' own ratios with their range.
    Every worker does 4 untimed warm-up pushes (they fill the manager's storage once, so its pages are faulted in
    before the clock starts; 2 raw sends, 2 torchgfn adds), then N timed ones; its rate is N * payload bytes /
    (time of the last - time of the first). Aggregate MB/s = all workers' bytes / (last end - first start),
    per-worker MB/s = mean of the workers' own rates; batches/s is aggregate. e2e/raw = aggregate end-to-end /
    aggregate raw of the same row; ours/torchgfn = aggregate ding_buffer (sync) / aggregate torchgfn.
    N = payload budget / batch size, clamped (see the header of the output). All processes run with
    ``OMP_NUM_THREADS=1``. Nothing is asserted; the targets of the issue (end-to-end >= 50% of raw for batches
    >= 1 MB; >= 10x torchgfn's manager) are checked per row and printed.

Run
    python benchmarks/bench_distributed.py [--quick] [--backends torch,mpi,ray] [--sizes 0.1,1,5]
                                           [--workers 2,1] [--rounds 3] [--no-async] [--no-shm] [--no-torchgfn]
                                           [--json PATH]
                                           [--hosts 10gbit]

    ``--hosts RATE`` runs every rank on a host of its own: network namespaces joined by a bridge
    (``tests/distributed/netns_hosts.py``; needs root), every link shaped with ``tc tbf`` to RATE; torch ranks
    rendezvous at the first host's address, mpirun starts its ranks through an rsh agent that enters the namespace
    (TCP only). Ray is not run that way here.

    ``--quick`` (a handful of batches per cell) is a smoke run. Each backend runs as its own job (subprocess with a
    timeout); a backend that is unavailable or fails is reported and skipped. Tables go to stdout as markdown,
    progress to stderr, everything (per-rank raw timings included) to ``--json`` (``--out`` is the same; default
    ``benchmarks/results/bench_distributed.json``). The script re-runs itself in ``--role rank`` /
    ``--role ray-driver`` mode inside the jobs.
"""

import argparse
import datetime
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _jobs import free_port  # noqa: E402

MB = 1 << 20
OBS_DIM = 128  # ours: float32[rows, 128] + float32[rows] = 516 bytes per row
OUR_ROW_BYTES = OBS_DIM * 4 + 4
GFN_NDIM = 64  # torchgfn: int64[rows, 64] + bool[rows] + float32[rows] = 517 bytes per row
GFN_ROW_BYTES = GFN_NDIM * 8 + 1 + 4
CAPACITY_BATCHES = 4
WARMUP = 2
PUSH_WARMUP = CAPACITY_BATCHES  # ours: untimed pushes that fill the manager's storage once (its pages faulted in)
RAW_TAG = 99  # ding_buffer's transport uses tag 7; torchgfn tag 0
WORLD = 3  # torch / mpi jobs: ranks 0..W-1 are workers, rank 2 the manager
DEFAULT_OUT = os.path.join(HERE, 'results', 'bench_distributed.json')
PACKAGES = ('torch', 'numpy', 'mpi4py', 'ray', 'torchgfn', 'ding_buffer')
TARGET_RAW_SHARE = 0.5
TARGET_GFN_RATIO = 10.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def now() -> float:
    return time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine


# ============================================================================================ rank side
def make_batches(rows: int, seed: int, k: int = 2) -> List[Dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {'obs': torch.randn(rows, OBS_DIM, generator=g), 'log_reward': torch.randn(rows, generator=g)} for _ in range(k)
    ]


def ding_cfg(ph: Dict[str, Any], plan: Dict[str, Any], backend: str, mode: str, **extra) -> Dict[str, Any]:
    dist_cfg = dict(
        backend=backend,
        timeout=plan['timeout'],
        heartbeat_seconds=3600.0,
        peer_timeout=None,
        async_score=(mode == 'async'),
        shared_memory=(mode == 'shm'),
        **extra,
    )
    return dict(
        type='naive',
        replay_buffer_size=ph['rows'] * CAPACITY_BATCHES,
        storage=dict(type='tensor'),
        distributed=dist_cfg,
    )


def push_loop(buf: Any, ph: Dict[str, Any], seed: int, mode: str, timeout: float) -> Dict[str, Any]:
    """A worker's timed pushes; returns its record (t0/t1 on the machine-wide monotonic clock)."""
    batches = make_batches(ph['rows'], seed)
    total = PUSH_WARMUP + ph['n']
    lat = []
    t0 = now()
    for i in range(total):
        if i == PUSH_WARMUP:
            t0 = now()
        a = time.perf_counter()
        buf.push(batches[i % len(batches)], batched=True)
        lat.append(time.perf_counter() - a)
    if mode == 'async':
        buf.drain_pending_score(timeout)
    stored = (buf.pushes.last_score or {}).get("stored")
    if mode == 'shm':  # the pushes returned once written to the ring: the clock stops when the manager has
        buf.count()  # committed them all (it commits a worker's ring before it serves any request of the worker)
    t1 = now()
    buf.close()
    return dict(t0=t0, t1=t1, n=ph['n'], bytes=ph['bytes'], last_stored=stored, lat=lat[PUSH_WARMUP:])


def serve_timed(mgr: Any, timeout: float) -> Dict[str, Any]:
    """Run a ReplayBufferManager, timing its request handling (buffer push etc.; decoding is in the transport)."""
    spent = [0.0]
    handle = mgr.core.handle

    def timed(sender, request):
        a = time.perf_counter()
        try:
            return handle(sender, request)
        finally:
            spent[0] += time.perf_counter() - a

    mgr.core.handle = timed
    a = now()
    summary = mgr.run(timeout=timeout)
    out = dict(
        run_s=now() - a,
        handle_s=spent[0],
        count=mgr.count(),
        counters=summary['counters'],
        lost=summary['lost'],
        bytes_received=summary['bytes_received'],
        recv_buffers_reused=summary.get('recv_buffers_reused'),
    )
    mgr.close()
    return out


def timed_round_trips(total: int, round_trip) -> Dict[str, Any]:
    """Run ``round_trip`` ``total`` times; the clock starts after the WARMUP first ones."""
    lat = []
    t0 = now()
    for i in range(total):
        if i == WARMUP:
            t0 = now()
        a = time.perf_counter()
        round_trip()
        lat.append(time.perf_counter() - a)
    return dict(t0=t0, t1=now(), lat=lat[WARMUP:])


def e2e_modes(
    plan: Dict[str, Any], ph: Dict[str, Any], backend: str, rank: int, world: int, mgr: int, workers: List[int], barrier
) -> List[Dict[str, Any]]:
    """The end-to-end cells of one phase on this rank (torch and MPI jobs): serve on the manager, push on
    the workers."""
    from ding_buffer import create_buffer

    out = []
    for mode in ph['modes']:
        barrier()
        if rank != mgr and rank not in workers:
            continue
        extra = {} if len(workers) == world - 1 else dict(worker_ranks=workers)
        buf = create_buffer(ding_cfg(ph, plan, backend, mode, **extra))
        rec = dict(phase=ph['id'], mode=mode, rank=rank)
        if rank == mgr:
            out.append(dict(rec, manager=True, **serve_timed(buf, plan['timeout'])))
        else:
            out.append(dict(rec, **push_loop(buf, ph, 1000 * rank + ph['id'], mode, plan['timeout'])))
    return out


def rank_torch(plan: Dict[str, Any], save) -> List[Dict[str, Any]]:
    import torch.distributed as dist

    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=plan['timeout']))
    rank, world = dist.get_rank(), dist.get_world_size()
    mgr = world - 1
    out = []
    for ph in plan['phases']:
        workers = list(range(ph['workers']))
        dist.barrier()
        rec = dict(phase=ph['id'], mode='raw', rank=rank)
        total = WARMUP + ph['n']
        if rank == mgr:

            def serve(w):
                buf, ack = torch.empty(ph['bytes'], dtype=torch.uint8), torch.ones(1, dtype=torch.uint8)
                for _ in range(total):
                    dist.recv(buf, src=w, tag=RAW_TAG)
                    dist.send(ack, dst=w, tag=RAW_TAG)

            threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rec['manager'] = True
            out.append(rec)
        elif rank in workers:
            payload = torch.randint(0, 256, (ph['bytes'],), dtype=torch.uint8)
            ack = torch.zeros(1, dtype=torch.uint8)

            def round_trip():
                dist.send(payload, dst=mgr, tag=RAW_TAG)
                dist.recv(ack, src=mgr, tag=RAW_TAG)

            out.append(dict(rec, n=ph['n'], bytes=ph['bytes'], **timed_round_trips(total, round_trip)))
        out += e2e_modes(plan, ph, 'torch', rank, world, mgr, workers, dist.barrier)
        save(out)
    dist.barrier()
    dist.destroy_process_group()
    return out


def rank_mpi(plan: Dict[str, Any], save) -> List[Dict[str, Any]]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    mgr = world - 1
    out = []

    def barrier() -> None:  # a rank left out of a 1-worker cell waits here without spinning a core (MPI's does)
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(1e-3)

    for ph in plan['phases']:
        workers = list(range(ph['workers']))
        barrier()
        rec = dict(phase=ph['id'], mode='raw', rank=rank)
        total = WARMUP + ph['n']
        if rank == mgr:
            buf, ack, st = np.empty(ph['bytes'], np.uint8), np.ones(1, np.uint8), MPI.Status()
            for _ in range(total * len(workers)):
                comm.Recv([buf, MPI.BYTE], source=MPI.ANY_SOURCE, tag=RAW_TAG, status=st)
                comm.Send([ack, MPI.BYTE], dest=st.Get_source(), tag=RAW_TAG)
            out.append(dict(rec, manager=True))
        elif rank in workers:
            payload = np.random.default_rng(rank).integers(0, 256, ph['bytes'], dtype=np.uint8)
            ack = np.zeros(1, np.uint8)

            def round_trip():
                comm.Send([payload, MPI.BYTE], dest=mgr, tag=RAW_TAG)
                comm.Recv([ack, MPI.BYTE], source=mgr, tag=RAW_TAG)

            out.append(dict(rec, n=ph['n'], bytes=ph['bytes'], **timed_round_trips(total, round_trip)))
        out += e2e_modes(plan, ph, 'mpi', rank, world, mgr, workers, barrier)
        save(out)
    barrier()
    return out


def gfn_container(env: Any, rows: int, seed: int) -> Any:
    from gfn.containers import StatesContainer

    g = torch.Generator().manual_seed(seed)
    states = torch.randint(0, 8, (rows, GFN_NDIM), generator=g, dtype=torch.int64)
    return StatesContainer(
        env,
        states=env.States(states),
        is_terminating=torch.ones(rows, dtype=torch.bool),
        log_rewards=torch.randn(rows, generator=g),
    )


def rank_torchgfn(plan: Dict[str, Any], save) -> List[Dict[str, Any]]:
    import contextlib
    import io

    import torch.distributed as dist
    from gfn.containers import ReplayBuffer
    from gfn.containers import message as gm
    from gfn.containers.replay_buffer_manager import ReplayBufferManager
    from gfn.gym import HyperGrid

    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=plan['timeout']))
    rank, world = dist.get_rank(), dist.get_world_size()
    mgr = world - 1
    # time torchgfn's wire format (dill + list-of-ints conversion) without changing it
    spent = dict(serialize_s=0.0, deserialize_s=0.0, wire_bytes=0, messages=0)
    serialize, deserialize = gm.Message.serialize, gm.Message.deserialize

    def timed_serialize(self):
        a = time.perf_counter()
        r = serialize(self)
        spent['serialize_s'] += time.perf_counter() - a
        if self.message_type == gm.MessageType.DATA:
            spent['wire_bytes'], spent['messages'] = spent['wire_bytes'] + r.numel(), spent['messages'] + 1
        return r

    def timed_deserialize(t):
        a = time.perf_counter()
        r = deserialize(t)
        spent['deserialize_s'] += time.perf_counter() - a
        return r

    gm.Message.serialize = timed_serialize
    gm.Message.deserialize = staticmethod(timed_deserialize)
    env = HyperGrid(ndim=GFN_NDIM, height=8, validate_modes=False)
    out = []
    for ph in plan['phases']:
        workers = list(range(ph['workers']))
        rows, cap = ph['gfn_rows'], ph['gfn_rows'] * CAPACITY_BATCHES
        for k in spent:
            spent[k] = 0 if k in ('wire_bytes', 'messages') else 0.0
        dist.barrier()
        rec = dict(phase=ph['id'], mode='torchgfn', rank=rank)
        if rank == mgr:
            m = ReplayBufferManager(env, rank, num_training_ranks=len(workers), capacity=cap)
            a = now()
            with contextlib.redirect_stdout(io.StringIO()):
                m.run()
            out.append(
                dict(
                    rec, manager=True, run_s=now() - a, count=len(m.replay_buffer), deserialize_s=spent['deserialize_s']
                )
            )
        elif rank in workers:
            containers = [gfn_container(env, rows, 1000 * rank + ph['id'] * 10 + k) for k in range(2)]
            rb = ReplayBuffer(env, capacity=cap, remote_manager_rank=mgr)
            total = WARMUP + ph['gfn_n']
            lat = []
            t0 = now()
            for i in range(total):
                if i == WARMUP:
                    t0 = now()
                    for k in spent:
                        spent[k] = 0 if k in ('wire_bytes', 'messages') else 0.0
                a = time.perf_counter()
                rb.add(containers[i % 2])
                lat.append(time.perf_counter() - a)
            t1 = now()
            with contextlib.redirect_stdout(io.StringIO()):
                ReplayBufferManager.send_termination_signal(mgr)
            out.append(dict(rec, t0=t0, t1=t1, n=ph['gfn_n'], bytes=ph['gfn_bytes'], lat=lat[WARMUP:], **spent))
        save(out)
    dist.barrier()
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------------------------- ray
def ray_raw_body(sink: Any, ph: Dict[str, Any], seed: int) -> Dict[str, Any]:
    import ray

    payload = np.random.default_rng(seed).integers(0, 256, ph['bytes'], dtype=np.uint8)
    lat = []
    t0 = now()
    for i in range(WARMUP + ph['n']):
        if i == WARMUP:
            t0 = now()
        a = time.perf_counter()
        got = ray.get(sink.take.remote(payload))
        lat.append(time.perf_counter() - a)
        assert got == ph['bytes']
    return dict(t0=t0, t1=now(), n=ph['n'], bytes=ph['bytes'], lat=lat[WARMUP:])


def ray_e2e_body(cfg: Dict[str, Any], ph: Dict[str, Any], seed: int, mode: str, timeout: float) -> Dict[str, Any]:
    torch.set_num_threads(1)
    from ding_buffer import create_buffer

    return push_loop(create_buffer(cfg), ph, seed, mode, timeout)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class RawSink:
    def take(self, a: np.ndarray) -> int:
        return len(a)


def ray_driver(plan: Dict[str, Any], save) -> List[Dict[str, Any]]:
    import ray

    from ding_buffer import create_buffer

    ray.init(address='local', num_cpus=4, include_dashboard=False, log_to_driver=False, namespace='ding_buffer_bench')
    raw_task = ray.remote(num_cpus=1)(ray_raw_body)
    e2e_task = ray.remote(num_cpus=1)(ray_e2e_body)
    sink = ray.remote(RawSink).options(max_concurrency=1).remote()
    ray.get(sink.take.remote(np.zeros(1, np.uint8)), timeout=plan['timeout'])
    # start the worker processes before anything is timed, so the timed tasks overlap
    ray.get([ray.remote(num_cpus=1)(_sleep).remote(0.5) for _ in range(2)], timeout=plan['timeout'])
    out = []
    for ph in plan['phases']:
        workers = list(range(ph['workers']))
        res = ray.get([raw_task.remote(sink, ph, w) for w in workers], timeout=plan['timeout'])
        out += [dict(r, phase=ph['id'], mode='raw', rank=w) for w, r in zip(workers, res)]
        for mode in ph['modes']:
            cfg = ding_cfg(ph, plan, 'ray', mode, actor_name=f"bench_{ph['id']}_{mode}", num_workers=len(workers) + 1)
            drv = create_buffer(cfg)  # creates the manager actor; its EXIT (the last) ends it
            res = ray.get(
                [e2e_task.remote(cfg, ph, 1000 * w + ph['id'], mode, plan['timeout']) for w in workers],
                timeout=plan['timeout'],
            )
            out += [dict(r, phase=ph['id'], mode=mode, rank=w) for w, r in zip(workers, res)]
            stats = drv.stats()
            out.append(
                dict(
                    phase=ph['id'],
                    mode=mode,
                    rank='actor',
                    manager=True,
                    count=stats.get('count'),
                    counters={k[8:]: v for k, v in stats.items() if k.startswith('manager/')},
                )
            )
            drv.close()
        save(out)
    ray.shutdown()
    return out


def rank_main(args) -> None:
    torch.set_num_threads(1)
    with open(args.plan) as f:
        plan = json.load(f)
    if args.role == 'ray-driver':
        name, fn = 'ray_driver', ray_driver
    else:
        rank = os.environ.get('RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0'))
        fns = dict(torch=rank_torch, mpi=rank_mpi, torchgfn=rank_torchgfn)
        name, fn = f'{args.backend}_rank{rank}', fns[args.backend]
    path = os.path.join(args.outdir, name + '.json')

    def save(out: List[Dict[str, Any]]) -> None:  # after every phase: a job that times out keeps its finished rows
        with open(path + '.tmp', 'w') as f:
            json.dump(out, f)
        os.replace(path + '.tmp', path)

    save(fn(plan, save))


# ============================================================================================ driver side
def tool_version(cmd: List[str]) -> str:
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
        return text.strip().splitlines()[0] if text.strip() else 'unknown'
    except Exception as e:
        return f'unavailable ({type(e).__name__})'


def availability() -> Dict[str, Optional[str]]:
    """None when the job can run, else why not."""
    why: Dict[str, Optional[str]] = {}
    import torch.distributed as dist

    why['torch'] = None if dist.is_available() and shutil.which('torchrun') else 'torch.distributed or torchrun missing'
    if importlib.util.find_spec('mpi4py') is None:
        why['mpi'] = 'mpi4py is not installed'
    elif not shutil.which('mpirun'):
        why['mpi'] = 'mpirun (Open MPI) is not on PATH'
    else:
        why['mpi'] = None
    why['ray'] = None if importlib.util.find_spec('ray') else 'ray is not installed'
    if importlib.util.find_spec('gfn') is None:
        why['torchgfn'] = 'torchgfn is not installed'
    else:
        why['torchgfn'] = why['torch']
    return why


def run_job(name: str, cmd: List[str], timeout: float, logdir: str) -> Optional[str]:
    """Run a job in its own session; returns None or why it failed (the log's tail)."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    env.setdefault('PYTHONPATH', REPO)  # (mpirun hands it on to ranks on other hosts)
    path = os.path.join(logdir, f'{name}.log')
    log(f'[{name}] {" ".join(cmd)}')
    t = time.perf_counter()
    with open(path, 'w') as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(wait)
                    break
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
    log(f'[{name}] done in {time.perf_counter() - t:.1f}s, rc={rc}')
    if rc == 0:
        return None
    with open(path) as f:
        tail = ''.join(f.readlines()[-15:])
    return (f'timed out after {timeout:.0f}s' if rc is None else f'exit code {rc}') + f'; log tail:\n{tail}'


HOSTS: Any = None  # --hosts: the namespaced hosts the jobs run on (tests/distributed/netns_hosts.Hosts)


def hosts_command(backend: str, me: List[str]) -> List[str]:
    """A job whose rank r runs on namespaced host r (the manager, the last rank, alone on its host)."""
    import shlex

    if backend == 'torch':
        parts = []
        for r in range(WORLD):
            env = dict(RANK=r, LOCAL_RANK=0, WORLD_SIZE=WORLD, LOCAL_WORLD_SIZE=1, MASTER_ADDR=HOSTS.addr(0),
                       MASTER_PORT=29500, GLOO_SOCKET_IFNAME=HOSTS.device)  # fmt: skip
            cmd = ['env', *(f'{k}={v}' for k, v in env.items()), 'ip', 'netns', 'exec', HOSTS.ns(r), sys.executable]
            parts.append(' '.join(shlex.quote(x) for x in cmd + me + ['--role', 'rank', '--backend', 'torch']) + ' &')
        return ['sh', '-c', ' '.join(parts) + ' wait']
    subnet = f'{HOSTS.net}.0/24'
    rsh = os.path.join(REPO, 'tests', 'distributed', 'dist_scripts', 'netns_rsh.sh')
    return [
        'mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(WORLD),
        '--host', ','.join(HOSTS.ns(r) for r in range(WORLD)),
        '--mca', 'plm_rsh_agent', rsh, '--mca', 'plm_rsh_no_tree_spawn', '1',
        '--mca', 'oob_tcp_if_include', subnet, '--mca', 'btl_tcp_if_include', subnet, '--mca', 'btl', 'tcp,self',
        '-x', 'PYTHONPATH', '-x', 'OMP_NUM_THREADS', '-x', 'PYTHONUNBUFFERED',
        sys.executable, *me, '--role', 'rank', '--backend', 'mpi',
    ]  # fmt: skip


def job_command(backend: str, plan_path: str, outdir: str) -> List[str]:
    me = [os.path.abspath(__file__), '--plan', plan_path, '--outdir', outdir]
    if HOSTS is not None:
        return hosts_command(backend, me)
    if backend in ('torch', 'torchgfn'):
        return [
            'torchrun',
            '--nnodes',
            '1',
            '--nproc_per_node',
            str(WORLD),
            '--master_addr',
            '127.0.0.1',
            '--master_port',
            str(free_port()),
            *me,
            '--role',
            'rank',
            '--backend',
            backend,
        ]
    if backend == 'mpi':
        return [
            'mpirun',
            '--allow-run-as-root',
            '--oversubscribe',
            '-n',
            str(WORLD),
            sys.executable,
            *me,
            '--role',
            'rank',
            '--backend',
            'mpi',
        ]
    return [sys.executable, *me, '--role', 'ray-driver', '--backend', 'ray']


def collect(outdir: str, prefix: str) -> List[Dict[str, Any]]:
    recs = []
    for name in sorted(os.listdir(outdir)):
        if name.startswith(prefix) and name.endswith('.json'):
            with open(os.path.join(outdir, name)) as f:
                recs += json.load(f)
    return recs


def aggregate(recs: List[Dict[str, Any]], phase: int, mode: str, workers: int) -> Optional[Dict[str, Any]]:
    ws = [r for r in recs if r['phase'] == phase and r['mode'] == mode and not r.get('manager')]
    if len(ws) != workers:
        return None
    span = max(r['t1'] for r in ws) - min(r['t0'] for r in ws)
    total = sum(r['n'] * r['bytes'] for r in ws)
    per = [r['n'] * r['bytes'] / (r['t1'] - r['t0']) / MB for r in ws]
    out = dict(
        mbps=total / span / MB,
        mbps_per_worker=statistics.mean(per),
        batches_per_s=sum(r['n'] for r in ws) / span,
        n=ws[0]['n'],
        bytes=ws[0]['bytes'],
        span_s=span,
        median_ms=1e3 * statistics.median(x for r in ws for x in r['lat']),
        mean_ms=1e3 * statistics.mean(x for r in ws for x in r['lat']),
    )
    mgr = [r for r in recs if r['phase'] == phase and r['mode'] == mode and r.get('manager')]
    if mgr:
        m = mgr[0]
        batches = sum(r['n'] for r in ws) + (WARMUP if mode == 'torchgfn' else PUSH_WARMUP) * workers
        if 'handle_s' in m:
            out['manager_handle_ms_per_batch'] = 1e3 * m['handle_s'] / batches
            out['manager_run_s'] = m['run_s']
        if 'deserialize_s' in m:
            out['manager_deserialize_ms_per_batch'] = 1e3 * m['deserialize_s'] / batches
            out['manager_run_s'] = m['run_s']
        if 'count' in m:
            out['manager_count'] = m['count']
    if 'serialize_s' in ws[0]:
        msgs = sum(r['messages'] for r in ws)
        out['worker_serialize_ms_per_batch'] = 1e3 * sum(r['serialize_s'] for r in ws) / max(msgs, 1)
        out['worker_add_ms_per_batch'] = 1e3 * statistics.mean((r['t1'] - r['t0']) / r['n'] for r in ws)
        out['wire_bytes_per_batch'] = sum(r['wire_bytes'] for r in ws) / max(msgs, 1)
    return out


def make_plan(args) -> Dict[str, Any]:
    phases = []
    for rnd in range(args.rounds):  # every cell once per round: raw and end to end back to back, rounds apart
        for size in args.sizes:
            target = int(round(size * MB))
            rows, gfn_rows = max(1, target // OUR_ROW_BYTES), max(1, target // GFN_ROW_BYTES)
            nbytes = rows * OUR_ROW_BYTES
            n = min(args.n_max, max(args.n_min, math.ceil(args.budget_mb * MB / nbytes)))
            gfn_n = min(n, max(args.gfn_n_min, math.ceil(args.gfn_budget_mb * MB / (gfn_rows * GFN_ROW_BYTES))))
            for w in args.workers:
                modes = ['sync'] + (['async'] if w == max(args.workers) and not args.no_async else [])
                modes += [] if args.no_shm else ['shm']
                phases.append(
                    dict(
                        id=len(phases),
                        round=rnd,
                        size_mb=size,
                        workers=w,
                        rows=rows,
                        bytes=nbytes,
                        n=n,
                        modes=modes,
                        gfn_rows=gfn_rows,
                        gfn_bytes=gfn_rows * GFN_ROW_BYTES,
                        gfn_n=gfn_n,
                    )
                )
    return dict(phases=phases, timeout=args.rank_timeout)


def merge_rounds(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per cell (batch size, workers): each rate is the median over the rounds, and ``ratios[mode]`` lists
    every round's end-to-end / raw (both measured back to back in that round), whose median the tables show."""
    cells: Dict[Any, List[Dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row['phase']['size_mb'], row['phase']['workers']), []).append(row)
    out = []
    for group in cells.values():
        merged = dict(phase=dict(group[0]['phase'], rounds=len(group)), ratios={})
        for mode in [k for k in group[0] if k != 'phase']:
            aggs = [r[mode] for r in group if r.get(mode)]
            if not aggs:
                merged[mode] = None
                continue
            m = dict(aggs[0])
            for key in (
                'mbps',
                'mbps_per_worker',
                'batches_per_s',
                'median_ms',
                'mean_ms',
                'manager_handle_ms_per_batch',
                'manager_deserialize_ms_per_batch',
            ):
                if all(key in a for a in aggs):
                    m[key] = statistics.median(a[key] for a in aggs)
            merged[mode] = m
            if mode != 'raw':
                merged['ratios'][mode] = [
                    r[mode]['mbps'] / r['raw']['mbps']
                    for r in group
                    if r.get(mode) and r.get('raw') and r['raw']['mbps'] > 0
                ]
        out.append(merged)
    return out


def run_backends(args, plan: Dict[str, Any], why: Dict[str, Optional[str]], tmp: str) -> Dict[str, Any]:
    results: Dict[str, Any] = {}
    jobs = list(args.backends) + ([] if args.no_torchgfn else ['torchgfn'])
    for backend in jobs:
        if why.get(backend):
            log(f'[{backend}] not available: {why[backend]}')
            results[backend] = dict(error=f'not available: {why[backend]}')
            continue
        jplan = plan
        if backend == 'torchgfn':  # 2 workers (the largest count) only, one round (it is slow)
            jplan = dict(
                plan, phases=[p for p in plan['phases'] if p['workers'] == max(args.workers) and p['round'] == 0]
            )
        outdir = os.path.join(tmp, backend)
        os.makedirs(outdir)
        plan_path = os.path.join(tmp, f'plan_{backend}.json')
        with open(plan_path, 'w') as f:
            json.dump(jplan, f)
        t = time.perf_counter()
        err = run_job(backend, job_command(backend, plan_path, outdir), args.job_timeout, tmp)
        wall = time.perf_counter() - t
        recs = collect(outdir, '')
        rows = []
        for ph in jplan['phases']:
            modes = ['torchgfn'] if backend == 'torchgfn' else ['raw'] + ph['modes']
            rows.append(dict(phase=ph, **{m: aggregate(recs, ph['id'], m, ph['workers']) for m in modes}))
        results[backend] = dict(rows=merge_rounds(rows), round_rows=rows, records=recs, error=err, wall_s=wall)
        if err:
            log(f'[{backend}] FAILED: {err}')
    return results


# ---------------------------------------------------------------------------------------------- report
def f_rate(x: Optional[float]) -> str:
    if x is None:
        return 'n/a'
    return f'{x:,.0f}' if x >= 100 else f'{x:.3g}'


def f_pair(agg: Optional[Dict[str, Any]], key: str = 'mbps') -> str:
    if not agg:
        return 'n/a'
    return f"{f_rate(agg[key])} ({f_rate(agg[key + '_per_worker'])})"


def ratio(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> Optional[float]:
    return a['mbps'] / b['mbps'] if a and b and b['mbps'] > 0 else None


def raw_share(row: Dict[str, Any], mode: str) -> Optional[float]:
    """Median over the rounds of end-to-end / raw for ``mode`` (each round's pair measured back to back)."""
    rs = row.get('ratios', {}).get(mode)
    return statistics.median(rs) if rs else None


def f_share(row: Dict[str, Any], mode: str) -> str:
    rs = row.get('ratios', {}).get(mode)
    if not rs:
        return 'n/a'
    return f'{statistics.median(rs):.0%}' + (f' ({min(rs):.0%}-{max(rs):.0%})' if len(rs) > 1 else '')


def gfn_row(results: Dict[str, Any], size: float) -> Optional[Dict[str, Any]]:
    for row in results.get('torchgfn', {}).get('rows', []):
        if row['phase']['size_mb'] == size:
            return row['torchgfn']
    return None


def backend_table(backend: str, res: Dict[str, Any], results: Dict[str, Any]) -> str:
    from bench_naive import md_table

    head = [
        'batch MB',
        'workers',
        'batches/worker',
        'raw MB/s',
        'ding_buffer MB/s',
        'batches/s',
        'e2e/raw',
        'async MB/s',
        'async/raw',
        'shared memory MB/s',
        'shm/raw',
        'torchgfn MB/s (batches/worker)',
        'ours/torchgfn',
    ]
    lines = []
    for row in res['rows']:
        ph, raw, sync, asy, shm = row['phase'], row['raw'], row['sync'], row.get('async'), row.get('shm')
        top = ph['workers'] == max(p['phase']['workers'] for p in res['rows'])
        g = gfn_row(results, ph['size_mb']) if top else None
        r3 = ratio(sync, g)
        lines.append(
            [
                f"{ph['size_mb']:g}",
                str(ph['workers']),
                str(ph['n']),
                f_pair(raw),
                f_pair(sync),
                f_rate(sync['batches_per_s']) if sync else 'n/a',
                f_share(row, 'sync'),
                f_pair(asy) if 'async' in ph['modes'] else '-',
                f_share(row, 'async') if 'async' in ph['modes'] else '-',
                f_pair(shm) if 'shm' in ph['modes'] else '-',
                f_share(row, 'shm') if 'shm' in ph['modes'] else '-',
                f"{f_pair(g)} ({g['n']})" if g else '-',
                f'{r3:.1f}x' if r3 else '-',
            ]
        )
    return md_table(head, lines)


def where_time_goes(results: Dict[str, Any], args) -> List[str]:
    out = []
    for backend, res in results.items():
        for row in res.get('rows', []):
            ph = row['phase']
            if backend == 'torchgfn':
                g = row['torchgfn']
                if g:
                    out.append(
                        f"- torchgfn, {ph['size_mb']:g} MB: add() median {g['median_ms']:.1f} ms (mean "
                        f"{g['mean_ms']:.1f}) per worker, of which serialize (dill + list of ints) "
                        f"{g['worker_serialize_ms_per_batch']:.1f} ms; manager deserialize "
                        f"{g.get('manager_deserialize_ms_per_batch', float('nan')):.1f} ms/batch; "
                        f"{g['wire_bytes_per_batch'] / MB:.3f} MB on the wire per batch"
                    )
                continue
            s, raw = row.get('sync'), row.get('raw')
            if s and raw and ph['workers'] == max(args.workers):
                hm = s.get('manager_handle_ms_per_batch')
                out.append(
                    f"- {backend}, {ph['size_mb']:g} MB, {ph['workers']} workers: push median "
                    f"{s['median_ms']:.2f} ms (mean {s['mean_ms']:.2f}) vs raw round trip median "
                    f"{raw['median_ms']:.2f} ms (mean {raw['mean_ms']:.2f})"
                    + (f"; manager handler (buffer write, serial) {hm:.2f} ms/batch" if hm is not None else '')
                )
    return out


def targets(results: Dict[str, Any], args) -> List[str]:
    out = []
    for backend, res in results.items():
        if backend == 'torchgfn' or not res.get('rows'):
            continue
        for row in res['rows']:
            ph = row['phase']
            for mode in ('sync', 'shm'):
                if ph['size_mb'] >= 1 and mode in ph['modes']:
                    r = raw_share(row, mode)
                    out.append(
                        f"- {backend}{' + shared memory' if mode == 'shm' else ''}, {ph['size_mb']:g} MB, "
                        f"{ph['workers']} worker(s): e2e/raw {f_share(row, mode)} -> "
                        f"{'n/a' if r is None else ('met' if r >= TARGET_RAW_SHARE else 'MISSED')} "
                        f"(target >= {TARGET_RAW_SHARE:.0%})"
                    )
            if ph['workers'] == max(args.workers):
                r = ratio(row['sync'], gfn_row(results, ph['size_mb']))
                if r is not None:
                    out.append(
                        f"- {backend}, {ph['size_mb']:g} MB: ours/torchgfn {r:.1f}x -> "
                        f"{'met' if r >= TARGET_GFN_RATIO else 'MISSED'} (target >= {TARGET_GFN_RATIO:g}x)"
                    )
    return out


def print_report(env: Dict[str, Any], plan: Dict[str, Any], results: Dict[str, Any], args) -> None:
    v = env['versions']
    print('# ding_buffer distributed: workers push batches to one manager\n')
    print(f"- date: {env['date_utc']}")
    print(f"- CPU: {env['cpu']}, {env['cores']} cores ({env['cores_usable']} usable); every process OMP_NUM_THREADS=1")
    print('- ' + ', '.join(f'{k} {v[k]}' for k in ('python',) + PACKAGES) + f", Open MPI: {env['openmpi']}")
    where = (
        f"each on a host of its own (network namespaces joined by a bridge, every link shaped to {args.hosts} with tc "
        f"tbf: the bytes cross veth pairs and the kernel's TCP stack, not loopback)"
        if args.hosts
        else 'on this machine'
    )
    print(
        f"- 1 manager + {'/'.join(map(str, args.workers))} workers {where}; MB = 2^20 bytes of tensor "
        f"payload; {args.rounds} round(s) of every cell, raw then end to end back to back in each; rates are "
        f"medians over the rounds and e2e/raw the median of the rounds' ratios (lowest-highest in parentheses); "
        f"per cell {PUSH_WARMUP} warm-up pushes ({WARMUP} raw round trips, {WARMUP} torchgfn adds) + N timed "
        f"ones per worker, N = {args.budget_mb:g} MB / batch "
        f"clamped to [{args.n_min}, {args.n_max}] (torchgfn: {args.gfn_budget_mb:g} MB / batch, >= "
        f"{args.gfn_n_min}, capped at N){' -- QUICK smoke run, numbers are noise' if args.quick else ''}"
    )
    print(
        '- ours: dict {obs: float32[rows, 128], log_reward: float32[rows]} pushed into a naive buffer on tensor '
        f'storage ({CAPACITY_BATCHES} batches capacity); torchgfn: StatesContainer of HyperGrid(ndim=64) states '
        '(int64[rows, 64] + bool + float32 log-reward) via ReplayBuffer.add -> ReplayBufferManager'
    )
    for p in plan['phases']:
        if p['workers'] == max(args.workers) and p['round'] == 0:
            print(
                f"- batch {p['size_mb']:g} MB: ours {p['rows']} rows = {p['bytes']:,} bytes, N = {p['n']}; torchgfn "
                f"{p['gfn_rows']} rows = {p['gfn_bytes']:,} bytes, N = {p['gfn_n']}"
            )
    print(
        '- rates: aggregate over workers (per worker in parentheses); e2e/raw and ours/torchgfn are aggregate '
        'ratios; raw = one uint8 buffer of the batch size + 1-byte ack per round trip, same processes, same job'
    )
    for backend in args.backends:
        res = results.get(backend, {})
        print(f'\n## {backend}\n')
        if not res.get('rows'):
            print(f"not measured: {res.get('error')}")
            continue
        if res.get('error'):
            print(f"job failed (partial results): {res['error'].splitlines()[0]}\n")
        print(backend_table(backend, res, results))
        print(f"\n(job wall time {res['wall_s']:.0f} s, startup included)")
    g = results.get('torchgfn')
    if g is not None and g.get('error'):
        print(f"\ntorchgfn: {g['error'].splitlines()[0]}")
    elif g is not None:
        print(f"\n(torchgfn job wall time {g['wall_s']:.0f} s, startup included)")
    lines = targets(results, args)
    if lines:
        print('\n## targets\n')
        print('\n'.join(lines))
    lines = where_time_goes(results, args)
    if lines:
        print('\n## where the time goes (per-push latency over all timed pushes of all workers)\n')
        print('\n'.join(lines))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true', help='smoke run: a handful of batches per cell')
    p.add_argument('--backends', default='torch,mpi,ray', help='comma-separated subset of torch,mpi,ray')
    p.add_argument('--sizes', default='0.1,1,5', help='batch sizes in MB (2^20 bytes), comma-separated')
    p.add_argument('--workers', default='2,1', help='worker counts, comma-separated (each at most 2)')
    p.add_argument('--no-async', action='store_true', help='skip the async_score column')
    p.add_argument(
        '--no-shm', action='store_true', help='skip the shared-memory column (distributed.shared_memory=True)'
    )
    p.add_argument('--rounds', type=int, default=None, help='rounds of every cell (default 3, quick 1)')
    p.add_argument('--no-torchgfn', action='store_true', help='skip torchgfn')
    p.add_argument('--budget-mb', type=float, default=None, help='payload per worker per cell (default 512, quick 4)')
    p.add_argument('--n-min', type=int, default=None, help='fewest timed pushes per worker (default 40, quick 3)')
    p.add_argument('--n-max', type=int, default=None, help='most timed pushes per worker (default 500, quick 40)')
    p.add_argument(
        '--gfn-budget-mb', type=float, default=None, help='torchgfn payload per worker per cell (default 24, quick 2)'
    )
    p.add_argument('--gfn-n-min', type=int, default=None, help='fewest torchgfn timed adds (default 3, quick 2)')
    p.add_argument('--job-timeout', type=float, default=None, help='seconds per backend job (default 400, quick 90)')
    p.add_argument('--rank-timeout', type=float, default=120.0, help='timeouts inside a job (gloo, manager)')
    p.add_argument('--json', '--out', dest='out', default=DEFAULT_OUT, help=f'JSON output (default {DEFAULT_OUT})')
    p.add_argument(
        '--hosts',
        default=None,
        metavar='RATE',
        help="run every rank on a host of its own (network namespaces, needs root), links shaped with tc tbf to "
        "RATE (e.g. 10gbit); torch and MPI only",
    )
    # internal: inside a job
    p.add_argument('--role', choices=('main', 'rank', 'ray-driver'), default='main', help=argparse.SUPPRESS)
    p.add_argument('--backend', choices=('torch', 'mpi', 'ray', 'torchgfn'), help=argparse.SUPPRESS)
    p.add_argument('--plan', help=argparse.SUPPRESS)
    p.add_argument('--outdir', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role != 'main':
        return args
    args.backends = [b.strip() for b in args.backends.split(',') if b.strip()]
    bad = [b for b in args.backends if b not in ('torch', 'mpi', 'ray')]
    if bad:
        p.error(f'unknown backends {bad}')
    args.no_shm = args.no_shm or bool(args.hosts)  # every rank on a host of its own: nothing to share
    args.sizes = [float(s) for s in args.sizes.split(',')]
    args.workers = sorted({int(w) for w in args.workers.split(',')}, reverse=True)
    if any(s <= 0 for s in args.sizes) or any(w not in (1, 2) for w in args.workers):
        p.error('--sizes must be positive, --workers 1 and/or 2')
    if args.rounds is not None and args.rounds < 1:
        p.error(f'--rounds must be at least 1, got {args.rounds}')
    q = args.quick
    for name, full, quick in (
        ('budget_mb', 512.0, 4.0),
        ('n_min', 40, 3),
        ('n_max', 500, 40),
        ('gfn_budget_mb', 24.0, 2.0),
        ('gfn_n_min', 3, 2),
        ('job_timeout', 400.0, 90.0),
        ('rounds', 3, 1),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.role != 'main':
        rank_main(args)
        return
    from bench_naive import machine

    t0 = time.perf_counter()
    env = machine(PACKAGES)
    env['openmpi'] = tool_version(['mpirun', '--version']) if shutil.which('mpirun') else 'not installed'
    why = availability()
    plan = make_plan(args)
    if args.hosts:
        global HOSTS
        sys.path.insert(0, os.path.join(REPO, 'tests', 'distributed'))
        from netns_hosts import Hosts, available

        reason = available()
        if reason:
            raise SystemExit(f'--hosts: {reason}')
        args.no_torchgfn = True
        for b in args.backends:
            if b == 'ray':
                why[b] = 'not run across namespaced hosts by this script (see tests/distributed/test_across_hosts.py)'
        HOSTS = Hosts(WORLD).__enter__()
        for r in range(WORLD):
            HOSTS.shape(r, args.hosts)
    try:
        with tempfile.TemporaryDirectory(prefix='bench_distributed_') as tmp:
            results = run_backends(args, plan, why, tmp)
    finally:
        if HOSTS is not None:
            HOSTS.close()
    env['wall_s'] = time.perf_counter() - t0
    print_report(env, plan, results, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(
            dict(
                env=env,
                args={k: v for k, v in vars(args).items() if k not in ('plan', 'outdir')},
                plan=plan,
                results=results,
            ),
            f,
            indent=1,
        )
    log(f'wrote {args.out} ({env["wall_s"]:.0f}s)')


if __name__ == '__main__':
    main()

"""Load test of sharded managers: many lightweight clients against K = 1, 2, 4 Ray manager actors on this machine.

What is measured
    For each K, a local Ray instance holds K manager actors of one ``advanced`` buffer (``distributed.num_shards=K``,
    round-robin routing). ``--procs`` client processes each run ``--threads`` client threads (``procs * threads``
    clients in all, e.g. 4 x 16 = 64 or 4 x 64 = 256); every client is its own ``create_buffer(cfg)`` (a
    ``ShardedBuffer`` with K ``RemoteBuffer``s, one Ray channel each) and, for ``--seconds``, pushes one small item
    (``obs: f32[16]``, ``action``, ``reward``: 76 bytes of tensors) per call, and every ``--sample-every``-th call
    samples 32 items instead (K ``stats`` calls + the per-shard draws). Latency is the wall time of each call.

    Reported per K: aggregate calls/s (pushes + samples, all clients), pushes/s, the median and p99 push latency,
    the p99 sample latency, and the manager actors' CPU seconds per 1,000 requests (from /proc of the actor
    processes: the per-request cost of a shard). Nothing is asserted.

Run
    python benchmarks/bench_shards.py [--shards 1,2,4] [--procs 4] [--threads 16] [--seconds 10] [--out PATH]

The script re-runs itself in ``--role client`` mode in the client processes (they join the driver's Ray instance).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def buffer_cfg(name: str, shards: int) -> Dict[str, Any]:
    return dict(
        type='advanced',
        replay_buffer_size=100_000,
        seed=0,
        storage=dict(type='tensor'),
        distributed=dict(
            backend='ray',
            actor_name=name,
            namespace='bench_shards',
            num_shards=shards,
            timeout=60,
            startup_timeout=120,
            heartbeat_seconds=5.0,
            peer_timeout=None,
        ),
    )


# ---------------------------------------------------------------------------------------------- client process
def client_main(args: argparse.Namespace) -> None:
    import ray
    import torch

    from ding_buffer import create_buffer

    ray.init(address=os.environ['RAY_ADDRESS'], namespace='bench_shards', log_to_driver=False, configure_logging=False)
    cfg = buffer_cfg(args.name, args.k)
    clients = [create_buffer(cfg) for _ in range(args.threads)]
    item = {'obs': torch.zeros(16), 'action': 1, 'reward': 1.0}
    results: List[Dict[str, Any]] = [None] * args.threads  # type: ignore[list-item]
    start_at = float(args.start_at)

    def run(i: int) -> None:
        buf, push_lat, sample_lat = clients[i], [], []
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + args.seconds
        n = 0
        while time.time() < end:
            t0 = time.perf_counter()
            if args.sample_every and n % args.sample_every == args.sample_every - 1:
                buf.sample(32)
                sample_lat.append(time.perf_counter() - t0)
            else:
                buf.push(item)
                push_lat.append(time.perf_counter() - t0)
            n += 1
        results[i] = {'push': push_lat, 'sample': sample_lat}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    push = [x for r in results for x in r['push']]
    sample = [x for r in results for x in r['sample']]
    with open(args.result, 'w') as f:
        json.dump({'push': push, 'sample': sample}, f)


# ---------------------------------------------------------------------------------------------- driver
def actor_cpu_seconds(ray: Any, name: str, k: int) -> float:
    """CPU seconds (user + system) the K manager actor processes used so far."""
    total = 0.0
    for s in range(k):
        pid = ray.get(
            ray.get_actor(f'{name}-shard{s}' if k > 1 else name, namespace='bench_shards').__ray_call__.remote(
                lambda self: os.getpid()
            )
        )
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
    return total


def run_k(args: argparse.Namespace, k: int) -> Dict[str, Any]:
    import ray

    from ding_buffer import create_buffer

    ray.init(
        num_cpus=max(4, k + 2),
        include_dashboard=False,
        namespace='bench_shards',
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        name = f'bench_{uuid.uuid4().hex[:8]}'
        owner = create_buffer(buffer_cfg(name, k))  # creates the K actors and holds them
        owner.push({'obs': np.zeros(16, np.float32), 'action': 1, 'reward': 1.0})
        cpu0 = actor_cpu_seconds(ray, name, k)
        address = ray.get_runtime_context().gcs_address
        start_at = time.time() + 20.0  # every client connected and ready before the clock starts
        procs, files = [], []
        for p in range(args.procs):
            out = os.path.join(args.tmp, f'k{k}_p{p}.json')
            files.append(out)
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                '--role',
                'client',
                '--name',
                name,
                '--k',
                str(k),
                '--threads',
                str(args.threads),
                '--seconds',
                str(args.seconds),
                '--sample-every',
                str(args.sample_every),
                '--start-at',
                str(start_at),
                '--result',
                out,
            ]
            env = dict(os.environ, RAY_ADDRESS=address, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
            procs.append(subprocess.Popen(cmd, env=env))
        for p in procs:
            p.wait(timeout=args.seconds + 300)
        cpu1 = actor_cpu_seconds(ray, name, k)
        push, sample = [], []
        for out in files:
            with open(out) as f:
                r = json.load(f)
            push += r['push']
            sample += r['sample']
        owner.close()
        calls = len(push) + len(sample)
        requests = len(push) + len(sample) * (k + max(1, min(k, 2)))  # a sample: K stats + its draws
        return {
            'shards': k,
            'clients': args.procs * args.threads,
            'seconds': args.seconds,
            'calls_per_s': calls / args.seconds,
            'pushes_per_s': len(push) / args.seconds,
            'push_p50_ms': 1e3 * float(np.percentile(push, 50)),
            'push_p99_ms': 1e3 * float(np.percentile(push, 99)),
            'sample_p99_ms': 1e3 * float(np.percentile(sample, 99)) if sample else float('nan'),
            'manager_cpu_ms_per_1k_requests': 1e6 * (cpu1 - cpu0) / max(requests, 1),
        }
    finally:
        ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--role', default='driver', choices=['driver', 'client'])
    p.add_argument('--shards', default='1,2,4')
    p.add_argument('--procs', type=int, default=4)
    p.add_argument('--threads', type=int, default=16)
    p.add_argument('--seconds', type=float, default=10.0)
    p.add_argument('--sample-every', type=int, default=20)
    p.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results', 'bench_shards.json'))
    # client mode
    p.add_argument('--name')
    p.add_argument('--k', type=int)
    p.add_argument('--start-at')
    p.add_argument('--result')
    args = p.parse_args()
    if args.role == 'client':
        client_main(args)
        return
    import tempfile

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for k in [int(x) for x in args.shards.split(',')]:
            print(
                f'K={k}: {args.procs} processes x {args.threads} clients, {args.seconds:g} s ...',
                file=sys.stderr,
                flush=True,
            )
            rows.append(run_k(args, k))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    with open(args.out, 'w') as f:
        json.dump(rows, f, indent=1)
    print(
        "\n| shards K | clients | calls/s | pushes/s | push p50 ms | push p99 ms | sample(32) p99 ms | manager CPU ms "
        "per 1k requests |\n|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['shards']} | {r['clients']} | {r['calls_per_s']:,.0f} | {r['pushes_per_s']:,.0f} | "
            f"{r['push_p50_ms']:.1f} | {r['push_p99_ms']:.1f} | {r['sample_p99_ms']:.1f} | "
            f"{r['manager_cpu_ms_per_1k_requests']:.0f} |"
        )


if __name__ == '__main__':
    main()

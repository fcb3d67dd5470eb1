"""Where the time of the prioritized DQN loop goes, stage by stage, next to the numpy-gather reference loop.

The loop of ``bench_per.py`` (``advanced`` on tensor storage, CartPole transitions, filled to capacity): 4 single
pushes of gym dicts, ``sample(256)``, ``update`` of the 256 sampled priorities. Each call is timed with
``time.perf_counter`` and, inside it, the compiled tree kernels (``prio_set_one`` of the pushes, ``prio_flush`` and
``prio_draw`` of the sample, ``prio_update_by_id``) and the storage's gather of the sampled rows; what is left is
Python (argument checks, output tensors, IS weights, monitors). The reference loop (``bench_per.py``'s numpy gather)
writes 4 rows of obs / next_obs and gathers 256 random rows of both.

Run
    python benchmarks/per_stages.py [--capacities 100000,1000000] [--loops 3000] [--rounds 3]

Prints one markdown table per capacity (microseconds per loop, medians over rounds). Nothing is asserted.
"""

import argparse
import datetime
import gc
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peers_per as P  # noqa: E402
from bench_naive import cpu_model  # noqa: E402

from ding_buffer import tree_kernels  # noqa: E402

KERNELS = ('prio_set_one', 'prio_flush', 'prio_draw', 'prio_update_by_id')


def timed(table: Dict[str, float], name: str, fn: Callable) -> Callable:
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            table[name] = table.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def one_round(capacity: int, loops: int) -> Dict[str, float]:
    """Microseconds per loop of every stage, for one freshly filled buffer."""
    w = P.make_workload('cartpole', capacity, seed=capacity, fill_chunk=10_000, pool_batches=8)
    buf = P.ours_buffer(capacity)
    P.ours_fill(buf, w)
    inner: Dict[str, float] = {}
    saved = {name: getattr(tree_kernels, name) for name in KERNELS}
    for name in KERNELS:  # callers look them up in the module at each call
        setattr(tree_kernels, name, timed(inner, name, saved[name]))
    storage = buf.storage
    storage.gather = timed(inner, 'gather of the sampled rows', storage.gather)
    items, prios = w.items, [torch.from_numpy(p) for p in w.prios]
    outer = np.zeros(3)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        k = 0
        for it in range(loops + 200):
            if it == 200:  # warm-up done
                inner.clear()
                outer[:] = 0
            t0 = time.perf_counter()
            for _ in range(4):
                buf.push(items[k % len(items)])
                k += 1
            t1 = time.perf_counter()
            s = buf.sample(256)
            t2 = time.perf_counter()
            buf.update(
                {
                    'replay_unique_id': s['replay_unique_id'],
                    'replay_buffer_idx': s['replay_buffer_idx'],
                    'priority': prios[it % len(prios)],
                }
            )
            outer += (t1 - t0, t2 - t1, time.perf_counter() - t2)
        ref = np.zeros(2)
        obs = np.empty((capacity, 4), np.float32)
        nxt = np.empty_like(obs)
        obs[:] = 0
        nxt[:] = 0
        for it in range(loops + 200):
            if it == 200:
                ref[:] = 0
            t0 = time.perf_counter()
            for _ in range(4):
                x = items[k % len(items)]
                k += 1
                obs[k % capacity] = x['obs']
                nxt[k % capacity] = x['next_obs']
            t1 = time.perf_counter()
            idx = np.random.randint(0, capacity, 256)
            obs[idx], nxt[idx]
            ref += (t1 - t0, time.perf_counter() - t1)
    finally:
        if gc_was:
            gc.enable()
        for name, fn in saved.items():
            setattr(tree_kernels, name, fn)
        buf.close()
    us = 1e6 / loops
    out = {
        'ours: 4 single pushes': outer[0] * us,
        'ours: sample(256)': outer[1] * us,
        'ours: update(256)': outer[2] * us,
        'reference: 4 row writes': ref[0] * us,
        'reference: randint + 2 gathers': ref[1] * us,
    }
    out.update({f'inside: {name}': v * us for name, v in inner.items()})
    return out


def report(capacity: int, rounds: List[Dict[str, float]]) -> str:
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    ours = med['ours: 4 single pushes'] + med['ours: sample(256)'] + med['ours: update(256)']
    ref = med['reference: 4 row writes'] + med['reference: randint + 2 gathers']
    kern = sum(v for k, v in med.items() if k.startswith('inside: prio_'))
    gather = med.get('inside: gather of the sampled rows', 0.0)
    rows = [
        ('prioritized loop (4 push + sample + update)', ours),
        ('  4 single pushes', med['ours: 4 single pushes']),
        ('    of which the compiled tree write (prio_set_one)', med.get('inside: prio_set_one', 0.0)),
        ('  sample(256)', med['ours: sample(256)']),
        ('    of which the deferred tree refresh (prio_flush)', med.get('inside: prio_flush', 0.0)),
        ('    of which the compiled draw (prio_draw)', med.get('inside: prio_draw', 0.0)),
        ('    of which the gather of the 5 fields', gather),
        ('  update(256)', med['ours: update(256)']),
        ('    of which the compiled update (prio_update_by_id)', med.get('inside: prio_update_by_id', 0.0)),
        ('  compiled tree work in all', kern),
        ('  Python and numpy outside the kernels and the gather', ours - kern - gather),
        ('numpy reference loop (4 row writes + randint + 2 gathers)', ref),
        ('  4 row writes of obs / next_obs', med['reference: 4 row writes']),
        ('  randint + 2 gathers of 256 rows', med['reference: randint + 2 gathers']),
    ]
    lines = [f'#### capacity {capacity:,}: microseconds per loop (median of {len(rounds)} rounds)', '']
    lines += ['| stage | us per loop |', '|---|---:|']
    lines += [f'| {name} | {value:.1f} |' for name, value in rows]
    lines += ['', f'Prioritized loop / reference loop (rate ratio): {ref / ours:.2f}.', '']
    return '\n'.join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--capacities', default='100000,1000000')
    ap.add_argument('--loops', type=int, default=3000)
    ap.add_argument('--rounds', type=int, default=3)
    args = ap.parse_args()
    command = 'python ' + ' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    print(f'`{command}`, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {cpu_model()}.\n')
    for cap in (int(c) for c in args.capacities.split(',')):
        rounds = [one_round(cap, args.loops) for _ in range(args.rounds)]
        print(report(cap, rounds))


if __name__ == '__main__':
    main()

"""Scaling of ``ding_buffer``'s hot operations with capacity, next to a plain numpy reference loop.

What is measured
    CartPole-like transitions (obs f32[4], action i64, reward f32, next_obs f32[4], done bool) in buffers of
    capacity 1e4, 1e5, 1e6, 1e7 and 1e8 by default (``--capacities``; a capacity that would not fit in memory is
    skipped, saying so), every contender filled to capacity before anything is timed, all in one process. Per
    capacity:

    * uniform ``sample(256)``: ``ding_buffer`` ``naive`` on tensor storage;
    * prioritized ``sample(256)`` with importance-sampling weights: ``advanced`` (alpha 0.6, beta 0.4) on tensor
      storage;
    * ``update`` of 256 priorities of a batch ``advanced`` sampled just before. ``update`` writes the leaves and
      leaves the refresh of the trees above them to the next read (as cpprb does); after the cell one untimed
      ``sample`` pays what the cell left, so the next cell does not (the DQN loop counts every refresh);
    * a DQN loop iteration on ``advanced``: 4 single pushes + ``sample(256)`` + ``update(256)``;
    * the numpy reference loop: five preallocated numpy arrays (one per field), 4 single-transition writes of all
      five fields + a gather of all five fields at 256 indexes drawn by ``rng.integers`` (uniform, with
      replacement; no priorities, ids or weights);
    * bytes per item of ``naive`` and ``advanced``: RSS growth (``/proc/self/statm``) from before constructing
      the buffer to after filling it, divided by capacity. Measured in this same process, one buffer at a time
      (``naive``, then ``advanced``, then the numpy arrays), with ``gc.collect()`` + ``malloc_trim(0)`` before
      both readings and after a warm-up on tiny buffers of both kinds (library initialisation excluded). The
      fill source is allocated before the first reading. Pages freed by an earlier capacity and reused by the
      allocator can make a small-capacity figure read low; large capacities are dominated by fresh mmaps.

    Results are for the machine that ran them (the header names its CPU); nothing is asserted.

How
    As ``bench_per.py``: each measurement calls the operation repeatedly for at least ``--target-s`` seconds
    (and 5 calls) and reports microseconds per call = elapsed / calls. The single operations run with the
    garbage collector paused (``bench_naive.time_calls``); the two loops -- our DQN loop and the numpy
    reference loop -- run with it on, as a training loop does (``--gc-paused`` pauses it for them too, as
    ``per_stages.py`` does). The contenders of every capacity live at once, and within a repeat all cells
    (capacity x operation) run round-robin, the first one rotated each repeat, so a change of the machine's
    load falls on every capacity alike; the table reports the median over ``--repeats`` repeats (>= 3 by
    default); the ratio column and the growth factors are ratios of medians.
    ``update`` cycles through 32 batches sampled right before it in every repeat (as ``bench_per.py``), so
    none is stale. Inputs are ``bench_per.py``'s (``_peers_per.make_workload``): buffers are filled with
    ``extend`` of batch dicts of numpy arrays (100k rows at a time, capacity for smaller buffers); single
    pushes take gym dicts (own numpy f32[4] obs / next_obs, Python int action, float reward, bool done);
    new priorities are pre-drawn float32 tensors. All RNGs are seeded. Before building a capacity, its memory
    (~``EST_BYTES_PER_ITEM`` bytes per item for all contenders, plus headroom), with the smaller capacities'
    still held, is checked against
    ``MemAvailable`` in ``/proc/meminfo``; a capacity that would not fit is skipped with the reason printed.

Run
    python benchmarks/bench_scale.py [--capacities 1e4,1e5,1e6,1e7,1e8] [--repeats 3] [--target-s 0.4] [--quick]

    ``--quick`` (capacities 1e3 and 1e4, 1 repeat, 0.01 s cells) is a smoke run. The header and the table go to
    stdout as markdown, progress to stderr.
"""

import argparse
import itertools
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peers_per as P  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_naive import log, machine, md_table, time_calls  # noqa: E402
from bench_per import rss_bytes, settle  # noqa: E402

from ding_buffer import _numba, create_buffer  # noqa: E402

FILL_CHUNK = 100_000  # rows per ``extend`` when filling
POOL_BATCHES = 128  # distinct push batches of 64 -> 8192 distinct gym items for single pushes
MIN_CALLS = 5
FIELDS = ('obs', 'action', 'reward', 'next_obs', 'done')
# Per-item memory estimate for the capacity check: RSS growth measured ~46 B (naive), ~61-68 B (advanced) and
# ~49 B (numpy arrays) at 1e5..1e8 on tensor storage, i.e. ~160 B for all three; the headroom covers the
# fill's transient copies (100k rows at a time) and measurement noise.
EST_BYTES_PER_ITEM = 170
EST_HEADROOM = 1.1
EST_FIXED = 1 << 30  # interpreter, torch, fill source, pools
OPS = (  # key, table column (microseconds per call)
    ('uniform', 'uniform sample us'),
    ('prioritized', 'prioritized sample us'),
    ('update', 'update us'),
    ('dqn', 'DQN loop us'),
    ('numpy', 'numpy 5-field loop us'),
)
GROWTH_LABEL = {
    'uniform': 'uniform sample(256), naive',
    'prioritized': 'prioritized sample(256) with IS, advanced',
    'update': 'update(256), advanced',
    'dqn': 'DQN loop (4 push + sample + update), advanced',
    'numpy': 'numpy 5-field loop (4 writes + gather 256)',
}


# ---------------------------------------------------------------------------------------------- memory check
def mem_available() -> Optional[int]:
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def fits(capacity: int) -> Tuple[bool, str]:
    need = int(capacity * EST_BYTES_PER_ITEM * EST_HEADROOM) + EST_FIXED
    avail = mem_available()
    if avail is None:
        return True, 'MemAvailable unknown, not checked'
    msg = (
        f'estimate {need / 2**30:.2f} GiB ({EST_BYTES_PER_ITEM} B/item x {EST_HEADROOM} + 1 GiB), MemAvailable '
        f'{avail / 2**30:.2f} GiB'
    )
    return need <= avail, msg


# ---------------------------------------------------------------------------------------------- contenders
def fill(buf, w: P.Workload) -> None:
    for _, n in P.fill_slices(w.capacity, len(w.source['obs'])):
        buf.extend(P.head(w.source, n))
    assert buf.count() == w.capacity


def naive_buffer(capacity: int):
    _numba.load()
    return create_buffer(dict(type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type='tensor')))


def numpy_reference(w: P.Workload, seed: int) -> Callable[[], Any]:
    """Five preallocated arrays filled to capacity; returns the reference loop (4 writes + 5-field gather)."""
    n = w.capacity
    src = w.source
    arrays = {k: np.empty((n, *src[k].shape[1:]), dtype=src[k].dtype) for k in FIELDS}
    for start, k in P.fill_slices(n, len(src['obs'])):
        for f in FIELDS:
            arrays[f][start : start + k] = src[f][:k]
    obs, act, rew, nxt, done = (arrays[k] for k in FIELDS)
    rng = np.random.default_rng(seed)
    next_item = P._cycle(w.items)
    row = itertools.count()

    def loop():
        for _ in range(P.DQN_PUSHES):
            item, j = next_item(), next(row) % n
            obs[j] = item['obs']
            act[j] = item['action']
            rew[j] = item['reward']
            nxt[j] = item['next_obs']
            done[j] = item['done']
        idx = rng.integers(0, n, P.BATCH)
        return obs[idx], act[idx], rew[idx], nxt[idx], done[idx]

    return loop


def warm_up_library(w: P.Workload) -> None:
    """Tiny buffers of both kinds, every operation once: imports, compiled kernels, allocator pools."""
    for kind in ('naive', 'advanced'):
        buf = naive_buffer(1024) if kind == 'naive' else P.ours_buffer(1024)
        buf.extend(P.head(w.source, min(1024, w.capacity)))
        buf.push(w.items[0])
        s = buf.sample(P.BATCH)
        if kind == 'advanced':
            buf.update(
                {
                    'replay_unique_id': s['replay_unique_id'],
                    'replay_buffer_idx': s['replay_buffer_idx'],
                    'priority': torch.from_numpy(w.prios[0]),
                }
            )
        buf.close()
        del buf, s


# ---------------------------------------------------------------------------------- contenders of one capacity
def build_capacity(capacity: int, args) -> Dict[str, Any]:
    """One capacity's contenders built, filled (RSS per item measured) and warmed; returns their timed ops."""
    log(f'capacity {capacity:,}: building and filling (one buffer at a time for RSS)')
    w = P.make_workload(
        'cartpole', capacity, seed=capacity, fill_chunk=min(FILL_CHUNK, capacity), pool_batches=POOL_BATCHES
    )
    warm_up_library(w)
    result: Dict[str, Any] = {'bytes': {}, 'fill_s': {}}

    settle()
    before = rss_bytes()
    t0 = time.perf_counter()
    naive = naive_buffer(capacity)
    fill(naive, w)
    result['fill_s']['naive'] = time.perf_counter() - t0
    settle()
    result['bytes']['naive'] = (rss_bytes() - before) / capacity

    before = rss_bytes()
    t0 = time.perf_counter()
    adv = P.ours_buffer(capacity)
    P.ours_fill(adv, w)
    result['fill_s']['advanced'] = time.perf_counter() - t0
    settle()
    result['bytes']['advanced'] = (rss_bytes() - before) / capacity

    t0 = time.perf_counter()
    numpy_loop = numpy_reference(w, seed=capacity + 1)
    result['fill_s']['numpy'] = time.perf_counter() - t0
    log(
        '  filled in '
        + ', '.join(f'{k} {v:.2f} s' for k, v in result['fill_s'].items())
        + f"; RSS growth naive {result['bytes']['naive']:.1f} B/item, advanced {result['bytes']['advanced']:.1f}"
    )

    adv_ops, refresh = P.ours_ops(adv, w)  # bench_per's operations on our prioritized buffer (after the RSS reading)
    ops = {
        'uniform': lambda: naive.sample(P.BATCH),
        'prioritized': adv_ops['sample'],
        'update': adv_ops['update'],
        'dqn': adv_ops['dqn'],
        'numpy': numpy_loop,
    }
    warm = max(args.target_s / 5, 0.002)
    for k, _ in OPS:
        if k == 'update':
            refresh()
        time_calls(ops[k], 3, warm)
    result.update(ops=ops, refresh=refresh, close=lambda: (naive.close(), adv.close()))
    return result  # the buffers live in the closures of ``ops`` until main() drops them


LOOPS = ('dqn', 'numpy')  # timed with the garbage collector on unless --gc-paused


def measure(results: Dict[int, Dict[str, Any]], args) -> None:
    """Every (capacity, operation) cell, ``args.repeats`` times; within a repeat the cells run round-robin, the
    first one rotated each repeat, so a change of the machine's load falls on every capacity alike. Sets each
    capacity's ``us`` (medians) and ``raw_us``, then closes its buffers."""
    cells = [(cap, k) for cap in results for k, _ in OPS]
    raw = {cap: {k: [] for k, _ in OPS} for cap in results}
    for rep in range(args.repeats):
        shift = rep * len(cells) // args.repeats
        for cap, k in cells[shift:] + cells[:shift]:
            r = results[cap]
            if k == 'update':
                r['refresh']()  # fresh ids: pushes of the DQN loop may have overwritten older samples
            timer = time_calls if k not in LOOPS or args.gc_paused else time_calls_gc_on
            m = timer(r['ops'][k], MIN_CALLS, args.target_s)
            raw[cap][k].append(m['seconds'] / m['calls'] * 1e6)
            if k == 'update':
                r['ops']['prioritized']()  # untimed: the refresh the updates left to the next read
        log(f'repeat {rep + 1}/{args.repeats} done')
    for cap, r in results.items():
        r['us'] = {k: statistics.median(v) for k, v in raw[cap].items()}
        r['raw_us'] = raw[cap]
        r['close']()
        for key in ('ops', 'refresh', 'close'):
            del r[key]


def time_calls_gc_on(fn: Callable[[], Any], min_calls: int, target_s: float) -> Dict[str, float]:
    """``time_calls`` with the garbage collector left on (a training loop's setting)."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if calls >= min_calls and elapsed >= target_s:
            return {'calls': calls, 'seconds': elapsed}


# ---------------------------------------------------------------------------------------------- report
def fmt_us(x: float) -> str:
    return f'{x:,.1f}' if x < 1000 else f'{x:,.0f}'


def print_report(env: Dict[str, Any], results: Dict[int, Dict[str, Any]], skipped: Dict[int, str], args) -> None:
    print('# ding_buffer: cost of hot operations vs capacity\n')
    print(f"- CPU: {env['cpu']}")
    print(f"- cores: {env['cores']} ({env['cores_usable']} usable), torch threads {env['torch_threads']}")
    print(f"- date: {env['date_utc']}")
    print(f"- command: `{env['command']}`")
    loops_gc = 'paused' if args.gc_paused else 'on'
    print(
        f'- batch {P.BATCH}, alpha {P.ALPHA}, beta {P.BETA}; median of {args.repeats} interleaved repeats, each '
        f'>= {args.target_s} s per cell (GC paused for single operations, {loops_gc} for the two loops); '
        'microseconds per call, lower is better; results are for this machine'
    )
    for cap, why in skipped.items():
        print(f'- skipped capacity {cap:,}: {why}')
    print()
    header = ['capacity'] + [label for _, label in OPS]
    header += ['DQN loop / numpy loop (rate ratio = numpy_us / dqn_us)', 'naive B/item', 'advanced B/item']
    rows = []
    for cap, r in results.items():
        us = r['us']
        rows.append(
            [f'{cap:,}']
            + [fmt_us(us[k]) for k, _ in OPS]
            + [f"{us['numpy'] / us['dqn']:.3f}", f"{r['bytes']['naive']:.1f}", f"{r['bytes']['advanced']:.1f}"]
        )
    print(md_table(header, rows))
    if len(results) >= 2:
        caps = sorted(results)
        lo, hi = caps[0], caps[-1]
        print(f'\nGrowth factor (cost at {hi:,} / cost at {lo:,}, capacity x{hi // lo:,}):\n')
        for k, _ in OPS:
            f = results[hi]['us'][k] / results[lo]['us'][k]
            print(f'- {GROWTH_LABEL[k]}: {f:.2f}x')
    elif results:
        print('\nGrowth factor: needs at least two measured capacities.')
    print(f"\ntotal wall time: {env['wall_s']:.1f} s")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument(
        '--capacities',
        default=None,
        help='comma-separated capacities (default 1e4,1e5,1e6,1e7,1e8, each where memory allows; 1e3,1e4 with --quick)',
    )
    p.add_argument('--repeats', type=int, default=None, help='repeats per cell (default 3, 1 with --quick)')
    p.add_argument('--target-s', type=float, default=None, help='seconds per cell (default 0.4, 0.01 with --quick)')
    p.add_argument('--gc-paused', action='store_true', help='pause the garbage collector for the two loops too')
    p.add_argument('--quick', action='store_true', help='smoke run: capacities 1e3,1e4, 1 repeat, tiny cells')
    args = p.parse_args(argv)
    if args.capacities is None:
        args.capacities = '1e3,1e4' if args.quick else '1e4,1e5,1e6,1e7,1e8'
    try:
        caps = [int(float(c)) for c in args.capacities.split(',') if c.strip()]
    except ValueError:
        p.error(f'--capacities takes comma-separated numbers, got {args.capacities!r}')
    if not caps or any(c < 1000 or c > 10**8 for c in caps):
        p.error('--capacities must each be in [1e3, 1e8]')
    args.capacities = sorted(set(caps))
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.target_s is None:
        args.target_s = 0.01 if args.quick else 0.4
    if args.repeats < 1 or args.target_s <= 0:
        p.error('--repeats and --target-s must be positive')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    np.random.seed(0)
    torch.manual_seed(0)
    env = machine(('torch', 'numpy', 'numba', 'ding-buffer'))
    env['command'] = 'python ' + ' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    results: Dict[int, Dict[str, Any]] = {}
    skipped: Dict[int, str] = {}
    for cap in args.capacities:  # every capacity's contenders live at once: the cells are timed interleaved
        ok, why = fits(cap + sum(results))
        if not ok:
            skipped[cap] = f'would not fit in memory next to the smaller ones: {why}'
            log(f'skipping capacity {cap:,}: {skipped[cap]}')
            continue
        log(f'capacity {cap:,}: {why}')
        results[cap] = build_capacity(cap, args)
        settle()
    measure(results, args)
    env['wall_s'] = time.perf_counter() - t0
    print_report(env, results, skipped, args)


if __name__ == '__main__':
    main()

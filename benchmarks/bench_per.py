"""Benchmark of ``ding_buffer``'s prioritized replay buffer (``type='advanced'``, tensor storage) against peers.

What is measured
    CartPole-like transitions (obs f32[4], action i64, reward f32, next_obs f32[4], done bool) in buffers of
    capacity 1e5 and 1e6, and image transitions (obs and next_obs u8[4,84,84]) at 1e5 (2e4 when the machine
    lacks the memory for one 1e5 image buffer at a time); alpha 0.6, beta 0.4, every buffer filled to capacity
    before anything is timed:

    * push of a batch of 64 transitions (transitions/s);
    * single push of one transition as a gym loop makes it -- numpy f32[4] obs / next_obs, Python int action,
      float reward, bool done (transitions/s);
    * prioritized sample of 256 with importance-sampling weights (batches/s);
    * update of 256 priorities of a sampled batch (batches/s);
    * a DQN loop iteration: 4 single pushes + sample 256 + update 256 (loops/s);
    * bytes per transition (CartPole only): RSS growth (``/proc/self/statm``) from before constructing the
      buffer to after filling it to capacity, divided by capacity, each peer measured in a fresh subprocess
      (``--mem-child``) after a warm-up on a tiny buffer of its own kind (library initialisation excluded) and
      with ``gc.collect()`` + ``malloc_trim(0)`` before both readings. Array-based peers fill from one
      preallocated source chunk (allocated before the first reading); DI-engine stores the pushed dicts, so
      they are created during the fill and counted.

    Contenders: ``ding_buffer`` advanced on tensor storage; cpprb ``PrioritizedReplayBuffer``; TorchRL
    ``TensorDictPrioritizedReplayBuffer`` on ``LazyTensorStorage``; DI-engine's ``AdvancedReplayBuffer`` (the
    real class; DI-engine must import, see Run); for images also a plain numpy uniform gather of obs and
    next_obs from preallocated arrays. A peer that fails to import, build or run one operation on a tiny buffer
    is skipped (the reason is printed).

How
    Each measurement calls the operation repeatedly for at least ``--target-s`` seconds (and 2000 calls for
    single pushes, 5 otherwise) with the garbage collector paused (``bench_naive.time_calls``); the rate is
    calls * items / elapsed. CartPole: all contenders of a capacity live at once; within a repeat the
    operations run in the order sample, update, DQN loop, push 64, single push (pushes keep the buffer full)
    and for each operation the contenders run round-robin, the first one rotated each repeat. ``update``
    cycles through 32 batches sampled just before it (re-drawn every repeat, so none is stale); ours and cpprb
    refresh their trees above updated leaves at the next read, so one untimed ``sample`` follows each
    ``update`` cell and the next cell does not pay for it (the DQN loop pays every refresh). Images: one
    buffer at a time (~5.6 GB each at 1e5); each repeat builds, times and frees every contender in rotated
    order. Tables report the median over repeats; ratios are ratios of medians. Inputs are pre-built pools of
    distinct transitions in each contender's native form; new priorities are pre-drawn vectors (a float32
    tensor for ours and TorchRL, a numpy array for cpprb, a list of floats for DI-engine). All RNGs are seeded.
    The targets of the issue are checked at the largest CartPole capacity; nothing is asserted.

Run
    python benchmarks/bench_per.py [--quick] [--repeats N] [--out PATH]

    With DI-engine (not a dependency; installed into an isolated venv that sees the system packages):
        python -m venv --system-site-packages /tmp/dienv
        /tmp/dienv/bin/pip install --no-deps DI-engine==0.5.3 gym==0.25.1 DI-toolkit hbutils deprecation rich \\
            DI-treetensor treevalue graphviz dill URLObject enum-tools tabulate tensorboardX gymnasium hickle \\
            h5py mpire tqdm redis pynng einops
        /tmp/dienv/bin/python benchmarks/bench_per.py

    ``--quick`` (capacities 1e4 and 1e5, images at 2e3, memory at 1e5 only, 2 repeats, short cells) is a
    smoke run. Tables go to stdout as markdown, progress to stderr (DI-engine also logs its sampled-data
    tables there), all medians and raw samples to ``--out`` (JSON, default ``benchmarks/results/bench_per.json``).
"""

import argparse
import ctypes
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peers_per as P  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_naive import cell, fmt, fmt_ratio, log, machine, md_table, ratio, time_calls  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'bench_per.json')
OP_ORDER = ('sample', 'update', 'dqn', 'push64', 'push1')  # pushes last: they overwrite the oldest items
MIN_CALLS = {'push1': 2000}
DEFAULT_MIN_CALLS = 5
CARTPOLE_FILL_CHUNK = 10_000
IMAGE_FILL_CHUNK = 500
IMAGE_BYTES = 2 * int(np.prod(P.IMAGE_SHAPE)) + 8 + 4 + 1  # payload of one image transition
PEERS = (P.OURS, P.CPPRB, P.TORCHRL, P.DIENGINE)
IMAGE_PEERS = (P.OURS, P.CPPRB, P.TORCHRL, P.NUMPY)
# name, op, other contender, minimum ratio ours / other (bytes: maximum), at the largest CartPole capacity
TARGETS = [  # the issue "hot paths" (each at every CartPole capacity; stated for 1e6)
    ('update >= 1.5x cpprb', 'update', P.CPPRB, 1.5),
    ('batched push (64) >= 1x cpprb', 'push64', P.CPPRB, 1.0),
    ('DQN loop >= 2x cpprb', 'dqn', P.CPPRB, 2.0),
    ('sample >= 2x cpprb', 'sample', P.CPPRB, 2.0),
    ('single push >= 1x cpprb (keep)', 'push1', P.CPPRB, 1.0),
    ('bytes / transition <= 1.05x cpprb', 'bytes', P.CPPRB, 1.05),
    ('DQN loop >= 10x DI-engine AdvancedReplayBuffer', 'dqn', P.DIENGINE, 10.0),
    ('DQN loop >= 0.40x the numpy gather loop (0.5 at 1e5)', 'dqn', P.NUMPY, 0.4),
]
SHORT = {'ours': P.OURS, 'cpprb': P.CPPRB, 'torchrl': P.TORCHRL, 'diengine': P.DIENGINE}  # --peers names
IMAGE_TARGET = ('images: sample >= 0.9x numpy uniform gather', 'sample', P.NUMPY, 0.9)


# ---------------------------------------------------------------------------------------------- memory
def rss_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def settle() -> None:
    """Collect garbage and hand free heap pages back to the OS, so RSS counts live memory only."""
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def mem_child(peer: str, capacity: int, budget_s: float) -> None:
    """Runs in a fresh process: bytes per transition of ``peer`` filled to ``capacity``; prints one JSON line."""
    w = P.make_workload('cartpole', capacity, seed=capacity, fill_chunk=CARTPOLE_FILL_CHUNK, pool_batches=1)
    source_td = P._td(w.source) if peer == P.TORCHRL else None
    reason = P.probe(peer)  # warm-up on a tiny buffer: imports, numba kernels, allocator pools
    if reason:
        raise RuntimeError(reason)
    settle()
    before = rss_bytes()
    t0 = time.perf_counter()
    info = {'filled': capacity}
    if peer == P.OURS:
        buf = P.ours_buffer(capacity)
        P.ours_fill(buf, w)
    elif peer == P.CPPRB:
        buf = P.cpprb_buffer(capacity, w)
        P.cpprb_fill(buf, w)
    elif peer == P.TORCHRL:
        buf = P.torchrl_buffer(capacity)
        P.torchrl_fill(buf, w, source_td)
    elif peer == P.DIENGINE:
        buf = P.diengine_buffer(capacity)
        info = P.diengine_fill(buf, w, budget_s)
    else:
        raise ValueError(peer)
    fill_s = time.perf_counter() - t0
    settle()
    after = rss_bytes()
    out = {
        'rss_before': before,
        'rss_after': after,
        'capacity': capacity,
        'filled': info['filled'],
        'fill_s': fill_s,
        'bytes_per_transition': (after - before) / info['filled'],
    }
    print(json.dumps(out), flush=True)
    P.diengine_cleanup()
    os._exit(0)  # skip DI-engine's __del__ (clears item by item) and interpreter teardown


def measure_memory(peer: str, capacity: int, budget_s: float) -> Dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        '--mem-child',
        peer,
        str(capacity),
        '--fill-budget-s',
        str(budget_s),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ['no output'])[-1]
        log(f'  memory of {peer} at {capacity:,} failed: {err}')
        return {'error': err}
    res = json.loads(lines[-1])
    log(
        f"  memory {peer} @ {capacity:,}: {res['bytes_per_transition']:.1f} B/transition "
        f"(child {time.perf_counter() - t0:.1f} s)"
    )
    return res


# ---------------------------------------------------------------------------------------------- timing
def time_op(c: P.Contender, op: str, target_s: float) -> Optional[Dict[str, float]]:
    fn = c.ops[op]
    if not callable(fn):
        return None
    m = time_calls(fn, MIN_CALLS.get(op, DEFAULT_MIN_CALLS), target_s)
    if op == 'update' and callable(c.ops['sample']):
        # untimed: ours and cpprb leave the trees' refresh above updated leaves to the next read; that read pays
        # here, so the next operation's cell does not
        c.ops['sample']()
    return dict(m, rate=m['calls'] * P.OPS[op][1] / m['seconds'])


def warm_up(c: P.Contender, target_s: float) -> None:
    for op in OP_ORDER:
        if op == 'update':
            c.refresh()
        fn = c.ops[op]
        if callable(fn):
            time_calls(fn, 3, target_s)


def summarize(contenders: List[P.Contender], raw: Dict[str, Dict[str, List[Dict[str, float]]]]) -> Dict[str, Any]:
    out = {}
    for c in contenders:
        ops = {}
        for op in P.OPS:
            samples = raw[c.name].get(op)
            if samples:
                ops[op] = {
                    'median': statistics.median(s['rate'] for s in samples),
                    'unit': P.OPS[op][0],
                    'samples': samples,
                }
            else:
                ops[op] = {'median': None, 'shown_as': c.ops[op] if isinstance(c.ops[op], str) else 'n/a'}
        out[c.name] = {'notes': c.notes, 'info': c.info, 'ops': ops}
    return out


def build(name: str, w: P.Workload, args) -> P.Contender:
    if name == P.OURS:
        return P.build_ours(w)
    if name == P.CPPRB:
        return P.build_cpprb(w)
    if name == P.TORCHRL:
        return P.build_torchrl(w)
    if name == P.DIENGINE:
        return P.build_diengine(w, args.fill_budget_s)
    if name == P.NUMPY:
        return P.build_numpy_gather(w)
    raise ValueError(name)


def bench_cartpole(capacity: int, peers: List[str], args) -> Dict[str, Any]:
    log(f'CartPole capacity {capacity:,}: building and filling buffers')
    w = P.make_workload('cartpole', capacity, seed=capacity, fill_chunk=CARTPOLE_FILL_CHUNK, pool_batches=128)
    contenders = []
    for name in peers:
        c = build(name, w, args)
        contenders.append(c)
        log(f"  filled {name}: {c.info['filled']:,} items in {c.info['fill_s']:.2f} s")
    for c in contenders:
        warm_up(c, args.target_s / 5)
    raw = {c.name: {} for c in contenders}
    for rep in range(args.repeats):
        shift = rep % len(contenders)
        order = contenders[shift:] + contenders[:shift]
        for op in OP_ORDER:
            if op == 'update':
                for c in contenders:
                    c.refresh()
            for c in order:
                m = time_op(c, op, args.target_s)
                if m is not None:
                    raw[c.name].setdefault(op, []).append(m)
        log(f'  repeat {rep + 1}/{args.repeats} done')
    result = {'contenders': summarize(contenders, raw)}
    for c in contenders:
        c.release()
    del contenders, w, c
    settle()
    return result


def image_capacity(args) -> (int, str):
    if args.quick:
        return 2_000, 'quick run'
    want = 100_000
    need = want * IMAGE_BYTES
    avail = 0
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemAvailable:'):
                avail = int(line.split()[1]) * 1024
    if avail >= 1.2 * need + 2 * 2**30:
        return want, f'MemAvailable {avail / 2**30:.1f} GiB >= 1.2 x {need / 2**30:.1f} GiB + 2 GiB'
    return 20_000, (
        f'MemAvailable {avail / 2**30:.1f} GiB < 1.2 x {need / 2**30:.1f} GiB + 2 GiB needed for '
        f'one 1e5 image buffer: using 2e4'
    )


def bench_images(peers: List[str], args) -> Dict[str, Any]:
    capacity, why = image_capacity(args)
    log(f'images capacity {capacity:,} ({why}): one buffer at a time')
    w = P.make_workload('image', capacity, seed=7, fill_chunk=IMAGE_FILL_CHUNK, pool_batches=16)
    raw = {name: {} for name in peers}
    last = {}
    repeats = args.image_repeats
    for rep in range(repeats):
        shift = rep % len(peers)
        for name in peers[shift:] + peers[:shift]:
            c = build(name, w, args)
            warm_up(c, args.target_s / 5)
            for op in OP_ORDER:
                if op == 'update':
                    c.refresh()
                m = time_op(c, op, args.target_s)
                if m is not None:
                    raw[name].setdefault(op, []).append(m)
            last[name] = c._replace(
                ops={k: (v if isinstance(v, str) else None) for k, v in c.ops.items()}, refresh=None, release=None
            )
            log(f"  repeat {rep + 1}/{repeats}: {name} (fill {c.info['fill_s']:.1f} s)")
            c.release()
            del c
            settle()
    result = {'capacity': capacity, 'why': why, 'contenders': summarize([last[n] for n in peers], raw)}
    del w
    settle()
    return result


# ---------------------------------------------------------------------------------------------- report
PACKAGES = ('torch', 'numpy', 'numba', 'cpprb', 'torchrl', 'tensordict', 'DI-engine', 'ding-buffer')


def environment(args) -> Dict[str, Any]:
    return {
        **machine(PACKAGES),
        'python_executable': sys.executable,
        'capacities': args.capacities,
        'memory_capacities': args.mem_capacities,
        'repeats': args.repeats,
        'image_repeats': args.image_repeats,
        'target_s': args.target_s,
        'fill_budget_s': args.fill_budget_s,
        'quick': args.quick,
    }


def bytes_of(memory: Dict[str, Any], name: str) -> Optional[float]:
    m = memory.get(name)
    return m.get('bytes_per_transition') if m else None


def rate_table(contenders: Dict[str, Any], memory: Optional[Dict[str, Any]]) -> str:
    names = list(contenders)
    rows = [[label] + [cell(contenders[n], op) for n in names] for op, (label, _) in P.OPS.items()]
    if memory is not None:
        rows.append(
            ['bytes / transition (RSS growth)'] + [fmt(bytes_of(memory, n), 1) if n in memory else '—' for n in names]
        )
    rows.append(
        ['fill to capacity (s, not a rate)']
        + [
            f"{contenders[n]['info']['fill_s']:.2f}"
            + (
                ''
                if contenders[n]['info']['filled'] >= cap_of(contenders)
                else f" ({contenders[n]['info']['filled']:,} items)"
            )
            for n in names
        ]
    )
    return md_table(['operation'] + names, rows)


def cap_of(contenders: Dict[str, Any]) -> int:
    return contenders[P.OURS]['info']['filled']


def ratio_table(contenders: Dict[str, Any], memory: Optional[Dict[str, Any]]) -> str:
    ours = contenders[P.OURS]
    peers = [n for n in contenders if n != P.OURS]
    rows = [
        [label] + [fmt_ratio(ratio(ours['ops'][op]['median'], contenders[p]['ops'][op]['median'])) for p in peers]
        for op, (label, _) in P.OPS.items()
    ]
    if memory is not None:
        rows.append(
            ['bytes / transition'] + [fmt(ratio(bytes_of(memory, P.OURS), bytes_of(memory, p)), 3) for p in peers]
        )
    return md_table([f'{P.OURS} / peer'] + peers, rows)


def target_value(results: Dict[str, Any], memory: Dict[str, Any], op: str, other: str) -> Optional[float]:
    if op == 'bytes':
        return ratio(bytes_of(memory, P.OURS), bytes_of(memory, other))
    c = results['contenders']
    if other not in c:
        return None
    return ratio(c[P.OURS]['ops'][op]['median'], c[other]['ops'][op]['median'])


def check_targets(cartpole, memory, images, args) -> List[Dict[str, Any]]:
    out = []
    for name, op, other, bound in TARGETS:
        for cap in sorted(cartpole, key=int):
            v = target_value(cartpole[cap], memory.get(cap, {}), op, other)
            met = None if v is None else (v <= bound if op == 'bytes' else v >= bound)
            out.append({'target': name, 'capacity': int(cap), 'value': v, 'bound': bound, 'met': met})
    if images is not None:
        name, op, other, bound = IMAGE_TARGET
        v = target_value(images, {}, op, other)
        out.append(
            {
                'target': name,
                'capacity': images['capacity'],
                'value': v,
                'bound': bound,
                'met': None if v is None else v >= bound,
            }
        )
    return out


def print_report(env, cartpole, memory, images, targets, skipped, args) -> None:
    v = env['versions']
    print('# ding_buffer prioritized replay buffer vs peers\n')
    print(f"- date: {env['date_utc']}")
    print(
        f"- CPU: {env['cpu']}, {env['cores']} cores ({env['cores_usable']} usable), torch threads "
        f"{env['torch_threads']}"
    )
    print(
        f"- python {v['python']}, torch {v['torch']}, numpy {v['numpy']}, numba "
        f"{v['numba']}, cpprb {v['cpprb']}, torchrl {v['torchrl']} (tensordict {v['tensordict']}), DI-engine "
        f"{v['DI-engine']}, ding_buffer {v['ding-buffer']}"
    )
    print(
        f"- alpha {P.ALPHA}, beta {P.BETA}, batch {P.BATCH}; median of {args.repeats} repeats (images "
        f"{args.image_repeats}), each >= {args.target_s} s per cell (GC paused), contenders interleaved; "
        f"buffers filled to capacity first"
    )
    for name, reason in skipped.items():
        print(f'- skipped {name}: {reason}')
    for cap, res in cartpole.items():
        mem = memory.get(cap)
        print(f'\n## CartPole, capacity {int(cap):,}: rates, median (min-max over repeats; higher is better)\n')
        print(rate_table(res['contenders'], mem if mem is not None else {}))
        print(
            f'\n## CartPole, capacity {int(cap):,}: ratio ours / peer (rates: > 1 = ding_buffer faster; '
            f'bytes: < 1 = ding_buffer smaller)\n'
        )
        print(ratio_table(res['contenders'], mem))
    if images is not None:
        print(
            f"\n## images u8[4,84,84] x2, capacity {images['capacity']:,} ({images['why']}): rates, median "
            "(min-max over repeats)\n"
        )
        print(rate_table(images['contenders'], None))
        print(f"\n## images, capacity {images['capacity']:,}: ratio ours / peer\n")
        print(ratio_table(images['contenders'], None))
    print(
        '\n## targets (stated for capacity 1e6'
        + (', evaluated at the quick run\'s capacities' if args.quick else '')
        + ')\n'
    )
    rows = [
        [
            t['target'],
            f"{t['capacity']:,}",
            'n/a' if t['value'] is None else f"{t['value']:.3f}",
            f"{t['bound']:g}",
            {True: 'met', False: 'NOT met', None: 'n/a (peer or memory not measured)'}[t['met']],
        ]
        for t in targets
    ]
    print(md_table(['target', 'capacity', 'ours / peer', 'bound', 'result'], rows))
    print('\nNotes (n/a = the peer has no such operation; — = not measured):\n')
    seen = set()
    for res in list(cartpole.values()) + ([images] if images else []):
        for name, entry in res['contenders'].items():
            for note in entry['notes']:
                if (name, note) not in seen:
                    seen.add((name, note))
                    print(f'- {name}: {note}')
    print(
        '- bytes / transition: RSS growth from before construction to after the fill, / capacity, one fresh '
        'subprocess per peer and capacity (warm-up on a tiny buffer first; gc + malloc_trim before each '
        'reading); DI-engine\'s count includes the stored dicts and their numpy arrays, which it keeps'
    )
    if memory:
        for cap, per in memory.items():
            for name, m in per.items():
                if 'error' in m:
                    print(f'- memory of {name} at {int(cap):,} failed: {m["error"]}')
                elif m['filled'] < m['capacity']:
                    print(f"- memory of {name} at {int(cap):,}: filled {m['filled']:,} items only (budget)")
    print(f"\ntotal wall time: {env['wall_s']:.1f} s")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true', help='smoke run: capacities 1e4/1e5, images 2e3, 2 repeats')
    p.add_argument('--repeats', type=int, default=None, help='repeats per cell (default 5, 2 with --quick)')
    p.add_argument('--image-repeats', type=int, default=None, help='image rounds (default 3, 2 with --quick)')
    p.add_argument('--target-s', type=float, default=None, help='seconds per measurement (default 0.4)')
    p.add_argument(
        '--fill-budget-s',
        type=float,
        default=None,
        help="cap on DI-engine's fill time per buffer (default 240, 30 with --quick)",
    )
    p.add_argument(
        '--capacities', default=None, help='comma-separated CartPole capacities (default 1e5,1e6; 1e4,1e5 with --quick)'
    )
    p.add_argument('--no-images', action='store_true', help='skip the image transitions')
    p.add_argument('--no-memory', action='store_true', help='skip the bytes-per-transition subprocesses')
    p.add_argument(
        '--peers', default=None, help='comma-separated subset of: ours,cpprb,torchrl,diengine (default: all importable)'
    )
    p.add_argument('--out', default=DEFAULT_OUT, help=f'JSON output (default {DEFAULT_OUT})')
    p.add_argument('--mem-child', nargs=2, metavar=('PEER', 'CAPACITY'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peers is not None and not set(s.strip() for s in args.peers.split(',')) <= set(SHORT):
        p.error(f'--peers takes a comma-separated subset of {",".join(SHORT)}')
    if args.capacities is not None:
        try:
            args.capacities = [int(float(c)) for c in args.capacities.split(',')]
        except ValueError:
            p.error(f'--capacities takes comma-separated numbers, got {args.capacities!r}')
        if any(c < 1000 for c in args.capacities):
            p.error('--capacities must be >= 1000 each')
    else:
        args.capacities = [10_000, 100_000] if args.quick else [100_000, 1_000_000]
    args.mem_capacities = [100_000] if args.quick else args.capacities
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.image_repeats is None:
        args.image_repeats = 2 if args.quick else 3
    if args.target_s is None:
        args.target_s = 0.05 if args.quick else 0.4
    if args.fill_budget_s is None:
        args.fill_budget_s = 30.0 if args.quick else 240.0
    if args.repeats < 1 or args.image_repeats < 1 or args.target_s <= 0 or args.fill_budget_s <= 0:
        p.error('--repeats, --image-repeats, --target-s and --fill-budget-s must be positive')
    return args


def available(args) -> (List[str], Dict[str, str]):
    wanted = PEERS if args.peers is None else [SHORT[s.strip()] for s in args.peers.split(',')]
    logging.getLogger('torchrl').setLevel(logging.ERROR)
    peers, skipped = [], {}
    for name in PEERS:
        if name not in wanted:
            continue
        reason = P.probe(name)
        if reason is None:
            peers.append(name)
            continue
        if name == P.DIENGINE and 'ding' in reason:
            reason += ' -- run with a python where DI-engine imports (see the docstring: /tmp/dienv)'
        if name == P.OURS:
            raise RuntimeError(f'{P.OURS} does not work: {reason}')
        skipped[name] = reason
        log(f'skipping {name}: {reason}')
    # Importing DI-engine sets the root logger to INFO with a console handler; keep ding_buffer's loggers at
    # WARNING, what they get in a process without logging configuration (DI-engine keeps its own logging).
    logging.getLogger('ding_buffer').setLevel(logging.WARNING)
    return peers, skipped


def main(argv=None) -> None:
    args = parse_args(argv)
    np.random.seed(0)
    torch.manual_seed(0)
    if args.mem_child:
        mem_child(args.mem_child[0], int(args.mem_child[1]), args.fill_budget_s)
        return
    t0 = time.perf_counter()
    peers, skipped = available(args)
    env = environment(args)
    # the numpy gather is the physical reference, not a peer: always measured, never in the memory table
    cartpole = {str(cap): bench_cartpole(cap, peers + [P.NUMPY], args) for cap in args.capacities}
    memory = {}
    if not args.no_memory:
        log('bytes per transition: one subprocess per peer and capacity')
        for cap in args.mem_capacities:
            memory[str(cap)] = {name: measure_memory(name, cap, args.fill_budget_s) for name in peers}
    images = None
    if not args.no_images:
        images = bench_images([n for n in IMAGE_PEERS if n in peers or n == P.NUMPY], args)
    targets = check_targets(cartpole, memory, images, args)
    env['wall_s'] = time.perf_counter() - t0
    print_report(env, cartpole, memory, images, targets, skipped, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(
            {
                'environment': env,
                'skipped_peers': skipped,
                'cartpole': cartpole,
                'memory': memory,
                'images': images,
                'targets': targets,
            },
            f,
            indent=1,
        )
    P.diengine_cleanup()
    log(f'wrote {args.out}; total wall time {env["wall_s"]:.1f} s')
    sys.stdout.flush()
    os._exit(0)  # DI-engine buffers' __del__ would clear item by item at interpreter exit


if __name__ == '__main__':
    main()

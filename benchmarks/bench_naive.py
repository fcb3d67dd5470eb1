"""Benchmark of ``ding_buffer``'s naive (uniform FIFO) replay buffer against peers.

What is measured
    CartPole-like transitions (obs f32[4], action i64, reward f32, next_obs f32[4], done bool) in buffers of
    capacity 1e5 and 1e6, each filled to capacity (in chunks of 100k) before anything is timed:

    * push of a batch of 64 transitions, given as batch arrays (``extend``) or as a list of 64 dicts
      (transitions/s);
    * single push of one transition dict (transitions/s);
    * sample of 256 without replacement and with replacement (batches/s);
    * bytes per stored transition.

    Contenders: ``ding_buffer`` naive on tensor storage and on list storage; DI-engine's NaiveReplayBuffer
    algorithm reimplemented in a few lines (Python list of dicts, ``np.random.choice(n, 256, replace=False)``
    -- DI-engine itself is not installed); cpprb ``ReplayBuffer``; TorchRL ``ReplayBuffer`` on a
    ``LazyTensorStorage`` with ``RandomSampler`` and with ``SamplerWithoutReplacement``. A peer that fails
    to import is skipped (the reason is printed). A separate small table times the index draw alone:
    ``ding_buffer.sampling.uniform_indices`` vs ``Generator.choice`` vs ``np.random.choice`` at n = 1e4..1e6.

How
    Sampling is timed first on the freshly filled buffers (it does not change them), pushes afterwards (they
    overwrite the oldest items). Each measurement calls the operation repeatedly for at least
    ``--target-s`` seconds (and a minimum number of calls, 2000 for single pushes) with the garbage collector
    paused, as ``timeit`` does; the rate is calls * items / elapsed (``time.perf_counter``). Within a repeat
    the contenders are measured round-robin (starting contender rotated each repeat); the tables report the
    median over ``--repeats`` repeats. Ratios are ratios of medians. Pushed inputs come from a pre-built pool
    of distinct transitions in each contender's native form (numpy arrays / dicts; TensorDicts for TorchRL),
    built outside the timed region. All RNGs are seeded. No timing is asserted.

Run
    python benchmarks/bench_naive.py [--quick] [--repeats N] [--out PATH]

    ``--quick`` (capacities 1e4 and 1e5, fewer repeats, shorter measurements) is a smoke run. Tables go to
    stdout as markdown, progress to stderr, all medians and raw samples to ``--out`` (JSON, default
    ``benchmarks/results/bench_naive.json``).
"""

import argparse
import datetime
import gc
import itertools
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np
import torch

from ding_buffer import _numba, create_buffer
from ding_buffer.sampling import uniform_indices

BATCH = 256  # sample size
PUSH_BATCH = 64  # transitions per batched push
FILL_CHUNK = 100_000  # transitions per chunk when filling to capacity
POOL_BATCHES = 128  # distinct push batches cycled through (POOL_BATCHES * PUSH_BATCH distinct transitions)
OURS = 'ding_buffer naive (tensor)'
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'bench_naive.json')

# Rows of the rate table: key -> (label, items per call for the rate).
OPS = {
    'push64_arrays': ('push 64, batch arrays (transitions/s)', PUSH_BATCH),
    'push64_dicts': ('push 64, list of 64 dicts (transitions/s)', PUSH_BATCH),
    'push1': ('single push (transitions/s)', 1),
    'sample_noreplace': ('sample 256 w/o replacement (batches/s)', 1),
    'sample_replace': ('sample 256 with replacement (batches/s)', 1),
}
SAMPLE_OPS = ('sample_noreplace', 'sample_replace')
PUSH_OPS = ('push64_arrays', 'push64_dicts', 'push1')
MIN_CALLS = {'push1': 2000}  # the brief asks single pushes to be measured over >= 2000 pushes
DEFAULT_MIN_CALLS = 5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- workload
def make_chunk(rng: np.random.Generator, n: int) -> Dict[str, np.ndarray]:
    """``n`` CartPole-like transitions as batch arrays."""
    return {
        'obs': rng.standard_normal((n, 4), dtype=np.float32),
        'action': rng.integers(0, 2, size=n, dtype=np.int64),
        'reward': np.ones(n, dtype=np.float32),
        'next_obs': rng.standard_normal((n, 4), dtype=np.float32),
        'done': rng.random(n) < 0.05,
    }


def unbatch(chunk: Dict[str, np.ndarray]) -> List[Dict[str, Any]]:
    """One dict per transition (numpy views / scalars), the layout DI-engine's collectors hand to the buffer."""
    keys = list(chunk)
    columns = [chunk[k] for k in keys]
    return [dict(zip(keys, row)) for row in zip(*columns)]


def fill_chunks(capacity: int, seed: int) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [make_chunk(rng, min(FILL_CHUNK, capacity - start)) for start in range(0, capacity, FILL_CHUNK)]


class PushInputs(NamedTuple):
    batches: List[Dict[str, np.ndarray]]  # batch arrays of PUSH_BATCH
    dict_lists: List[List[Dict[str, Any]]]  # the same, as lists of dicts
    items: List[Dict[str, Any]]  # every transition of the pool, one dict each


def push_inputs(seed: int) -> PushInputs:
    rng = np.random.default_rng(seed)
    batches = [make_chunk(rng, PUSH_BATCH) for _ in range(POOL_BATCHES)]
    dict_lists = [unbatch(b) for b in batches]
    return PushInputs(batches, dict_lists, [item for lst in dict_lists for item in lst])


# ---------------------------------------------------------------------------------------------- DI-engine
class DIEngineStyleNaive:
    """DI-engine's ``NaiveReplayBuffer`` data path, reimplemented: a Python list of dicts used as a ring,
    ``np.random.choice(valid, size, replace)`` for indices (O(capacity) without replacement: the legacy
    RandomState permutes the whole population), then list indexing. No deepcopy, no monitors."""

    def __init__(self, capacity: int, seed: int) -> None:
        self._data: List[Any] = [None] * capacity
        self._size = capacity
        self._tail = 0
        self._valid = 0
        self._lock = threading.Lock()
        self._rs = np.random.RandomState(seed)  # what np.random.choice uses, with its own seed

    def push(self, item: Any) -> None:
        with self._lock:
            self._data[self._tail] = item
            self._tail = (self._tail + 1) % self._size
            self._valid = min(self._valid + 1, self._size)

    def extend(self, items: List[Any]) -> None:
        with self._lock:
            n, tail = len(items), self._tail
            if tail + n <= self._size:
                self._data[tail : tail + n] = items
            else:
                k = self._size - tail
                self._data[tail:] = items[:k]
                self._data[: n - k] = items[k:]
            self._tail = (tail + n) % self._size
            self._valid = min(self._valid + n, self._size)

    def sample(self, size: int, replace: bool = False) -> List[Any]:
        with self._lock:
            indices = self._rs.choice(self._valid, size, replace=replace)
            data = self._data
            return [data[i] for i in indices.tolist()]

    def __len__(self) -> int:
        return self._valid


# ---------------------------------------------------------------------------------------------- contenders
class Contender(NamedTuple):
    name: str
    ops: Dict[str, Any]  # op key -> zero-arg callable, or a str shown instead of a number ('n/a', '—')
    nbytes: Callable[[], Optional[float]]  # bytes per stored transition
    notes: List[str]


def _cycle(pool: List[Any]) -> Callable[[], Any]:
    it = itertools.cycle(pool)
    return lambda: next(it)


def _estimate_item_bytes(items: List[Dict[str, Any]]) -> float:
    """Mean of getsizeof(dict) + getsizeof(values) (+ the data of numpy views) + 8 for the list slot."""
    total = 0
    for item in items:
        total += sys.getsizeof(item) + 8
        for value in item.values():
            total += sys.getsizeof(value)
            if isinstance(value, np.ndarray) and value.base is not None:
                total += value.nbytes  # a view does not count the data it points to
    return total / len(items)


def build_ours(capacity: int, chunks, inputs: PushInputs, storage: str) -> Contender:
    _numba.load()  # steady state: compiled kernels loaded before anything is timed (they load in the background)
    buf = create_buffer(dict(type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type=storage)))
    for chunk in chunks:
        buf.extend(chunk)
    assert buf.count() == capacity
    next_batch, next_list, next_item = _cycle(inputs.batches), _cycle(inputs.dict_lists), _cycle(inputs.items)
    ops = {
        'push64_arrays': lambda: buf.extend(next_batch()),
        'push64_dicts': lambda: buf.push(next_list()),
        'push1': lambda: buf.push(next_item()),
        'sample_noreplace': lambda: buf.sample(BATCH),
        'sample_replace': lambda: buf.sample(BATCH, replace=True),
    }
    if storage == 'tensor':
        nbytes = lambda: float(buf.storage.nbytes_per_item())
        notes = ['bytes: field data only (`nbytes_per_item()`); the ring adds 9 B/slot (valid flag + int64 id)']
    else:
        nbytes = lambda: _estimate_item_bytes(buf.sample(1000))
        notes = [
            'bytes: estimate (getsizeof of dict + values + view data + list slot), ring adds 9 B/slot',
            'push 64 batch arrays = `extend`, which splits the batch into per-item dicts',
            'pushed dicts are stored by reference (no copy, no schema check); sample returns the stored dicts',
        ]
    return Contender(f'ding_buffer naive ({storage})', ops, nbytes, notes)


def build_diengine(capacity: int, chunks, inputs: PushInputs) -> Contender:
    buf = DIEngineStyleNaive(capacity, seed=0)
    for chunk in chunks:
        buf.extend(unbatch(chunk))
    next_list, next_item = _cycle(inputs.dict_lists), _cycle(inputs.items)
    ops = {
        'push64_arrays': 'n/a',
        'push64_dicts': lambda: buf.extend(next_list()),
        'push1': lambda: buf.push(next_item()),
        'sample_noreplace': lambda: buf.sample(BATCH),
        'sample_replace': lambda: buf.sample(BATCH, replace=True),
    }
    notes = [
        "DI-engine's algorithm, reimplemented (DI-engine is not installed); takes lists of dicts only",
        'pushes store references (a list slice assignment), sample w/o replacement is O(capacity)',
        'bytes: estimate (getsizeof of dict + values + view data + list slot)',
    ]
    return Contender('DI-engine-style naive', ops, lambda: _estimate_item_bytes(buf.sample(1000)), notes)


def build_cpprb(capacity: int, chunks, inputs: PushInputs) -> Contender:
    import cpprb

    env_dict = {
        'obs': {'shape': 4, 'dtype': np.float32},
        'action': {'dtype': np.int64},
        'reward': {'dtype': np.float32},
        'next_obs': {'shape': 4, 'dtype': np.float32},
        'done': {'dtype': np.bool_},
    }
    buf = cpprb.ReplayBuffer(capacity, env_dict=env_dict)
    for chunk in chunks:
        buf.add(**chunk)
    assert buf.get_stored_size() == capacity
    next_batch, next_item = _cycle(inputs.batches), _cycle(inputs.items)

    def nbytes() -> float:
        arrays = buf.get_all_transitions()
        return sum(a.nbytes for a in arrays.values()) / buf.get_stored_size()

    ops = {
        'push64_arrays': lambda: buf.add(**next_batch()),
        'push64_dicts': 'n/a',
        'push1': lambda: buf.add(**next_item()),
        'sample_noreplace': 'n/a',
        'sample_replace': lambda: buf.sample(BATCH),
    }
    notes = ['uniform `sample` draws with replacement; no without-replacement mode']
    return Contender('cpprb ReplayBuffer', ops, nbytes, notes)


def _tensordict(chunk: Dict[str, np.ndarray]):
    from tensordict import TensorDict

    return TensorDict({k: torch.from_numpy(v) for k, v in chunk.items()}, batch_size=[len(chunk['obs'])])


def build_torchrl(capacity: int, chunks, inputs: PushInputs, without_replacement: bool) -> Contender:
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler, SamplerWithoutReplacement

    sampler = SamplerWithoutReplacement() if without_replacement else RandomSampler()
    buf = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=BATCH)
    for chunk in chunks:
        buf.extend(_tensordict(chunk))
    assert len(buf) == capacity

    def nbytes() -> float:
        td = buf.storage._storage
        return sum(t.numel() * t.element_size() for t in td.values(True, True)) / capacity

    if without_replacement:
        ops = {op: '—' for op in PUSH_OPS}  # same storage and push path as the RandomSampler contender
        ops.update({'sample_noreplace': lambda: buf.sample(), 'sample_replace': 'n/a'})
        notes = [
            'SamplerWithoutReplacement is epoch-style: no repeats across consecutive batches until the '
            'buffer is exhausted (one randperm(capacity) per epoch), unlike per-batch w/o replacement',
            'pushes not re-measured (—): same storage as the RandomSampler contender',
        ]
        return Contender('TorchRL (SamplerWithoutReplacement)', ops, nbytes, notes)
    td_batches = [_tensordict(b) for b in inputs.batches]
    td_items = [td[i] for td in td_batches for i in range(PUSH_BATCH)]
    next_batch, next_item = _cycle(td_batches), _cycle(td_items)
    ops = {
        'push64_arrays': lambda: buf.extend(next_batch()),
        'push64_dicts': 'n/a',
        'push1': lambda: buf.add(next_item()),
        'sample_noreplace': 'n/a',
        'sample_replace': lambda: buf.sample(),
    }
    notes = ['inputs are TensorDicts (batch arrays = TensorDict[64], single = TensorDict[])']
    return Contender('TorchRL (RandomSampler)', ops, nbytes, notes)


def build_numpy_gather(capacity: int, chunks, inputs: PushInputs) -> Contender:
    """The physical reference: two preallocated arrays (obs, next_obs) and ``arr[np.random.randint(0, n, 256)]``
    for each -- moving the batch and nothing else (with replacement; no ids, no other fields)."""
    obs = np.concatenate([c['obs'] for c in chunks])[:capacity]
    nxt = np.concatenate([c['next_obs'] for c in chunks])[:capacity]
    assert len(obs) == capacity

    def sample() -> Any:
        idx = np.random.randint(0, capacity, BATCH)
        return {'obs': obs[idx], 'next_obs': nxt[idx]}

    ops = dict.fromkeys(('push64_arrays', 'push64_dicts', 'push1', 'sample_noreplace'), 'n/a')
    ops['sample_replace'] = sample
    notes = ['baseline: two preallocated numpy arrays (obs, next_obs), `arr[np.random.randint(0, n, 256)]` for each']
    return Contender('numpy gather', ops, lambda: (obs.nbytes + nxt.nbytes) / capacity, notes)


BUILDERS = [
    (OURS, lambda c, ch, inp: build_ours(c, ch, inp, 'tensor')),
    ('ding_buffer naive (list)', lambda c, ch, inp: build_ours(c, ch, inp, 'list')),
    ('DI-engine-style naive', build_diengine),
    ('cpprb ReplayBuffer', build_cpprb),
    ('TorchRL (RandomSampler)', lambda c, ch, inp: build_torchrl(c, ch, inp, False)),
    ('TorchRL (SamplerWithoutReplacement)', lambda c, ch, inp: build_torchrl(c, ch, inp, True)),
    ('numpy gather', build_numpy_gather),
]


def available_peers() -> Dict[str, str]:
    """Import each optional peer; returns ``{package: reason}`` for those that failed."""
    failed = {}
    for module in ('cpprb', 'torchrl', 'tensordict'):
        try:
            __import__(module)
        except Exception as e:  # any import failure means: skip that peer
            failed[module] = f'{type(e).__name__}: {e}'
            log(f'skipping peer {module}: {failed[module]}')
    logging.getLogger('torchrl').setLevel(logging.WARNING)
    return failed


def wanted_builders(failed: Dict[str, str]):
    for name, builder in BUILDERS:
        if name.startswith('cpprb') and 'cpprb' in failed:
            continue
        if name.startswith('TorchRL') and ('torchrl' in failed or 'tensordict' in failed):
            continue
        yield name, builder


# ---------------------------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], Any], min_calls: int, target_s: float) -> Dict[str, float]:
    """Call ``fn`` until ``target_s`` seconds and ``min_calls`` calls have passed, GC paused."""
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if calls >= min_calls and elapsed >= target_s:
                return {'calls': calls, 'seconds': elapsed}
    finally:
        if gc_enabled:
            gc.enable()


def check_sample(contender: Contender) -> None:
    """Sanity check (not timing): every sampling op returns 256 items."""
    for op in SAMPLE_OPS:
        fn = contender.ops[op]
        if callable(fn):
            out = fn()
            n = len(out) if isinstance(out, list) else len(next(iter(out.values())))
            if n != BATCH:
                raise RuntimeError(f'{contender.name} {op} returned {n} items, expected {BATCH}')


def run_phase(contenders: List[Contender], ops, repeats: int, target_s: float, raw) -> None:
    """Round-robin over contenders inside each repeat; appends rates to ``raw[name][op]``."""
    for rep in range(repeats):
        shift = rep % len(contenders)
        order = contenders[shift:] + contenders[:shift]
        for op in ops:
            for c in order:
                fn = c.ops[op]
                if not callable(fn):
                    continue
                m = time_calls(fn, MIN_CALLS.get(op, DEFAULT_MIN_CALLS), target_s)
                rate = m['calls'] * OPS[op][1] / m['seconds']
                raw[c.name].setdefault(op, []).append(dict(m, rate=rate))
        log(f'    repeat {rep + 1}/{repeats} of {"/".join(ops)} done')


def warm_up(contenders: List[Contender], ops, target_s: float) -> None:
    for c in contenders:
        for op in ops:
            if callable(c.ops[op]):
                time_calls(c.ops[op], 3, target_s)


def bench_capacity(capacity: int, failed: Dict[str, str], args) -> Dict[str, Any]:
    log(f'capacity {capacity:,}: building and filling buffers')
    chunks = fill_chunks(capacity, seed=capacity)
    inputs = push_inputs(seed=1)
    contenders = []
    for name, builder in wanted_builders(failed):
        start = time.perf_counter()
        contenders.append(builder(capacity, chunks, inputs))
        log(f'  filled {name} in {time.perf_counter() - start:.2f} s')
    for c in contenders:
        check_sample(c)
    raw = {c.name: {} for c in contenders}
    log('  sampling (buffers unchanged)')
    warm_up(contenders, SAMPLE_OPS, args.target_s / 5)
    run_phase(contenders, SAMPLE_OPS, args.repeats, args.target_s, raw)
    log('  pushing (overwrites the oldest items)')
    warm_up(contenders, PUSH_OPS, args.target_s / 5)
    run_phase(contenders, PUSH_OPS, args.repeats, args.target_s, raw)
    result = {'contenders': {}}
    for c in contenders:
        entry = {'notes': c.notes, 'bytes_per_transition': c.nbytes(), 'ops': {}}
        for op in OPS:
            fn = c.ops[op]
            if callable(fn):
                rates = [s['rate'] for s in raw[c.name][op]]
                entry['ops'][op] = {'median': statistics.median(rates), 'unit': OPS[op][0], 'samples': raw[c.name][op]}
            else:
                entry['ops'][op] = {'median': None, 'shown_as': fn}
        result['contenders'][c.name] = entry
    del contenders, chunks, inputs
    gc.collect()
    return result


def bench_indices(args) -> Dict[str, Any]:
    """The index draw alone: O(batch) vs O(n)."""
    log('index draw: uniform_indices vs Generator.choice vs np.random.choice')
    rng = np.random.default_rng(0)
    np.random.seed(0)
    methods = {
        'ding_buffer uniform_indices(rng, n, 256)': lambda n: uniform_indices(rng, n, BATCH),
        'rng.choice(n, 256, replace=False)': lambda n: rng.choice(n, BATCH, replace=False),
        'np.random.choice(n, 256, replace=False)': lambda n: np.random.choice(n, BATCH, replace=False),
    }
    raw = {m: {n: [] for n in args.index_ns} for m in methods}
    for rep in range(args.repeats):
        for n in args.index_ns:
            for name, f in methods.items():
                m = time_calls(lambda: f(n), DEFAULT_MIN_CALLS, args.target_s / 2)
                raw[name][n].append(dict(m, rate=m['calls'] / m['seconds']))
    return {
        name: {
            str(n): {'median': statistics.median(s['rate'] for s in samples), 'samples': samples}
            for n, samples in per_n.items()
        }
        for name, per_n in raw.items()
    }


# ---------------------------------------------------------------------------------------------- report
def cpu_model() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or 'unknown'


def versions(pkgs=('torch', 'numpy', 'cpprb', 'torchrl', 'tensordict', 'ding_buffer')) -> Dict[str, str]:
    from importlib import metadata

    out = {'python': platform.python_version()}
    for pkg in pkgs:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = 'not installed'
    return out


def machine(pkgs=None) -> Dict[str, Any]:
    """Date, CPU, cores, torch threads and package versions (shared by every benchmark's JSON and header)."""
    return {
        'date_utc': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'),
        'cpu': cpu_model(),
        'cores': os.cpu_count(),
        'cores_usable': len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
        'torch_threads': torch.get_num_threads(),
        'versions': versions() if pkgs is None else versions(pkgs),
    }


def environment(args) -> Dict[str, Any]:
    return {
        **machine(),
        'capacities': args.capacities,
        'repeats': args.repeats,
        'target_s': args.target_s,
        'quick': args.quick,
    }


def fmt(x: Optional[float], digits: int = 0) -> str:
    if x is None:
        return 'n/a'
    return f'{x:,.{digits}f}'


def fmt_rate(x: Optional[float]) -> str:
    """Three significant digits with a k/M suffix (the noise is far above that precision anyway)."""
    if x is None:
        return 'n/a'
    for scale, suffix in ((1e6, ' M'), (1e3, ' k')):
        if x >= scale:
            return f'{x / scale:.3g}{suffix}'
    return f'{x:.3g}'


def fmt_ratio(x: Optional[float]) -> str:
    return 'n/a' if x is None else f'{x:.3g}'


def md_table(header: List[str], rows: List[List[str]]) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(['---'] + ['---:'] * (len(header) - 1)) + '|']
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
    return '\n'.join(lines)


def cell(entry: Dict[str, Any], op: str) -> str:
    """The median rate and, from more than one repeat, the spread over repeats: ``median (min-max)``."""
    o = entry['ops'][op]
    if o['median'] is None:
        return o['shown_as']
    rates = [s['rate'] for s in o.get('samples') or ()]
    if len(rates) < 2:
        return fmt_rate(o['median'])
    return f"{fmt_rate(o['median'])} ({fmt_rate(min(rates))}-{fmt_rate(max(rates))})"


def rate_table(res: Dict[str, Any]) -> str:
    names = list(res['contenders'])
    rows = [[label] + [cell(res['contenders'][n], op) for n in names] for op, (label, _) in OPS.items()]
    rows.append(['bytes / transition'] + [fmt(res['contenders'][n]['bytes_per_transition'], 1) for n in names])
    return md_table(['operation'] + names, rows)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def ratio_table(res: Dict[str, Any]) -> str:
    contenders = res['contenders']
    ours = contenders[OURS]
    peers = [n for n in contenders if n != OURS]
    rows = []
    for op, (label, _) in OPS.items():
        rows.append(
            [label] + [fmt_ratio(ratio(ours['ops'][op]['median'], contenders[p]['ops'][op]['median'])) for p in peers]
        )
    rows.append(
        ['bytes / transition']
        + [fmt_ratio(ratio(ours['bytes_per_transition'], contenders[p]['bytes_per_transition'])) for p in peers]
    )
    return md_table([f'{OURS} / peer'] + peers, rows)


def index_table(res: Dict[str, Any], ns: List[int]) -> str:
    rows = [[name] + [fmt_rate(per_n[str(n)]['median']) for n in ns] for name, per_n in res.items()]
    return md_table(['index draw (calls/s)'] + [f'n = {n:,}' for n in ns], rows)


def print_report(env: Dict[str, Any], results: Dict[str, Any], indices: Dict[str, Any], failed, args) -> None:
    v = env['versions']
    print('# ding_buffer naive replay buffer vs peers\n')
    print(f"- date: {env['date_utc']}")
    print(
        f"- CPU: {env['cpu']}, {env['cores']} cores ({env['cores_usable']} usable), torch threads "
        f"{env['torch_threads']}"
    )
    print(
        f"- python {v['python']}, torch {v['torch']}, numpy {v['numpy']}, cpprb {v['cpprb']}, "
        f"torchrl {v['torchrl']} (tensordict {v['tensordict']}), ding_buffer {v['ding_buffer']}"
    )
    print(
        f"- median of {args.repeats} repeats, each >= {args.target_s} s per cell (GC paused), contenders "
        f"round-robin; buffers filled to capacity first; transitions: obs f32[4], action i64, reward f32, "
        f"next_obs f32[4], done bool"
    )
    for module, reason in failed.items():
        print(f'- skipped peer {module}: {reason}')
    for cap, res in results.items():
        print(f'\n## capacity {int(cap):,}: rates, median (min-max over repeats; higher is better)\n')
        print(rate_table(res))
        print(
            f'\n## capacity {int(cap):,}: ratio {OURS} / peer (rates: > 1 = ding_buffer faster; '
            f'bytes: < 1 = ding_buffer smaller)\n'
        )
        print(ratio_table(res))
    print('\nNotes (n/a = the peer has no such operation/input form; — = not measured):\n')
    first = next(iter(results.values()))
    for name, entry in first['contenders'].items():
        for note in entry['notes']:
            print(f'- {name}: {note}')
    print('\n## index draw alone: 256 distinct indices out of n (calls/s, higher is better)\n')
    print(index_table(indices, args.index_ns))
    print(f"\ntotal wall time: {env['wall_s']:.1f} s")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true', help='smoke run: capacities 1e4/1e5, 2 repeats, short cells')
    p.add_argument('--repeats', type=int, default=None, help='repeats per cell (default 5, 2 with --quick)')
    p.add_argument('--target-s', type=float, default=None, help='seconds per measurement (default 0.4)')
    p.add_argument('--out', default=DEFAULT_OUT, help=f'JSON output (default {DEFAULT_OUT})')
    args = p.parse_args(argv)
    args.capacities = [10_000, 100_000] if args.quick else [100_000, 1_000_000]
    args.index_ns = [10_000, 100_000, 1_000_000]
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.target_s is None:
        args.target_s = 0.05 if args.quick else 0.4
    if args.repeats < 1 or args.target_s <= 0:
        p.error('--repeats and --target-s must be positive')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    np.random.seed(0)
    torch.manual_seed(0)
    failed = available_peers()
    env = environment(args)
    results = {str(cap): bench_capacity(cap, failed, args) for cap in args.capacities}
    indices = bench_indices(args)
    env['wall_s'] = time.perf_counter() - t0
    print_report(env, results, indices, failed, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(
            {'environment': env, 'skipped_peers': failed, 'capacities': results, 'index_draw': indices}, f, indent=1
        )
    log(f'wrote {args.out}; total wall time {env["wall_s"]:.1f} s')


if __name__ == '__main__':
    main()

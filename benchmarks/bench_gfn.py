"""Benchmark of ``ding_buffer``'s diverse GFlowNet buffer (``type='gfn_diverse'``) against torchgfn's
``NormBasedDiversePrioritizedReplayBuffer``.

What is measured
    Terminating states of dimension 64 with integer grid coordinates, capacity 10,000, batches of 256:

    * insert: ``push`` / ``add`` of a fresh batch of 256 into a *full* buffer (the diversity filter only runs
      once a buffer is full, in torchgfn as here), median ms per batch;
    * sample: ``sample(256)`` from the full buffer, median ms per call;
    * full fill: 40 batches of 256 pushed into an empty buffer (no filtering until full), ms per fill.

    Contenders, all fed the same states and log-rewards:

    * ``ours (dict)``: ``create_buffer(dict(type='gfn_diverse', ...))`` pushed a dict
      ``{'state': float32[256, 64], 'log_reward': float32[256]}``;
    * ``ours (StatesContainer)``: the same buffer type pushed a torchgfn ``StatesContainer`` of
      ``HyperGrid(ndim=64)`` states (int64 tensors), as a torchgfn user would;
    * ``torchgfn``: ``NormBasedDiversePrioritizedReplayBuffer(env, capacity=10000, cutoff_distance, p)`` fed
      an identical, separately built ``StatesContainer``.

    Rows (configurations) combine a state distribution with a cutoff and p:

    * ``sparse``: HyperGrid-like terminating states of random trajectories from s0 = 0 (1 + Poisson(5) steps,
      action probabilities drawn once from Dirichlet(0.3), coordinates capped at height - 1 = 7), so exact and
      near duplicates occur naturally and most coordinates are 0;
    * ``dense``: a pool of 20,000 uniform points of [0, 4)^64; each state is a pool point, half of them with
      one or two coordinates moved by +-1 (clipped), so exact and near duplicates occur while unrelated states
      are far apart (p=1 distance ~80);
    * cutoffs: 0 (torchgfn's default: exact duplicates; p = 1), small cutoffs that reject near duplicates
      (p = 1 and p = 2), and one large cutoff (dense, p=1, cutoff 45) where almost no pair is close but every
      pair must be examined over many columns (a stress case for an early-exit scan).

    Log-rewards are distinct float32 values (unique over the whole run, so neither buffer ever breaks a tie and
    the stored sets must agree exactly). The fill draws them from U(-5, 5); every later batch draws them from
    ``min_stored + U(-1, 1)`` (the current minimum, read before the batch is built), so about half of each batch
    passes the reward filter and the distance filter then works on the rest.

How
    Per row: the three buffers are filled with the same 40 batches (10,240 items; untimed), then
    ``--warmup`` batches are pushed untimed (numba compiles its kernels on the first filtered push), then
    ``--reps`` fresh batches are each pushed into every buffer, contenders in rotated order, each push timed
    on its own with ``time.perf_counter`` and the garbage collector paused. Batches (dict and both containers)
    are built before the timed calls. Then ``sample(256)`` is timed the same way (warm-up first). Admitted
    counts: ours returns them from ``push``; for torchgfn they are the stored items whose log-reward belongs to
    the batch (rewards are unique), counted after the timed call. At the end every buffer's whole content is
    read (ours: ``sample(count, replace=False)``, torchgfn: its ``training_container``) and the multisets of
    (state row, log-reward) are compared. The fill phase is timed separately (``--fill-reps`` fresh buffers per
    contender, rotated, same 40 batches, construction untimed). Ratios are torchgfn / ours of medians
    (> 1: ours faster). The target of the issue, >= 3x faster insert and sample, is checked per row; nothing
    is asserted.

Run
    python benchmarks/bench_gfn.py [--quick] [--reps N] [--torch-threads N] [--profile] [--out PATH]

    ``--quick`` (fewer repetitions) is a smoke run. ``--profile`` runs cProfile on our inserts in every row where
    one of ours misses the 3x insert target, and on our ``sample(256)`` in the first row where each misses the
    sample target, and prints where the time goes. Tables go to stdout as markdown, progress to stderr, medians
    and raw samples to ``--out`` (JSON, default ``benchmarks/results/bench_gfn.json``). Without torchgfn only
    ``ours (dict)`` is measured. The header (and a column per row) reports the share of the machine's CPU time
    used by other processes: on a shared machine torch's intra-op threads can stall for milliseconds when a core
    is taken (every torch op of both libraries is affected, torchgfn's most), so a run with a large share is
    noise; ``--torch-threads 1`` removes the stalls (then every contender runs on one core).
"""

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_naive import log, machine, md_table  # noqa: E402

from ding_buffer import _numba, create_buffer  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'bench_gfn.json')
DIM = 64
CAPACITY = 10_000
BATCH = 256
FILL_BATCHES = 40
TARGET = 3.0
OURS_DICT, OURS_CONT, TGFN = 'ours (dict)', 'ours (StatesContainer)', 'torchgfn'
PACKAGES = ('numpy', 'torch', 'numba', 'torchgfn', 'ding-buffer')

# sparse: HyperGrid-like random trajectories from s0
SPARSE_HEIGHT, SPARSE_EXTRA_STEPS, SPARSE_ALPHA = 8, 5.0, 0.3
# dense: perturbed pool points
DENSE_HEIGHT, DENSE_POOL, DENSE_PERTURB = 4, 20_000, 0.5


class Row(NamedTuple):
    name: str
    data: str  # 'sparse' or 'dense'
    cutoff: float
    p: float


ROWS = [
    Row('sparse, cutoff 0, p=1 (default)', 'sparse', 0.0, 1.0),
    Row('sparse, cutoff 1, p=1', 'sparse', 1.0, 1.0),
    Row('sparse, cutoff 1.5, p=2', 'sparse', 1.5, 2.0),
    Row('dense, cutoff 0, p=1 (default)', 'dense', 0.0, 1.0),
    Row('dense, cutoff 2, p=1', 'dense', 2.0, 1.0),
    Row('dense, cutoff 1.5, p=2', 'dense', 1.5, 2.0),
    Row('dense, cutoff 45, p=1 (stress)', 'dense', 45.0, 1.0),
]


# ---------------------------------------------------------------------------------------------- data
class Source:
    """Deterministic states and globally unique float32 log-rewards for one row."""

    def __init__(self, kind: str, seed: int) -> None:
        self.kind = kind
        self.rng = np.random.default_rng(seed)
        self.used = np.empty(0, dtype=np.float32)
        if kind == 'sparse':
            self.height = SPARSE_HEIGHT
            self.probs = self.rng.dirichlet(np.full(DIM, SPARSE_ALPHA))
        elif kind == 'dense':
            self.height = DENSE_HEIGHT
            self.pool = self.rng.integers(0, DENSE_HEIGHT, (DENSE_POOL, DIM), dtype=np.int64)
        else:
            raise ValueError(kind)

    def states(self, n: int) -> np.ndarray:
        rng = self.rng
        if self.kind == 'sparse':
            steps = 1 + rng.poisson(SPARSE_EXTRA_STEPS, n)
            actions = rng.choice(DIM, int(steps.sum()), p=self.probs)
            owner = np.repeat(np.arange(n), steps)
            out = np.zeros((n, DIM), dtype=np.int64)
            np.add.at(out, (owner, actions), 1)
            return np.minimum(out, self.height - 1)
        out = self.pool[rng.integers(0, len(self.pool), n)].copy()
        moved = np.flatnonzero(rng.random(n) < DENSE_PERTURB)
        for k in range(2):  # one or two coordinates moved by +-1
            sel = moved if k == 0 else moved[rng.random(len(moved)) < 0.5]
            cols = rng.integers(0, DIM, len(sel))
            out[sel, cols] += rng.choice(np.array([-1, 1]), len(sel))
        return np.clip(out, 0, self.height - 1)

    def log_rewards(self, n: int, low: float, high: float) -> np.ndarray:
        """``n`` float32 values from U(low, high), distinct from each other and from every earlier value."""
        out = self.rng.uniform(low, high, n).astype(np.float32)
        while True:
            _, first = np.unique(out, return_index=True)
            bad = np.ones(n, dtype=bool)
            bad[first] = False
            bad |= np.isin(out, self.used)
            if not bad.any():
                break
            out[bad] = self.rng.uniform(low, high, int(bad.sum())).astype(np.float32)
        self.used = np.concatenate([self.used, out])
        return out


class Batch(NamedTuple):
    states: np.ndarray  # int64 [n, DIM]
    log_rewards: np.ndarray  # float32 [n]


def as_dict(b: Batch) -> Dict[str, torch.Tensor]:
    return {
        'state': torch.from_numpy(b.states.astype(np.float32)),
        'log_reward': torch.from_numpy(b.log_rewards.copy()),
    }


def as_container(env: Any, b: Batch) -> Any:
    from gfn.containers import StatesContainer

    n = len(b.log_rewards)
    return StatesContainer(
        env,
        states=env.States(torch.from_numpy(b.states.copy())),
        is_terminating=torch.ones(n, dtype=torch.bool),
        log_rewards=torch.from_numpy(b.log_rewards.copy()),
    )


# ---------------------------------------------------------------------------------------------- contenders
class Contender(NamedTuple):
    name: str
    buf: Any
    push: Callable[[Dict[str, Any]], Optional[int]]  # takes the pre-built inputs of one batch
    sample: Callable[[], Any]
    content: Callable[[], Batch]  # the whole stored multiset


def torchgfn_available() -> Optional[str]:
    import importlib

    try:
        for module, name in (
            ('gfn.containers', 'NormBasedDiversePrioritizedReplayBuffer'),
            ('gfn.containers', 'StatesContainer'),
            ('gfn.gym', 'HyperGrid'),
        ):
            getattr(importlib.import_module(module), name)
    except Exception as e:  # any import failure: measure ours (dict) only
        return f'{type(e).__name__}: {e}'
    return None


def make_env(height: int) -> Any:
    from gfn.gym import HyperGrid

    return HyperGrid(ndim=DIM, height=height, validate_modes=False)


def ours_buffer(row: Row) -> Any:
    return create_buffer(
        dict(type='gfn_diverse', replay_buffer_size=CAPACITY, cutoff_distance=row.cutoff, p_norm_distance=row.p, seed=0)
    )


def ours_content_dict(buf: Any) -> Batch:
    out = buf.sample(buf.count(), replace=False)
    return Batch(out['state'].numpy().astype(np.int64), out['log_reward'].numpy())


def ours_content_container(buf: Any) -> Batch:
    c = buf.sample(buf.count(), replace=False)
    return Batch(c.states.tensor.numpy(), c.log_rewards.numpy())


def build_contenders(row: Row, env: Any) -> List[Contender]:
    out = []
    b = ours_buffer(row)
    out.append(
        Contender(
            OURS_DICT,
            b,
            lambda x, b=b: b.push(x['dict']),
            lambda b=b: b.sample(BATCH),
            lambda b=b: ours_content_dict(b),
        )
    )
    if env is not None:
        from gfn.containers import NormBasedDiversePrioritizedReplayBuffer

        b2 = ours_buffer(row)
        out.append(
            Contender(
                OURS_CONT,
                b2,
                lambda x, b=b2: b.push(x['ours_cont']),
                lambda b=b2: b.sample(BATCH),
                lambda b=b2: ours_content_container(b),
            )
        )
        t = NormBasedDiversePrioritizedReplayBuffer(
            env, capacity=CAPACITY, cutoff_distance=row.cutoff, p_norm_distance=row.p
        )
        out.append(
            Contender(
                TGFN,
                t,
                lambda x, t=t: t.add(x['tgfn']),
                lambda t=t: t.sample(BATCH),
                lambda t=t: Batch(t.training_container.states.tensor.numpy(), t.training_container.log_rewards.numpy()),
            )
        )
    return out


def inputs(b: Batch, env: Any) -> Dict[str, Any]:
    """Every contender's own copy of the batch (built outside the timed region)."""
    x = {'dict': as_dict(b)}
    if env is not None:
        x['ours_cont'] = as_container(env, b)
        x['tgfn'] = as_container(env, b)
    return x


def timed(fn: Callable[[], Any]):
    """One call, GC paused: (seconds, result)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        res = fn()
        return time.perf_counter() - t0, res
    finally:
        if enabled:
            gc.enable()


def admitted_by_torchgfn(t: Any, b: Batch) -> int:
    return int(np.isin(t.training_container.log_rewards.numpy(), b.log_rewards).sum())


def same_multiset(a: Batch, b: Batch) -> bool:
    if len(a.log_rewards) != len(b.log_rewards):
        return False
    ia, ib = np.argsort(a.log_rewards, kind='stable'), np.argsort(b.log_rewards, kind='stable')
    return bool(
        np.array_equal(a.log_rewards[ia], b.log_rewards[ib])
        and np.array_equal(a.states[ia].astype(np.int64), b.states[ib].astype(np.int64))
    )


# ---------------------------------------------------------------------------------------------- one row
def fill_batches(src: Source) -> List[Batch]:
    return [Batch(src.states(BATCH), src.log_rewards(BATCH, -5.0, 5.0)) for _ in range(FILL_BATCHES)]


def next_batch(src: Source, ref: Any) -> Batch:
    m = ref.stats()['log_reward_min']
    return Batch(src.states(BATCH), src.log_rewards(BATCH, m - 1.0, m + 1.0))


def prepare_row(row: Row, seed: int, env: Any, warmup: int):
    """Filled and warmed-up contenders plus the row's data source."""
    src = Source(row.data, seed)
    contenders = build_contenders(row, env)
    for b in fill_batches(src):
        x = inputs(b, env)
        for c in contenders:
            c.push(x)
    for k in range(warmup):
        b = next_batch(src, contenders[0].buf)
        x = inputs(b, env)
        for c in contenders[k % len(contenders) :] + contenders[: k % len(contenders)]:
            c.push(x)
    return src, contenders


def bench_row(row: Row, seed: int, env: Any, args) -> Dict[str, Any]:
    t_row = time.perf_counter()
    cpu0 = busy_cpu_s()
    src, contenders = prepare_row(row, seed, env, args.warmup)
    names = [c.name for c in contenders]
    before = contenders[0].buf.stats()
    insert = {n: [] for n in names}
    admitted = {n: [] for n in names}
    for k in range(args.reps):
        b = next_batch(src, contenders[0].buf)
        x = inputs(b, env)
        shift = k % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            dt, res = timed(lambda: c.push(x))
            insert[c.name].append(dt)
            admitted[c.name].append(int(res) if c.name != TGFN else admitted_by_torchgfn(c.buf, b))
    after = contenders[0].buf.stats()
    for c in contenders:  # sample warm-up
        for _ in range(3):
            c.sample()
    sample = {n: [] for n in names}
    for k in range(args.reps):
        shift = k % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            dt, res = timed(c.sample)
            sample[c.name].append(dt)
            if k == 0 and len(res if c.name == TGFN or c.name == OURS_CONT else res['state']) != BATCH:
                raise RuntimeError(f'{c.name} sample returned the wrong number of items')
    contents = {c.name: c.content() for c in contenders}
    checked = after['filter_checked'] - before['filter_checked']
    filt = {
        'passed_reward_per_push': (checked - (after['rejected_by_reward'] - before['rejected_by_reward'])) / args.reps,
        'rejected_by_distance_per_push': (after['rejected_by_distance'] - before['rejected_by_distance']) / args.reps,
        'unique_stored_states': after['unique_terminating_states'],
    }
    match = {}
    if TGFN in names:
        for n in (OURS_DICT, OURS_CONT):
            match[n] = {
                'counts_equal': sum(a == t for a, t in zip(admitted[n], admitted[TGFN])),
                'stored_multiset_equal': same_multiset(contents[n], contents[TGFN]),
            }
    res = {
        'row': row._asdict(),
        'insert_ms': {n: summary(v) for n, v in insert.items()},
        'sample_ms': {n: summary(v) for n, v in sample.items()},
        'admitted_per_push': {n: v for n, v in admitted.items()},
        'filter': filt,
        'match': match,
        'wall_s': time.perf_counter() - t_row,
    }
    res['other_cpu_share'] = other_cpu_share(cpu0, busy_cpu_s(), res['wall_s'])
    log(
        f'  {row.name}: insert '
        + ', '.join(f"{n} {res['insert_ms'][n]['median']:.2f}" for n in names)
        + ' ms; sample '
        + ', '.join(f"{n} {res['sample_ms'][n]['median']:.3f}" for n in names)
        + f' ms ({res["wall_s"]:.1f} s)'
    )
    return res


def summary(seconds: List[float]) -> Dict[str, Any]:
    ms = [s * 1e3 for s in seconds]
    return {
        'median': statistics.median(ms),
        'mean': statistics.fmean(ms),
        'min': min(ms),
        'max': max(ms),
        'samples': ms,
    }


def bench_fill(env: Any, args) -> Dict[str, Any]:
    """40 batches of 256 into an empty buffer, per contender; construction untimed."""
    row = ROWS[0]
    src = Source(row.data, 12345)
    batches = fill_batches(src)
    xs = [inputs(b, env) for b in batches]
    names = [c.name for c in build_contenders(row, env)]
    times = {n: [] for n in names}

    def fill(c: Contender) -> None:
        for x in xs:
            c.push(x)

    for rep in range(args.fill_warmup + args.fill_reps):
        contenders = build_contenders(row, env)
        shift = rep % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            dt, _ = timed(lambda: fill(c))
            if rep >= args.fill_warmup:
                times[c.name].append(dt)
        del contenders
    return {n: summary(v) for n, v in times.items()}


# ---------------------------------------------------------------------------------------------- profile
def profile_table(prof: cProfile.Profile, calls: int, top: int = 10) -> List[List[str]]:
    """The ``top`` functions by own time, per call of the profiled operation."""
    rows = []
    for (file, line, func), (_, nc, tt, ct, _) in sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[
        :top
    ]:
        where = f'{os.path.basename(file)}:{line}' if line else 'built-in'
        rows.append([f'`{func}` ({where})', f'{nc / calls:.1f}', f'{tt * 1e3 / calls:.3f}', f'{ct * 1e3 / calls:.3f}'])
    return rows


def profile_row(row: Row, seed: int, env: Any, args, what: str, names: List[str]) -> Dict[str, List[List[str]]]:
    """cProfile of our ``what`` ('insert' or 'sample') in ``row``: same data as the timed run, torchgfn idle."""
    out = {}
    for name in names:
        src, contenders = prepare_row(row, seed, env, args.warmup)
        c = next(c for c in contenders if c.name == name)
        prof = cProfile.Profile()
        if what == 'insert':
            calls = args.reps
            for _ in range(calls):  # each batch built from the current minimum, as in the timed run
                x = inputs(next_batch(src, c.buf), env)
                prof.enable()
                c.push(x)
                prof.disable()
        else:
            calls = 20 * args.reps
            for _ in range(3):
                c.sample()
            prof.enable()
            for _ in range(calls):
                c.sample()
            prof.disable()
        out[name] = profile_table(prof, calls)
    return out


def run_profiles(verdicts: List[Dict[str, Any]], envs: Dict[str, Any], args) -> List[Dict[str, Any]]:
    """Inserts: every row where one of ours misses the target. Sample: the first row where each misses it."""
    out = []
    sampled = set()
    for i, row in enumerate(ROWS):
        mine = [v for v in verdicts if v['row'] == row.name]
        slow = [v['contender'] for v in mine if not v['insert_met']]
        if slow:
            log(f'profiling insert of {", ".join(slow)} in {row.name}')
            for name, table in profile_row(row, 1000 + i, envs.get(row.data), args, 'insert', slow).items():
                out.append({'what': 'insert', 'row': row.name, 'contender': name, 'calls': args.reps, 'table': table})
        slow = [v['contender'] for v in mine if not v['sample_met'] and v['contender'] not in sampled]
        if slow:
            sampled.update(slow)
            log(f'profiling sample of {", ".join(slow)} in {row.name}')
            for name, table in profile_row(row, 1000 + i, envs.get(row.data), args, 'sample', slow).items():
                out.append(
                    {'what': 'sample(256)', 'row': row.name, 'contender': name, 'calls': 20 * args.reps, 'table': table}
                )
    return out


# ---------------------------------------------------------------------------------------------- report
def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def fr(x: Optional[float]) -> str:
    return 'n/a' if x is None else f'{x:.2f}x'


def time_table(results: List[Dict[str, Any]], key: str, names: List[str], digits: int) -> str:
    ours = [n for n in names if n != TGFN]
    header = ['row'] + [f'{n} ms' for n in names]
    if TGFN in names:
        header += [f'torchgfn / {n}' for n in ours]
    header.append('other processes\' CPU share')
    rows = []
    for r in results:
        med = {n: r[key][n]['median'] for n in names}
        cells = [r['row']['name']] + [f'{med[n]:.{digits}f}' for n in names]
        if TGFN in names:
            cells += [fr(ratio(med[TGFN], med[n])) for n in ours]
        share = r.get('other_cpu_share')
        cells.append('n/a' if share is None else f'{100 * share:.0f}%')
        rows.append(cells)
    return md_table(header, rows)


def filter_table(results: List[Dict[str, Any]], names: List[str]) -> str:
    header = ['row', 'passed reward filter / push', 'rejected by distance / push'] + [
        f'admitted / push: {n}' for n in names
    ]
    if TGFN in names:
        header += ['admitted counts equal (ours dict, container)', 'stored multisets equal (dict, container)']
    rows = []
    for r in results:
        f = r['filter']
        cells = [r['row']['name'], f"{f['passed_reward_per_push']:.1f}", f"{f['rejected_by_distance_per_push']:.1f}"]
        cells += [f"{statistics.fmean(r['admitted_per_push'][n]):.1f}" for n in names]
        if TGFN in names:
            reps = len(r['admitted_per_push'][TGFN])
            m = r['match']
            cells.append(f"{m[OURS_DICT]['counts_equal']}/{reps}, {m[OURS_CONT]['counts_equal']}/{reps}")
            cells.append(', '.join('yes' if m[n]['stored_multiset_equal'] else 'NO' for n in (OURS_DICT, OURS_CONT)))
        rows.append(cells)
    return md_table(header, rows)


def target_table(results: List[Dict[str, Any]]) -> (str, List[Dict[str, Any]]):
    rows, verdicts = [], []
    for r in results:
        for n in (OURS_DICT, OURS_CONT):
            ins = ratio(r['insert_ms'][TGFN]['median'], r['insert_ms'][n]['median'])
            smp = ratio(r['sample_ms'][TGFN]['median'], r['sample_ms'][n]['median'])
            v = {
                'row': r['row']['name'],
                'contender': n,
                'insert': ins,
                'sample': smp,
                'insert_met': ins >= TARGET,
                'sample_met': smp >= TARGET,
            }
            verdicts.append(v)
            rows.append(
                [
                    v['row'],
                    n,
                    fr(ins),
                    'met' if v['insert_met'] else 'NOT met',
                    fr(smp),
                    'met' if v['sample_met'] else 'NOT met',
                ]
            )
    return md_table(
        [
            'row',
            'ours',
            'insert torchgfn/ours',
            f'insert >= {TARGET:g}x',
            'sample torchgfn/ours',
            f'sample >= {TARGET:g}x',
        ],
        rows,
    ), verdicts


def print_report(env_info: Dict[str, Any], results, fill, verdicts_table, profiles, skipped, args) -> None:
    v = env_info['versions']
    names = list(results[0]['insert_ms'])
    print('# ding_buffer gfn_diverse vs torchgfn NormBasedDiversePrioritizedReplayBuffer\n')
    print(f"- date: {env_info['date_utc']}")
    print(
        f"- CPU: {env_info['cpu']}, {env_info['cores']} cores ({env_info['cores_usable']} usable), torch threads "
        f"{env_info['torch_threads']}"
    )
    print('- ' + ', '.join(f'{k} {v[k]}' for k in ('python',) + PACKAGES))
    other = env_info.get('other_cpu_share')
    if other is not None:
        print(
            f'- CPU time used by other processes during the run: {100 * other:.0f}% of the machine'
            + (' -- timings are noisy' if other > 0.1 else '')
        )
    print(
        f'- capacity {CAPACITY:,}, states int grid [{BATCH}, {DIM}], batch {BATCH}; every buffer full before '
        f'timing; {args.warmup} untimed warm-up pushes, then median of {args.reps} pushes (fresh batch each, '
        f'same batch for all contenders, rotated order, GC paused) and of {args.reps} samples'
    )
    if skipped:
        print(f'- torchgfn not measured: {skipped}')
    print('\n## insert: one batch of 256 into a full buffer (median ms, lower is better; ratio > 1 = ours faster)\n')
    print(time_table(results, 'insert_ms', names, 2))
    print('\n## sample(256) from a full buffer (median ms; ratio > 1 = ours faster)\n')
    print(time_table(results, 'sample_ms', names, 3))
    print(
        '\n## filtering and admission (per timed push; "passed reward filter" and "rejected by distance" are '
        'counted by ours (dict))\n'
    )
    print(filter_table(results, names))
    print(
        f'\n## full fill: {FILL_BATCHES} batches of {BATCH} into an empty buffer (median of {args.fill_reps} fills, '
        f'ms per fill; ms per push in parentheses)\n'
    )
    rows = [
        [n, f"{fill[n]['median']:.1f} ({fill[n]['median'] / FILL_BATCHES:.2f})"]
        + ([fr(ratio(fill[TGFN]['median'], fill[n]['median']))] if TGFN in fill else [])
        for n in fill
    ]
    print(md_table(['contender', 'fill ms'] + (['torchgfn / contender'] if TGFN in fill else []), rows))
    if verdicts_table:
        print(f'\n## target: >= {TARGET:g}x faster insert and sample than torchgfn, per row\n')
        print(verdicts_table)
    for pr in profiles:
        print(
            f"\n## cProfile: {pr['contender']} {pr['what']}, {pr['row']} ({pr['calls']} calls; top functions by own "
            f"time, per call; numba kernels are opaque to cProfile)\n"
        )
        print(md_table(['function', 'calls', 'own ms', 'cumulative ms'], pr['table']))
    print('\nNotes:\n')
    print(
        '- ours (StatesContainer) writes each container into a preallocated ring of per-field tensors, in '
        'place (no copy of the stored items per push)'
    )
    print(
        '- torchgfn computes distances in float32 with torch.cdist (p=2 via matrix products), ours in float64 '
        'with an exact hash lookup for cutoff 0 and an early-exit scan otherwise; on these integer states both '
        'are exact, so identical inputs must give identical stored sets'
    )
    print(f"\ntotal wall time: {env_info['wall_s']:.1f} s")


# ---------------------------------------------------------------------------------------------- main
def busy_cpu_s():
    """(busy CPU seconds of the whole machine, CPU seconds of this process), or None off Linux."""
    try:
        with open('/proc/stat') as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf('SC_CLK_TCK')
    busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait (guest time is already in user)
    t = os.times()
    return busy, t.user + t.system


def other_cpu_share(start, end, wall_s: float) -> Optional[float]:
    """Share of the machine's CPU time used by other processes between two ``busy_cpu_s`` readings."""
    if start is None or end is None or wall_s <= 0:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
    return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / (wall_s * cores))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Benchmark of ding_buffer's gfn_diverse buffer against torchgfn's "
        "NormBasedDiversePrioritizedReplayBuffer (see the module docstring)"
    )
    p.add_argument('--quick', action='store_true', help='smoke run: 5 timed pushes/samples per row, 2 fills')
    p.add_argument('--reps', type=int, default=None, help='timed pushes and samples per row (default 30)')
    p.add_argument('--warmup', type=int, default=None, help='untimed pushes per row before timing (default 3)')
    p.add_argument('--fill-reps', type=int, default=None, help='timed full fills per contender (default 20)')
    p.add_argument(
        '--torch-threads',
        type=int,
        default=None,
        help="torch.set_num_threads before anything runs (default: torch's own choice). 1 avoids "
        "intra-op thread stalls when other processes compete for the cores",
    )
    p.add_argument(
        '--profile', action='store_true', help='cProfile our inserts / samples where they miss the 3x target'
    )
    p.add_argument('--out', default=DEFAULT_OUT, help=f'JSON output (default {DEFAULT_OUT})')
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 5 if args.quick else 30
    if args.warmup is None:
        args.warmup = 1 if args.quick else 3
    if args.fill_reps is None:
        args.fill_reps = 2 if args.quick else 20
    args.fill_warmup = 1
    if args.torch_threads is not None and args.torch_threads < 1:
        p.error('--torch-threads must be >= 1')
    if args.reps < 1 or args.warmup < 1 or args.fill_reps < 1:
        p.error('--reps, --warmup and --fill-reps must be >= 1')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    t0 = time.perf_counter()
    torch.manual_seed(0)  # torchgfn samples with torch.randperm
    np.random.seed(0)
    _numba.load()  # steady state: the compiled kernels are loaded before anything is timed
    skipped = torchgfn_available()
    if skipped:
        log(f'torchgfn not available ({skipped}): measuring ours (dict) only')
    envs = {} if skipped else {'sparse': make_env(SPARSE_HEIGHT), 'dense': make_env(DENSE_HEIGHT)}
    info = machine(PACKAGES)
    cpu_start = busy_cpu_s()
    results = []
    for i, row in enumerate(ROWS):
        log(f'row {i + 1}/{len(ROWS)}: {row.name}')
        results.append(bench_row(row, 1000 + i, envs.get(row.data), args))
    log('full fill')
    fill = bench_fill(envs.get(ROWS[0].data), args)
    table, verdicts = (None, [])
    if not skipped:
        table, verdicts = target_table(results)
    profiles = run_profiles(verdicts, envs, args) if args.profile and not skipped else []
    info['wall_s'] = time.perf_counter() - t0
    info['other_cpu_share'] = other_cpu_share(cpu_start, busy_cpu_s(), info['wall_s'])
    info.update(quick=args.quick, reps=args.reps, warmup=args.warmup, fill_reps=args.fill_reps)
    print_report(info, results, fill, table, profiles, skipped, args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(
            {
                'environment': info,
                'torchgfn_skipped': skipped,
                'rows': results,
                'fill_ms': fill,
                'targets': verdicts,
                'profiles': profiles,
            },
            f,
            indent=1,
        )
    log(f'wrote {args.out}; total wall time {info["wall_s"]:.1f} s')


if __name__ == '__main__':
    main()

"""Per-operation benchmark of ``ding_buffer``'s GFlowNet buffers against torchgfn's own buffers, both fed real
torchgfn containers.

What is measured
    Every row is one (buffer, container kind, capacity, operation), timed for ``ding_buffer`` and for torchgfn's
    corresponding buffer in the same process:

    * buffers: ``gfn`` FIFO vs ``ReplayBuffer``; ``gfn`` with ``prioritized_capacity`` vs
      ``ReplayBuffer(prioritized_capacity=True)``; ``gfn_diverse`` (cutoff 0, p = 1) vs
      ``NormBasedDiversePrioritizedReplayBuffer``; ``terminating_state`` vs ``TerminatingStateBuffer``;
    * containers: ``Trajectories`` sampled from ``HyperGrid(ndim=8, height=8)`` by a seeded random MLP policy
      (varying lengths, padded with the sink state; no log_probs / estimator outputs, so torchgfn's ``extend``
      pays no padding of them), and ``StatesContainer`` of their terminating states (every row terminating);
      both carry distinct float32 log-rewards (no ties);
    * capacities 1,000 and 10,000 items; pushes of ``--batch`` (64) items, samples of ``--sample`` (64) items;
    * operations: ``push (filling)``: every push from empty until the buffer is full (median over them);
      ``push (full)``: pushes into the full buffer; ``sample``: ``sample(n)`` / torchgfn's ``sample(n)`` from the
      full buffer (uniform, without replacement for both).

How
    One pool of container batches is built up front (untimed) and the same objects are handed to both contenders
    (neither mutates a pushed container; the pool's checksum is verified at the end). Per row and repeat both
    buffers are built fresh, then filled in lockstep, each push timed on its own with ``time.perf_counter`` and the
    garbage collector paused (which contender goes first alternates per call); then ``--full-pushes`` pushes into
    the full buffers and ``--samples`` samples, each after a few untimed warm-up calls. Medians are taken over all
    timed calls of all ``--repeats`` repeats; the ratio is torchgfn / ours of the medians (> 1: ours faster) and
    nothing is asserted.

Run
    python benchmarks/bench_gfn_ops.py [--quick] [--repeats N] [--batch N] [--sample N] [--only TEXT]
                                       [--capacities 1000,10000] [--torch-threads N] [--profile]

    ``--quick``: one repeat and fewer full pushes / samples (a smoke run). ``--only TEXT``: only the rows whose
    buffer name contains TEXT or whose container is TEXT; ``--capacities 1000,10000``. ``--profile``: cProfile of
    our pushes and samples in the largest-capacity rows measured, printed to stderr. On a shared machine torch's
    intra-op threads can stall for milliseconds when a core is taken (both libraries are affected); compare runs
    on a quiet machine, repeat them and take medians, or pass ``--torch-threads 1``.
"""

import argparse
import cProfile
import datetime
import gc
import io
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_naive import cpu_model, log  # noqa: E402

from ding_buffer import _numba, create_buffer  # noqa: E402

NDIM, HEIGHT = 8, 8
CAPACITIES = (1_000, 10_000)
OPS = ('push (filling)', 'push (full)', 'sample')


# ---------------------------------------------------------------------------------------------- data
def make_pool(env: Any, n_batches: int, batch: int, seed: int, log_probs: bool = True) -> Dict[str, List[Any]]:
    """``n_batches`` Trajectories batches from HyperGrid and a StatesContainer of each one's terminating states;
    log-rewards are distinct float32 values (multiples of 1/64 in [-512, 512))."""
    from gfn.containers import StatesContainer, Trajectories
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.preprocessors import KHotPreprocessor
    from gfn.samplers import Sampler
    from gfn.utils.modules import MLP

    torch.manual_seed(seed)
    pre = KHotPreprocessor(env.height, env.ndim)
    pf = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions, preprocessor=pre)
    sampler = Sampler(pf)
    rewards = (torch.randperm(1 << 16).float() - (1 << 15)) / 64
    assert n_batches * batch <= len(rewards)
    out: Dict[str, List[Any]] = {'Trajectories': [], 'StatesContainer': []}
    with torch.no_grad():
        for k in range(n_batches):
            tr = sampler.sample_trajectories(env, n=batch, save_logprobs=log_probs)
            r = rewards[k * batch : (k + 1) * batch].clone()
            tr = Trajectories(
                env=env,
                states=tr.states,
                actions=tr.actions,
                terminating_idx=tr.terminating_idx,
                is_backward=False,
                log_rewards=r,
                log_probs=tr.log_probs if log_probs else None,
            )
            out['Trajectories'].append(tr)
            term = tr.terminating_states
            out['StatesContainer'].append(
                StatesContainer(
                    env=env, states=term, is_terminating=torch.ones(batch, dtype=torch.bool), log_rewards=r.clone()
                )
            )
    return out


def checksum(pool: Dict[str, List[Any]]) -> float:
    total = 0.0
    for c in pool['Trajectories']:
        total += float(c.states.tensor.sum()) + float(c.actions.tensor.sum()) + float(c.terminating_idx.sum())
        total += float(c.log_rewards.double().sum())
    for c in pool['StatesContainer']:
        total += float(c.states.tensor.sum()) + float(c.log_rewards.double().sum()) + float(c.is_terminating.sum())
    return total


# ---------------------------------------------------------------------------------------------- contenders
class Pair(NamedTuple):
    name: str  # our buffer
    peer: str  # torchgfn's
    ours: Callable[[int], Any]  # capacity -> buffer
    theirs: Callable[[Any, int], Any]  # env, capacity -> buffer


def pairs() -> List[Pair]:
    from gfn.containers.replay_buffer import (
        NormBasedDiversePrioritizedReplayBuffer,
        ReplayBuffer,
        TerminatingStateBuffer,
    )

    return [
        Pair(
            'gfn (FIFO)',
            'ReplayBuffer',
            lambda cap: create_buffer(dict(type='gfn', replay_buffer_size=cap, seed=0)),
            lambda env, cap: ReplayBuffer(env, capacity=cap),
        ),
        Pair(
            'gfn (prioritized_capacity)',
            'ReplayBuffer(prioritized_capacity=True)',
            lambda cap: create_buffer(dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, seed=0)),
            lambda env, cap: ReplayBuffer(env, capacity=cap, prioritized_capacity=True),
        ),
        Pair(
            'gfn_diverse',
            'NormBasedDiversePrioritizedReplayBuffer',
            lambda cap: create_buffer(dict(type='gfn_diverse', replay_buffer_size=cap, seed=0)),
            lambda env, cap: NormBasedDiversePrioritizedReplayBuffer(env, capacity=cap),
        ),
        Pair(
            'terminating_state',
            'TerminatingStateBuffer',
            lambda cap: create_buffer(dict(type='terminating_state', replay_buffer_size=cap, seed=0)),
            lambda env, cap: TerminatingStateBuffer(env, capacity=cap),
        ),
    ]


def timed(fn: Callable[[], Any]) -> float:
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def run_case(
    pair: Pair,
    env: Any,
    batches: List[Any],
    cap: int,
    args,
    times: Dict[str, Dict[str, List[float]]],
    profile: bool = False,
) -> None:
    """One repeat of one (pair, kind, capacity): fill, push into full, sample; appends seconds to ``times``."""
    ours, theirs = pair.ours(cap), pair.theirs(env, cap)
    contenders = [
        ('ours', lambda x: ours.push(x), lambda: ours.sample(args.sample)),
        ('torchgfn', lambda x: theirs.add(x), lambda: theirs.sample(args.sample)),
    ]
    prof = cProfile.Profile() if profile else None
    it = iter(batches)
    k = 0

    def call(op: str, fn: Callable[[], Any], name: str) -> None:
        if prof is not None and name == 'ours':
            prof.enable()
        times[op][name].append(timed(fn))
        if prof is not None and name == 'ours':
            prof.disable()

    def both(op: str, x: Any = None) -> None:
        nonlocal k
        order = contenders if k % 2 == 0 else contenders[::-1]
        k += 1
        for name, push, sample in order:
            call(op, (lambda push=push: push(x)) if x is not None else sample, name)

    while ours.count() < cap or len(theirs) < cap:
        both('push (filling)', next(it))
    for _ in range(3):  # warm-up
        x = next(it)
        ours.push(x)
        theirs.add(x)
    for _ in range(args.full_pushes):
        both('push (full)', next(it))
    for _ in range(3):
        ours.sample(args.sample)
        theirs.sample(args.sample)
    for _ in range(args.samples):
        both('sample')
    if ours.count() != cap or len(theirs) != cap:
        raise RuntimeError(f'{pair.name}: sizes {ours.count()} / {len(theirs)} after the run, capacity {cap}')
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats('cumulative').print_stats(25)
        log(f'--- cProfile of ours, {pair.name}, cap {cap}\n{s.getvalue()}')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--quick', action='store_true', help='one repeat, fewer calls (smoke run)')
    ap.add_argument('--repeats', type=int, default=None)
    ap.add_argument('--batch', type=int, default=64, help='items per push')
    ap.add_argument('--sample', type=int, default=64, help='items per sample')
    ap.add_argument('--full-pushes', type=int, default=None)
    ap.add_argument('--samples', type=int, default=None)
    ap.add_argument(
        '--torch-threads',
        type=int,
        default=None,
        help="torch's intra-op threads (default: torch's own); 1 avoids stalls on a busy machine",
    )
    ap.add_argument('--profile', action='store_true')
    ap.add_argument('--only', default='', help='measure only the rows whose buffer or container contains this text')
    ap.add_argument('--capacities', default=','.join(map(str, CAPACITIES)), help='comma-separated capacities')
    args = ap.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.full_pushes = args.full_pushes or (15 if args.quick else 40)
    args.samples = args.samples or (30 if args.quick else 100)
    command = 'python ' + ' '.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    _numba.load()  # steady state: the compiled kernels are loaded before anything is timed

    from gfn.gym import HyperGrid

    env = HyperGrid(ndim=NDIM, height=HEIGHT, validate_modes=False)
    capacities = [int(c) for c in args.capacities.split(',')]
    per_run = -(-max(capacities) // args.batch) + 3 + args.full_pushes + 1
    t0 = time.perf_counter()
    pool = make_pool(env, per_run, args.batch, seed=0)
    before = checksum(pool)
    log(f'pool: {per_run} batches of {args.batch} built in {time.perf_counter() - t0:.1f} s')

    rows = []
    for pair in pairs():
        for kind in ('Trajectories', 'StatesContainer'):
            if args.only and args.only not in pair.name and args.only != kind:
                continue
            for cap in capacities:
                times = {op: {'ours': [], 'torchgfn': []} for op in OPS}
                t1 = time.perf_counter()
                for rep in range(args.repeats):
                    profile = args.profile and rep == 0 and cap == max(capacities)
                    run_case(pair, env, pool[kind], cap, args, times, profile)
                log(f'{pair.name:28s} {kind:16s} cap {cap:>6,}: {time.perf_counter() - t1:.1f} s')
                for op in OPS:
                    o, t = statistics.median(times[op]['ours']), statistics.median(times[op]['torchgfn'])
                    rows.append((pair, kind, cap, op, o, t, len(times[op]['ours'])))
    if checksum(pool) != before:
        raise RuntimeError('a contender modified a pushed container')

    print('## GFlowNet buffer operations: ding_buffer vs torchgfn\n')
    print(f'- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}')
    print(f'- machine: {cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}')
    import importlib.metadata as md

    print(f"- versions: torch {torch.__version__}, torchgfn {md.version('torchgfn')}")
    print(f'- command: `{command}`')
    print(
        f'- data: HyperGrid(ndim={NDIM}, height={HEIGHT}); pushes of {args.batch} items, samples of {args.sample}; '
        f'{args.repeats} repeat(s); both libraries fed the same torchgfn containers (Trajectories sampled with '
        f'their log-probs; StatesContainer of their terminating states)'
    )
    print('- ratio = torchgfn / ours of median ms (> 1: ours faster)\n')
    print('| ours | torchgfn | container | capacity | op | calls | torchgfn ms | ours ms | ratio |')
    print('|---|---|---|---:|---|---:|---:|---:|---:|')
    for pair, kind, cap, op, o, t, n in rows:
        print(
            f'| {pair.name} | {pair.peer} | {kind} | {cap:,} | {op} | {n} | {t * 1e3:.3f} | {o * 1e3:.3f} | '
            f'{t / o:.2f}x |'
        )
    log(f'total {time.perf_counter() - t0:.1f} s')


if __name__ == '__main__':
    main()

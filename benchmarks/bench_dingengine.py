"""Every DI-engine buffer type, ours against DI-engine's own, in one process, with DI-engine's native input.

What is measured
    CartPole-like transitions as DI-engine's collectors hand them over -- a list of dicts of numpy arrays and
    Python scalars (obs / next_obs f32[4], action, reward, done, collect_iter) -- in buffers of capacity
    ``--capacity`` (default 1e5) filled to capacity before anything is timed. For each type, the operations a
    DI-engine serial pipeline calls:

    * ``naive``, ``advanced``, ``deque`` (with ``priority`` and IS weights, and uniform): ``push`` of a list of 64
      transitions (transitions/s); ``sample(128, train_iter)`` (batches/s); for the prioritized ones one learner
      step, ``sample(128)`` + ``update(priority_info)`` with the dict a ``BaseLearner`` builds (steps/s);
    * ``elastic``: ``sample(128)`` from a window of the newest 10% (``set_buffer_size``);
    * ``sequence``: ``sample(16, 50, train_iter)`` (batches of 16 runs of 50).

    Both sides get the same compiled config (DI-engine's class defaults merged with the section) and list
    storage, which is what a DI-engine pipeline uses. Every push hands over fresh dicts (shallow copies, made
    inside the timed call for both sides), as a collector does: DI-engine writes its ids into pushed dicts.
    DI-engine's buffers need DI-engine with its dependencies
    (``pip install di-engine==0.5.3``, best in a scratch venv); without them the script says so and stops.

How
    Each measurement calls the operation for at least ``--target-s`` seconds (and 5 calls) with the garbage
    collector paused; a rate is calls * items / elapsed. Contenders alternate within a round (the first one
    rotates); the table reports the median over ``--rounds`` rounds and the ratio of medians. Seeds are fixed
    (``np.random.seed`` for DI-engine, which samples with the global RNG). No timing is asserted.

Run
    python benchmarks/bench_dingengine.py [--capacity N] [--rounds R] [--target-s S]
"""

import argparse
import contextlib
import datetime
import gc
import io
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from ding_buffer import _numba, create_buffer

PUSH = 64
BATCH = 128
RUNS, RUN_LEN = 16, 50


class NullTB:
    """A tb_logger that drops everything (both sides get one; DI-engine's deque requires it)."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def transitions(rng: np.random.Generator, n: int, start: int = 0) -> List[Dict[str, Any]]:
    return [
        {
            'obs': rng.standard_normal(4, dtype=np.float32),
            'next_obs': rng.standard_normal(4, dtype=np.float32),
            'action': int(rng.integers(2)),
            'reward': 1.0,
            'done': bool(rng.random() < 0.05),
            'collect_iter': (start + k) // 100,
        }
        for k in range(n)
    ]


def dingengine_classes() -> Optional[Dict[str, Any]]:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            from ding.data.buffer.deque_buffer_wrapper import DequeBufferWrapper
            from ding.utils import deep_merge_dicts
            from ding.worker.replay_buffer import AdvancedReplayBuffer, NaiveReplayBuffer
            from ding.worker.replay_buffer.naive_buffer import ElasticReplayBuffer, SequenceReplayBuffer
    except Exception as e:  # noqa: BLE001 -- any import failure means: no peer
        print(
            f'DI-engine buffers are not importable ({type(e).__name__}: {e}); install di-engine==0.5.3 with its '
            f'dependencies (a scratch venv) to run this benchmark',
            file=sys.stderr,
        )
        return None
    return dict(
        naive=NaiveReplayBuffer,
        advanced=AdvancedReplayBuffer,
        elastic=ElasticReplayBuffer,
        sequence=SequenceReplayBuffer,
        deque=DequeBufferWrapper,
        merge=deep_merge_dicts,
    )


# Each case: buffer type, the user's section, and the operations timed on it.
CASES = {
    'naive': ('naive', {}, ('push', 'sample')),
    'advanced': ('advanced', {}, ('push', 'sample', 'step')),
    'deque (priority, IS)': ('deque', dict(priority=True, priority_IS_weight=True), ('push', 'sample', 'step')),
    'deque (uniform)': ('deque', {}, ('push', 'sample')),
    'elastic (newest 10%)': ('elastic', {}, ('sample',)),
    'sequence': ('sequence', {}, ('runs',)),
}
LABELS = {
    'push': f'push {PUSH} (transitions/s)',
    'sample': f'sample {BATCH} (batches/s)',
    'step': f'sample {BATCH} + update (steps/s)',
    'runs': f'sample {RUNS} runs of {RUN_LEN} (batches/s)',
}


def section(classes: Dict[str, Any], buffer_type: str, user: Dict[str, Any], capacity: int) -> Any:
    """DI-engine's compiled section: its class defaults, then the type and the user's keys."""
    user = dict(user, replay_buffer_size=capacity)
    if buffer_type == 'elastic':
        user['set_buffer_size'] = lambda envstep: capacity // 10
    cfg = classes['merge'](classes[buffer_type].default_config(), dict(user, type=buffer_type))
    if buffer_type in ('sequence', 'episode'):
        cfg.type = buffer_type  # DI-engine's class defaults say 'naive' for these
    return cfg


def build(side: str, classes: Dict[str, Any], cfg: Any, workdir: str) -> Any:
    if side == 'ours':
        return create_buffer(cfg, tb_logger=NullTB(), exp_name=workdir, instance_name='ours')
    cls = classes[cfg.type]
    return cls(cfg, tb_logger=NullTB(), exp_name=workdir, instance_name='theirs')


def operation(name: str, buf: Any, is_deque: bool, pool: List[List[Dict[str, Any]]]) -> Callable[[int], int]:
    """A callable(i) doing the ``i``-th call of operation ``name``; returns the items it counts."""
    if name == 'push':
        # fresh dicts every push, as a collector's are (DI-engine writes its ids into pushed dicts, so a dict
        # pushed twice corrupts its buffer); both sides pay the 64 shallow copies
        return lambda i: (buf.push([dict(d) for d in pool[i % len(pool)]], i), PUSH)[1]
    if name == 'sample':
        return lambda i: (buf.sample(BATCH, i), 1)[1]
    if name == 'runs':
        return lambda i: (buf.sample(RUNS, RUN_LEN, i), 1)[1]
    prio = np.abs(np.random.default_rng(0).standard_normal(BATCH)).tolist()

    def step(i: int) -> int:
        data = buf.sample(BATCH, i)
        if is_deque:
            buf.update({'priority': prio})
        else:  # BaseLearner's priority_info
            buf.update(
                {
                    'priority': prio,
                    'replay_buffer_idx': [d.get('replay_buffer_idx') for d in data],
                    'replay_unique_id': [d.get('replay_unique_id') for d in data],
                }
            )
        return 1

    return step


def rate(fn: Callable[[int], int], target_s: float) -> float:
    gc.disable()
    try:
        n, items, start = 0, 0, time.perf_counter()
        while True:
            items += fn(n)
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= target_s and n >= 5:
                return items / elapsed
    finally:
        gc.enable()


def human(x: float) -> str:
    for unit, div in (('M', 1e6), ('k', 1e3)):
        if x >= div:
            return f'{x / div:.3g} {unit}'
    return f'{x:.3g}'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--capacity', type=int, default=100_000)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--target-s', type=float, default=0.5)
    args = parser.parse_args()
    classes = dingengine_classes()
    if classes is None:
        return 2
    for name in ('ding_buffer', 'b_logger', 'ours_logger', 'theirs_logger', ''):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    _numba.load()  # steady state: the compiled kernels are loaded before anything is timed
    fill = transitions(rng, args.capacity)
    pool = [transitions(rng, PUSH, k * PUSH) for k in range(64)]
    results: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    # DI-engine writes its logs under './{exp_name}', also for an absolute exp_name: run inside the temp dir with
    # relative names so nothing lands in the caller's directory
    with tempfile.TemporaryDirectory() as workdir, contextlib.chdir(workdir), contextlib.redirect_stdout(io.StringIO()):
        for case, (buffer_type, user, ops) in CASES.items():
            cfg = section(classes, buffer_type, user, args.capacity)
            bufs, pools = {}, {}
            for side in ('ours', 'DI-engine'):  # each side its own dicts: DI-engine writes keys into pushed ones
                np.random.seed(0)
                bufs[side] = build(side, classes, cfg, side)
                bufs[side].push([dict(d) for d in fill], 0)
                pools[side] = [[dict(d) for d in batch] for batch in pool]
            for op in ops:
                per = results.setdefault(case, {}).setdefault(op, {'ours': [], 'DI-engine': []})
                for r in range(args.rounds):
                    order = ['ours', 'DI-engine'] if r % 2 == 0 else ['DI-engine', 'ours']
                    for side in order:
                        fn = operation(op, bufs[side], buffer_type == 'deque', pools[side])
                        per[side].append(rate(fn, args.target_s))
                print(f'{case} {op}', file=sys.stderr)
            for buf in bufs.values():
                if hasattr(buf, 'close'):
                    buf.close()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
    print(f'### ding_buffer vs DI-engine 0.5.3, capacity {args.capacity:,}, measured {stamp}\n')
    print(
        f'{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, '
        f'torch {torch.__version__}, numpy {np.__version__}; `python benchmarks/bench_dingengine.py '
        f'--capacity {args.capacity} --rounds {args.rounds} --target-s {args.target_s}`\n'
    )
    print('| type | operation | ding_buffer | DI-engine | ratio |')
    print('|---|---|---:|---:|---:|')
    for case, per_op in results.items():
        for op, sides in per_op.items():
            ours, theirs = statistics.median(sides['ours']), statistics.median(sides['DI-engine'])
            print(f'| {case} | {LABELS[op]} | {human(ours)} | {human(theirs)} | {ours / theirs:.2f}x |')
    return 0


if __name__ == '__main__':
    sys.exit(main())

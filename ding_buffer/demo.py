"""``ding-buffer demo``: a tour of the buffers -- build them from configs, push CartPole-like transitions and
episodes, sample, save atomically, reload into a fresh buffer and check the round trip. Nothing is written to the
working directory unless ``--out`` says so.
"""
import argparse
import logging
import os
import tempfile
import time
from typing import List

import numpy as np
import torch

from . import create_buffer


def _transitions(rng: np.random.Generator, n: int, start: int = 0) -> List[dict]:
    return [
        dict(
            obs=rng.standard_normal(4).astype(np.float32),
            action=int(rng.integers(2)),
            reward=1.0,
            next_obs=rng.standard_normal(4).astype(np.float32),
            done=bool(i % 50 == 49),
            step=start + i,
        ) for i in range(n)
    ]


def _demo_naive(storage: str, out_dir: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = dict(type='naive', replay_buffer_size=1000, seed=seed, storage=dict(type=storage))
    with create_buffer(cfg, instance_name=f'demo_{storage}') as buffer:
        t0 = time.perf_counter()
        buffer.push(_transitions(rng, 1500))
        print(f"[naive/{storage}] pushed 1500 transitions into capacity 1000: count={buffer.count()} "
              f"push_count={buffer.push_count} ({time.perf_counter() - t0:.3f}s)")
        batch = buffer.sample(256, cur_learner_iter=0)
        steps = batch['step'] if storage == 'tensor' else torch.tensor([t['step'] for t in batch])
        print(f"[naive/{storage}] sampled 256: steps in [{int(steps.min())}, {int(steps.max())}] "
              f"(only the newest 1000 of 1500 survive), {len(set(steps.tolist()))} distinct")
        if storage == 'tensor':
            print(f"[naive/{storage}] batch fields: " +
                  ', '.join(f"{k}{tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}" for k, v in batch.items()))
        newest = buffer.sample(8, sample_range=slice(-10, None))
        newest_steps = newest['step'].tolist() if storage == 'tensor' else [t['step'] for t in newest]
        print(f"[naive/{storage}] sample_range=slice(-10, None) -> steps {sorted(newest_steps)}")
        path = os.path.join(out_dir, f'naive_{storage}.pt')
        buffer.save_data(path)
        print(f"[naive/{storage}] saved to {path} ({os.path.getsize(path) / 1e6:.2f} MB, atomic write)")
        expected = buffer.sample(32)
        reloaded = create_buffer(cfg, instance_name=f'demo_{storage}_reloaded')
        # list storage keeps arbitrary Python objects, so its file needs an explicit allow_pickle=True
        reloaded.load_data(path, allow_pickle=(storage == 'list'))
        got = reloaded.sample(32)  # the file holds the RNG state from before `expected` was drawn
        same = _same(expected, got)
        print(f"[naive/{storage}] reloaded: count={reloaded.count()} push_count={reloaded.push_count}; "
              f"next sample identical to the original's: {same}")
        reloaded.close()
        if not same or reloaded.count() != buffer.count():
            raise SystemExit(f"demo failed: round trip mismatch for {storage} storage")


def _demo_episode(out_dir: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = dict(type='episode', replay_buffer_size=100, max_transitions=2000, seed=seed, storage=dict(type='tensor'))
    with create_buffer(cfg, instance_name='demo_episode') as buffer:
        lengths = rng.integers(5, 120, size=40)
        for ep, length in enumerate(lengths):
            buffer.push(dict(obs=torch.randn(int(length), 4), reward=torch.ones(int(length)),
                             episode=torch.full((int(length), ), ep)))
        print(f"[episode/tensor] pushed 40 episodes ({int(lengths.sum())} transitions) into max_transitions=2000: "
              f"{buffer.count()} episodes, {buffer.transition_count} transitions kept (oldest whole episodes evicted)")
        windows = buffer.sample(64, unroll_len=16, pad=True, replace=True)
        contiguous = bool((windows['episode'] == windows['episode'][:, :1]).all())
        print(f"[episode/tensor] sampled 64 windows of 16 steps: obs{tuple(windows['obs'].shape)}, "
              f"padded steps={int((~windows['mask']).sum())}, each window within one episode: {contiguous}")
        path = os.path.join(out_dir, 'episode_tensor.pt')
        buffer.save_data(path)
        reloaded = create_buffer(cfg, instance_name='demo_episode_reloaded')
        reloaded.load_data(path)
        print(f"[episode/tensor] saved and reloaded: episode lengths equal: {reloaded.episode_len == buffer.episode_len}")
        reloaded.close()


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return a == b


def demo(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        out_dir, tmp = args.out, None
    else:
        tmp = tempfile.TemporaryDirectory(prefix='ding_buffer_demo_')
        out_dir = tmp.name
    try:
        for storage in ('list', 'tensor'):
            _demo_naive(storage, out_dir, args.seed)
        _demo_episode(out_dir, args.seed)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print("demo finished: push, sample, save and reload work on list and tensor storage")
    return 0

"""``ding-buffer demo``: a tour of every buffer type in ``BUFFER_REGISTRY`` -- build each from a config, push
CartPole-like transitions, episodes or GFlowNet terminating states, sample, and print 1-3 lines per type showing
its defining behaviour with numbers computed on the spot. Every claim is checked: a violated one stops the demo
with ``SystemExit('demo failed: ...')``. The naive and episode buffers also save atomically, reload into a fresh
buffer and check the round trip. Nothing is written to the working directory unless ``--out`` says so.

One function per buffer type, driven by ``DEMOS``; the GFlowNet buffers are in ``demo_gfn``. The ``distributed``
wrapper needs several processes and is shown by the training jobs instead.
"""

import argparse
import contextlib
import functools
import logging
import os
import tempfile
import time
from typing import Any, Callable, List, Tuple

import numpy as np
import torch

from . import create_buffer
from .base import BUFFER_REGISTRY
from .demo_gfn import check, demo_gfn, demo_gfn_diverse, demo_terminating_state


def _transitions(rng: np.random.Generator, n: int, start: int = 0) -> List[dict]:
    return [
        dict(
            obs=rng.standard_normal(4).astype(np.float32),
            action=int(rng.integers(2)),
            reward=1.0,
            next_obs=rng.standard_normal(4).astype(np.float32),
            done=bool(i % 50 == 49),
            step=start + i,
        )
        for i in range(n)
    ]


def _episodes(buffer: Any, lengths: np.ndarray) -> None:
    for ep, length in enumerate(lengths.tolist()):
        buffer.push(dict(obs=torch.randn(length, 4), reward=torch.ones(length), episode=torch.full((length,), ep)))


def _demo_naive(storage: str, out_dir: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = dict(type='naive', replay_buffer_size=1000, seed=seed, storage=dict(type=storage))
    with create_buffer(cfg, instance_name=f'demo_{storage}') as buffer:
        t0 = time.perf_counter()
        buffer.push(_transitions(rng, 1500))
        print(
            f"[naive/{storage}] pushed 1500 transitions into capacity 1000: count={buffer.count()} "
            f"push_count={buffer.push_count} ({time.perf_counter() - t0:.3f}s)"
        )
        batch = buffer.sample(256, cur_learner_iter=0)
        steps = batch['step'] if storage == 'tensor' else torch.tensor([t['step'] for t in batch])
        print(
            f"[naive/{storage}] sampled 256: steps in [{int(steps.min())}, {int(steps.max())}] "
            f"(only the newest 1000 of 1500 survive), {len(set(steps.tolist()))} distinct"
        )
        check(
            buffer.count() == 1000 and int(steps.min()) >= 500, f"naive/{storage} kept items older than the newest 1000"
        )
        if storage == 'tensor':
            print(
                f"[naive/{storage}] batch fields: "
                + ', '.join(f"{k}{tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}" for k, v in batch.items())
            )
        newest = buffer.sample(8, sample_range=slice(-10, None))
        newest_steps = newest['step'].tolist() if storage == 'tensor' else [t['step'] for t in newest]
        print(f"[naive/{storage}] sample_range=slice(-10, None) -> steps {sorted(newest_steps)}")
        check(min(newest_steps) >= 1490, f"naive/{storage} sample_range=slice(-10, None) drew older items")
        path = os.path.join(out_dir, f'naive_{storage}.pt')
        buffer.save_data(path)
        print(f"[naive/{storage}] saved to {path} ({os.path.getsize(path) / 1e6:.2f} MB, atomic write)")
        expected = buffer.sample(32)
        reloaded = create_buffer(cfg, instance_name=f'demo_{storage}_reloaded')
        # list storage keeps arbitrary Python objects, so its file needs an explicit allow_pickle=True
        reloaded.load_data(path, allow_pickle=(storage == 'list'))
        got = reloaded.sample(32)  # the file holds the RNG state from before `expected` was drawn
        same = _same(expected, got)
        print(
            f"[naive/{storage}] reloaded: count={reloaded.count()} push_count={reloaded.push_count}; "
            f"next sample identical to the original's: {same}"
        )
        reloaded.close()
        check(same and reloaded.count() == buffer.count(), f"round trip mismatch for {storage} storage")


def _demo_episode(out_dir: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cfg = dict(type='episode', replay_buffer_size=100, max_transitions=2000, seed=seed, storage=dict(type='tensor'))
    with create_buffer(cfg, instance_name='demo_episode') as buffer:
        lengths = rng.integers(5, 120, size=40)
        _episodes(buffer, lengths)
        print(
            f"[episode/tensor] pushed 40 episodes ({int(lengths.sum())} transitions) into max_transitions=2000: "
            f"{buffer.count()} episodes, {buffer.transition_count} transitions kept (oldest whole episodes evicted)"
        )
        check(buffer.transition_count <= 2000, "episode buffer holds more than max_transitions")
        windows = buffer.sample(64, unroll_len=16, pad=True, replace=True)
        # padded steps (mask False) hold zeros, not the episode's number
        contiguous = bool(((windows['episode'] == windows['episode'][:, :1]) | ~windows['mask']).all())
        print(
            f"[episode/tensor] sampled 64 windows of 16 steps: obs{tuple(windows['obs'].shape)}, "
            f"padded steps={int((~windows['mask']).sum())}, each window within one episode: {contiguous}"
        )
        check(contiguous, "an episode window crossed an episode boundary")
        path = os.path.join(out_dir, 'episode_tensor.pt')
        buffer.save_data(path)
        reloaded = create_buffer(cfg, instance_name='demo_episode_reloaded')
        reloaded.load_data(path)
        same = reloaded.episode_len == buffer.episode_len
        print(f"[episode/tensor] saved and reloaded: episode lengths equal: {same}")
        reloaded.close()
        check(same, "round trip mismatch for the episode buffer")


def _set_priority(buffer: Any, batch: dict, priority: torch.Tensor) -> dict:
    """``buffer.update`` of the items of a sampled ``batch`` with ``priority``; returns what it reports."""
    ids = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx')}
    return buffer.update(dict(ids, priority=priority))


def _demo_advanced(out_dir: str, seed: int) -> None:
    """Raise the priority of the items one sample drew, then check how often later samples draw them and the
    importance-sampling weights they carry; then ``max_use=2`` (``_demo_max_use``)."""
    n, hot_p, alpha, beta, draws = 1000, 10.0, 0.6, 0.4, 100
    cfg = dict(
        type='advanced',
        replay_buffer_size=n,
        alpha=alpha,
        beta=beta,
        anneal_step=0,
        seed=seed,
        storage=dict(type='tensor'),
    )
    with create_buffer(cfg, instance_name='demo_advanced') as buffer:
        buffer.push(_transitions(np.random.default_rng(seed), n))
        first = buffer.sample(64)
        hot = torch.unique(first['replay_unique_id'])  # the items drawn get a high priority (like a large TD error)
        result = _set_priority(buffer, first, torch.full((len(first['replay_unique_id']),), hot_p))
        batches = [buffer.sample(256) for _ in range(draws)]
        ids = torch.cat([b['replay_unique_id'] for b in batches])
        weights = torch.cat([b['IS'] for b in batches]).double()
        k = len(hot)
        share = float(torch.isin(ids, hot).double().mean())
        expected = k * hot_p**alpha / (k * hot_p**alpha + (n - k))
        tol = 5 * (expected * (1 - expected) / len(ids)) ** 0.5
        print(
            f"[advanced] {n} items at priority 1, update() set priority {hot_p:g} on {k} of them "
            f"({result['updated']} updated, {result['stale']} stale); {len(ids)} draws hit those {k} "
            f"{share:.1%} of the time (expected k*{hot_p:g}^{alpha} / sum = {expected:.1%}; uniform {k / n:.1%})"
        )
        check(abs(share - expected) <= tol, f"advanced: high-priority share {share:.4f} != expected {expected:.4f}")
        is_hot = (hot_p / 1.0) ** (-alpha * beta)  # (leaf / min leaf) ** -beta with leaf = p ** alpha
        lo, hi = float(weights.min()), float(weights.max())
        print(
            f"[advanced] IS weights in [{lo:.3f}, {hi:.3f}] (expected (p^alpha / min p^alpha)^-beta: "
            f"{is_hot:.3f} for priority {hot_p:g}, 1.000 for priority 1; beta={beta})"
        )
        check(abs(lo - is_hot) < 1e-3 and abs(hi - 1.0) < 1e-3, f"advanced: IS weights [{lo}, {hi}] != [{is_hot}, 1]")
    _demo_max_use(seed)


def _demo_max_use(seed: int) -> None:
    """``max_use=2`` on an advanced buffer: items drawn twice leave, counted in ``removed_by_use``."""
    cfg = dict(type='advanced', replay_buffer_size=100, max_use=2, seed=seed, storage=dict(type='tensor'))
    with create_buffer(cfg, instance_name='demo_advanced_max_use') as buffer:
        buffer.push(_transitions(np.random.default_rng(seed), 100))
        drawn = torch.cat([buffer.sample(16)['replay_unique_id'] for _ in range(5)])
        _, uses = torch.unique(drawn, return_counts=True)
        spent = int((uses >= 2).sum())
        removed = buffer.stats()['removed_by_use']
        print(
            f"[advanced] max_use=2: 5 samples of 16 drew {len(uses)} distinct items, {spent} of them twice or more "
            f"-> removed_by_use={removed}, count 100 -> {buffer.count()}"
        )
        check(removed == spent and buffer.count() == 100 - spent, "advanced: max_use eviction miscounted")


def _demo_elastic(out_dir: str, seed: int) -> None:
    schedule = lambda envstep: 100 if envstep < 10000 else 500  # noqa: E731 (the window size at each envstep)
    cfg = dict(
        type='elastic', replay_buffer_size=1000, set_buffer_size=schedule, seed=seed, storage=dict(type='tensor')
    )
    with create_buffer(cfg, instance_name='demo_elastic') as buffer:
        buffer.push(_transitions(np.random.default_rng(seed), 1000))
        seen = []
        for envstep in (0, 20000):
            buffer.update(envstep)
            steps = buffer.sample(64)['step']
            seen.append((envstep, buffer.current_buffer_size, int(steps.min())))
        print(
            "[elastic] 1000 items stored, window from set_buffer_size(envstep): "
            + '; '.join(f"envstep {e}: window {w}, sampled steps >= {m}" for e, w, m in seen)
            + f" (count stays {buffer.count()})"
        )
        windows_ok = [w for _, w, _ in seen] == [100, 500] and all(m >= 1000 - w for _, w, m in seen)
        check(windows_ok and buffer.count() == 1000, "elastic: sampling left the window of the newest items")


def _demo_sequence(out_dir: str, seed: int) -> None:
    cfg = dict(type='sequence', replay_buffer_size=500, seed=seed, storage=dict(type='tensor'))
    with create_buffer(cfg, instance_name='demo_sequence') as buffer:
        buffer.push(_transitions(np.random.default_rng(seed), 600))
        runs = buffer.sample(8, 10)
        steps = runs['step']
        consecutive = bool((steps[:, 1:] - steps[:, :-1] == 1).all())
        print(
            f"[sequence] 600 pushed into 500; sample(8, 10) -> obs{tuple(runs['obs'].shape)}, run starts "
            f"{sorted(steps[:, 0].tolist())}, every run 10 consecutive steps: {consecutive}"
        )
        check(consecutive and int(steps.min()) >= 100, "sequence: a run is not consecutive or reaches evicted items")


def _demo_deque(out_dir: str, seed: int) -> None:
    cfg = dict(type='deque', replay_buffer_size=100, max_use=1, seed=seed, storage=dict(type='list'))
    with create_buffer(cfg, instance_name='demo_deque') as buffer:
        items = _transitions(np.random.default_rng(seed), 150)
        buffer.push(items, cur_collector_envstep=150)
        full = buffer.count()
        batch = buffer.sample(32, train_iter=0)
        steps = [t['step'] for t in batch]
        left = buffer.count()
        print(
            f"[deque] DI-engine's DequeBufferWrapper API: pushed 150 into 100 (FIFO: steps "
            f"{min(steps)}..{max(steps)} drawn, the oldest 50 gone); sample(32, train_iter) -> {len(batch)} "
            f"distinct pushed dicts with keys {sorted(batch[0])}; max_use=1: count {full} -> {left}"
        )
        check(
            full == 100
            and min(steps) >= 50
            and len(set(steps)) == 32
            and sorted(batch[0]) == sorted(items[0])
            and left == 68,
            "deque: FIFO, distinct draws or max_use eviction broken",
        )


def _demo_prioritized_episode(out_dir: str, seed: int) -> None:
    t, alpha, eta, hot_p = 8, 0.9, 0.9, 10.0
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=100,
        max_transitions=2000,
        seed=seed,
        sampler=dict(type='prioritized', unroll_len=t, alpha=alpha, beta=0.6, eta=eta, eps=0.0),
    )
    lengths = np.random.default_rng(seed).integers(t, 4 * t, size=20)
    with create_buffer(cfg, instance_name='demo_prioritized_episode') as buffer:
        _episodes(buffer, lengths)
        first = buffer.sample(64)
        # per-step priorities: hot_p on the steps of the drawn windows of episodes 0 and 1, 1 elsewhere
        hot_steps = (first['episode'] <= 1) & first['mask']
        _set_priority(buffer, first, torch.where(hot_steps, hot_p, 1.0))
        step_p = [np.ones(int(n)) for n in lengths]  # what we set, to predict the window priorities
        for ep, start in zip(first['episode'][:, 0].tolist(), first['start'].tolist()):
            if ep <= 1:
                step_p[ep][start : start + t] = hot_p
        leaf = [
            np.array(
                [(eta * p[s : s + t].max() + (1 - eta) * p[s : s + t].mean()) ** alpha for s in range(len(p) - t + 1)]
            )
            for p in step_p
        ]
        expected = (leaf[0].sum() + leaf[1].sum()) / sum(x.sum() for x in leaf)
        eps_of = torch.cat([buffer.sample(256)['episode'][:, 0] for _ in range(40)])
        share = float((eps_of <= 1).double().mean())
        tol = 5 * (expected * (1 - expected) / len(eps_of)) ** 0.5
        print(
            f"[prioritized_episode] 20 episodes, windows of {t} steps; per-step priority {hot_p:g} set on the drawn "
            f"windows of episodes 0-1 -> window p = eta*max + (1-eta)*mean; {len(eps_of)} draws: episodes 0-1 "
            f"{share:.1%} (expected {expected:.1%}, by transitions {lengths[:2].sum() / lengths.sum():.1%})"
        )
        check(abs(share - expected) <= tol, f"prioritized_episode: share {share:.4f} != expected {expected:.4f}")


def _demo_chunk(out_dir: str, seed: int) -> None:
    fpc = 3
    cfg = dict(type='chunk', fragments_per_chunk=fpc, max_chunks=10, max_reuse=1, max_staleness=1, seed=seed)
    with create_buffer(cfg, instance_name='demo_chunk') as buffer:
        buffer.update_model_version(1)
        for fid in range(6):  # two workers (environments), each 6 fragments of 4 steps from model version 1
            buffer.push(
                [dict(worker=f'env{w}', fid=fid, model_version=1, data=dict(obs=torch.randn(4, 3))) for w in range(2)]
            )
        made = buffer.count()
        buffer.push(dict(worker='env2', fid=0, model_version=-1, data=dict(obs=torch.randn(4, 3))))  # already stale
        dropped = buffer.stats()['fragments_dropped']
        batch = buffer.sample(2 * fpc)
        runs = [[(x['worker'], x['fid']) for x in batch[i : i + fpc]] for i in range(0, len(batch), fpc)]
        whole = all(
            len({w for w, _ in r}) == 1 and [f for _, f in r] == list(range(r[0][1], r[0][1] + fpc)) for r in runs
        )
        left = buffer.count()
        drawn = ', '.join(f"{r[0][0]} fids {r[0][1]}..{r[-1][1]}" for r in runs)
        print(
            f"[chunk] 2 workers x 6 fragments -> {made} chunks of {fpc}; a fragment 2 versions old dropped at its "
            f"queue ({dropped}); sample({2 * fpc}) -> 2 whole chunks ({drawn}); max_reuse=1: {made} -> {left} chunks"
        )
        moved = buffer.update_model_version(3)['chunks_dropped']
        print(
            f"[chunk] model version 1 -> 3 with max_staleness=1: {moved} stale chunks leave, "
            f"{buffer.stats()['payloads']} payloads kept (the last sample's, until the next one)"
        )
        check(
            made == 4
            and dropped == 1
            and whole
            and left == 2
            and moved == 2
            and buffer.count() == 0
            and buffer.stats()['payloads'] == 2 * fpc,
            "chunk: fragments, chunks or payloads miscounted",
        )


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return a == b


def _demo_mixture(out_dir: str, seed: int) -> None:
    cfg = dict(
        type='mixture',
        seed=seed,
        weights=dict(offline=0.25, online=0.75),
        members=dict(
            offline=dict(type='naive', replay_buffer_size=2000, seed=seed, storage=dict(type='tensor')),
            online=dict(type='advanced', replay_buffer_size=200, seed=seed, storage=dict(type='tensor')),
        ),
    )
    with create_buffer(cfg, instance_name='demo_mixture') as buffer:
        rng = np.random.default_rng(seed)
        buffer.push(_transitions(rng, 2000), member='offline')
        buffer.push(_transitions(rng, 300, start=10000))  # online: the newest 200 stay
        batch = buffer.sample(64)
        member = batch['mixture_member']
        online = member == buffer.member_names.index('online')
        from_offline = bool((batch['step'][~online] < 10000).all())
        updated = buffer.update(
            {k: batch[k][online] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')}
            | {'priority': torch.ones(48)}
        )
        print(
            f"[mixture] offline 2000 + online 300 pushed into 200 (counts {buffer.members['offline'].count()}, "
            f"{buffer.members['online'].count()}); sample(64) with weights 0.25 / 0.75 -> {int((~online).sum())} "
            f"offline, {int(online.sum())} online, each from its member: {from_offline}; update routed to the "
            f"prioritized member: {updated}"
        )
        ok = int(online.sum()) == 48 and from_offline and updated == {'updated': 48, 'stale': 0}
        check(ok and buffer.count() == 2200, "mixture: a sample's split or an update's routing is wrong")


# (buffer type, function(out_dir, seed)) in tour order; only the naive and episode parts write to out_dir.
DEMOS: List[Tuple[str, Callable[[str, int], None]]] = [
    ('naive', functools.partial(_demo_naive, 'list')),
    ('naive', functools.partial(_demo_naive, 'tensor')),
    ('episode', _demo_episode),
    ('advanced', _demo_advanced),
    ('elastic', _demo_elastic),
    ('sequence', _demo_sequence),
    ('deque', _demo_deque),
    ('prioritized_episode', _demo_prioritized_episode),
    ('gfn', demo_gfn),
    ('gfn_diverse', demo_gfn_diverse),
    ('terminating_state', demo_terminating_state),
    ('chunk', _demo_chunk),
    ('mixture', _demo_mixture),
]


def demo(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    t0 = time.perf_counter()
    toured = list(dict.fromkeys(name for name, _ in DEMOS))
    print(
        f"ding-buffer demo: a tour of {len(toured)} buffer types ({', '.join(toured)}); every claim printed is "
        f"checked, a false one stops the demo"
    )
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    where = contextlib.nullcontext(args.out) if args.out else tempfile.TemporaryDirectory(prefix='ding_buffer_demo_')
    with where as out_dir:  # a temporary directory is removed afterwards, failed or not
        for _, run in DEMOS:
            run(out_dir, args.seed)
    missing = sorted(set(BUFFER_REGISTRY) - set(toured) - {'distributed'})
    print(
        f"demo finished in {time.perf_counter() - t0:.1f}s: {len(toured)} buffer types toured"
        + (f" (not toured: {', '.join(missing)})" if missing else " (every registered type)")
        + "; push, sample, save and reload work on list and tensor storage; the 'distributed' wrapper (a manager "
        "process serving workers over torch / MPI / Ray) is shown by the training jobs: ding-buffer train "
        "config/cartpole_apex.py or config/hypergrid_tb_distributed.py --nproc 4"
    )
    return 0

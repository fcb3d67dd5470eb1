"""The GFlowNet part of ``ding-buffer demo`` (``gfn``, ``gfn_diverse``, ``terminating_state``): plain dict batches
of terminating states and log-rewards, so torchgfn is not needed. Each function prints 1-3 lines and checks what
they claim (``check`` stops the demo with ``SystemExit('demo failed: ...')``)."""

import torch

from . import create_buffer


def check(ok: bool, what: str) -> None:
    """Stop the demo when a printed claim does not hold."""
    if not ok:
        raise SystemExit(f"demo failed: {what}")


def _grid_states(g: torch.Generator, n: int) -> torch.Tensor:
    """Terminating states of a 16 x 16 HyperGrid (float coordinates)."""
    return torch.randint(0, 16, (n, 2), generator=g).float()


def demo_gfn(out_dir: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    cap, n_batches, per = 100, 10, 50
    cfg = dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, prioritized_sampling=True, seed=seed)
    with create_buffer(cfg, instance_name='demo_gfn') as buffer:
        pushed = []
        for b in range(n_batches):
            r = torch.randn(per, generator=g, dtype=torch.float64)
            buffer.push(dict(state=_grid_states(g, per), log_reward=r))
            pushed.append(r)
            if b == 1:
                min_full = buffer.stats()['log_reward_min']
        pushed = torch.cat(pushed)
        s = buffer.stats()
        best = torch.sort(pushed, descending=True).values[:cap]
        print(
            f"[gfn] keep-best (prioritized_capacity): {len(pushed)} (state, log_reward) items in {n_batches} batches "
            f"into capacity {cap}: count={buffer.count()}, admitted={s['admitted']} (the others were below the kept "
            f"minimum), evicted={s['evicted']}; min kept log-reward {min_full:.3f} when first full -> "
            f"{s['log_reward_min']:.3f} = the {cap}th best of all pushed"
        )
        kept = torch.sort(torch.as_tensor(buffer.log_rewards()), descending=True).values
        check(
            buffer.count() == cap and torch.equal(kept, best) and s['log_reward_min'] > min_full,
            "gfn: the kept items are not the best log-rewards",
        )
        n = 20000
        out = buffer.sample(n, replace=True)
        p = torch.softmax(best, 0)
        top = float((out['log_reward'] == best[0]).double().mean())
        mean, expected_mean = float(out['log_reward'].mean()), float((p * best).sum())
        print(
            f"[gfn] prioritized_sampling, {n} draws: the best item drawn {top:.2%} (softmax(log_reward) share "
            f"{float(p[0]):.2%}, uniform {1 / cap:.2%}); mean sampled log-reward {mean:.3f} (expected "
            f"{expected_mean:.3f}, uniform {float(best.mean()):.3f})"
        )
        sd = float(best.std()) / n**0.5
        check(
            abs(top - float(p[0])) <= 5 * (float(p[0]) / n) ** 0.5 and abs(mean - expected_mean) <= 5 * sd,
            "gfn: reward-proportional sampling does not follow softmax(log_reward)",
        )


def demo_gfn_diverse(out_dir: str, seed: int) -> None:
    cap, cutoff = 40, 0.5
    cfg = dict(type='gfn_diverse', replay_buffer_size=cap, cutoff_distance=cutoff, p_norm_distance=1.0, seed=seed)
    stored = torch.stack([torch.arange(cap) * 2.0, torch.zeros(cap)], 1)  # (0,0), (2,0), ..., (78,0)
    near = stored[-10:] + torch.tensor([0.1, 0.1])  # L1 distance 0.2 < cutoff from the best stored states
    far = torch.stack([torch.arange(10) * 2.0, torch.full((10,), 10.0)], 1)  # 10 away from everything stored
    low = far + torch.tensor([0.0, 10.0])  # new states, but rewards below the stored minimum
    batch = dict(
        state=torch.cat([near, far, low]),
        log_reward=torch.cat(
            [torch.full((20,), 5.0, dtype=torch.float64), torch.full((10,), -10.0, dtype=torch.float64)]
        ),
    )
    with create_buffer(cfg, instance_name='demo_gfn_diverse') as buffer:
        buffer.push(dict(state=stored, log_reward=torch.arange(cap, dtype=torch.float64) / 10))
        admitted = buffer.push(batch)
        s = buffer.stats()
        gap_diverse = _min_gap(buffer)
        dist = float((near - stored[-10:]).abs().sum(1).max())
        print(
            f"[gfn_diverse] full at {cap} states; a batch of 30 (10 within L1 distance {dist:.1f} of a stored state, "
            f"10 new, 10 new but below the min reward): rejected_by_distance={s['rejected_by_distance']}, "
            f"rejected_by_reward={s['rejected_by_reward']}, admitted={admitted} "
            f"(cutoff_distance={cutoff})"
        )
        check(
            s['rejected_by_distance'] == 10 and s['rejected_by_reward'] == 10 and admitted == 10,
            "gfn_diverse: the diversity filter did not reject exactly the near-duplicates",
        )
    plain_cfg = dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, seed=seed)
    with create_buffer(plain_cfg, instance_name='demo_gfn_plain') as plain:
        plain.push(dict(state=stored, log_reward=torch.arange(cap, dtype=torch.float64) / 10))
        plain_admitted = plain.push(batch)
        gap_plain = _min_gap(plain)
    print(
        f"[gfn_diverse] closest pair of kept states (L1): {gap_diverse:.1f} with the filter, {gap_plain:.1f} in "
        f"plain keep-best 'gfn', which admits {plain_admitted} of the same batch (near-duplicates included)"
    )
    check(
        gap_diverse > cutoff >= gap_plain and plain_admitted == 20,
        "gfn_diverse: the comparison with plain keep-best does not hold",
    )


def _min_gap(buffer) -> float:
    """The smallest L1 distance between two stored states (read before the buffer is closed)."""
    states = buffer.sample(buffer.count(), replace=False)['state']
    d = torch.cdist(states, states, p=1.0)
    return float(d.masked_fill(torch.eye(len(states), dtype=torch.bool), float('inf')).min())


def demo_terminating_state(out_dir: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    cap, n, steps = 50, 40, 12
    cfg = dict(type='terminating_state', replay_buffer_size=cap, prioritized_capacity=True, seed=seed)
    with create_buffer(cfg, instance_name='demo_terminating_state') as buffer:
        pairs = {}
        for _ in range(3):  # trajectories: the whole path, the actions, and the terminating state with its reward
            states = _grid_states(g, n)
            r = torch.randn(n, generator=g, dtype=torch.float64)
            buffer.push(
                dict(
                    trajectory=torch.randn(n, steps, 2, generator=g),
                    actions=torch.randint(0, 3, (n, steps)),
                    state=states,
                    log_reward=r,
                )
            )
            pairs.update({float(x): tuple(st.tolist()) for x, st in zip(r, states)})
        out = buffer.sample(buffer.count(), replace=False)
        fields = sorted(k for k in out if not k.startswith('replay_'))
        best = sorted(pairs, reverse=True)[:cap]
        match = sorted(out['log_reward'].tolist(), reverse=True) == best and all(
            pairs[float(x)] == tuple(st.tolist()) for x, st in zip(out['log_reward'], out['state'])
        )
        print(
            f"[terminating_state] pushed {3 * n} items with fields [actions, log_reward, state, trajectory] into "
            f"capacity {cap}: stored fields {fields}; the {buffer.count()} best (state, log_reward) pairs kept "
            f"intact: {match}"
        )
        check(fields == ['log_reward', 'state'] and match, "terminating_state kept other fields or mismatched pairs")

"""How the GFlowNet presets differ from ``gfn`` at push time: ``gfn_diverse``'s admission rule (keep-best plus the
p-norm diversity filter once full) and ``terminating_state``'s conversion of what is pushed into what is stored."""

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..control.diversity import diverse_mask, row_hashes
from .gfn_data import GFNBatch, all_true, is_container, is_torchgfn, terminating_states_of


def diverse_admission(t: Any, batch: GFNBatch) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """``gfn_diverse``'s admission rule: below capacity every item enters; once full, best rewards first, those
    below the stored minimum dropped, then the distance filter (``control.diversity.diverse_mask``)."""
    index, c, r = t.index, t.tally, batch.log_reward
    if index.count < t.capacity():
        return None, None
    hashes = row_hashes(batch.rows) if t.cfg.cutoff_distance == 0 else None  # exact duplicates: by hash
    t.evict(index.flush())  # lazy: back to capacity before comparing
    order = np.argsort(-r, kind='stable')  # best first; equal rewards keep batch order
    c['filter_checked'] += batch.n
    live = index.live_slots()
    ok = r[order] >= index.log_reward[live].min()
    c['rejected_by_reward'] += int((~ok).sum())
    order = order[ok]
    if t.cfg.cutoff_distance >= 0 and len(order):
        keep = diverse_mask(
            batch.rows[order],
            None if hashes is None else hashes[order],
            t.states,
            live,
            float(t.cfg.cutoff_distance),
            float(t.cfg.p_norm_distance),
        )
        c['rejected_by_distance'] += int((~keep).sum())
        order = order[keep]
    return order, hashes


def terminating_states(cfg: Any, data: Any) -> Any:
    """``terminating_state``: what is stored for ``data`` -- a dict batch keeps its state, log-reward and condition
    fields (and ``collect_iter``); a torchgfn container becomes a ``StatesContainer`` of its terminating states (for
    ``Transitions`` and ``StatesContainer`` input only the terminating rows' rewards are kept); another Container
    becomes a dict batch."""
    if is_container(data):
        return [] if len(data) == 0 else _container_terminating_states(cfg, data)  # empty: a no-op, as for gfn
    keys = [k for k in (cfg.state_key, cfg.log_reward_key, cfg.condition_key) if k is not None]
    kept = keys + ['collect_iter']  # the item's collect time: staleness removal reads it
    if isinstance(data, dict):
        return {k: data[k] for k in kept if k in data} if all(k in data for k in keys) else data
    if isinstance(data, list):
        return [{k: item[k] for k in kept if k in item} if isinstance(item, dict) else item for item in data]
    return data  # rejected with a clear message by push


def _container_terminating_states(cfg: Any, data: Any) -> Any:
    """``terminating_states`` of a Container: a torchgfn container with an env becomes a ``StatesContainer``
    (``data`` itself when it already is one with every row terminating and one reward per row); any other, a dict
    batch."""
    mask = getattr(data, 'is_terminating', None)
    torchgfn = is_torchgfn(data)
    if (
        torchgfn
        and type(data).__name__ == 'StatesContainer'
        and isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and all_true(mask)
    ):
        r = data.log_rewards
        if hasattr(data, 'env') and (r is None or len(r) == len(mask)):
            return data  # already what is stored: every row terminating, one reward per row (no new container)
        states = data.states  # every row terminating: the terminating states are the states (no gather)
    else:
        states = terminating_states_of(data)
        if states is None:
            raise ValueError(
                "terminating_state cannot tell the terminating states of backward Transitions; push forward "
                "Transitions, Trajectories (forward or backward) or a StatesContainer"
            )
    n = len(states)
    r = _terminating_log_rewards(data, mask, n)
    if torchgfn and hasattr(data, 'env'):
        return _states_container(data, states, n, r)
    return _terminating_batch(cfg, data, states, r)


def _terminating_log_rewards(data: Any, mask: Any, n: int) -> Any:
    """The log-rewards of the ``n`` terminating states of ``data`` (None if it has none): all of them, or only the
    terminating rows' when it has one per row of ``mask``; any other count is a ValueError."""
    r = data.log_rewards
    if r is not None and len(r) != n:
        if mask is None or len(r) != len(mask):
            raise ValueError(f"container has {len(r)} log_rewards for {n} terminating states")
        r = r[mask]
    return r


def _states_container(data: Any, states: Any, n: int, r: Any) -> Any:
    """A torchgfn ``StatesContainer`` on ``data``'s env holding the ``n`` ``states``, every row terminating, with
    log-rewards ``r``."""
    from gfn.containers import StatesContainer

    return StatesContainer(
        env=data.env,
        states=states,
        is_terminating=torch.ones(n, dtype=torch.bool, device=states.device),
        log_rewards=r,
    )


def _terminating_batch(cfg: Any, data: Any, states: Any, r: Any) -> Dict[str, torch.Tensor]:
    """A dict batch of ``states`` (a tensor, or states with ``.tensor``), their log-rewards ``r`` and, when the config
    has a condition key and the states carry conditions, those."""
    if r is None:
        raise ValueError("terminating_state needs log_rewards on the container")
    tensor = states if isinstance(states, torch.Tensor) else getattr(states, 'tensor', None)
    if tensor is None:
        raise TypeError(f"terminating_states of {type(data).__name__} is neither a tensor nor has .tensor")
    out = {cfg.state_key: tensor, cfg.log_reward_key: torch.as_tensor(r)}
    cond = getattr(states, 'conditions', None)
    if cfg.condition_key is not None and isinstance(cond, torch.Tensor):
        out[cfg.condition_key] = cond
    return out


__all__ = ['diverse_admission', 'terminating_states']

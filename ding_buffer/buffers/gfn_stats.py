"""The numbers a ``RewardTable`` reports -- ``stats()`` (log-reward summary, unique terminating states, the filter's
rejection rates, counters) and, every ``monitor.log_every`` pushes, the TensorBoard scalars computed under the lock
and written after it. Functions of the table ``t``."""

import math
from typing import Any, Dict

import numpy as np

from ..monitor.tb import Due
from .gfn_data import ContainerStoreBase

_STAT_TAGS = ('size', 'log_reward_min', 'log_reward_mean', 'log_reward_max', 'unique_terminating_states')


def stats(t: Any, out: Dict[str, float]) -> Dict[str, float]:
    """
    Overview:
        Flat numbers: ``size``, ``capacity``, ``log_reward_min/mean/max`` (finite rewards of stored items;
        NaN if none), ``zero_reward_items`` (log-reward -inf), ``unique_terminating_states`` (distinct
        state+condition rows; -1 when items have no single terminating state), cumulative counters
        (``pushed``, ``admitted``, ``evicted``, ``sampled``) and, for the diversity filter, ``filter_checked``
        (items that arrived while full), ``rejected_by_reward``, ``rejected_by_distance`` and their
        ``reject_rate_reward`` / ``reject_rate_distance`` (fractions of ``filter_checked``); plus the engine's
        counters (``removed_by_use``, ``refused_push``, ...; see ``Engine.stats``). O(capacity), plus, after
        a change, hashing the newly stored states and recounting distinct ones (O(capacity log capacity)).
    """
    with t.lock:
        c = dict(t.tally)
        out.update(size=t.count(), capacity=t.capacity())
        r = np.empty(0) if t.index is None else t.index.log_reward[t.index.live_slots()]
        finite = r[np.isfinite(r)]
        out['log_reward_min'] = float(finite.min()) if len(finite) else float('nan')
        out['log_reward_mean'] = _mean(finite)
        out['log_reward_max'] = float(finite.max()) if len(finite) else float('nan')
        out['zero_reward_items'] = int((r == -np.inf).sum())
        # log of sum(exp(log_reward)): what softmax sampling across shards weighs this buffer by (-inf: none)
        top = float(finite.max()) if len(finite) else float('-inf')
        out['log_reward_logsumexp'] = top + float(np.log(np.exp(finite - top).sum())) if len(finite) else top
        tracked = None if t.states is None else t.states.enabled
        unique = t.states.count_unique(t.store.rows_at) if tracked else (0 if tracked is None else -1)
        out['unique_terminating_states'] = unique
        checked = max(c['filter_checked'], 1)
        out['reject_rate_reward'] = c['rejected_by_reward'] / checked
        out['reject_rate_distance'] = c['rejected_by_distance'] / checked
        out.update({k: v for k, v in c.items() if k != 'push_calls'})
        return out


def due_scalars(t: Any) -> Due:
    """Every ``monitor.log_every`` pushes: stats and the rejection rates of the last interval (written by the
    caller after releasing the lock)."""
    if t.parts.tb is None or t.tally['push_calls'] % t.cfg.monitor.log_every:
        return None
    s = stats(t, {})
    step = t.tally['push_calls']
    prefix = f'{t.name}_iter/'
    scalars = [(prefix + tag, s[tag], step) for tag in _STAT_TAGS if np.isfinite(s[tag])]
    last, now = t.last_logged, t.tally
    checked = now['filter_checked'] - last['filter_checked']
    if checked:
        for what in ('reward', 'distance'):
            rate = (now[f'rejected_by_{what}'] - last[f'rejected_by_{what}']) / checked
            scalars.append((prefix + f'reject_rate_{what}', rate, step))
    t.last_logged = dict(now)
    return None, scalars


def log_rewards(t: Any) -> np.ndarray:
    """Log-rewards of the stored items (float64 copy, any order; used for the manager's baseline)."""
    with t.lock:
        if t.index is None:
            return np.empty(0)
        return t.index.log_reward[t.index.live_slots()].astype(np.float64)


def describe(t: Any) -> str:
    kind = (
        'empty'
        if t._store is None
        else (t._store.cls.__name__ if isinstance(t._store, ContainerStoreBase) else 'dict batches')
    )
    return f"count={t.count()}, replay_buffer_size={t.capacity()}, holding {kind}"


def _mean(x: np.ndarray) -> float:
    """The mean of finite ``x`` (NaN: empty), finite too: a sum beyond float64 (values near its largest) is taken
    over ``x / len(x)`` instead."""
    if not len(x):
        return float('nan')
    with np.errstate(over='ignore'):
        m = float(x.mean())
    return m if math.isfinite(m) else float((x / len(x)).sum())


__all__ = ['stats', 'due_scalars', 'log_rewards', 'describe']

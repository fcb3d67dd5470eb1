"""The GFlowNet buffers built on ``GFlowNetReplayBuffer``: ``gfn_diverse`` (keep-best plus the diversity filter
as an admission rule) and ``terminating_state`` (only terminating states and their log-rewards)."""

from typing import Any, Optional, Tuple

import numpy as np
import torch

from ..base import BUFFER_REGISTRY
from ..control.diversity import diverse_mask, row_hashes
from .gflownet import GFlowNetReplayBuffer
from .gfn_data import GFNBatch, is_container


@BUFFER_REGISTRY.register('gfn_diverse')
class DiverseGFlowNetReplayBuffer(GFlowNetReplayBuffer):
    """
    Overview:
        torchgfn's ``NormBasedDiversePrioritizedReplayBuffer``. Below capacity every item is stored. Once full,
        an incoming batch is sorted by log-reward (descending; ties keep batch order), items below the stored
        minimum are dropped (ties stay), then -- unless ``cutoff_distance < 0`` -- an item is kept only if its
        p-norm distance to every earlier item of the batch and to every stored item exceeds ``cutoff_distance``
        (state and condition concatenated; ``cutoff_distance = 0`` rejects exact duplicates). Survivors displace
        the lowest rewards. Capacity is always reward-prioritized.
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=3, seed=0))
        >>> buf.push({'state': torch.tensor([[0, 0], [1, 1], [2, 2]]), 'log_reward': torch.tensor([1.0, 2.0, 3.0])})
        3
        >>> buf.push({'state': torch.tensor([[2, 2], [3, 3]]), 'log_reward': torch.tensor([5.0, 4.0])})  # full
        1
        >>> batch = buf.sample(3)  # [2, 2] was stored already: only [3, 3] came in, displacing [0, 0]
        >>> sorted(batch['state'][:, 0].tolist()), sorted(batch['log_reward'].tolist())
        ([1, 2, 3], [2.0, 3.0, 4.0])
        >>> buf.stats()['rejected_by_distance']
        1
        >>> buf.close()
    """

    diverse = True
    config = dict(
        GFlowNetReplayBuffer.config,
        type='gfn_diverse',
        prioritized_capacity=True,
        # Minimum p-norm distance (strictly greater) to be admitted; < 0 disables the filter.
        cutoff_distance=0.0,
        # p of the distance (torch.cdist's p): > 0, float('inf') for the max norm.
        p_norm_distance=1.0,
    )
    checks = dict(
        GFlowNetReplayBuffer.checks,
        prioritized_capacity=(lambda x: x is True, 'True (the diverse buffer always keeps the best rewards)'),
        cutoff_distance=(lambda x: np.isfinite(x), 'a finite number (< 0 disables the filter)'),
        p_norm_distance=(lambda x: x > 0, 'a number > 0 (float("inf") for the max norm)'),
    )

    def _validate(self, batch: GFNBatch) -> None:
        super()._validate(batch)
        if batch.rows is not None and not np.isfinite(batch.rows).all():
            raise ValueError("gfn_diverse needs finite terminating states (and conditions); got NaN or inf")
        if batch.rows is None and batch.n:
            raise ValueError("gfn_diverse needs exactly one terminating state per item (got e.g. Transitions)")

    def _admission(self, batch: GFNBatch) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """Once full: best rewards first, those below the stored minimum dropped, then the distance filter."""
        index, c, r = self._index, self._tally, batch.log_reward
        if index.count < self.capacity:
            return None, None
        hashes = row_hashes(batch.rows) if self._cfg.cutoff_distance == 0 else None  # exact duplicates: by hash
        self._evict(index.flush())  # lazy: back to capacity before comparing
        order = np.argsort(-r, kind='stable')  # best first; equal rewards keep batch order
        c['filter_checked'] += batch.n
        live = index.live_slots()
        ok = r[order] >= index.log_reward[live].min()
        c['rejected_by_reward'] += int((~ok).sum())
        order = order[ok]
        if self._cfg.cutoff_distance >= 0 and len(order):
            keep = diverse_mask(
                batch.rows[order],
                None if hashes is None else hashes[order],
                self._states,
                live,
                float(self._cfg.cutoff_distance),
                float(self._cfg.p_norm_distance),
            )
            c['rejected_by_distance'] += int((~keep).sum())
            order = order[keep]
        return order, hashes


@BUFFER_REGISTRY.register('terminating_state')
class TerminatingStateBuffer(GFlowNetReplayBuffer):
    """
    Overview:
        Stores only terminating states and their log-rewards. Dict batches keep the fields ``state_key``,
        ``log_reward_key`` (and ``condition_key``), and ``collect_iter`` where an item has one -- what
        ``max_staleness`` (and rules of your own) read; a torchgfn container becomes a ``StatesContainer`` of its
        terminating states (as torchgfn's ``TerminatingStateBuffer``; for ``Transitions`` and
        ``StatesContainer`` input only the terminating rows' rewards are kept, where torchgfn mismatches them);
        another Container becomes a dict batch. Sampling returns that kind.
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='terminating_state', replay_buffer_size=4, seed=0))
        >>> buf.push({'state': torch.ones(3, 2), 'log_reward': torch.zeros(3), 'log_probs': torch.zeros(3, 7)})
        3
        >>> batch = buf.sample(2)  # the state and its log-reward only
        >>> sorted(batch), tuple(batch['state'].shape)
        (['log_reward', 'replay_buffer_idx', 'replay_unique_id', 'state'], (2, 2))
        >>> buf.close()
    """

    item_kind = 'state'

    config = dict(GFlowNetReplayBuffer.config, type='terminating_state')

    def _convert(self, data: Any) -> Any:
        cfg = self._cfg
        keys = [k for k in (cfg.state_key, cfg.log_reward_key, cfg.condition_key) if k is not None]
        kept = keys + ['collect_iter']  # the item's collect time: staleness removal reads it
        if isinstance(data, dict):
            return {k: data[k] for k in kept if k in data} if all(k in data for k in keys) else data
        if isinstance(data, list):
            return [{k: item[k] for k in kept if k in item} if isinstance(item, dict) else item for item in data]
        if not is_container(data):
            return data  # rejected with a clear message by push
        mask = getattr(data, 'is_terminating', None)
        torchgfn = type(data).__module__.startswith('gfn.')
        if (
            torchgfn
            and type(data).__name__ == 'StatesContainer'
            and isinstance(mask, torch.Tensor)
            and mask.dtype == torch.bool
            and bool(mask.all())
        ):
            r = data.log_rewards
            if hasattr(data, 'env') and (r is None or len(r) == len(mask)):
                return data  # already what is stored: every row terminating, one reward per row (no new container)
            states = data.states  # every row terminating: the terminating states are the states (no gather)
        else:
            states = data.terminating_states
        n = len(states)
        r = data.log_rewards
        if r is not None and len(r) != n:
            if mask is None or len(r) != len(mask):
                raise ValueError(f"container has {len(r)} log_rewards for {n} terminating states")
            r = r[mask]
        if torchgfn and hasattr(data, 'env'):
            from gfn.containers import StatesContainer

            env = data.env
            return StatesContainer(
                env=env,
                states=states,
                is_terminating=torch.ones(n, dtype=torch.bool, device=states.device),
                log_rewards=r,
            )
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


__all__ = ['DiverseGFlowNetReplayBuffer', 'TerminatingStateBuffer']

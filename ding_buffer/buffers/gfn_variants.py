"""The GFlowNet buffers built on ``GFlowNetReplayBuffer``: ``gfn_diverse`` (keep-best plus the diversity filter
as an admission rule) and ``terminating_state`` (only terminating states and their log-rewards)."""

import math

from ..base import BUFFER_REGISTRY
from ..config import as_float
from .gflownet import GFlowNetReplayBuffer


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
        >>> import torch
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
        cutoff_distance=(lambda x: math.isfinite(as_float(x)), 'a finite number (< 0 disables the filter)'),
        p_norm_distance=(lambda x: as_float(x) > 0, 'a number > 0 (float("inf") for the max norm)'),
    )

    table_args = dict(diverse=True, defaults=config, checks=checks)


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
        >>> import torch
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
    table_args = dict(terminating=True, defaults=config, checks=GFlowNetReplayBuffer.checks)


__all__ = ['DiverseGFlowNetReplayBuffer', 'TerminatingStateBuffer']

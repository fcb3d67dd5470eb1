"""``SequenceReplayBuffer`` (``type='sequence'``): the naive ring sampled as runs of consecutive items.

DI-engine's Dreamer world model calls ``sample(batch, sequence, cur_learner_iter)`` and gets ``batch`` runs of
``sequence`` consecutive transitions (``[B][T]``). DI-engine's version assumes episodes of exactly 500 stored
steps and refuses ``sample_range``; this one draws a run start uniformly among every start whose run lies in the
stored items (or in ``sample_range``, a contiguous slice of insertion order), so runs are always consecutive in
push order and never wrap past the newest item. ``replace=False`` draws distinct starts (runs may overlap);
``replace=True`` may repeat a start. Where ``max_use`` (or a remover of your own) took items out of the middle, a run
never jumps over the gap. ``distributed`` is refused: a remote ``sample`` has no ``sequence`` argument.

Output: list storage -> a list of ``batch`` lists of ``sequence`` items; tensor storage -> one dict of
``[batch, sequence, ...]`` tensors (with ``replay_buffer_idx`` / ``replay_unique_id`` of shape ``[B, T]``).
Use counts, ``max_use`` and the sampled-item counters count every item of every run.
"""

from typing import Any, Optional

from ..base import BUFFER_REGISTRY
from ..config import dingengine_ignored
from .naive import NAIVE_CONFIG, NaiveReplayBuffer

SEQUENCE_CONFIG = dict(NAIVE_CONFIG, type='sequence')


@BUFFER_REGISTRY.register('sequence')
class SequenceReplayBuffer(NaiveReplayBuffer):
    """
    Overview:
        Naive FIFO storage; ``sample(batch, sequence, cur_learner_iter)`` returns ``batch`` runs of ``sequence``
        consecutive items (DI-engine's ``SequenceReplayBuffer``).
    Interfaces:
        the naive buffer's, with ``sample(batch, sequence, cur_learner_iter=-1, sample_range=None,
        replace=False, timeout=None)``.
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='sequence', replay_buffer_size=10, seed=0))
        >>> buf.push([{'t': i} for i in range(10)])
        10
        >>> runs = buf.sample(4, 3)  # 4 runs of 3 consecutive items
        >>> [len(run) for run in runs], {b['t'] - a['t'] for run in runs for a, b in zip(run, run[1:])}
        ([3, 3, 3, 3], {1})
        >>> buf.close()
        >>> buf = create_buffer(dict(type='sequence', seed=0, storage=dict(type='tensor')))
        >>> _ = buf.push([{'obs': torch.zeros(4), 't': i} for i in range(10)])
        >>> out = buf.sample(2, 3)
        >>> tuple(out['obs'].shape), tuple(out['replay_unique_id'].shape), out['t'].diff(dim=1).tolist()
        ((2, 3, 4), (2, 3), [[1, 1], [1, 1]])
        >>> buf.close()
    """

    item_kind = 'sequence'  # sample(batch, sequence): windows of consecutive items
    config = SEQUENCE_CONFIG
    ignored_keys = dingengine_ignored(SEQUENCE_CONFIG, 'sequence')
    not_distributable = "a remote sample has no 'sequence' argument; use type 'episode' (windows) with a manager"
    table_args = dict(runs=True)  # no capacity rule: one evicting from the middle would break runs

    def sample(  # type: ignore[override]
        self,
        batch: int,
        sequence: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        replace: bool = False,
        timeout: Optional[float] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Draw ``batch`` runs of ``sequence`` consecutive items. Returns ``None`` (and logs why) when fewer
            than ``sequence`` items are stored (in ``sample_range``), or fewer than ``batch`` run starts exist
            and ``replace`` is False; with ``timeout`` it waits for them (``SampleTimeoutError``).
        Arguments:
            - batch (:obj:`int`): number of runs (> 0).
            - sequence (:obj:`int`): items per run (> 0).
            - cur_learner_iter (:obj:`int`): learner iteration (staleness = it - collect_iter).
            - sample_range (:obj:`slice`): a contiguous slice of insertion order (0 = oldest) holding the runs.
            - replace (:obj:`bool`): whether a run start may be drawn twice.
        Returns:
            - runs: ``[batch][sequence]`` items (list storage) or a dict of ``[batch, sequence, ...]`` tensors.
        """
        return self._sample(cur_learner_iter, self._t.runs_request(batch, sequence, sample_range, replace, timeout))

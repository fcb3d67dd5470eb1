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

import numpy as np

from ..base import BUFFER_REGISTRY
from ..config import dingengine_ignored, positive_int
from ..control.samplers import check_positions
from ..storage import refuse_items_output
from .naive import NAIVE_CHECKS, NAIVE_CONFIG, NaiveReplayBuffer

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
    checks = NAIVE_CHECKS
    ignored_keys = dingengine_ignored(SEQUENCE_CONFIG, 'sequence')
    not_distributable = "a remote sample has no 'sequence' argument; use type 'episode' (windows) with a manager"

    capacity_rules = False  # runs are consecutive items: a capacity rule evicting from the middle would break them

    def _build(self) -> None:
        refuse_items_output(self._cfg.storage, 'sequence', '[batch][sequence] runs')
        super()._build()

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
        self._check_size(batch)
        if not positive_int(sequence) and not (isinstance(sequence, np.integer) and sequence > 0):
            raise ValueError(f"sequence must be an int > 0, got {type(sequence).__name__} {sequence!r:.40}")
        self._check_range(sample_range)
        if sample_range is not None and sample_range.step not in (None, 1):
            raise ValueError(f"sample_range of a sequence sample must be contiguous (step 1), got {sample_range!r}")
        if type(replace) is not bool:
            raise TypeError(f"replace must be a bool, got {type(replace).__name__} {replace!r:.40}")
        batch, sequence = int(batch), int(sequence)
        return self._sample_flow(
            batch * sequence,
            cur_learner_iter,
            timeout,
            lambda: self._draw_runs(batch, sequence, sample_range, replace),
            lambda: self._run_shortfall(batch, sequence, sample_range, replace)[0],
        )

    def _run_shortfall(self, batch: int, sequence: int, sample_range: Optional[slice], replace: bool):
        """(why the runs cannot be drawn now or '', the insertion positions where a run may start)."""
        positions = self._candidates(sample_range)
        if self.count() == 0:
            return 'buffer is empty', None
        if len(positions) < sequence:
            where = f' in {sample_range}' if sample_range is not None else ''
            return f'{len(positions)} items{where} < sequence length {sequence}', None
        starts = self._run_starts(positions, sequence)
        if len(starts) == 0:
            return f'no {sequence} consecutive items are stored (removals left gaps)', None
        if not replace and len(starts) < batch:
            return f'{len(starts)} run starts < batch size {batch} and replace=False', None
        return '', starts

    def _run_starts(self, positions: range, sequence: int) -> np.ndarray:
        """Insertion positions where a run of ``sequence`` consecutive pushes starts. Without removal rules every
        position up to ``len - sequence`` does; ``max_use`` or a rule of your own may remove items from the middle,
        and a run must not jump over such a gap (its ids are consecutive)."""
        last = positions.start + len(positions) - sequence
        if not self._rules:
            return np.arange(positions.start, last + 1, dtype=np.int64)
        pos = np.arange(positions.start, positions.start + len(positions), dtype=np.int64)
        uids = np.asarray(self._storage.ring.uids(self._storage.ring.slots_of_positions(pos)), dtype=np.int64)
        ok = uids[sequence - 1 :] - uids[: len(uids) - sequence + 1] == sequence - 1
        return pos[: len(ok)][ok]

    def _draw_runs(self, batch: int, sequence: int, sample_range: Optional[slice], replace: bool) -> Optional[Any]:
        why, candidates = self._run_shortfall(batch, sequence, sample_range, replace)
        if why:
            return self._refused(why)
        m = len(candidates)
        idx = self._sampler.draw(self._rng, m, batch, replace)
        if self._own_sampler:
            if idx is None:
                return self._refused(f'sampler {self._cfg.sampler.get("type")!r} refused')
            idx = check_positions(idx, m, batch, self._cfg.sampler.get('type'))
        starts = candidates[np.asarray(idx, dtype=np.int64)]
        runs = starts[:, None] + np.arange(sequence, dtype=np.int64)[None, :]
        slots = self._storage.ring.slots_of_positions(runs.reshape(-1))
        if self._storage.kind == 'list':
            items = self._copy_out(self._storage.gather(slots))
            out = [items[i * sequence : (i + 1) * sequence] for i in range(batch)]
        else:
            out = self._storage.gather(slots.reshape(batch, sequence))
        self._drawn(slots, batch * sequence)  # after the gather: max_use may remove what was drawn
        return out

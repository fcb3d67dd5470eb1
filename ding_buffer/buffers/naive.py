"""``NaiveReplayBuffer`` (``type='naive'``): FIFO ring, uniform sampling, DI-engine semantics."""
from typing import Any, Dict, List, Optional

from ..base import BUFFER_REGISTRY
from ..config import positive_int
from ..sampling import uniform_indices
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, build_storage, storage_from_state
from .common import BufferCore


@BUFFER_REGISTRY.register('naive')
class NaiveReplayBuffer(BufferCore):
    """
    Overview:
        First-in-first-out ring with uniform sampling. On list storage ``sample`` returns a list of the stored
        objects (copies when ``deepcopy``); on tensor storage one dict of batched tensors with
        ``replay_buffer_idx`` and ``replay_unique_id``.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update`` (no-op), ``clear``, ``count``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``replay_buffer_size``, ``push_count``, ``storage``
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(n), sample O(batch) (with or without replacement), clear O(capacity).
    """
    config = dict(
        type='naive',
        # Maximum number of items; the oldest is overwritten when full.
        replay_buffer_size=10000,
        # Deep-copy items on push and sampled items on sample (list storage).
        deepcopy=False,
        # Items are dicts whose payload is a file at item['data_id']; delete it when the item leaves.
        enable_track_used_data=False,
        # Period of the throughput monitor (DI-engine key; the monitor reads it).
        periodic_thruput_seconds=60.0,
        # Seed of the buffer's own RNG; None draws it from numpy's global RNG (np.random.seed reproduces).
        seed=None,
        storage=STORAGE_CONFIG,
    )
    checks = dict(
        replay_buffer_size=(positive_int, 'a positive int'),
        periodic_thruput_seconds=(lambda x: x > 0, 'a positive number of seconds'),
        seed=(lambda x: x is None or (isinstance(x, int) and x >= 0), 'None or an int >= 0'),
        **STORAGE_CHECKS,
    )

    def _build(self) -> None:
        self._storage = build_storage(self._cfg.storage, self._cfg.replay_buffer_size)

    @property
    def push_count(self) -> int:
        """Items accepted since construction or the last ``clear`` (DI-engine resets it on clear)."""
        return self._storage.ring.push_count

    def _push_items(self, items: List[Any]) -> int:
        if len(items) == 1 and self._storage.write_one(items[0]) is not None:  # tensor storage's fast path
            return 1
        result = self._storage.write(self._storage.prepare(items))
        self._evicted(result.evicted)
        return len(items)

    def _push_batch(self, batch: Any) -> int:
        prepared = self._storage.prepare_batch(batch)
        result = self._storage.write(prepared)
        self._evicted(result.evicted)
        return prepared.n + prepared.dropped

    def sample(
            self,
            size: int,
            cur_learner_iter: int = -1,
            sample_range: Optional[slice] = None,
            replace: bool = False
    ) -> Optional[Any]:
        """
        Overview:
            Sample ``size`` items uniformly. ``sample_range`` is a slice over insertion order (0 = oldest,
            ``slice(-k, None)`` = the newest ``k``). Returns ``None`` (and logs why) when there are fewer
            candidates than ``size`` without ``replace``, or none at all.
        Arguments:
            - size (:obj:`int`): batch size (> 0).
            - cur_learner_iter (:obj:`int`): learner iteration (unused by uniform sampling).
            - sample_range (:obj:`slice`): restrict to these insertion positions.
            - replace (:obj:`bool`): sample with replacement.
        Returns:
            - batch: a list of items (list storage) or a dict of batched tensors (tensor storage), or ``None``.
        """
        self._check_size(size)
        with self._lock:
            positions = self._range_positions(len(self._storage), sample_range)
            m = len(positions)
            if m == 0:
                return self._refuse('buffer is empty' if len(self._storage) == 0 else f'{sample_range} selects nothing')
            if not replace and m < size:
                return self._refuse(f'{m} candidate items < batch size {size} and replace=False')
            idx = uniform_indices(self._rng, m, int(size), replace)
            slots = self._storage.ring.slots_of_positions(positions.start + idx * positions.step)
            out = self._storage.gather(slots)
            return self._copy_out(out) if self._storage.kind == 'list' else out

    def _clear(self) -> List[Any]:
        removed = self._storage.clear()
        self._storage.ring.push_count = 0
        return removed

    def _state(self) -> Dict[str, Any]:
        return {'storage': self._storage.state_dict()}

    def _restore(self, state: Dict[str, Any]) -> None:
        if 'storage' not in state:
            raise ValueError("state has no 'storage' entry")
        self._storage = storage_from_state(self._cfg.storage, self._cfg.replay_buffer_size, state['storage'])

    def __repr__(self) -> str:
        return (
            f"NaiveReplayBuffer(instance_name={self._instance_name!r}, count={self.count()}, "
            f"replay_buffer_size={self.replay_buffer_size}, storage={self._storage!r})"
        )

"""``FreeListIndex``: slot bookkeeping where any slot may be reused -- the index of a table whose capacity rule
chooses what leaves (the lowest priority, the worst of a column) instead of the oldest.

Same interface as ``RingIndex`` (``storage.ring`` is one or the other), different layout: every slot stores the
id of its item (8 bytes per slot; ``RingIndex`` derives it from the slot), and free slots sit on a stack, so a
write goes to any free slot -- the one a capacity rule just emptied. Ids count every item ever written and are
never reused (also across ``clear``). Insertion order is the order of the ids: ``oldest`` / ``ordered_slots`` /
``slots_of_positions`` sort them (O(count log count), cached until the next change), so a table that needs them
on every call (``max_staleness``, ``sample_range``) pays that; draws by slot (priority trees) do not.

A write beyond the free slots overwrites the oldest items, as the ring does: a table without a capacity rule
behaves like a FIFO ring (the engine asks its capacity rule to free slots first).

Not thread-safe: the owning buffer's lock serialises every call.
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..persistence import refuse_unknown
from ..sampling import sorted_unique
from .ring import SlotIndex, check_counters


class FreeListIndex(SlotIndex):
    """
    Overview:
        Slot bookkeeping of ``capacity`` slots with free-slot reuse (see the module docstring).
    Examples:
        >>> index = FreeListIndex(3)
        >>> _ = index.commit(3)
        >>> index.remove(np.array([1])).tolist()  # a capacity rule chose slot 1 (not the oldest, slot 0)
        [1]
        >>> slots, uids, overwritten = index.commit(1)  # the new item takes the freed slot
        >>> slots.tolist(), uids.tolist(), overwritten.tolist()
        ([1], [3], [])
        >>> index.ordered_slots().tolist(), index.uids(index.ordered_slots()).tolist()  # oldest first
        ([0, 2, 1], [0, 2, 3])
    """

    derived_ids = False  # ids are stored per slot (RingIndex derives them: its compiled fast paths rely on that)

    what = 'index'
    slot_bytes = 45  # a flag, an id and a free-list entry (a list of Python ints) per slot

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._uid = np.full(capacity, -1, dtype=np.int64)
        self._free = list(range(capacity - 1, -1, -1))  # a stack: the next write takes the lowest free slot first
        self._order: Optional[np.ndarray] = None  # valid slots by id, until the next change

    # ------------------------------------------------------------------ ids
    def uids(self, slots: Any) -> Any:
        """Ids of the items at ``slots`` (which must be valid). O(len(slots)); ints and int arrays."""
        if isinstance(slots, (int, np.integer)):
            return int(self._uid[slots])
        return self._uid[slots]

    # ------------------------------------------------------------------ writing
    def next_slots(self, n: int) -> np.ndarray:
        """Slots the next ``n`` (<= capacity) writes will use, without changing anything."""
        free = self._free[-n:][::-1]  # (the order ``commit`` pops them in)
        if len(free) < n:
            free = free + self.oldest(n - len(free)).tolist()
        return np.asarray(free, dtype=np.int64)

    def commit(self, n: int, slots: Any = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``RingIndex.commit`` over free slots: free ones first, then the oldest items' (overwritten). O(n) plus a
        sort when anything is overwritten. ``slots``: what ``next_slots(n)`` answered (not made again)."""
        assert 0 < n <= self.capacity, n
        take = min(n, len(self._free))
        if slots is None:  # the free slots (popped below, with the other changes), then the oldest items'
            free = self._free[len(self._free) - take :][::-1]
            overwritten = self.oldest(n - take) if n > take else np.zeros(0, dtype=np.int64)
            slots = np.asarray(free + overwritten.tolist(), dtype=np.int64)
        else:
            overwritten = slots[take:]
        uids = np.arange(self.next_uid, self.next_uid + n, dtype=np.int64)
        # the state changes in one run of stores with no call between them: a Ctrl-C lands before or after it
        del self._free[len(self._free) - take :]
        self.valid[slots] = True
        self._uid[slots] = uids
        self.count += take
        self.next_uid += n
        self.push_count += n
        self._order = None
        return slots, uids, overwritten

    def next_slot(self) -> int:
        """The slot the next write uses, without changing anything."""
        return self._free[-1] if self._free else int(self.oldest(1)[0])

    def commit_one(self) -> Tuple[int, bool]:
        """``commit(1)``: returns (slot, overwrote)."""
        slots, _, overwritten = self.commit(1)
        return int(slots[0]), bool(len(overwritten))

    def remove(self, slots: np.ndarray) -> np.ndarray:
        """Invalidate ``slots``; returns the slots that were actually valid (their slots become free)."""
        slots = np.unique(np.asarray(slots, dtype=np.int64))
        slots = slots[self.valid[slots]]
        if len(slots):
            n, freed = len(slots), slots[::-1].tolist()  # (the lowest freed slot is taken first)
            # the state changes in one run of stores with no call between them: a Ctrl-C lands before or after it
            self.valid[slots] = False
            self._uid[slots] = -1
            self.count -= n
            self._free += freed
            self._order = None
        return slots

    def clear(self, reset_push_count: bool = False) -> None:
        super().clear(reset_push_count)
        self._uid[:] = -1
        self._free = list(range(self.capacity - 1, -1, -1))
        self._order = None

    # ------------------------------------------------------------------ order
    def ordered_slots(self) -> np.ndarray:
        """Every valid slot in insertion order (oldest first): sorted by id, cached until the next change."""
        if self._order is None:
            live = np.flatnonzero(self.valid)
            self._order = live[np.argsort(self._uid[live], kind='stable')]
        return self._order

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest valid slots, oldest first."""
        return self.ordered_slots()[: max(int(k), 0)].copy()

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        return {
            'capacity': self.capacity,
            'layout': 'free_list',
            'valid': torch.from_numpy(self.valid.copy()),
            'uid': torch.from_numpy(self.uid.copy()),
            'next_uid': self.next_uid,
            'push_count': self.push_count,
            # the free slots in the order the next writes take them: a restored table writes where this one would
            'free': torch.tensor(self._free[::-1], dtype=torch.int64),
        }

    @classmethod
    def from_state(cls, state: Dict[str, Any], capacity: int) -> 'FreeListIndex':
        """Build an index from ``state`` (its own, or a ``RingIndex`` state: a ring's items keep their ids),
        checking every invariant; raises ``ValueError`` on inconsistency."""
        need = ('capacity', 'valid', 'uid', 'next_uid', 'push_count')
        valid, uid = cls._saved_arrays(state, capacity, need)
        refuse_unknown(state, need + ('layout', 'free', 'head', 'span'), 'saved index')  # (a ring's state loads too)
        if state.get('layout', 'free_list') != 'free_list':
            raise ValueError(f"saved index has layout {state['layout']!r:.40}; expected 'free_list' or none")
        index = cls(capacity)
        index.next_uid, index.push_count = int(state['next_uid']), int(state['push_count'])
        check_counters('index', index.push_count, index.next_uid)
        ids = uid[valid]
        if len(ids) and (ids.min() < 0 or ids.max() >= index.next_uid or len(sorted_unique(ids)) != len(ids)):
            raise ValueError("inconsistent index state: the items' ids must be distinct and in [0, next_uid)")
        if (uid[~valid] != -1).any():
            raise ValueError("inconsistent index state: an empty slot has an id")
        index.valid = valid.copy()
        index._uid = np.where(valid, uid, -1)
        index.count = int(valid.sum())
        empty = np.flatnonzero(~valid)
        if 'free' in state:  # (a ring's state, or an older file, has none: the lowest free slot first)
            free = state['free']
            free = free.numpy() if isinstance(free, torch.Tensor) else np.asarray(free)
            if free.ndim != 1 or (free.size and free.dtype.kind not in 'iu'):  # ([] reads as float64)
                raise ValueError(
                    f"inconsistent index state: 'free' must be a 1-D array of ints, got {free.dtype} of shape "
                    f"{free.shape}"
                )
            free = free.astype(np.int64)
            if len(free) != len(empty) or not np.array_equal(np.sort(free), empty):
                raise ValueError("inconsistent index state: 'free' must list each empty slot once")
        else:
            free = empty
        index._free = free[::-1].tolist()
        return index

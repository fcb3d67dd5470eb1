"""``RingIndex``: slot bookkeeping shared by every storage (which slot holds what, in which order).

The ring keeps, for ``capacity`` slots, a validity mask; every item gets a unique id (ids count every item
ever written and are never reused, also across ``clear``). Items are written at ``tail`` and age towards
``head``; ``span`` is the number of ring positions from head to tail, holes (removed items) included.
Invariant: the item with id ``u`` is always written to slot ``u % capacity`` (``tail == next_uid % capacity``),
so ids are derived from the slot (``uids``) instead of stored -- 8 bytes per slot saved.
Invariant: ``head`` is always a valid slot when ``count > 0`` (holes at the head are trimmed eagerly), so
when nothing has been removed from the middle, ``count == span`` and insertion position ``p`` (0 = oldest)
lives at slot ``(head + p) % capacity`` -- O(1) per lookup.

Not thread-safe: the owning buffer's lock serialises every call.
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..persistence import refuse_unknown

ID_LIMIT = 1 << 62  # ids and push counts beyond it would overflow the int64 arrays ids are computed in


def check_counters(what: str, push_count: int, next_uid: int) -> None:
    """A saved index's counters are in [0, 2**62) (``ValueError`` otherwise)."""
    if not (0 <= push_count < ID_LIMIT and 0 <= next_uid < ID_LIMIT):
        raise ValueError(
            f"inconsistent {what} state: counters ({push_count}, {next_uid}) must be in [0, 2**62); negative counters "
            "or ids past it"
        )


class SlotIndex:
    """What ``RingIndex`` and ``FreeListIndex`` share: ``capacity`` slots, their validity mask, the counters."""

    what = 'ring'  # what error messages call a saved state of this index
    slot_bytes = 1  # what the index keeps per slot (its validity flag)

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.valid = np.zeros(capacity, dtype=bool)
        self.count = 0
        self.next_uid = 0
        self.push_count = 0

    def holds(self, slots: np.ndarray, ids: np.ndarray, mine: Any = None) -> np.ndarray:
        """Mask: slot ``slots[i]`` still holds the item with id ``ids[i]`` (and ``mine[i]``, when given) -- the
        identity check of every ``update`` keyed by ids."""
        match = self.valid[slots] & (self.uids(slots) == ids)
        return match if mine is None else match & mine

    @property
    def uid(self) -> np.ndarray:
        """Id of every slot, -1 where empty. O(capacity): for inspection and persistence, not hot paths."""
        return np.where(self.valid, self.uids(np.arange(self.capacity, dtype=np.int64)), -1)

    def slots_of_positions(self, positions: np.ndarray) -> np.ndarray:
        """Map insertion positions (0 = oldest valid item) to slots. O(len) for a ring without holes."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.count):
            raise IndexError(
                f"insertion positions must be in [0, {self.count}), got {positions.min()}..{positions.max()}"
            )
        return self._slots_at(positions)

    def _slots_at(self, positions: np.ndarray) -> np.ndarray:
        return self.ordered_slots()[positions]

    def skip(self, dropped: int) -> None:
        """A push larger than the capacity: every stored item leaves and the ``dropped`` oldest pushed items are
        never stored, but ids and counters advance as if they had been (DI-engine's tail arithmetic); the next
        write lands where ``next_uid`` says (a ring's id/slot invariant: its ``clear`` puts the head there)."""
        self.clear()  # (first: a call stopped before the counters moved -- a Ctrl-C -- leaves a consistent index)
        self.next_uid += dropped
        self.push_count += dropped

    def clear(self, reset_push_count: bool = False) -> None:
        """Invalidate everything; ``next_uid`` is kept, ``push_count`` unless ``reset_push_count`` (DI-engine's
        naive buffer restarts it, the advanced one does not)."""
        if reset_push_count:
            self.push_count = 0
        self.valid[:] = False
        self.count = 0

    @classmethod
    def _saved_arrays(cls, state: Dict[str, Any], capacity: int, need: Tuple[str, ...]) -> Tuple[np.ndarray, ...]:
        """The ``valid`` and ``uid`` arrays of a saved state, checked: it has every key of ``need`` and ``capacity``."""
        missing = [k for k in need if k not in state]
        if missing:
            raise ValueError(f"{cls.what} state is missing keys {missing}")
        if state['capacity'] != capacity:
            raise ValueError(f"saved storage has capacity {state['capacity']}, this buffer's capacity is {capacity}")
        valid = np.asarray(state['valid'], dtype=bool)
        uid = np.asarray(state['uid'], dtype=np.int64)
        if valid.shape != (capacity,) or uid.shape != (capacity,):
            raise ValueError(f"{cls.what} arrays must have shape ({capacity},), got {valid.shape} and {uid.shape}")
        return valid, uid


class RingIndex(SlotIndex):
    """
    Overview:
        Slot bookkeeping of ``capacity`` slots (see the module docstring).
    Examples:
        >>> ring = RingIndex(3)
        >>> _ = ring.commit(2)
        >>> slots, uids, overwritten = ring.commit(2)  # full: the oldest item (slot 0) is overwritten
        >>> slots.tolist(), uids.tolist(), overwritten.tolist()
        ([2, 0], [2, 3], [0])
        >>> ring.ordered_slots().tolist(), ring.uids(ring.ordered_slots()).tolist(), ring.count  # oldest first
        ([1, 2, 0], [1, 2, 3], 3)
    """

    derived_ids = True  # the id of slot s is derived, not stored (the compiled fast paths compute it the same way)

    _BLOCK = 64  # slots per block of ``_blocks``
    _BLOCKS_FROM = 1 << 15  # spans with holes from which positions are found through ``_blocks``

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.head = 0
        self.span = 0
        # valid slots per block of _BLOCK slots: kept (from the first lookup of a large ring with holes) so that a
        # position is found in O(log) instead of listing the whole ring (``_select``); None: not kept
        self._blocks: Any = None

    @property
    def tail(self) -> int:
        """Next slot to be written."""
        return (self.head + self.span) % self.capacity

    def uids(self, slots: Any) -> Any:
        """Ids of the items at ``slots`` (which must be valid): the newest id ``u < next_uid`` with
        ``u % capacity == slot``. O(len(slots)); works on ints and int arrays."""
        last = self.next_uid - 1
        return last - (last - slots) % self.capacity

    def next_slot(self) -> int:
        """The slot the next write uses (``tail``), without changing anything. O(1)."""
        return (self.head + self.span) % self.capacity

    def next_slots(self, n: int) -> np.ndarray:
        """Slots the next ``n`` (<= capacity) writes will use, without changing anything. O(n)."""
        first = (self.head + self.span) % self.capacity
        if first + n <= self.capacity:  # (no wrap: one arange, as ``commit``)
            return np.arange(first, first + n)
        return (first + np.arange(n)) % self.capacity

    def commit(self, n: int, slots: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Claim the next ``n`` slots (``n <= capacity``), overwriting the oldest items when full. O(n). Returns
        ``(slots, uids, overwritten)``: the written slots in write order, the new items' ids, and the slots whose
        previous (valid) item was overwritten. ``slots``: what ``next_slots(n)`` answered (not made again)."""
        assert 0 < n <= self.capacity, n
        uids = np.arange(self.next_uid, self.next_uid + n, dtype=np.int64)  # (allocated before anything changes)
        first = (self.head + self.span) % self.capacity
        seg = mark = None  # the run, or the slots, that become valid (written last)
        if first + n <= self.capacity:  # no wrap: slices instead of fancy indexing
            slots = np.arange(first, first + n) if slots is None else slots
            seg = self.valid[first : first + n]
            hit = np.count_nonzero(seg)  # a full ring overwrites all, a filling one none: no mask indexing then
            if hit == n:
                overwritten, seg = slots, None  # the run is valid already
            else:
                overwritten = slots[seg] if hit else slots[:0]
        else:
            slots = self.next_slots(n) if slots is None else slots
            overwritten = slots[self.valid[slots]]
            mark = slots
        fresh = n - len(overwritten)
        if self._blocks is not None and fresh:  # (the slots not overwritten become valid)
            np.add.at(self._blocks, np.setdiff1d(slots, overwritten, assume_unique=True) // self._BLOCK, 1)
        head, span = self.head, self.span + n
        if span > self.capacity:
            head, span = (head + span - self.capacity) % self.capacity, self.capacity
        # the state changes in one run of stores with no call between them: a Ctrl-C lands before or after it
        if seg is not None:
            seg[:] = True
        if mark is not None:
            self.valid[mark] = True
        self.count += fresh
        self.next_uid += n
        self.push_count += n
        self.head, self.span = head, span
        if not self.valid[self.head]:  # holes at the head (removed items) shrink the span
            self._trim_head()
        return slots, uids, overwritten

    def commit_one(self) -> Tuple[int, bool]:
        """``commit(1)`` in O(1) Python-scalar work (the single-push hot path). Returns (slot, overwrote)."""
        slot = (self.head + self.span) % self.capacity
        overwrote = bool(self.valid[slot])
        if not overwrote:
            self.count += 1
            if self._blocks is not None:
                self._blocks[slot // self._BLOCK] += 1
        self.valid[slot] = True
        self.next_uid += 1
        self.push_count += 1
        if self.span == self.capacity:
            self.head = (self.head + 1) % self.capacity
        else:
            self.span += 1
        if not self.valid[self.head]:
            self._trim_head()
        return slot, overwrote

    def remove(self, slots: np.ndarray) -> np.ndarray:
        """Invalidate ``slots``; returns the slots that were actually valid. O(len(slots)) amortised."""
        slots = np.unique(np.asarray(slots, dtype=np.int64))
        slots = slots[self.valid[slots]]
        n = len(slots)
        self.valid[slots] = False  # (with the count: no call between them, where a Ctrl-C may land; a head left
        self.count -= n  # on a hole is trimmed by the next change, or by a load of a state saved meanwhile)
        if self._blocks is not None:
            np.add.at(self._blocks, slots // self._BLOCK, -1)
        self._trim_head()
        return slots

    def _trim_head(self) -> None:
        """Holes at the head leave the span: the head moves to the oldest valid slot (scanned in growing chunks, so a
        run of a million holes is a few numpy calls, not a million steps)."""
        if self.count == 0:
            self.head, self.span = self.tail, 0
            return
        head, span, step = self.head, self.span, 8
        while not self.valid[head]:
            end = min(head + step, self.capacity)
            seg = self.valid[head:end]
            skip = int(seg.argmax()) if seg.any() else len(seg)
            head, span = (head + skip) % self.capacity, span - skip
            step *= 4
        self.head, self.span = head, span  # (once: a call stopped in the scan -- a Ctrl-C -- leaves them as they were)

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest valid slots, oldest first. O(k) without holes; with holes it scans forward from the
        head in growing chunks, so a short walk (e.g. staleness eviction before each sample) never pays O(span)."""
        if self.count == self.span:
            return (self.head + np.arange(min(k, self.span))) % self.capacity
        found, start, step = [], 0, max(k, 64)
        while sum(len(f) for f in found) < k and start < self.span:
            pos = (self.head + np.arange(start, min(start + step, self.span))) % self.capacity
            found.append(pos[self.valid[pos]])
            start, step = start + step, step * 2
        return np.concatenate(found)[:k] if found else np.zeros(0, dtype=np.int64)

    def ordered_slots(self) -> np.ndarray:
        """Every valid slot in insertion order (oldest first). O(count) without holes, O(span) with."""
        positions = (self.head + np.arange(self.span)) % self.capacity
        if self.count == self.span:
            return positions
        return positions[self.valid[positions]]

    def _slots_at(self, positions: np.ndarray) -> np.ndarray:
        if self.count == self.span:
            return (self.head + positions) % self.capacity
        if self.span < self._BLOCKS_FROM or len(positions) * self._BLOCK * 4 > self.span:
            return self.ordered_slots()[positions]
        return self._select(positions)

    def _select(self, positions: np.ndarray) -> np.ndarray:
        """``_slots_at`` with holes, O(capacity / _BLOCK + len(positions) * _BLOCK): insertion position ``p`` is the
        ``(p + a) % count``-th valid slot in slot order, ``a`` the valid slots before the head (the newest items,
        when the ring wraps: every valid slot lies in [head, tail))."""
        b = self._BLOCK
        if self._blocks is None:
            padded = np.zeros(-(-self.capacity // b) * b, dtype=bool)
            padded[: self.capacity] = self.valid
            self._blocks = padded.reshape(-1, b).sum(axis=1, dtype=np.int64)
        cum = np.cumsum(self._blocks)
        hb = self.head // b
        before = (int(cum[hb - 1]) if hb else 0) + int(np.count_nonzero(self.valid[hb * b : self.head]))
        rank = (positions + before) % self.count  # the rank of each in slot order
        block = np.searchsorted(cum, rank, side='right')
        offset = rank - np.where(block > 0, cum[block - 1], 0)
        cells = block[:, None] * b + np.arange(b)
        bits = self.valid[np.minimum(cells, self.capacity - 1)] & (cells < self.capacity)
        return block * b + np.argmax(np.cumsum(bits, axis=1) > offset[:, None], axis=1)

    def skip(self, dropped: int) -> None:
        super().skip(dropped)
        self.head = self.next_uid % self.capacity  # (the id/slot invariant, as ``clear`` keeps it)

    def clear(self, reset_push_count: bool = False) -> None:
        """The next write goes to slot ``next_uid % capacity`` (the id/slot invariant)."""
        super().clear(reset_push_count)
        self._blocks = None
        self.span = 0
        self.head = self.next_uid % self.capacity

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        return {
            'capacity': self.capacity,
            'head': self.head,
            'span': self.span,
            'valid': torch.from_numpy(self.valid.copy()),
            'uid': torch.from_numpy(self.uid.copy()),
            'next_uid': self.next_uid,
            'push_count': self.push_count,
        }

    @classmethod
    def from_state(cls, state: Dict[str, Any], capacity: int) -> 'RingIndex':
        """Build a ring from ``state``, checking every invariant; raises ``ValueError`` on inconsistency."""
        if state.get('layout') == 'free_list':
            raise ValueError(
                "the state was saved by a buffer with a capacity rule (a 'removers' entry such as 'min_priority' "
                "or 'keep_best'), whose slots are reused in any order; load it into a buffer configured with one"
            )
        need = ('capacity', 'head', 'span', 'valid', 'uid', 'next_uid', 'push_count')
        valid, uid = cls._saved_arrays(state, capacity, need)
        refuse_unknown(state, need, 'saved ring')
        if (uid[~valid] != -1).any():
            raise ValueError("inconsistent ring state: an empty slot has an id")
        ring = cls(capacity)
        ring.valid = valid.copy()
        ring.head, ring.span = int(state['head']), int(state['span'])
        ring.next_uid, ring.push_count = int(state['next_uid']), int(state['push_count'])
        check_counters('ring', ring.push_count, ring.next_uid)
        ring.count = int(valid.sum())
        if ring.next_uid < 0 or (ring.head + ring.span - ring.next_uid) % capacity:
            raise ValueError(
                f"inconsistent ring state: tail {(ring.head + ring.span) % capacity} is not next_uid "
                f"{ring.next_uid} modulo capacity {capacity}"
            )
        if not (0 <= ring.head < capacity and ring.count <= ring.span <= capacity):
            raise ValueError(f"inconsistent ring state: head={ring.head} span={ring.span} count={ring.count}")
        inside = np.zeros(capacity, dtype=bool)
        inside[(ring.head + np.arange(ring.span)) % capacity] = True
        if (valid & ~inside).any():
            raise ValueError("inconsistent ring state: valid slots outside [head, tail)")
        if ring.count and not valid[ring.head]:  # holes at the head not trimmed yet (a remove stopped part-way)
            ring._trim_head()
        if not np.array_equal(uid[valid], ring.uid[valid]):
            raise ValueError("inconsistent ring state: saved unique ids do not match their slots")
        return ring

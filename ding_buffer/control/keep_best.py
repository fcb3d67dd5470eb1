"""``RewardIndex``: which items a GFlowNet buffer keeps and how it samples them.

Per slot: the item's log-reward (float64), insertion sequence number (also its unique id) and a live flag.

Capacity rule (all-or-nothing per push, deterministic):

* ``prioritized_capacity``: keep the ``capacity`` items with the largest ``(log_reward, seq)`` -- the highest
  rewards; among equal rewards the newest (torchgfn sorts with an unstable ``argsort``, so its tie order is
  unspecified). ``-inf`` is a valid log-reward (reward 0) and is evicted first.
* FIFO: keep the ``capacity`` newest items.
* ``lazy``: truncation waits until stored + incoming reaches ``2 * capacity`` (torchgfn's ``lazy_sort``);
  until then everything stays, visible to ``sample``.

Sampling: uniform, or ``p_i = exp(r_i) / sum_j exp(r_j)`` computed as ``exp(r_i - max r)`` (no overflow for
any finite log-reward; items at ``-inf`` have probability 0; if every item is at ``-inf`` the draw is
uniform). Without replacement it is successive sampling (Plackett-Luce) via the Gumbel-top-k trick, so it
works for any spread of rewards, where ``torch.multinomial`` fails once fewer than ``n`` items have a
non-zero probability.

Complexity: a prioritized push that truncates costs O(slots) (one ``np.partition``) -- lazy mode does it once
per ``capacity`` items; a FIFO one O(evicted) (an insertion-order queue: ``_fifo_truncate``); sampling
O(slots + n log n), uniform sampling of a full eager buffer O(n). Not thread-safe: the buffer's lock serialises calls.
"""

from typing import Any, Optional, Tuple

import numpy as np

from ..sampling import sorted_unique, uniform_indices

_NO_SLOTS = np.empty(0, dtype=np.int64)
_NO_SLOTS.flags.writeable = False


class RewardIndex:
    """
    Overview:
        Which items stay and which are drawn, by log-reward (see the module docstring). The owner asks
        ``admit`` before a push, then commits with ``store`` / ``evict``.
    Examples:
        >>> ri = RewardIndex(capacity=3, physical=3, prioritized=True, lazy=False, reuse_slots=True)
        >>> slots = ri.free_slots(3)
        >>> ri.store(slots, np.array([1.0, 5.0, -np.inf]), ri.claim_seqs(3))
        >>> sorted(ri.sample(np.random.default_rng(0), 2, prioritized=True, replace=False).tolist())  # -inf: never
        [0, 1]
        >>> keep_new, evict = ri.admit(np.array([4.0, 0.5]))  # full: the 2 lowest of the 5 rewards go
        >>> keep_new.tolist(), evict.tolist(), ri.count  # admit decides, nothing changed yet
        ([True, False], [2], 3)
        >>> RewardIndex(3, 3, prioritized=True, lazy=False, reuse_slots=True).admit(np.ones(2))  # room: all kept
        (None, array([], dtype=int64))
    """

    def __init__(self, capacity: int, physical: int, prioritized: bool, lazy: bool, reuse_slots: bool) -> None:
        self.capacity = capacity
        self.reuse_slots = reuse_slots  # True: evicted slots are reused; False: append-only, compacted by the owner
        self.prioritized = prioritized
        self.lazy = lazy
        self.log_reward = np.empty(physical)
        self.seq = np.empty(physical, dtype=np.int64)
        self.alive = np.empty(physical, dtype=bool)
        self.next_seq = 0
        self.clear()

    @property
    def physical(self) -> int:
        return len(self.alive)

    # ------------------------------------------------------------------ admission
    def admit(self, new_log_reward: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """
        Overview:
            Decide a push of ``n`` items (changes nothing): returns ``(keep_new, evict_slots)``, a bool mask of
            the incoming items that are stored (None: every one) and the stored slots that leave.
        """
        n = len(new_log_reward)
        total = self.count + n
        limit = 2 * self.capacity if self.lazy else self.capacity + 1
        if total < limit or total <= self.capacity:
            return None, _NO_SLOTS
        return self._truncate(new_log_reward, total - self.capacity)

    def flush(self) -> np.ndarray:
        """Slots to evict to bring the buffer down to ``capacity`` now (lazy mode before a diversity check)."""
        if self.count <= self.capacity:
            return np.empty(0, dtype=np.int64)
        return self._truncate(np.empty(0), self.count - self.capacity)[1]

    def _truncate(self, new_log_reward: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """Drop the ``k`` smallest keys ``(log_reward, seq)`` among stored and incoming items (prioritized; FIFO:
        the ``k`` oldest, ``_fifo_truncate``)."""
        if not self.prioritized:
            return self._fifo_truncate(len(new_log_reward), k)
        slots = self.live_slots()
        new_seq = self.next_seq + np.arange(len(new_log_reward), dtype=np.int64)
        seq = np.concatenate([self.seq[slots], new_seq])
        r = np.concatenate([self.log_reward[slots], new_log_reward])
        kth = np.partition(r, k - 1)[k - 1]
        drop = r < kth
        ties = np.flatnonzero(r == kth)
        need = k - int(drop.sum())
        if need:  # among equal rewards the oldest go first
            drop[ties[np.argpartition(seq[ties], need - 1)[:need]] if need < len(ties) else ties] = True
        return ~drop[len(slots) :], slots[drop[: len(slots)]]

    def _fifo_truncate(self, n: int, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """FIFO: ``_truncate`` from insertion order, O(k): incoming items are newer than every stored one, so the
        ``k`` oldest are the stored ones first (evicted slots oldest first: new items that take them in that order
        keep the slots in insertion order, a ring, whose runs of slots are written as slices)."""
        gone = min(k, self.count)
        keep_new = None
        if k > gone:
            keep_new = np.ones(n, dtype=bool)
            keep_new[: k - gone] = False
        return keep_new, self._oldest_live(gone)

    # ------------------------------------------------------------------ insertion order
    def _reset_order(self) -> None:
        """The insertion-order queue: ``(slot, seq)`` of every stored item, oldest first, between ``_head`` and
        ``_tail``; entries of items evicted since (by any rule) are skipped lazily (their slot's seq differs)."""
        size = max(16, 2 * self.physical)
        self._q_slot, self._q_seq = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
        self._head = self._tail = 0

    def _enqueue(self, slots: np.ndarray, seq: np.ndarray) -> None:
        """Append items in insertion order (``seq`` ascending: ``claim_seqs`` order); compacts or doubles the queue
        when it is full (amortised O(1) per item)."""
        n = len(slots)
        if self._tail + n > len(self._q_slot):
            h, t = self._head, self._tail
            qs, qq = self._q_slot[h:t], self._q_seq[h:t]
            live = self.seq[qs] == qq  # drop the entries of evicted items
            qs, qq = qs[live], qq[live]
            m = len(qs)
            size = len(self._q_slot)
            while m + n > size // 2:
                size *= 2
            if size != len(self._q_slot):
                self._q_slot = np.empty(size, dtype=np.int64)
                self._q_seq = np.empty(size, dtype=np.int64)
            self._q_slot[:m], self._q_seq[:m] = qs, qq
            self._head, self._tail = 0, m
        self._q_slot[self._tail : self._tail + n] = slots
        self._q_seq[self._tail : self._tail + n] = seq
        self._tail += n

    def _purge(self, m: int) -> None:
        """Drop the dead entries among the first ``m`` of the queue up to its first live one (FIFO evicts the
        head: the next ``_oldest_live`` then starts at a live entry). O(m)."""
        h = self._head
        if m <= 0 or h >= self._tail:
            return
        live = self.seq[self._q_slot[h : h + m]] == self._q_seq[h : h + m]
        first = int(live.argmax())  # (0 when none is live)
        self._head = h + (first if live[first] else len(live))

    def _oldest_live(self, k: int) -> np.ndarray:
        """The ``k`` oldest live slots, oldest first (``k <= count``). Skips leading dead entries for good; O(k +
        dead entries passed)."""
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        h = self._head
        qs = self._q_slot[h : h + k]
        if len(qs) == k and self.seq[qs].tobytes() == self._q_seq[h : h + k].tobytes():  # common: none dead
            return qs.copy()  # (equal bytes: equal int64 values, at a tenth of numpy's ``all``)
        out = []
        got, pos, width = 0, self._head, k
        while got < k:
            end = min(self._tail, pos + width)
            qs = self._q_slot[pos:end]
            live = self.seq[qs] == self._q_seq[pos:end]
            if pos == self._head and not live[0]:  # purge the dead prefix (it never becomes live again)
                first = int(np.argmax(live)) if live.any() else len(live)
                self._head += first
            take = qs[live][: k - got]
            out.append(take)
            got += len(take)
            pos, width = end, 2 * width
            if end >= self._tail:
                break
        res = np.concatenate(out) if len(out) > 1 else out[0]
        assert len(res) == k, 'insertion-order queue out of step with the live items'
        return res

    # ------------------------------------------------------------------ slots
    def live_slots(self) -> np.ndarray:
        """Live slots in slot order (O(slots); O(1) when every slot is live, a full eager buffer)."""
        if self.count == self.physical:
            return np.arange(self.physical, dtype=np.int64)
        return np.flatnonzero(self.alive)

    def claim_seqs(self, n: int) -> np.ndarray:
        """The next ``n`` sequence numbers (unique ids), consumed."""
        seqs = self.next_seq + np.arange(n, dtype=np.int64)
        self.next_seq += n
        return seqs

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest live slots (smallest sequence numbers), oldest first. O(k) amortised."""
        return self._oldest_live(min(int(k), self.count))

    def free_slots(self, n: int) -> np.ndarray:
        """Reuse mode: ``n`` free slots (the caller commits them with ``store``)."""
        if n > self._n_free:
            raise RuntimeError(f"no room for {n} items ({self._n_free} free slots)")
        return self._free[self._n_free - n : self._n_free][::-1].copy()

    def append_slots(self, n: int) -> np.ndarray:
        """Append mode: the next ``n`` never-used slots, growing the arrays when needed."""
        if self.end + n > self.physical:
            self._grow(max(2 * self.physical, self.end + n))
        return np.arange(self.end, self.end + n, dtype=np.int64)

    def _grow(self, physical: int) -> None:
        extra = physical - self.physical
        self.log_reward = np.concatenate([self.log_reward, np.full(extra, np.nan)])
        self.seq = np.concatenate([self.seq, np.full(extra, -1, dtype=np.int64)])
        self.alive = np.concatenate([self.alive, np.zeros(extra, dtype=bool)])
        if len(self._q_slot) < 2 * physical:
            m = self._tail - self._head
            for name in ('_q_slot', '_q_seq'):
                q = getattr(self, name)
                new = np.empty(max(2 * physical, 2 * m), dtype=np.int64)
                new[:m] = q[self._head : self._tail]
                setattr(self, name, new)
            self._head, self._tail = 0, m

    def store(self, slots: np.ndarray, log_reward: np.ndarray, seq: np.ndarray) -> None:
        """Mark ``slots`` live with these rewards and sequence numbers."""
        self.log_reward[slots] = log_reward
        self.seq[slots] = seq
        self.alive[slots] = True
        self.count += len(slots)
        if self.reuse_slots:
            self._n_free -= len(slots)  # they came from ``free_slots``
        elif len(slots):
            self.end = max(self.end, int(slots.max()) + 1)
        self._enqueue(np.asarray(slots, dtype=np.int64), np.asarray(seq, dtype=np.int64))

    def replace(self, evicted: np.ndarray, log_reward: np.ndarray, seq: np.ndarray) -> None:
        """Reuse mode, a push into a full buffer: new items take the ``evicted`` slots, in that order -- as
        ``evict`` then ``store`` would, without marking the slots dead and live again or passing them through the
        free stack (which ends as it was)."""
        self.log_reward[evicted] = log_reward
        self.seq[evicted] = seq  # (the evicted items' queue entries die with their old sequence numbers)
        self._purge(len(evicted))
        self._enqueue(evicted, np.asarray(seq, dtype=np.int64))

    def evict(self, slots: np.ndarray) -> None:
        self.alive[slots] = False
        self.log_reward[slots] = np.nan
        self.seq[slots] = -1
        self.count -= len(slots)
        self._purge(len(slots))
        if self.reuse_slots:
            self._free[self._n_free : self._n_free + len(slots)] = slots
            self._n_free += len(slots)

    def compact(self, keep: np.ndarray) -> None:
        """Append mode: slot ``keep[i]`` becomes slot ``i`` (the storage was compacted the same way)."""
        m = len(keep)
        for name in ('log_reward', 'seq', 'alive'):
            arr = getattr(self, name)
            moved = arr[keep]
            arr[m:] = {'log_reward': np.nan, 'seq': -1, 'alive': False}[name]
            arr[:m] = moved
        self.end = m
        self._rebuild_order()

    def _rebuild_order(self) -> None:
        """The queue from the live items (after a compaction or a restore): O(slots log slots)."""
        self._reset_order()
        slots = self.live_slots()
        slots = slots[np.argsort(self.seq[slots], kind='stable')]
        self._enqueue(slots, self.seq[slots])

    def clear(self) -> None:
        """Every slot empty (``next_seq`` is kept). What it allocates comes first: a ``MemoryError`` changes
        nothing."""
        free = np.arange(self.physical - 1, -1, -1, dtype=np.int64)  # every slot free, popped lowest first
        self._reset_order()  # (allocates both arrays before it changes anything)
        self.alive[:] = False
        self.log_reward[:] = np.nan
        self.seq[:] = -1
        self.count = 0
        self.end = 0  # append mode: first never-used slot
        self._free, self._n_free = free, self.physical

    def restored(
        self,
        log_reward: np.ndarray,
        seq: np.ndarray,
        next_seq: int,
        slots: Optional[np.ndarray] = None,
        free: Optional[np.ndarray] = None,
    ) -> Tuple['RewardIndex', np.ndarray]:
        """
        Overview:
            A new index like this one holding these items (a restored save) at ``slots`` (default ``0..n-1``)
            with the free slots stacked as ``free`` (reuse mode; default: every other slot, lowest popped first),
            so a restored buffer places and samples exactly as the saved one did. Validates the layout
            (``ValueError``); nothing changes here. Returns the new index and the items' slots.
        """
        n = len(seq)
        slots = np.arange(n, dtype=np.int64) if slots is None else _slot_array(slots, 'slots')
        in_range = not n or (len(slots) == n and slots.min() >= 0 and slots.max() < self.physical)
        if len(slots) != n or len(sorted_unique(slots)) != n or not in_range:
            raise ValueError(f"saved slots must be {n} distinct slots in [0, {self.physical})")
        if free is not None:
            free = _slot_array(free, 'free')
            taken = np.zeros(self.physical, dtype=bool)
            taken[slots] = True
            if (
                len(free) != self.physical - n
                or len(sorted_unique(free)) != len(free)
                or (len(free) and (free.min() < 0 or free.max() >= self.physical or taken[free].any()))
            ):
                raise ValueError("saved free slots must be exactly the slots no item holds")
        new = RewardIndex(self.capacity, self.physical, self.prioritized, self.lazy, self.reuse_slots)
        new.log_reward[slots], new.seq[slots], new.alive[slots] = log_reward, seq, True
        new.count, new.end = n, (int(slots.max()) + 1 if n else 0)
        new.next_seq = int(next_seq)
        if new.reuse_slots:
            if free is None:
                free = np.flatnonzero(~new.alive)[::-1]
            new._free[: len(free)] = free
            new._n_free = len(free)
        new._rebuild_order()
        return new, slots

    def free_state(self) -> np.ndarray:
        """The free-slot stack (reuse mode), bottom first: what ``load(..., free=)`` restores."""
        return self._free[: self._n_free].copy()

    # ------------------------------------------------------------------ sampling
    def sample(self, rng: np.random.Generator, n: int, prioritized: bool, replace: bool) -> np.ndarray:
        """``n`` live slots; without ``replace`` distinct (the caller checks ``n <= count``)."""
        m = self.count
        if not prioritized:
            pos = rng.integers(0, m, n) if replace else uniform_indices(rng, m, n)
            return pos if m == self.physical else self.live_slots()[pos]  # full: position = slot
        slots = self.live_slots()
        r = self.log_reward[slots]
        finite = r > -np.inf
        if not finite.any():  # every reward is 0: the limit of equal rewards, uniform
            return slots[rng.integers(0, m, n) if replace else uniform_indices(rng, m, n)]
        if replace:
            w = np.exp(r - r[finite].max())
            cdf = np.cumsum(w)
            pos = np.searchsorted(cdf, rng.random(n) * cdf[-1], side='right')
            # u * total can round up to total: map it to the last item with a non-zero weight
            pos = np.minimum(pos, np.flatnonzero(w > 0)[-1])
            return slots[pos]
        # Gumbel-top-k: the order of r_i + Gumbel noise is successive sampling without replacement
        idx_f = np.flatnonzero(finite)
        keys = r[idx_f] - np.log(-np.log(rng.random(len(idx_f)) + np.finfo(float).tiny) + np.finfo(float).tiny)
        take = min(n, len(idx_f))
        top = np.argpartition(-keys, take - 1)[:take] if take < len(idx_f) else np.arange(len(idx_f))
        order = idx_f[top[np.argsort(-keys[top], kind='stable')]]
        if take < n:  # the rest have reward 0: uniformly, after every positive-reward item
            rest = np.flatnonzero(~finite)
            order = np.concatenate([order, rest[uniform_indices(rng, len(rest), n - take)]])
        return slots[order]

    # ------------------------------------------------------------------ state
    def state_dict(self, slots: np.ndarray) -> dict:
        """Rewards and ids of ``slots`` as tensors (loadable with ``weights_only=True``)."""
        import torch

        return {
            'log_reward': torch.from_numpy(self.log_reward[slots].copy()),
            'seq': torch.from_numpy(self.seq[slots].copy()),
            'next_seq': int(self.next_seq),
        }


def _slot_array(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (len(arr) and arr.dtype.kind not in 'iu'):
        raise ValueError(f"saved '{what}' must be a 1-d array of ints, got {arr.dtype} shape {arr.shape}")
    return arr.astype(np.int64)

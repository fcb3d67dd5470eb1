"""Segment trees with DI-engine's scalar API and batched, compiled operations.

``SumSegmentTree``, ``MinSegmentTree`` and ``MaxSegmentTree`` keep DI-engine's surface: the capacity must be a
power of two, ``tree[i] = v`` / ``tree[i]``, ``reduce(start=0, end=None)`` over ``[start, end)`` and, on the sum
tree, ``find_prefixsum_idx(x, trust_caller=True)`` with the strictly-greater rule (zero leaves are skipped,
exact boundaries go right, ``x >= total`` lands on the last non-zero leaf). On top of that every operation
takes arrays: ``tree[idx_array] = values`` writes a batch, ``find_prefixsum_idx(array)`` descends the whole
batch in one compiled call.

Layout: an 8-ary tree (one 64-byte cache line of children per node), so a descent over a million leaves
touches 7 levels instead of 20, and the internal nodes cost ~1/7 of the leaves. Several trees may share one
leaf array (``leaves=``): ``PriorityTree`` keeps sum and min (and optionally max) over the same priorities,
so the leaves are stored once. A min tree over shared leaves ignores zero leaves (empty slots).

Complexity: set / find / reduce O(8 * log8(capacity)) per element. Not thread-safe: the owner serialises calls.
"""

from typing import Any, Dict, Optional, Union

import numpy as np

from . import tree_kernels as kern
from .tree_kernels import K

_OPS = {'sum': (kern.SUM, 0.0), 'min': (kern.MIN, np.inf), 'max': (kern.MAX, -np.inf)}


def _layout(capacity: int):
    """(padded leaf count, level starts, internal node count); each level padded to a multiple of K."""
    size = max(K, -(-capacity // K) * K)
    n_leaves, starts, total = size, [], 0
    while size > 1:
        size = -(-size // K)
        starts.append(total)
        padded = size if size == 1 else -(-size // K) * K
        total += padded
        size = padded if size > 1 else 1
    return n_leaves, np.asarray(starts, dtype=np.int64), total


class SegmentTree:
    """
    Overview:
        A segment tree over ``capacity`` leaves (a power of two, as in DI-engine) for ``operation`` in
        ``'sum'``, ``'min'``, ``'max'``. ``leaves=`` shares another tree's leaf array (then zero leaves count as
        empty for ``'min'``); call ``refresh(idx)`` after the owner writes them.
    Examples:
        >>> tree = SegmentTree(8, 'max')
        >>> tree[np.array([0, 5])] = [2.0, 7.0]  # a batched write; the other leaves hold -inf
        >>> tree.root(), tree.reduce(0, 5), tree
        (7.0, 2.0, SegmentTree(capacity=8, root=7.0))
    """

    def __init__(
        self,
        capacity: int,
        operation: str,
        neutral_element: Optional[float] = None,
        leaves: Optional[np.ndarray] = None,
    ) -> None:
        if not isinstance(capacity, (int, np.integer)) or capacity <= 0 or capacity & (capacity - 1):
            raise ValueError(f"segment tree capacity must be a positive power of two, got {capacity!r}")
        if operation not in _OPS:
            raise ValueError(f"segment tree operation must be one of {sorted(_OPS)}, got {operation!r}")
        op, default = _OPS[operation]
        self.capacity = int(capacity)
        self.operation = operation
        self.neutral_element = float(default if neutral_element is None else neutral_element)
        n_leaves, self._starts, n_nodes = _layout(self.capacity)
        if leaves is None:
            self._leaves = np.full(n_leaves, default, dtype=np.float64)  # padding past capacity: identity
            self._leaves[: self.capacity] = self.neutral_element
            self._op = op
        else:
            if leaves.shape != (n_leaves,) or leaves.dtype != np.float64:
                raise ValueError(
                    f"shared leaves must be float64 of shape ({n_leaves},), got {leaves.dtype} {leaves.shape}"
                )
            self._leaves = leaves
            self._op = kern.MIN_POS if op == kern.MIN else op
        self._nodes = np.full(n_nodes, default if self._op != kern.MIN_POS else np.inf, dtype=np.float64)
        if leaves is not None or self.neutral_element != default:
            self.rebuild()

    # ------------------------------------------------------------------ scalar + batched API
    @property
    def leaves(self) -> np.ndarray:
        """The leaf array (``capacity`` leaves, padded to a multiple of 8). Read-only by convention."""
        return self._leaves

    def _check_index(self, idx: Any) -> Union[int, np.ndarray]:
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            if not 0 <= idx < self.capacity:
                raise IndexError(f"segment tree index {idx} out of range [0, {self.capacity})")
            return int(idx)
        arr = np.asarray(idx)
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        if arr.dtype.kind not in 'iu' or arr.ndim != 1:
            raise TypeError(f"segment tree index must be an int or a 1-D int array, got {arr.dtype} {arr.shape}")
        arr = arr.astype(np.int64, copy=False)
        if len(arr) and (arr.min() < 0 or arr.max() >= self.capacity):
            raise IndexError(f"segment tree indices out of range [0, {self.capacity}): {arr.min()}..{arr.max()}")
        return arr

    def __setitem__(self, idx: Any, value: Any) -> None:
        idx = self._check_index(idx)
        if isinstance(idx, int):
            kern.set_one(self._leaves, self._nodes, self._starts, self._op, idx, float(value))
        else:
            values = np.broadcast_to(np.asarray(value, dtype=np.float64), idx.shape)
            kern.set_many(self._leaves, self._nodes, self._starts, self._op, idx, np.ascontiguousarray(values))

    def __getitem__(self, idx: Any) -> Any:
        idx = self._check_index(idx)
        return float(self._leaves[idx]) if isinstance(idx, int) else self._leaves[idx]

    def refresh(self, idx: np.ndarray) -> None:
        """Recompute the ancestors of leaves ``idx`` (after their shared leaves were written elsewhere)."""
        kern.refresh_many(self._leaves, self._nodes, self._starts, self._op, np.asarray(idx, dtype=np.int64))

    def rebuild(self) -> None:
        """Recompute every internal node from the leaves. O(capacity)."""
        below = self._leaves
        if self._op == kern.MIN_POS:
            below = np.where(below > 0.0, below, np.inf)
        for lvl in range(len(self._starts)):
            vals = kern._np_reduce_blocks(below.reshape(-1, K), self._op)
            level = kern._np_level(self._leaves, self._nodes, self._starts, lvl + 1)
            level[: len(vals)] = vals
            below = level

    def reduce(self, start: int = 0, end: Optional[int] = None) -> float:
        """Reduce the leaves in ``[start, end)`` (``end`` defaults to capacity; negative ``end`` counts from it)."""
        if end is None:
            end = self.capacity
        elif end < 0:
            end += self.capacity
        if not 0 <= start < end <= self.capacity:
            raise ValueError(f"reduce needs 0 <= start < end <= {self.capacity}, got start={start} end={end}")
        neutral = np.inf if self._op == kern.MIN_POS else _OPS[self.operation][1]
        return float(
            kern.reduce_range(self._leaves, self._nodes, self._starts, self._op, neutral, int(start), int(end))
        )

    def root(self) -> float:
        """``reduce()`` over all leaves in O(1)."""
        return float(self._nodes[-1])

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        return {'capacity': self.capacity, 'operation': self.operation, 'leaves': self._leaves[: self.capacity].copy()}

    def load_leaves(self, leaves: Any) -> None:
        """Replace every leaf (validated: float array of length ``capacity``) and rebuild. O(capacity)."""
        arr = np.asarray(leaves, dtype=np.float64)
        if arr.shape != (self.capacity,):
            raise ValueError(f"saved tree leaves have shape {arr.shape}, expected ({self.capacity},)")
        self._leaves[: self.capacity] = arr
        self.rebuild()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, root={self.root()})"


class SumSegmentTree(SegmentTree):
    """
    Overview:
        Sums of leaves, and ``find_prefixsum_idx``: the leaf a prefix sum falls in (the prioritized draw).
    Examples:
        >>> tree = SumSegmentTree(4)
        >>> tree[0] = 1.0
        >>> tree[np.array([1, 2, 3])] = [2.0, 0.0, 3.0]
        >>> tree.reduce(), tree.reduce(1, 3)  # [start, end)
        (6.0, 2.0)
        >>> tree.find_prefixsum_idx(2.5), tree.find_prefixsum_idx(np.array([0.0, 1.0, 3.0, 5.9])).tolist()
        (1, [0, 1, 3, 3])
    """

    def __init__(self, capacity: int, leaves: Optional[np.ndarray] = None) -> None:
        super().__init__(capacity, 'sum', leaves=leaves)

    def find_prefixsum_idx(self, prefixsum: Any, trust_caller: bool = True) -> Any:
        """
        Overview:
            The leaf ``i`` with ``prefix(i) <= x < prefix(i + 1)``, for a scalar or (vectorised) an array of
            ``x``. Zero leaves are never returned; ``x >= total`` (e.g. float error) gives the last non-zero leaf.
        Arguments:
            - prefixsum: a float or a 1-D float array.
            - trust_caller (:obj:`bool`): if False, check ``0 <= x <= total + 1e-5`` (``ValueError`` otherwise).
        """
        total = self.root()
        if isinstance(prefixsum, (float, int, np.floating, np.integer)):
            x = float(prefixsum)
            if not trust_caller and not 0 <= x <= total + 1e-5:
                raise ValueError(f"prefixsum {x} is outside [0, total={total}]")
            i = int(kern.find_one(self._leaves, self._nodes, self._starts, x))
            if i < 0:
                raise ValueError("find_prefixsum_idx on a tree whose leaves are all zero")
            return i
        xs = np.ascontiguousarray(prefixsum, dtype=np.float64)
        if xs.ndim != 1:
            raise ValueError(f"prefixsum array must be 1-D, got shape {xs.shape}")
        if not trust_caller and not ((xs >= 0).all() and (xs <= total + 1e-5).all()):  # NaN fails both
            raise ValueError(f"prefixsums must be in [0, total={total}], got {xs.min()}..{xs.max()}")
        out = np.empty(len(xs), dtype=np.int64)
        kern.find_many(self._leaves, self._nodes, self._starts, xs, out)
        if len(out) and out.min() < 0:
            raise ValueError("find_prefixsum_idx on a tree whose leaves are all zero")
        return out


class MinSegmentTree(SegmentTree):
    """
    Overview:
        Minima of leaves (``inf`` where none is set).
    Examples:
        >>> tree = MinSegmentTree(4)
        >>> tree[np.arange(4)] = [3.0, 1.0, 2.0, 5.0]
        >>> tree.reduce(), tree.reduce(2, 4), tree[1]
        (1.0, 2.0, 1.0)
    """

    def __init__(self, capacity: int, leaves: Optional[np.ndarray] = None) -> None:
        super().__init__(capacity, 'min', leaves=leaves)


class MaxSegmentTree(SegmentTree):
    """
    Overview:
        Maxima of leaves (``-inf`` where none is set).
    Examples:
        >>> tree = MaxSegmentTree(4)
        >>> tree[np.arange(4)] = [3.0, 1.0, 2.0, 5.0]
        >>> tree.reduce(), tree.reduce(0, 3), tree[3]
        (5.0, 3.0, 5.0)
    """

    def __init__(self, capacity: int, leaves: Optional[np.ndarray] = None) -> None:
        super().__init__(capacity, 'max', leaves=leaves)


def next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class PriorityTree:
    """
    Overview:
        Sum and min (and optionally max) over one array of non-negative leaves -- the priority index of a
        prioritized buffer. A zero leaf is an empty slot: never sampled, ignored by ``min_leaf``.
        Memory: 8 bytes per leaf, ~1.2 bytes per leaf for each tree's internal nodes, half a byte per leaf for
        the record of deferred writes.

        Batched writes are deferred (as cpprb's trees do): ``set`` / ``fill`` write the leaves at once and record
        them; the internal nodes are refreshed by the next read (``total``, ``min_leaf``, ``max_leaf``, ``find``,
        or the ``sum`` / ``min`` / ``max`` trees), once for every write since the previous read, with the
        ancestors that writes share computed once. A record that fills up (one entry per 8 leaves) is refreshed
        at once, by rebuilding whole levels. ``set_one`` refreshes its path at once. ``leaves`` is always
        current; the nodes a read sees are bit-identical to refreshing after every write. Not thread-safe (the
        owning buffer's lock serialises).
    Examples:
        >>> tree = PriorityTree(5, with_max=True)
        >>> tree.set(np.array([0, 1, 4]), np.array([1.0, 3.0, 2.0]))  # slots 2 and 3 stay empty (0)
        >>> tree.total(), tree.min_leaf(), tree.max_leaf()  # the min ignores empty slots
        (6.0, 1.0, 3.0)
        >>> tree.find(np.array([0.5, 1.5, 4.5])).tolist()  # prefix sums -> slots
        [0, 1, 4]
    """

    def __init__(self, size: int, with_max: bool = False) -> None:
        self.size = int(size)
        self._sum = SumSegmentTree(next_power_of_two(size))
        self._min = MinSegmentTree(self._sum.capacity, leaves=self._sum.leaves)
        self._max = MaxSegmentTree(self._sum.capacity, leaves=self._sum.leaves) if with_max else None
        xnodes = self._max._nodes if with_max else np.zeros(0)
        self._arrays = (self._sum._leaves, self._sum._nodes, self._min._nodes, xnodes, with_max, self._sum._starts)
        # leaves written since the last refresh (see tree_kernels._defer): room for one per parent of the leaves,
        # so a record that fills up is refreshed by rebuilding whole levels (streaming, ~1 ms per million leaves)
        # instead of one random path per entry; half a byte per leaf (int32 slots below 2**31 leaves)
        n_leaves = len(self._sum.leaves)
        self._pending = np.empty(max(64, n_leaves // K), dtype=np.int32 if n_leaves < 2**31 else np.int64)
        self._npending = np.zeros(1, dtype=np.int64)
        self._deferred = (self._pending, self._npending)
        self.has_max = with_max

    @property
    def leaves(self) -> np.ndarray:
        return self._sum.leaves

    @property
    def arrays(self) -> tuple:
        """``(leaves, sum nodes, min nodes, max nodes, has max, level starts)``: what the fused kernels take."""
        return self._arrays

    @property
    def deferred(self) -> tuple:
        """``(pending, npending)``: the record of leaves waiting for a refresh, for kernels that defer one."""
        return self._deferred

    def flush(self) -> None:
        """Refresh the nodes above every leaf written since the last refresh (a no-op when none was)."""
        if self._npending[0]:
            kern.prio_flush(*self._arrays, self._pending, self._npending)

    @property
    def sum(self) -> SumSegmentTree:
        self.flush()
        return self._sum

    @property
    def min(self) -> MinSegmentTree:
        self.flush()
        return self._min

    @property
    def max(self) -> Optional[MaxSegmentTree]:
        self.flush()
        return self._max

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Write leaves ``idx`` (int64 array; the last write wins for repeats); the trees follow at the next read.
        Values must be finite and >= 0 (the caller validates)."""
        kern.prio_set_lazy(
            *self._arrays,
            np.asarray(idx, dtype=np.int64),
            np.asarray(values, dtype=np.float64),
            self._pending,
            self._npending,
        )

    def fill(self, idx: np.ndarray, value: float) -> None:
        """``set`` of one value at every leaf of ``idx``."""
        kern.prio_fill_lazy(*self._arrays, np.asarray(idx, dtype=np.int64), float(value), self._pending, self._npending)

    def set_one(self, i: int, value: float) -> None:
        """One leaf and its path at once (a path costs about what recording it would; leaves that wait for a
        refresh elsewhere stay recorded -- refreshing in either order gives the same nodes)."""
        kern.prio_set_one(*self._arrays, int(i), float(value))

    def total(self) -> float:
        self.flush()
        return float(self._sum._nodes[-1])

    def min_leaf(self) -> float:
        """Smallest positive leaf (``inf`` when every leaf is zero)."""
        self.flush()
        return float(self._min._nodes[-1])

    def max_leaf(self) -> float:
        if self._max is None:
            raise RuntimeError("PriorityTree was built without a max tree")
        self.flush()
        return self._max.root()

    def find(self, xs: np.ndarray) -> np.ndarray:
        self.flush()
        return self._sum.find_prefixsum_idx(xs)

    def load_leaves(self, leaves: Any) -> None:
        arr = np.asarray(leaves, dtype=np.float64)
        if arr.shape != (self.size,):
            raise ValueError(f"saved priority leaves have shape {arr.shape}, expected ({self.size},)")
        if not np.isfinite(arr).all() or (arr < 0).any():
            raise ValueError("saved priority leaves must be finite and >= 0")
        full = np.zeros(self._sum.capacity)
        full[: self.size] = arr
        self._npending[0] = 0  # every node is rebuilt below
        self._sum.load_leaves(full)
        self._min.rebuild()
        if self._max is not None:
            self._max.rebuild()

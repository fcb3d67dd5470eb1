"""Diversity of stored states: exact-duplicate sets (hashing) and the two-stage filter of the ``gfn_diverse``
buffer; the p-norm distances it runs on for ``cutoff > 0`` live in ``distances``.

Representation: every item is one float64 row (its terminating state flattened, with its condition
concatenated when there is one). float64 keeps integer states exact up to 2**53, so distances between grid
states are exact and comparisons with integer cutoffs never suffer rounding (torchgfn computes in float32).

Speed: torchgfn builds the full ``batch x buffer`` distance matrix (``torch.cdist``) on every insert. Here

* ``cutoff == 0`` (the default: reject exact duplicates) is a hash lookup, O(batch), with an exact row
  comparison on every hash hit, so a 64-bit collision can never reject a new state;
* ``cutoff > 0`` scans pairs with an early exit and pivot pruning (``distances.far_mask``).
"""

import functools
from typing import Callable, Dict, List, Optional

import numpy as np

from .._numba import HAVE_NUMBA, njit, ready, warmer  # noqa: F401 (re-exported)
from ..sampling import sorted_unique
from .distances import N_PIVOTS, _far_numpy, choose_pivots, far_mask, pnorm_distances  # noqa: F401 (re-exported)

# ---------------------------------------------------------------------------------------------------- hashing
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """
    Overview:
        A 64-bit hash per float64 row; equal rows (``-0.0 == 0.0`` included) get equal hashes. Every element
        is mixed with its column before the sum, so permuted rows and one-hot rows do not collide.
    Complexity: O(rows * columns): one compiled pass once the kernels are loaded, else vectorised numpy (the same
    hashes).
    """
    rows = np.ascontiguousarray(rows, dtype=np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
    bits = rows.view(np.uint64)
    salt = _salt(rows.shape[1])
    if ready():
        out = np.empty(len(rows), dtype=np.uint64)
        _hash_rows(bits, salt, out)
        return out
    with np.errstate(over='ignore'):
        mixed = _mix(bits ^ salt[None, :])
        return _mix(mixed.sum(axis=1, dtype=np.uint64) + np.uint64(rows.shape[1]))


@functools.lru_cache(maxsize=64)
def _salt(width: int) -> np.ndarray:
    """Each column's salt (shared: callers must not write to it; the same few widths recur)."""
    with np.errstate(over='ignore'):
        return _mix(np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)


@njit(cache=True, nogil=True)
def _hash_rows(bits, salt, out):
    """``row_hashes``' numpy expression, one row at a time (uint64 arithmetic wraps in both)."""
    m1, m2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    for i in range(bits.shape[0]):
        acc = np.uint64(bits.shape[1])
        for j in range(bits.shape[1]):
            z = bits[i, j] ^ salt[j]
            z = (z ^ (z >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            acc += z ^ (z >> s31)
        acc = (acc ^ (acc >> s30)) * m1
        acc = (acc ^ (acc >> s27)) * m2
        out[i] = acc ^ (acc >> s31)


@warmer
def _warm_hashes() -> None:
    _hash_rows(np.zeros((2, 3), dtype=np.uint64), np.ones(3, dtype=np.uint64), np.empty(2, dtype=np.uint64))


class StateSet:
    """
    Overview:
        The representations of the stored items, by slot: their hashes and, when ``keep_rows``, their rows
        (needed by the distance filter and for exact duplicate checks). ``count_unique`` is the number of
        distinct hashes among the stored items (= distinct states, barring a 64-bit collision).
    Interfaces:
        ``add``, ``remove``, ``duplicates_of``, ``compact``, ``clear``, ``count_unique``, ``pivot_distances``
    Complexity: ``add`` / ``remove`` O(n) vectorised while nobody asked for duplicates: an item added without its
        hash is only marked, and the marked items are hashed together when a count or a duplicate check needs
        them -- from the kept rows, or (``add`` without rows) from the rows the owner's ``rows_at(slots)`` reads
        back from its store, so a push need not build rows at all; ``count_unique`` is cached and recounted
        (a sort of the stored hashes, O(stored log stored)) only after a change. Once ``duplicates_of``
        was asked (the diverse filter, only once the buffer is full) a hash -> slots index is kept: O(n) dict
        operations per add / remove, and the count is its size.
    Not thread-safe (the buffer's lock serialises calls).
    Examples:
        >>> states = StateSet(physical=4, keep_rows=True)
        >>> states.add(np.array([0, 1, 2]), np.array([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]))
        >>> states.count_unique()  # distinct states stored
        2
        >>> rows = np.array([[1.0, 1.0], [2.0, 2.0]])
        >>> states.duplicates_of(rows, row_hashes(rows)).tolist()
        [True, False]
    """

    HASH_VALUES = 1 << 20  # row values hashed per call when counting (8 MB of float64)

    def __init__(self, physical: int, keep_rows: bool, p: float = 1.0) -> None:
        self.keep_rows = keep_rows
        self.p = float(p)
        # pivot distances of stored rows (keep_rows and p >= 1): lower bounds that prune the distance filter
        self.pivots: Optional[np.ndarray] = None
        self.pdist: Optional[np.ndarray] = None
        self.sqnorm: Optional[np.ndarray] = None  # squared Euclidean norms of stored rows (p = 2: Gram pruning)
        # None until the first push; False for good once a batch comes without one row per item (e.g.
        # Transitions), so that tracked and untracked items never mix
        self.enabled: Optional[bool] = None
        self.dim: Optional[int] = None
        self.hashes = np.zeros(physical, dtype=np.uint64)
        self.present = np.zeros(physical, dtype=bool)  # slots holding a counted item
        self.rows: Optional[np.ndarray] = None
        self.unhashed = np.zeros(physical, dtype=bool)  # slots whose item was added without its hash
        self._unique: Optional[int] = 0  # None: recount
        self._buckets: Optional[Dict[int, List[int]]] = None  # hash -> slots holding it; None: not kept (yet)

    def count_unique(self, rows_at: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> int:
        """Distinct stored states. ``rows_at(slots)``: the stored items' rows, for items added without rows."""
        if self._buckets is not None:
            return len(self._buckets)
        if self._unique is None:
            self._hash_unhashed(rows_at)
            self._unique = len(sorted_unique(self.hashes[self.present]))
        return self._unique

    def grow(self, physical: int) -> None:
        extra = physical - len(self.hashes)
        for name in ('hashes', 'present', 'unhashed', 'rows', 'pdist', 'sqnorm'):
            arr = getattr(self, name)
            if arr is not None and extra > 0:
                setattr(self, name, np.concatenate([arr, np.zeros((extra,) + arr.shape[1:], arr.dtype)]))

    def check_dim(self, width: int, what: str) -> None:
        if self.dim is not None and width != self.dim:
            raise ValueError(
                f"{what} has {width} values per item, the stored ones have {self.dim}: a buffer's items have one "
                f"state width, all with conditions of one width or all without"
            )

    def add(
        self,
        slots: np.ndarray,
        rows: Optional[np.ndarray],
        hashes: Optional[np.ndarray] = None,
        width: Optional[int] = None,
    ) -> None:
        """Items now at ``slots``: their ``rows`` (None: rows of ``width`` values, read back with ``rows_at`` when
        counted; not with ``keep_rows``) and ``row_hashes`` when the caller has them (else computed now, or
        when needed where the rows are kept)."""
        if self.enabled is False:
            return
        self.enabled = True
        if rows is None:
            assert not self.keep_rows and self._buckets is None, 'kept rows and the hash index need the rows'
        if self.dim is None:
            self.dim = rows.shape[1] if rows is not None else int(width)
            if self.keep_rows:
                self.rows = np.zeros((len(self.hashes), self.dim))
                if self.p >= 1.0 and len(rows):
                    self.pivots = choose_pivots(rows, self.p)
                    self.pdist = np.zeros((len(self.hashes), N_PIVOTS))
                if self.p == 2.0:
                    self.sqnorm = np.zeros(len(self.hashes))
        if not len(slots):
            return
        if self.rows is not None:
            self.rows[slots] = rows
        if self.pdist is not None:
            self.pdist[slots] = self.pivot_distances(rows)
        if self.sqnorm is not None:
            self.sqnorm[slots] = np.einsum('ij,ij->i', rows, rows)
        self.present[slots] = True
        self._unique = None
        if hashes is None and self._buckets is None and (rows is None or self.rows is not None):
            self.unhashed[slots] = True  # hashed when counted, with the other unhashed items
            return
        self.unhashed[slots] = False  # (an earlier add of the slot, not hashed yet, is gone)
        self.hashes[slots] = row_hashes(rows) if hashes is None else hashes
        if self._buckets is not None:
            self._bucket(slots, self.hashes[slots])

    def _hash_unhashed(self, rows_at: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
        """Hash the stored items added without a hash, from the kept rows or ``rows_at``'s, a few MB of rows at a
        time (the rows of a whole buffer of large states need not fit in memory at once)."""
        slots = np.flatnonzero(self.unhashed & self.present)  # items removed since need no hash
        if len(slots) and self.rows is None and rows_at is None:
            raise RuntimeError('items were added without rows: counting them needs rows_at')
        step = max(1, self.HASH_VALUES // max(1, self.dim or 1))
        for i in range(0, len(slots), step):
            part = slots[i : i + step]
            self.hashes[part] = row_hashes(self.rows[part] if self.rows is not None else rows_at(part))
        self.unhashed[:] = False

    def _bucket(self, slots: np.ndarray, hashes: np.ndarray) -> None:
        buckets = self._buckets
        for s, h in zip(slots.tolist(), hashes.tolist()):
            b = buckets.get(h)
            if b is None:
                buckets[h] = [s]
            else:
                b.append(s)

    def remove(self, slots: np.ndarray) -> None:
        if not self.enabled or not len(slots):
            return
        buckets = self._buckets
        if buckets is not None:
            for s, h in zip(slots.tolist(), self.hashes[slots].tolist()):
                b = buckets.get(h)
                if b is not None and s in b:  # (a removal stopped part-way took some already)
                    b.remove(s)
                    if not b:
                        del buckets[h]
        self.present[slots] = False
        self._unique = None

    def _index_buckets(self) -> Dict[int, List[int]]:
        """The hash -> slots index, built on first use and kept from then on."""
        if self._buckets is None:
            self._hash_unhashed()
            self._buckets = {}
            slots = np.flatnonzero(self.present)
            self._bucket(slots, self.hashes[slots])
        return self._buckets

    def clear(self) -> None:
        """No item stored: counting starts again with the next push, which fixes the states' width as a new set's
        first push does (a buffer that held items without a single terminating state counts those of its next
        pushes)."""
        self.present[:] = False
        self.unhashed[:] = False
        self._unique = 0
        self.dim = self.rows = self.pivots = self.pdist = self.sqnorm = None
        if self._buckets is not None:
            self._buckets = {}
        if self.enabled is False:
            self.enabled = None

    def enable(self) -> None:
        """Count unique states (a restored, empty buffer that counted them before)."""
        if self.enabled is None:
            self.enabled = True

    def disable(self) -> None:
        self.clear()
        self.enabled = False
        self._buckets = None

    def compact(self, keep: np.ndarray) -> None:
        """Slot ``keep[i]`` becomes slot ``i`` (container storage after compaction)."""
        if not self.enabled:
            return
        m = len(keep)
        for arr in (self.hashes, self.present, self.unhashed, self.rows, self.pdist, self.sqnorm):
            if arr is not None:
                arr[:m] = arr[keep]  # advanced indexing copies first, so overlapping moves are safe
        self.present[m:] = False
        self.unhashed[m:] = False
        if self._buckets is not None:
            self._buckets = {}
            self._bucket(np.flatnonzero(self.present), self.hashes[self.present])

    def pivot_distances(self, rows: np.ndarray) -> Optional[np.ndarray]:
        """``(len(rows), N_PIVOTS)`` distances to the pivots, or None when there are none (yet)."""
        return None if self.pivots is None else pnorm_distances(rows, self.pivots, self.p)

    def duplicates_of(self, rows: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Bool mask: row ``i`` equals a stored row (exact comparison on hash hits; needs ``keep_rows``)."""
        out = np.zeros(len(hashes), dtype=bool)
        buckets = self._index_buckets()
        for i, h in enumerate(hashes.tolist()):
            b = buckets.get(h)
            if b is not None:
                out[i] = bool(np.any(np.all(self.rows[b] == rows[i], axis=1)))
        return out


def first_occurrences(rows: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Bool mask: row ``i`` differs from every earlier row (exact comparison on hash hits)."""
    out = np.ones(len(hashes), dtype=bool)
    seen: Dict[int, List[int]] = {}
    for i, h in enumerate(hashes.tolist()):
        earlier = seen.get(h)
        if earlier is None:
            seen[h] = [i]
            continue
        if np.any(np.all(rows[earlier] == rows[i], axis=1)):
            out[i] = False
        earlier.append(i)
    return out


def diverse_mask(
    rows: np.ndarray, hashes: np.ndarray, stored: StateSet, stored_slots: np.ndarray, cutoff: float, p: float
):
    """
    Overview:
        torchgfn's two-stage filter on a batch already sorted by reward (descending). Stage 1 keeps item ``i``
        iff it is far from *every* earlier item of the batch (also the ones stage 1 drops: not greedy);
        stage 2 keeps a stage-1 survivor iff it is far from every stored item. ``cutoff == 0`` means exact
        duplicates and runs on hashes.
    Returns:
        - keep (:obj:`np.ndarray`): bool mask over the batch.
    Examples:
        >>> stored = StateSet(physical=4, keep_rows=True)
        >>> stored.add(np.array([0, 1]), np.array([[0.0, 0.0], [1.0, 1.0]]))
        >>> batch = np.array([[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])  # best reward first
        >>> diverse_mask(batch, row_hashes(batch), stored, np.array([0, 1]), cutoff=0.0, p=1.0).tolist()
        [False, True, False]
        >>> diverse_mask(batch, None, stored, np.array([0, 1]), cutoff=2.0, p=1.0).tolist()  # L1 2 is not > 2
        [False, False, False]
    """
    if cutoff == 0.0:
        keep = first_occurrences(rows, hashes)
        idx = np.flatnonzero(keep)
        keep[idx[stored.duplicates_of(rows[idx], hashes[idx])]] = False
        return keep
    dq = stored.pivot_distances(rows)
    keep = far_mask(rows, rows, None, cutoff, p, triangular=True, q_pivot=dq)
    idx = np.flatnonzero(keep)
    if len(idx) and len(stored_slots):
        far = far_mask(
            rows[idx],
            stored.rows,
            stored_slots,
            cutoff,
            p,
            q_pivot=None if dq is None else dq[idx],
            ref_pivot=stored.pdist,
            ref_sqnorm=stored.sqnorm,
        )
        keep[idx[~far]] = False
    return keep

"""Diversity of stored states: exact-duplicate sets (hashing) and the p-norm distance filter of the
``gfn_diverse`` buffer.

Representation: every item is one float64 row (its terminating state flattened, with its condition
concatenated when there is one). float64 keeps integer states exact up to 2**53, so distances between grid
states are exact and comparisons with integer cutoffs never suffer rounding (torchgfn computes in float32).

Distances follow ``torch.cdist``: ``d(x, y) = (sum_j |x_j - y_j| ** p) ** (1 / p)`` (``p = 1`` the plain sum,
``p = 2`` ``sqrt``, ``p = inf`` the max), accumulated in column order. An item is *far* from a set when its
distance to every member is strictly greater than the cutoff.

Speed: torchgfn builds the full ``batch x buffer`` distance matrix (``torch.cdist``) on every insert. Here

* ``cutoff == 0`` (the default: reject exact duplicates) is a hash lookup, O(batch), with an exact row
  comparison on every hash hit, so a 64-bit collision can never reject a new state;
* ``cutoff > 0`` scans pairs with an early exit: the partial sum only grows, so a pair is known to be far as
  soon as it passes ``cutoff ** p`` (usually after a few columns), and a query stops at its first close
  neighbour. Compiled with numba when installed; the numpy fallback makes the same decisions.
"""
import os
from typing import Dict, List, Optional

import numpy as np

try:  # DING_BUFFER_NO_NUMBA=1 forces the numpy fallback (tests run both)
    if os.environ.get('DING_BUFFER_NO_NUMBA', '') not in ('', '0'):
        raise ImportError('disabled by DING_BUFFER_NO_NUMBA')
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised by the no-numba test run
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        return lambda f: f


# ---------------------------------------------------------------------------------------------------- hashing
_M1 = np.uint64(0xbf58476d1ce4e5b9)
_M2 = np.uint64(0x94d049bb133111eb)
_GOLDEN = np.uint64(0x9e3779b97f4a7c15)


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
    Complexity: O(rows * columns), vectorised.
    """
    rows = np.ascontiguousarray(rows, dtype=np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
    bits = rows.view(np.uint64)
    salt = _mix(np.arange(1, rows.shape[1] + 1, dtype=np.uint64) * _GOLDEN)
    with np.errstate(over='ignore'):
        mixed = _mix(bits ^ salt[None, :])
        return _mix(mixed.sum(axis=1, dtype=np.uint64) + np.uint64(rows.shape[1]))


class StateSet:
    """
    Overview:
        The representations of the stored items, by slot: their hashes (always) and their rows (when
        ``keep_rows``: needed by the distance filter and for exact duplicate checks). ``unique`` is the number
        of distinct hashes (= distinct states, barring a 64-bit collision).
    Interfaces:
        ``add``, ``remove``, ``duplicates_of``, ``far_mask``, ``compact``, ``clear``, ``unique``, ``rows_of``
    Complexity: add/remove O(n) dict operations; ``duplicates_of`` O(n) plus one row comparison per hash hit.
    Not thread-safe (the buffer's lock serialises calls).
    """

    def __init__(self, physical: int, keep_rows: bool) -> None:
        self.keep_rows = keep_rows
        # None until the first push; False for good once a batch comes without one row per item (e.g.
        # Transitions), so that tracked and untracked items never mix
        self.enabled: Optional[bool] = None
        self.dim: Optional[int] = None
        self.hashes = np.zeros(physical, dtype=np.uint64)
        self.rows: Optional[np.ndarray] = None
        self._buckets: Dict[int, List[int]] = {}  # hash -> slots holding it

    @property
    def unique(self) -> int:
        return len(self._buckets)

    def grow(self, physical: int) -> None:
        if physical > len(self.hashes):
            self.hashes = np.concatenate([self.hashes, np.zeros(physical - len(self.hashes), np.uint64)])
            if self.rows is not None:
                self.rows = np.concatenate([self.rows, np.zeros((physical - len(self.rows), self.dim))])

    def check_dim(self, rows: np.ndarray, what: str) -> None:
        if self.dim is not None and rows.shape[1] != self.dim:
            raise ValueError(f"{what} has {rows.shape[1]} values per item, the stored ones have {self.dim}")

    def add(self, slots: np.ndarray, rows: np.ndarray, hashes: np.ndarray) -> None:
        if self.enabled is False:
            return
        self.enabled = True
        if self.dim is None:
            self.dim = rows.shape[1]
            if self.keep_rows:
                self.rows = np.zeros((len(self.hashes), self.dim))
        self.hashes[slots] = hashes
        if self.rows is not None:
            self.rows[slots] = rows
        buckets = self._buckets
        for s, h in zip(slots.tolist(), hashes.tolist()):
            b = buckets.get(h)
            if b is None:
                buckets[h] = [s]
            else:
                b.append(s)

    def remove(self, slots: np.ndarray) -> None:
        if not self.enabled:
            return
        buckets = self._buckets
        for s, h in zip(slots.tolist(), self.hashes[slots].tolist()):
            b = buckets[h]
            b.remove(s)
            if not b:
                del buckets[h]

    def clear(self) -> None:
        self._buckets = {}

    def disable(self) -> None:
        self.enabled = False
        self._buckets = {}

    def compact(self, keep: np.ndarray) -> None:
        """Slot ``keep[i]`` becomes slot ``i`` (container storage after compaction)."""
        if not self.enabled:
            return
        hashes = self.hashes[keep]
        rows = None if self.rows is None else self.rows[keep]
        self.hashes[:len(keep)] = hashes
        if rows is not None:
            self.rows[:len(keep)] = rows
        self._buckets = {}
        if len(keep):
            self.add(np.arange(len(keep), dtype=np.int64), rows if rows is not None else np.zeros((len(keep), 0)),
                     hashes)

    def duplicates_of(self, rows: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Bool mask: row ``i`` equals a stored row (exact comparison on hash hits; needs ``keep_rows``)."""
        out = np.zeros(len(hashes), dtype=bool)
        buckets = self._buckets
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


# ---------------------------------------------------------------------------------------------- distances
_INF_P = -1.0  # p = inf is passed to the kernels as this code


@njit(cache=True, nogil=True)
def _far_kernel(q, refs, ref_slots, cutoff, p, exit_sum, triangular, out):
    """out[i] = every ref (``refs[ref_slots[k]]``; with ``triangular`` only k < i) is at distance > cutoff."""
    d = q.shape[1]
    for i in range(q.shape[0]):
        far = True
        n_refs = i if triangular else ref_slots.shape[0]
        for k in range(n_refs):
            r = ref_slots[k]
            s = 0.0
            for j in range(d):
                diff = abs(q[i, j] - refs[r, j])
                if p == 1.0:
                    s += diff
                elif p == 2.0:
                    s += diff * diff
                elif p == _INF_P:
                    if diff > s:
                        s = diff
                else:
                    s += diff ** p
                if s > exit_sum:  # the partial sum only grows: certainly far
                    break
            if s > exit_sum:
                continue
            if p == 1.0 or p == _INF_P:
                dist = s
            elif p == 2.0:
                dist = np.sqrt(s)
            else:
                dist = s ** (1.0 / p)
            if not dist > cutoff:
                far = False
                break
        out[i] = far


def _exit_sum(cutoff: float, p: float) -> float:
    """A partial sum above this value proves ``distance > cutoff`` (a safe margin over ``cutoff ** p``)."""
    if p == 1.0 or np.isinf(p):
        return cutoff
    if p == 2.0:
        return cutoff * cutoff * (1.0 + 2.0 ** -50)
    if p < 1.0:
        return float('inf')  # s ** (1/p) can underflow for tiny s: always finish the sum
    return cutoff ** p * (1.0 + 1e-12)


def _far_numpy(q, refs, ref_slots, cutoff, p, triangular):
    """The kernel's decisions with whole-array numpy (same sums, same column order)."""
    out = np.ones(len(q), dtype=bool)
    chunk = max(1, (1 << 21) // max(1, len(q)))
    n_refs = len(ref_slots)
    for start in range(0, n_refs, chunk):
        sl = ref_slots[start:start + chunk]
        block = refs[sl]
        s = np.zeros((len(q), len(sl)))
        for j in range(q.shape[1]):
            diff = np.abs(q[:, j, None] - block[None, :, j])
            if p == 1.0:
                s += diff
            elif p == 2.0:
                s += diff * diff
            elif np.isinf(p):
                np.maximum(s, diff, out=s)
            else:
                s += diff ** p
        if p == 1.0 or np.isinf(p):
            dist = s
        elif p == 2.0:
            dist = np.sqrt(s)
        else:
            dist = s ** (1.0 / p)
        close = ~(dist > cutoff)
        if triangular:
            close &= (np.arange(start, start + len(sl))[None, :] < np.arange(len(q))[:, None])
        out &= ~close.any(axis=1)
    return out


def far_mask(queries: np.ndarray, refs: np.ndarray, ref_slots: Optional[np.ndarray], cutoff: float, p: float,
             triangular: bool = False) -> np.ndarray:
    """
    Overview:
        ``mask[i]`` is True iff every reference is at p-norm distance ``> cutoff`` from ``queries[i]``.
        References are ``refs[ref_slots]`` (all rows when ``ref_slots`` is None); ``triangular`` compares
        query ``i`` with queries ``0..i-1`` instead (``refs`` is then ``queries``).
    Complexity: O(queries * refs * columns) worst case; early exit per pair and per query.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float64)
    if ref_slots is None:
        ref_slots = np.arange(len(refs), dtype=np.int64)
    ref_slots = np.ascontiguousarray(ref_slots, dtype=np.int64)
    if len(queries) == 0:
        return np.ones(0, dtype=bool)
    p = float(p)
    if not HAVE_NUMBA:
        return _far_numpy(queries, refs, ref_slots, float(cutoff), p, triangular)
    out = np.empty(len(queries), dtype=np.bool_)
    code = _INF_P if np.isinf(p) else p
    _far_kernel(queries, np.ascontiguousarray(refs, dtype=np.float64), ref_slots, float(cutoff), code,
                _exit_sum(float(cutoff), p), triangular, out)
    return out


def diverse_mask(rows: np.ndarray, hashes: np.ndarray, stored: StateSet, stored_slots: np.ndarray, cutoff: float,
                 p: float):
    """
    Overview:
        torchgfn's two-stage filter on a batch already sorted by reward (descending). Stage 1 keeps item ``i``
        iff it is far from *every* earlier item of the batch (also the ones stage 1 drops: not greedy);
        stage 2 keeps a stage-1 survivor iff it is far from every stored item. ``cutoff == 0`` means exact
        duplicates and runs on hashes.
    Returns:
        - keep (:obj:`np.ndarray`): bool mask over the batch.
    """
    if cutoff == 0.0:
        keep = first_occurrences(rows, hashes)
        idx = np.flatnonzero(keep)
        keep[idx[stored.duplicates_of(rows[idx], hashes[idx])]] = False
        return keep
    keep = far_mask(rows, rows, None, cutoff, p, triangular=True)
    idx = np.flatnonzero(keep)
    if len(idx) and len(stored_slots):
        keep[idx[~far_mask(rows[idx], stored.rows, stored_slots, cutoff, p)]] = False
    return keep

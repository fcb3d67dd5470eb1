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
from typing import Dict, List, Optional

import numpy as np

from .._numba import HAVE_NUMBA, njit


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
            if self.pdist is not None:
                self.pdist = np.concatenate([self.pdist, np.zeros((physical - len(self.pdist), N_PIVOTS))])
            if self.sqnorm is not None:
                self.sqnorm = np.concatenate([self.sqnorm, np.zeros(physical - len(self.sqnorm))])

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
                if self.p >= 1.0 and len(rows):
                    self.pivots = choose_pivots(rows, self.p)
                    self.pdist = np.zeros((len(self.hashes), N_PIVOTS))
                if self.p == 2.0:
                    self.sqnorm = np.zeros(len(self.hashes))
        self.hashes[slots] = hashes
        if self.rows is not None:
            self.rows[slots] = rows
        if self.pdist is not None:
            self.pdist[slots] = self.pivot_distances(rows)
        if self.sqnorm is not None:
            self.sqnorm[slots] = np.einsum('ij,ij->i', rows, rows)
        self._bucket(slots, hashes)

    def _bucket(self, slots: np.ndarray, hashes: np.ndarray) -> None:
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
        m = len(keep)
        for arr in (self.hashes, self.rows, self.pdist, self.sqnorm):
            if arr is not None:
                arr[:m] = arr[keep]  # advanced indexing copies first, so overlapping moves are safe
        self._buckets = {}
        self._bucket(np.arange(m, dtype=np.int64), self.hashes[:m])

    def pivot_distances(self, rows: np.ndarray) -> Optional[np.ndarray]:
        """``(len(rows), N_PIVOTS)`` distances to the pivots, or None when there are none (yet)."""
        return None if self.pivots is None else pnorm_distances(rows, self.pivots, self.p)

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
N_PIVOTS = 4


@njit(cache=True, nogil=True)
def _close(q, i, refs, r, cutoff, p, exit_sum):
    """distance(q[i], refs[r]) <= cutoff, with an early exit once the partial sum proves it is larger."""
    s = 0.0
    for j in range(q.shape[1]):
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
            return False
    if p == 1.0 or p == _INF_P:
        dist = s
    elif p == 2.0:
        dist = np.sqrt(s)
    else:
        dist = s ** (1.0 / p)
    return not dist > cutoff


@njit(cache=True, nogil=True)
def _pruned(dq, i, drefs, r, lb_cut):
    """The pivot lower bound max_k |d(q, P_k) - d(y, P_k)| <= d(q, y) already exceeds the cutoff."""
    for k in range(dq.shape[1]):
        if abs(dq[i, k] - drefs[r, k]) > lb_cut:
            return True
    return False


@njit(cache=True, nogil=True)
def _far_kernel(q, dq, refs, drefs, order, keys, cutoff, lb_cut, p, exit_sum, pivots, out):
    """out[i] = every ref is at distance > cutoff. ``order`` lists the candidate ref rows sorted by their
    distance to pivot 0 (``keys``), so only the window ``keys in d(q, P_0) -+ lb_cut`` is scanned."""
    for i in range(q.shape[0]):
        if pivots:
            lo = np.searchsorted(keys, dq[i, 0] - lb_cut, side='left')
            hi = np.searchsorted(keys, dq[i, 0] + lb_cut, side='right')
        else:
            lo, hi = 0, order.shape[0]
        far = True
        for t in range(lo, hi):
            r = order[t]
            if pivots and _pruned(dq, i, drefs, r, lb_cut):
                continue
            if _close(q, i, refs, r, cutoff, p, exit_sum):
                far = False
                break
        out[i] = far


@njit(cache=True, nogil=True)
def _far_earlier_kernel(q, dq, cutoff, lb_cut, p, exit_sum, pivots, out):
    """out[i] = every q[k], k < i, is at distance > cutoff."""
    for i in range(q.shape[0]):
        far = True
        for k in range(i):
            if pivots and _pruned(dq, i, dq, k, lb_cut):
                continue
            if _close(q, i, q, k, cutoff, p, exit_sum):
                far = False
                break
        out[i] = far


@njit(cache=True, nogil=True)
def _far_gram_kernel(q, refs, ref_slots, gram, qn, rn, cutoff, thr_sq, tol, p, exit_sum, out):
    """Like ``_far_kernel``, pruning with the Euclidean distance from a Gram matrix: for p <= 2,
    d_p >= d_2, so a pair with ``|q|^2 + |y|^2 - 2 q.y - tol > cutoff^2`` is certainly far. The rest is
    checked exactly."""
    for i in range(q.shape[0]):
        far = True
        for t in range(ref_slots.shape[0]):
            r = ref_slots[t]
            scale = qn[i] + rn[r]
            if scale - 2.0 * gram[i, r] - tol * scale > thr_sq:
                continue
            if _close(q, i, refs, r, cutoff, p, exit_sum):
                far = False
                break
        out[i] = far


def pnorm_distances(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """``(len(a), len(b))`` p-norm distances (numpy; used for the few pivots, not for decisions)."""
    diff = np.abs(a[:, None, :] - b[None, :, :])
    if np.isinf(p):
        return diff.max(axis=2) if diff.shape[2] else np.zeros(diff.shape[:2])
    return (diff ** p).sum(axis=2) ** (1.0 / p)


def choose_pivots(rows: np.ndarray, p: float, k: int = N_PIVOTS) -> np.ndarray:
    """The origin, then greedily the row farthest from the pivots chosen so far (spread-out references)."""
    pivots = [np.zeros(rows.shape[1])]
    dmin = pnorm_distances(rows, pivots[0][None], p)[:, 0]
    for _ in range(k - 1):
        far = int(np.argmax(dmin))
        pivots.append(rows[far].copy())
        dmin = np.minimum(dmin, pnorm_distances(rows, rows[far][None], p)[:, 0])
    return np.stack(pivots)


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


def _lb_cut(cutoff: float, *dists: np.ndarray) -> float:
    """The cutoff plus a tolerance for rounding in the pivot distances (pruning stays conservative)."""
    scale = max([1.0] + [float(d.max()) for d in dists if d is not None and d.size])
    return cutoff + 1e-9 * scale


def far_mask(queries: np.ndarray, refs: np.ndarray, ref_slots: Optional[np.ndarray], cutoff: float, p: float,
             triangular: bool = False, q_pivot: Optional[np.ndarray] = None,
             ref_pivot: Optional[np.ndarray] = None, ref_sqnorm: Optional[np.ndarray] = None) -> np.ndarray:
    """
    Overview:
        ``mask[i]`` is True iff every reference is at p-norm distance ``> cutoff`` from ``queries[i]``.
        References are ``refs[ref_slots]`` (all rows when ``ref_slots`` is None); ``triangular`` compares
        query ``i`` with queries ``0..i-1`` instead. With pivot distances (``q_pivot`` / ``ref_pivot``,
        ``(n, N_PIVOTS)``; p >= 1 only, where the triangle inequality holds) pairs whose pivot lower bound
        exceeds the cutoff are skipped, and the references are scanned only in the window of pivot-0 distance
        around each query. Decisions are exact either way.
    Complexity: O(queries * candidates * columns) worst case; the pivot window and early exits make
    candidates a small fraction of the references when the cutoff is small next to the spread of the data.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float64)
    if ref_slots is None:
        ref_slots = np.arange(len(queries) if triangular else len(refs), dtype=np.int64)
    ref_slots = np.ascontiguousarray(ref_slots, dtype=np.int64)
    if len(queries) == 0:
        return np.ones(0, dtype=bool)
    p, cutoff = float(p), float(cutoff)
    if not HAVE_NUMBA:
        return _far_numpy(queries, queries if triangular else refs, ref_slots, cutoff, p, triangular)
    out = np.empty(len(queries), dtype=np.bool_)
    code = _INF_P if np.isinf(p) else p
    pivots = q_pivot is not None and (triangular or ref_pivot is not None) and p >= 1.0
    dq = np.ascontiguousarray(q_pivot if pivots else np.zeros((len(queries), 1)), dtype=np.float64)
    if triangular:
        _far_earlier_kernel(queries, dq, cutoff, _lb_cut(cutoff, dq), code, _exit_sum(cutoff, p), pivots, out)
        return out
    if ref_sqnorm is not None and p == 2.0:
        # one BLAS product gives every pair's Euclidean distance up to rounding; the relative tolerance
        # bounds the error of |q|^2 + |y|^2 - 2 q.y in float64 (D products per dot, a few ulps each)
        refs64 = np.ascontiguousarray(refs, dtype=np.float64)
        gram = queries @ refs64.T
        qn = np.einsum('ij,ij->i', queries, queries)
        tol = (queries.shape[1] + 8) * 4.0 * np.finfo(np.float64).eps
        _far_gram_kernel(queries, refs64, ref_slots, gram, qn, np.ascontiguousarray(ref_sqnorm), cutoff,
                         cutoff * cutoff, tol, code, _exit_sum(cutoff, p), out)
        return out
    if pivots:
        keys_all = ref_pivot[ref_slots, 0]
        sort = np.argsort(keys_all, kind='stable')
        order, keys = ref_slots[sort], np.ascontiguousarray(keys_all[sort])
        drefs = np.ascontiguousarray(ref_pivot, dtype=np.float64)
        lb_cut = _lb_cut(cutoff, dq, keys)
    else:
        order, keys, drefs, lb_cut = ref_slots, np.zeros(0), np.zeros((1, 1)), np.inf
    _far_kernel(queries, dq, np.ascontiguousarray(refs, dtype=np.float64), drefs, order, keys, cutoff, lb_cut, code,
                _exit_sum(cutoff, p), pivots, out)
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
    dq = stored.pivot_distances(rows)
    keep = far_mask(rows, rows, None, cutoff, p, triangular=True, q_pivot=dq)
    idx = np.flatnonzero(keep)
    if len(idx) and len(stored_slots):
        far = far_mask(rows[idx], stored.rows, stored_slots, cutoff, p, q_pivot=None if dq is None else dq[idx],
                       ref_pivot=stored.pdist, ref_sqnorm=stored.sqnorm)
        keep[idx[~far]] = False
    return keep

"""The p-norm distance filter behind ``cutoff > 0`` of the ``gfn_diverse`` buffer: ``far_mask`` decides, for
each query row, whether every reference row is farther than the cutoff; pivot distances (``choose_pivots``,
``pnorm_distances``) give the lower bounds that let it skip most pairs.

Distances follow ``torch.cdist``: ``d(x, y) = (sum_j |x_j - y_j| ** p) ** (1 / p)`` (``p = 1`` the plain sum,
``p = 2`` ``sqrt``, ``p = inf`` the max), accumulated in column order. An item is *far* from a set when its
distance to every member is strictly greater than the cutoff.

Speed: torchgfn builds the full ``batch x buffer`` distance matrix (``torch.cdist``) on every insert. Here pairs
are scanned with an early exit: the partial sum only grows, so a pair is known to be far as soon as it passes
``cutoff ** p`` (usually after a few columns), and a query stops at its first close neighbour. Compiled with
numba when installed; the numpy fallback makes the same decisions.
"""

import math
from typing import Optional

import numpy as np

from .._numba import HAVE_NUMBA, njit, ready  # noqa: F401 (HAVE_NUMBA re-exported)

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
            s += diff**p
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
    """The pivot lower bound max_k |d(q, P_k) - d(y, P_k)| <= d(q, y) already exceeds the cutoff (a pivot distance
    that overflowed to inf bounds nothing)."""
    for k in range(dq.shape[1]):
        a, b = dq[i, k], drefs[r, k]
        if abs(a - b) > lb_cut and math.isfinite(a) and math.isfinite(b):
            return True
    return False


@njit(cache=True, nogil=True)
def _far_kernel(q, dq, refs, drefs, order, keys, cutoff, lb_cut, p, exit_sum, pivots, out):
    """out[i] = every ref is at distance > cutoff. ``order`` lists the candidate ref rows sorted by their
    distance to pivot 0 (``keys``), so only the window ``keys in d(q, P_0) -+ lb_cut`` is scanned."""
    n = order.shape[0]
    tail = np.searchsorted(keys, np.inf, side='left')  # refs from tail on: their pivot distance overflowed (no bound)
    for i in range(q.shape[0]):
        if pivots and math.isfinite(dq[i, 0]):
            lo = np.searchsorted(keys, dq[i, 0] - lb_cut, side='left')
            hi = np.searchsorted(keys, dq[i, 0] + lb_cut, side='right')
        else:
            lo, hi = 0, n
        far = _far_from(q, dq, i, refs, drefs, order, lo, hi, cutoff, lb_cut, p, exit_sum, pivots)
        if far and max(tail, hi) < n:
            far = _far_from(q, dq, i, refs, drefs, order, max(tail, hi), n, cutoff, lb_cut, p, exit_sum, pivots)
        out[i] = far


@njit(cache=True, nogil=True)
def _far_earlier_kernel(q, dq, cutoff, lb_cut, p, exit_sum, pivots, out):
    """out[i] = every q[k], k < i, is at distance > cutoff."""
    order = np.arange(q.shape[0])
    for i in range(q.shape[0]):
        out[i] = _far_from(q, dq, i, q, dq, order, 0, i, cutoff, lb_cut, p, exit_sum, pivots)


@njit(cache=True, nogil=True)
def _far_from(q, dq, i, refs, drefs, order, lo, hi, cutoff, lb_cut, p, exit_sum, pivots):
    """Whether q[i] is farther than ``cutoff`` from every ref ``order[lo:hi]`` (pivot bounds prune first)."""
    for t in range(lo, hi):
        r = order[t]
        if pivots and _pruned(dq, i, drefs, r, lb_cut):
            continue
        if _close(q, i, refs, r, cutoff, p, exit_sum):
            return False
    return True


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
    if p in (1.0, 2.0) or not diff.shape[2]:
        with np.errstate(over='ignore'):  # huge states: inf (see _lb_cut)
            return (diff**p).sum(axis=2) ** (1.0 / p)
    return _pair_distances(a, b, p)  # |d| ** p would overflow (or underflow) at a large p


def choose_pivots(rows: np.ndarray, p: float, k: int = N_PIVOTS) -> np.ndarray:
    """The origin, then greedily the row farthest from the pivots chosen so far (spread-out references)."""
    pivots = [np.zeros(rows.shape[1])]
    dmin = pnorm_distances(rows, pivots[0][None], p)[:, 0]
    for _ in range(k - 1):
        far = int(np.argmax(dmin))
        pivots.append(rows[far].copy())
        dmin = np.minimum(dmin, pnorm_distances(rows, rows[far][None], p)[:, 0])
    return np.stack(pivots)


def _normal(cutoff: float, p: float) -> bool:
    """Whether ``cutoff ** p`` is a normal float64 (neither overflows nor underflows)."""
    try:
        return float(np.finfo(np.float64).tiny) <= cutoff**p < float('inf')
    except OverflowError:
        return False


def _exit_sum(cutoff: float, p: float) -> float:
    """A partial sum above this value proves ``distance > cutoff`` (a safe margin over ``cutoff ** p``)."""
    if p == 1.0 or np.isinf(p):
        return cutoff
    if p == 2.0:
        return cutoff * cutoff * (1.0 + 2.0**-50)
    if p < 1.0:
        return float('inf')  # s ** (1/p) can underflow for tiny s: always finish the sum
    try:
        return cutoff**p * (1.0 + 1e-12)
    except OverflowError:  # cutoff ** p beyond float64 (10 ** 400): no partial sum proves far, finish each one
        return float('inf')


@np.errstate(over='ignore')  # huge states at a large p: sums of inf, as in the kernel
def _far_numpy(q, refs, ref_slots, cutoff, p, triangular, by_pair=False):
    """The kernel's decisions with whole-array numpy (same sums, same column order). ``by_pair``: where
    ``cutoff ** p`` is out of float64's range (a tiny or huge cutoff, a large p), each pair's distance is taken in
    units of its largest difference (``_pair_distances``), so no power overflows or underflows."""
    out = np.ones(len(q), dtype=bool)
    chunk = max(1, (1 << 21) // max(1, len(q)))
    n_refs = len(ref_slots)
    for start in range(0, n_refs, chunk):
        sl = ref_slots[start : start + chunk]
        block = refs[sl]
        if by_pair:
            close = ~(_pair_distances(q, block, p) > cutoff)
            if triangular:
                close &= np.arange(start, start + len(sl))[None, :] < np.arange(len(q))[:, None]
            out &= ~close.any(axis=1)
            continue
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
                s += diff**p
        if p == 1.0 or np.isinf(p):
            dist = s
        elif p == 2.0:
            dist = np.sqrt(s)
        else:
            dist = s ** (1.0 / p)
        close = ~(dist > cutoff)
        if triangular:
            close &= np.arange(start, start + len(sl))[None, :] < np.arange(len(q))[:, None]
        out &= ~close.any(axis=1)
    return out


@np.errstate(over='ignore', under='ignore', invalid='ignore')
def _pair_distances(q: np.ndarray, block: np.ndarray, p: float) -> np.ndarray:
    """``(len(q), len(block))`` p-norm distances as ``top * (sum (diff / top) ** p) ** (1 / p)``, ``top`` each
    pair's largest difference: every term is at most 1 and the sum at most the width."""
    top = np.zeros((len(q), len(block)))
    for j in range(q.shape[1]):
        np.maximum(top, np.abs(q[:, j, None] - block[None, :, j]), out=top)
    unit = np.where(top > 0, top, 1.0)
    s = np.zeros_like(top)
    for j in range(q.shape[1]):
        s += (np.abs(q[:, j, None] - block[None, :, j]) / unit) ** p
    return np.where(np.isinf(top), np.inf, top * s ** (1.0 / p))  # (a difference beyond float64: inf / inf)


def _lb_cut(cutoff: float, *dists: np.ndarray) -> float:
    """The cutoff plus a tolerance for rounding in the pivot distances (pruning stays conservative). A distance that
    overflowed (inf: huge states at a large p) sets no scale: an infinite cut would make every pivot window NaN
    (empty), and such rows are only ever in reach of each other, which the window still scans."""
    scale = 1.0
    for d in dists:
        if d is not None and d.size:
            top = float(d.max())
            if not np.isfinite(top):
                finite = d[np.isfinite(d)]
                top = float(finite.max()) if finite.size else 1.0
            scale = max(scale, top)
    return cutoff + 1e-9 * scale


def far_mask(
    queries: np.ndarray,
    refs: np.ndarray,
    ref_slots: Optional[np.ndarray],
    cutoff: float,
    p: float,
    triangular: bool = False,
    q_pivot: Optional[np.ndarray] = None,
    ref_pivot: Optional[np.ndarray] = None,
    ref_sqnorm: Optional[np.ndarray] = None,
) -> np.ndarray:
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
    Examples:
        >>> queries, refs = np.array([[0.0, 0.0], [5.0, 5.0]]), np.array([[0.0, 1.0], [9.0, 9.0]])
        >>> far_mask(queries, refs, None, cutoff=1.0, p=2.0).tolist()  # [0, 0] is at distance 1 (not > 1) of [0, 1]
        [False, True]
        >>> far_mask(queries, refs, None, cutoff=0.5, p=2.0).tolist()
        [True, True]
    """
    queries = np.ascontiguousarray(queries, dtype=np.float64)
    if ref_slots is None:
        ref_slots = np.arange(len(queries) if triangular else len(refs), dtype=np.int64)
    ref_slots = np.ascontiguousarray(ref_slots, dtype=np.int64)
    if len(queries) == 0:
        return np.ones(0, dtype=bool)
    p, cutoff = float(p), float(cutoff)
    by_pair = p != 1.0 and not np.isinf(p) and cutoff > 0 and not _normal(cutoff, p)
    if by_pair or not ready():  # (no numba, or its kernels still loading: numpy gives the same mask)
        return _far_numpy(queries, queries if triangular else refs, ref_slots, cutoff, p, triangular, by_pair)
    out = np.empty(len(queries), dtype=np.bool_)
    code = _INF_P if np.isinf(p) else p
    exit_sum = _exit_sum(cutoff, p)
    pivots = q_pivot is not None and (triangular or ref_pivot is not None) and p >= 1.0
    dq = np.ascontiguousarray(q_pivot if pivots else np.zeros((len(queries), 1)), dtype=np.float64)
    if triangular:
        _far_earlier_kernel(queries, dq, cutoff, _lb_cut(cutoff, dq), code, exit_sum, pivots, out)
        return out
    refs64 = np.ascontiguousarray(refs, dtype=np.float64)
    if ref_sqnorm is not None and p == 2.0:
        # one BLAS product gives every pair's Euclidean distance up to rounding; the relative tolerance
        # bounds the error of |q|^2 + |y|^2 - 2 q.y in float64 (D products per dot, a few ulps each)
        gram = queries @ refs64.T
        qn = np.einsum('ij,ij->i', queries, queries)
        tol = (queries.shape[1] + 8) * 4.0 * np.finfo(np.float64).eps
        rn = np.ascontiguousarray(ref_sqnorm)
        _far_gram_kernel(queries, refs64, ref_slots, gram, qn, rn, cutoff, cutoff * cutoff, tol, code, exit_sum, out)
        return out
    if pivots:
        keys_all = ref_pivot[ref_slots, 0]
        sort = np.argsort(keys_all, kind='stable')
        order, keys = ref_slots[sort], np.ascontiguousarray(keys_all[sort])
        drefs = np.ascontiguousarray(ref_pivot, dtype=np.float64)
        lb_cut = _lb_cut(cutoff, dq, keys)
    else:
        order, keys, drefs, lb_cut = ref_slots, np.zeros(0), np.zeros((1, 1)), np.inf
    _far_kernel(queries, dq, refs64, drefs, order, keys, cutoff, lb_cut, code, exit_sum, pivots, out)
    return out

"""Uniform index sampling that costs O(batch), not O(population).

The legacy ``np.random.choice(n, k, replace=False)`` permutes all ``n`` items (O(n)); at n = 1e6 that
dominates a learner step (DI-engine's naive buffer). ``uniform_indices`` draws with replacement and keeps
first occurrences -- a uniformly random ordered k-subset (sequential sampling with rejection of repeats), O(k)
whatever ``n`` -- switching to a partial permutation only when k is at least a quarter of n (then O(n) = O(k)).
Its integers are ``floor(u * n)`` of the generator's 53-bit uniform doubles (``below``): a batch of them costs a
fraction of ``Generator.integers`` / ``Generator.choice``, whose fixed cost per call is several microseconds.
"""

import numpy as np

from ._numba import njit, ready

# Above this fraction of the population a permutation is cheaper than rejection.
_PERMUTATION_FRACTION = 0.25


def below(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """
    Overview:
        ``size`` integers uniform in ``[0, n)`` (int64): ``floor(u * n)`` of uniform doubles ``u = j / 2**53``.
        Each value has probability within ``n / 2**53`` of ``1 / n`` (below 1e-8 relative for n <= 1e8). The
        product of ``u <= 1 - 2**-53`` and an integer ``n <= 2**53`` rounds to below ``n`` (the gap between
        ``n`` and the next double below it is at least ``n * 2**-53``); larger ``n`` are clipped.
    Examples:
        >>> idx = below(np.random.default_rng(0), 10, 1000)
        >>> idx.dtype, int(idx.min()), int(idx.max()), len(set(idx.tolist()))
        (dtype('int64'), 0, 9, 10)
    """
    if n <= 0:
        raise ValueError(f"cannot draw indices from a population of {n}")
    u = rng.random(size)
    u *= n
    out = u.astype(np.int64)
    return out if n <= 2**53 else np.minimum(out, n - 1, out=out)


def uniform_indices(rng: np.random.Generator, n: int, size: int, replace: bool = False) -> np.ndarray:
    """
    Overview:
        ``size`` indices in ``[0, n)``, uniformly; distinct and in random order when ``replace`` is False.
    Arguments:
        - rng (:obj:`np.random.Generator`): the random source.
        - n (:obj:`int`): population size (> 0).
        - size (:obj:`int`): number of indices (<= n when ``replace`` is False).
    Returns:
        - indices (:obj:`np.ndarray`): int64 array of shape ``(size,)``.
    Complexity: O(size) expected; O(n) when ``size`` is at least a quarter of ``n`` (a partial permutation).
    """
    if replace:
        return below(rng, n, size)
    if size > n:
        raise ValueError(f"cannot draw {size} distinct indices from {n}")
    if size == 0:
        return np.empty(0, dtype=np.int64)
    if size >= _PERMUTATION_FRACTION * n:
        return rng.permutation(n)[:size].astype(np.int64, copy=False)
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < size:
        need = size - len(chosen)
        draws = below(rng, n, need + need // 4 + 8)
        chosen = first_distinct(np.concatenate([chosen, draws]) if len(chosen) else draws, size)
    return chosen


@njit(cache=True, nogil=True)
def _first_distinct_loop(values, size, out):
    """Open addressing with linear probing in a table of a power-of-two size at least twice ``values``: the values
    are uniform draws, so their low bits are a good hash."""
    cap = 16
    while cap < 2 * values.shape[0]:
        cap *= 2
    table = np.full(cap, -1, dtype=np.int64)
    mask = cap - 1
    k = 0
    for v in values:
        if k == size:
            break
        h = v & mask
        while table[h] != -1 and table[h] != v:
            h = (h + 1) & mask
        if table[h] == -1:
            table[h] = v
            out[k] = v
            k += 1
    return k


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d array by a sort and a mask of the first value of each run: numpy 2's
    ``np.unique`` hashes integers instead, some 50x slower for a million of them (a state's ids, checked on every
    load)."""
    s = np.sort(np.asarray(values).reshape(-1))
    if len(s) < 2:
        return s
    first = np.empty(len(s), dtype=bool)
    first[0] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    return s[first]


def first_distinct(values: np.ndarray, size: int) -> np.ndarray:
    """The first ``size`` distinct entries of ``values`` (non-negative), in order of first occurrence. O(len)."""
    if ready():  # until the kernels are loaded, numpy gives the same result
        out = np.empty(min(size, len(values)), dtype=np.int64)
        k = _first_distinct_loop(values, size, out)
        return out[:k]
    _, first = np.unique(values, return_index=True)
    first.sort()  # order of first occurrence; already-chosen items keep their place at the front
    return values[first][:size]

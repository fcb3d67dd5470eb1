"""Uniform index sampling that costs O(batch), not O(population).

The legacy ``np.random.choice(n, k, replace=False)`` permutes all ``n`` items (O(n)); at n = 1e6 that
dominates a learner step (DI-engine's naive buffer). ``Generator.choice`` is O(k) only on its Floyd path
(n > 10000 and k <= n / 50); otherwise it shuffles the whole population. ``uniform_indices`` uses that fast
path where it applies, and elsewhere draws with replacement keeping first occurrences -- a uniformly random
ordered k-subset (sequential sampling with rejection of repeats) -- switching to a partial permutation only
when k is at least a quarter of n (then O(n) = O(k)).
"""

import numpy as np

from ._numba import njit, ready

# Above this fraction of the population a permutation is cheaper than rejection.
_PERMUTATION_FRACTION = 0.25
# numpy's Generator.choice(replace=False) uses Floyd's O(k) algorithm under exactly these conditions.
_FLOYD_MIN_POPULATION = 10000
_FLOYD_RATIO = 50


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
    Complexity: O(size log size) expected.
    """
    if replace:
        return rng.integers(0, n, size=size, dtype=np.int64)
    if size > n:
        raise ValueError(f"cannot draw {size} distinct indices from {n}")
    if n > _FLOYD_MIN_POPULATION and size * _FLOYD_RATIO <= n:
        return rng.choice(n, size, replace=False).astype(np.int64, copy=False)
    if size >= _PERMUTATION_FRACTION * n:
        return rng.permutation(n)[:size].astype(np.int64, copy=False)
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < size:
        need = size - len(chosen)
        draws = rng.integers(0, n, size=need + need // 4 + 8, dtype=np.int64)
        chosen = first_distinct(np.concatenate([chosen, draws]), n, size)
    return chosen


@njit(cache=True, nogil=True)
def _first_distinct_loop(values, n, size, mark, out):
    k = 0
    for v in values:
        if not mark[v]:
            mark[v] = True
            out[k] = v
            k += 1
            if k == size:
                break
    return k


def first_distinct(values: np.ndarray, n: int, size: int) -> np.ndarray:
    """The first ``size`` distinct entries of ``values`` (all in ``[0, n)``), in order of first occurrence."""
    if ready():  # until the kernels are loaded, numpy gives the same result
        out = np.empty(min(size, len(values)), dtype=np.int64)
        k = _first_distinct_loop(values, n, size, np.zeros(n, dtype=np.bool_), out)
        return out[:k]
    _, first = np.unique(values, return_index=True)
    first.sort()  # order of first occurrence; already-chosen items keep their place at the front
    return values[first][:size]

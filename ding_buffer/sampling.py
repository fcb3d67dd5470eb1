"""Uniform index sampling that costs O(batch), not O(population).

``np.random.choice(n, k, replace=False)`` permutes all ``n`` items (O(n)); at n = 1e6 that dominates a
learner step. ``uniform_indices`` instead draws with replacement and keeps first occurrences, which yields a
uniformly random ordered k-subset (sequential sampling with rejection of repeats); it needs a few rounds
only when k is a sizeable fraction of n, where it switches to a partial permutation (then O(n) = O(k)).
"""
import numpy as np

# Above this fraction of the population a permutation is cheaper than rejection.
_PERMUTATION_FRACTION = 0.25


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
    if size >= _PERMUTATION_FRACTION * n:
        return rng.permutation(n)[:size].astype(np.int64, copy=False)
    chosen = np.empty(0, dtype=np.int64)
    while len(chosen) < size:
        need = size - len(chosen)
        draws = rng.integers(0, n, size=need + need // 4 + 8, dtype=np.int64)
        combined = np.concatenate([chosen, draws])
        _, first = np.unique(combined, return_index=True)
        first.sort()  # order of first occurrence; already-chosen items keep their place at the front
        chosen = combined[first][:size]
    return chosen

"""The uniform draw behind every uniform sampler (``ding_buffer.sampling.uniform_indices``): distinct indices in
range, uniform at every position (chi-square), with and without replacement, and O(size) work -- no
population-sized permutation -- where the sample is small next to the population."""

import numpy as np
import pytest
from helpers import NoPermutationGenerator, chi_square

from ding_buffer.sampling import sorted_unique, uniform_indices

# 0.999 quantile of the chi-square distribution with 49 degrees of freedom.
CHI2_49_Q999 = 85.35


@pytest.mark.parametrize('n,size', [(1000, 7), (50, 10), (50, 13), (50, 50), (1, 1), (7, 1)])
def test_uniform_indices_distinct_in_range(n, size):
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx = uniform_indices(rng, n, size)
        assert idx.dtype == np.int64 and idx.shape == (size,)
        assert len(np.unique(idx)) == size
        assert idx.min() >= 0 and idx.max() < n


@pytest.mark.parametrize('size', [5, 40])  # 5 < 50/4: rejection path; 40 >= 50/4: permutation path
@pytest.mark.parametrize('position', [0, -1])
def test_uniform_indices_is_uniform_per_position(size, position):
    rng = np.random.default_rng(size)
    counts = np.zeros(50)
    rounds = 10000
    for _ in range(rounds):
        counts[uniform_indices(rng, 50, size)[position]] += 1
    assert chi_square(counts, rounds / 50) < CHI2_49_Q999


def test_uniform_indices_rejection_path_avoids_permutation():
    rng = NoPermutationGenerator(np.random.PCG64(0))
    idx = uniform_indices(rng, 1000, 249)  # just below n / 4
    assert len(np.unique(idx)) == 249


def test_uniform_indices_permutation_path_is_used_for_large_fractions():
    NoPermutationGenerator.permutation_calls = 0
    rng = NoPermutationGenerator(np.random.PCG64(0))
    with pytest.raises(AssertionError, match='permutation'):
        uniform_indices(rng, 1000, 250)
    assert NoPermutationGenerator.permutation_calls == 1


def test_uniform_indices_with_replacement():
    rng = np.random.default_rng(0)
    idx = uniform_indices(rng, 3, 1000, replace=True)
    assert idx.shape == (1000,) and idx.dtype == np.int64
    assert set(idx.tolist()) == {0, 1, 2}
    counts = np.bincount(uniform_indices(rng, 50, 10000, replace=True), minlength=50)
    assert chi_square(counts, 10000 / 50) < CHI2_49_Q999


@pytest.mark.parametrize('replace', [False, True])
def test_uniform_indices_of_size_zero_is_empty(replace):
    for n in (1, 10, 10**6):
        idx = uniform_indices(np.random.default_rng(0), n, 0, replace=replace)
        assert idx.dtype == np.int64 and idx.shape == (0,)


def test_uniform_indices_from_an_empty_population_raises():
    with pytest.raises(ValueError, match='population of 0'):
        uniform_indices(np.random.default_rng(0), 0, 3, replace=True)


def test_uniform_indices_more_than_population_without_replacement_raises():
    with pytest.raises(ValueError):
        uniform_indices(np.random.default_rng(0), 5, 6)


def test_uniform_indices_small_fraction_of_a_large_population_is_distinct_and_uniform():
    """n > 10000 and size <= n/50: distinct, in range, uniform over the population's deciles."""
    rng = np.random.default_rng(7)
    n, size, rounds = 20_000, 100, 2_000
    counts = np.zeros(10, dtype=np.int64)  # per decile of the population
    for _ in range(rounds):
        idx = uniform_indices(rng, n, size)
        assert idx.dtype == np.int64 and len(np.unique(idx)) == size
        assert idx.min() >= 0 and idx.max() < n
        counts += np.bincount(idx * 10 // n, minlength=10)
    expected = rounds * size / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 0.999 quantile, 9 dof


@pytest.mark.parametrize('dtype', [np.int64, np.uint64, np.float64, np.int32])
def test_sorted_unique_is_numpys_unique(dtype):
    """The sort-based ``np.unique`` that loads check ids with (numpy 2's own hashes integers, ~50x slower at 1e6)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 3, 17, 1000):
        for high in (1, 5, 10**6):
            x = rng.integers(0, high, n).astype(dtype)
            got = sorted_unique(x)
            assert got.dtype == x.dtype and np.array_equal(got, np.unique(x)), (n, high)
    assert sorted_unique(np.array([2**64 - 1, 0, 2**64 - 1], dtype=np.uint64)).tolist() == [0, 2**64 - 1]

"""Tests for ``ding_buffer.segment_tree`` and ``ding_buffer.tree_kernels``, checked against brute-force numpy.

Covers DI-engine's segment-tree semantics (power-of-two capacity, ``reduce`` over ``[start, end)``, the
strictly-greater rule of ``find_prefixsum_idx`` with its test vector), batched updates (last write wins),
error handling, bit-identical numba / numpy backends (also with ``DING_BUFFER_NO_NUMBA=1`` in a subprocess),
``PriorityTree`` (sum / positive-min / max over shared leaves, sampling frequencies) and persistence.

Sums over dyadic leaves (multiples of 1/8) are exact in float64 whatever the summation order, so those tests
compare sums and ``find_prefixsum_idx`` results exactly against ``np.cumsum`` / ``np.searchsorted``.
"""

import json
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from helpers import REPO_ROOT, subprocess_env

from ding_buffer import tree_kernels as kern
from ding_buffer.segment_tree import (
    MaxSegmentTree,
    MinSegmentTree,
    PriorityTree,
    SegmentTree,
    SumSegmentTree,
    next_power_of_two,
)

CAPACITIES = [1, 2, 4, 8, 16, 64, 512, 4096, 2**16]

# DI-engine's test vector (ding/utils/tests/test_segment_tree.py): leaves and (prefixsum -> index) pairs.
DI_LEAVES = [0.0, 0.1, 0.5, 0.0, 0.0, 0.2, 0.8, 0.0]
DI_QUERIES = [(0.0, 1), (0.09, 1), (0.1, 2), (0.59, 2), (0.6, 5), (0.799, 5), (0.8, 6)]  # plus total -> 6
DI_TOTAL_IDX = 6


# ====================================================================== helpers


def seed_of(*parts):
    """A deterministic seed from test parameters (``hash`` of a str changes between processes)."""
    return zlib.crc32(repr(parts).encode())


def dyadic(rng, n, zero_frac=0.3):
    """``n`` non-negative multiples of 1/8 (some small integers, ~``zero_frac`` zeros): sums are exact."""
    vals = rng.integers(0, 33, n) / 8.0
    big = rng.random(n) < 0.05
    vals[big] = rng.integers(1, 1000, int(big.sum())).astype(np.float64)
    vals[rng.random(n) < zero_frac] = 0.0
    return vals


def messy(rng, n, negative=False, zero_frac=0.2):
    """``n`` floats over many magnitudes (rounding differs with the summation order), some zeros."""
    vals = rng.random(n) * 10.0 ** rng.integers(-6, 7, n)
    if negative:
        vals *= rng.choice([-1.0, 1.0], n)
    vals[rng.random(n) < zero_frac] = 0.0
    return vals


def batch_indices(rng, cap, k):
    """``k`` random indices in ``[0, cap)`` plus deliberate repeats, shuffled (int64)."""
    idx = rng.integers(0, cap, k)
    dup = rng.choice(idx, size=k // 3 + 1)
    idx = np.concatenate([idx, dup])
    rng.shuffle(idx)
    return idx.astype(np.int64)


def apply_in_order(ref, idx, vals):
    """Brute-force reference of a batched write: writes happen in order, so the last write wins."""
    for i, v in zip(idx.tolist(), vals.tolist()):
        ref[i] = v


def expected_find(leaves, xs):
    """Brute force of the strictly-greater rule: the first ``i`` with ``prefix(i+1) > x``; ``x >= total`` gives
    the last non-zero leaf. Exact when ``leaves`` are dyadic."""
    cs = np.cumsum(leaves)
    xs = np.asarray(xs, dtype=np.float64)
    idx = np.searchsorted(cs, xs, side='right')
    last = np.flatnonzero(leaves)[-1]
    return np.where(xs >= cs[-1], last, idx)


def random_ranges(rng, cap, n):
    """``n`` random half-open ranges ``lo < hi <= cap`` plus the edge ranges."""
    lo = rng.integers(0, cap, n)
    hi = lo + 1 + (rng.random(n) * (cap - lo)).astype(np.int64)
    hi = np.minimum(hi, cap)
    edges = [(0, cap), (0, 1), (cap - 1, cap), (cap // 2, cap), (0, max(1, cap // 2))]
    return list(zip(lo.tolist(), hi.tolist())) + edges


def prefix_boundaries(rng, leaves, max_n=20000):
    """Every (or a sample of) exact prefix boundary, points just below them, 0, total and beyond."""
    cs = np.cumsum(leaves)
    if len(cs) > max_n:
        cs = rng.choice(cs, max_n)
    below = cs - 1.0 / 16
    total = float(np.sum(leaves))
    return np.concatenate([[0.0, total, total + 1e-9, total + 1e-6, total * 2 + 1], cs, below[below >= 0]])


def build_tree(op, cap):
    return {'sum': SumSegmentTree, 'min': MinSegmentTree, 'max': MaxSegmentTree}[op](cap)


BRUTE = {'sum': np.sum, 'min': np.min, 'max': np.max}

# ====================================================================== 1. DI-engine's test vector


@pytest.mark.parametrize('trust_caller', [True, False])
def test_dingengine_vector_scalar_and_array(trust_caller):
    tree = SumSegmentTree(8)
    for i, v in enumerate(DI_LEAVES):
        tree[i] = v
    total = tree.root()
    assert np.isclose(total, 1.6)
    assert tree.reduce() == total
    queries = DI_QUERIES + [(total, DI_TOTAL_IDX)]
    for x, want in queries:
        got = tree.find_prefixsum_idx(x, trust_caller=trust_caller)
        assert got == want and isinstance(got, int), (x, got, want)
    xs = np.array([x for x, _ in queries])
    got = tree.find_prefixsum_idx(xs, trust_caller=trust_caller)
    assert got.dtype == np.int64 and got.shape == xs.shape
    np.testing.assert_array_equal(got, [want for _, want in queries])


@pytest.mark.parametrize('cap,offset', [(64, 0), (4096, 1000), (2**16, 2**16 - 8)])
def test_dingengine_vector_inside_a_deep_tree(cap, offset):
    """The same vector written as one batch into a multi-level tree (zeros elsewhere) at an offset."""
    tree = SumSegmentTree(cap)
    tree[np.arange(offset, offset + 8)] = DI_LEAVES
    queries = DI_QUERIES + [(tree.root(), DI_TOTAL_IDX), (tree.root() + 1e-6, DI_TOTAL_IDX)]
    xs = np.array([x for x, _ in queries])
    np.testing.assert_array_equal(tree.find_prefixsum_idx(xs), [offset + want for _, want in queries])
    assert [tree.find_prefixsum_idx(x) for x in xs] == [offset + want for _, want in queries]


# ====================================================================== 2. properties against brute force


@pytest.mark.parametrize('cap', CAPACITIES)
def test_sum_tree_random_workload_matches_bruteforce(cap):
    rng = np.random.default_rng(1000 + cap)
    tree = SumSegmentTree(cap)
    ref = np.zeros(cap)
    assert tree.root() == 0.0 and tree.reduce() == 0.0
    for rnd in range(6):
        # a batched write with repeated indices (last write wins) ...
        idx = batch_indices(rng, cap, int(rng.integers(1, min(2 * cap, 5000) + 1)))
        vals = dyadic(rng, len(idx))
        tree[idx] = vals
        apply_in_order(ref, idx, vals)
        # ... scalar writes, and zeroing a batch (slots emptied)
        for i in rng.integers(0, cap, 5).tolist():
            v = float(dyadic(rng, 1)[0])
            tree[i] = v
            ref[i] = v
        if rnd % 2:
            zero_idx = rng.integers(0, cap, max(1, cap // 4))
            tree[zero_idx] = 0.0  # a scalar broadcast over the batch
            ref[zero_idx] = 0.0
        if rnd == 0:
            tree[cap - 1] = 2.5  # make sure the last leaf is non-zero at least once
            ref[cap - 1] = 2.5

        np.testing.assert_array_equal(tree.leaves[:cap], ref)
        assert (tree.leaves[cap:] == 0.0).all()  # the padding keeps the neutral element
        probe = rng.integers(0, cap, 20)
        np.testing.assert_array_equal(tree[probe], ref[probe])
        assert [tree[int(i)] for i in probe] == ref[probe].tolist()

        total = float(ref.sum())
        assert tree.root() == total and tree.reduce() == total  # exact: dyadic leaves
        for lo, hi in random_ranges(rng, cap, 100):
            assert tree.reduce(lo, hi) == ref[lo:hi].sum(), (lo, hi)
        if cap > 2:
            assert tree.reduce(1, -1) == ref[1 : cap - 1].sum()  # negative end counts from capacity
            assert tree.reduce(end=-1) == ref[: cap - 1].sum()

        if total == 0.0:
            with pytest.raises(ValueError):
                tree.find_prefixsum_idx(0.0)
            continue
        xs = np.concatenate([rng.uniform(0, total, 2000), prefix_boundaries(rng, ref)])
        want = expected_find(ref, xs)
        got = tree.find_prefixsum_idx(xs)
        np.testing.assert_array_equal(got, want)
        assert (ref[got] > 0).all()  # never a zero leaf
        for x in rng.choice(xs, 30).tolist():
            assert tree.find_prefixsum_idx(x) == expected_find(ref, [x])[0]
        inside = xs[xs <= total + 1e-5]
        np.testing.assert_array_equal(tree.find_prefixsum_idx(inside, trust_caller=False), want[xs <= total + 1e-5])


@pytest.mark.parametrize('cap', [8, 64, 4096])
def test_find_with_non_dyadic_leaves_brackets_x_and_skips_zeros(cap):
    """Float leaves: the result brackets x up to rounding and is never a zero leaf."""
    rng = np.random.default_rng(7 + cap)
    tree = SumSegmentTree(cap)
    leaves = rng.random(cap) * 3
    leaves[rng.random(cap) < 0.4] = 0.0
    leaves[-1] = 0.0  # trailing zeros: x >= total must still land on a non-zero leaf
    tree[np.arange(cap)] = leaves
    total = tree.root()
    assert np.isclose(total, leaves.sum(), rtol=1e-12)
    xs = np.concatenate([rng.uniform(0, total, 5000), [0.0, total, np.nextafter(total, 0), total + 1e-7]])
    got = tree.find_prefixsum_idx(xs)
    assert (leaves[got] > 0).all()
    cs = np.concatenate([[0.0], np.cumsum(leaves)])
    tol = 1e-9 * total
    assert (cs[got] <= xs + tol).all()
    assert ((xs < cs[got + 1] + tol) | (got == np.flatnonzero(leaves)[-1])).all()


@pytest.mark.parametrize('cap', CAPACITIES)
@pytest.mark.parametrize('op', ['min', 'max', 'sum'])
def test_reduce_random_float_workload_matches_bruteforce(op, cap):
    """Standalone trees over arbitrary floats (negatives and zeros are ordinary values here)."""
    rng = np.random.default_rng(seed_of('reduce', op, cap))
    tree = build_tree(op, cap)
    ref = np.zeros(cap) if op == 'sum' else np.full(cap, tree.neutral_element)
    for _ in range(4):
        idx = batch_indices(rng, cap, int(rng.integers(1, min(2 * cap, 5000) + 1)))
        vals = messy(rng, len(idx), negative=True)
        tree[idx] = vals
        apply_in_order(ref, idx, vals)
        i = int(rng.integers(0, cap))
        tree[i] = -3.25
        ref[i] = -3.25
        np.testing.assert_array_equal(tree.leaves[:cap], ref)
        if op == 'sum':  # for capacity < 8 reduce() adds the leaves in another order than the root: ulp noise
            assert np.isclose(tree.root(), tree.reduce(), rtol=1e-12, atol=1e-12)
        else:
            assert tree.root() == tree.reduce()
        for lo, hi in random_ranges(rng, cap, 60):
            got, want = tree.reduce(lo, hi), BRUTE[op](ref[lo:hi])
            if op == 'sum':
                assert np.isclose(got, want, rtol=1e-9, atol=1e-9), (lo, hi, got, want)
            else:
                assert got == want, (lo, hi, got, want)


def test_min_and_max_tree_initial_state_and_dingengine_neutral_elements():
    assert MinSegmentTree(4).reduce() == np.inf and MinSegmentTree(4).neutral_element == np.inf
    assert MaxSegmentTree(4).reduce() == -np.inf and MaxSegmentTree(4).neutral_element == -np.inf
    assert SumSegmentTree(4).reduce() == 0.0 and SumSegmentTree(4).neutral_element == 0.0
    t = MinSegmentTree(16)
    t[3] = 0.0  # a standalone min tree counts zeros (only a min tree over shared leaves ignores them)
    t[9] = 5.0
    assert t.reduce() == 0.0 and t.reduce(4, 16) == 5.0 and t.reduce(10, 16) == np.inf
    m = MaxSegmentTree(16)  # DI-engine's max tree never updated its inner nodes; ours does
    m[np.array([2, 11])] = [-1.0, 7.0]
    assert m.root() == 7.0 and m.reduce(0, 11) == -1.0 and m.reduce(3, 11) == -np.inf


def test_constructor_accepts_numpy_integers_and_reports_itself():
    t = SumSegmentTree(np.int64(16))
    assert t.capacity == 16 and isinstance(t.capacity, int) and t.operation == 'sum'
    assert 'capacity=16' in repr(t)
    assert [next_power_of_two(n) for n in (0, 1, 2, 3, 8, 1000, 10**5)] == [1, 1, 2, 4, 8, 1024, 131072]


def test_empty_int_batch_is_a_noop():
    t = SumSegmentTree(8)
    t[np.array([2])] = 1.0
    before = t._nodes.copy()
    t[np.array([], dtype=np.int64)] = np.array([])
    assert t.find_prefixsum_idx(np.array([])).shape == (0,)
    np.testing.assert_array_equal(t._nodes, before)


# ====================================================================== 3. errors


@pytest.mark.parametrize('cap', [13, 0, -4, 2.0, 6, None, '8'])
def test_capacity_must_be_a_positive_power_of_two(cap):
    with pytest.raises(ValueError):
        SumSegmentTree(cap)
    with pytest.raises(ValueError):
        SegmentTree(cap, 'min')


def test_unknown_operation_is_rejected():
    with pytest.raises(ValueError):
        SegmentTree(8, 'prod')


@pytest.mark.parametrize('cap', [1, 8, 64])
def test_out_of_range_indices_raise_index_error(cap):
    tree = SumSegmentTree(cap)
    for bad in [cap, -1, np.int64(cap), cap + 100]:
        with pytest.raises(IndexError):
            tree[bad] = 1.0
        with pytest.raises(IndexError):
            tree[bad]
    for bad in [np.array([0, cap]), np.array([-1, 0]), [cap]]:
        with pytest.raises(IndexError):
            tree[bad] = np.ones(len(bad))
        with pytest.raises(IndexError):
            tree[bad]
    assert tree.root() == 0.0 and (tree.leaves == 0).all()  # nothing was written


@pytest.mark.parametrize(
    'bad', [np.array([0.0, 1.0]), np.array([True, False]), 1.0, np.float64(2.0), np.array([[0, 1]]), np.array(['a'])]
)
def test_non_integer_indices_raise_type_error(bad):
    tree = SumSegmentTree(8)
    with pytest.raises(TypeError):
        tree[bad] = 1.0
    with pytest.raises(TypeError):
        tree[bad]


@pytest.mark.parametrize('start,end', [(2, 2), (3, 1), (0, 9), (-1, 4), (0, 0), (0, -8), (0, -9), (8, 8), (7, -1)])
def test_reduce_rejects_empty_or_out_of_range_intervals(start, end):
    tree = SumSegmentTree(8)
    with pytest.raises(ValueError):
        tree.reduce(start, end)


@pytest.mark.parametrize('cap', [1, 8, 16, 64, 2**16])
def test_find_on_an_all_zero_tree_raises(cap):
    tree = SumSegmentTree(cap)
    with pytest.raises(ValueError):
        tree.find_prefixsum_idx(0.0)
    with pytest.raises(ValueError):
        tree.find_prefixsum_idx(np.array([0.0, 0.5]))
    tree[cap - 1] = 1.0
    tree[cap - 1] = 0.0  # emptied again: still all zero
    with pytest.raises(ValueError):
        tree.find_prefixsum_idx(np.array([0.0]))


def test_trust_caller_false_checks_the_range():
    tree = SumSegmentTree(8)
    tree[np.arange(8)] = DI_LEAVES
    total = tree.root()
    for bad in [-1e-9, -1.0, total + 2e-5, total + 1.0, np.inf]:
        with pytest.raises(ValueError):
            tree.find_prefixsum_idx(bad, trust_caller=False)
        with pytest.raises(ValueError):
            tree.find_prefixsum_idx(np.array([0.2, bad]), trust_caller=False)
    # within the 1e-5 slack it is accepted and lands on the last non-zero leaf
    assert tree.find_prefixsum_idx(total + 5e-6, trust_caller=False) == DI_TOTAL_IDX
    np.testing.assert_array_equal(tree.find_prefixsum_idx(np.array([total + 5e-6]), trust_caller=False), [6])
    with pytest.raises(ValueError):
        tree.find_prefixsum_idx(np.zeros((2, 2)))
    with pytest.raises(ValueError):  # scalar NaN is outside the range
        tree.find_prefixsum_idx(np.nan, trust_caller=False)


def test_trust_caller_false_rejects_nan_in_an_array():
    tree = SumSegmentTree(8)
    tree[np.arange(8)] = DI_LEAVES
    with pytest.raises(ValueError):
        tree.find_prefixsum_idx(np.array([0.2, np.nan]), trust_caller=False)


def test_negative_prefixsum_never_returns_a_zero_leaf():
    tree = SumSegmentTree(8)
    tree[np.arange(8)] = DI_LEAVES
    try:
        got = tree.find_prefixsum_idx(-0.5)
    except ValueError:
        return
    assert DI_LEAVES[got] > 0, got


def test_root_equals_reduce_with_a_custom_neutral_element():
    tree = SegmentTree(2, 'sum', neutral_element=1.0)
    assert tree.root() == tree.reduce() == 2.0


# ====================================================================== 4. backends: compiled vs numpy fallback


COMPILED = (kern.set_many, kern.refresh_many, kern.find_many)
NUMPY = (kern.np_set_many, kern.np_refresh_many, kern.np_find_many)


@pytest.mark.parametrize('cap', CAPACITIES)
@pytest.mark.parametrize('op', ['sum', 'min', 'max'])
def test_numpy_fallback_is_bit_identical_on_standalone_trees(op, cap):
    rng = np.random.default_rng(seed_of('backend', op, cap))
    a, b = build_tree(op, cap), build_tree(op, cap)
    for _ in range(4):
        idx = batch_indices(rng, cap, int(rng.integers(1, min(2 * cap, 5000) + 1)))
        vals = messy(rng, len(idx), negative=(op != 'sum'))
        kern.set_many(a._leaves, a._nodes, a._starts, a._op, idx, vals)
        kern.np_set_many(b._leaves, b._nodes, b._starts, b._op, idx, vals)
        assert np.array_equal(a._leaves, b._leaves)
        assert np.array_equal(a._nodes, b._nodes)
        # and both equal a from-scratch rebuild (same combine order)
        c = build_tree(op, cap)
        c.load_leaves(a._leaves[:cap])
        assert np.array_equal(a._nodes, c._nodes)
        if op != 'sum' or a.root() <= 0:
            continue
        total = a.root()
        xs = np.concatenate(
            [
                rng.uniform(0, total * 1.05, 3000),
                np.cumsum(a._leaves[:cap])[:: max(1, cap // 512)],
                [0.0, total, np.inf, np.nan],
            ]
        )
        out_a, out_b = np.empty(len(xs), np.int64), np.empty(len(xs), np.int64)
        kern.find_many(a._leaves, a._nodes, a._starts, xs, out_a)
        kern.np_find_many(b._leaves, b._nodes, b._starts, xs, out_b)
        np.testing.assert_array_equal(out_a, out_b)
        assert (a._leaves[out_a] > 0).all()
        # the batched (level-major) descent agrees with the scalar one query by query
        assert [int(kern.find_one(a._leaves, a._nodes, a._starts, x)) for x in xs.tolist()] == out_a.tolist()


@pytest.mark.parametrize('cap', CAPACITIES)
def test_numpy_fallback_is_bit_identical_on_shared_leaves(cap):
    """A PriorityTree driven through the compiled kernels vs one driven through the numpy fallback."""
    rng = np.random.default_rng(4242 + cap)
    trees = {'compiled': PriorityTree(cap, with_max=True), 'numpy': PriorityTree(cap, with_max=True)}
    fns = {'compiled': COMPILED, 'numpy': NUMPY}
    for rnd in range(4):
        idx = batch_indices(rng, cap, int(rng.integers(1, min(2 * cap, 5000) + 1)))
        vals = messy(rng, len(idx), zero_frac=0.3)
        direct_idx = rng.integers(0, cap, max(1, cap // 8))
        direct_vals = messy(rng, len(direct_idx))
        for name, p in trees.items():
            set_many, refresh_many, _ = fns[name]
            set_many(p.sum._leaves, p.sum._nodes, p.sum._starts, kern.SUM, idx, vals)
            refresh_many(p.leaves, p.min._nodes, p.min._starts, kern.MIN_POS, idx)
            refresh_many(p.leaves, p.max._nodes, p.max._starts, kern.MAX, idx)
            # the owner writes shared leaves directly, then refreshes every tree
            p.leaves[direct_idx] = direct_vals
            for t, op in [(p.sum, kern.SUM), (p.min, kern.MIN_POS), (p.max, kern.MAX)]:
                refresh_many(p.leaves, t._nodes, t._starts, op, direct_idx)
        c, n = trees['compiled'], trees['numpy']
        assert np.array_equal(c.leaves, n.leaves)
        for attr in ['sum', 'min', 'max']:
            assert np.array_equal(getattr(c, attr)._nodes, getattr(n, attr)._nodes), attr
        ref = c.leaves[:cap]
        assert c.min_leaf() == (ref[ref > 0].min() if (ref > 0).any() else np.inf)
        assert c.max_leaf() == ref.max()
        if c.total() > 0:
            xs = np.concatenate([rng.uniform(0, c.total(), 2000), [0.0, c.total(), 2 * c.total()]])
            out_c, out_n = np.empty(len(xs), np.int64), np.empty(len(xs), np.int64)
            kern.find_many(c.sum._leaves, c.sum._nodes, c.sum._starts, xs, out_c)
            kern.np_find_many(n.sum._leaves, n.sum._nodes, n.sum._starts, xs, out_n)
            np.testing.assert_array_equal(out_c, out_n)


@pytest.mark.parametrize('with_max', [True, False])
@pytest.mark.parametrize('size', [1, 8, 1000, 4096, 10**5])
def test_fused_priority_updates_are_bit_identical_to_separate_kernels(size, with_max):
    """``PriorityTree.set`` / ``set_one`` (fused sum/min/max refresh) vs separate compiled ``set_many`` +
    ``refresh_many`` calls vs the numpy fallback ``np_prio_set_many`` / ``np_prio_set_one``."""
    rng = np.random.default_rng(seed_of('fused', size, with_max))
    fused, separate, fallback = (PriorityTree(size, with_max=with_max) for _ in range(3))
    for _ in range(4):
        idx = batch_indices(rng, size, int(rng.integers(1, min(2 * size, 5000) + 1)))
        vals = messy(rng, len(idx), zero_frac=0.3)
        fused.set(idx, vals)
        kern.set_many(separate.leaves, separate.sum._nodes, separate.sum._starts, kern.SUM, idx, vals)
        kern.refresh_many(separate.leaves, separate.min._nodes, separate.min._starts, kern.MIN_POS, idx)
        if with_max:
            kern.refresh_many(separate.leaves, separate.max._nodes, separate.max._starts, kern.MAX, idx)
        kern.np_prio_set_many(*fallback._arrays, idx, vals)
        for i in rng.integers(0, size, 5).tolist():
            v = float(messy(rng, 1, zero_frac=0.3)[0])
            fused.set_one(i, v)
            kern.set_one(separate.leaves, separate.sum._nodes, separate.sum._starts, kern.SUM, i, v)
            kern.refresh_many(separate.leaves, separate.min._nodes, separate.min._starts, kern.MIN_POS, np.array([i]))
            if with_max:
                kern.refresh_many(separate.leaves, separate.max._nodes, separate.max._starts, kern.MAX, np.array([i]))
            kern.np_prio_set_one(*fallback._arrays, i, v)
        for other in (separate, fallback):
            assert np.array_equal(fused.leaves, other.leaves)
            for attr in ['sum', 'min'] + (['max'] if with_max else []):
                assert np.array_equal(getattr(fused, attr)._nodes, getattr(other, attr)._nodes), attr


@pytest.mark.parametrize('with_max', [True, False])
@pytest.mark.parametrize('size', [1, 100, 5000, 10**5])
def test_deferred_refresh_reads_match_a_tree_refreshed_after_every_write(size, with_max):
    """``PriorityTree`` writes leaves at once and refreshes the nodes at the next read: runs of ``set`` /
    ``fill`` / ``set_one`` of random lengths between reads -- some overflowing the record of pending leaves (one
    entry per 8 leaves), which then rebuilds whole levels -- give, at every read, exactly the nodes, totals,
    minima, maxima and draws of a tree refreshed after each write (the numpy fallback, which never defers)."""
    rng = np.random.default_rng(seed_of('deferred', size, with_max))
    lazy, eager = PriorityTree(size, with_max=with_max), PriorityTree(size, with_max=with_max)
    for _ in range(12):
        for _ in range(int(rng.integers(0, 6))):  # a run of writes (possibly none) before the next read
            kind = int(rng.integers(0, 3))
            if kind == 0:
                idx = batch_indices(rng, size, int(rng.choice([1, 64, 256, 9000])))
                vals = messy(rng, len(idx), zero_frac=0.3)
                lazy.set(idx, vals)
                kern.np_prio_set_many(*eager.arrays, idx, vals)
            elif kind == 1:
                idx = batch_indices(rng, size, int(rng.integers(1, 200)))
                value = float(rng.choice([0.0, rng.uniform(0.1, 3.0)]))
                lazy.fill(idx, value)
                kern.np_prio_set_many(*eager.arrays, idx, np.full(len(idx), value))
            else:
                for i in rng.integers(0, size, int(rng.integers(1, 20))).tolist():
                    v = float(messy(rng, 1, zero_frac=0.3)[0])
                    lazy.set_one(i, v)
                    kern.np_prio_set_one(*eager.arrays, i, v)
        assert np.array_equal(lazy.leaves, eager.leaves)  # leaves are never deferred
        read = int(rng.integers(0, 4))
        if read == 0:
            assert lazy.total() == eager.total()
        elif read == 1:
            assert lazy.min_leaf() == eager.min_leaf()
        elif read == 2 and with_max:
            assert lazy.max_leaf() == eager.max_leaf()
        elif eager.total() > 0:
            xs = rng.uniform(0, eager.total(), 512)
            np.testing.assert_array_equal(lazy.find(xs), eager.find(xs))
        for attr in ['sum', 'min'] + (['max'] if with_max else []):
            assert np.array_equal(getattr(lazy, attr)._nodes, getattr(eager, attr)._nodes), attr


@pytest.mark.parametrize('cap', [1, 2, 4, 8, 16, 32, 64, 128, 512, 1024, 4096, 2**16])
def test_numpy_find_on_an_all_zero_tree_returns_minus_one_like_the_kernel(cap):
    """Padded levels (capacities that are not powers of 8) once sent dead queries past the level end."""
    tree = SumSegmentTree(cap)
    xs = np.array([0.0, 0.5])
    assert int(kern.find_one(tree._leaves, tree._nodes, tree._starts, 0.0)) == -1  # the scalar kernel
    out_n = np.zeros(2, np.int64)
    kern.np_find_many(tree._leaves, tree._nodes, tree._starts, xs, out_n)
    assert out_n.tolist() == [-1, -1]


@pytest.mark.slow
def test_numpy_fallback_in_a_subprocess_without_numba():
    code = textwrap.dedent(
        f"""
        import json
        import numpy as np
        from ding_buffer import tree_kernels as kern
        from ding_buffer.segment_tree import PriorityTree, SumSegmentTree
        res = {{'have_numba': kern.HAVE_NUMBA,
                'aliased': [kern.set_many is kern.np_set_many, kern.find_many is kern.np_find_many,
                            kern.refresh_many is kern.np_refresh_many]}}
        t = SumSegmentTree(8)
        for i, v in enumerate({DI_LEAVES!r}):
            t[i] = v
        xs = [x for x, _ in {DI_QUERIES!r}] + [t.root()]
        res['scalar'] = [t.find_prefixsum_idx(x) for x in xs]
        res['array'] = t.find_prefixsum_idx(np.array(xs)).tolist()
        big = SumSegmentTree(4096)
        big[np.arange(1000, 1008)] = {DI_LEAVES!r}
        res['deep'] = big.find_prefixsum_idx(np.array(xs[:-1] + [big.root()])).tolist()
        p = PriorityTree(1000, with_max=True)
        p.set(np.array([3, 3, 999, 5], dtype=np.int64), np.array([1.0, 2.0, 0.5, 0.25]))
        res['prio'] = [p.total(), p.min_leaf(), p.max_leaf(), p.find(np.array([0.0, 2.0, 2.6])).tolist()]
        print(json.dumps(res))
        """
    )
    env = subprocess_env(DING_BUFFER_NO_NUMBA='1')
    proc = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, env=env, cwd=str(REPO_ROOT), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res['have_numba'] is False
    assert res['aliased'] == [True, True, True]
    want = [w for _, w in DI_QUERIES] + [DI_TOTAL_IDX]
    assert res['scalar'] == want and res['array'] == want
    assert res['deep'] == [1000 + w for w in want]
    assert res['prio'] == [2.75, 0.25, 2.0, [3, 5, 999]]


# ====================================================================== 5. PriorityTree


@pytest.mark.parametrize('size', [1000, 10**5])
def test_priority_tree_random_workload(size):
    rng = np.random.default_rng(size)
    p = PriorityTree(size, with_max=True)
    assert p.sum.capacity == next_power_of_two(size)
    assert p.total() == 0.0 and p.min_leaf() == np.inf and p.max_leaf() == 0.0
    ref = np.zeros(size)
    for rnd in range(6):
        idx = batch_indices(rng, size, int(rng.integers(1, 5000)))
        vals = messy(rng, len(idx), zero_frac=0.3)
        p.set(idx, vals)
        apply_in_order(ref, idx, vals)
        for i in rng.integers(0, size, 10).tolist():
            v = float(messy(rng, 1, zero_frac=0.3)[0])
            p.set_one(i, v)
            ref[i] = v
        if rnd == 3:  # empty every slot but a few
            nz = np.flatnonzero(ref)
            keep = rng.choice(nz, 3, replace=False)
            drop = np.setdiff1d(nz, keep).astype(np.int64)
            p.set(drop, np.zeros(len(drop)))
            ref[drop] = 0.0
        np.testing.assert_array_equal(p.leaves[:size], ref)
        assert (p.leaves[size:] == 0).all()
        assert np.isclose(p.total(), ref.sum(), rtol=1e-12, atol=0)
        pos = ref[ref > 0]
        assert p.min_leaf() == (pos.min() if len(pos) else np.inf)
        assert p.max_leaf() == ref.max()
        assert p.min.reduce() == p.min_leaf() and p.max.reduce() == p.max_leaf()
        total = p.total()
        xs = np.concatenate([rng.uniform(0, total, 20000), [0.0, total, total * (1 + 1e-12)]])
        got = p.find(xs)
        assert ((got >= 0) & (got < size)).all()
        assert (ref[got] > 0).all()  # zero leaves (empty slots) are never returned
    p.set(np.arange(size, dtype=np.int64), np.zeros(size))
    assert p.total() == 0.0 and p.min_leaf() == np.inf and p.max_leaf() == 0.0


@pytest.mark.parametrize('size', [5, 1000, 10**5])
def test_priority_tree_find_after_emptying_every_slot_raises(size):
    p = PriorityTree(size)
    idx = np.arange(size, dtype=np.int64)
    p.set(idx, np.ones(size))
    p.set(idx, np.zeros(size))
    with pytest.raises(ValueError):
        p.find(np.array([0.0]))


def test_priority_tree_without_max():
    p = PriorityTree(10)
    p.set(np.array([1, 2], dtype=np.int64), np.array([0.5, 1.5]))
    assert p.max is None and p.total() == 2.0 and p.min_leaf() == 0.5
    with pytest.raises(RuntimeError):
        p.max_leaf()


def _stratified_counts(p, n, rng):
    xs = (np.arange(n) + rng.random(n)) * (p.total() / n)
    return np.bincount(p.find(xs), minlength=p.sum.capacity)


def test_priority_tree_sampling_frequencies_chi_square():
    rng = np.random.default_rng(2024)
    size, n = 1000, 200_000
    leaves = rng.uniform(0.5, 2.0, size)
    leaves[rng.random(size) < 0.25] = 0.0
    p = PriorityTree(size, with_max=True)
    order = rng.permutation(size).astype(np.int64)
    p.set(order, leaves[order])
    counts = _stratified_counts(p, n, rng)
    assert counts.sum() == n
    assert (counts[:size][leaves == 0] == 0).all() and (counts[size:] == 0).all()
    pos = leaves > 0
    df = int(pos.sum()) - 1
    threshold = df + 5 * np.sqrt(2 * df)  # chi-square mean + 5 standard deviations
    expected = n * leaves[pos] / leaves[pos].sum()
    assert expected.min() > 50
    chi2 = float(np.sum((counts[:size][pos] - expected) ** 2 / expected))
    assert chi2 < threshold, (chi2, threshold)
    # the statistic has power: the same counts against uniform priorities fail badly
    uniform = np.full(df + 1, n / (df + 1))
    assert float(np.sum((counts[:size][pos] - uniform) ** 2 / uniform)) > 10 * threshold


# ====================================================================== 6. persistence


@pytest.mark.parametrize('cap', [1, 8, 512, 2**16])
@pytest.mark.parametrize('op', ['sum', 'min', 'max'])
def test_state_dict_round_trip_is_bit_identical(op, cap):
    rng = np.random.default_rng(seed_of('persist', op, cap))
    tree = build_tree(op, cap)
    for _ in range(3):
        idx = batch_indices(rng, cap, min(2 * cap, 3000))
        tree[idx] = messy(rng, len(idx), negative=(op != 'sum'))
    state = tree.state_dict()
    assert state['capacity'] == cap and state['operation'] == op and state['leaves'].shape == (cap,)
    leaves_before = tree.leaves.copy()
    saved = state['leaves'].copy()
    state['leaves'][:] = 12345.0  # a copy, not a view
    assert np.array_equal(tree.leaves, leaves_before)
    state['leaves'][:] = saved
    restored = build_tree(op, cap)
    restored[np.arange(cap)] = messy(rng, cap)  # overwritten by the load
    restored.load_leaves(state['leaves'])
    assert np.array_equal(restored._leaves, tree._leaves)
    assert np.array_equal(restored._nodes, tree._nodes)
    assert restored.root() == tree.root()
    for bad in [np.zeros(cap + 1), np.zeros((cap, 1)), np.zeros(0), 1.0]:
        with pytest.raises(ValueError):
            restored.load_leaves(bad)
    assert np.array_equal(restored._nodes, tree._nodes)  # a rejected load changes nothing


@pytest.mark.parametrize('size', [1000, 10**5])
def test_priority_tree_load_leaves_is_a_full_rebuild(size):
    rng = np.random.default_rng(size + 5)
    incremental = PriorityTree(size, with_max=True)
    for _ in range(5):
        idx = batch_indices(rng, size, 4000)
        incremental.set(idx, messy(rng, len(idx), zero_frac=0.3))
    for i in rng.integers(0, size, 20).tolist():
        incremental.set_one(i, float(rng.random()))
    leaves = incremental.leaves[:size].copy()

    loaded = PriorityTree(size, with_max=True)
    loaded.set(np.arange(size, dtype=np.int64), messy(rng, size))  # stale content, replaced by the load
    loaded.load_leaves(leaves)
    assert np.array_equal(loaded.leaves, incremental.leaves)
    for attr in ['sum', 'min', 'max']:
        assert np.array_equal(getattr(loaded, attr)._nodes, getattr(incremental, attr)._nodes), attr
    assert loaded.total() == incremental.total() and loaded.min_leaf() == leaves[leaves > 0].min()

    # and the reverse direction: incremental sets of the loaded leaves give the same nodes
    rebuilt = PriorityTree(size, with_max=True)
    order = rng.permutation(size).astype(np.int64)
    rebuilt.set(order, leaves[order])
    for attr in ['sum', 'min', 'max']:
        assert np.array_equal(getattr(rebuilt, attr)._nodes, getattr(loaded, attr)._nodes), attr

    loaded.load_leaves(np.zeros(size))
    assert loaded.total() == 0.0 and loaded.min_leaf() == np.inf and loaded.max_leaf() == 0.0


def test_priority_tree_load_leaves_validation():
    size = 1000
    p = PriorityTree(size, with_max=True)
    p.set(np.arange(10, dtype=np.int64), np.arange(1.0, 11.0))
    nodes = [p.sum._nodes.copy(), p.min._nodes.copy(), p.max._nodes.copy()]
    leaves = p.leaves.copy()
    good = np.ones(size)
    bad_inputs = [np.ones(size + 1), np.ones(size - 1), np.ones(p.sum.capacity), np.ones((size, 1)), np.ones(0)]
    for pos, bad_value in [(0, np.nan), (5, np.inf), (7, -np.inf), (size - 1, -1e-12), (3, -1.0)]:
        arr = good.copy()
        arr[pos] = bad_value
        bad_inputs.append(arr)
    for bad in bad_inputs:
        with pytest.raises(ValueError):
            p.load_leaves(bad)
        # validation happens before anything is written
        assert np.array_equal(p.leaves, leaves)
        assert all(np.array_equal(a, b) for a, b in zip([p.sum._nodes, p.min._nodes, p.max._nodes], nodes))
    p.load_leaves(good.tolist())  # any array-like of the right length
    assert p.total() == size and p.min_leaf() == 1.0 and p.max_leaf() == 1.0


@pytest.mark.slow
def test_loading_the_kernels_while_another_thread_imports_does_not_fail():
    """The load swaps its dispatchers into every ding_buffer module found in ``sys.modules``; another thread's
    import (here: a finalizer the garbage collector runs inside the loop) changed ``sys.modules`` while the load
    walked it, and the load -- a push's or sample's first kernel call -- raised 'dictionary changed size during
    iteration'."""
    code = textwrap.dedent(
        """
        import gc, sys, types
        import numpy as np
        from ding_buffer import _numba
        from ding_buffer.segment_tree import PriorityTree

        on = [True]
        class Import:  # garbage whose finalizer imports a module (as another thread would) and leaves more
            def __init__(self):
                self.cycle = self
            def __del__(self):
                if on[0] and len(sys.modules) < 100_000:
                    sys.modules[f'ding_buffer_test_import_{len(sys.modules)}'] = types.ModuleType('m')
                    Import()

        warm = _numba._warm
        def warm_then_collect_often(pending, swap):
            warm(pending, swap)
            Import()
            gc.set_threshold(1)  # a collection at almost every allocation from here on
        _numba._warm = warm_then_collect_often
        try:
            _numba.load()
        finally:
            on[0] = False
            gc.set_threshold(700)
        p = PriorityTree(8, with_max=True)
        p.set(np.array([1, 2], dtype=np.int64), np.array([1.0, 3.0]))
        print(_numba.ready(), p.total())
        """
    )
    proc = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=str(REPO_ROOT),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ['True', '4.0']

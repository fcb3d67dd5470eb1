"""The diversity filter's distance kernel (``ding_buffer.control.diversity``): ``far_mask`` -- whether each
candidate is farther than ``cutoff`` (p-norm) from every reference, or from every earlier candidate -- agrees in
its compiled and numpy forms with a brute-force reference, for p = 0.5, 1, 2, 3 and inf."""

import numpy as np
import pytest
from helpers import INF, ref_distance

from ding_buffer.control import diversity


@pytest.mark.parametrize('p', [1.0, 2.0, INF, 3.0, 0.5])
def test_far_mask_kernel_and_numpy_agree_with_reference(p):
    rng = np.random.default_rng(7)
    q = rng.integers(0, 4, size=(40, 3)).astype(np.float64)
    refs = rng.integers(0, 4, size=(30, 3)).astype(np.float64)
    slots = np.arange(0, 30, 2, dtype=np.int64)
    for cutoff in (0.5, 1.0, 2.0, 3.0):
        want = np.array([all(ref_distance(tuple(x), tuple(refs[s]), p) > cutoff for s in slots) for x in q])
        want_tri = np.array(
            [all(ref_distance(tuple(q[i]), tuple(q[j]), p) > cutoff for j in range(i)) for i in range(len(q))]
        )
        np.testing.assert_array_equal(diversity._far_numpy(q, refs, slots, cutoff, p, False), want)
        np.testing.assert_array_equal(diversity._far_numpy(q, q, np.arange(len(q)), cutoff, p, True), want_tri)
        np.testing.assert_array_equal(diversity.far_mask(q, refs, slots, cutoff, p), want)
        np.testing.assert_array_equal(diversity.far_mask(q, q, None, cutoff, p, triangular=True), want_tri)


def _ref_hash(row):
    """``row_hashes`` of one row in plain Python integers (splitmix64, mod 2**64)."""
    import struct

    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    total = 0
    for j, v in enumerate(row):
        bits = struct.unpack('<Q', struct.pack('<d', float(v) + 0.0))[0]
        total += mix(bits ^ mix(((j + 1) * 0x9E3779B97F4A7C15) & mask))
    return mix((total + len(row)) & mask)


@pytest.mark.parametrize('compiled', [False, True])
def test_row_hashes_match_a_plain_python_reference(compiled, monkeypatch):
    from ding_buffer import _numba

    if compiled:
        _numba.load()  # (without numba both runs take the numpy path)
    else:
        monkeypatch.setattr(diversity, 'ready', lambda: False)
    rng = np.random.default_rng(3)
    for shape in [(0, 3), (5, 1), (33, 8), (6, 64)]:
        rows = rng.integers(-4, 4, size=shape).astype(np.float64) * 0.5
        rows[rows == 0] = -0.0  # equal to 0.0: the same hash
        got = diversity.row_hashes(rows)
        assert got.dtype == np.uint64 and got.tolist() == [_ref_hash(r) for r in rows.tolist()]
    one_hot = np.eye(4)
    assert len(set(diversity.row_hashes(one_hot).tolist())) == 4  # permuted rows do not collide


@pytest.mark.parametrize('p, scale', [(64.0, 2e5), (3.0, 1e103), (1.0, 6e307)])
def test_pivot_pruning_keeps_rows_whose_pivot_distances_overflow_in_reach(p, scale):
    """Pivot distances of huge states at a large p overflow to inf; an infinite pruning cut then made every
    pivot window NaN (empty), so an exact duplicate of a stored row counted as far. The compiled path (pivots)
    and the numpy path (none) decide alike."""
    from ding_buffer import _numba

    _numba.load()
    rng = np.random.default_rng(0)
    refs = rng.uniform(-scale, scale, size=(12, 3))
    q = np.concatenate([refs[[3, 7]], refs[[3]] * 0.5, rng.uniform(-1, 1, size=(1, 3))])
    pivots = diversity.choose_pivots(refs, p)
    got = diversity.far_mask(
        q,
        refs,
        None,
        0.5,
        p,
        q_pivot=diversity.pnorm_distances(q, pivots, p),
        ref_pivot=diversity.pnorm_distances(refs, pivots, p),
    )
    want = diversity._far_numpy(q, refs, np.arange(len(refs)), 0.5, p, False)
    assert got[:2].tolist() == [False, False]  # the duplicates are in reach
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('compiled', [False, True])
@pytest.mark.parametrize('p, unit, cutoff', [(1000, 1.0, 3.5), (700, 1.0, 2.5), (1000, 0.125, 0.3125)])
def test_far_mask_at_a_huge_p_agrees_with_exact_arithmetic(compiled, monkeypatch, p, unit, cutoff):
    """At p in the hundreds ``|d| ** p`` and ``cutoff ** p`` overflow (or underflow) float64: a close pair summed to
    inf counted as far. Decided in units of the cutoff, the mask is the exact one (rational arithmetic)."""
    from fractions import Fraction

    from ding_buffer import _numba

    if compiled:
        _numba.load()
    else:
        monkeypatch.setattr(diversity, 'ready', lambda: False)
    rng = np.random.default_rng(5)
    q = rng.integers(0, 20, size=(30, 2)) * unit
    refs = rng.integers(0, 20, size=(8, 2)) * unit
    c = Fraction(cutoff) ** p

    def far(a, b):  # sum |a - b| ** p > cutoff ** p, exactly
        return sum(abs(Fraction(x) - Fraction(y)) ** p for x, y in zip(a, b)) > c

    want = np.array([all(far(x, y) for y in refs) for x in q])
    want_tri = np.array([all(far(q[i], q[j]) for j in range(i)) for i in range(len(q))])
    pivots = diversity.choose_pivots(refs, float(p))
    qp, rp = diversity.pnorm_distances(q, pivots, float(p)), diversity.pnorm_distances(refs, pivots, float(p))
    assert np.isfinite(qp).all() and np.isfinite(rp).all()
    np.testing.assert_array_equal(diversity.far_mask(q, refs, None, cutoff, float(p)), want)
    np.testing.assert_array_equal(diversity.far_mask(q, refs, None, cutoff, float(p), q_pivot=qp, ref_pivot=rp), want)
    np.testing.assert_array_equal(
        diversity.far_mask(q, q, None, cutoff, float(p), triangular=True, q_pivot=qp), want_tri
    )
    assert 0 < want.sum() < len(q)  # (both kinds of answer are checked)


@pytest.mark.parametrize('compiled', [False, True])
def test_states_whose_pivot_distances_overflow_are_judged_as_the_numpy_path_judges_them(compiled, monkeypatch):
    """Finite states near float64's top: their distance to a pivot overflows to inf, and |inf - d| > cutoff pruned
    (or windowed out) pairs that are close. gfn_diverse then admitted a state within the cutoff of a stored one on
    the compiled path only."""
    import torch

    from ding_buffer import _numba, create_buffer

    if compiled:
        _numba.load()
    else:
        monkeypatch.setattr(diversity, 'ready', lambda: False)
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=1, cutoff_distance=1e307, p_norm_distance=1.0))
    buf.push({'state': torch.tensor([[1.75e308, 5e306]], dtype=torch.float64), 'log_reward': torch.tensor([0.0])})
    buf.push({'state': torch.tensor([[1.75e308, 0.0]], dtype=torch.float64), 'log_reward': torch.tensor([1.0])})
    assert buf.stats()['rejected_by_distance'] == 1 and buf.stats()['log_reward_max'] == 0.0
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=2, cutoff_distance=2e153, p_norm_distance=2.0))
    buf.push({'state': torch.tensor([[0.0], [-1e154]], dtype=torch.float64), 'log_reward': torch.tensor([0.0, 0.0])})
    buf.push(
        {'state': torch.tensor([[1.4e154], [1.3e154]], dtype=torch.float64), 'log_reward': torch.tensor([2.0, 1.0])}
    )
    assert buf.stats()['rejected_by_distance'] == 1  # 1.3e154 is within the cutoff of the better 1.4e154

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

"""``ding_buffer.control.priority``: draws, IS weights and priorities against ``p ** alpha`` by hand, update / running
max / retire, the fused ``draw``, save / restore (bad states refused, nothing changed), and the argument checks of
``as_priorities``, ``split_ids``, ``parse_update``, ``BetaSchedule`` (error type, key and entry named)."""

import numpy as np
import pytest
import torch
from helpers import assert_same, chi_square, chi_threshold, wait_until

from ding_buffer.control.priority import BetaSchedule, PriorityIndex, as_priorities, parse_update, split_ids
from ding_buffer.storage.ring import RingIndex

ALPHA, P = 0.6, np.array([0.5, 1.0, 0.0, 3.0, 7.25, 1.0, 0.0, 2.0, 10.0, 0.125])


def index(**kw):
    idx = PriorityIndex(len(P), ALPHA, eps=0.01, **kw)
    idx.set_new(np.arange(len(P)), P)
    return idx


def test_draws_follow_p_to_the_alpha_and_weights_are_by_hand():
    idx, leaf, pos = index(), P**ALPHA, np.flatnonzero(P > 0)
    rng, n = np.random.default_rng(0), 200 * 1000  # stratified: the chi-square bound is generous, so many draws
    counts = np.bincount(np.concatenate([idx.sample(rng, 1000) for _ in range(200)]), minlength=len(P))
    assert counts.sum() == counts[pos].sum()  # priority 0: never drawn
    assert chi_square(counts[pos], n * leaf[pos] / leaf.sum()) < chi_threshold(len(pos) - 1)
    cand = np.array([0, 2, 4, 9])  # a subset: drawn in proportion within it
    counts = np.bincount(np.concatenate([idx.sample(rng, 1000, cand) for _ in range(100)]), minlength=len(P))
    c = cand[P[cand] > 0]
    assert counts.sum() == counts[c].sum() and chi_square(counts[c], 1e5 * leaf[c] / leaf[c].sum()) < chi_threshold(2)
    np.testing.assert_allclose(idx.is_weights(pos, 0.4), (leaf[pos] / leaf[pos].min()) ** -0.4)  # w / w_max
    assert idx.priorities(np.arange(len(P))).tolist() == P.tolist()  # exact values come back exactly
    q, big = np.random.default_rng(9).random(500) * 100, PriorityIndex(500, ALPHA)
    big.set_new(np.arange(500), q)  # as_stored: what a pushed item will report, float32-rounded
    assert big.priorities(np.arange(500)).tolist() == big.as_stored(q).tolist() == q.astype(np.float32).tolist()


def test_update_running_max_retire_and_reset():
    idx = index()
    idx.update(np.array([2, 8]), np.array([20.0, 1.0]))  # eps added; the max is the largest ever set
    assert idx.priorities(np.array([2, 8])).tolist() == pytest.approx([20.01, 1.01], rel=1e-6)
    idx.update(np.array([2]), np.array([0.5]))
    assert idx.max_priority == 20.0 and idx.default_priority() == 20.0
    assert index(with_max=True).default_priority() == pytest.approx(10.0)  # with a max tree: the max stored
    idx.retire(np.flatnonzero(P != 1.0))
    assert set(idx.sample(np.random.default_rng(1), 100).tolist()) == {1, 5}  # retired slots: never drawn
    idx.reset()
    rng, state = np.random.default_rng(2), np.random.default_rng(2).bit_generator.state
    assert idx.sample(rng, 4) is None and rng.bit_generator.state == state and idx.max_priority == 1.0


def test_alpha_zero_is_uniform_and_keeps_float32_priorities():
    idx = PriorityIndex(len(P), 0.0, eps=0.0)
    idx.set_new(np.arange(len(P)), P)  # every leaf p ** 0 = 1, zeros included
    assert idx.priorities(np.arange(len(P))).tolist() == P.tolist()
    assert np.bincount(idx.sample(np.random.default_rng(3), 1000), minlength=len(P)).tolist() == [100] * len(P)


def test_fused_draw_gives_what_sample_weights_and_priorities_give():
    pytest.importorskip('numba')
    idx, ring = index(), RingIndex(len(P))
    ring.commit(len(P))
    assert wait_until(idx.can_draw, 60)
    u, counts = np.random.default_rng(4).random(64), np.zeros(len(P), dtype=np.int32)
    slots, w, pr, use, ids = idx.draw(u, 0.4, counts, ring)
    assert slots.tolist() == idx.sample(np.random.default_rng(4), 64).tolist()  # the same strata offsets u
    assert ids.tolist() == ring.uids(slots).tolist() and pr.tolist() == idx.priorities(slots).tolist()
    np.testing.assert_allclose(w, idx.is_weights(slots, 0.4))
    assert counts.tolist() == np.bincount(slots, minlength=len(P)).tolist()  # one draw counted per entry
    assert use.tolist() == [int((slots[: i + 1] == s).sum()) for i, s in enumerate(slots)]


def test_save_restore_round_trip_and_bad_states_change_nothing():
    idx, valid = index(), np.ones(len(P), dtype=bool)
    state = idx.state_dict()
    new = idx.restored(state, valid)
    assert new.priorities(np.arange(len(P))).tolist() == P.tolist() and new.max_priority == idx.max_priority
    assert new.sample(np.random.default_rng(5), 9).tolist() == idx.sample(np.random.default_rng(5), 9).tolist()
    for bad, ok, match in [
        (dict(state, alpha=0.5), valid, 'saved with alpha=0.5'),
        (dict(state, leaves=state['leaves'][:-1]), valid, r"'leaves' has shape \(9,\)"),
        (dict(state, priority=-state['priority']), valid, 'finite and >= 0'),
        (state, np.arange(len(P)) != 3, 'non-zero at empty slots'),
        (dict(state, max_priority=float('nan')), valid, 'max_priority must be finite'),
    ]:
        with pytest.raises(ValueError, match=match):
            idx.restored(bad, ok)
    assert_same(idx.state_dict(), state)


@pytest.mark.parametrize(
    'values,error,match',
    [
        ([1.0, True], TypeError, "'prio' must be real numbers; entry 1 is bool True"),
        ([[1.0], ['2']], TypeError, "entry 1 is str '2'"),
        (np.array([1j]), TypeError, 'got dtype complex128'),
        ([1.0, float('nan')], ValueError, "'prio' must be finite .* entry 1 is nan"),
        (np.array([0.0, 1.0, -2.0]), ValueError, 'entry 2 is -2.0 \\(nothing was changed\\)'),
        ([1, 10**400], ValueError, 'entry 1 is an int of 401 digits'),
        (torch.tensor([3.5e38]), ValueError, 'entry 0 is inf'),  # overflows float32 (torch rounds it to inf)
    ],
)
def test_as_priorities_refuses_naming_key_and_entry(values, error, match):
    before = repr(values)
    with pytest.raises(error, match=match):
        as_priorities(values, key='prio')
    assert repr(values) == before


def test_as_priorities_accepts_real_numbers_in_any_container():
    for values in ([[1, 2.5], [0, 4]], (1, 2.5, 0, 4), torch.tensor([1, 2.5, 0, 4]), np.array([1, 2.5, 0, 4])):
        assert as_priorities(values).tolist() == [1.0, 2.5, 0.0, 4.0] and as_priorities(values).dtype == np.float64
    assert as_priorities(3).tolist() == [3.0]


def test_split_ids_and_parse_update():
    assert split_ids(torch.tensor([4, 7]), 'buf')[0].tolist() == [4, 7] and split_ids(np.array([4]), 'b')[1] is None
    ids, mine = split_ids(['buf_3', 'other_3', 'buf_x', 'buf_12', 'buf_'], 'buf')  # DI-engine's string ids
    assert ids.tolist() == [3, -1, -1, 12, -1] and mine.tolist() == [True, False, False, True, False]
    assert [a.tolist() for a in split_ids([5, 'buf_1', 'zz_1'], 'buf')] == [[5, 1, -1], [True, True, False]]
    with pytest.raises(TypeError, match="'replay_unique_id' entry 1 is float 1.5"):
        split_ids([5, 1.5], 'buf')
    info = dict(replay_unique_id=['buf_3', 'x_1'], replay_buffer_idx=[3, 1], priority=[2.0, 1.0])
    assert [a.tolist() for a in parse_update(info, 'buf', 8)] == [[2, 1], [3, -1], [3, 1], [True, False]]
    assert parse_update({}, 'buf', 8) is None and parse_update(dict(priority=None), 'buf', 8) is None
    for bad, error, match in [
        ([1, 2], TypeError, 'update info must be a dict, got list'),
        ({'priority': [1.0], 'replay_unique_id': [1]}, ValueError, "has 'priority' but no 'replay_buffer_idx'"),
        (dict(info, priority=[2.0]), ValueError, 'lengths differ: priority 1, replay_unique_id 2, replay_buffer_idx 2'),
        (dict(info, replay_buffer_idx=[3, 8]), ValueError, r"'replay_buffer_idx' must be in \[0, 8\), got 3..8"),
        (dict(info, replay_buffer_idx=[3.0, 1.0]), TypeError, "'replay_buffer_idx' must be ints, got dtype float64"),
        (dict(info, priority=[2.0, -1.0]), ValueError, "'priority' .* entry 1 is -1.0"),
    ]:
        before = repr(bad)
        with pytest.raises(error, match=match):
            parse_update(bad, 'buf', capacity=8)
        assert repr(bad) == before


def test_beta_schedule_anneals_linearly_to_one_and_refuses_out_of_range():
    beta, const = BetaSchedule(0.2, anneal_step=4), BetaSchedule(0.3, anneal_step=0)
    assert [beta.draw() for _ in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])  # + (1 - 0.2) / 4 each
    assert [const.draw() for _ in range(3)] == [0.3] * 3
    for bad in (1.5, -0.1, float('nan')):
        with pytest.raises(ValueError, match=f'beta must be in \\[0, 1\\], got {bad}'):
            const.set(bad)
        assert const.value == 0.3
    with pytest.raises(ValueError, match='got 2.0'):
        BetaSchedule(2, anneal_step=3)


def test_beta_is_a_real_number_not_a_bool_or_a_string():
    """A str beta ('0.5'), a bool or a complex number was taken as a number; 'x', None, 10**400 or a complex
    tensor raised bare errors."""
    beta = BetaSchedule(0.3, anneal_step=0)
    for bad in (
        '0.5',
        True,
        None,
        'x',
        b'1',
        10**400,
        np.complex128(0.5),
        torch.tensor(0.5 + 0.7j),
        torch.tensor(True),
    ):
        with pytest.raises(ValueError, match="beta must be in \\[0, 1\\], got"):
            beta.set(bad)
        assert beta.value == 0.3
    good_values = (np.float32(0.25), np.array(0.25), torch.tensor(0.25), -torch.tensor(-0.25))
    for good in good_values + (torch.tensor(0.25, dtype=torch.bfloat16), torch.tensor(0.25, dtype=torch.float16)):
        beta.set(good)
        assert beta.value == 0.25 and type(beta.value) is float

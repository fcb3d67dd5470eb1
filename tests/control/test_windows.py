"""Prioritized windows (``ding_buffer.control.windows.WindowPriorities``) against a brute-force model: each window's
priority ``eta * max + (1 - eta) * mean`` of its steps after random updates (episodes that wrap around the slots,
a padded short one), draws in proportion to ``p_w ** alpha`` (chi-square), IS weights by hand, removal, the running
max, and save / restore (same windows and draws; bad states refused, nothing changed)."""

import numpy as np
import pytest
from helpers import chi_square, chi_threshold

from ding_buffer.control.windows import WindowPriorities

N, T, ALPHA, ETA, EPS = 40, 4, 0.7, 0.9, 0.01
EPISODES = [(0, 4, 10), (1, 14, 3), (2, 35, 9)]  # (episode slot, first slot, length): episode 2 wraps to slot 3
FIRST_OF, LENGTH_OF = np.array([e[1] for e in EPISODES]), np.array([e[2] for e in EPISODES])


def reference_windows(step, episodes, pad=True):
    """Window-start slot -> window priority, computed step by step."""
    out = {}
    for _, first, length in episodes:
        for o in range(length - T + 1 if length >= T else int(pad)):
            p = [step[(first + i) % N] for i in range(o, min(o + T, length))]
            out[(first + o) % N] = ETA * max(p) + (1 - ETA) * sum(p) / len(p)
    return out


def build(rng, rounds=30):
    wp, step, top = WindowPriorities(N, T, ALPHA, ETA, EPS, pad=True), np.zeros(N), 1.0
    for ep, first, length in EPISODES:
        wp.episode_added(ep, first, length)
        step[(first + np.arange(length)) % N] = top
    owned = np.flatnonzero(step > 0)
    for _ in range(rounds):
        slots = rng.choice(owned, size=int(rng.integers(1, 6)), replace=False)
        p = rng.random(len(slots)) * 5
        wp.update(slots, p, first_of=FIRST_OF, length_of=LENGTH_OF)
        step[slots], top = p + EPS, max(top, p.max())
    return wp, step, top


def test_window_priorities_match_reference_after_random_updates():
    wp, step, top = build(np.random.default_rng(0))
    ref = reference_windows(step, EPISODES)
    got = wp.window_priorities(np.arange(N))
    assert set(np.flatnonzero(got).tolist()) == set(ref)  # slot 14: the padded 3-step episode's one window
    np.testing.assert_allclose([got[s] for s in ref], list(ref.values()), rtol=1e-6)  # float32 as reported
    assert wp.max_priority == top
    starts = np.array(sorted(ref))
    owner = {s: (first, length) for _, first, length in EPISODES for s in (first + np.arange(length)) % N}
    assert wp.locate(starts, FIRST_OF).tolist() == [(s - owner[s][0]) % N for s in starts]


def test_draws_follow_window_priority_to_the_alpha_and_weights_are_by_hand():
    wp, step, _ = build(np.random.default_rng(1))
    ref = reference_windows(step, EPISODES)
    starts = np.array(sorted(ref))
    leaf = np.array([ref[s] for s in starts]) ** ALPHA
    rng, rounds, size = np.random.default_rng(2), 200, 1000  # stratified: the bound is generous, so many draws
    counts = np.bincount(np.concatenate([wp.sample(rng, size) for _ in range(rounds)]), minlength=N)
    assert counts.sum() == counts[starts].sum()  # only window starts are drawn
    assert chi_square(counts[starts], rounds * size * leaf / leaf.sum()) < chi_threshold(len(starts) - 1)
    np.testing.assert_allclose(wp.is_weights(starts, 0.6), (leaf / leaf.min()) ** -0.6, rtol=1e-9)


def test_removed_episode_is_never_drawn_and_new_steps_get_the_running_max():
    wp, step, top = build(np.random.default_rng(3))
    wp.episode_removed(*EPISODES[0])
    rng = np.random.default_rng(4)
    assert not np.isin(np.concatenate([wp.sample(rng, 64) for _ in range(20)]), np.arange(4, 14)).any()
    assert (wp.window_priorities(np.arange(4, 14)) == 0).all()
    wp.episode_added(0, 20, 5)  # the same episode slot, elsewhere: every step at the largest priority ever set
    np.testing.assert_allclose(wp.window_priorities(np.array([20, 21])), [top, top], rtol=1e-6)
    wp.clear()
    assert wp.max_priority == 1.0 and wp.sample(rng, 4) is None


def test_short_episode_without_pad_offers_no_window():
    wp = WindowPriorities(N, T, ALPHA, ETA, EPS, pad=False)
    wp.episode_added(0, 0, T - 1)
    assert wp.sample(np.random.default_rng(0), 3) is None and not wp.window_priorities(np.arange(N)).any()
    wp.episode_added(1, 10, T)  # exactly one window
    assert wp.sample(np.random.default_rng(0), 3).tolist() == [10, 10, 10]


def test_save_restore_round_trip_and_bad_states_change_nothing():
    wp, _, top = build(np.random.default_rng(5))
    state = wp.state_dict()
    new = wp.restored(state, EPISODES)
    assert new is not wp and new.max_priority == top
    assert new.window_priorities(np.arange(N)).tolist() == wp.window_priorities(np.arange(N)).tolist()
    assert new.sample(np.random.default_rng(6), 20).tolist() == wp.sample(np.random.default_rng(6), 20).tolist()
    before = wp.window_priorities(np.arange(N))
    step = state['step'].numpy()
    for bad, episodes, match in [
        (dict(state, step=step[:-1]), EPISODES, f'must be {N} finite numbers'),
        (dict(state, step=np.where(np.arange(N) == 5, -1.0, step)), EPISODES, '>= 0'),
        (dict(state, step=np.where(np.arange(N) == 5, np.nan, step)), EPISODES, 'finite'),
        (dict(state, max_priority=0.0), EPISODES, 'max_priority must be finite and > 0, got 0.0'),
        (state, EPISODES[:2], 'do not match the stored transitions'),  # episode 2's steps held by nobody
    ]:
        with pytest.raises(ValueError, match=match):
            wp.restored(bad, episodes)
    assert wp.window_priorities(np.arange(N)).tolist() == before.tolist() and wp.max_priority == top

"""Keep-best admission (``ding_buffer.control.keep_best.RewardIndex``) against a sorted-list model: prioritized
capacity keeps the largest ``(log_reward, seq)``, FIFO the newest, lazy mode truncates only at twice the capacity;
``admit`` changes nothing; draws follow ``softmax(log_reward)`` (chi-square, with and without replacement,
``-inf`` last or never); save / restore places and draws as the saved index did, a bad layout refused."""

import numpy as np
import pytest
from helpers import chi_square, chi_threshold

from ding_buffer.control.keep_best import RewardIndex

CAP = 8


def snapshot(ri):
    arrays = (ri.log_reward, ri.seq, ri.alive, ri.free_state())
    return [a.tobytes() for a in arrays] + [ri.count, ri.next_seq]  # bytes: NaN (empty slot) equals itself


def push(ri, r):
    """What the owning buffer does: admit, claim ids for every item, evict, then store the kept ones."""
    before = snapshot(ri)
    keep_new, evict = ri.admit(r)
    assert snapshot(ri) == before  # admit only decides
    seqs = ri.claim_seqs(len(r))
    ri.evict(evict)
    if keep_new is None:  # every item kept
        keep_new = np.ones(len(r), dtype=bool)
    ri.store(ri.free_slots(int(keep_new.sum())), r[keep_new], seqs[keep_new])


def live(ri):
    slots = ri.live_slots()
    return sorted(zip(ri.log_reward[slots].tolist(), ri.seq[slots].tolist()))


@pytest.mark.parametrize('prioritized', [True, False])
@pytest.mark.parametrize('lazy', [False, True])
def test_capacity_rule_matches_a_sorted_list(prioritized, lazy):
    rng = np.random.default_rng(int(prioritized) + 2 * int(lazy))
    ri = RewardIndex(CAP, 2 * CAP + 16, prioritized, lazy, reuse_slots=True)
    model, seq = [], 0
    for _ in range(200):
        r = rng.choice([-np.inf, 0.0, 1.0, 2.0, 3.0], size=int(rng.integers(1, 12)))  # ties and rewards of 0
        model += [(x, seq + i) for i, x in enumerate(r.tolist())]
        seq += len(r)
        if len(model) >= (2 * CAP if lazy else CAP + 1):
            model = sorted(model, key=(lambda e: e) if prioritized else (lambda e: e[1]))[-CAP:]
        push(ri, r)
        assert live(ri) == sorted(model) and ri.count == len(model)
        oldest = ri.oldest(ri.count)
        assert ri.seq[oldest].tolist() == sorted(s for _, s in model)  # oldest first
    if lazy:
        ri.evict(ri.flush())
        model = sorted(model, key=(lambda e: e) if prioritized else (lambda e: e[1]))[-CAP:]
        assert live(ri) == sorted(model)


def test_prioritized_draws_with_replacement_follow_softmax():
    ri = RewardIndex(6, 6, prioritized=True, lazy=False, reuse_slots=True)
    push(ri, np.array([0.0, 1.0, 2.0, np.log(0.5), -np.inf, 1.0]))
    r = ri.log_reward  # by slot (every slot live)
    p = np.exp(r) / np.exp(r).sum()
    n = 30000
    counts = np.bincount(ri.sample(np.random.default_rng(0), n, prioritized=True, replace=True), minlength=6)
    assert counts[r == -np.inf].sum() == 0  # reward 0: never
    keep = p > 0
    assert chi_square(counts[keep], n * p[keep]) < chi_threshold(keep.sum() - 1)
    big = RewardIndex(3, 3, prioritized=True, lazy=False, reuse_slots=True)
    push(big, np.array([1000.0, 999.0, -np.inf]))  # no overflow: exp(r - max r)
    counts = np.bincount(big.sample(np.random.default_rng(1), n, prioritized=True, replace=True), minlength=3)
    e = np.exp(big.log_reward - 1000.0)
    assert counts[e == 0].sum() == 0 and chi_square(counts[e > 0], n * e[e > 0] / e.sum()) < chi_threshold(1)


def test_prioritized_draws_without_replacement_are_successive_softmax_with_zero_rewards_last():
    ri = RewardIndex(5, 5, prioritized=True, lazy=False, reuse_slots=True)
    push(ri, np.array([0.0, 1.0, 2.0, -np.inf, -np.inf]))
    pos = ri.live_slots()[np.argsort(ri.log_reward[ri.live_slots()])][::-1]  # slots by reward: 2, 1, 0, -inf x2
    rng, rounds = np.random.default_rng(2), 20000
    first, second = np.zeros(ri.physical), np.zeros(ri.physical)
    for _ in range(rounds):
        out = ri.sample(rng, 4, prioritized=True, replace=False)
        assert len(set(out.tolist())) == 4 and set(out[:3].tolist()) == set(pos[:3].tolist()) and out[3] in pos[3:]
        first[out[0]] += 1
        second[out[1]] += 1
    w = np.exp(ri.log_reward[pos[:3]])
    p1 = w / w.sum()
    p2 = np.array([sum(p1[j] * w[i] / (w.sum() - w[j]) for j in range(3) if j != i) for i in range(3)])
    assert chi_square(first[pos[:3]], rounds * p1) < chi_threshold(2)
    assert chi_square(second[pos[:3]], rounds * p2) < chi_threshold(2)  # Plackett-Luce, not independent draws
    zero = RewardIndex(4, 4, prioritized=True, lazy=False, reuse_slots=True)
    push(zero, np.full(4, -np.inf))  # every reward 0: uniform
    counts = np.bincount(zero.sample(rng, 8000, prioritized=True, replace=True), minlength=4)
    assert chi_square(counts, np.full(4, 2000)) < chi_threshold(3)


def test_restore_places_and_draws_like_the_saved_index_and_refuses_bad_layouts():
    rng = np.random.default_rng(3)
    ri = RewardIndex(CAP, CAP, prioritized=True, lazy=False, reuse_slots=True)
    for _ in range(5):
        push(ri, rng.normal(size=5))
    slots = ri.live_slots()
    new, placed = ri.restored(ri.log_reward[slots], ri.seq[slots], ri.next_seq, slots=slots, free=ri.free_state())
    assert placed.tolist() == slots.tolist() and snapshot(new) == snapshot(ri)
    assert new.oldest(CAP).tolist() == ri.oldest(CAP).tolist()
    a, b = (x.sample(np.random.default_rng(4), 6, prioritized=True, replace=False) for x in (ri, new))
    assert a.tolist() == b.tolist()
    push(ri, np.array([9.0, -9.0]))
    push(new, np.array([9.0, -9.0]))
    assert snapshot(new) == snapshot(ri)
    before, r, s = snapshot(ri), ri.log_reward[slots], ri.seq[slots]
    for kwargs, match in [
        (dict(slots=np.r_[slots[:-1], slots[0]]), f'{CAP} distinct slots in'),
        (dict(slots=np.r_[slots[:-1], CAP]), rf'\[0, {CAP}\)'),
        (dict(slots=slots.astype(float)), "'slots' must be a 1-d array of ints"),
        (dict(slots=slots, free=np.array([slots[0]])), 'exactly the slots no item holds'),
    ]:
        with pytest.raises(ValueError, match=match):
            ri.restored(r, s, ri.next_seq, **kwargs)
    assert snapshot(ri) == before


@pytest.mark.parametrize('prioritized', [True, False])
def test_replace_is_evict_then_store_into_the_evicted_slots(prioritized):
    """A push into a full buffer commits with ``replace``: the arrays, free stack, insertion order and every later
    decision equal a twin's ``evict`` + ``store`` of the same items into the same slots, also with dead entries in
    the insertion-order queue (items evicted out of order, as ``max_use`` does)."""
    rng = np.random.default_rng(7)
    a, b = (RewardIndex(CAP, CAP, prioritized, False, True) for _ in range(2))
    for ri in (a, b):
        ri.store(ri.free_slots(CAP), np.arange(CAP, dtype=float), ri.claim_seqs(CAP))
    replaced = 0
    for step in range(300):
        if rng.random() < 0.2 and a.count:  # an out-of-order removal: a dead queue entry, then refill the slot
            gone, value = rng.choice(a.live_slots(), size=1), rng.normal(size=1)
            for ri in (a, b):
                ri.evict(gone)
                ri.store(ri.free_slots(1), value, ri.claim_seqs(1))
            continue
        r = rng.normal(size=int(rng.integers(1, 4)))
        keep_a, evict_a = a.admit(r)
        keep_b, evict_b = b.admit(r)
        assert np.array_equal(evict_a, evict_b) and (keep_a is None) == (keep_b is None)
        kept = np.ones(len(r), dtype=bool) if keep_a is None else keep_a
        seq_a, seq_b = a.claim_seqs(len(r))[kept], b.claim_seqs(len(r))[kept]
        if len(evict_a) != kept.sum():
            continue  # (not a replacement; both indexes stay equal: nothing was committed)
        a.replace(evict_a, r[kept], seq_a)
        b.evict(evict_b)
        b.free_slots(len(evict_b))  # (what the buffer takes them from; reversed, hence stored explicitly below)
        b.store(evict_b, r[kept], seq_b)
        replaced += 1
        assert snapshot(a) == snapshot(b), step
        assert np.array_equal(a.oldest(CAP), b.oldest(CAP)), step
    assert replaced > 100

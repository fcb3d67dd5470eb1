"""Compositions of the engine's parts, through the public API only.

1. ``naive`` + ``max_use`` / ``max_staleness`` / ``thruput_controller`` / ``sample(timeout=)`` / user samplers
   (``SAMPLER_REGISTRY``) / user removers (``REMOVER_REGISTRY``), on list and tensor storage;
2. ``episode`` + ``max_use`` / ``max_staleness`` / ``thruput_controller`` / ``timeout`` (per episode);
3. prioritized sequence replay (``prioritized_episode``, or ``episode`` + tensor storage +
   ``sampler=dict(type='prioritized', ...)``) against a brute-force reference of window priorities
   (``p_w = eta * max + (1 - eta) * mean`` of the window's step priorities, drawn with ``p_w ** alpha``).

Every item carries ``x`` (naive) or ``obs = [episode, step]`` (episodes), so any sampled element can be traced
back to what was pushed. Every buffer is seeded.
"""

import os
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from helpers import FakeTB, assert_same

from ding_buffer import create_buffer
from ding_buffer.control.limits import REMOVER_REGISTRY, Remover
from ding_buffer.control.samplers import SAMPLER_REGISTRY
from ding_buffer.errors import SampleTimeoutError

STORAGES = ['list', 'tensor']
NO_DECAY = 1e6  # window_seconds: the thruput counters practically never decay during a test
# An outer bound on waits that must end (a hang fails the test); never a speed requirement: a loaded machine passes.
GENEROUS = 30.0


# ---------------------------------------------------------------------------------------------- user parts
# Registered once, at import time (a registry refuses a name registered twice).
@SAMPLER_REGISTRY.register('compositions_newest_first')
class NewestFirst:
    """The newest ``size`` candidates (newest first), optionally skipping the ``skip`` newest; refuses when
    there are too few."""

    def __init__(self, skip=0):
        self.skip = skip

    def draw(self, rng, m, size, replace):
        top = m - self.skip
        if size > top:
            return None
        return np.arange(top - 1, top - 1 - size, -1, dtype=np.int64)


@SAMPLER_REGISTRY.register('compositions_fixed_answer')
class FixedAnswer:
    """Answers every draw with the same kind of reply: ``'none'`` refuses; the others are answers no preset may
    act on (a negative position, one past the end, floats, too few positions)."""

    def __init__(self, answer):
        self.answer = answer

    def draw(self, rng, m, size, replace):
        return {
            'none': lambda: None,
            'negative': lambda: np.full(size, -1, dtype=np.int64),
            'past_end': lambda: np.full(size, m, dtype=np.int64),
            'floats': lambda: np.zeros(size, dtype=np.float64),
            'too_few': lambda: np.zeros(size - 1, dtype=np.int64),
            'none_after_drawing': lambda: [rng.integers(0, m, size), None][1],  # moves the buffer's RNG, refuses
        }[self.answer]()


@REMOVER_REGISTRY.register('compositions_odd')
class OddRule(Remover):
    """Remove every drawn element whose ``collect_iter`` is odd."""

    name = 'odd'

    def after_sample(self, table, slots, use):
        ci = table.collect_iter(slots)
        return np.unique(slots[ci % 2 == 1]).astype(np.int64)


def test_registering_a_name_twice_raises():
    with pytest.raises(ValueError, match='already registered'):
        SAMPLER_REGISTRY.register('compositions_newest_first')(type('Other', (), {}))
    with pytest.raises(ValueError, match='already registered'):
        REMOVER_REGISTRY.register('compositions_odd')(type('OtherRule', (Remover,), {}))
    assert SAMPLER_REGISTRY['compositions_newest_first'] is NewestFirst
    assert REMOVER_REGISTRY['compositions_odd'] is OddRule


# ---------------------------------------------------------------------------------------------- naive helpers
def naive(storage, size=10, **kwargs):
    return create_buffer(dict(type='naive', replay_buffer_size=size, seed=0, storage=dict(type=storage), **kwargs))


def item(x, ci=None):
    d = {'x': torch.tensor(x)}
    if ci is not None:
        d['collect_iter'] = ci
    return d


def xs(out):
    """The ``x`` of every sampled item, in batch order (list storage: list of items; tensor: dict of [B])."""
    if isinstance(out, dict):
        return out['x'].tolist()
    return [int(o['x']) for o in out]


def limiter(max=float('inf'), min=0.0, ratio=0.0):
    return dict(push_sample_rate_limit=dict(max=max, min=min), window_seconds=NO_DECAY, sample_min_limit_ratio=ratio)


@pytest.fixture(params=STORAGES)
def storage(request):
    return request.param


# ---------------------------------------------------------------------------------------------- 1. naive: max_use
def test_naive_max_use_follows_a_reference_model(storage):
    """Draws with replacement, batches of 4, max_use=2, new items pushed half-way: an item is never drawn after
    the batch in which its total draw count reached 2, it leaves right after that batch, and the counters
    match the model."""
    buf = naive(storage, size=20, max_use=2)
    buf.push([item(i) for i in range(10)])
    uses, stored, removed, sampled, refused = Counter(), set(range(10)), set(), 0, 0
    for it in range(40):
        if it == 5:
            buf.push([item(100 + i) for i in range(5)])
            stored |= {100 + i for i in range(5)}
        out = buf.sample(4, replace=True)
        if not stored:
            assert out is None
            refused += 1
        else:
            got = xs(out)
            assert len(got) == 4 and set(got) <= stored, (got, stored)
            sampled += 4
            uses.update(got)
            gone = {x for x in set(got) if uses[x] >= 2}
            stored -= gone
            removed |= gone
        assert buf.count() == len(stored)
        st = buf.stats()
        assert st['removed_by_use'] == len(removed) == st['remove_count']
        assert st['sampled_items'] == sampled and st['refused_sample'] == refused
    assert not stored and len(removed) == 15  # 15 items x 2 uses = 30 draws < 160
    assert all(uses[x] >= 2 for x in removed)


def test_naive_max_use_without_replacement_draws_each_item_at_most_twice(storage):
    buf = naive(storage, size=10, max_use=2)
    buf.push([item(i) for i in range(10)])
    uses = Counter()
    while True:
        out = buf.sample(3)
        if out is None:
            break
        uses.update(xs(out))
        assert max(uses.values()) <= 2
    spent = {x for x, n in uses.items() if n == 2}
    assert buf.count() == 10 - len(spent) < 3  # stopped because fewer than 3 items were left
    assert buf.stats()['removed_by_use'] == len(spent) >= 8
    assert buf.stats()['refused_sample'] == 1


def test_naive_max_use_counts_draws_within_one_batch(storage):
    buf = naive(storage, max_use=2)
    buf.push(item(7))
    assert xs(buf.sample(2, replace=True)) == [7, 7]
    assert buf.count() == 0
    assert buf.stats()['removed_by_use'] == 1
    assert buf.sample(1) is None


def test_naive_max_use_counts_survive_save_and_load(storage, tmp_path):
    cfg = dict(max_use=2)
    buf = naive(storage, **cfg)
    buf.push([item(i) for i in range(3)])
    assert xs(buf.sample(1, sample_range=slice(0, 1))) == [0]  # item 0: one use
    path = str(tmp_path / 'naive.pt')
    buf.save_data(path)
    fresh = naive(storage, **cfg)
    fresh.load_data(path)
    assert fresh.count() == 3
    assert xs(fresh.sample(1, sample_range=slice(0, 1))) == [0]  # its second use
    assert fresh.count() == 2
    assert fresh.stats()['removed_by_use'] == 1
    assert sorted(xs(fresh.sample(2))) == [1, 2]


# ---------------------------------------------------------------------------------------------- 1. naive: staleness
def test_naive_staleness_removes_the_oldest_stale_items(storage):
    buf = naive(storage, max_staleness=3)
    buf.push([item(i, ci=i) for i in range(10)])
    assert len(xs(buf.sample(10))) == 10  # cur_learner_iter=-1 by default: nothing is stale
    assert buf.count() == 10
    out = buf.sample(7, cur_learner_iter=5)  # 5 - ci >= 3 <=> ci <= 2
    assert sorted(xs(out)) == list(range(3, 10))
    assert buf.count() == 7 and buf.stats()['removed_by_staleness'] == 3
    assert buf.sample(5, cur_learner_iter=8) is None  # ci <= 5 leave first: 4 items left < 5
    assert buf.count() == 4 and buf.stats()['removed_by_staleness'] == 6
    assert sorted(xs(buf.sample(4, cur_learner_iter=8))) == [6, 7, 8, 9]
    st = buf.stats()
    assert st['remove_count'] == 6 and st['refused_sample'] == 1


def test_naive_staleness_walk_stops_at_the_first_fresh_item(storage):
    buf = naive(storage, max_staleness=3)
    cis = [0, 1, 9, 0, 1, 9]
    buf.push([item(i, ci=c) for i, c in enumerate(cis)])
    out = buf.sample(4, cur_learner_iter=5)
    assert sorted(xs(out)) == [2, 3, 4, 5]  # items 3 and 4 are stale but behind the fresh item 2
    assert buf.count() == 4 and buf.stats()['removed_by_staleness'] == 2


def test_naive_staleness_walk_stops_at_an_item_without_collect_iter():
    buf = naive('list', max_staleness=3)
    buf.push([item(0, ci=0), item(1), item(2, ci=0)])
    assert sorted(xs(buf.sample(2, cur_learner_iter=10))) == [1, 2]
    assert buf.count() == 2 and buf.stats()['removed_by_staleness'] == 1


# ---------------------------------------------------------------------------------------------- 1. naive: limiter
def test_naive_thruput_max_refuses_pushes(storage):
    buf = naive(storage, size=30, thruput_controller=limiter(max=2))
    assert buf.push([item(i) for i in range(10)]) == 10  # nothing sampled yet: always allowed
    assert len(xs(buf.sample(4))) == 4
    assert buf.push(item(10)) == 0  # (10 + 1) / 4 > 2
    assert buf.count() == 10
    st = buf.stats()
    assert st['refused_push'] == 1 and st['push_items'] == 10
    assert len(xs(buf.sample(4))) == 4
    assert buf.push([item(20 + i) for i in range(4)]) == 4  # (10 + 4) / 8 <= 2
    assert buf.push([item(30 + i) for i in range(3)]) == 0  # (14 + 3) / 8 > 2
    st = buf.stats()
    assert buf.count() == 14 and st['refused_push'] == 2 and st['push_items'] == 14


def test_naive_thruput_min_refuses_samples(storage):
    buf = naive(storage, size=30, thruput_controller=limiter(min=1))
    buf.push([item(i) for i in range(10)])
    assert buf.sample(4) is not None and buf.sample(4) is not None  # 10/4, 10/8
    assert buf.sample(4) is None  # 10 / 12 < 1
    st = buf.stats()
    assert st['refused_sample'] == 1 and st['sample_calls'] == 2 and buf.count() == 10
    buf.push([item(10 + i) for i in range(4)])
    assert len(xs(buf.sample(4))) == 4  # 14 / 12


def test_naive_sample_min_limit_ratio(storage):
    buf = naive(storage, thruput_controller=limiter(ratio=2))
    buf.push([item(i) for i in range(10)])
    assert buf.sample(6) is None  # 10 < 2 x 6
    assert len(xs(buf.sample(5))) == 5
    assert buf.stats()['refused_sample'] == 1


def _push_later(buf, items, delay):
    t = threading.Thread(target=lambda: (time.sleep(delay), buf.push(items)), daemon=True)
    t.start()
    return t


def test_naive_timeout_raises_and_a_push_from_another_thread_wakes_it(storage):
    buf = naive(storage)
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError):
        buf.sample(2, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < GENEROUS  # waited its timeout (the upper bound only catches a hang)
    pusher = _push_later(buf, [item(1), item(2)], 0.1)
    out = buf.sample(2, timeout=2 * GENEROUS)  # woken by the push (its timeout would raise)
    assert sorted(xs(out)) == [1, 2]
    pusher.join(GENEROUS)


def test_naive_timeout_waits_for_the_rate_limit(storage):
    buf = naive(storage, size=30, thruput_controller=limiter(min=1))
    buf.push([item(i) for i in range(4)])
    assert buf.sample(4) is not None  # 4 / 4
    with pytest.raises(SampleTimeoutError):
        buf.sample(4, timeout=0.2)  # 4 / 8 < 1 and nobody pushes
    pusher = _push_later(buf, [item(10 + i) for i in range(4)], 0.1)
    assert len(xs(buf.sample(4, timeout=2 * GENEROUS))) == 4  # 8 / 8 after the push: woken by it
    pusher.join(GENEROUS)


def test_sample_timeout_error_is_public():
    import ding_buffer

    assert ding_buffer.SampleTimeoutError is SampleTimeoutError
    assert issubclass(SampleTimeoutError, TimeoutError)


# ---------------------------------------------------------------------------------------------- 1. naive: parts by name
@pytest.mark.parametrize('sampler', [dict(type='prioritized'), dict(type='no_such_sampler'), dict(type=3)])
def test_naive_refuses_bad_sampler_types(storage, sampler):
    with pytest.raises(ValueError, match=r'sampler\.type'):
        naive(storage, sampler=sampler)


def test_unknown_remover_type_is_refused(storage):
    with pytest.raises(ValueError, match=r'removers'):
        naive(storage, removers=[dict(type='no_such_rule')])


def test_naive_user_sampler_draws_the_newest(storage):
    buf = naive(storage, sampler=dict(type='compositions_newest_first'))
    buf.push([item(i) for i in range(10)])
    assert xs(buf.sample(3)) == [9, 8, 7]
    assert xs(buf.sample(3, sample_range=slice(0, 5))) == [4, 3, 2]  # positions are relative to the range
    buf.push([item(10), item(11)])  # overwrites 0 and 1
    assert xs(buf.sample(4)) == [11, 10, 9, 8]
    assert buf.sample(11) is None  # the sampler refuses
    assert buf.stats()['refused_sample'] == 1
    skipping = naive(storage, sampler=dict(type='compositions_newest_first', skip=2))  # arguments reach the class
    skipping.push([item(i) for i in range(10)])
    assert xs(skipping.sample(2)) == [7, 6]


def test_naive_user_remover(storage):
    buf = naive(storage, removers=[dict(type='compositions_odd')])
    buf.push([item(i, ci=i) for i in range(10)])
    stored, gone = set(range(10)), set()
    for _ in range(6):
        out = buf.sample(3)
        if out is None:
            assert len(stored) < 3
            break
        got = xs(out)
        assert set(got) <= stored
        odd = {x for x in got if x % 2}
        stored -= odd
        gone |= odd
        assert buf.count() == len(stored)
        assert buf.stats()['removed_by_odd'] == len(gone) == buf.stats()['remove_count']
    assert gone  # at least one odd item was drawn (seeded)
    assert buf.stats()['removed_by_use'] == 0


@pytest.mark.parametrize('storage_type', ['list', 'tensor'])
def test_naive_max_use_and_user_remover_count_each_removal_once(storage_type):
    """max_use=1 removes every drawn item; the odd rule must not remove (or count) them a second time."""
    buf = naive(storage_type, max_use=1, removers=[dict(type='compositions_odd')])
    buf.push([item(i, ci=i) for i in range(6)])
    got = xs(buf.sample(3))
    st = buf.stats()
    assert buf.count() == 3 and set(xs(buf.sample(3))) == set(range(6)) - set(got)
    assert st['removed_by_use'] + st['removed_by_odd'] == st['remove_count'] == st['push_items'] - st['count'] == 3


def test_naive_use_count_restarts_when_a_slot_is_overwritten(storage):
    buf = naive(storage, size=3, max_use=2)
    buf.push([item(i) for i in range(3)])
    assert xs(buf.sample(1, sample_range=slice(0, 1))) == [0]  # item 0: one use
    buf.push(item(3))  # overwrites item 0's slot
    assert xs(buf.sample(1, sample_range=slice(-1, None))) == [3]  # item 3's first use, not the second
    assert buf.count() == 3 and buf.stats()['removed_by_use'] == 0
    assert xs(buf.sample(1, sample_range=slice(-1, None))) == [3]
    assert buf.count() == 2 and buf.stats()['removed_by_use'] == 1


def test_naive_staleness_walk_skips_holes_left_by_max_use(storage):
    buf = naive(storage, max_use=1, max_staleness=3)
    buf.push([item(i, ci=i) for i in range(10)])
    first = xs(buf.sample(4))
    left = [i for i in range(10) if i not in first]
    assert buf.count() == 6
    second = xs(buf.sample(1, cur_learner_iter=7))  # ci <= 4 are stale
    stale = [i for i in left if i <= 4]
    assert buf.stats()['removed_by_staleness'] == len(stale) > 0
    assert second[0] in left and second[0] > 4
    assert buf.count() == 6 - len(stale) - 1
    assert sorted(xs(buf.sample(buf.count()))) == sorted(i for i in left if i > 4 and i != second[0])


def test_close_wakes_a_waiting_sampler(storage):
    buf = naive(storage)
    caught = {}

    def waiter():
        try:
            buf.sample(1, timeout=2 * GENEROUS)
        except Exception as e:  # noqa: BLE001 (recorded and checked below)
            caught['error'] = e

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.2)
    buf.close()
    t.join(GENEROUS)
    assert not t.is_alive()  # woken by close, long before its timeout
    assert isinstance(caught.get('error'), RuntimeError) and 'closed' in str(caught['error'])


# ---------------------------------------------------------------------------------------------- 2. episode helpers
def dict_ep(e, length, ci=None):
    """A dict episode of time-stacked tensors: obs [L, 2] = (episode, step), act [L]; optional collect_iter [L]."""
    steps = torch.arange(length)
    ep = {'obs': torch.stack([torch.full((length,), float(e)), steps.float()], dim=1), 'act': 100 * e + steps}
    if ci is not None:
        ep['collect_iter'] = torch.as_tensor(ci, dtype=torch.int64).expand(length).clone()
    return ep


def list_ep(e, length, ci=None):
    """A list episode of transition dicts; ``ci`` an int or one per step."""
    cis = [ci] * length if ci is None or isinstance(ci, int) else list(ci)
    out = []
    for t in range(length):
        tr = {'obs': torch.tensor([float(e), float(t)]), 'act': torch.tensor(100 * e + t)}
        if cis[t] is not None:
            tr['collect_iter'] = cis[t]
        out.append(tr)
    return out


def episode_buffer(storage, size=8, max_transitions=None, **kwargs):
    """An episode buffer; tensor storage needs max_transitions (64 unless given)."""
    cfg = dict(type='episode', replay_buffer_size=size, seed=0, storage=dict(type=storage), **kwargs)
    if max_transitions is not None or storage == 'tensor':
        cfg['max_transitions'] = max_transitions or 64
    return create_buffer(cfg)


def make_ep(storage, e, length, ci=None):
    return (dict_ep if storage == 'tensor' else list_ep)(e, length, ci)


def window_keys(out):
    """[(episode, start), ...] of a window batch (tensor: dict of [B, T]; list: list of windows)."""
    if isinstance(out, dict):
        return [(int(o[0]), int(o[1])) for o in out['obs'][:, 0]]
    keys = []
    for w in out:
        first = w[0] if isinstance(w, list) else {'obs': torch.as_tensor(w['obs'])[0]}
        keys.append((int(first['obs'][0]), int(first['obs'][1])))
    return keys


def episode_keys(out):
    """Episode numbers of a whole-episode batch."""
    return [int(ep[0]['obs'][0]) if isinstance(ep, list) else int(torch.as_tensor(ep['obs'])[0, 0]) for ep in out]


# ---------------------------------------------------------------------------------------------- 2. episode + parts
@pytest.mark.parametrize('mode', ['list', 'tensor', 'prioritized'])
def test_episode_staleness_removes_the_oldest_stale_episodes(mode):
    """Episode k's steps carry collect_iter k, except episode 1: [3, 1, 3, 3] (its min, 1, counts)."""
    storage = 'list' if mode == 'list' else 'tensor'
    extra = dict(sampler=dict(type='prioritized', unroll_len=2)) if mode == 'prioritized' else {}
    buf = episode_buffer(storage, max_staleness=3, **extra)
    for k in range(5):
        ci = [3, 1, 3, 3] if k == 1 else k
        buf.push([make_ep(storage, k, 4, ci)])  # a list is a list of episodes
    assert buf.count() == 5
    out = buf.sample(60, cur_learner_iter=4, unroll_len=2, replace=True)  # 4 - ci >= 3 <=> ci <= 1
    assert {e for e, _ in window_keys(out)} <= {2, 3, 4}
    assert buf.count() == 3 and buf.stats()['removed_by_staleness'] == 2
    out = buf.sample(30, cur_learner_iter=6, unroll_len=2, replace=True)  # now ci <= 3 are stale
    assert {e for e, _ in window_keys(out)} == {4}
    st = buf.stats()
    assert buf.count() == 1 and st['removed_by_staleness'] == 4 == st['remove_count']


def test_episode_staleness_walk_stops_at_the_first_fresh_episode(storage):
    buf = episode_buffer(storage, max_staleness=3)
    buf.push([make_ep(storage, k, 3, ci) for k, ci in enumerate([0, 9, 0])])
    assert sorted(episode_keys(buf.sample(2, cur_learner_iter=5))) == [1, 2]
    assert buf.count() == 2 and buf.stats()['removed_by_staleness'] == 1


def test_episode_max_use_follows_a_reference_model(storage):
    """max_use=3 per episode, counting window draws and whole-episode draws alike (replace=True)."""
    buf = episode_buffer(storage, max_use=3)
    buf.push([make_ep(storage, k, 4) for k in range(6)])
    uses, stored, removed = Counter(), set(range(6)), set()
    for it in range(30):
        whole = it % 3 == 2
        out = buf.sample(2, replace=True) if whole else buf.sample(3, unroll_len=2, replace=True)
        if not stored:
            assert out is None
            continue
        got = episode_keys(out) if whole else [e for e, _ in window_keys(out)]
        assert set(got) <= stored, (it, got, stored)
        uses.update(got)
        gone = {e for e in set(got) if uses[e] >= 3}
        stored -= gone
        removed |= gone
        assert buf.count() == len(stored)
        assert buf.stats()['removed_by_use'] == len(removed)
    assert not stored and buf.stats()['remove_count'] == 6


def test_episode_max_use_on_whole_episodes_without_replacement(storage):
    buf = episode_buffer(storage, max_use=1)
    buf.push([make_ep(storage, k, 3) for k in range(5)])
    first = episode_keys(buf.sample(3))
    assert len(set(first)) == 3 and buf.count() == 2
    assert sorted(episode_keys(buf.sample(2))) == sorted(set(range(5)) - set(first))
    assert buf.count() == 0 and buf.stats()['removed_by_use'] == 5


def test_episode_use_count_restarts_when_an_episode_is_evicted(storage):
    buf = episode_buffer(storage, size=2, max_use=2)
    buf.push([make_ep(storage, 0, 3), make_ep(storage, 1, 3)])
    assert episode_keys(buf.sample(1, sample_range=slice(0, 1))) == [0]
    buf.push([make_ep(storage, 2, 3)])  # evicts episode 0 and takes its slot
    assert episode_keys(buf.sample(1, sample_range=slice(-1, None))) == [2]
    assert buf.count() == 2 and buf.stats()['removed_by_use'] == 0


def test_episode_use_counts_survive_save_and_load(storage, tmp_path):
    buf = episode_buffer(storage, max_use=2)
    buf.push([make_ep(storage, k, 3) for k in range(3)])
    assert window_keys(buf.sample(1, unroll_len=2, sample_range=slice(0, 1)))[0][0] == 0
    path = str(tmp_path / 'episodes.pt')
    buf.save_data(path)
    fresh = episode_buffer(storage, max_use=2)
    fresh.load_data(path, allow_pickle=storage == 'list')
    assert episode_keys(fresh.sample(1, sample_range=slice(0, 1))) == [0]  # second use: removed
    assert fresh.count() == 2 and fresh.stats()['removed_by_use'] == 1


def test_episode_push_after_a_middle_removal_keeps_the_older_episodes():
    """List storage keeps episodes as objects: a hole left by a middle removal is simply free room."""
    buf = episode_buffer('list', max_transitions=12, max_use=1)
    buf.push([make_ep('list', k, 4) for k in range(3)])
    assert episode_keys(buf.sample(1, sample_range=slice(1, 2))) == [1]  # removed: max_use=1
    buf.push([make_ep('list', 3, 4)])  # 8 + 4 <= 12 transitions: nothing needs to leave
    assert buf.count() == 3 and buf.stats()['remove_count'] == 1
    assert sorted(episode_keys(buf.sample(3))) == [0, 2, 3]


def test_episode_push_after_a_middle_removal_never_overwrites_live_transitions():
    """Tensor storage keeps transitions in one ring written at its tail: a hole in the middle is not written
    into, so the oldest episode whose transitions lie where the new one goes leaves first (whole, counted)."""
    buf = episode_buffer('tensor', max_transitions=12, max_use=1)
    buf.push([make_ep('tensor', k, 4) for k in range(3)])  # transitions 0-3, 4-7, 8-11
    assert episode_keys(buf.sample(1, sample_range=slice(1, 2))) == [1]  # removed: max_use=1
    buf.push([make_ep('tensor', 3, 4)])  # the tail is slots 0-3, episode 0's: it leaves
    assert buf.count() == 2 and buf.stats()['remove_count'] == 2 and buf.episode_len == [4, 4]
    out = buf.sample(2)
    assert sorted(episode_keys(out)) == [2, 3]
    for ep in out:  # both intact: one episode's number, steps 0..3
        assert len(set(ep['obs'][:, 0].tolist())) == 1 and ep['obs'][:, 1].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert buf.count() == 0  # max_use=1
    buf.push([make_ep('tensor', 4, 4), make_ep('tensor', 5, 4)])
    assert sorted(episode_keys(buf.sample(2))) == [4, 5]


def test_episode_thruput_controller_and_timeout(storage):
    buf = episode_buffer(storage, thruput_controller=limiter(max=1))
    with pytest.raises(SampleTimeoutError):
        buf.sample(1, unroll_len=2, timeout=0.2)  # empty
    pusher = _push_later(buf, [make_ep(storage, 0, 3), make_ep(storage, 1, 3)], 0.1)
    out = buf.sample(2, unroll_len=2, replace=True, timeout=2 * GENEROUS)  # woken by the push
    assert {e for e, _ in window_keys(out)} <= {0, 1}
    pusher.join(GENEROUS)
    assert buf.push([make_ep(storage, 2, 3)]) == 0  # (2 + 1) / 2 > 1
    assert buf.count() == 2 and buf.stats()['refused_push'] == 1
    assert buf.sample(1, unroll_len=2) is not None
    assert buf.push([make_ep(storage, 2, 3)]) == 1  # (2 + 1) / 3 <= 1


def test_episode_user_sampler_draws_the_newest_windows_and_episodes(storage):
    buf = episode_buffer(storage, sampler=dict(type='compositions_newest_first'))
    buf.push([make_ep(storage, k, 4) for k in range(3)])
    assert window_keys(buf.sample(4, unroll_len=2)) == [(2, 2), (2, 1), (2, 0), (1, 2)]
    assert episode_keys(buf.sample(2)) == [2, 1]


def _episode_draws(buf):
    """A whole-episode draw and a window draw."""
    return [lambda: buf.sample(2), lambda: buf.sample(2, unroll_len=2)]


@pytest.mark.parametrize('kind', ['whole', 'windows'])
def test_episode_user_sampler_refusal_is_a_refused_sample(storage, kind):
    """A user sampler answering ``None`` refuses the sample (as on naive and sequence): ``None`` comes back, one
    refused sample is counted, and nothing else changes (no use counted, no episode removed by max_use)."""
    buf = episode_buffer(storage, max_use=1, sampler=dict(type='compositions_fixed_answer', answer='none'))
    buf.push([make_ep(storage, k, 4) for k in range(3)])
    before = buf.state_dict()
    draw = _episode_draws(buf)[kind == 'windows']
    assert draw() is None
    assert buf.stats()['refused_sample'] == 1 and buf.stats()['sampled_items'] == 0
    assert buf.count() == 3 and buf.stats()['removed_by_use'] == 0
    before['counters']['refused_sample'] += 1  # the one thing a refusal changes
    assert_same(before, buf.state_dict())


@pytest.mark.parametrize('answer', ['negative', 'past_end', 'floats', 'too_few'])
@pytest.mark.parametrize('kind', ['whole', 'windows'])
def test_episode_user_sampler_bad_answer_raises_and_changes_nothing(storage, kind, answer):
    """A user sampler's answer is checked before it is used: a negative position (which numpy would read as the
    newest episode, or as a window starting before its episode), a position past the end, floats or too few
    positions raise a RuntimeError naming the sampler; no use is counted and the state is unchanged."""
    buf = episode_buffer(storage, max_use=1, sampler=dict(type='compositions_fixed_answer', answer=answer))
    buf.push([make_ep(storage, k, 4) for k in range(3)])
    before = buf.state_dict()
    draw = _episode_draws(buf)[kind == 'windows']
    with pytest.raises(RuntimeError, match="sampler 'compositions_fixed_answer' returned"):
        draw()
    assert buf.count() == 3 and buf.stats()['removed_by_use'] == 0 and buf.stats()['sampled_items'] == 0
    assert_same(before, buf.state_dict())


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_user_sampler_that_refuses_after_drawing_leaves_the_rng_as_it_was(storage):
    """A refusal (``None``) from a sampler that drew from the buffer's RNG first: the sample is refused (counted)
    and the RNG goes back, so the next samples are those of a buffer that never asked."""
    cfg = dict(type='naive', replay_buffer_size=16, seed=4, storage=dict(type=storage))
    buf = create_buffer(dict(cfg, sampler=dict(type='compositions_fixed_answer', answer='none_after_drawing')))
    buf.push([{'obs': float(i)} for i in range(8)])
    before = buf.state_dict()
    assert buf.sample(3) is None
    before['counters']['refused_sample'] += 1  # the one thing a refusal changes
    assert_same(before, buf.state_dict())


# ---------------------------------------------------------------------------------------------- 3. prioritized windows
T, ALPHA, BETA, ETA, EPS = 3, 0.7, 0.5, 0.6, 1e-3
LENGTHS = [2, 3, 4, 6, 7]  # with padding: windows 1 + 1 + 2 + 4 + 5 = 13


def prio_buffer(size=8, max_transitions=64, alpha=ALPHA, seed=0, via='preset', pad=True, **kwargs):
    sampler = dict(type='prioritized', unroll_len=T, alpha=alpha, beta=BETA, eta=ETA, eps=EPS, anneal_step=0)
    if via == 'preset':
        cfg = dict(type='prioritized_episode', sampler=sampler)
    else:
        cfg = dict(type='episode', storage=dict(type='tensor'), sampler=sampler)
    cfg.update(replay_buffer_size=size, max_transitions=max_transitions, seed=seed, pad_short_episodes=pad, **kwargs)
    return create_buffer(cfg)


class Reference:
    """Brute force: per-step priorities of every stored episode, every window enumerated."""

    def __init__(self, alpha=ALPHA, pad=True):
        self.alpha, self.pad = alpha, pad
        self.steps = {}  # episode -> float64 array of step priorities

    def add(self, e, length, priority=1.0):
        self.steps[e] = np.full(length, priority)

    def drop(self, e):
        del self.steps[e]

    def windows(self):
        out = {}
        for e, p in self.steps.items():
            L = len(p)
            starts = range(L - T + 1) if L >= T else ([0] if self.pad else [])
            for o in starts:
                w = p[o : o + T]
                out[(e, o)] = ETA * w.max() + (1 - ETA) * w.mean()
        return out

    def probabilities(self):
        pw = self.windows()
        mass = {k: v**self.alpha for k, v in pw.items()}
        total = sum(mass.values())
        return {k: v / total for k, v in mass.items()}

    def is_weights(self):
        mass = {k: v**self.alpha for k, v in self.windows().items()}
        low = min(mass.values())
        return {k: (v / low) ** (-BETA) for k, v in mass.items()}


def prio_keys(out):
    """(episode_id, start) of each sampled window, checked against the window's own data."""
    keys = [(int(e), int(s)) for e, s in zip(out['episode_id'], out['start'])]
    assert keys == [(int(o[0]), int(o[1])) for o in out['obs'][:, 0]]
    return keys


def check_batch(out, ref, size):
    """Every window of the batch exists in the reference, with the reference's priority and IS weight; the
    step ids are -1 exactly on padding."""
    pw, isw = ref.windows(), ref.is_weights()
    keys = prio_keys(out)
    assert len(keys) == size
    assert out['priority'].dtype == torch.float32 and out['IS'].shape == (size,)
    for b, k in enumerate(keys):
        assert k in pw, k
        e, start = k
        n = min(T, len(ref.steps[e]) - start)  # valid steps of the window
        assert out['mask'][b].tolist() == [True] * n + [False] * (T - n), (k, out['mask'][b])
        assert out['obs'][b, :n].tolist() == [[float(e), float(start + j)] for j in range(n)], k
        np.testing.assert_allclose(float(out['priority'][b]), pw[k], rtol=1e-5)
        np.testing.assert_allclose(float(out['IS'][b]), isw[k], rtol=1e-5)
    pad = ~out['mask']
    assert torch.equal(out['replay_buffer_idx'] == -1, pad) and torch.equal(out['replay_unique_id'] == -1, pad)
    return keys


def covering_batch(buf, ref, size=256):
    """A batch that contains every window (seeded; asserted)."""
    out = buf.sample(size)
    assert set(prio_keys(out)) == set(ref.windows()), "a 256-window batch should cover every window"
    return out


def step_priorities(out, table, fill_padding=1000.0):
    """[B, T] per-step priorities taken from ``table[e][t]`` (``fill_padding`` where masked)."""
    obs, mask = out['obs'], out['mask']
    p = np.full(mask.shape, fill_padding)
    for b in range(mask.shape[0]):
        for k in range(mask.shape[1]):
            if mask[b, k]:
                p[b, k] = table[int(obs[b, k, 0])][int(obs[b, k, 1])]
    return torch.from_numpy(p)


def filled(lengths=LENGTHS, **kwargs):
    buf = prio_buffer(**kwargs)
    ref = Reference(alpha=kwargs.get('alpha', ALPHA), pad=kwargs.get('pad', True))
    buf.push([dict_ep(e, L) for e, L in enumerate(lengths)])
    for e, L in enumerate(lengths):
        ref.add(e, L)
    return buf, ref


def distinct_priorities(buf, ref, seed=1):
    """Give every step a distinct priority through one per-step update; mirror it in the reference."""
    rng = np.random.default_rng(seed)
    table = {e: rng.uniform(0.05, 6.0, size=len(p)) for e, p in ref.steps.items()}
    out = covering_batch(buf, ref)
    res = buf.update(
        {
            'replay_unique_id': out['replay_unique_id'],
            'replay_buffer_idx': out['replay_buffer_idx'],
            'priority': step_priorities(out, table),
        }
    )
    assert res == {'updated': int(out['mask'].sum()), 'stale': 0}
    for e in table:
        ref.steps[e] = table[e] + EPS
    return table


def frequencies(buf, batches=200, size=256):
    counts = Counter()
    for _ in range(batches):
        counts.update(prio_keys(buf.sample(size)))
    return counts


def assert_matches(counts, probs):
    stats = pytest.importorskip('scipy.stats')
    assert set(counts) <= set(probs), set(counts) - set(probs)
    keys = sorted(probs)
    n = sum(counts.values())
    observed = np.array([counts[k] for k in keys], dtype=np.float64)
    expected = np.array([probs[k] for k in keys]) * n
    res = stats.chisquare(observed, expected)
    assert res.pvalue > 1e-3, (res, dict(zip(keys, observed)), dict(zip(keys, expected)))


def test_prioritized_frequencies_match_window_priorities():
    buf, ref = filled()
    distinct_priorities(buf, ref)
    probs = ref.probabilities()
    assert max(probs.values()) / min(probs.values()) > 1.5  # the test can tell priorities apart
    assert_matches(frequencies(buf), probs)


def test_prioritized_frequencies_follow_a_later_update():
    """The sampler follows a second update that reverses the ranking (not just the first one)."""
    buf, ref = filled()
    table = distinct_priorities(buf, ref)
    reversed_table = {e: 6.1 - p for e, p in table.items()}
    out = covering_batch(buf, ref)
    buf.update(
        {
            'replay_unique_id': out['replay_unique_id'],
            'replay_buffer_idx': out['replay_buffer_idx'],
            'priority': step_priorities(out, reversed_table),
        }
    )
    for e in table:
        ref.steps[e] = reversed_table[e] + EPS
    assert_matches(frequencies(buf, batches=100), ref.probabilities())


def test_prioritized_priority_and_is_weights_match_the_reference():
    buf, ref = filled()
    check_batch(buf.sample(64), ref, 64)  # all steps at 1.0: IS is 1 everywhere
    assert torch.equal(buf.sample(8)['IS'], torch.ones(8))
    distinct_priorities(buf, ref)
    for _ in range(5):
        check_batch(buf.sample(64), ref, 64)
    assert len(set(ref.is_weights().values())) > 5


def test_type_episode_with_prioritized_sampler_equals_the_preset():
    a, _ = filled()
    b, _ = filled(via='episode')
    for _ in range(3):
        x, y = a.sample(16), b.sample(16)
        assert_same(x, y)
        p = torch.linspace(0.5, 3.0, 16)
        info = lambda o: {
            'replay_unique_id': o['replay_unique_id'],
            'replay_buffer_idx': o['replay_buffer_idx'],
            'priority': p,
        }
        assert a.update(info(x)) == b.update(info(y))


def test_prioritized_sampler_needs_tensor_storage():
    with pytest.raises(ValueError, match=r'sampler\.type'):
        create_buffer(dict(type='episode', storage=dict(type='list'), sampler=dict(type='prioritized', unroll_len=T)))


def test_prioritized_per_window_update_later_window_wins():
    buf, ref = filled()
    out = covering_batch(buf, ref)
    keys = prio_keys(out)
    want = [(3, 0), (3, 1), (4, 4), (0, 0)]  # (3, 0) and (3, 1) overlap; (0, 0) is the padded window
    rows = [keys.index(k) for k in want]
    prio = [2.0, 0.5, 3.0, 0.25]
    res = buf.update(
        {
            'replay_unique_id': out['replay_unique_id'][rows],
            'replay_buffer_idx': out['replay_buffer_idx'][rows],
            'priority': torch.tensor(prio),
        }
    )
    assert res == {'updated': 4, 'stale': 0}
    assert buf.stats()['updated'] == 4
    ref.steps[3][0:3] = 2.0 + EPS
    ref.steps[3][1:4] = 0.5 + EPS  # the later window wins on steps 1 and 2
    ref.steps[4][4:7] = 3.0 + EPS
    ref.steps[0][0:2] = 0.25 + EPS  # only the valid steps of the padded window
    pw = ref.windows()
    np.testing.assert_allclose([pw[(4, 4)], pw[(0, 0)], pw[(3, 1)]], [3.0 + EPS, 0.25 + EPS, 0.5 + EPS])
    assert pw[(3, 0)] != 2.0 + EPS  # overwritten by the later window on two of its steps
    after = covering_batch(buf, ref)
    check_batch(after, ref, 256)
    assert_matches(frequencies(buf, batches=40), ref.probabilities())


def test_prioritized_per_step_update_skips_padding():
    buf, ref = filled()
    out = covering_batch(buf, ref)
    keys = prio_keys(out)
    rows = [keys.index((0, 0)), keys.index((2, 1))]  # the padded window of episode 0 (length 2), and one more
    table = {0: [0.3, 1.7], 2: [None, 0.2, 2.5, 0.9]}
    p = step_priorities({'obs': out['obs'][rows], 'mask': out['mask'][rows]}, table, fill_padding=1e6)
    assert p[0, 2] == 1e6  # padding: skipped
    res = buf.update(
        {
            'replay_unique_id': out['replay_unique_id'][rows],
            'replay_buffer_idx': out['replay_buffer_idx'][rows],
            'priority': p,
        }
    )
    assert res == {'updated': 5, 'stale': 0}
    ref.steps[0][:] = np.array([0.3, 1.7]) + EPS
    ref.steps[2][1:4] = np.array([0.2, 2.5, 0.9]) + EPS
    check_batch(covering_batch(buf, ref), ref, 256)


def test_prioritized_stale_updates_after_eviction():
    """Episodes of 6 steps in 24 transition slots: two new episodes evict the two oldest and reuse their
    slots. Updates naming the evicted transitions are stale -- per window and per step -- and change nothing."""
    buf = prio_buffer(size=10, max_transitions=24)
    ref = Reference()
    buf.push([dict_ep(e, 6) for e in range(4)])
    for e in range(4):
        ref.add(e, 6)
    old = covering_batch(buf, ref)
    buf.push([dict_ep(4, 6), dict_ep(5, 6)])
    ref.drop(0)
    ref.drop(1)
    ref.add(4, 6)
    ref.add(5, 6)
    assert buf.count() == 4 and buf.stats()['transitions'] == 24
    keys = prio_keys(old)
    evicted = np.array([e in (0, 1) for e, _ in keys])
    assert evicted.any() and not evicted.all()
    # per window: the later window of the batch wins where windows overlap
    prio = torch.linspace(0.2, 0.9, len(keys), dtype=torch.float64)  # below 1: new steps keep getting 1.0
    res = buf.update(
        {'replay_unique_id': old['replay_unique_id'], 'replay_buffer_idx': old['replay_buffer_idx'], 'priority': prio}
    )
    assert res == {'updated': int((~evicted).sum()), 'stale': int(evicted.sum())}
    assert buf.stats()['stale_updates'] == int(evicted.sum())
    for b, (e, s) in enumerate(keys):
        if e not in (0, 1):
            ref.steps[e][s : s + T] = float(prio[b]) + EPS
    check_batch(covering_batch(buf, ref), ref, 256)  # episodes 4 and 5 still at 1.0
    # per step, after evicting episodes 2 and 3 as well
    old = covering_batch(buf, ref)
    buf.push([dict_ep(6, 6), dict_ep(7, 6)])
    ref.drop(2)
    ref.drop(3)
    ref.add(6, 6)
    ref.add(7, 6)
    keys = prio_keys(old)
    table = {e: np.linspace(0.1, 0.6, 6) + 0.05 * e for e in range(8)}
    stale_steps = sum(int(old['mask'][b].sum()) for b, (e, _) in enumerate(keys) if e in (2, 3))
    live_steps = int(old['mask'].sum()) - stale_steps
    res = buf.update(
        {
            'replay_unique_id': old['replay_unique_id'],
            'replay_buffer_idx': old['replay_buffer_idx'],
            'priority': step_priorities(old, table),
        }
    )
    assert res == {'updated': live_steps, 'stale': stale_steps}
    assert buf.stats()['stale_updates'] == int(evicted.sum()) + stale_steps
    for e in (4, 5):
        ref.steps[e] = table[e] + EPS
    check_batch(covering_batch(buf, ref), ref, 256)


def test_prioritized_new_episodes_get_the_running_max_priority():
    buf, ref = filled()
    out = covering_batch(buf, ref)
    row = prio_keys(out).index((4, 2))
    buf.update(
        {
            'replay_unique_id': out['replay_unique_id'][[row]],
            'replay_buffer_idx': out['replay_buffer_idx'][[row]],
            'priority': torch.tensor([5.0]),
        }
    )
    buf.push(dict_ep(5, 4))  # its 4 steps get the running max, 5 (eps aside)
    out = buf.sample(256)
    new = [b for b, (e, _) in enumerate(prio_keys(out)) if e == 5]
    assert new
    np.testing.assert_allclose(out['priority'][new].numpy(), 5.0, rtol=1e-3)


def _raise_max_to(buf, ref, priority):
    """One window update to ``priority``: the running max becomes ``priority``."""
    out = covering_batch(buf, ref)
    row = prio_keys(out).index((4, 2))
    buf.update(
        {
            'replay_unique_id': out['replay_unique_id'][[row]],
            'replay_buffer_idx': out['replay_buffer_idx'][[row]],
            'priority': torch.tensor([priority]),
        }
    )
    assert buf.stats()['max_priority'] == priority


def _new_episode_priorities(buf, e):
    """Window priorities of episode ``e`` (pushed alone after a clear) in a large batch."""
    out = buf.sample(64)
    assert set(out['obs'][:, 0, 0].tolist()) == {float(e)}
    return out['priority'].numpy()


@pytest.mark.parametrize('via', ['preset', 'config'])
def test_prioritized_clear_resets_the_running_max_priority(via):
    """``clear`` forgets the running max priority (as ``advanced`` and DI-engine do): episodes pushed after it
    enter at 1.0, not at the max of the priorities cleared away -- and a saved state carries the max it had."""
    buf, ref = filled(via=via)
    _raise_max_to(buf, ref, 5.0)
    saved = buf.state_dict()
    buf.clear()
    assert buf.stats()['max_priority'] == 1.0
    assert buf.state_dict()['windows']['max_priority'] == 1.0
    buf.push(dict_ep(7, 4))
    np.testing.assert_allclose(_new_episode_priorities(buf, 7), 1.0, rtol=1e-6)
    cleared = buf.state_dict()
    # save / load: the max travels with the state, and a clear after a load resets it too
    other = prio_buffer(via=via)
    other.load_state_dict(saved)
    assert other.stats()['max_priority'] == 5.0
    other.clear()
    assert other.stats()['max_priority'] == 1.0
    other.push(dict_ep(7, 4))
    np.testing.assert_allclose(_new_episode_priorities(other, 7), 1.0, rtol=1e-6)
    third = prio_buffer(via=via)
    third.load_state_dict(cleared)
    assert third.stats()['max_priority'] == 1.0
    assert_same(cleared['windows'], third.state_dict()['windows'])


def test_prioritized_transition_ring_wraps_around():
    """20 transition slots, episodes of 3..7 steps pushed one by one: the oldest episodes are evicted, new ones
    wrap around the end of the ring; after every push the windows, their priorities and IS weights still match
    the reference, and per-step updates reach the right steps."""
    buf = prio_buffer(size=10, max_transitions=20)
    ref = Reference()
    order, rng = [], np.random.default_rng(5)
    for e in range(12):
        length = int(rng.integers(3, 8))
        buf.push(dict_ep(e, length))
        order.append(e)
        ref.add(e, length)  # updates stay below 1: the running max, given to new steps, stays 1.0
        while sum(len(ref.steps[k]) for k in order) > 20:
            ref.drop(order.pop(0))
        assert buf.count() == len(order)
        check_batch(covering_batch(buf, ref), ref, 256)
        table = {k: rng.uniform(0.05, 0.95, size=len(ref.steps[k])) for k in order}  # < 1: the max stays 1.0
        out = covering_batch(buf, ref)
        res = buf.update(
            {
                'replay_unique_id': out['replay_unique_id'],
                'replay_buffer_idx': out['replay_buffer_idx'],
                'priority': step_priorities(out, table),
            }
        )
        assert res == {'updated': int(out['mask'].sum()), 'stale': 0}
        for k in order:
            ref.steps[k] = table[k] + EPS
        check_batch(buf.sample(128), ref, 128)


def test_prioritized_push_after_a_middle_removal_keeps_every_window():
    """A user remover takes the middle episode (odd collect_iter); the next push must not overwrite live
    transitions (the oldest episode, lying where the new one goes, leaves first) nor lose the new windows."""
    buf = prio_buffer(size=8, max_transitions=12, removers=[dict(type='compositions_odd')])
    ref = Reference()
    buf.push([dict_ep(k, 4, ci=k) for k in range(3)])  # episode 1 has collect_iter 1: removed once drawn
    for k in range(3):
        ref.add(k, 4)
    buf.sample(256)
    ref.drop(1)
    assert buf.count() == 2 and buf.stats()['removed_by_odd'] == 1
    buf.push(dict_ep(3, 4, ci=4))  # written at transition slots 0-3: episode 0 leaves
    ref.drop(0)
    ref.add(3, 4)
    check_batch(covering_batch(buf, ref), ref, 256)
    buf.push(dict_ep(4, 4, ci=6))  # slots 4-7 are free
    ref.add(4, 4)
    check_batch(covering_batch(buf, ref), ref, 256)


@pytest.mark.parametrize(
    'kwargs', [dict(unroll_len=T + 1), dict(unroll_len=1), dict(replace=False), dict(sample_range=slice(0, 2))]
)
def test_prioritized_refuses_other_sample_arguments(kwargs):
    buf, ref = filled()
    before = buf.state_dict()
    with pytest.raises(ValueError):
        buf.sample(4, **kwargs)
    assert_same(buf.state_dict(), before)
    check_batch(buf.sample(4, unroll_len=T, replace=True), ref, 4)  # the configured values are accepted


def test_prioritized_save_and_load_give_the_identical_next_sample(tmp_path):
    buf, ref = filled()
    distinct_priorities(buf, ref)
    buf.sample(16)
    path = str(tmp_path / 'prio.pt')
    buf.save_data(path)
    fresh = prio_buffer(seed=123)  # its own seed is replaced by the saved RNG state
    fresh.load_data(path)
    assert fresh.count() == buf.count()
    for _ in range(3):
        x, y = buf.sample(32), fresh.sample(32)
        assert_same(x, y)
        p = torch.linspace(0.1, 5.0, 32)
        info = lambda o: {
            'replay_unique_id': o['replay_unique_id'],
            'replay_buffer_idx': o['replay_buffer_idx'],
            'priority': p,
        }
        assert buf.update(info(x)) == fresh.update(info(y))
    assert buf.stats() == fresh.stats()
    # the next pushed episode gets the same priority in both
    buf.push(dict_ep(9, 4))
    fresh.push(dict_ep(9, 4))
    assert_same(buf.sample(64), fresh.sample(64))


def test_prioritized_alpha_zero_draws_windows_uniformly():
    buf, ref = filled(alpha=0.0)
    distinct_priorities(buf, ref)
    probs = ref.probabilities()
    assert len(set(np.round(list(probs.values()), 12))) == 1
    counts = frequencies(buf)
    assert_matches(counts, probs)
    out = buf.sample(64)
    assert torch.equal(out['IS'], torch.ones(64))
    pw = ref.windows()
    for b, k in enumerate(prio_keys(out)):
        np.testing.assert_allclose(float(out['priority'][b]), pw[k], rtol=1e-5)


def test_prioritized_without_padding_ignores_short_episodes():
    buf, ref = filled(pad=False)
    assert (0, 0) not in ref.windows()  # episode 0 has 2 steps < unroll_len
    covering_batch(buf, ref)  # every window, and only those
    distinct_priorities(buf, ref)
    check_batch(buf.sample(64), ref, 64)


def test_prioritized_max_use_removes_drawn_episodes():
    buf, ref = filled(max_use=1)
    seen = []
    for _ in range(len(LENGTHS)):
        ((e, _),) = check_batch(buf.sample(1), ref, 1)  # never a window of a removed episode
        seen.append(e)
        ref.drop(e)
        assert buf.count() == len(ref.steps)
    assert sorted(seen) == list(range(len(LENGTHS)))
    assert buf.sample(1) is None
    assert buf.stats()['removed_by_use'] == len(LENGTHS)


# ---------------------------------------------------------------------------------------------- parts by config
@pytest.mark.parametrize('storage_type', ['list', 'tensor'])
def test_user_parts_load_through_import_names(storage_type, monkeypatch):
    """A config names a module of its own in import_names (tests/buffers/composition_plugins.py, found on the path
    like a user's module); its sampler and remover are then usable by name."""
    monkeypatch.syspath_prepend(os.path.dirname(os.path.abspath(__file__)))
    cfg = dict(
        type='naive',
        replay_buffer_size=8,
        seed=0,
        import_names=['composition_plugins'],
        sampler=dict(type='plugin_oldest_first'),
        removers=[dict(type='plugin_drop_flagged', flag=7)],
        storage=dict(type=storage_type),
    )
    buf = create_buffer(cfg)
    buf.push([{'x': torch.tensor(float(i)), 'collect_iter': 7 if i % 3 == 0 else i} for i in range(6)])
    out = buf.sample(2)
    xs = [float(t['x']) for t in out] if storage_type == 'list' else out['x'].tolist()
    assert xs == [1.0, 2.0]  # 0 and 3 were flagged and removed first; then the two oldest
    assert buf.count() == 4 and buf.stats()['removed_by_flagged'] == 2
    with pytest.raises(ValueError, match=r"removers\[0\]"):
        create_buffer(dict(cfg, removers=[dict(type='plugin_drop_flagged', wrong=1)]))


def test_naive_periodic_thruput_seconds_drives_the_throughput_report():
    """periodic_thruput_seconds (DI-engine's key) reports pushes / samples / removals to a tb_logger passed in."""

    writer = FakeTB()
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=4, seed=0, periodic_thruput_seconds=0.1),
        tb_logger=writer,
        instance_name='demo',
    )
    buf.push([{'x': i} for i in range(6)])
    buf.sample(2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(t == 'demo_sec/pushed_in' for t, _, _ in writer.rows):
        time.sleep(0.05)
    buf.close()
    first = {t: v for t, v, s in writer.rows if s == 0}
    assert first == {
        'demo_sec/pushed_in': 6,
        'demo_sec/sampled_out': 2,
        'demo_sec/removed': 2,
        'demo_sec/current_have': 4,
    }


@REMOVER_REGISTRY.register('compositions_early')
class EarlyRule(Remover):
    """The ``Remover`` docstring's pattern: the stored elements collected before iteration 2 leave before a draw."""

    name = 'early'

    def before_sample(self, table, cur_learner_iter):
        slots = table.oldest(table.count())
        return slots[table.collect_iter(slots) < 2]


@pytest.mark.parametrize('btype', ['naive', 'gfn', 'terminating_state'])
def test_a_user_rule_asks_an_empty_buffer_for_its_elements(btype):
    """Before the first push a table answers a rule's ``oldest`` / ``collect_iter`` with no elements (a GFlowNet
    table, whose store is made by the first push, raised ``AttributeError``)."""
    buf = create_buffer(dict(type=btype, seed=0, removers=[dict(type='compositions_early')]))
    assert buf.sample(1) is None
    batch = {'state': torch.zeros(3, 2), 'log_reward': torch.zeros(3), 'collect_iter': torch.tensor([0, 5, 7])}
    buf.push(
        batch if btype != 'naive' else [{'x': torch.tensor(i), 'collect_iter': int(c)} for i, c in enumerate([0, 5, 7])]
    )
    assert buf.sample(2) is not None and buf.count() == 2  # the element collected at 0 left before the draw

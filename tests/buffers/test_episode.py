"""Tests for ``EpisodeReplayBuffer`` (``type='episode'``) on list and tensor storage.

Every stored transition carries ``obs = [episode number, step]`` (float) and ``act = 100 * episode + step``
(int64), so any sampled window or episode can be traced back to the episode and steps it came from.
"""

import collections
import threading
import time

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer

STORAGES = ['list', 'tensor']


# ---------------------------------------------------------------------------------------------- helpers
def make_buffer(storage, replay_buffer_size=4, max_transitions=20, seed=0, **kwargs):
    cfg = dict(type='episode', replay_buffer_size=replay_buffer_size, seed=seed, storage=dict(type=storage), **kwargs)
    if max_transitions is not None:
        cfg['max_transitions'] = max_transitions
    return create_buffer(cfg)


def dict_ep(e, length):
    """A dict episode of time-stacked tensors."""
    steps = torch.arange(length)
    return {
        'obs': torch.stack([torch.full((length,), float(e)), steps.float()], dim=1),
        'act': 100 * e + steps,
    }


def list_ep(e, length):
    """A list episode of transition dicts."""
    return [{'obs': torch.tensor([float(e), float(t)]), 'act': torch.tensor(100 * e + t)} for t in range(length)]


EPISODE_KINDS = {'dict': dict_ep, 'list': list_ep}


def pair(obs):
    return int(obs[0]), int(obs[1])


def decode_episode(ep):
    """[(episode, step), ...] of a whole sampled episode (dict of [L, ...] or list of transitions)."""
    if isinstance(ep, list):
        return [pair(tr['obs']) for tr in ep]
    return [pair(o) for o in torch.as_tensor(ep['obs'])]


def decode_windows(out):
    """List of windows, each a list of (episode, step) or None at padding, for either output layout."""
    if isinstance(out, dict):  # tensor storage: one dict of [B, T, ...]
        obs, mask = out['obs'], out['mask']
        return [[pair(obs[b, k]) if mask[b, k] else None for k in range(obs.shape[1])] for b in range(obs.shape[0])]
    windows = []
    for w in out:
        if isinstance(w, list):
            windows.append([None if tr is None else pair(tr['obs']) for tr in w])
        else:
            obs = torch.as_tensor(w['obs'])
            mask = w.get('mask', torch.ones(obs.shape[0], dtype=torch.bool))
            windows.append([pair(obs[k]) if mask[k] else None for k in range(obs.shape[0])])
    return windows


def check_window(window, lengths_by_episode, unroll_len):
    """A window is ``unroll_len`` consecutive steps of one stored episode (padding only at the end)."""
    assert len(window) == unroll_len
    valid = [x for x in window if x is not None]
    assert valid, window
    assert window[: len(valid)] == valid, f"padding must be at the end: {window}"
    e, t0 = valid[0]
    assert e in lengths_by_episode, f"window from an episode not stored: {window}"
    assert valid == [(e, t0 + k) for k in range(len(valid))], f"not consecutive: {window}"
    if len(valid) < unroll_len:  # padded: the whole (short) episode
        assert t0 == 0 and len(valid) == lengths_by_episode[e] < unroll_len
    else:
        assert t0 + unroll_len <= lengths_by_episode[e]
    return e, t0


def stored_episodes(buf):
    """{episode number: [(episode, step), ...]} of every stored episode (via a whole-episode sample)."""
    out = buf.sample(buf.count())
    decoded = [decode_episode(ep) for ep in out]
    return {steps[0][0]: steps for steps in decoded}


@pytest.fixture(params=STORAGES)
def storage(request):
    return request.param


# ---------------------------------------------------------------------------------------------- 1. push forms
def test_dict_push_is_one_episode(storage):
    buf = make_buffer(storage)
    assert buf.push(dict_ep(0, 5)) == 1
    assert buf.count() == 1
    assert buf.episode_len == [5]
    assert buf.transition_count == 5
    assert buf.push_count == 1


@pytest.mark.parametrize('kind', ['dict', 'list'])
def test_list_push_is_list_of_episodes(storage, kind):
    buf = make_buffer(storage)
    make = EPISODE_KINDS[kind]
    assert buf.push([make(0, 3), make(1, 5), make(2, 2)]) == 3
    assert buf.count() == 3
    assert buf.episode_len == [3, 5, 2]
    assert buf.transition_count == 10
    assert buf.push_count == 3
    assert sorted(stored_episodes(buf).values()) == [
        [(0, t) for t in range(3)],
        [(1, t) for t in range(5)],
        [(2, t) for t in range(2)],
    ]


def test_list_episodes_are_stacked_on_tensor_storage():
    buf = make_buffer('tensor')
    buf.push([list_ep(0, 4)])
    (ep,) = buf.sample(1)
    assert isinstance(ep, dict)
    assert ep['obs'].shape == (4, 2) and ep['obs'].dtype == torch.float32
    assert ep['act'].shape == (4,) and ep['act'].dtype == torch.int64
    assert ep['act'].tolist() == [0, 1, 2, 3]


def test_episode_len_while_slots_are_empty(storage):
    buf = make_buffer(storage, replay_buffer_size=5)
    assert buf.episode_len == []
    assert buf.count() == 0 and buf.transition_count == 0 and buf.push_count == 0
    buf.push(dict_ep(0, 3))
    assert buf.episode_len == [3]
    buf.push(dict_ep(1, 1))
    assert buf.episode_len == [3, 1]


def test_empty_list_push_is_noop(storage):
    buf = make_buffer(storage)
    assert buf.push([]) == 0
    assert buf.count() == 0 and buf.push_count == 0


def test_push_count_counts_evicted_episodes(storage):
    buf = make_buffer(storage, replay_buffer_size=2)
    for e in range(5):
        buf.push(dict_ep(e, 2))
    assert buf.push_count == 5
    assert buf.count() == 2
    assert buf.transition_count == 4


# ---------------------------------------------------------------------------------------------- 2. capacity
def test_episode_capacity_evicts_oldest_fifo(storage):
    buf = make_buffer(storage, replay_buffer_size=3, max_transitions=100)
    for e in range(5):
        buf.push(dict_ep(e, e + 1))
    assert buf.count() == 3
    assert buf.episode_len == [3, 4, 5]
    assert sorted(stored_episodes(buf)) == [2, 3, 4]


def test_list_push_longer_than_episode_capacity_keeps_newest(storage):
    buf = make_buffer(storage, replay_buffer_size=3, max_transitions=100)
    buf.push([dict_ep(e, e + 1) for e in range(5)])
    assert buf.episode_len == [3, 4, 5]
    assert sorted(stored_episodes(buf)) == [2, 3, 4]
    assert buf.push_count == 5


def test_transition_capacity_evicts_whole_oldest_episodes(storage):
    buf = make_buffer(storage, replay_buffer_size=10, max_transitions=10)
    buf.push([dict_ep(0, 4), dict_ep(1, 4)])
    assert buf.episode_len == [4, 4]
    buf.push(dict_ep(2, 3))  # 11 > 10: episode 0 goes as a whole
    assert buf.episode_len == [4, 3] and buf.transition_count == 7
    buf.push(dict_ep(3, 10))  # needs everything
    assert buf.episode_len == [10] and buf.transition_count == 10
    buf.push(dict_ep(4, 1))
    assert buf.episode_len == [1] and buf.transition_count == 1
    assert stored_episodes(buf) == {4: [(4, 0)]}


def test_transition_capacity_over_random_lengths(storage):
    """Model check: after every push the buffer holds exactly the newest whole episodes that fit both limits."""
    max_eps, max_tr = 4, 20
    buf = make_buffer(storage, replay_buffer_size=max_eps, max_transitions=max_tr)
    rng = np.random.default_rng(1234)
    model = collections.deque()  # (episode, length), oldest first
    for e in range(200):
        length = int(rng.integers(1, max_tr + 4))
        if length > max_tr:
            continue  # a refused push (all or nothing: tests/buffers/test_contract.py)
        buf.push(dict_ep(e, length))
        while len(model) >= max_eps or (model and sum(n for _, n in model) + length > max_tr):
            model.popleft()
        model.append((e, length))
        assert buf.episode_len == [n for _, n in model]
        assert buf.transition_count == sum(n for _, n in model) <= max_tr
        assert buf.count() == len(model) <= max_eps
        if e % 10 == 0:  # full content check, including episodes that wrap around the transition ring
            assert stored_episodes(buf) == {ep: [(ep, t) for t in range(n)] for ep, n in model}


def test_episode_exactly_max_transitions_fits(storage):
    buf = make_buffer(storage, max_transitions=6)
    buf.push(dict_ep(0, 2))
    buf.push(dict_ep(1, 6))
    assert buf.episode_len == [6]


def test_tensor_storage_requires_max_transitions():
    with pytest.raises(ValueError):
        make_buffer('tensor', max_transitions=None)


def test_list_storage_max_transitions_is_optional():
    buf = make_buffer('list', max_transitions=None, replay_buffer_size=2)
    buf.push([dict_ep(0, 500), dict_ep(1, 700)])
    assert buf.episode_len == [500, 700]
    assert buf.transition_count == 1200


# ---------------------------------------------------------------------------------------------- 3. all or nothing
# (invalid episodes and schema mismatches after valid ones: tests/buffers/test_contract.py)
def test_int_episode_raises_type_error(storage):
    buf = make_buffer(storage)
    with pytest.raises(TypeError):
        buf.push([dict_ep(0, 2), 5])
    assert buf.count() == 0


def test_tensor_failed_first_push_does_not_fix_schema():
    buf = make_buffer('tensor')
    other = {'obs': torch.zeros(2, 3), 'act': torch.arange(2)}
    with pytest.raises(ValueError):
        buf.push([dict_ep(0, 2), other])
    assert buf.count() == 0 and buf.transition_count == 0
    buf.push(other)  # the schema of the rejected push was not kept
    assert buf.episode_len == [2]


# ---------------------------------------------------------------------------------------------- 4. whole episodes
def test_whole_episode_sample_distinct_without_replace(storage):
    buf = make_buffer(storage, replay_buffer_size=5, max_transitions=30)
    buf.push([dict_ep(e, e + 2) for e in range(5)])
    for _ in range(20):
        out = buf.sample(3)
        decoded = [decode_episode(ep) for ep in out]
        ids = [d[0][0] for d in decoded]
        assert len(set(ids)) == 3
        for d in decoded:
            e = d[0][0]
            assert d == [(e, t) for t in range(e + 2)]
    assert len({decode_episode(ep)[0][0] for ep in buf.sample(5)}) == 5


def test_whole_episode_sample_none_when_too_few(storage):
    buf = make_buffer(storage)
    assert buf.sample(1) is None  # empty
    buf.push([dict_ep(0, 2), dict_ep(1, 2)])
    assert buf.sample(3) is None
    out = buf.sample(5, replace=True)
    assert len(out) == 5
    assert {decode_episode(ep)[0][0] for ep in out} <= {0, 1}


def test_whole_episode_sample_is_uniform(storage):
    buf = make_buffer(storage, max_transitions=30)
    buf.push([dict_ep(0, 1), dict_ep(1, 9), dict_ep(2, 4)])  # uniform over episodes, not transitions
    n = 3000
    counts = collections.Counter(decode_episode(ep)[0][0] for ep in buf.sample(n, replace=True))
    chi2 = sum((counts[e] - n / 3) ** 2 / (n / 3) for e in range(3))
    assert chi2 < 13.8  # 0.999 quantile, 2 dof


def test_sample_range_selects_by_insertion_order(storage):
    buf = make_buffer(storage, replay_buffer_size=3, max_transitions=30)
    for e in range(5):  # episodes 2, 3, 4 remain, 4 is newest
        buf.push(dict_ep(e, 3))
    for _ in range(10):
        (ep,) = buf.sample(1, sample_range=slice(-1, None))
        assert decode_episode(ep)[0][0] == 4
        out = buf.sample(2, sample_range=slice(0, 2))
        assert {decode_episode(ep)[0][0] for ep in out} == {2, 3}
    assert buf.sample(2, sample_range=slice(-1, None)) is None
    assert buf.sample(1, sample_range=slice(5, None)) is None


def test_list_storage_returns_stored_objects():
    buf = make_buffer('list')
    d, lst = dict_ep(0, 3), list_ep(1, 2)
    buf.push([d, lst])
    for _ in range(5):
        out = buf.sample(2)
        assert {id(x) for x in out} == {id(d), id(lst)}


def test_list_storage_deepcopy_returns_copies():
    buf = make_buffer('list', deepcopy=True)
    d = dict_ep(0, 3)
    buf.push(d)
    d['obs'][0, 0] = 99.0  # the buffer copied the pushed episode
    (out,) = buf.sample(1)
    assert out is not d
    assert decode_episode(out) == [(0, 0), (0, 1), (0, 2)]
    out['obs'][0, 0] = 42.0  # nor does it hand out its own copy
    assert decode_episode(buf.sample(1)[0]) == [(0, 0), (0, 1), (0, 2)]


def test_tensor_whole_episode_output():
    buf = make_buffer('tensor')
    buf.push([dict_ep(0, 3), dict_ep(1, 5)])
    out = buf.sample(2)
    assert isinstance(out, list) and len(out) == 2
    for ep in out:
        e = int(ep['obs'][0, 0])
        length = 3 if e == 0 else 5
        assert ep['obs'].shape == (length, 2)
        assert ep['act'].tolist() == [100 * e + t for t in range(length)]
        assert ep['replay_buffer_idx'].shape == (length,)
        assert ep['replay_unique_id'].shape == (length,)


# ---------------------------------------------------------------------------------------------- 5. windows
LENGTHS = [3, 10, 6]


def window_buffer(storage, kind='dict', lengths=LENGTHS, **kwargs):
    buf = make_buffer(storage, replay_buffer_size=8, max_transitions=40, **kwargs)
    buf.push([EPISODE_KINDS[kind](e, n) for e, n in enumerate(lengths)])
    return buf


@pytest.mark.parametrize('kind', ['dict', 'list'])
def test_windows_are_consecutive_steps_of_one_episode(storage, kind):
    buf = window_buffer(storage, kind)
    lengths = dict(enumerate(LENGTHS))
    for unroll_len in (1, 3, 6, 10):
        out = buf.sample(50, unroll_len=unroll_len, replace=True)
        windows = decode_windows(out)
        assert len(windows) == 50
        for w in windows:
            assert None not in w
            check_window(w, lengths, unroll_len)


@pytest.mark.parametrize('kind', ['dict', 'list'])
def test_windows_are_uniform_over_all_windows(storage, kind):
    unroll_len, n = 3, 6500
    buf = window_buffer(storage, kind)
    lengths = dict(enumerate(LENGTHS))
    all_windows = [(e, s) for e, L in lengths.items() for s in range(L - unroll_len + 1)]
    assert len(all_windows) == 13
    counts = collections.Counter(
        check_window(w, lengths, unroll_len) for w in decode_windows(buf.sample(n, unroll_len=unroll_len, replace=True))
    )
    assert set(counts) == set(all_windows)
    expected = n / len(all_windows)
    chi2 = sum((counts[w] - expected) ** 2 / expected for w in all_windows)
    assert chi2 < 32.9, (chi2, counts)  # 0.999 quantile of chi-square with 12 dof


def test_windows_without_replace_are_distinct(storage):
    buf = window_buffer(storage)
    lengths = dict(enumerate(LENGTHS))
    for size in (5, 13):
        out = buf.sample(size, unroll_len=3)
        starts = [check_window(w, lengths, 3) for w in decode_windows(out)]
        assert len(starts) == size == len(set(starts))
    assert buf.sample(14, unroll_len=3) is None
    assert len(decode_windows(buf.sample(14, unroll_len=3, replace=True))) == 14


def test_short_episodes_give_no_window_without_pad(storage):
    buf = window_buffer(storage)
    lengths = dict(enumerate(LENGTHS))
    out = buf.sample(200, unroll_len=7, replace=True)
    assert {check_window(w, lengths, 7)[0] for w in decode_windows(out)} == {1}  # only episode 1 (length 10)
    assert buf.sample(5, unroll_len=7) is None  # 4 windows of length 7
    assert buf.sample(1, unroll_len=11) is None  # no episode long enough
    assert buf.sample(1, unroll_len=11, replace=True) is None


@pytest.mark.parametrize('unroll_len', [2**63, 10**30])
def test_unroll_len_beyond_int64_is_no_window_like_any_longer_one(storage, unroll_len):
    buf, twin = window_buffer(storage), window_buffer(storage)
    assert buf.sample(1, unroll_len=unroll_len) is None  # was an OverflowError from the window count
    assert buf.sample(1, unroll_len=unroll_len, replace=True) is None
    assert twin.sample(1, unroll_len=11) is None and twin.sample(1, unroll_len=11, replace=True) is None
    assert_same(buf.state_dict(), twin.state_dict())  # the same refused samples, nothing else


def test_empty_buffer_window_sample_is_none(storage):
    assert make_buffer(storage).sample(1, unroll_len=2) is None


@pytest.mark.parametrize('how', ['argument', 'config'])
def test_pad_gives_one_window_per_short_episode(storage, how):
    lengths = {0: 2, 1: 5}
    unroll_len = 4
    if how == 'config':
        buf = window_buffer(storage, lengths=[2, 5], pad_short_episodes=True)
        out = buf.sample(3, unroll_len=unroll_len)
    else:
        buf = window_buffer(storage, lengths=[2, 5])
        out = buf.sample(3, unroll_len=unroll_len, pad=True)
    windows = decode_windows(out)
    starts = sorted(check_window(w, lengths, unroll_len) for w in windows)
    assert starts == [(0, 0), (1, 0), (1, 1)]  # 1 padded window + 5 - 4 + 1
    assert [(0, 0), (0, 1), None, None] in windows
    assert buf.sample(4, unroll_len=unroll_len, pad=True) is None


def test_pad_false_argument_overrides_config(storage):
    buf = window_buffer(storage, lengths=[2, 5], pad_short_episodes=True)
    out = buf.sample(100, unroll_len=4, pad=False, replace=True)
    assert {check_window(w, {0: 2, 1: 5}, 4)[0] for w in decode_windows(out)} == {1}


def test_pad_is_uniform_over_windows(storage):
    buf = window_buffer(storage, lengths=[2, 5, 1])  # T=4 with pad: 1 + 2 + 1 windows
    lengths = {0: 2, 1: 5, 2: 1}
    n = 4000
    counts = collections.Counter(
        check_window(w, lengths, 4) for w in decode_windows(buf.sample(n, unroll_len=4, pad=True, replace=True))
    )
    assert set(counts) == {(0, 0), (1, 0), (1, 1), (2, 0)}
    chi2 = sum((c - n / 4) ** 2 / (n / 4) for c in counts.values())
    assert chi2 < 16.3  # 0.999 quantile, 3 dof


def test_tensor_padding_is_zero_masked_and_meta_minus_one():
    buf = window_buffer('tensor', lengths=[2])
    out = buf.sample(1, unroll_len=4, pad=True)
    assert out['mask'].tolist() == [[True, True, False, False]]
    assert out['obs'][0].tolist() == [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert out['act'][0].tolist() == [0, 1, 0, 0]
    assert (out['replay_buffer_idx'][0, 2:] == -1).all() and (out['replay_buffer_idx'][0, :2] >= 0).all()
    assert (out['replay_unique_id'][0, 2:] == -1).all() and (out['replay_unique_id'][0, :2] >= 0).all()
    assert out['start'].tolist() == [0]


def test_tensor_padding_zeroes_nonzero_fields():
    buf = make_buffer('tensor', max_transitions=10)
    buf.push({'obs': torch.full((2, 3), 7.0), 'done': torch.tensor([False, True])})
    out = buf.sample(1, unroll_len=5, pad=True)
    assert out['obs'][0, :2].eq(7.0).all() and out['obs'][0, 2:].eq(0.0).all()
    assert out['done'][0].tolist() == [False, True, False, False, False]


def test_list_storage_padding_of_list_episode_is_none():
    buf = window_buffer('list', kind='list', lengths=[2])
    (window,) = buf.sample(1, unroll_len=4, pad=True)
    assert isinstance(window, list) and len(window) == 4
    assert window[2] is None and window[3] is None
    assert [pair(tr['obs']) for tr in window[:2]] == [(0, 0), (0, 1)]


def test_list_storage_padding_of_dict_episode_is_zero_with_mask():
    buf = window_buffer('list', kind='dict', lengths=[2])
    (window,) = buf.sample(1, unroll_len=4, pad=True)
    assert isinstance(window, dict)
    assert window['mask'].dtype == torch.bool and window['mask'].tolist() == [True, True, False, False]
    assert torch.as_tensor(window['obs']).tolist() == [[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert torch.as_tensor(window['act']).tolist() == [0, 1, 0, 0]


def test_list_storage_padding_keeps_a_leaf_no_tensor_holds_as_a_list_padded_with_none():
    """A dict episode with a list of strings beside its numbers: accepted at push, so every window of it samples
    (padded or not, with pad on for the whole buffer) -- the strings stay a list, padded with None."""
    buf = create_buffer(dict(type='episode', replay_buffer_size=4, pad_short_episodes=True, seed=0))
    assert buf.push({'instruction': ['go', 'left', 'stop'], 'reward': [0.0, 0.0, 1.0]}) == 1
    (window,) = buf.sample(1, unroll_len=5)
    assert window['instruction'] == ['go', 'left', 'stop', None, None]
    assert window['reward'].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert window['mask'].tolist() == [True, True, True, False, False]
    seen = {tuple(buf.sample(1, unroll_len=2)[0]['instruction']) for _ in range(40)}
    assert seen == {('go', 'left'), ('left', 'stop')}
    # decided by the whole stored leaf: ragged rows are a list in every window, also where a window's rows are even
    buf.clear()
    buf.push({'legal': [[0, 1], [1, 2], [0, 1, 2], [2]], 'reward': [0.0, 0.0, 0.0, 1.0]})
    kinds = {type(buf.sample(1, unroll_len=2)[0]['legal']).__name__ for _ in range(60)}
    assert kinds == {'list'}, kinds


def td_ep(e, length):
    """The dict episode of ``dict_ep`` as a TensorDict with batch_size [length], plus a nested field."""
    tensordict = pytest.importorskip('tensordict')
    ep = dict_ep(e, length)
    ep['next'] = {'obs': ep['obs'] + 0.5}
    return tensordict.TensorDict(ep, batch_size=[length])


@pytest.mark.parametrize('pad', [False, True])
def test_list_storage_windows_of_a_tensordict_episode_are_tensordicts(pad):
    """Windows come back in the episode's own type: a TensorDict episode gives TensorDict windows (batch_size =
    the window length, the episode's fields, nesting kept, plus ``mask`` when padded), as whole episodes come
    back as the stored TensorDicts; plain-dict episodes keep giving dicts."""
    tensordict = pytest.importorskip('tensordict')
    buf = make_buffer('list', max_transitions=None, pad_short_episodes=pad)
    buf.push([td_ep(0, 2), td_ep(1, 5), dict_ep(2, 5)])
    lengths = {0: 2, 1: 5, 2: 5}
    out = buf.sample(60, unroll_len=3, replace=True)
    seen = set()
    for window in out:
        e, t0 = check_window(decode_windows([window])[0], lengths, 3)
        seen.add(e)
        if e == 2:
            assert type(window) is dict
            continue
        assert isinstance(window, tensordict.TensorDictBase), type(window)
        assert window.batch_size == torch.Size([3])
        assert set(window.keys()) == {'obs', 'act', 'next'} | ({'mask'} if pad else set())
        assert set(window['next'].keys()) == {'obs'}
        valid = min(3, lengths[e] - t0)
        steps = torch.arange(t0, t0 + valid)
        assert window['act'][:valid].tolist() == (100 * e + steps).tolist()
        assert window['obs'].dtype == torch.float32 and window['act'].dtype == torch.int64
        torch.testing.assert_close(window['next', 'obs'][:valid], window['obs'][:valid] + 0.5)
        if pad:
            assert window['mask'].tolist() == [k < valid for k in range(3)]
            assert window['obs'][valid:].eq(0).all() and window['act'][valid:].eq(0).all()
    assert seen == ({0, 1, 2} if pad else {1, 2})
    assert all(isinstance(ep, tensordict.TensorDictBase) for ep in buf.sample(2, sample_range=slice(0, 2)))


def test_tensor_window_output_shapes():
    buf = window_buffer('tensor')
    out = buf.sample(5, unroll_len=3)
    assert out['obs'].shape == (5, 3, 2) and out['obs'].dtype == torch.float32
    assert out['act'].shape == (5, 3) and out['act'].dtype == torch.int64
    assert out['mask'].shape == (5, 3) and out['mask'].dtype == torch.bool and out['mask'].all()
    for key in ('replay_buffer_idx', 'replay_unique_id'):
        assert out[key].shape == (5, 3)
    for key in ('episode_id', 'episode_idx', 'start'):
        assert out[key].shape == (5,), key
    # the metadata agrees with the data: episode ids count pushed episodes, start is the first step
    assert out['episode_id'].tolist() == out['obs'][:, 0, 0].long().tolist()
    assert out['start'].tolist() == out['obs'][:, 0, 1].long().tolist()
    assert ((out['episode_idx'] >= 0) & (out['episode_idx'] < 8)).all()


def test_window_sample_range_selects_episodes(storage):
    buf = window_buffer(storage)
    out = buf.sample(40, unroll_len=2, replace=True, sample_range=slice(-1, None))
    assert {check_window(w, {2: 6}, 2)[0] for w in decode_windows(out)} == {2}
    assert buf.sample(6, unroll_len=2, sample_range=slice(-1, None)) is None  # 5 windows


@pytest.mark.parametrize('unroll_len', [0, -1, -5])
def test_non_positive_unroll_len_raises(storage, unroll_len):
    buf = window_buffer(storage)
    with pytest.raises(ValueError):
        buf.sample(2, unroll_len=unroll_len)


@pytest.mark.parametrize('size', [0, -1])
def test_non_positive_size_raises(storage, size):
    buf = window_buffer(storage)
    with pytest.raises(ValueError):
        buf.sample(size)
    with pytest.raises(ValueError):
        buf.sample(size, unroll_len=2)


@pytest.mark.parametrize('size', [2.0, '2', None, True])
def test_non_int_size_raises(storage, size):
    buf = window_buffer(storage)
    with pytest.raises(TypeError):
        buf.sample(size)
    with pytest.raises(TypeError):
        buf.sample(size, unroll_len=2)


def test_numpy_int_size_is_accepted(storage):
    buf = window_buffer(storage)
    assert len(buf.sample(np.int64(2))) == 2
    assert len(decode_windows(buf.sample(np.int32(2), unroll_len=np.int64(3)))) == 2


@pytest.mark.parametrize('kind', [np.uint64, np.int32, np.uint8])
def test_numpy_unroll_lens_draw_the_windows_an_int_draws(storage, kind):
    """``np.uint64(3)`` minus an int is a float in numpy: list storage sliced with float starts (a bare TypeError)."""
    a, b = window_buffer(storage, seed=7), window_buffer(storage, seed=7)
    assert_same(a.sample(4, unroll_len=kind(3), replace=True), b.sample(4, unroll_len=3, replace=True))
    assert_same(a.state_dict(), b.state_dict())


def test_same_seed_same_samples(storage):
    a, b = window_buffer(storage, seed=7), window_buffer(storage, seed=7)
    assert_same(a.sample(10, unroll_len=3, replace=True), b.sample(10, unroll_len=3, replace=True))
    assert_same(a.sample(2), b.sample(2))


# ---------------------------------------------------------------------------------------------- 6. wrap-around
def wrapped_buffer(storage):
    """max_transitions=10: episode 2 occupies transition slots 8, 9, 0, 1 (wraps); episode 3 slots 2..4."""
    buf = make_buffer(storage, replay_buffer_size=4, max_transitions=10)
    for e, n in enumerate([4, 4, 4, 3]):
        buf.push(dict_ep(e, n))
    return buf


def test_wrap_around_whole_episodes(storage):
    buf = wrapped_buffer(storage)
    assert buf.episode_len == [4, 3]
    assert stored_episodes(buf) == {2: [(2, t) for t in range(4)], 3: [(3, t) for t in range(3)]}


def test_wrap_around_windows(storage):
    buf = wrapped_buffer(storage)
    lengths = {2: 4, 3: 3}
    out = buf.sample(4, unroll_len=2)  # 3 + 2 = 5 windows
    starts = {check_window(w, lengths, 2) for w in decode_windows(out)}
    assert len(starts) == 4
    out = buf.sample(5, unroll_len=4, pad=True)
    assert out is None  # 1 + 1 windows only
    out = buf.sample(2, unroll_len=4, pad=True)
    assert sorted(decode_windows(out), key=lambda w: w[0]) == [
        [(2, 0), (2, 1), (2, 2), (2, 3)],
        [(3, 0), (3, 1), (3, 2), None],
    ]


def test_tensor_wrap_around_window_crosses_ring_end():
    buf = wrapped_buffer('tensor')
    out = buf.sample(1, unroll_len=4, sample_range=slice(0, 1))  # the only window of episode 2
    assert decode_windows(out) == [[(2, 0), (2, 1), (2, 2), (2, 3)]]
    assert out['act'][0].tolist() == [200, 201, 202, 203]
    idx = out['replay_buffer_idx'][0].tolist()
    assert [(b - a) % 10 for a, b in zip(idx, idx[1:])] == [1, 1, 1]
    assert idx[-1] < idx[0]  # it really crosses the end of the transition ring
    uid = out['replay_unique_id'][0].tolist()
    assert uid == list(range(uid[0], uid[0] + 4))


def test_tensor_wrap_around_many_pushes_windows():
    buf = make_buffer('tensor', replay_buffer_size=3, max_transitions=13)
    rng = np.random.default_rng(5)
    model = collections.deque()
    for e in range(60):
        n = int(rng.integers(1, 8))
        buf.push(dict_ep(e, n))
        while len(model) >= 3 or (model and sum(m for _, m in model) + n > 13):
            model.popleft()
        model.append((e, n))
        lengths = dict(model)
        out = buf.sample(20, unroll_len=2, pad=True, replace=True)
        for w, act in zip(decode_windows(out), out['act']):
            ep_num, t0 = check_window(w, lengths, 2)
            expected = [100 * ep_num + t0 + k if x is not None else 0 for k, x in enumerate(w)]
            assert act.tolist() == expected


# ---------------------------------------------------------------------------------------------- 7. state / persistence
def filled_buffer(storage, seed=0):
    buf = make_buffer(storage, replay_buffer_size=4, max_transitions=10, seed=seed)
    for e, n in enumerate([4, 4, 4, 3, 2]):  # wraps around on tensor storage
        buf.push(dict_ep(e, n))
    return buf


def draw(buf):
    return [buf.sample(3, unroll_len=2, replace=True), buf.sample(2), buf.sample(2, unroll_len=4, pad=True)]


def summary(buf):
    return buf.episode_len, buf.count(), buf.transition_count, buf.push_count


def test_state_dict_round_trip(storage):
    src = filled_buffer(storage)
    state = src.state_dict()
    dst = make_buffer(storage, replay_buffer_size=4, max_transitions=10, seed=999)
    dst.load_state_dict(state)
    assert summary(dst) == summary(src) == ([4, 3, 2], 3, 9, 5)
    assert_same(src.state_dict(), dst.state_dict())
    assert_same(draw(src), draw(dst))


def test_state_dict_is_a_copy(storage):
    buf = filled_buffer(storage)
    state = buf.state_dict()
    buf.push(dict_ep(9, 5))
    buf2 = make_buffer(storage, replay_buffer_size=4, max_transitions=10)
    buf2.load_state_dict(state)
    assert buf2.episode_len == [4, 3, 2]


def test_loaded_buffer_keeps_working(storage):
    src = filled_buffer(storage)
    dst = make_buffer(storage, replay_buffer_size=4, max_transitions=10)
    dst.load_state_dict(src.state_dict())
    for buf in (src, dst):
        buf.push(dict_ep(5, 6))
    assert summary(dst) == summary(src) == ([2, 6], 2, 8, 6)
    assert_same(src.state_dict(), dst.state_dict())
    assert_same(draw(src), draw(dst))


def test_save_load_data_round_trip(storage, tmp_path):
    src = filled_buffer(storage)
    path = str(tmp_path / 'episodes.pt')
    src.save_data(path)
    dst = make_buffer(storage, replay_buffer_size=4, max_transitions=10, seed=3)
    dst.load_data(path)
    assert summary(dst) == summary(src)
    assert_same(src.state_dict(), dst.state_dict())
    assert_same(draw(src), draw(dst))


# (states and files of buffers configured otherwise -- capacity, storage kind, max_transitions -- are refused,
# changing nothing: tests/buffers/test_contract.py)


class Token:
    """An arbitrary (non-tensor) Python object stored in list-storage episodes."""

    def __init__(self, value):
        self.value = value


def test_list_storage_arbitrary_objects_need_allow_pickle(tmp_path):
    src = make_buffer('list')
    src.push([[{'obs': Token(0), 'step': t} for t in range(3)], [{'obs': Token(1), 'step': 0}]])
    path = str(tmp_path / 'objects.pt')
    src.save_data(path)
    dst = make_buffer('list')
    dst.push([[{'obs': Token(9), 'step': 0}]])
    before_len = dst.episode_len
    with pytest.raises(ValueError):
        dst.load_data(path)
    assert dst.episode_len == before_len == [1]
    dst.load_data(path, allow_pickle=True)
    assert summary(dst) == summary(src) == ([3, 1], 2, 4, 2)
    eps = dst.sample(2)
    assert sorted((ep[0]['obs'].value, [tr['step'] for tr in ep]) for ep in eps) == [(0, [0, 1, 2]), (1, [0])]


def test_clear_empties_and_resets_push_count(storage):
    buf = filled_buffer(storage)
    buf.clear()
    assert summary(buf) == ([], 0, 0, 0)
    assert buf.sample(1) is None
    assert buf.sample(1, unroll_len=1) is None
    buf.push([dict_ep(0, 3), dict_ep(1, 5)])
    assert summary(buf) == ([3, 5], 2, 8, 2)
    assert stored_episodes(buf) == {0: [(0, t) for t in range(3)], 1: [(1, t) for t in range(5)]}
    lengths = {0: 3, 1: 5}
    for w in decode_windows(buf.sample(30, unroll_len=3, replace=True)):
        check_window(w, lengths, 3)


def test_a_list_storage_episode_with_a_nested_collect_iter_is_stored_and_reloads():
    """Was (for a few commits): list storage read a pushed episode's top-level collect_iter with the item rule, so an
    episode whose collect_iter is a dict of tensors (the episode store reads no collect_iter there) was refused --
    after older episodes had been evicted for it -- and a saved state holding one did not load."""
    buf = create_buffer(dict(type='episode', replay_buffer_size=2, storage=dict(type='list')))
    buf.push({'obs': torch.zeros(3, 2)})
    buf.push({'obs': torch.ones(3, 2)})
    buf.push({'obs': torch.full((3, 2), 2.0), 'collect_iter': {'a': torch.tensor([1, 2, 3])}})
    assert buf.count() == 2
    again = create_buffer(dict(type='episode', replay_buffer_size=2, storage=dict(type='list')))
    again.load_state_dict(buf.state_dict())
    assert_same(again.state_dict(), buf.state_dict())


def test_per_step_priorities_at_padded_steps_are_skipped_whatever_they_hold():
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=10,
        max_transitions=40,
        pad_short_episodes=True,
        sampler=dict(type='prioritized', unroll_len=4),
        storage=dict(type='tensor'),
        seed=0,
    )
    buf = create_buffer(cfg)
    buf.push({'t': torch.arange(2)})  # shorter than a window: two steps of padding
    batch = buf.sample(2)
    keys = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx')}
    priority = torch.full((2, 4), 3.0)
    priority[~batch['mask']] = float('nan')
    assert buf.update(dict(keys, priority=priority)) == {'updated': 4, 'stale': 0}
    priority[0, 0] = float('nan')  # a real step: refused, naming its place
    before = buf.state_dict()
    with pytest.raises(ValueError, match='entry 0 is nan'):
        buf.update(dict(keys, priority=priority))
    assert_same(buf.state_dict(), before)
    with pytest.raises(TypeError, match='entry 1 is bool True'):  # per step as lists: each entry a real number
        buf.update(dict(keys, priority=[[3.0, True, 3.0, 3.0]] * 2))
    assert_same(buf.state_dict(), before)


def test_a_padded_window_longer_than_any_episode_costs_no_memory_at_push():
    """A window's priority at push was computed over all its ``unroll_len`` steps, padding included: with windows
    of 2**36 steps every push raised MemoryError (after storing the episode). Steps past the episode are padding,
    so the priority is the same as a window as long as the episode."""
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=4,
        max_transitions=64,
        pad_short_episodes=True,
        sampler=dict(type='prioritized', unroll_len=2**36),
        storage=dict(type='tensor'),
        seed=0,
    )
    buf = create_buffer(cfg)
    assert buf.push({'obs': torch.zeros(10, 4)}) == 1 and buf.count() == 1 and buf.transition_count == 10
    again = create_buffer(cfg)
    again.load_state_dict(buf.state_dict())
    assert_same(again.state_dict(), buf.state_dict())
    with pytest.raises(ValueError, match="'sampler.unroll_len'"):  # (2**40 at most, as a capacity)
        create_buffer(dict(cfg, sampler=dict(type='prioritized', unroll_len=2**40 + 1)))


@pytest.mark.parametrize('kind', ['episode', 'prioritized_episode'])
def test_a_push_whose_storage_write_fails_adds_no_episode(kind, tmp_path):
    """The fields are allocated at the first push; when that failed (a memmap_dir that cannot be created), the
    episode was committed anyway: empty episodes were then sampled, and the buffer's state did not load."""
    (tmp_path / 'afile').write_text('')
    cfg = dict(type=kind, replay_buffer_size=4, max_transitions=16, seed=0)
    cfg['storage'] = dict(type='tensor', memmap_dir=str(tmp_path / 'afile' / 'mm'))  # its parent is a file
    buf = create_buffer(cfg)
    before = buf.state_dict()
    for _ in range(2):
        with pytest.raises(OSError):
            buf.push({'obs': torch.zeros(3, 4)})
    assert buf.count() == 0 and buf.transition_count == 0
    assert_same(buf.state_dict(), before)
    twin = create_buffer(dict(cfg, storage=dict(type='tensor')))
    twin.load_state_dict(buf.state_dict())
    assert twin.count() == 0


@pytest.mark.parametrize('kind', ['episode', 'prioritized_episode'])
def test_the_throughput_period_takes_seconds_as_a_float(kind):
    """Documented 'as for naive' (a positive number of seconds), but 0.5 and 30.0 were refused: 'expected int'."""
    for seconds in (0.5, 30.0, 2):
        buf = create_buffer(dict(type=kind, max_transitions=64, periodic_thruput_seconds=seconds))
        assert buf.cfg.periodic_thruput_seconds == seconds


def test_windows_no_episode_can_hold_are_warned_of_at_build(caplog):
    """unroll_len beyond max_transitions without padding: every sample refuses, which the build now says."""
    with caplog.at_level('WARNING', logger='ding_buffer'):
        create_buffer(dict(type='prioritized_episode', max_transitions=50, storage=dict(type='tensor')))
    assert "'sampler.unroll_len' is 80, more than max_transitions=50" in caplog.text
    caplog.clear()
    with caplog.at_level('WARNING', logger='ding_buffer'):
        create_buffer(dict(type='prioritized_episode', max_transitions=50, pad_short_episodes=True))
    assert 'unroll_len' not in caplog.text


@pytest.mark.parametrize('sampler', ['uniform', 'python_random'])
def test_prioritized_episode_names_its_sampler_type_when_given_another(sampler):
    """Its prioritized defaults are merged into the sampler section: another type was handed arguments the user never
    gave (``UniformSampler() takes no arguments``, listing six of them)."""
    with pytest.raises(ValueError, match=f"'sampler.type' has invalid value '{sampler}'; expected 'prioritized'") as e:
        create_buffer(dict(type='prioritized_episode', max_transitions=64, sampler=dict(type=sampler)))
    assert 'alpha' not in str(e.value)
    buf = create_buffer(dict(type='episode', max_transitions=64, sampler=dict(type=sampler), seed=0))  # as it says
    buf.push([{'obs': torch.arange(6.0)}])
    assert buf.sample(2, unroll_len=3)[0]['obs'].shape == (3,)


@pytest.mark.timeout(60)
def test_a_prioritized_sample_waiting_through_a_load_sees_the_loaded_windows():
    """A ``sample(timeout=)`` of prioritized windows that is waiting when ``load_state_dict`` replaces the windows
    index asks the new one: it draws once the restored episodes are there, not after its timeout."""
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=16,
        max_transitions=256,
        seed=0,
        storage=dict(type='tensor'),
        sampler=dict(type='prioritized', unroll_len=2),
    )
    src = create_buffer(cfg)
    src.push([[{'obs': torch.full((2,), float(10 * i + t))} for t in range(4)] for i in range(4)])
    buf = create_buffer(cfg)
    out = []

    def waiter():
        try:
            out.append(buf.sample(2, timeout=20.0))
        except Exception as e:  # (a SampleTimeoutError here is the failure)
            out.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    buf.load_state_dict(src.state_dict())
    t.join(30)
    assert len(out) == 1 and isinstance(out[0], dict), out
    assert out[0]['obs'].shape[:2] == (2, 2)


def test_a_restore_of_prioritized_windows_removes_the_memmap_files_it_replaced(tmp_path):
    """The replaced store and its prioritized windows referred to each other, so its memmap files (and fields)
    stayed until a garbage collection, and after close() too; they go when a restore replaces them, as on every
    other type."""
    import gc
    import os

    gc.disable()  # (what the cycle needed to be freed at all)
    try:
        buf = create_buffer(
            dict(
                type='prioritized_episode',
                max_transitions=40,
                replay_buffer_size=8,
                sampler=dict(type='prioritized', unroll_len=2),
                storage=dict(type='tensor', memmap_dir=str(tmp_path)),
            )
        )
        buf.push({'obs': torch.ones(5, 2)})
        for _ in range(3):
            buf.load_state_dict(buf.state_dict())
        assert len(os.listdir(tmp_path)) == 1
        buf.close()
        assert os.listdir(tmp_path) == []
    finally:
        gc.enable()


def test_a_state_of_prioritized_windows_is_refused_by_uniform_windows_and_the_other_way_round(tmp_path):
    """A uniform episode buffer took a prioritized one's state (file too) and dropped its step priorities without a
    word; the other way round was refused already. Both are refused naming 'windows', with nothing changed."""
    base = dict(type='episode', replay_buffer_size=4, max_transitions=40, seed=0, storage=dict(type='tensor'))
    prio = dict(base, sampler=dict(type='prioritized', unroll_len=3))
    src = create_buffer(prio)
    src.push({'x': torch.arange(5)})
    out = src.sample(2)
    src.update({k: out[k] for k in ('replay_unique_id', 'replay_buffer_idx')} | {'priority': torch.tensor([4.0, 0.5])})
    path = str(tmp_path / 'prio.pt')
    src.save_data(path)
    for source, target in ((src, create_buffer(base)), (create_buffer(base), create_buffer(prio))):
        before = target.state_dict()
        with pytest.raises(ValueError, match="'windows' entry"):
            target.load_state_dict(source.state_dict())
        assert_same(target.state_dict(), before)
    uniform = create_buffer(base)
    with pytest.raises(ValueError, match="'windows' entry"):
        uniform.load_data(path)
    assert uniform.count() == 0


def test_prioritized_window_settings_that_break_later_calls_are_refused_at_build():
    """sampler.eps above float32's range made the buffer's own state unloadable (its step priorities saved as
    inf)."""
    base = dict(type='episode', replay_buffer_size=8, max_transitions=40, storage=dict(type='tensor'))
    for sampler, extra, key in (
        (dict(type='prioritized', unroll_len=3, eps=1e39), {}, 'sampler.eps'),
        (dict(type='prioritized', unroll_len=3, eps=1.5), {}, 'sampler.eps'),
    ):
        with pytest.raises(ValueError, match=f"config key '{key}'"):
            create_buffer(dict(base, sampler=sampler, **extra))
    ok = create_buffer(dict(base, sampler=dict(type='prioritized', unroll_len=3, eps=1.0)))
    ok.push({'obs': torch.randn(6, 3)})
    out = ok.sample(2)
    ok.update({k: out[k] for k in ('replay_unique_id', 'replay_buffer_idx')} | {'priority': torch.ones(2)})
    create_buffer(dict(base, sampler=dict(type='prioritized', unroll_len=3, eps=1.0))).load_state_dict(ok.state_dict())


def test_prioritized_episode_stats_report_the_prioritized_entries():
    """``priority_mass`` sums the windows' ``priority ** alpha`` (one window per start) and ``priority_min_leaf`` is
    the smallest nonzero one, as on ``advanced`` (the entry was missing here)."""
    cfg = dict(
        type='prioritized_episode',
        replay_buffer_size=4,
        max_transitions=40,
        sampler=dict(type='prioritized', unroll_len=4, alpha=1.0),
        storage=dict(type='tensor'),
        seed=0,
    )
    buf = create_buffer(cfg)
    assert buf.stats()['priority_min_leaf'] == float('inf') and buf.stats()['priority_mass'] == 0.0
    buf.push({'t': torch.arange(10)})
    s = buf.stats()
    assert s['priority_mass'] == pytest.approx(7 * s['max_priority'])  # 10 - 4 + 1 windows, each at the maximum
    assert s['priority_min_leaf'] == pytest.approx(s['max_priority'])

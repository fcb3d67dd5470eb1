"""The mixture buffer (``type='mixture'``): exact per-member counts, items marked with their member, priority updates
routed back (checked against a brute-force model of each prioritized member), all-or-nothing updates and loads, state
and file round trips, and the members' own rules -- through the public API."""

import copy
import threading
import time

import numpy as np
import pytest
import torch
from helpers import answer_while_held, assert_same, chi_square, chi_threshold, states_equal, wait_until

from ding_buffer import BUFFER_REGISTRY, SampleTimeoutError, create_buffer
from ding_buffer.buffers.mixture import split_counts
from ding_buffer.control.limits import REMOVER_REGISTRY, Remover
from ding_buffer.control.samplers import SAMPLER_REGISTRY


def mixture(storage='list', weights=None, seed=0, offline=None, online=None, **extra):
    members = dict(
        offline=dict(type='naive', replay_buffer_size=1000, seed=seed + 1, storage=dict(type=storage)),
        online=dict(type='advanced', replay_buffer_size=64, seed=seed + 2, storage=dict(type=storage)),
    )
    members['offline'].update(offline or {})
    members['online'].update(online or {})
    cfg = dict(type='mixture', seed=seed, members=members, **extra)
    if weights is not None:
        cfg['weights'] = weights
    return create_buffer(cfg, instance_name='mix')


def transitions(values, storage):
    if storage == 'list':
        return [{'obs': float(v)} for v in values]
    return [{'obs': torch.tensor([float(v)]), 'act': torch.tensor(int(v) % 3)} for v in values]


def filled(storage='list', n_off=200, n_on=40, **kw):
    buf = mixture(storage, **kw)
    buf.push(transitions(range(n_off), storage), member='offline')
    buf.push(transitions(range(-1, -n_on - 1, -1), storage))  # push_to: the last member, 'online'
    return buf


def members_of(batch, buf):
    if isinstance(batch, list):
        return [item['mixture_member'] for item in batch]
    return [buf.member_names[i] for i in batch['mixture_member'].tolist()]


def obs_of(batch):
    if isinstance(batch, list):
        return np.array([item['obs'] for item in batch])
    return batch['obs'][:, 0].numpy()


# ------------------------------------------------------------------------------------------ the split of a sample
@pytest.mark.parametrize('weights', [[1, 1], [1, 3], [0.3, 0.7], [1, 0], [0.001, 5], [2, 2, 1], [1, 1, 1]])
@pytest.mark.parametrize('size', [1, 7, 64, 1000])
def test_split_counts_are_floor_or_ceil_and_sum_to_the_size(weights, size):
    w = np.array(weights, dtype=float)
    exact = size * w / w.sum()
    rng = np.random.default_rng(0)
    for _ in range(50):
        counts = split_counts(size, w, rng)
        assert counts.sum() == size
        assert np.all((counts == np.floor(exact)) | (counts == np.ceil(exact)))
        assert np.all(counts[w == 0] == 0)


def test_split_counts_mean_is_exact():
    """Each member gets the ceiling with probability its fractional share: the mean count is size * share."""
    w, size, trials = np.array([0.2, 0.45, 0.35]), 7, 20000
    rng = np.random.default_rng(3)
    counts = np.array([split_counts(size, w, rng) for _ in range(trials)])
    exact = size * w
    ceil_freq = (counts > np.floor(exact)).mean(axis=0)
    frac = exact - np.floor(exact)
    assert np.all(np.abs(ceil_freq - frac) < 5 * np.sqrt(frac * (1 - frac) / trials)), (ceil_freq, frac)


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_each_sample_takes_the_exact_counts_and_marks_every_item(storage):
    buf = filled(storage, weights=dict(offline=0.5, online=0.5))
    for size in (2, 10, 64):
        batch = buf.sample(size)
        names, obs = members_of(batch, buf), obs_of(batch)
        assert names == ['offline'] * (size // 2) + ['online'] * (size // 2)  # member by member, in config order
        assert np.all(obs[: size // 2] >= 0) and np.all(obs[size // 2 :] < 0)  # each item from its member
    assert buf.stats()['sampled_offline'] == buf.stats()['sampled_online'] == 38
    buf.close()


def test_odd_sizes_assign_the_remainder_by_the_seed():
    runs = []
    for _ in range(2):
        buf = filled(weights=dict(offline=1, online=1), seed=5)
        runs.append([members_of(buf.sample(5), buf).count('offline') for _ in range(200)])
        buf.close()
    assert runs[0] == runs[1]  # the same seed splits the same way
    assert set(runs[0]) == {2, 3} and abs(np.mean(runs[0]) - 2.5) < 0.2


def test_size_weights_follow_the_members_counts():
    buf = filled(n_off=300, n_on=60, weights='size', online=dict(replay_buffer_size=100))
    batch = buf.sample(36)
    assert members_of(batch, buf).count('offline') == 30  # 36 * 300 / 360
    buf.close()


@pytest.mark.parametrize(
    'weights, share',
    [
        (dict(offline=1e308, online=1e308), 0.5),  # their sum is inf
        (dict(offline=1.5e308, online=0.5e308), 0.75),  # size * weight is inf
        (dict(offline=1e-300, online=3e-300), 0.25),
        (dict(offline=5e-324, online=0), 1.0),  # the smallest float
    ],
)
def test_extreme_weights_keep_their_ratio(weights, share):
    """Weights near the float64 limits are valid config values: the split uses their ratio, never inf / inf."""
    buf = filled(weights=weights)
    assert buf.weights == pytest.approx(dict(offline=share, online=1 - share))
    for size in (1, 8, 40):
        counts = members_of(buf.sample(size), buf).count('offline')
        assert counts in (np.floor(size * share), np.ceil(size * share))
    buf.close()


def test_a_zero_weight_member_is_never_sampled_but_takes_pushes():
    buf = filled(weights=dict(offline=0, online=1))
    assert set(members_of(buf.sample(32), buf)) == {'online'}
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_sample_is_none_and_nothing_drawn_when_a_member_with_a_share_is_empty(storage):
    buf = mixture(storage, weights=dict(offline=0.5, online=0.5))
    buf.push(transitions(range(20), storage), member='offline')
    before = {n: m.state_dict() for n, m in buf.members.items()}
    assert buf.sample(4) is None
    for name, member in buf.members.items():
        assert_same(member.state_dict(), before[name], f'{name} after a refused mixture sample')
    assert buf.stats()['refused_sample'] == 1
    buf.close()


def test_a_member_without_replacement_short_of_its_share_refuses_before_anyone_draws():
    buf = filled(n_off=3, weights=dict(offline=0.5, online=0.5))
    before = buf.members['online'].state_dict()
    assert buf.sample(10) is None  # offline holds 3 < 5
    assert_same(buf.members['online'].state_dict(), before)
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('why', ['rate limit', 'stale', 'empty prioritized'])
def test_a_later_member_refusing_for_its_own_reasons_leaves_the_earlier_ones_undrawn(storage, why):
    """The first member (max_use=1: a draw would remove what it gave) is asked first, and draws nothing, when the
    second refuses: its rate limit, its items all stale, or empty (an advanced member draws with replacement)."""
    second = dict(
        {'rate limit': dict(type='naive', thruput_controller=dict(sample_min_limit_ratio=3.0))}.get(why)
        or {'stale': dict(type='naive', max_staleness=5)}.get(why)
        or dict(type='advanced'),
        storage=dict(type='tensor') if storage == 'tensor' else dict(type='list'),
    )
    buf = mixture(storage, weights=dict(offline=0.5, online=0.5), offline=dict(type='naive', max_use=1), online=second)
    buf.push(transitions(range(8), storage), member='offline')
    if why != 'empty prioritized':
        items = transitions(range(100, 108), storage)
        if why == 'stale':
            items = [dict(t, collect_iter=0) for t in items]
        buf.push(items, member='online')
    before = buf.members['offline'].state_dict()
    assert buf.sample(8, cur_learner_iter=100) is None
    assert_same(buf.members['offline'].state_dict(), before, 'offline after a refused mixture sample')
    assert buf.members['offline'].count() == 8 and buf.stats()['refused_sample'] == 1
    buf.close()


@pytest.mark.timeout(30)
def test_sample_with_a_timeout_of_an_empty_mixture_weighted_by_size_waits_then_raises_or_draws():
    from ding_buffer.errors import SampleTimeoutError

    buf = mixture()  # weights='size'
    start = time.monotonic()
    with pytest.raises(SampleTimeoutError, match='every member is empty'):
        buf.sample(2, timeout=0.3)
    assert time.monotonic() - start >= 0.3
    threading.Timer(0.2, lambda: buf.push(transitions(range(4), 'list'))).start()
    assert len(buf.sample(2, timeout=10)) == 2
    buf.close()


@pytest.mark.timeout(30)
def test_sample_with_a_timeout_waits_for_a_push():
    buf = mixture(weights=dict(offline=0.5, online=0.5))
    buf.push(transitions(range(10), 'list'), member='offline')
    got = {}
    t = threading.Thread(target=lambda: got.setdefault('batch', buf.sample(4, timeout=10)))
    t.start()
    time.sleep(0.3)
    assert 'batch' not in got
    buf.push(transitions([-1, -2], 'list'))
    t.join(10)
    assert members_of(got['batch'], buf).count('online') == 2
    buf.close()


# ------------------------------------------------------------------------------------------ updates, brute force
def brute_force(priorities, alpha, beta, eps):
    """P(i) and IS(i) of a prioritized member from its stored priorities (what DI-engine's formula gives)."""
    leaf = (np.asarray(priorities) + eps) ** alpha
    p = leaf / leaf.sum()
    w = (len(p) * p) ** (-beta)
    return p, w / w.max()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_updates_reach_the_right_member_and_match_a_brute_force_model(storage):
    alpha, beta, eps = 0.7, 0.5, 1e-5
    online = dict(replay_buffer_size=8, alpha=alpha, beta=beta, anneal_step=0, eps=eps)
    prio = dict(type='advanced', replay_buffer_size=8, alpha=alpha, beta=beta, anneal_step=0, eps=eps, seed=9)
    buf = mixture(storage, weights=dict(offline=0.5, online=0.5), online=online, offline=prio)
    buf.push(transitions(range(8), storage), member='offline')
    buf.push(transitions(range(-1, -9, -1), storage))
    target = {'offline': np.arange(1.0, 9.0), 'online': np.arange(8.0, 0.0, -1.0)}  # priority of obs value
    key = {'offline': lambda v: int(v), 'online': lambda v: int(-v - 1)}
    for _ in range(6):  # cover every slot of both members
        batch = buf.sample(16)
        names, obs = members_of(batch, buf), obs_of(batch)
        prios = [target[n][key[n](v)] for n, v in zip(names, obs)]
        if storage == 'list':  # list ids name their member: no member key needed (DI-engine's learner)
            info = {k: [item[k] for item in batch] for k in ('replay_unique_id', 'replay_buffer_idx')}
        else:
            info = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')}
        info['priority'] = prios
        assert buf.update(info) == {'updated': 16, 'stale': 0}
    draws = {'offline': np.zeros(8), 'online': np.zeros(8)}
    for _ in range(300):
        batch = buf.sample(16)
        names, obs = members_of(batch, buf), obs_of(batch)
        is_w = [item['IS'] for item in batch] if storage == 'list' else batch['IS'].tolist()
        for n, v, w in zip(names, obs, is_w):
            p, expected_w = brute_force(target[n], alpha, beta, eps)
            assert w == pytest.approx(expected_w[key[n](v)], rel=1e-4), (n, v)
            draws[n][key[n](v)] += 1
    for n in draws:
        p, _ = brute_force(target[n], alpha, beta, eps)
        assert chi_square(draws[n], p * draws[n].sum()) < chi_threshold(7), (n, draws[n])
    buf.close()


def test_tensordict_members_sample_one_tensordict_that_updates_back():
    """Members fed TensorDicts return TensorDicts: the mixture's batch is one TensorDict (nested fields kept), and
    that TensorDict is a valid update."""
    tensordict = pytest.importorskip('tensordict')
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5), offline=dict(type='advanced'))
    for name, sign in (('offline', 1.0), ('online', -1.0)):
        data = {'obs': sign * torch.arange(1.0, 11.0)[:, None].repeat(1, 3), 'nest': {'r': torch.zeros(10)}}
        buf.extend(tensordict.TensorDict(data, batch_size=[10]), member=name)
    batch = buf.sample(6)
    assert isinstance(batch, tensordict.TensorDictBase) and batch.batch_size == torch.Size([6])
    assert members_of({'mixture_member': batch['mixture_member']}, buf) == ['offline'] * 3 + ['online'] * 3
    assert (batch['obs'][:3] > 0).all() and (batch['obs'][3:] < 0).all() and batch['nest', 'r'].shape == (6,)
    batch.set('priority', torch.full((6,), 3.0))
    assert buf.update(batch) == {'updated': 6, 'stale': 0}
    buf.close()


def test_a_field_the_members_store_in_other_shapes_is_refused_by_name():
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5))
    buf.push([{'obs': torch.zeros(4), 'nest': {'x': torch.zeros(2)}} for _ in range(5)], member='offline')
    buf.push([{'obs': torch.zeros(3), 'nest': {'y': torch.zeros(2)}} for _ in range(5)], member='online')
    with pytest.raises(ValueError, match=r"field 'obs' as \{'offline': 'rows of shape \(4,\)', 'online': 'rows of sh"):
        buf.sample(4)
    buf.close()
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5))
    buf.push([{'obs': {'x': torch.zeros(2)}} for _ in range(5)], member='offline')
    buf.push([{'obs': torch.zeros(2)} for _ in range(5)], member='online')
    with pytest.raises(ValueError, match=r"field 'obs' as \{'offline': 'dict'"):
        buf.sample(4)
    buf.close()


def test_nested_fields_no_member_shares_are_left_out():
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5))
    buf.push([{'r': 1.0, 'nest': {'x': torch.zeros(2), 'z': 1.0}, 'g': {'a': 0.0}} for _ in range(5)], member='offline')
    buf.push(
        [{'r': 2.0, 'nest': {'y': torch.zeros(2), 'z': 2.0}, 'g': {'b': 0.0}, 'odd': {'w': 0.0}} for _ in range(5)]
    )
    batch = buf.sample(4)
    assert set(batch) >= {'r', 'nest'} and set(batch['nest']) == {'z'}
    assert 'odd' not in batch and 'g' not in batch  # nothing of 'g' is shared: no empty dict
    assert batch['nest']['z'].tolist() == [1.0, 1.0, 2.0, 2.0]
    buf.close()


def test_an_update_is_all_or_nothing_across_members():
    buf = filled('tensor', weights=dict(offline=0.5, online=0.5), offline=dict(type='advanced'))
    batch = buf.sample(8)
    before = buf.state_dict()
    good = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')}
    bad_tail = torch.tensor([1.0] * 7 + [float('nan')])  # the last entry is the online member's
    with pytest.raises(ValueError, match='priorit'):
        buf.update({**good, 'priority': bad_tail})
    bad_slot = {**good, 'priority': torch.ones(8)}
    bad_slot['replay_buffer_idx'] = bad_slot['replay_buffer_idx'].clone()
    bad_slot['replay_buffer_idx'][-1] = 10**6
    with pytest.raises(ValueError, match='replay_buffer_idx'):
        buf.update(bad_slot)
    assert_same(buf.state_dict(), before, 'state after a refused mixture update')
    assert buf.update({**good, 'priority': torch.full((8,), 2.0)}) == {'updated': 8, 'stale': 0}
    buf.close()


def test_an_update_with_bfloat16_priorities_is_routed():
    buf = filled('tensor', weights=dict(offline=0.5, online=0.5), offline=dict(type='advanced'))
    batch = buf.sample(8)
    info = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')}
    assert buf.update({**info, 'priority': torch.full((8,), 2.5, dtype=torch.bfloat16)}) == {'updated': 8, 'stale': 0}
    assert buf.stats()['offline.max_priority'] == buf.stats()['online.max_priority'] == 2.5
    buf.close()


def test_an_update_that_cannot_be_routed_names_the_key():
    buf = filled('tensor')
    batch = buf.sample(4)
    info = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx')} | {'priority': torch.ones(4)}
    with pytest.raises(ValueError, match="needs 'mixture_member'"):
        buf.update(info)
    with pytest.raises(ValueError, match="'mixture_member' holds 'nobody'"):
        buf.update({**info, 'mixture_member': ['nobody'] * 4})
    list_buf = filled('list')
    with pytest.raises(ValueError, match='not an id of a member'):
        list_buf.update({'replay_unique_id': ['other_3'], 'replay_buffer_idx': [3], 'priority': [1.0]})
    buf.close()
    list_buf.close()


def test_stale_updates_are_counted_by_the_member():
    buf = filled(weights=dict(offline=0, online=1))  # online holds 40 of capacity 64
    batch = buf.sample(4)
    buf.push(transitions(range(100, 164), 'list'))  # the online ring turns over: every sampled id is replaced
    info = {k: [item[k] for item in batch] for k in ('replay_unique_id', 'replay_buffer_idx')}
    assert buf.update({**info, 'priority': [1.0] * 4}) == {'updated': 0, 'stale': 4}
    buf.close()


# ------------------------------------------------------------------------------------------ state and files
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_state_and_file_round_trips_give_identical_next_samples(storage, tmp_path):
    buf = filled(storage, weights=dict(offline=0.3, online=0.7))
    buf.sample(7)
    copy = mixture(storage, weights=dict(offline=0.3, online=0.7), seed=42)
    copy.load_state_dict(buf.state_dict())
    assert_same(copy.state_dict(), buf.state_dict())
    buf.save_data(str(tmp_path / 'mix.pt'))
    from_file = mixture(storage, weights=dict(offline=0.3, online=0.7), seed=43)
    from_file.load_data(str(tmp_path / 'mix.pt'), allow_pickle=storage == 'list')
    for _ in range(3):
        a, b, c = buf.sample(9), copy.sample(9), from_file.sample(9)
        assert_same(a, b, 'sample after load_state_dict')
        assert_same(a, c, 'sample after load_data')
    for b in (buf, copy, from_file):
        b.close()


def test_a_refused_load_leaves_every_member_as_it_was():
    buf = filled('tensor')
    good = buf.state_dict()
    other = filled('tensor', n_off=50, n_on=10, seed=7)
    before = other.state_dict()
    broken = {**good, 'members': {**good['members'], 'online': {**good['members']['online'], 'rng': 'garbage'}}}
    with pytest.raises(ValueError, match="^mixture member 'online': "):
        other.load_state_dict(broken)  # offline loads first, then online refuses (named): offline goes back
    assert_same(other.state_dict(), before, 'state after a refused load')
    for bad in ({**good, 'members': {'offline': good['members']['offline']}}, {**good, 'type': 'Naive'}):
        with pytest.raises(ValueError):
            other.load_state_dict(bad)
        assert_same(other.state_dict(), before)
    other.load_state_dict(good)
    assert states_equal(other.state_dict(), good)
    buf.close()
    other.close()


# ------------------------------------------------------------------------------------------ members keep their rules
def test_members_keep_their_own_capacity_and_eviction():
    buf = filled(n_off=200, n_on=200)  # online capacity 64: FIFO; offline 1000 never evicts here
    assert (buf.members['offline'].count(), buf.members['online'].count(), buf.count()) == (200, 64, 264)
    online = obs_of(buf.members['online'].sample(64))
    assert set(online.tolist()) <= set(range(-200, -136))  # the newest 64
    stats = buf.stats()
    assert stats['offline.count'] == 200 and stats['online.count'] == 64 and stats['count'] == 264
    buf.clear()
    assert buf.count() == 0
    buf.close()


@pytest.mark.parametrize(
    'cfg, match',
    [
        (dict(members={}), "'members' must be a non-empty dict"),
        (dict(members=dict(a=dict(type='deque'))), "'members.a.type' is 'deque'"),
        (dict(members=dict(a=dict(type='mixture'))), 'cannot itself be a mixture'),
        (dict(members=dict(a=dict(replay_buffer_size=3))), "'members.a' must be a buffer config with a 'type'"),
        (dict(members=dict(a=dict(type='episode'))), "'members.a.type' is 'episode', whose items are episodes"),
        (dict(weights=dict(offline=1)), "'weights' must be 'size' or a dict"),
        (dict(weights=np.array([0.5, 0.5])), "'weights' must be 'size' or a dict"),
        (dict(weights=np.array(['size'])), "'weights' must be 'size' or a dict"),
        (dict(weights=dict(offline=-1, online=1)), "'weights.offline' has value -1"),
        (dict(weights=dict(offline=0, online=0)), 'no positive weight'),
        (dict(push_to='nobody'), "'push_to' is 'nobody'"),
        (dict(member_kye='x'), "did you mean 'member_key'"),
        (dict(weight=dict(offline=1, online=1)), "did you mean 'weights'"),
        (dict(member=dict(a=dict(type='naive'))), "did you mean 'members'"),
        (
            dict(members=dict(a=dict(type='naive'), b=dict(type='naive', storage=dict(type='tensor')))),
            'one storage kind',
        ),
        (
            dict(members=dict(a=dict(type='naive', replay_buffer_size=-1))),
            "^mixture member 'a': .*'replay_buffer_size'",
        ),
    ],
)
def test_bad_configs_are_refused_by_name(cfg, match):
    with pytest.raises(ValueError, match=match):
        create_buffer(dict(type='mixture', **cfg))


def test_a_members_dataset_error_names_the_member(tmp_path):
    missing = str(tmp_path / 'missing.hdf5')
    members = dict(offline=dict(type='naive', dataset=dict(path=missing)), online=dict(type='naive'))
    with pytest.raises(FileNotFoundError, match=f"^mixture member 'offline': no dataset file at '{missing}'"):
        create_buffer(dict(type='mixture', members=members))
    import h5py

    from ding_buffer.datasets.hdf5 import FileError

    bad = str(tmp_path / 'bad.hdf5')  # a dataset's own error type (a ValueError subclass) keeps its type
    with h5py.File(bad, 'w') as f:
        f['observations'], f['actions'] = np.zeros((2, 3), np.float32), np.zeros((2, 1), np.float32)
        f['rewards'], f['terminals'] = np.zeros(2, np.float32), np.array([0.5, 1.0])
    members['offline']['dataset'] = dict(path=bad)
    with pytest.raises(FileError, match="^mixture member 'offline': .*'terminals' holds 0.5"):
        create_buffer(dict(type='mixture', members=members))


@pytest.mark.parametrize('item', [('obs', 2.0), 3.0, [('obs', 1.0)]])
def test_a_mixture_refuses_items_that_are_no_dicts_at_push(item):
    """Every sampled item gets the member key, so an item that is no dict is refused at push (it was stored, and
    every later sample that drew it raised)."""
    buf = mixture('list', weights=dict(offline=0.5, online=0.5))
    buf.push(transitions(range(4), 'list'), member='offline')
    buf.push(transitions(range(4), 'list'))
    before = buf.state_dict()
    with pytest.raises(TypeError, match="a mixture stores dicts .* is (tuple|float)"):
        buf.push(item)
    assert_same(buf.state_dict(), before)
    assert len(buf.sample(8)) == 8


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_the_member_key_hides_no_field_a_sample_adds_and_no_pushed_field(storage):
    for reserved in ('IS', 'priority', 'replay_unique_id', 'replay_buffer_idx'):
        with pytest.raises(ValueError, match="config key 'member_key' has invalid value"):
            mixture(storage, member_key=reserved)
    buf = mixture(storage, member_key='obs')
    before = buf.state_dict()
    with pytest.raises(ValueError, match="pushed data has a field 'obs', the mixture's member_key"):
        buf.push(transitions(range(3), storage), member='offline')
    if storage == 'tensor':
        with pytest.raises(ValueError, match="the mixture's member_key"):
            buf.extend({'obs': torch.zeros(3, 1), 'act': torch.zeros(3, dtype=torch.int64)})
    assert_same(buf.state_dict(), before)
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_member_without_priorities_refuses_the_fields_that_would_pose_as_a_prioritized_members(storage):
    """Beside a prioritized member, a naive member's field 'IS' became the joined batch's IS weights for its rows
    (data used as loss weights), and a 'replay_unique_id' naming the prioritized member's item routed an update by
    id to it. Both are refused at push, nothing changed; a prioritized member takes them (its own values win)."""
    buf = filled(storage, n_off=8, n_on=8)
    one = transitions([1], storage)[0]
    before = buf.state_dict()
    for key, value in (('IS', 100.0), ('replay_unique_id', 'mix_online_3')):
        with pytest.raises(ValueError, match=f"member 'offline' has a field '{key}'.*without priorities"):
            buf.push([dict(one), dict(one, **{key: value})], member='offline')
        if storage == 'tensor':
            with pytest.raises(ValueError, match=f"field '{key}'"):
                buf.extend(
                    {'obs': torch.zeros(2, 1), 'act': torch.zeros(2, dtype=torch.int64), key: torch.ones(2)},
                    member='offline',
                )
    assert_same(buf.state_dict(), before)
    assert buf.push([dict(one, IS=100.0)], member='online') == 1
    batch = buf.sample(16)
    weights = batch['IS'] if storage == 'tensor' else torch.tensor([d.get('IS', 1.0) for d in batch])
    assert float(weights.max()) <= 1.0
    alone = mixture(storage, online=dict(type='naive'))  # no prioritized member: a field like any other
    assert alone.push([dict(one, IS=5.0)], member='offline') == 1
    if storage == 'tensor':  # written into the member itself (not checked): still no weight in a joined batch
        alone.close()
        alone = mixture(storage)
        alone.members['offline'].push([dict(one, IS=torch.tensor(50.0)) for _ in range(4)])
        alone.push([one] * 4)
        batch = alone.sample(8)
        offline = batch['mixture_member'] == 0
        assert offline.any() and bool((batch['IS'][offline] == 1.0).all())
    buf.close()
    alone.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_dingengines_short_state_form_pushes_to_push_to_and_a_state_without_type_is_named(storage):
    """``load_state_dict({'data': [...]})`` pushes the items on every buffer (DI-engine's form); a mixture said
    "state was made by None", as it did for a state with no 'type' at all."""
    buf = mixture(storage)
    items = transitions(range(3), storage)
    buf.load_state_dict({'data': items}, deepcopy=True)
    assert (buf.members['offline'].count(), buf.members['online'].count()) == (0, 3)
    before = buf.state_dict()
    with pytest.raises(ValueError, match="state has no 'type' entry"):
        buf.load_state_dict({'Data': items})
    with pytest.raises(ValueError, match="pushed data has a field 'mixture_member'"):  # the push's own checks
        buf.load_state_dict({'data': [dict(items[0], mixture_member=0)]})
    with pytest.raises(TypeError, match='deepcopy must be a bool'):
        buf.load_state_dict({'data': items}, deepcopy='yes')
    assert_same(buf.state_dict(), before)
    buf.close()


@SAMPLER_REGISTRY.register('test_mix_clears_its_mixture')
class _ClearsItsMixture:
    """A member's sampler that calls its mixture (``target``) once."""

    target = None

    def draw(self, rng, m, size, replace):
        target, _ClearsItsMixture.target = _ClearsItsMixture.target, None
        if target is not None:
            target.clear()
        return rng.integers(0, m, size)


def test_a_members_hook_that_changes_the_mixture_is_refused_before_any_member_changes():
    """A member's sampler clearing the mixture mid-sample: the members before the drawing one were cleared, then the
    drawing member refused. The mixture refuses it first, nothing changed."""
    buf = filled('list', n_off=4, n_on=4, online=dict(type='naive', sampler=dict(type='test_mix_clears_its_mixture')))
    before = buf.state_dict()
    _ClearsItsMixture.target = buf
    with pytest.raises(RuntimeError, match=r"clear\(\) was called from inside its own sample\(\)"):
        buf.sample(4)
    assert_same(buf.state_dict(), before)
    buf.close()


def test_a_bad_priority_is_named_by_its_place_in_the_call():
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5), offline=dict(type='advanced'))
    buf.push(transitions(range(8), 'tensor'), member='offline')
    buf.push(transitions(range(8), 'tensor'))
    batch = buf.sample(4)  # entries 0, 1 from offline, 2, 3 from online
    priority = torch.ones(4)
    priority[2] = float('nan')
    before = buf.state_dict()
    with pytest.raises(ValueError, match='entry 2 is nan'):
        buf.update(
            {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')} | {'priority': priority}
        )
    assert_same(buf.state_dict(), before)
    buf.close()


def test_push_to_an_unknown_member_is_refused_and_changes_nothing():
    buf = filled()
    before = buf.state_dict()
    with pytest.raises(ValueError, match="member must be one of"):
        buf.push(transitions([1], 'list'), member='nobody')
    for member in (['offline'], {'offline': 1}):  # (not hashable: they raised a bare "unhashable type")
        with pytest.raises(ValueError, match="member must be one of"):
            buf.push(transitions([1], 'list'), member=member)
    assert_same(buf.state_dict(), before)
    buf.close()
    with pytest.raises(RuntimeError, match='closed'):
        buf.push(transitions([1], 'list'))


def test_extend_writes_a_batch_to_a_member():
    buf = mixture('tensor')
    assert buf.extend({'obs': torch.zeros(5, 1), 'act': torch.zeros(5, dtype=torch.long)}, member='offline') == 5
    assert (buf.members['offline'].count(), buf.members['online'].count()) == (5, 0)
    buf.close()


def test_a_mixture_is_refused_as_a_distributed_buffer_by_name():
    with pytest.raises(ValueError, match="'distributed' is set on type 'mixture': a mixture holds local member"):
        create_buffer(dict(type='mixture', distributed=dict(backend='torch')))


def test_a_training_config_checks_every_members_section():
    from ding_buffer.train.config import build_train_config

    members = dict(a=dict(type='advanced'), b=dict(type='naive', replay_bufer_size=3))
    section = dict(policy=dict(other=dict(replay_buffer=dict(type='mixture', members=members))))
    with pytest.raises(
        ValueError,
        match=r"'policy\.other\.replay_buffer\.members\.b\.replay_bufer_size'.*did you mean "
        r"'policy\.other\.replay_buffer\.members\.b\.replay_buffer_size'",
    ):
        build_train_config(section)
    members['b'] = dict(type='naive')
    assert build_train_config(section).policy.other.replay_buffer.type == 'mixture'


def test_the_mixture_cfg_shares_no_section_with_the_callers_config():
    from easydict import EasyDict

    members = dict(a=dict(type='naive', storage=dict(type='tensor')), b=dict(type='naive', storage=dict(type='tensor')))
    cfg = EasyDict(type='mixture', members=members)
    buf = create_buffer(cfg)
    buf.cfg.members.a.storage.type = 'list'
    buf.cfg.members.b.replay_buffer_size = 3
    assert cfg.members.a.storage.type == 'tensor' and 'replay_buffer_size' not in cfg.members.b
    assert create_buffer(cfg).cfg.members.a.storage.type == 'tensor'


def test_a_member_value_that_cannot_be_copied_is_still_refused_by_its_key():
    """The mixture copies each member's section: a value that cannot be copied (a writer passed by mistake) must
    still be named by the member's own check, not fail the copy with a bare ``cannot pickle``."""
    members = dict(a=dict(type='naive', tb_logger=threading.Lock()), b=dict(type='naive'))
    with pytest.raises(ValueError, match=r"mixture member 'a': unknown config key 'tb_logger'"):
        create_buffer(dict(type='mixture', members=members))
    with pytest.raises(ValueError, match=r"unknown config key 'members\.a\.tb_logger'"):
        BUFFER_REGISTRY.get('mixture').check_config(dict(type='mixture', members=members))


@pytest.mark.timeout(30)
def test_tensorboard_shows_each_member_under_its_own_tags():
    class Writer:  # what a SummaryWriter is to the buffers: add_scalar and flush
        def __init__(self):
            self.tags = set()

        def add_scalar(self, tag, value, step=None):
            self.tags.add(tag)

        def flush(self):
            pass

    tb = Writer()
    members = dict(
        offline=dict(type='advanced', monitor=dict(periodic_thruput=dict(seconds=0.05))),
        online=dict(type='naive', periodic_thruput_seconds=0.05),
    )
    buf = create_buffer(dict(type='mixture', members=members), tb_logger=tb, instance_name='mix')
    buf.push(transitions(range(10), 'list'), member='offline')
    buf.push(transitions(range(10), 'list'))
    buf.sample(4)
    assert wait_until(lambda: {'mix_offline_sec/pushed_in', 'mix_online_sec/pushed_in'} <= tb.tags, timeout=20), tb.tags
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('member', ['offline', 'online'])
def test_a_batched_push_keeps_no_reference_to_the_callers_batch(storage, member):
    """As every buffer type (the contract suite): what a batched push stored never changes when the caller writes
    to its batch afterwards (collectors reuse their batch buffers; the manager pushes shared-memory rows in place)."""
    buf = mixture(storage)
    batch = {'obs': torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), 'act': torch.arange(4)}
    assert buf.push(batch, batched=True, member=member) == 4
    before = copy.deepcopy(buf.state_dict())  # (a state may share memory with the buffer)
    for v in batch.values():
        v.fill_(7)
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('first', ['offline', 'online'])
def test_is_weights_are_kept_whichever_member_comes_first(first):
    """``IS`` leaves the mixture whether the prioritized member is listed first or last: 1 for the items of the
    member that does not weight, the member's own weights for the others."""
    members = dict(
        offline=dict(type='naive', replay_buffer_size=100, seed=1, storage=dict(type='tensor')),
        online=dict(type='advanced', replay_buffer_size=100, seed=2, storage=dict(type='tensor')),
    )
    order = [first] + [m for m in members if m != first]
    buf = create_buffer(dict(type='mixture', seed=0, members={m: members[m] for m in order}), instance_name='mix')
    buf.push(transitions(range(20), 'tensor'), member='offline')
    buf.push(transitions(range(-1, -21, -1), 'tensor'), member='online')
    batch = buf.sample(16)
    names = members_of(batch, buf)
    assert set(names) == {'offline', 'online'}
    is_w = batch['IS'].tolist()
    assert [w for n, w in zip(names, is_w) if n == 'offline'] == [1.0] * names.count('offline')
    assert all(0.0 < w <= 1.0 for w in is_w)
    buf.close()


@pytest.mark.parametrize('weights', ['size', {'offline': 1, 'online': 1}])
def test_close_ends_a_waiting_sample(weights):
    """Under weights='size' an empty mixture's sample(timeout=) slept out its whole timeout after close()."""
    buf = mixture(weights=weights)
    out = {}

    def learner():
        try:
            buf.sample(4, timeout=30)
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            out['error'] = e

    th = threading.Thread(target=learner)
    th.start()
    time.sleep(0.2)
    buf.close()
    th.join(60)  # (only a bound against a hang: a wait that slept out its timeout ends in SampleTimeoutError)
    assert isinstance(out.get('error'), RuntimeError) and 'closed' in str(out['error']), out


def test_a_refused_sample_moves_neither_the_rng_nor_the_sample_count():
    """A refusal counts refused_sample only, as on every engine buffer, and a sample that times out counts
    nothing (it raises, as theirs do); the shares it drew are drawn again."""
    buf = filled(n_off=20, n_on=20, weights={'offline': 1, 'online': 1})
    twin = filled(n_off=20, n_on=20, weights={'offline': 1, 'online': 1})
    before = buf.state_dict()
    assert buf.sample(41) is None
    with pytest.raises(SampleTimeoutError):
        buf.sample(41, timeout=0.05)
    state = buf.state_dict()
    assert state['counters']['refused_sample'] == 1
    state['counters']['refused_sample'] = before['counters']['refused_sample']
    assert_same(state, before)
    assert buf.stats()['sample_calls'] == 0
    assert_same(buf.sample(8), twin.sample(8), 'sample')
    assert buf.stats()['sample_calls'] == 1


@SAMPLER_REGISTRY.register('test_mix_refuses')
class _Refuses:
    """A user sampler that refuses (answers None) while fewer than 8 candidates exist."""

    def draw(self, rng, m, size, replace):
        rng.integers(0, m, size)  # moves the member's RNG first: the refusal must put it back
        return None if m < 8 else rng.integers(0, m, size)


@SAMPLER_REGISTRY.register('test_mix_garbage')
class _Garbage:
    def draw(self, rng, m, size, replace):
        return np.full(size, m, dtype=np.int64)  # out of range


@REMOVER_REGISTRY.register('test_mix_raises')
class _RaisesAfterSample(Remover):
    def after_sample(self, table, slots, use):
        raise RuntimeError('remover failed on purpose')


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('part', ['refusing sampler', 'garbage sampler', 'raising remover'])
def test_a_member_whose_own_parts_fail_its_draw_leaves_every_member_as_it_was(storage, part):
    """A member whose sampler or rule of the user's may fail or refuse after saying it would draw: the mixture
    draws it first, so a member that cannot fail (max_use=1: a draw would remove what it gave) has not drawn when
    it does."""
    st = dict(type='tensor') if storage == 'tensor' else dict(type='list')
    user = {
        'refusing sampler': dict(sampler=dict(type='test_mix_refuses')),
        'garbage sampler': dict(sampler=dict(type='test_mix_garbage')),
        'raising remover': dict(removers=[dict(type='test_mix_raises')]),
    }[part]
    first = dict(type='naive', max_use=1)
    buf = mixture(
        storage,
        weights=dict(offline=0.5, online=0.5),
        offline=dict(first, storage=st, seed=1),
        online=dict(type='naive', storage=st, seed=2, **user),
    )
    buf.push(transitions(range(8), storage), member='offline')
    buf.push(transitions(range(100, 104), storage), member='online')  # 4 < 8: the refusing sampler refuses
    before = {n: buf.members[n].state_dict() for n in ('offline', 'online')}
    if part == 'refusing sampler':
        assert buf.sample(4) is None
    else:
        with pytest.raises(RuntimeError):
            buf.sample(4)
    if part == 'refusing sampler':  # a refusal is counted, by the member that refused and by the mixture
        before['online']['counters']['refused_sample'] += 1
        assert buf.stats()['refused_sample'] == 1
    for n in ('offline', 'online'):
        assert_same(buf.members[n].state_dict(), before[n], f'{n} after a failed mixture sample')
    assert buf.stats()['sample_calls'] == 0
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_why_not_sample_and_lock_make_a_question_and_a_sample_one_step(storage):
    """The contract's ``why_not_sample`` and ``lock`` on a mixture: the question draws nothing (the same sample
    follows as without it), names each refusing member, waits with a timeout, and ``lock`` holds every member."""
    kw = dict(n_off=20, n_on=3, weights={'offline': 1, 'online': 1}, online=dict(type='naive'))
    buf, twin = filled(storage, **kw), filled(storage, **kw)
    before = buf.state_dict()
    assert buf.why_not_sample(4) == ''
    assert_same(buf.state_dict(), before, 'state after why_not_sample')
    with buf.lock:
        assert buf.why_not_sample(4) == ''
        assert_same(buf.sample(4), twin.sample(4), 'the sample after the question')
    why = buf.why_not_sample(10)  # online holds 3 < 5
    assert why.startswith('online: ') and buf.stats()['refused_sample'] == 0
    with pytest.raises(SampleTimeoutError, match='online'):
        buf.why_not_sample(10, timeout=0.05)
    held = threading.Event()
    pushed = []

    def push():
        held.wait(5)
        pushed.append(buf.push(transitions(range(200, 202), storage), member='online'))

    t = threading.Thread(target=push)
    t.start()
    with buf.lock:  # every member's lock: a push into a member waits
        held.set()
        time.sleep(0.1)
        assert pushed == []
    t.join(10)
    assert pushed == [2]
    buf.close()


@pytest.mark.timeout(60)
def test_a_refused_load_racing_pushes_loses_no_pushed_item():
    """A load that a later member refuses puts the earlier members back; a push into one of them meanwhile
    waits for the load (every member's lock is held through it), so no item it stored is undone."""
    buf = mixture(online=dict(type='naive'))
    buf.push(transitions(range(3), 'list'), member='offline')
    bad = buf.state_dict()
    bad['members']['online'] = {'type': 'NaiveReplayBuffer', 'bogus': 1}
    stop, stored, errors = threading.Event(), [], []

    def pusher():
        i = 0
        while not stop.is_set():
            stored.append(buf.push({'obs': float(1000 + i)}, member='offline'))
            i += 1

    t = threading.Thread(target=pusher)
    t.start()
    try:
        for _ in range(30):
            try:
                buf.load_state_dict(bad)
            except ValueError as e:
                errors.append(e)
    finally:
        stop.set()
        t.join(30)
    assert len(errors) == 30 and sum(stored) > 0
    assert buf.members['offline'].stats()['push_items'] == 3 + sum(stored)
    buf.close()


def test_a_closed_mixture_refuses_clear_and_update():
    buf = filled(n_off=10, n_on=10, weights={'offline': 1, 'online': 1})
    assert buf.sample(4) is not None
    buf.close()
    before = buf.state_dict()
    with pytest.raises(RuntimeError, match='closed'):
        buf.clear()
    with pytest.raises(RuntimeError, match='closed'):
        buf.update({'replay_unique_id': ['mix_online_0'], 'replay_buffer_idx': [0], 'priority': [2.0]})
    assert_same(buf.state_dict(), before)


@pytest.mark.timeout(60)
def test_a_close_that_begins_during_an_update_waits_for_every_members_part():
    """An update under way when close() begins finishes whole: the close, started by a member's update (after that
    member applied its part, before the next member's), waits -- it never closes the next member in between."""
    both = dict(type='advanced', storage=dict(type='tensor'))
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5), offline=both, online=both)
    for member in ('offline', 'online'):
        buf.push([{'obs': torch.full((4,), float(i))} for i in range(20)], member=member)
    batch = buf.sample(8)
    info = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx', 'mixture_member')}
    info['priority'] = torch.full((8,), 5.0)
    first, own = buf.members['offline'], buf.members['offline'].update
    closer = threading.Thread(target=buf.close)

    def update_then_close(part):
        out = own(part)
        closer.start()
        closer.join(0.5)  # a close that is not held back ends here, closing the next member first
        return out

    first.update = update_then_close
    assert buf.update(info) == {'updated': 8, 'stale': 0}
    closer.join(30)
    assert not closer.is_alive()
    assert buf.stats()['offline.updated'] == 4 and buf.stats()['online.updated'] == 4
    with pytest.raises(RuntimeError, match='closed'):
        buf.update(info)


@pytest.mark.timeout(60)
def test_a_timeout_bounds_the_wait_for_a_members_lock():
    buf = filled(n_off=20, n_on=20, weights={'offline': 1, 'online': 1})
    answered = answer_while_held(buf.members['online'].lock, lambda: buf.sample(4, timeout=0.2))
    assert len(answered) == 1 and isinstance(answered[0], SampleTimeoutError), answered
    assert 'another call held a member' in str(answered[0])


@pytest.mark.parametrize('why', ['shape', 'dtype', 'nested'])
def test_members_whose_fields_cannot_join_are_refused_before_anyone_draws(why):
    """Members storing a shared field in other shapes, in dtypes torch cannot join (uint32 beside int64), or as
    rows in one and a dict of fields in the other, fail the sample naming the field -- before any member draws (with
    max_use=1 the failed samples removed items) and with the mixture's own RNG as it was (an odd size draws which
    member takes the remainder)."""
    offline = dict(type='naive', max_use=1)
    buf = mixture('tensor', weights=dict(offline=0.5, online=0.5), offline=offline, online=dict(type='naive'))
    other = {'shape': torch.zeros(3), 'dtype': torch.zeros(4), 'nested': {'a': torch.zeros(4)}}[why]
    act = torch.tensor(1, dtype=torch.uint32 if why == 'dtype' else torch.int64)
    buf.push([{'obs': torch.zeros(4), 'act': torch.tensor(1)} for _ in range(6)], member='offline')
    buf.push([{'obs': other, 'act': act} for _ in range(6)], member='online')
    before = buf.state_dict()
    for size in (4, 3, 3):
        with pytest.raises(ValueError, match="field '(obs|act)' as"):
            buf.sample(size)
    assert_same(buf.state_dict(), before)
    assert buf.members['offline'].count() == 6
    buf.close()


def test_a_state_whose_member_holds_items_that_are_no_dicts_is_refused_at_load(tmp_path):
    """The door the push refuses, through a load (or a file): refused naming the member, nothing changed; an item
    pushed into a member itself fails the sample naming the member."""
    buf = mixture('list', weights=dict(offline=0.5, online=0.5))
    buf.push(transitions(range(4), 'list'), member='offline')
    buf.push(transitions(range(4), 'list'))
    state = buf.state_dict()
    plain = create_buffer(dict(type='naive', replay_buffer_size=1000, seed=1))
    plain.push([1, 2, 3])
    bad = dict(state, members=dict(state['members'], offline=plain.state_dict()))
    before = buf.state_dict()
    with pytest.raises(ValueError, match="member 'offline' holds item 0 of type int"):
        buf.load_state_dict(bad)
    assert_same(buf.state_dict(), before)
    buf.members['offline'].push(7)  # the member's own push: a naive buffer takes any object
    with pytest.raises(TypeError, match="member 'offline' holds a int item"):
        for _ in range(20):
            buf.sample(8)


def _frame_step(t):
    def frame(k):
        return torch.full((2, 2), k % 250, dtype=torch.uint8)

    return dict(
        obs=torch.stack([frame(t), frame(t + 1)]), next_obs=torch.stack([frame(t + 1), frame(t + 2)]), reward=1.0
    )


def _frames_member(seed, **frames):
    storage = dict(type='tensor', frames=frames) if frames else dict(type='tensor')
    return dict(type='naive', replay_buffer_size=16, seed=seed, storage=storage)


@pytest.mark.parametrize(
    'b',
    [dict(n_step=1), dict(), dict(n_step=2, gamma=0.5)],
    ids=['one-step frames', 'no frames', 'another n_step'],
)
def test_members_summing_rewards_over_different_n_steps_are_refused(b):
    """A joined batch would hold n-step returns beside one-step rewards with no field telling them apart."""
    members = dict(a=_frames_member(1, n_step=3, gamma=0.5), b=_frames_member(2, **b))
    with pytest.raises(ValueError, match=r"'members.<name>.storage.frames.n_step' .* got \{'a': 3, 'b': [12]\}"):
        create_buffer(dict(type='mixture', seed=0, members=members))


def test_members_of_one_n_step_join_their_returns_and_discounts():
    members = dict(a=_frames_member(1, n_step=3, gamma=0.5), b=_frames_member(2, n_step=3, gamma=0.9))
    mix = create_buffer(dict(type='mixture', seed=0, weights=dict(a=1, b=1), members=members))
    for name, base in (('a', 0), ('b', 100)):
        mix.push([_frame_step(base + t) for t in range(10)], member=name)
    out = mix.sample(8)
    gamma = {0: 0.5, 1: 0.9}
    for k, member in enumerate(out['mixture_member'].tolist()):
        g = gamma[member]
        n = out['n_step'][k].item()  # 3, or fewer for the newest steps (their later steps are not pushed yet)
        assert 1 <= n <= 3
        assert out['n_step_discount'][k].item() == pytest.approx(g**n)
        assert out['reward'][k].item() == pytest.approx(sum(g**i for i in range(n)))
        assert out['next_obs'][k, -1, 0, 0].item() - out['obs'][k, -1, 0, 0].item() == n
    assert 3 in out['n_step'].tolist() and set(out['mixture_member'].tolist()) == {0, 1}
    mix.close()

"""DI-engine parity: the ``elastic``, ``sequence`` and ``deque`` types, DI-engine's ignored keys, ``ding.*``
``import_names``, ``load_state_dict(deepcopy=)``, the segment trees in ``ding_buffer.utils``, and serial-pipeline
rounds on compiled dizoo sections (``tests/data/dizoo_compiled.json``, written by ``benchmarks/dizoo_sweep.py``).
Everything through the public API."""

import collections
import json
import logging
import os

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, TESTS_DIR, FakeTB, assert_same

from ding_buffer import create_buffer
from ding_buffer.utils import MinSegmentTree, SegmentTree, SumSegmentTree, deep_merge_dicts

DATA = str(TESTS_DIR / 'data')


def items(n, start=0):
    return [{'i': start + k, 'obs': np.float32([start + k])} for k in range(n)]


def numbers(batch):
    return [d['i'] for d in batch]


# ================================================================================ elastic
def test_elastic_samples_only_the_newest_window_and_keeps_the_rest():
    buf = create_buffer(dict(type='elastic', replay_buffer_size=100, seed=0, set_buffer_size=lambda s: 5 + s // 10))
    buf.push(items(50))
    assert buf.current_buffer_size == 5  # DI-engine asks for the size at envstep 0
    seen = collections.Counter(i for _ in range(200) for i in numbers(buf.sample(3, 0)))
    assert set(seen) == set(range(45, 50))  # every item of the window, nothing older
    assert buf.update(100) is None and buf.current_buffer_size == 15
    seen = collections.Counter(i for _ in range(300) for i in numbers(buf.sample(5, 0)))
    assert set(seen) == set(range(35, 50))
    assert buf.sample(16, 0) is None  # 15 candidates, no replacement
    buf.resize(2)
    assert buf.count() == 50  # shrinking keeps every stored item ...
    assert sorted(numbers(buf.sample(2, 0))) == [48, 49]
    buf.resize(50)  # ... so growing brings the older ones back
    assert sorted(numbers(buf.sample(50, 0))) == list(range(50))


def test_elastic_sample_range_selects_within_the_window_and_push_evicts_fifo():
    buf = create_buffer(dict(type='elastic', replay_buffer_size=20, seed=1))
    buf.push(items(30))  # ring keeps 10..29
    buf.resize(8)  # window: 22..29
    got = {i for _ in range(100) for i in numbers(buf.sample(2, 0, sample_range=slice(0, 3)))}
    assert got == {22, 23, 24}
    assert buf.sample(1, 0, sample_range=slice(10, None)) is None


def test_elastic_bad_sizes_raise_naming_the_problem():
    # (bad sizes from set_buffer_size are refused, changing nothing: tests/buffers/test_contract.py)
    sizes = {'n': 4}
    buf = create_buffer(dict(type='elastic', replay_buffer_size=10, seed=0, set_buffer_size=lambda s: sizes['n']))
    buf.push(items(6))
    before = buf.state_dict()
    for bad in (0, 1.5, '3'):
        with pytest.raises(ValueError, match=r'size must be an int in \[1, 2\*\*60\)'):
            buf.resize(bad)
    sizes['n'] = 6.0  # an integral float (a scheduler multiplying sizes) is a size
    buf.update(8)
    assert buf.current_buffer_size == 6 and type(buf.current_buffer_size) is int
    buf.resize(4)
    with pytest.raises(TypeError, match='envstep'):
        buf.update('7')
    assert buf.update({'priority': [1.0], 'replay_buffer_idx': [0], 'replay_unique_id': ['buffer_0']}) == {
        'updated': 0,
        'stale': 0,
    }  # a learner's priority_info: the naive no-op
    assert_same(buf.state_dict(), before)
    with pytest.raises(ValueError, match="config key 'set_buffer_size'"):
        create_buffer(dict(type='elastic', set_buffer_size=5))
    plain = create_buffer(dict(type='elastic', replay_buffer_size=10))
    with pytest.raises(ValueError, match='needs config key .set_buffer_size.'):
        plain.update(3)


def test_elastic_state_round_trip_keeps_the_window_and_the_next_samples(tmp_path):
    buf = create_buffer(dict(type='elastic', replay_buffer_size=30, seed=3))
    buf.push(items(40))
    buf.resize(7)
    path = str(tmp_path / 'elastic.pt')
    buf.save_data(path)
    other = create_buffer(dict(type='elastic', replay_buffer_size=30, seed=99))
    other.load_data(path, allow_pickle=True)
    assert other.current_buffer_size == 7
    assert [numbers(buf.sample(3, 0)) for _ in range(5)] == [numbers(other.sample(3, 0)) for _ in range(5)]
    bad = buf.state_dict()
    bad['current_buffer_size'] = 0
    with pytest.raises(ValueError, match='current_buffer_size'):  # (all or nothing: test_contract.py)
        other.load_state_dict(bad)


def test_elastic_scheduler_is_the_callers_own_callable_not_a_copy():

    class WorldModel:  # DI-engine's MBPO sets set_buffer_size = world_model.buffer_size_scheduler
        def __init__(self):
            self.calls = []

        def buffer_size_scheduler(self, envstep):
            self.calls.append(envstep)
            return 10 + envstep

    model = WorldModel()
    buf = create_buffer(dict(type='elastic', replay_buffer_size=100, set_buffer_size=model.buffer_size_scheduler))
    buf.update(5)
    assert model.calls == [0, 5] and buf.current_buffer_size == 15


# ================================================================================ sequence
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_sequence_runs_are_consecutive_and_within_the_stored_items(storage):
    buf = create_buffer(dict(type='sequence', replay_buffer_size=20, seed=0, storage=dict(type=storage)))
    for k in range(30):  # the ring wraps: it keeps 10..29
        buf.push({'i': k, 'obs': np.float32([k])})
    for _ in range(50):
        runs = buf.sample(4, 5, 0)
        if storage == 'list':
            runs = [[d['i'] for d in run] for run in runs]
        else:
            assert runs['obs'].shape == (4, 5, 1) and runs['replay_unique_id'].shape == (4, 5)
            runs = runs['i'].tolist()
        assert len(runs) == 4
        for run in runs:
            assert run == list(range(run[0], run[0] + 5)) and 10 <= run[0] <= 25


def test_sequence_starts_are_uniform_and_distinct_without_replacement():
    buf = create_buffer(dict(type='sequence', replay_buffer_size=64, seed=1))
    buf.push(items(12))  # starts 0..8 for runs of 4
    counts = collections.Counter()
    for _ in range(3000):
        starts = [run[0]['i'] for run in buf.sample(3, 4, 0)]
        assert len(set(starts)) == 3
        counts.update(starts)
    assert set(counts) == set(range(9))
    expected = 3000 * 3 / 9
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 26.1  # 8 degrees of freedom, p = 0.001


def test_sequence_shortfalls_ranges_and_bad_arguments():
    buf = create_buffer(dict(type='sequence', replay_buffer_size=50, seed=2))
    assert buf.sample(1, 3, 0) is None  # empty
    buf.push(items(10))
    assert buf.sample(1, 11, 0) is None  # fewer items than one run
    assert buf.sample(9, 3, 0) is None  # 8 starts < 9 runs without replacement
    assert len(buf.sample(9, 3, 0, replace=True)) == 9
    runs = [buf.sample(2, 3, 0, sample_range=slice(-4, None)) for _ in range(20)]
    assert {run[0]['i'] for batch in runs for run in batch} <= {6, 7}
    before = buf.state_dict()
    for args, kwargs, exc in [
        ((2, 0, 0), {}, ValueError),
        ((2, 'x', 0), {}, ValueError),
        ((0, 2, 0), {}, ValueError),
        ((2, 2, 0), dict(sample_range=slice(0, 8, 2)), ValueError),
        ((2, 2, 0), dict(replace=1), TypeError),
        ((2, 2, 0), dict(sample_range=3), TypeError),
    ]:
        with pytest.raises(exc):
            buf.sample(*args, **kwargs)
        assert_same(buf.state_dict(), before)


def test_sequence_counts_every_item_of_a_run_for_max_use():
    buf = create_buffer(dict(type='sequence', replay_buffer_size=50, seed=4, max_use=1))
    buf.push(items(8))
    drawn = {d['i'] for d in buf.sample(1, 3, 0)[0]}
    assert buf.count() == 5 and buf.stats()['removed_by_use'] == 3
    left = {run[0]['i'] for run in buf.sample(5, 1, 0)}  # runs of 1: the items that are left
    assert left == set(range(8)) - drawn


# ================================================================================ deque
def test_deque_uniform_returns_the_stored_dicts_without_replacement_and_max_use_removes():
    buf = create_buffer(dict(type='deque', replay_buffer_size=10, max_use=2, seed=0))
    pushed = items(6)
    buf.push(pushed)
    batch = buf.sample(6, 0)
    assert sorted(numbers(batch)) == list(range(6))  # no replacement
    assert all(any(d is p for p in pushed) for d in batch)  # the stored objects, as DI-engine returns them
    assert buf.sample(7, 0) is None  # fewer items than the batch
    buf.sample(6, 1)
    assert buf.count() == 0  # every item was drawn twice: max_use removed it


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('priority', [False, True])
def test_deque_pushes_a_tuple_as_its_items_as_dingengines_deque_iterates_it(priority, storage):
    """DI-engine's DequeBufferWrapper pushes ``for d in data``: a tuple of 3 transitions is 3 items (it was one
    tuple item here, or a TypeError with priority)."""
    cfg = dict(type='deque', replay_buffer_size=10, priority=priority, seed=0, storage=dict(type=storage))
    by_tuple, by_list = create_buffer(cfg), create_buffer(cfg)
    pushed = [{'obs': float(i), 'priority': float(i + 1)} for i in range(3)]
    assert by_tuple.push(tuple(pushed)) == by_list.push(list(pushed)) == 3
    assert by_tuple.push(()) == 0 and by_tuple.count() == 3
    assert_same(by_tuple.sample(3, 0), by_list.sample(3, 0))
    assert_same(by_tuple.state_dict(), by_list.state_dict())


@pytest.mark.parametrize('priority', [False, True])
def test_deque_with_max_use_keeps_what_dingengines_deque_keeps(priority):
    """DI-engine's DequeBuffer is a deque(maxlen=size): an item spent by use_time_check leaves it, so the next push
    fills its place instead of dropping the oldest live item. A reference deque runs beside the buffer, fed the
    items each sample drew."""
    import collections

    rng = np.random.default_rng(3)
    buf = create_buffer(dict(type='deque', replay_buffer_size=5, max_use=2, priority=priority, seed=1))
    ref, uses, nxt = collections.deque(maxlen=5), {}, 0
    for _ in range(300):
        if rng.random() < 0.5 or not ref:
            k = int(rng.integers(1, 4))
            buf.push([{'x': nxt + i} for i in range(k)], 0)
            for i in range(k):
                ref.append(nxt + i)
                uses[nxt + i] = 0
            nxt += k
        else:
            got = buf.sample(int(rng.integers(1, len(ref) + 1)) if not priority else 1, 0)
            for item in got or []:
                assert item['x'] in ref
                uses[item['x']] += 1
                if uses[item['x']] == 2:
                    ref.remove(item['x'])
        assert buf.count() == len(ref)


def test_deque_prioritized_distribution_follows_priority_power():
    buf = create_buffer(dict(type='deque', replay_buffer_size=16, priority=True, priority_power_factor=1.0, seed=5))
    pushed = [{'i': k, 'priority': p} for k, p in enumerate([1.0, 2.0, 4.0])]
    buf.push(pushed)
    assert pushed[0] == {'i': 0, 'priority': 1.0}  # not mutated (DI-engine pops 'priority')
    counts = collections.Counter()
    for _ in range(2000):
        batch = buf.sample(3, 0)
        assert all(set(d) == {'i'} for d in batch)  # the pushed data: no priority, no buffer keys
        counts.update(numbers(batch))
    total = sum(counts.values())
    for k, p in enumerate([1, 2, 4]):
        assert abs(counts[k] / total - p / 7) < 0.02


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_prioritized_deque_draws_a_full_batch_once_anything_is_stored_as_dingengines(storage):
    """DI-engine's prioritized deque draws its batch by index with replacement, so a pipeline trains from its first
    collect; its uniform deque returns None while fewer than ``size`` items are stored. A ratio the user sets is
    waited for either way."""
    cfg = dict(type='deque', replay_buffer_size=100, priority=True, priority_power_factor=1.0, seed=3)
    cfg['storage'] = dict(type=storage)
    buf = create_buffer(cfg)
    assert buf.sample(4, 0) is None  # nothing stored
    buf.push([{'i': torch.tensor(k), 'priority': p} for k, p in enumerate([1.0, 3.0])])
    counts = collections.Counter()
    for _ in range(300):
        batch = buf.sample(8, 0)
        ids = batch['i'].tolist() if storage == 'tensor' else [int(d['i']) for d in batch]
        assert len(ids) == 8
        counts.update(ids)
    assert abs(counts[1] / sum(counts.values()) - 0.75) < 0.03  # priorities 1 : 3, with replacement
    uniform = create_buffer(dict(cfg, priority=False))
    uniform.push([{'i': torch.tensor(k)} for k in range(2)])
    assert uniform.sample(8, 0) is None
    waits = create_buffer(dict(cfg, thruput_controller=dict(sample_min_limit_ratio=1.0)))
    waits.push([{'i': torch.tensor(k)} for k in range(2)])
    assert waits.sample(8, 0) is None and waits.sample(2, 0) is not None
    for bad in ('2', [2], True, 0.5):
        with pytest.raises(ValueError, match="'thruput_controller.sample_min_limit_ratio' has invalid value"):
            create_buffer(dict(cfg, thruput_controller=dict(sample_min_limit_ratio=bad)))
    # the config DI-engine's compile_config makes (the class defaults merged in), and the buffer's own: the same rule
    for again in (deep_merge_dicts(type(buf).default_config(), cfg), dict(buf.cfg)):
        other = create_buffer(again)
        other.push([{'i': torch.tensor(0)}])
        assert other.sample(8, 0) is not None


def test_deque_is_weights_anneal_and_match_the_priorities():
    buf = create_buffer(
        dict(
            type='deque',
            replay_buffer_size=16,
            priority=True,
            priority_IS_weight=True,
            priority_power_factor=1.0,
            IS_weight_power_factor=0.5,
            IS_weight_anneal_train_iter=10,
            seed=0,
        )
    )
    buf.push([{'i': k, 'priority': p} for k, p in enumerate([1.0, 4.0])])
    beta = 0.5
    for it in range(3):
        batch = buf.sample(2, it)
        for d in batch:
            p = [1.0, 4.0][d['i']]
            assert d['IS'] == pytest.approx((p / 1.0) ** -beta, rel=1e-4)
        beta = min(1.0, beta + 0.5 / 10)
    plain = create_buffer(dict(type='deque', priority=True, seed=0))
    plain.push([{'i': 0, 'priority': 2.0}])
    assert plain.sample(1, 0) == [{'i': 0}]  # no IS weight without priority_IS_weight


@pytest.mark.parametrize('weights', [False, True])
@pytest.mark.parametrize('output', [None, 'items'])
def test_deque_returns_the_users_fields_named_as_the_inner_tables_annotations(weights, output):
    """DI-engine's DequeBufferWrapper returns the pushed data (only 'priority' taken by the prioritized push, 'IS'
    set with priority_IS_weight): a prioritized deque dropped the user's 'use', 'staleness', 'IS' and id fields
    (the inner table's annotations had overwritten them in the drawn copies), as did a uniform one with
    output='items' its ids. The update of the last batch still finds its items."""
    user = {'obs': 1.0, 'use': 7, 'staleness': 3, 'replay_buffer_idx': 5, 'replay_unique_id': 'ep-17', 'IS': 0.5}
    for priority in (True, False):
        if output == 'items' and priority:
            continue
        cfg = dict(
            type='deque', priority=priority, priority_IS_weight=weights and priority, seed=0, replay_buffer_size=8
        )
        buf = create_buffer(dict(cfg, storage=dict(type='list', output=output)), instance_name='dq')
        buf.push([dict(user, priority=2.0), dict(user, obs=2.0)])
        batch = buf.sample(2, 0)
        for d in batch:
            want = {**user, 'obs': d['obs']} if priority else {**user, 'obs': d['obs'], 'priority': 2.0}
            if not priority and d['obs'] == 2.0:
                del want['priority']
            if priority and weights:  # the draw's weight, not the user's 0.5
                assert 0.5 < d['IS'] <= 1.0
                want['IS'] = d['IS']
            assert d == want, (priority, d)
        if priority:
            assert buf.update({'priority': [9.0, 9.0]}) == {'updated': 2, 'stale': 0}
            assert buf.inner.stats()['max_priority'] == 9.0 + 1e-5  # DI-engine's deque: the priority it stores


def test_deque_update_applies_to_every_last_batch_with_clipping():
    tb = FakeTB()
    buf = create_buffer(
        dict(
            type='deque', replay_buffer_size=32, priority=True, priority_max_limit=50.0, train_iter_per_log=100, seed=0
        ),
        tb_logger=tb,
    )
    buf.push([{'i': k} for k in range(20)])
    for it in range(1, 6):  # DI-engine remembers the batch only on logging iterations: here every time
        batch = buf.sample(4, it)
        assert buf.update({'priority': [1e6, 2.0, 3.0, 4.0]}) == {'updated': 4, 'stale': 0}
        assert buf.update({'priority': [1.0] * 4}) == {'updated': 0, 'stale': 0}  # the batch was used
        assert len(batch) == 4
    assert buf.stats()['max_priority'] == 50.0 + 1e-5  # clipped at priority_max_limit, then DI-engine's 1e-5


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_prioritized_deque_keeps_dingengines_running_max(storage):
    """DI-engine's deque (its PriorityExperienceReplay middleware) stores ``priority + 1e-5`` and raises its running
    max with that; the max here was the priority given, below the one stored, so a new item's default priority was
    lower than an equal one's (IS below 1.0 for equal priorities)."""
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, priority_IS_weight=True, seed=0))
    buf.push([{'i': 0.0}])
    buf.sample(1, 0)
    assert buf.update({'priority': [5.0]}) == {'updated': 1, 'stale': 0}
    buf.push([{'i': 1.0}])  # takes the running max
    assert buf.stats()['max_priority'] == 5.0 + 1e-5
    assert buf.stats()['priority_mass'] == pytest.approx(2 * (5.0 + 1e-5) ** 0.6, rel=1e-12)
    assert [d['IS'] for d in buf.sample(8, 1)] == [1.0] * 8
    fresh = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, seed=0))
    fresh.load_state_dict(buf.state_dict())  # the rule holds after a load
    fresh.sample(1, 0)
    fresh.update({'priority': [7.0]})
    assert fresh.stats()['max_priority'] == 7.0 + 1e-5


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_deque_update_after_clear_counts_the_batch_as_stale_and_bad_values_are_refused_without_a_batch(storage):
    """The last batch's items left with ``clear()``: an update of it counts its entries as stale (as ``advanced``
    counts ids of items that left). With no batch to apply to, priorities are still checked (NaN, negative)."""
    cfg = dict(type='deque', replay_buffer_size=8, priority=True, seed=0, storage=dict(type=storage))
    buf = create_buffer(cfg)
    buf.push([{'i': float(k)} for k in range(8)])
    buf.sample(3, 0)
    buf.clear()
    buf.push([{'i': float(10 + k)} for k in range(8)])
    assert buf.update({'priority': [5.0, 5.0, 5.0]}) == {'updated': 0, 'stale': 3}
    assert buf.stats()['stale_updates'] == 3 and buf.stats()['max_priority'] == 1.0
    fresh = create_buffer(cfg)
    fresh.push([{'i': float(k)} for k in range(8)])
    before = fresh.state_dict()
    for bad in ([float('nan'), 1.0], [-1.0, 1.0]):
        with pytest.raises(ValueError, match="'priority' must be finite"):
            fresh.update({'priority': bad})
    assert_same(fresh.state_dict(), before)


def test_deque_update_takes_a_dict_of_numpy_priorities():
    # (bad priorities are refused, changing nothing and keeping the batch: tests/buffers/test_contract.py)
    buf = create_buffer(dict(type='deque', replay_buffer_size=32, priority=True, seed=0))
    buf.push([{'i': k} for k in range(8)])
    buf.sample(4, 0)
    with pytest.raises(TypeError):
        buf.update([1.0, 2.0])
    assert buf.update({'priority': np.float32([1, 2, 3, 4])}) == {'updated': 4, 'stale': 0}
    buf.sample(4, 0)
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"one number an item, shape \[n\] or \[n, 1\]; got shape \[2, 2\]"):
        buf.update({'priority': np.ones((2, 2))})  # 4 numbers, but not one an item: refused, the batch kept
    assert_same(buf.state_dict(), before)
    assert buf.update({'priority': np.float32([[1], [2], [3], [4]])}) == {'updated': 4, 'stale': 0}  # a column
    buf.sample(4, 0)
    before = buf.state_dict()
    with pytest.raises(TypeError, match='entry 1 is bool True'):  # as advanced refuses it
        buf.update({'priority': [0.5, True, 0.5, 0.5]})
    assert_same(buf.state_dict(), before)
    bf16 = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)  # a mixed-precision learner's TD errors
    assert buf.update({'priority': bf16}) == {'updated': 4, 'stale': 0}


def test_deque_update_skips_items_that_left_since_the_sample():
    buf = create_buffer(dict(type='deque', replay_buffer_size=4, priority=True, seed=0))
    buf.push([{'i': k} for k in range(4)])
    buf.sample(4, 0)
    buf.push([{'i': 10 + k} for k in range(2)])  # overwrites two slots
    out = buf.update({'priority': [9.0, 9.0, 9.0, 9.0]})
    assert out['updated'] + out['stale'] == 4 and out['stale'] >= 1


def test_deque_max_use_with_priority_works():
    buf = create_buffer(dict(type='deque', replay_buffer_size=8, priority=True, max_use=1, seed=0))
    buf.push([{'i': k} for k in range(8)])
    buf.sample(4, 0)
    assert 4 <= buf.count() < 8  # DI-engine raises TypeError for max_use together with priority


def test_deque_tensorboard_tags_follow_train_iter_per_log():
    tb = FakeTB()
    buf = create_buffer(
        dict(type='deque', replay_buffer_size=64, priority=True, max_use=100, train_iter_per_log=10, seed=0),
        tb_logger=tb,
        instance_name='learner_buffer',
    )
    buf.push([{'i': k} for k in range(32)])
    for it in range(25):
        buf.sample(4, it)
    steps = sorted({step for _, _, step in tb.rows})
    assert steps == [0, 10, 20]
    assert tb.tags() == {
        f'learner_buffer_iter/{k}': 3 for k in ('use_count_avg', 'priority_avg', 'priority_max', 'buffer_data_count')
    }
    uniform = FakeTB()
    plain = create_buffer(dict(type='deque', seed=0), tb_logger=uniform)
    plain.push(items(8))
    plain.sample(2, 0)
    assert set(uniform.tags()) == {'buffer_iter/buffer_data_count'}


@pytest.mark.parametrize('priority', [False, True])
def test_deque_logged_at_a_negative_train_iter_loads_its_own_state(priority):
    """``sample`` takes any train_iter within +-2**60; the state it leaves (last logged iteration -5) loads back,
    into the deque and through ``inner``, and logging goes on from there."""
    tb = FakeTB()
    buf = create_buffer(dict(type='deque', priority=priority, train_iter_per_log=10, seed=0), tb_logger=tb)
    buf.push(items(6))
    buf.sample(2, -5)
    state = buf.state_dict()
    assert state['last_log_train_iter'] == -5
    twin = create_buffer(dict(type='deque', priority=priority, train_iter_per_log=10, seed=0), tb_logger=tb)
    twin.load_state_dict(state)
    assert_same(twin.state_dict(), state)
    buf.inner.load_state_dict(buf.inner.state_dict())
    assert_same(buf.state_dict(), state)
    tb.rows.clear()
    twin.sample(2, 4)  # 9 iterations after -5: not yet
    twin.sample(2, 5)
    assert {step for _, _, step in tb.rows} == {5}
    buf.close()
    twin.close()


def test_deque_state_round_trip_and_config_errors(tmp_path):
    buf = create_buffer(dict(type='deque', replay_buffer_size=16, priority=True, seed=7))
    buf.push([{'i': k, 'priority': float(k + 1)} for k in range(10)])
    buf.sample(3, 0)
    path = str(tmp_path / 'deque.pt')
    buf.save_data(path)
    other = create_buffer(dict(type='deque', replay_buffer_size=16, priority=True, seed=1))
    other.load_data(path, allow_pickle=True)
    assert [numbers(buf.sample(3, 1)) for _ in range(4)] == [numbers(other.sample(3, 1)) for _ in range(4)]
    bad = buf.state_dict()
    bad['last_log_train_iter'] = 'x'
    with pytest.raises(ValueError, match='last_log_train_iter'):  # (all or nothing: test_contract.py)
        other.load_state_dict(bad)
    with pytest.raises(ValueError, match="'priority_IS_weight'"):
        create_buffer(dict(type='deque', priority_IS_weight=True))
    with pytest.raises(ValueError, match="config key 'priority_max_limit'"):
        create_buffer(dict(type='deque', priority_max_limit=0))
    with pytest.raises(ValueError, match="config key 'max_use'"):
        create_buffer(dict(type='deque', max_use=0))


# ================================================================================ keys and import_names
IGNORED = dict(max_reuse=4, min_sample_ratio=1.5, sliced=True, multi_buffer=False, name='policy')


@pytest.mark.parametrize('buffer_type', ['naive', 'advanced', 'elastic', 'sequence', 'deque', 'episode'])
def test_keys_dingengine_ignores_warn_once_and_change_nothing(buffer_type, caplog):
    plain = create_buffer(dict(type=buffer_type, seed=0))
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        buf = create_buffer(dict(type=buffer_type, seed=0, **IGNORED))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key in IGNORED:
        lines = [m for m in warned if f"config key '{key}'" in m]
        assert len(lines) == 1 and 'no effect' in lines[0], warned
    assert not set(IGNORED) & set(buf.cfg)  # kept out of behaviour: not even in the config
    if buffer_type != 'episode':
        for b in (plain, buf):
            b.push(items(8))
        if buffer_type == 'sequence':
            assert numbers(buf.sample(2, 3, 0)[0]) == numbers(plain.sample(2, 3, 0)[0])
        else:
            assert numbers(buf.sample(4, 0)) == numbers(plain.sample(4, 0))
    assert_same(buf.state_dict(), plain.state_dict())


def test_keys_of_other_dingengine_types_warn_on_naive_and_misspellings_still_raise(caplog):
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        create_buffer(dict(type='naive', alpha=0.6, beta=0.4, monitor=dict(periodic_thruput=dict(seconds=60))))
    assert sum("no effect" in r.getMessage() for r in caplog.records) == 3
    with pytest.raises(ValueError, match=r"'replay_bufer_size'.*did you mean 'replay_buffer_size'"):
        create_buffer(dict(type='deque', replay_bufer_size=10))
    with pytest.raises(ValueError, match=r"'max_uses'.*did you mean 'max_use'"):
        create_buffer(dict(type='advanced', max_uses=2))
    with pytest.raises(ValueError) as e:
        create_buffer(dict(type='advanced', zzzqqq=1))
    assert 'did you mean' not in str(e.value) and 'valid keys' in str(e.value)  # nothing close: no guess
    with pytest.raises(ValueError, match="unknown config key 'storage.typo'"):
        create_buffer(dict(type='deque', storage=dict(typo=1)))


def test_dingengine_import_names_are_skipped_for_types_we_provide(caplog):
    with caplog.at_level(logging.INFO, logger='ding_buffer'):
        buf = create_buffer(dict(type='deque', import_names=['ding.data.buffer.deque_buffer_wrapper']))
    assert buf.count() == 0
    lines = [r.getMessage() for r in caplog.records if 'ding.data.buffer.deque_buffer_wrapper' in r.getMessage()]
    assert len(lines) == 1 and 'skipped' in lines[0]
    with pytest.raises(ValueError, match=r"unknown buffer type 'dequex'.*registered: .*deque"):
        create_buffer(dict(type='dequex', import_names=['ding.data.buffer.deque_buffer_wrapper']))
    with pytest.raises(ModuleNotFoundError):  # a module of the user's own is still imported for real
        create_buffer(dict(type='naive', import_names=['no_such_module_for_ding_buffer']))
    with pytest.raises(TypeError, match='import_names'):
        create_buffer(dict(type='naive', import_names=[3]))


# ================================================================================ DI-engine surface
def test_load_state_dict_deepcopy_true_copies_the_items():
    src = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    src.push([{'i': k, 'box': [k]} for k in range(4)])
    state = src.state_dict()
    shared = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    copied = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    shared.load_state_dict(state)
    copied.load_state_dict(state, deepcopy=True)
    a = {d['i']: d for d in shared.sample(4, 0)}
    b = {d['i']: d for d in copied.sample(4, 0)}
    for k in range(4):
        assert a[k] == b[k] and a[k] is not b[k]
        a[k]['box'].append('changed')
        assert b[k]['box'] == [k]  # the deep copy is independent of what the other buffer shares
    with pytest.raises(TypeError, match='deepcopy'):
        copied.load_state_dict(state, deepcopy='yes')


def test_segment_trees_are_exported_from_utils_with_dingengine_semantics():
    tree = SumSegmentTree(8)
    for i, v in enumerate([0, 0.1, 0.5, 0, 0, 0.2, 0.8, 0]):
        tree[i] = v
    assert [tree.find_prefixsum_idx(x) for x in (0, 0.09, 0.1, 0.59, 0.6, 0.799, 0.8)] == [1, 1, 2, 2, 5, 5, 6]
    assert tree.reduce() == pytest.approx(1.6) and tree.reduce(1, 3) == pytest.approx(0.6)
    low = MinSegmentTree(4)
    low[2] = 3.0
    low[1] = 5.0
    assert low.reduce() == 3.0 and issubclass(SumSegmentTree, SegmentTree)


# ================================================================================ serial-pipeline rounds
with open(os.path.join(DATA, 'dizoo_compiled.json')) as f:
    COMPILED = json.load(f)


@pytest.mark.parametrize('name', sorted(COMPILED))
def test_serial_pipeline_round_on_compiled_dizoo_sections(name):
    """What DI-engine's serial pipeline does with a compiled section: create_buffer(section, tb_logger=...,
    exp_name=...), push collected transitions with cur_collector_envstep, sample(batch, learner.train_iter), and
    update(learner.priority_info) -- built from the sampled list of dicts as BaseLearner builds it."""
    section = COMPILED[name]['section']
    rng = np.random.default_rng(0)
    np.random.seed(0)
    tb = FakeTB()
    buf = create_buffer(section, tb_logger=tb, exp_name='serial', instance_name='buffer')
    envstep, updated = 0, 0
    for train_iter in range(30):
        data = [
            {
                'obs': rng.standard_normal(4).astype(np.float32),
                'action': int(rng.integers(2)),
                'reward': float(rng.standard_normal()),
                'done': bool(rng.random() < 0.05),
                'collect_iter': train_iter,
            }
            for _ in range(16)
        ]
        envstep += len(data)
        buf.push(data, cur_collector_envstep=envstep)
        batch = buf.sample(32, train_iter)
        if batch is None:
            assert buf.count() < 32
            continue
        assert isinstance(batch, list) and len(batch) == 32 and all('obs' in d for d in batch)
        priority = np.abs(rng.standard_normal(32)).tolist()
        priority_info = {
            'priority': priority,
            'replay_buffer_idx': [d.get('replay_buffer_idx') for d in batch],
            'replay_unique_id': [d.get('replay_unique_id') for d in batch],
        }
        result = buf.update(priority_info)
        updated += (result or {}).get('updated', 0)
    assert buf.count() == min(30 * 16, section['replay_buffer_size'])
    prioritized = section['type'] == 'advanced' or section.get('priority')
    assert (updated > 0) == bool(prioritized)
    buf.close()


# ================================================================================ the sweep itself
@pytest.mark.slow
def test_dizoo_sweep_builds_every_compiled_section():
    import importlib.util

    spec = importlib.util.spec_from_file_location('dizoo_sweep', str(REPO_ROOT / 'benchmarks' / 'dizoo_sweep.py'))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    result = sweep.run_sweep()
    if result is None:
        pytest.skip(
            'DI-engine source is not installed (pip install --no-deps di-engine==0.5.3): the sweep needs '
            'its dizoo/ configs'
        )
    assert result['total'] >= 300, result
    assert result['failed'] == {}, result['failed']
    assert result['built'] == result['total']
    assert set(result['served']) <= {'served', 'skipped'}, result['served']
    assert set(result['warned']) <= {
        'max_reuse',
        'min_sample_ratio',
        'sliced',
        'multi_buffer',
        'name',
        'alpha',
        'beta',
        'anneal_step',
        'monitor',
        'priority',
        'priority_IS_weight',
    }, result['warned']


# ================================================================================ found by review
def test_sequence_runs_never_jump_over_items_that_max_use_removed():
    for storage in ('list', 'tensor'):
        buf = create_buffer(dict(type='sequence', replay_buffer_size=10, seed=0, max_use=1, storage=dict(type=storage)))
        for k in range(10):
            buf.push({'i': k})
        while True:
            runs = buf.sample(1, 3, 0)
            if runs is None:
                break
            got = [d['i'] for d in runs[0]] if storage == 'list' else runs['i'][0].tolist()
            assert got == list(range(got[0], got[0] + 3)), got  # consecutive pushes only
        assert buf.count() >= 0 and buf.sample(1, 3, 0, replace=True) is None


def test_types_that_a_trainer_or_manager_cannot_serve_are_refused_at_build():
    from ding_buffer.train.config import build_train_config

    with pytest.raises(ValueError, match="'sequence'.*DQN trainer cannot use"):
        build_train_config(
            dict(
                policy=dict(
                    learn=dict(batch_size=32), other=dict(replay_buffer=dict(type='sequence', replay_buffer_size=64))
                )
            )
        )
    for buffer_type in ('deque', 'sequence'):
        with pytest.raises(ValueError, match=f"config key 'distributed' is set on type '{buffer_type}'"):
            create_buffer(dict(type=buffer_type, distributed=dict(backend='torch')))


def test_deque_state_keeps_the_batch_to_update_and_checks_it():
    def make(seed):
        return create_buffer(dict(type='deque', replay_buffer_size=16, priority=True, seed=seed))

    buf = make(0)
    buf.push([{'i': k} for k in range(8)])
    buf.sample(2, 0)
    other = make(5)
    other.load_state_dict(buf.state_dict())
    assert buf.update({'priority': [1e3, 1e3]}) == other.update({'priority': [1e3, 1e3]}) == {'updated': 2, 'stale': 0}
    assert [numbers(buf.sample(4, 1)) for _ in range(3)] == [numbers(other.sample(4, 1)) for _ in range(3)]
    buf.sample(2, 2)
    for bad in (
        {'ids': ['buffer_0'], 'slots': [99]},
        {'ids': ['a', 'b'], 'slots': [1]},
        [1, 2],
        {'ids': [1.5], 'slots': [0]},
        {'ids': [2**70], 'slots': [0]},  # ids no update can read (every later update raised)
        {'ids': ['buffer_' + '9' * 30], 'slots': [0]},
        {'ids': [-1], 'slots': [0]},
    ):
        state = buf.state_dict()
        state['last_batch'] = bad
        with pytest.raises(ValueError, match='last_batch'):  # (all or nothing: test_contract.py)
            other.load_state_dict(state)
    state = buf.state_dict()
    state['last_log_train_iter'] = 2**70
    with pytest.raises(ValueError, match='last_log_train_iter'):
        other.load_state_dict(state)


def test_deque_update_checks_priorities_even_with_nothing_to_update():
    buf = create_buffer(dict(type='deque', replay_buffer_size=16, priority=True, seed=0))
    for bad in ('garbage', ['1.5', '2'], [object()], [True, False], torch.tensor([True])):
        with pytest.raises(TypeError, match="'priority' must be real numbers"):
            buf.update({'priority': bad})
    plain = create_buffer(dict(type='deque', seed=0, storage=dict(type='tensor')))
    plain.push({'obs': torch.zeros(2), 'priority': torch.tensor(3.0)})
    assert set(plain.sample(1, 0)) == {'obs', 'priority'}  # a field of the user's, kept as on list storage
    with pytest.raises(ValueError, match="config key 'seed'"):
        create_buffer(dict(type='deque', seed=True))

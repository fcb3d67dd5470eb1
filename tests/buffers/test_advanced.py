"""Tests of ``AdvancedReplayBuffer`` (``type='advanced'``) on list and tensor storage.

Behaviour checked against DI-engine's AdvancedReplayBuffer (anchors/dingengine-buffers.md §5, §6, §8), except
where the spec marks DI-engine's behaviour as a bug (``sample_range`` over physical slots, mutation of pushed
dicts, silent filtering of bad items, revival of retired items). Sections:

1. push (ids, slots, default/explicit priorities, validation all-or-nothing, ``extend``, tensor fast path)
2. sample (IS weights, stratification, priority frequencies, beta annealing, refusals, staleness, use,
   ``sample_range`` in insertion order)
3. update (stale entries, eps, validation all-or-nothing)
4. eviction (max_use with and without used-data tracking, max_staleness)
5. throughput controller (DI-engine arithmetic, blocking sample, decay with a fake clock)
6. persistence (state_dict / save_data round trips, corrupted states)
7. concurrency (tree invariants after a threaded run)
8. config validation and DI-engine defaults
"""

import copy
import math
import queue
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from easydict import EasyDict
from helpers import assert_same, chi_square, chi_threshold, run_threads, subprocess_env, wait_until

from ding_buffer import AdvancedReplayBuffer, SampleTimeoutError, create_buffer, deep_merge_dicts

STORAGES = ['list', 'tensor']
NAME = 'demo'
EPS = 1e-5
ROW_KEYS = ('id', 'replay_buffer_idx', 'priority', 'IS', 'use', 'staleness')


# ---------------------------------------------------------------------------------------------- helpers
def make(storage='list', size=16, seed=0, name=NAME, **kw):
    cfg = dict(type='advanced', replay_buffer_size=size, seed=seed, storage=dict(type=storage), **kw)
    return create_buffer(cfg, instance_name=name)


def item(i, **extra):
    """An item both storages accept: an int id and a small float32 array derived from it."""
    d = {'id': i, 'obs': np.full(2, i, dtype=np.float32)}
    d.update(extra)
    return d


def push_ids(buf, ids, **extra):
    for i in ids:
        assert buf.push(item(i, **extra)) == 1


def rows(batch):
    """A sampled batch (list of dicts or dict of batched tensors) as a list of plain per-item dicts; the
    unique id becomes an int ``uid`` (list storage: checked to be ``f'{NAME}_{n}'``)."""
    if isinstance(batch, list):
        out = []
        for x in batch:
            r = {k: x[k] for k in ROW_KEYS if k in x}
            prefix, n = x['replay_unique_id'].rsplit('_', 1)
            assert prefix == NAME and n.isdigit(), x['replay_unique_id']
            r['uid'] = int(n)
            r['id'] = int(r['id'])
            out.append(r)
        return out
    assert batch['replay_unique_id'].dtype == torch.int64
    cols = {k: batch[k].tolist() for k in ROW_KEYS if k in batch}
    cols['uid'] = batch['replay_unique_id'].tolist()
    return [{k: v[i] for k, v in cols.items()} for i in range(len(cols['uid']))]


def col(batch, key):
    return [r[key] for r in rows(batch)]


def draw_at(buf, position, **kw):
    """The item at insertion ``position`` (0 = oldest), read through ``sample(1, sample_range=...)``."""
    batch = buf.sample(1, sample_range=slice(position, position + 1), **kw)
    assert batch is not None
    (r,) = rows(batch)
    return r


def index_view(buf):
    """uid -> {slot, priority, leaf, use} for every valid slot, read from the public ``state_dict``."""
    st = buf.state_dict()
    ring, idx = st['storage']['ring'], st['index']
    valid, uid = ring['valid'].numpy(), ring['uid'].numpy()
    return {
        int(uid[s]): dict(
            slot=int(s), priority=float(idx['priority'][s]), leaf=float(idx['leaves'][s]), use=int(idx['use'][s])
        )
        for s in np.flatnonzero(valid)
    }


def stored_ids(buf):
    """The 'id' field of every stored item in insertion order (from ``state_dict``)."""
    st = buf.state_dict()['storage']
    if st['kind'] == 'list':
        return [int(x['id']) for x in st['items']]
    if not st['schema']:
        return []
    names = ['.'.join(p) for p, _, _ in st['schema']]
    return st['fields'][names.index('id')].tolist()


def info_from(batch, priorities):
    """DI-engine's learner ``priority_info`` built from a sampled batch (tensor storage: the tensors as is)."""
    if isinstance(batch, list):
        return {
            'replay_unique_id': [x['replay_unique_id'] for x in batch],
            'replay_buffer_idx': [x['replay_buffer_idx'] for x in batch],
            'priority': list(priorities),
        }
    return {
        'replay_unique_id': batch['replay_unique_id'],
        'replay_buffer_idx': batch['replay_buffer_idx'],
        'priority': torch.as_tensor(priorities, dtype=torch.float32),
    }


def busy_buffer(storage, seed=0, **kw):
    """A buffer with a non-trivial state: wrap-around, explicit/default priorities, updates, uses, annealed
    beta, max_use removals (holes) and counters."""
    cfg = dict(max_use=3, anneal_step=20, alpha=0.7, beta=0.3)
    cfg.update(kw)
    buf = make(storage, size=16, seed=seed, **cfg)
    rng = np.random.default_rng(123)
    for i in range(30):
        extra = {'collect_iter': i}
        if i % 3:
            extra['priority'] = float(rng.uniform(0.1, 4.0))
        buf.push(item(i, **extra))
    for it in range(6):
        batch = buf.sample(4, cur_learner_iter=40 + it)
        buf.update(info_from(batch, rng.uniform(0.5, 6.0, size=4).astype(np.float32)))
    return buf


# An outer bound on waits that must end (a hang fails the test); never a speed requirement: a loaded machine passes.
GENEROUS = 30.0


# ================================================================================ 1. push
@pytest.mark.parametrize('storage', STORAGES)
def test_push_assigns_increasing_ids_and_slot_indices(storage):
    buf = make(storage, size=4)
    push_ids(buf, range(6))  # wraps around: ids 0, 1 are overwritten
    assert buf.count() == 4 and buf.push_count == 6
    got = sorted(rows(buf.sample(4)), key=lambda r: r['uid'])  # equal priorities, size == count: each once
    assert [r['uid'] for r in got] == [2, 3, 4, 5]
    assert [r['replay_buffer_idx'] for r in got] == [2, 3, 0, 1]  # the slot each item was written to
    assert [r['id'] for r in got] == [2, 3, 4, 5]
    assert buf.push([item(6), item(7)]) == 2
    assert sorted(col(buf.sample(4), 'uid')) == [4, 5, 6, 7]
    assert {u: v['slot'] for u, v in index_view(buf).items()} == {4: 0, 5: 1, 6: 2, 7: 3}


def test_list_storage_ids_are_instance_name_strings():
    buf = make('list', size=8, name='my_buf')
    push_ids(buf, range(3))
    batch = buf.sample(3)
    assert sorted(x['replay_unique_id'] for x in batch) == ['my_buf_0', 'my_buf_1', 'my_buf_2']
    assert all(x['replay_buffer_idx'] == int(x['replay_unique_id'][-1]) for x in batch)


def test_tensor_storage_ids_are_int64_tensors():
    buf = make('tensor', size=8)
    push_ids(buf, range(3))
    batch = buf.sample(3)
    assert batch['replay_unique_id'].dtype == torch.int64 and batch['replay_buffer_idx'].dtype == torch.int64
    assert sorted(batch['replay_unique_id'].tolist()) == [0, 1, 2]
    assert batch['priority'].dtype == torch.float32 and batch['IS'].dtype == torch.float32
    assert batch['use'].dtype == torch.int64 and batch['staleness'].dtype == torch.int64


@pytest.mark.parametrize('storage', STORAGES)
def test_missing_or_none_priority_gets_the_running_max(storage):
    buf = make(storage, size=16)
    buf.push(item(0))
    buf.push(item(1, priority=None))
    view = index_view(buf)
    assert view[0]['priority'] == view[1]['priority'] == 1.0
    assert buf.stats()['max_priority'] == 1.0
    # update raises the running max to the largest raw priority ever set (without eps)
    assert buf.update({'replay_unique_id': [f'{NAME}_0'], 'replay_buffer_idx': [0], 'priority': [5.0]}) == {
        'updated': 1,
        'stale': 0,
    }
    assert buf.stats()['max_priority'] == 5.0
    buf.push(item(2))
    assert index_view(buf)[2]['priority'] == 5.0
    # a smaller update does not lower it; explicit pushed priorities do not raise it (DI-engine)
    buf.update({'replay_unique_id': [f'{NAME}_2'], 'replay_buffer_idx': [2], 'priority': [2.0]})
    buf.push(item(3, priority=9.0))
    buf.push([item(4), item(5, priority=None)])
    view = index_view(buf)
    assert view[3]['priority'] == 9.0
    assert view[4]['priority'] == view[5]['priority'] == 5.0
    assert buf.stats()['max_priority'] == 5.0


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0])
@pytest.mark.parametrize('storage', STORAGES)
def test_explicit_priorities_are_stored_and_leaf_is_priority_pow_alpha(storage, alpha):
    buf = make(storage, size=8, alpha=alpha)
    prios = [0.5, 2.0, 3.0, 0.25, 7.0]
    buf.push([item(i, priority=p) for i, p in enumerate(prios[:3])])
    buf.push(item(3, priority=np.float32(prios[3])))
    buf.push(item(4, priority=torch.tensor(prios[4])))
    view = index_view(buf)
    for i, p in enumerate(prios):
        assert view[i]['priority'] == p
        assert view[i]['leaf'] == pytest.approx(p**alpha, rel=1e-12)
    st = buf.state_dict()['index']
    assert (st['leaves'][5:] == 0).all() and (st['priority'][5:] == 0).all()


@pytest.mark.parametrize('storage', STORAGES)
def test_pushed_and_stored_dicts_are_not_mutated(storage):
    buf = make(storage, size=8)
    d = item(0, priority=2.0)
    d_copy = copy.deepcopy(d)
    batch_items = [item(1), item(2, priority=3.0)]
    batch_copy = copy.deepcopy(batch_items)
    buf.push(d)
    buf.push(batch_items)
    batch = buf.sample(3, cur_learner_iter=5)
    buf.update(info_from(batch, [4.0, 4.0, 4.0]))
    buf.sample(3)
    for got, want in ((d, d_copy), *zip(batch_items, batch_copy)):
        assert set(got) == set(want)
        assert got['id'] == want['id'] and np.array_equal(got['obs'], want['obs'])
        assert got.get('priority') == want.get('priority')
    if storage == 'list':
        # the stored objects keep their keys; every sampled dict is a new dict
        for x in buf.sample(3):
            assert not any(x is y for y in (d, *batch_items))
        assert all('IS' not in y and 'replay_unique_id' not in y for y in (d, *batch_items))


def test_tensor_storage_schema_mismatch_names_the_field():
    buf = busy_buffer('tensor')  # (that the refusal changes nothing: tests/buffers/test_contract.py)
    with pytest.raises(ValueError, match='obs'):
        buf.push([item(50, collect_iter=1), {'id': 51, 'obs': np.zeros(3, np.float32), 'collect_iter': 1}])


def _batch(ids, **extra):
    ids = np.asarray(ids, dtype=np.int64)
    out = {'id': ids, 'obs': np.repeat(ids[:, None], 2, axis=1).astype(np.float32)}
    out.update(extra)
    return out


@pytest.mark.parametrize('storage', STORAGES)
def test_extend_with_and_without_priority(storage):
    buf = make(storage, size=16)
    assert buf.extend(_batch([0, 1, 2])) == 3
    assert buf.extend(_batch([3, 4, 5, 6], priority=np.array([0.5, 1.0, 2.0, 4.0]))) == 4
    assert buf.push(_batch([7], priority=torch.tensor([3.0])), batched=True) == 1
    assert buf.count() == 8 and buf.push_count == 8
    view = index_view(buf)
    assert [view[u]['priority'] for u in range(8)] == [1.0, 1.0, 1.0, 0.5, 1.0, 2.0, 4.0, 3.0]
    assert [view[u]['leaf'] for u in range(8)] == pytest.approx(
        [p**0.6 for p in [1.0, 1.0, 1.0, 0.5, 1.0, 2.0, 4.0, 3.0]], rel=1e-12
    )
    assert stored_ids(buf) == list(range(8))
    buf.extend(_batch([8, 9]))  # the next ids
    assert sorted(index_view(buf)) == list(range(10))


@pytest.mark.parametrize('via', ['extend', 'list'])
@pytest.mark.parametrize('storage', STORAGES)
def test_push_longer_than_capacity_keeps_the_newest_with_their_priorities(storage, via):
    buf = make(storage, size=4)
    if via == 'extend':
        assert buf.extend(_batch(range(6), priority=np.arange(1.0, 7.0))) == 6
    else:
        assert buf.push([item(i, priority=float(i + 1)) for i in range(6)]) == 6
    view = index_view(buf)
    assert sorted(view) == [2, 3, 4, 5] and stored_ids(buf) == [2, 3, 4, 5]
    assert [view[u]['priority'] for u in (2, 3, 4, 5)] == [3.0, 4.0, 5.0, 6.0]
    assert [view[u]['slot'] for u in (2, 3, 4, 5)] == [2, 3, 0, 1]  # id u lives at slot u % capacity
    stats = buf.stats()
    assert buf.push_count == 6 and stats['push_items'] == 6 and stats['remove_count'] == 2


@pytest.mark.parametrize('storage', STORAGES)
def test_max_priority_within_buffer_uses_the_max_stored_priority(storage):
    def run(within):
        buf = make(storage, size=4, max_priority_within_buffer=within)
        buf.push(item(0))
        buf.update({'replay_unique_id': [f'{NAME}_0'], 'replay_buffer_idx': [0], 'priority': [5.0]})
        buf.push([item(i, priority=2.0) for i in range(1, 3)])
        buf.push(item(3))  # id 0 (priority 5 + eps) is still stored
        buf.push([item(i, priority=2.0) for i in range(4, 6)])  # overwrites ids 0 and 1
        buf.push(item(6))
        return index_view(buf)

    running, within = run(False), run(True)
    # the max tree survives a state round trip
    a = make(storage, size=4, max_priority_within_buffer=True)
    a.push([item(0, priority=3.0), item(1, priority=0.5)])
    b = make(storage, size=4, max_priority_within_buffer=True)
    b.load_state_dict(a.state_dict())
    b.push(item(2))
    assert index_view(b)[2]['priority'] == pytest.approx(3.0, rel=1e-6)
    assert running[3]['priority'] == 5.0 and running[6]['priority'] == 5.0  # DI-engine: largest ever set
    assert within[3]['priority'] == pytest.approx(5.0 + EPS, rel=1e-6)  # TorchRL: largest one still stored
    assert within[6]['priority'] == pytest.approx(5.0 + EPS, rel=1e-6)  # id 3 is still stored
    # once the large ones are gone the default falls back to what is stored
    buf = make(storage, size=2, max_priority_within_buffer=True)
    buf.push(item(0, priority=9.0))
    buf.push([item(1, priority=3.0), item(2, priority=0.5)])  # id 0 overwritten
    buf.push(item(3))  # overwrites id 1; the max stored before that push is 3
    assert index_view(buf)[3]['priority'] == pytest.approx(3.0, rel=1e-6)
    buf.push(item(4, priority=0.25))  # stored: id 3 (3.0), id 4 (0.25)
    buf.push(item(5, priority=0.5))  # overwrites id 3
    buf.push(item(6))  # stored before: 0.25 and 0.5
    assert index_view(buf)[6]['priority'] == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize('alpha, given', [(0.9, 3.3e7), (0.95, 8.3e7), (0.6, 0.75)])
def test_the_max_stored_priority_does_not_creep_over_many_pushes(alpha, given):
    """Each push without a priority took ``max_leaf ** (1 / alpha)`` in float64 as its priority: its leaf rounded
    one way each time, so the default moved by a rounding per push, without limit (a sample's IS below 1.0 for
    items all reporting one priority)."""
    n = 3000
    buf = make('list', size=n + 1, max_priority_within_buffer=True, alpha=alpha, anneal_step=0)
    buf.push(item(0, priority=given))  # (a float32 value: stored as given)
    for i in range(1, n + 1):
        buf.push(item(i))
    buf.push([item(i) for i in range(n + 1, n + 5)])  # a list push takes it too (evicting 4)
    batch = buf.sample(256)
    assert {x['priority'] for x in batch} == {given}
    assert [x['IS'] for x in batch] == [1.0] * 256
    expected = (n + 1) * given**alpha
    assert buf.stats()['priority_mass'] == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize('plus_eps', [False, True])
def test_the_running_max_takes_the_priority_given_or_the_one_stored(plus_eps):
    """DI-engine's AdvancedReplayBuffer raises its max with the priority given; its PriorityExperienceReplay (deque,
    task buffers) with the one it stores, priority + eps."""
    buf = make('list', size=4, max_priority_plus_eps=plus_eps, eps=0.25)
    buf.push(item(0))
    out = buf.sample(1)
    buf.update({'replay_unique_id': [out[0]['replay_unique_id']], 'replay_buffer_idx': [0], 'priority': [2.0]})
    assert buf.stats()['max_priority'] == (2.25 if plus_eps else 2.0)
    buf.push(item(1))  # takes the running max
    assert index_view(buf)[0]['priority'] == 2.25  # stored: priority + eps either way
    assert index_view(buf)[1]['priority'] == (2.25 if plus_eps else 2.0)


def test_an_item_taking_the_max_stored_priority_weighs_as_the_top_item():
    """A top priority float32 cannot hold (0.1): the new item took float32(0.1), a leaf above the top one, so the
    two items reporting one priority had different IS weights."""
    buf = make('list', size=4, max_priority_within_buffer=True, anneal_step=0)
    buf.push(item(0, priority=0.1))
    buf.push(item(1))
    batch = [x for _ in range(10) for x in buf.sample(2)]
    assert len({x['priority'] for x in batch}) == 1 and {x['id'] for x in batch} == {0, 1}
    assert [x['IS'] for x in batch] == [1.0] * 20


@pytest.mark.parametrize('given', [1e-300, 1e-40])
def test_the_max_stored_priority_below_float32s_range_is_kept(given):
    """Rounded to float32, a top priority of 1e-300 made new items' priority 0 (never drawn)."""
    buf = make('list', size=8, max_priority_within_buffer=True)
    buf.push(item(0, priority=given))
    buf.push([item(1), item(2)])
    drawn = {x["id"] for _ in range(50) for x in buf.sample(3)}
    assert drawn == {0, 1, 2}
    assert buf.stats()['priority_mass'] == pytest.approx(3 * given**0.6, rel=1e-9)


@pytest.mark.parametrize('storage', STORAGES)
def test_sampled_items_can_be_pushed_back(storage):
    buf = make(storage, size=8)
    buf.push([item(i, priority=float(i + 1)) for i in range(4)])
    batch = buf.sample(4, cur_learner_iter=3)
    if storage == 'tensor':
        batch['priority'] = batch['priority'] * 2
        assert buf.extend(batch) == 4  # meta keys (ids, IS, use, staleness) are ignored, 'priority' is used
        got = col(batch, 'priority')
    else:
        for x in batch:
            x['priority'] *= 2
        assert buf.push(batch) == 4  # a list of sampled dicts: their 'priority' is used
        got = [x['priority'] for x in batch]
    view = index_view(buf)
    assert sorted(view) == list(range(8))
    assert [view[u]['priority'] for u in range(4, 8)] == got
    assert [view[u]['use'] for u in range(4, 8)] == [0, 0, 0, 0]


def test_list_storage_deepcopy_copies_on_push_and_on_sample():
    buf = make('list', size=8, deepcopy=True)
    d = item(0)
    buf.push(d)
    d['obs'][:] = 99  # the caller reuses its object
    (x,) = buf.sample(1)
    assert x['obs'].tolist() == [0.0, 0.0]
    x['obs'][:] = 7  # the learner mutates the sample
    assert buf.sample(1)[0]['obs'].tolist() == [0.0, 0.0]
    shallow = make('list', size=8)
    d = item(0)
    shallow.push(d)
    (x,) = shallow.sample(1)
    assert x is not d and x['obs'] is d['obs']  # deepcopy=False: a new dict around the stored leaves


# ---------------------------------------------------------------- tensor storage: single-push fast path
def _schema_item(**override):
    d = {
        'obs': np.zeros(3, np.float32),
        'act': 1,
        'rew': 0.5,
        'i32': np.int32(3),
        'done': False,
        'd64': np.float64(1.0),
    }
    d.update(override)
    return d


FAST_CASES = [
    # (name, item, takes the fast path)
    ('plain', _schema_item(act=7, rew=-1.5), True),
    ('tensor_leaf', _schema_item(obs=torch.arange(3, dtype=torch.float32)), True),
    ('noncontiguous_array', _schema_item(obs=np.arange(6, dtype=np.float32)[::2]), True),
    ('noncontiguous_tensor', _schema_item(obs=torch.arange(6, dtype=torch.float32)[::2]), True),
    ('requires_grad', _schema_item(obs=torch.ones(3, requires_grad=True)), True),
    ('numpy_scalars', _schema_item(act=np.int64(9), rew=np.float32(2.5), done=np.bool_(True)), True),
    ('zero_dim_array', _schema_item(act=np.array(11)), True),
    ('int_into_float32', _schema_item(rew=3), True),
    ('int_into_float64', _schema_item(d64=-4), True),
    ('int_2_24_plus_1_into_float32', _schema_item(rew=2**24 + 1), True),
    ('with_priority', _schema_item(priority=3.0), True),
    ('with_meta_keys', _schema_item(replay_unique_id=123, replay_buffer_idx=5, IS=0.3, use=2, staleness=1), True),
    ('int64_min', _schema_item(act=-(2**63)), True),
    ('float_overflowing_float32', _schema_item(rew=1e300), True),
    ('nested_dict', _schema_item(obs={'a': np.zeros(3, np.float32)}), False),
    ('wrong_dtype_array', _schema_item(obs=np.zeros(3, np.float64)), False),
    ('wrong_shape', _schema_item(obs=np.zeros((1, 3), np.float32)), False),
    ('float_into_int64', _schema_item(act=2.0), False),
    ('int_into_int32', _schema_item(i32=5), False),
    ('int_too_big_for_int32', _schema_item(i32=2**40), False),
    ('int_too_big_for_int64', _schema_item(act=2**70), False),
    ('float_into_float64', _schema_item(d64=2.5), False),
    ('bool_into_float32', _schema_item(rew=True), False),
    ('bool_into_int64', _schema_item(act=False), False),
    ('int_into_bool', _schema_item(done=1), False),
    ('np_float64_into_float32', _schema_item(rew=np.float64(0.5)), False),
    ('np_int32_into_int64', _schema_item(act=np.int32(1)), False),
    ('extra_key', _schema_item(extra=1.0), False),
    ('missing_key', {k: v for k, v in _schema_item().items() if k != 'rew'}, False),
    ('swapped_key', {**{k: v for k, v in _schema_item().items() if k != 'rew'}, 'rwd': 0.5}, False),
    ('string_leaf', _schema_item(act='x'), False),
    ('list_leaf', _schema_item(obs=[0.0, 0.0, 0.0]), False),
    ('dict_subclass', type('D', (dict,), {})(_schema_item()), False),
]


def _outcome(buf, it):
    try:
        return ('ok', buf.push(it))
    except Exception as e:  # the exact type and message must agree between the paths
        return (type(e).__name__, str(e))


def _fast_and_generic_buffers(size=4):
    fast = make('tensor', size=size)
    generic = make('tensor', size=size)
    generic.storage.write_one = lambda it: None  # every single push takes the generic path
    calls = []
    original = fast.storage.write_one

    def spy(it):
        slot = original(it)
        calls.append(slot is not None)
        return slot

    fast.storage.write_one = spy
    for b in (fast, generic):
        b.push(_schema_item())  # the first item defines the schema (generic path for both)
    calls.clear()
    return fast, generic, calls


@pytest.mark.parametrize('name,it,fast_path', FAST_CASES, ids=[c[0] for c in FAST_CASES])
def test_tensor_single_push_fast_path_matches_generic_path(name, it, fast_path):
    fast, generic, calls = _fast_and_generic_buffers()
    with np.errstate(over='ignore'):
        got_fast = _outcome(fast, copy.deepcopy(it) if name != 'requires_grad' else it)
        got_generic = _outcome(generic, copy.deepcopy(it) if name != 'requires_grad' else it)
    # an item the buffer already recognises as not plain (e.g. a dict subclass) never reaches write_one
    assert calls in ([fast_path], [] if not fast_path else None), 'the case does not exercise the intended path'
    assert got_fast == got_generic
    if fast_path:
        assert got_fast == ('ok', 1)
    assert_same(generic.state_dict(), fast.state_dict())
    assert fast.count() == generic.count() == (2 if got_fast[0] == 'ok' else 1)


def test_tensor_fast_path_wraps_around_like_the_generic_path():
    fast, generic, calls = _fast_and_generic_buffers(size=4)
    for i in range(9):
        it = _schema_item(act=i, rew=float(i), priority=None if i % 2 else float(i + 1))
        assert fast.push(copy.deepcopy(it)) == generic.push(copy.deepcopy(it)) == 1
    assert all(calls) and len(calls) == 9
    assert_same(generic.state_dict(), fast.state_dict())
    assert_same(fast.sample(4), generic.sample(4))


@pytest.mark.parametrize('dtype', ['bfloat16', 'float8_e4m3fn'])
def test_tensor_storage_stores_bfloat16_fields(dtype):
    dtype = getattr(torch, dtype)
    buf = make('tensor', size=4)
    before = buf.state_dict()
    try:
        buf.push({'x': torch.full((3,), 1.5).to(dtype), 'id': 0})
    except Exception:
        assert_same(before, buf.state_dict())  # a refused first push must leave no schema behind
        raise
    buf.push({'x': torch.full((3,), 2.0).to(dtype), 'id': 1})
    batch = buf.sample(2)
    assert batch['x'].dtype == dtype
    assert sorted(batch['x'].float()[:, 0].tolist()) == [1.5, 2.0]


@pytest.mark.parametrize(
    'field,value',
    [
        ('rew', 2**70),
        ('d64', 2**70),
        ('rew', -(2**63) - 1),
        ('rew', 2**200),
        # past 2**53 through a double first: rounded twice, one float32 step off the generic path's single rounding
        ('rew', 2**60 + 2**36 + 1),
        ('rew', -(2**60 + 2**36 + 1)),
        ('d64', 2**60 + 1),
    ],
    ids=[
        '2**70_into_float32',
        '2**70_into_float64',
        'below_int64_into_float32',
        '2**200_into_float32',
        'twice_rounded_into_float32',
        'negative_twice_rounded_into_float32',
        'inexact_into_float64',
    ],
)
def test_tensor_fast_path_huge_int_into_float_field_matches_generic_path(field, value):
    fast, generic, _ = _fast_and_generic_buffers()
    with np.errstate(over='ignore'):
        got_fast = _outcome(fast, _schema_item(**{field: value}))
        got_generic = _outcome(generic, _schema_item(**{field: value}))
    assert got_fast == got_generic
    assert_same(generic.state_dict(), fast.state_dict())


# ================================================================================ 2. sample
@pytest.mark.parametrize('storage', STORAGES)
def test_is_weights_follow_leaf_ratio_to_minus_beta(storage):
    alpha, beta = 0.7, 0.45
    buf = make(storage, size=16, alpha=alpha, beta=beta, anneal_step=0)
    prios = np.random.default_rng(3).uniform(0.05, 9.0, size=12)
    buf.push([item(i, priority=float(p)) for i, p in enumerate(prios)])
    leaf_min = (prios**alpha).min()
    for _ in range(5):
        for r in rows(buf.sample(12)):
            expected = ((prios[r['uid']] ** alpha) / leaf_min) ** (-beta)
            assert r['IS'] == pytest.approx(expected, rel=1e-6)
            assert r['priority'] == pytest.approx(prios[r['uid']], rel=1e-6)
            assert 0 < r['IS'] <= 1.0


@pytest.mark.parametrize('storage', STORAGES)
def test_equal_priorities_give_is_exactly_one(storage):
    buf = make(storage, size=16)
    buf.push([item(i, priority=2.5) for i in range(10)])
    for _ in range(3):
        assert col(buf.sample(7), 'IS') == [1.0] * 7


@pytest.mark.parametrize('storage', STORAGES)
def test_dingengine_is_probe(storage):
    buf = make(storage, size=8, alpha=0.6, beta=0.4, anneal_step=0)
    buf.push([item(i, priority=float(i + 1)) for i in range(4)])
    want = {0: 1.0, 1: 0.8467, 2: 0.7682, 3: 0.7170}
    for pos in range(4):
        r = draw_at(buf, pos)
        assert round(r['IS'], 4) == want[r['uid']]
    for r in rows(buf.sample(4)):
        assert round(r['IS'], 4) == want[r['uid']]


@pytest.mark.parametrize('n,pushed', [(1, 1), (5, 5), (16, 16), (16, 40), (7, 40)])
@pytest.mark.parametrize('storage', STORAGES)
def test_stratified_equal_priorities_return_every_item_once(storage, n, pushed):
    buf = make(storage, size=16)
    push_ids(buf, range(pushed))
    count = buf.count()
    for _ in range(5):
        if n == count:
            assert sorted(col(buf.sample(n), 'uid')) == list(range(pushed - count, pushed))
        else:  # n < count (full buffer, slot s holds one unit of mass): draw k lies in stratum k
            slots = col(buf.sample(n), 'replay_buffer_idx')
            for k, s in enumerate(slots):
                assert math.floor(k * count / n) <= s <= math.ceil((k + 1) * count / n) - 1, (k, slots)


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0])
@pytest.mark.parametrize('storage', STORAGES)
def test_sampling_frequencies_follow_priority_pow_alpha(storage, alpha):
    n_items, size, calls = 24, 16, 1500
    buf = make(storage, size=32, alpha=alpha, seed=7)
    prios = np.random.default_rng(11).uniform(0.1, 10.0, size=n_items)
    buf.push([item(i, priority=float(p)) for i, p in enumerate(prios)])
    counts = np.zeros(n_items)
    for _ in range(calls):
        counts += np.bincount(col(buf.sample(size), 'uid'), minlength=n_items)
    draws = size * calls
    p = prios**alpha / (prios**alpha).sum()
    df = n_items - 1
    assert chi_square(counts, draws * p) < chi_threshold(df)
    # the test has power: the frequencies are far from those of another exponent
    other = 1.0 if alpha < 1 else 0.5
    q = prios**other / (prios**other).sum()
    assert chi_square(counts, draws * q) > 10 * chi_threshold(df)


@pytest.mark.parametrize('storage', STORAGES)
def test_beta_anneals_once_per_sample_call_and_caps_at_one(storage):
    buf = make(storage, size=8, beta=0.4, anneal_step=10)
    buf.push([item(0, priority=1.0), item(1, priority=4.0)])
    leaf_ratio = 4.0**0.6
    b = buf.sample(2)
    assert buf.beta == pytest.approx(0.46)
    # IS uses the beta of *before* this call's annealing
    assert max(col(b, 'uid')) == 1 and min(col(b, 'IS')) == pytest.approx(leaf_ratio**-0.4, rel=1e-6)
    b = buf.sample(2)
    assert buf.beta == pytest.approx(0.52)  # DI-engine probe: 0.4 -> 0.52 after 2 calls with anneal_step=10
    assert min(col(b, 'IS')) == pytest.approx(leaf_ratio**-0.46, rel=1e-6)
    assert buf.sample(3) is None  # a refused call does not anneal
    assert buf.beta == pytest.approx(0.52)
    assert buf.sample(1, sample_range=slice(5, 9)) is None  # nor does an empty range
    assert buf.beta == pytest.approx(0.52)
    for _ in range(12):
        buf.sample(1)
    assert buf.beta == 1.0
    assert buf.stats()['beta'] == 1.0

    fixed = make(storage, size=8, beta=0.3, anneal_step=0)
    fixed.push(item(0))
    for _ in range(5):
        fixed.sample(1)
    assert fixed.beta == 0.3


@pytest.mark.parametrize('storage', STORAGES)
def test_stats_beta_is_the_current_beta(storage):
    """Not the beta of the last sampled batch (the sampled-data monitor's), which is from before annealing."""
    buf = make(storage, size=8, beta=0.4, anneal_step=10)
    push_ids(buf, range(4))
    buf.sample(2)
    assert buf.beta == pytest.approx(0.46)
    assert buf.stats()['beta'] == buf.beta
    other = make(storage, size=8, beta=0.4, anneal_step=10)
    push_ids(other, range(4))
    other.load_state_dict(buf.state_dict())
    assert other.stats()['beta'] == other.beta


@pytest.mark.parametrize('storage', STORAGES)
def test_beta_setter_validates(storage):
    buf = make(storage, size=8, anneal_step=0)
    buf.push([item(0, priority=1.0), item(1, priority=4.0)])
    buf.beta = 0.7
    assert buf.beta == 0.7
    assert min(col(buf.sample(2), 'IS')) == pytest.approx((4.0**0.6) ** -0.7, rel=1e-6)
    for bad in (1.5, -0.1, float('nan'), float('inf')):
        with pytest.raises(ValueError, match='beta'):
            buf.beta = bad
        assert buf.beta == 0.7
    buf.beta = 1
    assert buf.beta == 1.0 and isinstance(buf.beta, float)


@pytest.mark.parametrize('ratio,ok,refused', [(2, 5, 6), (1.5, 6, 7)])
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_refused_below_min_limit_ratio(storage, ratio, ok, refused):
    buf = make(storage, size=32, thruput_controller=dict(sample_min_limit_ratio=ratio))
    assert buf.sample(1) is None  # empty
    push_ids(buf, range(10))
    assert buf.sample(ok) is not None  # 10 / ok >= ratio
    assert buf.sample(refused) is None  # 10 / refused < ratio
    stats = buf.stats()
    assert stats['refused_sample'] == 2 and stats['sample_calls'] == 1 and stats['sampled_items'] == ok
    default = make(storage, size=8)
    push_ids(default, range(3))
    assert default.sample(4) is None and default.sample(3) is not None
    with pytest.raises(ValueError):
        default.sample(0)
    with pytest.raises(TypeError):
        default.sample(1.0)


def test_staleness_list_storage():
    buf = make('list', size=8)
    buf.push([item(0, collect_iter=3), item(1, collect_iter=[5, 2, 9]), item(2), item(3, collect_iter=(8, 4))])
    got = {r['uid']: r['staleness'] for r in rows(buf.sample(4, cur_learner_iter=10))}
    assert got == {0: 7, 1: 8, 2: -1, 3: 6}
    got = {r['uid']: r['staleness'] for r in rows(buf.sample(4))}  # cur_learner_iter defaults to -1
    assert got == {0: -4, 1: -3, 2: -1, 3: -5}


def test_staleness_tensor_storage():
    buf = make('tensor', size=8)
    buf.push([item(i, collect_iter=c) for i, c in enumerate([3, 0, 7])])
    got = {r['uid']: r['staleness'] for r in rows(buf.sample(3, cur_learner_iter=10))}
    assert got == {0: 7, 1: 10, 2: 3}
    seq = make('tensor', size=8)  # a sequence collect_iter: its min
    seq.push([item(i, collect_iter=np.array(c)) for i, c in enumerate([[5, 2], [1, 9]])])
    got = {r['uid']: r['staleness'] for r in rows(seq.sample(2, cur_learner_iter=10))}
    assert got == {0: 8, 1: 9}
    none = make('tensor', size=8)
    push_ids(none, range(3))
    assert col(none.sample(3, cur_learner_iter=10), 'staleness') == [-1, -1, -1]


@pytest.mark.parametrize('storage', STORAGES)
def test_use_counts_every_draw_including_duplicates(storage):
    buf = make(storage, size=8)
    buf.push([item(0, priority=0.0), item(1, priority=1.0)])  # priority 0: never drawn
    b = rows(buf.sample(2))
    assert [r['uid'] for r in b] == [1, 1]
    assert [r['use'] for r in b] == [1, 2]
    b = rows(buf.sample(2))
    assert [r['use'] for r in b] == [3, 4]
    assert [r['IS'] for r in b] == [1.0, 1.0]  # the zero leaf is ignored by the min tree
    view = index_view(buf)
    assert view[0]['use'] == 0 and view[1]['use'] == 4


SLICES = [
    slice(None, 5),
    slice(0, 5),
    slice(0, 1),
    slice(-4, None),
    slice(-1, None),
    slice(3, 9),
    slice(2, 11, 3),
    slice(None, None, 2),
    slice(None, None, -1),
    slice(9, 2, -2),
    slice(-100, None),
    slice(None, 100),
    slice(5, 5),
    slice(7, 3),
    slice(100, None),
    slice(-3, -6),
]


def _buffer_with_holes(storage, holes):
    """Capacity 16, 40 items pushed (wrap-around: ids 24..39 stored); with ``holes`` four items in the middle
    are removed by ``max_use=1`` and the state is moved into a buffer without max_use. Returns the buffer
    and the stored ids in insertion order."""
    src = make(storage, size=16, max_use=1 if holes else float('inf'))
    push_ids(src, range(40))
    order = list(range(24, 40))
    if holes:
        for victim in (26, 31, 32, 37):
            pos = order.index(victim)
            assert draw_at(src, pos)['uid'] == victim  # single-position ranges are exact
            order.pop(pos)
        assert src.count() == 12 and src.stats()['removed_by_use'] == 4
    buf = make(storage, size=16, seed=5)
    buf.load_state_dict(src.state_dict())
    assert stored_ids(buf) == order
    return buf, order


@pytest.mark.parametrize('holes', [False, True])
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_is_exact_insertion_order(storage, holes):
    buf, order = _buffer_with_holes(storage, holes)
    assert sorted(col(buf.sample(len(order)), 'uid')) == order  # no range: every stored item once
    for s in SLICES:
        expected = order[s]
        if not expected:
            refused = buf.stats()['refused_sample']
            assert buf.sample(2, sample_range=s) is None, s
            assert buf.stats()['refused_sample'] == refused + 1
            continue
        # equal priorities, size == len(range): every item of the range exactly once
        assert sorted(col(buf.sample(len(expected), sample_range=s), 'uid')) == sorted(expected), s
        counts = {}
        k = min(3, len(expected))
        for _ in range(150):
            for u in col(buf.sample(k, sample_range=s), 'uid'):
                counts[u] = counts.get(u, 0) + 1
        assert set(counts) <= set(expected), s
        if len(expected) > 1:
            assert set(counts) == set(expected), s
            draws = 150 * k
            chi = chi_square([counts[u] for u in expected], draws / len(expected))
            assert chi < chi_threshold(len(expected) - 1), (s, counts)


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_respects_priorities_within_the_range(storage):
    buf = make(storage, size=16, alpha=1.0, seed=2)
    prios = [1.0, 8.0, 1.0, 2.0, 4.0, 16.0, 1.0, 3.0, 5.0, 1.0]
    buf.push([item(i, priority=p) for i, p in enumerate(prios)])
    s = slice(2, 8)
    inside = list(range(10))[s]
    counts = np.zeros(10)
    for _ in range(600):
        counts += np.bincount(col(buf.sample(5, sample_range=s), 'uid'), minlength=10)
    assert counts[[i for i in range(10) if i not in inside]].sum() == 0
    p = np.array([prios[i] for i in inside])
    assert chi_square(counts[inside], counts.sum() * p / p.sum()) < chi_threshold(len(inside) - 1)


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_must_be_a_slice(storage):
    buf = make(storage, size=8)
    push_ids(buf, range(4))
    with pytest.raises(TypeError):
        buf.sample(1, sample_range=(0, 2))


@pytest.mark.parametrize('storage', STORAGES)
def test_empty_range_returns_none_and_changes_nothing(storage):
    buf = make(storage, size=8, anneal_step=5)
    push_ids(buf, range(6))
    before = buf.state_dict()
    assert buf.sample(2, sample_range=slice(4, 4)) is None
    after = buf.state_dict()
    after['counters']['refused_sample'] -= 1
    assert_same(before, after)


# ================================================================================ 3. update
@pytest.mark.parametrize('storage', STORAGES)
def test_update_stores_priority_plus_eps(storage):
    buf = make(storage, size=8, alpha=0.6)
    push_ids(buf, range(4))
    batch = buf.sample(4)
    new = [2.0, 3.5, 0.25, 6.0]
    by_uid = dict(zip(col(batch, 'uid'), new))
    assert buf.update(info_from(batch, new)) == {'updated': 4, 'stale': 0}
    view = index_view(buf)
    for u, p in by_uid.items():
        assert view[u]['priority'] == np.float32(p + EPS)
        assert view[u]['leaf'] == pytest.approx((p + EPS) ** 0.6, rel=1e-12)
        assert view[u]['leaf'] != pytest.approx(p**0.6, rel=1e-9)
    for pos in range(4):  # visible in the next sample's 'priority'
        r = draw_at(buf, pos)
        assert r['priority'] == pytest.approx(by_uid[r['uid']] + EPS, rel=1e-7)
    assert buf.stats()['max_priority'] == 6.0  # the raw value, without eps
    buf.push(item(4))
    assert index_view(buf)[4]['priority'] == 6.0
    assert buf.stats()['updated'] == 4 and buf.stats()['stale_updates'] == 0


@pytest.mark.parametrize('storage', STORAGES)
def test_bfloat16_priorities_update_like_float32(storage):
    """A mixed-precision learner's TD errors (bfloat16, which numpy lacks) are priorities like any float tensor."""
    buf = make(storage, size=8, alpha=0.6)
    push_ids(buf, range(4))
    batch = buf.sample(4)
    new = [2.0, 3.5, 0.25, 6.0]  # exact in bfloat16
    info = {**info_from(batch, new), 'priority': torch.tensor(new, dtype=torch.bfloat16)}
    assert buf.update(info) == {'updated': 4, 'stale': 0}
    view = index_view(buf)
    for u, p in zip(col(batch, 'uid'), new):
        assert view[u]['priority'] == np.float32(p + EPS)


@pytest.mark.parametrize('storage', STORAGES)
def test_update_to_zero_keeps_the_item_sampleable_through_eps(storage):
    buf = make(storage, size=8, alpha=0.6)
    push_ids(buf, range(3))
    assert buf.update({'replay_unique_id': [f'{NAME}_1'], 'replay_buffer_idx': [1], 'priority': [0.0]}) == {
        'updated': 1,
        'stale': 0,
    }
    view = index_view(buf)
    assert view[1]['priority'] == np.float32(EPS) and view[1]['leaf'] == pytest.approx(EPS**0.6, rel=1e-12)
    r = draw_at(buf, 1)
    assert r['uid'] == 1 and r['IS'] == 1.0  # the smallest leaf
    assert buf.stats()['max_priority'] == 1.0


def test_update_accepts_sampled_tensors_and_the_whole_batch():
    buf = make('tensor', size=8)
    push_ids(buf, range(4))
    batch = buf.sample(4)
    batch['priority'] = torch.tensor([1.5, 2.5, 3.5, 4.5], dtype=torch.float64)
    assert buf.update(batch) == {'updated': 4, 'stale': 0}  # extra keys of the sampled batch are ignored
    view = index_view(buf)
    for u, p in zip(batch['replay_unique_id'].tolist(), [1.5, 2.5, 3.5, 4.5]):
        assert view[u]['priority'] == np.float32(p + EPS)
    # numpy arrays and python lists work as well
    assert buf.update(
        {'replay_unique_id': np.array([0, 1]), 'replay_buffer_idx': np.array([0, 1]), 'priority': np.array([7.0, 8.0])}
    ) == {'updated': 2, 'stale': 0}
    assert buf.update({'replay_unique_id': [2], 'replay_buffer_idx': [2], 'priority': [9.0]}) == {
        'updated': 1,
        'stale': 0,
    }
    assert buf.stats()['max_priority'] == 9.0


@pytest.mark.parametrize('storage', STORAGES)
def test_update_priority_is_one_number_an_item_or_a_column(storage):
    buf = make(storage, size=8)
    push_ids(buf, range(4))
    batch = buf.sample(2)
    before = buf.state_dict()
    for bad in (torch.tensor([[1.0, 2.0]]), np.ones((2, 2)), [[1.0, 2.0]]):  # [1, 2] is no batch of 2 priorities
        with pytest.raises(ValueError, match=r"'priority' must be one number an item, .* got shape \[\d, 2\]"):
            buf.update(info_from(batch, [0.0, 0.0]) | {'priority': bad})
        assert_same(buf.state_dict(), before)
    assert buf.update(info_from(batch, [0.0, 0.0]) | {'priority': torch.tensor([[3.0], [5.0]])})['updated'] == 2
    twin = make(storage, size=8)
    push_ids(twin, range(4))
    twin.update(info_from(twin.sample(2), [3.0, 5.0]))  # a learner's [n, 1] column updates as [n] does
    assert_same(buf.state_dict(), twin.state_dict())


@pytest.mark.parametrize('edit', ['priority', 'leaves', 'a priority by 5e-6'])
def test_a_saved_priority_that_disagrees_with_its_leaf_is_refused(edit):
    """Each priority is saved twice, as itself and as its leaf (priority ** alpha), which is what samples: a state
    where they disagree is damaged (the saved priority was dropped, the leaf taken without a word)."""
    buf = make('tensor', size=4)
    push_ids(buf, range(3))
    batch = buf.sample(3)
    buf.update(info_from(batch, [2.0, 4.0, 8.0]))
    state = buf.state_dict()
    if edit == 'priority':
        state['index']['priority'][0] = 100.0
    elif edit == 'a priority by 5e-6':  # (honest states agree to the bit: the priority is its leaf's, in float32)
        state['index']['priority'][0] *= 1 + 5e-6
    else:
        state['index']['leaves'][0] = 0.001
    fresh = make('tensor', size=4)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=r"saved 'priority' .* at slot 0 disagrees with its leaf"):
        fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), before)


def test_update_accepts_list_storage_ids_as_strings_and_arrays():
    buf = make('list', size=8)
    push_ids(buf, range(4))
    batch = buf.sample(4)
    info = info_from(batch, np.array([1.0, 2.0, 3.0, 4.0]))
    info['replay_buffer_idx'] = np.array(info['replay_buffer_idx'])
    info['priority'] = np.array(info['priority'])
    assert buf.update(info) == {'updated': 4, 'stale': 0}
    # a scalar entry
    assert buf.update({'replay_unique_id': f'{NAME}_1', 'replay_buffer_idx': 1, 'priority': 5.0}) == {
        'updated': 1,
        'stale': 0,
    }
    assert index_view(buf)[1]['priority'] == np.float32(5.0 + EPS)


@pytest.mark.parametrize('storage', STORAGES)
def test_update_reports_overwritten_and_foreign_entries_as_stale(storage):
    buf = make(storage, size=4)
    push_ids(buf, range(4))
    batch = buf.sample(4)
    push_ids(buf, range(4, 6))  # overwrites ids 0 and 1 (slots 0 and 1)
    assert buf.update(info_from(batch, [3.0] * 4)) == {'updated': 2, 'stale': 2}
    view = index_view(buf)
    assert view[4]['priority'] == view[5]['priority'] == 1.0  # the new items keep their priority
    assert view[2]['priority'] == view[3]['priority'] == np.float32(3.0 + EPS)
    # another instance's ids, and this instance's id at the wrong slot, are stale
    res = buf.update(
        {
            'replay_unique_id': ['other_2', f'{NAME}_2', f'{NAME}x_3', 'demo_03x'],
            'replay_buffer_idx': [2, 3, 3, 3],
            'priority': [9.0, 9.0, 9.0, 9.0],
        }
    )
    assert res == {'updated': 0, 'stale': 4}
    assert index_view(buf) == view
    assert buf.stats()['updated'] == 2 and buf.stats()['stale_updates'] == 6
    assert buf.stats()['max_priority'] == 3.0  # stale entries do not raise the running max


@pytest.mark.parametrize('storage', STORAGES)
@pytest.mark.parametrize('bad', [2**63, -(2**63) - 1, 10**30, f'{NAME}_{10**30}'])
def test_update_with_an_id_beyond_int64_names_it(storage, bad):
    """No item has an id beyond int64: a ValueError naming it (was a bare OverflowError), nothing changed."""
    buf = make(storage, size=8)
    push_ids(buf, range(4))
    before = buf.state_dict()
    ids = [f'{NAME}_0', bad] if isinstance(bad, str) else [0, bad]
    with pytest.raises(ValueError, match=f"'replay_unique_id' {10**30 if isinstance(bad, str) else bad} is beyond"):
        buf.update({'replay_unique_id': ids, 'replay_buffer_idx': [0, 1], 'priority': [2.0, 3.0]})
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('form', [list, tuple])
def test_update_ids_longer_than_python_converts_are_named_or_stale(form):
    """Python refuses to convert more than 4300 digits: an id of 5000 was that bare error (naming neither key nor
    id), and 5000 zeros (no id: leading zeros) that error as a list but stale as a tuple."""
    buf = make('list', size=8)
    push_ids(buf, range(4))
    before = buf.state_dict()
    ones = form([f'{NAME}_0', f'{NAME}_' + '1' * 5000])
    with pytest.raises(ValueError, match=r"'replay_unique_id' 1{20}\.\.\. \(5000 digits\) is beyond int64"):
        buf.update({'replay_unique_id': ones, 'replay_buffer_idx': [0, 1], 'priority': [2.0, 3.0]})
    assert_same(buf.state_dict(), before)
    with pytest.raises(ValueError, match=r"'replay_unique_id' of 16610 bits is beyond int64"):  # (an int one)
        buf.update({'replay_unique_id': form([0, 10**5000]), 'replay_buffer_idx': [0, 1], 'priority': [2.0, 3.0]})
    assert_same(buf.state_dict(), before)
    zeros = form([f'{NAME}_0', f'{NAME}_' + '0' * 5000])
    out = buf.update({'replay_unique_id': zeros, 'replay_buffer_idx': [0, 1], 'priority': [2.0, 3.0]})
    assert out == {'updated': 1, 'stale': 1}


def test_update_ids_of_a_buffer_whose_name_is_a_prefix_are_foreign():
    buf = make('list', size=4, name='my')
    buf.push(item(0))
    assert buf.update(
        {'replay_unique_id': ['my_buf_0', 'my_0'], 'replay_buffer_idx': [0, 0], 'priority': [2.0, 3.0]}
    ) == {'updated': 1, 'stale': 1}


@pytest.mark.parametrize('form', ['all str', 'mixed with ints'])
@pytest.mark.parametrize('text', ['01', '00', '\u0661', '\uff11', '+1', ' 1'])
def test_update_ids_not_written_as_this_buffer_writes_them_are_foreign(text, form):
    """An id string is ``f'{name}_{n}'``: '..._01', another script's digits or a sign name no item (stale), and the
    update of this buffer's own ids in the same call still applies."""
    buf = make('list', size=4, name='my')
    for i in range(3):
        buf.push(item(i))
    mine = ['my_2'] if form == 'all str' else [2]
    res = buf.update({'replay_unique_id': [f'my_{text}'] + mine, 'replay_buffer_idx': [1, 2], 'priority': [7.0, 3.0]})
    assert res == {'updated': 1, 'stale': 1}
    view = index_view(buf)
    assert view[1]['priority'] == 1.0 and view[2]['priority'] == np.float32(3.0 + EPS)


@pytest.mark.parametrize('storage', STORAGES)
def test_update_of_removed_item_is_stale(storage):
    buf = make(storage, size=8, max_use=1)
    push_ids(buf, range(3))
    batch = buf.sample(1, sample_range=slice(1, 2))
    assert buf.count() == 2
    assert buf.update(info_from(batch, [5.0])) == {'updated': 0, 'stale': 1}
    assert 1 not in index_view(buf)
    assert buf.stats()['max_priority'] == 1.0


@pytest.mark.parametrize('storage', STORAGES)
def test_update_repeated_entry_last_write_wins(storage):
    buf = make(storage, size=8)
    push_ids(buf, range(2))
    res = buf.update(
        {'replay_unique_id': [f'{NAME}_1', f'{NAME}_1'], 'replay_buffer_idx': [1, 1], 'priority': [2.0, 5.0]}
    )
    assert res == {'updated': 2, 'stale': 0}
    assert index_view(buf)[1]['priority'] == np.float32(5.0 + EPS)


@pytest.mark.parametrize('storage', STORAGES)
def test_update_without_priority_is_a_noop(storage):
    buf = busy_buffer(storage)
    batch = buf.sample(3)
    before = buf.state_dict()
    info = info_from(batch, [2.0, 2.0, 2.0])
    del info['priority']
    assert buf.update(info) == {'updated': 0, 'stale': 0}
    assert buf.update({}) == {'updated': 0, 'stale': 0}
    assert buf.update({**info, 'priority': None}) == {'updated': 0, 'stale': 0}
    assert_same(before, buf.state_dict())


# ================================================================================ 4. eviction
@pytest.mark.parametrize('storage', STORAGES)
def test_max_use_removes_items(storage):
    buf = make(storage, size=8, max_use=2)
    push_ids(buf, range(3))
    assert col(buf.sample(3), 'use') == [1, 1, 1]
    assert buf.count() == 3
    assert col(buf.sample(3), 'use') == [2, 2, 2]
    assert buf.count() == 0
    stats = buf.stats()
    assert stats['removed_by_use'] == 3 and stats['remove_count'] == 3
    assert buf.sample(1) is None
    view = buf.state_dict()['index']
    assert (view['leaves'] == 0).all() and (view['use'] == 0).all() and (view['priority'] == 0).all()


@pytest.mark.parametrize('storage', STORAGES)
def test_max_use_reached_inside_one_batch(storage):
    buf = make(storage, size=8, max_use=2)
    buf.push([item(0, priority=0.0), item(1, priority=1.0), item(2, priority=0.0)])
    b = rows(buf.sample(3))
    assert [r['uid'] for r in b] == [1, 1, 1] and [r['use'] for r in b] == [1, 2, 3]
    assert buf.count() == 2 and sorted(index_view(buf)) == [0, 2]
    assert buf.stats()['removed_by_use'] == 1
    refused = buf.stats()['refused_sample']
    assert buf.sample(1) is None  # only zero-priority items are left
    assert buf.stats()['refused_sample'] == refused + 1
    # the freed slot is not reused before the ring comes round; ids go on
    buf.push(item(3))
    assert sorted(index_view(buf)) == [0, 2, 3] and index_view(buf)[3]['slot'] == 3


def _tracked_item(tmp_path, i):
    path = tmp_path / f'data_{i}.pt'
    torch.save(torch.full((2,), float(i)), path)
    return {'data_id': str(path), 'id': i}


def test_max_use_with_tracking_retires_item_and_update_cannot_revive_it(tmp_path):
    buf = make('list', size=4, max_use=2, enable_track_used_data=True)
    buf.start()
    try:
        buf.push([_tracked_item(tmp_path, i) for i in range(3)])
        assert [draw_at(buf, 0)['use'] for _ in range(2)] == [1, 2]  # item 0 reaches max_use
        assert buf.count() == 3  # DI-engine: kept (its file too), just never sampled again
        assert (tmp_path / 'data_0.pt').exists()
        view = index_view(buf)
        assert view[0]['leaf'] == 0 and view[0]['priority'] == 0 and view[0]['use'] == 2
        assert buf.stats()['removed_by_use'] == 0
        assert buf.sample(1, sample_range=slice(0, 1)) is None
        res = buf.update({'replay_unique_id': [f'{NAME}_0'], 'replay_buffer_idx': [0], 'priority': [10.0]})
        assert res == {'updated': 0, 'stale': 1}
        assert index_view(buf)[0]['leaf'] == 0 and buf.stats()['max_priority'] == 1.0
        assert sorted(col(buf.sample(2), 'uid')) == [1, 2]
        for _ in range(20):
            b = buf.sample(1, sample_range=slice(0, 3))
            assert b is None or col(b, 'uid') != [0]
        # the file goes when the slot is overwritten
        buf.push([_tracked_item(tmp_path, 3), _tracked_item(tmp_path, 4)])
        assert wait_until(lambda: not (tmp_path / 'data_0.pt').exists(), GENEROUS)
        assert (tmp_path / 'data_3.pt').exists() and (tmp_path / 'data_4.pt').exists()
    finally:
        buf.close()


@pytest.mark.parametrize('storage', STORAGES)
def test_max_staleness_removes_oldest_first_and_stops_at_first_fresh(storage):
    buf = make(storage, size=16, max_staleness=10)
    buf.push([item(i, collect_iter=c) for i, c in enumerate([0, 1, 5, 0, 6, 20])])
    b = buf.sample(1, cur_learner_iter=12)  # 12-0, 12-1 >= 10: stale; 12-5 = 7: fresh, the walk stops
    assert b is not None and col(b, 'uid')[0] in (2, 3, 4, 5)
    assert stored_ids(buf) == [2, 3, 4, 5]  # id 3 (collect_iter 0) stays: it is behind a fresh item
    stats = buf.stats()
    assert stats['removed_by_staleness'] == 2 and stats['remove_count'] == 2 and stats['removed_by_use'] == 0
    buf.sample(1, cur_learner_iter=15)  # 15-5 = 10 (stale at the threshold), 15-0 stale, 15-6 = 9 fresh
    assert stored_ids(buf) == [4, 5]
    assert buf.stats()['removed_by_staleness'] == 4
    assert buf.sample(1, cur_learner_iter=100) is None  # everything stale: nothing left to sample
    assert buf.count() == 0 and buf.stats()['removed_by_staleness'] == 6 and buf.stats()['remove_count'] == 6
    assert (buf.state_dict()['index']['leaves'] == 0).all()


def test_max_staleness_walk_stops_at_item_without_collect_iter():
    buf = make('list', size=8, max_staleness=5)
    buf.push([item(0, collect_iter=0), item(1), item(2, collect_iter=0)])
    buf.sample(1, cur_learner_iter=50)
    assert stored_ids(buf) == [1, 2]


def test_max_staleness_with_tracking_deletes_the_files(tmp_path):
    buf = make('list', size=8, max_staleness=5, enable_track_used_data=True)
    try:
        items = [_tracked_item(tmp_path, i) for i in range(4)]
        for it, ci in zip(items, [0, 1, 9, 2]):
            it['collect_iter'] = ci
        buf.push(items)
        buf.sample(1, cur_learner_iter=6)  # ids 0 and 1 are stale; id 2 stops the walk
        assert stored_ids(buf) == [2, 3]
        assert wait_until(
            lambda: not (tmp_path / 'data_0.pt').exists() and not (tmp_path / 'data_1.pt').exists(), GENEROUS
        )
        assert (tmp_path / 'data_2.pt').exists() and (tmp_path / 'data_3.pt').exists()
    finally:
        buf.close()


@pytest.mark.parametrize('storage', STORAGES)
def test_max_staleness_long_walk_after_wraparound(storage):
    buf = make(storage, size=256, max_staleness=10)
    buf.push([item(i, collect_iter=i) for i in range(300)])  # ids 44..299 stored
    assert buf.sample(4, cur_learner_iter=260) is not None  # collect_iter <= 250 is stale: 207 items (> 64)
    assert stored_ids(buf) == list(range(251, 300))
    stats = buf.stats()
    assert stats['removed_by_staleness'] == 207 and stats['remove_count'] == 44 + 207
    assert buf.count() == 49 and stats['push_items'] - stats['remove_count'] == 49


# ---------------------------------------------------------------- model-based check of the bookkeeping
class Model:
    """A plain-Python reference of DI-engine's bookkeeping: ids, slots, priorities, use counts, running max,
    max_use and staleness eviction, beta annealing. Sampling itself is random, so the model applies the batch
    the buffer returned and checks it (ids stored, priorities, IS, use)."""

    def __init__(self, cap, alpha, beta, anneal_step, max_use, max_staleness):
        self.cap, self.alpha, self.beta = cap, alpha, beta
        self.anneal = (1 - beta) / anneal_step
        self.max_use, self.max_staleness = max_use, max_staleness
        self.items = {}  # uid -> dict(prio (float64), use, ci)
        self.order = []  # stored uids, oldest first
        self.next_uid = 0
        self.max_priority = 1.0

    def remove(self, uid):
        del self.items[uid]
        self.order.remove(uid)

    def push(self, entries):
        for prio, ci in entries:
            uid = self.next_uid
            self.next_uid += 1
            if uid - self.cap in self.items:  # the previous occupant of slot uid % cap
                self.remove(uid - self.cap)
            self.items[uid] = dict(prio=self.max_priority if prio is None else prio, use=0, ci=ci)
            self.order.append(uid)

    def evict_stale(self, cur):
        while self.order and cur - self.items[self.order[0]]['ci'] >= self.max_staleness:
            self.remove(self.order[0])

    def apply_sample(self, batch_rows):
        leaf_min = min(v['prio'] ** self.alpha for v in self.items.values())
        for r in batch_rows:
            it = self.items[r['uid']]
            it['use'] += 1
            assert r['use'] == it['use']
            assert r['priority'] == pytest.approx(it['prio'], rel=1e-6)
            assert r['IS'] == pytest.approx((it['prio'] ** self.alpha / leaf_min) ** -self.beta, rel=1e-5)
        for u in {r['uid'] for r in batch_rows}:
            if self.items[u]['use'] >= self.max_use:
                self.remove(u)
        self.beta = min(1.0, self.beta + self.anneal)

    def apply_update(self, entries):
        n = 0
        for uid, p in entries:
            if uid in self.items:
                self.items[uid]['prio'] = p + EPS
                self.max_priority = max(self.max_priority, p)
                n += 1
        return n

    def check(self, buf):
        view = index_view(buf)
        assert sorted(view) == sorted(self.items)
        assert stored_ids(buf) == self.order
        for u, v in view.items():
            it = self.items[u]
            assert v['slot'] == u % self.cap and v['use'] == it['use']
            assert v['priority'] == np.float32(it['prio'])
            assert v['leaf'] == pytest.approx(it['prio'] ** self.alpha, rel=1e-12)
        assert buf.count() == len(self.items) and buf.push_count == self.next_uid
        assert buf.beta == pytest.approx(self.beta, abs=1e-12)
        assert buf.stats()['max_priority'] == self.max_priority


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('storage', STORAGES)
def test_random_operations_match_a_reference_model(storage, seed):
    cap, alpha, beta, anneal_step, max_use, max_staleness = 16, 0.7, 0.4, 50, 4, 12
    buf = make(
        storage,
        size=cap,
        seed=seed,
        alpha=alpha,
        beta=beta,
        anneal_step=anneal_step,
        max_use=max_use,
        max_staleness=max_staleness,
    )
    model = Model(cap, alpha, beta, anneal_step, max_use, max_staleness)
    rng = np.random.default_rng(seed)
    it, last = 0, None
    for _ in range(400):
        op = rng.choice(['push', 'push_list', 'extend', 'sample', 'sample', 'update'])
        if op in ('push', 'push_list', 'extend'):
            k = 1 if op == 'push' else int(rng.integers(1, 20))
            prios = [None if rng.random() < 0.4 else float(rng.uniform(0.1, 5.0)) for _ in range(k)]
            if op == 'extend':
                prios = [float(rng.uniform(0.1, 5.0)) for _ in range(k)] if rng.random() < 0.5 else [None] * k
            ids = list(range(model.next_uid, model.next_uid + k))
            if op == 'extend':
                extra = {'collect_iter': np.full(k, it, dtype=np.int64)}
                if prios[0] is not None:
                    extra['priority'] = np.array(prios)
                assert buf.extend(_batch(ids, **extra)) == k
            else:
                entries = [
                    item(i, collect_iter=it, **({} if p is None else {'priority': p})) for i, p in zip(ids, prios)
                ]
                assert buf.push(entries[0] if op == 'push' else entries) == k
            model.push([(p, it) for p in prios])
        elif op == 'sample':
            it += int(rng.integers(0, 3))
            size = int(rng.integers(1, 6))
            model.evict_stale(it)
            batch = buf.sample(size, cur_learner_iter=it)
            if len(model.items) < size:
                assert batch is None
            else:
                assert batch is not None
                last = rows(batch)
                assert all(r['staleness'] == it - model.items[r['uid']]['ci'] for r in last)
                model.apply_sample(last)
        elif last is not None:
            entries = [(r['uid'], float(rng.uniform(0.0, 6.0))) for r in last]
            info = {
                'replay_unique_id': [f'{NAME}_{u}' for u, _ in entries],
                'replay_buffer_idx': [u % cap for u, _ in entries],
                'priority': [p for _, p in entries],
            }
            if len({u for u, _ in entries}) == len(entries):  # repeated ids: last write wins, checked elsewhere
                res = buf.update(info)
                assert res['updated'] == model.apply_update(entries)
                assert res['updated'] + res['stale'] == len(entries)
        model.check(buf)


# ================================================================================ 5. throughput control
THRUPUT = dict(push_sample_rate_limit=dict(max=2, min=0.5), window_seconds=5, sample_min_limit_ratio=1.5)


def _run_thruput_scenario(storage, thruput, push_n, sample_n, big_n):
    """push ``push_n``; sample(sample_n) x4; sample(big_n); push(push_n) x3 -- all within the controller's first
    second (it decays in whole-second steps): its clock is stopped, so a slow machine runs the same arithmetic.
    Was: run on the wall clock and retried until it took under 0.9 s, which a loaded machine failed."""
    from ding_buffer.control import limiter as limiter_module
    from ding_buffer.control.thruput import ThruputController

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limiter_module, 'ThruputController', lambda cfg: ThruputController(cfg, clock=lambda: 0.0))
        buf = make(storage, size=1000, thruput_controller=thruput)
    first = buf.push([item(i) for i in range(push_n)])
    results = [buf.sample(sample_n) for _ in range(4)]
    too_big = buf.sample(big_n)
    pushes = [buf.push([item(i) for i in range(push_n)]) for _ in range(3)]
    return buf, first, results, too_big, pushes, buf.stats()


@pytest.mark.parametrize('storage', STORAGES)
def test_dingengine_thruput_arithmetic(storage):
    buf, first, results, too_big, pushes, stats = _run_thruput_scenario(storage, THRUPUT, 30, 19, 21)
    assert first == 30
    assert [r is not None for r in results] == [True, True, True, False]  # 30/19, 30/38, 30/57 >= .5; 30/76 < .5
    assert too_big is None  # 30/21 < sample_min_limit_ratio 1.5
    assert pushes == [30, 30, 0]  # 60/57, 90/57 <= 2; 120/57 > 2
    assert buf.count() == 90
    assert stats['refused_sample'] == 2 and stats['refused_push'] == 1 and stats['refused_push_items'] == 30
    assert stats['thruput_push'] == 90 and stats['thruput_sample'] == 57


@pytest.mark.parametrize(
    'thruput',
    [
        dict(push_sample_rate_limit=dict(max=2, min=0.5)),
        dict(sample_min_limit_ratio=1.5),
        dict(window_seconds=2.5),
    ],
    ids=['min', 'sample_min_limit_ratio', 'window_seconds'],
)
def test_thruput_config_accepts_float_values(thruput):
    """DI-engine configs use floats here (min=.5, ratio 1.5) although its defaults are ints (0, 1, 30)."""
    buf = make('list', size=8, thruput_controller=thruput)
    assert buf.cfg.thruput_controller.window_seconds == thruput.get('window_seconds', 30)


@pytest.mark.parametrize('storage', STORAGES)
def test_thruput_arithmetic_through_the_buffer(storage):
    """DI-engine's scenario with integer limits (min=1, max=2, ratio 2): push 30; sample(10) x3 allowed
    (30/10, 30/20, 30/30 >= 1), the 4th refused (30/40); sample(16) refused (30 < 2 x 16); pushes of 30:
    60/30 <= 2 accepted, 90/30 > 2 refused twice."""
    thruput = dict(push_sample_rate_limit=dict(max=2, min=1), window_seconds=5, sample_min_limit_ratio=2)
    buf, first, results, too_big, pushes, stats = _run_thruput_scenario(storage, thruput, 30, 10, 16)
    assert first == 30
    assert [r is not None for r in results] == [True, True, True, False]
    assert too_big is None
    assert pushes == [30, 0, 0]
    assert buf.count() == 60 and buf.push_count == 60
    assert stats['refused_sample'] == 2 and stats['refused_push'] == 2 and stats['refused_push_items'] == 60
    assert stats['thruput_push'] == 60 and stats['thruput_sample'] == 30
    assert stats['push_items'] == 60 and stats['sample_calls'] == 3 and stats['sampled_items'] == 30


@pytest.mark.parametrize('storage', STORAGES)
def test_blocking_sample_times_out_when_never_allowed(storage):
    buf = make(storage, size=16)
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError):
        buf.sample(4, timeout=0.3)
    assert 0.28 <= time.monotonic() - t0 < GENEROUS  # waited its timeout (the upper bound only catches a hang)
    assert isinstance(SampleTimeoutError('x'), TimeoutError)
    # refused by the rate limiter (push/sample must stay >= 1)
    limited = make(storage, size=16, thruput_controller=dict(push_sample_rate_limit=dict(max=float('inf'), min=1)))
    push_ids(limited, range(8))
    assert limited.sample(8, timeout=0.3) is not None  # 8 / 8 >= 1: served at once
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError):
        limited.sample(8, timeout=0.3)  # 8 / 16 < 1
    assert 0.28 <= time.monotonic() - t0 < GENEROUS
    with pytest.raises(SampleTimeoutError):
        limited.sample(8, timeout=0)
    with pytest.raises(ValueError):
        limited.sample(1, timeout=-1)


@pytest.mark.parametrize('timeout', [np.float32(0.05), np.float16(0.0), np.int64(0), np.int32(1)])
def test_a_numpy_timeout_counts_seconds_as_a_python_number_does(timeout):
    buf = make('list', size=16)
    push_ids(buf, range(2))
    assert len(buf.sample(2, timeout=timeout)) == 2  # servable: served at once
    before = buf.state_dict()
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError):
        buf.sample(4, timeout=timeout)  # 2 items, no replacement of a batch of 4: waits its timeout, then refuses
    assert time.monotonic() - t0 >= float(timeout) - 0.01  # it waited (never less than asked)
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('storage', STORAGES)
def test_blocking_sample_returns_when_another_thread_pushes(storage):
    buf = make(storage, size=16)
    push_ids(buf, range(2))
    result, errors = [], []

    def sampler():
        try:
            result.append(buf.sample(4, timeout=2 * GENEROUS))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=sampler)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.15)
    assert t.is_alive()  # still waiting: 2 items < 4
    push_ids(buf, range(2, 4))
    t.join(timeout=GENEROUS)
    assert not t.is_alive()
    assert errors == []  # woken by the push with a batch, not by its timeout (SampleTimeoutError)
    assert sorted(col(result[0], 'uid')) == [0, 1, 2, 3]
    assert time.monotonic() - t0 < GENEROUS


@pytest.mark.parametrize('storage', STORAGES)
def test_close_wakes_a_waiting_sampler(storage):
    buf = make(storage, size=16)
    errors = []

    def sampler():
        try:
            buf.sample(4, timeout=2 * GENEROUS)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=sampler)
    t.start()
    time.sleep(0.1)
    buf.close()
    t.join(timeout=GENEROUS)
    assert not t.is_alive()  # woken by close, long before its timeout
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError) and 'closed' in str(errors[0])
    with pytest.raises(RuntimeError):
        buf.push(item(0))
    with pytest.raises(RuntimeError):
        buf.sample(1)
    buf.close()  # idempotent


# ================================================================================ 6. persistence
def _compare_next_samples(a, b):
    for k in range(3):
        sa = a.sample(5, cur_learner_iter=60 + k)
        sb = b.sample(5, cur_learner_iter=60 + k)
        assert_same(sa, sb, 'sample')
        if sa is not None:
            pr = np.arange(1, 6, dtype=np.float32)
            assert a.update(info_from(sa, pr)) == b.update(info_from(sb, pr))
    assert_same(a.state_dict(), b.state_dict())


STATE_STATS = (
    'count',
    'push_count',
    'max_priority',
    'priority_mass',
    'push_items',
    'sample_calls',
    'sampled_items',
    'remove_count',
    'removed_by_use',
    'updated',
    'stale_updates',
)


@pytest.mark.parametrize('storage', STORAGES)
def test_state_dict_round_trip(storage):
    a = busy_buffer(storage)
    assert a.stats()['removed_by_use'] > 0 and a.beta > 0.3  # the state has holes and an annealed beta
    state = a.state_dict()
    b = make(storage, size=16, seed=99, max_use=3, anneal_step=20, alpha=0.7, beta=0.3)
    b.load_state_dict(state)
    assert_same(a.state_dict(), b.state_dict())
    for key in STATE_STATS:
        assert a.stats()[key] == b.stats()[key], key
    assert b.beta == a.beta and b.push_count == a.push_count
    assert (
        b._t.index.tree.total() == a._t.index.tree.total() and b._t.index.tree.min_leaf() == a._t.index.tree.min_leaf()
    )
    # the returned state is a copy: mutating it changes neither buffer
    state['index']['priority'][:] = 123.0
    state['counters']['push_items'] = -1
    assert_same(a.state_dict(), b.state_dict())
    _compare_next_samples(a, b)
    # ids continue after loading
    a.push(item(100, collect_iter=0))
    b.push(item(100, collect_iter=0))
    assert_same(a.state_dict(), b.state_dict())


@pytest.mark.parametrize('storage', STORAGES)
def test_state_from_another_alpha_is_refused_or_rescaled(storage):
    a = make(storage, size=4, alpha=0.5)
    a.push(item(0, priority=4.0))
    b = make(storage, size=4, alpha=1.0)
    try:
        b.load_state_dict(a.state_dict())
    except ValueError:
        return  # refusing the state is a fine fix too
    b.push(item(1, priority=4.0))
    view = index_view(b)
    assert view[0]['leaf'] == view[1]['leaf'] == 4.0
    assert col(b.sample(2), 'IS') == [1.0, 1.0]


@pytest.mark.parametrize('storage', STORAGES)
def test_save_and_load_data_round_trip(storage, tmp_path):
    a = busy_buffer(storage)
    path = tmp_path / 'sub' / 'buf.pt'
    a.save_data(str(path))
    b = make(storage, size=16, seed=42, max_use=3, anneal_step=20, alpha=0.7, beta=0.3)
    # the list items hold numpy arrays: loading them needs allow_pickle (refused without: test_contract.py)
    b.load_data(str(path), allow_pickle=storage == 'list')
    assert_same(a.state_dict(), b.state_dict())
    _compare_next_samples(a, b)


def test_list_storage_of_tensors_loads_without_allow_pickle(tmp_path):
    a = make('list', size=8)
    a.push([{'id': i, 'obs': torch.full((2,), float(i)), 'tag': f't{i}', 'collect_iter': [i, i + 1]} for i in range(5)])
    a.update(info_from(a.sample(3), [2.0, 3.0, 4.0]))
    a.save_data(str(tmp_path / 'b.pt'))
    b = make('list', size=8, seed=3)
    b.load_data(str(tmp_path / 'b.pt'))
    assert_same(a.state_dict(), b.state_dict())
    assert_same(a.sample(4, cur_learner_iter=9), b.sample(4, cur_learner_iter=9))


@pytest.mark.parametrize('storage', STORAGES)
def test_load_state_dict_with_data_only_pushes_the_items(storage):
    buf = make(storage, size=8)
    push_ids(buf, range(2))
    buf.load_state_dict({'data': [item(10), item(11, priority=3.0)]})
    assert buf.count() == 4 and stored_ids(buf) == [0, 1, 10, 11]
    view = index_view(buf)
    assert sorted(view) == [0, 1, 2, 3] and view[3]['priority'] == 3.0


@pytest.mark.parametrize('storage', STORAGES)
def test_clear_keeps_ids_push_count_and_beta_and_resets_max_priority(storage):
    buf = make(storage, size=8, anneal_step=10)
    push_ids(buf, range(5))
    buf.update(info_from(buf.sample(2), [7.0, 7.0]))
    beta = buf.beta
    buf.clear()
    assert buf.count() == 0 and buf.push_count == 5 and buf.beta == beta
    assert buf.stats()['max_priority'] == 1.0 and buf.stats()['remove_count'] == 5
    assert (buf.state_dict()['index']['leaves'] == 0).all()
    assert buf.sample(1) is None
    buf.push(item(5))
    assert index_view(buf) == {5: dict(slot=5, priority=1.0, leaf=1.0, use=0)}


# ================================================================================ 7. concurrency
def _check_tree_invariants(buf):
    index, ring = buf._t.index, buf.storage.ring
    cap = buf.replay_buffer_size
    leaves = index.tree.leaves
    valid = ring.valid
    assert (leaves[cap:] == 0).all()
    leaves = leaves[:cap]
    assert math.isclose(index.tree.total(), float(leaves.sum()), rel_tol=1e-9, abs_tol=1e-12)
    positive = leaves[leaves > 0]
    assert index.tree.min_leaf() == (positive.min() if len(positive) else math.inf)
    prios = index.priorities(np.arange(cap))
    use = buf.state_dict()['index']['use'].numpy()
    assert (leaves[~valid] == 0).all() and (prios[~valid] == 0).all() and (use[~valid] == 0).all()
    assert (leaves[valid] > 0).all()
    assert buf.count() == int(valid.sum()) == ring.count
    np.testing.assert_allclose(leaves[valid], prios[valid] ** buf.alpha, rtol=1e-6)


@pytest.mark.parametrize('storage', STORAGES)
def test_concurrent_push_sample_update_keep_tree_invariants(storage):
    cap, seconds = 512, 2.0
    buf = make(storage, size=cap, max_use=10, max_staleness=100, alpha=0.6)
    pushed, sampled, updated = [0, 0], [0, 0], [0]
    infos = queue.Queue(maxsize=64)
    t_start = time.monotonic()

    def now_ms():
        return int((time.monotonic() - t_start) * 1000)

    def pusher(k):
        def work(stop):
            rng = np.random.default_rng(100 + k)
            i = 0
            while not stop.is_set():
                mode = rng.integers(3)
                n = int(rng.integers(1, 17))
                ci = now_ms()
                if mode == 0:  # single push (tensor: the fast path)
                    extra = {'priority': float(rng.uniform(0.1, 5.0))} if rng.random() < 0.5 else {}
                    pushed[k] += buf.push(item(i, collect_iter=ci, **extra))
                    i += 1
                elif mode == 1:
                    pushed[k] += buf.push([item(i + j, collect_iter=ci) for j in range(n)])
                    i += n
                else:
                    b = _batch(
                        np.arange(i, i + n),
                        collect_iter=np.full(n, ci, dtype=np.int64),
                        priority=rng.uniform(0.1, 5.0, size=n),
                    )
                    pushed[k] += buf.extend(b)
                    i += n

        return work

    def sampler(k):
        def work(stop):
            rng = np.random.default_rng(200 + k)
            while not stop.is_set():
                size = int(rng.integers(1, 33))
                rng_range = [None, slice(-100, None), slice(10, 300, 3), slice(None, 50)][rng.integers(4)]
                try:
                    batch = buf.sample(
                        size,
                        cur_learner_iter=now_ms(),
                        sample_range=rng_range,
                        timeout=0.01 if rng.random() < 0.3 else None,
                    )
                except SampleTimeoutError:
                    continue
                if batch is None:
                    continue
                sampled[k] += 1
                try:
                    infos.put_nowait(info_from(batch, rng.uniform(0.0, 8.0, size=size).astype(np.float32)))
                except queue.Full:
                    pass
                if rng.random() < 0.05:
                    buf.stats()

        return work

    def updater(stop):
        while not stop.is_set() or not infos.empty():
            try:
                info = infos.get(timeout=0.05)
            except queue.Empty:
                continue
            res = buf.update(info)
            assert res['updated'] + res['stale'] == len(info['priority'])
            updated[0] += res['updated']

    def enough():
        stats = buf.stats()
        removed = stats['removed_by_use'] + stats['removed_by_staleness'] > 0
        return sum(pushed) > cap and all(sampled) and updated[0] > 0 and removed

    def controller(stop):
        """At least ``seconds`` of contention, then on until every part has done its share (a loaded machine takes
        longer; was: a fixed 2 s, after which a slow run had not pushed enough), GENEROUS seconds at most."""
        stop.wait(seconds)
        deadline = time.monotonic() + GENEROUS
        while not stop.is_set() and not enough() and time.monotonic() < deadline:
            stop.wait(0.05)
        stop.set()

    workers = [pusher(k) for k in range(2)] + [sampler(k) for k in range(2)] + [updater, controller]
    run_threads(workers, join_timeout=seconds + 2 * GENEROUS)  # the controller stops them
    assert sum(pushed) > cap and all(sampled) and updated[0] > 0
    _check_tree_invariants(buf)
    stats = buf.stats()
    assert stats['push_items'] == sum(pushed)
    assert stats['push_items'] - stats['remove_count'] == buf.count()
    assert stats['removed_by_use'] + stats['removed_by_staleness'] > 0
    assert stats['updated'] == updated[0]
    # the buffer still works and its state still round-trips
    clone = make(storage, size=cap, seed=1, max_use=10, max_staleness=100, alpha=0.6)
    clone.load_state_dict(buf.state_dict())
    _check_tree_invariants(clone)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_tensor_storage_on_cuda_matches_cpu():
    def run(device):
        buf = create_buffer(
            dict(
                type='advanced',
                replay_buffer_size=8,
                seed=0,
                max_staleness=6,
                storage=dict(type='tensor', device=device),
            ),
            instance_name=NAME,
        )
        buf.push([item(i, collect_iter=i, priority=float(i + 1)) for i in range(10)])
        batch = buf.sample(4, cur_learner_iter=9)
        assert batch['obs'].device.type == torch.device(device).type
        assert batch['IS'].device.type == torch.device(device).type
        buf.update(info_from(batch, [2.0, 3.0, 4.0, 5.0]))
        buf.push(item(10, collect_iter=10))
        return {k: v.cpu() for k, v in buf.sample(3, cur_learner_iter=11).items()}, buf.state_dict()

    (cpu_batch, cpu_state), (gpu_batch, gpu_state) = run('cpu'), run('cuda')
    assert_same(cpu_batch, gpu_batch)
    assert_same(cpu_state, gpu_state)


# ================================================================================ 8. config
def test_dingengine_default_config():
    cfg = AdvancedReplayBuffer.default_config()
    assert cfg.type == 'advanced' and cfg.cfg_type == 'AdvancedReplayBufferDict'
    assert cfg.replay_buffer_size == 4096
    assert cfg.max_use == float('inf') and cfg.max_staleness == float('inf')
    assert cfg.alpha == 0.6 and cfg.beta == 0.4 and cfg.anneal_step == 100000
    assert cfg.enable_track_used_data is False and cfg.deepcopy is False
    tc = cfg.thruput_controller
    assert tc.push_sample_rate_limit.max == float('inf') and tc.push_sample_rate_limit.min == 0
    assert tc.window_seconds == 30 and tc.sample_min_limit_ratio == 1
    assert cfg.monitor.sampled_data_attr.average_range == 5 and cfg.monitor.sampled_data_attr.print_freq == 200
    assert cfg.monitor.periodic_thruput.seconds == 60
    assert cfg.storage.type == 'list'
    # DI-engine builds its configs as deep_merge_dicts(default_config(), EasyDict(...))
    merged = deep_merge_dicts(cfg, EasyDict(dict(replay_buffer_size=64, thruput_controller=THRUPUT)))
    buf = create_buffer(merged, instance_name='merged')
    assert buf.replay_buffer_size == 64 and buf.cfg.thruput_controller.sample_min_limit_ratio == 1.5
    # a copy: changing it changes nothing
    cfg.alpha = 0.1
    assert AdvancedReplayBuffer.default_config().alpha == 0.6


def test_minimal_config_uses_the_defaults():
    buf = create_buffer(dict(type='advanced'))
    assert isinstance(buf, AdvancedReplayBuffer)
    assert buf.replay_buffer_size == 4096 and buf.alpha == 0.6 and buf.beta == 0.4
    assert buf.instance_name == 'buffer'
    buf.push(item(0))
    assert buf.sample(1)[0]['replay_unique_id'] == 'buffer_0'
    full = create_buffer(AdvancedReplayBuffer.default_config())  # DI-engine passes the whole default config
    assert full.replay_buffer_size == 4096


@pytest.mark.parametrize(
    'cfg,closest',
    [
        (dict(replay_bufer_size=8), 'replay_buffer_size'),
        (dict(alpah=0.5), 'alpha'),
        (dict(max_uses=3), 'max_use'),
        (dict(thruput_controller=dict(window_second=3)), 'thruput_controller.window_seconds'),
        (dict(storage=dict(typ='tensor')), 'storage.type'),
    ],
)
def test_unknown_config_key_names_the_closest_key(cfg, closest):
    with pytest.raises(ValueError, match=f"did you mean '{closest}'"):
        create_buffer(dict(type='advanced', **cfg))


@pytest.mark.parametrize(
    'cfg,key',
    [
        (dict(alpha=1.5), 'alpha'),
        (dict(alpha=-0.1), 'alpha'),
        (dict(beta=-0.1), 'beta'),
        (dict(beta=1.01), 'beta'),
        (dict(max_use=0), 'max_use'),
        (dict(max_use=-2), 'max_use'),
        (dict(max_staleness=0), 'max_staleness'),
        (dict(replay_buffer_size=0), 'replay_buffer_size'),
        (dict(anneal_step=-1), 'anneal_step'),
        (dict(anneal_step=2.5), 'anneal_step'),
        (dict(eps=-1e-3), 'eps'),
        (dict(seed=-1), 'seed'),
        (dict(thruput_controller=dict(sample_min_limit_ratio=0.5)), 'thruput_controller.sample_min_limit_ratio'),
        (dict(storage=dict(type='deque')), 'storage.type'),
        (dict(replay_buffer_size='8'), 'replay_buffer_size'),
        (dict(enable_track_used_data=True, storage=dict(type='tensor')), 'enable_track_used_data'),
    ],
)
def test_invalid_config_values_raise_naming_the_key(cfg, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        create_buffer(dict(type='advanced', **cfg))


@pytest.mark.parametrize('average_range', [2**63, 10**30])
def test_sampled_data_average_range_beyond_ssize_t_names_the_key(average_range):
    """The window of the sampled-data monitor is a deque: a length beyond 2**63 - 1 was a bare OverflowError."""
    section = dict(monitor=dict(sampled_data_attr=dict(average_range=average_range)))
    key = 'monitor.sampled_data_attr.average_range'
    with pytest.raises(ValueError, match=f"'{key}' has invalid value {average_range}"):
        create_buffer(dict(type='advanced', **section))
    big = create_buffer(dict(type='advanced', monitor=dict(sampled_data_attr=dict(average_range=2**63 - 1))))
    big.push({'obs': 1})
    assert len(big.sample(1)) == 1


def test_instance_name_must_be_a_non_empty_string():
    with pytest.raises(ValueError):
        create_buffer(dict(type='advanced', replay_buffer_size=8), instance_name='')


@pytest.mark.parametrize('storage', STORAGES)
def test_equal_priorities_give_identical_leaves_on_every_path(storage):
    """Single push, batched push and update must compute ``priority ** alpha`` the same way (numpy's SIMD
    ``np.power`` differs from the C ``pow`` by one ulp for some inputs): equal priorities -> IS exactly 1."""
    xs = np.random.default_rng(3).random(4096) * 10 + 0.1
    differs = xs[np.power(xs, 0.6) != np.array([x**0.6 for x in xs.tolist()])]
    p = float(differs[0]) if len(differs) else 0.37  # a value where the two pows disagree, if this CPU has one
    buf = create_buffer(
        dict(type='advanced', replay_buffer_size=128, alpha=0.6, eps=0.0, seed=0, storage=dict(type=storage)),
        instance_name='eq',
    )
    buf.push({'x': np.ones(2, np.float32), 'priority': 5.0})  # the first item fixes the schema
    buf.push({'x': np.ones(2, np.float32), 'priority': p})  # single push (tensor: the fast path)
    if storage == 'tensor':  # a batch long enough for numpy's vectorised loops
        buf.extend({'x': np.ones((64, 2), np.float32), 'priority': np.full(64, p)})
    else:
        buf.push([{'x': np.ones(2, np.float32), 'priority': p} for _ in range(64)])
    assert len(set(buf._t.index.tree.leaves[1:66].tolist())) == 1  # single and batched pushes agree
    out = buf.sample(64)
    ids = out['replay_unique_id'] if storage == 'tensor' else [d['replay_unique_id'] for d in out]
    idx = out['replay_buffer_idx'] if storage == 'tensor' else [d['replay_buffer_idx'] for d in out]
    buf.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [p] * 64})  # eps=0: same priority
    leaves = buf._t.index.tree.leaves[1:66]
    assert len(set(leaves.tolist())) == 1, sorted(set(leaves.tolist()))
    batch = buf.sample(64)
    if storage == 'tensor':
        weights = batch['IS'][batch['replay_buffer_idx'] > 0].tolist()
    else:
        weights = [d['IS'] for d in batch if d['replay_buffer_idx'] > 0]
    assert weights and set(weights) == {1.0}  # slot 0 (priority 5 unless updated) is the only other value
    buf.close()


_BACKEND_SCRIPT = r'''
import json, os, numpy as np, torch
from ding_buffer import create_buffer, tree_kernels, _numba
if os.environ.get('LOAD_FIRST') == '1':
    _numba.load()  # compiled from the first call; otherwise numpy serves until the background load swaps
buf = create_buffer(dict(type='advanced', replay_buffer_size=300, seed=5, storage=dict(type='tensor')))
rng = np.random.default_rng(0)
out = {'numba': tree_kernels.HAVE_NUMBA, 'batches': []}
for step in range(40):
    buf.extend({'x': rng.random((40, 3), dtype=np.float32), 'priority': rng.random(40) * 3})
    buf.push({'x': rng.random(3, dtype=np.float32)})
    b = buf.sample(32, cur_learner_iter=step)
    buf.update({'replay_unique_id': b['replay_unique_id'], 'replay_buffer_idx': b['replay_buffer_idx'],
                'priority': torch.from_numpy(rng.random(32) * 5)})
    out['batches'].append([b['replay_unique_id'].tolist(), b['IS'].tolist(), b['priority'].tolist()])
out['leaves'] = buf._t.index.tree.leaves.tolist()
out['nodes'] = [buf._t.index.tree.sum._nodes.tolist(), buf._t.index.tree.min._nodes.tolist()]
print(json.dumps(out))
'''


@pytest.mark.slow
def test_numba_and_numpy_backends_give_identical_buffers():
    """The compiled kernels and the numpy fallback must draw the same samples and build the same trees."""
    import json
    import subprocess
    import sys

    runs = {}
    for flag, first in (('0', '0'), ('0', '1'), ('1', '0')):  # numba (switching mid-run / from the start), numpy
        env = subprocess_env(DING_BUFFER_NO_NUMBA=flag, LOAD_FIRST=first)
        proc = subprocess.run(
            [sys.executable, '-c', _BACKEND_SCRIPT], env=env, capture_output=True, text=True, timeout=240
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[flag + first] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs['10']['numba'] is False
    if not runs['00']['numba']:
        pytest.skip('numba is not installed: only the fallback ran')
    for run in ('00', '01'):
        assert runs[run]['batches'] == runs['10']['batches'], run
        assert runs[run]['leaves'] == runs['10']['leaves'], run
        assert runs[run]['nodes'] == runs['10']['nodes'], run


def test_update_fast_path_gives_exactly_the_state_of_the_checking_path():
    """Tensors from a tensor-storage sample take one compiled pass (``_update_fast``); lists take the checking
    path. Same buffers, same updates -- fresh, stale (overwritten), repeated slots, foreign ids, float32 and
    float64 priorities -- must give identical states and results. (A bad entry is refused by both paths with
    nothing changed: the list and tensor forms of the contract suite's garbage updates.)"""
    rng = np.random.default_rng(0)

    def make():
        buf = create_buffer(dict(type='advanced', replay_buffer_size=64, seed=3, storage=dict(type='tensor')))
        buf.extend({'obs': torch.arange(100, dtype=torch.float32).reshape(50, 2), 'act': torch.arange(50)})
        return buf

    fast, slow = make(), make()
    for step in range(40):
        batch = fast.sample(16, step)
        assert_same(batch, slow.sample(16, step))
        dtype = (torch.float32, torch.float64, torch.float16)[step % 3]  # float16 (mixed precision): checking path
        prio = torch.from_numpy(rng.uniform(0, 5, 16)).to(dtype)
        ids, idx = batch['replay_unique_id'].clone(), batch['replay_buffer_idx'].clone()
        if step % 5 == 0:
            idx[3] = idx[2]  # a repeated slot: the last write wins
            ids[3] = ids[2]
        if step % 7 == 0:
            ids[0] += 1000  # an id this slot never held: stale
        info = {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': prio}
        as_lists = {k: v.tolist() for k, v in info.items()}
        assert fast.update(info) == slow.update(as_lists)
        assert_same(fast.state_dict(), slow.state_dict())
        if step % 3 == 0:  # new items overwrite old ones: later updates of them are stale
            more = {'obs': torch.zeros(5, 2), 'act': torch.arange(5)}
            fast.extend(more)
            slow.extend(more)
    swapped = {
        'replay_unique_id': batch['replay_unique_id'].numpy(),
        'replay_buffer_idx': batch['replay_buffer_idx'],
        'priority': np.full(16, 2.0, dtype='>f8'),
    }  # non-native byte order: the checking path converts it
    assert fast.update(swapped) == slow.update({k: np.asarray(v).tolist() for k, v in swapped.items()})
    assert_same(fast.state_dict(), slow.state_dict())


def _cartpole_batch(rng, n, collect_iter=False, priority=False):
    batch = {
        'obs': rng.standard_normal((n, 4), dtype=np.float32),
        'action': rng.integers(0, 2, n),
        'reward': rng.standard_normal(n, dtype=np.float32),
        'done': rng.random(n) < 0.2,
    }
    if collect_iter:
        batch['collect_iter'] = rng.integers(0, 50, n)
    if priority:
        batch['priority'] = rng.random(n).astype(np.float32) * 3
    return batch


def _as_lists(batch):
    """The same batch as Python lists (the checking path converts them; the fast path takes arrays only)."""
    return {k: v.tolist() for k, v in batch.items()}


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
@pytest.mark.parametrize('collect_iter', [False, True])
@pytest.mark.parametrize('priority', [False, True])
def test_batched_push_fast_path_gives_exactly_the_state_of_the_checking_path(type_, collect_iter, priority):
    """A batch of numpy arrays / CPU tensors of the stored dtypes takes the O(fields) path (slice writes, one
    deferred tree write); the same batches as lists take the checking path. Batch sizes that wrap the ring and
    exceed the free space, interleaved single pushes, samples and updates must give identical states and
    samples, and a float32 priority column (advanced) the same leaves as float64."""
    if priority and type_ == 'naive':
        pytest.skip('naive stores a priority key as a field; covered by collect_iter')
    rng = np.random.default_rng(seed=[7, collect_iter, priority])
    cfg = dict(type=type_, replay_buffer_size=100, storage=dict(type='tensor'), seed=11)
    fast, slow, tens = create_buffer(cfg), create_buffer(cfg), create_buffer(cfg)
    for step, n in enumerate([37, 37, 64, 1, 100, 13, 99, 50]):
        batch = _cartpole_batch(rng, n, collect_iter, priority)
        assert fast.extend(batch) == n
        assert slow.extend(_as_lists(batch) if step else batch) == n  # the first batch fixes the schema
        assert tens.extend({k: torch.from_numpy(v) for k, v in batch.items()}) == n
        item = {k: v[0] for k, v in _cartpole_batch(rng, 1, collect_iter).items()}
        item['action'] = int(item['action'])
        for buf in (fast, slow, tens):
            buf.push(dict(item))
        draws = [b.sample(16, cur_learner_iter=step) for b in (fast, slow, tens)]
        assert_same(draws[0], draws[1], 'sample')
        assert_same(draws[0], draws[2], 'sample')
        if type_ == 'advanced':
            p = torch.from_numpy(rng.random(16) * 2)
            for buf, d in zip((fast, slow, tens), draws):
                buf.update(
                    {
                        'replay_unique_id': d['replay_unique_id'],
                        'replay_buffer_idx': d['replay_buffer_idx'],
                        'priority': p,
                    }
                )
    assert_same(fast.state_dict(), slow.state_dict())
    assert_same(fast.state_dict(), tens.state_dict())
    assert_same(fast.stats(), slow.stats(), 'stats')


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_batched_push_refusals_change_nothing_on_the_fast_path(type_):
    """Batches that look like the stored schema but are not (dtype, per-item shape, leading sizes, missing or
    extra field, a collect_iter out of range or NaN, bad batched priorities) are refused with a ValueError /
    TypeError naming the field and the buffer's state is unchanged; a batch larger than the capacity keeps its
    newest items."""
    rng = np.random.default_rng(3)
    buf = create_buffer(dict(type=type_, replay_buffer_size=50, storage=dict(type='tensor'), seed=1))
    buf.extend(_cartpole_batch(rng, 30, collect_iter=True))
    before = copy.deepcopy(buf.state_dict())

    def bad(**change):
        b = _cartpole_batch(rng, 8, collect_iter=True)
        b.update(change)
        return {k: v for k, v in b.items() if v is not None}

    cases = [
        (bad(obs=rng.standard_normal((8, 4))), 'obs'),  # float64 into float32
        (bad(obs=rng.standard_normal((8, 5), dtype=np.float32)), 'obs'),
        (bad(action=rng.integers(0, 2, 7)), 'leading'),
        (bad(done=None), 'done'),
        (bad(extra=np.zeros(8, np.float32)), 'extra'),
        (bad(collect_iter=np.full(8, 2**62)), 'collect_iter'),
        (bad(collect_iter=np.full(8, -(2**63))), 'collect_iter'),
    ]
    if type_ == 'advanced':
        cases += [
            (bad(priority=np.full(8, -1.0)), 'priority'),
            (bad(priority=np.full(8, np.nan)), 'priority'),
            (bad(priority=np.ones(9)), 'priority'),
            (bad(priority=np.full(8, np.inf, np.float32)), 'priority'),
        ]
    for batch, word in cases:
        with pytest.raises((ValueError, TypeError), match=word):
            buf.extend(batch)
        assert_same(buf.state_dict(), before, f'after refusing {word}')
    sparse = bad()
    sparse['obs'] = torch.from_numpy(sparse['obs']).to_sparse()
    item = {k: v[0] for k, v in bad().items()}
    item['obs'] = torch.from_numpy(item['obs']).to_sparse()
    for call in (lambda: buf.extend(sparse), lambda: buf.push(item)):
        with pytest.raises(TypeError, match="'obs' is a torch.sparse_coo tensor"):
            call()
        assert_same(buf.state_dict(), before, 'after refusing a sparse tensor')
    big = _cartpole_batch(rng, 120, collect_iter=True)
    assert buf.extend(big) == 120
    got = buf.sample(50, replace=False) if type_ == 'naive' else None
    if got is not None:
        assert sorted(got['reward'].tolist()) == sorted(big['reward'][-50:].tolist())
    assert buf.count() == 50


def test_a_learner_editing_its_sampled_use_and_staleness_changes_nothing_the_buffer_reports():
    """``use`` and ``staleness`` of a tensor-storage sample are the learner's own tensors: editing them in place
    (e.g. ``clamp_``) leaves ``last_sample_use()`` and the sampled-data statistics as they were."""
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, storage=dict(type='tensor'), seed=0))
    buf.extend({'obs': torch.randn(4, 2), 'collect_iter': torch.zeros(4, dtype=torch.long)})
    batch = buf.sample(4, cur_learner_iter=10)
    before = buf.stats()
    use = buf.last_sample_use().tolist()
    batch['use'].fill_(1000)
    batch['staleness'].fill_(-5)
    after = buf.stats()
    assert buf.last_sample_use().tolist() == use == [1, 1, 1, 1]
    for key in ('use_avg', 'use_max', 'staleness_avg', 'staleness_max'):
        assert after[key] == before[key], key


@pytest.mark.parametrize('eps', [1.5, 1e39, float('inf'), -1e-9])
def test_an_eps_that_could_push_a_stored_priority_past_float32_is_refused_by_name(eps):
    with pytest.raises(ValueError, match=r"config key 'eps' has invalid value .*a number in \[0, 1\]"):
        create_buffer(dict(type='advanced', eps=eps))
    buf = create_buffer(dict(type='advanced', eps=1.0, seed=0))
    buf.push([{'x': 1}, {'x': 2}])
    drawn = buf.sample(2)
    buf.update(
        {
            'replay_unique_id': [x['replay_unique_id'] for x in drawn],
            'replay_buffer_idx': [x['replay_buffer_idx'] for x in drawn],
            'priority': [3.4e38, 1.0],  # the largest priority an update takes, plus eps: still finite in float32
        }
    )
    create_buffer(dict(type='advanced', eps=1.0, seed=0)).load_state_dict(buf.state_dict())


@pytest.mark.parametrize('storage', STORAGES)
def test_a_numpy_sample_size_leaves_a_file_that_loads_without_pickle(storage, tmp_path):
    """sample(np.int64(4)) made the sampled-items counter a numpy int, and the buffer's own file then needed
    allow_pickle=True."""
    buf = make(storage, size=16)
    push_ids(buf, range(8))
    assert buf.sample(np.int64(4)) is not None
    assert type(buf.stats()['sampled_items']) is int
    if storage == 'tensor':
        buf.save_data(str(tmp_path / 'b.pt'))
        other = make(storage, size=16)
        other.load_data(str(tmp_path / 'b.pt'))
        assert other.stats()['sampled_items'] == 4


def _sampled_keys(stats):
    return {
        k: stats[k] for k in ('use_avg', 'use_max', 'priority_avg', 'priority_max', 'priority_min', 'staleness_avg')
    }


@pytest.mark.parametrize(
    'cfg',
    [dict(type='advanced'), dict(type='advanced', storage=dict(type='tensor')), dict(type='deque', priority=True)],
    ids=['advanced-list', 'advanced-tensor', 'deque-prio'],
)
def test_the_sampled_batch_averages_survive_a_save_and_load(cfg, tmp_path):
    """``stats()``' moving averages of the last sampled batches are part of the state: a buffer loaded from a
    file (or a ``state_dict()``) reports what the saved one did, and its log schedule goes on from the saved
    call count."""
    cfg = dict(cfg, replay_buffer_size=64, seed=3, monitor=dict(sampled_data_attr=dict(average_range=3)))
    src = create_buffer(cfg)
    for i in range(40):
        src.push({'obs': float(i)})
    for k in range(5):
        batch = src.sample(4)
        if cfg['type'] == 'advanced':
            ids = batch['replay_unique_id'] if isinstance(batch, dict) else [x['replay_unique_id'] for x in batch]
            idx = batch['replay_buffer_idx'] if isinstance(batch, dict) else [x['replay_buffer_idx'] for x in batch]
            src.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [1.0 + k, 2.0, 3.0, 4.0]})
    want = _sampled_keys(src.stats())
    src.save_data(str(tmp_path / 'f'))
    by_file, by_state = create_buffer(cfg), create_buffer(cfg)
    by_file.load_data(str(tmp_path / 'f'))
    by_state.load_state_dict(src.state_dict())
    assert _sampled_keys(by_file.stats()) == want
    assert _sampled_keys(by_state.stats()) == want
    # the window goes on: two more batches push the oldest saved ones out of the 3-batch window
    for buf in (src, by_file):
        buf.sample(4)
        buf.sample(4)
    assert _sampled_keys(by_file.stats()) == _sampled_keys(src.stats())


@pytest.mark.parametrize(
    'bad',
    [
        {'calls': 2, 'rows': [[1.0] * 8, [float('nan')] * 8]},
        {'calls': 2, 'rows': [[1.0] * 7]},
        {'calls': 1, 'rows': [[1.0] * 8, [1.0] * 8]},
        {'calls': -1, 'rows': []},
        {'calls': True, 'rows': []},
        {'calls': 1, 'rows': [[1.0] * 8], 'extra': 0},
        {'calls': 1, 'rows': [['1'] * 8]},
        [],
    ],
    ids=['nan', 'short row', 'more rows than calls', 'negative calls', 'bool calls', 'extra key', 'str', 'list'],
)
def test_a_saved_sampled_window_that_lies_is_refused_and_changes_nothing(bad):
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    for i in range(4):
        buf.push({'obs': float(i)})
    buf.sample(2)
    state = buf.state_dict()
    before = copy.deepcopy(state)
    with pytest.raises((TypeError, ValueError), match='sampled'):
        buf.load_state_dict(dict(state, sampled=bad))
    assert_same(buf.state_dict(), before)
    old = {k: v for k, v in state.items() if k != 'sampled'}  # a state saved before the window was: loads empty
    buf.load_state_dict(old)
    assert 'use_avg' not in buf.stats() and buf.count() == 4


def test_why_not_sample_names_priorities_that_are_all_zero_as_sample_refuses_them():
    """Every stored priority 0: ``sample`` returns None, and ``why_not_sample`` answered '' (it would draw) -- a
    mixture trusting it let its other members draw first. It gives the sample's reason."""
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    buf.push([{'obs': i, 'priority': 0.0} for i in range(4)])
    assert buf.why_not_sample(2) == 'every candidate item has priority 0'
    assert buf.sample(2) is None
    mix = create_buffer(
        dict(
            type='mixture',
            weights=dict(offline=0.5, online=0.5),
            seed=0,
            members=dict(offline=dict(type='naive'), online=dict(type='advanced')),
        )
    )
    mix.push([{'obs': i} for i in range(4)], member='offline')
    mix.push([{'obs': i, 'priority': 0.0} for i in range(4)], member='online')
    assert mix.sample(4) is None
    assert mix.stats()['offline.sample_calls'] == 0  # all or nothing: no member drew


@pytest.mark.parametrize('storage', STORAGES)
def test_priorities_float32_cannot_hold_round_trip_at_a_tiny_alpha(storage):
    """At alpha below 1e-6 the priority is kept as a float32 column beside its leaf: a priority float32 rounds
    (1e-45, or 1e-300 to 0) left a leaf the load check said disagreed with it, so the buffer's own state_dict and
    save_data no longer loaded."""
    buf = make(storage, size=8, alpha=1e-7, eps=0.0)
    buf.push([item(i, priority=p) for i, p in enumerate([1e-300, 1e-45, 5e-324, 1.0])])
    buf.update({'replay_unique_id': [f'{NAME}_3'], 'replay_buffer_idx': [3], 'priority': [1e-301]})
    again = make(storage, size=8, alpha=1e-7, eps=0.0)
    again.load_state_dict(buf.state_dict())
    assert_same(again.state_dict(), buf.state_dict())
    assert_same(again.sample(4, 0), buf.sample(4, 0))
    damaged = buf.state_dict()
    damaged['index']['priority'][1] = 2.0  # (one priority that its leaf does not stand for)
    with pytest.raises(ValueError, match="saved 'priority' 2 at slot 1 disagrees with its leaf"):
        make(storage, size=8, alpha=1e-7, eps=0.0).load_state_dict(damaged)


@pytest.mark.parametrize('storage', STORAGES)
def test_an_extreme_priority_ratio_gives_is_weights_without_warnings(storage):
    """(leaf / min leaf) overflowed past 1.8e308 (alpha 1, priorities 5e-324 and 1): every sample warned, and under
    warnings-as-errors failed after counting its draw. The weights are computed as (min / leaf) ** beta now."""
    buf = make(storage, size=8, alpha=1.0)
    buf.push([item(0, priority=5e-324)] + [item(i, priority=1.0) for i in (1, 2, 3)])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        batches = [buf.sample(4, 0) for _ in range(16)]
    weights = np.asarray(
        [float(w) for b in batches for w in (b['IS'] if storage == 'tensor' else [d['IS'] for d in b])]
    )
    assert np.isfinite(weights).all() and (weights >= 0).all() and (weights <= 1).all()


def test_a_priority_just_above_float32s_max_is_refused_naming_the_exact_bound():
    buf = make('list', size=8)
    push_ids(buf, [0])
    with pytest.raises(ValueError, match=r"<= 3\.4028234663852886e\+38\) and >= 0; entry 0 is 3\.402823466385289e\+38"):
        buf.update({'replay_unique_id': [f'{NAME}_0'], 'replay_buffer_idx': [0], 'priority': [3.402823466385289e38]})


@pytest.mark.parametrize('btype', ['advanced', 'prioritized_episode'])
def test_ragged_priority_lists_are_refused_naming_the_key(btype):
    """Nested priority lists of different lengths got numpy's "inhomogeneous shape" error, naming nothing."""
    if btype == 'advanced':
        buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
        buf.push([{'obs': i} for i in range(4)])
        batch, prio = buf.sample(3), [[1.0, 2.0], [1.0], 3.0]
        keys = {k: [b[k] for b in batch] for k in ('replay_unique_id', 'replay_buffer_idx')}
    else:
        buf = create_buffer(dict(type='prioritized_episode', replay_buffer_size=8, seed=0, sampler=dict(unroll_len=3)))
        buf.push([[{'obs': t, 'done': t == 5} for t in range(6)]])
        batch, prio = buf.sample(3), [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0]]
        keys = {k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx')}
    before = buf.state_dict()
    with pytest.raises(ValueError, match="'priority' must be numbers in one shape"):
        buf.update({**keys, 'priority': prio})
    assert_same(buf.state_dict(), before)

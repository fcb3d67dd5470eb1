"""What ``sample`` returns: ``storage.output`` ('items': per-item dicts on tensor storage, the layout DI-engine's
policies collate) and the ``deque`` preset's draws, which follow Python's ``random`` as DI-engine's
``DequeBuffer`` does."""

import random

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer


def transitions(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            'obs': torch.randn(4, generator=g),
            'action': torch.tensor([i % 2]),
            'reward': float(i),
            'done': i % 5 == 4,
            'nested': {'h': torch.full((2, 3), float(i))},
        }
        for i in range(n)
    ]


def make(kind, output, **cfg):
    return create_buffer(
        dict(type=kind, replay_buffer_size=64, seed=3, storage=dict(type='tensor', output=output), **cfg)
    )


@pytest.mark.parametrize('kind', ['naive', 'advanced', 'elastic'])
def test_items_are_the_rows_of_the_batch_the_same_seed_draws(kind):
    batch_buf, items_buf = make(kind, 'batch'), make(kind, 'items')
    for buf in (batch_buf, items_buf):
        buf.push(transitions(20))
    batch, items = batch_buf.sample(8, 0), items_buf.sample(8, 0)
    assert isinstance(items, list) and len(items) == 8
    for i, item in enumerate(items):
        assert torch.equal(item['obs'], batch['obs'][i]) and item['obs'].shape == (4,)
        assert torch.equal(item['action'], batch['action'][i]) and item['action'].dtype == torch.int64
        assert torch.equal(item['nested']['h'], batch['nested']['h'][i])
        assert item['reward'] == batch['reward'][i].item() and type(item['reward']) is float
        assert item['done'] is bool(batch['done'][i])
        assert item['replay_unique_id'] == f"buffer_{int(batch['replay_unique_id'][i])}"
        assert item['replay_buffer_idx'] == int(batch['replay_buffer_idx'][i])
        if kind == 'advanced':
            for key in ('priority', 'IS', 'use', 'staleness'):
                assert item[key] == batch[key][i].item()
    for buf in (batch_buf, items_buf):
        buf.close()


def test_items_hold_copies_writing_one_changes_nothing_stored():
    buf = make('naive', 'items')
    buf.push(transitions(10))
    items = buf.sample(10, 0)
    before = buf.state_dict()
    for item in items:
        item['obs'].fill_(-1.0)
        item['nested']['h'].zero_()
    assert_same(buf.state_dict(), before)
    buf.close()


def test_items_ids_feed_update_as_a_dingengine_learner_sends_them():
    """DI-engine's learner builds priority_info from per-item ``replay_unique_id`` / ``replay_buffer_idx``."""
    buf = make('advanced', 'items', alpha=1.0)
    buf.push(transitions(16))
    items = buf.sample(16, 0)
    info = {
        'replay_unique_id': [d['replay_unique_id'] for d in items],
        'replay_buffer_idx': [d['replay_buffer_idx'] for d in items],
        'priority': [100.0 if d['reward'] == 3.0 else 1e-3 for d in items],
    }
    assert buf.update(info)['updated'] == 16
    drawn = [d['reward'] for _ in range(4) for d in buf.sample(16, 0)]
    assert drawn.count(3.0) > 56  # 64 draws; the item's share of the priority mass: 100 / (100 + 15e-3)
    before = buf.state_dict()
    bad = dict(info, priority=[float('nan')] + info['priority'][1:])
    with pytest.raises(ValueError, match='priority'):
        buf.update(bad)
    assert_same(buf.state_dict(), before)
    buf.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('priority', [False, True])
def test_deque_items_carry_no_ids_on_any_storage(storage, priority):
    """Only the uniform deque on list storage handed out replay_unique_id / replay_buffer_idx with items."""
    buf = create_buffer(dict(type='deque', priority=priority, seed=0, storage=dict(type=storage, output='items')))
    buf.push([{'obs': torch.zeros(2), 'reward': 1.0} for _ in range(4)])
    assert [sorted(d) for d in buf.sample(3, 0)] == [['obs', 'reward']] * 3


def test_deque_on_items_keeps_its_api():
    buf = create_buffer(
        dict(type='deque', priority=True, priority_IS_weight=True, seed=0, storage=dict(type='tensor', output='items'))
    )
    buf.push(transitions(10))
    out = buf.sample(4, 0)
    assert [sorted(d) for d in out] == [['IS', 'action', 'done', 'nested', 'obs', 'reward']] * 4
    assert buf.update({'priority': [1.0, 2.0, 3.0, 4.0]}) == {'updated': 4, 'stale': 0}
    buf.close()


@pytest.mark.parametrize(
    'cfg, needle',
    [
        (dict(type='naive', storage=dict(type='list', output='batch')), "'storage.output'='batch' needs"),
        (dict(type='naive', storage=dict(type='tensor', output='item')), "'storage.output' has invalid value"),
        (dict(type='naive', storage=dict(type='tensor', output=['items'])), "'storage.output'"),
        (dict(type='sequence', storage=dict(type='tensor', output='items')), "'sequence'.*; use None, or list storage"),
        (dict(type='sequence', storage=dict(type='list', output='items')), "'sequence'.*; use None (list storage's"),
        (dict(type='episode', storage=dict(type='tensor', output='items')), "not supported by type 'episode'"),
        (
            dict(type='prioritized_episode', storage=dict(type='tensor', output='items')),
            "not supported by type 'prioritized_episode'.*; use None (the storage's own layout",
        ),
    ],
)
def test_output_settings_that_cannot_work_are_refused_by_name(cfg, needle):
    with pytest.raises(ValueError, match=needle.replace('(', r'\(').replace('[', r'\[')):
        create_buffer(cfg)


def test_list_storage_samples_the_stored_objects_by_default():
    buf = create_buffer(dict(type='naive', seed=0, storage=dict(type='list')))
    stored = [{'x': i} for i in range(5)]
    buf.push(stored)
    out = buf.sample(5, 0)
    assert sorted(d['x'] for d in out) == [0, 1, 2, 3, 4]
    assert all(any(d is s for s in stored) for d in out)  # DI-engine's naive buffer: the same objects
    buf.close()


@pytest.mark.parametrize('kind', ['naive', 'elastic'])
def test_list_storage_items_carry_their_id_and_slot_and_feed_the_ids_a_push_gave(kind):
    """``output='items'`` on list storage: new dicts carrying ``replay_unique_id`` / ``replay_buffer_idx``, as on
    tensor storage (DI-engine's task pipeline keys each sampled item by its id); the stored dicts are unchanged."""
    cfg = dict(type=kind, seed=0, replay_buffer_size=4, storage=dict(type='list', output='items'))
    outs = {}
    for storage in ('list', 'tensor'):
        buf = create_buffer(dict(cfg, storage=dict(type=storage, output='items')))
        stored = [{'x': torch.tensor(float(i))} for i in range(6)]  # 6 into 4 slots: ids 2..5 remain
        buf.push(stored)
        out = buf.sample(4, 0)
        assert all(set(d) == {'x', 'replay_unique_id', 'replay_buffer_idx'} for d in out), out
        assert all(set(s) == {'x'} for s in stored)  # nothing written into what the user pushed
        for d in out:
            i = int(d['x'])
            assert d['replay_unique_id'] == f'buffer_{i}' and d['replay_buffer_idx'] == i % 4, d
        outs[storage] = sorted((d['replay_unique_id'], d['replay_buffer_idx']) for d in out)
        buf.close()
    assert outs['list'] == outs['tensor'] == [(f'buffer_{i}', i % 4) for i in range(2, 6)]


def test_list_storage_items_leave_objects_other_than_dicts_as_they_are():
    buf = create_buffer(dict(type='naive', seed=0, storage=dict(type='list', output='items')))
    buf.push([7, (1, 2), {'x': 1}])
    out = buf.sample(3, 0)
    assert sorted(map(repr, out)) == sorted(
        map(repr, [7, (1, 2), {'x': 1, 'replay_unique_id': 'buffer_2', 'replay_buffer_idx': 2}])
    )
    buf.close()
    deque = create_buffer(dict(type='deque', seed=0, storage=dict(type='list', output='items')))
    deque.push([7, (1, 2), {'x': 1}])  # deque leaves its inner id keys out
    assert sorted(map(repr, deque.sample(3, 0))) == sorted(map(repr, [7, (1, 2), {'x': 1}]))
    deque.close()


# ---------------------------------------------------------------------------------------------- deque draws
def dingengine_deque_draw(stored, size):
    """What DI-engine's DequeBuffer.sample(size) returns from ``stored`` (oldest first): random.sample."""
    return random.sample(stored, k=size)


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_unseeded_deque_draws_what_dingengines_deque_buffer_draws(storage):
    buf = create_buffer(dict(type='deque', replay_buffer_size=50, storage=dict(type=storage, output='items')))
    stored = []
    for step in range(6):
        new = [{'x': 100 * step + i} for i in range(13)]
        buf.push(new)
        stored = (stored + [d['x'] for d in new])[-50:]  # a deque of maxlen 50
        random.seed(step)
        ours = [d['x'] for d in buf.sample(9, step)]
        random.seed(step)
        assert ours == dingengine_deque_draw(stored, 9)
    buf.close()


def test_unseeded_deque_leaves_numpys_global_stream_alone():
    """DI-engine's exploration draws from numpy's global RNG: building and sampling the buffer must not shift it."""
    np.random.seed(5)
    expected = np.random.random(3)
    np.random.seed(5)
    buf = create_buffer(dict(type='deque'))
    buf.push([{'x': i} for i in range(10)])
    buf.sample(4, 0)
    assert np.array_equal(np.random.random(3), expected)
    buf.close()


def test_seeded_deque_draws_from_its_own_rng_reproducibly():
    def draws():
        buf = create_buffer(dict(type='deque', seed=7))
        buf.push([{'x': i} for i in range(30)])
        random.seed(0)
        a = [d['x'] for d in buf.sample(10, 0)]
        random.seed(1)  # Python's stream does not matter with a seed
        b = [d['x'] for d in buf.sample(10, 0)]
        buf.close()
        return a, b

    first, second = draws(), draws()
    assert first == second and first[0] != first[1]


def test_string_ids_of_other_buffers_or_malformed_count_as_stale():
    """A DI-engine learner sends ``f"{instance_name}_{id}"`` strings; another buffer's, or one that is not a
    decimal number after the prefix (``'²'`` is a digit int() refuses), is stale, never a crash or a wrong slot."""
    buf = make('advanced', 'items')
    buf.push(transitions(4))
    items = buf.sample(4, 0)
    ids = [d['replay_unique_id'] for d in items]
    slots = [d['replay_buffer_idx'] for d in items]
    n = len('buffer_')
    forged = [ids[0], 'other_' + ids[1][n:], 'buffer_\u00b2', 'buffer_ ' + ids[3][n:]]
    assert buf.update({'replay_unique_id': forged, 'replay_buffer_idx': slots, 'priority': [2.0] * 4}) == {
        'updated': 1,
        'stale': 3,
    }
    assert buf.update({'replay_unique_id': ids, 'replay_buffer_idx': slots, 'priority': [3.0] * 4}) == {
        'updated': 4,
        'stale': 0,
    }
    buf.close()

"""Tests for ``ding_buffer.storage``: the slot ring, the write protocol, list and tensor storages, builders."""

import os

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.storage import ListStorage, RingIndex, TensorStorage, build_storage, storage_from_state
from ding_buffer.storage.tree import path_name

# ====================================================================== helpers


def fill(storage, items):
    """prepare + write a list of items, returning the WriteResult."""
    return storage.write(storage.prepare(items))


def transition(i, obs_dim=3):
    """A deterministic tensor-storage item whose values encode ``i``."""
    return {
        'obs': {
            'vec': torch.full((obs_dim,), float(i)),
            'img': np.full((2, 2), i % 256, dtype=np.uint8),
        },
        'action': i,
        'reward': float(i) / 2,
        'done': bool(i % 2),
    }


def batch_of(values, obs_dim=3):
    """A batched dict (leading dim len(values)) whose rows encode ``values``."""
    v = np.asarray(values)
    return {
        'obs': {
            'vec': torch.tensor(v, dtype=torch.float32)[:, None].repeat(1, obs_dim),
            'img': np.repeat((v % 256).astype(np.uint8)[:, None, None], 2, 1).repeat(2, 2),
        },
        'action': torch.tensor(v, dtype=torch.int64),
        'reward': torch.tensor(v / 2, dtype=torch.float32),
        'done': torch.tensor(v % 2 == 1),
    }


def stored_values(storage):
    """The ``action`` values of the stored items, oldest first."""
    return storage.gather(storage.ring.ordered_slots())['action'].tolist()


# ====================================================================== RingIndex


class RingModel:
    """Brute-force reference: ``tail`` moves by one per write (mod capacity), ``data[slot]`` is a uid or None."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.data = [None] * capacity
        self.tail = 0
        self.next_uid = 0
        self.push_count = 0

    def commit(self, n):
        slots, uids, overwritten = [], [], []
        for _ in range(n):
            s = self.tail
            if self.data[s] is not None:
                overwritten.append(s)
            self.data[s] = self.next_uid
            slots.append(s)
            uids.append(self.next_uid)
            self.next_uid += 1
            self.tail = (self.tail + 1) % self.capacity
        self.push_count += n
        return slots, uids, overwritten

    def remove(self, slots):
        removed = sorted({s for s in slots if self.data[s] is not None})
        for s in removed:
            self.data[s] = None
        return removed

    def clear(self):
        self.data = [None] * self.capacity
        self.tail = self.next_uid % self.capacity  # ids stay derivable from slots

    def ordered(self):
        valid = [s for s in range(self.capacity) if self.data[s] is not None]
        return sorted(valid, key=lambda s: self.data[s])


def check_ring_against_model(ring, model, rng):
    expected_order = model.ordered()
    valid = np.array([d is not None for d in model.data])
    np.testing.assert_array_equal(ring.valid, valid)
    assert ring.count == int(ring.valid.sum()) == len(expected_order)
    assert ring.tail == model.tail
    assert ring.next_uid == model.next_uid
    assert ring.push_count == model.push_count
    assert 0 <= ring.head < ring.capacity
    assert ring.count <= ring.span <= ring.capacity
    if ring.count:
        assert ring.valid[ring.head]
        assert ring.head == expected_order[0]
    # uids: -1 on empty slots, the model's ids on valid ones
    np.testing.assert_array_equal(ring.uid, [-1 if d is None else d for d in model.data])
    order = ring.ordered_slots()
    assert order.tolist() == expected_order
    uids = ring.uid[order]
    assert (np.diff(uids) > 0).all()  # unique and increasing in insertion order
    # every valid slot lies within [head, head + span)
    inside = (ring.head + np.arange(ring.span)) % ring.capacity
    assert set(expected_order) <= set(inside.tolist())
    if ring.count:
        positions = rng.integers(0, ring.count, size=5)
        assert ring.slots_of_positions(positions).tolist() == [expected_order[p] for p in positions]
        k = int(rng.integers(0, ring.count + 1))
        assert ring.oldest(k).tolist() == expected_order[:k]


@pytest.mark.parametrize('capacity', [1, 5, 8])
def test_ring_random_ops_match_brute_force_model(capacity):
    rng = np.random.default_rng(1234 + capacity)
    ring, model = RingIndex(capacity), RingModel(capacity)
    for _ in range(300):
        op = rng.choice(['commit', 'remove', 'clear'], p=[0.55, 0.4, 0.05])
        if op == 'commit':
            n = int(rng.integers(1, capacity + 1))
            slots, uids, overwritten = ring.commit(n)
            m_slots, m_uids, m_over = model.commit(n)
            assert slots.tolist() == m_slots
            assert uids.tolist() == m_uids
            assert overwritten.tolist() == m_over
        elif op == 'remove':
            # a random mix of valid and invalid slots, with duplicates
            k = int(rng.integers(0, capacity + 1))
            chosen = rng.integers(0, capacity, size=k)
            removed = ring.remove(chosen)
            assert removed.tolist() == model.remove(chosen.tolist())
        else:
            next_uid = ring.next_uid
            ring.clear()
            model.clear()
            assert ring.next_uid == next_uid
        check_ring_against_model(ring, model, rng)


def test_positions_of_a_large_ring_with_holes_match_its_order():
    """A large ring with holes finds positions through per-block counts instead of listing every slot: the same
    slots as ``ordered_slots()`` (checked against the brute-force model above) after any mix of writes (batches,
    single ones, wrapping), removals and clears."""
    rng = np.random.default_rng(7)
    capacity = 100_003  # (not a multiple of the block size)
    ring = RingIndex(capacity)
    ring.commit(capacity)
    for step in range(120):
        op = rng.choice(['commit', 'one', 'remove', 'clear'], p=[0.3, 0.2, 0.48, 0.02])
        if op == 'commit':
            ring.commit(int(rng.integers(1, 5000)))
        elif op == 'one':
            for _ in range(int(rng.integers(1, 50))):
                ring.commit_one()
        elif op == 'remove':
            ring.remove(rng.integers(0, capacity, size=int(rng.integers(1, 20000))))
        else:
            ring.clear()
            ring.commit(int(rng.integers(40_000, capacity)))
        if ring.count:
            order = ring.ordered_slots()
            positions = rng.integers(0, ring.count, size=int(rng.integers(1, 120)))
            positions[:2] = [0, ring.count - 1]
            assert ring.slots_of_positions(positions).tolist() == order[positions].tolist(), (step, op)


def test_ring_rejects_bad_capacity():
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError):
            RingIndex(bad)


def test_ring_commit_fills_then_overwrites_oldest():
    ring = RingIndex(4)
    slots, uids, over = ring.commit(3)
    assert slots.tolist() == [0, 1, 2] and uids.tolist() == [0, 1, 2] and over.tolist() == []
    assert (ring.head, ring.tail, ring.span, ring.count, ring.push_count, ring.next_uid) == (0, 3, 3, 3, 3, 3)

    slots, uids, over = ring.commit(3)  # wraps: slot 3, then overwrites 0 and 1
    assert slots.tolist() == [3, 0, 1]
    assert uids.tolist() == [3, 4, 5]
    assert over.tolist() == [0, 1]
    assert (ring.head, ring.tail, ring.span, ring.count, ring.push_count, ring.next_uid) == (2, 2, 4, 4, 6, 6)
    assert ring.ordered_slots().tolist() == [2, 3, 0, 1]
    assert ring.uid.tolist() == [4, 5, 2, 3]


def test_ring_next_slots_does_not_change_state():
    ring = RingIndex(4)
    ring.commit(3)
    before = ring.state_dict()
    assert ring.next_slots(3).tolist() == [3, 0, 1]
    assert_same(ring.state_dict(), before)


def test_ring_remove_middle_makes_holes_and_head_is_trimmed():
    ring = RingIndex(6)
    ring.commit(5)  # slots 0..4, uids 0..4
    assert ring.remove(np.array([2, 3, 3, 5])).tolist() == [2, 3]  # 5 was never valid
    assert (ring.head, ring.span, ring.count) == (0, 5, 3)
    assert ring.ordered_slots().tolist() == [0, 1, 4]
    assert ring.slots_of_positions([0, 1, 2]).tolist() == [0, 1, 4]
    assert ring.uid.tolist() == [0, 1, -1, -1, 4, -1]

    ring.remove([0])  # head becomes 1
    assert (ring.head, ring.span, ring.count, ring.tail) == (1, 4, 2, 5)
    ring.remove([1])  # trims the head across the holes at 2 and 3
    assert (ring.head, ring.span, ring.count, ring.tail) == (4, 1, 1, 5)
    assert ring.ordered_slots().tolist() == [4]

    ring.remove([4])  # empty: head collapses onto tail, next write goes to the tail
    assert (ring.head, ring.span, ring.count, ring.tail) == (5, 0, 0, 5)
    assert ring.ordered_slots().tolist() == []
    slots, uids, _ = ring.commit(2)
    assert slots.tolist() == [5, 0] and uids.tolist() == [5, 6]


def test_ring_overwrite_with_holes_counts_only_valid_overwrites():
    ring = RingIndex(4)
    ring.commit(4)
    ring.remove([1])  # hole right after the head
    slots, uids, over = ring.commit(2)  # writes slots 0 and 1: only 0 held an item
    assert slots.tolist() == [0, 1]
    assert over.tolist() == [0]
    assert ring.count == 4
    assert ring.head == 2
    assert ring.ordered_slots().tolist() == [2, 3, 0, 1]
    assert ring.uid[ring.ordered_slots()].tolist() == [2, 3, 4, 5]


def test_ring_ordered_and_positions_without_holes():
    ring = RingIndex(5)
    ring.commit(4)
    ring.commit(3)  # head at 2, full, no holes
    assert ring.count == ring.span == 5
    assert ring.ordered_slots().tolist() == [2, 3, 4, 0, 1]
    assert ring.slots_of_positions(np.array([0, 2, 4])).tolist() == [2, 4, 1]
    assert ring.oldest(2).tolist() == [2, 3]


def test_ring_clear_keeps_next_uid_and_push_count():
    ring = RingIndex(3)
    ring.commit(3)
    ring.commit(2)
    ring.clear()
    # the next write goes to slot next_uid % capacity: ids stay derivable from slots
    assert (ring.count, ring.head, ring.span, ring.tail) == (0, 2, 0, 2)
    assert not ring.valid.any() and (ring.uid == -1).all()
    assert ring.next_uid == 5 and ring.push_count == 5
    slots, uids, over = ring.commit(1)
    assert slots.tolist() == [2] and uids.tolist() == [5] and over.tolist() == []
    assert ring.uid.tolist() == [-1, -1, 5]


def test_ring_state_dict_round_trip_with_holes():
    ring = RingIndex(6)
    ring.commit(5)
    ring.commit(3)
    ring.remove([4])
    state = ring.state_dict()
    back = RingIndex.from_state(state, 6)
    for attr in ('capacity', 'head', 'span', 'count', 'next_uid', 'push_count', 'tail'):
        assert getattr(back, attr) == getattr(ring, attr), attr
    np.testing.assert_array_equal(back.valid, ring.valid)
    np.testing.assert_array_equal(back.uid, ring.uid)
    np.testing.assert_array_equal(back.ordered_slots(), ring.ordered_slots())
    # the restored ring owns its arrays
    state['valid'][:] = False
    assert back.valid.sum() == ring.count


def _ring_state():
    ring = RingIndex(5)
    ring.commit(4)
    ring.remove([1])
    return ring.state_dict()  # head 0, span 4, valid [T, F, T, T, F], uids 0..3, next_uid 4


def test_ring_from_state_rejects_wrong_capacity():
    with pytest.raises(ValueError, match='capacity'):
        RingIndex.from_state(_ring_state(), 6)


@pytest.mark.parametrize('key', ['capacity', 'head', 'span', 'valid', 'uid', 'next_uid', 'push_count'])
def test_ring_from_state_rejects_missing_key(key):
    state = _ring_state()
    del state[key]
    with pytest.raises(ValueError, match=key):
        RingIndex.from_state(state, 5)


def test_ring_from_state_rejects_valid_slot_outside_head_tail():
    state = _ring_state()
    state['valid'][4] = True  # slot 4 is the tail, outside [0, 4)
    state['uid'][4] = 3
    with pytest.raises(ValueError):
        RingIndex.from_state(state, 5)


def test_ring_from_state_rejects_invalid_head():
    state = _ring_state()
    state['valid'][0] = False  # head must be valid while count > 0
    with pytest.raises(ValueError):
        RingIndex.from_state(state, 5)


def test_ring_from_state_rejects_uid_not_below_next_uid():
    state = _ring_state()
    state['uid'][2] = state['next_uid']
    with pytest.raises(ValueError, match='unique ids'):
        RingIndex.from_state(state, 5)


def test_ring_from_state_rejects_bad_geometry():
    for key, value in (('head', 5), ('head', -1), ('span', 6), ('span', 2)):  # span 2 < count 3
        state = _ring_state()
        state[key] = value
        with pytest.raises(ValueError):
            RingIndex.from_state(state, 5)
    state = _ring_state()
    state['valid'] = torch.zeros(4, dtype=torch.bool)
    with pytest.raises(ValueError, match='shape'):
        RingIndex.from_state(state, 5)


def test_ring_from_state_rejects_duplicate_uids():
    state = _ring_state()  # valid slots 0, 2, 3 in insertion order
    state['uid'] = torch.tensor([0, -1, 0, 3, -1])
    with pytest.raises(ValueError, match='do not match their slots'):
        RingIndex.from_state(state, 5)


@pytest.mark.parametrize('key', ['next_uid', 'push_count'])
def test_ring_from_state_rejects_negative_counters(key):
    state = RingIndex(3).state_dict()
    state[key] = -1
    with pytest.raises(ValueError):
        RingIndex.from_state(state, 3)


def test_ring_from_state_rejects_uids_out_of_insertion_order():
    state = _ring_state()  # valid slots 0, 2, 3 in insertion order, uids 0, 2, 3
    state['uid'] = torch.tensor([3, -1, 2, 0, -1])  # unique and < next_uid, but decreasing
    with pytest.raises(ValueError):
        RingIndex.from_state(state, 5)


# ====================================================================== Storage.write with dropped items


def test_write_more_items_than_capacity_keeps_newest_and_advances_counters():
    storage = ListStorage(4)
    a, b = object(), object()
    fill(storage, [a, b])  # slots 0, 1; tail 2
    items = [{'i': i} for i in range(6)]
    prepared = storage.prepare(items)
    assert prepared.n == 4 and prepared.dropped == 2
    assert prepared.skipped == items[:2]
    result = storage.write(prepared)
    # as if all 6 were written from the tail (slots 2, 3, 0, 1, 2, 3): the newest 4 end in slots 0..3
    assert result.slots.tolist() == [0, 1, 2, 3]
    assert result.uids.tolist() == [4, 5, 6, 7]
    # evicted: the stored items (oldest first), then the pushed items that were never stored
    assert len(result.evicted) == 4
    assert all(e is x for e, x in zip(result.evicted, [a, b, items[0], items[1]]))
    ring = storage.ring
    assert (ring.count, ring.next_uid, ring.push_count, ring.head, ring.tail) == (4, 8, 8, 0, 0)
    assert [x['i'] for x in storage.gather(ring.ordered_slots())] == [2, 3, 4, 5]
    assert storage.gather(ring.ordered_slots())[0] is items[2]


def test_write_dropped_wraps_start_slot_and_evicts_full_ring():
    storage = ListStorage(3)
    fill(storage, ['a', 'b', 'c', 'd'][:3])
    fill(storage, ['d'])  # overwrites 'a'; tail 1
    assert storage.ring.tail == 1
    result = fill(storage, list('vwxyz'))  # 5 into 3: v, w dropped; x goes where it would have: (1 + 2) % 3 = 0
    assert result.slots.tolist() == [0, 1, 2]
    assert result.uids.tolist() == [6, 7, 8]
    assert result.evicted == ['b', 'c', 'd', 'v', 'w']  # every stored item, oldest first, then the skipped ones
    assert storage.gather(storage.ring.ordered_slots()) == ['x', 'y', 'z']
    assert storage.ring.push_count == 9 and storage.ring.next_uid == 9


def test_write_overwrite_returns_evicted_items_for_list_storage():
    storage = ListStorage(2)
    fill(storage, ['a', 'b'])
    result = fill(storage, ['c'])
    assert result.slots.tolist() == [0] and result.evicted == ['a']
    assert storage.gather(storage.ring.ordered_slots()) == ['b', 'c']


def test_write_dropped_tensor_storage_returns_no_evicted_items():
    storage = TensorStorage(3)
    fill(storage, [transition(0)])
    result = fill(storage, [transition(i) for i in range(1, 6)])
    assert result.evicted == []
    assert result.slots.tolist() == [0, 1, 2]  # (tail 1 + dropped 2) % 3 = 0
    assert result.uids.tolist() == [3, 4, 5]
    assert stored_values(storage) == [3, 4, 5]
    assert storage.ring.push_count == 6


# ====================================================================== ListStorage


def test_list_storage_preserves_identity():
    storage = ListStorage(5)
    objs = [object(), {'a': [1, 2]}, 'text', [None], (1, 2)]
    result = fill(storage, objs)
    got = storage.gather(result.slots)
    assert len(got) == 5 and all(g is o for g, o in zip(got, objs))
    assert storage.get(int(result.slots[1])) is objs[1]
    assert len(storage) == 5
    with pytest.raises(TypeError, match=r'cannot push None \(item 1\)'):  # None is what an empty slot holds
        storage.prepare([{'a': 1}, None])
    assert len(storage) == 5 and all(g is o for g, o in zip(storage.gather(result.slots), objs))


def test_list_storage_remove_and_clear_return_removed_objects():
    storage = ListStorage(5)
    objs = [{'i': i} for i in range(5)]
    fill(storage, objs)
    removed = storage.remove(np.array([3, 1, 1, 3]))
    assert len(removed) == 2 and removed[0] is objs[1] and removed[1] is objs[3]
    assert storage.remove([1]) == []  # already gone
    assert storage.get(1) is None and storage.get(3) is None  # references dropped
    assert len(storage) == 3
    cleared = storage.clear()
    assert len(cleared) == 3 and all(c is o for c, o in zip(cleared, [objs[0], objs[2], objs[4]]))
    assert len(storage) == 0
    assert all(storage.get(s) is None for s in range(5))


def test_list_storage_state_dict_is_a_deep_copy():
    storage = ListStorage(3)
    objs = [{'x': [i]} for i in range(3)]
    fill(storage, objs)
    state = storage.state_dict()
    state['items'][0]['x'].append(99)
    state['ring']['valid'][:] = False
    assert objs[0]['x'] == [0]
    assert storage.gather([0])[0] is objs[0]
    assert storage.ring.valid.all()


def test_list_storage_from_state_round_trip():
    storage = ListStorage(4)
    fill(storage, [{'i': i} for i in range(6)])
    storage.remove([storage.ring.ordered_slots()[1]])
    state = storage.state_dict()
    back = ListStorage.from_state(state, 4)
    assert_same(back.state_dict(), storage.state_dict())
    order = storage.ring.ordered_slots()
    assert back.ring.ordered_slots().tolist() == order.tolist()
    assert back.gather(order) == storage.gather(order)
    # the restored storage owns copies
    assert back.gather(order)[0] is not storage.gather(order)[0]
    state['items'][0]['i'] = -1
    assert back.gather(order)[0]['i'] == 2


def test_list_storage_from_state_rejects_wrong_kind():
    storage = ListStorage(2)
    fill(storage, [1])
    state = storage.state_dict()
    state['kind'] = 'tensor'
    with pytest.raises(ValueError, match='tensor'):
        ListStorage.from_state(state, 2)


def test_list_storage_from_state_rejects_item_count_mismatch():
    storage = ListStorage(3)
    fill(storage, [1, 2])
    state = storage.state_dict()
    state['items'].append(3)
    with pytest.raises(ValueError, match='items'):
        ListStorage.from_state(state, 3)


def test_list_storage_from_state_rejects_slots_not_matching_ring():
    storage = ListStorage(3)
    fill(storage, [1, 2])
    state = storage.state_dict()
    state['slots'] = torch.tensor([0, 2])
    with pytest.raises(ValueError, match='slots'):
        ListStorage.from_state(state, 3)


def test_list_storage_from_state_rejects_items_not_a_list():
    storage = ListStorage(3)
    fill(storage, [1, 2])
    state = storage.state_dict()
    state['items'] = None
    with pytest.raises(ValueError, match='items'):
        ListStorage.from_state(state, 3)


@pytest.mark.parametrize(
    'cls, key',
    [
        (ListStorage, 'ring'),
        (ListStorage, 'slots'),
        (ListStorage, 'items'),
        (TensorStorage, 'ring'),
        (TensorStorage, 'slots'),
        (TensorStorage, 'schema'),
        (TensorStorage, 'fields'),
    ],
)
def test_storage_from_state_rejects_missing_key(cls, key):
    storage = cls(3)
    fill(storage, [{'a': 1.0}])
    state = storage.state_dict()
    del state[key]
    with pytest.raises(ValueError):
        cls.from_state(state, 3)


def test_list_storage_prepare_batch_unbatches():
    storage = ListStorage(4)
    result = storage.write(storage.prepare_batch({'a': torch.arange(3), 'b': {'c': np.arange(3) * 10}}))
    got = storage.gather(result.slots)
    assert [int(g['a']) for g in got] == [0, 1, 2]
    assert [int(g['b']['c']) for g in got] == [0, 10, 20]


def test_list_storage_makes_items_only_of_the_rows_a_batch_larger_than_it_keeps():
    """A batch of 200,000 rows of a field of no bytes (what a peer sends for a few bytes) into 10 slots: only the
    newest 10 rows become items; the older ones count as pushed and dropped, as before."""
    import tracemalloc

    buf = create_buffer(dict(type='advanced', replay_buffer_size=10, seed=0))
    batch = {'obs': np.zeros((200_000, 0), dtype=np.float32), 'i': np.arange(200_000)}
    tracemalloc.start()
    try:
        assert buf.push(batch, batched=True) == 200_000  # (every row counts as pushed; the oldest are dropped)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # one item dict a row: about 70 MB
    got = buf.sample(10)
    assert sorted(int(d['i']) for d in got) == list(range(199_990, 200_000))
    assert buf.stats()['push_items'] == 200_000
    with pytest.raises(ValueError, match="item 3: 'collect_iter' must be a whole number"):
        buf.push({'i': np.arange(50), 'collect_iter': [0, 1, 2, 3.5] + [0] * 46}, batched=True)
    tracemalloc.start()
    try:  # a column of empty collect_iter rows (nothing) is checked as a column, not row by row
        assert buf.push({'i': np.zeros((200_000, 0)), 'collect_iter': np.zeros((200_000, 0), np.int64)}, batched=True)
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()
    with pytest.raises(ValueError, match="item 123: 'collect_iter' must be a finite int"):
        buf.push({'i': np.arange(300), 'collect_iter': np.where(np.arange(300) == 123, 2**61, 0)}, batched=True)
    with pytest.raises(ValueError, match=r"item 0: .* got dict \{'a': (np.int64\()?10\)?\}"):  # (a nested one: row 0's)
        buf.push({'i': np.arange(50), 'collect_iter': {'a': np.arange(10, 60)}}, batched=True)


# ====================================================================== TensorStorage: schema


def test_tensor_schema_inferred_from_first_item():
    storage = TensorStorage(4)
    item = {
        'obs': {'vec': torch.zeros(3, dtype=torch.float64), 'img': np.zeros((2, 2), dtype=np.uint8)},
        'mask': np.array([True, False]),
        'np_scalar': np.float32(1.5),
        'np_int': np.int16(3),
        'flag': True,
        'action': 2,
        'reward': 0.5,
    }
    assert storage.schema is None
    fill(storage, [item])
    assert storage.schema == {
        ('obs', 'vec'): ((3,), torch.float64),
        ('obs', 'img'): ((2, 2), torch.uint8),
        ('mask',): ((2,), torch.bool),
        ('np_scalar',): ((), torch.float32),
        ('np_int',): ((), torch.int16),
        ('flag',): ((), torch.bool),
        ('action',): ((), torch.int64),
        ('reward',): ((), torch.float32),
    }
    for path, (shape, dtype) in storage.schema.items():
        assert storage.fields[path].shape == (4, *shape) and storage.fields[path].dtype == dtype
    out = storage.gather([0])
    assert out['mask'].tolist() == [[True, False]]
    assert out['np_scalar'].tolist() == [1.5] and out['np_int'].tolist() == [3]
    assert out['flag'].tolist() == [True] and out['action'].tolist() == [2] and out['reward'].tolist() == [0.5]


@pytest.mark.parametrize(
    'name', ['uint16', 'uint32', 'uint64', 'bfloat16', 'float8_e4m3fn', 'float8_e5m2', 'float8_e8m0fnu', 'complex32']
)
@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_every_tensor_dtype_round_trips_through_a_tensor_buffers_state(name, type_):
    """A float8_e8m0fnu field was stored and saved, but its state did not load (torch has no index_put for it):
    every dtype a push takes reloads bit for bit and samples the same."""
    dtype = getattr(torch, name)
    cfg = dict(type=type_, replay_buffer_size=5, seed=0, storage=dict(type='tensor'))
    buf = create_buffer(cfg)
    for i in range(4):  # 12 pushes into 5 slots: the ring wraps
        rows = torch.arange(6 * dtype.itemsize, dtype=torch.uint8).add(i).reshape(3, -1).view(dtype)
        buf.push([{'x': row} for row in rows])
    again = create_buffer(cfg)
    again.load_state_dict(buf.state_dict())
    got, expected = again.sample(5), buf.sample(5)
    assert got['x'].dtype == dtype and torch.equal(got['x'].view(torch.uint8), expected['x'].view(torch.uint8))


@pytest.mark.parametrize('name', ['uint4', 'int2', 'bits8', 'bits16', 'float4_e2m1fn_x2'])
def test_a_dtype_torch_cannot_copy_is_refused_at_push_and_changes_nothing(name):
    """A sub-byte field failed inside the write (a bare NotImplementedError) after the schema was made and the item
    counted, so every honest push after it was refused; a bits field was stored and then no state could be taken."""
    dtype = getattr(torch, name)
    x = torch.zeros(2 * dtype.itemsize, dtype=torch.uint8).view(dtype)
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor')))
    before = buf.state_dict()
    for push in (lambda: buf.push({'x': x}), lambda: buf.extend({'x': x.reshape(1, -1)})):
        with pytest.raises(TypeError, match=f"field 'x' has dtype torch.{name}.*view the bytes as torch.uint8"):
            push()
        assert_same(buf.state_dict(), before)
    assert buf.push({'x': torch.zeros(2)}) == 1 and buf.count() == 1


def test_tensor_repr_shows_fields_shapes_dtypes():
    storage = TensorStorage(4)
    assert 'schema not yet known' in repr(storage)
    fill(storage, [{'obs': torch.zeros(3), 'action': 1, 'img': np.zeros((2, 2), np.uint8)}])
    text = repr(storage)
    assert 'capacity=4' in text and 'count=1' in text and 'device=cpu' in text
    assert "'obs': {'shape': (3,), 'dtype': float32}" in text
    assert "'action': {'shape': (), 'dtype': int64}" in text
    assert "'img': {'shape': (2, 2), 'dtype': uint8}" in text


def _filled_tensor_storage():
    storage = TensorStorage(4)
    fill(storage, [transition(i) for i in range(3)])
    return storage


@pytest.mark.parametrize(
    'mutate, field',
    [
        (lambda it: it['obs'].pop('img'), 'obs.img'),
        (lambda it: it.update(extra=torch.zeros(1)), 'extra'),
        (lambda it: it['obs'].update(vec=torch.zeros(4)), 'obs.vec'),
        (lambda it: it['obs'].update(vec=torch.zeros(3, dtype=torch.float64)), 'obs.vec'),
        (lambda it: it['obs'].update(img=np.zeros((2, 2), dtype=np.int8)), 'obs.img'),
        (lambda it: it.update(reward=np.float64(1.0)), 'reward'),
        (lambda it: it.update(action=1.5), 'action'),
        (lambda it: it.update(done=1), 'done'),
    ],
    ids=['missing', 'extra', 'shape', 'dtype', 'uint8-vs-int8', 'np-float64', 'float-into-int', 'int-into-bool'],
)
def test_tensor_mismatched_item_raises_and_writes_nothing(mutate, field):
    storage = _filled_tensor_storage()
    before = storage.state_dict()
    fields_before = {p: f.clone() for p, f in storage.fields.items()}
    bad = transition(7)
    mutate(bad)
    with pytest.raises(ValueError, match=field.replace('.', r'\.')):
        storage.prepare([transition(5), bad])  # the good item before it is not written either
    assert len(storage) == 3
    assert_same(storage.state_dict(), before)
    for p, f in storage.fields.items():
        assert torch.equal(f, fields_before[p])


@pytest.mark.parametrize(
    'first, second, told',
    [
        ({'a': {'b': 1.0}}, {'a.b': 2.0}, r"the schema's 'a\.b' is the key path \('a', 'b'\), the item's \('a\.b',\)"),
        ({'a.b': 1.0}, {'a': {'b': 2.0}}, r"the schema's 'a\.b' is the key path \('a\.b',\), the item's \('a', 'b'\)"),
        (
            {'x': 0.0, 'a': {'b': 1.0}},
            {'a.b': 2.0},
            r"missing field\(s\) \['x', 'a\.b'\].*the schema's 'a\.b' is the key path \('a', 'b'\)",
        ),
        (
            {'a': {'b': 1.0}},
            {'a': {'b': 1.0}, 'a.b': 2.0},
            r"the item's 'a\.b' is the key path \('a\.b',\), the schema's \('a', 'b'\)",
        ),
    ],
)
def test_a_dotted_key_and_its_nested_twin_are_told_apart_in_the_refusal(first, second, told):
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor')))
    buf.push(first)
    before = buf.state_dict()
    with pytest.raises(ValueError, match=told):
        buf.push(second)
    assert_same(buf.state_dict(), before)


def test_tensor_bad_batch_in_first_push_leaves_schema_unset():
    storage = TensorStorage(4)
    bad = transition(1)
    bad['obs']['vec'] = torch.zeros(5)
    with pytest.raises(ValueError, match=r'obs\.vec'):
        storage.prepare([transition(0), bad])
    assert storage.schema is None and storage.fields == {} and len(storage) == 0
    fill(storage, [bad])  # a fresh first item defines the schema
    assert storage.schema[('obs', 'vec')] == ((5,), torch.float32)


def test_tensor_python_int_into_float_field_is_accepted():
    storage = TensorStorage(3)
    fill(storage, [{'reward': 0.5}])
    fill(storage, [{'reward': 3}])
    out = storage.gather(storage.ring.ordered_slots())
    assert out['reward'].dtype == torch.float32
    assert out['reward'].tolist() == [0.5, 3.0]


def test_tensor_non_dict_item_raises_type_error():
    storage = TensorStorage(3)
    with pytest.raises(TypeError, match='item 0 is list'):
        storage.prepare([[1, 2]])
    fill(storage, [{'a': 1}])
    with pytest.raises(TypeError, match='item 1 is Tensor'):
        storage.prepare([{'a': 2}, torch.zeros(1)])
    assert len(storage) == 1


@pytest.mark.parametrize(
    'value',
    ['text', np.array([object(), object()], dtype=object), [1, 2], np.array(['a', 'b']), None],
    ids=['str', 'object-array', 'list', 'str-array', 'None'],
)
def test_tensor_unsupported_leaf_raises_type_error_naming_field(value):
    first = TensorStorage(3)
    with pytest.raises(TypeError, match=r"'obs\.bad'"):
        first.prepare([{'obs': {'bad': value}, 'ok': 1}])
    later = TensorStorage(3)
    fill(later, [{'obs': {'bad': np.zeros(2)}, 'ok': 1}])
    before = later.state_dict()
    with pytest.raises(TypeError, match=r"'obs\.bad'"):
        later.prepare([{'obs': {'bad': value}, 'ok': 1}])
    assert_same(later.state_dict(), before)


def test_tensor_non_contiguous_array_is_stored_correctly():
    storage = TensorStorage(2)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    fill(storage, [{'x': arr[:, ::-1].T}])  # non-contiguous, negative strides
    np.testing.assert_array_equal(storage.gather([0])['x'][0].numpy(), arr[:, ::-1].T)


# ====================================================================== TensorStorage: meta keys and gather


def test_tensor_gather_returns_batched_fields_and_meta():
    storage = TensorStorage(5)
    fill(storage, [transition(i) for i in range(7)])  # slots 0..4 hold 5, 6, 2, 3, 4
    slots = np.array([1, 3, 0])
    out = storage.gather(slots)
    assert out['obs']['vec'].shape == (3, 3) and out['obs']['vec'][:, 0].tolist() == [6.0, 3.0, 5.0]
    assert out['obs']['img'].shape == (3, 2, 2) and out['obs']['img'].dtype == torch.uint8
    assert out['action'].tolist() == [6, 3, 5]
    assert out['reward'].tolist() == [3.0, 1.5, 2.5]
    assert out['done'].tolist() == [False, True, True]
    assert out['replay_buffer_idx'].dtype == torch.int64 and out['replay_buffer_idx'].tolist() == [1, 3, 0]
    assert out['replay_unique_id'].dtype == torch.int64 and out['replay_unique_id'].tolist() == [6, 3, 5]


def test_tensor_gather_2d_slots_gives_sequences():
    storage = TensorStorage(6)
    fill(storage, [transition(i) for i in range(6)])
    slots = np.array([[0, 1, 2], [3, 4, 5]])
    out = storage.gather(slots)
    assert out['obs']['vec'].shape == (2, 3, 3)
    assert out['obs']['img'].shape == (2, 3, 2, 2)
    assert out['action'].shape == (2, 3) and out['action'].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert out['replay_buffer_idx'].tolist() == slots.tolist()
    assert out['replay_unique_id'].shape == (2, 3) and out['replay_unique_id'].dtype == torch.int64


def test_tensor_meta_keys_ignored_so_sampled_item_can_be_pushed_back():
    storage = TensorStorage(4)
    fill(storage, [transition(i) for i in range(2)])
    sampled = storage.gather([1])
    item = {'obs': {k: v[0] for k, v in sampled['obs'].items()}, **{k: v[0] for k, v in sampled.items() if k != 'obs'}}
    assert 'replay_buffer_idx' in item and 'replay_unique_id' in item
    result = fill(storage, [item])
    assert result.slots.tolist() == [2] and result.uids.tolist() == [2]
    again = storage.gather([2])
    assert again['action'].tolist() == [1] and again['replay_unique_id'].tolist() == [2]
    assert set(storage.schema) == {('obs', 'vec'), ('obs', 'img'), ('action',), ('reward',), ('done',)}
    # the whole sampled batch can be pushed back as a batch too
    result = storage.write(storage.prepare_batch(storage.gather([0, 1])))
    assert result.slots.tolist() == [3, 0]
    assert stored_values(storage) == [1, 1, 0, 1]


def test_tensor_meta_keys_in_first_item_do_not_enter_schema():
    storage = TensorStorage(2)
    fill(storage, [{'x': 1.0, 'replay_buffer_idx': 7, 'replay_unique_id': 9}])
    assert set(storage.schema) == {('x',)}


# ====================================================================== TensorStorage: batched push


def test_tensor_prepare_batch_writes_rows():
    storage = TensorStorage(5)
    result = storage.write(storage.prepare_batch(batch_of([10, 11, 12])))
    assert result.slots.tolist() == [0, 1, 2]
    assert storage.schema[('obs', 'img')] == ((2, 2), torch.uint8)
    assert storage.schema[('done',)] == ((), torch.bool)
    out = storage.gather(result.slots)
    assert out['obs']['vec'].tolist() == [[10.0] * 3, [11.0] * 3, [12.0] * 3]
    assert out['obs']['img'][:, 1, 1].tolist() == [10, 11, 12]
    assert out['reward'].tolist() == [5.0, 5.5, 6.0]
    assert out['done'].tolist() == [False, True, False]


def test_tensor_prepare_batch_wraps_around_ring_end():
    storage = TensorStorage(5)
    storage.write(storage.prepare_batch(batch_of([0, 1, 2])))
    result = storage.write(storage.prepare_batch(batch_of([3, 4, 5, 6])))
    assert result.slots.tolist() == [3, 4, 0, 1]
    assert storage.ring.ordered_slots().tolist() == [2, 3, 4, 0, 1]
    out = storage.gather(storage.ring.ordered_slots())
    assert out['action'].tolist() == [2, 3, 4, 5, 6]
    assert out['obs']['vec'][:, 2].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert out['obs']['img'][:, 0, 1].tolist() == [2, 3, 4, 5, 6]
    assert out['done'].tolist() == [False, True, False, True, False]
    assert out['replay_unique_id'].tolist() == [2, 3, 4, 5, 6]


def test_tensor_prepare_batch_larger_than_capacity_keeps_newest():
    storage = TensorStorage(4)
    storage.write(storage.prepare_batch(batch_of([0])))
    prepared = storage.prepare_batch(batch_of(list(range(1, 8))))
    assert (prepared.n, prepared.dropped) == (4, 3)
    result = storage.write(prepared)
    assert result.slots.tolist() == [0, 1, 2, 3]  # (tail 1 + dropped 3) % 4 = 0
    assert result.uids.tolist() == [4, 5, 6, 7]
    assert stored_values(storage) == [4, 5, 6, 7]
    assert storage.ring.push_count == 8


def test_tensor_prepare_batch_mismatched_leading_dims_raise():
    storage = TensorStorage(4)
    batch = batch_of([0, 1, 2])
    batch['action'] = torch.arange(2)
    with pytest.raises(ValueError, match='leading'):
        storage.prepare_batch(batch)
    assert storage.schema is None


def test_tensor_prepare_batch_checks_schema():
    storage = TensorStorage(4)
    storage.write(storage.prepare_batch(batch_of([0, 1])))
    before = storage.state_dict()
    batch = batch_of([2, 3])
    batch['obs']['vec'] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r'obs\.vec'):
        storage.prepare_batch(batch)
    batch = batch_of([2, 3])
    batch['reward'] = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ValueError, match='reward'):
        storage.prepare_batch(batch)
    assert_same(storage.state_dict(), before)
    # Python int lists go into a float field
    batch = batch_of([2, 3])
    batch['reward'] = [1, 2]
    storage.write(storage.prepare_batch(batch))
    assert storage.gather([2, 3])['reward'].tolist() == [1.0, 2.0]


@pytest.mark.parametrize('first', [1.5, np.float64(1.5), torch.tensor(1.5, dtype=torch.bfloat16)])  # float32, 64, bf16
def test_a_python_int_goes_into_a_float_field_pushed_alone_or_batched_even_beyond_int64(first):
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor')))
    buf.push({'reward': first})
    buf.push([{'reward': 2**64}, {'reward': -(2**70)}, {'reward': 3}])  # one item at a time
    buf.extend({'reward': [2**64, 3]})  # a batch
    dtype = torch.float32 if type(first) is float else torch.bfloat16 if torch.is_tensor(first) else torch.float64
    got = buf.sample(6, sample_range=slice(0, 6), replace=False)['reward']
    assert got.dtype == dtype
    assert sorted(got.tolist()) == sorted(
        torch.tensor([1.5, 2.0**64, -(2.0**70), 3.0, 2.0**64, 3.0], dtype=dtype).tolist()
    )
    before = buf.state_dict()
    with pytest.raises(ValueError, match="field 'reward' int of 401 digits is beyond every float"):
        buf.push({'reward': 10**400})
    assert_same(buf.state_dict(), before)


def test_tensor_nbytes_per_item():
    storage = TensorStorage(4)
    assert storage.nbytes_per_item() == 0
    fill(storage, [transition(0)])
    # obs.vec 3 * float32, obs.img 4 * uint8, action int64, reward float32, done bool
    assert storage.nbytes_per_item() == 3 * 4 + 4 * 1 + 8 + 4 + 1


# ====================================================================== TensorStorage: devices, memmap


def test_tensor_memmap_one_file_per_field_readable_from_fresh_mapping(tmp_path):
    d = str(tmp_path / 'mm')
    storage = TensorStorage(5, memmap_dir=d)
    fill(storage, [transition(i) for i in range(7)])  # wraps: slots hold 5, 6, 2, 3, 4
    files = {path_name(p): storage.memmap_file(i, p) for i, p in enumerate(storage.schema)}
    assert sorted(os.listdir(d)) == sorted(os.path.basename(f) for f in files.values())
    assert len(set(files.values())) == 5
    expected = storage.gather(np.arange(5))
    for name, shape, dtype, want in (
        ('obs.vec', (3,), torch.float32, expected['obs']['vec']),
        ('obs.img', (2, 2), torch.uint8, expected['obs']['img']),
        ('action', (), torch.int64, expected['action']),
        ('reward', (), torch.float32, expected['reward']),
        ('done', (), torch.bool, expected['done']),
    ):
        numel = 5 * int(np.prod(shape, dtype=np.int64))
        path = files[name]
        assert os.path.getsize(path) == numel * torch.empty(0, dtype=dtype).element_size()
        mapped = torch.from_file(path, shared=True, size=numel, dtype=dtype).view(5, *shape)
        assert torch.equal(mapped, want)
    assert torch.from_file(files['action'], shared=True, size=5, dtype=torch.int64).tolist() == [5, 6, 2, 3, 4]


def test_tensor_memmap_failed_allocation_leaves_storage_untouched(tmp_path):
    (tmp_path / 'a_file').write_text('not a directory')
    storage = TensorStorage(3, memmap_dir=str(tmp_path / 'a_file' / 'mm'))
    with pytest.raises(OSError):
        storage.write(storage.prepare([{'a': 1.0}]))  # the memmap directory cannot be created
    assert storage.schema is None and storage.fields == {}
    assert len(storage) == 0
    assert storage.ring.push_count == 0 and storage.ring.next_uid == 0


def test_tensor_memmap_distinct_fields_get_distinct_files(tmp_path):
    storage = TensorStorage(3, memmap_dir=str(tmp_path))
    try:
        fill(storage, [{'a.b': 1.0, 'a': {'b': 2.0}}])
    except ValueError:
        return  # rejecting the ambiguous names up front is fine too
    assert len(os.listdir(tmp_path)) == 2


def test_tensor_memmap_needs_cpu_device(tmp_path):
    with pytest.raises(ValueError, match='memmap_dir'):
        TensorStorage(4, device='meta', memmap_dir=str(tmp_path))
    with pytest.raises(ValueError):
        TensorStorage(4, device='cuda', memmap_dir=str(tmp_path))


@pytest.mark.skipif(torch.cuda.is_available(), reason='CUDA is available here')
def test_tensor_cuda_device_without_cuda_raises():
    with pytest.raises(ValueError, match='CUDA'):
        TensorStorage(4, device='cuda')
    with pytest.raises(ValueError, match='CUDA'):
        TensorStorage(4, device='cuda:1')


# ====================================================================== TensorStorage: persistence


def _tensor_storage_with_holes():
    storage = TensorStorage(5)
    fill(storage, [transition(i) for i in range(7)])
    storage.remove([storage.ring.ordered_slots()[1]])
    return storage


def test_tensor_state_dict_round_trip():
    storage = _tensor_storage_with_holes()
    state = storage.state_dict()
    assert state['kind'] == 'tensor'
    assert [e[0] for e in state['schema']] == [['obs', 'vec'], ['obs', 'img'], ['action'], ['reward'], ['done']]
    assert state['schema'][1] == [['obs', 'img'], [2, 2], 'uint8']
    back = TensorStorage.from_state(state, 5)
    assert back.schema == storage.schema
    for attr in ('head', 'span', 'count', 'next_uid', 'push_count'):
        assert getattr(back.ring, attr) == getattr(storage.ring, attr)
    np.testing.assert_array_equal(back.ring.uid, storage.ring.uid)
    order = storage.ring.ordered_slots()
    assert_same(back.gather(order), storage.gather(order))
    assert_same(back.state_dict(), state)
    # the restored storage keeps working like the original
    fill(back, [transition(9)])
    fill(storage, [transition(9)])
    assert_same(back.state_dict(), storage.state_dict())


def test_tensor_state_dict_is_a_copy():
    storage = _tensor_storage_with_holes()
    state = storage.state_dict()
    for t in state['fields']:
        t.zero_()
    assert stored_values(storage) == [2, 4, 5, 6]


def test_tensor_state_round_trip_into_memmap(tmp_path):
    storage = _tensor_storage_with_holes()
    back = TensorStorage.from_state(storage.state_dict(), 5, memmap_dir=str(tmp_path))
    assert len(os.listdir(tmp_path)) == 5
    assert_same(back.state_dict(), storage.state_dict())


def test_tensor_state_round_trip_empty():
    storage = TensorStorage(3)
    back = TensorStorage.from_state(storage.state_dict(), 3)
    assert back.schema is None and len(back) == 0
    fill(storage, [transition(0)])
    storage.clear()
    back = TensorStorage.from_state(storage.state_dict(), 3)
    assert back.schema == storage.schema and len(back) == 0 and back.ring.next_uid == 1


def test_tensor_from_state_rejects_wrong_kind():
    state = ListStorage(5).state_dict()
    with pytest.raises(ValueError, match='list'):
        TensorStorage.from_state(state, 5)


@pytest.mark.parametrize('dtype', ['float64', 'notadtype', 'Tensor'])
def test_tensor_from_state_rejects_wrong_dtype_string(dtype):
    state = _tensor_storage_with_holes().state_dict()
    state['schema'][0][2] = dtype
    with pytest.raises(ValueError):
        TensorStorage.from_state(state, 5)


def test_tensor_from_state_rejects_wrong_field_shape():
    state = _tensor_storage_with_holes().state_dict()
    state['fields'][0] = state['fields'][0][:, :2]
    with pytest.raises(ValueError, match=r'obs\.vec'):
        TensorStorage.from_state(state, 5)
    state = _tensor_storage_with_holes().state_dict()
    state['schema'][1][1] = [4]
    with pytest.raises(ValueError, match=r'obs\.img'):
        TensorStorage.from_state(state, 5)
    state = _tensor_storage_with_holes().state_dict()
    state['fields'][2] = state['fields'][2][:-1]  # one row short
    with pytest.raises(ValueError, match='action'):
        TensorStorage.from_state(state, 5)


def test_tensor_from_state_rejects_field_count_mismatch():
    state = _tensor_storage_with_holes().state_dict()
    state['fields'].pop()
    with pytest.raises(ValueError, match='field'):
        TensorStorage.from_state(state, 5)


def test_tensor_from_state_rejects_slots_not_matching_ring():
    state = _tensor_storage_with_holes().state_dict()
    removed = int(np.flatnonzero(~state['ring']['valid'].numpy())[0])
    state['slots'] = state['slots'].clone()
    state['slots'][0] = removed
    with pytest.raises(ValueError, match='slots'):
        TensorStorage.from_state(state, 5)


def test_tensor_from_state_rejects_items_without_schema():
    state = _tensor_storage_with_holes().state_dict()
    state['schema'], state['fields'] = [], []
    with pytest.raises(ValueError, match='schema'):
        TensorStorage.from_state(state, 5)


def test_tensor_from_state_rejects_wrong_capacity():
    state = _tensor_storage_with_holes().state_dict()
    with pytest.raises(ValueError, match='capacity'):
        TensorStorage.from_state(state, 6)


# ====================================================================== build_storage / storage_from_state


def test_build_storage_kinds():
    assert isinstance(build_storage({'type': 'list'}, 3), ListStorage)
    assert isinstance(build_storage({}, 3), ListStorage)
    tensor = build_storage({'type': 'tensor', 'device': 'cpu', 'memmap_dir': None}, 3, reserved_keys=('prio',))
    assert isinstance(tensor, TensorStorage) and tensor.capacity == 3
    fill(tensor, [{'x': 1.0, 'prio': 2.0}])
    assert set(tensor.schema) == {('x',)}


def test_build_storage_list_with_memmap_raises(tmp_path):
    with pytest.raises(ValueError, match='memmap_dir'):
        build_storage({'type': 'list', 'memmap_dir': str(tmp_path)}, 3)
    assert os.listdir(tmp_path) == []


def test_storage_from_state_dispatches_and_validates():
    lst = ListStorage(3)
    fill(lst, ['a', 'b'])
    back = storage_from_state({'type': 'list'}, 3, lst.state_dict())
    assert isinstance(back, ListStorage) and back.gather(back.ring.ordered_slots()) == ['a', 'b']
    ten = TensorStorage(3)
    fill(ten, [transition(0)])
    back = storage_from_state({'type': 'tensor'}, 3, ten.state_dict())
    assert isinstance(back, TensorStorage) and stored_values(back) == [0]
    with pytest.raises(ValueError):
        storage_from_state({'type': 'list'}, 3, ten.state_dict())
    with pytest.raises(ValueError, match='dict'):
        storage_from_state({'type': 'list'}, 3, [1, 2])


def test_large_cpu_fields_ask_for_huge_pages_and_start_zeroed():
    """Fields of a large CPU tensor storage are allocated, advised to use transparent huge pages (Linux) before
    their pages are touched, and zeroed: an untouched row reads as zeros, written rows round-trip."""
    import sys

    from ding_buffer.storage.tensor_fields import advise_huge_pages

    small = torch.empty(16)
    assert advise_huge_pages(small) is False  # below two huge pages: nothing to ask for
    big = torch.empty(2**21)  # 8 MiB of float32
    thp = '/sys/kernel/mm/transparent_hugepage/enabled'
    thp_on = sys.platform.startswith('linux') and os.path.exists(thp) and '[never]' not in open(thp).read()
    assert advise_huge_pages(big) is thp_on
    storage = TensorStorage(300_000)
    storage.write(storage.prepare_batch({'obs': np.ones((5, 4), np.float32), 'a': np.arange(5)}))
    out = storage.read_at(np.array([0, 4, 5, 299_999]))
    assert out['obs'].tolist() == [[1.0] * 4, [1.0] * 4, [0.0] * 4, [0.0] * 4]
    assert out['a'].tolist() == [0, 4, 0, 0]


@pytest.mark.parametrize('capacity', [4, 40])
@pytest.mark.parametrize('row', [0, 9])
def test_a_collect_iter_is_judged_by_its_value_whatever_its_row_and_dtype(capacity, row):
    """2**60 - 1 is within the bound as a numpy int too (it was compared as a float, rounding to 2**60), whether its
    row is kept or dropped; wide unsigned and float8 tensors are read (torch has no min of them); a float16 column
    raises no warning."""
    import warnings

    buf = create_buffer(dict(type='naive', replay_buffer_size=capacity, seed=0))
    ci = np.zeros(10, np.int64)
    ci[row] = 2**60 - 1
    assert buf.push({'i': np.arange(10), 'collect_iter': ci}, batched=True) == 10
    ci[row] = 2**60
    with pytest.raises(ValueError, match=f"item {row}: 'collect_iter' must be a finite int"):
        buf.push({'i': np.arange(10), 'collect_iter': ci}, batched=True)
    for dt in (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn):
        assert buf.push({'obs': 1, 'collect_iter': torch.tensor(3).to(dt)}) == 1
        for shape in ((), (2,), (0,)):  # one per item, one per step (staleness reads their min), none
            tensors = create_buffer(
                dict(type='naive', replay_buffer_size=4, max_staleness=5, storage=dict(type='tensor'))
            )
            assert tensors.push({'x': torch.zeros(1), 'collect_iter': torch.full(shape, 3).to(dt)}) == 1
            assert tensors.sample(1, cur_learner_iter=4) is not None
            assert (tensors.sample(1, cur_learner_iter=8) is None) == bool(shape != (0,))  # (none: never stale)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert buf.push({'i': np.arange(50), 'collect_iter': np.arange(50).astype(np.float16)}, batched=True) == 50
    for bad in (np.array([True, False] * 5), np.array([3 + 5j] * 10), np.array([5] * 10, dtype='timedelta64[s]')):
        with pytest.raises(ValueError, match="item 0: 'collect_iter' must be"):
            buf.push({'i': np.arange(10), 'collect_iter': bad}, batched=True)


def test_list_storage_reads_collect_iter_once_when_an_item_is_stored():
    """Staleness is one index per sampled item whatever the items hold (R2D2 keeps a collect_iter per step): a
    slot's value (a sequence's min) is read when its item is stored (``prepare`` validates and reads it in one
    pass), so a later change of the stored dict is never seen, nor after a restore (the state holds the column); a bad
    value is refused before anything changes."""
    from ding_buffer.storage import ListStorage
    from ding_buffer.storage.base import NO_ITER

    st = ListStorage(4)
    items = [{'collect_iter': [5, 3, 9]}, {'collect_iter': 7}, {'x': 1}, 'not a dict']
    res = st.write(st.prepare(items))
    items[1]['collect_iter'] = 'later'  # read at the write: neither this change nor its badness is seen
    assert st.collect_iter(res.slots).tolist() == [3, 7, NO_ITER, NO_ITER]
    assert st.staleness(res.slots, 10).tolist() == [7, 3, -1, -1]
    items[1]['collect_iter'] = 1
    state = st.state_dict()
    restored = ListStorage.from_state(state, 4)
    assert restored.collect_iter(res.slots).tolist() == [3, 7, NO_ITER, NO_ITER]  # as stored, not as changed since
    del state['collect_iter']  # (a state of an earlier version: read from the saved items, which hold 1 now)
    assert ListStorage.from_state(state, 4).collect_iter(res.slots).tolist() == [3, 1, NO_ITER, NO_ITER]
    before = st.state_dict()
    for bad in ([{'collect_iter': 'soon'}], [{'x': 0}, {'collect_iter': 1.5}], [{'x': 0}, None]):
        with pytest.raises((ValueError, TypeError), match='collect_iter|None'):
            st.write(st.prepare(bad))
        assert_same(st.state_dict(), before)
    assert st.collect_iter(res.slots).tolist() == [3, 7, NO_ITER, NO_ITER]
    slot = st.write(st.prepare([{'collect_iter': 11}])).slots  # overwrites the oldest ({'collect_iter': [5, 3, 9]})
    assert st.collect_iter(slot).tolist() == [11]
    st.remove(res.slots[1:2])
    st.write(st.prepare([{'y': 0}]))
    assert sorted(st.collect_iter(st.ring.ordered_slots()).tolist()) == sorted([11, NO_ITER, NO_ITER, NO_ITER])
    st.clear()
    assert st.write(st.prepare([{'collect_iter': 4}])).slots.tolist() == [st.ring.ordered_slots()[0]]
    assert st.collect_iter(st.ring.ordered_slots()).tolist() == [4]


@pytest.mark.parametrize('btype', ['naive', 'advanced', 'elastic'])
def test_a_reloaded_list_storage_ages_its_items_as_the_saved_one(btype):
    """An item's ``collect_iter`` is read when it is stored; a state re-read it from the items, so a dict changed
    (or pushed twice) since made a reloaded buffer remove other items than the saved one."""
    from ding_buffer import create_buffer

    cfg = dict(type=btype, replay_buffer_size=8, seed=0, max_staleness=5)
    live = create_buffer(cfg)
    reused = {'obs': 0, 'collect_iter': 0}
    live.push(reused)
    reused['collect_iter'] = 8
    live.push(reused)
    live.push({'obs': 1, 'collect_iter': 100})
    live.push({'obs': 2})
    loaded = create_buffer(cfg)
    loaded.load_state_dict(live.state_dict())
    assert_same(loaded.state_dict(), live.state_dict())
    live.sample(1, cur_learner_iter=10)
    loaded.sample(1, cur_learner_iter=10)
    assert live.count() == loaded.count() == 3  # the first item (0) left: too stale
    assert_same(loaded.state_dict(), live.state_dict())


@pytest.mark.parametrize(
    'bad',
    [
        torch.zeros(4, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int64),
        torch.zeros(4, dtype=torch.int64, device='meta'),
        torch.zeros(4, dtype=torch.int64).to_sparse(),
        torch.full((4,), 2**60, dtype=torch.int64),
        [0, 0, 0, 0],
    ],
)
def test_a_saved_collect_iter_column_that_is_not_one_is_refused_naming_it(bad):
    from ding_buffer import create_buffer

    src = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    src.push([{'obs': i, 'collect_iter': i} for i in range(4)])
    state = src.state_dict()
    state['storage']['collect_iter'] = bad
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    before = buf.state_dict()
    with pytest.raises(ValueError, match="'collect_iter'"):
        buf.load_state_dict(state)
    assert_same(buf.state_dict(), before)


def test_a_stored_dicts_collect_iter_changed_after_push_changes_no_sample():
    """Was (with the column read lazily): a value changed after push was seen if nothing had read it yet -- a bad one
    made every later sample of ``advanced`` fail (after bumping use counts and beta), a changed one made
    ``max_staleness`` evict depending on whether the column had been read before."""
    from ding_buffer import create_buffer

    adv = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0, max_use=2))
    items = [{'obs': i, 'collect_iter': 0} for i in range(4)]
    adv.push(items)
    items[2]['collect_iter'] = 'oops'
    assert len(adv.sample(4, cur_learner_iter=3)) == 4 and len(adv.sample(4, cur_learner_iter=3)) == 4
    assert adv.count() == 0 and adv.stats()['removed_by_use'] == 4  # max_use=2: every item left

    kept = []
    for read_first in (False, True):
        buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, max_staleness=5))
        items = [{'obs': i, 'collect_iter': 10} for i in range(3)]
        buf.push(items)
        if read_first:
            buf.view.column('collect_iter', buf.view.oldest(3))
        for item in items:
            item['collect_iter'] = 0
        buf.sample(1, cur_learner_iter=10)
        kept.append(buf.count())
    assert kept == [3, 3]


def test_a_dict_subclass_is_read_as_stored_at_push_and_at_restore():
    """A dict subclass overriding ``get`` was accepted by a list push (read with ``dict.get``) and refused by the
    buffer's own state (read with its ``get``): both read the stored value now."""
    from ding_buffer import create_buffer

    class Step(dict):
        def get(self, key, default=None):
            return 1.5 if key == 'collect_iter' else super().get(key, default)

    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    buf.push([Step(obs=0, collect_iter=2), Step(obs=1)])
    again = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0))
    again.load_state_dict(buf.state_dict())
    assert_same(again.state_dict(), buf.state_dict())
    assert again.view.column('collect_iter', again.view.oldest(1)).tolist() == [2]


@pytest.mark.parametrize(
    'cfg',
    [
        dict(type='naive', storage=dict(type='tensor')),
        dict(type='advanced', storage=dict(type='tensor')),
        dict(type='episode', max_transitions=64, storage=dict(type='tensor')),
        dict(type='gfn', replay_buffer_size=8),
    ],
    ids=lambda c: c['type'],
)
def test_unsigned_fields_a_push_accepts_survive_a_state_and_a_file(cfg, tmp_path):
    """torch has no indexed writes for uint16 / 32 / 64 on the CPU: a restore writes them as a push does."""
    from ding_buffer import create_buffer

    buf = create_buffer(dict(cfg, seed=0))
    if cfg['type'] == 'gfn':
        buf.push(dict(state=torch.arange(6).reshape(3, 2).to(torch.uint32), log_reward=torch.rand(3)))
    elif cfg['type'] == 'episode':
        buf.push([[{'x': np.uint64(2**63 + i), 'y': torch.tensor([i], dtype=torch.uint16)} for i in range(3)]])
    else:
        buf.push([{'x': np.uint64(2**63 + i), 'y': torch.tensor([i], dtype=torch.uint16)} for i in range(3)])
    buf.save_data(str(tmp_path / 'u.pt'))
    for load in ('state', 'file'):
        other = create_buffer(dict(cfg, seed=0))
        if load == 'state':
            other.load_state_dict(buf.state_dict())
        else:
            other.load_data(str(tmp_path / 'u.pt'))
        assert other.count() == buf.count()
        assert_same(other.state_dict(), buf.state_dict())


@pytest.mark.parametrize('item', [{'obs': torch.ones(2), '': torch.zeros(1)}, {'obs': torch.ones(2), 'a': {'': 1}}])
def test_an_empty_field_name_is_refused_at_push_as_a_restore_would_refuse_it(item):
    from ding_buffer import create_buffer

    buf = create_buffer(dict(type='naive', storage=dict(type='tensor'), seed=0))
    buf.push({'obs': torch.zeros(2)})
    before = buf.state_dict()
    with pytest.raises(ValueError, match="field names must be non-empty str, got ''"):
        buf.push(item)
    assert_same(buf.state_dict(), before)
    fresh = create_buffer(dict(type='naive', storage=dict(type='tensor'), seed=0))
    with pytest.raises(ValueError, match="field names must be non-empty str"):
        fresh.push(item)  # the first push, which fixes the fields, refuses it too


def test_a_stored_object_that_cannot_be_copied_is_named_when_a_state_is_taken():
    """List storage keeps the pushed objects themselves; one holding a lock cannot go into a state or file: the
    error names the item (by insertion order), and the buffer is as it was."""
    import threading

    from ding_buffer import create_buffer

    buf = create_buffer(dict(type='naive', replay_buffer_size=4))
    buf.push([{'obs': 1}, {'obs': 2, 'lock': threading.Lock()}, {'obs': 3}])
    with pytest.raises(TypeError, match=r'stored item 1 \(0 = the oldest\) cannot be copied'):
        buf.state_dict()
    assert buf.count() == 3 and sorted(d['obs'] for d in buf.sample(3)) == [1, 2, 3]


@pytest.mark.parametrize('btype', ['naive', 'episode'])
def test_a_nested_tensor_in_a_batch_is_refused_naming_the_field_as_in_a_single_push(btype):
    """A batched push read its leading dimension through ``shape``, which a nested tensor lacks: torch's internal
    error named no field."""
    from ding_buffer import create_buffer

    extra = dict(max_transitions=32) if btype == 'episode' else {}
    buf = create_buffer(dict(type=btype, storage=dict(type='tensor'), seed=0, **extra))
    (buf.extend if btype == 'naive' else buf.push)({'x': torch.zeros(2, 3), 'y': torch.zeros(2)})
    before = buf.state_dict()
    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(3)])
    with pytest.raises(TypeError, match="field 'x' is a nested tensor"):
        (buf.extend if btype == 'naive' else buf.push)({'x': nested, 'y': torch.zeros(2)})
    assert_same(buf.state_dict(), before)


def test_a_stored_nested_tensor_is_named_when_a_state_cannot_copy_it():
    """torch's deepcopy of a nested tensor raises NotImplementedError: named as any object that does not copy."""
    from ding_buffer import create_buffer

    buf = create_buffer(dict(type='naive', replay_buffer_size=4))
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    buf.push([{'obs': 1}, {'obs': nested}])
    with pytest.raises(TypeError, match=r'stored item 1 \(0 = the oldest\) cannot be copied'):
        buf.state_dict()
    assert buf.count() == 2


def test_big_endian_numpy_leaves_are_stored_as_their_values_and_unknown_dtypes_are_named():
    """Arrays from h5py or np.load of a big-endian file were refused with torch's message naming no field; they
    are the same numbers (stored natively). A numpy dtype torch has no tensor of is refused naming the field."""
    from ding_buffer import create_buffer

    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type='tensor')))
    buf.push({'obs': np.array([1.5, -2.0], dtype='>f4'), 'act': 1})
    buf.extend({'obs': np.array([[3.0, 4.0]], dtype='>f4'), 'act': np.array([7], dtype='>i8')})
    batch = buf.sample(2, sample_range=slice(0, 2))
    assert batch['obs'].dtype == torch.float32
    assert sorted(map(tuple, batch['obs'].tolist())) == [(1.5, -2.0), (3.0, 4.0)]
    assert sorted(batch['act'].tolist()) == [1, 7]
    fresh = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type='tensor')))
    with pytest.raises(TypeError, match="field 'when' has numpy dtype datetime64"):
        fresh.push({'obs': np.zeros(2, dtype=np.float32), 'when': np.array([1], dtype='M8[s]')})
    assert fresh.count() == 0


def test_a_saved_field_torch_will_not_read_back_is_an_invalid_state():
    """A well-formed state whose field requires grad (torch.save keeps the flag) raised torch's RuntimeError from
    the load; it is a ValueError as other invalid states are, and the buffer is unchanged."""
    from ding_buffer import create_buffer

    for kind in ('naive', 'advanced'):
        cfg = dict(type=kind, replay_buffer_size=4, seed=0, storage=dict(type='tensor'))
        buf = create_buffer(cfg)
        buf.push([{'obs': torch.full((2,), float(i))} for i in range(3)])
        state = buf.state_dict()
        state['storage']['fields'][0] = state['storage']['fields'][0].float().requires_grad_()
        before = buf.state_dict()
        with pytest.raises(ValueError, match='invalid'):
            buf.load_state_dict(state)
        assert_same(buf.state_dict(), before)


@pytest.mark.slow
def test_a_memmap_dir_without_room_refuses_the_push_instead_of_killing_the_process(tmp_path):
    """Memmap files were sparse: the first push mapped them, and a later write into a page the disk could not hold
    killed the interpreter with SIGBUS. Their blocks are reserved when they are made: a full disk is an OSError at
    that push, which stores nothing and leaves no file."""
    import subprocess
    import sys

    mnt = tmp_path / 'small'
    mnt.mkdir()
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(mnt)], capture_output=True).returncode:
        pytest.skip('mounting a 1 MiB tmpfs needs root')
    try:
        child = (
            'import torch\n'
            'from ding_buffer import create_buffer\n'
            f"b = create_buffer(dict(type='naive', replay_buffer_size=10000, storage=dict(type='tensor', "
            f"memmap_dir={str(mnt / 'mm')!r})))\n"
            'try:\n'
            "    b.push({'obs': torch.ones(256)})\n"
            'except OSError as e:\n'
            "    print('refused', e.errno, b.count())\n"
        )
        out = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.split() == ['refused', '28', '0'], (out.stdout, out.stderr[-500:])
        assert os.listdir(mnt / 'mm') == []
    finally:
        subprocess.run(['umount', str(mnt)], capture_output=True)


def test_fields_larger_than_memory_are_refused_before_they_are_allocated(monkeypatch):
    """A capacity times an item's size beyond the machine's memory was allocated and zeroed: where memory is
    overcommitted the process was killed (here: a machine of 1 MiB, 1,000 slots of 4 KiB). The push is refused,
    naming the sizes, and changes nothing; memmap files are not memory."""
    from ding_buffer.storage import tensor_fields

    monkeypatch.setattr(tensor_fields, 'machine_memory', lambda: 1 << 20, raising=False)
    buf = create_buffer(dict(type='naive', replay_buffer_size=1000, storage=dict(type='tensor')))
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"1000 slots of 4096 bytes each need .* more than this machine's"):
        buf.push({'obs': torch.zeros(1024)})
    assert_same(buf.state_dict(), before)
    assert buf.push({'obs': torch.zeros(64)}) == 1  # 256 KiB in all: fits

"""``FreeListIndex``: the slot index of tables whose capacity rule chooses what leaves. Checked against a
brute-force model (a dict slot -> id) under random commits, removals and clears, and against ``RingIndex``'s
interface and FIFO behaviour when nothing is removed out of order."""

import inspect

import numpy as np
import pytest
import torch

from ding_buffer.storage.free_list import FreeListIndex
from ding_buffer.storage.ring import RingIndex


class Model:
    """slot -> id of the live items; free slots taken lowest first after the most recently freed ones."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}
        self.next_uid = 0

    def commit(self, n, free_order):
        slots = []
        for _ in range(n):
            if free_order:
                slot = free_order.pop()
            else:  # overwrite the oldest
                slot = min(self.items, key=self.items.get)
            self.items[slot] = self.next_uid
            self.next_uid += 1
            slots.append(slot)
        return slots

    def ordered(self):
        return sorted(self.items, key=self.items.get)


@pytest.mark.parametrize('capacity', [1, 3, 8, 17])
def test_random_operations_match_a_brute_force_model(capacity):
    rng = np.random.default_rng(capacity)
    index, model = FreeListIndex(capacity), Model(capacity)
    free = list(range(capacity - 1, -1, -1))
    for _ in range(400):
        op = rng.random()
        if op < 0.55:
            n = int(rng.integers(1, capacity + 1))
            n_free = len(free)
            slots, uids, overwritten = index.commit(n)
            expected = model.commit(n, free)
            assert slots.tolist() == expected
            assert uids.tolist() == [model.items[s] for s in expected]
            assert len(set(expected)) == n and overwritten.tolist() == expected[n_free:]
        elif op < 0.9 and model.items:
            k = int(rng.integers(1, len(model.items) + 1))
            gone = rng.choice(sorted(model.items), size=k, replace=False)
            removed = index.remove(np.concatenate([gone, gone[:1]]))  # a repeated slot is removed once
            assert sorted(removed.tolist()) == sorted(gone.tolist())
            for s in sorted(gone.tolist()):
                del model.items[s]
            free.extend(sorted(gone.tolist(), reverse=True))
        elif op < 0.93:
            index.clear()
            model.items.clear()
            free[:] = list(range(capacity - 1, -1, -1))
        assert index.count == len(model.items)
        assert index.ordered_slots().tolist() == model.ordered()
        live = np.array(model.ordered(), dtype=np.int64)
        assert index.uids(live).tolist() == [model.items[s] for s in model.ordered()]
        assert index.holds(live, index.uids(live)).all()
        if len(live):
            assert not index.holds(live, index.uids(live) + 1).any()
            k = int(rng.integers(0, len(live) + 1))
            assert index.oldest(k).tolist() == model.ordered()[:k]
            pos = rng.integers(0, len(live), size=5)
            assert index.slots_of_positions(pos).tolist() == [model.ordered()[p] for p in pos]
        restored = FreeListIndex.from_state(index.state_dict(), capacity)
        assert restored.ordered_slots().tolist() == index.ordered_slots().tolist()
        assert restored.next_uid == index.next_uid and restored.count == index.count


def test_without_out_of_order_removal_it_behaves_like_the_ring():
    ring, index = RingIndex(5), FreeListIndex(5)
    for n in (2, 3, 4, 1, 5, 2):
        a, b = ring.commit(n), index.commit(n)
        assert [x.tolist() for x in a] == [x.tolist() for x in b]
        assert ring.ordered_slots().tolist() == index.ordered_slots().tolist()
    ring.skip(3)
    index.skip(3)
    assert ring.next_uid == index.next_uid and ring.count == index.count == 0


def test_a_ring_state_loads_into_a_free_list_index_keeping_every_id():
    ring = RingIndex(4)
    ring.commit(3)
    ring.remove(np.array([0]))
    ring.commit(3)
    index = FreeListIndex.from_state(ring.state_dict(), 4)
    live = ring.ordered_slots()
    assert index.ordered_slots().tolist() == live.tolist()
    assert index.uids(live).tolist() == ring.uids(live).tolist()
    assert index.next_uid == ring.next_uid


@pytest.mark.parametrize(
    'change, needle',
    [
        (dict(capacity=5), 'capacity'),
        (dict(next_uid=-1), 'negative'),
        (dict(uid=np.array([0, 0, -1, -1])), 'distinct'),
        (dict(uid=np.array([0, 9, -1, -1])), 'next_uid'),
        (dict(uid=np.array([0, 1, 5, -1])), 'empty slot'),
        (dict(valid=np.ones(3, dtype=bool)), 'shape'),
    ],
)
def test_inconsistent_states_are_refused(change, needle):
    index = FreeListIndex(4)
    index.commit(2)
    state = dict(index.state_dict(), **change)
    with pytest.raises(ValueError, match=needle):
        FreeListIndex.from_state(state, 4)


def test_it_offers_every_public_verb_of_the_ring():
    def verbs(cls):
        return {n for n, _ in inspect.getmembers(cls) if not n.startswith('_')}

    assert verbs(RingIndex) - {'head', 'span', 'tail'} <= verbs(FreeListIndex)


def test_a_restored_index_takes_its_free_slots_in_the_saved_order():
    index = FreeListIndex(5)
    index.commit(5)
    index.remove(np.array([1]))
    index.remove(np.array([3]))
    index.remove(np.array([0]))  # freed 1, then 3, then 0: the next writes take 0, 3, 1 (the lowest freed first)
    expected = index.next_slots(3).tolist()
    restored = FreeListIndex.from_state(index.state_dict(), 5)
    assert restored.next_slots(3).tolist() == expected
    assert restored.commit(3)[0].tolist() == index.commit(3)[0].tolist() == expected


@pytest.mark.parametrize(
    'free',
    [
        [0, 3],
        [0, 3, 1, 1],
        [0, 3, 2],
        [0, 3, 1, 4],
        torch.tensor([0.2, 3.7, 1.1]),  # floats are not coerced
        torch.tensor([[0], [3], [1]]),  # nor is a 2-D array flattened
        torch.tensor([True, False, True]),
        'abc',
    ],
)
def test_a_state_whose_free_slots_are_not_its_empty_slots_is_refused(free):
    index = FreeListIndex(5)
    index.commit(5)
    index.remove(np.array([0, 1, 3]))
    state = index.state_dict()
    state['free'] = free if isinstance(free, (torch.Tensor, str)) else torch.tensor(free)
    with pytest.raises(ValueError, match="'free' must"):
        FreeListIndex.from_state(state, 5)


def test_a_full_tables_free_order_may_be_an_empty_list():
    index = FreeListIndex(3)
    index.commit(3)
    state = index.state_dict()
    state['free'] = []  # a hand-made or converted state: numpy reads [] as float64
    assert FreeListIndex.from_state(state, 3).next_slots(0).tolist() == []

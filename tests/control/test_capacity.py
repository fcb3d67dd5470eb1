"""Capacity rules (``removers=[dict(type='min_priority')]``, ``keep_best``, ``fifo``, ``lifo``): what leaves a full
table, checked call by call against a brute-force model for random pushes, priority updates and samples, on list
and tensor storage; state round trips; configurations that cannot work are refused by name."""

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer

CAPACITY = 12


class Model:
    """Every stored item: id -> priority (what ``priority`` reports). ``rule`` decides what leaves a full table."""

    def __init__(self, rule):
        self.rule = rule
        self.items = {}
        self.next_id = 0

    def _order(self, ids):
        return sorted(ids, key=lambda u: (self.items[u], u))

    def push(self, priorities):
        k = len(priorities)
        if k > CAPACITY:  # a push larger than the table: its newest items only, nothing stored stays
            self.items = {self.next_id + k - CAPACITY + i: p for i, p in enumerate(priorities[-CAPACITY:])}
            self.next_id += k
            return k  # push counts every item it took, the dropped oldest too
        need = len(self.items) + k - CAPACITY
        admitted = list(range(k))
        if need > 0:
            if self.rule == 'keep_best':  # the need lowest of stored + new (new ones newest) do not stay
                cands = [(p, u, True) for u, p in self.items.items()]
                cands += [(p, self.next_id + i, False) for i, p in enumerate(priorities)]
                out = sorted(cands, key=lambda c: (c[0], c[1]))[:need]
                for p, u, stored in out:
                    if stored:
                        del self.items[u]
                    else:
                        admitted.remove(u - self.next_id)
            else:
                if self.rule == 'min_priority':
                    gone = self._order(self.items)[:need]
                elif self.rule == 'fifo':
                    gone = sorted(self.items)[:need]
                else:  # lifo
                    gone = sorted(self.items)[::-1][:need]
                for u in gone:
                    del self.items[u]
        for i in admitted:
            self.items[self.next_id] = priorities[i]
            self.next_id += 1
        return len(admitted)

    def update(self, ids, priorities):
        for u, p in zip(ids, priorities):
            if u in self.items:
                self.items[u] = p


def stored(buf):
    view = buf.view
    slots = view.ordered_slots()
    ids = view.column('id', slots).tolist()
    prios = view.column('priority', slots).tolist() if view.has_column('priority') else [0.0] * len(ids)
    return dict(zip(ids, prios))


def make(rule, storage, **cfg):
    base = dict(
        type='advanced' if rule in ('min_priority', 'keep_best') else 'naive',
        replay_buffer_size=CAPACITY,
        seed=0,
        storage=dict(type=storage, output='items'),
        removers=[dict(type=rule)],
    )
    if base['type'] == 'advanced':
        base.update(eps=0.0, alpha=0.6)
    base.update(cfg)
    return create_buffer(base)


def items(n, prios, start):
    return [{'obs': torch.tensor([float(start + i)]), 'priority': float(p)} for i, p in enumerate(prios[:n])]


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('rule', ['min_priority', 'keep_best', 'fifo', 'lifo'])
def test_random_calls_match_the_brute_force_model(rule, storage):
    rng = np.random.default_rng(hash((rule, storage)) % 2**32)
    buf, model = make(rule, storage), Model(rule)
    prioritized = buf.view.has_column('priority')
    pushed = 0
    for step in range(300):
        op = rng.random()
        if op < 0.5 or not model.items:
            k = int(rng.choice([1, 1, 1, 2, 3, 5, CAPACITY, CAPACITY + 3]))
            prios = rng.integers(1, 10, size=k).astype(float).tolist()  # small ints: ties, exact float32
            n = buf.push(items(k, prios, pushed)) if prioritized else buf.push([{'obs': pushed + i} for i in range(k)])
            assert n == model.push(prios if prioritized else [0.0] * k), step
            pushed += k
        elif op < 0.8 and prioritized:
            batch = buf.sample(min(4, buf.count()), step)
            ids = [int(d['replay_unique_id'].split('_')[-1]) for d in batch]
            new = rng.integers(1, 10, size=len(batch)).astype(float).tolist()
            info = {
                'replay_unique_id': [d['replay_unique_id'] for d in batch],
                'replay_buffer_idx': [d['replay_buffer_idx'] for d in batch],
                'priority': new,
            }
            buf.update(info)
            last = {}
            for u, p in zip(ids, new):  # a repeated id in one update: its last priority stays
                last[u] = p
            model.update(list(last), list(last.values()))
        else:
            assert buf.sample(min(3, buf.count()), step) is not None
        assert stored(buf) == model.items, (step, rule)
        assert buf.count() == len(model.items)
    if rule in ('min_priority', 'keep_best', 'fifo', 'lifo'):
        assert buf.stats()[f'removed_by_{rule}'] > 0
    buf.close()


def test_a_state_round_trip_keeps_the_rule_working_identically(tmp_path):
    a = make('min_priority', 'tensor')
    a.push(items(CAPACITY, list(range(CAPACITY, 0, -1)), 0))
    a.push(items(3, [20.0, 0.5, 7.0], 100))
    a.save_data(str(tmp_path / 'a.pt'))
    b = make('min_priority', 'tensor')
    b.load_data(str(tmp_path / 'a.pt'))
    assert_same(b.state_dict(), a.state_dict())
    for buf in (a, b):
        buf.push(items(4, [3.0, 3.0, 9.0, 1.0], 200))
    assert stored(a) == stored(b)
    assert_same(a.sample(6, 1), b.sample(6, 1))
    for buf in (a, b):
        buf.close()


def test_a_state_saved_with_a_capacity_rule_does_not_load_into_a_ring_buffer():
    a = make('min_priority', 'list')
    a.push(items(CAPACITY, [1.0] * CAPACITY, 0))
    a.push(items(1, [5.0], 50))
    plain = create_buffer(dict(type='advanced', replay_buffer_size=CAPACITY, eps=0.0))
    before = plain.state_dict()
    with pytest.raises(ValueError, match='capacity rule'):
        plain.load_state_dict(a.state_dict())
    assert_same(plain.state_dict(), before)
    for buf in (a, plain):
        buf.close()


def test_lowest_priority_leaves_first_and_the_oldest_among_equals():
    """The buffer of the README's extension point: 'evict lowest priority first' as one config line. With every
    item at the same priority it evicts the oldest first (a FIFO), not the same slot over and over."""
    buf = make('min_priority', 'list')
    buf.push(items(CAPACITY, [2.0] * CAPACITY, 0))
    for i in range(CAPACITY):
        buf.push(items(1, [2.0], 100 + i))
        assert sorted(stored(buf)) == list(range(i + 1, CAPACITY + i + 1))
    buf.push(items(1, [0.5], 500))  # the lowest: the next to go
    buf.push(items(1, [9.0], 501))
    assert 2 * CAPACITY not in stored(buf) and 2 * CAPACITY + 1 in stored(buf)
    buf.close()


def test_keep_best_refuses_an_item_below_every_stored_one_and_counts_it():
    buf = make('keep_best', 'tensor')
    buf.push(items(CAPACITY, [5.0] * CAPACITY, 0))
    before = buf.state_dict()
    assert buf.push(items(1, [4.0], 50)) == 0
    assert buf.stats()['refused_by_keep_best'] == 1
    after = buf.state_dict()
    after['counters']['refused_by_keep_best'] = before['counters']['refused_by_keep_best']
    assert_same(after, before)  # nothing stored changed
    assert buf.push(items(1, [5.0], 51)) == 1  # as high as the lowest: enters, the oldest of the lowest leaves
    assert 0 not in stored(buf) and CAPACITY in stored(buf)
    buf.close()


@pytest.mark.parametrize(
    'cfg, needle',
    [
        (dict(type='naive', removers=[dict(type='min_priority')]), "reads column 'priority'"),
        (dict(type='naive', removers=[dict(type='keep_best', column='priority')]), "reads column 'priority'"),
        (dict(type='advanced', removers=[dict(type='keep_best', column='use')]), "knows for: priority"),
        (dict(type='advanced', removers=[dict(type='keep_best', column=3)]), "removers\\[0\\].column"),
        (dict(type='advanced', removers=[dict(type='min_priority'), dict(type='fifo')]), 'at most one'),
        (dict(type='episode', removers=[dict(type='fifo')]), "type 'episode' does not take"),
        (dict(type='sequence', removers=[dict(type='lifo')]), "type 'sequence' does not take"),
        (dict(type='gfn', removers=[dict(type='fifo')]), "type 'gfn' does not take"),
        (dict(type='advanced', removers=[dict(type='min_priorty')]), "did you mean 'min_priority'"),
    ],
)
def test_capacity_rules_that_cannot_work_are_refused_by_name(cfg, needle):
    with pytest.raises(ValueError, match=needle):
        create_buffer(cfg)


def test_a_capacity_rule_answering_garbage_changes_nothing():
    from ding_buffer.control.capacity import CapacityRule
    from ding_buffer.control.limits import REMOVER_REGISTRY

    @REMOVER_REGISTRY.register('test_capacity_garbage')
    class Garbage(CapacityRule):
        name = 'garbage'

        def evict(self, view, n):
            return np.array([-3])

    try:
        buf = create_buffer(
            dict(
                type='naive',
                replay_buffer_size=4,
                storage=dict(type='tensor'),
                removers=[dict(type='test_capacity_garbage')],
            )
        )
        buf.push([{'obs': float(i)} for i in range(4)])
        before = buf.state_dict()
        with pytest.raises(RuntimeError, match="'garbage'"):
            buf.push({'obs': 9.0})
        assert_same(buf.state_dict(), before)
        buf.close()
    finally:
        del REMOVER_REGISTRY['test_capacity_garbage']


@pytest.mark.parametrize('answer', ['uint64 past int64', 'an empty slot'])
@pytest.mark.parametrize('part', ['capacity rule', 'remover'])
def test_a_part_answering_no_stored_slot_fails_naming_it_and_changes_nothing(part, answer):
    """A uint64 slot of 2**64 - 1 wrapped to -1 (the last slot: on advanced its priority stayed in the tree and the
    buffer's own state stopped loading); a slot that holds nothing was dropped silently. Both fail the call, naming
    the part, as the docs say, and change nothing."""
    from ding_buffer.control.capacity import CapacityRule
    from ding_buffer.control.limits import REMOVER_REGISTRY, Remover

    def bad(view, n):
        if answer == 'an empty slot':
            empty = np.setdiff1d(np.arange(view.capacity), view.ordered_slots())[:1]
            assert len(empty) == 1  # (the test's own setup leaves one)
            return np.concatenate([view.oldest(n), empty])
        return np.array([2**64 - 1], dtype=np.uint64)

    class BadRule(CapacityRule):
        def evict(self, view, n):
            return bad(view, n)

    class BadRemover(Remover):
        def before_sample(self, view, cur_learner_iter):
            return bad(view, 1)

    REMOVER_REGISTRY.register('test_bad_part')(BadRule if part == 'capacity rule' else BadRemover)
    try:
        # capacity rule: 4 slots, max_use=1 empties the drawn one, then a push of 2 needs one more slot
        # remover: 8 slots, 4 stored, asked before every sample
        size = 4 if part == 'capacity rule' else 8
        cfg = dict(type='advanced', replay_buffer_size=size, seed=0, max_use=1, removers=[dict(type='test_bad_part')])
        buf = create_buffer(cfg)
        buf.push([{'obs': float(i)} for i in range(4)])
        if part == 'capacity rule':
            assert buf.sample(1) is not None and buf.count() == 3
        before = buf.state_dict()
        with pytest.raises(RuntimeError, match='test_bad_part'):
            buf.push([{'obs': 7.0}, {'obs': 8.0}]) if part == 'capacity rule' else buf.sample(1)
        assert_same(buf.state_dict(), before)
        create_buffer(cfg).load_state_dict(buf.state_dict())
        buf.close()
    finally:
        del REMOVER_REGISTRY['test_bad_part']


@pytest.fixture
def user_rules():
    """``my_oldest`` (a ``CapacityRule`` without a name), ``my_best`` (extends ``keep_best``), ``my_short`` (frees
    nothing) and ``my_garbage`` (answers a slot < 0): registered as a user module would, removed afterwards."""
    from ding_buffer.control.capacity import CapacityRule, KeepBest
    from ding_buffer.control.limits import REMOVER_REGISTRY

    class MyOldest(CapacityRule):
        def evict(self, view, n):
            return view.oldest(n)

    class MyBest(KeepBest):
        pass

    class MyShort(CapacityRule):
        def evict(self, view, n):
            return np.zeros(0, dtype=np.int64)

    class MyGarbage(CapacityRule):
        def evict(self, view, n):
            return np.array([-3])

    class MyGreedy(CapacityRule):  # answers more than the n slots asked for
        def evict(self, view, n):
            return view.oldest(n + 2)

    names = {'my_oldest': MyOldest, 'my_best': MyBest, 'my_short': MyShort, 'my_garbage': MyGarbage}
    names['my_greedy'] = MyGreedy
    for name, cls in names.items():
        REMOVER_REGISTRY.register(name)(cls)
    try:
        yield names
    finally:
        for name in names:
            del REMOVER_REGISTRY[name]


@pytest.mark.parametrize('kind', ['naive', 'elastic', 'advanced', 'deque'])
def test_a_user_capacity_rule_is_counted_under_its_registered_name(user_rules, kind):
    """Was: every CapacityRule without a ``name`` of its own was counted ``removed_by_capacity`` (the interface's
    name), not ``removed_by_<type>`` as other user removers are."""
    buf = create_buffer(dict(type=kind, replay_buffer_size=3, removers=[dict(type='my_oldest')]))
    buf.push([{'obs': i} for i in range(3)])
    buf.push({'obs': 3})
    buf.push({'obs': 4})
    stats = buf.stats()
    assert stats['removed_by_my_oldest'] == 2
    assert 'removed_by_capacity' not in stats
    assert buf.count() == 3
    buf.close()


def test_a_rule_extending_a_built_in_is_counted_under_its_own_registered_name(user_rules):
    buf = create_buffer(dict(type='advanced', replay_buffer_size=2, removers=[dict(type='my_best', column='priority')]))
    buf.push([{'obs': 0, 'priority': 5.0}, {'obs': 1, 'priority': 2.0}])
    assert buf.push({'obs': 2, 'priority': 1.0}) == 0  # below every stored one: refused
    assert buf.push({'obs': 3, 'priority': 9.0}) == 1  # obs 1 leaves
    stats = buf.stats()
    assert (stats['refused_by_my_best'], stats['removed_by_my_best']) == (1, 1)
    assert not {'refused_by_keep_best', 'removed_by_keep_best'} & set(stats)
    buf.close()


@pytest.mark.parametrize(
    'rule, needle',
    [
        ('my_short', "'my_short' freed 0 slots"),
        ('my_garbage', "'my_garbage'"),
        ('my_greedy', "'my_greedy' freed 3 slots.*needs 1 more slots"),  # evicted the extras silently
    ],
)
def test_a_failing_user_capacity_rule_is_named_by_its_registered_name(user_rules, rule, needle):
    buf = create_buffer(dict(type='naive', replay_buffer_size=3, removers=[dict(type=rule)]))
    buf.push([{'obs': i} for i in range(3)])
    with pytest.raises(RuntimeError, match=needle) as info:
        buf.push({'obs': 3})
    assert "'capacity'" not in str(info.value)
    assert buf.count() == 3
    buf.close()


def test_a_user_capacity_rule_refused_or_doubled_is_named_by_its_registered_name(user_rules):
    with pytest.raises(ValueError, match="capacity rule 'my_oldest', which type 'episode' does not take"):
        create_buffer(dict(type='episode', removers=[dict(type='my_oldest')]))
    with pytest.raises(ValueError, match=r"2 capacity rules \(my_oldest, fifo\)"):
        create_buffer(dict(type='naive', removers=[dict(type='my_oldest'), dict(type='fifo')]))


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_a_user_capacity_rule_failing_after_the_draw_leaves_the_rng_and_beta_as_they_were(kind):
    """A capacity rule of the user's (here one with an ``after_sample`` that raises once) may fail mid-sample, as
    any user part may: the failed sample moves neither the RNG nor beta, so the next sample is the one a twin that
    never failed draws."""
    from ding_buffer.control.capacity import CapacityRule
    from ding_buffer.control.limits import REMOVER_REGISTRY

    fail = [False]

    @REMOVER_REGISTRY.register('test_failing_audit')
    class OldestAndAudit(CapacityRule):
        def evict(self, view, n):
            return view.oldest(n)

        def after_sample(self, view, slots, use):
            if fail[0]:
                raise ZeroDivisionError('audit bug')
            return slots[:0]

    try:
        cfg = dict(type=kind, replay_buffer_size=16, removers=[dict(type='test_failing_audit')], seed=3)
        buf, twin = create_buffer(cfg), create_buffer(cfg)
        for b in (buf, twin):
            b.push([{'obs': i} for i in range(10)])
        before = buf.state_dict()
        fail[0] = True
        with pytest.raises(ZeroDivisionError):
            buf.sample(3)
        fail[0] = False
        assert_same(buf.state_dict(), before)
        assert [d['obs'] for d in buf.sample(3)] == [d['obs'] for d in twin.sample(3)]
    finally:
        del REMOVER_REGISTRY['test_failing_audit']


@pytest.mark.parametrize('kind', ['advanced', 'naive'])
def test_a_rule_that_writes_into_the_drawn_slots_then_raises_changes_nothing(kind):
    """A rule gets its own copy of the drawn slots: one that overwrote them before raising had the draw's use counts
    taken back from the wrong slots (negative counts, and a state that no longer loaded)."""
    from ding_buffer.control.limits import REMOVER_REGISTRY, Remover

    @REMOVER_REGISTRY.register('test_scribbler')
    class Scribbler(Remover):
        def after_sample(self, view, slots, use):
            slots[:] = 0
            raise ZeroDivisionError('scribbled')

    try:
        cfg = dict(type=kind, replay_buffer_size=8, seed=0, max_use=5, removers=[dict(type='test_scribbler')])
        buf = create_buffer(cfg)
        buf.push([{'obs': i} for i in range(8)])
        before = buf.state_dict()
        with pytest.raises(ZeroDivisionError):
            buf.sample(4)
        assert_same(buf.state_dict(), before)
        create_buffer(cfg).load_state_dict(buf.state_dict())
    finally:
        del REMOVER_REGISTRY['test_scribbler']


def test_a_rule_whose_hooks_raise_is_rebuilt_or_named_and_every_call_stays_whole(caplog):
    """``on_written`` / ``on_changed`` / ``rebuild`` hear of a change already made: a rule that raises in one of
    the first two is rebuilt from the table (logged; the call returns what it did, its counters and state whole); one
    whose ``rebuild`` raises fails the call with a ``RuntimeError`` naming it, after the change."""
    from ding_buffer.control.capacity import CapacityRule
    from ding_buffer.control.limits import REMOVER_REGISTRY

    fail = set()
    built = []

    @REMOVER_REGISTRY.register('test_hooks')
    class Hooks(CapacityRule):
        column = 'priority'

        def evict(self, view, n):
            return view.oldest(n)

        def on_written(self, view, slots):
            if 'on_written' in fail:
                raise ValueError('on_written bug')

        def on_changed(self, view, slots):
            if 'on_changed' in fail:
                raise ValueError('on_changed bug')

        def rebuild(self, view):
            if 'rebuild' in fail:
                raise ValueError('rebuild bug')
            built.append(view.count())

    try:
        cfg = dict(type='advanced', replay_buffer_size=2, seed=0, removers=[dict(type='test_hooks')])
        buf = create_buffer(cfg)
        buf.push([{'obs': 0}, {'obs': 1}])
        fail.add('on_written')
        assert buf.push({'obs': 2}) == 1  # stored: the oldest left, the rule rebuilt from the table
        assert built[-1] == 2 and 'on_written bug' in caplog.text and "'test_hooks'" in caplog.text
        assert sorted(d['obs'] for d in buf.sample(2)) == [1, 2]
        assert buf.stats()['push_items'] == 3 and buf.stats()['removed_by_test_hooks'] == 1
        fail.add('on_changed')
        s = buf.sample(2)
        ids = [d['replay_unique_id'] for d in s]
        assert buf.update({'replay_unique_id': ids, 'replay_buffer_idx': [d['replay_buffer_idx'] for d in s],
                           'priority': [3.0, 3.0]}) == {'updated': 2, 'stale': 0}  # fmt: skip
        assert buf.stats()['updated'] == 2
        fail.add('rebuild')
        with pytest.raises(RuntimeError, match=r"capacity rule 'test_hooks' raised in rebuild .*rebuild bug"):
            buf.clear()
        assert buf.count() == 0  # the change stands, as the error says
        fail.clear()
        create_buffer(cfg).load_state_dict(buf.state_dict())
    finally:
        del REMOVER_REGISTRY['test_hooks']

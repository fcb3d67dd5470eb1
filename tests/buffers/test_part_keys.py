"""The engine's part keys (``max_use``, ``max_staleness``, ``thruput_controller``, ``removers``, ``sampler``) on every
type that promises them, through the public API only -- regressions of keys that were accepted and then ignored,
half checked, or half applied:

1. built-in removers reached by name (``removers=[dict(type='max_staleness', ...)]``) take the same values as the
   top-level keys, checked when the buffer is built; an unknown remover name gets a "did you mean";
2. ``terminating_state`` keeps each item's ``collect_iter``, so ``max_staleness`` removes stale items;
3. ``deque`` takes ``max_staleness``, ``thruput_controller`` and ``removers`` and passes them to the buffer doing
   the work;
4. a sample that fails on a broken remover of the user's changes nothing (use counts, RNG, beta, counters);
5. ``advanced`` takes a ``sampler`` section: its own (prioritized), anything else refused saying why;
6. a fractional ``collect_iter`` is refused on list storage too, all or nothing.

A failing call must change nothing: ``state_dict()`` is compared before and after (``helpers.assert_same``).
"""

import logging

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.control.limits import REMOVER_REGISTRY, Remover

NAN = float('nan')
INF = float('inf')


def items(n, start=0, **extra):
    return [{'obs': np.float32(start + i), **extra} for i in range(n)]


def build_error(cfg):
    with pytest.raises(ValueError) as e:
        create_buffer(cfg)
    return str(e.value)


# ================================================================================ 1. removers by name
BAD_LIMITS = ['x', -5, 0, 0.0, NAN, -INF, True, None, [3]]


@pytest.mark.parametrize('buffer_type', ['naive', 'advanced', 'episode', 'gfn', 'deque'])
@pytest.mark.parametrize('key', ['max_use', 'max_staleness'])
@pytest.mark.parametrize('value', BAD_LIMITS, ids=repr)
def test_builtin_remover_by_name_checks_its_argument_like_the_top_level_key(buffer_type, key, value):
    """Was: ``removers=[dict(type='max_staleness', max_staleness='x')]`` built, then failed on every sample; -5
    emptied the buffer; NaN was never applied; ``max_use=0`` was accepted. Now refused when the buffer is built, with
    the top-level key's message naming ``removers[i].<key>``."""
    good = dict(type='max_use', max_use=4)
    msg = build_error(dict(type=buffer_type, removers=[good, dict(type=key, **{key: value})]))
    assert msg == f"config key 'removers[1].{key}' has invalid value {value!r}; expected a number > 0 or inf"
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # (others: the key's type check first)
        top = build_error(dict(type=buffer_type, **{key: value}))
        assert msg == top.replace(f"'{key}'", f"'removers[1].{key}'")


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_builtin_removers_by_name_work_as_the_top_level_keys(storage):
    by_name = create_buffer(
        dict(
            type='naive',
            seed=0,
            storage=dict(type=storage),
            removers=[dict(type='max_staleness', max_staleness=3), dict(type='max_use', max_use=2)],
        )
    )
    by_key = create_buffer(dict(type='naive', seed=0, storage=dict(type=storage), max_staleness=3, max_use=2))
    for buf in (by_name, by_key):
        buf.push([{'obs': np.float32(i), 'collect_iter': i} for i in range(8)])
        for _ in range(3):
            buf.sample(2, cur_learner_iter=6)
    assert by_name.stats()['removed_by_staleness'] == by_key.stats()['removed_by_staleness'] == 4
    assert by_name.stats()['removed_by_use'] == by_key.stats()['removed_by_use'] > 0
    assert_same(by_name.state_dict(), by_key.state_dict())
    inf = create_buffer(dict(type='naive', removers=[dict(type='max_use', max_use=INF)]))  # inf: no limit, as the key
    inf.push(items(2))
    for _ in range(5):
        assert inf.sample(2) is not None


@pytest.mark.parametrize(
    'name, near', [('max_stalenes', 'max_staleness'), ('max_uses', 'max_use'), ('MaxUse', ''), ('zzzqqq', '')]
)
def test_unknown_remover_type_suggests_the_closest_registered_name(name, near):
    msg = build_error(dict(type='naive', removers=[dict(type='max_use', max_use=2), dict(type=name)]))
    assert f"unknown remover type {name!r} (config key 'removers[1].type')" in msg
    registered = msg.split('registered: ')[1]  # (other test modules register rules of their own)
    assert 'max_staleness, max_use' in registered and 'import_names' in registered
    if near:
        assert f"did you mean {near!r}?" in msg
    else:
        assert 'did you mean' not in msg  # nothing close: no guess


def test_remover_entry_that_is_not_a_named_dict_is_refused():
    for entry in ('max_use', dict(max_use=2), dict(type=3)):
        assert "config key 'removers[0]' must be a dict with a 'type'" in build_error(
            dict(type='naive', removers=[entry])
        )
    assert "'removers[0]' ('max_use') has bad arguments" in build_error(
        dict(type='naive', removers=[dict(type='max_use', max_uses=2)])
    )


# ================================================================================ 2. terminating_state staleness
def gfn_batch(n, start=0, **extra):
    return {
        'state': torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, 2),
        'log_reward': torch.zeros(n),
        **extra,
    }


@pytest.mark.parametrize('as_list', [False, True])
def test_terminating_state_max_staleness_removes_stale_items(as_list):
    """Was: the conversion to terminating states dropped ``collect_iter``, so ``max_staleness`` never removed
    anything. Now the field is kept (dict batches and lists of item dicts) and staleness applies as on ``gfn``."""
    buf = create_buffer(dict(type='terminating_state', max_staleness=3, seed=0))
    data = gfn_batch(5, collect_iter=torch.arange(5), log_probs=torch.zeros(5, 7))
    if as_list:
        data = [{k: v[i] for k, v in data.items()} for i in range(5)]
    assert buf.push(data) == 5
    batch = buf.sample(2, cur_learner_iter=5)  # staleness 5, 4, 3 leave; 2, 1 stay
    assert buf.count() == 2 and buf.stats()['removed_by_staleness'] == 3
    assert sorted(batch['state'][:, 0].tolist()) == [3.0, 4.0] and sorted(batch['collect_iter'].tolist()) == [3, 4]
    assert 'log_probs' not in batch  # still only the terminating state, its reward (and its collect time)
    plain = create_buffer(dict(type='gfn', max_staleness=3, seed=0))
    plain.push(gfn_batch(5, collect_iter=torch.arange(5)))
    plain.sample(2, cur_learner_iter=5)
    assert plain.stats()['removed_by_staleness'] == 3  # what the same data does on gfn


def test_terminating_state_staleness_survives_a_state_round_trip_and_skips_items_without_collect_iter():
    buf = create_buffer(dict(type='terminating_state', max_staleness=2, seed=0))
    buf.push(gfn_batch(4, collect_iter=torch.tensor([0, 1, 8, 9])))
    other = create_buffer(dict(type='terminating_state', max_staleness=2, seed=0))
    other.load_state_dict(buf.state_dict())
    other.sample(1, cur_learner_iter=9)
    assert other.count() == 2 and other.stats()['removed_by_staleness'] == 2
    fresh = create_buffer(dict(type='terminating_state', max_staleness=2, seed=0))
    fresh.push(gfn_batch(4))  # no collect_iter: never stale
    fresh.sample(1, cur_learner_iter=100)
    assert fresh.count() == 4 and fresh.stats()['removed_by_staleness'] == 0


def test_terminating_state_bad_collect_iter_changes_nothing():
    buf = create_buffer(dict(type='terminating_state', max_staleness=2, seed=0))
    buf.push(gfn_batch(2, collect_iter=torch.tensor([1, 2])))
    before = buf.state_dict()
    for bad in (torch.tensor([1.0, NAN]), torch.tensor([True, False]), torch.tensor([1, 2**62])):
        with pytest.raises(ValueError, match='collect_iter'):
            buf.push(gfn_batch(2, 5, collect_iter=bad))
        assert_same(buf.state_dict(), before)


# ================================================================================ 3. deque
@pytest.mark.parametrize('priority', [False, True])
def test_deque_max_staleness_removes_stale_items(priority, caplog):
    """Was: ``deque`` warned that ``max_staleness`` has no effect. Now the inner buffer applies it, measured at
    ``sample``'s ``train_iter``."""
    with caplog.at_level(logging.WARNING, logger='ding_buffer'):
        buf = create_buffer(dict(type='deque', priority=priority, max_staleness=3, seed=0))
    assert not [r for r in caplog.records if 'no effect' in r.getMessage()]
    buf.push([{'obs': i, 'collect_iter': i} for i in range(6)])
    out = buf.sample(2, train_iter=5)  # staleness 5, 4, 3 leave
    assert buf.count() == 3 and buf.stats()['removed_by_staleness'] == 3
    assert all(d['obs'] >= 3 for d in out) and all(sorted(d) == ['collect_iter', 'obs'] for d in out)
    assert buf.inner.cfg.max_staleness == 3


@pytest.mark.parametrize('priority', [False, True])
def test_deque_thruput_controller_limits_pushes_and_samples(priority):
    ratio = create_buffer(dict(type='deque', priority=priority, thruput_controller=dict(sample_min_limit_ratio=2)))
    ratio.push([{'obs': i} for i in range(6)])
    assert ratio.sample(4) is None  # 6 < 2 x 4
    assert ratio.stats()['refused_sample'] == 1
    assert len(ratio.sample(3)) == 3
    rate = create_buffer(
        dict(type='deque', priority=priority, thruput_controller=dict(push_sample_rate_limit=dict(max=1.0, min=0)))
    )
    assert rate.push([{'obs': i} for i in range(6)]) == 6
    assert rate.sample(2) is not None
    assert rate.push([{'obs': i} for i in range(6)]) == 0  # pushed / sampled = 12 / 2 > 1: refused
    assert rate.stats()['refused_push'] == 1 and rate.count() == 6


@pytest.mark.parametrize('priority', [False, True])
def test_deque_sample_timeout_waits_for_the_minimum_size(priority):
    from ding_buffer.errors import SampleTimeoutError

    buf = create_buffer(dict(type='deque', priority=priority, thruput_controller=dict(sample_min_limit_ratio=2)))
    buf.push([{'obs': i} for i in range(3)])
    with pytest.raises(SampleTimeoutError, match='sample_min_limit_ratio'):
        buf.sample(2, timeout=0.05)


@pytest.fixture
def drop_oldest():
    """A user rule, registered for one test and deleted afterwards."""

    class DropOldest(Remover):
        name = 'oldest'

        def before_sample(self, table, cur_learner_iter):
            slots = table.oldest(table.count())
            return slots[:1]  # the oldest element, every sample

    REMOVER_REGISTRY.register('test_part_keys_drop_oldest')(DropOldest)
    try:
        yield 'test_part_keys_drop_oldest'
    finally:
        del REMOVER_REGISTRY['test_part_keys_drop_oldest']


@pytest.mark.parametrize('priority', [False, True])
def test_deque_removers_are_applied(priority, drop_oldest):
    """Was: ``removers`` was an unknown config key on ``deque``."""
    buf = create_buffer(dict(type='deque', priority=priority, seed=0, removers=[dict(type=drop_oldest)]))
    buf.push([{'obs': i} for i in range(5)])
    buf.sample(1)
    buf.sample(1)
    assert buf.count() == 3 and buf.stats()['removed_by_oldest'] == 2
    assert 'removed_by_oldest' in buf.inner.stats()


@pytest.mark.parametrize(
    'cfg, key',
    [
        (dict(max_staleness=-1), 'max_staleness'),
        (dict(thruput_controller=dict(sample_min_limit_ratio=0.5)), 'thruput_controller.sample_min_limit_ratio'),
        (dict(removers=[dict(type='max_staleness', max_staleness=0)]), 'removers[0].max_staleness'),
    ],
)
def test_deque_part_keys_are_checked(cfg, key):
    assert f"config key '{key}'" in build_error(dict(type='deque', **cfg))


# ================================================================================ 4. a failed sample changes nothing
class Broken(Remover):
    """Answers garbage, or raises, before or after the draw (``mode``)."""

    name = 'broken'

    def __init__(self, mode, when='after'):
        self.mode, self.when = mode, when

    def _answer(self, slots):
        if self.mode == 'raise':
            raise KeyError('the rule broke')
        return {'strings': np.array(['a']), 'floats': np.array([0.5]), 'negative': np.array([-1]),
                'past_end': np.array([10**6]), 'none': None}[self.mode]  # fmt: skip

    def before_sample(self, table, cur_learner_iter):
        return self._answer(None) if self.when == 'before' else super().before_sample(table, cur_learner_iter)

    def after_sample(self, table, slots, use):
        return self._answer(slots) if self.when == 'after' else super().after_sample(table, slots, use)


@pytest.fixture
def broken_rule():
    REMOVER_REGISTRY.register('test_part_keys_broken')(Broken)
    try:
        yield 'test_part_keys_broken'
    finally:
        del REMOVER_REGISTRY['test_part_keys_broken']


@pytest.mark.parametrize('buffer_type', ['naive', 'advanced'])
@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('mode', ['raise', 'strings', 'floats', 'negative', 'past_end', 'none'])
@pytest.mark.parametrize('when', ['after', 'before'])
def test_sample_failing_on_a_broken_user_remover_changes_nothing(buffer_type, storage, mode, when, broken_rule):
    """Was: the draw's use counts (and the RNG, advanced's beta and sampled-data window) stayed moved when a rule of
    the user's raised or answered garbage after the draw. Now the sample is all or nothing. ``max_staleness`` and
    ``max_use=1`` are configured too: there are use counts, and a rule that answered before the broken one would
    have removed something (stale items before the draw, every drawn item after it)."""
    rule = dict(type=broken_rule, mode=mode, when=when)
    it = 6 if when == 'before' else 2  # 'after': nothing stale, so nothing is removed before the draw
    buf = create_buffer(
        dict(
            type=buffer_type,
            seed=0,
            max_use=1,
            max_staleness=3,
            storage=dict(type=storage),
            removers=[rule],
            **({'anneal_step': 10} if buffer_type == 'advanced' else {}),
        )
    )
    buf.push([{'obs': np.float32(i), 'collect_iter': i} for i in range(8)])
    buf.update({})  # a no-op
    before, stats = buf.state_dict(), buf.stats()
    for kwargs in (dict(cur_learner_iter=it), dict(cur_learner_iter=it, sample_range=slice(-6, None))):
        with pytest.raises((KeyError, RuntimeError)):
            buf.sample(4, **kwargs)
        assert_same(buf.state_dict(), before)
        assert buf.stats() == stats
    if buffer_type == 'advanced':
        assert buf.beta == pytest.approx(0.4)


@pytest.mark.parametrize('buffer_type', ['naive', 'advanced'])
def test_sample_after_a_failed_one_draws_what_a_fresh_buffer_draws(buffer_type, broken_rule):
    """The failed call left no trace: the next sample (the rule fixed by loading the state into a buffer without it)
    is the one an untouched buffer draws."""
    cfg = dict(type=buffer_type, seed=3, max_use=2)
    failing = create_buffer(dict(cfg, removers=[dict(type=broken_rule, mode='raise')]))
    plain = create_buffer(cfg)
    for buf in (failing, plain):
        buf.push(items(8))
    with pytest.raises(KeyError):
        failing.sample(4)
    healed = create_buffer(cfg)
    healed.load_state_dict(failing.state_dict())
    assert_same(healed.sample(4), plain.sample(4))
    assert_same(healed.state_dict(), plain.state_dict())


def test_all_rules_answer_before_any_removes(broken_rule):
    """A before-sample rule that breaks after ``max_staleness`` answered: the stale items stay (nothing removed)."""
    buf = create_buffer(
        dict(type='naive', seed=0, max_staleness=2, removers=[dict(type=broken_rule, mode='raise', when='before')])
    )
    buf.push([{'obs': i, 'collect_iter': i} for i in range(5)])
    before = buf.state_dict()
    with pytest.raises(KeyError):
        buf.sample(1, cur_learner_iter=4)
    assert_same(buf.state_dict(), before)
    assert buf.count() == 5 and buf.stats()['removed_by_staleness'] == 0


# ================================================================================ 5. advanced's sampler section
@pytest.mark.parametrize('sampler', [{}, dict(type='prioritized')])
def test_advanced_takes_its_own_sampler_section(sampler):
    """Was: ``sampler`` was an "unknown config key" on ``advanced``."""
    with_section = create_buffer(dict(type='advanced', seed=0, sampler=sampler))
    without = create_buffer(dict(type='advanced', seed=0))
    for buf in (with_section, without):
        buf.push([{'obs': i, 'priority': float(i + 1)} for i in range(8)])
        batch = buf.sample(4)
        buf.update({'replay_unique_id': [d['replay_unique_id'] for d in batch],
                    'replay_buffer_idx': [d['replay_buffer_idx'] for d in batch], 'priority': [3.0] * 4})  # fmt: skip
    assert_same(with_section.state_dict(), without.state_dict())
    assert with_section.cfg.sampler == sampler


@pytest.mark.parametrize('name', ['uniform', 'python_random'])
def test_advanced_draws_with_another_sampler_when_named(name):
    """Was: refused ("type 'advanced' draws by priority"). Another sampler now draws the batches: every stored item is
    a candidate whatever its priority, IS weights are 1, and priorities stay for update() and capacity rules."""
    import random

    random.seed(0)
    buf = create_buffer(dict(type='advanced', seed=0, sampler=dict(type=name)))
    buf.push([{'obs': i, 'priority': p} for i, p in enumerate([1e-6, 1e-6, 1e-6, 1e3])])
    drawn = [d for _ in range(200) for d in buf.sample(4)]
    counts = np.bincount([d['obs'] for d in drawn], minlength=4)
    assert counts.min() > 120, counts  # ~200 each; by priority item 3 would be nearly every draw
    assert {float(d['IS']) for d in drawn} == {1.0}
    first = drawn[0]
    ids = {'replay_unique_id': [first['replay_unique_id']], 'replay_buffer_idx': [first['replay_buffer_idx']]}
    out = buf.update({**ids, 'priority': [5.0]})
    assert out == {'updated': 1, 'stale': 0}


def test_advanced_sampler_section_refuses_arguments_and_unknown_names():
    msg = build_error(dict(type='advanced', sampler=dict(type='prioritized', alpha=0.9)))
    assert "'sampler.alpha'" in msg and 'top-level keys' in msg
    assert "unknown sampler type 'prioritised'" in build_error(dict(type='advanced', sampler=dict(type='prioritised')))
    assert "'sampler.type' must be a str" in build_error(dict(type='advanced', sampler=dict(type=3)))
    assert "config key 'sampler'" in build_error(dict(type='advanced', sampler='prioritized'))


# ================================================================================ 6. fractional collect_iter
LIST_STORAGE = ['naive', 'naive_stale', 'advanced', 'episode']
FRACTIONAL = [1.5, np.float64(2.5), [1, 1.5], np.array([1.0, 2.5]), torch.tensor([0.5, 1.0]), NAN, INF]


def list_buffer(kind):
    if kind == 'naive_stale':
        return create_buffer(dict(type='naive', max_staleness=3, seed=0))
    return create_buffer(dict(type=kind, seed=0))


def one(kind, ci, obs=0):
    """One element with ``collect_iter`` ``ci``: an item, or (episode) a 2-step list episode ending in it."""
    if kind == 'episode':
        return [{'obs': obs, 'collect_iter': 1}, {'obs': obs, 'collect_iter': ci}]
    return {'obs': obs, 'collect_iter': ci}


@pytest.mark.parametrize('kind', LIST_STORAGE)
@pytest.mark.parametrize('value', FRACTIONAL, ids=repr)
def test_fractional_collect_iter_is_refused_on_list_storage_all_or_nothing(kind, value):
    """Was: 1.5 was accepted (and read as 1) on list storage; tensor storage with an int field refuses it."""
    buf = list_buffer(kind)
    buf.push([one(kind, 1)])
    before = buf.state_dict()
    with pytest.raises(ValueError, match='collect_iter'):
        buf.push([one(kind, 2, obs=1), one(kind, value, obs=2)])  # the valid element before it is not stored either
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize('kind', LIST_STORAGE)
def test_whole_number_floats_are_read_as_ints(kind):
    """The rule is on the value: 2.0 (and float arrays of whole numbers) is learner iteration 2."""
    buf = list_buffer(kind)
    assert buf.push([one(kind, 2.0), one(kind, np.array([3.0, 4.0]), obs=1), one(kind, torch.tensor([5.0]), 2)]) == 3
    if kind == 'advanced':
        batch = buf.sample(3, cur_learner_iter=10)
        assert all(d['staleness'] == {0: 8, 1: 7, 2: 5}[d['obs']] for d in batch)
    if kind == 'naive_stale':
        buf.sample(1, cur_learner_iter=6)  # staleness 4 and 3 leave; 1 stays
        assert buf.count() == 1 and buf.stats()['removed_by_staleness'] == 2


def test_tensor_storage_with_an_int_field_refuses_fractional_collect_iter_too():
    buf = create_buffer(dict(type='naive', storage=dict(type='tensor')))
    buf.push({'obs': np.float32(0), 'collect_iter': 1})
    before = buf.state_dict()
    with pytest.raises(ValueError, match='collect_iter'):
        buf.push({'obs': np.float32(1), 'collect_iter': 1.5})
    assert_same(buf.state_dict(), before)


def test_a_rule_without_a_name_of_its_own_is_counted_under_its_registry_name():
    """removed_by_<type>: two user rules without a ``name`` no longer share one 'removed_by_rule' counter."""

    class DropEven(Remover):
        def after_sample(self, table, slots, use):
            return slots[table.column('id', slots) % 2 == 0]

    class DropFirst(Remover):
        name = 'first'  # a name of its own is kept

        def before_sample(self, table, cur_learner_iter):
            return table.oldest(1)

    REMOVER_REGISTRY.register('test_part_keys_drop_even', replace=True)(DropEven)
    REMOVER_REGISTRY.register('test_part_keys_drop_first', replace=True)(DropFirst)
    buf = create_buffer(
        dict(
            type='naive',
            replay_buffer_size=16,
            seed=0,
            removers=[dict(type='test_part_keys_drop_even'), dict(type='test_part_keys_drop_first')],
        )
    )
    buf.push([{'x': i} for i in range(8)])  # ids 0..7
    batch = buf.sample(4)
    stats = buf.stats()
    first_gone = 1  # the oldest (id 0) leaves before the draw
    drawn_even = sum(1 for d in batch if d['x'] % 2 == 0)  # a fresh buffer: item x has id x
    assert stats['removed_by_first'] == first_gone
    assert stats['removed_by_test_part_keys_drop_even'] == drawn_even
    assert 'removed_by_rule' not in stats
    assert buf.count() == 8 - first_gone - drawn_even


def test_a_rule_named_like_a_built_in_counter_is_refused_unless_it_names_itself():
    class Mine(Remover):
        pass

    class Renamed(Remover):
        @property
        def name(self):  # answers the base's name and cannot be set
            return 'rule'

    REMOVER_REGISTRY.register('use', replace=True)(Mine)
    REMOVER_REGISTRY.register('test_part_keys_renamed', replace=True)(Renamed)
    try:
        with pytest.raises(ValueError, match=r"removers\[0\].*'use'.*max_use"):  # would share removed_by_use
            create_buffer(dict(type='naive', removers=[dict(type='use')]))
        with pytest.raises(ValueError, match=r"removers\[0\].*cannot be renamed"):
            create_buffer(dict(type='naive', removers=[dict(type='test_part_keys_renamed')]))
        Mine.name = 'staleness'  # a name of its own that is a built-in counter: refused too
        with pytest.raises(ValueError, match=r"removers\[0\].*removed_by_staleness.*max_staleness"):
            create_buffer(dict(type='naive', removers=[dict(type='use')]))
        Mine.name = 'mine'
        buf = create_buffer(dict(type='naive', removers=[dict(type='use')]))
        assert 'removed_by_mine' in buf.stats()
    finally:
        dict.pop(REMOVER_REGISTRY, 'use')  # the name stays free for the other tests of this process


@pytest.mark.parametrize('how', ['single', 'list', 'extend'])
def test_tensor_storage_with_a_float_field_refuses_fractional_collect_iter_too(how):
    """Was: a float collect_iter field (its first item held 2.0) took 1.5, which list storage and an int field
    refuse; whole numbers stay welcome."""
    buf = create_buffer(dict(type='naive', storage=dict(type='tensor')))
    buf.push({'obs': np.float32(0), 'collect_iter': 2.0})
    buf.extend({'obs': np.zeros(2, np.float32), 'collect_iter': np.array([3.0, 4.0], np.float32)})
    before = buf.state_dict()
    with pytest.raises(ValueError, match='collect_iter'):
        if how == 'single':
            buf.push({'obs': np.float32(1), 'collect_iter': 1.5})
        elif how == 'list':
            buf.push([{'obs': np.float32(1), 'collect_iter': 5.0}, {'obs': np.float32(2), 'collect_iter': 5.5}])
        else:
            buf.extend({'obs': np.zeros(2, np.float32), 'collect_iter': np.array([5.0, 5.5], np.float32)})
    assert_same(buf.state_dict(), before)


def test_tensor_storage_single_push_refuses_a_collect_iter_out_of_range():
    """Was: the single-push fast path took any int64 collect_iter (-2**63 never went stale: the staleness
    subtraction overflowed); a list push refused it."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor'), max_staleness=5))
    buf.push({'obs': np.zeros(2, np.float32), 'collect_iter': 1})
    before = buf.state_dict()
    for value in (-(2**63), 2**62, 2**60):
        with pytest.raises(ValueError, match="'collect_iter'"):
            buf.push({'obs': np.zeros(2, np.float32), 'collect_iter': value})
        assert_same(buf.state_dict(), before)


@pytest.mark.parametrize(
    'saved,target,buffer_type',
    [('lifo', 'fifo', 'naive'), ('fifo', 'lifo', 'naive'), ('min_priority', 'keep_best', 'advanced')]
    + [('keep_best', 'min_priority', 'advanced')],
)
def test_a_state_saved_with_another_capacity_rule_loads_and_a_damaged_counter_name_does_not(saved, target, buffer_type):
    """Switching a buffer's capacity rule and loading its state is supported: the old rule's counters are not this
    buffer's, and the new rule's start at 0. A counter name no registered rule has is a damaged one: refused."""

    def rule(name):
        return dict(type=name, column='priority') if name == 'keep_best' else dict(type=name)

    src = create_buffer(dict(type=buffer_type, replay_buffer_size=8, seed=0, removers=[rule(saved)]))
    src.push([dict(obs=float(i), priority=1.0 + i % 5) for i in range(12)])
    state = src.state_dict()
    dst = create_buffer(dict(type=buffer_type, replay_buffer_size=8, seed=0, removers=[rule(target)]))
    dst.load_state_dict(state)
    assert dst.count() == 8 and dst.stats()[f'removed_by_{target}'] == 0
    bad = dict(
        state,
        counters={f'removed_by_{saved}x' if k == f'removed_by_{saved}' else k: v for k, v in state['counters'].items()},
    )
    before = dst.state_dict()
    with pytest.raises(ValueError, match=f"unknown key.*'removed_by_{saved}x'"):
        dst.load_state_dict(bad)
    assert_same(dst.state_dict(), before)


@pytest.mark.parametrize('key', ['free', 'layout', 'valid', 'layout value'])
def test_a_capacity_rule_state_with_a_renamed_index_key_is_refused(key):
    """A table with a capacity rule saves its free-slot order: a damaged name must not load as a state without it
    (the default order would replace the saved one)."""
    cfg = dict(type='naive', replay_buffer_size=8, seed=0, removers=[dict(type='lifo')])
    src = create_buffer(cfg)
    src.push(items(12))
    state = src.state_dict()
    ring = state['storage']['ring']
    if key == 'layout value':
        ring['layout'], key = 'no such layout', 'layout'
    else:
        ring[key + 'x'] = ring.pop(key)
    dst = create_buffer(cfg)
    before = dst.state_dict()
    with pytest.raises(ValueError, match=f"'{key}x'|'{key}'|{key}"):
        dst.load_state_dict(state)
    assert_same(dst.state_dict(), before)

"""Property-based tests of the DI-engine types ``elastic``, ``sequence`` and ``deque``: random sequences of valid
and invalid calls, through the public API.

Combinations (test ids): ``elastic-list``, ``elastic-tensor``, ``sequence-list``, ``sequence-tensor``,
``deque-list``, ``deque-tensor`` (uniform) and ``deque_prio-list``, ``deque_prio-tensor`` (``priority=True``,
IS weights). Each run draws ``max_use`` (none or 2).

Calls: valid pushes (single items, lists -- some longer than the capacity --, with priorities for the deque);
invalid pushes (None, non-dicts, wrong shapes / dtypes for tensor schemas, NaN / negative priorities, bad
``cur_collector_envstep``); each type's valid sample and invalid ones (bad sizes, run lengths, iterations,
ranges, flags); ``update`` (the deque's ``{'priority': [...]}`` for its last batch, the elastic buffer's envstep)
and garbage updates; ``resize`` (elastic); ``clear``; ``state_dict`` -> ``load_state_dict`` into itself and into a
fresh buffer; randomly corrupted states; ``save_data`` / ``load_data``.

Properties after every call: a call that raises raised ``TypeError`` / ``ValueError`` / ``RuntimeError`` with a
message and left ``state_dict()`` exactly as it was, and the buffer still works (a valid push, then a sample);
a corrupted state that is accepted leaves a working buffer whose state round-trips; ``count() <=
replay_buffer_size``; sequence runs are consecutive pushes.
"""

import copy
import os
import tempfile

import numpy as np
import pytest
import torch
from helpers import GARBAGE, REFUSALS, SETTINGS, Case, assert_same, corrupted, paths_of
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from ding_buffer import create_buffer

CAP = 8
NAN = float('nan')
CASES = [Case(t, s, cap=CAP) for t in ('elastic', 'sequence', 'deque') for s in ('list', 'tensor')]
CASES += [Case('deque', s, variant='prio', cap=CAP) for s in ('list', 'tensor')]
FEWER = settings(SETTINGS, max_examples=30, stateful_step_count=40)  # 8 combinations: the suite stays short


class Machine(RuleBasedStateMachine):
    case: Case = None  # set by the subclass made for each combination

    @property
    def buffer_type(self):
        return self.case.name  # 'deque_prio': the deque with priority=True

    @property
    def storage(self):
        return self.case.storage

    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix='ding_parity_')
        self.counter = 0  # the number pushed items carry
        self.order = {}  # number -> its place in push order, for the items pushes stored: runs must be consecutive
        self.probe_seed = 0
        self.max_use = None

    def teardown(self):
        self.buf.close()

    # ------------------------------------------------------------------ construction
    def cfg(self):
        cfg = self.case.cfg()
        if self.buffer_type == 'deque_prio':
            cfg['priority_max_limit'] = 50.0
        if self.buffer_type == 'elastic':
            cfg['set_buffer_size'] = lambda envstep: 2 + envstep % 7
        if self.max_use is not None:
            cfg['max_use'] = self.max_use
        return cfg

    def new_buffer(self):
        return create_buffer(self.cfg())

    @initialize(max_use=st.sampled_from([None, 2]))
    def setup(self, max_use):
        self.max_use = max_use
        self.buf = self.new_buffer()

    # ------------------------------------------------------------------ inputs
    def item(self, rng):
        self.counter += 1
        item = {'obs': torch.from_numpy(rng.standard_normal(3).astype(np.float32)), 'n': self.counter}
        if self.buffer_type == 'deque_prio' and rng.random() < 0.5:
            item['priority'] = float(rng.uniform(0.1, 5.0))
        return item

    def stored(self, args):
        """A push of ``args`` was accepted: its items are stored in this order."""
        items = args[0] if isinstance(args[0], list) else [args[0]]
        for item in items:
            self.order[item['n']] = len(self.order)

    def valid_push(self, rng):
        if rng.random() < 0.3:
            return (self.item(rng),), {}
        items = [self.item(rng) for _ in range(int(rng.integers(1, CAP + 4)))]
        return (items,), ({'cur_collector_envstep': int(rng.integers(0, 100))} if rng.random() < 0.5 else {})

    def sample_call(self, rng):
        """A valid sample: (label, fn)."""
        t = self.buffer_type
        if t == 'sequence':
            b, s = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            kw = {}
            if rng.random() < 0.3:
                kw['replace'] = True
            if rng.random() < 0.3:
                kw['sample_range'] = slice(-int(rng.integers(1, CAP + 1)), None)
            return f'sample({b}, {s}, **{kw})', lambda: self.buf.sample(b, s, 0, **kw)
        size = int(rng.integers(1, 4))
        if t == 'elastic':
            kw = {'replace': True} if rng.random() < 0.3 else {}
            return f'sample({size}, **{kw})', lambda: self.buf.sample(size, 0, **kw)
        return f'sample({size}, train_iter)', lambda: self.buf.sample(size, int(rng.integers(0, 300)))

    def own(self, item) -> bool:
        """Whether ``item`` is one this test pushed (a list storage takes any object from a loaded state)."""
        n = item.get('n') if isinstance(item, dict) else None
        return type(n) is int and n in self.order

    def check_batch(self, out):
        if out is None or self.buffer_type != 'sequence':
            return
        if self.storage == 'list':  # an accepted corrupted state may hold items of any kind: check the test's own
            runs = [[d['n'] for d in run] for run in out if all(self.own(d) for d in run)]
        else:
            runs = out['n'].tolist()
        for run in runs:
            places = [self.order[n] for n in run]
            assert places == list(range(places[0], places[0] + len(run))), f'a run of non-consecutive pushes: {run}'

    # ------------------------------------------------------------------ the property
    def attempt(self, label, fn, must_raise=False, probe=True):
        before = self.buf.state_dict()
        try:
            out = fn()
        except REFUSALS as e:
            assert str(e).strip(), f'{label}: {type(e).__name__} with an empty message'
            assert_same(self.buf.state_dict(), before, f'state after {label} raised {type(e).__name__}: {e}')
            if probe:
                self.probe(f'{label} (refused: {e})')
            return True, None
        assert not must_raise, f'{label} was accepted (returned {out!r:.100}); it must raise'
        return False, out

    def probe(self, after):
        rng = np.random.default_rng(10**6 + self.probe_seed)
        self.probe_seed += 1
        args, kwargs = self.valid_push(rng)
        try:
            self.buf.push(*args, **kwargs)
            self.stored(args)
            label, fn = self.sample_call(rng)
            self.check_batch(fn())
        except Exception as e:  # reported as the failure
            raise AssertionError(f'after {after}: a valid push / sample raised {type(e).__name__}: {e}') from e

    # ------------------------------------------------------------------ rules
    @rule(seed=st.integers(0, 2**16))
    def push_valid(self, seed):
        args, kwargs = self.valid_push(np.random.default_rng(seed))
        raised, _ = self.attempt('valid push', lambda: self.buf.push(*args, **kwargs))
        assert not raised or self.storage == 'tensor', 'a valid push was refused'
        if not raised:
            self.stored(args)

    @rule(
        seed=st.integers(0, 2**16),
        kind=st.sampled_from(['none', 'int', 'envstep', 'shape', 'dtype', 'nan_prio', 'neg_prio', 'str_prio']),
    )
    def push_invalid(self, seed, kind):
        rng = np.random.default_rng(seed)
        ok = [self.item(rng) for _ in range(2)]
        if kind in ('shape', 'dtype') and self.storage == 'list':
            kind = 'none'  # list storage takes any dict
        if kind.endswith('_prio') and self.buffer_type != 'deque_prio':
            kind = 'int' if self.buffer_type != 'deque' or self.storage == 'tensor' else 'none'
        bad = {
            'none': ok + [None],
            'int': ok + [5] if self.buffer_type == 'deque_prio' or self.storage == 'tensor' else ok + [None],
            'envstep': ok,
            'shape': ok + [{'obs': torch.zeros(4), 'n': 1}],
            'dtype': ok + [{'obs': torch.zeros(3, dtype=torch.float64), 'n': 1}],
            'nan_prio': ok + [{'obs': torch.zeros(3), 'n': 1, 'priority': NAN}],
            'neg_prio': ok + [{'obs': torch.zeros(3), 'n': 1, 'priority': -1.0}],
            'str_prio': ok + [{'obs': torch.zeros(3), 'n': 1, 'priority': '1'}],
        }[kind]
        envstep = 'x' if kind == 'envstep' else 0
        if kind in ('shape', 'dtype') and self.buf.count() == 0 and not self.buf.push_count:
            return  # the schema comes from the first push
        self.attempt(f'invalid push ({kind})', lambda: self.buf.push(bad, envstep), must_raise=True)

    @rule(seed=st.integers(0, 2**16))
    def sample_valid(self, seed):
        label, fn = self.sample_call(np.random.default_rng(seed))
        raised, out = self.attempt(label, fn)
        assert not raised, f'{label} raised'
        self.check_batch(out)

    @rule(kind=st.integers(0, 6))
    def sample_invalid(self, kind):
        t = self.buffer_type
        if t == 'sequence':
            calls = [
                lambda: self.buf.sample(0, 2, 0),
                lambda: self.buf.sample(2, 0, 0),
                lambda: self.buf.sample(2, 'x'),
                lambda: self.buf.sample(2, 2, 'x'),
                lambda: self.buf.sample(2, 2, 0, sample_range=slice(0, 4, 2)),
                lambda: self.buf.sample(2, 2, 0, replace=2),
                lambda: self.buf.sample(2, 2, 0, timeout=-1),
            ]
        elif t == 'elastic':
            calls = [
                lambda: self.buf.sample(0),
                lambda: self.buf.sample(-1),
                lambda: self.buf.sample(1.5),
                lambda: self.buf.sample(2, 'x'),
                lambda: self.buf.sample(2, 0, sample_range=3),
                lambda: self.buf.sample(2, 0, replace='yes'),
                lambda: self.buf.sample(2, 0, timeout=NAN),
            ]
        else:
            calls = [
                lambda: self.buf.sample(0),
                lambda: self.buf.sample(-1),
                lambda: self.buf.sample(1.5),
                lambda: self.buf.sample(2, 'x'),
                lambda: self.buf.sample(2, 2**70),
                lambda: self.buf.sample(True),
                lambda: self.buf.sample(2, 0, timeout=-1),
            ]
        self.attempt(f'invalid sample #{kind}', calls[kind], must_raise=True)

    @rule(seed=st.integers(0, 2**16))
    def update_valid(self, seed):
        rng = np.random.default_rng(seed)
        if self.buffer_type == 'elastic':
            step = int(rng.integers(0, 1000))
            raised, _ = self.attempt(f'update({step})', lambda: self.buf.update(step))
            assert not raised and 2 <= self.buf.current_buffer_size <= 8
            return
        if self.buffer_type == 'deque_prio':
            n = int(rng.integers(1, 4))
            batch = self.buf.sample(n, 0)
            if batch is None:
                return
            prio = rng.uniform(0.0, 100.0, size=len(batch) if isinstance(batch, list) else n).tolist()
            raised, out = self.attempt('update(priority)', lambda: self.buf.update({'priority': prio}))
            assert not raised and out['updated'] + out['stale'] == len(prio), out
            return
        raised, out = self.attempt('update(dict)', lambda: self.buf.update({'priority': [1.0]}))
        assert not raised and out == {'updated': 0, 'stale': 0}

    @rule(kind=st.integers(0, 5))
    def update_garbage(self, kind):
        if self.buffer_type == 'elastic':
            calls = [
                lambda: self.buf.update('x'),
                lambda: self.buf.update(1.5),
                lambda: self.buf.update(2**70),
                lambda: self.buf.update(None),
                lambda: self.buf.update(True),
                lambda: self.buf.resize(0),
            ]
            self.attempt(f'garbage update #{kind}', calls[kind], must_raise=True)
            return
        if self.buffer_type == 'sequence':
            return
        calls = [
            lambda: self.buf.update([1.0]),
            lambda: self.buf.update({'priority': 'x'}),
            lambda: self.buf.update({'priority': [NAN] * 3}),
            lambda: self.buf.update({'priority': [-1.0] * 3}),
            lambda: self.buf.update({'priority': [[object()]]}),
            lambda: self.buf.update(None),
        ]
        must = kind in (0, 1, 4, 5)  # the others are checked only against a remembered prioritized batch
        self.attempt(f'garbage update #{kind}', calls[kind], must_raise=must)

    @rule(size=st.integers(-2, 12))
    def resize(self, size):
        if self.buffer_type != 'elastic':
            return
        self.attempt(f'resize({size})', lambda: self.buf.resize(size), must_raise=size < 1)

    @rule()
    def clear(self):
        self.buf.clear()
        assert self.buf.count() == 0

    @rule()
    def state_round_trip(self):
        state = self.buf.state_dict()
        reference = copy.deepcopy(state)
        raised, _ = self.attempt('load_state_dict(own state)', lambda: self.buf.load_state_dict(state))
        assert not raised
        assert_same(self.buf.state_dict(), reference, 'state after loading its own state')
        fresh = self.new_buffer()
        try:
            fresh.load_state_dict(copy.deepcopy(reference), deepcopy=True)
            assert_same(fresh.state_dict(), reference, 'state of a fresh buffer loaded with it')
        finally:
            fresh.close()

    @rule(data=st.data())
    def load_corrupted_state(self, data):
        state = self.buf.state_dict()
        order = dict(self.order)  # the push order that goes with ``state``
        paths = paths_of(state)
        path = paths[data.draw(st.integers(0, len(paths) - 1), label='path')]
        kind = data.draw(st.sampled_from(GARBAGE), label='garbage')
        corrupt = corrupted(state, path, kind)
        label = f'load_state_dict(state with {".".join(map(str, path))} -> {kind})'
        raised, _ = self.attempt(label, lambda: self.buf.load_state_dict(corrupt))
        if raised:
            return
        # accepted (harmless, or another consistent buffer -- say a renamed field, which valid pushes then lack):
        # a push is done or refused cleanly, a sample works, the state round-trips, the intact state loads back
        rng = np.random.default_rng(10**7 + self.probe_seed)
        self.probe_seed += 1
        args, kwargs = self.valid_push(rng)
        raised, _ = self.attempt(
            f'{label} (accepted), then a valid push', lambda: self.buf.push(*args, **kwargs), probe=False
        )
        if not raised:
            self.stored(args)
        _, fn = self.sample_call(rng)
        try:
            self.check_batch(fn())
        except Exception as e:  # reported as the failure
            raise AssertionError(f'{label} was accepted, then a sample raised {type(e).__name__}: {e}') from e
        again = self.buf.state_dict()
        fresh = self.new_buffer()
        try:
            fresh.load_state_dict(again)
            assert_same(fresh.state_dict(), again, f'{label} was accepted: its state does not round-trip')
        finally:
            fresh.close()
        self.buf.load_state_dict(state)  # the intact state loads back
        self.order = order
        assert_same(self.buf.state_dict(), state, 'the intact state after an accepted corruption')

    @rule()
    def save_and_load(self):
        path = os.path.join(self.tmp, 'buf.pt')
        self.buf.save_data(path)
        state = self.buf.state_dict()
        fresh = self.new_buffer()
        try:
            fresh.load_data(path, allow_pickle=self.storage == 'list')
            assert_same(fresh.state_dict(), state, 'state after save_data -> load_data')
        finally:
            fresh.close()
        with open(path, 'r+b') as f:
            f.truncate(max(1, os.path.getsize(path) // 2))
        self.attempt('load_data(truncated file)', lambda: self.buf.load_data(path, allow_pickle=True), must_raise=True)

    @invariant()
    def sizes(self):
        if hasattr(self, 'buf'):
            assert 0 <= self.buf.count() <= CAP and len(self.buf) == self.buf.count()


@pytest.mark.parametrize('case', CASES, ids=lambda c: c.id)
def test_random_calls_keep_every_dingengine_type_consistent(case):
    machine = type(f'Machine_{case.id.replace("-", "_")}', (Machine,), dict(case=case))
    run_state_machine_as_test(machine, settings=FEWER)

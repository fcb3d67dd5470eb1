"""Property-based tests: random sequences of valid and invalid calls against every preset x storage.

A hypothesis ``RuleBasedStateMachine`` per combination (test ids): ``naive-list``, ``naive-tensor``,
``advanced-list``, ``advanced-tensor``, ``episode-list``, ``episode-tensor`` (``max_transitions``),
``prioritized_episode-tensor`` (``sampler=dict(unroll_len=3)``), ``gfn``, ``gfn_diverse`` and
``terminating_state`` (dict batches of ``state`` float [B, 3] and ``log_reward`` float [B]). Each run draws the
optional parts of its config: ``max_use=2``, ``max_staleness=5``, the thruput controller (push/sample rate in
[0.5, 2], ``sample_min_limit_ratio=1``) and, for ``gfn``, reward-prioritized capacity / sampling.

Calls (rules): valid pushes (single items, lists -- some longer than the capacity --, batched dicts, episodes as
lists of transitions or dicts of [T, ...] tensors, GFlowNet dict batches and lists of item dicts); invalid pushes
(None, non-dicts, wrong shapes / dtypes / missing or extra fields for tensor schemas, NaN / negative / huge /
string / bool priorities, bad ``collect_iter`` -- also in a dict subclass --, reserved episode fields, bad
``cur_collector_envstep``); valid samples (every keyword each preset takes) and invalid ones (bad ``size``,
``cur_learner_iter``, ``timeout``, ``replace``, ``unroll_len``, ``pad``, unknown keywords, the arguments
prioritized windows refuse);
``update`` with what a sample returned and with garbage; ``clear``; ``state_dict`` -> ``load_state_dict`` (into
itself and into a fresh buffer; the given state is not aliased); ``load_state_dict`` of randomly corrupted states
(one entry anywhere in the state deleted or replaced); ``save_data`` / ``load_data`` (also truncated files and a
missing path).

Properties, after every call:

* a call that raises leaves ``state_dict()`` exactly as it was (tensors, arrays, NaN == NaN, nested containers);
  its message is a non-empty string; only ``TypeError`` / ``ValueError`` / ``RuntimeError`` are raised --
  anything else is a crash. A valid ``sample(timeout=...)`` may raise ``SampleTimeoutError``: its state must then
  be that of the same sample without a wait (which answers None), since the removal rules run first;
* inputs the API documents as invalid are refused (``must_raise``); a few others may be accepted (e.g. any
  object on naive's list storage, an unchecked ``collect_iter`` where nothing reads it);
* after every refused call the buffer still works: a valid push succeeds, and a sample succeeds when the buffer
  holds enough (unless a rate limiter is configured, which may legitimately refuse);
* a valid sample returns a batch whenever the buffer holds enough candidates (no rate limiter);
* a corrupted state that ``load_state_dict`` accepts leaves a working buffer (a push is done or refused cleanly,
  a sample works, its state round-trips, the intact state loads back);
* ``count() <= replay_buffer_size``, ``len(buf) == count()``, ``stats()`` is a dict of numbers.

The thruput controller's decay clock is frozen (``ThruputController``'s default clock argument is replaced for
the test): its counters decay every wall-clock second, which would make both the state comparisons around a call
and the derandomized runs depend on timing.

Bugs the machine found have tests of their own at the end: open ones ``test_known_bug_*`` (``xfail(strict=True)``
with the reason; the machine leaves out the inputs that hit them, each exclusion naming its test -- a fix turns
the test into an XPASS failure: remove the mark then, and the exclusion), fixed ones ``test_regression_*``.
"""

import copy
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from helpers import GARBAGE, REFUSALS, SETTINGS, Case, assert_same, corrupted, paths_of
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from ding_buffer import create_buffer
from ding_buffer.errors import SampleTimeoutError

CAP = 8  # items; episodes for the episode buffers
MAX_T = 20  # max_transitions of the episode buffers on tensor storage
OBS = 4
GFN_DIM = 3
UNROLL = 3  # prioritized_episode's sampler.unroll_len
NAN = float('nan')
INF = float('inf')
THRUPUT = {'push_sample_rate_limit': {'min': 0.5, 'max': 2.0}, 'window_seconds': 30.0, 'sample_min_limit_ratio': 1.0}


def is_number(v):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


# ================================================================================ the combinations
def config(case, opts):
    """``case``'s config with the optional parts this run drew (``opts``)."""
    cfg = case.cfg()
    if opts['max_use']:
        cfg['max_use'] = 2
    if opts['staleness']:
        cfg['max_staleness'] = 5
    if opts['thruput']:
        cfg['thruput_controller'] = copy.deepcopy(THRUPUT)
    if case.preset == 'gfn':
        cfg['prioritized_capacity'] = opts['gfn_prio']
        cfg['prioritized_sampling'] = opts['gfn_prio']
    return cfg


SIZES = dict(cap=CAP, max_transitions=MAX_T, unroll=UNROLL)
CASES = [Case(p, s, **SIZES) for p in ('naive', 'advanced', 'episode') for s in ('list', 'tensor')]
CASES += [Case('prioritized_episode', 'tensor', **SIZES)] + [Case(p, **SIZES) for p in ('gfn', 'gfn_diverse')]
CASES += [Case('terminating_state', **SIZES)]


# ================================================================================ the state machine
class BufferMachine(RuleBasedStateMachine):
    case: Case = None  # set by the subclass made for each combination

    def __init__(self):
        super().__init__()
        self.buf = None
        self.tmp = tempfile.mkdtemp(prefix='ding_buffer_props_')
        self.last_batch = None
        self.probe_seed = 0

    def teardown(self):
        if self.buf is not None:
            self.buf.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ construction
    @initialize(max_use=st.booleans(), staleness=st.booleans(), thruput=st.booleans(), gfn_prio=st.booleans())
    def make(self, max_use, staleness, thruput, gfn_prio):
        self.opts = {'max_use': max_use, 'staleness': staleness, 'thruput': thruput, 'gfn_prio': gfn_prio}
        self.buf = self.new_buffer()

    def new_buffer(self):
        return create_buffer(config(self.case, self.opts), instance_name='buffer')

    # ------------------------------------------------------------------ valid data
    def with_ci(self, rng):
        """Whether a valid item carries ``collect_iter``: always / never where a schema is fixed (present with
        ``max_staleness``), at random on list storage."""
        if self.case.fixed_schema:
            return self.opts['staleness']
        return bool(rng.random() < 0.5)

    def item(self, rng, k):
        item = {'obs': torch.from_numpy(rng.standard_normal(OBS).astype(np.float32)), 'act': int(k)}
        if self.with_ci(rng):
            item['collect_iter'] = int(rng.integers(0, 11))
        if self.case.preset == 'advanced' and rng.random() < 0.5:
            item['priority'] = float(rng.uniform(0.1, 5.0))
        return item

    def item_batch(self, rng, n):
        batch = {'obs': torch.from_numpy(rng.standard_normal((n, OBS)).astype(np.float32)), 'act': torch.arange(n)}
        if self.with_ci(rng):
            batch['collect_iter'] = torch.from_numpy(rng.integers(0, 11, n))
        if self.case.preset == 'advanced' and rng.random() < 0.5:
            batch['priority'] = torch.from_numpy(rng.uniform(0.1, 5.0, n))
        return batch

    def episode(self, rng, k):
        length = int(rng.integers(3 if self.case.preset == 'prioritized_episode' else 2, 6))
        obs = torch.from_numpy(rng.standard_normal((length, 2)).astype(np.float32))
        act = 100 * k + torch.arange(length)
        ci = torch.from_numpy(rng.integers(0, 11, length)) if self.with_ci(rng) else None
        if rng.random() < 0.5:
            steps = [{'obs': obs[t].clone(), 'act': act[t].clone()} for t in range(length)]
            if ci is not None:
                for t, step in enumerate(steps):
                    step['collect_iter'] = int(ci[t])
            return steps
        ep = {'obs': obs, 'act': act}
        if ci is not None:
            ep['collect_iter'] = ci
        return ep

    def gfn_items(self, rng, n, as_list):
        state = torch.from_numpy(rng.standard_normal((n, GFN_DIM)).astype(np.float32))
        reward = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        batch = {'state': state, 'log_reward': reward}
        if self.opts['staleness']:
            batch['collect_iter'] = torch.from_numpy(rng.integers(0, 11, n))
        if not as_list:
            return batch
        return [{k: v[i].clone() for k, v in batch.items()} for i in range(n)]

    def valid_push(self, rng):
        """``(args, kwargs)`` of a valid push."""
        case, form = self.case, int(rng.integers(0, 4))
        envstep = {} if rng.random() < 0.5 else {'cur_collector_envstep': int(rng.integers(0, 1000))}
        if case.gfn:
            n = int(rng.integers(1, 11))
            return (self.gfn_items(rng, n, as_list=form == 0),), envstep
        if case.episodic:
            if form == 0:
                ep = self.episode(rng, 0)
                return ((ep if isinstance(ep, dict) else [ep]),), envstep
            return ([self.episode(rng, k) for k in range(int(rng.integers(1, 5)))],), envstep
        if form == 0:
            return (self.item(rng, 0),), envstep
        if form == 1:
            return (self.item_batch(rng, int(rng.integers(1, 11))),), dict(envstep, batched=True)
        return ([self.item(rng, k) for k in range(int(rng.integers(1, 11)))],), envstep

    def ok_list(self, rng, n=2):
        """Valid elements to put before an invalid one in a list push (a partial write would show)."""
        if self.case.gfn:
            return self.gfn_items(rng, n, as_list=True)
        if self.case.episodic:
            return [self.episode(rng, k) for k in range(n)]
        return [self.item(rng, k) for k in range(n)]

    # ------------------------------------------------------------------ invalid pushes
    def invalid_push(self, rng, kind):
        """``(label, args, kwargs, must_raise)`` of an invalid push of the given kind."""
        case, ok = self.case, self.ok_list(rng)
        if kind == 'none':
            return 'push(None)', (None,), {}, True
        if kind == 'none_in_list':
            return 'push([valid, valid, None])', (ok + [None],), {}, True
        # list storage of naive keeps any object (DI-engine); every other preset stores dicts / episodes
        if kind == 'int':
            return 'push(5)', (5,), {}, case.id != 'naive-list'
        if kind == 'str':
            return "push('abc')", ('abc',), {}, case.id != 'naive-list'
        if kind.startswith('envstep'):
            value = {
                'envstep_str': 'abc',
                'envstep_none': None,
                'envstep_float': 1.5,
                'envstep_nan': NAN,
                'envstep_huge': 2**70,
            }[kind]
            args, kw = self.valid_push(rng)
            return f'push(valid, cur_collector_envstep={value!r})', args, dict(kw, cur_collector_envstep=value), True
        if kind == 'ci_dict_subclass':
            return self.bad_collect_iter(rng, 'abc', ok, wrap=OrderedDict)
        if kind.startswith('ci_'):
            value = {
                'ci_str': 'abc',
                'ci_huge': 2**70,
                'ci_nan': NAN,
                'ci_bool': True,
                'ci_list': [1, 'x'],
                'ci_inf': INF,
            }[kind]
            return self.bad_collect_iter(rng, value, ok)
        if case.gfn:
            return self.invalid_gfn_push(rng, kind, ok)
        if case.episodic:
            return self.invalid_episode_push(rng, kind, ok)
        return self.invalid_item_push(rng, kind, ok)

    def bad_collect_iter(self, rng, value, ok, wrap=dict):
        """A push with a bad ``collect_iter``. Where a schema is fixed by the first push (tensor storage, GFlowNet)
        the bad item follows valid ones (which fix the schema): a lone bad item would define it (see
        ``test_known_bug_tensor_storage_accepts_nan_collect_iter``)."""
        case = self.case
        # list storage validates collect_iter where it is read later: episodes always, advanced always (its
        # samples report staleness), naive only with a removal rule; terminating_state does not store the field
        must = case.fixed_schema or case.episodic or case.preset == 'advanced' or bool(self.engine_rules())
        must = must and case.preset != 'terminating_state'
        single = bool(rng.random() < 0.5) and not case.fixed_schema
        if case.gfn:
            items = [dict(x) for x in ok]
            items[-1]['collect_iter'] = value
            return f'push([items..., item with collect_iter={value!r}])', (items,), {}, must
        if case.episodic:
            ep = self.episode(rng, 7)
            if isinstance(ep, list):
                ep = [dict(t) for t in ep]
                ep[-1] = wrap(ep[-1], collect_iter=value)
            else:
                ep = wrap(ep, collect_iter=[value] * len(ep['act']))
            data = ep if single and isinstance(ep, Mapping) else ok + [ep]
            return f'push(episode with collect_iter {value!r} ({wrap.__name__}))', (data,), {}, must
        bad = wrap(self.item(rng, 9), collect_iter=value)
        data = bad if single else ok + [bad]
        label = (
            f'push({"" if single else "[valid, valid, "}item with collect_iter={value!r} ({wrap.__name__})'
            f'{"" if single else "]"})'
        )
        return label, (data,), {}, must

    def engine_rules(self):
        return [k for k in ('max_use', 'staleness') if self.opts[k]]

    def invalid_item_push(self, rng, kind, ok):
        case = self.case
        valid = {'obs': torch.zeros(OBS), 'act': 3}
        if self.with_ci(rng) and case.fixed_schema:
            valid['collect_iter'] = 1
        single = bool(rng.random() < 0.5)
        if kind.startswith('prio_') and kind != 'prio_batched' and case.preset == 'advanced':
            value = {
                'prio_nan': NAN,
                'prio_neg': -1.0,
                'prio_inf': INF,
                'prio_huge': 1e300,
                'prio_str': 'high',
                'prio_bool': True,
                'prio_pair': [1.0, 2.0],
                'prio_int_huge': 10**400,
            }[kind]
            bad = dict(valid, priority=value)
            label = (
                f'push({"" if single else "[valid, valid, "}item with priority={value!r:.20}{"" if single else "]"})'
            )
            return label, ((bad if single else ok + [bad]),), {}, True
        if kind == 'prio_batched' and case.preset == 'advanced':
            batch = {'obs': torch.zeros(3, OBS), 'act': torch.arange(3), 'priority': torch.tensor([1.0, 1.0, NAN])}
            if 'collect_iter' in valid:
                batch['collect_iter'] = torch.ones(3, dtype=torch.int64)
            return 'push(batch with a nan priority, batched=True)', (batch,), {'batched': True}, True
        if kind == 'batched_ragged':
            return (
                'push(ragged batch, batched=True)',
                ({'obs': torch.zeros(3, OBS), 'act': torch.arange(2)},),
                {'batched': True},
                True,
            )
        if kind == 'batched_not_dict':
            return 'push(5, batched=True)', (5,), {'batched': True}, True
        if kind == 'list_not_dict' and (case.fixed_schema or case.preset == 'advanced'):
            return 'push([valid, valid, 7])', (ok + [7],), {}, True
        if case.fixed_schema:
            bad = {
                'shape': dict(valid, obs=torch.zeros(OBS + 1)),
                'dtype': dict(valid, obs=torch.zeros(OBS, dtype=torch.float64)),
                'missing': {k: v for k, v in valid.items() if k != 'act'},
                'extra': dict(valid, x=2),
            }.get(kind)
            if bad is not None:
                return f'push([valid, valid, item with a {kind} mismatch])', (ok + [bad],), {}, True
        return 'push(None)', (None,), {}, True

    def invalid_episode_push(self, rng, kind, ok):
        case = self.case
        if kind == 'empty_episode':
            return 'push([episodes..., []])', (ok + [[]],), {}, True
        if kind == 'episode_int':
            return 'push([episodes..., 5])', (ok + [5],), {}, True
        if kind == 'ragged_dict':
            return (
                'push([episodes..., ragged dict episode])',
                (ok + [{'obs': torch.zeros(3, 2), 'act': torch.zeros(2, dtype=torch.int64)}],),
                {},
                True,
            )
        if kind == 'batched_ragged' or kind == 'batched_not_dict':
            return 'push(episode, batched=True)', (self.episode(rng, 1),), {'batched': True}, True
        if kind.startswith('reserved'):
            names = ['mask']
            if case.fixed_schema:
                names += ['start', 'episode_id', 'episode_idx']
            if case.preset == 'prioritized_episode':
                names += ['priority', 'IS']
            name = names[int(rng.integers(0, len(names)))]
            ep = self.episode(rng, 3)
            if isinstance(ep, list):
                ep = [dict(t, **{name: torch.tensor(1.0)}) for t in ep]
            else:
                ep = dict(ep, **{name: torch.ones(len(ep['act']))})
            single = bool(rng.random() < 0.5) and isinstance(ep, dict)
            # windows of list episodes (list storage) are lists of the stored transitions: no field is added
            must = case.fixed_schema or isinstance(ep, dict)
            return (
                f'push({"list" if isinstance(ep, list) else "dict"} episode with reserved field {name!r})',
                ((ep if single else ok + [ep]),),
                {},
                must,
            )
        if case.fixed_schema:
            step = {'obs': torch.zeros(2), 'act': torch.tensor(1)}
            if self.opts['staleness']:
                step['collect_iter'] = 1
            bad = {
                'shape': [step, dict(step, obs=torch.zeros(3))],
                'dtype': [step, dict(step, act=torch.tensor(1.5))],
                'too_long': [step] * (MAX_T + 1),
            }.get(kind)
            if bad is not None:
                return f'push([episodes..., episode with a {kind} problem])', (ok + [bad],), {}, True
        return 'push([episodes..., None])', (ok + [None],), {}, True

    def invalid_gfn_push(self, rng, kind, ok):
        batch = self.gfn_items(rng, 4, as_list=False)
        if kind == 'r_nan':
            batch['log_reward'] = torch.tensor([0.0, 1.0, -1.0, NAN])
            return 'push(batch with a nan log_reward)', (batch,), {}, True
        if kind == 'r_inf':
            batch['log_reward'] = torch.tensor([0.0, 1.0, -1.0, INF])
            return 'push(batch with a +inf log_reward)', (batch,), {}, True
        if kind == 'r_2d':
            batch['log_reward'] = torch.zeros(4, 1)
            return 'push(batch with 2-d log_reward)', (batch,), {}, True
        if kind == 'r_int':
            batch['log_reward'] = torch.zeros(4, dtype=torch.int64)
            return 'push(batch with integer log_reward)', (batch,), {}, True
        if kind == 'ragged':
            batch['state'] = torch.zeros(3, GFN_DIM)
            return 'push(ragged batch)', (batch,), {}, True
        if kind == 'no_reward':
            del batch['log_reward']
            return 'push(batch without log_reward)', (batch,), {}, True
        if kind == 'shape':
            bad = dict(ok[0], state=torch.zeros(GFN_DIM + 1))
            return 'push([items..., item with a wrong state dim])', (ok + [bad],), {}, True
        if kind == 'state_nan' and self.case.preset == 'gfn_diverse':
            batch['state'] = batch['state'].clone()
            batch['state'][3, 0] = NAN
            return 'push(batch with a nan state)', (batch,), {}, True
        if kind == 'list_not_dict':
            return 'push([items..., 7])', (ok + [7],), {}, True
        return 'push([items..., None])', (ok + [None],), {}, True

    PUSH_KINDS = (
        'none',
        'none_in_list',
        'int',
        'str',
        'envstep_str',
        'envstep_none',
        'envstep_float',
        'envstep_nan',
        'envstep_huge',
        'ci_str',
        'ci_huge',
        'ci_nan',
        'ci_bool',
        'ci_list',
        'ci_inf',
        'ci_dict_subclass',
        'prio_nan',
        'prio_neg',
        'prio_inf',
        'prio_huge',
        'prio_str',
        'prio_bool',
        'prio_pair',
        'prio_int_huge',
        'prio_batched',
        'batched_ragged',
        'batched_not_dict',
        'list_not_dict',
        'shape',
        'dtype',
        'missing',
        'extra',
        'empty_episode',
        'episode_int',
        'ragged_dict',
        'reserved',
        'too_long',
        'r_nan',
        'r_inf',
        'r_2d',
        'r_int',
        'ragged',
        'no_reward',
        'state_nan',
    )

    # ------------------------------------------------------------------ samples
    def valid_sample_kwargs(self, rng):
        """``(size, kwargs, must_give)``: a valid sample and whether it must return a batch (enough candidates,
        no rate limiter, no staleness removal possible before the draw)."""
        case, n = self.case, self.buf.count()
        size = int(rng.integers(1, 7))
        kw = {}
        if rng.random() < 0.5:
            kw['cur_learner_iter'] = int(rng.integers(-1, 21))
        if rng.random() < 0.25:
            kw['timeout'] = 0 if rng.random() < 0.5 else 0.001
        m = n
        if case.preset in ('naive', 'advanced', 'episode') and rng.random() < 0.3:
            k = int(rng.integers(1, CAP + 1))
            kw['sample_range'] = slice(-k, None) if rng.random() < 0.5 else slice(0, k)
            m = len(range(n)[kw['sample_range']])
        if case.preset in ('naive', 'episode', 'gfn', 'gfn_diverse', 'terminating_state') and rng.random() < 0.5:
            kw['replace'] = bool(rng.random() < 0.5)
        if case.preset == 'prioritized_episode' and rng.random() < 0.3:
            kw['replace'] = True
        if case.preset == 'episode':
            if rng.random() < 0.5:
                kw['unroll_len'] = 2
            if rng.random() < 0.3:
                kw['pad'] = bool(rng.random() < 0.5)
        if case.preset == 'advanced':
            enough = m > 0 and n >= size  # sample_min_limit_ratio=1; drawn with replacement
        elif case.preset == 'prioritized_episode':
            enough = n > 0
        elif case.gfn:
            enough = n > 0 and (kw.get('replace') is not False or n >= size)
        else:
            enough = m > 0 and (kw.get('replace', False) or m >= size)  # windows of 2 >= episodes
        quiet = not self.opts['staleness'] or kw.get('cur_learner_iter', -1) < 5  # collect_iter >= 0
        return size, kw, enough and quiet and not self.opts['thruput']

    def invalid_sample(self, rng, kind):
        """``(label, args, kwargs, must_raise)``: a valid sample with one argument made invalid."""
        case = self.case
        size, kw, _ = self.valid_sample_kwargs(rng)
        kw.pop('timeout', None)  # a refusal must not depend on a wait
        if kind == 'size':
            value = [0, -1, 1.5, True, '3', None, np.float64(2.0)][int(rng.integers(0, 7))]
            return f'sample(size={value!r})', (value,), kw, True
        if kind == 'cur_learner_iter':
            value = [None, 'x', 2**70, 1.5, NAN, True, -(2**70)][int(rng.integers(0, 7))]
            return f'sample(cur_learner_iter={value!r})', (size,), dict(kw, cur_learner_iter=value), True
        if kind == 'timeout':
            value = ['1', -1, NAN, INF, True, -0.5][int(rng.integers(0, 6))]
            return f'sample(timeout={value!r})', (size,), dict(kw, timeout=value), True
        if kind == 'replace':
            return "sample(replace='no')", (size,), dict(kw, replace='no'), True
        if kind == 'unknown_kwarg':
            return 'sample(foo=1)', (size,), dict(kw, foo=1), True
        if kind == 'sample_range' and case.preset in ('naive', 'advanced', 'episode'):
            value = ['abc', 5, (0, 2), slice(0, 2, 0), slice('a', None)][int(rng.integers(0, 5))]
            return f'sample(sample_range={value!r})', (size,), dict(kw, sample_range=value), True
        if kind == 'unroll_len' and case.preset == 'episode':
            value = [0, -1, 'a', True, 1.5][int(rng.integers(0, 5))]
            return f'sample(unroll_len={value!r})', (size,), dict(kw, unroll_len=value), True
        if kind == 'pad' and case.preset == 'episode':
            return "sample(pad='yes')", (size,), dict(kw, pad='yes'), True
        if case.preset == 'prioritized_episode' and kind in ('sample_range', 'unroll_len', 'pad'):
            value = {'sample_range': slice(0, 2), 'unroll_len': 2, 'pad': True}[kind]
            return f'sample({kind}={value!r}) (prioritized windows)', (size,), {kind: value}, True
        if case.preset == 'prioritized_episode' and kind == 'no_replace':
            return 'sample(replace=False) (prioritized windows)', (size,), {'replace': False}, True
        return 'sample(size=0)', (0,), kw, True

    SAMPLE_KINDS = (
        'size',
        'cur_learner_iter',
        'timeout',
        'replace',
        'unknown_kwarg',
        'sample_range',
        'unroll_len',
        'pad',
        'no_replace',
    )

    # ------------------------------------------------------------------ updates
    def update_info(self, batch, rng):
        """A well-formed ``update`` for a sampled batch, and how many entries it names (uniform presets: a
        made-up one, which they ignore)."""
        if not self.case.prioritized:
            return {'replay_unique_id': [0, 1], 'replay_buffer_idx': [0, 1], 'priority': [1.0, 2.0]}, 2
        if isinstance(batch, list):
            if not batch or not isinstance(batch[0], Mapping) or 'replay_unique_id' not in batch[0]:
                return None, 0
            ids = [d['replay_unique_id'] for d in batch]
            idx = [d['replay_buffer_idx'] for d in batch]
            n = len(batch)
        elif isinstance(batch, Mapping) and 'replay_unique_id' in batch:
            ids, idx = batch['replay_unique_id'], batch['replay_buffer_idx']
            n = int(idx.shape[0])
        else:
            return None, 0
        if self.case.preset == 'prioritized_episode' and rng.random() < 0.5:  # one priority per step
            prio = torch.from_numpy(rng.uniform(0.0, 10.0, tuple(idx.shape)))
            return {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': prio}, int((idx != -1).sum())
        prio = rng.uniform(0.0, 10.0, n)
        form = int(rng.integers(0, 3))
        prio = prio.tolist() if form == 0 else (prio if form == 1 else torch.from_numpy(prio))
        return {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': prio}, n

    def garbage_updates(self, rng):
        """``[(label, info, must_raise)]`` built on the last sample's update (or a made-up one)."""
        good, _ = self.update_info(self.last_batch, rng) if self.last_batch is not None else (None, 0)
        if good is None:
            good = {'replay_unique_id': [0, 1], 'replay_buffer_idx': [0, 1], 'priority': [1.0, 1.0]}
        prio = np.asarray(as_array(good['priority']), dtype=np.float64)
        idx = np.asarray(as_array(good['replay_buffer_idx']))
        ids = good['replay_unique_id']
        must = self.case.prioritized
        last = (-1,) + (0,) * (idx.ndim - 1)

        def with_prio(value):
            bad = prio.astype(object).copy()
            bad.reshape(-1)[-1] = value
            return dict(good, priority=bad.tolist())

        def with_idx(value):
            bad = idx.copy()
            bad[last] = value
            return dict(good, replay_buffer_idx=bad)

        return [
            ('nan priority', with_prio(NAN), must),
            ('inf priority', with_prio(INF), must),
            ('negative priority', with_prio(-0.5), must),
            ('str priority', with_prio('x'), must),
            ('bool priority', with_prio(True), must),
            ('priority list too short', dict(good, priority=prio.reshape(-1)[:-1].tolist()), must),
            ('replay_buffer_idx past the last slot', with_idx(self.case.slots), must),
            ('negative replay_buffer_idx', with_idx(-7), must),
            ('huge replay_buffer_idx', with_idx(2**40), must),
            ('float replay_buffer_idx', dict(good, replay_buffer_idx=idx.astype(np.float64)), must),
            ('no replay_buffer_idx', {'replay_unique_id': ids, 'priority': prio.tolist()}, must),
            ('no replay_unique_id', {'replay_buffer_idx': idx, 'priority': prio.tolist()}, must),
            ('not a dict', prio.tolist(), must),
            ('None', None, False),
            ('str', 'abc', False),
        ]

    # ------------------------------------------------------------------ the checked call
    def attempt(self, label, fn, must_raise=False, no_wait=None, probe=True):
        """Run ``fn()``: a refusal must leave the state unchanged, say why and leave a working buffer; returns
        ``(raised, result)``. ``no_wait(buffer)``: the same sample without ``timeout`` (a ``SampleTimeoutError``
        is then allowed, see ``timed_out``)."""
        before = self.buf.state_dict()
        try:
            out = fn()
        except SampleTimeoutError as e:
            if no_wait is None:
                raise
            assert str(e).strip(), f'{label}: SampleTimeoutError with an empty message'
            self.timed_out(label, before, no_wait)
            return True, None
        except REFUSALS as e:
            assert isinstance(str(e), str) and str(e).strip(), f'{label}: {type(e).__name__} with an empty message'
            assert_same(self.buf.state_dict(), before, f'state after {label} raised {type(e).__name__}: {e}')
            if probe:
                self.probe(f'{label} (refused: {type(e).__name__}: {e})')
            return True, None
        assert not must_raise, f'{label} was accepted (returned {out!r:.100}); it must raise'
        return False, out

    def timed_out(self, label, before, no_wait):
        """A valid ``sample(timeout=...)`` that timed out changed the state exactly as the same sample without a
        wait (which answers None) would have -- the removal rules (``max_staleness``) run before any sample can
        be refused -- except that it is not counted in ``refused_sample``. (Not "unchanged": while a sampler
        waits, other threads may push, so a wait cannot promise an unchanged buffer.)"""
        twin = self.new_buffer()
        try:
            twin.load_state_dict(before)
            assert no_wait(twin) is None, f'{label} timed out, but the same sample without a wait gave a batch'
            ignore = {'refused_sample'}
            assert_same(
                without_keys(self.buf.state_dict(), ignore),
                without_keys(twin.state_dict(), ignore),
                f'state after {label} timed out (vs. the same sample without a wait)',
            )
        finally:
            twin.close()

    def probe(self, after):
        """The buffer still works after ``after``: a valid push, then a sample when it holds something."""
        rng = np.random.default_rng(10**6 + self.probe_seed)
        self.probe_seed += 1
        args, kwargs = self.valid_push(rng)
        try:
            self.buf.push(*args, **kwargs)
        except Exception as e:  # reported as the failure
            raise AssertionError(f'after {after}: a valid push raised {type(e).__name__}: {e}') from e
        if self.buf.count() == 0:
            return
        try:
            out = self.buf.sample(1, cur_learner_iter=0)
        except Exception as e:
            raise AssertionError(f'after {after}: a valid sample(1) raised {type(e).__name__}: {e}') from e
        assert out is not None or self.opts['thruput'], f'after {after}: sample(1) of {self.buf.count()} gave None'
        if out is not None:
            self.last_batch = out

    # ------------------------------------------------------------------ rules: push
    @rule(seed=st.integers(0, 2**16))
    def push_valid(self, seed):
        args, kwargs = self.valid_push(np.random.default_rng(seed))
        raised, n = self.attempt('valid push', lambda: self.buf.push(*args, **kwargs))
        assert not raised, 'a valid push raised'
        assert isinstance(n, int) and n >= 0

    @rule(seed=st.integers(0, 2**16), pushes=st.integers(2, 4))
    def push_valid_several(self, seed, pushes):
        """Several valid pushes in a row (fills the buffer past its capacity more often than single pushes)."""
        rng = np.random.default_rng(seed)
        for _ in range(pushes):
            args, kwargs = self.valid_push(rng)
            raised, n = self.attempt('valid push', lambda a=args, k=kwargs: self.buf.push(*a, **k))
            assert not raised and isinstance(n, int) and n >= 0

    @rule(seed=st.integers(0, 2**16), kind=st.sampled_from(PUSH_KINDS))
    def push_invalid(self, seed, kind):
        label, args, kwargs, must = self.invalid_push(np.random.default_rng(seed), kind)
        self.attempt(label, lambda: self.buf.push(*args, **kwargs), must_raise=must)

    # ------------------------------------------------------------------ rules: sample / update
    @rule(seed=st.integers(0, 2**16))
    def sample_valid(self, seed):
        size, kw, must_give = self.valid_sample_kwargs(np.random.default_rng(seed))
        label = f'sample({size}, **{kw}) of {self.buf.count()}'
        plain = {k: v for k, v in kw.items() if k != 'timeout'}
        raised, out = self.attempt(
            label,
            lambda: self.buf.sample(size, **kw),
            no_wait=(lambda b: b.sample(size, **plain)) if 'timeout' in kw else None,
        )
        assert not (raised and must_give), f'{label} raised'
        assert out is not None or raised or not must_give, f'{label} returned None'
        if out is not None:
            self.last_batch = out

    @rule(seed=st.integers(0, 2**16), kind=st.sampled_from(SAMPLE_KINDS))
    def sample_invalid(self, seed, kind):
        label, args, kwargs, must = self.invalid_sample(np.random.default_rng(seed), kind)
        self.attempt(label, lambda: self.buf.sample(*args, **kwargs), must_raise=must)

    @rule(seed=st.integers(0, 2**16))
    def update_valid(self, seed):
        if self.last_batch is None:
            return
        info, n = self.update_info(self.last_batch, np.random.default_rng(seed))
        if info is None:
            return
        raised, out = self.attempt('update(from the last sample)', lambda: self.buf.update(info))
        assert not raised, 'a well-formed update raised'
        assert isinstance(out, Mapping) and set(out) >= {'updated', 'stale'}
        if self.case.prioritized:
            assert out['updated'] + out['stale'] == n, f'update of {n} entries answered {out}'
        else:
            assert out['updated'] == 0 and out['stale'] == 0

    @rule(seed=st.integers(0, 2**16), which=st.integers(0, 14))
    def update_garbage(self, seed, which):
        label, info, must = self.garbage_updates(np.random.default_rng(seed))[which]
        self.attempt(f'update({label})', lambda: self.buf.update(info), must_raise=must)

    # ------------------------------------------------------------------ rules: clear / state / files
    @rule(skip=st.integers(0, 2))
    def clear(self, skip):
        if skip:
            return  # (clear would otherwise empty the buffer too often to test anything else)
        raised, _ = self.attempt('clear()', self.buf.clear)
        assert not raised and self.buf.count() == 0

    @rule()
    def state_round_trip(self):
        state = self.buf.state_dict()
        reference = copy.deepcopy(state)
        raised, _ = self.attempt('load_state_dict(own state)', lambda: self.buf.load_state_dict(state))
        assert not raised, 'loading its own state raised'
        assert_same(self.buf.state_dict(), reference, 'state after loading its own state')
        # the state handed in is not aliased: changing it afterwards changes nothing in the buffer
        for value in _leaves(state):
            if isinstance(value, torch.Tensor) and value.numel():
                value.fill_(True if value.dtype == torch.bool else 7.5 if value.is_floating_point() else 7)
        assert_same(self.buf.state_dict(), reference, 'state after changing the dict it was loaded from')
        fresh = self.new_buffer()
        try:
            fresh.load_state_dict(copy.deepcopy(reference))
            assert_same(fresh.state_dict(), reference, 'state of a fresh buffer loaded with it')
        finally:
            fresh.close()

    @rule(data=st.data())
    def load_corrupted_state(self, data):
        state = self.buf.state_dict()
        if data.draw(st.integers(0, 9), label='whole') == 0:
            bad = data.draw(st.sampled_from(['not a dict', 'wrong type', 'empty']), label='what')
            corrupt = {'not a dict': [state], 'wrong type': dict(state, type='Other'), 'empty': {}}[bad]
            label = f'load_state_dict({bad})'
        else:
            paths = paths_of(state)
            path = paths[data.draw(st.integers(0, len(paths) - 1), label='path')]
            kind = data.draw(st.sampled_from(GARBAGE), label='garbage')
            if known_bad_corruption(self.case, path, kind):
                path, kind = ('type',), 'str'
            corrupt = corrupted(state, path, kind)
            label = f'load_state_dict(state with {".".join(map(str, path))} -> {kind})'
        raised, _ = self.attempt(label, lambda: self.buf.load_state_dict(corrupt))
        if raised:
            return
        # accepted (the change was harmless, repaired, or made another consistent buffer -- say a renamed field,
        # which valid pushes then lack): a push is done or refused cleanly, a sample works, the state round-trips,
        # and the intact state loads back
        rng = np.random.default_rng(10**7 + self.probe_seed)
        self.probe_seed += 1
        args, kwargs = self.valid_push(rng)
        self.attempt(f'{label} (accepted), then a valid push', lambda: self.buf.push(*args, **kwargs), probe=False)
        if self.buf.count():
            try:
                self.buf.sample(1, cur_learner_iter=0)
            except Exception as e:  # reported as the failure
                raise AssertionError(f'{label} was accepted, then sample(1) raised {type(e).__name__}: {e}') from e
        again = self.buf.state_dict()
        fresh = self.new_buffer()
        try:
            fresh.load_state_dict(again)
            assert_same(fresh.state_dict(), again, f'round trip of the state accepted by {label}')
        except REFUSALS as e:
            raise AssertionError(f'{label} was accepted, but its state_dict() is refused: {e}') from e
        finally:
            fresh.close()
        self.buf.load_state_dict(state)
        assert_same(self.buf.state_dict(), state, f'state after reloading the intact state following {label}')

    @rule()
    def save_and_load(self):
        path = os.path.join(self.tmp, 'buffer.pt')
        before = self.buf.state_dict()
        raised, _ = self.attempt('save_data', lambda: self.buf.save_data(path))
        assert not raised, 'save_data raised'
        assert_same(self.buf.state_dict(), before, 'state after save_data')
        pickle = self.case.storage == 'list'
        fresh = self.new_buffer()
        try:
            fresh.load_data(path, allow_pickle=pickle)
            assert_same(fresh.state_dict(), before, 'state of a fresh buffer after load_data')
        finally:
            fresh.close()
        raised, _ = self.attempt('load_data (own file)', lambda: self.buf.load_data(path, allow_pickle=pickle))
        assert not raised, 'load_data of its own file raised'
        assert_same(self.buf.state_dict(), before, 'state after load_data of its own file')

    @rule(cut=st.floats(0.0, 0.999))
    def load_damaged_file(self, cut):
        path = os.path.join(self.tmp, 'damaged.pt')
        self.buf.save_data(path)
        with open(path, 'rb') as f:
            raw = f.read()
        with open(path, 'wb') as f:
            f.write(raw[: int(cut * len(raw))])
        self.attempt(
            f'load_data(file truncated to {int(cut * len(raw))} of {len(raw)} bytes)',
            lambda: self.buf.load_data(path, allow_pickle=self.case.storage == 'list'),
            must_raise=True,
        )

    @rule()
    def load_missing_file(self):
        path = os.path.join(self.tmp, 'no_such_dir', 'nothing.pt')
        before = self.buf.state_dict()
        with pytest.raises((ValueError, OSError)):
            self.buf.load_data(path)
        assert_same(self.buf.state_dict(), before, 'state after load_data of a missing file')

    # ------------------------------------------------------------------ invariants
    @invariant()
    def within_capacity_and_stats_are_numbers(self):
        if self.buf is None:
            return
        n = self.buf.count()
        assert isinstance(n, int) and 0 <= n <= CAP, f'count() = {n!r}, capacity {CAP}'
        assert len(self.buf) == n
        stats = self.buf.stats()
        assert isinstance(stats, dict) and stats
        bad = {k: v for k, v in stats.items() if not is_number(v)}
        assert not bad, f'stats() entries that are not numbers: {bad}'
        assert stats['count'] == n


def as_array(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def without_keys(value, keys):
    """``value`` with every mapping entry named in ``keys`` left out, at any depth."""
    if isinstance(value, Mapping):
        return {k: without_keys(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [without_keys(v, keys) for v in value]
    return value


def known_bad_corruption(case, path, kind):
    """Corruptions that hit known bugs (their own xfail tests); the state machine uses another one."""
    return False  # none left (each bug found has a regression test at the end)


def _leaves(value):
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def machine_for(case):
    return type(f'Machine_{case.id.replace("-", "_")}', (BufferMachine,), {'case': case})


@pytest.fixture
def frozen_thruput_clock(monkeypatch):
    """Freeze the thruput controller's decay clock (see the module docstring)."""
    from ding_buffer.control.thruput import ThruputController

    defaults = ThruputController.__init__.__defaults__
    if defaults and len(defaults) == 1 and callable(defaults[0]):
        monkeypatch.setattr(ThruputController.__init__, '__defaults__', (lambda: 0.0,))


@pytest.mark.slow
@pytest.mark.parametrize('case', CASES, ids=lambda c: c.id)
def test_random_call_sequences(case, frozen_thruput_clock):
    run_state_machine_as_test(machine_for(case), settings=SETTINGS)


# ================================================================================ bugs found by the machine
# Each test is a property the state machine checks, on the smallest input that broke it. Open bugs are
# ``test_known_bug_*`` with xfail(strict=True): the machine leaves their inputs out (see the comments naming the
# tests); a fix turns the test into an XPASS failure -- then remove the mark, and the exclusion in the machine.
# ``test_regression_*`` are bugs the machine found that are fixed (the machine exercises their inputs again).
def known_bug(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


def bug_param(case_id, reason):
    return pytest.param(case_id, id=case_id, marks=known_bug(reason))


def _make(case_id, **over):
    case = next(c for c in CASES if c.id == case_id)
    return create_buffer(case.cfg(**over))


def _episode(k, length=2):
    return {'obs': torch.full((length, 2), float(k)), 'act': torch.arange(length)}


@pytest.mark.parametrize('case_id', ['episode-list', 'episode-tensor', 'prioritized_episode-tensor'])
def test_regression_episode_push_after_max_use_removal_stays_consistent(case_id):
    """Was: after ``max_use`` removed an episode from the middle of the ring, the next push wrote at the ring tail
    over a live episode without evicting it: the transition count drifted from the stored lengths and the
    buffer's own ``state_dict()`` / save file was refused ("saved transition count does not match ..."). (The
    ring still writes at its tail: the episode there is now evicted as such.)"""
    cfg = {'replay_buffer_size': 4, 'max_use': 2}
    buf = _make(case_id, **cfg)
    for k in range(30):  # push one episode of 3 steps, sample one (episode / window), 30 times
        buf.push(_episode(k, length=3))
        assert buf.sample(1) is not None
        assert buf.transition_count == sum(buf.episode_len), (
            f'after push {k}: {buf.transition_count} transitions, episode lengths {buf.episode_len}'
        )
    _make(case_id, **cfg).load_state_dict(buf.state_dict())
    if case_id != 'prioritized_episode-tensor':  # sample_range: whole episodes by insertion order
        buf = _make(case_id, **cfg)
        buf.push([_episode(k) for k in range(4)])
        assert buf.sample(2, sample_range=slice(1, 2), replace=True) is not None  # episode 1 drawn twice: removed
        buf.push(_episode(4))
        assert buf.transition_count == sum(buf.episode_len) == 2 * buf.count()
        _make(case_id, **cfg).load_state_dict(buf.state_dict())


@pytest.mark.parametrize('case_id', ['naive-tensor', 'advanced-tensor'])
def test_regression_tensor_push_is_validated_before_the_rate_limiter(case_id):
    """Was: on tensor storage an invalid push that the rate limiter refused returned 0 (counted in ``refused_push``)
    instead of raising ``ValueError``: the items were checked only after the limiter admitted them."""
    buf = _make(case_id, thruput_controller=copy.deepcopy(THRUPUT))
    buf.push([{'obs': torch.zeros(OBS)} for _ in range(4)])
    assert buf.sample(2) is not None
    assert buf.push([{'obs': torch.zeros(OBS)} for _ in range(4)]) == 0  # (4 + 4) / 2 > max 2: refused
    before = buf.state_dict()
    with pytest.raises(ValueError):
        buf.push([{'obs': torch.zeros(OBS)}, {'obs': torch.zeros(OBS + 1)}])  # wrong shape
    assert_same(buf.state_dict(), before)


@pytest.mark.parametrize(
    'case_id', ['naive-list', 'naive-tensor', 'advanced-list', 'advanced-tensor', 'episode-list', 'episode-tensor']
)
def test_regression_sample_range_is_checked_before_anything_changes(case_id):
    """Was: ``sample_range`` was checked only when the draw ran: after ``max_staleness`` had removed stale items
    (the ``TypeError`` left the buffer changed), and not at all when the buffer could not serve the batch."""
    buf = _make(case_id, max_staleness=5)
    if case_id.startswith('episode'):
        buf.push([dict(_episode(k), collect_iter=torch.full((2,), ci)) for k, ci in enumerate((0, 9))])
    else:
        buf.push([{'obs': torch.zeros(OBS), 'collect_iter': ci} for ci in (0, 9)])
    before = buf.state_dict()
    with pytest.raises(TypeError):
        buf.sample(1, cur_learner_iter=6, sample_range=5)  # the first item is stale at iteration 6
    assert_same(buf.state_dict(), before, 'state after a refused sample_range')
    empty = _make(case_id)
    with pytest.raises(TypeError):
        empty.sample(2, sample_range='abc')


def test_regression_naive_list_single_dict_subclass_collect_iter_is_checked():
    """Was: the single-push fast path of naive's list storage checked ``collect_iter`` only for exact dicts; a dict
    subclass with a bad one was stored, and with ``max_staleness`` every later sample raised ``ValueError``."""
    buf = _make('naive-list', max_staleness=5)
    before = buf.state_dict()
    try:
        buf.push(OrderedDict(x=1, collect_iter='abc'))
    except ValueError:
        assert_same(buf.state_dict(), before)
    buf.push({'x': 2, 'collect_iter': 3})
    assert buf.sample(1, cur_learner_iter=3) is not None


# Regression (found by the machine): tensor storage and GFlowNet column stores accepted a float collect_iter with
# NaN, which list storage refuses.
@pytest.mark.parametrize('case_id', ['naive-tensor', 'advanced-tensor', 'episode-tensor', 'gfn', 'gfn_diverse'])
def test_regression_tensor_storage_refuses_nan_collect_iter(case_id):
    buf = _make(case_id, max_staleness=5)
    if case_id.startswith('episode'):
        data = dict(_episode(0), collect_iter=torch.tensor([1.0, NAN]))
    elif case_id.startswith('gfn'):
        data = {
            'state': torch.randn(2, GFN_DIM),
            'log_reward': torch.zeros(2),
            'collect_iter': torch.tensor([1.0, NAN]),
        }
    else:
        data = {'obs': torch.zeros(OBS), 'collect_iter': NAN}
    with pytest.raises(ValueError):
        buf.push(data)


@pytest.mark.parametrize('case_id', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_regression_gfn_emptied_buffer_state_round_trip(case_id):
    """Was: the state of a GFlowNet buffer emptied by ``clear()`` has ``track_states=True``; loading it (also into
    itself, also through ``load_data``) gave ``track_states=None``."""
    buf = _make(case_id)
    buf.push({'state': torch.randn(3, GFN_DIM), 'log_reward': torch.randn(3)})
    buf.clear()
    state = buf.state_dict()
    fresh = _make(case_id)
    fresh.load_state_dict(state)
    assert_same(fresh.state_dict(), state)


@pytest.mark.parametrize('case_id', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_regression_gfn_track_states_none_with_items(case_id):
    """Was: ``load_state_dict`` accepted ``track_states=None`` with stored items (the terminating-state set stayed
    empty); the next push evicting one of them raised ``KeyError``."""
    src = _make(case_id, replay_buffer_size=4)
    src.push({'state': torch.randn(2, GFN_DIM), 'log_reward': torch.zeros(2)})
    buf = _make(case_id, replay_buffer_size=4)
    try:
        buf.load_state_dict(dict(src.state_dict(), track_states=None))
    except (ValueError, TypeError):
        return  # refused: fine
    buf.push({'state': torch.randn(2, GFN_DIM), 'log_reward': torch.ones(2)})
    buf.push({'state': torch.randn(2, GFN_DIM), 'log_reward': torch.full((2,), 2.0)})  # evicts the loaded items


@pytest.mark.parametrize('case_id', [c.id for c in CASES])
def test_regression_load_state_dict_huge_ints(case_id):
    """Every entry of the state replaced by 2**70, one at a time: refused with ValueError / TypeError, or accepted
    with a buffer that still takes a push. Was: ints >= 2**63 where the state holds int arrays (ring uid, slots,
    episode start / length, GFlowNet index seq) raised ``OverflowError``; GFlowNet ``index.next_seq = 2**70`` was
    accepted and the next push raised ``OverflowError``."""
    case = next(c for c in CASES if c.id == case_id)
    machine = machine_for(case)()
    try:
        machine.make(max_use=False, staleness=False, thruput=False, gfn_prio=False)
        rng = np.random.default_rng(0)
        for _ in range(3):
            args, kwargs = machine.valid_push(rng)
            machine.buf.push(*args, **kwargs)
        state = machine.buf.state_dict()
        problems = []
        for path in paths_of(state):
            buf = machine.new_buffer()
            try:
                buf.load_state_dict(corrupted(state, path, 'huge'))
                args, kwargs = machine.valid_push(rng)
                buf.push(*args, **kwargs)
            except (ValueError, TypeError):
                pass
            except Exception as e:  # noqa: BLE001 (collected)
                problems.append(f'{".".join(map(str, path))}: {type(e).__name__}: {e}')
            finally:
                buf.close()
        assert not problems, problems
    finally:
        machine.teardown()


TENSOR_CASES = ('naive-tensor', 'advanced-tensor', 'episode-tensor', 'prioritized_episode-tensor')


@pytest.mark.parametrize('case_id', TENSOR_CASES)
def test_regression_schema_with_empty_field_path(case_id):
    """Was: ``load_state_dict`` accepted a tensor-storage schema whose field path is empty (``[]``); the next
    sample raised ``IndexError``."""
    case = next(c for c in CASES if c.id == case_id)
    machine = machine_for(case)()
    try:
        machine.make(max_use=False, staleness=False, thruput=False, gfn_prio=False)
        args, kwargs = machine.valid_push(np.random.default_rng(0))
        machine.buf.push(*args, **kwargs)
        state = machine.buf.state_dict()
        where = ('storage', 'schema', 0, 0) if 'storage' in state else ('episodes', 'storage', 'schema', 0, 0)
        buf = machine.new_buffer()
        try:
            buf.load_state_dict(corrupted(state, where, 'empty_list'))
        except (ValueError, TypeError):
            return  # refused: fine
        buf.sample(1)
        buf.state_dict()
    finally:
        machine.teardown()


def test_regression_advanced_list_load_refuses_items_that_are_not_dicts():
    """Was: ``load_state_dict`` of advanced's list storage accepted stored items that are not dicts (which push
    refuses); every sample drawing one then raised ``TypeError`` / ``ValueError``."""
    src = _make('advanced-list')
    src.push([{'obs': torch.zeros(OBS)} for _ in range(2)])
    state = src.state_dict()
    buf = _make('advanced-list')
    try:
        buf.load_state_dict(corrupted(state, ('storage', 'items', 1), 'none'))
    except (ValueError, TypeError):
        return  # refused: fine
    for _ in range(5):
        assert buf.sample(2) is not None


def test_regression_prioritized_episode_update_refuses_bools_in_a_list():
    """Was: prioritized windows' ``update`` turned a list of priorities into a float array before checking it, so
    ``[1.0, True]`` was taken as ``[1.0, 1.0]`` (advanced refuses it with ``TypeError``)."""
    buf = _make('prioritized_episode-tensor')
    buf.push([_episode(k, length=4) for k in range(2)])
    out = buf.sample(2)
    before = buf.state_dict()
    with pytest.raises(TypeError):
        buf.update(
            {
                'replay_unique_id': out['replay_unique_id'],
                'replay_buffer_idx': out['replay_buffer_idx'],
                'priority': [1.0, True],
            }
        )
    assert_same(buf.state_dict(), before)


# Regression (found by the machine): a prioritized_episode sample refused because no window can be drawn
# advanced the buffer's RNG, so a refused sample changed all later draws.
def test_regression_prioritized_episode_refused_sample_keeps_the_rng():
    buf = _make('prioritized_episode-tensor')
    rng = buf.state_dict()['rng']
    assert buf.sample(2) is None
    assert_same(buf.state_dict()['rng'], rng)


@pytest.mark.parametrize('case_id', ['naive-list', 'advanced-list'])
def test_list_storage_load_checks_collect_iter(case_id):
    src = _make(case_id, max_staleness=5)
    src.push([{'x': 1, 'collect_iter': 1}, {'x': 2, 'collect_iter': 2}])
    state = src.state_dict()
    buf = _make(case_id, max_staleness=5)
    try:
        buf.load_state_dict(corrupted(state, ('storage', 'items', 0, 'collect_iter'), 'str'))
    except (ValueError, TypeError):
        return  # refused: fine
    assert buf.sample(1, cur_learner_iter=3) is not None

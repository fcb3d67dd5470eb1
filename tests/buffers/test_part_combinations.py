"""Part combinations against a brute-force model: a capacity rule (``fifo``, ``lifo``, ``min_priority``,
``keep_best``) together with ``max_use`` and / or ``max_staleness`` (as top-level keys or as ``removers``
entries, one or two of each), a sampler, on ``naive``, ``elastic``, ``advanced`` and ``deque`` (uniform and
prioritized), list and tensor storage -- through the public API only.

Each case runs a seeded random sequence of ~200 calls (pushes of 1..5 items carrying an increasing ``uid`` and a
``collect_iter``, samples at a growing learner iteration, priority updates with the ids of an earlier sample,
window resizes on ``elastic``, an occasional ``clear`` and calls with bad input that must change nothing). After
every call the items the buffer holds (read from ``state_dict()``, in the order of ``buffer.view``), their
priorities, and the counters of ``stats()`` naming removals and refusals are compared with the model's. Twice the
state goes through ``state_dict`` / ``load_state_dict`` into a new buffer of the same config: early on the new
buffer replaces the original (and must go on as the model says); later both take every call side by side and must
answer identically (same samples, same states), free slots reused in the same order
(``test_a_restored_buffer_reuses_free_slots_in_the_original_order``).

The model (``Model``) is plain Python over a dict ``uid -> [collect_iter, priority, use]``, written from the docs
(docs/composing.md, docs/buffer-types.md) and the rule docstrings (control/capacity.py, control/limits.py):

* a push of ``k > capacity`` items keeps its newest ``capacity`` items and nothing stored (no rule decides);
  otherwise ``need = count + k - capacity`` items leave first: the oldest (``fifo``), the newest stored
  (``lifo``), the lowest ``(priority, age)`` (``min_priority``); ``keep_best``: of the stored and the new items
  (newer than every stored one) the ``need`` lowest by ``(priority, age)`` do not stay -- stored ones leave
  (``removed_by_keep_best``), new ones are refused (``refused_by_keep_best``);
* before a draw, ``max_staleness``: the oldest items leave while ``cur_learner_iter - collect_iter >= s``,
  stopping at the first fresh one (DI-engine's walk); a sample is refused when fewer candidates than its size
  remain (without replacement, or on ``advanced``, whose minimum sample ratio is 1), or none (a prioritized deque
  draws with replacement once anything is stored, as DI-engine's);
* after a draw each drawn entry counts one use; items at ``max_use`` leave (``removed_by_use``);
* ``update`` sets ``priority + eps`` on the entries whose item is still stored (the others are stale);
* ``elastic`` draws among the newest ``current_buffer_size`` items; ``deque`` updates its last sampled batch.

Which items a uniform or prioritized draw picks is random: the model takes them from the sample and checks that
they are candidates (and distinct without replacement); with the deterministic sampler registered here it predicts
them exactly.
"""

import math
import zlib
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.control.samplers import SAMPLER_REGISTRY

STEPS = 200
ADVANCED_EPS = 0.5  # large enough that an updated priority p (stored p + eps) sorts between p and p + 1
DEQUE_EPS = 1e-5  # the prioritized deque's inner buffer keeps the advanced default
PRIORITIZED = ('advanced', 'deque_prio')
WITH_REPLACE = ('naive', 'elastic')  # types whose sample takes ``replace``


# ------------------------------------------------------------------------------------------------ a sampler
@SAMPLER_REGISTRY.register('part_combinations_ends')
class EndsFirst:
    """Deterministic: candidates alternately from both ends (oldest, newest, second oldest, ...), cycling when the
    batch is larger than the candidates (with replacement). The model predicts every draw."""

    def draw(self, rng, m, size, replace):
        return np.array(ends_order(m, size), dtype=np.int64)


def ends_order(m, size):
    order = []
    for i in range((m + 1) // 2):
        order.append(i)
        if m - 1 - i != i:
            order.append(m - 1 - i)
    return [order[j % m] for j in range(size)]


# ------------------------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Spec:
    kind: str  # naive, elastic, advanced, deque, deque_prio
    rule: str  # fifo, lifo, min_priority, keep_best
    limits: str  # use, stale, both (keys), entries (removers entries), double (a key and an entry of each)
    storage: str  # list, tensor
    sampler: Optional[str] = None  # None: the type's own; 'ends': the deterministic sampler above
    capacity: int = 6

    @property
    def id(self):
        parts = [self.kind, self.rule, self.limits, self.storage] + ([self.sampler] if self.sampler else [])
        return '-'.join(parts) + f'-cap{self.capacity}'


LIMITS = {  # (max_use keys / entries, max_staleness keys / entries): (top-level value or None, [entry values])
    'use': ((2, []), (None, [])),
    'stale': ((None, []), (3, [])),
    'both': ((2, []), (3, [])),
    'entries': ((None, [2]), (None, [4])),
    'double': ((3, [2]), (4, [3])),
}


def config(spec):
    (use_key, use_entries), (stale_key, stale_entries) = LIMITS[spec.limits]
    removers = [dict(type='keep_best', column='priority') if spec.rule == 'keep_best' else dict(type=spec.rule)]
    removers += [dict(type='max_use', max_use=u) for u in use_entries]
    removers += [dict(type='max_staleness', max_staleness=s) for s in stale_entries]
    cfg = dict(replay_buffer_size=spec.capacity, seed=1234, storage=dict(type=spec.storage), removers=removers)
    if use_key is not None:
        cfg['max_use'] = use_key
    if stale_key is not None:
        cfg['max_staleness'] = stale_key
    if spec.kind in ('naive', 'elastic'):
        cfg['type'] = spec.kind
        if spec.sampler == 'ends':
            cfg['sampler'] = dict(type='part_combinations_ends')
    elif spec.kind == 'advanced':
        cfg.update(type='advanced', alpha=0.6, beta=0.4, eps=ADVANCED_EPS)
        if spec.limits == 'entries':  # the prioritized sampler named, as `advanced` takes it
            cfg['sampler'] = dict(type='prioritized')
    else:
        cfg.update(type='deque', priority=spec.kind == 'deque_prio')
    return cfg


def effective_limits(spec):
    (use_key, use_entries), (stale_key, stale_entries) = LIMITS[spec.limits]
    uses = [u for u in [use_key] + use_entries if u is not None]
    stales = [s for s in [stale_key] + stale_entries if s is not None]
    return (min(uses) if uses else None), (min(stales) if stales else None)


def _cases():
    out = []
    for storage in ('list', 'tensor'):
        for rule in ('fifo', 'lifo', 'min_priority', 'keep_best'):
            for limits in ('use', 'stale', 'both', 'entries'):
                out.append(Spec('advanced', rule, limits, storage))
        for kind in ('naive', 'elastic'):
            for rule in ('fifo', 'lifo'):
                for limits in ('use', 'stale', 'both', 'entries') if kind == 'naive' else ('both', 'entries'):
                    out.append(Spec(kind, rule, limits, storage))
                out.append(Spec(kind, rule, 'both', storage, sampler='ends'))
        for rule in ('fifo', 'lifo'):
            out.append(Spec('deque', rule, 'both', storage))
        for rule in ('lifo', 'min_priority', 'keep_best'):
            out.append(Spec('deque_prio', rule, 'both', storage))
        out.append(Spec('advanced', 'min_priority', 'double', storage, capacity=4))
        out.append(Spec('advanced', 'keep_best', 'both', storage, capacity=4))
        out.append(Spec('naive', 'lifo', 'double', storage, capacity=4))
        out.append(Spec('elastic', 'fifo', 'use', storage, sampler='ends', capacity=8))
    return out


CASES = _cases()


# ------------------------------------------------------------------------------------------------ the model
@dataclass
class Model:
    spec: Spec
    items: dict = field(default_factory=dict)  # uid -> [collect_iter, priority, use]
    counters: dict = field(default_factory=dict)
    window: Optional[int] = None  # elastic: current_buffer_size
    last_batch: Optional[list] = None  # deque: uids of the last sampled batch

    def __post_init__(self):
        self.capacity = self.spec.capacity
        self.rule = self.spec.rule
        self.max_use, self.max_staleness = effective_limits(self.spec)
        self.eps = ADVANCED_EPS if self.spec.kind == 'advanced' else DEQUE_EPS
        names = ['removed_by_use', 'removed_by_staleness', f'removed_by_{self.rule}', 'sample_calls']
        names += ['refused_sample'] + (['refused_by_keep_best'] if self.rule == 'keep_best' else [])
        self.counters = dict.fromkeys(names, 0)
        if self.spec.kind == 'elastic':
            self.window = self.capacity

    def push(self, batch):
        """``batch``: [(uid, collect_iter, priority)], uids larger than every stored one. Returns what push
        answers: the items taken."""
        if len(batch) > self.capacity:  # the newest `capacity` of the batch, nothing stored
            self.items = {u: [ci, p, 0] for u, ci, p in batch[-self.capacity :]}
            return len(batch)
        need = len(self.items) + len(batch) - self.capacity
        admitted = list(batch)
        if need > 0:
            if self.rule == 'fifo':
                gone = sorted(self.items)[:need]
            elif self.rule == 'lifo':
                gone = sorted(self.items, reverse=True)[:need]
            elif self.rule == 'min_priority':
                gone = sorted(self.items, key=lambda u: (self.items[u][1], u))[:need]
            else:  # keep_best: the need lowest of stored + new by (priority, age) do not stay
                candidates = [(it[1], u, True) for u, it in self.items.items()]
                candidates += [(p, u, False) for u, ci, p in batch]
                lowest = sorted(candidates)[:need]
                gone = [u for p, u, stored in lowest if stored]
                refused = {u for p, u, stored in lowest if not stored}
                admitted = [b for b in batch if b[0] not in refused]
                self.counters['refused_by_keep_best'] += len(refused)
            for u in gone:
                del self.items[u]
            self.counters[f'removed_by_{self.rule}'] += len(gone)
        for u, ci, p in admitted:
            self.items[u] = [ci, p, 0]
        return len(admitted)

    def before_sample(self, cur_learner_iter):
        if self.max_staleness is None:
            return
        for u in sorted(self.items):
            if cur_learner_iter - self.items[u][0] >= self.max_staleness:
                del self.items[u]
                self.counters['removed_by_staleness'] += 1
            else:
                break

    def candidates(self):
        order = sorted(self.items)
        return order if self.window is None else order[max(0, len(order) - self.window) :]

    def refuses(self, size, replace):
        m = len(self.candidates())
        return m == 0 or (m < size and not replace)

    def drawn(self, uids):
        """Count a draw of ``uids`` (in order); returns each entry's use count after it."""
        uses = []
        for u in uids:
            self.items[u][2] += 1
            uses.append(self.items[u][2])
        if self.max_use is not None:
            spent = sorted({u for u in uids if self.items[u][2] >= self.max_use})
            for u in spent:
                del self.items[u]
            self.counters['removed_by_use'] += len(spent)
        self.counters['sample_calls'] += 1
        return uses

    def update(self, uids, priorities):
        n = 0
        for u, p in zip(uids, priorities):
            if u in self.items:
                self.items[u][1] = p + self.eps
                n += 1
        return {'updated': n, 'stale': len(uids) - n}

    def clear(self):
        self.items = {}  # (the deque's last batch stays: an update of it then counts its entries as stale)


# ------------------------------------------------------------------------------------------------ reading a buffer
def table_of(buf):
    return buf.inner if hasattr(buf, 'inner') else buf


def held(buf):
    """(uids oldest first, uid -> priority or None) of what ``buf`` stores, from its ``state_dict()`` (which
    lists each stored item with its slot) and its table view (which orders the slots)."""
    state = buf.state_dict()
    state = state.get('inner', state)
    storage = state['storage']
    slots = storage['slots'].tolist()
    if storage['kind'] == 'list':
        uids = [item['uid'] for item in storage['items']]
    elif not storage.get('schema'):  # a tensor storage learns its fields at the first push
        uids = []
    else:
        names = [tuple(entry[0]) for entry in storage['schema']]
        uids = storage['fields'][names.index(('uid',))].tolist()
    assert len(uids) == len(slots) == len(set(uids)), (uids, slots)
    by_slot = dict(zip(slots, uids))
    view = table_of(buf).view
    ordered = [by_slot[s] for s in view.ordered_slots().tolist()]
    assert sorted(ordered) == sorted(uids) and view.count() == len(uids)
    prios = None
    if 'index' in state:
        p = state['index']['priority']
        prios = {u: float(p[s]) for s, u in by_slot.items()}
    return ordered, prios


def entries(out):
    """A sample (a list of dicts, or one dict of batched tensors) as a list of plain dicts."""
    if isinstance(out, list):
        return [
            {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v) for k, v in d.items()} for d in out
        ]
    n = len(out['uid'])
    return [{k: (v[i].item() if v.dim() == 1 else v[i]) for k, v in out.items()} for i in range(n)]


def check(buf, model, where):
    uids, prios = held(buf)
    assert uids == sorted(model.items), (where, uids, sorted(model.items))
    if prios is not None:
        for u, it in model.items.items():
            assert math.isclose(prios[u], it[1], rel_tol=1e-6), (where, u, prios[u], it[1])
    stats = buf.stats()
    assert stats['count'] == len(model.items), where
    named = {k for k in stats if k.startswith(('removed_by_', 'refused_by_'))}
    assert named == set(model.counters) - {'sample_calls', 'refused_sample'}, (where, sorted(named))
    for name, value in model.counters.items():
        assert stats[name] == value, (where, name, stats[name], value)


# ------------------------------------------------------------------------------------------------ the driver
class Run:
    def __init__(self, spec, seed):
        self.spec = spec
        self.cfg = config(spec)
        self.rng = np.random.default_rng(seed)
        self.bufs = [create_buffer(self.cfg)]
        self.model = Model(spec)
        self.it = 0  # the learner iteration
        self.next_uid = 0
        self.samples = []  # advanced: (uids, update info without priorities) of earlier samples
        if spec.kind == 'elastic':
            self.resize(int(self.rng.integers(2, spec.capacity + 1)))

    # -- calls
    def all_same(self, results, where):
        for r in results[1:]:
            assert_same(r, results[0], f'{where}: the restored buffer answers')

    def items(self, k):
        out = []
        for _ in range(k):
            ci = max(0, self.it - int(self.rng.integers(0, 4)))  # collect_iter goes up and down a little
            item = {'uid': self.next_uid, 'collect_iter': ci}
            if self.spec.kind in PRIORITIZED:
                item['priority'] = float(self.rng.integers(1, 10))
            out.append(item)
            self.next_uid += 1
        return out

    def push(self, where):
        k = int(self.rng.choice([1, 1, 2, 3, 4, 5]))
        batch = self.items(k)
        results = [buf.push([dict(d) for d in batch]) for buf in self.bufs]
        self.all_same(results, where)
        expected = self.model.push([(d['uid'], d['collect_iter'], d.get('priority', 0.0)) for d in batch])
        assert results[0] == expected, (where, results[0], expected)

    def sample(self, where):
        self.it += int(self.rng.integers(0, 3))
        size = int(self.rng.integers(1, 4))
        replace = self.spec.kind in WITH_REPLACE and bool(self.rng.random() < 0.25)
        kwargs = dict(replace=True) if replace else {}
        outs = [buf.sample(size, self.it, **kwargs) for buf in self.bufs]
        self.all_same(outs, where)
        model = self.model
        model.before_sample(self.it)
        if model.refuses(size, replace or self.spec.kind == 'deque_prio'):  # (DI-engine's: by index, with replacement)
            assert outs[0] is None, (where, size, model.candidates())
            model.counters['refused_sample'] += 1
            return
        assert outs[0] is not None, (where, size, model.candidates())
        got = entries(outs[0])
        uids = [d['uid'] for d in got]
        candidates = model.candidates()
        assert len(uids) == size and set(uids) <= set(candidates), (where, uids, candidates)
        if self.spec.kind not in PRIORITIZED and not replace:
            assert len(set(uids)) == size, (where, uids)
        if self.spec.sampler == 'ends':
            assert uids == [candidates[p] for p in ends_order(len(candidates), size)], (where, uids, candidates)
        before = {u: list(model.items[u]) for u in set(uids)}
        uses = model.drawn(uids)
        if self.spec.kind == 'advanced':  # what the sample reports of each entry
            for d, use in zip(got, uses):
                ci, p, _ = before[d['uid']]
                assert d['use'] == use and d['staleness'] == self.it - ci, (where, d, use)
                assert math.isclose(d['priority'], p, rel_tol=1e-6), (where, d, p)
            info = {
                k: outs[0][k] if isinstance(outs[0], dict) else [d[k] for d in outs[0]]
                for k in ('replay_unique_id', 'replay_buffer_idx')
            }
            self.samples = (self.samples + [(uids, info)])[-4:]
        if self.spec.kind == 'deque_prio':
            model.last_batch = uids

    def update(self, where):
        kind, model = self.spec.kind, self.model
        if kind == 'advanced' and not self.samples:
            return self.sample(where)  # nothing sampled yet: no ids to update
        if kind == 'advanced':
            uids, info = self.samples[int(self.rng.integers(len(self.samples)))]  # the last or an earlier one
            prios = self.rng.integers(1, 10, size=len(uids)).astype(float).tolist()
            p = torch.tensor(prios) if self.rng.random() < 0.5 else prios
            results = [buf.update({**info, 'priority': p}) for buf in self.bufs]
            expected = model.update(uids, prios)
        elif kind == 'deque_prio':
            n = len(model.last_batch) if model.last_batch is not None else int(self.rng.integers(1, 4))
            prios = self.rng.integers(1, 10, size=n).astype(float).tolist()
            results = [buf.update({'priority': prios}) for buf in self.bufs]
            expected = model.update(model.last_batch, prios) if model.last_batch else {'updated': 0, 'stale': 0}
            model.last_batch = None
        else:  # uniform types: a learner's priority_info changes nothing
            info = {'replay_unique_id': [0], 'replay_buffer_idx': [0], 'priority': [1.0]}
            results = [buf.update(info) for buf in self.bufs]
            expected = {'updated': 0, 'stale': 0}
        self.all_same(results, where)
        assert results[0] == expected, (where, results[0], expected)

    def resize(self, size, where='resize'):
        for buf in self.bufs:
            buf.resize(size)
        self.model.window = size
        assert all(buf.current_buffer_size == size for buf in self.bufs), where

    def clear(self, where):
        for buf in self.bufs:
            buf.clear()
        self.model.clear()

    def bad_call(self, where):
        """A call with bad input: it raises and changes nothing (every buffer's whole state is as before)."""
        choices = ['collect_iter', 'size']
        if self.spec.kind in PRIORITIZED:
            choices.append('priority')
        if self.spec.kind == 'advanced' and self.samples:
            choices.append('update')
        if self.spec.kind == 'deque_prio' and self.model.last_batch:
            choices.append('update')
        if self.spec.kind == 'elastic':
            choices.append('resize')
        what = choices[int(self.rng.integers(len(choices)))]
        good = self.items(int(self.rng.integers(1, 4)))  # valid items first: a partial write would show
        self.next_uid -= len(good)  # (never stored: the next push takes these uids again)
        for buf in self.bufs:
            before = buf.state_dict()
            if what == 'collect_iter':
                call = lambda: buf.push(good + [{**good[0], 'uid': -1, 'collect_iter': 1.5}])
            elif what == 'priority':
                call = lambda: buf.push(good + [{**good[0], 'uid': -1, 'priority': float('nan')}])
            elif what == 'size':
                call = lambda: buf.sample(0, self.it)
            elif what == 'resize':
                call = lambda: buf.resize(0)
            elif self.spec.kind == 'advanced':
                uids, info = self.samples[-1]
                call = lambda: buf.update({**info, 'priority': [1.0] * (len(uids) - 1) + [float('nan')]})
            else:
                call = lambda: buf.update({'priority': [1.0] * (len(self.model.last_batch) - 1) + [-1.0]})
            with pytest.raises((TypeError, ValueError)):
                call()
            assert_same(buf.state_dict(), before, f'{where}: {what}')

    def round_trip(self, where, lockstep):
        """The state of the (only) buffer into a new buffer of the same config. ``lockstep``: both take every
        later call and must answer alike; otherwise the new one replaces the original."""
        (buf,) = self.bufs
        state = buf.state_dict()
        twin = create_buffer(self.cfg)
        twin.load_state_dict(state, deepcopy=bool(self.rng.random() < 0.5))
        assert_same(twin.state_dict(), state, where)
        if self.spec.kind == 'elastic':
            assert twin.current_buffer_size == buf.current_buffer_size
        if lockstep:
            self.bufs.append(twin)
        else:
            buf.close()
            self.bufs = [twin]

    def close(self):
        for buf in self.bufs:
            buf.close()


@pytest.mark.parametrize('spec', CASES, ids=[c.id for c in CASES])
def test_random_calls_match_the_model_and_survive_state_round_trips(spec):
    """Two round trips: at a random step the restored buffer replaces the original (it must go on as the model
    says); later original and restored buffer take every call side by side and must answer identically -- same
    samples, same states."""
    run = Run(spec, seed=zlib.crc32(spec.id.encode()))
    replace_at = int(run.rng.integers(STEPS // 5, 2 * STEPS // 5))
    lockstep_from = int(run.rng.integers(STEPS // 2, 2 * STEPS // 3))
    try:
        for step in range(STEPS):
            where = f'step {step}'
            if step == replace_at:
                run.round_trip(where, lockstep=False)
            if step >= lockstep_from and len(run.bufs) == 1:
                run.round_trip(where, lockstep=True)
            op = run.rng.random()
            if op < 0.42:
                run.push(where)
            elif op < 0.75:
                run.sample(where)
            elif op < 0.87:
                run.update(where)
            elif op < 0.89:
                run.clear(where)
            elif op < 0.94 and spec.kind == 'elastic':
                run.resize(int(run.rng.integers(1, spec.capacity + 2)), where)
            elif op < 0.94:
                run.sample(where)
            else:
                run.bad_call(where)
            for buf in run.bufs:
                check(buf, run.model, where)
            if len(run.bufs) == 2:
                assert_same(run.bufs[1].state_dict(), run.bufs[0].state_dict(), where)
        assert len(run.bufs) == 2, 'the side-by-side round trip never happened'
        counters = run.model.counters
        assert counters[f'removed_by_{spec.rule}'] + counters.get('refused_by_keep_best', 0) > 0  # the rule acted
        limits = effective_limits(spec)
        assert limits[0] is None or counters['removed_by_use'] > 0
        assert limits[1] is None or counters['removed_by_staleness'] > 0
    finally:
        run.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('kind', ['naive', 'elastic', 'advanced', 'deque_prio'])
def test_a_restored_buffer_reuses_free_slots_in_the_original_order(kind, storage):
    """docs/persistence.md: a reloaded buffer "continues exactly where the saved one was: its next sample is the
    same. Every buffer type and storage resumes exactly". Was: the free-slot order of a table with a capacity rule
    was not saved; a restored table wrote into other slots (its state differed, prioritized draws differed)."""
    cfg = config(Spec(kind, 'lifo', 'stale', storage, capacity=4))  # max_staleness 3

    def item(uid, priority=1.0):
        return {'uid': uid, 'collect_iter': uid, 'priority': priority}

    original = create_buffer(cfg)
    original.push([item(u) for u in range(4)])
    assert original.sample(1, 3) is not None  # uid 0 (collect_iter 0) is stale and leaves first
    assert original.sample(1, 4) is not None  # then uid 1
    restored = create_buffer(cfg)
    restored.load_state_dict(original.state_dict())
    assert_same(restored.state_dict(), original.state_dict())
    try:
        for buf in (original, restored):
            buf.push([item(4, 2.0)])
            buf.push([item(5, 9.0)])
        for i in range(3):  # the samples first (prioritized draws go by slot), then the whole state
            assert_same(restored.sample(3, 5), original.sample(3, 5), f'sample {i}')
        assert_same(restored.state_dict(), original.state_dict(), 'after two pushes')
    finally:
        original.close()
        restored.close()


# ------------------------------------------------------------------------------------------------ refused combinations
REFUSED = [
    # a capacity rule reading a column the type's table does not have (together with a limit)
    (dict(type='elastic', removers=[dict(type='min_priority')], max_use=2), "'removers'", 'min_priority'),
    (dict(type='elastic', removers=[dict(type='keep_best', column='priority')], max_staleness=3), "'removers'", None),
    (dict(type='deque', priority=False, removers=[dict(type='min_priority')], max_use=2), "'removers'", None),
    (dict(type='deque', priority=True, removers=[dict(type='keep_best', column='use')]), "'removers'", "'use'"),
    # two capacity rules
    (dict(type='deque', priority=True, removers=[dict(type='lifo'), dict(type='fifo')]), "'removers'", 'at most one'),
    # a capacity rule on a type whose table is not one of items
    (dict(type='episode', removers=[dict(type='lifo')], max_use=2), "'removers'", "'lifo'"),
    (dict(type='prioritized_episode', removers=[dict(type='fifo')], max_staleness=2), "'removers'", None),
    (dict(type='gfn_diverse', removers=[dict(type='min_priority')]), "'removers'", None),
    (dict(type='terminating_state', removers=[dict(type='fifo')]), "'removers'", None),
    (dict(type='chunk', removers=[dict(type='min_priority')]), "'removers'", 'whole chunks'),
    # a limit with a bad value, next to a capacity rule (as a key and as an entry)
    (dict(type='advanced', removers=[dict(type='lifo')], max_use=0), "'max_use'", None),
    (dict(type='naive', removers=[dict(type='fifo')], max_staleness=0), "'max_staleness'", None),
    (dict(type='deque', removers=[dict(type='fifo')], max_use=-1), "'max_use'", None),
    (
        dict(type='advanced', removers=[dict(type='min_priority'), dict(type='max_use', max_use=0)]),
        "'removers[1].max_use'",
        None,
    ),
    (
        dict(type='elastic', removers=[dict(type='lifo'), dict(type='max_staleness', max_staleness=-1)]),
        "'removers[1].max_staleness'",
        None,
    ),
    # a sampler the type cannot take, next to a capacity rule
    (
        dict(type='advanced', removers=[dict(type='lifo')], sampler=dict(type='prioritized', alpha=0.5)),
        "'sampler.alpha'",
        None,
    ),
    (dict(type='naive', removers=[dict(type='lifo')], sampler=dict(type='prioritized')), "'sampler.type'", None),
    (dict(type='elastic', sampler=dict(type='prioritized')), "'sampler.type'", "items of type 'elastic'"),
    (dict(type='sequence', sampler=dict(type='prioritized')), "'sampler.type'", "items of type 'sequence'"),
    (dict(type='elastic', removers=[dict(type='fifo')], sampler=dict(type='unifrm')), "'sampler.type'", "'uniform'"),
]


@pytest.mark.parametrize('cfg, key, also', REFUSED, ids=[f'{i}-{c["type"]}' for i, (c, _, _) in enumerate(REFUSED)])
def test_combinations_that_cannot_work_are_refused_naming_the_key(cfg, key, also):
    with pytest.raises(ValueError) as info:
        create_buffer(cfg)
    message = str(info.value)
    assert key in message, message
    assert also is None or also in message, message

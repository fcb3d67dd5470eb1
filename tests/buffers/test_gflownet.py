"""Tests of the GFlowNet buffers (``type='gfn'``, ``'gfn_diverse'``, ``'terminating_state'``) on dict batches.

Every content check compares the buffer with a brute-force reference written here (plain Python loops over
lists, float64 math): capacity (keep-best with the oldest of equal rewards leaving first, FIFO, lazy
truncation at ``2 * capacity``), the two-stage p-norm diversity filter of ``gfn_diverse`` and its counters,
and ``unique_terminating_states``. Also: sampling distributions (chi-square with fixed seeds, exact
Plackett-Luce inclusion probabilities), all-or-nothing rejection of bad input, save/load round trips, the
numba kernel against the numpy fallback (subprocess with ``DING_BUFFER_NO_NUMBA=1``) and TensorBoard scalars.
torchgfn containers themselves are tested elsewhere; a tiny fake container is used only to check that dict
and container pushes do not mix.
"""

import copy
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from helpers import FakeTB, assert_same, chi_square, chi_threshold, ref_distance, subprocess_env, without

from ding_buffer import _numba, create_buffer
from ding_buffer.control import diversity
from ding_buffer.persistence import save_state

INF = float('inf')
NINF = float('-inf')
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SETTINGS = (
    'replay_buffer_size',
    'prioritized_capacity',
    'prioritized_sampling',
    'sample_replacement',
    'lazy_sort',
    'state_key',
    'log_reward_key',
    'condition_key',
)
DIVERSE_SETTINGS = DEFAULT_SETTINGS + ('cutoff_distance', 'p_norm_distance')


# ================================================================================ brute-force reference
def rep(item):
    """What the diversity filter sees: the state flattened, then the condition (if any)."""
    return tuple(item['state']) + (tuple(item['cond']) if item['cond'] is not None else ())


class RefBuffer:
    """The semantics of the GFlowNet buffers written out as loops over a list of item dicts."""

    def __init__(self, capacity, prioritized=True, lazy=False, diverse=False, cutoff=0.0, p=1.0):
        self.capacity = capacity
        self.prioritized = prioritized or diverse
        self.lazy = lazy
        self.diverse = diverse
        self.cutoff = cutoff
        self.p = p
        self.items = []
        self.next_seq = 0
        self.c = dict(pushed=0, admitted=0, evicted=0, filter_checked=0, rejected_by_reward=0, rejected_by_distance=0)

    def _rank(self, it):
        return (it['r'], it['seq']) if self.prioritized else (it['seq'],)

    def _keep_best(self, items):
        """The ``capacity`` items with the largest key, in their original list order."""
        best = sorted(items, key=self._rank, reverse=True)[: self.capacity]
        keep = {it['seq'] for it in best}
        return [it for it in items if it['seq'] in keep]

    def push(self, batch):
        batch = [dict(it) for it in batch]
        self.c['pushed'] += len(batch)
        cand = batch
        if self.diverse and len(self.items) >= self.capacity:
            if len(self.items) > self.capacity:  # lazy: back to capacity before comparing
                kept = self._keep_best(self.items)
                self.c['evicted'] += len(self.items) - len(kept)
                self.items = kept
            cand = sorted(cand, key=lambda it: -it['r'])  # Python's sort is stable
            self.c['filter_checked'] += len(cand)
            lowest = min(it['r'] for it in self.items)
            passed = [it for it in cand if it['r'] >= lowest]
            self.c['rejected_by_reward'] += len(cand) - len(passed)
            cand = passed
            if self.cutoff >= 0:
                stage1 = []
                for i, it in enumerate(cand):
                    if all(ref_distance(rep(it), rep(e), self.p) > self.cutoff for e in cand[:i]):
                        stage1.append(it)
                stage2 = []
                for it in stage1:
                    if all(ref_distance(rep(it), rep(s), self.p) > self.cutoff for s in self.items):
                        stage2.append(it)
                self.c['rejected_by_distance'] += len(cand) - len(stage2)
                cand = stage2
        for it in cand:
            it['seq'] = self.next_seq
            self.next_seq += 1
        total = self.items + cand
        if (len(total) >= 2 * self.capacity) if self.lazy else (len(total) > self.capacity):
            kept = self._keep_best(total)
        else:
            kept = total
        kept_seqs = {it['seq'] for it in kept}
        self.c['admitted'] += sum(it['seq'] in kept_seqs for it in cand)
        self.c['evicted'] += sum(it['seq'] not in kept_seqs for it in self.items)
        self.items = kept

    def snapshot(self):
        return sorted((it['seq'], it['tag'], tuple(it['state']), it['cond'], it['r']) for it in self.items)

    def expected_stats(self):
        rs = [it['r'] for it in self.items]
        finite = [r for r in rs if r > NINF]
        out = dict(self.c)
        out['size'] = len(self.items)
        out['zero_reward_items'] = len(rs) - len(finite)
        out['unique_terminating_states'] = len({(tuple(it['state']), it['cond']) for it in self.items})
        out['log_reward_min'] = min(finite) if finite else None
        out['log_reward_max'] = max(finite) if finite else None
        out['log_reward_mean'] = (sum(finite) / len(finite)) if finite else None
        return out


# ================================================================================ helpers
def make(kind='gfn', cap=5, **kw):
    kw.setdefault('seed', 0)
    return create_buffer(dict(type=kind, replay_buffer_size=cap, **kw))


def items_of(states, rewards, tags=None, conds=None):
    tags = list(range(len(states))) if tags is None else tags
    out = []
    for i, (s, r) in enumerate(zip(states, rewards)):
        s = tuple(float(x) for x in (s if isinstance(s, (list, tuple)) else [s]))
        c = None
        if conds is not None:
            c = conds[i]
            c = tuple(float(x) for x in (c if isinstance(c, (list, tuple)) else [c]))
        out.append(dict(tag=int(tags[i]), state=s, cond=c, r=float(r)))
    return out


def to_batch(items, as_list=False, extra=True, state_dtype=torch.float32):
    """Items -> a dict batch ({'state', 'log_reward', 'tag', ['cond'], ['extra']}) or a list of item dicts."""
    state = torch.tensor([it['state'] for it in items], dtype=torch.float64).to(state_dtype)
    r = torch.tensor([it['r'] for it in items], dtype=torch.float64)
    tag = torch.tensor([it['tag'] for it in items], dtype=torch.int64)
    d = {'state': state, 'log_reward': r, 'tag': tag}
    if items and items[0]['cond'] is not None:
        d['cond'] = torch.tensor([it['cond'] for it in items], dtype=torch.float32)
    if extra:
        d['extra'] = torch.arange(len(items), dtype=torch.float32)[:, None].repeat(1, 2)
    if as_list:
        return [{k: v[i] for k, v in d.items()} for i in range(len(items))]
    return d


def read_all(buf):
    """Every stored item (sample without replacement), fields as tensors, sorted by replay_unique_id."""
    n = buf.count()
    if n == 0:
        return None
    out = buf.sample(n, replace=False)
    order = torch.argsort(out['replay_unique_id'])
    return {k: v[order] for k, v in out.items()}


def snapshot(buf):
    """Sorted (id, tag, state, cond, log_reward) tuples of the stored items."""
    out = read_all(buf)
    if out is None:
        return []
    rows = []
    for i in range(len(out['replay_unique_id'])):
        cond = tuple(float(x) for x in out['cond'][i].reshape(-1).tolist()) if 'cond' in out else None
        rows.append(
            (
                int(out['replay_unique_id'][i]),
                int(out['tag'][i]),
                tuple(float(x) for x in out['state'][i].reshape(-1).tolist()),
                cond,
                float(out['log_reward'][i]),
            )
        )
    return sorted(rows)


def assert_matches(buf, ref, exact_ids=True, where=''):
    got, want = snapshot(buf), ref.snapshot()
    assert buf.count() == len(ref.items), f"{where}: count {buf.count()} != {len(ref.items)}"
    ids = [g[0] for g in got]
    assert len(set(ids)) == len(ids), f"{where}: replay_unique_id not unique: {ids}"
    if exact_ids:
        assert got == want, f"{where}:\n got  {got}\n want {want}"
    else:  # same items, same relative insertion order
        assert [g[1:] for g in got] == [w[1:] for w in want], f"{where}:\n got  {got}\n want {want}"
    s, e = buf.stats(), ref.expected_stats()
    for key in (
        'size',
        'pushed',
        'admitted',
        'evicted',
        'filter_checked',
        'rejected_by_reward',
        'rejected_by_distance',
        'zero_reward_items',
        'unique_terminating_states',
    ):
        assert s[key] == e[key], f"{where}: stats[{key!r}] = {s[key]}, expected {e[key]}"
    checked = max(e['filter_checked'], 1)
    assert s['reject_rate_reward'] == pytest.approx(e['rejected_by_reward'] / checked), where
    assert s['reject_rate_distance'] == pytest.approx(e['rejected_by_distance'] / checked), where
    for key in ('log_reward_min', 'log_reward_max', 'log_reward_mean'):
        if e[key] is None:
            assert math.isnan(s[key]), f"{where}: stats[{key!r}] = {s[key]}, expected NaN"
        else:
            assert s[key] == pytest.approx(e[key], rel=1e-12, abs=1e-12), f"{where}: stats[{key!r}]"


def frozen(buf):
    """Everything observable about the buffer's contents (for all-or-nothing checks)."""
    return copy.deepcopy(buf.state_dict()), buf.count(), {k: v for k, v in buf.stats().items() if k != 'sampled'}


def assert_unchanged(buf, before):
    sd, n, stats = frozen(buf)
    assert n == before[1]
    assert_same(before[0], sd)
    assert stats.keys() == before[2].keys()
    for k in stats:
        a, b = stats[k], before[2][k]
        assert (math.isnan(a) and math.isnan(b)) or a == b, f"stats[{k!r}] changed: {b} -> {a}"


def random_items(rng, n, tag0, dim, grid, with_cond, levels=(0.0, 1.0, 2.0, 0.5, NINF), p_levels=None):
    states = rng.integers(0, grid, size=(n, dim))
    rewards = rng.choice(np.array(levels), size=n, p=p_levels)
    conds = rng.integers(0, 2, size=(n, 1)).tolist() if with_cond else None
    return items_of(states.tolist(), rewards.tolist(), tags=list(range(tag0, tag0 + n)), conds=conds)


def counts_of(ids, m):
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=m)


def softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    w = np.exp(logits - logits.max())
    return w / w.sum()


# ================================================================================ 1. gfn capacity
def test_prioritized_keeps_the_best_and_evicts_the_oldest_among_ties():
    buf = make('gfn', 3, prioritized_capacity=True)
    ref = RefBuffer(3, prioritized=True)
    for its in (
        items_of([[0], [1], [2]], [1, 1, 1], tags=[0, 1, 2]),
        items_of([[3]], [1], tags=[3]),
        items_of([[4], [5]], [1, 1], tags=[4, 5]),
    ):
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref)
    assert [row[1] for row in snapshot(buf)] == [3, 4, 5]  # only the newest of equal rewards stay
    its = items_of([[6], [7], [8], [9]], [2, 0, 1, 1], tags=[6, 7, 8, 9])
    buf.push(to_batch(its))
    ref.push(its)
    assert_matches(buf, ref)
    assert sorted(row[1] for row in snapshot(buf)) == [6, 8, 9]


def test_prioritized_eager_batch_larger_than_capacity():
    buf = make('gfn', 4, prioritized_capacity=True)
    ref = RefBuffer(4, prioritized=True)
    its = items_of([[i] for i in range(10)], [3, 1, 3, 2, 1, 3, 0, 3, 2, 1])
    assert buf.push(to_batch(its)) == 4
    ref.push(its)
    assert_matches(buf, ref)
    assert sorted(row[1] for row in snapshot(buf)) == [0, 2, 5, 7]


def test_fifo_keeps_the_newest():
    buf = make('gfn', 3, prioritized_capacity=False)
    ref = RefBuffer(3, prioritized=False)
    for its in (
        items_of([[100], [200], [300]], [5, 6, 7], tags=[100, 200, 300]),
        items_of([[1], [2]], [-1, NINF], tags=[1, 2]),
    ):
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref)
    assert [row[1] for row in snapshot(buf)] == [300, 1, 2]  # torchgfn's [100,200,300] + [1,2] -> [300,1,2]


def test_neg_inf_rewards_are_evicted_first():
    buf = make('gfn', 3, prioritized_capacity=True)
    ref = RefBuffer(3, prioritized=True)
    its = items_of([[0], [1], [2], [3]], [NINF, NINF, 0, 1])
    buf.push(to_batch(its))
    ref.push(its)
    assert_matches(buf, ref)
    assert sorted(row[1] for row in snapshot(buf)) == [1, 2, 3]
    assert buf.stats()['zero_reward_items'] == 1


def test_all_neg_inf_rewards_keep_the_newest():
    buf = make('gfn', 2, prioritized_capacity=True)
    ref = RefBuffer(2, prioritized=True)
    for k in range(3):
        its = items_of([[k], [k + 10]], [NINF, NINF], tags=[2 * k, 2 * k + 1])
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref)
    assert [row[1] for row in snapshot(buf)] == [4, 5]
    s = buf.stats()
    assert s['zero_reward_items'] == 2 and math.isnan(s['log_reward_max']) and math.isnan(s['log_reward_min'])


def test_lazy_sort_truncates_only_at_twice_the_capacity():
    buf = make('gfn', 4, prioritized_capacity=True, lazy_sort=True)
    ref = RefBuffer(4, prioritized=True, lazy=True)
    pushes = [
        items_of([[i] for i in range(3)], [0, 5, 1], tags=[0, 1, 2]),
        items_of([[i] for i in range(3, 7)], [2, 2, 0, 9], tags=[3, 4, 5, 6]),
        items_of([[7]], [-3], tags=[7]),
        items_of([[8], [9]], [2, 2], tags=[8, 9]),
    ]
    counts = []
    for its in pushes:
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref)
        counts.append(buf.count())
    assert counts == [3, 7, 4, 6]  # waiting items are stored and sampled until 3 + 4 + 1 reaches 8
    assert buf.sample(6, replace=False)['tag'].sort().values.tolist() == [1, 3, 4, 6, 8, 9]


def test_lazy_fifo():
    buf = make('gfn', 3, prioritized_capacity=False, lazy_sort=True)
    ref = RefBuffer(3, prioritized=False, lazy=True)
    for k in range(6):
        its = items_of([[k]], [10 - k], tags=[k])
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref)
    assert [row[1] for row in snapshot(buf)] == [3, 4, 5]


@pytest.mark.parametrize('bad', [float('nan'), INF])
@pytest.mark.parametrize(
    'kind,kw',
    [('gfn', dict(prioritized_capacity=True)), ('gfn', dict()), ('gfn_diverse', dict()), ('terminating_state', dict())],
)
def test_nan_or_pos_inf_reward_raises_and_changes_nothing(kind, kw, bad):
    buf = make(kind, 4, **kw)
    buf.push(to_batch(items_of([[0], [1]], [0, 1])))
    before = frozen(buf)
    with pytest.raises(ValueError):
        buf.push(to_batch(items_of([[2], [3], [4]], [1, bad, 2])))
    with pytest.raises(ValueError):
        buf.push(to_batch(items_of([[2], [3]], [bad, 1]), as_list=True))
    assert_unchanged(buf, before)


def test_list_of_items_equals_dict_batch():
    a = make('gfn', 6, prioritized_capacity=True)
    b = make('gfn', 6, prioritized_capacity=True)
    rng = np.random.default_rng(3)
    for k in range(5):
        its = random_items(rng, 4, 10 * k, 2, 3, with_cond=False)
        a.push(to_batch(its))
        b.push(to_batch(its, as_list=True))
    assert snapshot(a) == snapshot(b)
    assert_same(read_all(a)['extra'], read_all(b)['extra'])


@pytest.mark.parametrize('seed', range(12))
def test_gfn_random_pushes_match_reference(seed):
    rng = np.random.default_rng(1000 + seed)
    cap = int(rng.integers(5, 31))
    prioritized = bool(seed % 2 == 0)
    lazy = bool((seed // 2) % 2)
    with_cond = bool((seed // 4) % 2)
    dim = int(rng.integers(1, 3))
    kw = dict(prioritized_capacity=prioritized, lazy_sort=lazy)
    if with_cond:
        kw['condition_key'] = 'cond'
    buf = make('gfn', cap, **kw)
    ref = RefBuffer(cap, prioritized=prioritized, lazy=lazy)
    tag = 0
    for step in range(20):
        n = int(rng.integers(1, 41))
        its = random_items(rng, n, tag, dim, 3, with_cond)
        tag += n
        stored = buf.push(to_batch(its, as_list=bool(rng.random() < 0.2)))
        before = ref.c['admitted']
        ref.push(its)
        assert stored == ref.c['admitted'] - before
        assert_matches(buf, ref, where=f'seed {seed} push {step} cap {cap} kw {kw}')


# ================================================================================ 2. gfn_diverse
def full_diverse(cap=3, **kw):
    """A full diverse buffer holding states (10,), (20,), ... with rewards 1, 2, ..."""
    buf = make('gfn_diverse', cap, **kw)
    ref = RefBuffer(
        cap,
        diverse=True,
        lazy=kw.get('lazy_sort', False),
        cutoff=kw.get('cutoff_distance', 0.0),
        p=kw.get('p_norm_distance', 1.0),
    )
    its = items_of(
        [[10 * (i + 1)] for i in range(cap)], [i + 1 for i in range(cap)], tags=[100 + i for i in range(cap)]
    )
    buf.push(to_batch(its))
    ref.push(its)
    return buf, ref


def push_both(buf, ref, its, exact_ids=False):
    stored = buf.push(to_batch(its))
    before = ref.c['admitted']
    ref.push(its)
    assert stored == ref.c['admitted'] - before
    assert_matches(buf, ref, exact_ids=exact_ids)


def test_diverse_below_capacity_keeps_duplicates():
    buf = make('gfn_diverse', 10)
    ref = RefBuffer(10, diverse=True)
    push_both(buf, ref, items_of([[1, 1]] * 3, [0, 0, 0]))
    assert buf.count() == 3
    assert buf.stats()['unique_terminating_states'] == 1
    assert buf.stats()['filter_checked'] == 0


def test_diverse_filling_push_is_a_plain_insert_with_truncation():
    buf = make('gfn_diverse', 4)
    ref = RefBuffer(4, diverse=True)
    push_both(buf, ref, items_of([[0], [1]], [1, 1], tags=[0, 1]))
    push_both(buf, ref, items_of([[0], [0], [0], [5], [5]], [1, 3, 0, 1, 1], tags=[2, 3, 4, 5, 6]))
    assert sorted(row[1] for row in snapshot(buf)) == [2, 3, 5, 6]  # duplicates (0,) kept
    assert buf.stats()['filter_checked'] == 0


def test_diverse_reward_filter_keeps_ties_with_the_minimum():
    buf, ref = full_diverse(3)  # rewards 1, 2, 3
    push_both(buf, ref, items_of([[1], [2], [3], [4]], [0.5, 1, 1, 5], tags=[1, 2, 3, 4]))
    s = buf.stats()
    assert s['filter_checked'] == 4 and s['rejected_by_reward'] == 1 and s['rejected_by_distance'] == 0
    # 5 and the two ties with the minimum compete with the stored items; the newest of equal rewards stay
    assert sorted(row[1] for row in snapshot(buf)) == [4, 101, 102]


def test_diverse_duplicates_rejected_once_full_cutoff_zero():
    buf, ref = full_diverse(3)
    push_both(buf, ref, items_of([[20], [7], [7], [30], [8]], [9, 9, 8, 1, 2], tags=[1, 2, 3, 4, 5]))
    s = buf.stats()
    assert s['rejected_by_distance'] == 3  # (20,) stored, second (7,) an intra-batch duplicate, (30,) stored
    assert sorted(row[1] for row in snapshot(buf)) == [2, 5, 102]


def test_diverse_chain_is_not_greedy():
    buf, ref = full_diverse(3, cutoff_distance=1.0)
    push_both(buf, ref, items_of([[0], [1], [2]], [30, 20, 10], tags=[1, 2, 3]))
    assert buf.stats()['rejected_by_distance'] == 2
    assert sorted(row[1] for row in snapshot(buf)) == [1, 101, 102]


def test_diverse_stage_two_compares_with_stored_items_only():
    buf, ref = full_diverse(3, cutoff_distance=1.0)
    # (5,) and (7,) are far from each other; (11,) and (21,) are within 1 of stored (10,) and (20,)
    push_both(buf, ref, items_of([[11], [5], [21], [7]], [9, 9, 9, 9], tags=[1, 2, 3, 4]))
    assert sorted(row[1] for row in snapshot(buf)) == [2, 4, 102]


def test_diverse_negative_cutoff_disables_the_filter():
    buf, ref = full_diverse(3, cutoff_distance=-1.0)
    push_both(buf, ref, items_of([[30], [30], [30]], [9, 9, 0], tags=[1, 2, 3]))
    s = buf.stats()
    assert s['rejected_by_distance'] == 0 and s['rejected_by_reward'] == 1
    assert sorted(row[1] for row in snapshot(buf)) == [1, 2, 102]
    assert s['unique_terminating_states'] == 1  # three copies of (30,)


@pytest.mark.parametrize(
    'p,cutoff,at,beyond',
    [
        (1.0, 2.0, [1, 1], [1, 2]),
        (2.0, 5.0, [3, 4], [3, 5]),
        (INF, 2.0, [2, 1], [3, 0]),
        (3.0, 2.0, [2, 0], [2, 1]),
        (0.5, 4.0, [1, 1], [2, 1]),
    ],
)
def test_diverse_distance_equal_to_cutoff_is_rejected(p, cutoff, at, beyond):
    assert ref_distance((0, 0), tuple(at), p) == cutoff and ref_distance((0, 0), tuple(beyond), p) > cutoff
    buf = make('gfn_diverse', 2, cutoff_distance=cutoff, p_norm_distance=p)
    ref = RefBuffer(2, diverse=True, cutoff=cutoff, p=p)
    push_both(buf, ref, items_of([[0, 0], [100, 100]], [1, 1], tags=[0, 1]))
    # stage 2: at the cutoff from a stored state -> rejected; beyond -> admitted (it is far from `at` too)
    beyond = [-x for x in beyond]
    assert ref_distance(tuple(at), tuple(beyond), p) > cutoff
    push_both(buf, ref, items_of([at, beyond], [5, 4], tags=[2, 3]))
    assert sorted(row[1] for row in snapshot(buf)) == [1, 3]
    assert buf.stats()['rejected_by_distance'] == 1
    # stage 1: the second item is at the cutoff from the first (better) one
    far = [1000, 1000]
    at2 = [far[0] + at[0], far[1] + at[1]]
    push_both(buf, ref, items_of([far, at2], [9, 9], tags=[4, 5]))
    assert buf.stats()['rejected_by_distance'] == 2
    assert sorted(row[1] for row in snapshot(buf)) == [3, 4]


def test_diverse_conditions_are_part_of_the_representation():
    buf = make('gfn_diverse', 2, condition_key='cond')
    ref = RefBuffer(2, diverse=True)
    push_both(buf, ref, items_of([[1, 2], [3, 4]], [1, 1], tags=[0, 1], conds=[0, 0]))
    # same state as stored, other condition: distinct; same state and condition: duplicate
    push_both(buf, ref, items_of([[1, 2], [3, 4], [1, 2]], [5, 5, 5], tags=[2, 3, 4], conds=[1, 0, 1]))
    s = buf.stats()
    assert s['rejected_by_distance'] == 2
    assert sorted(row[1] for row in snapshot(buf)) == [1, 2]
    assert s['unique_terminating_states'] == 2


def test_diverse_condition_counts_in_the_distance():
    buf = make('gfn_diverse', 2, condition_key='cond', cutoff_distance=1.0)
    ref = RefBuffer(2, diverse=True, cutoff=1.0)
    push_both(buf, ref, items_of([[0], [50]], [1, 1], tags=[0, 1], conds=[0, 0]))
    # (0 | 2) is at L1 distance 2 from (0 | 0): admitted; (50 | 1) at distance 1 from (50 | 0): rejected
    push_both(buf, ref, items_of([[0], [50]], [5, 5], tags=[2, 3], conds=[2, 1]))
    assert sorted(row[1] for row in snapshot(buf)) == [1, 2]


def test_diverse_all_neg_inf():
    buf = make('gfn_diverse', 3)
    ref = RefBuffer(3, diverse=True)
    push_both(buf, ref, items_of([[0], [1], [2]], [NINF] * 3, tags=[0, 1, 2]))
    push_both(buf, ref, items_of([[3], [1], [4], [4]], [NINF] * 4, tags=[3, 4, 5, 6]))
    s = buf.stats()
    assert s['rejected_by_reward'] == 0 and s['rejected_by_distance'] == 2
    assert sorted(row[1] for row in snapshot(buf)) == [2, 3, 5]


def test_diverse_lazy_truncates_before_filtering():
    buf = make('gfn_diverse', 3, lazy_sort=True)
    ref = RefBuffer(3, diverse=True, lazy=True)
    push_both(buf, ref, items_of([[0], [1]], [1, 2], tags=[0, 1]))
    push_both(buf, ref, items_of([[2], [3], [4]], [3, 0, 4], tags=[2, 3, 4]))
    assert buf.count() == 5  # not yet truncated
    # full: truncate to 3 first (min becomes 2), so reward 1 is now below the minimum; (0,) was evicted
    push_both(buf, ref, items_of([[0], [5]], [1, 2], tags=[5, 6]))
    s = buf.stats()
    assert s['rejected_by_reward'] == 1 and s['filter_checked'] == 2
    assert sorted(row[1] for row in snapshot(buf)) == [1, 2, 4, 6]


DIVERSE_CASES = [(1.0, c, lazy) for c in (-1.0, 0.0) for lazy in (False, True)] + [
    (p, c, lazy) for p in (1.0, 2.0, INF, 3.0, 0.5) for c in (1.0, 2.0) for lazy in (False, True)
]


@pytest.mark.parametrize('p,cutoff,lazy', DIVERSE_CASES)
def test_diverse_random_pushes_match_reference(p, cutoff, lazy):
    seed = DIVERSE_CASES.index((p, cutoff, lazy))
    rng = np.random.default_rng(2000 + seed)
    cap = int(rng.integers(5, 31))
    with_cond = bool(seed % 3 == 0)
    dim = int(rng.integers(2, 4))
    kw = dict(cutoff_distance=cutoff, p_norm_distance=p, lazy_sort=lazy)
    if with_cond:
        kw['condition_key'] = 'cond'
    buf = make('gfn_diverse', cap, **kw)
    ref = RefBuffer(cap, diverse=True, lazy=lazy, cutoff=cutoff, p=p)
    tag = 0
    for step in range(20):
        n = int(rng.integers(1, 41))
        its = random_items(rng, n, tag, dim, 4, with_cond)
        tag += n
        stored = buf.push(to_batch(its, as_list=bool(rng.random() < 0.2)))
        before = ref.c['admitted']
        ref.push(its)
        assert stored == ref.c['admitted'] - before
        assert_matches(buf, ref, exact_ids=False, where=f'case {seed} push {step} cap {cap} kw {kw}')
    assert ref.c['filter_checked'] > 0
    if cutoff >= 0:
        assert ref.c['rejected_by_distance'] > 0


@pytest.mark.parametrize('p', [1.0, 2.0, INF, 3.0, 0.5])
def test_diverse_random_fractional_states_match_reference(p):
    """States k/3 (float32) and cutoffs equal to distances between such states: exact ties with the cutoff."""
    rng = np.random.default_rng(4000 + int(10 * min(p, 9)))
    third = [float(np.float32(k / 3)) for k in range(5)]
    cutoff = ref_distance((third[0], third[0]), (third[1], third[2]), p)
    buf = make('gfn_diverse', 10, cutoff_distance=cutoff, p_norm_distance=p)
    ref = RefBuffer(10, diverse=True, cutoff=cutoff, p=p)
    tag = 0
    for step in range(20):
        n = int(rng.integers(1, 25))
        its = random_items(rng, n, tag, 2, 5, False)
        for it in its:
            it['state'] = tuple(third[int(x)] for x in it['state'])
        tag += n
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref, exact_ids=False, where=f'p {p} push {step}')
    assert ref.c['rejected_by_distance'] > 0


def test_diverse_integer_states_match_reference():
    rng = np.random.default_rng(4100)
    buf = make('gfn_diverse', 8, cutoff_distance=1.0, p_norm_distance=2.0)
    ref = RefBuffer(8, diverse=True, cutoff=1.0, p=2.0)
    tag = 0
    for step in range(15):
        its = random_items(rng, int(rng.integers(1, 20)), tag, 3, 3, False)
        tag += len(its)
        buf.push(to_batch(its, state_dtype=torch.int64))
        ref.push(its)
        assert_matches(buf, ref, exact_ids=False, where=f'push {step}')
    assert read_all(buf)['state'].dtype == torch.int64


def test_negative_zero_is_the_same_state():
    buf = make('gfn_diverse', 2)
    buf.push(to_batch(items_of([[0.0, 1.0], [5.0, 5.0]], [0, 0])))
    assert buf.push(to_batch(items_of([[-0.0, 1.0]], [3]))) == 0
    assert buf.stats()['rejected_by_distance'] == 1
    g = make('gfn', 4)
    g.push(to_batch(items_of([[0.0], [-0.0], [1.0]], [0, 0, 0])))
    assert g.stats()['unique_terminating_states'] == 2


@pytest.mark.parametrize('seed', range(4))
def test_diverse_many_ties_match_reference(seed):
    rng = np.random.default_rng(3000 + seed)
    cap = 8
    buf = make('gfn_diverse', cap, cutoff_distance=float(seed % 2))
    ref = RefBuffer(cap, diverse=True, cutoff=float(seed % 2))
    tag = 0
    for step in range(25):
        n = int(rng.integers(1, 12))
        its = random_items(rng, n, tag, 2, 6, False, levels=(1.0, 2.0, 3.0), p_levels=(0.6, 0.3, 0.1))
        tag += n
        buf.push(to_batch(its))
        ref.push(its)
        assert_matches(buf, ref, exact_ids=False, where=f'push {step}')
    assert ref.c['rejected_by_reward'] > 0 and ref.c['evicted'] > 0


# ================================================================================ 3. terminating_state
def test_terminating_state_drops_extra_fields():
    buf = make('terminating_state', 4, prioritized_capacity=True, condition_key='cond')
    its = items_of([[0, 1], [2, 3], [4, 5]], [1, 2, 3], conds=[0, 1, 0])
    buf.push(to_batch(its))
    buf.push(to_batch(items_of([[6, 7]], [0], conds=[1]), as_list=True))
    out = read_all(buf)
    assert set(out) == {'state', 'log_reward', 'cond', 'replay_unique_id', 'replay_buffer_idx'}
    assert out['state'].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out['log_reward'].tolist() == [1, 2, 3, 0]
    assert out['cond'].reshape(-1).tolist() == [0, 1, 0, 1]
    assert out['log_reward'].dtype == torch.float64
    buf.push(to_batch(items_of([[8, 9]], [5], conds=[0])))
    out = read_all(buf)
    assert out['state'].tolist() == [[0, 1], [2, 3], [4, 5], [8, 9]]  # reward 0 left
    assert out['log_reward'].tolist() == [1, 2, 3, 5]


def test_terminating_state_without_condition_key_drops_the_condition():
    buf = make('terminating_state', 4)
    buf.push(to_batch(items_of([[0], [1]], [1, 2], conds=[0, 1])))
    assert set(read_all(buf)) == {'state', 'log_reward', 'replay_unique_id', 'replay_buffer_idx'}


# ================================================================================ 4. sampling
def filled(kind='gfn', rewards=(0.0,), **kw):
    buf = make(kind, len(rewards), prioritized_capacity=True, **kw)
    buf.push(to_batch(items_of([[i] for i in range(len(rewards))], list(rewards))))
    return buf


def test_uniform_sampling_with_replacement_is_uniform():
    buf = filled(rewards=[0, 5, -2, NINF, 1, 1, 3, 0, 0, 2], seed=1)
    out = buf.sample(20000)  # size > count: with replacement
    c = counts_of(out['tag'], 10)
    assert chi_square(c, np.full(10, 2000.0)) < chi_threshold(9)


def test_prioritized_sampling_with_replacement_follows_softmax():
    logits = [0.0, 1.0, 2.0, -1.0, 0.5, NINF]
    buf = filled(rewards=logits, prioritized_sampling=True, seed=2)
    out = buf.sample(30000, replace=True)
    c = counts_of(out['tag'], 6)
    assert c[5] == 0
    p = softmax(logits[:5])
    assert chi_square(c[:5], 30000 * p) < chi_threshold(4)


def test_huge_log_rewards_do_not_overflow():
    buf = filled(rewards=[1e4, 1e4 - 1], prioritized_sampling=True, seed=3)
    out = buf.sample(20000, replace=True)
    c = counts_of(out['tag'], 2)
    p = np.array([math.e, 1.0]) / (1.0 + math.e)
    assert chi_square(c, 20000 * p) < chi_threshold(1)
    firsts = [int(buf.sample(2, replace=False)['tag'][0]) for _ in range(2000)]
    assert chi_square(counts_of(firsts, 2), 2000 * p) < chi_threshold(1)


@pytest.mark.parametrize('prioritized', [False, True])
def test_without_replacement_draws_distinct_items(prioritized):
    buf = filled(rewards=[0, 1, 2, 3, 4, 5, 6, 7], prioritized_sampling=prioritized, seed=4)
    for k in (1, 3, 8):
        for _ in range(20):
            tags = buf.sample(k, replace=False)['tag'].tolist()
            assert len(tags) == k and len(set(tags)) == k


def test_without_replacement_first_draw_follows_softmax():
    logits = [0.0, 1.0, 2.0, -0.5, 1.5]
    buf = filled(rewards=logits, prioritized_sampling=True, seed=5)
    firsts = [int(buf.sample(3, replace=False)['tag'][0]) for _ in range(4000)]
    assert chi_square(counts_of(firsts, 5), 4000 * softmax(logits)) < chi_threshold(4)


def plackett_luce_inclusion(weights, k):
    """Exact probability that each item is among the first k of a successive draw (enumerates permutations)."""
    m = len(weights)
    inc = [0.0] * m
    for perm in itertools.permutations(range(m)):
        prob, left = 1.0, sum(weights)
        for i in perm:
            prob *= weights[i] / left
            left -= weights[i]
        for i in perm[:k]:
            inc[i] += prob
    return inc


def test_inclusion_probability_two_of_four_matches_plackett_luce():
    logits = [0.0, 1.0, 2.0, 0.5]
    buf = filled(rewards=logits, prioritized_sampling=True, seed=6)
    expected = plackett_luce_inclusion([math.exp(x) for x in logits], 2)
    assert sum(expected) == pytest.approx(2.0)
    n = 4000
    seen = np.zeros(4)
    for _ in range(n):
        tags = buf.sample(2, replace=False)['tag'].tolist()
        assert len(set(tags)) == 2
        seen[tags] += 1
    for i in range(4):
        sd = math.sqrt(expected[i] * (1 - expected[i]) / n)
        assert abs(seen[i] / n - expected[i]) < 5 * sd, (i, seen[i] / n, expected[i])
    # differs clearly from the first-draw softmax probabilities scaled by 2
    assert abs(expected[2] - 2 * softmax(logits)[2]) > 0.2


def test_uniform_without_replacement_inclusion_is_k_over_m():
    buf = filled(rewards=[0, 5, 9, -1, NINF], seed=7)
    seen = np.zeros(5)
    for _ in range(3000):
        seen[buf.sample(2, replace=False)['tag'].tolist()] += 1
    assert chi_square(seen, np.full(5, 3000 * 2 / 5)) < chi_threshold(4)


def test_all_neg_inf_prioritized_sampling_is_uniform():
    buf = filled(rewards=[NINF] * 5, prioritized_sampling=True, seed=8)
    c = counts_of(buf.sample(10000, replace=True)['tag'], 5)
    assert chi_square(c, np.full(5, 2000.0)) < chi_threshold(4)
    firsts = [int(buf.sample(2, replace=False)['tag'][0]) for _ in range(2000)]
    assert chi_square(counts_of(firsts, 5), np.full(5, 400.0)) < chi_threshold(4)
    assert sorted(buf.sample(5, replace=False)['tag'].tolist()) == [0, 1, 2, 3, 4]


def test_mixture_with_neg_inf_includes_every_finite_item():
    buf = filled(rewards=[NINF, 3.0, NINF, -50.0, NINF, 0.0], prioritized_sampling=True, seed=9)
    for _ in range(200):
        tags = buf.sample(4, replace=False)['tag'].tolist()
        assert len(set(tags)) == 4 and {1, 3, 5} <= set(tags)
    for _ in range(50):
        assert set(buf.sample(3, replace=False)['tag'].tolist()) == {1, 3, 5}
    assert not (set(buf.sample(3000, replace=True)['tag'].tolist()) & {0, 2, 4})


def test_sample_replacement_none_true_false():
    buf = filled(rewards=[0, 1, 2, 3, 4], seed=10)
    for _ in range(20):
        assert len(set(buf.sample(5)['tag'].tolist())) == 5  # size <= count: without replacement
    out = buf.sample(12)  # size > count: with replacement
    assert len(out['tag']) == 12
    assert buf.sample(6, replace=False) is None
    strict = filled(rewards=[0, 1, 2, 3, 4], sample_replacement=False, seed=10)
    assert strict.sample(6) is None
    assert sorted(strict.sample(5)['tag'].tolist()) == [0, 1, 2, 3, 4]
    always = filled(rewards=[0, 1, 2, 3, 4], sample_replacement=True, seed=10)
    assert any(len(set(always.sample(5)['tag'].tolist())) < 5 for _ in range(20))


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_empty_buffer_samples_none(kind):
    buf = make(kind, 4)
    assert buf.sample(1) is None
    assert buf.sample(3, replace=True) is None
    buf.push(to_batch(items_of([[0]], [0])))
    buf.clear()
    assert buf.count() == 0 and buf.sample(1) is None


def test_lazy_waiting_items_are_sampled_by_reward():
    buf = make('gfn', 3, prioritized_capacity=True, lazy_sort=True, prioritized_sampling=True, seed=12)
    logits = [0.0, 1.0, 2.0, 0.5, -1.0]
    buf.push(to_batch(items_of([[i] for i in range(5)], logits)))
    assert buf.count() == 5  # 5 < 2 * 3: nothing truncated yet
    c = counts_of(buf.sample(20000, replace=True)['tag'], 5)
    assert chi_square(c, 20000 * softmax(logits)) < chi_threshold(4)
    assert sorted(buf.sample(5)['tag'].tolist()) == [0, 1, 2, 3, 4]


def test_sample_argument_errors():
    buf = filled(rewards=[0, 1])
    with pytest.raises(ValueError):
        buf.sample(0)
    with pytest.raises(TypeError):
        buf.sample(1.5)
    with pytest.raises(TypeError):
        buf.sample(1, replace='yes')


def test_sampling_is_reproducible_with_seed():
    a = filled(rewards=[0, 1, 2, 3], prioritized_sampling=True, seed=11)
    b = filled(rewards=[0, 1, 2, 3], prioritized_sampling=True, seed=11)
    for k in (2, 4, 9):
        assert_same(a.sample(k), b.sample(k))


# ================================================================================ 5. bad input
def base_buffer(kind='gfn', **kw):
    buf = (
        make(kind, 4, prioritized_capacity=True, condition_key='cond', **kw)
        if kind != 'gfn_diverse'
        else make(kind, 4, condition_key='cond', **kw)
    )
    buf.push(to_batch(items_of([[0, 0], [1, 1], [2, 2]], [0, 1, 2], conds=[0, 0, 1])))
    return buf


def good():
    return to_batch(items_of([[5, 5], [6, 6]], [3, 4], conds=[0, 1]))


BAD_BATCHES = {
    'nan_reward': lambda: {**good(), 'log_reward': torch.tensor([0.0, float('nan')], dtype=torch.float64)},
    'inf_reward': lambda: {**good(), 'log_reward': torch.tensor([INF, 0.0], dtype=torch.float64)},
    'reward_2d': lambda: {**good(), 'log_reward': torch.zeros(2, 1, dtype=torch.float64)},
    'reward_int': lambda: {**good(), 'log_reward': torch.zeros(2, dtype=torch.int64)},
    'missing_state': lambda: {k: v for k, v in good().items() if k != 'state'},
    'missing_reward': lambda: {k: v for k, v in good().items() if k != 'log_reward'},
    'missing_condition': lambda: {k: v for k, v in good().items() if k != 'cond'},
    'state_dim': lambda: {**good(), 'state': torch.zeros(2, 3)},
    'lengths_differ': lambda: {**good(), 'log_reward': torch.zeros(3, dtype=torch.float64)},
    'list_bad_item': lambda: (
        to_batch(items_of([[5, 5]], [1], conds=[0]), as_list=True)
        + [{**to_batch(items_of([[6, 6]], [1], conds=[0]), as_list=True)[0], 'state': torch.zeros(4)}]
    ),
}


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse', 'terminating_state'])
@pytest.mark.parametrize('name', sorted(BAD_BATCHES))
def test_bad_batch_raises_and_leaves_buffer_unchanged(kind, name):
    buf = base_buffer(kind)
    for _ in range(2):  # also once the diverse buffer is full
        before = frozen(buf)
        with pytest.raises(ValueError):
            buf.push(BAD_BATCHES[name]())
        assert_unchanged(buf, before)
        buf.push(good())
    assert buf.count() == 4


def test_failed_first_push_leaves_a_fresh_buffer():
    buf = make('gfn', 3, prioritized_capacity=True)
    with pytest.raises(ValueError):
        buf.push({'state': torch.zeros(2, 2), 'log_reward': torch.tensor([0.0, float('nan')])})
    assert buf.count() == 0 and buf.sample(1) is None
    # another schema and state size are still accepted: nothing was fixed by the failed push
    its = items_of([[1, 2, 3], [4, 5, 6]], [0, 1])
    assert buf.push(to_batch(its)) == 2
    assert read_all(buf)['state'].tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize('bad', [float('nan'), INF, NINF])
def test_diverse_non_finite_state_or_condition_raises(bad):
    buf = base_buffer('gfn_diverse')
    before = frozen(buf)
    b = good()
    b['state'][1, 0] = bad
    with pytest.raises(ValueError):
        buf.push(b)
    b = good()
    b['cond'][0, 0] = bad
    with pytest.raises(ValueError):
        buf.push(b)
    assert_unchanged(buf, before)


class FakeContainer:
    """The Container protocol in a few lines (not torchgfn): states [n, d], log-rewards [n]."""

    def __init__(self, states, log_rewards):
        self.states, self._log_rewards = states, log_rewards

    def __len__(self):
        return len(self.states)

    def __getitem__(self, idx):
        return FakeContainer(self.states[idx], self._log_rewards[idx])

    def extend(self, other):
        self.states = torch.cat([self.states, other.states])
        self._log_rewards = torch.cat([self._log_rewards, other._log_rewards])

    @property
    def log_rewards(self):
        return self._log_rewards

    @property
    def terminating_states(self):
        return self.states


class NoRewardContainer(FakeContainer):
    """A container without log-rewards (as torchgfn's backward trajectories)."""

    def __init__(self, states, log_rewards=None):
        super().__init__(states, None)

    def __getitem__(self, idx):
        return NoRewardContainer(self.states[idx])

    def extend(self, other):
        self.states = torch.cat([self.states, other.states])


def test_a_container_whose_extend_fails_halfway_keeps_the_buffer_usable():
    """An ``extend`` that fails after changing the stored container (no memory for its second field): the stored
    container goes back to the items it held, so later pushes, samples and round trips work (they failed for good:
    its length no longer matched the positions the buffer counts)."""

    class Halfway(FakeContainer):
        fail = False

        def __getitem__(self, idx):
            return Halfway(self.states[idx], self._log_rewards[idx])

        def extend(self, other):
            self.states = torch.cat([self.states, other.states])
            if Halfway.fail and len(self.states) > 4:  # (the buffer's own try, on a copy of one item, passes)
                Halfway.fail = False
                raise MemoryError('no memory for the log-rewards')
            self._log_rewards = torch.cat([self._log_rewards, other._log_rewards])

    buf = make('gfn', 8)
    buf.push(Halfway(torch.arange(6.0).reshape(3, 2), torch.arange(3.0)))
    Halfway.fail = True
    with pytest.raises(MemoryError):
        buf.push(Halfway(torch.ones(2, 2), torch.zeros(2)))
    buf.push(Halfway(torch.full((4, 2), 7.0), torch.full((4,), 7.0)))
    assert sorted(buf.log_rewards().tolist())[-4:] == [7.0] * 4
    other = make('gfn', 8)
    other.load_state_dict(buf.state_dict())
    assert sorted(other.log_rewards().tolist()) == sorted(buf.log_rewards().tolist())
    assert len(other.sample(buf.count())) == buf.count()


def test_a_loaded_state_of_containers_stays_the_callers():
    """A state's container was held by the buffer that loaded it: editing the state changed the buffer, and two
    buffers loaded from one state shared it (a push into one grew the other's, whose next push failed)."""
    buf = make('gfn', 8)
    buf.push(FakeContainer(torch.arange(10.0).reshape(5, 2), torch.arange(5.0)))
    state = buf.state_dict()
    one, two = make('gfn', 8), make('gfn', 8)
    one.load_state_dict(state)
    two.load_state_dict(state)
    state['store']['container'].states.add_(1000)  # (the caller's state, reused)
    assert one.training_container.states.tolist() == buf.training_container.states.tolist()
    one.push(FakeContainer(torch.full((2, 2), 7.0), torch.tensor([9.0, 9.0])))
    assert (one.count(), two.count(), len(two.training_container)) == (7, 5, 5)
    assert two.push(FakeContainer(torch.full((2, 2), 5.0), torch.tensor([8.0, 8.0]))) == 2
    assert two.training_container.states[-2:].tolist() == [[5.0, 5.0], [5.0, 5.0]]


def test_a_fifo_buffer_of_containers_without_rewards_loads_its_own_state(tmp_path):
    """A FIFO buffer keeps such items (log-reward NaN: none), but its state and files were then refused at load."""
    buf = make('gfn', 4)
    assert buf.push(NoRewardContainer(torch.arange(6.0).reshape(3, 2))) == 3
    twin = make('gfn', 4)
    twin.load_state_dict(buf.state_dict())
    assert twin.count() == 3 and twin.stats()['unique_terminating_states'] == 3
    buf.save_data(str(tmp_path / 'b.pt'))
    again = make('gfn', 4)
    again.load_data(str(tmp_path / 'b.pt'), allow_pickle=True)  # the container class is pickled
    out = again.sample(3, replace=False)
    assert sorted(out.states.tolist()) == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    # a prioritized buffer needs the rewards: it refuses the push (a state brings its own settings: FIFO)
    prio = make('gfn', 4, prioritized_capacity=True)
    with pytest.raises(ValueError, match='log_rewards must be defined'):
        prio.push(NoRewardContainer(torch.zeros(1, 2)))
    assert prio.count() == 0


def test_dict_and_container_pushes_do_not_mix():
    buf = base_buffer('gfn')
    before = frozen(buf)
    with pytest.raises(TypeError):
        buf.push(FakeContainer(torch.zeros(2, 2), torch.zeros(2)))
    assert_unchanged(buf, before)
    cbuf = make('gfn', 4, prioritized_capacity=True)
    cbuf.push(FakeContainer(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0.0, 1.0])))
    assert cbuf.count() == 2
    stats = cbuf.stats()
    with pytest.raises(TypeError):
        cbuf.push(good())
    with pytest.raises(TypeError):
        cbuf.push(to_batch(items_of([[0, 0]], [0]), as_list=True))
    assert cbuf.stats() == stats
    out = cbuf.sample(2, replace=False)
    assert isinstance(out, FakeContainer)
    assert sorted(out.log_rewards.tolist()) == [0.0, 1.0]
    assert sorted(out.states.tolist()) == [[0.0, 0.0], [1.0, 1.0]]


def test_push_none_and_unknown_types_raise_type_error():
    buf = base_buffer('gfn')
    before = frozen(buf)
    with pytest.raises(TypeError):
        buf.push(None)
    with pytest.raises(TypeError):
        buf.push(torch.zeros(3))
    assert_unchanged(buf, before)
    assert buf.push([]) == 0
    assert_unchanged(buf, before)


@pytest.mark.parametrize(
    'kind,cfg,key',
    [
        ('gfn', dict(replay_buffer_size=-1), 'replay_buffer_size'),
        ('gfn', dict(replay_buffer_size=0), 'replay_buffer_size'),
        ('gfn_diverse', dict(replay_buffer_size=-3), 'replay_buffer_size'),
        ('gfn_diverse', dict(p_norm_distance=0), 'p_norm_distance'),
        ('gfn_diverse', dict(p_norm_distance=-1.0), 'p_norm_distance'),
        ('gfn_diverse', dict(p_norm_distance=float('nan')), 'p_norm_distance'),
        ('gfn_diverse', dict(cutoff_distance=float('nan')), 'cutoff_distance'),
        ('gfn_diverse', dict(cutoff_distance=INF), 'cutoff_distance'),
        ('gfn_diverse', dict(prioritized_capacity=False), 'prioritized_capacity'),
        ('gfn', dict(replay_buffer_sz=5), 'replay_buffer_sz'),
        ('gfn_diverse', dict(cutof_distance=1.0), 'cutof_distance'),
        ('terminating_state', dict(lazy_srt=True), 'lazy_srt'),
        ('gfn', dict(sample_replacement='yes'), 'sample_replacement'),
        ('gfn', dict(state_key=''), 'state_key'),
        ('gfn', dict(monitor=dict(log_every=0)), 'monitor.log_every'),
        # slots no machine holds (80 TiB): refused when built, not a MemoryError at the first push
        ('gfn', dict(replay_buffer_size=2**40), 'replay_buffer_size'),
        ('terminating_state', dict(capacity=2**40), 'replay_buffer_size'),
        ('gfn', dict(capacity=np.int64(2**40), replay_buffer_size=2**40), 'replay_buffer_size'),
        # two keys naming one field: a gfn_diverse row held the state twice (or its reward) as its "condition"
        ('gfn_diverse', dict(condition_key='state'), 'condition_key'),
        ('gfn', dict(condition_key='log_reward'), 'condition_key'),
        ('terminating_state', dict(state_key='log_reward'), 'log_reward_key'),
    ],
)
def test_bad_config_raises_naming_the_key(kind, cfg, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        create_buffer(dict(type=kind, **cfg))


def test_diverse_filter_with_cutoff_to_the_p_beyond_float64_decides_as_the_numpy_fallback():
    """cutoff ** p = 10 ** 400 overflowed the compiled kernels' early-exit bound (a Python float power): every
    push into a full buffer raised OverflowError once numba had loaded."""
    _numba.load()  # the compiled kernels (a no-op without numba)
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=1, cutoff_distance=10.0, p_norm_distance=400.0))
    buf.push({'state': torch.tensor([[0.0, 0.0]]), 'log_reward': torch.tensor([0.0])})
    before = buf.state_dict()
    buf.push({'state': torch.tensor([[5.0, 5.0]]), 'log_reward': torch.tensor([1.0])})  # distance 5.01: too close
    assert buf.stats()['rejected_by_distance'] == 1
    assert_same(without(buf.state_dict(), 'counters'), without(before, 'counters'))  # nothing stored
    buf.push({'state': torch.tensor([[20.0, 0.0]]), 'log_reward': torch.tensor([1.0])})  # distance 20: far
    assert buf.sample(1)['state'].tolist() == [[20.0, 0.0]]


@pytest.mark.parametrize('key', ['cutoff_distance', 'p_norm_distance'])
def test_diverse_distance_settings_beyond_the_float_range_name_the_key(key):
    """10**400 is an int no float holds: a ValueError naming the key (was a TypeError from np.isfinite at the
    build for the cutoff, an OverflowError at the first full push for p)."""
    with pytest.raises(ValueError, match=f"'{key}' has invalid value 1000"):
        create_buffer(dict(type='gfn_diverse', replay_buffer_size=2, **{key: 10**400}))


def test_diverse_distance_settings_may_be_large_ints():
    _numba.load()
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=1, cutoff_distance=10**30, p_norm_distance=10**30))
    buf.push({'state': torch.tensor([[0.0, 0.0]]), 'log_reward': torch.tensor([0.0])})
    buf.push({'state': torch.tensor([[1e35, 0.0]]), 'log_reward': torch.tensor([1.0])})  # farther than 1e30
    assert buf.sample(1)['state'][0, 0].item() > 1e34 and buf.stats()['rejected_by_distance'] == 0


def test_cutoff_and_p_settings_only_exist_on_the_diverse_buffer():
    with pytest.raises(ValueError, match='cutoff_distance'):
        create_buffer(dict(type='gfn', cutoff_distance=1.0))
    buf = create_buffer(dict(type='gfn_diverse', p_norm_distance=INF, cutoff_distance=-2))
    assert buf.cfg.prioritized_capacity is True and buf.cfg.p_norm_distance == INF


# ================================================================================ 6. save / load
def fill_for_save(kind, kw, seed):
    rng = np.random.default_rng(seed)
    buf = make(kind, 6, **kw)
    tag = 0
    for _ in range(5):
        its = random_items(rng, 4, tag, 2, 3, with_cond=True)
        tag += 4
        buf.push(to_batch(its))
    return buf, rng, tag


def assert_same_contents(a, b):
    x, y = read_all(a), read_all(b)
    if x is None or y is None:
        assert x is None and y is None
        return
    x.pop('replay_buffer_idx')
    y.pop('replay_buffer_idx')
    assert_same(x, y)


SAVE_CASES = [
    (
        'gfn',
        dict(
            prioritized_capacity=True,
            lazy_sort=True,
            prioritized_sampling=True,
            sample_replacement=True,
            condition_key='cond',
        ),
        DEFAULT_SETTINGS,
    ),
    ('gfn', dict(prioritized_capacity=False, condition_key='cond'), DEFAULT_SETTINGS),
    (
        'gfn_diverse',
        dict(lazy_sort=True, cutoff_distance=1.5, p_norm_distance=INF, condition_key='cond'),
        DIVERSE_SETTINGS,
    ),
    ('gfn_diverse', dict(cutoff_distance=0.0, p_norm_distance=0.5, condition_key='cond'), DIVERSE_SETTINGS),
    ('terminating_state', dict(prioritized_capacity=True, condition_key='cond'), DEFAULT_SETTINGS),
]


@pytest.mark.parametrize('kind,kw,settings', SAVE_CASES)
def test_save_load_round_trip(tmp_path, kind, kw, settings):
    buf, rng, tag = fill_for_save(kind, kw, seed=42)
    path = str(tmp_path / 'gfn.pt')
    buf.save_data(path)
    loaded = create_buffer(dict(type=kind))
    loaded.load_data(path)
    for key in settings:
        assert loaded.cfg[key] == buf.cfg[key], key
    assert loaded.replay_buffer_size == 6 and loaded.capacity == 6
    assert loaded.stats() == buf.stats()
    assert_same_contents(buf, loaded)
    for _ in range(6):  # further pushes behave exactly as in the original
        its = random_items(rng, int(rng.integers(1, 8)), tag, 2, 3, with_cond=True)
        tag += len(its)
        assert buf.push(to_batch(its)) == loaded.push(to_batch(its))
        assert loaded.stats() == buf.stats()
        assert_same_contents(buf, loaded)


def test_save_load_empty_buffer(tmp_path):
    buf = make('gfn_diverse', 7, cutoff_distance=2.0)
    path = str(tmp_path / 'empty.pt')
    buf.save_data(path)
    loaded = create_buffer(dict(type='gfn_diverse'))
    loaded.load_data(path)
    assert loaded.count() == 0 and loaded.capacity == 7 and loaded.cfg.cutoff_distance == 2.0


def corrupt_files(tmp_path, good_path):
    raw = open(good_path, 'rb').read()
    out = {}
    for name, data in (
        ('garbage', b'this is not a buffer file' * 10),
        ('truncated', raw[: len(raw) // 2]),
        ('empty', b''),
    ):
        p = tmp_path / f'{name}.pt'
        p.write_bytes(data)
        out[name] = str(p)
    other = create_buffer(dict(type='naive', replay_buffer_size=4))
    other.push([{'x': 1}])
    p = str(tmp_path / 'naive.pt')
    other.save_data(p)
    out['other_buffer'] = p
    return out


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse'])
def test_loading_a_corrupt_file_raises_and_changes_nothing(tmp_path, kind):
    src, _, _ = fill_for_save(kind, dict(condition_key='cond'), seed=1)
    good_path = str(tmp_path / 'good.pt')
    src.save_data(good_path)
    buf, _, _ = fill_for_save(kind, dict(condition_key='cond'), seed=2)
    before = frozen(buf)
    for name, path in corrupt_files(tmp_path, good_path).items():
        with pytest.raises(ValueError):
            buf.load_data(path)
        assert_unchanged(buf, before)
    buf.load_data(good_path)
    assert_same_contents(src, buf)


def _corrupt_state(state, what):
    s = copy.deepcopy(state)
    if what == 'duplicate_seq':
        s['index']['seq'][1] = s['index']['seq'][0]
    elif what == 'seq_beyond_next':
        s['index']['next_seq'] = 1
    elif what == 'too_many_items':
        s['settings']['replay_buffer_size'] = 2
    elif what == 'bad_setting':
        s['settings']['p_norm_distance'] = 0.0
    elif what == 'unknown_store':
        s['store']['kind'] = 'mystery'
    elif what == 'short_field':
        s['store']['fields'][0] = s['store']['fields'][0][:2]
    elif what == 'missing_counters':
        del s['counters']
    elif what == 'missing_state_field':
        keep = [i for i, sch in enumerate(s['store']['schema']) if list(sch[0]) != ['state']]
        s['store']['schema'] = [s['store']['schema'][i] for i in keep]
        s['store']['fields'] = [s['store']['fields'][i] for i in keep]
    elif what == 'renamed_reward_key':  # the key travels with the settings: the stored field must exist
        s['settings']['log_reward_key'] = 'lr'
    elif what in ('nan_reward_field', 'index_reward_changed', 'nan_state'):
        names = [list(sch[0]) for sch in s['store']['schema']]
        if what == 'nan_reward_field':
            s['store']['fields'][names.index(['log_reward'])][0] = float('nan')
        elif what == 'index_reward_changed':
            s['index']['log_reward'][0] = 50.0
        else:  # gfn_diverse refuses non-finite states at push
            s['store']['fields'][names.index(['state'])][0, 0] = float('nan')
    return s


CORRUPT_STATES = [
    'duplicate_seq',
    'seq_beyond_next',
    'too_many_items',
    'bad_setting',
    'unknown_store',
    'short_field',
    'missing_counters',
    'missing_state_field',
    'renamed_reward_key',
    'nan_reward_field',
    'index_reward_changed',
    'nan_state',
]


@pytest.mark.parametrize('what', CORRUPT_STATES)
def test_loading_an_inconsistent_state_file_raises_and_changes_nothing(tmp_path, what):
    src = make('gfn_diverse', 4, condition_key='cond')
    src.push(to_batch(items_of([[0, 0], [1, 1], [2, 2], [3, 3]], [0, 1, 2, 3], conds=[0, 0, 1, 1])))
    path = str(tmp_path / f'{what}.pt')
    save_state(path, type(src).__name__, _corrupt_state(src.state_dict(), what))
    buf = make('gfn_diverse', 5, condition_key='cond')
    # slots get reused out of insertion order, so a half-done restore would be visible
    buf.push(to_batch(items_of([[5, 5], [6, 6], [7, 7], [8, 8], [9, 9]], [4, 0, 5, 1, 6], conds=[0] * 5)))
    buf.push(to_batch(items_of([[10, 10], [11, 11]], [7, 8], conds=[1, 1])))
    before = frozen(buf)
    with pytest.raises(ValueError):
        buf.load_data(path)
    assert_unchanged(buf, before)
    # and it still filters duplicates of what it holds
    assert buf.push(to_batch(items_of([[10, 10]], [9], conds=[1]))) == 0


# ================================================================================ 7. numba vs numpy
def numba_scenario():
    """A small randomised diverse run per (cutoff, p, condition); returns JSON-able contents and counters."""
    results = []
    cases = [
        (1.0, 1.0, False),
        (2.0, 2.0, True),
        (1.0, INF, False),
        (2.0, 3.0, True),
        (4.0, 0.5, False),
        (0.0, 1.0, True),
        (1.5, 2.0, False),
    ]
    for k, (cutoff, p, with_cond) in enumerate(cases):
        rng = np.random.default_rng(500 + k)
        kw = dict(cutoff_distance=cutoff, p_norm_distance=p, lazy_sort=bool(k % 2), seed=0)
        if with_cond:
            kw['condition_key'] = 'cond'
        buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=12, **kw))
        tag = 0
        for _ in range(12):
            its = random_items(rng, int(rng.integers(1, 30)), tag, 3, 4, with_cond)
            tag += len(its)
            buf.push(to_batch(its))
        s = buf.stats()
        results.append(
            dict(
                contents=[list(r[1:3]) + [r[4]] for r in snapshot(buf)],
                counters=[
                    s[c]
                    for c in (
                        'filter_checked',
                        'rejected_by_reward',
                        'rejected_by_distance',
                        'admitted',
                        'evicted',
                        'unique_terminating_states',
                    )
                ],
            )
        )
    return dict(have_numba=diversity.HAVE_NUMBA, results=results)


@pytest.mark.slow
def test_numba_and_numpy_fallback_agree():
    env = subprocess_env(HERE, DING_BUFFER_NO_NUMBA='1')  # this module and the shared helpers it imports
    code = 'import json, test_gflownet as t; print("JSON:" + json.dumps(t.numba_scenario()))'
    proc = subprocess.run([sys.executable, '-c', code], env=env, cwd=HERE, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('JSON:')][-1]
    fallback = json.loads(line[len('JSON:') :])
    assert fallback['have_numba'] is False
    here = json.loads(json.dumps(numba_scenario()))
    if importlib.util.find_spec('numba') is not None and os.environ.get('DING_BUFFER_NO_NUMBA', '') in ('', '0'):
        assert here['have_numba'] is True  # so the comparison really is kernel vs fallback
    assert here['results'] == fallback['results']
    assert sum(r['counters'][2] for r in here['results']) > 0  # the distance filter did reject items


# ================================================================================ 8. TensorBoard
class FakeWriter:
    def __init__(self):
        self.calls = []
        self.closed = False

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, float(value), int(step)))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_tensorboard_scalars():
    tb = FakeWriter()
    buf = create_buffer(
        dict(
            type='gfn_diverse',
            replay_buffer_size=3,
            cutoff_distance=1.0,
            seed=0,
            monitor=dict(tensorboard=True, log_every=1),
        ),
        tb,
        'exp',
        'gfnbuf',
    )
    ref = RefBuffer(3, diverse=True, cutoff=1.0)
    pushes = [
        items_of([[0], [10]], [NINF, NINF]),
        items_of([[20], [21]], [1, 2]),
        items_of([[30], [31], [40], [0], [50]], [5, 5, 6, NINF, 7]),
        items_of([[60], [61], [62]], [9, 8, 0]),
    ]
    for step, its in enumerate(pushes, start=1):
        before = dict(ref.c)
        buf.push(to_batch(its))
        ref.push(its)
        got = {tag: v for tag, v, st in tb.calls if st == step}
        assert all(tag.startswith('gfnbuf_iter/') for tag in got)
        got = {tag[len('gfnbuf_iter/') :]: v for tag, v in got.items()}
        e = ref.expected_stats()
        assert got['size'] == e['size']
        assert got['unique_terminating_states'] == e['unique_terminating_states']
        if e['log_reward_max'] is None:
            assert 'log_reward_max' not in got
        else:
            assert got['log_reward_max'] == e['log_reward_max']
            assert got['log_reward_min'] == e['log_reward_min']
        checked = ref.c['filter_checked'] - before['filter_checked']
        if checked:
            for what in ('reward', 'distance'):
                rate = (ref.c[f'rejected_by_{what}'] - before[f'rejected_by_{what}']) / checked
                assert got[f'reject_rate_{what}'] == pytest.approx(rate), (step, what)
        else:
            assert 'reject_rate_reward' not in got and 'reject_rate_distance' not in got
    steps = {st for _, _, st in tb.calls}
    assert steps == {1, 2, 3, 4}
    # push 3: 5 checked, the stored minimum is -inf (nothing below it), (31,) within 1 of (30,)
    assert ('gfnbuf_iter/reject_rate_reward', 0.0, 3) in tb.calls
    assert ('gfnbuf_iter/reject_rate_distance', 0.2, 3) in tb.calls
    # push 4: 3 checked, reward 0 below the minimum 5, (61,) within 1 of (60,)
    assert ('gfnbuf_iter/reject_rate_reward', 1 / 3, 4) in tb.calls
    assert ('gfnbuf_iter/reject_rate_distance', 1 / 3, 4) in tb.calls
    assert ('gfnbuf_iter/log_reward_max', 9.0, 4) in tb.calls and ('gfnbuf_iter/size', 3.0, 4) in tb.calls
    buf.close()
    assert not tb.closed  # borrowed writer


def test_tensorboard_log_every():
    tb = FakeWriter()
    buf = create_buffer(
        dict(type='gfn', replay_buffer_size=5, monitor=dict(tensorboard=True, log_every=2)), tb, 'exp', 'b'
    )
    for k in range(5):
        buf.push(to_batch(items_of([[k]], [k])))
    assert sorted({st for _, _, st in tb.calls}) == [2, 4]
    assert ('b_iter/size', 4.0, 4) in tb.calls


# ================================================================================ 9. unique_terminating_states
@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_unique_terminating_states_counts_state_and_condition(kind):
    buf = make(kind, 10, condition_key='cond')
    its = items_of([[1, 2], [1, 2], [1, 2], [3, 4], [3, 4], [0, 0]], [0] * 6, conds=[0, 1, 0, 0, 0, 1])
    buf.push(to_batch(its))
    assert buf.stats()['unique_terminating_states'] == 4
    buf.clear()
    assert buf.stats()['unique_terminating_states'] == 0


def test_unique_terminating_states_after_evictions():
    buf = make('gfn', 3, prioritized_capacity=True)
    buf.push(to_batch(items_of([[1], [1], [2]], [0, 1, 2])))
    assert buf.stats()['unique_terminating_states'] == 2
    buf.push(to_batch(items_of([[3], [3]], [5, 6])))  # both (1,) leave, (2,) stays
    assert {r[2] for r in snapshot(buf)} == {(2.0,), (3.0,)}
    assert buf.stats()['unique_terminating_states'] == 2


@pytest.mark.parametrize(
    'cfg',
    [
        dict(),
        dict(prioritized_capacity=True, prioritized_sampling=True),
        dict(lazy_sort=True, prioritized_capacity=True),
    ],
)
def test_restored_buffer_places_and_samples_like_the_saved_one(tmp_path, cfg):
    """Saved with each item's slot and the free-slot stack: after load, further pushes land where they would
    have landed and every later sample matches, draw for draw."""

    def batch(k, n):
        g = torch.Generator().manual_seed(k)
        return {'state': torch.randn(n, 3, generator=g), 'log_reward': torch.randn(n, generator=g, dtype=torch.float64)}

    a = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=5, **cfg))
    for k in range(5):
        a.push(batch(k, 5))  # evictions leave the free stack in a history-dependent order
    a.save_data(str(tmp_path / 'g.pt'))
    b = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=9, **cfg))
    b.load_data(str(tmp_path / 'g.pt'))
    for k in range(5, 9):
        assert a.push(batch(k, 3)) == b.push(batch(k, 3))
        sa, sb = a.sample(4), b.sample(4)
        for key in ('state', 'log_reward', 'replay_unique_id', 'replay_buffer_idx'):
            assert torch.equal(sa[key], sb[key]), key


# ================================================================================ 10. eviction order and counts
def brute_unique(items):
    return len({(tuple(it['state']), it['cond']) for it in items})


@pytest.mark.parametrize(
    'kind,prioritized,lazy',
    [
        ('gfn', False, False),
        ('gfn', False, True),
        ('gfn', True, False),
        ('gfn', True, True),
        ('gfn_diverse', True, False),
        ('gfn_diverse', True, True),
        ('terminating_state', False, False),
    ],
)
@pytest.mark.parametrize('seed', range(3))
def test_evictions_and_unique_states_match_brute_force_over_many_wrapping_pushes(
    tmp_path, kind, prioritized, lazy, seed
):
    """Hundreds of pushes that wrap the slots many times (FIFO and prioritized, rewards from a few levels, so many
    ties), items also leaving in the middle (``max_use``), clears and save/load round trips: after every step the
    stored ids are the brute-force model's and ``unique_terminating_states`` is a brute-force count."""
    rng = np.random.default_rng(500 + seed)
    cap = int(rng.integers(4, 25))
    kw = dict(prioritized_capacity=prioritized, lazy_sort=lazy, max_use=1, condition_key='cond')
    buf = make(kind, cap, **kw)
    ref = RefBuffer(cap, prioritized=prioritized, lazy=lazy, diverse=kind == 'gfn_diverse')
    tag = 0
    for step in range(150):
        n = int(rng.integers(1, 2 * cap + 3))
        its = random_items(rng, n, tag, 2, 3, True, levels=(0.0, 1.0, 2.0, NINF))
        tag += n
        buf.push(to_batch(its))
        ref.push(its)
        where = f'{kind} seed {seed} step {step} cap {cap}'
        if rng.random() < 0.3 and buf.count():
            m = int(rng.integers(1, buf.count() + 1))
            out = buf.sample(m, replace=False)  # sampled once: gone (max_use=1)
            gone = set(out['replay_unique_id'].tolist())
            ref.items = [it for it in ref.items if it['seq'] not in gone]
        if rng.random() < 0.05:
            buf.clear()
            ref.items = []
        if rng.random() < 0.1:
            path = str(tmp_path / f'b{step}.pt')
            buf.save_data(path)
            buf = make(kind, cap, **kw)
            buf.load_data(path)
        ids = sorted(buf.state_dict()['index']['seq'].tolist())  # sampling would use the items up
        assert ids == sorted(it['seq'] for it in ref.items), where
        assert buf.stats()['unique_terminating_states'] == brute_unique(ref.items), where
        assert buf.stats()['size'] == len(ref.items), where
    if kind != 'terminating_state':  # which keeps no 'tag' field
        assert snapshot(buf) == ref.snapshot()


def test_unique_states_count_many_rows_waiting_to_be_hashed():
    """Thousands of items pushed between two reads of the count (hashed together when counted)."""
    rng = np.random.default_rng(7)
    cap = 4096 + 700
    buf = make('gfn', cap)
    ref = RefBuffer(cap, prioritized=False)
    tag = 0
    for step in range(12):
        its = random_items(rng, 900, tag, 3, 6, False)
        tag += 900
        buf.push(to_batch(its))
        ref.push(its)
        if step % 5 == 4:
            assert buf.stats()['unique_terminating_states'] == brute_unique(ref.items)
    assert buf.stats()['unique_terminating_states'] == brute_unique(ref.items)
    assert buf.count() == len(ref.items) == cap


def test_unique_states_counted_a_few_rows_at_a_time(monkeypatch):
    """The count hashes the stored states in bounded pieces (large states of a whole buffer need not fit in memory
    at once): pieces of one and of two rows give the brute-force count."""
    rng = np.random.default_rng(11)
    for values in (1, 7):  # rows of 3 values: pieces of 1 and of 2 rows
        monkeypatch.setattr(diversity.StateSet, 'HASH_VALUES', values)
        buf, ref = make('gfn', 40), RefBuffer(40, prioritized=False)
        for step in range(6):
            its = random_items(rng, 17, 17 * step, 3, 3, False)
            buf.push(to_batch(its))
            ref.push(its)
            assert buf.stats()['unique_terminating_states'] == brute_unique(ref.items)


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse'])
def test_a_caller_reusing_its_float64_state_tensor_after_a_push_changes_nothing_stored(kind):
    """A float64 state tensor converts to the buffer's rows without a copy; the buffer must still copy them, or a
    caller that refills its tensor (a rollout buffer reused every step) rewrites what was counted."""
    buf = create_buffer(dict(type=kind, replay_buffer_size=4, seed=0))
    st = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    assert buf.push({'state': st, 'log_reward': torch.zeros(4)}) == 4
    st.zero_()  # the caller reuses its tensor
    assert buf.stats()['unique_terminating_states'] == 4
    if kind == 'gfn_diverse':  # full: the stored states themselves are refused as duplicates
        again = torch.arange(8, dtype=torch.float64).reshape(4, 2)
        assert buf.push({'state': again, 'log_reward': torch.ones(4)}) == 0
        assert buf.stats()['rejected_by_distance'] == 4


def test_large_finite_log_rewards_are_accepted_without_a_warning():
    """Log-rewards whose sum overflows are still finite, and a push of them is no numpy warning (a test suite that
    turns warnings into errors must not fail on them)."""
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert buf.push({'state': torch.zeros(2, 2), 'log_reward': torch.tensor([1e308, 1e308], dtype=torch.float64)})
        with pytest.raises(ValueError, match="'log_reward' must be finite or -inf; item 0 is inf"):
            buf.push({'state': torch.zeros(2, 2), 'log_reward': torch.tensor([np.inf, -np.inf], dtype=torch.float64)})
    assert buf.count() == 2


@pytest.mark.parametrize('kind', ['gfn', 'gfn_diverse'])
def test_float64_states_with_the_neg_bit_are_stored_as_their_values(kind):
    """A lazily negated float64 view (``x.neg()`` of a conjugate view, ``torch._neg_view``) cannot be viewed by
    numpy: its rows are converted through torch instead, with the negated values."""
    buf = create_buffer(dict(type=kind, replay_buffer_size=8, seed=0))
    st = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    assert buf.push({'state': st._neg_view(), 'log_reward': torch.zeros(4)}) == 4
    assert buf.stats()['unique_terminating_states'] == 4
    got = buf.sample(4, replace=False)
    order = torch.argsort(got['replay_unique_id'])
    assert torch.equal(got['state'][order], -st.float())


def test_a_state_sized_beyond_memory_is_refused_as_invalid():
    """A state brings its own capacity; one no memory holds raised MemoryError instead of the documented
    ValueError (the buffer unchanged either way) -- and one that fits only in a large machine was allocated before
    the saved free list (of another size) refused it: a few-KB file could end the process. Both are refused before
    anything is allocated for them."""
    buf = make('gfn', 4)
    buf.push(good())
    state = buf.state_dict()
    before = frozen(buf)
    for size, layout, match in ((2**40, 2, 'free slots'), (2**26, 2, 'free slots'), (2**40, 1, "machine's")):
        bad = dict(state, settings=dict(state['settings'], replay_buffer_size=size))
        if layout == 1:  # a file of the first layout: no free list to compare
            bad = {k: v for k, v in bad.items() if k not in ('slots', 'free', 'layout')}
        with pytest.raises(ValueError, match=match):
            buf.load_state_dict(bad)
        assert_unchanged(buf, before)


@pytest.mark.parametrize('kind', ['gfn', 'terminating_state'])
def test_an_empty_container_is_a_no_op(kind):
    """terminating_state raised on an empty Container that is not torchgfn's ("a batch of size 0"), where gfn and
    the docs make it a no-op."""
    buf = make(kind, 4)
    before = frozen(buf)
    buf.push(FakeContainer(torch.zeros(0, 2), torch.zeros(0)))
    assert_unchanged(buf, before)
    buf.push(FakeContainer(torch.ones(2, 2), torch.zeros(2)))
    buf.push(FakeContainer(torch.zeros(0, 2), torch.zeros(0)))
    assert buf.count() == 2


def test_replace_takes_a_numpy_bool():
    buf = make('gfn', 8)
    buf.push(good())
    assert buf.sample(2, replace=np.True_) is not None
    with pytest.raises(TypeError, match='replace'):
        buf.sample(2, replace=1)


@pytest.mark.parametrize('route', ['state_dict', 'save_data'])
def test_rejection_rates_of_an_interval_span_a_reload(tmp_path, route):
    """The TensorBoard rejection rates are those of the interval since the last write, across a reload in its
    middle: a reloaded buffer writes what an unreloaded twin writes."""
    cfg = dict(type='gfn_diverse', replay_buffer_size=4, seed=0, monitor=dict(log_every=4))
    g = torch.Generator().manual_seed(0)
    states = [torch.randint(0, 3, (3, 2), generator=g) for _ in range(12)]
    batches = [{'state': s, 'log_reward': torch.randint(0, 3, (3,), generator=g).float()} for s in states]
    twin_tb, first_tb, second_tb = FakeTB(), FakeTB(), FakeTB()
    twin = create_buffer(dict(cfg), tb_logger=twin_tb, instance_name='buf')
    buf = create_buffer(dict(cfg), tb_logger=first_tb, instance_name='buf')
    for i, b in enumerate(batches):
        twin.push(dict(b))
        buf.push(dict(b))
        if i == 5:  # between two writes (pushes 4 and 8)
            saved = buf.state_dict() if route == 'state_dict' else buf.save_data(str(tmp_path / 'buf.pt'))
            buf.close()
            buf = create_buffer(dict(cfg), tb_logger=second_tb, instance_name='buf')
            if route == 'state_dict':
                buf.load_state_dict(saved)
            else:
                buf.load_data(str(tmp_path / 'buf.pt'))
    rates = [row for row in twin_tb.rows if 'reject_rate' in row[0]]
    assert {step for _, _, step in rates} == {4, 8, 12}  # (the data makes the filter reject in every interval)
    assert sorted(first_tb.rows + second_tb.rows) == sorted(twin_tb.rows)


@pytest.mark.parametrize('section', ['counters', 'logged'])
@pytest.mark.parametrize('value', [float('nan'), 1.7, 'x', torch.tensor([1, 2]), -1, True, 10**6])
def test_saved_counts_that_are_not_counts_are_refused_by_name(section, value):
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=4, seed=0))
    buf.push({'state': torch.arange(6.0).reshape(3, 2), 'log_reward': torch.zeros(3)})
    state = buf.state_dict()
    before = copy.deepcopy(state)
    state[section]['pushed'] = value
    if section == 'counters' and isinstance(value, int) and value == 10**6:  # a count (above the last write's): loads
        buf.load_state_dict(state)
        assert buf.stats()['pushed'] == 10**6
        return
    with pytest.raises(ValueError, match=f"'{section}'.*'pushed'|'logged'.*at most.*'pushed'"):
        buf.load_state_dict(state)
    assert_same(before, buf.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
@pytest.mark.parametrize('btype', ['gfn', 'gfn_diverse', 'terminating_state'])
def test_dict_batches_on_a_gpu_buffer_match_a_cpu_twin(btype):
    """``device='cuda'``: batches pushed from the CPU or the GPU are stored and sampled as a CPU twin's (a CPU
    batch's columns moved to the GPU met a CPU row index: every such push raised); the state loads on the CPU."""
    bufs = [create_buffer(dict(type=btype, replay_buffer_size=32, seed=1, device=d)) for d in ('cpu', 'cuda')]
    g = torch.Generator().manual_seed(0)
    for k in range(12):
        batch = {'state': torch.randint(0, 5, (8, 3), generator=g).float(), 'log_reward': torch.randn(8, generator=g)}
        gpu = {key: v.cuda() for key, v in batch.items()} if k % 2 else batch
        assert bufs[0].push(batch) == bufs[1].push(gpu)
        a, b = bufs[0].sample(4), bufs[1].sample(4)
        assert b['state'].device.type == 'cuda' and torch.equal(a['state'], b['state'].cpu())
    cpu_twin = create_buffer(dict(type=btype, replay_buffer_size=32, seed=1))
    cpu_twin.load_state_dict(bufs[1].state_dict())
    assert_same(cpu_twin.state_dict(), bufs[0].state_dict())


def test_a_file_whose_capacity_times_its_items_exceeds_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    """A file's saved replay_buffer_size passed when its slots' index fit in memory, and the restore then allocated
    capacity x the saved item size (a 2.5 MB file asked for 64 GiB: killed where memory is overcommitted). Here: a
    machine of 256 KiB, 100 slots of 4 KiB items."""
    from ding_buffer.storage import tensor_fields

    buf = create_buffer(dict(type='gfn', replay_buffer_size=100, seed=0))
    buf.push({'state': torch.zeros(2, 1024), 'log_reward': torch.zeros(2)})
    path = str(tmp_path / 'gfn.pt')
    buf.save_data(path)
    monkeypatch.setattr(tensor_fields, 'machine_memory', lambda: 1 << 18, raising=False)
    fresh = create_buffer(dict(type='gfn', replay_buffer_size=10, seed=0))
    before = fresh.state_dict()
    with pytest.raises(ValueError, match="100 slots of 4100 bytes each need .* more than this machine's"):
        fresh.load_data(path)
    assert_same(fresh.state_dict(), before)


@pytest.mark.parametrize('key', ['state_key', 'log_reward_key', 'condition_key'])
def test_a_field_key_named_like_a_sample_id_is_refused_at_build(key):
    """Storage drops the ids a sample adds from a push: state_key='replay_unique_id' was accepted, and every push
    then failed saying the batch had no such field."""
    for kind in ('gfn', 'gfn_diverse', 'terminating_state'):
        for name in ('replay_unique_id', 'replay_buffer_idx'):
            with pytest.raises(ValueError, match=f"config key '{key}'"):
                create_buffer({'type': kind, 'replay_buffer_size': 8, key: name})

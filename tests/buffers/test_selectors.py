"""Samplers that read columns, and capacity rules of the user's: the parts see the table only through its view.

A sampler offering ``select(rng, view, slots, size, replace)`` is handed the candidates' slots (in the order
positions count them, 0 = the oldest) and the table's read-only view, and answers positions among them; it serves
``naive`` (every kind of candidates: a ``sample_range``, the runs of ``sequence``) and ``advanced`` (instead of the
priority draw), and ``episode``. A capacity rule of the user's is counted under the name it is registered as.
"""

import numpy as np
import pytest
from helpers import assert_same

from ding_buffer import create_buffer
from ding_buffer.control.capacity import CapacityRule
from ding_buffer.control.limits import REMOVER_REGISTRY, Remover
from ding_buffer.control.samplers import SAMPLER_REGISTRY


@SAMPLER_REGISTRY.register('test_by_collect_iter')
class ByCollectIter:
    """Weight exp(collect_iter / temperature): newer data more often (a column-weighted sampler)."""

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature

    def select(self, rng, view, slots, size, replace):
        it = view.column('collect_iter', slots).astype(float)
        w = np.exp((it - it.max()) / self.temperature)
        return rng.choice(len(slots), size, replace=replace, p=w / w.sum())


SEEN = []


@SAMPLER_REGISTRY.register('test_recording')
class Recording:
    """Uniform, remembering the ids of the candidates it was shown."""

    def select(self, rng, view, slots, size, replace):
        SEEN.append(view.column('id', slots).tolist())
        return rng.integers(0, len(slots), size)


@SAMPLER_REGISTRY.register('test_garbage')
class Garbage:
    def select(self, rng, view, slots, size, replace):
        rng.random(3)  # moves the RNG: the failed call must restore nothing it should not keep
        return np.full(size, len(slots))  # one past the candidates


@REMOVER_REGISTRY.register('test_stalest_first')
class StalestFirst(CapacityRule):
    """A full table drops the lowest collect_iter first (the oldest among equal ones)."""

    column = 'collect_iter'

    def evict(self, view, n):
        slots = view.ordered_slots()
        return slots[np.argsort(view.column('collect_iter', slots), kind='stable')[:n]]


def weighted(kind, n=10, temperature=2.0):
    buf = create_buffer(
        dict(
            type=kind, replay_buffer_size=64, seed=0, sampler=dict(type='test_by_collect_iter', temperature=temperature)
        )
    )
    buf.push([{'obs': i, 'collect_iter': i} for i in range(n)])
    return buf


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_a_column_weighted_sampler_draws_in_proportion_to_its_weights(kind):
    buf = weighted(kind)
    draws = 4000
    if kind == 'naive':
        obs = [d['obs'] for d in buf.sample(draws, replace=True)]
    else:
        obs = [d['obs'] for _ in range(draws // 8) for d in buf.sample(8)]
    counts = np.bincount(obs, minlength=10)
    w = np.exp((np.arange(10) - 9) / 2.0)
    expected = draws * w / w.sum()
    # every count within 5 standard deviations of its binomial expectation
    sd = np.sqrt(expected * (1 - w / w.sum()))
    assert np.all(np.abs(counts - expected) < 5 * sd + 1), (counts, expected.round(1))
    assert counts[9] > 5 * counts[4]  # the weighting shows, it is not uniform


def test_a_weighted_sample_on_advanced_carries_unit_is_weights_and_keeps_update():
    buf = weighted('advanced')
    batch = buf.sample(4)
    assert [float(d['IS']) for d in batch] == [1.0] * 4
    info = {
        'replay_unique_id': [d['replay_unique_id'] for d in batch],
        'replay_buffer_idx': [d['replay_buffer_idx'] for d in batch],
        'priority': [2.0] * 4,
    }
    assert buf.update(info)['updated'] + buf.update(info)['stale'] == 4
    assert buf.stats()['sample_calls'] == 1


def test_a_selecting_sampler_is_shown_exactly_the_candidates():
    """``sample_range`` candidates on naive, run starts on sequence, windows (their episode, once per window) on
    episode."""
    SEEN.clear()
    naive = create_buffer(dict(type='naive', seed=0, sampler=dict(type='test_recording')))
    naive.push([{'obs': i} for i in range(10)])
    naive.sample(2, sample_range=slice(-4, None))
    naive.sample(2, sample_range=slice(1, 8, 3))
    seq = create_buffer(dict(type='sequence', seed=0, sampler=dict(type='test_recording')))
    seq.push([{'obs': i} for i in range(6)])
    seq.sample(2, 3)  # runs of 3: they start at items 0..3
    ep = create_buffer(dict(type='episode', seed=0, sampler=dict(type='test_recording')))
    ep.push([[{'obs': 0}] * 3, [{'obs': 1}] * 5])
    ep.sample(2, unroll_len=3)  # 1 window in the first episode, 3 in the second
    ids = [SEEN[0], SEEN[1], SEEN[2]]
    assert ids == [[6, 7, 8, 9], [1, 4, 7], [0, 1, 2, 3]]
    assert len(SEEN[3]) == 4
    assert SEEN[3][0] != SEEN[3][1] and SEEN[3][1:] == [SEEN[3][1]] * 3  # the episodes' ids, per window


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_a_selecting_samplers_garbage_fails_the_call_with_nothing_changed(kind):
    buf = create_buffer(dict(type=kind, seed=0, max_use=3, sampler=dict(type='test_garbage')))
    buf.push([{'obs': i} for i in range(5)])
    before = buf.state_dict()
    with pytest.raises(RuntimeError, match="sampler 'test_garbage' returned"):
        buf.sample(2)
    assert_same(buf.state_dict(), before)


@REMOVER_REGISTRY.register('test_flaky_after_sample')
class FlakyAfterSample(Remover):
    """A user remover whose ``after_sample`` raises while ``FLAKY[0]``."""

    def after_sample(self, view, slots, use):
        if FLAKY[0]:
            raise ZeroDivisionError('rule bug')
        return slots[:0]


FLAKY = [False]


@pytest.mark.parametrize('kind', ['naive', 'deque'])
def test_a_failed_sample_puts_pythons_random_state_back_for_the_python_random_sampler(kind):
    """DI-engine's deque draws with Python's global random (the deque without a seed; ``python_random`` by name
    elsewhere): a sample a user's rule failed drew nothing, so the next sample is what it would have been."""
    import random

    def run(fail_once):
        random.seed(0)
        cfg = dict(type=kind, removers=[dict(type='test_flaky_after_sample')])
        if kind == 'naive':
            cfg['sampler'] = dict(type='python_random')
        buf = create_buffer(cfg)
        buf.push([{'obs': i} for i in range(100)])
        if fail_once:
            FLAKY[0] = True
            try:
                with pytest.raises(ZeroDivisionError):
                    buf.sample(5)
            finally:
                FLAKY[0] = False
        return [d['obs'] for d in buf.sample(5)]

    assert run(True) == run(False)


@SAMPLER_REGISTRY.register('test_scribbler')
class Scribbler:
    """Uses the candidates it is handed as scratch space (writes an empty slot into them), answering valid
    positions: advanced and episode then drew the empty slot."""

    def select(self, rng, view, slots, size, replace):
        slots[:] = np.setdiff1d(np.arange(view.capacity), view.ordered_slots())[0]
        return np.zeros(size, dtype=np.int64)


@pytest.mark.parametrize('kind', ['naive', 'advanced', 'episode'])
def test_the_candidates_a_sampler_is_handed_are_its_own(kind):
    """A sampler that scribbles over the candidates it is handed (an empty slot) and answers position 0 draws the
    first real candidate: advanced and episode read the array the sampler had rewritten and drew empty slots."""
    buf = create_buffer(dict(type=kind, replay_buffer_size=8, seed=0, sampler=dict(type='test_scribbler')))
    buf.push([[{'obs': i}] * 2 for i in range(4)] if kind == 'episode' else [{'obs': i} for i in range(4)])
    out = buf.sample(2) if kind != 'episode' else buf.sample(2, unroll_len=1)
    obs = [w[0]['obs'] for w in out] if kind == 'episode' else [d['obs'] for d in out]
    assert obs == [0, 0], obs
    create_buffer(dict(type=kind, replay_buffer_size=8, sampler=dict(type='test_scribbler'))).load_state_dict(
        buf.state_dict()
    )


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_a_user_capacity_rule_keeps_what_a_reference_model_keeps_and_is_counted_by_its_name(kind):
    rng = np.random.default_rng(0)
    buf = create_buffer(dict(type=kind, replay_buffer_size=8, seed=0, removers=[dict(type='test_stalest_first')]))
    model = []  # (collect_iter, id) of what is stored
    next_id, left = 0, 0
    for _ in range(30):
        cis = rng.integers(0, 20, rng.integers(1, 4)).tolist()
        buf.push([{'obs': next_id + k, 'collect_iter': ci} for k, ci in enumerate(cis)])
        need = len(model) + len(cis) - 8  # room is made among the stored items, before the write
        for _ in range(max(need, 0)):  # the lowest collect_iter leaves, the oldest among equal ones
            model.remove(min(model))
            left += 1
        model += [(ci, next_id + k) for k, ci in enumerate(cis)]
        next_id += len(cis)
    view = buf.view
    slots = view.ordered_slots()
    assert sorted(view.column('id', slots).tolist()) == sorted(i for _, i in model)
    assert buf.stats()['removed_by_test_stalest_first'] == left > 0


@SAMPLER_REGISTRY.register('test_ragged')
class Ragged:
    def select(self, rng, view, slots, size, replace):
        return [[0], [0, 1]]


def test_a_ragged_answer_is_refused_naming_the_sampler():
    buf = create_buffer(dict(type='naive', seed=0, sampler=dict(type='test_ragged')))
    buf.push([{'obs': i} for i in range(5)])
    before = buf.state_dict()
    with pytest.raises(RuntimeError, match="sampler 'test_ragged' returned list"):
        buf.sample(2)
    assert_same(buf.state_dict(), before)


def test_advanced_with_another_sampler_draws_priority_zero_items_and_skips_only_retired_ones(tmp_path):
    """With used-data tracking, items at ``max_use`` stay stored but are never drawn again; an item pushed with
    priority 0 is still a candidate of a sampler that does not draw by priority."""

    def item(i, p):
        path = tmp_path / f'{i}.pt'
        path.write_bytes(b'')
        return {'obs': i, 'data_id': str(path), 'priority': p}

    buf = create_buffer(
        dict(type='advanced', seed=0, sampler=dict(type='uniform'), max_use=2, enable_track_used_data=True)
    )
    buf.push([item(0, 0.0), item(1, 0.0)])
    drawn = []
    for _ in range(10):  # one at a time: an item retires once it reached 2 uses, whatever the draws
        batch = buf.sample(1)
        if batch is None:
            break
        drawn.append(batch[0]['obs'])
    assert sorted(drawn) == [0, 0, 1, 1]
    assert buf.count() == 2 and buf.sample(1) is None  # stored, never drawn again
    buf.push([item(2, 0.0)])
    assert [d['obs'] for d in buf.sample(3)] == [2, 2, 2]
    buf.close()

"""Values at the edges of what the buffers accept: each is either refused up front with an error naming it, or it
works -- never an overflow, an inf or a silently wrong answer on a later call."""

import math

import numpy as np
import pytest
import torch

from ding_buffer import create_buffer
from ding_buffer.control.distances import far_mask


# ---------------------------------------------------------------------------------------------- distances
@pytest.mark.parametrize('p', [2.0, 3.0, 0.5])
@pytest.mark.parametrize(
    'cutoff, gap, far',
    [
        (1e-310, 1.0, True),  # a subnormal cutoff: its reciprocal is beyond float64
        (1e-300, 1e10, True),  # rows in units of the cutoff overflow
        (1e-300, 1e-200, True),  # cutoff ** p underflows, the distance is 1e100 cutoffs
        (1e300, 1e200, False),  # cutoff ** p overflows, the distance is far inside it
        (1e300, 1e305, True),
    ],
)
@pytest.mark.parametrize('numba', [True, False])
def test_far_mask_at_a_cutoff_whose_power_is_out_of_float64_range(monkeypatch, p, cutoff, gap, far, numba):
    if not numba:
        monkeypatch.setattr('ding_buffer.control.distances.ready', lambda: False)
    q = np.array([[0.0, 0.0]])
    refs = np.array([[gap, 0.0], [-gap, gap], [0.0, 0.0]])  # `gap` and more than `gap` from q; then q itself
    assert far_mask(q, refs, np.array([0, 1]), cutoff, p).tolist() == [far]
    assert far_mask(q, refs, np.array([0, 1, 2]), cutoff, p).tolist() == [False]  # never far from itself
    assert far_mask(np.vstack([q, refs[:1]]), None, None, cutoff, p, triangular=True).tolist() == [True, far]


def test_a_tiny_cutoff_admits_states_far_apart():
    buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=2, cutoff_distance=1e-310, p_norm_distance=3.0))
    buf.push({'state': torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64), 'log_reward': torch.zeros(2)})
    buf.push({'state': torch.tensor([[2.0, 0.0], [3.0, 1.0]], dtype=torch.float64), 'log_reward': torch.ones(2)})
    assert buf.stats()['rejected_by_distance'] == 0
    assert sorted(buf.sample(2, replace=False)['state'].tolist()) == [[2.0, 0.0], [3.0, 1.0]]


# ---------------------------------------------------------------------------------------------- sample arguments
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_unroll_len_beyond_a_sample_is_refused_naming_it(storage):
    buf = create_buffer(dict(type='episode', replay_buffer_size=4, max_transitions=16, storage=dict(type=storage)))
    buf.push([[{'obs': torch.ones(2)}] * 3])
    before = buf.state_dict()
    for size, unroll in ((1, 2**63), (1, 2**40), (2**20, 2**12)):
        with pytest.raises(ValueError, match=f'unroll_len={unroll} with sample size {size}'):
            buf.sample(size, unroll_len=unroll, pad=True)
    after = buf.state_dict()
    assert after['counters'] == before['counters']
    assert buf.sample(1, unroll_len=5, pad=True) is not None  # still samples


@pytest.mark.parametrize('btype', ['naive', 'elastic', 'advanced', 'episode'])
@pytest.mark.parametrize('step, want', [(2**70, 0.0), (-(2**70), 5.0)])
def test_a_sample_range_step_beyond_int64_selects_one_item(btype, step, want):
    buf = create_buffer(dict(type=btype, replay_buffer_size=8, seed=0))
    items = [{'obs': float(i)} for i in range(6)]
    buf.push([[x] for x in items] if btype == 'episode' else items)
    got = buf.sample(1, sample_range=slice(None, None, step))
    got = got[0][0] if btype == 'episode' else got[0]
    assert got['obs'] == want
    nothing = slice(10, None, step) if step > 0 else slice(None, 10, step)  # (range(6)[nothing] is empty)
    assert buf.sample(1, sample_range=nothing) is None


# ---------------------------------------------------------------------------------------------- stored values
@pytest.mark.parametrize('v', [2**60 - 1, -(2**60 - 1)])
def test_collect_iter_just_inside_the_bound_is_accepted_on_both_storages(v):
    for storage in ('list', 'tensor'):
        buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type=storage)))
        buf.push({'obs': torch.zeros(2), 'collect_iter': v})
        got = buf.sample(1)
        assert int(got['collect_iter'][0] if storage == 'tensor' else got[0]['collect_iter']) == v
    with pytest.raises(ValueError, match='collect_iter'):
        buf.push({'obs': torch.zeros(2), 'collect_iter': v + (1 if v > 0 else -1)})


def test_log_reward_mean_of_values_near_float64_max_is_finite():
    buf = create_buffer(dict(type='gfn', replay_buffer_size=4))
    r = torch.tensor([1.7e308, 1.7e308, 1.5e308], dtype=torch.float64)
    buf.push({'state': torch.tensor([[0.0], [1.0], [2.0]]), 'log_reward': r})
    st = buf.stats()
    assert math.isfinite(st['log_reward_mean'])
    assert st['log_reward_mean'] == pytest.approx(1.7e308 / 3 * 2 + 1.5e308 / 3, rel=1e-12)


# ---------------------------------------------------------------------------------------------- priorities
@pytest.mark.parametrize('alpha', [1e-12, 1e-9, 1e-7])
@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_tiny_alpha_keeps_priorities_to_float32_and_evicts_the_lowest(alpha, storage):
    """A leaf is priority ** alpha, about 1 + alpha * log(priority): its last bit, magnified 1 / alpha times, is
    more than a float32 step of the priority. Priorities read back are still the float32 values pushed."""
    cfg = dict(type='advanced', replay_buffer_size=2, alpha=alpha, eps=0.0, storage=dict(type=storage), seed=0)
    buf = create_buffer(dict(cfg, removers=[dict(type='min_priority')]))
    for i, p in enumerate([1.0001, 1.0, 3.0]):
        buf.push({'obs': torch.full((2,), float(i)), 'priority': p})
    twin = create_buffer(dict(cfg, removers=[dict(type='min_priority')]))
    twin.load_state_dict(buf.state_dict())
    for b in (buf, twin):
        seen = {}
        for _ in range(20):  # (seeded: both items show up)
            got = b.sample(2)
            if storage == 'tensor':
                seen.update(zip(got['obs'][:, 0].tolist(), got['priority'].tolist()))
            else:
                seen.update((float(x['obs'][0]), x['priority']) for x in got)
        assert seen == {0.0: float(np.float32(1.0001)), 2.0: 3.0}  # the 1.0 item went; exact priorities


@pytest.mark.parametrize('alpha, top', [(1e-12, 3.0), (1e-9, float(np.finfo(np.float32).max)), (0.6, 5.0)])
def test_an_item_without_priority_gets_exactly_the_largest_stored_one(alpha, top):
    cfg = dict(type='advanced', replay_buffer_size=8, alpha=alpha, max_priority_within_buffer=True, seed=0)
    buf = create_buffer(cfg)
    buf.push({'obs': 0, 'priority': top})
    buf.push({'obs': 1})  # takes the largest stored priority
    assert [x['priority'] for x in buf.sample(2)] == [top, top]
    create_buffer(cfg).load_state_dict(buf.state_dict())  # its own state loads


@pytest.mark.parametrize('alpha', [0.0, 1e-7, 1e-6, 0.6])
@pytest.mark.parametrize('slot, value, match', [(0, 5.0, 'disagrees with its leaf'), (3, 7.0, 'empty slots|its leaf')])
def test_a_saved_priority_that_disagrees_with_its_leaf_is_refused_at_any_alpha(alpha, slot, value, match):
    cfg = dict(type='advanced', replay_buffer_size=4, alpha=alpha, seed=0)
    buf = create_buffer(cfg)
    buf.push([{'obs': 0, 'priority': 3.0}, {'obs': 1, 'priority': 4.0}])
    state = buf.state_dict()
    state['index'] = dict(state['index'], priority=state['index']['priority'].clone())
    state['index']['priority'][slot] = value
    if alpha == 0 and slot == 0:  # every leaf is 1: nothing to compare, the column is the priority
        create_buffer(cfg).load_state_dict(state)
        return
    with pytest.raises(ValueError, match=match):
        create_buffer(cfg).load_state_dict(state)


@pytest.mark.parametrize('p', [2.0, 3.0, 50.0])
@pytest.mark.parametrize('cutoff', [1e-10, 1e-200, 1e200])
def test_states_a_difference_beyond_float64_apart_are_far_at_any_cutoff(p, cutoff):
    q = np.array([[1e308], [-1e308]])
    assert far_mask(q, np.array([[0.0], [1.0]]), None, cutoff, p).tolist() == [cutoff < 1e308, cutoff < 1e308]
    assert far_mask(q, None, None, cutoff, p, triangular=True).tolist() == [True, True]  # 2e308 apart: inf


def test_prioritized_windows_padded_beyond_a_sample_are_refused_with_nothing_changed():
    cfg = dict(type='episode', pad_short_episodes=True, storage=dict(type='tensor'), max_transitions=64, seed=0,
               sampler=dict(type='prioritized', unroll_len=2**40))  # fmt: skip
    buf = create_buffer(cfg)
    buf.push({'obs': torch.arange(3.0).unsqueeze(1)})
    before = buf.state_dict()
    with pytest.raises(ValueError, match='unroll_len=1099511627776 with sample size 1'):
        buf.sample(1)
    assert before['rng'] == buf.state_dict()['rng']


def test_a_uint64_collect_iter_is_bounded_as_an_int64_one():
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor')))
    col = torch.tensor([2**60 - 1, 5]).to(torch.uint64)
    buf.push({'obs': torch.zeros(2, 2), 'collect_iter': col}, batched=True)
    with pytest.raises(ValueError, match='collect_iter'):
        buf.push({'obs': torch.zeros(1, 2), 'collect_iter': torch.tensor([2**60]).to(torch.uint64)}, batched=True)

"""Values at the edges of what the buffers accept: each is either refused up front with an error naming it, or it
works -- never an overflow, an inf or a silently wrong answer on a later call."""

import math
import os
import threading

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
@pytest.mark.parametrize('alpha', [1e-18, 1e-12, 1e-9, 1e-7])
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


# ---------------------------------------------------------------------------------------------- shapes and dtypes
def test_lazy_conjugate_and_negative_views_are_written_as_their_values():
    c = torch.randn(4, 2, dtype=torch.complex64)
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor'), seed=0))
    buf.extend({'obs': c.conj().imag, 'reward': torch.full((4,), 5.0)})  # a float view with the negative bit
    assert torch.equal(buf.sample(4, sample_range=slice(0, 4), replace=False)['obs'].sort(0).values,
                       (-c.imag).sort(0).values)  # fmt: skip
    ep = create_buffer(dict(type='episode', max_transitions=32, storage=dict(type='tensor')))
    ep.push({'obs': c.conj(), 'reward': torch.ones(4)})
    assert torch.equal(ep.sample(1)[0]['obs'], c.conj().resolve_conj())
    create_buffer(dict(type='episode', max_transitions=32, storage=dict(type='tensor'))).load_state_dict(
        ep.state_dict()
    )
    adv = create_buffer(dict(type='advanced', replay_buffer_size=8, eps=0.0, storage=dict(type='tensor'), seed=0))
    adv.extend({'obs': torch.zeros(2, 2)})
    got = adv.sample(2)
    prio = torch.tensor([-1.0, -2.0])._neg_view()  # 1.0, 2.0 behind a negative bit
    adv.update({'replay_unique_id': got['replay_unique_id'], 'replay_buffer_idx': got['replay_buffer_idx'],
                'priority': prio})  # fmt: skip
    assert sorted(adv.sample(2)['priority'].tolist()) in ([1.0, 2.0], [1.0, 1.0], [2.0, 2.0])


def test_quantized_leaves_are_refused_naming_the_field():
    q = torch.quantize_per_tensor(torch.randn(4, 2), 0.1, 0, torch.quint8)
    with pytest.raises(TypeError, match="field 'obs' is a quantized tensor"):
        create_buffer(dict(type='naive', storage=dict(type='tensor'))).push([{'obs': q[0]}])


@pytest.mark.parametrize('frame', [torch.ones(2, 3, dtype=torch.bool), torch.zeros(3, 0, dtype=torch.uint8),
                                   torch.arange(6, dtype=torch.int32).reshape(2, 3).to(torch.uint16)])  # fmt: skip
def test_frames_of_any_accepted_dtype_and_shape_round_trip(tmp_path, frame):
    cfg = dict(type='advanced', replay_buffer_size=16, storage=dict(type='tensor', frames=dict()), seed=0)
    buf = create_buffer(cfg)
    stack = torch.stack([frame] * 4)
    buf.push(dict(obs=stack, action=0, reward=1.0, next_obs=stack, done=True))
    buf.save_data(str(tmp_path / 'b.pt'))
    for load in (lambda b: b.load_state_dict(buf.state_dict()), lambda b: b.load_data(str(tmp_path / 'b.pt'))):
        other = create_buffer(cfg)
        load(other)
        assert torch.equal(other.sample(1)['obs'][0], stack)


@pytest.mark.parametrize('dtype', [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn])
def test_padded_windows_of_dtypes_without_masked_fill(dtype):
    buf = create_buffer(dict(type='episode', max_transitions=64, storage=dict(type='tensor'), seed=0))
    buf.push({'obs': torch.ones(3, 2).to(dtype), 'reward': torch.ones(3)})
    out = buf.sample(1, unroll_len=5, pad=True)
    assert out['obs'].dtype == dtype
    assert out['obs'].float()[0].tolist() == [[1.0, 1.0]] * 3 + [[0.0, 0.0]] * 2


@pytest.mark.parametrize('leaf', [np.arange(12, dtype=np.float32).reshape(4, 3).astype('>f4'),
                                  np.arange(12, dtype=np.float32).reshape(4, 3)[::-1]])  # fmt: skip
def test_padded_list_windows_of_big_endian_or_reversed_arrays(leaf):
    buf = create_buffer(dict(type='episode', seed=0))
    buf.push({'obs': leaf, 'reward': np.ones(4)})
    out = buf.sample(1, unroll_len=6, pad=True)[0]
    assert out['obs'][:4].tolist() == leaf.tolist() and out['obs'][4:].tolist() == [[0.0] * 3] * 2


@pytest.mark.parametrize('btype, key', [('gfn', 'state'), ('gfn_diverse', 'cond')])
def test_complex_gflownet_states_and_conditions_are_refused_at_push(btype, key):
    buf = create_buffer(dict(type=btype, replay_buffer_size=4, condition_key='cond', seed=0))
    data = {'state': torch.tensor([[0.0], [1.0]]), 'log_reward': torch.ones(2), 'cond': torch.ones(2, 1)}
    data[key] = data[key].to(torch.complex64)
    with pytest.raises(ValueError, match=f"field '{key}' must hold real numbers"):
        buf.push(data)
    assert buf.count() == 0


def test_deepcopy_of_a_graph_tensor_is_refused_naming_the_field():
    w = torch.ones(3, requires_grad=True)
    buf = create_buffer(dict(type='naive', deepcopy=True))
    with pytest.raises(TypeError, match="item 1 field 'obs' cannot be copied"):
        buf.push([{'obs': torch.ones(3)}, {'obs': w * 2}])
    assert buf.count() == 0


def test_memmap_fields_with_long_or_non_ascii_paths(tmp_path):
    buf = create_buffer(dict(type='naive', storage=dict(type='tensor', memmap_dir=str(tmp_path))))
    buf.push([{'observation': {'ü' * 120: torch.ones(2), 'x' * 300: torch.zeros(1)}}])
    got = buf.sample(1)
    assert got['observation']['ü' * 120].tolist() == [[1.0, 1.0]]
    assert all(len(f.encode()) < 255 for f in os.listdir(tmp_path))


@pytest.mark.parametrize('alpha', [1e-20, 1e-18, 1e-15])
def test_states_at_an_alpha_whose_leaves_round_to_one_reload(alpha):
    cfg = dict(type='advanced', replay_buffer_size=4, alpha=alpha, storage=dict(type='tensor'), seed=0)
    buf = create_buffer(cfg)
    buf.push([{'obs': torch.ones(2), 'priority': 1e-5}, {'obs': torch.zeros(2), 'priority': 3e38}])
    got = buf.sample(2)
    buf.update({'replay_unique_id': got['replay_unique_id'], 'replay_buffer_idx': got['replay_buffer_idx'],
                'priority': [0.0, 2.0]})  # fmt: skip
    other = create_buffer(cfg)
    other.load_state_dict(buf.state_dict())
    assert sorted(other.sample(2)['priority'].tolist()) == sorted(buf.sample(2)['priority'].tolist())


def test_an_uncopyable_item_holding_a_cycle_gets_the_copy_error():
    node = {'name': 'root'}
    node['self'] = node
    buf = create_buffer(dict(type='naive', deepcopy=True))
    with pytest.raises(TypeError, match="a pushed item cannot be copied .*lock"):
        buf.push({'obs': 1, 'tree': node, 'lock': threading.Lock()})


def test_frames_given_as_a_lazily_negated_stack():
    frames = [torch.full((2,), float(i + 1)) for i in range(5)]
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor', frames=dict())))
    obs = torch.stack(frames[0:2])
    buf.push(dict(obs=torch._neg_view(-obs), next_obs=torch.stack(frames[1:3]), reward=0.0, done=False))
    assert torch.equal(buf.sample(1)['obs'][0], obs)

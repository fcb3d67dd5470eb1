"""TensorDicts (TorchRL's ``tensordict``) in and out of the buffers (``ding_buffer.storage.tensordict_io``).

Covers: flat and nested TensorDicts pushed one by one, as a batch (``push(td)`` with ``batch_size=[B]``,
``extend``, ``batched=True``) and in lists; samples as TensorDicts (``batch_size``, nesting, exact values through a
step id) on naive, elastic, advanced, sequence, deque and the episode buffers; the output-type rule (the first item
stored decides; kept by ``clear``, ``state_dict`` and ``save_data``); ``update`` with a sampled TensorDict; list
storage; bad input (same message as the dict, nothing changes); ``iter(buffer)``; importing without tensordict.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import assert_same, subprocess_env

from ding_buffer import create_buffer

tensordict = pytest.importorskip('tensordict')
TensorDict = tensordict.TensorDict

SLOT_TYPES = ['naive', 'elastic', 'advanced']


def item(i, nested=True):
    """One transition (batch_size []) whose every leaf is a function of its step id ``i``."""
    data = {'step': torch.tensor(i), 'obs': torch.arange(3, dtype=torch.float32) + i}
    if nested:
        data['next'] = {
            'obs': torch.arange(3, dtype=torch.float32) + i + 0.5,
            'deep': {'done': torch.tensor([i % 2 == 0])},
        }
    return TensorDict(data, batch_size=[])


def batch(start, n, nested=True):
    """Items ``start .. start + n - 1`` as one TensorDict with batch_size [n]."""
    return torch.stack([item(i, nested) for i in range(start, start + n)])


def check_rows(td, nested=True):
    """Every row of a sampled TensorDict is exactly the item its step id names."""
    step = td['step']
    expect = torch.arange(3, dtype=torch.float32) + step.unsqueeze(-1).float()
    assert torch.equal(td['obs'], expect)
    if nested:
        assert torch.equal(td['next', 'obs'], expect + 0.5)
        assert torch.equal(td['next', 'deep', 'done'], (step % 2 == 0).unsqueeze(-1))


def make(kind='naive', size=100, **kw):
    cfg = dict(type=kind, replay_buffer_size=size, seed=0, storage=dict(type='tensor'), **kw)
    return create_buffer(cfg)


def all_steps(buf):
    """The stored step ids, read through the public API (the state's field columns, insertion order)."""
    storage = buf.state_dict()['storage']
    names = ['.'.join(p) for p, _, _ in storage['schema']]
    return storage['fields'][names.index('step')].tolist()


# ---------------------------------------------------------------------------------------------- push / sample
@pytest.mark.parametrize('kind', SLOT_TYPES)
@pytest.mark.parametrize('nested', [True, False])
def test_single_items_sample_tensordict(kind, nested):
    buf = make(kind)
    for i in range(10):
        assert buf.push(item(i, nested)) == 1
    out = buf.sample(6)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([6])
    keys = set(out.keys(include_nested=True, leaves_only=True))
    assert {'step', 'obs', 'replay_buffer_idx', 'replay_unique_id'} <= keys
    assert (('next', 'obs') in keys and ('next', 'deep', 'done') in keys) == nested
    assert out['replay_unique_id'].dtype == torch.int64 and out['replay_buffer_idx'].dtype == torch.int64
    assert torch.equal(out['replay_unique_id'], out['step'])  # ids count pushes, as the step ids do here
    check_rows(out, nested)
    if kind == 'advanced':
        for key in ('priority', 'IS', 'staleness', 'use'):
            assert out[key].shape == (6,)


@pytest.mark.parametrize('kind', SLOT_TYPES)
def test_batch_forms_are_equivalent(kind):
    """push(td[B]), push(td[B], batched=True), extend(td[B]) and a list of items store the same items."""
    buf = make(kind)
    assert buf.push(batch(0, 4)) == 4
    assert buf.push(batch(4, 3), batched=True) == 3
    assert buf.extend(batch(7, 2)) == 2
    assert buf.push([item(9), item(10)]) == 2
    assert all_steps(buf) == list(range(11))
    check_rows(buf.sample(11, **({} if kind == 'advanced' else {'replace': True})))


def test_naive_values_round_trip_exactly():
    buf = make('naive', size=8)
    buf.extend(batch(0, 12))  # wraps: the newest 8 stay
    out = buf.sample(8)  # without replacement: every stored item once
    assert sorted(out['step'].tolist()) == list(range(4, 12))
    check_rows(out)
    pushed = batch(4, 8)
    order = torch.argsort(out['step'])
    for key in [('obs',), ('next', 'obs'), ('next', 'deep', 'done')]:
        assert torch.equal(out[key][order], pushed[key])


def test_batch_size_rules():
    # (a TensorDict of batch_size [] pushed with batched=True, and a TensorDict batch inside a list, are refused
    # naming the problem and changing nothing: tests/buffers/test_contract.py)
    buf = make('naive')
    buf.push(batch(0, 6).reshape(2, 3))  # batch_size [2, 3]: 2 items of 3 steps
    out = buf.sample(2)
    assert out.batch_size == torch.Size([2]) and out['obs'].shape == (2, 3, 3)


def test_sequence_runs():
    buf = make('sequence')
    buf.extend(batch(0, 20))
    out = buf.sample(3, 4)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([3])
    assert out['next', 'obs'].shape == (3, 4, 3)
    assert (out['step'][:, 1:] - out['step'][:, :-1] == 1).all()
    check_rows(out)


def test_deque_drops_inner_keys():
    buf = create_buffer(dict(type='deque', replay_buffer_size=50, priority=True, storage=dict(type='tensor')))
    buf.push(batch(0, 10))
    out = buf.sample(4, 0)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([4])
    assert not {'replay_unique_id', 'priority', 'IS'} & set(out.keys())
    check_rows(out)
    assert buf.update({'priority': torch.full((4,), 2.0)}) == {'updated': 4, 'stale': 0}


# ---------------------------------------------------------------------------------------------- episodes
def test_episode_buffer_takes_trajectories():
    buf = make('episode', size=10, max_transitions=100)
    assert buf.push(batch(0, 6)) == 1  # a TensorDict [T] is one episode of T steps
    assert buf.push([batch(10, 5), batch(20, 4)]) == 2
    assert buf.episode_len == [6, 5, 4]
    episodes = buf.sample(3)
    assert all(isinstance(e, TensorDict) and e.batch_size == torch.Size([len(e['step'])]) for e in episodes)
    assert sorted(tuple(e['step'].tolist()) for e in episodes) == [
        (0, 1, 2, 3, 4, 5),
        (10, 11, 12, 13, 14),
        (20, 21, 22, 23),
    ]
    windows = buf.sample(5, unroll_len=3)
    assert isinstance(windows, TensorDict) and windows.batch_size == torch.Size([5])
    assert windows['obs'].shape == (5, 3, 3) and windows['mask'].all()
    assert (windows['step'][:, 1:] - windows['step'][:, :-1] == 1).all()
    check_rows(windows)


def test_prioritized_episode_update_with_sampled_tensordict():
    buf = create_buffer(
        dict(
            type='prioritized_episode',
            replay_buffer_size=10,
            max_transitions=100,
            seed=0,
            sampler=dict(type='prioritized', unroll_len=3, alpha=1.0),
        )
    )
    buf.push([batch(0, 6), batch(10, 8)])
    out = buf.sample(4)
    assert isinstance(out, TensorDict) and out.batch_size == torch.Size([4])
    out['priority'] = torch.full((4,), 7.0)
    assert buf.update(out) == {'updated': 4, 'stale': 0}
    assert buf.stats()['max_priority'] == pytest.approx(7.0, rel=1e-3)


# ---------------------------------------------------------------------------------------------- update
def test_advanced_update_with_sampled_tensordict_moves_priorities():
    buf = make('advanced', size=10, alpha=1.0, beta=1.0)
    buf.extend(batch(0, 10))
    out = buf.sample(10)
    target = int(out['step'][0])
    out['priority'] = torch.where(out['step'] == target, 100.0, 1e-3)
    result = buf.update(out)  # the sampled TensorDict itself, as a dict batch
    assert result == {'updated': 10, 'stale': 0}
    assert buf.stats()['max_priority'] == pytest.approx(100.0, rel=1e-4)
    assert share(buf, target) > 0.9  # 100 against 9 * 1e-3
    # the dict form with the TensorDict's columns does the same (``out`` covered every item: with equal
    # priorities the stratified draw takes each of the 10 once)
    assert sorted(out['step'].tolist()) == list(range(10))
    info = {
        'replay_unique_id': out['replay_unique_id'],
        'replay_buffer_idx': out['replay_buffer_idx'],
        'priority': torch.ones(10),
    }
    assert buf.update(info) == {'updated': 10, 'stale': 0}
    assert share(buf, target) < 0.3  # uniform again: 0.1


def share(buf, step):
    """Fraction of 1000 draws (100 samples of 10: a sample may not exceed the stored count) that hit ``step``."""
    draws = torch.cat([buf.sample(10)['step'] for _ in range(100)])
    return float((draws == step).float().mean())


# ---------------------------------------------------------------------------------------------- output type rule
def test_output_type_follows_first_item():
    dict_first = make('naive')
    dict_first.push({'step': 0, 'obs': np.zeros(3, np.float32)})
    dict_first.push(item(1, nested=False))
    assert type(dict_first.sample(2)) is dict
    td_first = make('naive')
    td_first.push(item(0, nested=False))
    td_first.push({'step': torch.tensor(1), 'obs': torch.arange(3.0) + 1})
    assert isinstance(td_first.sample(2), TensorDict)
    td_first.clear()  # the schema and the output type stay
    td_first.push({'step': torch.tensor(2), 'obs': torch.arange(3.0) + 2})
    assert isinstance(td_first.sample(1), TensorDict)


@pytest.mark.parametrize(
    'cfg', [{'type': t} for t in SLOT_TYPES] + [{'type': 'deque'}, {'type': 'deque', 'priority': True}]
)
def test_output_items_asked_for_by_name_wins_over_the_tensordict_output(cfg):
    """``storage.output='items'`` gives per-item dicts of TensorDict data too (nesting kept, values exact), and
    on ``advanced`` an update built from those items' ids moves their priorities."""
    buf = create_buffer(dict(cfg, replay_buffer_size=16, seed=0, storage=dict(type='tensor', output='items')))
    buf.push(batch(0, 8))
    out = buf.sample(4)
    assert type(out) is list and len(out) == 4 and all(type(x) is dict for x in out)
    for x in out:
        i = int(x['step'])
        assert torch.equal(x['obs'], torch.arange(3, dtype=torch.float32) + i)
        assert torch.equal(x['next']['obs'], torch.arange(3, dtype=torch.float32) + i + 0.5)
    if cfg['type'] == 'advanced':
        ids = [x['replay_unique_id'] for x in out]
        idx = [x['replay_buffer_idx'] for x in out]
        assert buf.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [5.0] * 4})['updated'] == 4


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_persistence_round_trip(kind, tmp_path):
    buf = make(kind)
    buf.extend(batch(0, 20))
    state = buf.state_dict()
    assert state['storage']['container'] == 'tensordict'
    path = os.path.join(tmp_path, 'td.pt')
    buf.save_data(path)
    for restore in ('file', 'state'):
        other = make(kind)
        other.load_data(path) if restore == 'file' else other.load_state_dict(state)
        a, b = buf.sample(8), other.sample(8)  # same RNG state, same data: the same batch
        assert isinstance(b, TensorDict) and b.batch_size == a.batch_size
        assert_same(a.to_dict(), b.to_dict(), restore)
        buf.load_state_dict(state)  # rewind for the next restore
    plain = make(kind)
    plain.push({'step': 0, 'obs': np.zeros(3, np.float32)})
    assert 'container' not in plain.state_dict()['storage']  # dict buffers' files are as before
    bad = buf.state_dict()
    bad['storage']['container'] = 'pandas'
    with pytest.raises(ValueError, match='container'):
        make(kind).load_state_dict(bad)


def test_episode_persistence(tmp_path):
    buf = make('episode', size=10, max_transitions=100)
    buf.push([batch(0, 6), batch(10, 5)])
    path = os.path.join(tmp_path, 'ep.pt')
    buf.save_data(path)
    other = make('episode', size=10, max_transitions=100)
    other.load_data(path)
    out = other.sample(2, unroll_len=4)
    assert isinstance(out, TensorDict)
    check_rows(out)


# ---------------------------------------------------------------------------------------------- list storage
def test_list_storage_keeps_the_objects():
    buf = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0))
    td = item(0)
    buf.push(td)
    assert buf.sample(1)[0] is td
    buf.push(batch(1, 3))  # [B]: B TensorDict items
    got = buf.sample(4)
    assert all(isinstance(x, TensorDict) and x.batch_size == torch.Size([]) for x in got)
    assert sorted(int(x['step']) for x in got) == [0, 1, 2, 3]
    prio = create_buffer(dict(type='advanced', replay_buffer_size=10, seed=0))
    prio.push([item(i) for i in range(5)])
    out = prio.sample(3)
    assert all(isinstance(x, TensorDict) for x in out)
    assert out[0]['replay_unique_id'].startswith('buffer_')  # the id is a NonTensorData string
    info = {
        'replay_unique_id': [x['replay_unique_id'] for x in out],
        'replay_buffer_idx': [x['replay_buffer_idx'] for x in out],
        'priority': [5.0] * 3,
    }
    assert prio.update(info) == {'updated': 3, 'stale': 0}


@pytest.mark.parametrize(
    'cfg',
    [dict(type='naive', storage=dict(type='list', output='items')), dict(type='deque', storage=dict(output='items'))],
)
def test_list_storage_per_item_samples_of_tensordicts_with_batch_dims_carry_one_id_each(cfg):
    """List storage keeps a TensorDict as pushed, batch dims too (in a list, or the rows of a [B, T] batch, an empty
    one included): per-item samples return those TensorDicts with their id and slot as one non-tensor value each
    (they raised tensordict's batch mismatch), nested ones stay TensorDicts."""
    cfg = dict(cfg, replay_buffer_size=10, seed=0)
    cfg['storage'] = dict(cfg['storage'], type='list')
    buf = create_buffer(cfg)
    buf.push([TensorDict({'obs': torch.zeros(3, 4), 'next': {'obs': torch.ones(3, 4)}}, batch_size=[3])])
    buf.push(TensorDict({'obs': torch.zeros(2, 5, 4)}, batch_size=[2, 5]))  # 2 items of batch_size [5]
    buf.push([TensorDict({'obs': torch.zeros(0, 4)}, batch_size=[0])])
    for _ in range(4):
        out = buf.sample(4)
        assert all(isinstance(x, TensorDict) and len(x.batch_size) == 1 for x in out)
        for x in out if cfg['type'] != 'deque' else ():  # (deque leaves its inner id keys out)
            assert type(x['replay_buffer_idx']) is int and 0 <= x['replay_buffer_idx'] < 4
            assert x['replay_unique_id'] == f"buffer_{x['replay_buffer_idx']}"
        assert all(isinstance(x['next'], TensorDict) for x in out if 'next' in x.keys())


@pytest.mark.parametrize('cfg', [dict(type='advanced'), dict(type='deque', priority=True)])
def test_a_prioritized_list_storage_buffer_refuses_tensordict_items_with_batch_dims(cfg):
    """One priority, IS weight and id per item: a TensorDict item with batch dims of its own (in a list, or a row of
    a [B, T] batch) is refused naming its batch_size, nothing stored (it was stored, and every sample raised)."""
    buf = create_buffer(dict(cfg, replay_buffer_size=10, seed=0))
    buf.push([TensorDict({'obs': torch.zeros(4)}, batch_size=[])])
    before = buf.stats()
    for bad in (
        [TensorDict({'obs': torch.zeros(3, 4)}, batch_size=[3])],
        TensorDict({'obs': torch.zeros(2, 5, 4)}, batch_size=[2, 5]),
    ):
        with pytest.raises(
            ValueError, match=r"batch_size \[(3|5)\]; a prioritized buffer's items have batch_size \[\]"
        ):
            buf.push(bad)
        assert buf.stats() == before and buf.count() == 1
    tensor = create_buffer(dict(cfg, replay_buffer_size=10, seed=0, storage=dict(type='tensor')))
    assert tensor.push(TensorDict({'obs': torch.zeros(2, 5, 4)}, batch_size=[2, 5])) == 2  # rows of [5, 4] leaves


def test_update_takes_back_a_list_storage_sample_of_tensordicts():
    """A list-storage sample's items are TensorDicts whose id is a ``NonTensorData``: one of them, or their stack
    (TorchRL's pattern), with new priorities goes back to ``update``."""
    buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
    buf.extend(TensorDict({'obs': torch.arange(4.0)}, batch_size=[4]))
    out = buf.sample(2)
    one = out[0].clone()
    one['priority'] = torch.tensor(5.0)
    assert buf.update(one) == {'updated': 1, 'stale': 0}
    stack = torch.stack(out)
    stack['priority'] = torch.tensor([2.0, 3.0])
    assert buf.update(stack) == {'updated': 2, 'stale': 0}
    got = {int(x['obs']): float(x['priority']) for _ in range(16) for x in buf.sample(4)}
    assert got[int(out[1]['obs'])] == pytest.approx(3.0, abs=1e-4)


# ---------------------------------------------------------------------------------------------- bad input
def _as_dict(td):
    return td.to_dict()


@pytest.mark.parametrize('kind', ['naive', 'advanced'])
def test_bad_input_same_error_nothing_changes(kind):
    buf = make(kind)
    buf.extend(batch(0, 5))
    before = buf.state_dict()
    wrong_shape = item(5)
    wrong_shape['next', 'obs'] = torch.zeros(4)
    non_tensor = item(5)
    non_tensor['next', 'name'] = 'abc'
    wrong_batch = batch(5, 3)
    wrong_batch['next', 'obs'] = torch.zeros(3, 2)
    cases = [(wrong_shape, {}), (non_tensor, {}), (wrong_batch, {'batched': True}), ([item(5), wrong_shape], {})]
    for bad, kw in cases:
        messages = []
        for data in (bad, [_as_dict(x) for x in bad] if isinstance(bad, list) else _as_dict(bad)):
            with pytest.raises((TypeError, ValueError)) as info:
                buf.push(data, **kw)
            messages.append((info.type, str(info.value)))
        assert messages[0] == messages[1]
        assert 'next.' in messages[0][1]
        assert_same(before, buf.state_dict())
    fresh = make(kind)
    with pytest.raises(TypeError, match="field 'next.name' has type str"):
        fresh.push(non_tensor)
    assert fresh.count() == 0
    fresh.push(item(0))  # the failed first push fixed nothing: a valid item still sets the schema
    assert isinstance(fresh.sample(1), TensorDict)


# ---------------------------------------------------------------------------------------------- iter / import
@pytest.mark.parametrize(
    'cfg',
    [
        dict(type='naive'),
        dict(type='advanced', storage=dict(type='tensor')),
        dict(type='deque'),
        dict(type='episode'),
        dict(type='gfn'),
    ],
)
def test_iter_is_a_clear_type_error(cfg):
    buf = create_buffer(cfg)
    with pytest.raises(TypeError, match=r'not iterable.*buffer\.sample\(batch_size\)'):
        iter(buf)
    with pytest.raises(TypeError, match='not iterable'):
        for _ in buf:
            pass


@pytest.mark.slow
def test_works_without_tensordict():
    code = (
        "import sys; sys.modules['tensordict'] = None\n"  # import tensordict fails from here on
        "import numpy as np\n"
        "from ding_buffer import create_buffer\n"
        "b = create_buffer(dict(type='advanced', replay_buffer_size=10, storage=dict(type='tensor')))\n"
        "b.push({'x': np.zeros(2, np.float32), 'n': {'y': 1}}); b.extend({'x': np.ones((3, 2), np.float32), "
        "'n': {'y': np.arange(3)}})\n"
        "out = b.sample(4); assert type(out) is dict, type(out)\n"
        "print(b.update(out))\n"
    )
    env = subprocess_env()
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "'updated': 4" in res.stdout

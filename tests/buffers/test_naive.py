"""Tests of ``NaiveReplayBuffer`` (``type='naive'``) on list and tensor storage.

Covers DI-engine push/clear semantics, sampling (ranges, copies, batched tensor output, uniformity), seeding,
persistence (save/load, state_dict) and the O(batch) cost of sampling without replacement. The uniform index
draw itself (``ding_buffer.sampling.uniform_indices``) is tested in tests/control/test_samplers.py.
"""

import os

import numpy as np
import pytest
import torch
from helpers import NoPermutationGenerator, Payload, assert_same, chi_square

from ding_buffer import create_buffer

STORAGES = ['list', 'tensor']

# 0.999 quantile of the chi-square distribution with 49 degrees of freedom.
CHI2_49_Q999 = 85.35


# ---------------------------------------------------------------------------------------------- helpers
def make(storage='list', size=64, seed=0, **kw):
    cfg = dict(type='naive', replay_buffer_size=size, seed=seed, **kw)
    if storage != 'list':
        cfg['storage'] = dict(type=storage)
    return create_buffer(cfg)


def item(i):
    """An item both storages accept: an int id and a small float tensor derived from it."""
    return {'id': i, 'obs': torch.full((3,), float(i))}


def push_range(buf, start, stop, one_by_one=False):
    if one_by_one:
        for i in range(start, stop):
            buf.push(item(i))
    else:
        buf.push([item(i) for i in range(start, stop)])


def ids_of(batch):
    """Ids of a sampled batch (list of dicts or dict of batched tensors), in sample order."""
    if isinstance(batch, list):
        return [int(x['id']) for x in batch]
    return batch['id'].tolist()


def stored_ids(buf):
    """Ids of every stored item in insertion order (ids increase with insertion in these tests)."""
    if buf.count() == 0:
        return []
    return sorted(ids_of(buf.sample(buf.count())))


@pytest.mark.parametrize('storage', STORAGES)
def test_push_one_item_and_a_list(storage):
    buf = make(storage)
    assert buf.push(item(0)) == 1
    assert buf.count() == 1
    assert buf.push([item(1), item(2), item(3)]) == 3
    assert buf.count() == 4
    assert buf.push_count == 4
    assert stored_ids(buf) == [0, 1, 2, 3]


@pytest.mark.parametrize('storage', STORAGES)
def test_fifo_overwrites_the_oldest(storage):
    buf = make(storage, size=8)
    push_range(buf, 0, 13, one_by_one=True)
    assert buf.count() == 8
    assert buf.push_count == 13
    assert stored_ids(buf) == list(range(5, 13))


@pytest.mark.parametrize('storage', STORAGES)
def test_push_20_then_80_into_64_matches_di_engine_tail(storage):
    buf = make(storage, size=64)
    push_range(buf, 0, 20)
    push_range(buf, 20, 100)
    assert buf.count() == 64
    assert buf.push_count == 100
    assert buf.storage.ring.tail == 36  # DI-engine: (20 + 80) % 64
    assert stored_ids(buf) == list(range(36, 100))


@pytest.mark.parametrize('storage', STORAGES)
def test_list_longer_than_capacity_keeps_its_newest_items(storage):
    buf = make(storage, size=8)
    assert buf.push([item(i) for i in range(20)]) == 20
    assert buf.count() == 8
    assert buf.push_count == 20
    assert stored_ids(buf) == list(range(12, 20))


@pytest.mark.parametrize('storage', STORAGES)
def test_push_empty_list_is_a_noop(storage):
    buf = make(storage, size=8)
    push_range(buf, 0, 5)
    before = buf.state_dict()
    assert buf.push([]) == 0
    assert_same(before, buf.state_dict())
    assert buf.count() == 5 and buf.push_count == 5


@pytest.mark.parametrize('storage', STORAGES)
def test_clear_empties_and_resets_push_count(storage):
    buf = make(storage, size=8)
    push_range(buf, 0, 12)
    buf.clear()
    assert buf.count() == 0
    assert buf.push_count == 0
    assert buf.sample(1) is None
    push_range(buf, 100, 103)
    assert buf.count() == 3
    assert buf.push_count == 3
    assert stored_ids(buf) == [100, 101, 102]


def test_unique_ids_keep_increasing_after_clear():
    buf = make('tensor', size=8)
    push_range(buf, 0, 12)
    before = buf.sample(8)['replay_unique_id']
    assert sorted(before.tolist()) == list(range(4, 12))
    buf.clear()
    push_range(buf, 0, 3)
    after = buf.sample(3)['replay_unique_id']
    assert sorted(after.tolist()) == [12, 13, 14]


# ================================================================================ 2. sample
@pytest.mark.parametrize('replace', [False, True])
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_empty_buffer_returns_none(storage, replace):
    buf = make(storage)
    assert buf.sample(1, replace=replace) is None


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_more_than_count_without_replace_returns_none(storage):
    buf = make(storage)
    push_range(buf, 0, 5)
    assert buf.sample(6) is None
    assert buf.sample(5) is not None


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_with_replace_returns_size_items(storage):
    buf = make(storage)
    push_range(buf, 0, 3)
    ids = ids_of(buf.sample(10, replace=True))
    assert len(ids) == 10
    assert set(ids) <= {0, 1, 2}


@pytest.mark.parametrize('size', [0, -1, -100])
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_non_positive_size_raises_value_error(storage, size):
    buf = make(storage)
    push_range(buf, 0, 5)
    with pytest.raises(ValueError):
        buf.sample(size)


@pytest.mark.parametrize('size', [2.0, '3', True, None, [2]])
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_non_int_size_raises_type_error(storage, size):
    buf = make(storage)
    push_range(buf, 0, 5)
    with pytest.raises(TypeError):
        buf.sample(size)


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_accepts_numpy_int_size(storage):
    buf = make(storage)
    push_range(buf, 0, 5)
    assert len(ids_of(buf.sample(np.int64(3)))) == 3


@pytest.mark.parametrize('batch', [3, 30, 40])  # rejection path, permutation path, whole buffer
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_without_replacement_gives_distinct_items(storage, batch):
    buf = make(storage)
    push_range(buf, 0, 40)
    for _ in range(50):
        ids = ids_of(buf.sample(batch))
        assert len(ids) == batch
        assert len(set(ids)) == batch
        assert set(ids) <= set(range(40))


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_negative_start_selects_the_newest(storage):
    buf = make(storage)
    push_range(buf, 0, 40)
    assert sorted(ids_of(buf.sample(5, sample_range=slice(-5, None)))) == [35, 36, 37, 38, 39]
    for _ in range(30):
        assert set(ids_of(buf.sample(3, sample_range=slice(-5, None)))) <= {35, 36, 37, 38, 39}


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_stop_selects_the_oldest(storage):
    buf = make(storage)
    push_range(buf, 0, 40)
    assert sorted(ids_of(buf.sample(5, sample_range=slice(None, 5)))) == [0, 1, 2, 3, 4]
    for _ in range(30):
        assert set(ids_of(buf.sample(3, sample_range=slice(None, 5)))) <= {0, 1, 2, 3, 4}


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_is_over_insertion_order_after_wraparound(storage):
    buf = make(storage, size=16)
    push_range(buf, 0, 40, one_by_one=True)  # stores 24..39; slot order differs from insertion order
    assert sorted(ids_of(buf.sample(4, sample_range=slice(-4, None)))) == [36, 37, 38, 39]
    assert sorted(ids_of(buf.sample(4, sample_range=slice(None, 4)))) == [24, 25, 26, 27]
    assert sorted(ids_of(buf.sample(4, sample_range=slice(2, 6)))) == [26, 27, 28, 29]
    assert sorted(ids_of(buf.sample(4, sample_range=slice(-10, -6)))) == [30, 31, 32, 33]


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_with_step(storage):
    buf = make(storage, size=16)
    push_range(buf, 0, 40, one_by_one=True)  # stores 24..39
    assert sorted(ids_of(buf.sample(8, sample_range=slice(None, None, 2)))) == list(range(24, 40, 2))
    assert sorted(ids_of(buf.sample(4, sample_range=slice(1, None, 4)))) == [25, 29, 33, 37]
    assert sorted(ids_of(buf.sample(3, sample_range=slice(None, None, -6)))) == [27, 33, 39]
    for _ in range(30):
        assert set(ids_of(buf.sample(3, sample_range=slice(None, None, 2)))) <= set(range(24, 40, 2))


@pytest.mark.parametrize('storage', STORAGES)
def test_sample_range_with_too_few_candidates_returns_none(storage):
    buf = make(storage)
    push_range(buf, 0, 40)
    assert buf.sample(6, sample_range=slice(-5, None)) is None
    assert buf.sample(1, sample_range=slice(10, 10)) is None
    assert buf.sample(1, sample_range=slice(100, None), replace=True) is None
    # With replacement a small range is enough.
    assert set(ids_of(buf.sample(6, sample_range=slice(-5, None), replace=True))) <= set(range(35, 40))


def test_list_storage_sample_returns_the_stored_objects():
    buf = make('list')
    pushed = [item(i) for i in range(10)]
    buf.push(pushed)
    for x in buf.sample(10):
        assert any(x is p for p in pushed)


def test_list_storage_deepcopy_push_copies_the_items():
    buf = make('list', deepcopy=True)
    pushed = [item(i) for i in range(5)]
    buf.push(pushed)
    for p in pushed:
        p['id'] = -1
        p['obs'].zero_()
    for x in buf.sample(5):
        assert x['id'] >= 0
        assert torch.equal(x['obs'], torch.full((3,), float(x['id'])))


def test_list_storage_deepcopy_sample_copies_the_items():
    buf = make('list', deepcopy=True)
    push_range(buf, 0, 5)
    first = buf.sample(5)
    for x in first:
        x['id'] = -1
        x['obs'].zero_()
    second = buf.sample(5)
    assert sorted(ids_of(second)) == [0, 1, 2, 3, 4]
    assert all(not any(x is y for y in first) for x in second)
    for x in second:
        assert torch.equal(x['obs'], torch.full((3,), float(x['id'])))


def test_tensor_storage_sample_is_one_dict_of_batched_tensors():
    buf = make('tensor', size=16)
    buf.push([{'id': i, 'obs': torch.full((3,), float(i)), 'nested': {'a': np.arange(2) + i}} for i in range(10)])
    out = buf.sample(4)
    assert isinstance(out, dict)
    assert set(out) == {'id', 'obs', 'nested', 'replay_buffer_idx', 'replay_unique_id'}
    assert out['id'].shape == (4,) and out['id'].dtype == torch.int64
    assert out['obs'].shape == (4, 3) and out['obs'].dtype == torch.float32
    assert out['nested']['a'].shape == (4, 2)
    assert out['replay_buffer_idx'].dtype == torch.int64 and out['replay_unique_id'].dtype == torch.int64
    for k in range(4):
        i = int(out['id'][k])
        assert torch.equal(out['obs'][k], torch.full((3,), float(i)))
        assert out['nested']['a'][k].tolist() == [i, i + 1]


def test_tensor_storage_meta_fields_match_what_was_pushed():
    buf = make('tensor', size=16)
    push_range(buf, 0, 50, one_by_one=True)  # each item's id equals its unique id
    out = buf.sample(16)
    assert torch.equal(out['id'], out['replay_unique_id'])
    assert torch.equal(out['replay_buffer_idx'], out['replay_unique_id'] % 16)
    assert sorted(out['id'].tolist()) == list(range(34, 50))


def test_tensor_storage_sampled_batch_can_be_pushed_back():
    buf = make('tensor', size=16)
    push_range(buf, 0, 4)
    out = buf.sample(2)
    assert buf.push([{'id': out['id'][k], 'obs': out['obs'][k]} for k in range(2)]) == 2
    assert buf.count() == 6


@pytest.mark.parametrize('via', ['extend', 'push_batched'])
@pytest.mark.parametrize('storage', STORAGES)
def test_extend_pushes_a_batch_dict(storage, via):
    buf = make(storage, size=16)
    batch = {'id': torch.arange(10), 'obs': torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 3)}
    n = buf.extend(batch) if via == 'extend' else buf.push(batch, batched=True)
    assert n == 10
    assert buf.count() == 10 and buf.push_count == 10
    out = buf.sample(10)
    assert sorted(ids_of(out)) == list(range(10))
    rows = out if isinstance(out, list) else [{'id': out['id'][k], 'obs': out['obs'][k]} for k in range(10)]
    for r in rows:
        assert torch.equal(r['obs'], torch.full((3,), float(r['id'])))


@pytest.mark.parametrize('storage', STORAGES)
def test_extend_larger_than_capacity_keeps_the_newest(storage):
    buf = make(storage, size=16)
    push_range(buf, 0, 5)
    assert buf.extend({'id': torch.arange(5, 45), 'obs': torch.zeros(40, 3)}) == 40
    assert buf.count() == 16 and buf.push_count == 45
    assert buf.storage.ring.tail == 45 % 16
    assert stored_ids(buf) == list(range(29, 45))


@pytest.mark.parametrize('storage', STORAGES)
def test_update_is_a_noop(storage):
    buf = make(storage)
    push_range(buf, 0, 5)
    before = buf.state_dict()
    assert buf.update({'priority': [1.0], 'replay_unique_id': [0], 'replay_buffer_idx': [0]}) == {
        'updated': 0,
        'stale': 0,
    }
    assert_same(before, buf.state_dict())


# ================================================================================ 3. uniformity
@pytest.mark.parametrize('storage', STORAGES)
def test_sample_without_replacement_is_uniform_over_items(storage):
    buf = make(storage, size=64, seed=1234)
    push_range(buf, 0, 50)
    counts = np.zeros(50)
    rounds = 2000
    for _ in range(rounds):
        counts[ids_of(buf.sample(10))] += 1
    assert counts.sum() == rounds * 10
    assert chi_square(counts, rounds * 10 / 50) < CHI2_49_Q999


# ================================================================================ 4. seeds
def _sample_sequence(buf, k=10):
    return [ids_of(buf.sample(4)) for _ in range(k)] + [ids_of(buf.sample(20, replace=True))]


@pytest.mark.parametrize('storage', STORAGES)
def test_same_seed_gives_same_samples(storage):
    a, b = make(storage, seed=7), make(storage, seed=7)
    push_range(a, 0, 30)
    push_range(b, 0, 30)
    assert _sample_sequence(a) == _sample_sequence(b)


@pytest.mark.parametrize('storage', STORAGES)
def test_different_seeds_give_different_samples(storage):
    a, b = make(storage, seed=7), make(storage, seed=8)
    push_range(a, 0, 30)
    push_range(b, 0, 30)
    assert _sample_sequence(a) != _sample_sequence(b)


@pytest.mark.parametrize('storage', STORAGES)
def test_global_numpy_seed_reproduces_when_seed_is_none(storage):
    np.random.seed(3)
    a = make(storage, seed=None)
    np.random.seed(3)
    b = make(storage, seed=None)
    push_range(a, 0, 30)
    push_range(b, 0, 30)
    assert _sample_sequence(a) == _sample_sequence(b)


# ================================================================================ 5. persistence
def _filled(storage, size=16, n=40, seed=5):
    buf = make(storage, size=size, seed=seed)
    push_range(buf, 0, n, one_by_one=True)  # wraps around
    buf.sample(3)  # advance the RNG
    return buf


@pytest.mark.parametrize('storage', STORAGES)
def test_save_load_round_trip(storage, tmp_path):
    src = _filled(storage)
    path = str(tmp_path / 'buf.pt')
    src.save_data(path)
    dst = make(storage, size=16, seed=999)
    dst.load_data(path)  # no allow_pickle: dicts of ints and tensors only
    assert dst.count() == src.count() == 16
    assert dst.push_count == src.push_count == 40
    assert dst.storage.ring.tail == src.storage.ring.tail
    assert stored_ids(make_copy_via_state(dst)) == list(range(24, 40))
    assert_same(src.state_dict(), dst.state_dict())
    # The RNG state travels with the file: the next samples agree.
    for _ in range(5):
        assert_same(src.sample(6), dst.sample(6))
    # The loaded buffer keeps working: ids continue.
    src.push(item(40))
    dst.push(item(40))
    assert_same(src.state_dict(), dst.state_dict())


def make_copy_via_state(buf):
    """A fresh buffer with ``buf``'s state (so that inspecting it does not consume ``buf``'s RNG)."""
    twin = make(buf.storage.kind, size=buf.replay_buffer_size)
    twin.load_state_dict(buf.state_dict())
    return twin


@pytest.mark.parametrize('storage', STORAGES)
def test_save_load_of_an_empty_buffer(storage, tmp_path):
    src = make(storage, size=16)
    path = str(tmp_path / 'empty.pt')
    src.save_data(path)
    dst = make(storage, size=16)
    push_range(dst, 0, 3)
    dst.load_data(path)
    assert dst.count() == 0
    assert_same(src.state_dict(), dst.state_dict())


@pytest.mark.parametrize('storage', STORAGES)
def test_save_is_atomic_and_replaces_an_existing_file(storage, tmp_path):
    path = tmp_path / 'buf.pt'
    path.write_bytes(b'old content')
    buf = make(storage, size=16)
    push_range(buf, 0, 3)
    buf.save_data(str(path))
    push_range(buf, 3, 9)
    buf.save_data(str(path))
    assert os.listdir(tmp_path) == ['buf.pt']  # no leftover (hidden) temporary file
    loaded = make(storage, size=16)
    loaded.load_data(str(path))
    assert loaded.count() == 9
    assert_same(buf.state_dict(), loaded.state_dict())


def test_failed_save_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / 'buf.pt'
    good = make('list', size=8)
    push_range(good, 0, 3)
    good.save_data(str(path))
    old_bytes = path.read_bytes()
    bad = make('list', size=8)
    bad.push({'id': 0, 'fn': lambda x: x})  # a lambda cannot be pickled: torch.save fails half-way
    with pytest.raises(Exception):  # noqa: B017 -- whatever pickle raises, the old file must survive
        bad.save_data(str(path))
    assert os.listdir(tmp_path) == ['buf.pt']
    assert path.read_bytes() == old_bytes


def test_list_storage_loads_python_objects_with_allow_pickle(tmp_path):
    src = make('list', size=8)
    src.push([{'id': i, 'payload': Payload(i)} for i in range(4)])
    path = str(tmp_path / 'objects.pt')
    src.save_data(path)
    dst = make('list', size=8)
    push_range(dst, 100, 102)
    dst.load_data(path, allow_pickle=True)  # (without allow_pickle: refused, tests/buffers/test_contract.py)
    assert dst.count() == 4
    assert sorted(x['payload'].value for x in dst.sample(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize('storage', STORAGES)
def test_missing_file_raises_file_not_found(storage, tmp_path):
    buf = make(storage)
    with pytest.raises(FileNotFoundError):
        buf.load_data(str(tmp_path / 'nope.pt'))


@pytest.mark.parametrize('storage', STORAGES)
def test_naive_file_into_episode_buffer_raises(storage, tmp_path):
    path = str(tmp_path / 'buf.pt')
    _filled(storage, size=16).save_data(path)
    cfg = dict(type='episode', replay_buffer_size=16, seed=0)
    if storage == 'tensor':
        cfg.update(max_transitions=256, storage=dict(type='tensor'))
    episode_buffer = create_buffer(cfg)
    with pytest.raises(ValueError):
        episode_buffer.load_data(path, allow_pickle=True)
    assert episode_buffer.count() == 0


@pytest.mark.parametrize('storage', STORAGES)
def test_state_dict_returns_copies(storage):
    buf = _filled(storage)
    reference = buf.state_dict()
    state = buf.state_dict()
    # Mutate everything reachable from the returned state.
    if storage == 'list':
        for x in state['storage']['items']:
            x['id'] = -1
            x['obs'].zero_()
        state['storage']['items'].clear()
    else:
        for t in state['storage']['fields']:
            t.zero_()
    ring = state['storage']['ring']
    ring['valid'].zero_()
    ring['uid'].fill_(-5)
    ring['head'] = 3
    state['storage']['slots'].zero_()
    state['rng']['state']['state'] = 1
    state['type'] = 'tampered'
    assert_same(reference, buf.state_dict())
    assert stored_ids(buf) == list(range(24, 40))


@pytest.mark.parametrize('storage', STORAGES)
def test_load_state_dict_with_duplicate_unique_ids_raises_value_error(storage):
    state = _filled(storage).state_dict()
    state['storage']['ring']['uid'][state['storage']['ring']['valid']] = 30
    target = make(storage, size=16, seed=1)
    with pytest.raises(ValueError):
        target.load_state_dict(state)


@pytest.mark.parametrize('storage', STORAGES)
def test_load_state_dict_round_trip(storage):
    source = _filled(storage)
    target = make(storage, size=16, seed=1)
    target.load_state_dict(source.state_dict())
    assert_same(source.state_dict(), target.state_dict())
    assert_same(source.sample(5), target.sample(5))


@pytest.mark.parametrize('storage', STORAGES)
def test_load_state_dict_with_only_data_pushes_the_items(storage):
    buf = make(storage, size=16)
    push_range(buf, 0, 2)
    buf.load_state_dict({'data': [item(i) for i in range(2, 7)]})
    assert buf.count() == 7
    assert buf.push_count == 7
    assert stored_ids(buf) == list(range(7))


@pytest.mark.parametrize(
    'state,error,match',
    [
        ({'data': None}, TypeError, "state 'data' must be a list of items, got NoneType"),
        ({'data': 'ab'}, TypeError, "state 'data' must be a list of items, got str"),
        ({'data': [{'obs': 1}], 'extra': 1}, ValueError, "state has no 'type' entry"),
    ],
)
def test_load_state_dict_of_a_malformed_short_form_says_what_is_wrong_and_changes_nothing(state, error, match):
    buf = create_buffer(dict(type='naive', seed=0))
    buf.push({'obs': 0})
    before = buf.state_dict()
    with pytest.raises(error, match=match):
        buf.load_state_dict(state)
    assert_same(buf.state_dict(), before)


def test_load_state_dict_with_only_data_keeps_the_objects_as_push_does_unless_deepcopy():
    for deepcopy in (False, True):
        items = [{'obs': [0]}, {'obs': [1]}]
        buf = create_buffer(dict(type='naive', seed=0))
        buf.load_state_dict({'data': items}, deepcopy=deepcopy)
        items[0]['obs'].append(5)
        got = sorted(buf.sample(2), key=lambda x: x['obs'][0])
        assert got == ([{'obs': [0, 5]}, {'obs': [1]}] if not deepcopy else [{'obs': [0]}, {'obs': [1]}])
        assert (got[0] is items[0]) is not deepcopy


# ================================================================================ 6. complexity
def test_sampling_without_replacement_does_no_population_sized_work(monkeypatch):
    """
    ``numpy.random.Generator`` is an immutable C type, so its ``permutation`` cannot be patched directly;
    instead every Generator the buffer creates is one whose permutation/choice/shuffle raise.
    """
    original_default_rng = np.random.default_rng
    monkeypatch.setattr(
        np.random, 'default_rng', lambda seed=None: NoPermutationGenerator(original_default_rng(seed).bit_generator)
    )
    n = 1_000_000
    buf = make('tensor', size=n, seed=0)
    assert buf.extend({'x': torch.arange(n, dtype=torch.int32)}) == n
    assert buf.count() == n
    for _ in range(3):
        out = buf.sample(256)
        assert out['x'].shape == (256,)
        assert len(set(out['x'].tolist())) == 256
        assert torch.equal(out['x'].long(), out['replay_unique_id'])
    out = buf.sample(256, sample_range=slice(-100_000, None))
    assert out["x"].min() >= n - 100_000
    assert buf.sample(256, replace=True)['x'].shape == (256,)


@pytest.mark.parametrize('storage', STORAGES)
def test_batched_push_does_not_alias_the_callers_batch(storage):
    """Vectorised collectors reuse their batch buffers: a later write to the batch must not reach the buffer."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, seed=0, storage=dict(type=storage)))
    batch = {'x': torch.zeros(3), 'y': np.zeros((3, 2), dtype=np.float32)}
    buf.extend(batch)
    batch['x'][:] = 7
    batch['y'][:] = 7
    out = buf.sample(3)
    xs = out['x'] if storage == 'tensor' else torch.stack([item['x'] for item in out])
    ys = out['y'] if storage == 'tensor' else torch.as_tensor(np.stack([item['y'] for item in out]))
    assert (xs == 0).all() and (ys == 0).all()


class _Fragile:
    """An object whose deep copy raises while ``fail`` is set."""

    fail = False

    def __deepcopy__(self, memo):
        if _Fragile.fail:
            raise RuntimeError('cannot copy me')
        return _Fragile()

    def __eq__(self, other):
        return isinstance(other, _Fragile)


@pytest.mark.parametrize(
    'kind, push, size',
    [
        ('naive', [{'obs': 1}, {'obs': 2, 'f': _Fragile()}], 2),
        ('advanced', [{'obs': 1}, {'obs': 2, 'f': _Fragile()}], 2),
        ('episode', [[{'obs': 1, 'f': _Fragile()}, {'obs': 2}]], 1),
    ],
)
def test_a_sample_whose_deep_copy_raises_changes_nothing(kind, push, size):
    """deepcopy=True: the copy of the batch used to come last, after use counts, max_use removals, counters, beta
    and the RNG had moved (naive lost both items). The sample is all or nothing, and the next one is the same."""
    cfg = dict(type=kind, deepcopy=True, seed=0, replay_buffer_size=4)
    if kind != 'episode':
        cfg['max_use'] = 1
    buf = create_buffer(cfg)
    buf.push(push)
    before = buf.state_dict()
    _Fragile.fail = True
    try:
        with pytest.raises(RuntimeError, match='cannot copy me'):
            buf.sample(size)
    finally:
        _Fragile.fail = False
    assert_same(buf.state_dict(), before)
    twin = create_buffer(cfg)
    twin.load_state_dict(before)
    assert_same(buf.sample(size), twin.sample(size), 'sample')
    assert_same(buf.state_dict(), twin.state_dict())


@pytest.mark.parametrize('kind', ['naive', 'advanced', 'deque'])
def test_tensors_inside_an_autograd_graph_do_not_break_a_later_state_dict(kind):
    """A batch that requires grad (a policy output not detached) was split into rows that stayed in its graph, and
    a pushed ``x * 2`` stayed one: both refuse deepcopy, so every later state_dict / save_data raised."""
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    buf = create_buffer(dict(type=kind, replay_buffer_size=8, seed=0))
    assert buf.extend({'obs': torch.randn(2, 3, requires_grad=True) * 2, 'reward': torch.ones(2)}) == 2
    buf.push({'obs': x * 2, 'reward': torch.tensor(1.0)})
    twin = create_buffer(dict(type=kind, replay_buffer_size=8, seed=0))
    twin.load_state_dict(buf.state_dict())
    assert twin.count() == 3
    items = twin.sample(3, 0) if kind == 'deque' else twin.sample(3)
    assert len(items) == 3 and not any(item['obs'].requires_grad for item in items)
    if kind != 'advanced':  # drawn without replacement: all three
        assert any(torch.equal(item['obs'], (x * 2).detach()) for item in items)


def test_a_python_float_goes_into_a_float64_field_exactly():
    """A field first pushed as np.float64 refused the Python floats of later pushes (a reward type that alternates
    between the two is common); a Python float is a double, so it is stored exactly."""
    buf = create_buffer(dict(type='naive', replay_buffer_size=8, storage=dict(type='tensor'), seed=0))
    buf.push({'r': np.float64(0.1)})
    buf.push({'r': 0.1 + 2**-40})
    buf.push({'r': 3})
    buf.extend({'r': [1 / 3, 2.5]})
    got = buf.sample(5, replace=False)['r']
    assert got.dtype == torch.float64
    assert sorted(got.tolist()) == sorted([0.1, 0.1 + 2**-40, 3.0, 1 / 3, 2.5])
    with pytest.raises(ValueError, match="dtype torch.float64, expected torch.float32"):
        create_buffer(dict(type='naive', storage=dict(type='tensor'))).push([{'r': 1.0}, {'r': np.float64(1.0)}])


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_max_use_drains_a_large_buffer_drawing_every_item_once(storage):
    """A large ring with holes (``max_use=1`` removes what was drawn) finds positions through per-block counts: a
    buffer sampled without replacement until empty gives every stored item exactly once, interleaved pushes too
    (it listed every slot on every sample, O(capacity), before)."""
    n = 40_000
    buf = create_buffer(dict(type='naive', replay_buffer_size=n + 8, max_use=1, seed=0, storage=dict(type=storage)))
    buf.push([{'obs': i} for i in range(n)])
    drawn = []
    for k in range(100):
        batch = buf.sample(256)
        drawn += [int(x) for x in (batch['obs'] if storage == 'tensor' else [d['obs'] for d in batch])]
        if k % 50 == 0:
            buf.push([{'obs': n + k}])
    while buf.count():
        batch = buf.sample(min(256, buf.count()))
        drawn += [int(x) for x in (batch['obs'] if storage == 'tensor' else [d['obs'] for d in batch])]
    assert sorted(drawn) == list(range(n)) + [n + k for k in range(0, 100, 50)]

"""Tensors that are views into a larger tensor (a row of a collector's batch), tensor subclasses and tensors with no
values: what each storage keeps and writes of them. A copy keeps the view's own elements, not its whole storage;
what a storage cannot read is refused by name at push, the buffer unchanged."""

import os
import warnings

import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer

ROW = 256  # float32 elements a row: 1 KiB
PARENT_BYTES = 64 * ROW * 4  # a batch of 64 rows


def own(t: torch.Tensor) -> bool:
    """``t`` holds only its own elements (not the storage of a larger tensor)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def batch_rows(n: int):
    big = torch.arange(64 * ROW, dtype=torch.float32).reshape(64, ROW)
    return big, [big[i] for i in range(n)]


@pytest.mark.parametrize('store', ['memory', 'disk'])
def test_chunk_fragments_that_are_rows_of_a_batch_keep_only_their_rows(store, tmp_path):
    big, rows = batch_rows(4)
    store_cfg = dict(type=store, path=str(tmp_path / 'store') if store == 'disk' else None)
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, max_reuse=None, store=store_cfg, seed=0))
    for k, row in enumerate(rows):
        buf.push(dict(worker='w', fid=k, model_version=0, data={'obs': row}))
    out = buf.sample(2)
    for f in out:
        assert own(f['data']['obs']) and torch.equal(f['data']['obs'], big[f['fid']])
    if store == 'disk':
        files = [os.path.join(tmp_path / 'store', f) for f in os.listdir(tmp_path / 'store')]
        assert files and sum(os.path.getsize(f) for f in files) < PARENT_BYTES  # four 1 KiB rows, not 4 batches
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    assert os.path.getsize(path) < PARENT_BYTES
    buf.close()


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
@pytest.mark.parametrize('deepcopy', [False, True])
def test_list_storage_copies_and_files_keep_only_a_views_own_elements(type_, deepcopy, tmp_path):
    big, rows = batch_rows(4)
    buf = create_buffer(dict(type=type_, replay_buffer_size=8, deepcopy=deepcopy, storage=dict(type='list'), seed=0))
    for row in rows:
        buf.push({'obs': row})
    items = buf.state_dict()['storage']['items']  # (at most the four rows they span, not the 64-row batch)
    assert len(items) == 4 and all(x['obs'].untyped_storage().nbytes() <= 4 * ROW * 4 for x in items)
    if deepcopy:  # (each pushed item copied on its own, and each sample)
        assert all(own(x['obs']) for x in buf.sample(3))
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    assert os.path.getsize(path) < PARENT_BYTES
    other = create_buffer(dict(type=type_, replay_buffer_size=8, storage=dict(type='list'), seed=0))
    other.load_data(path)
    got = sorted(x['obs'][0].item() for x in other.state_dict()['storage']['items'])
    assert got == [float(i * ROW) for i in range(4)]


class Obs(torch.Tensor):
    """A plain tensor subclass (no ``new_empty``: ``copy.deepcopy`` refuses it)."""


def test_a_plain_tensor_subclass_is_stored_and_saved_as_its_values(tmp_path):
    x = torch.arange(4.0).as_subclass(Obs)
    for storage in ('list', 'tensor'):
        buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type=storage), seed=0))
        buf.push({'obs': x})
        path = str(tmp_path / f'{storage}.pt')
        buf.save_data(path)  # (list storage: torch's RuntimeError from deepcopy before)
        other = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type=storage), seed=0))
        other.load_data(path, allow_pickle=storage == 'list')  # (list storage keeps the class: code to run)
        out = other.sample(1)
        obs = out[0]['obs'] if isinstance(out, list) else out['obs'][0]  # (tensor storage: a batch)
        assert torch.equal(obs.as_subclass(torch.Tensor), torch.arange(4.0))


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
def test_tensor_storage_refuses_a_tensor_subclass_it_cannot_read(type_):
    """A MaskedTensor failed inside the write, after the ring took a slot: an item of zeros was sampled after."""
    from torch.masked import masked_tensor

    warnings.filterwarnings('ignore', message='.*MaskedTensors.*')
    buf = create_buffer(dict(type=type_, replay_buffer_size=4, storage=dict(type='tensor'), seed=0))
    buf.push({'obs': torch.ones(3), 'reward': 1.0})
    before = buf.state_dict()
    bad = masked_tensor(torch.zeros(3), torch.tensor([True, False, True]))
    with pytest.raises(TypeError, match="field 'obs' is a MaskedTensor, a tensor subclass"):
        buf.push({'obs': bad, 'reward': 0.0})
    assert_same(buf.state_dict(), before, 'state after the refused push')
    assert buf.count() == 1


def test_a_chunk_payload_no_copy_takes_is_a_type_error():
    buf = create_buffer(dict(type='chunk', fragments_per_chunk=1, max_reuse=None, seed=0))
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match="a fragment's payload cannot be copied"):
        buf.push(dict(worker='w', fid=0, model_version=0, data={'obs': nested}))
    assert buf.count() == 0
    buf.push(dict(worker='w', fid=0, model_version=0, data={'obs': torch.ones(2)}))
    assert buf.count() == 1


def test_overlapping_windows_of_one_episode_are_saved_once(tmp_path):
    """Windows ``episode[t:t + 40]`` (and obs / next_obs views of one trajectory) span the whole episode together:
    a copy keeps them on one storage, as deepcopy does, not one copy per window."""
    episode = torch.arange(100 * ROW, dtype=torch.float32).reshape(100, ROW)
    buf = create_buffer(dict(type='naive', replay_buffer_size=64, storage=dict(type='list'), seed=0))
    for t in range(61):
        buf.push({'obs': episode[t : t + 39], 'next_obs': episode[t + 1 : t + 40]})
    items = buf.state_dict()['storage']['items']
    pointers = {x[k].untyped_storage().data_ptr() for x in items for k in ('obs', 'next_obs')}
    assert len(pointers) == 1
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    assert os.path.getsize(path) < 2 * episode.numel() * 4
    other = create_buffer(dict(type='naive', replay_buffer_size=64, storage=dict(type='list'), seed=0))
    other.load_data(path)
    for t, x in enumerate(other.state_dict()['storage']['items']):
        assert torch.equal(x['obs'], episode[t : t + 39]) and torch.equal(x['next_obs'], episode[t + 1 : t + 40])


class Tagged(torch.Tensor):
    """A subclass that ``deepcopy`` copies with its own ``__deepcopy__`` (keeping its tag)."""

    def __deepcopy__(self, memo):
        new = self.detach().clone().as_subclass(Tagged)
        new.tag = self.tag
        memo[id(self)] = new
        return new


def test_copies_of_views_keep_what_deepcopy_keeps():
    tagged = torch.arange(3.0).as_subclass(Tagged)
    tagged.tag = 'camera-0'
    row = torch.arange(64 * ROW, dtype=torch.float32).reshape(64, ROW)[2]
    row.units = 'm/s'
    leaf = torch.zeros(64, ROW)[1].requires_grad_()
    leaf.grad = torch.ones(ROW)
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, deepcopy=True, seed=0))
    buf.push({'tagged': tagged, 'row': row, 'leaf': leaf})
    out = buf.sample(1)[0]
    assert out['tagged'].tag == 'camera-0' and out['row'].units == 'm/s' and own(out['row'])
    assert out['leaf'].requires_grad and out['leaf'].is_leaf and torch.equal(out['leaf'].grad, torch.ones(ROW))


def test_tensor_storage_refuses_a_wrapper_tensor_subclass():
    from torch.testing._internal.two_tensor import TwoTensor

    buf = create_buffer(dict(type='naive', replay_buffer_size=4, storage=dict(type='tensor'), seed=0))
    buf.push({'obs': torch.ones(3), 'reward': 1.0})
    before = buf.state_dict()
    with pytest.raises(TypeError, match="field 'obs' is a TwoTensor, a tensor subclass"):
        buf.push({'obs': TwoTensor(torch.full((3,), 5.0), torch.full((3,), 7.0)), 'reward': 0.0})
    assert_same(buf.state_dict(), before, 'state after the refused push')


def test_conjugate_and_negative_views_keep_their_values_through_copies():
    """A lazy conjugate / negation is a flag on a view: its bytes are the unconjugated values. Compacted as bytes,
    copies came back unconjugated (and negated .imag rows with the wrong sign)."""
    x = torch.randn(100, 3, dtype=torch.cfloat, generator=torch.Generator().manual_seed(0))
    item = {'c': x.conj()[0], 'n': x.conj().imag[0]}
    for deepcopy in (False, True):
        buf = create_buffer(dict(type='naive', replay_buffer_size=4, deepcopy=deepcopy, seed=0))
        buf.push(item)
        other = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
        other.load_state_dict(buf.state_dict())
        for got in (buf.sample(1)[0], other.sample(1)[0]):
            assert torch.equal(got['c'], x[0].conj()) and torch.equal(got['n'], -x[0].imag)


def test_views_of_one_tensor_as_two_dtypes_are_saved(tmp_path):
    """torch.save refuses one storage viewed as two dtypes: such an item was accepted and every save_data failed."""
    x = torch.arange(12.0).reshape(4, 3)
    buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
    buf.push({'f': x[2], 'u': x[2].view(torch.uint8), 'all': x})
    path = str(tmp_path / 'b.pt')
    buf.save_data(path)
    other = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
    other.load_data(path)
    got = other.sample(1)[0]
    assert torch.equal(got['f'], x[2]) and torch.equal(got['u'], x[2].view(torch.uint8)) and torch.equal(got['all'], x)

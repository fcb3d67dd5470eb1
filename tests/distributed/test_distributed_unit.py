"""In-process unit tests of ``ding_buffer.distributed``: no process group, no transport, no second process.

1. the wire codec (``encode`` / ``decode``): round trips of every supported leaf, zero-copy decoding, refusals
   (pickle-free by default) and malformed or hostile messages;
2. ``ManagerCore.handle`` driven directly on a real buffer from ``build_manager_buffer``: ops, error replies that
   leave the buffer unchanged, scoring / metadata hooks, baseline strategies (torchgfn §7.1), version gating,
   ``max_reuse`` and the shutdown checkpoint;
3. ``RemoteBuffer`` over a loopback channel written here (every request and reply goes through the real codec
   and a real ``ManagerCore``): ``remote_buffer_freq``, baseline filtering with refresh (torchgfn §6.3),
   ``async_score``, ``scoring_only``, ``local_buffer``, sample timeouts, remote exceptions, ``close``;
4. validation of the ``distributed`` config section through ``create_buffer``.
"""

import collections
import copy
import math
import os
import queue
import threading
import time

import numpy as np
import pytest
import torch
from easydict import EasyDict
from helpers import assert_same, wait_until, without
from in_process import InProcessNet as _Net
from in_process import in_process_job as _in_process_job

from ding_buffer import SampleTimeoutError, create_buffer
from ding_buffer.base import BUFFER_REGISTRY, get_buffer_cls
from ding_buffer.buffers import NaiveReplayBuffer
from ding_buffer.distributed import ManagerCore, RemoteBuffer, build_manager_buffer, profile
from ding_buffer.distributed.codec import _TORCH_DTYPES, DATA_DEPTH, STATE_DEPTH, decode, encode
from ding_buffer.distributed.config import resolve_callable
from ding_buffer.distributed.factory import worker_buffer
from ding_buffer.distributed.push_dedup import MAX_CLIENTS
from ding_buffer.distributed.transport import ThreadedTransport
from ding_buffer.errors import (
    CodecError,
    ManagerTimeoutError,
    ManagerUnavailableError,
    ProtocolError,
    SendTimeout,
    TransportError,
)

NINF = float('-inf')
W = 'worker-0'


# ================================================================================================ helpers
def wire(obj, allow_pickle=False):
    """encode -> bytes on a 'wire' -> fresh writable buffers -> decode (what a socket would do)."""
    header, parts = encode(obj, allow_pickle=allow_pickle)
    received = [np.frombuffer(bytes(p), dtype=np.uint8).copy() for p in parts]
    return decode(bytes(header), received, allow_pickle=allow_pickle)


def roundtrip(obj, allow_pickle=False):
    header, parts = encode(obj, allow_pickle=allow_pickle)
    return decode(header, parts, allow_pickle=allow_pickle)


def header_of(body, n=()):
    import json

    return json.dumps({'v': 1, 'n': list(n), 'body': body}).encode()


class Opaque:
    """An arbitrary object: only pickle can carry it."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Opaque and other.x == self.x


EXECUTED = []


def _mark_executed():
    EXECUTED.append(1)
    return 'pwned'


class Hostile:
    def __reduce__(self):
        return (_mark_executed, ())


# scoring / metadata hooks referenced by 'module:function' strings (pytest imports this file as
# 'test_distributed_unit': its folder is put on sys.path)
def score_hook(batch, sender=None, buffer=None):
    n = len(batch) if isinstance(batch, list) else 1
    return {'n_in': n, 'sender': sender, 'count_after': buffer.count()}


def bad_score_hook(batch, sender=None, buffer=None):
    return [1, 2]


def meta_hook(buffer):
    return {'n_modes_found': 7, 'seen': buffer.count()}


NOT_CALLABLE = 3
# seconds: an outer bound that only says a call ended (instead of hanging), never how fast; waits are checked by
# what they did and by lower bounds (a wait lasted at least its timeout)
OUTER = 30.0


def req(op, rid=0, shard=0, **args):
    return {'op': op, 'id': rid, 'shard': shard, 'args': args}


def make_cfg(type='advanced', size=16, storage='tensor', **dist):
    cfg = dict(type=type, replay_buffer_size=size, seed=0, distributed=dict(backend='torch', **dist))
    if type in ('advanced', 'naive'):
        cfg['storage'] = dict(type=storage)
    else:
        cfg['prioritized_capacity'] = True
    return EasyDict(cfg)


def make_core(type='advanced', size=16, storage='tensor', **dist):
    buf, dcfg, key = build_manager_buffer(make_cfg(type, size, storage, **dist))
    return ManagerCore(buf, dcfg, key)


def ok(reply):
    assert reply['ok'], reply
    return reply['result']


def item(i):
    return {'obs': torch.full((2,), float(i)), 'log_reward': torch.tensor(float(i))}


def gfn_batch(log_rewards, offset=0.0):
    lr = torch.tensor(log_rewards, dtype=torch.float32)
    n = len(lr)
    state = torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + offset
    return {'state': state, 'log_reward': lr}


def stored_obs(buf):
    """Tensor-storage field 'obs' of an advanced / naive buffer in insertion order (ring not wrapped)."""
    st = buf.state_dict()['storage']
    names = [s[0] for s in st['schema']]
    return st['fields'][names.index(['obs'])]


class Loopback:
    """A channel for ``RemoteBuffer``: requests and replies go through the real codec; the request is handled by
    a real ``ManagerCore`` at submit time, the reply is held until ``result``."""

    def __init__(self, core, sender=W, allow_pickle=False):
        self.core = core
        self.sender = sender
        self.allow_pickle = allow_pickle
        self.where = 'loopback manager'
        self.requests = []
        self.closed = 0
        self.fail = None
        self._replies = {}
        self._next = 0

    def submit(self, request, deadline=None):
        """``self.fail``: None, 'lost' (the request never reaches the manager) or 'late' (it is applied but the
        reply does not come in time) -- the two faces of a ManagerUnavailableError."""
        if self.closed:
            raise ManagerUnavailableError('loopback is closed')
        rid = self._next
        self._next += 1
        request['id'] = rid
        if self.fail == 'lost':
            raise ManagerUnavailableError('loopback: request lost')
        decoded = wire(request, self.allow_pickle)
        self.requests.append(decoded)
        reply = self.core.handle(self.sender, decoded)
        if self.fail == 'late':
            raise ManagerUnavailableError('loopback: no reply in time')
        if reply is not None:
            self._replies[rid] = wire(reply, self.allow_pickle)
        return rid

    def result(self, ticket, op, deadline=None):
        if ticket not in self._replies:
            raise ManagerUnavailableError(f'no reply to {op!r} (ticket {ticket})')
        return self._replies.pop(ticket)

    def close(self, grace=None):
        self.closed += 1

    def ops(self):
        return [r['op'] for r in self.requests]


def make_remote(type='advanced', size=16, storage='tensor', gfn_extra=None, **dist):
    """What ``create_distributed`` builds on a worker, with a Loopback channel to an in-process manager."""
    cfg = make_cfg(type, size, storage, **dist)
    cfg.update(gfn_extra or {})
    buf, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buf, dcfg, key)
    channel = Loopback(core, allow_pickle=dcfg.allow_pickle)
    local_cfg = EasyDict(copy.deepcopy({k: v for k, v in dict(cfg).items() if k != 'distributed'}))
    rb = worker_buffer(get_buffer_cls(cfg), local_cfg, dcfg, channel)
    return rb, core, channel


# ================================================================================================ 1. codec
def _torch_values(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    lo, hi = (0, 255) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


@pytest.mark.parametrize('name', sorted(_TORCH_DTYPES))
def test_codec_torch_tensors_of_every_dtype(name):
    dtype = _TORCH_DTYPES[name]
    gen = torch.Generator().manual_seed(0)
    base = _torch_values(dtype, (4, 6), gen)
    cases = {
        'contiguous': base,
        'transposed': base.T,
        'strided': base[::2, 1::3],
        '0-d': base[1, 2],
        'empty': base[:0],
        'empty-3d': torch.empty((2, 0, 3), dtype=dtype),
    }
    assert not cases['transposed'].is_contiguous() and not cases['strided'].is_contiguous()
    for what, t in cases.items():
        out = wire(t)
        assert_same(t.contiguous(), out, f'{name}/{what}')
        out2 = roundtrip({'x': t})['x']  # decoding the encoder's own parts
        assert_same(t.contiguous(), out2, f'{name}/{what} (local)')


@pytest.mark.parametrize('name', ['uint16', 'uint32', 'uint64', 'float8_e4m3fn', 'float8_e5m2', 'complex32'])
def test_a_remote_buffer_takes_the_tensor_dtypes_a_local_one_does(name):
    """The unsigned, float8 and complex-half dtypes were pickled (refused without allow_pickle), so a push a local
    tensor buffer takes raised TypeError on a distributed one: they travel raw, bit for bit."""
    dtype = getattr(torch, name)
    x = (
        torch.arange(12 * dtype.itemsize, dtype=torch.uint8).reshape(3, 4 * dtype.itemsize).view(dtype)
    )  # distinct bytes
    out = wire({'x': x})['x']
    assert out.dtype == dtype and torch.equal(out.view(torch.uint8), x.view(torch.uint8))
    lazy = torch.tensor([1 + 2j, 3 - 4j]).conj()  # a conjugate view (and its negative) travel resolved
    assert torch.equal(wire(lazy), lazy.resolve_conj()) and torch.equal(wire(-lazy.imag), -lazy.resolve_conj().imag)
    if name.startswith('uint'):  # through a worker's push and sample, as on a local buffer
        rb, core, _ = make_remote('naive', 8)
        assert rb.push({'x': x[0]}) == 1
        assert torch.equal(rb.sample(1)['x'][0].view(torch.uint8), x[0].view(torch.uint8))


def test_codec_tensor_detached_and_values_exact():
    t = torch.tensor([1.5, -0.0, float('inf'), float('-inf')], requires_grad=True)
    out = wire(t)
    assert not out.requires_grad
    assert torch.equal(out, t.detach()) and math.copysign(1.0, out[1].item()) == -1.0
    nan = wire(torch.tensor([float('nan')], dtype=torch.bfloat16))
    assert nan.dtype == torch.bfloat16 and torch.isnan(nan).all()


NP_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


@pytest.mark.parametrize('dtype', NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_codec_numpy_arrays(dtype):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((5, 6)) * 50
    if np.dtype(dtype).kind == 'c':
        base = base + 1j * rng.standard_normal((5, 6))
    elif np.dtype(dtype).kind in 'iu':
        base = np.abs(base)
    elif np.dtype(dtype).kind == 'b':
        base = base > 0
    a = base.astype(dtype)
    for what, x in {
        'contiguous': a,
        'transposed': a.T,
        'strided': a[1::2, ::3],
        'fortran': np.asfortranarray(a),
        'empty': a[:0],
        '3d': a.reshape(5, 3, 2),
    }.items():
        out = wire(x)
        assert isinstance(out, np.ndarray) and out.shape == x.shape, what
        assert_same(np.ascontiguousarray(x), out, f'{np.dtype(dtype).name}/{what}')
        assert out.flags.writeable, what


def test_codec_numpy_zero_dim_array_keeps_shape():
    a = np.array(3.5, dtype=np.float32)
    out = wire(a)
    assert_same(a, out)
    assert out.shape == ()


@pytest.mark.parametrize(
    'scalar',
    [
        np.bool_(True),
        np.int8(-5),
        np.uint8(200),
        np.int32(-70000),
        np.int64(-(2**63)),
        np.uint64(2**64 - 1),
        np.float16(1.5),
        np.float32(0.1),
        np.complex64(1 + 2j),
        np.complex128(-0.5 + 1e-300j),
    ],
    ids=lambda s: type(s).__name__,
)
def test_codec_numpy_scalars_keep_dtype(scalar):
    out = wire({'s': scalar})['s']
    assert type(out) is type(scalar) and out.dtype == scalar.dtype
    assert out == scalar


def test_codec_numpy_float64_scalar_keeps_dtype():
    s = np.float64(1 / 3)
    out = wire({'s': s})['s']
    assert out == s
    assert type(out) is np.float64


def test_codec_longdouble_scalar():
    s = np.longdouble(1) / 3
    out = wire(s)
    assert type(out) is np.longdouble and out == s


def test_codec_nested_structures():
    msg = {
        'a': {'b': [1, 2.5, 'x', None, True, False], 'c': (1, (2, [3, (4,)]))},
        3: 'int key',
        '3': 'str key',
        'ints': [0, -1, 2**63 - 1, -(2**63), 2**64 - 1],
        'floats': [0.1, -0.0, 1e308, 5e-324, float('inf'), float('-inf')],
        'sl': [slice(1, 10, 2), slice(None), slice(-3, None, None)],
        'bytes': b'\x00\xffabc',
        'empty': [b'', (), [], {}],
        'mixed': [torch.arange(3), np.arange(2, dtype=np.int16), {'t': (torch.ones(1, 2),)}],
    }
    out = wire(msg)
    assert_same(msg, out)
    assert set(out) == {'a', 3, '3', 'ints', 'floats', 'sl', 'bytes', 'empty', 'mixed'}
    assert type(out['a']['c']) is tuple and type(out['a']['c'][1][1]) is list and type(out['a']['c'][1][1][1]) is tuple
    assert out['a']['b'][4] is True and type(out['ints'][0]) is int
    assert math.copysign(1.0, out['floats'][1]) == -1.0
    nan = wire({'v': float('nan'), 'l': [float('nan')]})
    assert math.isnan(nan['v']) and math.isnan(nan['l'][0]) and type(nan['v']) is float


def test_codec_one_element_views_of_any_stride_travel():
    """A one-element slice with a step (or the imaginary part of a complex tensor) counts as contiguous in torch,
    whatever its stride: it raised torch's 'stride(-1) must be 1' instead of travelling."""
    for x in (torch.arange(2.0)[::2], torch.tensor([1 + 2j]).imag, torch.arange(4.0).reshape(2, 2)[:1, ::2]):
        out = wire({'x': x})['x']
        assert out.shape == x.shape and torch.equal(out, x)


def test_codec_masked_arrays_and_sparse_tensors_are_pickled_or_refused_by_path():
    """A masked array or a sparse tensor has no byte view of what it means: pickled with ``allow_pickle`` (the mask
    and the values back), else refused naming its path (they raised numpy / torch errors, a mask would be lost).
    Subclasses of the other kinds travel as their base kind, with or without pickle, as the docs say."""
    masked, sparse = np.ma.masked_array([1.0, 2.0], mask=[0, 1]), torch.eye(2).to_sparse()
    hidden = torch.masked.masked_tensor(torch.ones(2), torch.tensor([True, False]))
    got = wire({'m': masked, 's': sparse, 'h': hidden}, allow_pickle=True)
    assert got['m'].mask.tolist() == [False, True] and torch.equal(got['s'].to_dense(), torch.eye(2))
    assert got['h'].get_mask().tolist() == [True, False]
    for key, value in (('m', masked), ('s', sparse), ('h', hidden)):
        with pytest.raises(TypeError, match=rf"at 'message\.{key}' without pickle"):
            encode({key: value})
    for pickle in (False, True):
        out = wire({'d': collections.OrderedDict(a=1), 't': Pair(1, 2), 'e': EasyDict(b=2)}, allow_pickle=pickle)
        assert (type(out['d']), type(out['t']), type(out['e'])) == (dict, tuple, dict)
        assert out == {'d': {'a': 1}, 't': (1, 2), 'e': {'b': 2}}


Pair = collections.namedtuple('Pair', 'a b')


def test_codec_zero_copy():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    header, parts = encode({'t': t})
    assert np.shares_memory(parts[0], t.numpy())  # contiguous CPU data is not copied when encoding
    # writable torch uint8 parts: the decoded tensor is a view of the part
    received = [torch.from_numpy(p.copy()) for p in parts]
    out = decode(header, received)['t']
    assert out.data_ptr() == received[0].data_ptr()
    received[0][:4] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8)  # float32 1.0 (little endian)
    assert out[0, 0].item() == 1.0
    # writable numpy parts: also a view
    received = [p.copy() for p in parts]
    out = decode(header, received)['t']
    assert out.data_ptr() == received[0].ctypes.data
    received[0][:] = 0
    assert torch.count_nonzero(out) == 0
    # read-only bytes: an independent, writable copy
    raw = [bytes(p) for p in parts]
    out = decode(header, raw)['t']
    out += 1
    assert torch.equal(out, t + 1) and torch.equal(decode(header, raw)['t'], t)


def test_codec_refuses_arbitrary_objects_without_pickle():
    with pytest.raises(TypeError, match=r"message\.a\.b") as e:
        encode({'a': {'b': Opaque(1)}})
    assert 'allow_pickle' in str(e.value)
    with pytest.raises(TypeError, match=r"message\.x\[1\]"):
        encode({'x': [1, {2, 3}]})
    with pytest.raises(TypeError, match='allow_pickle'):
        encode({(1, 2): 'tuple key'})
    msg = {'a': {'b': Opaque(1)}, 's': {2, 3}, 'k': {(1, 2): 'tuple key'}, 't': torch.ones(2)}
    out = wire(msg, allow_pickle=True)
    assert_same(msg['t'], out['t'])
    assert out['a']['b'] == Opaque(1) and out['s'] == {2, 3} and out['k'] == {(1, 2): 'tuple key'}
    assert roundtrip(2**100, allow_pickle=True) == 2**100
    header, parts = encode(msg, allow_pickle=True)
    with pytest.raises(CodecError, match='allow_pickle'):
        decode(header, parts, allow_pickle=False)


def test_codec_hostile_pickle_is_never_executed():
    EXECUTED.clear()
    header, parts = encode({'x': Hostile()}, allow_pickle=True)
    with pytest.raises(CodecError):
        decode(header, parts)
    with pytest.raises(CodecError):
        decode(header_of({'$p': 0}, [len(parts[0])]), [bytes(parts[0])])
    assert EXECUTED == []
    assert decode(header, parts, allow_pickle=True) == {'x': 'pwned'} and EXECUTED == [1]  # control: it would run


MALFORMED = {
    'not json': (b'{"v": 1, "n": [', []),
    'not utf-8': (b'\xff\xfe', []),
    'json list': (b'[1, 2]', []),
    'wrong version': (b'{"v": 2, "n": [], "body": 1}', []),
    'no version': (b'{"n": [], "body": 1}', []),
    'n not a list': (b'{"v": 1, "n": 3, "body": 1}', []),
    'more parts announced': (header_of({'$t': [0, 'float32', [1]]}, [4, 4]), [b'abcd']),
    'fewer parts announced': (header_of({'$t': [0, 'float32', [1]]}, [4]), [b'abcd', b'efgh']),
    'part index out of range': (header_of({'$t': [1, 'float32', [1]]}, [4]), [b'abcd']),
    'tensor part too short': (header_of({'$t': [0, 'float32', [2]]}, [4]), [b'abcd']),
    'tensor part too long': (header_of({'$t': [0, 'int16', [1]]}, [4]), [b'abcd']),
    'array part size': (header_of({'$a': [0, '<f8', [1]]}, [4]), [b'abcd']),
    'big-endian array': (header_of({'$a': [0, '>f8', [1]]}, [8]), [b'abcdefgh']),
    'big-endian scalar': (header_of({'$s': ['>i4', 1]}), []),
    'negative dim': (header_of({'$t': [0, 'float32', [-1]]}, [4]), [b'abcd']),
    'float dim': (header_of({'$t': [0, 'float32', [1.0]]}, [4]), [b'abcd']),
    'bad descriptor': (header_of({'$t': [0, 'float32']}, [4]), [b'abcd']),
    'unknown tag': (header_of({'$z': 1}), []),
    'two-key node': (header_of({'a': 1, 'b': 2}), []),
    'unknown torch dtype': (header_of({'$t': [0, 'float8', [1]]}, [1]), [b'a']),
    'unknown numpy dtype': (header_of({'$a': [0, 'qq7', [1]]}, [1]), [b'a']),
    'object dtype': (header_of({'$a': [0, '|O', [1]]}, [8]), [b'abcdefgh']),
    'structured dtype': (header_of({'$a': [0, 'V4', [1]]}, [4]), [b'abcd']),
    'object scalar': (header_of({'$s': ['|O', 1]}), []),
    'string scalar': (header_of({'$s': ['S3', 'abc']}), []),
    'bad dict key': (header_of({'$d': [[1.5, 2]]}), []),
    'bool dict key': (header_of({'$d': [[True, 2]]}), []),  # the encoder pickles a dict with one: a later reply
    'repeated dict key': (header_of({'$d': [['a', 1], ['a', 2]]}), []),  # holding it could not go out
    'bad dict node': (header_of({'$d': 5}), []),
    'bad tuple node': (header_of({'$u': 5}), []),
    'bad slice node': (header_of({'$l': [1, 2]}), []),
    'pickled leaf': (header_of({'$p': 0}, [1]), [b'.']),
}


@pytest.mark.parametrize('case', sorted(MALFORMED))
def test_codec_malformed_messages_raise_codec_error(case):
    header, parts = MALFORMED[case]
    with pytest.raises(CodecError) as e:
        decode(header, parts)
    assert isinstance(e.value, ValueError)


HOSTILE_NON_CODEC = {
    'deep nesting': (b'{"v":1,"n":[],"body":' + b'[' * 100000 + b']' * 100000 + b'}', []),
    'complex scalar not a pair': (header_of({'$s': ['<c16', 5]}), []),
    'int scalar out of range': (header_of({'$s': ['|i1', 1000]}), []),
    'int scalar given as an out-of-range float': (header_of({'$s': ['|i1', 300.0]}), []),  # (numpy 1.x wrapped it)
    'torch dtype not a str': (header_of({'$t': [0, ['float32'], [1]]}, [4]), [b'abcd']),
    'bool dim': (header_of({'$t': [0, 'float32', [True]]}, [4]), [b'abcd']),
}


@pytest.mark.parametrize('case', sorted(HOSTILE_NON_CODEC))
def test_codec_hostile_headers_raise_codec_error(case):
    header, parts = HOSTILE_NON_CODEC[case]
    with pytest.raises(CodecError):
        decode(header, parts)


# ================================================================================================ 2. ManagerCore
def test_manager_push_sample_update():
    core = make_core()
    torch.manual_seed(0)
    rows = torch.randn(3, 2)
    r = ok(core.handle(W, req('push', data={'obs': rows}, batched=True)))
    assert r == {'stored': 3, 'score': {}}
    r = ok(core.handle(W, req('push', rid=1, data={'obs': torch.tensor([7.0, 8.0])})))
    assert r['stored'] == 1 and ok(core.handle(W, req('count'))) == 4
    expected = torch.cat([rows, torch.tensor([[7.0, 8.0]])])
    sample = ok(core.handle(W, req('sample', size=4)))
    got = sample['obs'][torch.argsort(sample['replay_unique_id'])]
    assert torch.equal(got, expected)  # equal priorities + stratified draw: every item exactly once
    info = {
        'replay_unique_id': sample['replay_unique_id'],
        'replay_buffer_idx': sample['replay_buffer_idx'],
        'priority': torch.tensor([1.0, 2.0, 3.0, 4.0]),
    }
    assert ok(core.handle(W, req('update', info=info))) == {'updated': 4, 'stale': 0}
    again = ok(core.handle(W, req('sample', size=4)))
    by_uid = dict(zip(again['replay_unique_id'].tolist(), again['priority'].tolist()))
    for uid, p in zip(sample['replay_unique_id'].tolist(), [1.0, 2.0, 3.0, 4.0]):
        if uid in by_uid:
            assert by_uid[uid] == pytest.approx(p + 1e-5)
    assert core.counters['push_requests'] == 2 and core.counters['pushed_items'] == 4
    assert core.counters['sample_requests'] == 2 and core.per_sender[W]['requests'] == 6
    stats = ok(core.handle(W, req('stats')))
    assert stats['manager/push_requests'] == 2 and stats['manager/exited'] == 0


BAD_REQUESTS = {
    'unknown op': (req('frobnicate'), 'ValueError'),
    'not a dict': (['push', {'data': 1}], 'ValueError'),
    'op not a str': ({'op': 5, 'id': 0}, 'ValueError'),
    'wrong shard': (req('push', shard=1, data={'obs': torch.zeros(2)}), 'ValueError'),
    'args not a dict': ({'op': 'push', 'id': 0, 'shard': 0, 'args': [1]}, 'TypeError'),
    'unknown arg': (req('push', data={'obs': torch.zeros(2)}, bogus=1), 'TypeError'),
    'push of a str field': (req('push', data={'obs': 'abc'}), 'TypeError'),
    'push of a wrong shape': (req('push', data={'obs': torch.zeros(5)}), 'ValueError'),
    'push of an int': (req('push', data=5), 'TypeError'),
    'sample size 0': (req('sample', size=0), 'ValueError'),
    'sample with timeout': (req('sample', size=1, kwargs={'timeout': 1.0}), 'ValueError'),
    'update nan priority': (
        req('update', info={'replay_unique_id': [0], 'replay_buffer_idx': [0], 'priority': [float('nan')]}),
        'ValueError',
    ),
    'model version not int': (req('model_version', version='3'), 'TypeError'),
    'baseline_sync nan': (req('baseline_sync', value=float('nan')), 'ValueError'),
}


@pytest.mark.parametrize('case', sorted(BAD_REQUESTS))
def test_manager_bad_requests_get_error_replies(case):
    core = make_core()
    ok(core.handle(W, req('push', data={'obs': torch.tensor([1.0, 2.0])})))
    before = copy.deepcopy(core.buffer.state_dict())
    request, error = BAD_REQUESTS[case]
    reply = core.handle(W, request)
    assert reply['ok'] is False and reply['error'] == error and reply['message'], reply
    assert reply['id'] == (request.get('id') if isinstance(request, dict) else None)
    assert core.counters['errors'] == 1
    assert core.buffer.count() == 1
    after = core.buffer.state_dict()
    assert_same(before['storage'], after['storage'])
    # still serving
    assert ok(core.handle(W, req('push', rid=9, data={'obs': torch.tensor([3.0, 4.0])})))['stored'] == 1
    assert torch.equal(stored_obs(core.buffer), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))


def test_manager_ping_and_exit():
    core = make_core()
    assert core.handle(W, {'op': 'ping'}) is None
    assert core.per_sender[W]['requests'] == 1
    r = core.handle(W, req('exit', rid=4))
    assert r == {'id': 4, 'ok': True, 'result': {'exited': 1}, 'final': True}
    assert core.handle(W, req('exit'))['result'] == {'exited': 1}  # a set: the same sender once
    assert core.handle('worker-1', req('exit'))['result'] == {'exited': 2}
    assert core.liveness.exited == {W, 'worker-1'}
    assert 'final' not in core.handle(W, req('count'))
    assert core.summary()['exited'] == sorted([W, 'worker-1'])


@pytest.mark.parametrize('hook', [score_hook, 'test_distributed_unit:score_hook'], ids=['callable', 'string'])
def test_manager_scoring_function(hook):
    if isinstance(hook, str):
        assert resolve_callable(hook, 'scoring_function') is score_hook
    core = make_core(storage='list', scoring_function=hook, baseline_strategy='ema')
    r = ok(core.handle(W, req('push', data=[item(3), item(5)])))
    assert r == {'stored': 2, 'score': {'n_in': 2, 'sender': W, 'count_after': 2, 'baseline_log_reward': 3.0}}
    r = ok(core.handle('w9', req('push', data=item(1))))
    assert r['score'] == {'n_in': 1, 'sender': 'w9', 'count_after': 3, 'baseline_log_reward': pytest.approx(2.8)}


@pytest.mark.parametrize('hook', [bad_score_hook, 'test_distributed_unit:bad_score_hook'], ids=['callable', 'string'])
def test_manager_scoring_function_must_return_dict(hook):
    core = make_core(storage='list', scoring_function=hook)
    reply = core.handle(W, req('push', data=item(1)))
    assert reply['ok'] is False and reply['error'] == 'TypeError' and 'dict' in reply['message']
    assert core.handle(W, req('count'))['ok']


def test_manager_metadata_function():
    core = make_core(storage='list', metadata_function='test_distributed_unit:meta_hook')
    ok(core.handle(W, req('push', data=item(1))))
    md = ok(core.handle(W, req('metadata')))
    assert md == {
        'model_version': -1,
        'session_id': '',
        'count': 1,
        'buffer_type': 'AdvancedReplayBuffer',
        'shard': 0,
        'n_modes_found': 7,
        'seen': 1,
    }
    core = make_core(storage='list', metadata_function=lambda buffer: 'nope')
    reply = core.handle(W, req('metadata'))
    assert reply['ok'] is False and reply['error'] == 'TypeError'


def _gfn_push(core, log_rewards, offset=0.0):
    return ok(core.handle(W, req('push', data=gfn_batch(log_rewards, offset), batched=True)))


@pytest.mark.parametrize('strategy', ['min', 'percentile'])
def test_manager_baseline_full_buffer(strategy):
    q = 0.5
    core = make_core('gfn', size=6, baseline_strategy=strategy, baseline_percentile=q, baseline_ema_alpha=0.5)
    r = _gfn_push(core, [1.0, NINF])  # not full: the EMA of batch minima (finite only) -> 1.0
    assert r['score'] == {'baseline_log_reward': 1.0}
    r = _gfn_push(core, [0.0, 2.0, 3.0, 4.0], offset=10)  # now full: 1, -inf, 0, 2, 3, 4
    assert core.buffer.count() == 6
    stored = core.buffer.log_rewards()
    assert np.isneginf(stored).sum() == 1
    finite = np.sort(stored[np.isfinite(stored)])
    assert finite.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    expected = finite.min() if strategy == 'min' else np.quantile(finite, q)
    assert r['score']['baseline_log_reward'] == expected
    if strategy == 'percentile':
        assert expected == 2.0  # torchgfn's check: values 0..4, q = 0.5 -> 2.0
    r = _gfn_push(core, [-1.0, 2.5], offset=20)  # keep-best: -inf leaves, -1 is not admitted
    stored = np.sort(core.buffer.log_rewards())
    assert stored.tolist() == [0.0, 1.0, 2.0, 2.5, 3.0, 4.0]
    expected = stored.min() if strategy == 'min' else np.quantile(stored, q)
    assert r['score']['baseline_log_reward'] == expected == (0.0 if strategy == 'min' else 2.25)
    assert ok(core.handle(W, req('metadata')))['baseline_log_reward'] == r['score']['baseline_log_reward']


def test_manager_baseline_percentile_values():
    rng = np.random.default_rng(3)
    vals = rng.normal(size=20).astype(np.float32)
    for q in (0.0, 0.1, 0.37, 1.0):
        core = make_core('gfn', size=20, baseline_strategy='percentile', baseline_percentile=q)
        r = _gfn_push(core, vals.tolist())
        assert r['score']['baseline_log_reward'] == pytest.approx(np.quantile(vals.astype(np.float64), q), rel=1e-12)


@pytest.mark.parametrize('strategy', ['ema', 'min', 'percentile'])
def test_manager_baseline_ema(strategy):
    # 'ema' always; 'min' / 'percentile' while the buffer is not full (capacity 100)
    alpha = 0.25
    core = make_core('gfn', size=100, baseline_strategy=strategy, baseline_ema_alpha=alpha)
    batches = [[3.0, 5.0], [NINF, 1.0, 2.0], [NINF], [4.0], [NINF, 10.0, 0.5]]
    ema, expected = None, []
    for b in batches:
        finite = [x for x in b if math.isfinite(x)]
        if finite:
            m = min(finite)
            ema = m if ema is None else alpha * m + (1 - alpha) * ema
        expected.append(ema)
    assert expected == [3.0, 2.5, 2.5, 2.875, 2.28125]
    got = [_gfn_push(core, b, offset=10 * i)['score']['baseline_log_reward'] for i, b in enumerate(batches)]
    assert got == expected


def test_manager_baseline_ema_on_full_buffer_ignores_stored():
    core = make_core('gfn', size=2, baseline_strategy='ema', baseline_ema_alpha=0.5)
    assert _gfn_push(core, [5.0, 6.0])['score']['baseline_log_reward'] == 5.0  # full, but 'ema'
    assert _gfn_push(core, [1.0], offset=5)['score']['baseline_log_reward'] == 3.0


def test_manager_no_baseline_without_rewards_or_strategy():
    core = make_core('advanced', storage='list', baseline_strategy='min')
    assert ok(core.handle(W, req('push', data={'obs': torch.zeros(2)})))['score'] == {}  # no log-reward yet
    assert ok(core.handle(W, req('push', data={'obs': torch.zeros(2), 'log_reward': -2.0})))['score'] == {
        'baseline_log_reward': -2.0
    }  # an 'advanced' buffer keeps no log-rewards: EMA
    core = make_core('gfn', size=2)
    assert _gfn_push(core, [1.0, 2.0])['score'] == {}
    assert 'baseline_log_reward' not in ok(core.handle(W, req('metadata')))


@pytest.mark.parametrize('strategy', ['min', 'percentile', 'ema'])
def test_manager_baseline_sync_overrides(strategy):
    core = make_core('gfn', size=4, baseline_strategy=strategy)
    _gfn_push(core, [1.0, 2.0, 3.0, 4.0])  # full
    assert ok(core.handle(W, req('baseline_sync', value=-7.5))) is None
    for i in range(3):
        assert _gfn_push(core, [10.0 + i], offset=5 * i)['score']['baseline_log_reward'] == -7.5
    assert ok(core.handle(W, req('metadata')))['baseline_log_reward'] == -7.5


def test_manager_version_gating():
    core = make_core(storage='list', max_version_lag=2)
    r = ok(core.handle('learner', req('model_version', version=5, session_id='s1')))
    assert r == {'model_version': 5, 'session_id': 's1', 'cleared': 0}
    push = lambda v, s='s1', data=None: ok(
        core.handle(W, req('push', data=data or item(v), model_version=v, session_id=s))
    )
    assert push(3) == {'stored': 1, 'score': {}}  # lag 2: accepted
    assert push(5)['stored'] == 1
    assert push(2) == {'stored': 0, 'rejected_stale': 1, 'score': {}}  # lag 3
    assert push(1, data=[item(0), item(1)]) == {'stored': 0, 'rejected_stale': 2, 'score': {}}
    assert push(5, s='s-other')['rejected_stale'] == 1  # another session
    assert core.counters['rejected_stale'] == 4 and core.buffer.count() == 2
    assert ok(core.handle(W, req('push', data=item(9))))['stored'] == 1  # unstamped pushes are not gated
    assert ok(core.handle('learner', req('model_version', version=6, session_id='s1')))['cleared'] == 0
    assert core.buffer.count() == 3
    r = ok(core.handle('learner', req('model_version', version=0, session_id='s2')))
    assert r == {'model_version': 0, 'session_id': 's2', 'cleared': 3}
    assert core.buffer.count() == 0
    assert push(5, s='s1')['rejected_stale'] == 1
    assert push(0, s='s2')['stored'] == 1
    assert ok(core.handle(W, req('metadata')))['model_version'] == 0


def test_manager_no_version_gating_by_default():
    core = make_core(storage='list')
    ok(core.handle('learner', req('model_version', version=50, session_id='s1')))
    assert ok(core.handle(W, req('push', data=item(1), model_version=0, session_id='zzz')))['stored'] == 1
    assert ok(core.handle('learner', req('model_version', version=51, session_id='s2')))['cleared'] == 0
    assert core.buffer.count() == 1


def test_manager_max_reuse():
    core = make_core(max_reuse=2)
    assert core.buffer.cfg.max_use == 2
    ok(core.handle(W, req('push', data={'obs': torch.tensor([1.0, 2.0])})))
    s1 = ok(core.handle(W, req('sample', size=1)))
    assert s1['use'].tolist() == [1] and core.buffer.count() == 1
    s2 = ok(core.handle(W, req('sample', size=1)))
    assert s2['use'].tolist() == [2] and torch.equal(s2['obs'], torch.tensor([[1.0, 2.0]]))
    assert core.buffer.count() == 0 and ok(core.handle(W, req('count'))) == 0
    assert ok(core.handle(W, req('sample', size=1))) is None


class _NoUseBuffer(NaiveReplayBuffer):
    config = {k: v for k, v in NaiveReplayBuffer.config.items() if k != 'max_use'}
    config['type'] = 'test_no_max_use'


@pytest.fixture
def no_max_use_type():
    """A buffer type without ``max_use``, registered for one test (registered at import, it joined other modules'
    tests that are parametrized over the registry when this module was collected first)."""
    BUFFER_REGISTRY.register('test_no_max_use')(_NoUseBuffer)
    yield 'test_no_max_use'
    BUFFER_REGISTRY.pop('test_no_max_use', None)


def test_manager_max_reuse_needs_max_use(no_max_use_type):
    with pytest.raises(ValueError, match=r"distributed\.max_reuse"):
        build_manager_buffer(make_cfg('test_no_max_use', max_reuse=2))


def test_manager_max_reuse_on_naive_removes_after_reuse():
    buf = build_manager_buffer(make_cfg('naive', max_reuse=2))[0]
    buf.push([{'x': torch.tensor([float(i)])} for i in range(4)])
    first = buf.sample(4)['x'].flatten().tolist()
    assert sorted(first) == [0.0, 1.0, 2.0, 3.0] and buf.count() == 4  # drawn once each: all stay
    second = buf.sample(4)['x'].flatten().tolist()
    assert sorted(second) == [0.0, 1.0, 2.0, 3.0]
    assert buf.count() == 0 and buf.stats()['removed_by_use'] == 4 and buf.sample(1) is None


@pytest.mark.parametrize('type_', ['advanced', 'gfn'])
def test_manager_shutdown_checkpoint(tmp_path, type_):
    path = str(tmp_path / 'ckpt.pt')
    core = make_core(type_, checkpoint_path=path)
    if type_ == 'gfn':
        _gfn_push(core, [0.5, 1.5, NINF])
    else:
        ok(
            core.handle(
                W,
                req('push', data={'obs': torch.randn(3, 2, generator=torch.Generator().manual_seed(0))}, batched=True),
            )
        )
    assert core.shutdown() == path
    fresh = make_core(type_).buffer
    fresh.load_data(path)
    assert fresh.count() == 3
    assert_same(core.buffer.state_dict(), fresh.state_dict())
    assert make_core(type_).shutdown() is None
    assert list(tmp_path.iterdir()) == [tmp_path / 'ckpt.pt']


# ================================================================================================ 3. RemoteBuffer
def test_remote_freq_batches_concatenated_in_order():
    rb, core, ch = make_remote(remote_buffer_freq=3)
    gen = torch.Generator().manual_seed(0)
    batches = [{'obs': torch.randn(n, 2, generator=gen)} for n in (2, 1, 3, 2)]
    assert rb.extend(batches[0]) == 2 and rb.extend(batches[1]) == 1
    assert ch.ops() == [] and core.buffer.count() == 0
    assert rb.extend(batches[2]) == 3
    assert ch.ops() == ['push'] and core.counters['push_requests'] == 1
    assert torch.equal(stored_obs(core.buffer), torch.cat([b['obs'] for b in batches[:3]]))
    assert ch.requests[0]['args']['batched'] is True
    assert rb.pushes.last_score == {'stored': 6}
    rb.extend(batches[3])
    assert core.counters['push_requests'] == 1
    rb.flush()
    assert core.counters['push_requests'] == 2
    assert torch.equal(stored_obs(core.buffer), torch.cat([b['obs'] for b in batches]))
    assert rb.count() == 8


def test_remote_freq_keeps_what_a_pending_push_held_when_it_was_made():
    """A collector refills one array for every step: with remote_buffer_freq the pushes waiting for a later call
    store what they held at their call, as a local push does (they were all the last step's data)."""
    rb, core, ch = make_remote(remote_buffer_freq=4)
    step = {'obs': torch.zeros(2)}
    for i in range(4):
        step['obs'].fill_(float(i))
        rb.push(step)
    assert core.counters['push_requests'] == 1
    assert stored_obs(core.buffer)[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_remote_freq_single_items_and_close_flushes():
    rb, core, ch = make_remote(storage='list', remote_buffer_freq=3)
    for i in range(5):
        rb.push({'i': i})
    assert core.counters['push_requests'] == 1 and core.counters['pushed_items'] == 3
    assert ch.requests[0]['args']['data'] == [{'i': 0}, {'i': 1}, {'i': 2}]
    rb.close()  # sends the 2 pending items, then EXIT
    assert ch.ops() == ['push', 'push', 'exit']
    assert core.buffer.state_dict()['storage']['items'] == [{'i': i} for i in range(5)]


def test_remote_baseline_filtering_with_refresh():
    rb, core, ch = make_remote(
        'gfn', size=100, baseline_strategy='min', baseline_filtering=True, baseline_refresh_after=2
    )
    rb.baseline_sync(2.0)
    assert rb.pushes.baseline_log_reward == NINF  # learned from push replies only
    rb.push(gfn_batch([0.0, 5.0]))  # no baseline yet: everything is sent
    assert core.buffer.count() == 2 and rb.pushes.baseline_log_reward == 2.0
    assert rb.pushes.filter_stats == dict(total=0, kept=0, skipped_sends=0, sends=1)

    b = gfn_batch([1.0, 3.0, 0.5, 4.0], offset=100)  # partial: only rows 1 and 3 go
    rb.push(b)
    sent = ch.requests[-1]['args']['data']
    assert torch.equal(sent['log_reward'], torch.tensor([3.0, 4.0]))
    assert torch.equal(sent['state'], b['state'][[1, 3]])
    assert core.buffer.count() == 4
    assert rb.pushes.filter_stats == dict(total=4, kept=2, skipped_sends=0, sends=2)

    n_requests = len(ch.requests)
    rb.push(gfn_batch([0.0, 1.0], offset=200))  # fully filtered: skipped
    assert len(ch.requests) == n_requests and core.buffer.count() == 4
    assert rb.pushes.filter_stats == dict(total=6, kept=2, skipped_sends=1, sends=2)
    rb.push(gfn_batch([1.5, 0.1], offset=300))  # 2nd in a row: refresh, sent whole
    assert len(ch.requests) == n_requests + 1 and core.buffer.count() == 6
    assert torch.equal(ch.requests[-1]['args']['data']['log_reward'], torch.tensor([1.5, 0.1]))
    assert rb.pushes.filter_stats == dict(total=8, kept=2, skipped_sends=2, sends=3)

    rb.push(gfn_batch([0.0], offset=400))  # the counter restarted: skipped again
    assert core.buffer.count() == 6 and rb.pushes.filter_stats['skipped_sends'] == 3
    rb.push(gfn_batch([9.0, 1.0], offset=500))  # partial resets the counter
    rb.push(gfn_batch([0.0], offset=600))
    assert core.buffer.count() == 7 and rb.pushes.filter_stats == dict(total=12, kept=3, skipped_sends=4, sends=4)
    assert core.counters['push_requests'] == 4


def test_remote_baseline_filtering_without_refresh_never_sends_filtered():
    rb, core, ch = make_remote('gfn', size=100, baseline_strategy='ema', baseline_filtering=True)
    rb.push(gfn_batch([3.0, 4.0]))
    assert rb.pushes.baseline_log_reward == 3.0
    for i in range(4):
        rb.push(gfn_batch([1.0], offset=10 * i))
    stats = rb.pushes.filter_stats
    assert core.buffer.count() == 2 and stats['skipped_sends'] == 4 and stats['sends'] == 1


def test_baseline_filtering_sends_a_nan_log_reward_on_for_the_buffer_to_refuse():
    """A NaN log-reward compared as below the baseline: the row was dropped without a word (an all-NaN batch was
    skipped), where a local buffer refuses it. It goes on, and the manager's buffer refuses the push by name."""
    rb, core, ch = make_remote('gfn', size=100, baseline_strategy='min', baseline_filtering=True)
    rb.push(gfn_batch([1.0, 2.0]))
    assert rb.pushes.baseline_log_reward == 1.0
    before = core.buffer.state_dict()
    for bad in ([5.0, float('nan')], [float('nan')]):
        with pytest.raises(ValueError, match='must be finite or -inf'):
            rb.push(gfn_batch(bad, offset=100))
        assert_same(core.buffer.state_dict(), before)


def test_remote_async_score():
    rb, core, ch = make_remote(storage='list', async_score=True, scoring_function=score_hook)
    rb.push(item(1))
    assert rb.pushes.last_score is None
    assert core.buffer.count() == 1  # the loopback served it; the reply waits
    rb.push([item(2), item(3)])
    assert rb.pushes.last_score == {'n_in': 1, 'sender': W, 'count_after': 1, 'stored': 1}
    assert rb.drain_pending_score(timeout=1.0) == {'n_in': 2, 'sender': W, 'count_after': 3, 'stored': 2}
    assert rb.pushes.last_score['count_after'] == 3
    assert rb.drain_pending_score(timeout=1.0) is None
    rb.push(item(4))
    assert rb.pushes.last_score['count_after'] == 3
    rb.close()  # collects the outstanding score before EXIT
    assert rb.pushes.last_score['count_after'] == 4 and ch.ops()[-1] == 'exit'


def test_remote_sync_score():
    rb, core, ch = make_remote(storage='list', scoring_function=score_hook)
    rb.push(item(1))
    assert rb.pushes.last_score == {'n_in': 1, 'sender': W, 'count_after': 1, 'stored': 1}
    assert rb.drain_pending_score(timeout=1.0) is None


@pytest.mark.parametrize('scoring_only', [True, False])
def test_remote_scoring_only(scoring_only):
    rb, core, ch = make_remote(
        'gfn', size=10, scoring_only=scoring_only, local_buffer=True, gfn_extra=dict(condition_key='cond')
    )
    b = gfn_batch([1.0, 2.0])
    b['cond'] = torch.tensor([[0.0], [1.0]])
    b['traj'] = torch.arange(6.0).reshape(2, 3)
    rb.push(b)
    sent = ch.requests[-1]['args']['data']
    keys = {'state', 'log_reward', 'cond'} | (set() if scoring_only else {'traj'})
    assert set(sent) == keys
    for k in keys:
        assert torch.equal(sent[k], b[k])
    assert 'traj' in rb.local.sample(2)  # the local copy keeps everything
    assert ('traj' in core.buffer.sample(2)) is not scoring_only


def test_remote_local_buffer_mode():
    rb, core, ch = make_remote(local_buffer=True)
    for i in range(3):
        rb.push({'obs': torch.full((2,), float(i))})
    assert core.buffer.count() == 3 and rb.local.count() == 3
    core.buffer.clear()  # the manager is a write-only pool: sample / count come from the local copy
    n = len(ch.requests)
    assert rb.count() == 3
    s = rb.sample(3)
    assert s is not None and sorted(s['obs'][:, 0].tolist()) == [0.0, 1.0, 2.0]
    assert (
        rb.update(
            {
                'replay_unique_id': s['replay_unique_id'],
                'replay_buffer_idx': s['replay_buffer_idx'],
                'priority': torch.ones(3),
            }
        )['updated']
        == 3
    )
    assert len(ch.requests) == n  # nothing asked of the manager


def test_remote_sample_update_through_manager():
    rb, core, ch = make_remote()
    rb.extend({'obs': torch.arange(6.0).reshape(3, 2)})
    s = rb.sample(3)
    assert torch.equal(s['obs'][torch.argsort(s['replay_unique_id'])], torch.arange(6.0).reshape(3, 2))
    r = rb.update(
        {
            'replay_unique_id': s['replay_unique_id'],
            'replay_buffer_idx': s['replay_buffer_idx'],
            'priority': torch.tensor([5.0, 6.0, 7.0]),
        }
    )
    assert r == {'updated': 3, 'stale': 0}
    assert rb.stats()['manager/sample_requests'] == 1


def test_remote_sample_timeout():
    """A worker's ``sample(timeout=)`` waits its timeout, then raises; meanwhile it re-asks the manager (which never
    blocks, nor sees the timeout) until a batch comes: here the manager's buffer fills at the third ask."""
    rb, core, ch = make_remote()
    assert rb.sample(2) is None
    t0 = time.monotonic()
    with pytest.raises(SampleTimeoutError):
        rb.sample(2, timeout=0.2)
    assert time.monotonic() - t0 >= 0.2  # waited its timeout
    assert all('timeout' not in r['args']['kwargs'] for r in ch.requests)
    asked = ch.ops().count('sample')
    handle = core.handle

    def filling(sender, request):
        if request.get('op') == 'sample' and ch.ops().count('sample') == asked + 3:
            core.buffer.push([item(i) for i in range(4)])
        return handle(sender, request)

    core.handle = filling
    assert rb.sample(2, timeout=OUTER) is not None
    assert ch.ops().count('sample') == asked + 3  # asked, and asked again twice, then drew


def test_remote_sample_and_why_not_sample_count_refusals_as_a_local_buffer_does():
    """A timed-out ``sample(timeout=)`` counts no refused sample however often it asked (a local buffer's counts
    none), one that ends in a batch neither, a plain refused ``sample`` one; ``why_not_sample`` answers as the
    manager's buffer does, waits with ``timeout`` and counts nothing."""
    rb, core, ch = make_remote()
    local = create_buffer(without(make_cfg(), 'distributed'))
    for buf in (rb, local):
        with pytest.raises(SampleTimeoutError):
            buf.sample(2, timeout=0.2)
        assert buf.why_not_sample(2) != ''
        with pytest.raises(SampleTimeoutError):
            buf.why_not_sample(2, timeout=0.1)
        assert buf.stats()['refused_sample'] == 0
        assert buf.sample(2) is None
        assert buf.stats()['refused_sample'] == 1
        buf.extend({'obs': torch.arange(6.0).reshape(3, 2)})
        assert buf.why_not_sample(2) == '' and buf.why_not_sample(2, timeout=0.1) == ''
        assert buf.sample(2, timeout=0.5)['obs'].shape == (2, 2)
        assert buf.stats()['refused_sample'] == 1
    assert rb.why_not_sample(2) == local.why_not_sample(2) and rb.why_not_sample(9) == local.why_not_sample(9)
    assert ch.ops().count('sample') > 3  # (the timed-out sample re-asked: each poll was a sample request)
    reply = core.handle(W, {'op': 'sample', 'id': 1, 'args': {'size': 1, 'poll': 1}})
    assert reply['error'] == 'TypeError' and "'poll' must be a bool, got int" in reply['message']


def test_remote_sample_with_timeout_judges_the_whole_request_as_the_manager_buffer_does():
    """A worker's ``sample(n, timeout=t, **kwargs)`` asks the manager's buffer the whole request: ``replace=True``
    and ``unroll_len`` draw at once where the buffer can; an argument the buffer refuses raises at once instead
    of waiting out ``t``; a request that stays impossible (``sample_range``) times out counting no refused sample;
    ``timeout=0`` draws when it can, as a local buffer does."""
    rb, core, ch = make_remote('naive')
    rb.extend({'obs': torch.arange(6.0).reshape(3, 2)})
    assert rb.sample(8, replace=True, timeout=0.5)['obs'].shape == (8, 2)
    assert rb.sample(2, timeout=0)['obs'].shape == (2, 2) and rb.why_not_sample(2, timeout=0) == ''
    asks = ch.ops().count('sample')
    with pytest.raises(TypeError, match="^manager: replace must be a bool, got str 'yes'"):
        rb.sample(9, timeout=5.0, replace='yes')
    assert ch.ops().count('sample') == asks + 1  # refused at the first ask, not asked again until the timeout
    with pytest.raises(SampleTimeoutError):
        rb.sample(2, sample_range=slice(0, 1), timeout=0.2)
    assert rb.stats()['refused_sample'] == 0
    cfg = EasyDict(type='episode', replay_buffer_size=16, seed=0, distributed=dict(backend='torch'))
    buf, dcfg, key = build_manager_buffer(cfg)
    ch = Loopback(ManagerCore(buf, dcfg, key))
    rb = worker_buffer(get_buffer_cls(cfg), EasyDict(without(cfg, 'distributed')), dcfg, ch)
    for e in range(2):
        rb.push([[{'obs': torch.full((2,), float(10 * e + t)), 'done': t == 9} for t in range(10)]])  # one episode
    assert rb.sample(5, unroll_len=2, timeout=0.5) is not None


def test_a_remote_sample_refuses_n_samples_where_its_type_does_not_take_it_as_the_local_buffer_does():
    """``n_samples``, torchgfn's name of the size, is for the GFlowNet buffers: a worker's ``sample(n_samples=2)``
    on naive drew a batch where the local buffer raises ``TypeError``; nothing is drawn now."""
    rb, core, ch = make_remote('naive')
    local = create_buffer(without(make_cfg('naive', 16, 'tensor'), 'distributed'))
    for b in (rb, local):
        b.extend({'obs': torch.arange(6.0).reshape(3, 2)})
        with pytest.raises(TypeError, match="unexpected keyword argument 'n_samples'"):
            b.sample(n_samples=2)
        assert b.stats()['sample_calls'] == 0


def test_remote_why_not_sample_timeout_on_a_silent_manager_is_a_sample_timeout():
    rb, core, ch = make_remote('naive')

    def silent(ticket, op, deadline=None):  # a busy or frozen manager: the poll's own deadline runs out
        time.sleep(max(0.0, min(deadline - time.monotonic(), 1.0)))
        raise ManagerTimeoutError(f'no reply to {op!r} in time')

    ch.result = silent
    for call in (rb.sample, rb.why_not_sample):
        with pytest.raises(SampleTimeoutError, match='did not answer the last poll in time'):
            call(4, timeout=0.2)


def test_manager_checks_cur_learner_iter_before_the_version_lag_replaces_it():
    core = make_core('naive', max_version_lag=2)
    ok(core.handle(W, req('push', data=item(0))))
    ok(core.handle(W, req('model_version', version=5)))
    for op, args in (
        ('why_not_sample', dict(cur_learner_iter=-1.0)),
        ('sample', dict(kwargs={'cur_learner_iter': -1.0})),
    ):
        reply = core.handle(W, req(op, size=1, **args))
        assert reply['error'] == 'TypeError' and 'cur_learner_iter must be an int, got float' in reply['message']


def test_remote_manager_exceptions_are_reraised():
    rb, core, ch = make_remote()
    with pytest.raises(ValueError, match='^manager: .*sample size must be > 0'):
        rb.sample(0)
    with pytest.raises(TypeError, match='^manager: '):
        rb.push({'obs': 'abc'})
    rb.push({'obs': torch.zeros(2)})
    with pytest.raises(ValueError, match='^manager: '):
        rb.push({'obs': torch.zeros(3)})
    with pytest.raises(ValueError, match='^manager: '):
        rb.baseline_sync(float('nan'))
    assert rb.count() == 1 and core.counters["errors"] == 4


def test_remote_close():
    rb, core, ch = make_remote()
    rb.push({'obs': torch.zeros(2)})
    rb.close()
    assert ch.ops() == ['push', 'exit'] and core.liveness.exited == {W} and ch.closed == 1
    rb.close()
    assert ch.ops() == ['push', 'exit'] and ch.closed == 1
    for call in (
        lambda: rb.push({'obs': torch.zeros(2)}),
        lambda: rb.sample(1),
        rb.count,
        rb.stats,
        lambda: rb.update({}),
        rb.metadata,
        rb.clear,
    ):
        with pytest.raises(RuntimeError, match='closed'):
            call()
    assert len(ch.requests) == 2


def test_remote_model_version_stamps_pushes():
    rb, core, ch = make_remote(storage='list', max_version_lag=1)
    assert rb.update_model_version(4, session_id='s') == {'model_version': 4, 'session_id': 's', 'cleared': 0}
    rb.push(item(0))
    assert ch.requests[-1]['args']['model_version'] == 4 and rb.pushes.last_score['stored'] == 1
    rb.set_model_version(2, 's')
    rb.push(item(1))
    assert rb.pushes.last_score == {'stored': 0, 'rejected_stale': 1}
    assert rb.metadata()['model_version'] == 4 and core.buffer.count() == 1


@pytest.mark.parametrize(
    'version, session, error',
    [
        (5, torch.zeros(3), ValueError),  # a tensor session compared ambiguously in every later call
        (5, True, ValueError),
        (5, 'x' * 200, ValueError),
        (2**61, 's', ValueError),  # the manager samples with its version as the learner iteration (< 2**60)
        (-2, 's', ValueError),
        (True, 's', TypeError),
        ('5', 's', TypeError),
    ],
)
def test_a_bad_model_version_or_session_is_refused_and_changes_nothing(version, session, error):
    rb, core, ch = make_remote(storage='list', max_version_lag=2)
    rb.update_model_version(4, session_id='s')
    rb.push(item(0))
    before = core.buffer.state_dict()
    with pytest.raises(error, match='model version|session_id'):
        rb.update_model_version(version, session)  # refused on the worker, before anything is sent
    with pytest.raises(error):
        rb.set_model_version(version, session)
    # a peer that sends it anyway gets an error reply, and the manager's version and session stay
    reply = core.handle(W, req('model_version', version=version, session_id=session))
    assert not reply['ok'] and ('model version' in reply['message'] or 'session_id' in reply['message'])
    reply = core.handle(W, req('push', data=item(1), model_version=version, session_id=session))
    assert not reply['ok']
    assert (core.model_version, core.session_id) == (4, 's')
    assert_same(core.buffer.state_dict(), before)
    # later calls work: a stamped push, a sample (with the version as the learner iteration), a new session
    rb.push(item(2))
    assert rb.pushes.last_score['stored'] == 1 and len(rb.sample(2)) == 2
    assert rb.update_model_version(np.int64(5), 't') == {'model_version': 5, 'session_id': 't', 'cleared': 2}
    # whole numbers and int sessions, as int() took them before
    assert rb.update_model_version(6.0, 7)['model_version'] == 6 and rb.metadata()['session_id'] == 7
    assert rb.update_model_version(torch.tensor(8), 7)['model_version'] == 8


@pytest.mark.parametrize('session', [0, ''])
def test_session_0_and_the_empty_session_gate_pushes_as_any_other(session):
    """0 and '' are sessions: with one set, pushes of another session are refused and a new session clears the
    data of the old one (as for session 7)."""
    rb, core, ch = make_remote(storage='list', max_version_lag=2)
    rb.update_model_version(5, session_id=session)
    rb.push(item(0))
    rb.set_model_version(5, 1)
    rb.push(item(1))
    assert rb.pushes.last_score == {'stored': 0, 'rejected_stale': 1} and core.buffer.count() == 1
    assert rb.update_model_version(6, session_id=1) == {'model_version': 6, 'session_id': 1, 'cleared': 1}
    rb.set_model_version(6, session)
    rb.push(item(2))
    assert rb.pushes.last_score == {'stored': 0, 'rejected_stale': 1} and core.buffer.count() == 0


def test_pending_pushes_keep_the_model_version_they_were_made_by():
    """With ``remote_buffer_freq`` a push waits for a later call; it still carries the version and session that made
    it, not the ones set before it was sent: a stale one is refused, a fresh one stored."""
    rb, core, ch = make_remote(storage='list', max_version_lag=0, remote_buffer_freq=2)
    rb.update_model_version(5, session_id='s')
    rb.set_model_version(1, 's')  # an old model
    rb.push(item(0))  # pending
    rb.set_model_version(5, 's')
    rb.push(item(1))
    assert [r['args']['model_version'] for r in ch.requests if r['op'] == 'push'] == [1, 5]
    assert core.buffer.count() == 1 and core.counters['rejected_stale'] == 1
    rb.push(item(2))  # pending, session s
    rb.set_model_version(5, 't')
    rb.flush()
    assert core.buffer.count() == 2 and core.counters['rejected_stale'] == 1  # made in session s: stored


def test_a_refused_update_model_version_leaves_the_workers_stamp():
    """The learner's ``update_model_version`` stamps its own later pushes only once the manager took it."""
    cfg = EasyDict(type='chunk', fragments_per_chunk=1, seed=0, distributed=dict(backend='torch', max_version_lag=0))
    buf, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buf, dcfg, key)
    rb = worker_buffer(get_buffer_cls(cfg), EasyDict(type='chunk', fragments_per_chunk=1), dcfg, Loopback(core))
    rb.update_model_version(0, session_id='s')
    with pytest.raises(ValueError, match="session_id must be a printable str.*got 7"):
        rb.update_model_version(0, session_id=7)  # a chunk buffer's sessions are str, as its fragments'
    assert (rb.pushes.model_version, rb.pushes.session_id) == (0, 's')
    assert (core.model_version, core.session_id) == (0, 's')


def test_a_meta_tensor_is_refused_naming_its_path_before_it_is_sent():
    rb, core, ch = make_remote(storage='list')
    with pytest.raises(TypeError, match=r"cannot send the meta tensor at 'message\.args\.data\.obs'"):
        rb.push({'obs': torch.empty(2, device='meta')})
    rb.push(item(1))
    assert core.buffer.count() == 1


@pytest.mark.parametrize('version', [np.int64(3), np.uint8(3), 3])
def test_blob_versions_take_numpy_ints(version):
    rb, core, ch = make_remote(storage='list')
    assert rb.put_blob('w', version, {'a': 1}) == {'stored': True, 'version': 3}
    assert rb.get_blob('w', newer_than=np.int64(2)) == {'version': 3, 'payload': {'a': 1}}
    assert rb.get_blob('w', newer_than=version) is None


def test_blob_version_messages_give_each_range_and_the_refused_name():
    rb, core, ch = make_remote(storage='list')
    with pytest.raises(ValueError, match=r'blob version must be an int in \[0, 2\*\*62\), got -1'):
        rb.put_blob('w', -1, 1)
    with pytest.raises(ValueError, match=r'newer_than must be an int in \[-1, 2\*\*62\), got -2'):
        rb.get_blob('w', newer_than=-2)
    for i in range(16):
        rb.put_blob(f'b{i}', 0, i)
    with pytest.raises(ValueError, match="blob 'one_more': the manager keeps at most 16 blob names"):
        rb.put_blob('one_more', 0, 0)


def test_a_remote_load_data_takes_only_a_bool_allow_pickle():
    rb, core, ch = make_remote(storage='list')
    for flag in ('False', 0, None):
        with pytest.raises(TypeError, match='allow_pickle must be a bool'):
            rb.load_data('b.pt', allow_pickle=flag)
    assert ch.ops() == []  # refused before anything is asked


def test_a_windowed_sample_never_replies_more_rows_than_the_buffer_holds():
    """sample(16, unroll_len=200_000, pad=True) of 15 stored steps replied 3.2M padded rows (131 MB): a worker
    could run the manager out of memory under its lock. Windows are bounded by the steps stored, or 2**16 rows."""
    cfg = EasyDict(type='episode', replay_buffer_size=8, seed=0, distributed=dict(backend='torch'))
    buf, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buf, dcfg, key)
    for n in (5, 10):
        ok(core.handle(W, req('push', data={'obs': torch.arange(float(n))})))
    before = buf.state_dict()
    args = dict(unroll_len=200_000, pad=True, replace=True)
    reply = core.handle(W, req("sample", size=8, kwargs=args))
    assert not reply['ok'] and 'unroll_len=200000' in reply['message'] and '15 stored steps' in reply['message']
    assert_same(buf.state_dict(), before)
    # short episodes padded to a longer window (R2D2 early in training) still work, up to 2**16 rows
    batch = ok(core.handle(W, req("sample", size=8, kwargs=dict(unroll_len=42, pad=True, replace=True))))
    assert len(batch) == 8 and all(len(w["obs"]) == 42 for w in batch)
    reply = core.handle(W, req('sample', size=8, kwargs=dict(args, unroll_len=np.int64(200_000))))
    assert not reply['ok'] and 'padded rows' in reply['message']  # a numpy int is bounded too
    # windows within the stored episodes are data, bounded by the buffer itself: served
    for n in [400] * 10:
        ok(core.handle(W, req('push', data={'obs': torch.arange(float(n))})))
    batch = ok(core.handle(W, req('sample', size=8, kwargs=dict(unroll_len=300, replace=True))))
    assert len(batch) == 8


def test_pending_pushes_refused_together_are_sent_one_by_one():
    """remote_buffer_freq=3: a bad push among good ones made the manager refuse the merged batch, and the good
    pushes (whose calls had returned 1) were lost. They are stored; the refusal names the bad one."""
    rb, core, ch = make_remote(storage='tensor', remote_buffer_freq=3)
    assert rb.push(item(3)) == 1 and rb.push({'obs': torch.zeros(2)}) == 1  # no log_reward: refused by the manager
    with pytest.raises(ValueError, match=r"missing field.*\(pending push 2 of 3; 1 refused, the others stored\)"):
        rb.push(item(5))
    assert sorted(t[0].item() for t in stored_obs(core.buffer)) == [3.0, 5.0]
    for i in (6, 7, 8):
        rb.push(item(i))
    assert core.buffer.count() == 5 and rb.unacknowledged == 0
    # pending pushes that cannot even be merged (fields of other shapes) go one by one too
    rb.push({'obs': torch.zeros(3), 'log_reward': torch.tensor(0.0)})
    rb.push(item(9))
    with pytest.raises(ValueError, match='pending push 1 of 3'):
        rb.push(item(10))
    assert core.buffer.count() == 7


def test_a_push_stored_before_it_failed_is_not_sent_again():
    """A scoring function that fails after the merged push was stored: the error says so, and the pending pushes
    are not sent again one by one (they would be stored twice)."""
    rb, core, ch = make_remote(storage='list', remote_buffer_freq=2, scoring_function=bad_score_hook)
    rb.push(item(1))
    with pytest.raises(TypeError, match='were stored') as info:
        rb.push(item(2))
    assert info.value.stored is True and core.buffer.count() == 2 and ch.ops().count('push') == 1


def test_a_version_the_buffer_refuses_leaves_the_manager_as_it_was():
    cfg = EasyDict(type='chunk', fragments_per_chunk=1, seed=0, distributed=dict(backend='torch'))
    buf, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buf, dcfg, key)
    ok(core.handle(W, req('model_version', version=3, session_id='s1')))
    buf.update_model_version = lambda version, session: (_ for _ in ()).throw(ValueError('the gate refuses'))
    reply = core.handle(W, req('model_version', version=4, session_id='s2'))
    assert not reply['ok'] and 'the gate refuses' in reply['message']
    meta = ok(core.handle(W, req('metadata')))
    assert (meta['model_version'], meta['session_id']) == (3, 's1')


# ================================================================================================ 4. config
@pytest.mark.parametrize(
    'dist, match',
    [
        (dict(backend='torch', bogus=1), r"distributed\.bogus"),
        (dict(backend=None, remote_bufer_freq=2), r"distributed\.remote_bufer_freq"),
        (dict(backend='nccl'), r"distributed\.backend"),
        (dict(backend='torch', baseline_filtering=True), r"baseline_strategy"),
        (dict(backend='torch', baseline_strategy='median'), r"distributed\.baseline_strategy"),
        (dict(backend='torch', baseline_percentile=1.5), r"distributed\.baseline_percentile"),
        (dict(backend='torch', remote_buffer_freq=0), r"distributed\.remote_buffer_freq"),
        (dict(backend='torch', scoring_function='nocolon'), r"distributed\.scoring_function"),
        (dict(backend='torch', max_reuse=0), r"distributed\.max_reuse"),
        # keys only the manager's shutdown or Ray's start-up would have read: refused at once, on every rank
        (dict(backend='torch', checkpoint_path=5), r"distributed\.checkpoint_path.*5.*expected"),
        (dict(backend='torch', checkpoint_path=''), r"distributed\.checkpoint_path"),
        (dict(backend='ray', ray_address=6379), r"distributed\.ray_address"),
        (dict(backend='ray', namespace=''), r"distributed\.namespace"),
        (dict(backend='torch', log_reward_key=''), r"distributed\.log_reward_key"),
        # seconds the clocks and timers they feed cannot hold (1e10 overflowed time_t at the first wait)
        (dict(backend='torch', timeout=1e10), r"distributed\.timeout.*at most 1e7"),
        (dict(backend='torch', heartbeat_seconds=1e10, peer_timeout=None), r"distributed\.heartbeat_seconds"),
        (dict(backend='torch', startup_timeout=2**80), r"distributed\.startup_timeout"),
        (dict(backend='torch', peer_timeout=1e300), r"distributed\.peer_timeout"),
        (dict(backend='torch', max_version_lag=True), r"distributed\.max_version_lag"),
        (dict(backend='torch', max_version_lag=2**62), r"distributed\.max_version_lag"),
    ],
)
def test_config_validation(dist, match):
    with pytest.raises(ValueError, match=match):
        create_buffer(dict(type='advanced', replay_buffer_size=8, distributed=dist))


def test_config_distributed_must_be_a_dict():
    with pytest.raises(TypeError, match='distributed'):
        create_buffer(dict(type='advanced', distributed=['torch']))


@pytest.mark.parametrize(
    'spec, match',
    [
        ('nomodule_xyz:fn', 'cannot be imported'),
        ('test_distributed_unit:not_there', 'cannot be imported'),
        ('test_distributed_unit:NOT_CALLABLE', 'not callable'),
    ],
)
def test_config_scoring_function_resolved_at_manager(spec, match):
    buf, dcfg, key = build_manager_buffer(make_cfg(scoring_function=spec))
    with pytest.raises(ValueError, match=r"distributed\.scoring_function.*" + match):
        ManagerCore(buf, dcfg, key)
    buf, dcfg, key = build_manager_buffer(make_cfg(metadata_function=spec))
    with pytest.raises(ValueError, match=r"distributed\.metadata_function"):
        ManagerCore(buf, dcfg, key)


@pytest.mark.parametrize(
    'dist, needles',
    [
        (dict(scoring_function='nomodule_xyz:fn'), ["'distributed.scoring_function'", "'nomodule_xyz:fn'", 'expected']),
        (
            dict(metadata_function='test_distributed_unit:NOT_CALLABLE'),
            ["'distributed.metadata_function'", 'NOT_CALLABLE', 'not callable', 'expected'],
        ),
        (dict(file_root='/nonexistent/dir_xyz'), ["'distributed.file_root'", "'/nonexistent/dir_xyz'", 'expected']),
    ],
)
def test_manager_side_checks_name_the_key_the_value_and_what_was_expected(dist, needles, no_max_use_type):
    from ding_buffer.distributed.config import build_distributed_config
    from ding_buffer.distributed.local import check_manager_side

    cfg = make_cfg(**dist)
    with pytest.raises(ValueError) as info:
        check_manager_side(cfg, build_distributed_config(cfg.distributed))
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    check_manager_side(make_cfg(), build_distributed_config(make_cfg().distributed))  # a good config passes
    cfg = make_cfg('test_no_max_use', max_reuse=2)
    with pytest.raises(ValueError, match=r"'distributed\.max_reuse' is 2.*'max_use'"):
        check_manager_side(cfg, build_distributed_config(cfg.distributed))


def _no_network(monkeypatch):
    """Start-up of either backend fails the test if reached; the launcher variables of this process are cleared."""
    import ding_buffer.distributed.startup as startup

    def reached(*args, **kwargs):
        raise AssertionError('the network start-up was reached')

    monkeypatch.setattr(startup, 'init_torch', reached)
    monkeypatch.setattr(startup, 'init_mpi', reached)
    for key in ('RANK', 'WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'PMI_RANK', 'PMI_SIZE'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv('OMPI_MCA_orte_enable_recovery', raising=False)


def _launched_as(monkeypatch, backend, rank, world):
    if backend == 'torch':
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            pytest.skip('this process has a default process group')
        monkeypatch.setenv('RANK', str(rank))
        monkeypatch.setenv('WORLD_SIZE', str(world))
    else:  # (mpi4py is never imported for this: the launcher's variables are read)
        monkeypatch.setenv('OMPI_COMM_WORLD_RANK', str(rank))
        monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', str(world))


@pytest.mark.parametrize('backend', ['torch', 'mpi'])
@pytest.mark.parametrize(
    'dist, key',
    [
        (dict(scoring_function='nomodule_xyz:fn'), 'scoring_function'),
        (dict(metadata_function='test_distributed_unit:not_there'), 'metadata_function'),
        (dict(file_root='/nonexistent/dir_xyz'), 'file_root'),
        (dict(worker_ranks=[0]), 'worker_ranks'),  # rank 1 of 3 has no role (rank 2 manages)
    ],
)
def test_a_rank_fails_on_its_own_settings_before_any_network_call(monkeypatch, backend, dist, key):
    """The manager rank (the last of 3, known from the launcher's variables) refuses what it would refuse after
    start-up -- its callables, its file_root, a rank without a role -- before start-up is even tried."""
    _no_network(monkeypatch)
    _launched_as(monkeypatch, backend, 1 if key == 'worker_ranks' else 2, 3)
    cfg = dict(make_cfg(**dist), distributed=dict(backend=backend, startup_timeout=60, **dist))
    with pytest.raises(ValueError, match=rf"'distributed\.{key}'"):
        create_buffer(cfg)


@pytest.mark.parametrize('backend', ['torch', 'mpi'])
def test_a_max_reuse_the_managers_buffer_refuses_fails_before_any_network_call(monkeypatch, backend):
    """distributed.max_reuse becomes the manager's max_use: a value the type's own rule refuses (chunk refuses 2**62
    uses) passed every check made before start-up, and the manager refused it only once the workers had connected."""
    _no_network(monkeypatch)
    _launched_as(monkeypatch, backend, 2, 3)
    cfg = dict(type='chunk', distributed=dict(backend=backend, startup_timeout=60, max_reuse=2**62))
    with pytest.raises(ValueError, match=r"'distributed\.max_reuse' is 4611686018427387904, which the buffer refuses"):
        create_buffer(cfg)


def test_under_mpirun_enable_recovery_a_refusing_rank_joins_mpi_init_before_raising(monkeypatch):
    """With --enable-recovery a rank that left before MPI_Init would hold the others in it for good: the check
    still runs first, and the rank joins MPI_Init before raising what it found."""
    import ding_buffer.distributed.startup as startup

    _no_network(monkeypatch)
    _launched_as(monkeypatch, 'mpi', 2, 3)
    monkeypatch.setenv('OMPI_MCA_orte_enable_recovery', '1')
    joined = []
    monkeypatch.setattr(startup, 'init_mpi', lambda: joined.append(1) or (2, 3))
    with pytest.raises(ValueError, match=r"'distributed\.scoring_function'"):
        create_buffer(dict(make_cfg(), distributed=dict(backend='mpi', scoring_function='nomodule_xyz:fn')))
    assert joined == [1]


@pytest.mark.parametrize('backend', ['torch', 'mpi'])
def test_a_worker_rank_leaves_the_managers_settings_to_the_manager(monkeypatch, backend):
    """A scoring module or file_root may exist on the manager's host only: a worker rank does not check them (it
    goes on to start-up, here the stub that says it was reached)."""
    _no_network(monkeypatch)
    _launched_as(monkeypatch, backend, 0, 3)
    dist = dict(backend=backend, scoring_function='nomodule_xyz:fn', file_root='/nonexistent/dir_xyz')
    with pytest.raises(AssertionError, match='network start-up was reached'):
        create_buffer(dict(make_cfg(), distributed=dist))


def test_ray_checks_the_manager_side_before_starting_a_local_instance(monkeypatch):
    """With no cluster address the manager actor runs on this host: its settings are checked before Ray starts;
    with a cluster address the actor may run on another host, and checks them itself."""
    import ding_buffer.distributed.ray_backend as ray_backend
    import ding_buffer.distributed.ray_channel as ray_channel

    class NoRay:
        @staticmethod
        def is_initialized():
            return False

    def reached(*args, **kwargs):
        raise AssertionError('Ray was reached')

    monkeypatch.setattr(ray_channel, 'import_ray', lambda: NoRay)
    monkeypatch.setattr(ray_backend, 'get_or_create_actor', reached)
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    for bad, key in (
        (dict(scoring_function='nomodule_xyz:fn'), 'scoring_function'),
        (dict(file_root='/no/x'), 'file_root'),
    ):
        with pytest.raises(ValueError, match=rf"'distributed\.{key}'"):
            create_buffer(dict(make_cfg(), distributed=dict(backend='ray', **bad)))
    with pytest.raises(AssertionError, match='Ray was reached'):
        create_buffer(dict(make_cfg(), distributed=dict(backend='ray', ray_address='10.0.0.1:6379', file_root='/no/x')))


def test_config_backend_none_is_a_local_buffer():
    buf = create_buffer(
        dict(
            type='advanced',
            replay_buffer_size=8,
            seed=0,
            storage=dict(type='tensor'),
            distributed=dict(backend=None, remote_buffer_freq=3),
        )
    )
    assert type(buf).__name__ == 'AdvancedReplayBuffer'
    buf.push({'obs': torch.ones(2)})
    assert buf.count() == 1 and torch.equal(buf.sample(1)['obs'], torch.ones(1, 2))
    buf = create_buffer(dict(type='gfn', replay_buffer_size=8, distributed=None))
    assert type(buf).__name__ == 'GFlowNetReplayBuffer'


# ---------------------------------------------------------------------------------------------- framing
_PIPES = []


@pytest.fixture(autouse=True)
def _close_pipes():
    yield
    while _PIPES:
        pipe = _PIPES.pop()
        pipe.gate.set()
        pipe.a.close(1)
        pipe.b.close(1)


class _Pipe:
    """Two in-memory ThreadedTransports wired back to back: every send is one queued message. ``exact`` receives
    behave like MPI's (sized by a probe: the count is known and a wrong size is refused); otherwise like gloo's
    (a zeroed buffer of the posted size; a longer message would abort the process, which fails the test).
    ``gate`` (an Event) stalls a's sender until set, as a frozen peer stalls gloo / MPI sends."""

    def __init__(self, max_bytes=1 << 30, exact=False):
        import queue as q

        from ding_buffer.distributed import framing as fr

        class PipeTransport(ThreadedTransport):
            def __init__(self, me, pipe):  # a sends anything (a peer with another limit); b enforces max_bytes
                super().__init__([1 - me], False, max_bytes if me == 1 else 1 << 40, grace=5.0)
                self.me, self.pipe = me, pipe
                self.asked = []  # sizes of the receives posted after a head

            def _send_buf(self, peer, buf):
                if self.me == 0:
                    assert self.pipe.gate.wait(30)
                self.pipe.wires[(self.me, peer)].put(np.array(buf, dtype=np.uint8, copy=True).reshape(-1))

            def _next(self, peer):
                while True:
                    try:
                        return self.pipe.wires[(peer, self.me)].get(timeout=0.05)
                    except q.Empty:
                        if self._abandon:
                            raise TransportError('closed') from None

            def _recv_head(self, peer):
                msg = self._next(peer)
                if exact:
                    return msg, len(msg)
                assert len(msg) <= fr.HEAD, f"gloo would abort: a {len(msg)}-byte message on a {fr.HEAD}-byte receive"
                buf = np.zeros(fr.HEAD, np.uint8)
                buf[: len(msg)] = msg
                return buf, None

            def _recv_exact(self, peer, n, out=None):
                self.asked.append(n if out is None else 0)  # bytes allocated for the receive
                msg = self._next(peer)
                if exact and len(msg) != n:
                    raise ProtocolError(f'{len(msg)} bytes where {n} were announced')
                assert len(msg) <= n, f"gloo would abort: a {len(msg)}-byte message on a {n}-byte receive"
                buf = np.zeros(n, np.uint8) if out is None else out
                buf[: len(msg)] = msg
                return buf

        self.gate = threading.Event()
        self.gate.set()
        self.wires = {(0, 1): q.Queue(), (1, 0): q.Queue()}
        self.a, self.b = PipeTransport(0, self), PipeTransport(1, self)
        self.a.start()
        self.b.start()
        _PIPES.append(self)

    def roundtrip(self, obj):
        self.a.send(1, obj, deadline=time.monotonic() + 10)
        return self.b.recv(10)

    def raw(self, buf):
        """Put bytes on a's wire to b as one message, bypassing the framing (a hostile peer)."""
        self.wires[(0, 1)].put(np.asarray(buf, dtype=np.uint8).reshape(-1))

    def close(self):
        self.gate.set()
        return self.a.close(5), self.b.close(5)


def _ctrl(*fields):
    from ding_buffer.distributed import framing as fr

    c = np.zeros(8, np.int64)
    c[: len(fields)] = fields
    return np.concatenate([c.view(np.uint8), np.zeros(fr.CTRL - 64, np.uint8)])


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_inline_overflow_and_large_parts(exact):
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import MESSAGE

    pipe = _Pipe(exact=exact)
    g = torch.Generator().manual_seed(0)
    msg = {
        'id': 7,
        'tiny': torch.arange(3),  # inline
        'edge': torch.zeros(fr.INLINE, dtype=torch.uint8),  # exactly INLINE: inline
        'big': torch.randn(fr.INLINE // 4 + 1, generator=g),  # 4 bytes over INLINE: out of line
        'fill': [torch.ones(fr.INLINE // 4) for _ in range(fr.HEAD // fr.INLINE + 1)],  # inline until the head is full
        'empty': torch.zeros(0, 5),
        'many': [torch.full((7,), i, dtype=torch.int16) for i in range(40)],  # several inline parts
        'name': 'x' * (fr.HEAD * 2),  # header larger than the head: meta overflows into a second message
    }
    peer, kind, out = pipe.roundtrip(msg)
    assert (peer, kind) == (0, MESSAGE)
    assert_same(msg, out)
    head, extra, outline, n = fr.frame(*encode(msg))
    assert extra is not None and len(head) == fr.HEAD  # the header alone overflows: every part out of line
    assert len(outline) == len(encode(msg)[1])
    fill = {k: msg[k] for k in ('big', 'fill', 'tiny')}
    head, extra, outline, n = fr.frame(*encode(fill))
    assert extra is None and len(head) <= fr.HEAD
    assert sorted(p.nbytes for p in outline) == [fr.INLINE] * 2 + [fr.INLINE + 4]  # big + fills past the head
    assert_same(fill, pipe.roundtrip(fill)[2])
    head, extra, outline, n = fr.frame(*encode({'x': torch.ones(10)}))
    assert extra is None and not outline and len(head) < 200  # a small message is short, not HEAD bytes
    before = pipe.wires[(0, 1)].qsize()
    pipe.a.send(1, {'op': 'ping', 'x': torch.ones(4)}, deadline=time.monotonic() + 10)
    assert pipe.wires[(0, 1)].qsize() - before <= 1  # a small message is exactly one send
    assert_same(pipe.b.recv(10)[2], {'op': 'ping', 'x': torch.ones(4)})
    assert pipe.close() == ([], [])


def test_framing_decoded_tensors_own_their_memory_so_torch_save_works():
    import io

    pipe = _Pipe()
    msg = {
        'a': torch.arange(5, dtype=torch.int64),
        'b': torch.ones(3, dtype=torch.float32),  # both inline
        'c': torch.zeros(3, 2, dtype=torch.float16),
        'big': torch.arange(70000, dtype=torch.int32),
        'arr': np.arange(4, dtype=np.float64),
    }
    out = pipe.roundtrip(msg)[2]
    assert_same(msg, out)
    f = io.BytesIO()
    torch.save(out, f)  # tensors viewing one receive buffer as different dtypes cannot be saved
    f.seek(0)
    assert_same(torch.load(f, weights_only=False), msg)


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_oversized_message_is_drained_and_answered_with_its_id(exact):
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR

    pipe = _Pipe(max_bytes=fr.HEAD + 1000, exact=exact)
    pipe.a.send(
        1, {'op': 'push', 'args': {'data': torch.zeros(100_000)}, 'id': 41}, msg_id=41, deadline=time.monotonic() + 10
    )
    peer, kind, (rid, err) = pipe.b.recv(10)
    assert kind == ERROR and rid == 41 and 'max_message_mb' in str(err) and isinstance(err, ValueError)
    pipe.a.send(1, {'op': 'push', 'id': 42}, deadline=time.monotonic() + 10)  # still in sync after the drain
    assert pipe.b.recv(10)[2] == {'op': 'push', 'id': 42}
    assert pipe.wires[(0, 1)].empty()


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_garbage_is_answered_and_the_stream_resynchronises(exact):
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR, MESSAGE

    pipe = _Pipe(exact=exact)
    rng = np.random.default_rng(0)
    bad = [
        np.zeros(fr.HEAD, np.uint8),  # no magic
        rng.integers(0, 256, 1000, dtype=np.uint8),  # random bytes
        _ctrl(fr.MAGIC, 9, 5, fr.CTRL),  # unknown kind
        _ctrl(fr.MAGIC, fr.DATA, 6, fr.CTRL + 10, 5, 0, 0, 10),  # head length that disagrees with what arrived
        _ctrl(fr.MAGIC, fr.DATA, 7, fr.CTRL + 32, 3, 2, 0, 32)[: fr.CTRL],  # meta announced, never sent
        np.frombuffer(b'\x67\x6e\x69\x64' + b'\x00' * 16, np.uint8),
    ]  # 20 bytes: the magic and nothing else
    if exact:
        bad.append(np.zeros(3, np.uint8))  # shorter than a control block
    for b in bad:
        pipe.raw(b)
        pipe.a.send(1, {'op': 'count', 'id': 1}, msg_id=1, deadline=time.monotonic() + 10)
        got = []
        while not (got and got[-1][1] == MESSAGE):
            got.append(pipe.b.recv(10))
            assert got[-1] is not None, f'nothing arrived after {b[:24].tolist()}'
        assert got[-1][2] == {'op': 'count', 'id': 1}, got  # the next well-formed message is read whole
        assert all(k == ERROR for _, k, _ in got[:-1]), got  # garbage is reported, never parsed
    assert pipe.b.protocol_errors >= len(bad) - 1


def test_framing_a_short_frame_never_reads_stale_bytes():
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR, MESSAGE

    pipe = _Pipe()
    pipe.a.send(1, {'op': 'push', 'args': {'x': 'y' * 400}, 'id': 3}, msg_id=3, deadline=time.monotonic() + 10)
    assert pipe.b.recv(10)[1] == MESSAGE
    # 20 bytes: magic, kind DATA, id 69 -- a receive that reused the previous buffer would find its lengths
    pipe.raw(np.array([fr.MAGIC, fr.DATA, 69], np.int64).view(np.uint8)[:20])
    peer, kind, (rid, err) = pipe.b.recv(10)
    assert kind == ERROR and 'control block' in str(err)


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_a_lying_part_table_is_refused(exact):
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR, MESSAGE

    pipe = _Pipe(exact=exact)
    header, parts = encode({'op': 'push', 'id': 5, 'x': torch.ones(50_000)})  # out of line, shorter than a head:
    head, extra, out, n = fr.frame(header, parts, 5)  # (a longer stray piece would abort gloo, see the transport)
    lied = head.copy()
    lied[: fr.CTRL].view(np.int64)[6] += 8  # body bytes that the table does not add up to
    pipe.raw(lied)
    peer, kind, (rid, err) = pipe.b.recv(10)
    assert kind == ERROR and rid == 5 and 'part table' in str(err)
    for p in out:  # the announced pieces arrive anyway: refused as heads, then the stream is in sync
        pipe.raw(p)
    pipe.a.send(1, {'op': 'count', 'id': 6}, msg_id=6, deadline=time.monotonic() + 10)
    while True:
        item = pipe.b.recv(10)
        assert item is not None
        if item[1] == MESSAGE:
            assert item[2] == {'op': 'count', 'id': 6}
            break


def test_framing_mpi_piece_of_the_wrong_size_is_consumed_and_refused():
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR

    pipe = _Pipe(exact=True)
    header, parts = encode({'op': 'push', 'id': 8, 'x': torch.ones(100_000)})
    head, extra, out, n = fr.frame(header, parts, 8)
    pipe.raw(head)
    pipe.raw(np.zeros(out[0].nbytes + 16, np.uint8))  # longer than announced
    peer, kind, (rid, err) = pipe.b.recv(10)
    assert kind == ERROR and rid == 8 and 'announced' in str(err)
    assert pipe.roundtrip({'op': 'count', 'id': 9})[2] == {'op': 'count', 'id': 9}


def test_framing_allocates_a_piece_at_a_time_not_the_declared_size():
    from ding_buffer.distributed import framing as fr

    pipe = _Pipe(max_bytes=4 << 30)
    declared = 1536 << 20  # 1.5 GiB announced, below max_message_bytes
    header = encode({'op': 'push', 'id': 4, 'x': torch.zeros(0)})[0]
    fake = np.zeros(declared, np.uint8)[:0]  # nothing real behind it
    head, extra, out, n = fr.frame(header, [np.lib.stride_tricks.as_strided(fake, (declared,), (0,))], 4)
    pipe.raw(head)
    pipe.raw(np.ones(1 << 20, np.uint8))  # one MiB of it arrives, then the sender goes quiet
    time.sleep(0.3)
    assert pipe.b.asked and max(pipe.b.asked) <= fr.PIECE, pipe.b.asked  # never the whole 1.5 GiB up front
    assert pipe.b.recv(0.1) is None


def test_send_timeout_keeps_the_frame_whole_and_bounds_the_queue():
    from ding_buffer.distributed.frame_reader import MESSAGE

    pipe = _Pipe()
    pipe.gate.clear()  # the peer stops reading
    payload = {'op': 'push', 'id': 1, 'x': torch.arange(200_000)}
    t = time.monotonic()
    with pytest.raises(SendTimeout):
        pipe.a.send(1, payload, msg_id=1, deadline=time.monotonic() + 0.3)
    assert 0.3 <= time.monotonic() - t < OUTER  # the caller waited for its deadline, then got SendTimeout
    assert pipe.a.queued(1) == 1  # the frame stays queued, whole
    t = time.monotonic()
    with pytest.raises(SendTimeout, match='previous'):  # nothing more is queued behind it
        pipe.a.send(1, {'op': 'count', 'id': 2}, msg_id=2, deadline=time.monotonic() + 0.3)
    assert 0.3 <= time.monotonic() - t < OUTER  # it waited for room until its deadline
    assert pipe.a.queued(1) == 1  # the queue stays bounded
    pipe.gate.set()  # the peer reads again: the frame that timed out arrives whole, in order
    peer, kind, got = pipe.b.recv(10)
    assert kind == MESSAGE
    assert_same(got, payload)
    assert pipe.roundtrip({'op': 'count', 'id': 3})[2] == {'op': 'count', 'id': 3}
    assert pipe.close() == ([], [])


def test_close_says_goodbye_and_both_sides_end_their_threads():
    from ding_buffer.distributed.frame_reader import BYE, MESSAGE

    pipe = _Pipe()
    assert pipe.roundtrip({'op': 'count'})[1] == MESSAGE
    assert pipe.a.close(5) == []  # a's goodbye is answered by b's
    assert pipe.b.recv(5) == (0, BYE, None)
    assert not pipe.a.alive(1) and not pipe.b.alive(0)
    with pytest.raises(TransportError, match='closed'):
        pipe.b.send(0, {'op': 'count'}, deadline=time.monotonic() + 1)
    assert pipe.b.close(5) == []


# ---------------------------------------------------------------------------------------------- trust and faults
def test_manager_file_requests_stay_inside_file_root(tmp_path):
    core = make_core(storage='list')
    r = core.handle(W, req('save_data', path='x.buf'))
    assert r['error'] == 'PermissionError' and 'file_root=None' in r['message']  # no root: no files at all
    root = tmp_path / 'root'
    root.mkdir()
    (tmp_path / 'outside').mkdir()
    os.symlink(tmp_path / 'outside', root / 'link')
    core = make_core(storage='list', file_root=str(root))
    core.handle(W, req('push', data=item(1)))
    assert ok(core.handle(W, req('save_data', path='sub.buf'))) == str(root / 'sub.buf')
    for bad in ('../x.buf', '/etc/passwd', 'link/x.buf', '', 'a\0b', '.', 7):
        r = core.handle(W, req('save_data', path=bad))
        assert r['ok'] is False and r['error'] in ('PermissionError', 'ValueError'), (bad, r)
    assert not (tmp_path / 'x.buf').exists() and not (tmp_path / 'outside' / 'x.buf').exists()
    with pytest.raises(ValueError, match=r"distributed\.file_root"):
        make_core(file_root=str(tmp_path / 'missing'))


def test_a_checkpoint_path_the_manager_cannot_write_is_refused_at_start(tmp_path):
    """A checkpoint_path that is a directory, or lies under a file, was accepted and failed at shutdown: on Ray the
    actor then ended with every item lost. It is refused when the manager starts; missing directories are made."""
    (tmp_path / 'file').write_text('x')
    for bad in (tmp_path, tmp_path / 'file' / 'ck.pt', tmp_path / 'file' / 'a' / 'ck.pt'):
        with pytest.raises(ValueError, match=r"distributed\.checkpoint_path' is .*(is a directory|not a directory)"):
            make_core(checkpoint_path=str(bad))
    core = make_core(storage='list', checkpoint_path=str(tmp_path / 'new' / 'dir' / 'ck.pt'))
    core.handle(W, req('push', data=item(1)))
    assert core.shutdown() == str(tmp_path / 'new' / 'dir' / 'ck.pt')
    again = create_buffer(dict(type='advanced', replay_buffer_size=16, storage=dict(type='list')))
    again.load_data(str(tmp_path / 'new' / 'dir' / 'ck.pt'))
    assert again.count() == 1


def test_remote_save_and_load_take_a_path_object_as_a_local_buffer_does(tmp_path):
    """``save_data(pathlib.Path(...))`` / ``load_data`` on a worker: the path travels as its text (the codec
    refused the object)."""
    import pathlib

    root = tmp_path / 'root'
    root.mkdir()
    rb, core, ch = make_remote(storage='tensor', file_root=str(root))
    rb.extend({'obs': torch.arange(6.0).reshape(3, 2)})
    assert rb.save_data(pathlib.Path('sub.buf')) == str(root / 'sub.buf')
    rb.clear()
    rb.load_data(pathlib.PurePosixPath('sub.buf'))
    assert rb.count() == 3


def test_remote_update_takes_list_storage_ids_as_a_numpy_text_array():
    rb, core, ch = make_remote(storage='list')
    rb.push([{'obs': torch.full((2,), float(i))} for i in range(3)])
    s = rb.sample(2)
    info = {
        'replay_unique_id': np.array([x['replay_unique_id'] for x in s]),  # e.g. collected from a numpy pipeline
        'replay_buffer_idx': np.array([x['replay_buffer_idx'] for x in s]),
        'priority': np.array([5.0, 6.0]),
    }
    assert rb.update(info) == {'updated': 2, 'stale': 0}
    assert info['replay_unique_id'].dtype.kind == 'U'  # (the caller's arrays are left as they were)


def test_load_data_never_unpickles_on_a_request(tmp_path):
    import pickle

    EXECUTED.clear()
    with open(tmp_path / 'evil.buf', 'wb') as f:
        pickle.dump({'x': Hostile()}, f)
    core = make_core(storage='list', file_root=str(tmp_path))
    r = core.handle(W, req('load_data', path='evil.buf', allow_pickle=True))  # the flag cannot travel
    assert r['error'] == 'TypeError' and EXECUTED == []
    r = core.handle(W, req('load_data', path='evil.buf'))  # the manager's own allow_pickle is False
    assert r['ok'] is False and EXECUTED == []
    rb, core2, ch = make_remote(storage='list', file_root=str(tmp_path))
    with pytest.raises(ValueError, match=r'distributed\.allow_pickle'):
        rb.load_data('evil.buf', allow_pickle=True)
    assert EXECUTED == []


def test_push_records_of_one_sender_are_not_pushed_out_by_another():
    """A peer pushing under many made-up client ids forgets only its own records: another worker's push in doubt,
    sent again with the same client and sequence number, is still recognised (stored once)."""
    core = make_core(storage='list')
    ok(core.handle(W, req('push', data=item(1), client='honest', seq=0)))  # its reply lost: sent again later
    flood = MAX_CLIENTS + 1  # more ids than the manager keeps records for, all from one other rank
    for i in range(flood):  # empty pushes under fresh ids: nothing stored
        ok(core.handle('evil', req('push', data=[], client=f'evil{i}', seq=0)))
    again = ok(core.handle(W, req('push', data=item(1), client='honest', seq=0)))
    assert again['duplicate'] is True and core.buffer.count() == 1
    assert ok(core.handle('evil', req('push', data=[], client=f'evil{flood - 1}', seq=0)))['duplicate']
    # the flooding sender keeps only its newest records: its first id is new again
    assert 'duplicate' not in ok(core.handle('evil', req('push', data=item(2), client='evil0', seq=0)))
    assert core.buffer.count() == 2


def test_sample_kwargs_are_whitelisted():
    core = make_core()
    core.handle(W, req('push', data=item(1)))
    r = core.handle(W, req('sample', size=1, kwargs={'evil': 1}))
    assert r['error'] == 'ValueError' and "'evil'" in r['message'] and 'cur_learner_iter' in r['message']
    assert ok(core.handle(W, req('sample', size=1, kwargs={'cur_learner_iter': 3})))['obs'].shape == (1, 2)


def test_push_sequence_numbers_are_applied_once():
    core = make_core()
    first = ok(core.handle(W, req('push', data=item(1), client='c1', seq=0)))
    assert first['stored'] == 1
    again = ok(core.handle(W, req('push', data=item(1), client='c1', seq=0)))  # a retry of seq 0
    assert again == dict(first, duplicate=True) and core.buffer.count() == 1
    assert ok(core.handle(W, req('push', data=item(2), client='c2', seq=0)))['stored'] == 1  # another client
    assert ok(core.handle(W, req('push', data=item(3), client='c1', seq=1)))['stored'] == 1
    older = ok(core.handle(W, req('push', data=item(1), client='c1', seq=0)))
    assert older == {'stored': 0, 'score': {}, 'duplicate': True} and core.buffer.count() == 3
    assert core.counters['duplicate_pushes'] == 2
    for client, seq in (('c1', -1), ('', 0), ('c' * 200, 0), ('c1', 2**63), ('c1', '3'), (5, 0), ('c1', True)):
        r = core.handle(W, req('push', data=item(9), client=client, seq=seq))
        assert r['error'] == 'ValueError' and "'seq'" in r['message'], (client, seq, r)
    assert core.buffer.count() == 3


def test_liveness_lose_silence_and_rejoin():
    core = make_core(peer_timeout=2.0, heartbeat_seconds=1.0)
    core.liveness.seen('a', now=0.0)
    core.liveness.seen('b', now=0.0)
    core.liveness.seen('c', now=0.0)
    for now in (0.5, 1.0, 1.5):
        core.liveness.check_silent(now=now)
    assert core.liveness.lost == {}
    core.handle('b', req('exit'))
    for now in (2.0, 2.5, 3.0):
        core.liveness.check_silent(now=now, busy=['c'])  # c's request waits for the buffer: not silent
    lost = core.liveness.lost
    assert list(lost) == ['a'] and 'peer_timeout' in lost['a']  # an exited sender is never lost
    core.liveness.seen('a', now=3.0)
    core.liveness.seen('c', now=3.0)  # c's request was served
    core.liveness.check_silent(now=13.0)  # this process did not run for 10 s (frozen): that is held against nobody
    assert core.liveness.lost == {}
    core.handle('a', {'op': 'ping'})  # it speaks again: rejoined
    assert core.liveness.lost == {} and core.liveness.rejoined == {'a': 1}
    assert core.summary()['rejoined'] == {'a': 1}


@pytest.mark.parametrize(
    'dist, key',
    [
        (dict(heartbeat_seconds=10, peer_timeout=15), 'heartbeat_seconds'),
        (dict(timeout=float('inf')), 'timeout'),
        (dict(timeout=float('nan')), 'timeout'),
        (dict(startup_timeout=0), 'startup_timeout'),
        (dict(peer_timeout=float('inf')), 'peer_timeout'),
        (dict(max_message_mb=float('nan')), 'max_message_mb'),
        (dict(file_root=''), 'file_root'),
        (dict(worker_ranks=[0, 0]), 'worker_ranks'),  # one rank counted as two workers
        (dict(worker_ranks=[True]), 'worker_ranks'),
    ],
)
def test_config_traps_are_refused(dist, key):
    with pytest.raises(ValueError, match=rf"distributed\.{key}"):
        create_buffer(dict(type='naive', replay_buffer_size=8, distributed=dict(backend='torch', **dist)))


def test_push_in_doubt_is_resent_with_its_sequence_number():
    rb, core, ch = make_remote()
    rb.push(item(0))
    ch.fail = 'late'  # applied, but no reply in time
    with pytest.raises(ManagerUnavailableError):
        rb.push(item(1))
    assert rb.pushes.unacknowledged == 1 and core.buffer.count() == 2
    ch.fail = None
    rb.push(item(1))  # the caller's retry: recognised, nothing new is added
    assert core.buffer.count() == 2 and rb.pushes.last_score['duplicate'] is True and rb.pushes.unacknowledged == 0
    ch.fail = 'lost'  # never reached the manager
    with pytest.raises(ManagerUnavailableError):
        rb.push(item(2))
    ch.fail = None
    rb.push(item(3))  # new data: the push in doubt goes first, with its old sequence number
    assert core.buffer.count() == 4 and rb.pushes.unacknowledged == 0
    assert torch.equal(stored_obs(core.buffer)[:4, 0], torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert [r['args']['seq'] for r in ch.requests if r['op'] == 'push'] == [0, 1, 1, 2, 3]


def test_retry_that_fails_again_is_still_a_retry():
    rb, core, ch = make_remote()
    ch.fail = 'late'
    for _ in range(3):  # applied once, then the retries fail before reaching it
        with pytest.raises(ManagerUnavailableError):
            rb.push(item(5))
        ch.fail = 'lost'
    ch.fail = None
    rb.push(item(5))
    rb.push(item(6))
    assert core.buffer.count() == 2 and core.counters['duplicate_pushes'] == 1


def test_async_push_in_doubt_and_close_resend():
    rb, core, ch = make_remote(async_score=True)
    rb.push(item(0))
    ch.fail = 'lost'
    with pytest.raises(ManagerUnavailableError):
        rb.push(item(1))  # never sent
    ch.fail = None
    rb.close()  # sends what is owed, then EXIT
    assert core.buffer.count() == 2 and core.liveness.exited == {W}


def test_failed_flush_of_earlier_items_does_not_take_the_new_data():
    rb, core, ch = make_remote(remote_buffer_freq=3)
    batch = {'obs': torch.ones(2, 2), 'log_reward': torch.zeros(2)}
    rb.push(item(0))  # pending: single items
    ch.fail = 'lost'
    with pytest.raises(ManagerUnavailableError, match='push it again'):
        rb.push(batch, batched=True)  # a batch: the single items must go first, and fail
    ch.fail = None
    rb.push(batch, batched=True)  # not a retry: this data was never taken
    rb.flush()
    assert core.buffer.count() == 3 and rb.pushes.unacknowledged == 0


def test_a_push_failing_behind_one_in_doubt_says_its_data_was_not_taken():
    """Push 1 fails (in doubt, kept); push 2 fails while push 1 is sent again first: push 2 took none of its data,
    with the same error type -- its message says so (an actor loop that logged and went on lost it unawares)."""
    rb, core, ch = make_remote()
    rb.push(item(0))
    ch.fail = 'lost'
    with pytest.raises(ManagerUnavailableError) as first:
        rb.push(item(1))
    assert 'push it again' not in str(first.value) and rb.pushes.unacknowledged == 1
    with pytest.raises(ManagerUnavailableError, match='was not taken, push it again'):
        rb.push(item(2))
    assert rb.pushes.unacknowledged == 1
    ch.fail = None
    rb.push(item(2))  # as the message says
    rb.flush()
    assert core.buffer.count() == 3 and rb.pushes.unacknowledged == 0


def test_sync_request_while_an_async_push_is_in_flight_keeps_its_reply():

    from ding_buffer.distributed.channel import PeerChannel
    from ding_buffer.distributed.frame_reader import MESSAGE

    class FakeTransport:  # replies in request order, as the real transports deliver them
        def __init__(self):
            self.inbox = queue.Queue()

        def start(self):
            pass

        def send(self, peer, obj, msg_id=-1, deadline=None, wait=True, limit=1):
            if obj.get('op') != 'ping':
                self.inbox.put((peer, MESSAGE, {'id': obj['id'], 'ok': True, 'result': obj['op']}))

        def recv(self, timeout):
            try:
                return self.inbox.get(timeout=timeout)
            except queue.Empty:
                return None

        def close(self, grace=None, final=False):
            return []

    ch = PeerChannel(FakeTransport(), 2, timeout=5.0, heartbeat=60.0)
    pushed = ch.submit({'op': 'push'})  # async: not collected yet
    assert ch.result(ch.submit({'op': 'count'}), 'count')['result'] == 'count'
    assert ch.result(pushed, 'push')['result'] == 'push'  # kept, not dropped (a dropped one: ManagerTimeoutError)
    assert ch._early == {} and ch._outstanding == set()
    ch.close(0)


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_part_tables_that_overflow_or_overlap_are_refused(exact):
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR

    pipe = _Pipe(max_bytes=1 << 20, exact=exact)
    header = encode({'op': 'push', 'id': 3})[0]

    def frame_with(table, body, extra=b''):
        n = len(table)
        meta = np.array(table, np.int64).reshape(-1).view(np.uint8).tobytes() + header + extra
        c = np.array([fr.MAGIC, fr.DATA, 3, fr.CTRL + len(meta), len(header), n, body, len(meta)], np.int64)
        return np.frombuffer(c.tobytes() + meta, np.uint8)

    # four parts of ~2**62 bytes whose int64 sum wraps around to 16
    pipe.raw(frame_with([[(1 << 62) + 4, -1]] * 4, 16))
    # 64 inline parts over the same 4 KiB (a 4 KiB frame that would copy 256 KiB)
    first = 16 * 64 + len(header)
    pipe.raw(frame_with([[4096, first]] * 64, 0, b'x' * 4096))
    for _ in range(2):
        peer, kind, (rid, err) = pipe.b.recv(10)
        assert kind == ERROR and rid == 3 and 'part table' in str(err)
    assert pipe.b.asked == []  # refused before any receive or allocation
    assert pipe.roundtrip({'op': 'count', 'id': 4})[2] == {'op': 'count', 'id': 4}


def test_framing_header_cap_refuses_huge_headers_with_a_hint():
    from ding_buffer.distributed import framing as fr
    from ding_buffer.distributed.frame_reader import ERROR

    pipe = _Pipe(max_bytes=1 << 30)
    msg = {'op': 'push', 'id': 8, 'x': 'y' * (fr.MAX_HEADER + 10)}
    with pytest.raises(CodecError, match='header'):  # a sender refuses it before anything leaves
        pipe.b.send(0, msg, deadline=time.monotonic() + 10)
    head, extra, out, n = fr.frame(*encode(msg), 8)  # a peer that sends it anyway
    pipe.raw(head)
    pipe.raw(extra)
    peer, kind, (rid, err) = pipe.b.recv(10)
    assert kind == ERROR and rid == 8 and 'batched dict' in str(err)
    assert pipe.roundtrip({'op': 'count', 'id': 9})[2] == {'op': 'count', 'id': 9}


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_framing_multi_piece_part_is_allocated_once_its_first_piece_arrived(monkeypatch, exact):
    from ding_buffer.distributed import framing

    monkeypatch.setattr(framing, 'PIECE', 4096)
    pipe = _Pipe(exact=exact)
    x = torch.arange(50_000, dtype=torch.int32)  # 200,000 bytes: 49 pieces
    out = pipe.roundtrip({'x': x})[2]
    assert torch.equal(out['x'], x)
    assert pipe.b.asked[0] == 4096 and set(pipe.b.asked[1:]) == {0}  # later pieces land in the part itself


def test_track_used_data_is_refused_with_a_distributed_backend():
    with pytest.raises(ValueError, match='enable_track_used_data'):  # a worker's data_id would name files to delete
        create_buffer(
            dict(
                type='naive',
                replay_buffer_size=8,
                storage=dict(type='list'),
                enable_track_used_data=True,
                distributed=dict(backend='torch'),
            )
        )


def test_sample_size_is_bounded_by_the_capacity():
    core = make_core(size=16)
    core.handle(W, req('push', data=item(1)))
    r = core.handle(W, req('sample', size=10**9, kwargs={}))
    assert r['error'] == 'ValueError' and 'capacity' in r['message']
    assert core.handle(W, req('sample', size='3'))['error'] == 'TypeError'  # as a local buffer's sample answers
    assert ok(core.handle(W, req('sample', size=np.int64(1), kwargs={}))) is not None  # a numpy int, as locally


def test_windows_are_bounded_by_the_stored_steps_not_by_the_capacity_in_episodes():
    """An R2D2 batch is more windows than the buffer holds episodes: through a manager it is served as locally
    (it was refused as beyond the capacity), and the reply is still bounded by the steps stored."""
    for cfg in (
        EasyDict(type='episode', replay_buffer_size=4, seed=0, storage=dict(type='tensor'), max_transitions=1000),
        EasyDict(
            type='prioritized_episode',
            replay_buffer_size=4,
            seed=0,
            max_transitions=1000,
            storage=dict(type='tensor'),
            sampler=dict(type='prioritized', unroll_len=5),
        ),
    ):
        buf, dcfg, key = build_manager_buffer(EasyDict(cfg, distributed=dict(backend='torch')))
        core = ManagerCore(buf, dcfg, key)
        for _ in range(4):
            ok(core.handle(W, req('push', data={'obs': torch.zeros(100, 3)})))
        kwargs = dict(unroll_len=5) if cfg.type == 'episode' else {}
        batch = ok(core.handle(W, req('sample', size=16, kwargs=kwargs)))
        assert batch['obs'].shape == (16, 5, 3)
        reply = core.handle(W, req('sample', size=20_000, kwargs=kwargs))  # 100,000 rows of 400 stored steps
        assert not reply['ok'] and '400 stored steps' in reply['message']


def test_decode_refuses_deep_nesting():
    deep = 1
    for _ in range(80):
        deep = [deep]
    with pytest.raises(CodecError, match='nests deeper'):
        roundtrip({'x': deep})


@pytest.mark.parametrize('depth', [DATA_DEPTH - 2, DATA_DEPTH + 1])
def test_deep_push_is_refused_unless_every_reply_carrying_it_can_be_read(depth):
    """Data nested as deep as a request may be would come back deeper (a state, a sample): the manager takes
    only what every reply can carry, and what it took, the replies carry."""
    deep = 1.0
    for _ in range(depth):
        deep = [deep]
    core = make_core(storage='list')
    before = wire(ok(core.handle(W, req('state_dict'))))
    r = core.handle(W, wire(req('push', data={'obs': deep}, client='c', seq=0)))
    if depth > DATA_DEPTH:
        assert r['error'] == 'CodecError' and 'nests deeper' in r['message']
        assert core.buffer.count() == 0
        assert_same(before, wire(ok(core.handle(W, req('state_dict')))))
        assert core.handle(W, req('put_blob', name='w', version=1, payload={'obs': deep}))['error'] == 'CodecError'
        return
    assert ok(r)['stored'] == 1
    for op, args in (('state_dict', {}), ('sample', dict(size=1))):
        out = wire(wire(core.handle(W, req(op, **args))))  # a reply, then that reply's data sent back
        assert out['ok'], (op, out.get('message'))
    ok(core.handle(W, req('put_blob', name='w', version=1, payload={'obs': deep})))
    assert wire(core.handle(W, req('get_blob', name='w')))['ok']


def nested(depth, leaf=1.0):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def test_deep_data_inside_a_slice_is_refused():
    core = make_core(storage='list')
    r = core.handle(W, wire(req('push', data={'obs': slice(nested(DATA_DEPTH), None, None)})))
    assert r['error'] == 'CodecError' and 'nests deeper' in r['message'] and core.buffer.count() == 0


@pytest.mark.parametrize('type_', ['naive', 'advanced', 'episode'])
def test_states_the_manager_loads_fit_in_its_replies_and_load_again(type_):
    """Whatever state the manager loads, its replies carry and a load of its own state takes: a push at the limit
    comes back in a state that loads again; a state in the documented ``{'data': [items]}`` form -- shallower than
    the buffer's own -- loads exactly when the buffer's state then fits, else it is refused with nothing changed."""
    cfg = dict(type=type_, replay_buffer_size=16, seed=0, storage=dict(type='list'))
    core = ManagerCore(*build_manager_buffer(EasyDict(cfg, distributed=dict(backend='torch'))))
    steps = [{'obs': nested(DATA_DEPTH - 2), 'done': False}, {'obs': nested(DATA_DEPTH - 2), 'done': True}]
    ok(core.handle(W, wire(req('push', data=[steps] if type_ == 'episode' else steps[1]))))
    ok(core.handle(W, wire(req('load_state_dict', state=ok(wire(core.handle(W, req('state_dict'))))))))
    assert core.buffer.count() == 1
    sample = dict(size=1, kwargs=dict(unroll_len=1)) if type_ == 'episode' else dict(size=1)
    outer = 3 if type_ == 'episode' else 2  # levels above the obs: state dict, data list, (episode list,) item
    loaded = []
    for depth in range(DATA_DEPTH - 2, STATE_DEPTH + 2):  # (the deepest list's level, the state's being 0)
        item = {'obs': nested(depth - outer), 'done': True}
        before = wire(core.handle(W, req('state_dict')))
        r = core.handle(W, wire(req('load_state_dict', state={'data': [[item] if type_ == 'episode' else item]})))
        if not r['ok']:
            assert r['error'] == 'CodecError' and 'nests deeper' in r['message'], r
            assert_same(before, wire(core.handle(W, req('state_dict'))))
            continue
        loaded.append(depth)
        state = wire(core.handle(W, req('state_dict')))
        assert state['ok'] and wire(core.handle(W, req('sample', **sample)))['ok']
        ok(core.handle(W, wire(req('load_state_dict', state=state['result']))))
    assert loaded and loaded == list(range(DATA_DEPTH - 2, loaded[-1] + 1)) and loaded[-1] < STATE_DEPTH


def raising_score_hook(batch, sender=None, buffer=None):
    raise KeyError('boom')


def test_push_that_stores_then_fails_scoring_is_never_stored_twice():
    core = make_core(storage='list', scoring_function=raising_score_hook)
    first = core.handle(W, req('push', data=item(1), client='c', seq=0))
    assert first['error'] == 'KeyError' and 'were stored' in first['message']
    again = core.handle(W, req('push', data=item(1), client='c', seq=0))  # the retry gets the same answer
    assert again['error'] == 'KeyError' and core.buffer.count() == 1


def test_a_request_longer_than_peer_timeout_loses_nobody():
    """A push whose scoring takes longer than peer_timeout holds the buffer: the other worker's request waits,
    nobody's heartbeat is read meanwhile, and still nobody is counted lost (in-process manager and workers)."""
    from ding_buffer.distributed import ReplayBufferManager
    from ding_buffer.distributed.channel import PeerChannel

    cfg = make_cfg(
        storage='list',
        timeout=10.0,
        peer_timeout=1.0,
        heartbeat_seconds=0.25,
        scoring_function='test_distributed_unit:slow_score_hook',
    )
    buf, dcfg, key = build_manager_buffer(cfg)
    wires = {}
    mgr = ReplayBufferManager(buf, _Net(0, [1, 2], wires, 10.0), dcfg, [1, 2], key)
    out = {}
    th = threading.Thread(target=lambda: out.update(mgr.run(timeout=60)), daemon=True)
    th.start()
    local_cfg = EasyDict({k: v for k, v in dict(cfg).items() if k != 'distributed'})
    a, b = (
        RemoteBuffer(local_cfg, dcfg, PeerChannel(_Net(r, [0], wires, 10.0), 0, 10.0, 0.25), log_reward_key=key)
        for r in (1, 2)
    )
    a.push(item(0))
    b.push(item(0))
    slow = threading.Thread(target=lambda: a.push(item(9)))  # scoring sleeps 2.5 s > peer_timeout
    slow.start()
    time.sleep(0.2)
    b.push(item(1))  # waits for the buffer behind the slow push
    slow.join()
    time.sleep(0.6)
    assert mgr.core.liveness.lost == {}, mgr.core.liveness.lost
    a.close()
    b.close()
    th.join(20)
    assert out['lost'] == {} and out['exited'] == ['1', '2'] and buf.count() == 4, out


class _LateCompletions(_Net):
    """Like MPI's Isend: the data reaches the peer as the frame is queued, while the sender thread sees the send
    complete only once ``gate`` is set (a starved thread under CPU contention)."""

    starts_sends = True

    def __init__(self, *args, gate, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate

    def _start_send(self, peer, buf):
        self._send_buf(peer, buf)

    def _finish_send(self, peer, handle, buf):
        assert self.gate.wait(30)


def test_replies_the_peer_read_but_the_sender_has_not_seen_leave_lose_nobody():
    """Synchronous requests whose replies the worker read while the manager's sender thread lagged (more of them
    than the manager keeps queued for one worker) are all answered and nobody is counted lost; the lag ends
    before distributed.timeout."""
    from ding_buffer.distributed import ReplayBufferManager
    from ding_buffer.distributed.channel import PeerChannel
    from ding_buffer.distributed.framing import MAX_QUEUED

    cfg = make_cfg(storage='list', timeout=10.0, peer_timeout=30.0, heartbeat_seconds=5.0)
    buf, dcfg, key = build_manager_buffer(cfg)
    wires, gate = {}, threading.Event()
    mgr = ReplayBufferManager(buf, _LateCompletions(0, [1], wires, 10.0, gate=gate), dcfg, [1], key)
    out = {}
    th = threading.Thread(target=lambda: out.update(mgr.run(timeout=60)), daemon=True)
    th.start()
    local_cfg = EasyDict({k: v for k, v in dict(cfg).items() if k != 'distributed'})
    w = RemoteBuffer(local_cfg, dcfg, PeerChannel(_Net(1, [0], wires, 10.0), 0, 10.0, 5.0), log_reward_key=key)
    w.push(item(0))
    opened = threading.Timer(1.0, gate.set)
    opened.start()
    t0 = time.monotonic()
    counts = [w.count() for _ in range(3 * MAX_QUEUED)]
    waited = time.monotonic() - t0
    assert counts == [1] * (3 * MAX_QUEUED)
    # the replies past MAX_QUEUED waited for the lag to end (no reply was refused: nobody lost, every count right)
    assert waited > 0.5, waited
    w.close()
    th.join(20)
    opened.cancel()
    assert out['lost'] == {} and out['exited'] == ['1'], out


SLOW_SCORE = {'seconds': 2.5, 'release': threading.Event()}  # what slow_score_hook waits for


def slow_score_hook(batch, sender=None, buffer=None):
    """scoring_function: item 9's push is scored for SLOW_SCORE['seconds'] (or until SLOW_SCORE['release'] is set)."""
    obs = batch['obs'] if isinstance(batch, dict) else batch[0]['obs']
    if float(obs.reshape(-1)[0]) == 9.0:
        SLOW_SCORE['release'].wait(SLOW_SCORE['seconds'])
    return {}


def _big_batch(i, rows=320):  # 320 x 128 float32 = 160 KiB: sent out of line, kept by the receive pool
    g = torch.Generator().manual_seed(i)
    return {'obs': torch.randn(rows, 128, generator=g), 'log_reward': torch.full((rows,), float(i))}


@pytest.mark.parametrize('exact', [False, True], ids=['gloo-like', 'mpi-like'])
def test_receive_buffers_are_reused_only_once_nothing_holds_them(exact):
    """A large part lands in the warm buffer of an earlier message of the same size only after every view of
    that message is gone: a decoded message the caller still holds is never overwritten."""
    pipe = _Pipe(exact=exact)
    a, b = _big_batch(1)['obs'], _big_batch(2)['obs']
    first = pipe.roundtrip({'x': a})  # held below
    second = pipe.roundtrip({'x': b})  # arrives while `first` is alive: a new buffer
    assert torch.equal(first[2]['x'], a) and torch.equal(second[2]['x'], b)
    assert pipe.b.recv_buffers_reused == 0
    del first, second
    for i in range(3, 6):
        got = pipe.roundtrip({'x': _big_batch(i)['obs']})
        assert torch.equal(got[2]['x'], _big_batch(i)['obs'])
        del got
    assert pipe.b.recv_buffers_reused == 3
    small = pipe.roundtrip({'x': torch.arange(10)})  # inline in the head: the pool is not involved
    assert torch.equal(small[2]['x'], torch.arange(10)) and pipe.b.recv_buffers_reused == 3


def test_receive_pool_keeps_only_recurring_sizes_within_its_limits():
    """Parts whose sizes vary pin no memory; a size that recurs is kept and reused; limits hold."""
    from ding_buffer.distributed.recv_pool import MAX_BUFFERS, MAX_BYTES, RecvPool

    pool = RecvPool()
    for k in range(20):  # 20 different sizes: every one a miss, none kept
        n = (1 << 17) + 4096 * k
        assert pool.take(n) is None
        pool.keep(np.zeros(n, np.uint8))
    n = 1 << 17
    for _ in range(2):  # the first miss of n is not kept, the second (a size that recurs) is
        assert pool.take(n) is None
        pool.keep(np.zeros(n, np.uint8))
    assert pool.take(n) is not None and pool.hits == 1
    held = pool.take(n)  # the one buffer is free again (the returned array was not kept)
    assert held is not None and pool.take(n) is None  # held now: never handed out twice
    assert pool.take(100) is None and pool.take(1 << 30) is None  # outside the pooled range
    for k in range(3 * MAX_BUFFERS):
        size = 30 << 20
        pool.take(size)
        pool.keep(np.zeros(size, np.uint8))
    kept = [pool.take(30 << 20) for _ in range(MAX_BUFFERS)]
    assert sum(b is not None for b in kept) * (30 << 20) <= MAX_BYTES


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_pushed_data_survives_receive_buffer_recycling(storage):
    """Pushes of one size land in recycled receive buffers: every stored item still reads back exactly as pushed,
    whether the storage copies each push (tensor) or keeps Python objects (list)."""
    cfg = make_cfg(type='naive', size=320 * 4, storage=storage, timeout=10.0, heartbeat_seconds=5.0)
    mgr, out, th, (w,) = _in_process_job(cfg)
    for i in range(8):
        w.push(_big_batch(i), batched=True)
    data = mgr.buffer.sample(320 * 4, replace=False)  # the whole buffer: the last 4 batches
    if isinstance(data, dict):  # tensor storage samples a batch of columns
        obs, lr = data['obs'], data['log_reward']
    else:
        obs, lr = torch.stack([d['obs'] for d in data]), torch.stack([torch.as_tensor(d['log_reward']) for d in data])
    assert sorted(set(lr.tolist())) == [4.0, 5.0, 6.0, 7.0]
    for i in range(4, 8):
        got = obs[lr == i]
        want = _big_batch(i)['obs']
        order = torch.argsort(got[:, 0])
        assert torch.equal(got[order], want[torch.argsort(want[:, 0])]), f"batch {i} changed after it was stored"
    w.close()
    th.join(20)
    assert out['exited'] == ['1']
    if storage == 'tensor':  # it copies every push: each buffer is free again once the push is stored
        assert out['recv_buffers_reused'] >= 6, out['recv_buffers_reused']


def test_poll_returns_when_done_and_fails_at_the_deadline():
    from ding_buffer.distributed.poll_wait import poll, precise_sleeps

    precise_sleeps()  # Linux: the thread's timer slack; elsewhere nothing
    flag = threading.Event()
    kick = threading.Event()
    t = time.monotonic()
    threading.Timer(0.05, flag.set).start()
    assert poll(flag.is_set, t + 60, kick=kick) and flag.is_set()  # True once done (at the deadline: False)
    t = time.monotonic()
    assert not poll(lambda: False, t + 0.1, busy_until=lambda: t + 0.05)
    assert time.monotonic() - t >= 0.1
    done = threading.Event()
    threading.Timer(0.05, lambda: (done.set(), kick.set())).start()  # a kick ends an idle pause: polled again
    t = time.monotonic()
    assert poll(done.is_set, t + 60, kick=kick) and time.monotonic() - t < OUTER


def test_a_sample_poll_that_outlives_the_sample_timeout_is_a_sample_timeout(monkeypatch):
    """sample(timeout=t) against a manager busy with another worker's slow push (held until the test releases
    it): the poll cannot be answered within t, and the call raises SampleTimeoutError (not
    ManagerUnavailableError) after at least t seconds, while the slow push is still being scored."""
    release = threading.Event()
    monkeypatch.setitem(SLOW_SCORE, 'release', release)
    monkeypatch.setitem(SLOW_SCORE, 'seconds', 60.0)
    cfg = make_cfg(
        type='naive',
        storage='list',
        timeout=10.0,
        heartbeat_seconds=5.0,
        scoring_function='test_distributed_unit:slow_score_hook',
    )
    mgr, out, th, (a, b) = _in_process_job(cfg, n_workers=2)
    b.push(item(1))
    slow = threading.Thread(target=lambda: a.push(item(9)))  # scoring holds the buffer until released
    slow.start()
    time.sleep(0.3)
    t = time.monotonic()
    try:
        with pytest.raises(SampleTimeoutError, match='within 0.5s'):
            b.sample(1, timeout=0.5)
        assert time.monotonic() - t >= 0.5
        assert slow.is_alive()  # the sample timeout ended the call, not the end of the slow push
    finally:
        release.set()
    slow.join()
    assert len(b.sample(2, timeout=5)) == 2  # the manager and this worker's channel serve on
    a.close()
    b.close()
    th.join(20)
    assert out['lost'] == {}, out


def test_remote_sample_takes_a_numpy_timeout_as_seconds():
    """A numpy timeout (np.float32, np.int64) is seconds, as a Python number is, and crosses the wire as one."""
    cfg = make_cfg(type='naive', storage='list', timeout=5.0, heartbeat_seconds=5.0)
    mgr, out, th, (w,) = _in_process_job(cfg)
    w.push(item(1))
    assert len(w.sample(1, timeout=np.float32(5))) == 1
    with pytest.raises(SampleTimeoutError):
        w.sample(4, replace=False, timeout=np.int64(0))
    w.close()
    th.join(20)
    assert out['exited'] == ['1']


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -1.0, True, 'x', 1e300])
def test_remote_sample_refuses_a_bad_timeout_before_asking(bad):
    """sample(timeout=NaN) used to poll forever (NaN never runs out); every bad timeout is refused by name, as the
    local buffers refuse it, and the buffer and the channel are unchanged."""
    cfg = make_cfg(type='naive', storage='list', timeout=5.0, heartbeat_seconds=5.0)
    mgr, out, th, (w,) = _in_process_job(cfg)
    w.push(item(1))
    before = w.state_dict()
    with pytest.raises(ValueError, match='timeout must be None or a number of seconds'):
        w.sample(1, timeout=bad)
    assert_same(w.state_dict(), before)
    assert len(w.sample(1, timeout=5)) == 1
    w.close()
    th.join(20)
    assert out['exited'] == ['1']


def test_one_deadline_bounds_a_push_that_resends_first():
    rb, core, ch = make_remote(timeout=1.0)
    fast = ch.result

    def slow_result(ticket, op, deadline=None, _orig=fast):
        left = deadline - time.monotonic()
        time.sleep(min(0.8, max(left, 0)))
        if left < 0.8:
            raise ManagerUnavailableError('slow manager')
        return _orig(ticket, op, deadline)

    ch.fail = 'late'
    with pytest.raises(ManagerUnavailableError):
        rb.push(item(0))
    ch.fail = None
    ch.result = slow_result
    # resend (0.8 s) + its own push (0.8 s) > timeout: slow_result raises once what is left of the call's one
    # deadline is too short (a fresh deadline for the push would let it through)
    with pytest.raises(ManagerUnavailableError):
        rb.push(item(1))
    ch.result = fast
    rb.push(item(1))  # now fast: the push in doubt, then this one
    assert core.buffer.count() == 2


def test_buffer_types_declare_what_the_distributed_layer_needs():
    from ding_buffer.distributed.config import build_distributed_config

    dcfg = build_distributed_config({'backend': 'torch', 'log_reward_key': 'score'})
    naive = get_buffer_cls({'type': 'naive'})
    assert profile(naive, EasyDict(), dcfg) == {
        'dict_is_batch': False,
        'log_reward_key': 'score',
        'scoring_keys': None,
        'item_kind': 'transition',
        'sample_kwargs': ('cur_learner_iter', 'sample_range', 'replace'),
        'has_log_rewards': False,
        'version_gate': False,
    }
    gfn = get_buffer_cls({'type': 'gfn_diverse'})
    assert profile(gfn, EasyDict(log_reward_key='lr', condition_key='c'), dcfg) == {
        'dict_is_batch': True,
        'log_reward_key': 'lr',
        'scoring_keys': ['state', 'lr', 'c'],
        'item_kind': 'trajectory',
        'sample_kwargs': ('cur_learner_iter', 'replace', 'n_samples'),
        'has_log_rewards': True,
        'version_gate': False,
    }


def test_file_root_is_resolved_once(tmp_path, monkeypatch):
    (tmp_path / 'root').mkdir()
    monkeypatch.chdir(tmp_path)
    core = make_core(storage='list', file_root='root')  # relative to the directory at construction
    monkeypatch.chdir('/')
    core.handle(W, req('push', data=item(1)))
    assert ok(core.handle(W, req('save_data', path='a.buf'))) == str(tmp_path / 'root' / 'a.buf')


# ---------------------------------------------------------------------------------- versioned blobs (weights)
def test_blob_put_get_keeps_only_newer_versions_through_the_wire():
    """A learner's weights as a versioned blob: a get returns the payload only when it is newer than the
    caller's version; an older or repeated put changes nothing; the payload round-trips through the codec."""
    core = make_core()
    weights = {'net.0.weight': torch.randn(4, 3), 'net.0.bias': torch.randn(4)}
    assert ok(core.handle('w0', req('get_blob', name='weights'))) is None
    assert ok(core.handle('w0', req('put_blob', name='weights', version=3, payload=weights))) == {
        'stored': True,
        'version': 3,
    }
    wire = decode(*encode(req('put_blob', name='weights', version=2, payload={'x': torch.zeros(1)})))
    assert ok(core.handle('w1', wire)) == {'stored': False, 'version': 3}  # a delayed older put
    got = ok(core.handle('w1', decode(*encode(req('get_blob', name='weights', newer_than=-1)))))
    assert got['version'] == 3 and got['payload'].keys() == weights.keys()
    assert all(torch.equal(got['payload'][k], weights[k]) for k in weights)
    assert ok(core.handle('w1', req('get_blob', name='weights', newer_than=3))) is None
    assert ok(core.handle('w1', req('put_blob', name='weights', version=4, payload={'v': 4})))['stored']
    assert ok(core.handle('w1', req('get_blob', name='weights', newer_than=3)))['payload'] == {'v': 4}
    assert ok(core.handle('w1', req('stats')))['manager/blob_version/weights'] == 4


@pytest.mark.parametrize(
    'args,match',
    [
        (dict(name='', version=0, payload=1), 'blob name'),
        (dict(name='x' * 65, version=0, payload=1), 'blob name'),
        (dict(name='a\nb', version=0, payload=1), 'blob name'),
        (dict(name=7, version=0, payload=1), 'blob name'),
        (dict(name='w', version=-1, payload=1), r'blob version must be an int in [0, 2**62)'),
        (dict(name='w', version=1.5, payload=1), 'blob version'),
        (dict(name='w', version=True, payload=1), 'blob version'),
        (dict(name='w', version=1 << 62, payload=1), 'blob version'),
    ],
)
def test_blob_bad_requests_are_answered_and_change_nothing(args, match):
    core = make_core()
    ok(core.handle('w0', req('put_blob', name='w', version=1, payload={'a': 1})))
    reply = core.handle('w0', req('put_blob', **args))
    assert not reply['ok'] and reply['error'] == 'ValueError' and match in reply['message']
    assert ok(core.handle('w0', req('get_blob', name='w'))) == {'version': 1, 'payload': {'a': 1}}


def test_blob_names_are_bounded():
    core = make_core()
    for i in range(16):
        ok(core.handle('w0', req('put_blob', name=f'b{i}', version=0, payload=i)))
    reply = core.handle('w0', req('put_blob', name='one_more', version=0, payload=0))
    assert not reply['ok'] and 'at most 16' in reply['message']
    assert ok(core.handle('w0', req('put_blob', name='b3', version=1, payload=33)))['stored']  # known names still move


def test_blob_bytes_are_bounded_by_max_blob_mb():
    """A peer cannot make the manager hold more than distributed.max_blob_mb of blobs; a refused put changes nothing
    and a replacement counts only its own size."""
    core = make_core(max_blob_mb=1.0)
    half = torch.zeros(1 << 17, dtype=torch.float32)  # 512 KiB
    assert ok(core.handle('w0', req('put_blob', name='a', version=0, payload={'w': half})))['stored']
    reply = core.handle('w0', req('put_blob', name='b', version=0, payload={'w': torch.zeros(1 << 18)}))  # 1 MiB
    assert not reply['ok'] and 'max_blob_mb' in reply['message']
    assert ok(core.handle('w0', req('get_blob', name='b'))) is None
    assert ok(core.handle('w0', req('put_blob', name='a', version=1, payload={'w': torch.zeros(1 << 17)})))['stored']
    assert ok(core.handle('w0', req('get_blob', name='a')))['version'] == 1


@pytest.mark.parametrize(
    'payload',
    [
        {'s': '\U0001f600' * 300_000},
        {'n': [10**4000] * 300},
        {'l': slice('\U0001f600' * 300_000, None, None)},
        {'t': [torch.zeros(1) for _ in range(500)]},
    ],
    ids=['4-byte characters', 'big ints', 'a slice of them', 'many small tensors'],
)
def test_blob_strings_and_big_ints_count_their_bytes_against_max_blob_mb(payload):
    """300,000 characters of 4 bytes (1.2 MB held) and 300 ints of 4,000 digits (0.5 MB) each hold more than
    their count of characters or entries suggests."""
    core = make_core(max_blob_mb=0.4)
    reply = core.handle('w0', req('put_blob', name='a', version=0, payload=payload))
    assert not reply['ok'] and 'max_blob_mb' in reply['message']


def test_distributed_max_reuse_reaches_a_chunk_buffer():
    """chunk names max_use max_reuse: distributed.max_reuse sets it (it was refused as a type without max_use)."""
    buf, _, _ = build_manager_buffer(
        EasyDict(type='chunk', fragments_per_chunk=2, distributed=dict(backend='torch', max_reuse=3))
    )
    assert buf.cfg.max_reuse == 3
    buf.close()


def test_a_frames_manager_serves_workers_pushing_their_own_streams():
    """A manager whose buffer keeps frames once (storage.frames) with two workers, each pushing its own
    environment's steps (env_id), interleaved: what a worker samples is exactly what was pushed, n-step returns
    included (the stacks travel in full; the manager stores each frame once)."""
    cfg = make_cfg(type='advanced', size=64, timeout=10.0, heartbeat_seconds=5.0)
    cfg['storage'] = dict(type='tensor', frames=dict(env_key='env_id', n_step=2, gamma=0.5))
    mgr, out, th, (a, b) = _in_process_job(cfg, n_workers=2)
    rng = np.random.default_rng(0)
    frames = {e: [rng.integers(0, 256, (3, 3), dtype=np.uint8) for _ in range(12)] for e in (0, 1)}
    pushed = {}
    for t in range(10):
        for e, w in ((0, a), (1, b)):
            f = frames[e]
            step = dict(
                obs=np.stack([f[max(t - 1, 0)], f[t]]),
                next_obs=np.stack([f[t], f[t + 1]]),
                reward=float(t + 10 * e),
                done=t == 9,
                env_id=e,
                step=100 * e + t,
            )
            w.push(step)
            pushed[step['step']] = step
    got = a.sample(20)
    assert got is not None and len(got['step']) == 20
    for j, s in enumerate(got['step'].tolist()):
        e, t = divmod(s, 100)
        ref = pushed[s]
        assert np.array_equal(got['obs'][j].numpy(), ref['obs'])
        last = pushed[100 * e + min(t + 1, 9)]
        assert np.array_equal(got['next_obs'][j].numpy(), last['next_obs'])
        expected = ref['reward'] + (0.5 * last['reward'] if t < 9 else 0.0)
        assert got['reward'][j].item() == pytest.approx(expected)
    a.close()
    b.close()
    th.join(20)
    assert out['lost'] == {}, out


def test_a_worker_lost_for_silence_holds_the_manager_lost_grace_more_seconds():
    """Lost for silence alone (maybe behind a partition, or the manager's own link was cut), a worker still holds
    the manager lost_grace seconds (default peer_timeout); one lost by its connection, or that exited, does not;
    one that speaks again rejoins and is waited for as before."""
    from ding_buffer.distributed.config import build_distributed_config
    from ding_buffer.distributed.liveness import Liveness

    for grace, expect in ((None, 3.0), (10.0, 10.0), (0.0, 0.0)):
        live = Liveness(
            build_distributed_config(dict(backend='torch', peer_timeout=3.0, heartbeat_seconds=1.0, lost_grace=grace))
        )
        t0 = 1000.0
        for w in (0, 2):
            live.seen(w, t0)
        live.check_silent(now=t0 + 1.0)
        live.check_silent(now=t0 + 2.0)
        live.check_silent(now=t0 + 3.5)  # 0 and 2: silent 3.5 s > peer_timeout
        assert set(live.lost) == {0, 2}
        live.seen(1)
        live.lose(1, 'its connection broke')  # a broken connection: done at once
        live.exit(2)
        since = live.silent_since[0]
        assert live.done(1) and live.done(2)
        assert live.done(0, now=since + expect) and (expect == 0.0 or not live.done(0, now=since + expect - 0.01))
        live.seen(0)  # it speaks again: rejoined, waited for
        assert not live.done(0) and live.rejoined == {0: 1}


def test_the_last_workers_exit_reply_is_queued_before_the_manager_says_goodbye():
    """The manager's run loop may wake between applying the last worker's EXIT and queuing its reply (here it is
    woken there on purpose, and the reply is held back past a poll); it still queues that reply before its
    goodbye, so the worker's close() returns instead of meeting a manager that already said goodbye."""
    cfg = make_cfg(storage='list', timeout=10.0)
    mgr, out, th, (w,) = _in_process_job(cfg)
    real_send = mgr.transport.send

    def late_final_send(peer, obj, **kw):
        if isinstance(obj, dict) and obj.get('final'):
            mgr.transport.inbox.put((peer, 'exited', None))  # run() re-checks its exit condition now
            time.sleep(1.2)  # two polls of run()
        return real_send(peer, obj, **kw)

    mgr.transport.send = late_final_send
    w.push(item(0))
    w.close()  # raised ManagerUnavailableError when run() closed the transport under the reply
    th.join(20)
    assert not th.is_alive() and out['exited'] == ['1'] and out['lost'] == {}, out


def test_a_single_item_with_a_length_is_one_item():
    """A str, a tensor, a tuple or bytes pushed as one item is one item (its length counted 5, 4, 3, 6), in the
    push's answer and the manager's counters, as a local push answers."""
    rb, core, ch = make_remote('naive', storage='list')
    answers = [rb.push(x) for x in ('hello', torch.randn(4), (1, 2, 3), b'abcdef')]
    assert answers == [1, 1, 1, 1]
    assert core.buffer.count() == 4 and core.counters['pushed_items'] == 4


def test_close_sends_exit_before_raising_the_refusal_of_a_last_pending_push():
    """A pending push (remote_buffer_freq) that the buffer refuses when close() sends it: EXIT is still sent (the
    worker is counted as exited, not lost), then the refusal is raised; close() is done."""
    rb, core, ch = make_remote('naive', remote_buffer_freq=4)
    rb.push({'obs': torch.zeros(2)})
    rb.push({'obs': torch.zeros(3)})  # another shape: refused when it is sent
    with pytest.raises(ValueError, match="field 'obs'"):
        rb.close()
    assert ch.ops()[-1] == 'exit' and core.buffer.count() == 1
    rb.close()  # idempotent


def test_a_remote_gfn_sample_takes_torchgfns_n_samples():
    rb, core, ch = make_remote('gfn', size=100)
    rb.push(gfn_batch([0.0, 1.0, 2.0]))
    assert len(rb.sample(n_samples=2)['log_reward']) == 2
    with pytest.raises(TypeError, match='give one'):
        rb.sample(2, n_samples=2)


@pytest.mark.parametrize('exc', [IsADirectoryError, NotADirectoryError, FileExistsError, FileNotFoundError])
def test_file_errors_of_the_manager_arrive_as_their_os_error(exc):
    """A save onto a directory, under a file, ...: the worker raises the manager's OSError type (``except
    OSError`` catches it, as for a local buffer), not a RemoteError."""
    from ding_buffer.distributed.protocol import error_reply, result_of

    with pytest.raises(exc, match='manager: .*boom'):
        result_of(error_reply(1, exc('boom')), 'save_data')


def sharded_remote(type='advanced', size=64, **dist):
    """Two in-process managers (``make_remote`` each) used as one ``ShardedBuffer``; also their cores."""
    from ding_buffer.distributed.sharded import ShardedBuffer

    shards, cores = zip(*[make_remote(type, size, **dist)[:2] for _ in range(2)])
    local_cfg = without(make_cfg(type, size, **dist), 'distributed')
    return ShardedBuffer(list(shards), local_cfg, seed=0), cores


def states(cores):
    return [c.buffer.state_dict() for c in cores]


def test_a_sharded_update_refused_anywhere_changes_no_shard():
    """A bad row in a later shard's part, a short column or a float ``shard`` column: refused as one buffer refuses
    it, naming the key, before any shard changed."""
    buf, cores = sharded_remote()
    for i in range(6):
        buf.extend({'obs': torch.full((2, 2), float(i))})
    s = buf.sample(6)
    order = torch.argsort(s['shard'], stable=True)  # shard 0's rows first, so the bad one is in shard 1's part
    info = {k: s[k][order] for k in ('replay_unique_id', 'replay_buffer_idx', 'shard')}
    assert set(info['shard'].tolist()) == {0, 1}
    before = states(cores)
    bad_idx = dict(info, replay_buffer_idx=info['replay_buffer_idx'].clone(), priority=torch.full((6,), 2.0))
    bad_idx['replay_buffer_idx'][-1] = 999
    with pytest.raises(ValueError, match=r"'replay_buffer_idx' must be in \[0, 64\), got .*999"):
        buf.update(bad_idx)
    with pytest.raises(ValueError, match='lengths differ: shard 6, priority 5'):
        buf.update(dict(info, priority=torch.full((5,), 3.0)))
    with pytest.raises(TypeError, match="'shard' must be ints"):
        buf.update(dict(info, shard=info['shard'] + 0.4, priority=torch.full((6,), 3.0)))
    assert_same(states(cores), before)
    assert buf.update(dict(info, priority=torch.full((6,), 3.0))) == {'updated': 6, 'stale': 0}


def test_a_sharded_load_data_that_a_shard_refuses_puts_the_others_back(tmp_path):
    buf, cores = sharded_remote(file_root=str(tmp_path))
    for i in range(6):
        buf.extend({'obs': torch.full((2, 2), float(i))})
    buf.save_data('ck')
    for i in range(6, 8):
        buf.extend({'obs': torch.full((2, 2), float(i))})
    before = states(cores)
    with open(tmp_path / 'ck.shard1', 'r+b') as f:  # shard 1's file truncated: shard 0 loads first
        f.truncate(100)
    with pytest.raises(ValueError, match='ck.shard1'):
        buf.load_data('ck')
    assert_same(states(cores), before)
    assert [c.buffer.count() for c in cores] == [8, 8]


def test_a_sharded_sample_with_replacement_larger_than_a_shards_capacity_draws():
    """A manager replies at most its capacity: a shard owed more draws answers in several calls, so the sharded
    buffer draws what one buffer of all the shards' capacity draws (and ``why_not_sample`` agrees)."""
    buf, cores = sharded_remote('naive', size=16)
    buf.extend({'obs': torch.arange(12.0).reshape(6, 2)})
    buf.extend({'obs': torch.arange(12.0, 24.0).reshape(6, 2)})
    for size in (28, 32):
        out = buf.sample(size, replace=True)
        assert out['obs'].shape == (size, 2) and set(out['shard'].tolist()) == {0, 1}
        assert set(out['obs'][:, 0].tolist()) <= set(range(0, 24, 2))
    gfn, cores = sharded_remote('gfn', size=16)  # gfn draws with replacement when asked for more than it holds
    gfn.extend(gfn_batch([float(i) for i in range(6)]))
    gfn.extend(gfn_batch([float(i) for i in range(6, 12)]))
    assert gfn.why_not_sample(28) == ''
    assert len(gfn.sample(28)['log_reward']) == 28 and len(gfn.sample(32)['log_reward']) == 32


def test_remote_why_not_sample_refuses_what_remote_sample_refuses():
    """A size beyond the manager's capacity: ``sample`` refuses it, so ``why_not_sample`` does not say it would
    draw -- it raises the same error."""
    rb, core, ch = make_remote('gfn', size=16)
    rb.push(gfn_batch([0.0, 1.0, 2.0]))
    msgs = []
    for call in (lambda: rb.sample(17), lambda: rb.why_not_sample(17), lambda: rb.why_not_sample(17, timeout=1.0)):
        with pytest.raises(ValueError, match='at most 16') as e:
            call()
        msgs.append(str(e.value))
    assert len(set(msgs)) == 1 and rb.why_not_sample(16) == ''
    # windows: a sample's own unroll_len bounds it (more windows than episodes), so the size alone is no refusal
    cfg = EasyDict(type='episode', replay_buffer_size=2, seed=0, distributed=dict(backend='torch'))
    buf, dcfg, key = build_manager_buffer(cfg)
    rb = worker_buffer(
        get_buffer_cls(cfg), EasyDict(without(cfg, 'distributed')), dcfg, Loopback(ManagerCore(buf, dcfg, key))
    )
    for e in range(2):
        rb.push([[{'obs': torch.full((2,), float(10 * e + t)), 'done': t == 9} for t in range(10)]])
    assert rb.why_not_sample(5) == buf.why_not_sample(5) != ''  # the buffer's own answer, not a refused size
    assert rb.sample(5, unroll_len=2) is not None


def test_remote_update_takes_object_arrays_of_ids_as_a_local_buffer_does():
    """List storage's string ids in a numpy object array (what ``np.array`` of a sample's ids gives)."""
    rb, core, ch = make_remote('advanced', storage='list')
    local = create_buffer(without(make_cfg('advanced', storage='list'), 'distributed'))
    results = []
    for buf in (rb, local):
        for i in range(4):
            buf.push({'obs': torch.tensor([float(i)])})
        s = buf.sample(2)
        info = {
            'replay_unique_id': np.array([x['replay_unique_id'] for x in s], dtype=object),
            'replay_buffer_idx': np.array([x['replay_buffer_idx'] for x in s]),
            'priority': np.array([5.0, 6.0]),
        }
        results.append(buf.update(info))
    assert results[0] == results[1] == {'updated': 2, 'stale': 0}


def test_a_sharded_load_data_of_managers_moves_no_state_over_the_wire(tmp_path):
    """Loading files into managers all or nothing keeps each manager's state before the load on that manager (until
    the client ends the load): a shard larger than one message loads, and the managers send replies only."""
    from ding_buffer.distributed.sharded import ShardedBuffer

    cfg = make_cfg('naive', 64, 'tensor', file_root=str(tmp_path), timeout=10.0, heartbeat_seconds=5.0)
    jobs = [_in_process_job(cfg) for _ in range(2)]
    buf = ShardedBuffer([j[3][0] for j in jobs], without(cfg, 'distributed'), seed=0)
    for i in range(8):  # 4 pushes of 0.5 MiB per shard
        buf.push({'obs': torch.full((1, 128 * 1024), float(i))})
    buf.save_data('ck')
    buf.push({'obs': torch.zeros(1, 128 * 1024)})
    sent = [j[0].transport.sent_bytes for j in jobs]
    buf.load_data('ck')
    assert [j[0].buffer.count() for j in jobs] == [4, 4]
    assert all(j[0].transport.sent_bytes - s < (64 << 10) for j, s in zip(jobs, sent))  # replies, no states
    (tmp_path / 'ck.shard1').write_bytes((tmp_path / 'ck.shard1').read_bytes()[:200])
    buf.push({'obs': torch.ones(1, 128 * 1024)})  # one shard holds 5 items now
    before = [j[0].buffer.state_dict() for j in jobs]
    with pytest.raises(ValueError, match='ck.shard1'):
        buf.load_data('ck')
    assert_same([j[0].buffer.state_dict() for j in jobs], before)  # shard 0 put back as it was before the load
    assert sorted(j[0].buffer.count() for j in jobs) == [4, 5]
    buf.close()
    for j in jobs:
        j[2].join(20)


def test_a_sharded_load_data_whose_reply_is_lost_puts_every_shard_back(tmp_path):
    """A shard's manager applied the load but its reply did not come: that shard is asked to put its state back too
    (a manager that kept none answers so), and no manager keeps a copy after the call."""
    from ding_buffer.distributed.sharded import ShardedBuffer

    parts = [make_remote('advanced', 64, file_root=str(tmp_path)) for _ in range(2)]
    buf = ShardedBuffer([p[0] for p in parts], without(make_cfg('advanced', 64), 'distributed'), seed=0)
    cores, ch1 = [p[1] for p in parts], parts[1][2]
    for i in range(4):
        buf.extend({'obs': torch.full((2, 2), float(i))})
    buf.save_data('ck')
    for i in range(4, 8):
        buf.extend({'obs': torch.full((2, 2), float(i))})
    before = states(cores)
    submit = ch1.submit

    def late_load(request, deadline=None):  # applied, reply lost
        ch1.fail = 'late' if request.get('op') == 'load_data' else None
        try:
            return submit(request, deadline)
        finally:
            ch1.fail = None

    ch1.submit = late_load
    with pytest.raises(ManagerUnavailableError, match='shard 1 of 2'):
        buf.load_data('ck')
    assert_same(states(cores), before)
    ch1.submit = submit
    assert buf.load_data('ck') and [c.buffer.count() for c in cores] == [4, 4]


def test_a_manager_keeps_a_state_for_undo_only_while_its_loader_is_alive_and_never_undoes_a_later_load(tmp_path):
    """``load_data(undo=True)`` keeps the state before the load until ``end_load``; a sender counted lost drops it,
    and another sender's load since then is never undone by it."""
    cfg = make_cfg('naive', 32, file_root=str(tmp_path))
    buf, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buf, dcfg, key)
    local_cfg = EasyDict(without(cfg, 'distributed'))
    rb, other = (worker_buffer(get_buffer_cls(cfg), local_cfg, dcfg, Loopback(core, sender=s)) for s in (W, 'w2'))
    rb.extend({'obs': torch.arange(8.0).reshape(4, 2)})
    rb.save_data('a')
    rb.extend({'obs': torch.arange(4.0).reshape(2, 2)})
    assert rb.load_data('a', undo=True) and rb.count() == 4
    other.extend({'obs': torch.zeros(3, 2)})
    other.load_data('a')  # another sender's load since: not undone
    assert rb.end_load(True) is True and rb.count() == 4 and rb.end_load(False) is False
    rb.extend({'obs': torch.zeros(1, 2)})
    rb.load_data('a', undo=True)
    assert rb.end_load(True) is True and rb.count() == 5  # put back: nothing loaded since
    rb.load_data('a', undo=True)
    core.liveness.lose(W, 'it closed its connection without EXIT')  # (as the runner counts a sender lost)
    other.count()  # any request: the lost sender's kept state goes
    assert rb.end_load(True) is False and rb.count() == 4
    with pytest.raises(TypeError, match='undo must be a bool'):
        rb.load_data('a', undo=1)


# ================================================================================================ local parity
@pytest.mark.parametrize(
    'type_,batch',
    [
        ('naive', {'obs': [[1.0, 2.0], [3.0, 4.0]], 'k': [1, 2]}),
        ('gfn', {'state': [[1.0, 2.0], [3.0, 4.0]], 'log_reward': [0.5, 0.25]}),
    ],
)
def test_a_batch_dict_of_list_leaves_is_stored_remotely_as_locally(type_, batch):
    """A worker counted a batch's rows from its tensor and array leaves only: a batch of lists, which a local buffer
    stores, was refused before it was sent, naming no field; leaves that disagree are named as locally."""
    rb, core, ch = make_remote(type_)
    local = create_buffer(without(make_cfg(type_), 'distributed'))
    push = (lambda b, x: b.extend(x)) if type_ == 'naive' else (lambda b, x: b.push(x))
    for buf in (rb, local):
        assert push(buf, batch) == 2 and buf.count() == 2
    assert_same(core.buffer.state_dict(), local.state_dict())
    key = next(iter(batch))
    for buf in (rb, local):
        with pytest.raises(ValueError, match='leading dimension') as err:
            push(buf, dict(batch, **{key: batch[key][:1]}))
        assert any(f"'{k}'" in str(err.value) for k in batch)  # a field is named


def test_float_nans_travel_bit_for_bit_and_an_int_too_long_for_text_is_named():
    import struct

    bits = lambda x: struct.pack('<d', x)  # noqa: E731
    payload = struct.unpack('<d', struct.pack('<Q', 0x7FF8000000000123))[0]
    values = [-float('nan'), payload, np.float32(np.frombuffer(bytes.fromhex('2301c07f'), np.float32)[0])]
    got = wire({'a': values[0], 'b': [values[1]], 'c': values[2], 'd': np.complex64(complex(float('nan'), 1.0))})
    assert bits(got['a']) == bits(values[0]) and type(got['a']) is float
    assert bits(got['b'][0]) == bits(values[1])
    assert got['c'].dtype == np.float32 and got['c'].tobytes() == values[2].tobytes()
    assert got['d'].dtype == np.complex64 and np.isnan(got['d'].real) and got['d'].imag == 1.0
    with pytest.raises(ValueError, match=r"the int at 'message.x\[1\]'"):
        encode({'x': [1, 10**5000]})
    for bad in (-1, 1 << 64, 1.5, True):
        with pytest.raises(CodecError, match='bad float node'):
            decode(header_of({'$f': bad}), [])


def _run_expecting_timeout(mgr):
    try:
        mgr.run(timeout=1.0)
    except TimeoutError:  # (the dropped worker never said goodbye)
        pass


@pytest.mark.slow
def test_a_worker_dropped_without_close_leaves_no_sender_thread():
    """The transport's sender thread waited for a frame for good, holding the transport: each RemoteBuffer dropped
    without ``close()`` left one (in-process, one a round). An idle sender ends; the next frame starts another."""
    import gc

    from ding_buffer.distributed import ReplayBufferManager
    from ding_buffer.distributed.channel import PeerChannel

    def senders():
        return [t for t in threading.enumerate() if t.name.startswith('ding_buffer-send')]

    before = len(senders())
    for _ in range(3):
        cfg = make_cfg('naive', storage='list', timeout=2.0, heartbeat_seconds=0.2)
        buf, dcfg, key = build_manager_buffer(cfg)
        wires = {}
        mgr = ReplayBufferManager(buf, _Net(0, [1], wires, 2.0), dcfg, [1], key)
        th = threading.Thread(target=_run_expecting_timeout, args=(mgr,), daemon=True)
        th.start()
        local_cfg = EasyDict({k: v for k, v in dict(cfg).items() if k != 'distributed'})
        w = RemoteBuffer(local_cfg, dcfg, PeerChannel(_Net(1, [0], wires, 2.0), 0, 2.0, 0.2), log_reward_key=key)
        assert w.push(item(0)) == 1
        del w  # dropped without close()
        th.join(10)
        buf.close()
    gc.collect()
    assert wait_until(lambda: len(senders()) <= before, timeout=10), [t.name for t in senders()]


def test_a_sender_thread_that_cannot_start_queues_nothing_and_the_next_send_starts_one(monkeypatch):
    """A failed ``Thread.start`` (no threads left) kept its unstarted thread as the sender: every later frame sat in
    the queue for good and ``close()`` raised joining it. The send raises; the next one starts a sender."""
    wires = {}
    a, b = _Net(0, [1], wires, 2.0), _Net(1, [0], wires, 2.0)
    a.start()
    b.start()
    real, failed = threading.Thread.start, []

    def start(thread):
        if thread.name.startswith('ding_buffer-send') and not failed:
            failed.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real(thread)

    monkeypatch.setattr(threading.Thread, 'start', start)
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            a.send(1, {'op': 'x', 'k': 0}, wait=True, deadline=time.monotonic() + 5)
        a.send(1, {'op': 'x', 'k': 1}, wait=True, deadline=time.monotonic() + 5)
        peer, kind, obj = b.recv(timeout=5)
        assert (peer, obj['k']) == (0, 1)  # the failed send queued nothing
    finally:
        monkeypatch.setattr(threading.Thread, 'start', real)
        a.close(grace=1.0)  # (it joined the unstarted thread: RuntimeError)
        b.close(grace=1.0)


@pytest.mark.timeout(60)
def test_torch_backend_joins_a_default_group_whose_cpu_backend_is_gloo():
    """A default group made with a device-mapped backend ('cpu:gloo', as 'cpu:gloo,cuda:nccl' on a GPU machine)
    carries the buffer's CPU tensors over gloo: joined, not refused (a fresh interpreter: the group is global)."""
    import subprocess
    import sys

    from helpers import REPO_ROOT, pythonpath

    code = (
        "import torch.distributed as dist\n"
        "from ding_buffer.distributed.startup import init_torch\n"
        "dist.init_process_group('cpu:gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "print('JOINED', init_torch(5.0))\n"
    )
    env = dict(os.environ, PYTHONPATH=pythonpath())
    proc = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=50, env=env, cwd=str(REPO_ROOT)
    )
    assert 'JOINED (0, 1)' in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]

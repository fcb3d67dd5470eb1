"""Wire codec: a message is one small JSON header plus the raw bytes of every tensor / ndarray / bytes leaf.

``encode(obj)`` walks a nested structure (dict, list, tuple, str, int, float incl. inf/nan, bool, None, slice,
``torch.Tensor``, ``np.ndarray``, numpy scalars, bytes) and returns ``(header, parts)``: ``header`` is UTF-8 JSON
describing the structure, each array leaf is replaced by a reference to its part, and ``parts`` are uint8
``np.ndarray`` views of the leaves' memory (no copy for contiguous CPU data). ``decode(header, parts)`` rebuilds
the structure; tensors are views over the received parts (no copy when a part is writable).

Anything else is refused with ``TypeError`` unless ``allow_pickle=True``, which pickles that leaf into a part;
decoding a pickled leaf also needs ``allow_pickle=True`` (unpickling runs code: trust the peer).
A malformed header or part list raises ``CodecError`` (a ``ValueError``) and never executes anything: every
size is checked with Python integers (no overflow) before a view is made, and each part may be used by one
leaf only, so every decoded tensor owns its memory (``torch.save`` of a decoded result works).
"""

import json
import math
import pickle
import struct
import sys
from itertools import chain
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import CodecError

VERSION = 1
MAX_DEPTH = 64  # nesting levels a decoded message may have
DATA_DEPTH = MAX_DEPTH - 16  # nesting levels data a manager keeps may have: replies and states carrying it nest deeper
STATE_DEPTH = DATA_DEPTH + 8  # nesting levels of a state a manager loads: a state nests its items up to 8 deeper

# tensor dtypes sent raw, by the name ``str(dtype)`` gives them after 'torch.'
_TORCH_DTYPES = {  # every dtype torch computes with (not the sub-byte and bits shells); those this torch has
    name: getattr(torch, name)
    for name in (
        'float64 float32 float16 bfloat16 int64 int32 int16 int8 uint64 uint32 uint16 uint8 bool complex128 complex64 '
        'complex32 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu'
    ).split()
    if isinstance(getattr(torch, name, None), torch.dtype)
}
_TORCH_ITEMSIZE = {name: dt.itemsize for name, dt in _TORCH_DTYPES.items()}
# the numpy dtype of each tensor dtype numpy has and aligns as torch does (not bfloat16; numpy aligns complex
# numbers to their halves, torch to their size): such parts are viewed in numpy, then wrapped
_TORCH_AS_NP = {
    n: np.dtype(n) for n in 'bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64'.split()
}
_NP_KINDS = set('biufc')  # numpy dtypes sent raw: bool, ints, uints, floats, complex


def _as_bytes_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class _Encoder:
    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.parts: List[np.ndarray] = []

    def part(self, view: np.ndarray) -> int:
        self.parts.append(view)
        return len(self.parts) - 1

    def walk(self, x: Any, path: Any) -> Any:
        """``path`` says where ``x`` sits, for an error only: a str, or ``(parent path, suffix)`` (built lazily:
        formatting it for every node costs more than encoding a small message)."""
        t = type(x)
        if t is float:  # (JSON writes every NaN alike: one with a sign or payload goes as its bits)
            return x if x == x else {'$f': struct.unpack('<Q', struct.pack('<d', x))[0]}
        if t is int or t is bool or x is None or isinstance(x, str):
            return x
        if isinstance(x, np.generic):  # before int/float: np.float64 is a float subclass
            if x.dtype.kind in 'fc' and x != x:  # a NaN: its bytes, as a long double's (``$s`` writes it as JSON)
                return {'$z': [self.part(_as_bytes_view(np.array(x))), x.dtype.str]}
            if x.dtype.kind in _NP_KINDS and x.dtype.itemsize <= 8 * (1 + (x.dtype.kind == 'c')):
                return {'$s': [x.dtype.str, x.item() if x.dtype.kind != 'c' else [x.real.item(), x.imag.item()]]}
            if x.dtype.kind in _NP_KINDS:  # long double: no JSON form, send its bytes
                return {'$z': [self.part(_as_bytes_view(np.array(x))), x.dtype.str]}
            return self.pickled(x, path)
        if isinstance(x, (int, float)):  # Python's JSON carries ints of any size (RNG states hold 128-bit ones)
            return x
        if isinstance(x, torch.Tensor):
            return self.tensor(x, path)
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in _NP_KINDS or x.dtype.byteorder == '>' or isinstance(x, np.ma.MaskedArray):
                return self.pickled(x, path)
            a = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            return {'$a': [self.part(_as_bytes_view(a)), a.dtype.str, list(x.shape)]}
        if isinstance(x, dict):
            items = []
            for k, v in x.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    return self.pickled(x, path)
                items.append([k, self.walk(v, (path, '.', k))])
            return {'$d': items}
        if isinstance(x, list):
            return [self.walk(v, (path, '[', i)) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {'$u': [self.walk(v, (path, '[', i)) for i, v in enumerate(x)]}
        if isinstance(x, (bytes, bytearray, memoryview)):
            return {'$b': self.part(np.frombuffer(x, dtype=np.uint8))}
        if isinstance(x, slice):
            return {'$l': [self.walk(x.start, path), self.walk(x.stop, path), self.walk(x.step, path)]}
        return self.pickled(x, path)

    def tensor(self, x: torch.Tensor, path: Any) -> Any:
        if x.is_meta:
            raise TypeError(f"cannot send the meta tensor at '{_path_str(path)}': it holds a shape, no values")
        if x.layout is not torch.strided or x.is_nested or isinstance(x, _MASKED):  # no byte view of values
            return self.pickled(x, path)
        t = x.detach()
        if t.device.type != 'cpu':
            t = t.cpu()
        dt = str(t.dtype).replace('torch.', '')
        if dt not in _TORCH_DTYPES:
            return self.pickled(x, path)
        t = t.resolve_conj().resolve_neg().contiguous()  # (a conjugate or negative view has no byte view)
        if t.numel() == 1 and t.reshape(-1).stride(0) != 1:  # one element counts as contiguous at any stride
            t = t.clone(memory_format=torch.contiguous_format)
        view = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return {'$t': [self.part(view), dt, list(t.shape)]}

    def pickled(self, x: Any, path: Any) -> Any:
        if not self.allow_pickle:
            raise TypeError(
                f"cannot send {type(x).__name__} at '{_path_str(path)}' without pickle: the wire carries dicts, lists, "
                f"tuples, numbers, str, bytes, slices, tensors and numeric ndarrays; set distributed.allow_pickle=True "
                f"(on every rank) to pickle other objects"
            )
        return {'$p': self.part(np.frombuffer(pickle.dumps(x, protocol=5), dtype=np.uint8))}


def _path_str(path: Any) -> str:
    parts = []
    while isinstance(path, tuple):
        path, sep, key = path
        parts.append(f'.{key}' if sep == '.' else f'[{key}]')
    return path + ''.join(reversed(parts))


_MASKED = torch.masked.MaskedTensor  # (a mask besides its values)
_JSON = json.JSONEncoder(separators=(',', ':'))  # (json.dumps builds an encoder per call for these separators)


def encode(obj: Any, allow_pickle: bool = False) -> Tuple[bytes, List[np.ndarray]]:
    """Return ``(header, parts)``; ``parts`` are uint8 arrays viewing the leaves' memory."""
    enc = _Encoder(allow_pickle)
    body = enc.walk(obj, 'message')
    try:
        header = _JSON.encode({'v': VERSION, 'n': [int(p.nbytes) for p in enc.parts], 'body': body}).encode()
    except ValueError as e:  # an int of more digits than Python writes as text (sys.get_int_max_str_digits)
        limit = getattr(sys, 'get_int_max_str_digits', lambda: 0)()  # (0: no limit; Pythons before 3.9.14 had none)
        where = _long_int_path(obj, limit)
        if where is None:
            raise
        raise ValueError(
            f"cannot send the int at '{where}': the wire writes ints as text, and Python writes at most {limit} "
            f"digits ({e}); send such a number as bytes or a str"
        ) from e
    return header, enc.parts


def _long_int_path(obj: Any, limit: int) -> Optional[str]:
    """Where ``obj`` holds an int of more than ``limit`` digits (None: nowhere, or no limit)."""
    if not limit:
        return None
    bound = 10**limit
    stack: List[Tuple[Any, Any]] = [(obj, 'message')]
    while stack:
        x, path = stack.pop()
        if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= bound:
            return _path_str(path)
        if isinstance(x, dict):
            stack.extend((v, (path, '.', k)) for k, v in x.items())
        elif isinstance(x, (list, tuple)):
            stack.extend((v, (path, '[', i)) for i, v in enumerate(x))
    return None


def _part_np(p: Any) -> np.ndarray:
    if isinstance(p, torch.Tensor):
        return p.numpy()
    if isinstance(p, np.ndarray):
        return p.reshape(-1).view(np.uint8)
    return np.frombuffer(p, dtype=np.uint8)


def check_depth(x: Any, what: str, limit: int = DATA_DEPTH) -> None:
    """``CodecError`` when the lists, tuples, dicts and slices of decoded ``x`` nest deeper than ``limit`` levels:
    data a manager keeps must fit in the replies that carry it back (a sample, a state), which nest it deeper than
    the request that brought it."""
    level, depth = [x] if type(x) in _NESTING else [], 0  # (only lists, tuples, dicts and slices on a level)
    while level:
        if depth > limit:
            raise CodecError(f"{what} nests deeper than {limit} levels: a reply carrying it could not be read")
        inner = chain.from_iterable(
            v.values() if type(v) is dict else (v.start, v.stop, v.step) if type(v) is slice else v for v in level
        )
        level, depth = [e for e in inner if type(e) in _NESTING], depth + 1


_NESTING = (dict, list, tuple, slice)


def _numeric_dtype(spec: Any, what: str) -> np.dtype:
    try:
        dtype = np.dtype(spec)
    except TypeError as e:
        raise CodecError(f"unknown {what} dtype {spec!r}") from e
    if dtype.kind not in _NP_KINDS:
        raise CodecError(f"{what} dtype {spec!r} is not numeric")
    if not dtype.isnative:  # never encoded raw (pickled instead): it could not be sent on (a reply would fail)
        raise CodecError(f"{what} dtype {spec!r} is not in this host's byte order")
    return dtype


class _Decoder:
    def __init__(self, parts: Sequence[Any], allow_pickle: bool) -> None:
        self.parts = parts
        self.allow_pickle = allow_pickle
        self.used: set = set()

    def part(self, i: Any) -> Any:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.parts):
            raise CodecError(f"message references part {str(i)[:40]!r}, it has {len(self.parts)}")
        if i in self.used:  # two leaves over one buffer would alias each other (and break torch.save)
            raise CodecError(f"message references part {i} twice")
        self.used.add(i)
        return self.parts[i]

    def array(self, spec: Any, torch_out: bool) -> Any:
        shape = _shape_of(spec)
        raw = self.part(spec[0])
        if torch_out:
            dtype = _TORCH_DTYPES.get(spec[1])
            if dtype is None:
                raise CodecError(f"unknown tensor dtype {spec[1]!r}")
            itemsize = _TORCH_ITEMSIZE[spec[1]]
        else:
            dtype = _numeric_dtype(spec[1], 'array')
            itemsize = dtype.itemsize
        n = math.prod(shape)  # Python ints: a hostile shape cannot overflow into a matching size
        nbytes = (
            len(raw)
            if isinstance(raw, (bytes, bytearray))
            else int(raw.nbytes if not isinstance(raw, torch.Tensor) else raw.numel())
        )
        if n * itemsize != nbytes:
            raise CodecError(
                f"array part {spec[0]} has {nbytes} bytes, shape {list(shape)} of {spec[1]} needs {n * itemsize}"
            )
        if torch_out:
            return _tensor_of(raw, spec[1], shape, n, dtype, itemsize)
        a = _part_np(raw.numpy() if isinstance(raw, torch.Tensor) else raw)
        if n == 0:
            return np.empty(shape, dtype=dtype)
        if a.ctypes.data % itemsize or not a.flags.writeable:
            a = a.copy()
        return a.view(dtype).reshape(shape)

    def walk(self, x: Any, depth: int = 0) -> Any:
        t = type(x)
        if t is str or t is int or t is float or x is None or t is bool:  # (JSON gives exactly these types)
            return x
        if depth > MAX_DEPTH:  # deeper data could not be encoded back (a reply carrying it would fail)
            raise CodecError(f"message nests deeper than {MAX_DEPTH} levels")
        depth += 1
        if isinstance(x, list):
            return [self.walk(v, depth) for v in x]
        if not isinstance(x, dict) or len(x) != 1:
            raise CodecError(f"bad node {str(x)[:80]!r}")
        ((tag, v),) = x.items()
        if tag == '$d':
            if type(v) is not list:
                raise CodecError("bad dict node")
            out = {}
            for kv in v:
                if type(kv) is not list or len(kv) != 2:
                    raise CodecError("bad dict node")
                k = kv[0]  # what the encoder sends: str and int keys (bool keys are pickled), each once
                if not isinstance(k, (str, int)) or isinstance(k, bool) or k in out:
                    raise CodecError(f"bad dict key {k!r}")
                out[k] = self.walk(kv[1], depth)
            return out
        if tag == '$t':
            return self.array(v, True)
        if tag == '$a':
            return self.array(v, False)
        if tag == '$u':
            if not isinstance(v, list):
                raise CodecError("bad tuple node")
            return tuple(self.walk(e, depth) for e in v)
        if tag == '$b':
            return bytes(_part_np(self.part(v)))
        if tag == '$l':
            if not isinstance(v, list) or len(v) != 3:
                raise CodecError("bad slice node")
            return slice(*(self.walk(e, depth) for e in v))
        if tag in ('$s', '$z'):
            return self.scalar(tag, v)
        if tag == '$f':  # a float NaN's bits
            if type(v) is not int or not 0 <= v < 1 << 64:
                raise CodecError("bad float node")
            return struct.unpack('<d', struct.pack('<Q', v))[0]
        if tag == '$p':
            if not self.allow_pickle:
                raise CodecError("message holds a pickled object and allow_pickle is False on this rank")
            return pickle.loads(_part_np(self.part(v)).tobytes())
        raise CodecError(f"unknown node tag {tag!r}")

    def scalar(self, tag: str, v: Any) -> Any:
        if not isinstance(v, list) or len(v) != 2:
            raise CodecError("bad scalar node")
        if tag == '$z':
            return self.array([v[0], v[1], []], False)[()]
        dt = _numeric_dtype(v[0], 'scalar')
        if dt.kind in 'iu' and type(v[1]) in (int, float) and not np.iinfo(dt).min <= v[1] <= np.iinfo(dt).max:
            raise CodecError(f"scalar {v[1]} is out of range for {dt}")  # (numpy 1.x would wrap it)
        return dt.type(complex(*v[1]) if dt.kind == 'c' else v[1])


def decode(header: Any, parts: Sequence[Any], allow_pickle: bool = False) -> Any:
    """Rebuild what ``encode`` described. ``parts``: bytes-likes, uint8 arrays or uint8 tensors."""
    try:
        h = json.loads(bytes(header).decode() if not isinstance(header, str) else header)
    except (ValueError, TypeError, RecursionError) as e:  # ValueError: bad JSON, bad UTF-8, a 5,000-digit int
        raise CodecError(f"message header is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from e
    if not isinstance(h, dict) or h.get('v') != VERSION or not isinstance(h.get('n'), list):
        raise CodecError(f"message header has no version {VERSION} envelope")
    if len(h['n']) != len(parts):
        raise CodecError(f"header announces {len(h['n'])} parts, {len(parts)} arrived")
    try:
        return _Decoder(parts, allow_pickle).walk(h.get('body'))
    except CodecError:
        raise
    except RecursionError as e:
        raise CodecError("message nests too deeply") from e
    except Exception as e:  # hostile values inside well-formed nodes (a pickle's own errors included)
        raise CodecError(f"malformed message: {type(e).__name__}: {str(e)[:200]}") from e


def peek_id(header: Any) -> Any:
    """The top-level ``'id'`` of an encoded request, read from the header alone (None if absent or unreadable);
    lets a receiver answer a message it refuses (too large, undecodable) with the right request id."""
    if len(header) > (1 << 16):  # parsing a huge header just for its id would cost what refusing it saves
        return None
    try:
        body = json.loads(bytes(header).decode()).get('body')
        for k, v in body['$d']:
            if k == 'id' and isinstance(v, int) and not isinstance(v, bool):
                return v
    except Exception:
        pass
    return None


def _shape_of(spec: Any) -> tuple:
    """The shape of an array descriptor ``[part, dtype name, shape]``, every size an exact int in [0, 2**62)."""
    if type(spec) is not list or len(spec) != 3 or type(spec[1]) is not str or type(spec[2]) is not list:
        raise CodecError(f"bad array descriptor {str(spec)[:120]!r}")
    shape = tuple(spec[2])
    if len(shape) > 64:
        raise CodecError(f"bad array descriptor {str(spec)[:120]!r}")
    for s in shape:  # (type(): a bool is no size; JSON gives exact ints)
        if type(s) is not int or not 0 <= s < (1 << 62):
            raise CodecError(f"bad array descriptor {str(spec)[:120]!r}")
    return shape


def _tensor_of(raw: Any, name: str, shape: tuple, n: int, dtype: torch.dtype, itemsize: int) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` over the checked bytes ``raw`` (viewed; copied only when unaligned or
    read-only)."""
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    np_dtype = _TORCH_AS_NP.get(name)
    if np_dtype is not None and not isinstance(raw, torch.Tensor):  # numpy's views cost half of torch's
        a = _part_np(raw).view(np_dtype)
        if not (a.flags.writeable and a.flags.aligned):  # a tensor needs aligned, writable memory
            a = a.copy()
        return torch.from_numpy(a.reshape(shape))
    if isinstance(raw, torch.Tensor):
        t = raw
    else:
        a = _part_np(raw)
        t = torch.from_numpy(a if a.flags.writeable else a.copy())
    if t.data_ptr() % itemsize:  # a view needs aligned storage; copy the rare unaligned part
        t = t.clone()
    return t.view(dtype).reshape(shape)

"""Nested-dict helpers: flatten an item to ``{path: leaf}``, rebuild it, split a batch into items.

A path is a tuple of string keys (``('obs', 'image')``). Leaves are torch tensors, numpy arrays, numpy
scalars and Python ``bool``/``int``/``float``; anything else is a ``TypeError`` naming the field.
"""

import copy
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np
import torch

from .tensordict_io import is_tensordict, to_plain

Path = Tuple[str, ...]
# Types that are certainly leaves: skips the (slow, ABC-based) ``isinstance(x, Mapping)`` on the hot path.
_LEAF_TYPES = (torch.Tensor, np.ndarray, int, float, bool)

# Python scalars become these dtypes (float32 like TorchRL/cpprb defaults, int64 for indices/actions).
PY_SCALAR_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32}


def path_name(path: Path) -> str:
    return '.'.join(path)


def flatten(item: Mapping, prefix: Path = (), skip_top: Tuple[str, ...] = ()) -> Dict[Path, Any]:
    """Flatten nested mappings into ``{path: leaf}``; top-level keys in ``skip_top`` are ignored. A TensorDict
    (at any level) is read as its nested dict (``tensordict_io.to_plain``)."""
    if type(item) is not dict and is_tensordict(item):
        item = to_plain(item)
    out: Dict[Path, Any] = {}
    for key, value in item.items():
        if not isinstance(key, str) or not key:
            raise (ValueError if key == '' else TypeError)(
                f"field names must be non-empty str, got {key!r} under '{path_name(prefix) or '<root>'}'"
            )
        if not prefix and key in skip_top:
            continue
        path = prefix + (key,)
        if type(value) is dict or (type(value) not in _LEAF_TYPES and isinstance(value, Mapping)):
            sub = flatten(value, path)
            if not sub:
                raise ValueError(f"field '{path_name(path)}' is an empty dict; expected a tensor or a nested dict")
            out.update(sub)
        else:
            out[path] = value
    return out


def unflatten(flat: Dict[Path, Any]) -> Dict[str, Any]:
    """Inverse of :func:`flatten`."""
    out: Dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


# torch's sub-byte and bit-container dtypes: tensors of them exist, but torch copies or indexes none of them
SHELL_DTYPES = frozenset(
    getattr(torch, name)
    for name in [f'{s}int{k}' for s in ('', 'u') for k in range(1, 8)]
    + ['bits1x8', 'bits2x4', 'bits4x2', 'bits8', 'bits16', 'float4_e2m1fn_x2']
    if isinstance(getattr(torch, name, None), torch.dtype)
)


def _unindexed() -> frozenset:
    """The wide dtypes this torch cannot index on the CPU (older releases: uint16/32/64 and float8 among them):
    tensor storage refuses them at push instead of failing in a later sample or save."""
    out = set()
    for name in ('uint16', 'uint32', 'uint64', 'float8_e4m3fn', 'float8_e5m2', 'float8_e4m3fnuz', 'float8_e5m2fnuz'):
        dtype = getattr(torch, name, None)
        if isinstance(dtype, torch.dtype):
            try:
                torch.zeros(2, dtype=dtype)[torch.tensor([1])]  # (how samples and saves read the stored fields)
            except (RuntimeError, NotImplementedError, TypeError):
                out.add(dtype)
    return frozenset(out)


UNINDEXED_DTYPES = _unindexed()


def _plain(value: torch.Tensor, path: Path) -> torch.Tensor:
    """A tensor subclass as a plain tensor of its values, or ``TypeError`` where they cannot be read so."""
    try:
        plain = value.as_subclass(torch.Tensor)
    except (RuntimeError, TypeError, NotImplementedError) as e:
        plain, why = None, f" ({e})"
    else:
        why = ''
    if type(plain) is not torch.Tensor:  # (a wrapper subclass stays what it is: its values are elsewhere)
        raise TypeError(
            f"field '{path_name(path)}' is a {type(value).__name__}, a tensor subclass whose values tensor storage "
            f"cannot read{why}; push a plain tensor"
        )
    return plain


def to_tensor(value: Any, path: Path) -> torch.Tensor:
    """Convert one leaf to a CPU/device tensor without copying where possible."""
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise TypeError(
                f"field '{path_name(path)}' is a meta tensor (shape only, no data); push tensors with their values"
            )
        if value.layout is not torch.strided or value.is_nested or value.is_quantized:
            kind = 'nested' if value.is_nested else 'quantized' if value.is_quantized else value.layout
            raise TypeError(
                f"field '{path_name(path)}' is a {kind} tensor; tensor storage stores dense tensors (call "
                f"{'.dequantize()' if value.is_quantized else '.to_dense()'} first)"
            )
        if value.dtype in SHELL_DTYPES or value.dtype in UNINDEXED_DTYPES:
            raise TypeError(
                f"field '{path_name(path)}' has dtype {value.dtype}, which torch {torch.__version__} cannot index or "
                f"copy into a buffer; tensor storage stores the byte dtypes and wider (view the bytes as torch.uint8 "
                f"first)"
            )
        if type(value) is not torch.Tensor:  # a subclass (a Parameter too) is stored as its values
            value = _plain(value, path)
        if value.is_conj() or value.is_neg():  # a lazy conjugate / negation: numpy cannot view it (written later)
            value = value.resolve_conj().resolve_neg()
        return value.detach()
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind in 'USV':
            raise TypeError(f"field '{path_name(path)}' has numpy dtype {arr.dtype}; tensor storage needs numeric data")
        if not arr.dtype.isnative:  # big-endian data (h5py, np.load of such a file): the same values, native
            arr = arr.astype(arr.dtype.newbyteorder('='))
        if arr.ndim and not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = np.array(arr, copy=True, order='C')
        try:
            return torch.from_numpy(arr)
        except TypeError as e:  # a numpy dtype torch has no tensor of
            raise TypeError(
                f"field '{path_name(path)}' has numpy dtype {arr.dtype}, which torch cannot hold: {e}"
            ) from None
    if type(value) in PY_SCALAR_DTYPES:
        try:
            return torch.tensor(value, dtype=PY_SCALAR_DTYPES[type(value)])
        except (RuntimeError, OverflowError, ValueError) as e:
            raise ValueError(f"field '{path_name(path)}' value {value!r} does not fit in int64: {e}") from e
    raise TypeError(
        f"field '{path_name(path)}' has type {type(value).__name__}; tensor storage accepts torch tensors, "
        "numpy arrays and bool/int/float scalars (use storage.type='list' for arbitrary objects)"
    )


def unbatch(batch: Any) -> List[Dict[str, Any]]:
    """Split a dict whose leaves share a leading dimension ``B`` into ``B`` item dicts. Rows are copies, so a
    collector may reuse its batch buffer after the push."""
    flat, size = batched_leaves(batch)
    return [batch_row(flat, i) for i in range(size)]


def batch_row(flat: Dict[Path, Any], i: int) -> Dict[str, Any]:
    """Row ``i`` of the flattened batch ``flat`` as an item dict (a copy)."""
    return unflatten({p: leaf_row(leaf, i) for p, leaf in flat.items()})


def batched_leaves(batch: Any) -> Tuple[Dict[Path, Any], int]:
    """The flattened leaves of a batch dict and their common leading dimension (checked)."""
    if type(batch) is not dict and not isinstance(batch, Mapping):
        raise TypeError(f"a batched push needs a dict of batched leaves, got {type(batch).__name__}")
    flat = flatten(batch)
    if not flat:
        raise ValueError("a batched push got an empty dict")
    size = None
    for path, leaf in flat.items():
        n = batch_len(leaf, path)
        if size is None:
            size = n
        elif n != size:
            raise ValueError(f"batched field '{path_name(path)}' has leading dimension {n}, expected {size}")
    return flat, size


def leaf_row(leaf: Any, i: int) -> Any:
    if isinstance(leaf, torch.Tensor):
        return leaf[i].detach().clone()  # a row of its own, outside any graph (a graph's tensors refuse deepcopy)
    if isinstance(leaf, np.ndarray):
        return leaf[i].copy()
    return leaf[i]


def batch_len(leaf: Any, path: Path) -> int:
    if isinstance(leaf, (torch.Tensor, np.ndarray)) and leaf.ndim >= 1:
        return int(leaf.size(0) if isinstance(leaf, torch.Tensor) else leaf.shape[0])  # (a nested tensor has no shape)
    if isinstance(leaf, (list, tuple)):
        return len(leaf)
    raise ValueError(
        f"batched field '{path_name(path)}' has no leading batch dimension "
        f"(got {type(leaf).__name__} with shape {getattr(leaf, 'shape', None)})"
    )


def copy_memo(obj: Any, grad: Optional[str] = 'all', subclasses: bool = False) -> Dict[int, Any]:
    """A ``copy.deepcopy`` memo for the tensors in ``obj``'s dicts, lists and tuples that ``deepcopy`` copies wrongly:
    a tensor that requires grad as a detached copy (``grad`` 'all'; 'graph': only those inside an autograd graph,
    which ``deepcopy`` refuses; None: none); views into a larger storage (rows of a batch) on a storage of their own
    that holds only the bytes they span together (``deepcopy`` and ``torch.save`` copy the whole storage; views
    that cover most of theirs are left to ``deepcopy``, which shares it); and, with ``subclasses``, a tensor subclass
    as its ``clone`` (for one ``deepcopy`` refuses). Empty when there is none. Each object is visited once (shared
    and cyclic containers too; ``obj`` keeps the ids alive)."""
    memo: Dict[int, Any] = {}
    views: Dict[Tuple[int, int], List[torch.Tensor]] = {}
    seen: Set[int] = set()
    stack = [obj]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            graph = x.requires_grad and not x.is_leaf
            if x.requires_grad and (grad == 'all' or (grad == 'graph' and graph)):
                memo[id(x)] = x.detach().clone()
            elif subclasses and type(x) not in (torch.Tensor, torch.nn.Parameter):
                memo[id(x)] = x.detach().clone().requires_grad_(x.requires_grad)
            elif not graph and _dense(x):
                storage = x.untyped_storage()
                views.setdefault((storage.data_ptr(), storage.nbytes()), []).append(x)
        elif isinstance(x, Mapping):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    for (_, nbytes), group in views.items():
        dtypes = {t.dtype for t in group}
        if len(dtypes) == 1:
            _compact(group, nbytes, memo)
        else:  # views of one storage as several dtypes: torch.save refuses them together, so one storage each
            for dtype in dtypes:
                _compact([t for t in group if t.dtype == dtype], nbytes, memo, always=True)
    return memo


def _dense(x: torch.Tensor) -> bool:
    """A plain dense tensor with elements (grouped by storage: all of a storage's tensors decide its span)."""
    if type(x) is not torch.Tensor or x.layout is not torch.strided or x.is_nested or x.is_meta or x.is_quantized:
        return False
    if x.is_conj() or x.is_neg():  # (a lazy conjugate / negation: its bytes are not its values; deepcopy's own)
        return False
    return x.numel() > 0


def _compact(group: List[torch.Tensor], nbytes: int, memo: Dict[int, Any], always: bool = False) -> None:
    """The views ``group`` of one storage of ``nbytes``, in ``memo`` as views of one new storage holding the bytes
    they span (offsets moved, strides and attributes kept, as ``Tensor.__deepcopy__`` keeps them) when that span is
    at most half the storage (``always``: whatever it spans)."""
    spans = []
    for t in group:
        start = t.storage_offset() * t.element_size()
        reach = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        spans.append((start, start + (reach + 1) * t.element_size()))
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if (2 * (hi - lo) > nbytes and not always) or any((a - lo) % t.element_size() for t, (a, _) in zip(group, spans)):
        return
    raw = torch.empty(0, dtype=torch.uint8, device=group[0].device).set_(group[0].untyped_storage())
    storage = raw[lo:hi].clone().untyped_storage()
    for t, (a, _) in zip(group, spans):
        new = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            storage, (a - lo) // t.element_size(), t.shape, t.stride()
        )
        memo[id(t)] = new.requires_grad_(t.requires_grad)
        if t.__dict__:
            new.__dict__ = copy.deepcopy(t.__dict__, memo)
        if t.is_leaf and t.grad is not None:
            new.grad = copy.deepcopy(t.grad, memo)

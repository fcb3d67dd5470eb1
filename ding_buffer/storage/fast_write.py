"""``FastWriter``: the hot paths of ``TensorStorage`` writes on CPU: one flat item (``write``), or one flat batch
of arrays (``check_batch`` + ``put_batch``), checked against per-field facts built once per schema (``build``) and
written straight into the fields' numpy views. Anything that is not a plain match returns ``None`` with nothing
changed; the storage's generic path (``prepare`` / ``prepare_batch`` + ``write``) then takes it and reports errors.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .ring import RingIndex
from .tensor_schema import Schema
from .tree import Path

_MISSING = object()
# collect_iter values the batch path takes without asking the generic path (which accepts |x| < 2**60 in float64:
# a margin keeps the fast path from taking a value the generic one would round up and refuse)
COLLECT_ITER_SAFE = 2**59
# per field: top-level key, numpy view of the field, shape, numpy dtype, torch dtype, accepted Python scalars
FieldSpec = Tuple[str, np.ndarray, tuple, np.dtype, torch.dtype, tuple]
# the Python scalars the generic path accepts into a scalar field of each dtype (other floats: int; others: none)
_SCALARS = {torch.bool: (bool,), torch.int64: (int,), torch.float32: (int, float)}


def _tensor_view(v: torch.Tensor, dtype: torch.dtype) -> Optional[np.ndarray]:
    """A numpy view of ``v`` when it is a plain dense CPU tensor of ``dtype`` (no conj / neg bits), else None."""
    if (
        v.dtype != dtype
        or not v.is_cpu  # (not ``v.device.type``: building the device object costs more than the whole check)
        or v.layout is not torch.strided
        or v.is_nested
        or v.is_conj()
        or v.is_neg()
    ):
        return None
    return v.detach().numpy()


def _skipped(mapping: dict, skip_keys: Tuple[str, ...]) -> int:
    """How many of ``skip_keys`` ``mapping`` holds (they are not fields)."""
    n = 0
    for key in skip_keys:  # a plain loop: a generator costs more on the single-push hot path
        if key in mapping:
            n += 1
    return n


class FastWriter:
    def __init__(self, spec: List[FieldSpec], skip_keys: Tuple[str, ...]) -> None:
        self.spec = spec
        self.skip_keys = skip_keys

    @classmethod
    def build(
        cls, schema: Schema, views: Dict[Path, np.ndarray], device: torch.device, skip_keys: Tuple[str, ...]
    ) -> Optional['FastWriter']:
        """Per-field facts for ``write`` (flat schemas on CPU only): numpy view of the field, shape, dtypes and
        the Python scalar types the generic path would accept for it."""
        if device.type != 'cpu' or any(len(p) != 1 for p in schema) or len(views) != len(schema):
            return None
        spec = []
        for path, (shape, dtype) in schema.items():
            scalars = () if shape else _SCALARS.get(dtype, (int,) if dtype.is_floating_point else ())
            view = views[path]
            spec.append((path[0], view, shape, view.dtype, dtype, scalars))
        return cls(spec, skip_keys)

    def write(self, item: Any, ring: RingIndex) -> Optional[int]:
        """Check ``item`` against the schema and write it at the next slot of ``ring``. Returns the slot, or ``None``
        -- with nothing changed -- when the item is not a plain match (nested dict, any mismatch)."""
        spec = self.spec
        if type(item) is not dict or len(item) - _skipped(item, self.skip_keys) != len(spec):
            return None
        values = []
        for key, _view, shape, np_dtype, dtype, scalars in spec:
            v = item.get(key, _MISSING)
            t = type(v)
            if t is np.ndarray:
                if (v.dtype is not np_dtype and v.dtype != np_dtype) or v.shape != shape:
                    return None
            elif t is torch.Tensor:
                v = _tensor_view(v, dtype)
                if v is None or v.shape != shape:
                    return None
            elif t in scalars:
                # ints go only to int64 and float fields (``build``): within int64 they always fit; past 2**53 (where
                # doubles skip ints) numpy would round one into a float field twice, through a double: the generic
                # path rounds it once (and reports one beyond int64)
                if t is int and not -(2**53) <= v <= 2**53 and (dtype is not torch.int64 or not -(2**63) <= v < 2**63):
                    return None
            elif not (isinstance(v, np.generic) and v.dtype == np_dtype and shape == ()):
                return None
            values.append(v)
        slot = ring.next_slot()  # written before the index counts it (``Storage.write``)
        for (_, view, _, _, _, _), v in zip(spec, values):
            view[slot] = v
        ring.commit_one()
        return slot

    def check_batch(self, batch: Any) -> Optional[Tuple[List[np.ndarray], int]]:
        """The columns of ``batch`` (in schema order, as numpy arrays; CPU tensors are viewed, not copied) and its
        size ``n``, when every leaf is an array of exactly the stored dtype and per-item shape with one leading
        dimension ``n`` in ``[1, capacity]``. ``None`` otherwise. Nothing is written. O(fields)."""
        spec = self.spec
        if type(batch) is not dict or len(batch) - _skipped(batch, self.skip_keys) != len(spec):
            return None
        cols = []
        n = -1
        for key, _view, shape, np_dtype, dtype, _ in spec:
            v = batch.get(key, _MISSING)
            t = type(v)
            if t is torch.Tensor:
                v = _tensor_view(v, dtype)
                if v is None:
                    return None
            elif t is not np.ndarray or v.dtype != np_dtype:
                return None
            vshape = v.shape
            if len(vshape) != len(shape) + 1 or vshape[1:] != shape:
                return None
            if n < 0:
                n = vshape[0]
            elif vshape[0] != n:
                return None
            if key == 'collect_iter' and n > 0:
                if not (-COLLECT_ITER_SAFE < v.min() and v.max() < COLLECT_ITER_SAFE):
                    return None  # NaN fails too
                if v.dtype.kind == 'f' and not (v == np.trunc(v)).all():
                    return None  # a fractional learner iteration: the generic path refuses it
            cols.append(v)
        if not 0 < n <= spec[0][1].shape[0]:  # every field's view has the capacity as its first dimension
            return None
        return cols, n

    def put_batch(self, cols: List[np.ndarray], n: int, ring: RingIndex) -> np.ndarray:
        """Write columns checked by ``check_batch`` at the next ``n`` slots of ``ring``; returns the slots."""
        cap, slots = ring.capacity, ring.next_slots(n)  # written before the index counts them (``Storage.write``)
        first = int(slots[0])
        if not ring.derived_ids:  # a free-list index hands out any free slots
            for (_, view, _, _, _, _), v in zip(self.spec, cols):
                view[slots] = v
        elif first + n <= cap:
            for (_, view, _, _, _, _), v in zip(self.spec, cols):
                view[first : first + n] = v
        else:
            k = cap - first
            for (_, view, _, _, _, _), v in zip(self.spec, cols):
                view[first:] = v[:k]
                view[: n - k] = v[k:]
        return ring.commit(n, slots)[0]

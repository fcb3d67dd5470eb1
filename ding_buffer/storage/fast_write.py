"""``FastWriter``: the single-item fast path of ``TensorStorage`` (one flat item on CPU, no tensors made).

Built once per schema (``FastWriter.build``, ``None`` where the path does not apply: fields off the CPU,
nested paths, a field numpy has no dtype for). ``write`` checks each leaf of an item against the per-field
facts in a few attribute reads and writes it straight into the field's numpy view -- no stacking, no tensor
conversion. Anything that is not a plain match returns ``None`` with nothing changed; the storage's generic
path (``prepare`` + ``write``) then takes the item and reports any error.
"""
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .ring import RingIndex
from .tensor_schema import Schema
from .tree import Path

_MISSING = object()
# per field: top-level key, numpy view of the field, shape, numpy dtype, torch dtype, accepted Python scalars
FieldSpec = Tuple[str, np.ndarray, tuple, np.dtype, torch.dtype, tuple]


class FastWriter:

    def __init__(self, spec: List[FieldSpec], skip_keys: Tuple[str, ...]) -> None:
        self.spec = spec
        self.skip_keys = skip_keys

    @classmethod
    def build(cls, schema: Schema, views: Dict[Path, np.ndarray], device: torch.device,
              skip_keys: Tuple[str, ...]) -> Optional['FastWriter']:
        """Per-field facts for ``write`` (flat schemas on CPU only): numpy view of the field, shape, dtypes and
        the Python scalar types the generic path would accept for it."""
        if device.type != 'cpu' or any(len(p) != 1 for p in schema) or len(views) != len(schema):
            return None
        spec = []
        for path, (shape, dtype) in schema.items():
            if dtype == torch.bool:
                scalars = (bool, )
            elif dtype == torch.int64:
                scalars = (int, )
            elif dtype == torch.float32:
                scalars = (int, float)
            elif dtype.is_floating_point:
                scalars = (int, )
            else:
                scalars = ()
            if shape:
                scalars = ()
            view = views[path]
            spec.append((path[0], view, shape, view.dtype, dtype, scalars))
        return cls(spec, skip_keys)

    def write(self, item: Any, ring: RingIndex) -> Optional[int]:
        """
        Overview:
            Check ``item`` against the schema and write it at the next slot of ``ring``. Returns the slot, or
            ``None`` -- with nothing changed -- when the item is not a plain match (nested dict, any mismatch).
        """
        spec = self.spec
        if type(item) is not dict:
            return None
        skipped = 0
        for key in self.skip_keys:
            if key in item:
                skipped += 1
        if len(item) - skipped != len(spec):
            return None
        values = []
        for key, view, shape, np_dtype, dtype, scalars in spec:
            v = item.get(key, _MISSING)
            t = type(v)
            if t is np.ndarray:
                if v.dtype != np_dtype or v.shape != shape:
                    return None
            elif t is torch.Tensor:
                if v.dtype != dtype or v.shape != shape or v.device.type != 'cpu':
                    return None
                v = v.detach().numpy()
            elif t in scalars:
                if t is int:
                    if not -2 ** 63 <= v < 2 ** 63:  # the generic path reports it
                        return None
                    try:  # out of the field's range: let the generic path report it
                        np_dtype.type(v)
                    except (OverflowError, ValueError):
                        return None
            elif not (isinstance(v, np.generic) and v.dtype == np_dtype and shape == ()):
                return None
            values.append(v)
        slot, _ = ring.commit_one()
        for (_, view, _, _, _, _), v in zip(spec, values):
            view[slot] = v
        return slot

"""The field tensors of a ``TensorStorage``: one preallocated ``[capacity, *shape]`` tensor per schema field.

Fields live in memory on the storage device, or, with ``memmap_dir``, each in its own file mapped with
``torch.from_file`` (shared), so buffers larger than RAM work. CPU fields also get numpy views (same memory),
which the storage writes and reads through: numpy's per-call overhead is a fraction of torch's.
"""
import os
from typing import Dict, Optional

import numpy as np
import torch

from .tensor_schema import Schema
from .tree import Path, path_name


def memmap_file(memmap_dir: str, index: int, path: Path) -> str:
    """File of the ``index``-th field: numbered, so distinct fields never share a file."""
    safe = ''.join(c if c.isalnum() or c in '._-' else '_' for c in path_name(path))
    return os.path.join(memmap_dir, f'{index:03d}_{safe}.bin')


def allocate_fields(schema: Schema, capacity: int, device: torch.device,
                    memmap_dir: Optional[str]) -> Dict[Path, torch.Tensor]:
    """A new zeroed (in memory) or freshly mapped (``memmap_dir``) tensor for every field of ``schema``."""
    fields: Dict[Path, torch.Tensor] = {}
    if memmap_dir is not None:
        os.makedirs(memmap_dir, exist_ok=True)
    for index, (path, (shape, dtype)) in enumerate(schema.items()):
        numel = capacity * int(np.prod(shape, dtype=np.int64))
        if memmap_dir is not None:
            fname = memmap_file(memmap_dir, index, path)
            if os.path.exists(fname):
                os.remove(fname)  # a stale file of another size would be mapped as is
            tensor = torch.from_file(fname, shared=True, size=numel, dtype=dtype)
            fields[path] = tensor.view(capacity, *shape)
        else:
            fields[path] = torch.zeros((capacity, *shape), dtype=dtype, device=device)
    return fields


def numpy_views(fields: Dict[Path, torch.Tensor]) -> Dict[Path, np.ndarray]:
    """Numpy views (shared memory) of the CPU ``fields`` whose dtype numpy has."""
    views = {}
    for p, f in fields.items():
        try:
            views[p] = f.numpy()
        except TypeError:  # bfloat16, float8, ...: numpy has no such dtype, write through torch
            pass
    return views

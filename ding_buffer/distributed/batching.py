"""Worker-side batch helpers: item counts, concatenation of pending pushes, row filters and field selection.

A push is either a *batch* (a dict whose tensor / ndarray leaves share a leading dimension) or a list of
*items* (each a dict). Containers (objects with ``log_rewards``) pass through untouched except for counting.
"""

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..storage.tensordict_io import is_tensordict
from ..storage.tree import batched_leaves


def batch_len(batch: Dict[str, Any]) -> int:
    """Leading dimension shared by the leaves of a dict batch, as a local buffer reads it (tensor, array and list
    leaves; a ``ValueError`` naming the field that disagrees)."""
    return batched_leaves(batch)[1]


def count_items(data: Any, batched: bool) -> int:
    """The items a push holds: a batch dict's rows, a list's entries, a TensorDict's leading batch size, else one
    item (a str, a tensor or a tuple is one item, whatever its length)."""
    if batched and isinstance(data, dict):
        return batch_len(data)
    if isinstance(data, list):
        return len(data)
    if is_tensordict(data):
        return int(data.batch_size[0]) if len(data.batch_size) else 1
    return 1


def concat_batches(batches: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Concatenate dict batches key by key (every batch must have the same keys)."""
    first = batches[0]
    out = {}
    for k, v in first.items():
        vals = []
        for b in batches:
            if k not in b:
                raise ValueError(f"pending batches to send differ in keys: one lacks {k!r}")
            vals.append(b[k])
        if isinstance(v, dict):
            out[k] = concat_batches(vals)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.cat([torch.as_tensor(x) for x in vals])
        elif isinstance(v, np.ndarray):
            out[k] = np.concatenate(vals)
        else:
            raise TypeError(f"cannot concatenate batch field {k!r} of type {type(v).__name__}")
    return out


def take_rows(batch: Dict[str, Any], mask: np.ndarray) -> Dict[str, Any]:
    """Rows of a dict batch where ``mask`` is True."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out[k] = take_rows(v, mask)
        elif isinstance(v, torch.Tensor):
            out[k] = v[torch.from_numpy(mask).to(v.device)]
        elif isinstance(v, np.ndarray):
            out[k] = v[mask]
        elif isinstance(v, (list, tuple)):  # (a batch's list leaf: one entry per row)
            out[k] = [x for x, keep in zip(v, mask.tolist()) if keep]
        else:
            out[k] = v
    return out


def _as_np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().double().numpy().reshape(-1)
    return np.asarray(x, dtype=np.float64).reshape(-1)


def log_rewards_of(data: Any, key: str) -> Optional[np.ndarray]:
    """Per-item log-rewards of a push (None when it carries none)."""
    try:
        if isinstance(data, dict):
            return _as_np(data[key]) if key in data else None
        if isinstance(data, list):
            if not data or not all(isinstance(it, dict) and key in it for it in data):
                return None
            return np.array([float(_as_np(it[key])[0]) for it in data])
        lr = getattr(data, 'log_rewards', None)
        return None if lr is None else _as_np(lr)
    except (TypeError, ValueError, IndexError):
        return None


def filter_items(data: Any, mask: np.ndarray) -> Any:
    """The items of a dict batch or a list where ``mask`` is True."""
    if isinstance(data, dict):
        return take_rows(data, mask)
    if isinstance(data, list):
        return [it for it, keep in zip(data, mask.tolist()) if keep]
    return data[torch.from_numpy(np.flatnonzero(mask))]  # containers support index tensors


def select_fields(data: Any, keys: List[str]) -> Any:
    """Keep only ``keys`` of a dict batch or of every item of a list (scoring_only)."""
    if isinstance(data, dict):
        return {k: data[k] for k in keys if k in data}
    if isinstance(data, list):
        return [{k: it[k] for k in keys if k in it} for it in data]
    return data

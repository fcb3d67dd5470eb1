"""How sampled elements leave a list-storage buffer: new dicts (the stored ones are never mutated) carrying the
DI-engine keys ``replay_unique_id`` (``f"{instance_name}_{id}"``) and ``replay_buffer_idx`` plus per-item extras
(``priority``, ``IS``, ``staleness``, ``use``, ...). A stored TensorDict leaves as a TensorDict copy (numbers
as 0-d tensors, the id as ``NonTensorData``)."""

from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch

from ..storage.tensordict_io import is_tensordict


def with_extras(
    storage: Any,
    slots: np.ndarray,
    extras: Dict[str, np.ndarray],
    instance_name: str,
    ids: Optional[np.ndarray] = None,
) -> Any:
    """The drawn items of a slot storage plus per-item ``extras``: one dict of batched tensors on tensor storage
    (extras as float32 for float arrays, else copies of them), new dicts with Python numbers on list storage.
    ``ids``: the items' unique ids when the caller has them (else read from the ring)."""
    if storage.kind == 'tensor':
        out = storage.gather(slots, ids)
        dev = storage.device
        on_cpu = dev.type == 'cpu'
        for key, col in extras.items():  # copies: the buffer keeps some of these arrays (use counts, monitors)
            t = torch.from_numpy(col.astype(np.float32) if col.dtype.kind == 'f' else col.copy())
            out[key] = t if on_cpu else t.to(dev)
        return out
    return prioritized_items(
        storage.gather(slots), instance_name, storage.ring.uids(slots) if ids is None else ids, slots, extras
    )


def prioritized_items(
    items: List[Any], instance_name: str, ids: np.ndarray, slots: np.ndarray, extras: Dict[str, np.ndarray]
) -> List[Dict[str, Any]]:
    """One new dict per drawn item, holding the stored values (``deepcopy=True`` copies them: the engine, for every
    table); ``extras`` arrays become Python numbers. An item that is not a mapping (list storage keeps any object)
    has no keys to carry them and leaves as it is."""
    ids_l, slots_l = ids.tolist(), np.asarray(slots).tolist()
    cols = {k: v.tolist() for k, v in extras.items()}
    out = []
    for k, item in enumerate(items):
        if type(item) is dict or (isinstance(item, Mapping) and not is_tensordict(item)):  # plain dicts first
            d = dict(item)
        elif is_tensordict(item):  # stays a TensorDict: a copy, the id a NonTensorData
            d = item.copy()
        else:
            out.append(item)
            continue
        uid = f'{instance_name}_{ids_l[k]}'
        values = {'replay_buffer_idx': int(slots_l[k]), **{key: col[k] for key, col in cols.items()}}
        if type(d) is dict:
            d['replay_unique_id'] = uid
            d.update(values)
        elif not d.batch_dims:  # numbers as 0-d tensors (also over a pushed non-tensor 'priority')
            d['replay_unique_id'] = uid
            for key, v in values.items():
                d[key] = torch.tensor(v)
        else:  # a TensorDict item with batch dims of its own (list storage keeps it as pushed): one value each
            d.set_non_tensor('replay_unique_id', uid)
            for key, v in values.items():
                d.set_non_tensor(key, v)
        out.append(d)
    return out


def as_items(batch: Dict[str, Any], instance_name: str) -> List[Dict[str, Any]]:
    """
    Overview:
        A tensor-storage sample (one dict of ``[B, ...]`` leaves) as ``B`` per-item dicts, the layout list storage
        samples and DI-engine's policies collate (``storage.output='items'``). A leaf of one value per item
        becomes a Python number per item (``tolist``); a wider leaf becomes ``B`` views of its rows (``unbind``),
        so nothing is copied here and the batch's memory is shared by its items, never with the storage (the
        gather copied it). ``replay_unique_id`` becomes ``f"{instance_name}_{id}"`` and ``replay_buffer_idx`` an
        int, as on list storage, so a learner's ``priority_info`` reads the same on both storages.
        O(B * fields), with one C++ call per field.
    Examples:
        >>> import torch
        >>> batch = {'obs': torch.arange(6.).reshape(3, 2), 'done': torch.tensor([False, True, False]),
        ...          'replay_unique_id': torch.tensor([7, 8, 9]), 'replay_buffer_idx': torch.tensor([0, 1, 2])}
        >>> items = as_items(batch, 'buffer')
        >>> len(items), items[1]['obs'], items[1]['done'], items[1]['replay_unique_id']
        (3, tensor([2., 3.]), True, 'buffer_8')
    """
    columns = {}
    size = None
    for key, value in batch.items():
        if key == 'replay_unique_id':
            col = [f'{instance_name}_{u}' for u in value.tolist()]
        else:
            col = _rows(value)
        if size is None:
            size = len(col)
        elif len(col) != size:
            raise ValueError(f"sampled field {key!r} has {len(col)} rows, the batch has {size}")
        columns[key] = col
    if not columns:
        return []
    keys = list(columns)
    return [dict(zip(keys, row)) for row in zip(*columns.values())]


def _rows(value: Any) -> List[Any]:
    """The per-item values of one sampled leaf (or nested dict of leaves)."""
    if isinstance(value, dict):
        sub = {k: _rows(v) for k, v in value.items()}
        keys = list(sub)
        return [dict(zip(keys, row)) for row in zip(*sub.values())]
    if isinstance(value, torch.Tensor):
        return value.tolist() if value.dim() == 1 else list(value.unbind(0))
    if isinstance(value, np.ndarray):
        return value.tolist() if value.ndim == 1 else list(value)
    return list(value)

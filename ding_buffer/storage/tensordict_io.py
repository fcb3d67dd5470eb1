"""TensorDicts (TorchRL's ``tensordict``) in and out of the buffers -- the one home of every conversion.

``tensordict`` is optional: nothing here imports it. ``is_tensordict`` looks the module up in ``sys.modules`` (a
dict lookup), so a plain dict costs one ``type(x) is dict`` test on the hot paths, and no object can be a
TensorDict while the module is not loaded.

The mapping onto the buffer API (TorchRL: ``rb.add(td)`` stores one element, ``rb.extend(td)`` splits dim 0):

* ``push(td)`` with ``batch_size=[]`` is one item, exactly as ``push(td.to_dict())``; a non-tensor leaf (a
  ``NonTensorData``) arrives as its Python value, so tensor storage refuses it with the dict's message.
* ``push(td)`` with ``batch_size=[B, ...]`` on the slot presets (naive, advanced, elastic, sequence, deque) is a
  batch of ``B`` items, as ``extend(td)`` / ``push(td, batched=True)`` -- the batch size *declares* the items, it
  is not a guess from shapes. Items keep their leaves' trailing dims, not their own batch dims. The episode
  buffer takes such a TensorDict as one episode of ``B`` steps (its dict episodes are time-stacked leaves).
* A TensorDict inside a list is one item and must have ``batch_size=[]`` on tensor storage.
* Output: a tensor storage whose *first* stored item (the one that fixed the schema) was a TensorDict samples
  TensorDicts: ``batch_size=[n]`` (``n`` = the leading dim of ``replay_buffer_idx``), the pushed nesting, plus the
  sample's tensor columns (``replay_unique_id`` and ``replay_buffer_idx`` int64, ``priority``, ``IS``, ...).
  Otherwise dicts. The choice lives with the schema: ``clear`` keeps it, ``state_dict`` / ``save_data`` carry it.
  List storage keeps the pushed objects (a TensorDict comes back as that TensorDict).
"""

import sys
from typing import Any, Dict, List, Optional

import torch


def is_tensordict(x: Any) -> bool:
    """Whether ``x`` is a ``tensordict.TensorDictBase`` (False, without importing anything, when it is not loaded)."""
    mod = sys.modules.get('tensordict')
    return mod is not None and isinstance(x, mod.TensorDictBase)


def to_plain(td: Any) -> Dict[str, Any]:
    """A TensorDict as a nested dict of its tensors (no copies); non-tensor leaves become their Python values."""
    return td.to_dict()


def rows(td: Any) -> List[Any]:
    """A TensorDict batch ``[B, ...]`` as ``B`` TensorDict items (views of one copy, so the caller may reuse ``td``)."""
    if not len(td.batch_size):
        raise ValueError("a batched push of a TensorDict needs batch_size [B, ...]; got batch_size []")
    return list(td.clone().unbind(0))


def check_batched(td: Any) -> None:
    """A TensorDict pushed with ``batched=True`` declares its batch: ``batch_size`` must not be empty."""
    if not len(td.batch_size):
        raise ValueError(
            "push(td, batched=True) / extend(td) needs a TensorDict with batch_size [B, ...] (its leading dim is the "
            "batch); this one has batch_size [] -- push it without batched=True to store it as one item"
        )


def check_item(td: Any, i: int) -> None:
    """A TensorDict in a list of items is one item: ``batch_size`` must be ``[]`` (tensor storage)."""
    if len(td.batch_size):
        raise ValueError(
            f"item {i} is a TensorDict with batch_size {list(td.batch_size)}; in a list each TensorDict is one item "
            f"(batch_size []). Push a batch of items by itself: push(td) or extend(td)"
        )


def to_tensordict(out: Any, device: Optional[torch.device] = None) -> Any:
    """A sample (one dict of batched tensors, or a list of them: whole episodes) as TensorDict(s) with
    ``batch_size=[n]``, ``n`` = the leading dim of ``replay_buffer_idx`` (else of the first leaf)."""
    if isinstance(out, list):
        return [to_tensordict(o, device) for o in out]
    if type(out) is not dict:
        return out
    lead = out.get('replay_buffer_idx')
    if lead is None:
        lead = next(iter(out.values()))
        while isinstance(lead, dict):
            lead = next(iter(lead.values()))
    try:
        import tensordict
    except ImportError as e:
        raise ImportError(
            "this buffer's items were pushed as TensorDicts and it samples TensorDicts, but the "
            "'tensordict' package cannot be imported here (pip install tensordict)"
        ) from e
    return tensordict.TensorDict(out, batch_size=lead.shape[:1], device=device)


def update_info(td: Any) -> Dict[str, Any]:
    """The top-level entries of a sampled TensorDict as a dict, for ``update`` (ids, slots, priorities); non-tensor
    entries (a list-storage sample's ``replay_unique_id``) as their Python values."""
    mod = sys.modules['tensordict']
    out = {}
    for k in td.keys():
        v = td.get(k)
        out[k] = v.data if isinstance(v, mod.NonTensorData) else v.tolist() if mod.is_non_tensor(v) else v
    return out


__all__ = ['is_tensordict', 'to_plain', 'rows', 'check_batched', 'check_item', 'to_tensordict', 'update_info']

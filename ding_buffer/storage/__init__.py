"""Storages: where items live (``list``: any Python object; ``tensor``: columnar preallocated tensors)."""

import re
from typing import Any, Dict, Mapping, Optional, Tuple

from ..config import check_fits_memory
from .base import Prepared, Storage, WriteResult
from .frame_storage import FrameStorage
from .frames import check_frames
from .free_list import FreeListIndex
from .list_storage import ListStorage
from .ring import RingIndex
from .tensor_storage import META_KEYS, TensorStorage

STORAGE_TYPES = {'list': ListStorage, 'tensor': TensorStorage}

# The ``storage`` section every buffer config carries.
STORAGE_CONFIG = dict(
    # 'list': any Python object, sampled as a list of the stored objects (DI-engine layout).
    # 'tensor': dicts of tensors/arrays/scalars kept as one preallocated tensor per field, sampled as one
    #           dict of batched tensors.
    type='list',
    # (tensor) device of the preallocated tensors, e.g. 'cpu', 'cuda', 'cuda:1'.
    device='cpu',
    # (tensor) keep every field in a memory-mapped file in this directory (CPU only); None = in memory.
    memmap_dir=None,
    # What sample returns: None = the storage's own layout (list: per-item dicts; tensor: one dict of batched
    # tensors); 'items' = per-item dicts on tensor storage too (rows of the gathered batch: what DI-engine's
    # policies collate); 'batch' = one dict of batched tensors (tensor storage only).
    output=None,
    # (tensor) image observations stored one frame a transition: None, or a dict (keys: key='obs',
    # next_key='next_obs', stack=None, env_key=None, done_key='done', truncated_key='truncated', spare=None,
    # check=True, n_step=1, gamma=0.99, reward_key='reward') -- see storage/frames.py and the storages docs.
    frames=None,
)


OUTPUTS = (None, 'batch', 'items')


def check_list_storage(cfg: Mapping) -> None:
    """The keys of a list storage config that only tensor storage takes are refused by name."""
    for key in ('memmap_dir', 'frames'):
        if cfg.get(key) is not None:
            raise ValueError(f"config key 'storage.{key}' needs storage.type='tensor', got 'list'")
    if cfg.get('output') == 'batch':
        raise ValueError(
            "config key 'storage.output'='batch' needs storage.type='tensor' (list storage keeps any Python "
            "object and samples the items themselves); use None or 'items'"
        )


def refuse_items_output(cfg: Mapping, buffer_type: str, layout: str, list_ok: bool = True) -> None:
    """For a preset whose samples are not a flat batch of items (runs, episodes, windows): ``storage.output=
    'items'`` is refused by name (``layout`` says what its samples are; ``list_ok``: list storage is an option)."""
    if cfg.get('output') == 'items':
        if not list_ok:
            fix = "None (the storage's own layout)"
        elif cfg.get('type', 'list') == 'list':
            fix = "None (list storage's own layout holds the stored items themselves)"
        else:
            fix = "None, or list storage (whose own layout holds the stored items themselves)"
        raise ValueError(
            f"config key 'storage.output'='items' is not supported by type {buffer_type!r}: its samples are "
            f"{layout}; use {fix}"
        )


def device_ok(x: Any) -> bool:
    """A device config value torch will take: 'cpu', 'cuda' or 'cuda:N'."""
    return isinstance(x, str) and re.fullmatch(r'cpu|cuda(:\d+)?', x) is not None


STORAGE_CHECKS = {
    'storage.type': (lambda x: x in STORAGE_TYPES, f"one of {sorted(STORAGE_TYPES)}"),
    'storage.device': (lambda x: device_ok(x), "'cpu', 'cuda' or 'cuda:N'"),
    'storage.memmap_dir': (
        lambda x: x is None or (isinstance(x, str) and x and '\x00' not in x),
        'None or a directory path',
    ),
    'storage.output': (lambda x: x is None or (isinstance(x, str) and x in OUTPUTS), f"one of {OUTPUTS}"),
    'storage.frames': (check_frames, 'None or a dict of frames options'),
}


def _tensor_kwargs(cfg: Mapping, reserved_keys: Tuple[str, ...], index_cls: type) -> Dict[str, Any]:
    return dict(
        device=cfg.get('device', 'cpu'),
        memmap_dir=cfg.get('memmap_dir'),
        reserved_keys=reserved_keys,
        index_cls=index_cls,
    )


def build_storage(
    cfg: Mapping,
    capacity: int,
    reserved_keys: Tuple[str, ...] = (),
    index_cls: type = RingIndex,
    episodes: Optional[int] = None,
    key: str = 'replay_buffer_size',
    table_bytes: int = 0,
) -> Storage:
    """Build the storage described by a buffer's ``storage`` config section (``index_cls``: its slot index,
    ``RingIndex`` or, for a table with a capacity rule, ``FreeListIndex``; ``episodes``: the transitions of an
    episode table of at most that many episodes, see ``FrameStorage``). Its per-slot arrays, with the
    ``table_bytes`` a slot its table keeps, must fit in memory: else ``ValueError`` naming the config ``key``."""
    kind = cfg.get('type', 'list')
    per_slot = (ListStorage if kind == 'list' else Storage).slot_bytes + index_cls.slot_bytes + table_bytes
    check_fits_memory(f"config key '{key}'", capacity, capacity * per_slot)
    if kind == 'list':
        check_list_storage(cfg)
        return ListStorage(capacity, index_cls)
    kwargs = _tensor_kwargs(cfg, reserved_keys, index_cls)
    if cfg.get('frames') is not None:
        return FrameStorage(capacity, frames=cfg['frames'], episodes=episodes, **kwargs)
    return TensorStorage(capacity, **kwargs)


def storage_from_state(
    cfg: Mapping,
    capacity: int,
    state: Dict[str, Any],
    reserved_keys: Tuple[str, ...] = (),
    index_cls: type = RingIndex,
    item_columns: bool = True,
    episodes: Optional[int] = None,
) -> Storage:
    """Build a new storage of the configured kind from ``state`` (validated; ``item_columns``: see
    ``ListStorage``)."""
    if not isinstance(state, Mapping):
        raise ValueError(f"storage state must be a dict, got {type(state).__name__}")
    kind = cfg.get('type', 'list')
    if kind == 'list':
        return ListStorage.from_state(dict(state), capacity, index_cls, item_columns)
    kwargs = _tensor_kwargs(cfg, reserved_keys, index_cls)
    if cfg.get('frames') is not None:
        return FrameStorage.from_state(dict(state), capacity, frames=cfg['frames'], episodes=episodes, **kwargs)
    if 'frames' in state:
        raise ValueError("saved storage keeps frames once (storage.frames); set config key 'storage.frames' to load it")
    return TensorStorage.from_state(dict(state), capacity, **kwargs)


__all__ = [
    'Storage',
    'Prepared',
    'WriteResult',
    'RingIndex',
    'FreeListIndex',
    'ListStorage',
    'TensorStorage',
    'FrameStorage',
    'META_KEYS',
    'STORAGE_CONFIG',
    'STORAGE_CHECKS',
    'build_storage',
    'check_list_storage',
    'refuse_items_output',
    'storage_from_state',
    'device_ok',
]

"""The manager's local buffer: the buffer section of a distributed config without its ``distributed`` part (and
with ``max_reuse`` as the buffer's ``max_use``), and what the manager needs to know of the type (``profile``).
Imported by the package and by the Ray actor alike (one home; neither imports the other for it)."""

import copy
from typing import Any, Dict, Tuple

from easydict import EasyDict

from ..base import get_buffer_cls
from ..config import check_section
from .config import build_distributed_config, resolve_callable
from .file_root import check_checkpoint_path, resolve_file_root


def _local_cfg(cfg: Any) -> EasyDict:
    local = EasyDict(copy.deepcopy({k: v for k, v in dict(cfg).items() if k != 'distributed'}))
    if local.get('enable_track_used_data'):  # the manager would delete whatever path a worker's data_id names
        raise ValueError(
            "config key 'enable_track_used_data' cannot be combined with distributed.backend: a worker's "
            "'data_id' would name files the manager deletes; delete used data on the worker side"
        )
    return local


def profile(cls: type, local: Any, dcfg: Any) -> Dict[str, Any]:
    """The buffer type's ``distributed_profile`` with the log-reward key resolved (``distributed.log_reward_key``
    when the type has none of its own)."""
    out = dict(cls.distributed_profile(local))
    out['log_reward_key'] = out.get('log_reward_key') or dcfg.log_reward_key
    if dcfg.shared_memory and (out['item_kind'] != 'transition' or out['dict_is_batch']):
        raise ValueError(
            f"config key 'distributed.shared_memory' is True for buffer type {local.get('type')!r}, whose items are "
            f"{out['item_kind']}s; shared-memory rings carry transitions (naive, elastic, advanced)"
        )
    return out


def _max_use_key(cls: type, cfg: Any, max_reuse: int) -> str:
    """The key of type ``cls`` that ``distributed.max_reuse`` sets (``max_use``; chunk's name of it is max_reuse)."""
    key = 'max_use' if 'max_use' in cls.config else getattr(cls, 'key_aliases', {}).get('max_use')
    if key is None:
        raise ValueError(
            f"config key 'distributed.max_reuse' is {max_reuse!r}; it needs a buffer type with a 'max_use' key "
            f"(every built-in preset has one), got type {cfg.get('type')!r}"
        )
    return key


def check_manager_side(cfg: Any, dcfg: Any) -> None:
    """
    Overview:
        What the manager of ``cfg`` would refuse, checked by a process alone (no network): ``scoring_function`` /
        ``metadata_function`` import as callables, ``file_root`` is a directory, ``checkpoint_path`` can be written,
        ``max_reuse`` fits the type.
        ``ValueError`` naming the key, its value and what was expected. A rank that will be the manager runs it
        before any start-up wait (``factory``); the manager itself resolves the same values again when it starts.
    """
    resolve_callable(dcfg.scoring_function, 'scoring_function')
    resolve_callable(dcfg.metadata_function, 'metadata_function')
    resolve_file_root(dcfg.file_root)
    check_checkpoint_path(dcfg.checkpoint_path)
    if dcfg.max_reuse is not None:  # the manager's buffer takes it as its max_use: checked by the type's own rule
        cls = get_buffer_cls(cfg)
        key = _max_use_key(cls, cfg, dcfg.max_reuse)
        try:
            check_section(cls, {**_local_cfg(cfg), key: dcfg.max_reuse})
        except ValueError as e:
            raise ValueError(
                f"config key 'distributed.max_reuse' is {dcfg.max_reuse!r:.40}, which the buffer refuses: {e}"
            ) from e


def build_manager_buffer(cfg: Any, *args, **kwargs) -> Tuple[Any, EasyDict, str]:
    """The manager's local buffer built from the same config (``max_reuse`` becomes ``max_use``)."""
    dcfg = build_distributed_config(cfg.get('distributed'))
    cls = get_buffer_cls(cfg)
    local = _local_cfg(cfg)
    if dcfg.max_reuse is not None:
        local[_max_use_key(cls, cfg, dcfg.max_reuse)] = dcfg.max_reuse
    return cls(local, *args, **kwargs), dcfg, profile(cls, local, dcfg)['log_reward_key']

"""Versioned blobs the manager keeps for its workers: e.g. the learner's network weights, which actors fetch
when a newer version is there (Ape-X). One slot per name; a put replaces the slot only with a higher version,
so a delayed or repeated put of an older version changes nothing.

What a peer can do with it is bounded: at most ``MAX_NAMES`` names of at most ``MAX_NAME_CHARS`` printable
characters, versions are ints in ``[0, 2**62)``, and a payload is whatever the codec decoded within the
transport's message limit (plain data and arrays/tensors: no pickle unless the manager allows it). The manager
holds at most ``MAX_NAMES`` payloads, of at most ``distributed.max_blob_mb`` together (the bytes of their arrays,
tensors, strings and bytes).
"""

import numbers
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..buffers.common import STEP_LIMIT, checked_session

MAX_NAMES = 16
MAX_NAME_CHARS = 64
VERSION_LIMIT = 1 << 62


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(f"blob name must be a printable str of 1..{MAX_NAME_CHARS} characters, got {name!r:.80}")
    return name


def check_version(version: Any, what: str = 'blob version', low: int = 0) -> int:
    """A blob version (``low`` 0) or a ``newer_than`` (``low`` -1): a whole number in ``[low, 2**62)``, numpy's
    ints too (not a bool or a float)."""
    if not isinstance(version, numbers.Integral) or isinstance(version, (bool, np.bool_)):
        raise ValueError(f"{what} must be an int in [{low}, 2**62), got {type(version).__name__} {version!r:.40}")
    if not low <= version < VERSION_LIMIT:
        raise ValueError(f"{what} must be an int in [{low}, 2**62), got {version!r:.40}")
    return int(version)


def check_stamp(version: Any, session_id: Any, required: bool = False) -> Tuple[Optional[int], Any]:
    """The model version and session a learner sets or a push carries: a version as an int in [-1, 2**60) (a whole
    number: numpy's, a float such as 3.0 or a one-element tensor too; None: no stamp; the manager samples with it as
    the learner iteration, whose bound is 2**60), and a session None, an int or a printable str of at most 128
    characters (``TypeError`` / ``ValueError`` naming the value; a tensor or an array would compare ambiguously).
    ``required``: a version must be given (a learner moving the manager's)."""
    if version is not None or required:
        number = version
        if isinstance(version, torch.Tensor):
            number = version.item() if version.numel() == 1 else None
        elif isinstance(version, np.ndarray):
            number = version.item() if version.size == 1 else None
        whole = isinstance(number, numbers.Integral) or (isinstance(number, float) and number.is_integer())
        if not whole or isinstance(number, (bool, np.bool_)):
            raise TypeError(f"model version must be an int, got {type(version).__name__} {version!r:.40}")
        if not -1 <= number < STEP_LIMIT:
            raise ValueError(f"model version must be an int in [-1, 2**60), got {version!r:.40}")
        version = int(number)
    if session_id is None or (isinstance(session_id, numbers.Integral) and not isinstance(session_id, bool)):
        return version, session_id if session_id is None else int(session_id)
    try:
        return version, checked_session(session_id)
    except ValueError:
        raise ValueError(
            f"session_id must be None, an int or a printable str of at most 128 characters, got {session_id!r:.60}"
        ) from None


TENSOR_OVERHEAD, ARRAY_OVERHEAD = 1024, 128  # bytes of a tensor / array object besides its data (measured, rounded up)


def payload_bytes(obj: Any) -> int:
    """Bytes held by a decoded payload: arrays, tensors, strings (their size in memory) and bytes in nested dicts /
    lists / tuples (the codec's own nesting limit bounds the depth; each container counts 64 bytes per entry, and
    a number 64 bytes, or a big int its size in memory)."""
    if isinstance(obj, torch.Tensor):  # (and what a tensor object costs of its own, whatever its size)
        return TENSOR_OVERHEAD + obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return ARRAY_OVERHEAD + int(obj.nbytes)
    if isinstance(obj, np.generic):  # (a numpy scalar: its bytes, a str_ or void of any length included)
        return max(64, int(obj.nbytes))
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, str):  # (its size in memory: up to 4 bytes a character)
        return sys.getsizeof(obj)
    if isinstance(obj, int):  # (a big int holds its digits)
        return max(64, sys.getsizeof(obj))
    if isinstance(obj, dict):
        return sum(64 + payload_bytes(k) + payload_bytes(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(64 + payload_bytes(v) for v in obj)
    if isinstance(obj, slice):
        return 64 + payload_bytes(obj.start) + payload_bytes(obj.stop) + payload_bytes(obj.step)
    return 64


class BlobStore:
    """``name -> (version, payload)``; the manager's half of ``RemoteBuffer.put_blob`` / ``get_blob``."""

    def __init__(self, max_bytes: float = float('inf')) -> None:
        self._slots: Dict[str, Any] = {}
        self._sizes: Dict[str, int] = {}
        self.max_bytes = max_bytes

    def put(self, name: Any, version: Any, payload: Any) -> Dict[str, Any]:
        """Keep ``payload`` as ``name``'s version ``version`` (>= 0) when it is newer than the kept one. Returns
        ``{'stored': bool, 'version': the version now kept}``."""
        name = check_name(name)
        version = check_version(version)
        kept = self._slots.get(name)
        if kept is None and len(self._slots) >= MAX_NAMES:
            raise ValueError(
                f"blob {name!r}: the manager keeps at most {MAX_NAMES} blob names, and {sorted(self._slots)} are taken"
            )
        if kept is not None and kept[0] >= version:
            return {'stored': False, 'version': kept[0]}
        size = payload_bytes(payload)
        total = sum(self._sizes.values()) - self._sizes.get(name, 0) + size
        if total > self.max_bytes:
            raise ValueError(
                f"blob {name!r} of {size} bytes would make the manager's blobs {total} bytes, over "
                f"distributed.max_blob_mb ({self.max_bytes / (1 << 20):g} MiB)"
            )
        self._slots[name] = (version, payload)
        self._sizes[name] = size
        return {'stored': True, 'version': version}

    def get(self, name: Any, newer_than: Any = -1) -> Optional[Dict[str, Any]]:
        """``{'version', 'payload'}`` of ``name`` when its version is above ``newer_than``, else None (also when
        nothing was put under ``name`` yet)."""
        name = check_name(name)
        newer_than = check_version(newer_than, 'newer_than', -1)
        kept = self._slots.get(name)
        if kept is None or kept[0] <= newer_than:
            return None
        return {'version': kept[0], 'payload': kept[1]}

    def versions(self) -> Dict[str, int]:
        return {k: v[0] for k, v in self._slots.items()}

"""``FragmentStore``: payloads of fragments kept apart from the buffer, which holds only their ids.

MineStudio's replay actor keeps metadata only and leaves payloads in a separate store that producers write to and
consumers read from by id; ours does the same with two kinds:

* ``memory``: a dict in the buffer's process (the default; payloads are any objects ``copy.deepcopy`` can copy).
  It keeps a deep copy of what it is given and hands out a deep copy on every ``get``, as the disk store does by
  construction: a producer reusing its tensors after a push, or a learner editing a sample in place, never changes
  what the store holds, so a later sample of the same fragment is what was pushed. (Read-only views are not an
  option: a torch tensor cannot be made unwritable.)
* ``disk``: one file per fragment under ``path`` (``<id>.pt``, written with ``torch.save`` to a temporary name and
  renamed, read back with ``weights_only=True`` once its CRC-32 checksums match: tensors, arrays, numbers, strings
  and containers of them, never code; a flipped bit is a ``ValueError``). Several processes may open the same
  ``path``: a producer ``put``s a payload and pushes only its id, a learner ``get``s the payloads of the ids it
  sampled. No fsync: it is a cache of fragments in flight, not a checkpoint (the owner clears it when it starts).

Ids are 32 lowercase hex characters (``uuid4().hex``), checked on every call, so an id from the wire never names a
path: the directory is the owner's ``path``, from its config. The buffer deletes a payload when no receive queue,
chunk or last fetch refers to it any more (reference counting in ``buffers/chunk.py``); the store itself keeps
everything it is given until then.
"""

import copy
import functools
import importlib
import io
import logging
import os
import re
import uuid
import weakref
from typing import Any, Dict, Iterable, Optional, Set

import numpy as np
import torch

from .. import forks
from ..persistence import NamedFile, check_integrity, naming, safe_globals, save_checked
from .tree import copy_memo

_ID = re.compile(r'[0-9a-f]{32}')
KINDS = ('memory', 'disk')
# the disk stores of this process by directory: a payload one of them holds is not deleted by another (two buffers
# on one path, e.g. one loaded from the other's file)
_OPEN: Dict[str, 'weakref.WeakSet[FragmentStore]'] = {}
_OPEN_LOCK = forks.lock(reentrant=False)


@functools.lru_cache(maxsize=None)
def numpy_globals() -> tuple:
    """What a pickled numpy array or scalar names (its constructor, ``ndarray``, ``dtype``, the dtype classes, and
    ``bytes``, which an empty array, ``b''`` or an empty numpy string pickles as): allowed when a payload file is
    read, so arrays round-trip; no other class is, so nothing runs code."""
    # numpy 2 pickles them as numpy._core.multiarray.*, numpy 1 as numpy.core.multiarray.*: either name is read
    # (a file moves between the two), as this numpy's function (numpy 1.26's numpy._core is a stand-in that
    # torch imports only in part)
    multiarray = importlib.import_module('numpy._core.multiarray' if _NUMPY_2 else 'numpy.core.multiarray')
    named = [(getattr(multiarray, f), f'numpy.{m}.multiarray.{f}') for f in ('_reconstruct', 'scalar') for m in _CORES]
    dtypes = {type(np.dtype(code)) for code in np.typecodes['All'] if code != 'O'}
    return (*named, np.ndarray, np.dtype, bytes, *dtypes)


_NUMPY_2 = int(np.__version__.split('.')[0]) >= 2
_CORES = ('_core', 'core')


def check_id(fragment_id: Any) -> str:
    """``fragment_id`` as a valid id (``ValueError`` naming it otherwise)."""
    if not isinstance(fragment_id, str) or not _ID.fullmatch(fragment_id):
        raise ValueError(f"fragment id must be 32 lowercase hex characters, got {fragment_id!r:.60}")
    return fragment_id


def _copied(payload: Any, memo: Dict[int, Any]) -> Any:
    """``copy.deepcopy(payload, memo)``; a payload no copy takes (a lock, a nested tensor) is a ``TypeError``."""
    try:
        return copy.deepcopy(payload, memo)
    except (TypeError, NotImplementedError, copy.Error) as e:
        raise TypeError(f"a fragment's payload cannot be copied into the store ({type(e).__name__}: {e})") from e


class FragmentStore:
    """
    Overview:
        Payloads by id. ``put(payload) -> id``, ``get(id)``, ``delete(id)``, ``id in store``, ``ids()``,
        ``nbytes()``, ``clear()``. ``KeyError`` for an id it does not hold. Both kinds copy: ``put`` keeps the
        payload as it is at the call and ``get`` returns a fresh copy each time (edit it freely).
    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     fid = FragmentStore('disk', tmp).put({'obs': torch.ones(2)})  # a producer
        ...     reader = FragmentStore('disk', tmp)  # a learner opening the same directory
        ...     print(len(fid), fid in reader, reader.get(fid)['obs'].tolist())
        ...     reader.delete(fid)
        ...     print(fid in reader, os.listdir(tmp))
        32 True [1.0, 1.0]
        False []
    """

    def __init__(self, kind: str = 'memory', path: Optional[str] = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"config key 'store.type' must be one of {list(KINDS)}, got {kind!r:.40}")
        if kind == 'disk':
            if not isinstance(path, str) or not path:
                raise ValueError(
                    f"config key 'store.path' must name a directory for store.type='disk', got {path!r:.60}"
                )
            path = os.path.abspath(path)
            os.makedirs(path, exist_ok=True)
        elif path is not None:
            raise ValueError("config key 'store.path' is only for store.type='disk'")
        self.kind, self.path = kind, path
        self._mem: Dict[str, Any] = {}
        self._held: Set[str] = set()  # (disk) the ids its owner refers to: ``hold``, ``delete``
        # (disk) in a forked child, the payloads it put itself: it deletes only those (None: not forked)
        self._own: Optional[Set[str]] = None
        if kind == 'disk':
            with _OPEN_LOCK:  # (by the directory itself: a symlink to it is the same store)
                _OPEN.setdefault(os.path.realpath(path), weakref.WeakSet()).add(self)
            forks.tell_children(self)

    def _after_fork(self) -> None:
        """A forked child's copy: the payloads so far are its parent's (a grandchild's: its parent's too)."""
        self._own = set()

    def hold(self, fragment_id: str) -> None:
        """The owner refers to ``fragment_id``: another store of this process on the same path keeps its file."""
        if self.kind == 'disk':
            self._held.add(fragment_id)

    def release(self) -> None:
        """The owner refers to nothing any more (it closed): the payloads stay."""
        self._held.clear()

    def _held_elsewhere(self, name: str) -> bool:
        if self._own is not None and name not in self._own:  # (a forked child's copy: its parent's)
            return True
        with _OPEN_LOCK:
            stores = _OPEN.get(os.path.realpath(self.path), ())
            return any(name in store._held for store in stores if store is not self)

    def _file(self, fragment_id: str) -> str:
        return os.path.join(self.path, check_id(fragment_id) + '.pt')

    def put(self, payload: Any) -> str:
        """Store ``payload`` under a new id and return the id."""
        return self.put_as(uuid.uuid4().hex, payload)

    def put_as(self, fragment_id: str, payload: Any) -> str:
        """Store a copy of ``payload`` under ``fragment_id`` (a restore writes saved payloads back under their ids)."""
        check_id(fragment_id)
        memo = copy_memo(payload)  # (a payload is data: a sample is a copy a learner may edit; a view: its own)
        if self.kind == 'memory':
            self._mem[fragment_id] = _copied(payload, memo)
            return fragment_id
        payload = _copied(payload, memo) if memo else payload
        final = self._file(fragment_id)
        tmp = os.path.join(self.path, f'.{fragment_id}.{os.getpid()}.tmp')
        try:
            with naming(final, os.path.basename(tmp)), open(tmp, 'wb') as f:
                save_checked(payload, NamedFile(f, final))  # (a full disk: an OSError naming the file)
            os.replace(tmp, final)
            if self._own is not None:
                self._own.add(fragment_id)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return fragment_id

    def get(self, fragment_id: str) -> Any:
        """A fresh copy of the payload (``memory``: a deep copy; ``disk``: read from its file)."""
        if self.kind == 'memory':
            try:
                payload = self._mem[check_id(fragment_id)]
            except KeyError:
                raise KeyError(f"no fragment {fragment_id!r} in the store (deleted, or never put)") from None
            return copy.deepcopy(payload)
        path = self._file(fragment_id)
        try:
            with open(path, 'rb') as f:  # read once: checked (torch.load checks no CRC-32) and loaded from memory
                raw = io.BytesIO(f.read())
        except FileNotFoundError:
            raise KeyError(f"no fragment {fragment_id!r} in the store at {self.path} (deleted, or never put)") from None
        check_integrity(raw, path)
        raw.seek(0)
        try:
            with safe_globals(numpy_globals()):
                return torch.load(raw, map_location='cpu', weights_only=True)
        except Exception as e:  # truncated, foreign or code-carrying file: never executed
            raise ValueError(f"fragment file {path} is unreadable: {type(e).__name__}: {e}") from e

    def __contains__(self, fragment_id: Any) -> bool:
        try:
            check_id(fragment_id)
        except ValueError:
            return False
        return fragment_id in self._mem if self.kind == 'memory' else os.path.isfile(self._file(fragment_id))

    def delete(self, fragment_id: str) -> None:
        """Forget ``fragment_id`` (a no-op when it is already gone)."""
        if self.kind == 'memory':
            self._mem.pop(check_id(fragment_id), None)
            return
        self._held.discard(fragment_id)
        if self._held_elsewhere(fragment_id):
            return
        if self._own is not None:
            self._own.discard(fragment_id)
        _remove(self._file(fragment_id))

    def size(self, fragment_id: str) -> int:
        """Bytes of one payload on disk (0 for ``memory``, or when it is gone)."""
        if self.kind == 'memory':
            return 0
        try:
            return os.path.getsize(self._file(fragment_id))
        except OSError:
            return 0

    def ids(self) -> Set[str]:
        if self.kind == 'memory':
            return set(self._mem)
        return {n[:-3] for n in os.listdir(self.path) if n.endswith('.pt') and _ID.fullmatch(n[:-3])}

    def nbytes(self) -> int:
        """Bytes on disk (``disk``); 0 for ``memory`` (not measured)."""
        return 0 if self.kind == 'memory' else sum(self.size(fragment_id) for fragment_id in self.ids())

    def delete_all(self, ids: Iterable[str]) -> None:
        for fragment_id in ids:
            self.delete(fragment_id)

    def clear(self) -> None:
        """Delete every payload (and, on disk, temporaries a killed writer left)."""
        if self.kind == 'memory':
            self._mem.clear()
            return
        self._held.clear()
        for name in os.listdir(self.path):
            if name.endswith('.pt') and _ID.fullmatch(name[:-3]) and self._held_elsewhere(name[:-3]):
                continue  # another open buffer's payload
            if (name.endswith('.pt') and _ID.fullmatch(name[:-3])) or (name.startswith('.') and name.endswith('.tmp')):
                _remove(os.path.join(self.path, name))


def _remove(path: str) -> None:
    """Delete the file of a payload no longer held: one already gone is fine; one the filesystem will not delete
    (EIO, EACCES, a read-only remount) stays on disk, logged, since the buffer has already let it go (nothing refers
    to the payload any more; ``clear_on_start`` deletes it when a buffer next starts on the path)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # (logged: a warning raised as an error would stop the call half way)
        logging.getLogger('ding_buffer').warning("could not delete the payload file %s (%s); it stays on disk", path, e)


__all__ = ['FragmentStore', 'check_id', 'KINDS']

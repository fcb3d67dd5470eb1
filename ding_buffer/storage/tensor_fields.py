"""The field tensors of a ``TensorStorage``: one preallocated ``[capacity, *shape]`` tensor per schema field.

Fields live in memory on the storage device, or, with ``memmap_dir``, each in its own file mapped with
``torch.from_file`` (shared), so buffers larger than RAM work. CPU fields also get numpy views (same memory),
which the storage writes and reads through: numpy's per-call overhead is a fraction of torch's.

Memmap files are working memory, not a save (``save_data`` is): every allocation gets files of its own
(``{index}_{field}.{host}-{pid}-{n}.bin``, ``n`` counting from a random number; made only if no such file exists),
so a storage being restored never touches the files of the live one, nor does a process of another host or
container sharing the directory (a container's pids are its own: two may both be pid 1), and the files are removed
with the storage that mapped them (``close()``, a rejected restore, garbage collection). Files that a killed process
of this host left behind (its pid gone; or this process's pid, numbered outside this process's range: a restarted
container's pid 1) are removed by the next allocation in that directory; another host's are never judged.
"""

import ctypes
import errno
import functools
import hashlib
import itertools
import math
import os
import re
import sys
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..config import machine_memory
from ..persistence import host_id
from .tensor_schema import Schema
from .tree import Path, path_name

# allocations count from a random number: a process restarted with the same pid (a container's pid 1) names its
# files anew, and tells its own from those an earlier process of its pid left (``remove_orphans``)
_FIRST = int.from_bytes(os.urandom(8), 'little') >> 2
_GENERATION = itertools.count(_FIRST)
_OURS = re.compile(r'^\d{3}_.*\.(?:([0-9a-f]{8})-)?(\d+)-(\d+)\.bin$')  # (files of older versions: no host part)


@functools.lru_cache(maxsize=None)
def host_tag() -> str:
    """8 hex digits naming this host (``persistence.host_id``): another host's files are never judged here."""
    return hashlib.sha1(host_id().encode()).hexdigest()[:8]


def new_token() -> str:
    """A name part no other allocation (of this process, or a live one of any host) uses."""
    return f'{host_tag()}-{os.getpid()}-{next(_GENERATION)}'


def memmap_file(memmap_dir: str, index: int, path: Path, token: str) -> str:
    """File of the ``index``-th field of the allocation ``token``: numbered, so distinct fields never share one; the
    field's name, in ASCII and at most 80 characters, only for whoever lists the folder (a file name holds 255
    bytes: a deep or non-ASCII field path would not fit)."""
    safe = ''.join(c if c.isascii() and c.isalnum() or c in '._-' else '_' for c in path_name(path))[:80]
    return os.path.join(memmap_dir, f'{index:03d}_{safe}.{token}.bin')


def check_fits(schema: Schema, capacity: int) -> None:
    """``capacity`` slots of ``schema`` fit in this machine's memory, else ``ValueError`` before anything is
    allocated: a system that overcommits memory grants a larger allocation, and the process is killed as it is
    zeroed (a config's capacity, or a saved state's, times a pushed or saved item's size)."""
    per_slot = sum(
        math.prod(int(d) for d in shape) * torch.empty(0, dtype=dtype).element_size()  # (Python ints: no wrap)
        for shape, dtype in schema.values()
    )
    if capacity * per_slot > machine_memory():
        raise ValueError(
            f"{capacity} slots of {per_slot} bytes each need {capacity * per_slot:.3g} bytes, more than this "
            f"machine's {machine_memory():.3g} bytes of memory: use a smaller capacity (replay_buffer_size / "
            f"max_transitions) or storage.memmap_dir"
        )


def allocate_fields(
    schema: Schema, capacity: int, device: torch.device, memmap_dir: Optional[str], token: str = ''
) -> Dict[Path, torch.Tensor]:
    """A new zeroed (in memory) or freshly mapped (``memmap_dir``, files named with ``token``) tensor for every
    field of ``schema``. A failed allocation removes the files it created."""
    fields: Dict[Path, torch.Tensor] = {}
    if memmap_dir is None:
        if device.type == 'cpu':
            check_fits(schema, capacity)
        for path, (shape, dtype) in schema.items():
            if device.type == 'cpu':
                field = torch.empty((capacity, *shape), dtype=dtype)
                advise_huge_pages(field)  # before the pages are touched: zero_ faults them in as huge pages
                fields[path] = field.zero_()
            else:
                fields[path] = torch.zeros((capacity, *shape), dtype=dtype, device=device)
        return fields
    try:
        os.makedirs(memmap_dir, exist_ok=True)
    except OSError as e:  # (accepted at build: the directory may be made possible later)
        raise OSError(e.errno, f"config key 'storage.memmap_dir' is {memmap_dir!r}: {e.strerror}") from None
    remove_orphans(memmap_dir)
    made: List[str] = []
    try:
        for index, (path, (shape, dtype)) in enumerate(schema.items()):
            numel = capacity * int(np.prod(shape, dtype=np.int64))
            fname = memmap_file(memmap_dir, index, path, token)
            reserve(fname, numel * torch.empty(0, dtype=dtype).element_size())
            made.append(fname)  # (after: a file that was there already is never this call's to remove)
            tensor = torch.from_file(fname, shared=True, size=numel, dtype=dtype)
            fields[path] = tensor.view(capacity, *shape)
    except BaseException:
        remove_files(made)
        raise
    return fields


def reserve(fname: str, nbytes: int) -> None:
    """Create ``fname`` with its ``nbytes`` of disk blocks reserved: a disk that cannot hold them is an ``OSError``
    now, not a SIGBUS at a later write into the mapping (a sparse file's pages get their blocks only then). Any
    failure names the file and ``storage.memmap_dir``."""
    try:
        fd = os.open(fname, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)  # (never another process's file)
        try:
            if nbytes and hasattr(os, 'posix_fallocate'):
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError as e:  # a file system that cannot reserve blocks: its files are mapped sparse
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
        except BaseException:
            remove_files([fname])  # (the file this call made)
            raise
        finally:
            os.close(fd)
    except OSError as e:
        what = 'no space left' if e.errno == errno.ENOSPC else e.strerror
        raise OSError(e.errno, f"{what} for the {nbytes}-byte memmap file {fname} (storage.memmap_dir)") from None


_HUGE = 2**21  # a transparent huge page on x86-64 and arm64
_MADV_HUGEPAGE = 14
_libc: Any = None


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask Linux to back a large CPU tensor with transparent huge pages (``madvise(MADV_HUGEPAGE)`` over the whole
    2 MiB pages inside it), as numpy does for its own large arrays: random row reads of a big buffer (sampling)
    then miss the TLB far less often. A no-op (False) elsewhere, for small tensors, or where THP is disabled."""
    global _libc
    nbytes = t.numel() * t.element_size()
    if not sys.platform.startswith('linux') or nbytes < 2 * _HUGE or t.device.type != 'cpu':
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    start = (t.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
    end = (t.data_ptr() + nbytes) & ~(_HUGE - 1)
    return end > start and _libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0


def remove_files(files: List[str], owner: Optional[int] = None) -> None:
    """Remove memmap files (already gone is fine; the mapping itself stays valid until released); with ``owner``
    (the pid that made them) only in that process: a forked child's copy of a storage shares its parent's files."""
    if owner is not None and owner != os.getpid():
        return
    for f in files:
        try:
            os.remove(f)
        except OSError:
            pass


def remove_orphans(memmap_dir: str) -> None:
    """Remove field files of processes that are gone (a killed run never released them)."""
    try:
        names = os.listdir(memmap_dir)
    except OSError:
        return
    for name in names:
        m = _OURS.match(name)
        if m is None or m.group(1) not in (None, host_tag()):  # another host's: not ours to judge
            continue
        pid, generation = int(m.group(2)), int(m.group(3))
        mine = pid == os.getpid() and _FIRST <= generation < _FIRST + 2**32  # (an earlier process of this pid's: not)
        if not mine and (pid == os.getpid() or not _alive(pid)):
            remove_files([os.path.join(memmap_dir, name)])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OverflowError, ValueError):  # no pid of this host: a file named so is not ours to judge
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def numpy_views(fields: Dict[Path, torch.Tensor]) -> Dict[Path, np.ndarray]:
    """Numpy views (shared memory) of the CPU ``fields`` whose dtype numpy has."""
    views = {}
    for p, f in fields.items():
        try:
            views[p] = f.numpy()
        except TypeError:  # bfloat16, float8, ...: numpy has no such dtype, write through torch
            pass
    return views

"""HDF5 access shared by the HDF5 layouts: importing h5py with an install hint, opening a file so that a damaged
one is a ``ValueError`` naming it, reading a dataset or a group of datasets in row ranges, and the checks every
layout makes of its arrays (numeric dtype, row count, 0/1 flags, readable to the end).

Every message names the file and the key (``'hopper.hdf5': key 'rewards' ...``).
"""

import contextlib
import os
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from ..config import machine_memory
from .columns import Tree

MAGIC = b'\x89HDF\r\n\x1a\n'  # at offset 0 (files with a user block put it at 512, 1024, ...)
NUMERIC = 'biuf'  # numpy dtype kinds a field may have: bool, signed, unsigned, float


def import_h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ImportError(
            'reading and writing HDF5 datasets needs h5py: pip install "ding_buffer[datasets]" (or pip install h5py)'
        ) from None
    return h5py


def is_hdf5(path: str) -> bool:
    """The HDF5 signature at offset 0 or, after a user block, at 512, 1024, 2048, ... (where the format puts it)."""
    with open(path, 'rb') as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while offset + len(MAGIC) <= size:
            f.seek(offset)
            if f.read(len(MAGIC)) == MAGIC:
                return True
            offset = 512 if offset == 0 else 2 * offset
        return False


class FileError(ValueError):
    """A dataset file that is not what its layout says (a ``ValueError``)."""


def fail(path: str, key: Optional[str], what: str) -> FileError:
    where = f"{path!r}: key {key!r}" if key else repr(path)
    return FileError(f"{where} {what}")


@contextlib.contextmanager
def open_hdf5(path: str, layout: str) -> Iterator[Any]:
    """The open ``h5py.File``; a file h5py cannot open (not HDF5, truncated, a damaged header) is a FileError."""
    h5py = import_h5py()
    try:
        f = h5py.File(path, 'r')
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise fail(
            path, None, f"is not a readable HDF5 file ({layout} layout expected; truncated or damaged?): {e}"
        ) from e
    with f:
        try:
            yield f
        except (OSError, RuntimeError) as e:  # h5py reading a damaged node outside the checked reads
            raise fail(path, None, f"cannot be read ({layout} layout; truncated or damaged?): {e}") from e


def node(path: str, group: Any, key: str, *, group_ok: bool = False, group_only: bool = False) -> Any:
    """``group[key]``: a dataset (with ``group_ok`` or a group of them; with ``group_only`` a group); missing or
    another kind is a FileError."""
    h5py = import_h5py()
    try:
        found = group.get(key) if key in group else None
    except (OSError, RuntimeError, KeyError, ValueError) as e:
        raise fail(path, _full(group, key), f"cannot be read (damaged file?): {e}") from e
    if found is None and key in group.keys():  # listed, but the link leads nowhere
        raise fail(path, _full(group, key), "is a link to nothing (a dangling soft or external link)")
    if found is None:
        raise fail(path, _full(group, key), f"is missing; the layout needs it (present: {shown(group.keys())})")
    if (
        isinstance(found, h5py.Group)
        if group_only
        else isinstance(found, h5py.Dataset) or (group_ok and isinstance(found, h5py.Group))
    ):
        return found
    kind = 'a group' if isinstance(found, h5py.Group) else 'a dataset' if isinstance(found, h5py.Dataset) else 'other'
    want = 'a group of datasets' if group_only else 'a dataset of arrays'
    raise fail(path, _full(group, key), f"is {kind}, expected {want}")


def shown(keys: Any) -> List[str]:
    """Member names for a message, sorted (h5py gives a name that is not UTF-8 text as bytes)."""
    return sorted(map(str, keys))


def names(path: str, group: Any) -> List[str]:
    """The names of a group's members, sorted; one that is not UTF-8 text (h5py gives bytes) is a FileError."""
    keys = list(group.keys())
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        where = (getattr(group, 'name', '/') or '/').lstrip('/') or None
        raise fail(path, where, f"has a member named {bad[0]!r}, which is not UTF-8 text (damaged file?)")
    return sorted(keys)


def _full(group: Any, key: str) -> str:
    name = getattr(group, 'name', '/') or '/'
    return key if name == '/' else f"{name.lstrip('/')}/{key}"


def leaves(path: str, obj: Any, name: str) -> Iterator[Tuple[str, Any]]:
    """``(key, dataset)`` of a dataset or of every dataset under a group (nested groups: nested keys)."""
    h5py = import_h5py()
    if isinstance(obj, h5py.Dataset):
        yield name, obj
        return
    keys = names(path, obj)
    if not keys:
        raise fail(path, name, "is an empty group, expected datasets")
    for k in keys:
        yield from leaves(path, node(path, obj, k, group_ok=True), f'{name}/{k}')


def check_array(path: str, key: str, ds: Any, rows: int, shape: Optional[tuple] = None) -> None:
    """``ds`` has ``rows`` rows, a numeric or bool dtype and (if given) the per-row ``shape``."""
    try:
        dtype = ds.dtype
    except (ValueError, TypeError, OSError) as e:  # a datatype numpy has no match for (a damaged header)
        raise fail(path, key, f"has a datatype numpy cannot read (damaged file?): {e}") from e
    if not numeric(dtype):
        raise fail(path, key, f"has dtype {dtype}, expected numbers or bools (floats of at most 64 bits)")
    if ds.ndim == 0 or ds.shape[0] != rows:
        got = 'a scalar' if ds.ndim == 0 else f'{ds.shape[0]} rows'
        raise fail(path, key, f"has {got}, expected {rows} rows (shape {tuple(ds.shape)})")
    if shape is not None and tuple(ds.shape[1:]) != tuple(shape):
        raise fail(path, key, f"has rows of shape {tuple(ds.shape[1:])}, expected {tuple(shape)}")
    _check_storage(path, key, ds)


def numeric(dtype: np.dtype) -> bool:
    """A dtype a field may have: bool, ints, floats torch has (not numpy's extended ``longdouble``)."""
    return dtype.kind in NUMERIC and not (dtype.kind == 'f' and dtype.itemsize > 8)


def _check_storage(path: str, key: str, ds: Any) -> None:
    """A contiguous dataset's stored bytes are what its shape and dtype need: a damaged header (another shape or
    dtype over the same bytes) would read rows from outside them; an unwritten one holds none (it reads as its fill
    value). A chunked dataset with checksums (as ``write_d4rl`` writes, every chunk) has every chunk of its grid in
    its index: a damaged index (or chunk shape) would read the chunks it misses as the fill value, checksums
    unchecked. (Without checksums an unwritten chunk is legal: a flag column written only where true.)"""
    h5py = import_h5py()
    try:
        layout = ds.id.get_create_plist().get_layout()
        chunked = layout == h5py.h5d.CHUNKED
        stored = ds.id.get_num_chunks() if chunked else ds.id.get_storage_size()
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise fail(path, key, f"cannot be read (damaged file?): {e}") from e
    if chunked:
        grid = int(np.prod([-(-s // c) for s, c in zip(ds.shape, ds.chunks)], dtype=np.int64))
        if stored != grid and ds.fletcher32:  # (other writers may leave chunks unwritten: they read as the fill value)
            what = f"has {stored} stored chunks of {ds.chunks} for its shape {ds.shape}, which needs {grid}"
            raise fail(path, key, f"{what} (a damaged chunk index, or a dataset never fully written)")
        return
    if layout != h5py.h5d.CONTIGUOUS:
        return
    need = int(np.prod(ds.shape, dtype=np.int64)) * ds.dtype.itemsize
    if 0 < stored != need:
        what = f"declares {tuple(ds.shape)} {ds.dtype} ({need} bytes) over {stored} stored bytes (damaged header?)"
        raise fail(path, key, what)


def check_flags(path: str, key: str, ds: Any, rows: int) -> None:
    """A flag column: ``rows`` values, one per row (shape ``[rows]`` or ``[rows, 1]``), bool or 0/1 numbers."""
    check_array(path, key, ds, rows)
    if ds.shape[1:] not in ((), (1,)):
        raise fail(path, key, f"has rows of shape {tuple(ds.shape[1:])}, expected one flag a row")


def read(path: str, key: str, ds: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)``; an unreadable range (a truncated file) is a FileError, and so are rows the file
    declares larger than this machine's memory (a few-KB chunked file may declare any; where the system overcommits
    memory the read would be granted and the process killed as it fills them)."""
    need = (stop - start) * int(np.prod(ds.shape[1:], dtype=np.float64)) * ds.dtype.itemsize
    if need > machine_memory():
        raise fail(
            path,
            key,
            f"declares rows of shape {tuple(ds.shape[1:])}, too large to read: {need:.3g} bytes for "
            f"rows {start}..{stop}, more than this machine's memory",
        )
    try:
        return ds[start:stop]
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
        raise fail(path, key, f"cannot be read at rows {start}..{stop} (truncated or damaged file?): {e}") from e
    except MemoryError as e:  # rows the file declares far larger than its bytes could hold
        raise fail(path, key, f"declares rows of shape {tuple(ds.shape[1:])}, too large to read: {e}") from e


def read_flags(path: str, key: str, ds: Any, start: int, stop: int) -> np.ndarray:
    """Flag rows ``[start, stop)`` as a bool array; a value other than 0 / 1 is a FileError."""
    raw = read(path, key, ds, start, stop).reshape(-1)
    if raw.dtype != np.bool_:
        bad = ~((raw == 0) | (raw == 1))
        if bad.any():
            at = start + int(np.flatnonzero(bad)[0])
            raise fail(path, key, f"holds {raw[at - start].item()!r} at row {at}, expected bools (0 or 1)")
    return raw.astype(bool)


def read_tree(path: str, obj: Any, name: str, start: int, stop: int) -> Tree:
    """A dataset's rows, or a group's as a nested dict of rows."""
    h5py = import_h5py()
    if isinstance(obj, h5py.Dataset):
        return read(path, name, obj, start, stop)
    return {k: read_tree(path, obj[k], f'{name}/{k}', start, stop) for k in names(path, obj)}


def scan(path: str, items: list, rows: int, chunk: int) -> None:
    """Read every ``(key, dataset, is_flag)`` of ``items`` to its end, ``chunk`` rows at a time: a truncated or
    damaged data block, or a flag that is not 0/1, is a FileError before anything is stored."""
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        for key, ds, is_flag in items:
            (read_flags if is_flag else read)(path, key, ds, start, stop)


class HDF5Reader:
    """What the HDF5 layouts' readers share: ``Reader.open(path, **options)`` opens the file (``open_hdf5``) and
    yields ``Reader(path, file, **options)``, which checks the layout's keys, rows, dtypes and shapes."""

    layout = 'HDF5'
    flags: Tuple[str, ...] = ('done', 'timeout')  # the episode-end flags of what it reads (D4RL, Minari)
    names: Tuple[str, ...] = ('obs', 'action', 'reward', 'next_obs', 'done', 'timeout')  # the fields it reads

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str, **options: Any) -> Iterator[Any]:
        with open_hdf5(path, cls.layout) as f:
            yield cls(path, f, **options)  # type: ignore[call-arg]

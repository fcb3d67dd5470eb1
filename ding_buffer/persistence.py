"""Atomic, code-free persistence of buffer states.

``atomic_save`` writes ``torch.save`` output to a temporary file in the target directory, fsyncs it, renames
it over the target (atomic on POSIX) and fsyncs the directory, so a crash leaves either the old file or the
new one, never a torn file; temporary files that a killed save left behind (this host, a writer process that is
gone, or older than a day) are removed by the next save of the same target. ``safe_load`` first checks every
archive member against its CRC-32 (a flipped bit raises ``ValueError`` instead of loading other data), then reads
with ``torch.load(weights_only=True)`` (no code execution); states holding arbitrary Python objects (list
storage) load only with ``allow_pickle=True``.
Every file is an envelope ``{'format', 'version', 'buffer', 'state'}`` so that foreign or future files are
rejected with a clear message.
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import socket
import sys
import tempfile
import time
import zipfile
import zlib
from typing import Any, BinaryIO, Callable, Dict, Iterator, Mapping

import torch

from . import forks

FORMAT = 'ding_buffer'
SCHEMA_VERSION = 1


def refuse_unknown(state: Mapping, known: Any, where: str) -> None:
    """``ValueError`` naming the keys of the saved dict ``state`` that its reader does not know: a damaged or
    hand-edited key must not load as a state missing that entry (older layouts only lack entries)."""
    unknown = [k for k in state if k not in known]
    if unknown:
        shown = sorted(map(str, unknown))[:6]
        raise ValueError(
            f"{where} has unknown key(s) {shown}; expected some of {sorted(map(str, known))} (a damaged or edited "
            f"state, or one of another buffer type)"
        )


USER_DATA_KEYS = frozenset({'items', 'data', 'payloads', 'container'})  # (what users pushed: taken as it came)


def refuse_meta(state: Any, lists: bool = False, where: str = 'state') -> None:
    """``ValueError`` naming the first tensor on the meta device (shapes without values) among the entries of
    ``state``'s nested dicts -- and with ``lists`` their lists' (a state's tensor columns; a walk that costs as
    many steps as a list storage's records, so only once a load failed) -- never inside the items users pushed:
    its readers would fail on it naming no key."""
    if getattr(state, 'is_meta', False) is True:
        raise ValueError(f"{where} is a tensor on the meta device (it holds no values)")
    if isinstance(state, Mapping):
        for key, value in state.items():
            if key not in USER_DATA_KEYS:
                refuse_meta(value, lists, f'{where}[{key!r}]')
    elif lists and isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            refuse_meta(value, lists, f'{where}[{i}]')


def atomic_save(obj: Any, path: str) -> None:
    """Write ``obj`` to ``path`` atomically (temporary file, fsync, rename, fsync of the directory)."""
    atomic_write(path, lambda f: save_checked(obj, f))


_CRC_SWITCH = forks.lock(reentrant=False)


def save_checked(obj: Any, f: Any) -> None:
    """``torch.save`` with the archive's CRC-32 checksums, which every read here checks (``check_integrity``),
    even while the user turned them off (``torch.serialization.set_crc32_options(False)``)."""
    if torch.serialization.get_crc32_options():
        return torch.save(obj, f)
    with _CRC_SWITCH:
        torch.serialization.set_crc32_options(True)
        try:
            torch.save(obj, f)
        finally:
            torch.serialization.set_crc32_options(False)


def atomic_write(path: str, write: Callable[[BinaryIO], None], mode: str = 'wb') -> None:
    """Call ``write(f)`` on a temporary file next to ``path`` (opened with ``mode``: ``'w+b'`` for writers that read
    back and seek; ``f.name`` is its path), fsync it and rename it over ``path`` (then fsync the directory): a crash
    or an error in ``write`` leaves the old file or none, never a torn one. A symlink at ``path`` is written
    through (its target gets the new file); an error of the filesystem names ``path``."""
    path = resolved(path)
    directory = os.path.dirname(path)
    prefix = _temp_prefix(path)
    with naming(path, prefix):
        os.makedirs(directory, exist_ok=True)
        remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f'{prefix}{_HOST}.{os.getpid()}.', suffix='.tmp', dir=directory)
        os.close(fd)
        try:
            with open(tmp, mode) as raw:
                f = NamedFile(raw, path)
                try:
                    write(f)
                    f.sync()
                except BaseException:
                    with contextlib.suppress(OSError):
                        raw.close()  # (a buffer it could not write fails its close too: the error above is the one)
                    raise
            os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; a saved file follows the umask like open()
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    try:  # the new file is in place: a failure from here on does not make the save one that failed (logged)
        fsync_dir(directory)
    except OSError as e:
        logging.getLogger('ding_buffer').warning(
            "saved %r, but the fsync of its directory failed (%s): the rename may not survive a power loss", path, e
        )


class NamedFile:
    """The open file ``f`` written for ``path``: an ``OSError`` of its writes (a full disk: they name no file)
    names ``path``."""

    def __init__(self, f: BinaryIO, path: str) -> None:
        self._f, self._path = f, path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def write(self, data: Any) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            e.filename = self._path if e.filename is None else e.filename
            raise

    def sync(self) -> None:
        """Flush and fsync."""
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            e.filename = self._path if e.filename is None else e.filename
            raise


def resolved(path: Any) -> str:
    """``path`` (str, bytes or ``os.PathLike``) absolute, through symlinks (``ELOOP`` where ``open`` would raise it:
    a loop of links, or a chain longer than the system follows)."""
    path = os.path.abspath(file_path(path))
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path) from None
    return os.path.realpath(path)


def file_path(path: Any) -> str:
    """``path`` (str, bytes or ``os.PathLike``) as a str; ``TypeError`` for anything else."""
    return os.fsdecode(os.fspath(path))


@contextlib.contextmanager
def naming(path: str, temp_prefix: str) -> Iterator[None]:
    """Re-raise as an ``OSError`` of the same errno naming ``path`` an error of a write to ``path`` that names its
    temporary file (its name starts with ``temp_prefix``), or torch's ``RuntimeError`` while an ``OSError``
    naming either propagated (its archive writer raises one then: a full disk)."""
    outer = sys.exc_info()[1]  # (an error the caller is handling is not one of this write)
    try:
        yield
    except (OSError, RuntimeError) as e:
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError) or cause is outer or cause.errno is None or cause.filename is None:
            raise
        named = os.fsdecode(cause.filename)
        if named != path and not os.path.basename(named).startswith(temp_prefix) or cause is e and named == path:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), path) from e


def current_umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status; elsewhere set and restored)."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


STALE_SECONDS = 24 * 3600  # a temporary file this old is stale whatever wrote it (another host, a reused pid)


def _short(name: str, limit: int) -> str:
    """``name``, or when it is over ``limit`` bytes its start and a hash of the whole (distinct names stay
    distinct)."""
    raw = os.fsencode(name)
    return name if len(raw) <= limit else os.fsdecode(raw[: limit - 20]) + '~' + hashlib.sha1(raw).hexdigest()[:16]


_HOST = _short(socket.gethostname().replace('.', '_'), 64) or 'host'


def _temp_prefix(path: str) -> str:
    """``.{name}.``, a name over 96 bytes shortened (``_short``): the temporary file's name (with host, pid and a
    random part) stays within the filesystem's 255 bytes whenever ``path``'s does."""
    return '.' + _short(os.path.basename(path), 96) + '.'


def remove_stale_temps(path: str) -> int:
    """
    Overview:
        Remove temporary files a killed ``atomic_save`` of ``path`` left behind: only names this module gives
        (``.{name}.{host}.{pid}.*.tmp`` next to ``path``), and only when their writer is gone (this host, pid
        not running) or they are older than a day. Returns how many were removed; never raises.
    """
    directory, prefix = os.path.dirname(path), _temp_prefix(path)
    removed = 0
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith('.tmp')]
    except OSError:
        return 0
    for name in names:
        parts = name[len(prefix) :].split('.')
        if len(parts) < 3 or not parts[1].isdigit():
            continue  # not a name of ours
        full = os.path.join(directory, name)
        try:
            old = time.time() - os.stat(full).st_mtime > STALE_SECONDS
            gone = parts[0] == _HOST and int(parts[1]) != os.getpid() and not _pid_alive(int(parts[1]))
            if old or gone:
                os.remove(full)
                removed += 1
        except OSError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def fsync_dir(directory: str) -> None:
    """Make a rename / file creation in ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_text(text: str, path: str) -> None:
    """Write ``text`` to ``path`` atomically (``atomic_write``)."""
    atomic_write(path, lambda f: f.write(text.encode()))


def atomic_json(obj: Any, path: str) -> None:
    atomic_text(json.dumps(obj, indent=2) + '\n', path)


def save_state(path: str, buffer_name: str, state: Dict[str, Any]) -> None:
    atomic_save({'format': FORMAT, 'version': SCHEMA_VERSION, 'buffer': buffer_name, 'state': state}, path)


def safe_load(path: str, allow_pickle: bool = False, allowed: tuple = ()) -> Any:
    """
    Overview:
        Load a file written by :func:`atomic_save` without executing code from it, unless ``allow_pickle``.
        ``allowed``: classes the file may name besides tensors (e.g. numpy's array constructors), none of which
        runs code.
    Raises:
        - FileNotFoundError: the file does not exist.
        - ValueError: the file is corrupt, truncated, or holds Python objects while ``allow_pickle`` is False.
    """
    if type(allow_pickle) is not bool:  # 'False' from a config file or a flag is not False
        raise TypeError(f"allow_pickle must be a bool, got {type(allow_pickle).__name__} {allow_pickle!r:.40}")
    path = file_path(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no buffer file at {path!r}")
    check_integrity(path)
    try:
        if not allowed:
            return torch.load(path, map_location='cpu', weights_only=True)
        with safe_globals(allowed):  # (torch >= 2.5, as the disk store's own reads)
            return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        if 'weights_only' not in str(e) and 'Unsupported global' not in str(e):
            raise unreadable(path, e) from e
        if not allow_pickle:
            raise ValueError(
                f"{path!r} holds arbitrary Python objects (list storage or a chunk memory store); loading it can "
                "execute code. Pass allow_pickle=True only if you trust the file."
            ) from None
    except Exception as e:  # zip/stream errors on truncated or foreign files
        raise unreadable(path, e) from e
    try:
        return torch.load(path, map_location='cpu', weights_only=False)
    except Exception as e:
        raise unreadable(path, e) from e


def unreadable(path: str, e: BaseException) -> Exception:
    """What a failed read of ``path`` raises: ``MemoryError`` when memory ran out (the file may well be fine),
    else ``ValueError`` (corrupt or truncated)."""
    if out_of_memory(e):
        return MemoryError(f"not enough memory to load {path!r}: {e}")
    return ValueError(f"{path!r} is not a readable buffer file (corrupt or truncated?): {e}")


@contextlib.contextmanager
def restoring(path: str) -> Iterator[None]:
    """Around the restore of a state read from ``path``: a ``ValueError`` raised because memory ran out (a state
    whose arrays did not fit) is the ``MemoryError`` it is."""
    try:
        yield
    except ValueError as e:
        if out_of_memory(e):
            raise unreadable(path, e) from e
        raise


# what torch's allocator (a RuntimeError) and numpy (a MemoryError: as a worker's error, a message) say
_OUT_OF_MEMORY = ("can't allocate memory", 'std::bad_alloc', 'Unable to allocate')


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e``, or an error it was raised from, is one of memory running out (``MemoryError``, or torch's
    allocator failing)."""
    for _ in range(8):
        if isinstance(e, MemoryError) or any(m in str(e) for m in _OUT_OF_MEMORY):
            return True
        e = e.__cause__ or e.__context__
        if e is None:
            return False
    return False


_DOS_DIRECTORY = 0x10  # the MS-DOS directory bit of a zip member's external attributes


def host_id() -> str:
    """This host, as every process on it sees it: the hostname and the kernel's boot id."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}'


_GLOBALS_LOCK = forks.lock(reentrant=False)


@contextlib.contextmanager
def safe_globals(allowed: Any) -> Iterator[None]:
    """torch's ``safe_globals`` for one ``weights_only`` load, leaving the process's own list as it was: torch's
    removes every entry it lists on exit, also those the user had allowed before (their own loads then failed), so
    only the entries missing are added, and removed after; the package's loads take turns (another one's exit
    would remove them under a load still running)."""
    with _GLOBALS_LOCK:
        had = set(torch.serialization.get_safe_globals())
        with torch.serialization.safe_globals([g for g in allowed if g not in had]):
            yield


def check_integrity(source: Any, name: Any = None) -> None:
    """Raise ``ValueError`` unless ``source`` is a zip archive whose every member matches its CRC-32 (what
    ``torch.save`` writes; ``torch.load`` itself does not check them, so a flipped bit would load other data), none
    is compressed (``torch.save`` stores every member as it is; a compressed one may inflate to any size) and
    none is marked as a directory (``torch.save`` writes none; ``torch.load`` reads no data for one, so its tensors
    would hold whatever memory was there). ``source``: a path, or an open binary file (``name``: its path)."""
    path = source if name is None else name  # (what errors show)
    try:
        with zipfile.ZipFile(source) as archive:
            packed = next((i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED), None)
            bad = archive.testzip() if packed is None else None  # (testzip would inflate it: gigabytes, maybe)
            folder = next((i.filename for i in archive.infolist() if i.external_attr & _DOS_DIRECTORY), None)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        ValueError,
        NotImplementedError,
        RuntimeError,  # a member flagged as encrypted
        zlib.error,  # a member flagged as compressed
    ) as e:
        raise ValueError(f"{path!r} is not a readable buffer file (corrupt or truncated?): {e}") from e
    if packed is not None:
        raise ValueError(f"{path!r} is corrupt: archive member {packed!r} is compressed (torch.save stores members)")
    if bad is not None:
        raise ValueError(f"{path!r} is corrupt: archive member {bad!r} does not match its CRC-32 checksum")
    if folder is not None:
        raise ValueError(f"{path!r} is corrupt: archive member {folder!r} is marked as a directory")


def load_state(path: str, buffer_name: str, allow_pickle: bool = False, allowed: tuple = ()) -> Dict[str, Any]:
    """Load and check the envelope; returns the buffer state (``allowed``: see ``safe_load``)."""
    obj = safe_load(path, allow_pickle=allow_pickle, allowed=allowed)
    if not isinstance(obj, dict) or obj.get('format') != FORMAT:
        raise ValueError(f"{path!r} is not a ding_buffer save file")
    if obj.get('version') != SCHEMA_VERSION:
        raise ValueError(f"{path!r} has format version {obj.get('version')!r}; this code reads {SCHEMA_VERSION}")
    if obj.get('buffer') != buffer_name:
        raise ValueError(f"{path!r} was saved by {obj.get('buffer')!r}, cannot load it into {buffer_name!r}")
    state = obj.get('state')
    if not isinstance(state, dict):
        raise ValueError(f"{path!r} holds no buffer state (its 'state' entry is {type(state).__name__}, expected dict)")
    return state

"""Shared-memory rings: a worker on the manager's host pushes rows through memory instead of the wire.

One ring per worker buffer (``distributed.shared_memory``). The manager creates the segment (a file in
``/dev/shm``, mode 0600, named after its own pid) for the row layout the worker announced over the wire, and the
worker maps it; the worker unlinks the name as soon as it mapped it, the manager when the worker has not done so
within ``distributed.timeout`` and at shutdown, so nothing is left in ``/dev/shm`` however either side ends (a
manager killed between creating a segment and the worker mapping it leaves that one segment; the next manager on
the host removes the segments of dead managers).

Layout: a 512-byte header -- uint64 words magic, rows written (the worker's counter), rows read (the manager's),
the manager's heartbeat (``time.monotonic_ns``), closed and rows refused (set by the manager), then why the buffer
last refused rows (text) -- and ``rows`` fixed-size rows (a numpy structured dtype). A worker learns of refused rows
on its next push, which raises ``ValueError`` with the buffer's reason (as an ``async_score`` push learns late).
A worker writes a row's fields into the next free slot and then moves its counter; the manager reads the counter,
copies the rows up to it out of shared memory, hands the copy to the buffer as one batched push and then moves its
own counter. Nothing the worker writes is trusted: the layout is the manager's copy of what the worker announced
(checked when announced), and a counter that goes back or past the manager's one by more than the ring holds marks
the ring as corrupt -- it is closed and its worker counted (``shm_corrupt_rings``) -- while the rows a worker lies
about are data, judged by the buffer like any push. Rows are read once: the manager's read counter lives in its
own memory.
"""

import logging
import mmap
import os
import socket
import struct
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import ManagerTimeoutError, ManagerUnavailableError

logger = logging.getLogger('ding_buffer.distributed')

MAGIC = 0x31474E4952424444  # b'DDBRING1' little-endian
HEADER = 512
MAGIC_W, WRITTEN, READ, BEAT, CLOSED, REFUSED, FINAL = 0, 1, 2, 3, 4, 5, 6
NOTE = 64  # bytes 64..512: why the manager last refused rows (utf-8)
SHM_DIR = '/dev/shm'
PREFIX = 'ding_buffer_ring_'
MAX_FIELDS = 256
MAX_ROW_BYTES = 1 << 24
MAX_RINGS_PER_SENDER = 4
MAX_RINGS = 256  # all senders together (Ray clients are many over a long job: lost ones' rings are closed)
OPEN, CLOSED_BY_MANAGER, CLOSED_CORRUPT = 0, 1, 2
DTYPES = ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64', 'float16', 'float32',
          'float64')  # fmt: skip
SCALARS = {bool: 'b', int: 'i', float: 'f'}  # python scalars: (kind, dtype)
SCALAR_DTYPE = {'b': 'bool', 'i': 'int64', 'f': 'float64'}
SCALAR_TYPES = {'b': bool, 'i': int, 'f': float}
SCALAR_PACK = {'b': struct.Struct('?').pack, 'i': struct.Struct('<q').pack, 'f': struct.Struct('<d').pack}
_fence_lock = threading.Lock()


def _fence() -> None:
    """A lock round trip: orders a row's stores before its counter's (and a counter's load before the row's)
    on CPUs that reorder memory operations; free of cost next to a row's copy."""
    with _fence_lock:
        pass


def host_id() -> str:
    """This host, as both sides see it: the hostname and the kernel's boot id (namespaced hosts differ)."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = ''
    return f'{socket.gethostname()}/{boot}'


# ---------------------------------------------------------------------------------------------- row layouts
def _leaf(v: Any, batched: bool) -> Optional[Tuple[str, str, Tuple[int, ...]]]:
    """(kind, dtype, shape of one row) of a leaf that can travel in a ring, else None."""
    if isinstance(v, torch.Tensor):
        if v.device.type != 'cpu' or v.is_sparse or v.requires_grad:
            return None
        dt = str(v.dtype).replace('torch.', '')
        kind, shape = 't', tuple(v.shape)
    elif isinstance(v, (np.ndarray, np.generic)):
        dt, kind, shape = v.dtype.name, 'n', tuple(np.shape(v))
    elif type(v) in SCALARS and not batched:
        kind = SCALARS[type(v)]
        if kind == 'i' and not -(1 << 63) <= v < (1 << 63):
            return None
        return kind, SCALAR_DTYPE[kind], ()
    else:
        return None
    if dt not in DTYPES:
        return None
    if batched:
        if not shape:
            return None
        shape = shape[1:]
    return kind, dt, shape


def layout_of(data: Any, batched: bool) -> Optional[Tuple[list, int]]:
    """``([name, kind, dtype, shape] per field, rows)`` of a push that can travel in a ring (a dict item, a
    list of dict items of one layout, or a batched dict), else None (it goes over the wire)."""
    items = data if isinstance(data, list) and not batched else [data]
    if not items or type(items[0]) is not dict or not items[0] or len(items[0]) > MAX_FIELDS:
        return None
    first = items[0]
    fields = []
    for k, v in first.items():
        leaf = _leaf(v, batched) if isinstance(k, str) and k else None
        if leaf is None:
            return None
        fields.append([k, *leaf[:2], list(leaf[2])])
    if batched:
        lens = {int(v.shape[0]) for v in first.values()}
        return (fields, lens.pop()) if len(lens) == 1 else None
    for item in items[1:]:
        if type(item) is not dict or len(item) != len(fields):
            return None
        for (k, kind, dt, shape), (k2, v) in zip(fields, item.items()):
            leaf = _leaf(v, False) if k2 == k else None
            if leaf is None or leaf[0] != kind or leaf[1] != dt or list(leaf[2]) != shape:
                return None
    return fields, len(items)


def row_dtype(fields: Any) -> np.dtype:
    """The structured row dtype of a layout announced by a worker; ``ValueError`` naming what is wrong."""
    if not isinstance(fields, list) or not 0 < len(fields) <= MAX_FIELDS:
        raise ValueError(f"a ring layout is a list of 1..{MAX_FIELDS} fields, got {str(fields)[:80]}")
    names, spec = set(), []
    for f in fields:
        ok = isinstance(f, list) and len(f) == 4
        name, kind, dt, shape = f if ok else (None,) * 4
        ok = ok and isinstance(name, str) and 0 < len(name) <= 200 and name not in names
        ok = ok and kind in ('t', 'n', 'b', 'i', 'f') and dt in DTYPES
        ok = ok and isinstance(shape, list) and len(shape) <= 8
        ok = ok and all(type(d) is int and 0 <= d <= MAX_ROW_BYTES for d in shape)
        ok = ok and (kind in ('t', 'n') or (dt == SCALAR_DTYPE[kind] and not shape))
        if not ok:
            raise ValueError(f"a ring field is [name, kind, dtype, shape] with a dtype in {DTYPES}, got {str(f)[:80]}")
        names.add(name)
        if int(np.prod(shape, dtype=object)) * np.dtype(dt).itemsize > MAX_ROW_BYTES:
            raise ValueError(f"ring field {name!r} exceeds {MAX_ROW_BYTES} bytes a row")
        spec.append((name, dt, tuple(shape)))
    dtype = np.dtype(spec, align=True)
    if dtype.itemsize > MAX_ROW_BYTES:
        raise ValueError(f"a ring row of {dtype.itemsize} bytes exceeds {MAX_ROW_BYTES}")
    return dtype


class _Mapped:
    """A ring segment mapped in this process: the header words and the rows."""

    def __init__(self, path: str, dtype: np.dtype, rows: int, create: bool) -> None:
        size = HEADER + dtype.itemsize * rows
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:  # every page now: a full /dev/shm fails here (ENOSPC), not as SIGBUS on a later write
                os.posix_fallocate(fd, 0, size)
            elif os.fstat(fd).st_size != size:
                raise ValueError(f"ring {path} holds {os.fstat(fd).st_size} bytes, expected {size}")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.rows = path, rows
        self.head = np.ndarray((HEADER // 8,), np.uint64, self.mm, 0)
        self.body = np.ndarray((rows,), dtype, self.mm, HEADER)
        self.cols = {name: self.body[name] for name in dtype.names}

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.head = self.body = self.cols = None
        try:
            self.mm.close()
        except BufferError:  # a view still exported somewhere: the mapping goes with it
            pass


# ---------------------------------------------------------------------------------------------- worker side
class RingWriter:
    """A worker's end of its ring: ``write`` copies a push's rows into free slots, then moves the counter."""

    def __init__(self, path: str, fields: list, rows: int, timeout: float) -> None:
        self.fields = fields
        dtype = row_dtype(fields)
        self.map = _Mapped(path, dtype, rows, create=False)
        self.map.unlink()  # mapped on both sides now: the name is no longer needed
        if int(self.map.head[MAGIC_W]) != MAGIC:
            raise ValueError(f"ring {path} is not a ding_buffer ring")
        self.timeout = timeout
        self.written = int(self.map.head[WRITTEN])
        self.refused = 0
        self.itemsize = dtype.itemsize
        # one item's fields as (name, kind, what it must be, byte offset, byte end): what ``matches`` checks and
        # ``_put`` copies (a row is its fields' bytes at their offsets)
        self.spec = []
        for name, kind, dt, shape in fields:
            want = getattr(torch, dt) if kind == 't' else np.dtype(dt) if kind == 'n' else SCALAR_TYPES[kind]
            off = dtype.fields[name][1]
            self.spec.append((name, kind, want, tuple(shape), off, off + dtype.fields[name][0].itemsize))

    def matches(self, item: Any) -> bool:
        """Whether ``item`` (one item dict) has this ring's layout: the quick check of a push's every row."""
        if type(item) is not dict or len(item) != len(self.spec):
            return False
        for (name, kind, want, shape, _, _), (k, v) in zip(self.spec, item.items()):
            if k != name:
                return False
            if kind == 't':
                t = type(v) is torch.Tensor and v.dtype is want and v.shape == shape and v.layout is torch.strided
                if not (t and v.device.type == 'cpu' and not v.requires_grad):
                    return False
            elif kind == 'n':
                if not isinstance(v, (np.ndarray, np.generic)) or v.dtype != want or v.shape != shape:
                    return False
            elif type(v) is not want or (kind == 'i' and not -(1 << 63) <= v < (1 << 63)):
                return False
        return True

    def _put(self, slot: int, item: Dict[str, Any]) -> None:
        mm, base = self.map.mm, HEADER + slot * self.itemsize
        for (_, kind, _, _, lo, hi), v in zip(self.spec, item.values()):
            if kind == 't':
                mm[base + lo : base + hi] = v.numpy().tobytes()
            elif kind == 'n':
                mm[base + lo : base + hi] = v.tobytes()
            else:
                mm[base + lo : base + hi] = SCALAR_PACK[kind](v)

    def _room(self, deadline: float, start: int) -> int:
        """Free slots, waiting (at most until ``deadline``) while the manager has not read the ring."""
        pause = 1e-5
        while True:
            self.check_manager()  # (a corrupt ring raises here)
            if int(self.map.head[CLOSED]):
                raise RingClosed(self.committed_since(start))
            free = self.map.rows - (self.written - int(self.map.head[READ]))
            if free > 0:
                return free
            if time.monotonic() > deadline:
                raise ManagerTimeoutError(
                    f"the manager's shared-memory ring stayed full for {self.timeout}s (distributed.timeout): the "
                    f"manager is not keeping up; this push was not written"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def check_manager(self) -> None:
        """``ManagerUnavailableError`` when the manager's heartbeat in the ring is older than the timeout;
        ``RuntimeError`` when the manager closed the ring."""
        if int(self.map.head[CLOSED]) == CLOSED_CORRUPT:
            raise RuntimeError(
                "the manager closed this worker's shared-memory ring: its counter was impossible; this push was "
                "not written"
            )
        self.check_refused()
        if time.monotonic_ns() - int(self.map.head[BEAT]) > self.timeout * 1e9:
            raise ManagerUnavailableError(
                f"the manager has not tended its shared-memory ring for over {self.timeout}s (distributed.timeout): "
                f"it is frozen or gone; the rows it had not read are lost with it, this push was not written"
            )

    def check_refused(self) -> None:
        """``ValueError`` with the buffer's reason when it refused rows since the last check."""
        refused = int(self.map.head[REFUSED])
        if refused != self.refused:
            why = bytes(self.map.mm[NOTE:HEADER]).rstrip(b'\0').decode('utf-8', 'replace')
            k, self.refused = refused - self.refused, refused
            raise ValueError(
                f"the manager refused {k} rows of earlier pushes through shared memory: {why} (this push was not "
                f"written)"
            )

    def committed_since(self, start: int) -> int:
        """Once the manager closed the ring: how many of the rows written from counter value ``start`` on it took
        (it sets FINAL after its last take; waiting for that is bounded by the timeout)."""
        end = time.monotonic() + self.timeout
        while not int(self.map.head[FINAL]):
            if time.monotonic() > end:
                raise ManagerUnavailableError(
                    f"the manager closed its shared-memory ring and did not finish within {self.timeout}s "
                    f"(distributed.timeout); the rows of this push may be lost"
                )
            time.sleep(1e-4)
        _fence()
        return max(0, int(self.map.head[READ]) - start)

    def write(self, data: Any, batched: bool, n: int) -> int:
        """Write ``n`` rows; ``RingClosed(k)`` when the manager closed the ring meanwhile and took only the first
        ``k`` of them (the caller writes the rest into a new ring)."""
        deadline = time.monotonic() + self.timeout
        cols = self.map.cols
        done, start = 0, self.written
        while done < n:
            k = min(self._room(deadline, start), n - done)
            for lo, hi in self._segments(k):  # contiguous runs of slots (a wrap splits one)
                if batched:
                    for name in cols:
                        v = data[name][done : done + hi - lo]
                        cols[name][lo:hi] = v.numpy() if isinstance(v, torch.Tensor) else v
                else:
                    for j in range(hi - lo):
                        self._put(lo + j, data[done + j] if isinstance(data, list) else data)
                done += hi - lo
            _fence()
            self.written += k
            self.map.head[WRITTEN] = self.written
            _fence()  # (the manager stores CLOSED, fences, then reads WRITTEN: one of the two sees the other)
            closed = int(self.map.head[CLOSED])
            if closed == CLOSED_CORRUPT:
                self.check_manager()  # raises
            if closed:
                raise RingClosed(self.committed_since(start))
        return n

    def _segments(self, k: int) -> List[Tuple[int, int]]:
        lo = self.written % self.map.rows
        hi = lo + k
        return [(lo, hi)] if hi <= self.map.rows else [(lo, self.map.rows), (0, hi - self.map.rows)]

    def close(self) -> None:
        self.map.close()


# ---------------------------------------------------------------------------------------------- manager side
class RingCorrupt(ValueError):
    pass


class RingClosed(Exception):
    """The manager closed a ring under a push, having taken the first ``committed`` rows of it."""

    def __init__(self, committed: int) -> None:
        super().__init__(committed)
        self.committed = committed


class RingReader:
    """The manager's end of one ring: ``take`` copies the rows written since the last take out of shared memory."""

    def __init__(self, fields: list, rows: int, timeout: float) -> None:
        self.fields = fields
        dtype = row_dtype(fields)
        path = os.path.join(SHM_DIR, f'{PREFIX}{os.getpid()}_{uuid.uuid4().hex}')
        self.map = _Mapped(path, dtype, rows, create=True)
        self.map.head[MAGIC_W] = MAGIC
        self.read = 0
        self.unlink_by = time.monotonic() + timeout
        self.scalars = [(f[0], f[1]) for f in fields if f[1] in ('b', 'i', 'f')]

    def beat(self) -> None:
        self.map.head[BEAT] = time.monotonic_ns()

    def take(self, limit: int) -> Tuple[Optional[Any], int, bool]:
        """``(data, n, batched)``: a copy of up to ``limit`` rows written since the last take (``None, 0`` if
        none); ``RingCorrupt`` when the writer's counter is impossible."""
        if self.unlink_by is not None and time.monotonic() > self.unlink_by:
            self.map.unlink()  # the worker did not map it in time (or did and unlinked it already)
            self.unlink_by = None
        written = int(self.map.head[WRITTEN])
        _fence()
        if not self.read <= written <= self.read + self.map.rows:
            raise RingCorrupt(
                f"its writer's counter is {written} while {self.read} rows were read from a ring of {self.map.rows}"
            )
        n = min(written - self.read, limit)
        if n == 0:
            return None, 0, False
        a = self.read % self.map.rows
        b = a + n
        body = self.map.body
        block = body[a:b].copy() if b <= self.map.rows else np.concatenate([body[a:], body[: b - self.map.rows]])
        return self._as_push(block), n, not self.scalars

    def _as_push(self, block: np.ndarray) -> Any:
        cols = {f[0]: block[f[0]] for f in self.fields}
        if self.scalars:  # python scalars come back as python scalars: one item dict per row
            out = {name: (torch.from_numpy(c) if kind == 't' else c) for (name, kind, _, _), c in zip(self.fields,
                   cols.values())}  # fmt: skip
            for name, _ in self.scalars:
                out[name] = cols[name].tolist()
            names = list(out)
            return [dict(zip(names, vals)) for vals in zip(*(out[k] for k in names))]
        return {f[0]: (torch.from_numpy(cols[f[0]]) if f[1] == 't' else cols[f[0]]) for f in self.fields}

    def refuse(self, n: int, why: str) -> None:
        """Tell the worker that the buffer refused ``n`` rows, and why (its next push raises it)."""
        note = why.encode('utf-8', 'replace')[: HEADER - NOTE]
        self.map.mm[NOTE:HEADER] = note.ljust(HEADER - NOTE, b'\0')
        _fence()
        self.map.head[REFUSED] = int(self.map.head[REFUSED]) + n

    def done(self, n: int) -> None:
        """The ``n`` rows of the last take were handled (stored or refused): their slots are free again."""
        self.read += n
        self.map.head[READ] = self.read

    def closing(self, why: int = CLOSED_BY_MANAGER) -> None:
        """First step of closing: tell the writer, before the last take (``close`` after it)."""
        self.map.head[CLOSED] = why
        _fence()

    def close(self) -> None:
        """Last step: the read counter is final now (the writer waits for this to know what was taken)."""
        _fence()
        self.map.head[FINAL] = 1
        self.map.unlink()
        self.map.close()


def remove_stale_segments() -> int:
    """Remove the ring segments of managers on this host whose process is gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split('_', 1)[0]
        if not pid.isdigit() or os.path.exists(f'/proc/{pid}'):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except OSError:
            pass
    return removed


class RingIntake:
    """
    Overview:
        The manager's rings, by sender and client: ``open`` (a worker announced its layout), ``commit`` (apply
        what the rings hold, one batched push per ring and take), ``close`` (a sender's, on EXIT) and
        ``close_all`` (shutdown). Serialised by the manager's lock, like ``ManagerCore``.
    """

    def __init__(self, dcfg: Any, counters: Dict[str, int]) -> None:
        self.ring_bytes = int(dcfg.shm_ring_mb * (1 << 20))
        self.timeout = dcfg.timeout
        self.batch = 4096
        self.counters = counters
        counters.update(shm_rows=0, shm_refused_rows=0, shm_rings=0, shm_corrupt_rings=0)
        self.rings: Dict[Any, Dict[str, RingReader]] = {}
        self.host = host_id()
        remove_stale_segments()

    def open(self, sender: Any, client: Any, host: Any, fields: Any, apply: Callable) -> Optional[Dict[str, Any]]:
        """A new ring for ``client`` of ``sender`` (its old one, committed by ``handle``, is closed); None when the
        worker is on another host or ``/dev/shm`` has no room: it keeps the wire."""
        if host != self.host or not os.path.isdir(SHM_DIR):
            return None
        if not isinstance(client, str) or not 0 < len(client) <= 64:
            raise ValueError(f"a ring's client id is a str of 1..64 chars, got {str(client)[:80]!r}")
        dtype = row_dtype(fields)
        rows = self.ring_bytes // dtype.itemsize
        if rows < 1:
            raise ValueError(
                f"a row of {dtype.itemsize} bytes does not fit distributed.shm_ring_mb ({self.ring_bytes} bytes)"
            )
        mine = self.rings.setdefault(sender, {})
        if client in mine:
            self.close(sender, apply, client)
            mine = self.rings.setdefault(sender, {})
        if len(mine) >= MAX_RINGS_PER_SENDER or sum(map(len, self.rings.values())) >= MAX_RINGS:
            raise ValueError(
                f"a sender may hold at most {MAX_RINGS_PER_SENDER} shared-memory rings, all senders {MAX_RINGS}"
            )
        try:
            ring = RingReader(fields, rows, self.timeout)
        except OSError as e:  # /dev/shm is full (a container's default is 64 MiB): the wire, said once
            logger.warning("no room for a shared-memory ring of %d bytes (%s); the worker keeps the wire", rows, e)
            return None
        ring.beat()
        mine[client] = ring
        self.counters['shm_rings'] += 1
        return {'path': ring.map.path, 'rows': rows}

    def commit(self, apply: Callable[[Any, Any, bool, int], Any], sender: Any = None, only: Any = None) -> int:
        """Apply every ring's rows (only ``sender``'s when given) through ``apply(sender, data, batched, n)``;
        returns how many rows were taken. A refused push is counted and dropped; a corrupt ring is closed. A
        commit of every ring also stamps the manager's heartbeat into each (a worker waiting for room in a ring
        whose heartbeat stopped knows the manager is frozen or gone)."""
        total = 0
        senders = [sender] if sender is not None else list(self.rings)
        for s in senders:
            for client, ring in list(self.rings.get(s, {}).items()):
                if only is not None and client != only:
                    continue
                if sender is None:
                    ring.beat()
                while True:
                    try:
                        data, n, batched = ring.take(self.batch)
                    except RingCorrupt as e:
                        logger.warning("shared-memory ring of %r closed: %s", s, e)
                        self.counters['shm_corrupt_rings'] += 1
                        ring.closing(CLOSED_CORRUPT)
                        self.rings[s].pop(client).close()
                        break
                    if n == 0:
                        break
                    try:
                        apply(s, data, batched, n)
                        self.counters['shm_rows'] += n
                    except Exception as e:  # noqa: BLE001 - the buffer refused these rows: they go, the ring stays
                        self.counters['shm_refused_rows'] += n
                        ring.refuse(n, f'{type(e).__name__}: {e}')
                        logger.warning("%d rows from the shared-memory ring of %r refused: %s", n, s, e)
                    ring.done(n)
                    total += n
        return total

    def close(self, sender: Any, apply: Callable[[Any, Any, bool, int], Any], client: Any = None) -> None:
        """Close ``sender``'s rings (only ``client``'s when given): mark them closing, take what they hold, then
        mark the read counter final. A writer that wrote meanwhile learns exactly which of its rows were taken."""
        mine = self.rings.get(sender, {})
        for c in [client] if client is not None else list(mine):
            ring = mine.get(c)
            if ring is None:
                continue
            ring.closing()
            self.commit(apply, sender, only=c)
            mine.pop(c).close()
        if not mine:
            self.rings.pop(sender, None)

    def close_lost(self, lost: Any, apply: Callable[[Any, Any, bool, int], Any]) -> None:
        """Close the rings of senders counted lost: a lost worker that comes back (it was frozen) gets a new ring
        on its next push, and rings of workers that never come back (a Ray job's dead tasks) do not pile up."""
        for s in [s for s in self.rings if s in lost]:
            self.close(s, apply)

    def close_all(self, apply: Callable[[Any, Any, bool, int], Any]) -> None:
        for s in list(self.rings):
            self.close(s, apply)


def commit_loop(commit: Callable[[], int], stop: threading.Event) -> None:
    """The manager's ring thread: commit (``commit`` takes the manager's lock), and sleep a little longer each
    round that found nothing (10 us .. 2 ms)."""
    pause = 1e-5
    while not stop.is_set():
        if commit():
            pause = 1e-5
            continue
        stop.wait(pause)
        pause = min(pause * 2, 2e-3)


def start_commit_thread(core: Any, lock: Any, stopping: Callable[[], bool]) -> Optional[threading.Event]:
    """The ring thread of a manager runner whose ``core`` takes shared-memory pushes (None when it takes none);
    set the returned event to stop it."""
    if core.rings is None:
        return None
    stop = threading.Event()

    def commit() -> int:
        with lock:
            return 0 if stopping() else core.commit_rings()

    threading.Thread(target=commit_loop, args=(commit, stop), daemon=True, name='ding_buffer-rings').start()
    return stop


class RingPusher:
    """
    Overview:
        A worker's pushes through shared memory, when the manager is on this host: attaches on the first push
        that can travel in a ring (``request('shm_open', ...)``), and again when a push's layout differs.
        ``push`` returns the rows written, or None when the push must go over the wire (a layout that cannot
        travel in a ring, or a manager on another host).
    """

    def __init__(self, request: Callable[..., Any], client: str, timeout: float) -> None:
        self.request = request
        self.client = client
        self.timeout = timeout
        self.host = host_id()
        self.writer: Optional[RingWriter] = None
        self.remote = False  # the manager is on another host (or refused rings): the wire for good

    def push(self, data: Any, batched: bool) -> Optional[int]:
        if self.remote:
            return None
        if self.writer is not None and int(self.writer.map.head[CLOSED]) == CLOSED_BY_MANAGER:
            self.writer.close()  # it counted this worker lost (it was frozen) and took the ring's rows: a new one
            self.writer = None
        w = self.writer
        if w is not None and not batched:  # the common case: more rows of the ring's layout
            items = data if type(data) is list else [data]
            if items and all(w.matches(x) for x in items):
                return self._write(items, False, len(items))
        layout = layout_of(data, batched)
        if layout is None:
            return None
        fields, n = layout
        if n == 0:
            return 0
        if self.writer is None or self.writer.fields != fields:
            old, self.writer = self.writer, None
            try:
                # the manager commits (and closes) the old ring before it answers: its refusals are known then
                reply = self.request('shm_open', client=self.client, host=self.host, fields=fields)
                if reply is None:
                    self.remote = True
                    return None
                self.writer = RingWriter(reply['path'], fields, int(reply['rows']), self.timeout)
                if old is not None:
                    old.check_refused()
            finally:
                if old is not None:
                    old.close()
        return self._write(data, batched, n)

    def _write(self, data: Any, batched: bool, n: int) -> int:
        """Write a push's rows; if the manager closes the ring under it (it counted this worker lost), the rows it
        did not take go into a new ring."""
        try:
            return self.writer.write(data, batched, n)
        except RingClosed as e:
            k = e.committed
            self.writer.close()
            self.writer = None
            rest = {f: v[k:] for f, v in data.items()} if batched else list(data if type(data) is list else [data])[k:]
            if n - k:
                self.push(rest, batched)
            return n

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

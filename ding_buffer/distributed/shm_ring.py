"""Shared-memory rings: a worker on the manager's host pushes rows through memory instead of the wire.

One ring per worker buffer (``distributed.shared_memory``). The manager creates each ring as an anonymous memory
file (``memfd``: nothing ever appears in ``/dev/shm``) sealed against shrinking and growing, for the row layout the
worker announced over the wire; the worker maps it through ``/proc/<manager pid>/fd/<fd>`` and checks the random
token of the reply in its header. The memory goes when both sides unmapped it, however either side ends. A worker
that cannot map it (another host, a container with its own ``/proc``, a CPU without x86-64 store ordering) keeps
the wire.

Layout: a 512-byte header -- uint64 words magic, rows written (the worker's counter), rows read (the manager's), the
manager's heartbeat (``time.monotonic_ns``), closed, rows refused and final (set by the manager), the token, the
worker's last ``cur_collector_envstep``; then why the buffer last refused rows (text) -- then one column of ``rows``
slots per field (each on a 64-byte boundary), then one byte per slot that marks the first row of each push. A worker
writes a push's rows into free slots (waiting for room for the whole push first) and then moves its counter; the
manager reads the counter, hands the rows up to it to the buffer as one batched push (refused: push by push, so only
the pushes the buffer refuses are dropped; small columns copied first, large ones read in place, see
``IN_PLACE_BYTES``) and then moves its own counter. A worker learns of refused rows on its next push, which raises
``ValueError`` with the buffer's reason (as an ``async_score`` push learns late), or from ``close``. Nothing the
worker writes is trusted: the layout is the manager's copy of what the worker announced (checked when announced),
the file cannot change size, and a counter that goes back or past the manager's one by more than the ring holds
marks the ring as corrupt -- it is closed and counted (``shm_corrupt_rings``; the worker's next push raises and the
one after gets a new ring) -- while the rows and push marks a worker lies about are data, judged by the buffer like
any push. Rows are read once: the manager's read counter lives in its own memory. Closing is a handshake (closing ->
the last take -> final), so a worker writing while its ring closes learns which of its rows were taken and writes
the rest into a new ring.
"""

import fcntl
import logging
import mmap
import os
import platform
import secrets
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..buffers.common import STEP_LIMIT
from ..errors import ManagerTimeoutError, ManagerUnavailableError
from ..persistence import host_id

logger = logging.getLogger('ding_buffer.distributed')

MAGIC = 0x31474E4952424444  # b'DDBRING1' little-endian
HEADER = 512
MAGIC_W, WRITTEN, READ, BEAT, CLOSED, REFUSED, FINAL, TOKEN, _, ATTACHED = range(10)  # (8: unused)
MASK = (1 << 64) - 1
NOTE = 128  # bytes 128..512: why the manager last refused rows (utf-8)
MAX_FIELDS = 256
MAX_ROW_BYTES = 1 << 24
MAX_RINGS_PER_SENDER = 4
MAX_RINGS = 256  # all senders together (Ray clients are many over a long job: lost ones' rings are closed)
MAX_RING_BYTES = 4 << 30  # all rings together
TSO_MACHINES = ('x86_64', 'amd64', 'i386', 'i686')  # the store order the counters' handshake relies on
OPEN, CLOSED_BY_MANAGER, CLOSED_CORRUPT = 0, 1, 2
TAKE_BYTES = 8 << 20  # one take (one buffer push) holds up to this many bytes of rows, and at least 4,096 rows
# a ring of a layout whose rows become one item dict each (python scalars) holds at most this many rows: a take
# of them costs microseconds a row under the manager's lock, whatever few bytes a row has
PER_ROW_RING_ROWS = 1 << 16
IN_PLACE_BYTES = 256  # a batched take's columns of at least this many bytes per row go to the buffer in place
BUSY_SECONDS = 0.05  # the ring thread naps at most 0.2 ms this long after it last found rows (then up to 2 ms)
RETRY_AFTER = 4096  # a worker that got no ring asks again after this many pushes on the wire
FLAP_PUSHES, MAX_FLAPS = 64, 3  # a worker whose layouts change this many times, each ring taking fewer pushes than
# this, keeps the wire for RETRY_AFTER pushes (every change opens a ring: dearer than the wire)
DTYPES = ('bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64', 'float16', 'float32',
          'float64')  # fmt: skip
SCALARS = {bool: 'b', int: 'i', float: 'f'}  # python scalars: (kind, dtype)
SCALAR_DTYPE = {'b': 'bool', 'i': 'int64', 'f': 'float64'}
SCALAR_TYPES = {'b': bool, 'i': int, 'f': float}
SCALAR_PACK = {'b': struct.Struct('?').pack, 'i': struct.Struct('<q').pack, 'f': struct.Struct('<d').pack}
_fence_lock = threading.Lock()


def _fence() -> None:
    """A lock round trip (an atomic read-modify-write: a full barrier on x86-64, which keeps stores in order
    anyway): a row's stores before its counter's, a counter's load before the row's."""
    with _fence_lock:
        pass


# ---------------------------------------------------------------------------------------------- row layouts
def _leaf(v: Any, batched: bool) -> Optional[Tuple[str, str, Tuple[int, ...]]]:
    """(kind, dtype, shape of one row) of a leaf that can travel in a ring, else None."""
    if isinstance(v, torch.Tensor):
        if v.device.type != 'cpu' or v.layout is not torch.strided or v.requires_grad:
            return None
        dt = str(v.dtype).replace('torch.', '')
        kind, shape = 't', tuple(v.shape)
    elif isinstance(v, (np.ndarray, np.generic)):
        if not v.dtype.isnative:  # a byte-swapped array would be stored as its raw bytes
            return None
        dt, shape = v.dtype.name, tuple(np.shape(v))
        kind = 'n' if isinstance(v, np.ndarray) else 'g'  # an array, or a numpy scalar
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
        if kind == 'n' and not shape:  # a numpy column's rows are numpy scalars once the buffer splits it
            kind = 'g'
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
        ok = ok and kind in ('t', 'n', 'g', 'b', 'i', 'f') and dt in DTYPES
        ok = ok and isinstance(shape, list) and len(shape) <= 8
        ok = ok and all(type(d) is int and 0 <= d <= MAX_ROW_BYTES for d in shape)
        ok = ok and (kind in ('t', 'n') or (not shape and dt == SCALAR_DTYPE.get(kind, dt)))
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
    """A ring mapped in this process: the header words and the rows. The manager ``create``s it (and keeps the
    file descriptor the worker opens through ``/proc``); the worker ``attach``es to it."""

    def __init__(self, fd: int, dtype: np.dtype, rows: int) -> None:
        self.rows = rows
        # every page mapped now (MAP_POPULATE), not faulted in by the first pushes (about 4,096 faults per 16 MiB)
        self.mm = mmap.mmap(fd, self.size(dtype, rows), flags=mmap.MAP_SHARED | getattr(mmap, 'MAP_POPULATE', 0))
        self.head = np.ndarray((HEADER // 8,), np.uint64, self.mm, 0)
        self.ihead = np.ndarray((HEADER // 8,), np.int64, self.mm, 0)
        self.cols, self.offsets = {}, {}  # a column per field, one after the other: rows[i] of a field is contiguous
        *columns, (_, marks, _) = self._columns(dtype, rows)
        for name, off, sub in columns:
            self.cols[name] = np.ndarray((rows, *sub.shape), sub.base, self.mm, off)
            self.offsets[name] = (off, sub.itemsize)
        self.starts = np.ndarray((rows,), np.uint8, self.mm, marks)  # 1: a push's first row
        self.envsteps = np.ndarray((rows,), np.int64, self.mm, self._envstep_offset(marks, rows))  # each row's push's

    @staticmethod
    def _columns(dtype: np.dtype, rows: int):
        """``(name, byte offset, row dtype)`` of each field's column (each on a 64-byte boundary), then
        ``(None, offset of the push marks, None)``."""
        off = HEADER
        for name in dtype.names:
            sub = dtype.fields[name][0]
            yield name, off, sub
            off = -(-(off + sub.itemsize * rows) // 64) * 64
        yield None, off, None

    @staticmethod
    def _envstep_offset(marks: int, rows: int) -> int:
        return -(-(marks + rows) // 8) * 8  # (after the push marks, on an 8-byte boundary)

    @classmethod
    def size(cls, dtype: np.dtype, rows: int) -> int:
        *_, (_, marks, _) = cls._columns(dtype, rows)
        return cls._envstep_offset(marks, rows) + 8 * rows

    @classmethod
    def create(cls, dtype: np.dtype, rows: int) -> Tuple['_Mapped', int]:
        fd = os.memfd_create('ding_buffer_ring', os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:  # every page now (a full memory fails here, not as SIGBUS later); then its size is fixed for good
            os.posix_fallocate(fd, 0, cls.size(dtype, rows))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            return cls(fd, dtype, rows), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, path: str, dtype: np.dtype, rows: int) -> '_Mapped':
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size != cls.size(dtype, rows):
                raise ValueError(f"ring {path} holds {size} bytes, expected {cls.size(dtype, rows)}")
            return cls(fd, dtype, rows)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.head = self.ihead = self.starts = self.envsteps = self.cols = None
        try:
            self.mm.close()
        except BufferError:  # a view still exported somewhere: the mapping goes with it
            pass


# ---------------------------------------------------------------------------------------------- worker side
class RingCorruptClosed(RuntimeError):
    """The manager closed this worker's ring as corrupt (its counter was impossible): what it had not read is lost."""


class RingClosed(Exception):
    """The manager closed a ring under a push, having taken the first ``committed`` rows of it."""

    def __init__(self, committed: int) -> None:
        super().__init__(committed)
        self.committed = committed


class WireRest(Exception):
    """The rows of a push from ``rest`` on must go over the wire (their ring closed and no new one could be
    made); the push had ``total`` rows."""

    def __init__(self, rest: Any, total: int) -> None:
        super().__init__(total)
        self.rest, self.total = rest, total


class RingWriter:
    """A worker's end of its ring: ``write`` copies a push's rows into free slots, then moves the counter."""

    def __init__(self, path: str, fields: list, rows: int, token: int, timeout: float) -> None:
        self.fields = fields
        dtype = row_dtype(fields)
        self.map = _Mapped.attach(path, dtype, rows)
        if int(self.map.head[MAGIC_W]) != MAGIC or int(self.map.head[TOKEN]) != token:
            self.map.close()
            raise ValueError(f"{path} is not the manager's ring (another process's file, or another /proc)")
        self.map.head[ATTACHED] = 1  # the manager may let go of its descriptor now
        self.timeout = timeout
        self.written = int(self.map.head[WRITTEN])
        self.refused = 0
        # one item's fields as (name, kind, what it must be, shape, column offset, bytes a row): what ``matches``
        # checks and ``_put`` copies (row i of a field is its bytes at offset + i * size)
        self.spec = []
        for name, kind, dt, shape in fields:
            want = getattr(torch, dt) if kind == 't' else np.dtype(dt) if kind in ('n', 'g') else SCALAR_TYPES[kind]
            self.spec.append((name, kind, want, tuple(shape), *self.map.offsets[name]))

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
            elif kind in ('n', 'g'):
                ok = isinstance(v, np.ndarray) if kind == 'n' else isinstance(v, np.generic)
                if not ok or v.dtype != want or v.shape != shape:
                    return False
            elif type(v) is not want or (kind == 'i' and not -(1 << 63) <= v < (1 << 63)):
                return False
        return True

    def _put(self, slot: int, item: Dict[str, Any]) -> None:
        mm = self.map.mm
        for (_, kind, _, _, off, size), v in zip(self.spec, item.values()):
            lo, hi = off + slot * size, off + (slot + 1) * size
            if kind == 't':
                mm[lo:hi] = v.numpy().tobytes()
            elif kind in ('n', 'g'):
                mm[lo:hi] = v.tobytes()
            else:
                mm[lo:hi] = SCALAR_PACK[kind](v)

    def check_manager(self) -> None:
        """``RuntimeError`` when the manager closed the ring as corrupt; ``ManagerUnavailableError`` when its
        heartbeat in the ring is older than the timeout."""
        if int(self.map.head[CLOSED]) == CLOSED_CORRUPT:
            raise RingCorruptClosed(
                "the manager closed this worker's shared-memory ring: its counter was impossible; this push was "
                "not written"
            )
        if time.monotonic_ns() - int(self.map.head[BEAT]) > self.timeout * 1e9:
            raise ManagerUnavailableError(
                f"the manager's heartbeat in its shared-memory ring stopped for over {self.timeout}s "
                f"(distributed.timeout): it is frozen or gone, and the rows it had not read are lost with it unless it "
                f"comes back; this push was not written"
            )

    def refusal(self) -> Optional[ValueError]:
        """The buffer's refusal of rows since the last call, as the error the worker's next push raises."""
        refused = int(self.map.head[REFUSED])
        if refused == self.refused:
            return None
        why = bytes(self.map.mm[NOTE:HEADER]).rstrip(b'\0').decode('utf-8', 'replace')
        k, self.refused = refused - self.refused, refused
        return ValueError(f"the manager refused {k} rows of earlier pushes through shared memory: {why}")

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

    def _room(self, need: int, deadline: float, start: int, n: int) -> int:
        """Free slots once at least ``need`` are free, waiting at most until ``deadline``."""
        pause = 1e-5
        while True:
            if int(self.map.head[CLOSED]) == CLOSED_BY_MANAGER:  # (first: the manager's beat in it stops then)
                raise RingClosed(self.committed_since(start))
            self.check_manager()
            free = self.map.rows - (self.written - int(self.map.head[READ]))
            if free >= need:
                return free
            if time.monotonic() > deadline:
                done = self.written - start
                raise ManagerTimeoutError(
                    f"the manager's shared-memory ring had no room for {self.timeout}s (distributed.timeout): the "
                    f"manager is not keeping up; "
                    + ("this push was not written" if not done else f"{done} of this push's {n} rows were written")
                )
            time.sleep(pause)
            pause = min(pause * 2, 2e-4)

    def write(self, data: Any, batched: bool, n: int, envstep: int = -1) -> int:
        """Write ``n`` rows: room for the whole push first when it fits the ring, so a push that times out wrote
        nothing. ``RingClosed(k)`` when the manager closed the ring meanwhile and took only the first ``k``."""
        deadline = time.monotonic() + self.timeout
        done, start = 0, self.written
        while done < n:
            k = min(self._room(min(n - done, self.map.rows), deadline, start, n), n - done)
            for lo, hi in self._segments(k):  # contiguous runs of slots (a wrap splits one)
                self.map.starts[lo:hi] = 0
                self.map.envsteps[lo:hi] = envstep  # (each push's own: a commit's refused push moves nothing)
                if not done:
                    self.map.starts[lo] = 1
                if batched:
                    for name in self.map.cols:
                        v = data[name][done : done + hi - lo]
                        self.map.cols[name][lo:hi] = v.numpy() if isinstance(v, torch.Tensor) else v
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


def per_row(fields: list) -> bool:
    """Whether rows of this layout come back one item dict each: python scalars (and 0-d arrays) come back per
    row as they were pushed; the rest as one batched dict."""
    return any(f[1] in ('b', 'i', 'f') or (f[1] == 'n' and not f[3]) for f in fields)


class RingReader:
    """The manager's end of one ring: ``take`` hands over the rows written since the last take."""

    def __init__(self, fields: list, rows: int) -> None:
        self.fields = fields
        dtype = row_dtype(fields)
        self.map, self.fd = _Mapped.create(dtype, rows)
        self.token = secrets.randbits(63)
        self.map.head[MAGIC_W], self.map.head[TOKEN] = MAGIC, self.token
        self.read = self.refused = 0
        self.per_row = per_row(fields)
        self.nbytes = _Mapped.size(dtype, rows)
        self.take_rows = max(4096, TAKE_BYTES // max(1, dtype.itemsize))
        self.batched = not self.per_row

    @property
    def path(self) -> str:
        return f'/proc/{os.getpid()}/fd/{self.fd}'

    def beat(self) -> None:
        self.map.head[BEAT] = time.monotonic_ns()

    def let_go_of_fd(self) -> None:
        """Once the worker mapped the ring, the manager's descriptor is not needed (its mapping keeps the file)."""
        if self.fd is not None and int(self.map.head[ATTACHED]):
            os.close(self.fd)
            self.fd = None

    def target(self) -> int:
        """The writer's counter, checked: ``RingCorrupt`` when it is impossible."""
        written = int(self.map.head[WRITTEN])
        _fence()
        if not self.read <= written <= self.read + self.map.rows:
            raise RingCorrupt(
                f"its writer's counter is {written} while {self.read} rows were read from a ring of {self.map.rows}"
            )
        return written

    def take(self, limit: int, upto: Optional[int] = None) -> Tuple[Any, Optional[np.ndarray], Optional[np.ndarray]]:
        """``(rows, push starts, envsteps)``: up to ``limit`` rows written since the last take (and before counter
        value ``upto``; ``None, None, None`` if none), a copy of their marks of a push's first row and of each row's
        push's ``cur_collector_envstep`` (-1 where it is out of range); ``RingCorrupt``
        when the writer's counter is impossible. The rows are the ring's own memory (valid until ``done``;
        ``as_push`` copies what the buffer's checks read), but for a push that wraps around the ring's end: it is
        taken alone, as a copy (the take before it ends at its first row)."""
        written = self.target() if upto is None else upto
        n = min(written - self.read, limit)
        if n <= 0:
            return None, None, None
        rows, a = self.map.rows, self.read % self.map.rows
        left = written - self.read
        if n < left and not self.map.starts[(a + n) % rows]:  # the limit falls inside a push: end before it, or
            cut = np.flatnonzero(self.map.starts[(a + np.arange(1, n)) % rows])  # take it whole when it is the first
            after = [] if len(cut) else np.flatnonzero(self.map.starts[(a + np.arange(n, left)) % rows])
            n = int(cut[-1]) + 1 if len(cut) else n + int(after[0]) if len(after) else left  # (it fits the ring)
        if a + n > rows:  # the rows wrap around the end
            later = np.flatnonzero(self.map.starts[a + 1 : rows])
            if len(later):  # whole pushes up to the last one that starts before the end
                n = int(later[-1]) + 1
            else:  # the push at ``a`` wraps: it alone (up to the next push's first row)
                after = np.flatnonzero(self.map.starts[: a + n - rows])
                n = rows - a + int(after[0]) if len(after) else n
        b = a + n
        parts = [slice(a, b)] if b <= rows else [slice(a, None), slice(0, b - rows)]
        cols = self.map.cols.items()
        block = {k: c[parts[0]] if len(parts) == 1 else np.concatenate([c[p] for p in parts]) for k, c in cols}
        starts = np.concatenate([self.map.starts[p] for p in parts])
        envsteps = np.concatenate([self.map.envsteps[p] for p in parts])
        envsteps[(envsteps <= -STEP_LIMIT) | (envsteps >= STEP_LIMIT)] = -1  # (a lying actor's: no step)
        return block, starts, envsteps

    def as_push(self, block: Dict[str, np.ndarray]) -> Any:
        """Rows taken from the ring as the buffer's push: a batched dict of columns, or (python scalars or 0-d
        arrays in the layout) one item dict per row, each leaf of the type pushed."""
        if self.per_row:  # one item dict per row (each row a copy)
            cols = {}
            for name, kind, _, _ in self.fields:
                c = block[name]
                if kind == 't':  # (np.array: a 0-d field's row is a numpy scalar)
                    cols[name] = [torch.from_numpy(np.array(r)) for r in c]
                elif kind == 'n':  # (np.array: a 0-d array's row is a numpy scalar)
                    cols[name] = [np.array(r) for r in c]
                elif kind == 'g':
                    cols[name] = list(c)
                else:
                    cols[name] = c.tolist()
            names = list(cols)
            return [dict(zip(names, vals)) for vals in zip(*cols.values())]
        out = {}
        for name, kind, _, _ in self.fields:
            c = block[name]
            if c.nbytes < IN_PLACE_BYTES * len(c):  # small columns (priorities, rewards, flags) are copied:
                c = c.copy()  # what the buffer validates cannot change under it, whatever the writer does
            out[name] = torch.from_numpy(c) if kind == 't' else c
        return out

    def refuse(self, n: int, why: str) -> None:
        """Tell the worker that the buffer refused ``n`` rows, and why (its next push raises it)."""
        note = why.encode('utf-8', 'replace')[: HEADER - NOTE]
        self.map.mm[NOTE:HEADER] = note.ljust(HEADER - NOTE, b'\0')
        _fence()
        self.refused = (self.refused + n) & MASK  # the manager's own count (the worker may scribble on its copy)
        self.map.head[REFUSED] = self.refused

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
        self.map.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RingIntake:
    """
    Overview:
        The manager's rings, by sender and client: ``open`` (a worker announced its layout), ``commit`` (apply
        what the rings hold, one batched push per ring and take), ``close`` (a sender's, on EXIT or once lost),
        ``close_lost`` and ``close_all`` (shutdown). Serialised by the manager's lock, like ``ManagerCore``.
    """

    def __init__(self, dcfg: Any, counters: Dict[str, int], capacity: Optional[int] = None) -> None:
        self.ring_bytes = int(dcfg.shm_ring_mb * (1 << 20))
        # a take goes to the buffer in runs of whole pushes of at most its capacity of rows (``_runs``)
        self.max_take = capacity if isinstance(capacity, int) and capacity > 0 else None
        self.counters = counters
        counters.update(shm_rows=0, shm_refused_rows=0, shm_declined_rows=0, shm_rings=0, shm_corrupt_rings=0)
        self.rings: Dict[Any, Dict[str, RingReader]] = {}
        self.all: Tuple[RingReader, ...] = ()  # every ring, for the heartbeat thread (replaced, never changed)
        self.host = host_id()
        self.usable = platform.machine().lower() in TSO_MACHINES and hasattr(os, 'memfd_create')
        if not self.usable:
            logger.warning("distributed.shared_memory: this machine (%s) keeps the wire", platform.machine())

    def open(
        self, sender: Any, client: Any, host: Any, fields: Any, apply: Callable, exited: Any = ()
    ) -> Optional[Dict[str, Any]]:
        """A new ring for ``client`` of ``sender`` (its old one, committed by ``handle``, is closed); None when the
        worker keeps the wire: another host, a row of no bytes, no room (too many rings, or no memory)."""
        if not isinstance(client, str) or not 0 < len(client) <= 64:
            raise ValueError(f"a ring's client id is a str of 1..64 chars, got {str(client)[:80]!r}")
        if host != self.host or not self.usable or sender in exited:
            if client in self.rings.get(sender, {}):  # a worker that could not map its ring lets go of it this way
                self.close(sender, apply, client)
            return None
        dtype = row_dtype(fields)
        rows = self.ring_bytes // dtype.itemsize if dtype.itemsize else 0
        rows = min(rows, PER_ROW_RING_ROWS) if per_row(fields) else rows
        if rows < 1:
            return None
        if client in self.rings.get(sender, {}):
            self.close(sender, apply, client)
        mine = self.rings.setdefault(sender, {})
        held = sum(r.nbytes for r in self.all)
        if len(mine) >= MAX_RINGS_PER_SENDER or len(self.all) >= MAX_RINGS or held + self.ring_bytes > MAX_RING_BYTES:
            logger.warning(
                "no shared-memory ring for %r: a sender holds at most %d, all senders %d rings and %d bytes; it keeps "
                "the wire",
                sender,
                MAX_RINGS_PER_SENDER,
                MAX_RINGS,
                MAX_RING_BYTES,
            )
            return None
        try:
            ring = RingReader(fields, rows)
        except OSError as e:
            logger.warning("no shared-memory ring of %d rows (%s); the worker keeps the wire", rows, e)
            return None
        ring.beat()
        mine[client] = ring
        self.all = self.all + (ring,)
        self.counters['shm_rings'] += 1
        return {'path': ring.path, 'rows': rows, 'token': ring.token}

    def commit(self, apply: Callable[..., int], sender: Any = None, only: Any = None) -> int:
        """Apply rings' rows through ``apply(sender, data, batched, envstep, tentative)``; returns how many rows
        were taken.
        With ``sender``: everything its rings hold now (before one of its requests is served: its order), else
        up to one take's worth of rows per ring (a writer that never stops cannot hold the manager). A refused take
        is counted, dropped and told to the worker; a corrupt ring is closed."""
        total = 0
        for s in [sender] if sender is not None else list(self.rings):
            for client, ring in list(self.rings.get(s, {}).items()):
                if only is not None and client != only:
                    continue
                try:
                    if sender is None:
                        ring.let_go_of_fd()
                    upto, budget = ring.target(), ring.take_rows
                    while budget > 0:
                        block, starts, steps = ring.take(ring.take_rows, upto)  # (a cut only inside a longer push)
                        if block is None:
                            break
                        n = len(starts)
                        for a, b in _runs(starts, self.max_take):
                            self._apply(apply, s, ring, {f: c[a:b] for f, c in block.items()}, starts[a:b], steps[a:b])
                        ring.done(n)
                        total += n
                        if sender is None:  # one take's worth of rows per ring and round (two at its end)
                            budget -= n
                except Exception as e:  # noqa: BLE001 - an impossible counter (or anything else a ring does): closed
                    logger.warning("shared-memory ring of %r closed: %s: %s", s, type(e).__name__, e)
                    self.counters['shm_corrupt_rings'] += 1
                    ring.closing(CLOSED_CORRUPT)
                    self._drop(s, client)
        return total

    def _apply(self, apply: Callable, sender: Any, ring: RingReader, block: Any, starts: Any, steps: Any) -> None:
        """One take through the buffer as one push (``apply`` returns the rows stored); if the buffer refuses it
        (raises), or stores none of it (its rate limiter judges a push whole), push by push as the worker made them
        (the marks of a push's first row), as over the wire. A push that raises is dropped, counted and told to the
        worker; rows the buffer declines without an error are counted (``shm_declined_rows``), as a wire push's
        ``stored`` shows them. The ring stays. The first try of several pushes is ``tentative``: the manager
        counts it only if it stores something (else the pushes are counted one by one)."""
        n, err = len(starts), None
        cuts = [0, *(np.flatnonzero(starts[1:]) + 1).tolist(), n]
        try:
            stored = apply(sender, ring.as_push(block), ring.batched, int(steps[-1]), len(cuts) > 2)
        except Exception as e:  # noqa: BLE001 - the buffer's refusal, judged below push by push
            stored, err = 0, e
        if not stored and len(cuts) > 2:  # nothing stored, and the take holds several pushes
            stored, err = 0, None
            for a, b in zip(cuts[:-1], cuts[1:]):
                try:
                    push = ring.as_push({f: c[a:b] for f, c in block.items()})
                    k = apply(sender, push, ring.batched, int(steps[b - 1]))  # (the push's own envstep)
                except Exception as e:  # noqa: BLE001
                    self._refuse(sender, ring, b - a, e)
                    n -= b - a
                    continue
                stored += k
        if err is not None:
            self._refuse(sender, ring, n, err)
            return
        self.counters['shm_rows'] += stored
        self.counters['shm_declined_rows'] += n - stored

    def _refuse(self, sender: Any, ring: RingReader, n: int, err: Exception) -> None:
        self.counters['shm_refused_rows'] += n
        ring.refuse(n, f'{type(err).__name__}: {err}')
        logger.warning("%d rows from the shared-memory ring of %r refused: %s", n, sender, err)

    def beat(self) -> None:
        """Stamp the manager's heartbeat into every ring; called without the manager's lock (a long request does
        not make the manager look frozen). A ring closed meanwhile is skipped."""
        for ring in self.all:
            try:
                ring.beat()
            except (TypeError, ValueError):  # (its mapping went away)
                pass

    def _drop(self, sender: Any, client: Any) -> None:
        mine = self.rings.get(sender, {})
        ring = mine.pop(client, None)
        if ring is not None:
            self.all = tuple(r for r in self.all if r is not ring)
            ring.close()
        if not mine:
            self.rings.pop(sender, None)

    def close(self, sender: Any, apply: Callable[..., int], client: Any = None) -> None:
        """Close ``sender``'s rings (only ``client``'s when given): mark them closing, take what they hold, then
        mark the read counter final. A writer that wrote meanwhile learns exactly which of its rows were taken."""
        for c in [client] if client is not None else list(self.rings.get(sender, {})):
            ring = self.rings.get(sender, {}).get(c)
            if ring is None:
                continue
            ring.closing()
            self.commit(apply, sender, only=c)
            self._drop(sender, c)

    def close_lost(self, lost: Any, apply: Callable[..., int]) -> None:
        """Close the rings of senders counted lost: a lost worker that comes back (it was frozen) gets a new ring
        on its next push, and rings of workers that never come back (a Ray job's dead tasks) do not pile up."""
        for s in [s for s in self.rings if s in lost]:
            self.close(s, apply)

    def close_all(self, apply: Callable[..., int]) -> None:
        for s in list(self.rings):
            self.close(s, apply)


def _runs(starts: np.ndarray, cap: Optional[int]) -> List[Tuple[int, int]]:
    """A take's rows as runs ``[a, b)`` of whole pushes (``starts``: a push's first row; the take's first row starts
    one) of at most ``cap`` rows, a push larger than ``cap`` alone: a buffer push of more rows than its capacity
    keeps the newest whatever its capacity rule, so the pushes of a run are judged as over the wire, and each push
    is judged whole (its refusal, a rate limiter)."""
    n = len(starts)
    if cap is None or n <= cap:
        return [(0, n)]
    runs, a, last = [], 0, 0
    for end in [*(np.flatnonzero(starts[1:]) + 1).tolist(), n]:
        if end - a > cap and last > a:
            runs.append((a, last))
            a = last
        last = end
    return runs + [(a, n)]


def commit_loop(commit: Callable[[], int], beat: Callable[[], None], stop: threading.Event) -> None:
    """The manager's ring thread: beat (without the manager's lock), commit (``commit`` takes the lock, and lets
    it go between rounds), sleeping a little longer each round that found nothing (10 us .. 0.2 ms while rows came
    in the last ``BUSY_SECONDS``, else up to 2 ms). An error is logged, never fatal."""
    pause, busy_until = 1e-5, 0.0
    while not stop.is_set():
        try:
            beat()
            found = commit()
        except Exception:  # noqa: BLE001 - the thread must outlive one bad round
            logger.exception("shared-memory commit failed")
            found = 0
        if found:
            pause, busy_until = 1e-5, time.monotonic() + BUSY_SECONDS
            time.sleep(0)  # the lock's other takers (requests) get their turn
            continue
        stop.wait(pause)
        pause = min(pause * 2, 2e-4 if time.monotonic() < busy_until else 2e-3)


def start_commit_thread(core: Any, lock: Any, stopping: Callable[[], bool]) -> Optional[threading.Event]:
    """The ring thread of a manager runner whose ``core`` takes shared-memory pushes (None when it takes none);
    set the returned event to stop it."""
    if core.rings is None:
        return None
    stop = threading.Event()

    def commit() -> int:
        while not lock.acquire(timeout=0.05):  # a long request holds the manager: its rings still see it alive
            core.rings.beat()
            if stop.is_set():
                return 0
        try:
            return 0 if stopping() else core.commit_rings()
        finally:
            lock.release()

    args = (commit, core.rings.beat, stop)
    threading.Thread(target=commit_loop, args=args, daemon=True, name='ding_buffer-rings').start()
    return stop


class RingPusher:
    """
    Overview:
        A worker's pushes through shared memory, when the manager is on this host: attaches on the first push
        that can travel in a ring (``request('shm_open', ...)``), and again when a push's layout differs or the
        manager closed the ring. ``push`` returns the rows written, or None when the push must go over the wire
        (a layout that cannot travel in a ring, or no ring to be had); ``WireRest`` when only the rest of a push
        must (its ring closed under it and no new one could be made).
    """

    def __init__(self, request: Callable[..., Any], client: str, timeout: float) -> None:
        self.request = request
        self.client = client
        self.timeout = timeout
        self.host = host_id()
        self.writer: Optional[RingWriter] = None
        self.remote = 0  # pushes left on the wire before asking for a ring again (none to be had just now)
        self.used = 0  # pushes into the current ring
        self.flaps = 0  # layout changes in a row that each left a ring after fewer than FLAP_PUSHES pushes
        self.owed: Optional[ValueError] = None  # a refusal read from a ring this worker left: the next push raises

    def push(self, data: Any, batched: bool, envstep: int = -1) -> Optional[int]:
        if type(envstep) is not int or not -STEP_LIMIT < envstep < STEP_LIMIT:
            return None  # the wire's push judges it
        if self.writer is not None and self.owed is None:
            self.owed = self.writer.refusal()
        if self.owed is not None:
            e, self.owed = self.owed, None
            raise ValueError(f"{e} (this push was not written)")
        return self._push(data, batched, envstep)

    def _push(self, data: Any, batched: bool, envstep: int) -> Optional[int]:
        if self.remote:
            self.remote -= 1
            return None
        w = self.writer
        if w is not None and not batched:  # the common case: more rows of the ring's layout
            items = data if type(data) is list else [data]
            if items and all(w.matches(x) for x in items):
                self.used += 1
                return self._write(items, False, len(items), envstep)
        layout = layout_of(data, batched)
        if layout is None:
            return None
        fields, n = layout
        if n == 0:  # an empty batch: the wire's push judges it (refused, as a local buffer refuses it)
            return None
        if w is None or w.fields != fields:
            if w is not None:
                self.flaps = self.flaps + 1 if self.used < FLAP_PUSHES else 0
                if self.flaps >= MAX_FLAPS:  # its layouts keep changing (a reward now an int, now a float)
                    self.flaps = 0
                    self._retire()
                    self.remote = RETRY_AFTER - 1
                    return None
            self.used = 0
            try:  # the manager commits (and closes) the old ring before it answers: its refusals are known then
                reply = self.request('shm_open', client=self.client, host=self.host, fields=fields)
            finally:
                self._retire()
            if reply is None:  # another host, or no room: ask again after a while
                self.remote = RETRY_AFTER
                return None
            try:
                self.writer = RingWriter(reply['path'], fields, int(reply['rows']), int(reply['token']), self.timeout)
            except (OSError, ValueError) as e:  # e.g. a container whose /proc is not the manager's
                logger.warning("cannot map the manager's shared-memory ring (%s); this worker keeps the wire", e)
                self.request('shm_open', client=self.client, host='', fields=fields)  # the manager lets go of it
                self.remote = 1 << 62
                return None
        self.used += 1
        return self._write(data, batched, n, envstep)

    def _retire(self) -> None:
        """Let go of the current ring, keeping what the buffer refused of it for the next push."""
        if self.writer is not None:
            r = self.writer.refusal()
            if r is not None:
                self.owed = r if self.owed is None else ValueError(f"{self.owed}; {r}")
            self.writer.close()
            self.writer = None

    def _write(self, data: Any, batched: bool, n: int, envstep: int) -> int:
        """Write a push's rows; if the manager closes the ring under it (it counted this worker lost), the rows it
        did not take go into a new ring, or over the wire (``WireRest``)."""
        try:
            return self.writer.write(data, batched, n, envstep)
        except RingCorruptClosed as e:
            self._retire()  # the next push asks for a new ring
            raise RuntimeError(str(e)) from None
        except RingClosed as e:
            k = e.committed
            self._retire()
            if k >= n:
                return n
            rest = {f: v[k:] for f, v in data.items()} if batched else list(data if type(data) is list else [data])[k:]
            try:
                if self._push(rest, batched, envstep) is not None:
                    return n
            except WireRest as w:  # closed again under the rest: what that ring did not take
                raise WireRest(w.rest, n) from None
            except Exception:  # noqa: BLE001 - no new ring (the request failed): the first k rows are stored, the
                pass  # rest goes the wire's way (in doubt there, and resent once), never twice through a ring
            raise WireRest(rest, n) from None

    def close(self) -> Optional[ValueError]:
        """Let go of the ring; returns what the buffer refused of this worker's pushes and no push raised yet."""
        self._retire()
        owed, self.owed = self.owed, None
        return owed

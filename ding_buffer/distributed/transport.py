"""Point-to-point message transports for the torch (gloo) and MPI backends.

A *message* on the wire is the codec's ``(header, parts)`` framed as:

1. one *head* of at most ``HEAD`` bytes: a 64-byte control block ``int64[8] = [MAGIC, kind, message id,
   head bytes, header bytes, parts, out-of-line body bytes, meta bytes]`` followed by the *meta* block
   (``int64[2 * parts]`` of (size, inline offset or -1), the header, then the parts of at most ``INLINE``
   bytes copied in while the head has room);
2. the rest of the meta block, only when it does not fit in the head;
3. every other part, cut into pieces of at most ``PIECE`` bytes, sent from the tensor's own memory.

Delivery. A frame is queued whole on the peer's outbox and a sender thread sends its messages back to back, so
frames never interleave and never stop half-way: a caller whose deadline passes gets ``SendTimeout`` while the
frame stays queued (its memory alive) and reaches the peer whenever the peer reads again. A worker queues a
new frame only once the previous one left (bounded memory); the manager keeps at most ``MAX_QUEUED`` replies
per worker. A broken connection fails every queued frame with ``TransportError``.

Receiving. One thread per peer reads whole messages and decodes them (so every ``recv`` has a timeout: gloo's
own timed wait closes the connection when it expires). Every length is checked before it reaches a receive:
the control block must be self-consistent, parts must add up, and nothing past ``max_message_bytes`` is
allocated -- an oversized frame is drained piece by piece and reported as ``(ERROR, (id, CodecError))``, and
memory is allocated one piece at a time as the data arrives. MPI receives are sized by a matched probe, so
only the bytes that arrived are used and a message of the wrong size is consumed and refused; gloo receives
land in zeroed buffers, so a short message can never be read together with stale bytes. A message that breaks
the framing is answered with an error and the next message is read as a new head (the stream resynchronises
on message boundaries). The one thing no receiver can survive is gloo's own check: a single gloo message
longer than the receive posted for it (a head over ``HEAD`` bytes, or a piece longer than its head
declared) aborts the receiving process inside gloo. ding_buffer's senders never produce one; a peer that
bypasses them can, which is why the torch backend, like gloo, assumes the ranks of the job trust each other.

Shutdown. Each side ends a connection with a BYE message and answers the peer's BYE with its own; a receive
thread ends only when the peer's BYE arrives or the connection breaks. ``close(grace)`` sends BYE, then joins
the threads, so no thread is left inside gloo when the interpreter exits (a gloo wait that returns during
interpreter shutdown aborts the process).
"""
import atexit
import logging
import queue
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .codec import CodecError, decode, encode

MAGIC = 0x64696E67  # 'ding'
CTRL = 64  # bytes of the control block
HEAD = 256 << 10  # most bytes of the first message of a frame (receivers post this much)
INLINE = 128 << 10  # parts up to this size travel inside the head (a copy is cheaper than a message)
PIECE = 64 << 20  # largest single message of a part: receivers allocate at most this much ahead of the data
MAX_META = 64 << 20
MAX_HEADER = 8 << 20  # JSON headers parse into ~50x their size in Python objects
MAX_PARTS = 1 << 20
MAX_QUEUED = 8  # undelivered replies the manager keeps for one worker before counting it lost
TAG = 7
DATA, GOODBYE = 1, 2  # control-block kinds

MESSAGE, ERROR, LOST, BYE = 'message', 'error', 'lost', 'bye'

logger = logging.getLogger('ding_buffer.distributed')


class TransportError(RuntimeError):
    """The transport could not deliver or receive a message (peer gone, protocol broken)."""


class SendTimeout(TransportError):
    """A message was not handed to the peer before the deadline. A frame that was queued is still delivered
    later (in order); one refused because an earlier frame was still queued was not sent at all."""


class ProtocolError(TransportError):
    """A peer sent bytes that break the framing; ``msg_id`` is the id of the broken frame when it is known."""

    def __init__(self, message: str, msg_id: Optional[int] = None) -> None:
        super().__init__(message)
        self.msg_id = msg_id


def _pieces(n: int):
    """``(start, end)`` of each piece of an ``n``-byte part (a generator: ``n`` may be a hostile 2**62)."""
    return ((a, min(a + PIECE, n)) for a in range(0, n, PIECE))


def _table_ok(table: List[List[int]], first: int, mlen: int, body: int) -> bool:
    """A part table of Python ints is consistent: sizes >= 0; offsets -1 (out of line) or inline parts inside
    the meta block after the header, disjoint and in ascending order; out-of-line sizes add up to ``body``."""
    end, total = first, 0
    for size, off in table:
        if size < 0:
            return False
        if off == -1:
            total += size
        elif off < end or off + size > mlen:
            return False
        else:
            end = off + size
    return total == body


def _pad16(n: int) -> int:
    return (n + 15) & ~15


def frame(header: bytes, parts: List[np.ndarray], msg_id: int = -1,
          kind: int = DATA) -> Tuple[np.ndarray, Optional[np.ndarray], List[np.ndarray], int]:
    """``(head, extra meta or None, out-of-line parts, total bytes)`` for one message."""
    n = len(parts)
    table = np.empty(2 * n, dtype=np.int64)
    inline = []
    off = _pad16(16 * n + len(header))
    for i, p in enumerate(parts):
        table[2 * i] = p.nbytes
        if p.nbytes <= INLINE and CTRL + _pad16(off + p.nbytes) <= HEAD:
            table[2 * i + 1] = off
            inline.append((off, p))
            off = _pad16(off + p.nbytes)
        else:
            table[2 * i + 1] = -1
    out = [p for i, p in enumerate(parts) if table[2 * i + 1] < 0]
    body = sum(p.nbytes for p in out)
    in_head = min(off, HEAD - CTRL)
    # control + meta in one buffer, so inline parts are copied once; the head and the overflow are views of it
    buf = np.zeros(CTRL + off, dtype=np.uint8)
    buf[:CTRL].view(np.int64)[:] = (MAGIC, kind, msg_id, CTRL + in_head, len(header), n, body, off)
    meta = buf[CTRL:]
    meta[:16 * n] = table.view(np.uint8)
    meta[16 * n:16 * n + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for o, p in inline:
        meta[o:o + p.nbytes] = p
    head = buf[:CTRL + in_head]
    extra = buf[CTRL + in_head:] if off > in_head else None
    return head, extra, out, len(buf) + body


class _Frame:
    __slots__ = ('bufs', 'nbytes', 'done', 'error')

    def __init__(self, bufs: List[np.ndarray], nbytes: int) -> None:
        self.bufs = bufs  # keeps every buffer alive until the frame is delivered
        self.nbytes = nbytes
        self.done = threading.Event()
        self.error: Optional[str] = None


class _Outbox:

    def __init__(self) -> None:
        self.frames: 'deque[_Frame]' = deque()
        self.cond = threading.Condition()
        self.broken: Optional[str] = None
        self.bye_sent = False
        self.stop = False
        self.thread: Optional[threading.Thread] = None


_OPEN: 'weakref.WeakSet[ThreadedTransport]' = weakref.WeakSet()


@atexit.register
def _close_open_transports() -> None:  # before the interpreter tears threads down (see the module docstring)
    for t in list(_OPEN):
        try:
            t.close(final=True)
        except Exception:  # pragma: no cover - best effort at exit
            pass


class ThreadedTransport:
    """
    Overview:
        Framing, sender and receive threads and the inbox shared by the torch and MPI transports. Subclasses
        implement ``_send_buf(peer, buf)`` (blocking send of one message, on the sender thread),
        ``_recv_head(peer) -> (buf, count or None)`` and ``_recv_exact(peer, n) -> buf`` (blocking receive of
        the next message; ``count`` is the number of bytes that arrived when the transport can tell).
    Interfaces:
        ``start``, ``send``, ``send_encoded``, ``recv``, ``close``, ``queued``
    Thread-safety:
        ``send`` may be called from any thread; frames to one peer leave in the order they were queued.
    """

    def __init__(self, peers: Sequence[int], allow_pickle: bool, max_message_bytes: int,
                 grace: float = 5.0) -> None:
        self.peers = list(peers)
        self.allow_pickle = allow_pickle
        self.max_message_bytes = int(max_message_bytes)
        self.grace = float(grace)
        self.inbox: 'queue.Queue[Tuple[int, str, Any]]' = queue.Queue()
        self._out: Dict[int, _Outbox] = {p: _Outbox() for p in self.peers}
        self._recv_threads: Dict[int, threading.Thread] = {}
        self._bye_received: set = set()
        self._closed = False
        self._abandon = False  # set when close() gave up waiting: polling loops end
        self._lock = threading.Lock()
        # optional ``(peer, kind, obj) -> None`` run on the receive thread instead of queueing: the manager
        # serves requests there, saving a thread hand-off per request
        self.on_item: Optional[Callable[[int, str, Any], None]] = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.protocol_errors = 0

    # ------------------------------------------------------------------ backend primitives
    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        raise NotImplementedError

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        raise NotImplementedError

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        """The next message, expected to be ``n`` bytes, into ``out`` (a uint8 view of ``n`` bytes) or a new
        buffer; returns the buffer."""
        raise NotImplementedError

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, obj: Any, msg_id: int = -1, deadline: Optional[float] = None, wait: bool = True,
             limit: int = 1) -> int:
        """
        Overview:
            Encode ``obj`` and queue it for ``peer``. With ``wait`` block until it left (or ``deadline``, a
            ``time.monotonic()`` value, passes: ``SendTimeout``, the frame stays queued). A frame is queued only
            while fewer than ``limit`` frames wait for the peer (waiting for room until ``deadline``).
            Raises ``TypeError`` for objects the codec refuses, ``TransportError`` when the peer is gone.
        """
        header, parts = encode(obj, self.allow_pickle)
        return self.send_encoded(peer, header, parts, msg_id, deadline, wait, limit)

    def send_encoded(self, peer: int, header: bytes, parts: List[np.ndarray], msg_id: int = -1,
                     deadline: Optional[float] = None, wait: bool = True, limit: int = 1, kind: int = DATA) -> int:
        head, extra, out, n = frame(header, parts, msg_id if isinstance(msg_id, int) and msg_id >= 0 else -1, kind)
        if n > self.max_message_bytes or len(header) > MAX_HEADER:  # the peer would only drain and refuse it
            raise CodecError(f"message of {n} bytes (header {len(header)}) exceeds distributed.max_message_mb "
                             f"({self.max_message_bytes} bytes) or the {MAX_HEADER}-byte header limit; nothing was sent")
        bufs = [head] + ([extra] if extra is not None else [])
        for p in out:
            if not p.flags.writeable:  # torch.from_numpy needs writable memory; only bytes leaves are not
                p = p.copy()
            bufs.extend(p[a:b] for a, b in _pieces(p.nbytes))
        fr = _Frame(bufs, n)
        self._enqueue(peer, fr, deadline, limit, kind)
        if wait:
            left = None if deadline is None else deadline - time.monotonic()
            if not fr.done.wait(left):
                raise SendTimeout(f"rank {peer} did not take a message within the deadline; it stays queued "
                                  f"and is delivered if the peer reads again")
            if fr.error is not None:
                raise TransportError(fr.error)
        return n

    def _enqueue(self, peer: int, fr: _Frame, deadline: Optional[float], limit: int, kind: int) -> None:
        ob = self._out.get(peer)
        if ob is None:
            raise TransportError(f"rank {peer} is not a peer of this transport ({self.peers})")
        with ob.cond:
            while True:
                if ob.broken is not None:
                    raise TransportError(ob.broken)
                if ob.bye_sent or (self._closed and kind != GOODBYE):
                    raise TransportError(f"the connection to rank {peer} is closed")
                if len(ob.frames) < limit:
                    break
                left = 0.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise SendTimeout(f"rank {peer} has not taken the previous {len(ob.frames)} message(s); "
                                      f"nothing more is queued for it")
                ob.cond.wait(left)
            if kind == GOODBYE:
                ob.bye_sent = True
            ob.frames.append(fr)
            if ob.thread is None:
                ob.thread = threading.Thread(target=self._send_loop, args=(peer, ob), daemon=True,
                                             name=f'ding_buffer-send-{peer}')
                ob.thread.start()
            ob.cond.notify_all()

    def _send_loop(self, peer: int, ob: _Outbox) -> None:
        while True:
            with ob.cond:
                while not ob.frames and not ob.stop:
                    ob.cond.wait()
                if not ob.frames:
                    return
                fr = ob.frames[0]
            try:
                for b in fr.bufs:
                    if self._abandon:
                        raise TransportError("the transport was closed before the message left")
                    self._send_buf(peer, b)
            except Exception as e:
                with ob.cond:
                    ob.broken = f"sending to rank {peer} failed: {type(e).__name__}: {e}"
                    for f in ob.frames:
                        f.error = ob.broken
                        f.done.set()
                    ob.frames.clear()
                    ob.cond.notify_all()
                return
            with ob.cond:
                ob.frames.popleft()
                fr.done.set()
                ob.cond.notify_all()
            self.bytes_sent += fr.nbytes

    def queued(self, peer: int) -> int:
        """Frames waiting to leave for ``peer``."""
        ob = self._out[peer]
        with ob.cond:
            return len(ob.frames)

    # ------------------------------------------------------------------ receiving
    def start(self) -> None:
        _OPEN.add(self)
        for p in self.peers:
            t = threading.Thread(target=self._recv_loop, args=(p, ), name=f'ding_buffer-recv-{p}', daemon=True)
            self._recv_threads[p] = t
            t.start()

    def _deliver(self, peer: int, kind: str, obj: Any) -> None:
        if self.on_item is not None and kind in (MESSAGE, ERROR):
            try:
                self.on_item(peer, kind, obj)
            except Exception as e:  # the handler must not end the receive thread silently
                logger.exception("serving a message of rank %s failed", peer)
                self.inbox.put((peer, LOST, f"serving it failed: {type(e).__name__}: {e}"))
        else:
            self.inbox.put((peer, kind, obj))

    def _recv_loop(self, peer: int) -> None:
        while True:
            try:
                kind, obj = self._recv_message(peer)
            except ProtocolError as e:
                self.protocol_errors += 1
                kind, obj = ERROR, (e.msg_id, e)
            except Exception as e:  # connection closed, or close() gave up waiting
                if not self._abandon:
                    self.inbox.put((peer, LOST, f"{type(e).__name__}: {e}"))
                ob = self._out[peer]
                with ob.cond:
                    ob.broken = ob.broken or f"the connection to rank {peer} broke: {type(e).__name__}: {e}"
                    ob.cond.notify_all()
                return
            if kind == BYE:
                self._bye_received.add(peer)
                self._send_bye(peer)  # answer it (once), so the peer's receive thread can end too
                self.inbox.put((peer, BYE, None))
                return
            self._deliver(peer, kind, obj)

    def _send_bye(self, peer: int) -> None:
        ob = self._out[peer]
        with ob.cond:
            if ob.bye_sent or ob.broken is not None:
                return
        try:
            self.send_encoded(peer, b'{}', [], -1, None, wait=False, limit=1 << 30, kind=GOODBYE)
        except TransportError:
            pass

    def _recv_message(self, peer: int) -> Tuple[str, Any]:
        head, count = self._recv_head(peer)
        h = np.asarray(head)
        if (count if count is not None else len(h)) < CTRL:
            raise ProtocolError(f"rank {peer} sent a {count}-byte message, shorter than a control block")
        magic, kind, mid, hbytes, hlen, nparts, body, mlen = (int(v) for v in h[:CTRL].view(np.int64))
        if magic != MAGIC:
            raise ProtocolError(f"rank {peer} sent a message without the ding_buffer magic ({magic & (2**64 - 1):#x})")
        mid = mid if mid >= 0 else None
        if kind == GOODBYE:
            return BYE, None
        in_head = min(mlen, HEAD - CTRL)
        if not (kind == DATA and 0 < hlen and 0 <= nparts <= MAX_PARTS and 0 <= body
                and 16 * nparts + hlen <= mlen <= MAX_META and hbytes == CTRL + in_head
                and (count is None or count == hbytes)):
            raise ProtocolError(f"rank {peer} sent a bad control block {[kind, hbytes, hlen, nparts, body, mlen]} "
                                f"({count} bytes arrived)", mid)
        self.bytes_received += hbytes
        try:
            return self._recv_body(peer, h, mid, hlen, nparts, body, mlen, in_head)
        except ProtocolError as e:
            e.msg_id = mid if e.msg_id is None else e.msg_id
            raise

    def _recv_body(self, peer: int, h: np.ndarray, mid: Optional[int], hlen: int, nparts: int, body: int, mlen: int,
                   in_head: int) -> Tuple[str, Any]:
        if mlen <= in_head:
            meta = h[CTRL:CTRL + mlen]
        else:  # the rest of the meta block is one message (at most MAX_META bytes)
            meta = np.zeros(mlen, dtype=np.uint8)
            meta[:in_head] = h[CTRL:CTRL + in_head]
            self._recv_exact(peer, mlen - in_head, out=meta[in_head:])
            self.bytes_received += mlen - in_head
        first = 16 * nparts + hlen
        table = meta[:16 * nparts].copy().view(np.int64).reshape(-1, 2).tolist()  # Python ints: no overflow
        if not _table_ok(table, first, mlen, body):
            # the pieces it announces cannot be trusted either: the next message is read as a new head
            raise ProtocolError(f"rank {peer} sent a part table that does not match its sizes", mid)
        header = meta[16 * nparts:first].tobytes()
        if CTRL + mlen + body > self.max_message_bytes or hlen > MAX_HEADER:
            for s, o in table:  # drain: the bytes are on the wire already
                for a, b in _pieces(s if o < 0 else 0):
                    self._recv_exact(peer, b - a)
                    self.bytes_received += b - a
            what = (f"message of {CTRL + mlen + body} bytes exceeds distributed.max_message_mb "
                    f"({self.max_message_bytes} bytes)" if hlen <= MAX_HEADER else
                    f"message header of {hlen} bytes exceeds {MAX_HEADER} bytes (many small leaves: send one "
                    f"batched dict of tensors instead of a list of items)")
            return ERROR, (mid, CodecError(what))
        parts = []
        for s, o in table:
            if o >= 0:
                parts.append(meta[o:o + s].copy())  # owned: decoded tensors never share one buffer
                continue
            part = None
            for a, b in _pieces(s):
                if part is None:  # allocated once its first piece has arrived: memory follows the data
                    first_piece = np.asarray(self._recv_exact(peer, b - a)).reshape(-1)
                    if b == s:
                        part = first_piece
                        break
                    part = np.zeros(s, dtype=np.uint8)  # calloc: pages are not touched until written
                    part[a:b] = first_piece
                    del first_piece
                else:
                    self._recv_exact(peer, b - a, out=part[a:b])
                self.bytes_received += b - a
            parts.append(part if part is not None else np.empty(0, np.uint8))
        try:
            return MESSAGE, decode(header, parts, self.allow_pickle)
        except CodecError as e:
            return ERROR, (mid, e)

    def recv(self, timeout: Optional[float]) -> Optional[Tuple[int, str, Any]]:
        """Next ``(peer, kind, obj)`` from any peer, or ``None`` after ``timeout`` seconds."""
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def goodbye_received(self, peer: int) -> bool:
        """Whether ``peer`` ended the connection with a goodbye (a clean shutdown, not a failure)."""
        return peer in self._bye_received

    def alive(self, peer: int) -> bool:
        """Whether the receive thread of ``peer`` still runs (no BYE, connection intact)."""
        t = self._recv_threads.get(peer)
        return t is not None and t.is_alive()

    def close(self, grace: Optional[float] = None, final: bool = False) -> List[int]:
        """
        Overview:
            Say goodbye to every peer still connected (once), wait up to ``grace`` seconds (default: the
            transport's) for their answers and for queued frames to leave, and join the threads. Safe to call
            again: a later call waits again for threads that were still running. Returns the peers whose
            threads did not end in time (a frozen or unresponsive peer). ``final`` (at interpreter exit) also
            stops the MPI polling loops of such peers, which must not run past MPI's finalisation.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
        grace = self.grace if grace is None else grace
        deadline = time.monotonic() + grace
        if first:
            for p in self.peers:
                if p not in self._bye_received and self.alive(p):
                    self._send_bye(p)
            for ob in self._out.values():
                with ob.cond:
                    ob.stop = True
                    ob.cond.notify_all()
        for t in self._recv_threads.values():
            t.join(max(deadline - time.monotonic(), 0))
        for ob in self._out.values():
            if ob.thread is not None:
                ob.thread.join(max(deadline - time.monotonic(), 0))
        stuck = sorted({p for p, t in self._recv_threads.items() if t.is_alive()}
                       | {p for p, ob in self._out.items() if ob.thread is not None and ob.thread.is_alive()})
        if not stuck or final:
            self._abandon = True
            _OPEN.discard(self)
        if stuck and first:
            logger.warning("transport closed with ranks %s not answering its goodbye within %.1fs", stuck, grace)
        return stuck


class TorchTransport(ThreadedTransport):
    """torch.distributed point-to-point (gloo). The process group must be initialised (``init_torch``).
    Calls go straight to the process group object: ``dist.send``'s Python wrapper costs more than a small
    message on loopback."""

    def __init__(self, peers, allow_pickle, max_message_bytes, grace: float = 5.0, group=None) -> None:
        import torch.distributed as dist
        self._pg = group if group is not None else dist.distributed_c10d._get_default_group()
        super().__init__(peers, allow_pickle, max_message_bytes, grace)

    @property
    def rank(self) -> int:
        return self._pg.rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        self._pg.send([torch.from_numpy(buf)], peer, TAG).wait()

    def _recv_into(self, peer: int, buf: np.ndarray) -> np.ndarray:
        self._pg.recv([torch.from_numpy(buf)], peer, TAG).wait()
        return buf

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        # zeroed: gloo does not report how many bytes arrived, so a short message leaves zeros, never stale bytes
        return self._recv_into(peer, np.zeros(HEAD, dtype=np.uint8)), None

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        # zeroed (calloc: large buffers are not memset): a short message never leaves stale bytes
        return self._recv_into(peer, np.zeros(n, dtype=np.uint8) if out is None else out)


def _spin_then_sleep(done: Callable[[], bool], deadline: float, spin: float = 2e-3) -> bool:
    """Poll ``done`` back to back for ``spin`` seconds (each MPI test call also drives Open MPI's progress
    engine, which moves rendezvous transfers), then with sleeps growing to 1 ms; False at ``deadline``."""
    end_spin = time.monotonic() + spin
    while time.monotonic() < end_spin:
        if done():
            return True
        time.sleep(0)  # lets other Python threads run
    pause = 2e-5
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 1.5, 1e-3)
    return True


class MPITransport(ThreadedTransport):
    """mpi4py point-to-point over ``COMM_WORLD`` (or a given communicator).

    Receives are sized by a matched probe (``improbe``, polled briefly back to back, then with sleeps: a
    blocking receive would spin a core in Open MPI's progress loop while the peer is idle), so only the bytes
    that arrived are read and a message of the wrong size is consumed and refused. Sends are ``Isend`` +
    ``Test`` on the peer's sender thread; the frame keeps the buffer alive until the request completes."""

    def __init__(self, peers, allow_pickle, max_message_bytes, grace: float = 5.0, comm=None) -> None:
        from mpi4py import MPI
        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self._orphans: List[Tuple[Any, np.ndarray]] = []  # requests abandoned at close, with their buffers
        super().__init__(peers, allow_pickle, max_message_bytes, grace)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        req = self._comm.Isend([buf, self._MPI.BYTE], dest=peer, tag=TAG)
        if not _spin_then_sleep(lambda: req.Test() or self._abandon, float('inf'), spin=0.05) or self._abandon:
            if not req.Test():
                self._orphans.append((req, buf))  # MPI may still read it: it must never be freed
                raise TransportError(f"send to rank {peer} abandoned at close")

    def _probe(self, peer: int) -> Tuple[Any, int]:
        status = self._MPI.Status()
        found: List[Any] = []

        def probe() -> bool:
            if self._abandon:
                return True
            m = self._comm.improbe(source=peer, tag=TAG, status=status)
            if m is not None:
                found.append(m)
                return True
            return False

        _spin_then_sleep(probe, float('inf'), spin=3e-4)
        if not found:
            raise TransportError("transport closed")
        return found[0], status.Get_count(self._MPI.BYTE)

    def _consume(self, msg: Any, count: int) -> None:
        try:  # a receive into a smaller buffer consumes the message and reports truncation
            msg.Recv([np.empty(min(count, 1 << 16), dtype=np.uint8), self._MPI.BYTE])
        except self._MPI.Exception:
            pass

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        msg, count = self._probe(peer)
        if not CTRL <= count <= HEAD:
            self._consume(msg, count)
            raise ProtocolError(f"rank {peer} sent a {count}-byte message where a head (64..{HEAD} bytes) was due")
        buf = np.empty(count, dtype=np.uint8)
        msg.Recv([buf, self._MPI.BYTE])
        return buf, count

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        msg, count = self._probe(peer)
        if count != n:
            self._consume(msg, count)
            raise ProtocolError(f"rank {peer} sent a {count}-byte message where its frame announced {n} bytes")
        buf = np.empty(n, dtype=np.uint8) if out is None else out
        msg.Recv([buf, self._MPI.BYTE])
        return buf


def _wait_listening(host: str, port: int, deadline: float) -> None:
    """Return once something accepts TCP connections at ``host:port``; ``TimeoutError`` at ``deadline``."""
    import socket
    pause = 0.05
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"nothing listens at {host}:{port}")
        try:
            socket.create_connection((host, port), timeout=min(left, 2.0)).close()
            return
        except OSError:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.5)


def _presence_barrier(store: Any, rank: int, world: int, timeout_s: float, prefix: str,
                      configured: Optional[float] = None) -> None:
    """Every rank marks itself present in the store and waits (at most ``timeout_s``, what is left of the
    configured start-up time) for the others."""
    keys = [f'{prefix}/{r}' for r in range(world)]
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            store.set(keys[rank], '1')
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception as e:  # the store's host went away (it gave up waiting, or died)
            raise TimeoutError(f"distributed start-up: lost the store while waiting for the other ranks "
                               f"({type(e).__name__}: {e}); did every rank start?") from e
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"distributed start-up: ranks {missing} of {world} did not join within "
                               f"{configured if configured is not None else timeout_s}s "
                               f"(distributed.startup_timeout); were they started, with the same MASTER_ADDR/PORT?")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def init_torch(startup_s: float) -> Tuple[int, int]:
    """
    Overview:
        Join (or reuse) the default gloo process group from torchrun's / SLURM-style env variables. Start-up is
        bounded by ``startup_s``: reaching the master's store, then every rank marking itself present.
        The group itself gets a week-long timeout: gloo closes every connection when one of its own waits
        expires, and the manager may legitimately wait for hours between pushes (our timeouts live in the
        inbox and the outboxes instead).
    """
    import datetime
    import os
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError("distributed.backend='torch' needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        if dist.get_backend() != 'gloo':
            raise ValueError(f"distributed.backend='torch' needs a gloo process group, the default group uses "
                             f"{dist.get_backend()!r}; create a gloo group for the buffer")
        return dist.get_rank(), dist.get_world_size()
    missing = [k for k in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE') if k not in os.environ]
    if missing:
        raise RuntimeError(f"distributed.backend='torch' needs the env variables {missing} (set by torchrun, or by "
                           f"you for env:// launches); run the job under torchrun --nproc_per_node N")
    host, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    where = f"{host}:{port}"
    # torchrun hosts the store in its agent; otherwise rank 0 does. The store does not wait for its clients: the
    # presence barrier below does, and names the ranks that never came.
    agent = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    master = rank == 0 and not agent
    deadline = time.monotonic() + startup_s
    try:
        if not master:  # the store's own client retries with random back-off past its timeout: probe first
            _wait_listening(host, port, deadline)
        store = dist.TCPStore(host, port, world, is_master=master, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.5)))
    except Exception as e:
        raise TimeoutError(f"distributed start-up (rank {rank} of {world}): could not reach the torch.distributed "
                           f"master at {where} within {startup_s}s (distributed.startup_timeout): "
                           f"{type(e).__name__}: {e}") from e
    restart = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    _presence_barrier(store, rank, world, max(deadline - time.monotonic(), 0.0), f'ding_buffer/present/{restart}',
                      startup_s)
    long = datetime.timedelta(seconds=max(startup_s, 7 * 24 * 3600))
    store.set_timeout(long)
    dist.init_process_group('gloo', store=store, rank=rank, world_size=world, timeout=long)
    return rank, world


def init_mpi() -> Tuple[int, int]:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("distributed.backend='mpi' needs mpi4py (pip install 'ding_buffer[mpi]', and Open MPI: "
                          "apt-get install openmpi-bin libopenmpi-dev)") from e
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("distributed.backend='mpi' needs MPI_THREAD_MULTIPLE (mpi4py's default thread level)")
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

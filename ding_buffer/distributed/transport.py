"""Point-to-point message transports for the torch (gloo) and MPI backends.

A *message* on the wire is the codec's ``(header, parts)`` framed as:

1. one *head* of at most ``HEAD`` bytes: a 64-byte control block ``int64[8] = [MAGIC, kind, message id,
   head bytes, header bytes, parts, out-of-line body bytes, meta bytes]`` followed by the *meta* block
   (``int64[2 * parts]`` of (size, inline offset or -1), the header, then the parts of at most ``INLINE``
   bytes copied in while the head has room);
2. the rest of the meta block, only when it does not fit in the head;
3. every other part, cut into pieces of at most ``PIECE`` bytes, sent from the tensor's own memory.

Delivery. A frame is queued whole on the peer's outbox and its messages leave back to back, so frames never
interleave and never stop half-way: a caller whose deadline passes gets ``SendTimeout`` while the frame stays
queued (its memory alive) and reaches the peer whenever the peer reads again. The MPI backend starts every
message of a frame as it is queued (``Isend`` returns at once), so the data moves while the sender thread wakes
up to poll for the completions; the torch backend issues and waits for its gloo sends on the sender thread
(issuing them on the caller's thread measured slower). A worker queues a new frame only once the previous one
left (bounded memory); the manager keeps at most ``MAX_QUEUED`` replies per worker. A broken connection fails every
queued frame with ``TransportError``.

Receiving. One thread per peer reads whole messages and decodes them (so every ``recv`` has a timeout: gloo's
own timed wait closes the connection when it expires). Large parts land in recycled buffers when nothing holds
the earlier message any more (``recv_pool``). ``frame_reader`` checks every length before it reaches a
receive and resynchronises on message boundaries after a broken one; it also says why the torch backend, like
gloo, assumes the ranks of the job trust each other.

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

from ..errors import CodecError, ProtocolError, SendTimeout, TransportError
from .codec import encode
from .frame_reader import BYE, ERROR, LOST, MESSAGE, FrameReader
from .framing import DATA, GOODBYE, MAX_HEADER, frame, pieces

logger = logging.getLogger('ding_buffer.distributed')


class _Frame:
    __slots__ = ('bufs', 'nbytes', 'done', 'error', 'handles')

    def __init__(self, bufs: List[np.ndarray], nbytes: int) -> None:
        self.bufs = bufs  # keeps every buffer alive until the frame is delivered
        self.nbytes = nbytes
        self.done = _LEFT  # replaced by its own event when it is queued (a frame that left at once needs none)
        self.error: Optional[str] = None
        self.handles: Optional[List[Any]] = None  # the backend's handles of sends started at queueing


_LEFT = threading.Event()  # the ``done`` of every frame that left as it was queued
_LEFT.set()


class _Outbox:
    def __init__(self) -> None:
        self.frames: 'deque[_Frame]' = deque()
        self.cond = threading.Condition()
        self.broken: Optional[str] = None
        self.bye_sent = False
        self.stop = False
        self.thread: Optional[threading.Thread] = None
        self.owner: Any = None  # the transport, while frames wait (a goodbye queued as it is dropped still leaves)


_OPEN: 'weakref.WeakSet[ThreadedTransport]' = weakref.WeakSet()


def _sender(peer: int, ob: _Outbox) -> None:
    """The sender thread of a transport for ``peer``: sends its queued frames in order. The transport is held (by
    the outbox) only while frames wait, so one dropped without ``close()`` is collected once they left, and its
    finalizer stops this thread."""
    ob.owner._thread_started()  # (set before the thread started: a frame waits)
    while True:
        with ob.cond:
            while not ob.frames and not ob.stop:
                if ob.owner is not None:  # nothing waits to leave: the transport may go (its finalizer may run
                    ob.owner = None  # right here, setting ``stop``: checked again before waiting)
                    continue
                ob.cond.wait()
            if not ob.frames:
                ob.thread = ob.owner = None  # under the lock: a frame queued after this starts a new sender thread
                return
            fr, transport = ob.frames[0], ob.owner
        if not transport._send_frame(peer, ob, fr):
            return
        del transport


def _stop_senders(outboxes: List[_Outbox]) -> None:
    """A dropped transport's finalizer: its sender threads end once their frames left."""
    for ob in outboxes:
        with ob.cond:
            ob.stop = True
            ob.cond.notify_all()


@atexit.register
def _close_open_transports() -> None:  # before the interpreter tears threads down (see the module docstring)
    for t in list(_OPEN):
        try:
            t.close(final=True)
        except Exception:  # pragma: no cover - best effort at exit
            pass


class ThreadedTransport(FrameReader):
    """
    Overview:
        Framing, sender and receive threads and the inbox shared by the torch and MPI transports. Subclasses
        implement either ``_send_buf(peer, buf)`` (blocking send of one message, on the sender thread) or, with
        ``starts_sends = True``, ``_start_send(peer, buf) -> handle`` (start one message without blocking, e.g.
        MPI's Isend; called as the frame is queued, so the data moves while the threads hand over) and
        ``_finish_send(peer, handle, buf)`` (block until it left, on the sender thread); and
        ``_recv_head(peer) -> (buf, count or None)`` and ``_recv_exact(peer, n) -> buf`` (blocking receive of
        the next message; ``count`` is the number of bytes that arrived when the transport can tell).
    Interfaces:
        ``start``, ``send``, ``send_encoded``, ``recv``, ``close``, ``queued``
    Thread-safety:
        ``send`` may be called from any thread; frames to one peer leave in the order they were queued.
    """

    def __init__(self, peers: Sequence[int], allow_pickle: bool, max_message_bytes: int, grace: float = 5.0) -> None:
        self.peers = list(peers)
        self.allow_pickle = allow_pickle
        self.max_message_bytes = int(max_message_bytes)
        self.grace = float(grace)
        self.inbox: 'queue.Queue[Tuple[int, str, Any]]' = queue.Queue()
        self._out: Dict[int, _Outbox] = {p: _Outbox() for p in self.peers}
        weakref.finalize(self, _stop_senders, list(self._out.values())).atexit = False  # (close() runs at exit)
        self._readers: List[threading.Thread] = []  # the receive threads
        self._started = False
        self._ended: set = set()  # peers whose receive side ended (their goodbye arrived, or the connection broke)
        self._ended_cv = threading.Condition()
        self._bye_received: set = set()
        self._closed = False
        self._abandon = False  # set when close() gave up waiting: polling loops end
        self._close_deadline: Optional[float] = None  # the end of the first close()'s grace
        self._lock = threading.Lock()
        # optional ``(peer, kind, obj) -> None`` run on the receive thread instead of queueing: the manager
        # serves requests there, saving a thread hand-off per request
        self.on_item: Optional[Callable[[int, str, Any], None]] = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.protocol_errors = 0

    # ------------------------------------------------------------------ backend primitives
    starts_sends = False

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        raise NotImplementedError

    def _start_send(self, peer: int, buf: np.ndarray) -> Any:
        raise NotImplementedError

    def _finish_send(self, peer: int, handle: Any, buf: np.ndarray) -> None:
        raise NotImplementedError

    def _sent_now(self, peer: int, handles: Sequence[Any]) -> bool:
        """Whether the sends just started (``starts_sends``) have all completed already."""
        return False

    def _orphan(self, handles: Sequence[Any], bufs: Sequence[np.ndarray]) -> None:
        """Sends started and never finished (the connection broke, or close gave up): a backend whose
        transfers may still read the buffers keeps them alive."""

    def _thread_started(self) -> None:
        """Run first on each sender and receive thread of this transport (a backend's per-thread setup)."""

    # ------------------------------------------------------------------ sending
    def send(
        self, peer: int, obj: Any, msg_id: int = -1, deadline: Optional[float] = None, wait: bool = True, limit: int = 1
    ) -> int:
        """
        Overview:
            Encode ``obj`` and queue it for ``peer``. With ``wait`` block until it left (or ``deadline``, a
            ``time.monotonic()`` value, passes: ``SendTimeout``, the frame stays queued). A frame is queued only
            while fewer than ``limit`` frames wait for the peer (waiting for room until ``deadline``).
            Raises ``TypeError`` for objects the codec refuses, ``TransportError`` when the peer is gone.
        """
        header, parts = encode(obj, self.allow_pickle)
        return self.send_encoded(peer, header, parts, msg_id, deadline, wait, limit)

    def send_encoded(
        self,
        peer: int,
        header: bytes,
        parts: List[np.ndarray],
        msg_id: int = -1,
        deadline: Optional[float] = None,
        wait: bool = True,
        limit: int = 1,
        kind: int = DATA,
    ) -> int:
        head, extra, out, n = frame(header, parts, msg_id if isinstance(msg_id, int) and msg_id >= 0 else -1, kind)
        if n > self.max_message_bytes or len(header) > MAX_HEADER:  # the peer would only drain and refuse it
            raise CodecError(
                f"message of {n} bytes (header {len(header)}) exceeds distributed.max_message_mb "
                f"({self.max_message_bytes} bytes) or the {MAX_HEADER}-byte header limit; nothing was sent"
            )
        bufs = [head] + ([extra] if extra is not None else [])
        for p in out:
            if not p.flags.writeable:  # torch.from_numpy needs writable memory; only bytes leaves are not
                p = p.copy()
            bufs.extend(p[a:b] for a, b in pieces(p.nbytes))
        fr = _Frame(bufs, n)
        self._enqueue(peer, fr, deadline, limit, kind)
        if wait:
            left = None if deadline is None else deadline - time.monotonic()
            if not fr.done.wait(left):
                raise SendTimeout(
                    f"rank {peer} did not take a message within the deadline; it stays queued "
                    f"and is delivered if the peer reads again"
                )
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
                    raise SendTimeout(
                        f"rank {peer} has not taken the previous {len(ob.frames)} message(s); "
                        f"nothing more is queued for it"
                    )
                ob.cond.wait(left)
            if self.starts_sends:  # in queue order, under the lock: frames never interleave on the wire
                handles: List[Any] = []
                try:
                    for b in fr.bufs:
                        handles.append(self._start_send(peer, b))
                except Exception as e:  # part of a frame may be out: nothing can follow it on this connection
                    self._orphan(handles, fr.bufs)
                    ob.broken = f"sending to rank {peer} failed: {type(e).__name__}: {e}"
                    ob.cond.notify_all()
                    raise TransportError(ob.broken) from e
                fr.handles = handles
                if kind != GOODBYE and not ob.frames and self._sent_now(peer, handles):
                    self.bytes_sent += fr.nbytes  # it left as it was queued: the sender thread is not woken
                    return
            if kind == GOODBYE:
                ob.bye_sent = True
            fr.done = threading.Event()
            ob.frames.append(fr)
            ob.owner = self
            if ob.thread is None:  # (also after a sender thread ended: a late goodbye still leaves)
                thread = threading.Thread(target=_sender, args=(peer, ob), daemon=True, name=f'ding_buffer-send-{peer}')
                try:
                    thread.start()
                except BaseException:  # (no thread to be had: the frame is not queued, and the next try starts one)
                    ob.frames.pop()
                    ob.owner = self if ob.frames else None
                    raise
                ob.thread = thread
            ob.cond.notify_all()

    def _send_frame(self, peer: int, ob: _Outbox, fr: _Frame) -> bool:
        """Send ``fr``, the first of ``ob``'s frames, on its sender thread; False when the connection broke (every
        queued frame then fails)."""
        try:
            if fr.handles is not None:
                for h, b in zip(fr.handles, fr.bufs):
                    self._finish_send(peer, h, b)
            else:
                for b in fr.bufs:
                    if self._abandon:
                        raise TransportError("the transport was closed before the message left")
                    self._send_buf(peer, b)
        except Exception as e:
            with ob.cond:
                ob.broken = f"sending to rank {peer} failed: {type(e).__name__}: {e}"
                for f in ob.frames:
                    if f.handles is not None:
                        self._orphan(f.handles, f.bufs)
                    f.error = ob.broken
                    f.done.set()
                ob.frames.clear()
                ob.owner = None
                ob.cond.notify_all()
            return False
        with ob.cond:
            ob.frames.popleft()
            fr.done.set()
            ob.cond.notify_all()
        self.bytes_sent += fr.nbytes
        return True

    def queued(self, peer: int) -> int:
        """Frames waiting to leave for ``peer``."""
        ob = self._out[peer]
        with ob.cond:
            return len(ob.frames)

    # ------------------------------------------------------------------ receiving
    one_per_peer = False  # torch, MPI: a process's messages from a rank reach whichever transport reads first

    def start(self) -> None:
        """Start the receive threads; ``one_per_peer``: ``RuntimeError`` while another open transport of this process
        talks to one of the peers (its replies would reach either: matched by request ids that both number from 0)."""
        mine = set(self.peers) if self.one_per_peer else set()
        busy = sorted({p for t in list(_OPEN) if type(t) is type(self) and not t._closed for p in t.peers} & mine)
        if busy:
            raise RuntimeError(
                f"this process already has an open connection to rank(s) {busy} (a buffer of an earlier "
                f"create_buffer): on torch and MPI a process talks to a manager through one buffer; share it (a "
                f"buffer made after it closed is not served in the same job: the manager counts this process "
                f"exited for good)"
            )
        _OPEN.add(self)
        self._started = True
        self._start_readers()

    def _start_readers(self) -> None:
        """One receive thread per peer (a backend may read every peer's messages differently)."""
        for p in self.peers:
            self._reader(f'ding_buffer-recv-{p}', self._recv_loop, p)

    def _reader(self, name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
        """Start the receive thread ``name`` running ``target(*args)``."""
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._readers.append(t)
        t.start()
        return t

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
        self._thread_started()
        while self._recv_one(peer):
            pass

    def _recv_one(self, peer: int) -> bool:
        """Read one message of ``peer`` and deliver it; False once the peer's receive side ended (its goodbye
        arrived, or the connection broke). The message's receive buffers are free again on return (recv_pool)."""
        try:
            kind, obj = self._recv_message(peer)
        except ProtocolError as e:
            self.protocol_errors += 1
            kind, obj = ERROR, (e.msg_id, e)
        except Exception as e:  # connection closed, or close() gave up waiting
            self._broken(peer, e)
            return False
        if kind == BYE:
            self._bye_received.add(peer)
            self._send_bye(peer)  # answer it (once), so the peer's receive side can end too
            self.inbox.put((peer, BYE, None))
            self._end(peer)
            return False
        self._deliver(peer, kind, obj)
        return True

    def _broken(self, peer: int, e: BaseException) -> None:
        """``peer``'s connection broke: it is reported lost, its queued frames fail and its receive side ends."""
        if not self._abandon:
            self.inbox.put((peer, LOST, f"{type(e).__name__}: {e}"))
        ob = self._out[peer]
        with ob.cond:
            ob.broken = ob.broken or f"the connection to rank {peer} broke: {type(e).__name__}: {e}"
            ob.cond.notify_all()
        self._end(peer)

    def _wake(self, peer: Optional[int] = None) -> None:
        """Wake receive threads that wait without polling (those of ``peer``, or all), to see that their peer
        ended or the transport was abandoned (a backend hook)."""

    def _end(self, peer: int) -> None:
        with self._ended_cv:
            self._ended.add(peer)
            self._ended_cv.notify_all()
        self._wake(peer)  # a parked thread of the peer ends now

    def _send_bye(self, peer: int) -> None:
        ob = self._out[peer]
        with ob.cond:
            if ob.bye_sent or ob.broken is not None:
                return
        try:
            self.send_encoded(peer, b'{}', [], -1, None, wait=False, limit=1 << 30, kind=GOODBYE)
        except TransportError:
            pass

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
        """Whether ``peer``'s messages are still read (started, no BYE, connection intact)."""
        return self._started and not self._abandon and peer not in self._ended

    def _say_goodbye(self) -> None:
        """A goodbye to every peer still connected; the sender threads end once their queues are empty."""
        for p in self.peers:
            if p not in self._bye_received and self.alive(p):
                self._send_bye(p)
        for ob in self._out.values():
            with ob.cond:
                ob.stop = True
                ob.cond.notify_all()

    def close(self, grace: Optional[float] = None, final: bool = False) -> List[int]:
        """
        Overview:
            Say goodbye to every peer still connected (once), wait up to ``grace`` seconds (default: the
            transport's) for their answers and for queued frames to leave, and join the threads. Safe to call
            again: a later call waits again for threads that were still running. Returns the peers whose
            threads did not end in time (a frozen, unresponsive or dead peer: MPI cannot tell a dead rank from a
            silent one). ``final``: the transport is not used again (its owner is done, or the interpreter
            exits): the goodbye gets one grace in all, counted from the first ``close`` (a later ``final`` call
            never waits a second one), and the threads of peers that did not answer are abandoned (MPI polling
            loops end; they must not run past MPI's finalisation).
        """
        with self._lock:
            first = not self._closed
            self._closed = True
        grace = self.grace if grace is None else grace
        deadline = time.monotonic() + grace
        if first:
            self._close_deadline = deadline
        elif final and self._close_deadline is not None:
            deadline = min(deadline, self._close_deadline)  # the peers had their grace already
        if first:
            self._say_goodbye()
        if self._started:
            with self._ended_cv:
                self._ended_cv.wait_for(lambda: self._ended.issuperset(self.peers), max(deadline - time.monotonic(), 0))
        for ob in self._out.values():
            if ob.thread is not None:
                ob.thread.join(max(deadline - time.monotonic(), 0))
        stuck = sorted(
            {p for p in self.peers if self.alive(p)}
            | {p for p, ob in self._out.items() if ob.thread is not None and ob.thread.is_alive()}
        )
        if not stuck or final:
            self._abandon = True
            self._wake()
            _OPEN.discard(self)
        for t in self._readers:  # they end once their peers did, or at once when abandoned
            t.join(max(deadline - time.monotonic(), 0.05 if self._abandon else 0))
        left = [t.name for t in self._readers if t.is_alive()]
        if left and self._abandon:
            logger.warning("transport closed with receive threads %s still inside a receive", left)
        if stuck and first:
            logger.warning("transport closed with ranks %s not answering its goodbye within %.1fs", stuck, grace)
        return stuck

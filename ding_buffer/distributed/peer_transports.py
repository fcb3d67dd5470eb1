"""The two point-to-point backends of ``ThreadedTransport``: torch.distributed (gloo) and MPI (mpi4py)."""

import logging
import threading
import time
from collections import deque
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from ..errors import ProtocolError, TransportError
from .framing import CTRL, HEAD, TAG
from .poll_wait import poll, precise_sleeps
from .transport import ThreadedTransport

logger = logging.getLogger('ding_buffer.distributed')


class TorchTransport(ThreadedTransport):
    """torch.distributed point-to-point (gloo). The process group must be initialised (``init_torch``).
    Calls go straight to the process group object: ``dist.send``'s Python wrapper costs more than a small
    message on loopback."""

    one_per_peer = True

    def __init__(self, peers, allow_pickle, max_message_bytes, grace: float = 5.0, group=None) -> None:
        import torch.distributed as dist

        self._pg = group if group is not None else dist.distributed_c10d._get_default_group()
        super().__init__(peers, allow_pickle, max_message_bytes, grace)

    @property
    def rank(self) -> int:
        return self._pg.rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        # on the sender thread, issued and waited there: starting gloo sends on the caller's thread as the frame
        # is queued (as MPI does) measured ~10% slower at 0.1-1 MB pushes (2026-11-23, 2 cores)
        self._pg.send([torch.from_numpy(buf)], peer, TAG).wait()

    def _recv_into(self, peer: int, buf: np.ndarray) -> np.ndarray:
        self._pg.recv([torch.from_numpy(buf)], peer, TAG).wait()
        return buf

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        # zeroed: gloo does not report how many bytes arrived, so a short head leaves zeros, never stale bytes
        return self._recv_into(peer, np.zeros(HEAD, dtype=np.uint8)), None

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        # zeroed (calloc: large buffers are not memset): a short message never leaves stale bytes
        return self._recv_into(peer, np.zeros(n, dtype=np.uint8) if out is None else out)


EXPECT_WINDOW = 5e-3  # seconds a message is expected after traffic with a peer (poll_wait)
SEND_BUSY = 0.05  # seconds a send is polled closely before the pauses grow (the peer is not reading)
WAIT_STEP = 0.5  # seconds between a parked peer thread's own checks for its end or close (both also wake it)


# sends abandoned at close or on a broken connection, with their buffers, for the life of the process
_ORPHANED: List[Tuple[List[Any], List[np.ndarray]]] = []


class _Routed:
    """The messages of one peer that the dispatcher matched for the peer's own thread (``owned``: that thread
    reads the peer's current frame, and every message of the peer goes to it until its queue is empty)."""

    __slots__ = ('items', 'cond', 'owned', 'thread')

    def __init__(self) -> None:
        self.items: 'deque[Tuple[Any, int, Optional[np.ndarray]]]' = deque()  # (matched message, bytes, head)
        self.cond = threading.Condition()
        self.owned = False
        self.thread: Optional[threading.Thread] = None


class MPITransport(ThreadedTransport):
    """mpi4py point-to-point over ``COMM_WORLD`` (or a given communicator).

    Receiving: one dispatcher thread probes for the next message of any peer (``improbe`` on ``ANY_SOURCE``, or
    on the one peer; polled as ``poll_wait`` says: closely while a message is expected, with growing pauses while
    every peer is idle; a blocking receive would spin a core in Open MPI's progress loop). A message sized by its
    matched probe is read whole, so a message of the wrong size is consumed and refused. A frame that fits in its
    head (every small request and reply) is read, checked, decoded and delivered on the dispatcher itself: one
    thread serves every peer, with no hand-off per request. A frame with more messages (large parts), or a peer
    with replies still queued for it (whose request may wait for room), is handed to that peer's own thread, and
    the dispatcher routes the peer's messages to it, in order, until that thread has read them all: a peer that
    stops half-way through a frame, or does not take its replies, holds up only itself. A message from a rank that
    is not a peer is consumed and counted as a protocol error.

    Sending: ``Isend`` as the frame is queued and ``Test`` on the peer's sender thread; the frame keeps the
    buffer alive until the request completes, and requests abandoned at close keep theirs for the life of the
    process."""

    one_per_peer = True

    def __init__(self, peers, allow_pickle, max_message_bytes, grace: float = 5.0, comm=None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self._expect = 0.0  # until when the dispatcher polls closely (a message is expected soon)
        self._kick = threading.Event()  # ends the dispatcher's idle pause (this side sent something)
        self._routed = {p: _Routed() for p in peers}
        self._dispatcher: Optional[threading.Thread] = None
        super().__init__(peers, allow_pickle, max_message_bytes, grace)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    def _thread_started(self) -> None:
        precise_sleeps()  # this transport's threads poll (poll_wait)

    def _expect_soon(self, peer: int) -> None:
        self._expect = time.monotonic() + EXPECT_WINDOW
        if self._dispatcher is None or threading.get_ident() != self._dispatcher.ident:  # (it is not waiting)
            self._kick.set()

    starts_sends = True  # Isend as the frame is queued (26-28% of raw at 5 MB vs 23% from the sender thread)

    def _start_send(self, peer: int, buf: np.ndarray) -> Any:
        return self._comm.Isend([buf, self._MPI.BYTE], dest=peer, tag=TAG)

    def _finish_send(self, peer: int, req: Any, buf: np.ndarray) -> None:
        busy = time.monotonic() + SEND_BUSY
        if not poll(lambda: req.Test() or self._abandon, float('inf'), busy_until=lambda: busy) or self._abandon:
            if not req.Test():
                raise TransportError(f"send to rank {peer} abandoned at close")  # the frame is orphaned
        self._expect_soon(peer)  # it arrived: an answer (or the peer's next request) is likely to follow

    def _sent_now(self, peer: int, handles) -> bool:
        if all(r.Test() for r in handles):  # small messages leave eagerly: done at once
            self._expect_soon(peer)
            return True
        return False

    def _orphan(self, handles, bufs) -> None:
        # MPI may still read them: they must never be freed (those that completed since are let go)
        _ORPHANED[:] = [(h, b) for h, b in _ORPHANED if not all(self._done(r) for r in h)]
        _ORPHANED.append((list(handles), list(bufs)))

    # ------------------------------------------------------------------ receiving: the dispatcher
    def _start_readers(self) -> None:
        self._dispatcher = self._reader('ding_buffer-recv', self._dispatch_loop)

    def _dispatch_loop(self) -> None:
        self._thread_started()
        MPI = self._MPI
        source = self.peers[0] if len(self.peers) == 1 else MPI.ANY_SOURCE
        status = MPI.Status()
        found: List[Any] = []

        def probe() -> bool:
            if self._abandon or len(self._ended) == len(self.peers):
                return True
            m = self._comm.improbe(source=source, tag=TAG, status=status)
            if m is None:
                return False
            found.append(m)
            return True

        while True:
            try:
                poll(probe, float('inf'), busy_until=lambda: self._expect, kick=self._kick)
            except Exception as e:  # MPI itself failed: no peer can be read any more
                for p in self.peers:
                    if p not in self._ended:
                        self._broken(p, e)
                return
            if not found:
                return  # closed, or every peer ended
            self._expect = time.monotonic() + EXPECT_WINDOW  # the peers are active: more is likely to follow
            peer = status.Get_source()
            try:
                self._route(found.pop(), peer, status.Get_count(MPI.BYTE))
            except Exception as e:  # reading this peer failed: the others are still served
                logger.exception("reading a message of rank %s failed", peer)
                if peer in self._routed and peer not in self._ended:
                    self._broken(peer, e)

    def _route(self, msg: Any, peer: int, count: int) -> None:
        r = self._routed.get(peer)
        if r is None or peer in self._ended:
            self._consume(msg, count)
            if r is None:
                self.protocol_errors += 1
                logger.warning("rank %s, not a peer of this transport, sent a %d-byte message: dropped", peer, count)
            return
        with r.cond:
            if r.owned:  # the peer's thread reads its current frame: the rest is its
                r.items.append((msg, count, None))
                r.cond.notify()
                return
        head = None
        if CTRL <= count <= HEAD:  # the head of the peer's next frame (a wrong size is refused by _recv_head)
            head = np.empty(count, dtype=np.uint8)
            req = msg.Irecv([head, self._MPI.BYTE])
            # a head past MPI's eager size may need its sender to move on (a frozen one never does): its own
            # thread waits for that, never this one
            msg = None if self._done(req) else req
        r.items.append((msg, count, head))
        if head is None or (msg is None and _whole(head) and not self._out[peer].frames):
            self._recv_one(peer)  # here, on the dispatcher: it needs no other message and no room
            return
        with r.cond:
            r.owned = True
            if r.thread is None:
                r.thread = self._reader(f'ding_buffer-recv-{peer}', self._peer_loop, peer, r)
            r.cond.notify()

    def _wake(self, peer: Optional[int] = None) -> None:
        """Wake the parked thread of ``peer`` (all of them when None) to check whether it should end."""
        for p, r in self._routed.items():
            if peer is None or p == peer:
                with r.cond:
                    r.cond.notify_all()

    def _peer_loop(self, peer: int, r: _Routed) -> None:
        self._thread_started()
        while True:
            with r.cond:
                while not (r.owned and r.items):
                    if self._abandon or peer in self._ended:
                        return
                    r.cond.wait(WAIT_STEP)
            if not self._recv_one(peer):
                return
            with r.cond:
                if not r.items:
                    r.owned = False  # the dispatcher reads this peer's next frame again

    def _next(self, peer: int) -> Tuple[Any, int, Optional[np.ndarray]]:
        """The next message of ``peer``: on the dispatcher the one it routed (a frame read there needs no
        other); on the peer's thread, waited for until the dispatcher routes it."""
        r = self._routed[peer]
        with r.cond:
            while not r.items:
                if threading.current_thread() is self._dispatcher:
                    raise ProtocolError(f"rank {peer} sent a frame that needs more messages than its head")
                if self._abandon:
                    raise TransportError("transport closed")
                r.cond.wait(WAIT_STEP)
            return r.items.popleft()

    def _done(self, req: Any) -> bool:
        """Whether a receive completed (a truncated one, see ``_consume``, completes with an error)."""
        try:
            return req.Test()
        except self._MPI.Exception:
            return True

    def _wait(self, req: Any, buf: np.ndarray) -> None:
        """Wait for a receive the dispatcher started (on the peer's own thread); TransportError at close."""
        poll(lambda: self._done(req) or self._abandon, float('inf'), busy_until=lambda: self._expect)
        if not self._done(req):
            self._orphan([req], [buf])
            raise TransportError("transport closed")

    def _consume(self, msg: Any, count: int) -> None:
        # a receive into a smaller buffer consumes the message (and reports truncation); one that needs its sender
        # to move on first completes whenever that happens, kept alive meanwhile, and holds up nobody
        buf = np.empty(min(count, 1 << 16), dtype=np.uint8)
        req = msg.Irecv([buf, self._MPI.BYTE])
        if not self._done(req):
            self._orphan([req], [buf])

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        msg, count, head = self._next(peer)
        if head is not None:  # read, or being read, by the dispatcher
            if msg is not None:
                self._wait(msg, head)
            return head, count
        if not CTRL <= count <= HEAD:
            self._consume(msg, count)
            raise ProtocolError(f"rank {peer} sent a {count}-byte message where a head (64..{HEAD} bytes) was due")
        buf = np.empty(count, dtype=np.uint8)
        msg.Recv([buf, self._MPI.BYTE])
        return buf, count

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        msg, count, head = self._next(peer)
        if head is not None or count != n:
            if head is None:
                self._consume(msg, count)
            raise ProtocolError(f"rank {peer} sent a {count}-byte message where its frame announced {n} bytes")
        buf = np.empty(n, dtype=np.uint8) if out is None else out
        msg.Recv([buf, self._MPI.BYTE])
        return buf


def _whole(head: np.ndarray) -> bool:
    """Whether the frame this head starts is complete in it: its meta block fits and it has no out-of-line
    parts (so reading it needs no further message)."""
    ctrl = head[:CTRL].view(np.int64)
    return 0 <= ctrl[7] <= HEAD - CTRL and ctrl[6] == 0

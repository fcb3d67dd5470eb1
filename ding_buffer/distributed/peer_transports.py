"""The two point-to-point backends of ``ThreadedTransport``: torch.distributed (gloo) and MPI (mpi4py)."""

import threading
import time
from typing import Any, List, Optional, Tuple

import numpy as np
import torch

from ..errors import ProtocolError, TransportError
from .framing import CTRL, HEAD, TAG
from .poll_wait import poll, precise_sleeps
from .transport import ThreadedTransport


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


EXPECT_WINDOW = 5e-3  # seconds a message from a peer is expected after traffic with it (poll_wait)
SEND_BUSY = 0.05  # seconds a send is polled closely before the pauses grow (the peer is not reading)


# sends abandoned at close or on a broken connection, with their buffers, for the life of the process
_ORPHANED: List[Tuple[List[Any], List[np.ndarray]]] = []


class MPITransport(ThreadedTransport):
    """mpi4py point-to-point over ``COMM_WORLD`` (or a given communicator).

    Receives are sized by a matched probe (``improbe``, polled as ``poll_wait`` says: closely while a message
    is expected, with growing pauses while the peer is idle; a blocking receive would spin a core in Open MPI's
    progress loop), so only the bytes that arrived are read and a message of the wrong size is consumed and
    refused. Sends are ``Isend`` as the frame is queued and ``Test`` on the peer's sender thread; the frame keeps
    the buffer alive until the request completes, and requests abandoned at close keep theirs for the life of
    the process."""

    def __init__(self, peers, allow_pickle, max_message_bytes, grace: float = 5.0, comm=None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        # per peer: until when its receive thread polls closely (a message is expected soon: the peer sent one
        # recently, or one of ours just arrived there), and the event that ends that thread's idle pause
        self._expect = {p: 0.0 for p in peers}
        self._kick = {p: threading.Event() for p in peers}
        self._probing: set = set()  # peers whose receive thread is waiting for a message (poll_wait's pollers)
        super().__init__(peers, allow_pickle, max_message_bytes, grace)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    def _thread_started(self) -> None:
        precise_sleeps()  # this transport's threads poll (poll_wait)

    def _expect_soon(self, peer: int) -> None:
        self._expect[peer] = time.monotonic() + EXPECT_WINDOW
        self._kick[peer].set()

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
        _ORPHANED[:] = [(h, b) for h, b in _ORPHANED if not all(r.Test() for r in h)]
        _ORPHANED.append((list(handles), list(bufs)))

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

        self._probing.add(peer)
        try:
            poll(
                probe,
                float('inf'),
                busy_until=lambda: self._expect[peer],
                kick=self._kick[peer],
                pollers=len(self._probing),
            )
        finally:
            self._probing.discard(peer)
        if not found:
            raise TransportError("transport closed")
        self._expect[peer] = time.monotonic() + EXPECT_WINDOW
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

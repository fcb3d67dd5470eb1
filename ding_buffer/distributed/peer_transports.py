"""The two point-to-point backends of ``ThreadedTransport``: torch.distributed (gloo) and MPI (mpi4py)."""
import time
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch

from .transport import CTRL, HEAD, TAG, ProtocolError, ThreadedTransport, TransportError


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

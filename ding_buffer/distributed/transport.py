"""Point-to-point message transports for the torch (gloo) and MPI backends.

A *message* on the wire is the codec's ``(header, parts)`` framed as:

1. control: ``int64[4] = [MAGIC, header_len, n_parts, body_bytes]``
2. the header bytes, 3. ``int64[n_parts]`` part sizes, 4. every part, cut into pieces of at most ``PIECE`` bytes.

All pieces of one message go to one peer on one tag, so per-pair FIFO order keeps them together. Each peer has
one receive thread that reads whole messages, decodes them (so decoding of different peers overlaps) and puts
them into one inbox queue; ``recv(timeout)`` waits on that queue. That is how every receive gets a timeout:
gloo's own ``wait(timeout)`` closes the connection when it expires, so it cannot be used for polling.

Messages larger than ``max_message_bytes`` are drained into a scratch buffer and reported as an error item
``(request id read from the header, CodecError)``, so the caller can answer with an error instead of
allocating them; undecodable messages are reported the same way. A peer whose connection breaks (gloo) or
who sends garbage is reported once as lost and its thread ends.

Thread-safety: ``send`` holds a per-peer lock (the heartbeat thread and the caller may both send).
"""
import logging
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .codec import CodecError, decode, encode, peek_id

MAGIC = 0x64696E67  # 'ding'
PIECE = 64 << 20  # largest single send/recv; also bounds the scratch buffer used to drain oversized messages
MAX_HEADER = 64 << 20
MAX_PARTS = 1 << 20
TAG = 7

MESSAGE, ERROR, LOST = 'message', 'error', 'lost'

logger = logging.getLogger('ding_buffer.distributed')


class TransportError(RuntimeError):
    """The transport could not deliver or receive a message (peer gone, protocol broken)."""


def _pieces(n: int) -> List[Tuple[int, int]]:
    return [(a, min(a + PIECE, n)) for a in range(0, n, PIECE)]


class ThreadedTransport:
    """
    Overview:
        Framing, receive threads and the inbox shared by the torch and MPI transports; subclasses implement
        ``_send_buf(peer, np_uint8_or_int64)``, ``_recv_buf(peer, n, dtype)`` and ``_wait_arrival(peer)``.
    Interfaces:
        ``start``, ``send``, ``recv``, ``close``, ``rank``, ``world_size``
    """

    def __init__(self, peers: Sequence[int], allow_pickle: bool, max_message_bytes: int,
                 is_final: Callable[[Any], bool]) -> None:
        self.peers = list(peers)
        self.allow_pickle = allow_pickle
        self.max_message_bytes = int(max_message_bytes)
        self._is_final = is_final
        self.inbox: 'queue.Queue[Tuple[int, str, Any]]' = queue.Queue()
        self._send_locks: Dict[int, threading.Lock] = {p: threading.Lock() for p in self.peers}
        self._threads: List[threading.Thread] = []
        self._closed = False
        self.bytes_sent = 0
        self.bytes_received = 0

    # ------------------------------------------------------------------ backend primitives
    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        raise NotImplementedError

    def _recv_buf(self, peer: int, n: int, dtype: Any) -> Any:
        raise NotImplementedError

    def _wait_arrival(self, peer: int) -> None:
        """Block until a new message from ``peer`` starts arriving (the MPI transport polls; gloo blocks)."""

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, obj: Any) -> int:
        """Encode and send ``obj`` to ``peer``; returns the bytes sent. Raises ``TypeError`` for objects the codec
        refuses, ``TransportError`` when the peer is gone."""
        header, parts = encode(obj, self.allow_pickle)
        return self.send_encoded(peer, header, parts)

    def send_encoded(self, peer: int, header: bytes, parts: List[np.ndarray]) -> int:
        sizes = np.array([p.nbytes for p in parts], dtype=np.int64)
        body = int(sizes.sum())
        control = np.array([MAGIC, len(header), len(parts), body], dtype=np.int64)
        with self._send_locks[peer]:
            try:
                self._send_buf(peer, control)
                self._send_buf(peer, np.frombuffer(bytearray(header), dtype=np.uint8))
                if len(parts):
                    self._send_buf(peer, sizes)
                for p in parts:
                    if p.nbytes == 0:
                        continue
                    if not p.flags.writeable:  # torch.from_numpy needs writable memory; only bytes leaves are not
                        p = p.copy()
                    for a, b in _pieces(p.nbytes):
                        self._send_buf(peer, p[a:b])
            except TransportError:
                raise
            except Exception as e:
                raise TransportError(f"sending to rank {peer} failed: {type(e).__name__}: {e}") from e
        n = 32 + len(header) + 8 * len(parts) + body
        self.bytes_sent += n
        return n

    # ------------------------------------------------------------------ receiving
    def start(self) -> None:
        for p in self.peers:
            t = threading.Thread(target=self._recv_loop, args=(p, ), name=f'ding_buffer-recv-{p}', daemon=True)
            t.start()
            self._threads.append(t)

    def _recv_loop(self, peer: int) -> None:
        while not self._closed:
            try:
                self._wait_arrival(peer)
                if self._closed:
                    return
                kind, obj = self._recv_message(peer)
            except Exception as e:  # connection closed, protocol broken
                if not self._closed:
                    self.inbox.put((peer, LOST, f"{type(e).__name__}: {e}"))
                return
            self.inbox.put((peer, kind, obj))
            if kind == MESSAGE and self._is_final(obj):
                return

    def _recv_message(self, peer: int) -> Tuple[str, Any]:
        control = np.asarray(self._recv_buf(peer, 4, np.int64)).copy()
        magic, hlen, nparts, body = (int(v) for v in control)
        if magic != MAGIC:
            raise TransportError(f"rank {peer} sent a message without the ding_buffer magic ({magic:#x}); "
                                 f"is it running another protocol?")
        if not (0 < hlen <= MAX_HEADER and 0 <= nparts <= MAX_PARTS and body >= 0):
            raise TransportError(f"rank {peer} sent a bad control block {control.tolist()}")
        header = bytes(np.asarray(self._recv_buf(peer, hlen, np.uint8)))
        sizes = np.asarray(self._recv_buf(peer, nparts, np.int64)).copy() if nparts else np.zeros(0, np.int64)
        if (sizes < 0).any() or int(sizes.sum()) != body:
            raise TransportError(f"rank {peer} sent part sizes that do not add up to {body}")
        total = 32 + hlen + 8 * nparts + body
        self.bytes_received += total
        if total > self.max_message_bytes:
            for s in sizes.tolist():
                for a, b in _pieces(s):
                    self._recv_buf(peer, b - a, np.uint8)  # drain: the bytes are on the wire already
            return ERROR, (peek_id(header), CodecError(f"message of {total} bytes exceeds distributed.max_message_mb "
                                                       f"({self.max_message_bytes} bytes)"))
        parts = []
        for s in sizes.tolist():
            buf = self._alloc(s)
            for a, b in _pieces(s):
                self._recv_into(peer, buf, a, b)
            parts.append(buf)
        try:
            return MESSAGE, decode(header, parts, self.allow_pickle)
        except CodecError as e:
            return ERROR, (peek_id(header), e)

    def _alloc(self, n: int) -> Any:
        return np.empty(n, dtype=np.uint8)

    def _recv_into(self, peer: int, buf: Any, a: int, b: int) -> None:
        raise NotImplementedError

    def recv(self, timeout: Optional[float]) -> Optional[Tuple[int, str, Any]]:
        """Next ``(peer, kind, obj)`` from any peer, or ``None`` after ``timeout`` seconds."""
        try:
            return self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop accepting messages; receive threads are daemons and end with their connection or the process."""
        self._closed = True


class TorchTransport(ThreadedTransport):
    """torch.distributed point-to-point (gloo). The process group must be initialised (``init_torch``)."""

    def __init__(self, peers, allow_pickle, max_message_bytes, is_final, group=None) -> None:
        import torch.distributed as dist
        self._dist = dist
        self._group = group
        super().__init__(peers, allow_pickle, max_message_bytes, is_final)

    @property
    def rank(self) -> int:
        return self._dist.get_rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        self._dist.send(torch.from_numpy(buf), dst=peer, tag=TAG, group=self._group)

    def _recv_buf(self, peer: int, n: int, dtype: Any) -> Any:
        t = torch.empty(n, dtype=torch.int64 if dtype == np.int64 else torch.uint8)
        self._dist.recv(t, src=peer, tag=TAG, group=self._group)
        return t.numpy()

    def _alloc(self, n: int) -> Any:
        return torch.empty(n, dtype=torch.uint8)  # decoded tensors are views of it: no copy after the wire

    def _recv_into(self, peer: int, buf: Any, a: int, b: int) -> None:
        self._dist.recv(buf[a:b], src=peer, tag=TAG, group=self._group)


class MPITransport(ThreadedTransport):
    """mpi4py point-to-point over ``COMM_WORLD`` (or a given communicator).

    Waiting for the start of a message polls ``Iprobe`` with a short sleep: a blocking ``Recv`` would spin a
    core in Open MPI's progress loop for as long as the peer is idle. Sends are ``Isend`` + ``Test`` with
    ``send_timeout`` so a dead peer cannot block the sender forever."""

    def __init__(self, peers, allow_pickle, max_message_bytes, is_final, comm=None, send_timeout=60.0) -> None:
        from mpi4py import MPI
        self._MPI = MPI
        self._comm = comm if comm is not None else MPI.COMM_WORLD
        self._send_timeout = send_timeout
        super().__init__(peers, allow_pickle, max_message_bytes, is_final)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        req = self._comm.Isend([buf, self._MPI.BYTE], dest=peer, tag=TAG)
        if req.Test():
            return
        deadline = time.monotonic() + self._send_timeout
        pause = 1e-5
        while not req.Test():
            if time.monotonic() > deadline:
                raise TransportError(f"send to rank {peer} did not complete within {self._send_timeout}s "
                                     f"(distributed.timeout); is it alive?")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def _wait_arrival(self, peer: int) -> None:
        pause = 2e-5
        while not self._closed and not self._comm.Iprobe(source=peer, tag=TAG):
            time.sleep(pause)
            pause = min(pause * 1.5, 2e-3)

    def _recv_buf(self, peer: int, n: int, dtype: Any) -> Any:
        a = np.empty(n, dtype=dtype)
        self._comm.Recv([a, self._MPI.BYTE], source=peer, tag=TAG)
        return a

    def _recv_into(self, peer: int, buf: Any, a: int, b: int) -> None:
        self._comm.Recv([buf[a:b], self._MPI.BYTE], source=peer, tag=TAG)


def init_torch(timeout_s: float) -> Tuple[int, int]:
    """Join (or reuse) the default gloo process group from torchrun's / SLURM-style env variables."""
    import datetime
    import torch.distributed as dist
    if not dist.is_available():
        raise RuntimeError("distributed.backend='torch' needs torch.distributed, which this torch build lacks")
    if not dist.is_initialized():
        # A long group timeout: gloo closes every connection when one of its own waits expires, and the
        # manager may legitimately wait for hours between pushes. Our timeouts live in the inbox instead.
        dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=max(timeout_s, 7 * 24 * 3600)))
    elif dist.get_backend() != 'gloo':
        raise ValueError(f"distributed.backend='torch' needs a gloo process group, the default group uses "
                         f"{dist.get_backend()!r}; create a gloo group for the buffer")
    return dist.get_rank(), dist.get_world_size()


def init_mpi() -> Tuple[int, int]:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("distributed.backend='mpi' needs mpi4py (pip install 'ding_buffer[mpi]', and Open MPI: "
                          "apt-get install openmpi-bin libopenmpi-dev)") from e
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("distributed.backend='mpi' needs MPI_THREAD_MULTIPLE (mpi4py's default thread level)")
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

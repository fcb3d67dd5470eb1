"""Point-to-point message transports for the torch (gloo) and MPI backends.

A *message* on the wire is the codec's ``(header, parts)`` framed as:

1. one *head* of at most ``HEAD`` bytes (receivers post a ``HEAD``-byte buffer; gloo and MPI both accept a
   shorter message): ``int64[6] = [MAGIC, header_len, n_parts, body_bytes, meta_len, 0]`` followed by the
   *meta* block: ``int64[2 * n_parts]`` (size, inline offset or -1 of each part), the header, then the parts
   of at most ``INLINE`` bytes copied in (16-byte aligned) while the head has room;
2. the rest of the meta block, only when it does not fit in the head;
3. every other part, cut into pieces of at most ``PIECE`` bytes, sent from the tensor's own memory.

So a small request or reply is one message, and a push of one large tensor two. All pieces of one message go
to one peer on one tag, so per-pair FIFO order keeps them together. Each peer has one receive thread that reads
whole messages, decodes them (decoding of different peers overlaps) and puts them into one inbox queue;
``recv(timeout)`` waits on that queue. That is how every receive gets a timeout: gloo's own
``wait(timeout)`` closes the connection when it expires, so it cannot be used for polling.

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
HEAD = 256 << 10  # capacity of the first message of every frame (each costs a rendezvous in gloo)
INLINE = 128 << 10  # parts up to this size travel inside the head (a copy is cheaper than a message)
PIECE = 64 << 20  # largest single send/recv of a part; also bounds the scratch buffer used to drain
MAX_META = 64 << 20
MAX_PARTS = 1 << 20
TAG = 7

MESSAGE, ERROR, LOST = 'message', 'error', 'lost'

logger = logging.getLogger('ding_buffer.distributed')


class TransportError(RuntimeError):
    """The transport could not deliver or receive a message (peer gone, protocol broken)."""


def _pieces(n: int) -> List[Tuple[int, int]]:
    return [(a, min(a + PIECE, n)) for a in range(0, n, PIECE)]


def _pad16(n: int) -> int:
    return (n + 15) & ~15


def frame(header: bytes, parts: List[np.ndarray]) -> Tuple[np.ndarray, Optional[np.ndarray], List[np.ndarray], int]:
    """``(head, extra meta or None, out-of-line parts, total bytes)`` for one message."""
    n = len(parts)
    table = np.empty(2 * n, dtype=np.int64)
    inline = []
    off = _pad16(16 * n + len(header))
    for i, p in enumerate(parts):
        table[2 * i] = p.nbytes
        if p.nbytes <= INLINE and 48 + _pad16(off + p.nbytes) <= HEAD:
            table[2 * i + 1] = off
            inline.append((off, p))
            off = _pad16(off + p.nbytes)
        else:
            table[2 * i + 1] = -1
    body = int(table[0::2].sum()) if n else 0
    # control + meta in one buffer, so inline parts are copied once; the head and the overflow are views of it
    buf = np.zeros(48 + off, dtype=np.uint8)
    buf[:48].view(np.int64)[:] = (MAGIC, len(header), n, body, off, 0)
    meta = buf[48:]
    meta[:16 * n] = table.view(np.uint8)
    meta[16 * n:16 * n + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for o, p in inline:
        meta[o:o + p.nbytes] = p
    head = buf[:HEAD]
    extra = buf[HEAD:] if len(buf) > HEAD else None
    out = [p for i, p in enumerate(parts) if table[2 * i + 1] < 0]
    return head, extra, out, len(head) + (0 if extra is None else len(extra)) + sum(p.nbytes for p in out)


class ThreadedTransport:
    """
    Overview:
        Framing, receive threads and the inbox shared by the torch and MPI transports; subclasses implement
        ``_send_buf(peer, uint8 array)``, ``_alloc(n)``, ``_recv_into(peer, buf, a, b)`` and ``_wait_arrival(peer)``.
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
        # optional ``(peer, kind, obj) -> None`` run on the receive thread instead of queueing (lost peers are
        # always queued): the manager serves requests there, saving a thread hand-off per request
        self.on_item: Optional[Callable[[int, str, Any], None]] = None
        self.bytes_sent = 0
        self.bytes_received = 0

    # ------------------------------------------------------------------ backend primitives
    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        raise NotImplementedError

    def _recv_buf(self, peer: int, n: int) -> Any:
        """Receive ``n`` bytes into a new buffer (``_alloc``)."""
        buf = self._alloc(n)
        self._recv_into(peer, buf, 0, n)
        return buf

    def _wait_arrival(self, peer: int) -> None:
        """Block until a new message from ``peer`` starts arriving (the MPI transport polls; gloo blocks)."""

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, obj: Any) -> int:
        """Encode and send ``obj`` to ``peer``; returns the bytes sent. Raises ``TypeError`` for objects the codec
        refuses, ``TransportError`` when the peer is gone."""
        header, parts = encode(obj, self.allow_pickle)
        return self.send_encoded(peer, header, parts)

    def send_encoded(self, peer: int, header: bytes, parts: List[np.ndarray]) -> int:
        head, extra, out, n = frame(header, parts)
        with self._send_locks[peer]:
            try:
                self._send_buf(peer, head)
                if extra is not None:
                    self._send_buf(peer, extra)
                for p in out:
                    if not p.flags.writeable:  # torch.from_numpy needs writable memory; only bytes leaves are not
                        p = p.copy()
                    for a, b in _pieces(p.nbytes):
                        self._send_buf(peer, p[a:b])
            except TransportError:
                raise
            except Exception as e:
                raise TransportError(f"sending to rank {peer} failed: {type(e).__name__}: {e}") from e
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
            if self.on_item is not None:
                try:
                    self.on_item(peer, kind, obj)
                except Exception as e:  # the handler must not die silently with the thread
                    self.inbox.put((peer, LOST, f"serving it failed: {type(e).__name__}: {e}"))
                    return
            else:
                self.inbox.put((peer, kind, obj))
            if kind == MESSAGE and self._is_final(obj):
                return

    def _recv_message(self, peer: int) -> Tuple[str, Any]:
        head = self._recv_buf(peer, HEAD)
        magic, hlen, nparts, body, mlen, _ = (int(v) for v in np.asarray(head)[:48].view(np.int64))
        if magic != MAGIC:
            raise TransportError(f"rank {peer} sent a message without the ding_buffer magic ({magic:#x}); "
                                 f"is it running another protocol?")
        if not (0 < hlen and 0 <= nparts <= MAX_PARTS and body >= 0 and 16 * nparts + hlen <= mlen <= MAX_META):
            raise TransportError(f"rank {peer} sent a bad control block {[magic, hlen, nparts, body, mlen]}")
        room = HEAD - 48
        if mlen <= room:
            meta = head[48:48 + mlen]  # a view: inline parts decode without a copy (a fresh head per message)
        else:
            meta = self._alloc(mlen)
            meta[:room] = head[48:]
            self._recv_into(peer, meta, room, mlen)
        m = np.asarray(meta)
        table = m[:16 * nparts].copy().view(np.int64).reshape(-1, 2) if nparts else np.zeros((0, 2), np.int64)
        header = m[16 * nparts:16 * nparts + hlen].tobytes()
        sizes, offs = table[:, 0], table[:, 1]
        if (sizes < 0).any() or int(sizes.sum()) != body or ((offs >= 0) & (offs + sizes > mlen)).any():
            raise TransportError(f"rank {peer} sent a part table that does not match its sizes")
        total = 48 + mlen + int(sizes[offs < 0].sum())
        self.bytes_received += total
        if total > self.max_message_bytes:
            for s in sizes[offs < 0].tolist():
                for a, b in _pieces(s):
                    self._recv_buf(peer, b - a)  # drain: the bytes are on the wire already
            return ERROR, (peek_id(header), CodecError(f"message of {total} bytes exceeds distributed.max_message_mb "
                                                       f"({self.max_message_bytes} bytes)"))
        parts = []
        for s, o in table.tolist():
            if o >= 0:
                parts.append(meta[o:o + s])
                continue
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
    """torch.distributed point-to-point (gloo). The process group must be initialised (``init_torch``).
    Calls go straight to the process group object: ``dist.send``'s Python wrapper costs more than a small
    message on loopback."""

    def __init__(self, peers, allow_pickle, max_message_bytes, is_final, group=None) -> None:
        import torch.distributed as dist
        self._dist = dist
        self._pg = group if group is not None else dist.distributed_c10d._get_default_group()
        super().__init__(peers, allow_pickle, max_message_bytes, is_final)

    @property
    def rank(self) -> int:
        return self._pg.rank()

    def _send_buf(self, peer: int, buf: np.ndarray) -> None:
        self._pg.send([torch.from_numpy(buf)], peer, TAG).wait()

    def _alloc(self, n: int) -> Any:
        return torch.empty(n, dtype=torch.uint8)  # decoded tensors are views of it: no copy after the wire

    def _recv_into(self, peer: int, buf: Any, a: int, b: int) -> None:
        self._pg.recv([buf[a:b]], peer, TAG).wait()


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

    Waiting for the start of a message polls ``Iprobe`` (briefly back to back, then with sleeps): a blocking
    ``Recv`` would spin a core in Open MPI's progress loop for as long as the peer is idle. Sends are
    ``Isend`` + ``Test`` with ``send_timeout`` so a dead peer cannot block the sender forever."""

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
        if not _spin_then_sleep(req.Test, time.monotonic() + self._send_timeout, spin=0.05):
            raise TransportError(f"send to rank {peer} did not complete within {self._send_timeout}s "
                                 f"(distributed.timeout); is it alive?")

    def _wait_arrival(self, peer: int) -> None:
        probe = lambda: self._closed or self._comm.Iprobe(source=peer, tag=TAG)  # noqa: E731
        _spin_then_sleep(probe, float("inf"), spin=3e-4)

    def _alloc(self, n: int) -> Any:
        return np.empty(n, dtype=np.uint8)

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

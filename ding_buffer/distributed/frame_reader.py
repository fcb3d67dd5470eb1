"""Reading one message of the torch / MPI transports off the wire: the inverse of ``framing.frame``.

Every length is checked before it reaches a receive: the control block must be self-consistent, parts must add
up, and nothing past ``max_message_bytes`` is allocated -- an oversized frame is drained piece by piece and
reported as ``(ERROR, (id, CodecError))``, and memory is allocated one piece at a time as the data arrives. MPI
receives are sized by a matched probe, so only the bytes that arrived are used and a message of the wrong size
is consumed and refused; gloo receives land in zeroed buffers, or in a recycled buffer of the same peer's
earlier message (``recv_pool``), so a short message can only ever be read together with zeros or with bytes
that peer sent before, never another peer's. A message that breaks the framing raises ``ProtocolError``
(answered with an error by the transport) and the next message is read as a new head (the stream resynchronises on
message boundaries). The
one thing no receiver can survive is gloo's own check: a single gloo message longer than the receive posted
for it (a head over ``HEAD`` bytes, or a piece longer than its head declared) aborts the receiving process
inside gloo. ding_buffer's senders never produce one; a peer that bypasses them can, which is why the torch
backend, like gloo, assumes the ranks of the job trust each other.
"""

from typing import Any, List, Optional, Tuple

import numpy as np

from ..errors import CodecError, ProtocolError
from .codec import decode
from .framing import CTRL, DATA, GOODBYE, HEAD, MAGIC, MAX_HEADER, MAX_META, MAX_PARTS, pieces, table_ok
from .recv_pool import RecvPool

# the kinds a transport's receive side reports, in its inbox and to ``on_item``
MESSAGE, ERROR, LOST, BYE = 'message', 'error', 'lost', 'bye'


class FrameReader:
    """
    Overview:
        The receive half of ``ThreadedTransport``: ``_recv_message(peer)`` reads and checks one whole message
        and returns ``(MESSAGE, obj)``, ``(ERROR, (id, CodecError))`` or ``(BYE, None)``, raising
        ``ProtocolError`` for a message that breaks the framing. Subclasses implement the blocking receives
        ``_recv_head(peer) -> (buf, count or None)`` and ``_recv_exact(peer, n, out) -> buf`` and set
        ``allow_pickle``, ``max_message_bytes`` and ``bytes_received`` (counted as the bytes arrive).
    Interfaces:
        ``_recv_message``
    Thread-safety:
        ``_recv_message`` runs on the peer's own receive thread, one message at a time.
    """

    allow_pickle: bool
    max_message_bytes: int
    bytes_received: int

    def _recv_head(self, peer: int) -> Tuple[Any, Optional[int]]:
        raise NotImplementedError

    def _recv_exact(self, peer: int, n: int, out: Optional[np.ndarray] = None) -> Any:
        """The next message, expected to be ``n`` bytes, into ``out`` (a uint8 view of ``n`` bytes) or a new
        buffer; returns the buffer."""
        raise NotImplementedError

    @property
    def recv_buffers_reused(self) -> int:
        """Large parts received into a warm buffer of an earlier message (``recv_pool``), over all peers."""
        return sum(p.hits for p in list(self.__dict__.get('_recv_pools', {}).values()))

    def _pool(self, peer: int) -> RecvPool:
        pools = self.__dict__.setdefault('_recv_pools', {})
        if peer not in pools:
            pools[peer] = RecvPool()
        return pools[peer]

    def _recv_message(self, peer: int) -> Tuple[str, Any]:
        head, count = self._recv_head(peer)
        h = np.asarray(head)
        if (count if count is not None else len(h)) < CTRL:
            raise ProtocolError(f"rank {peer} sent a {count}-byte message, shorter than a control block")
        magic, kind, mid, hbytes, hlen, nparts, body, mlen = h[:CTRL].view(np.int64).tolist()  # Python ints
        if magic != MAGIC:
            raise ProtocolError(f"rank {peer} sent a message without the ding_buffer magic ({magic & (2**64 - 1):#x})")
        mid = mid if mid >= 0 else None
        if kind == GOODBYE:
            return BYE, None
        in_head = min(mlen, HEAD - CTRL)
        if not (
            kind == DATA
            and 0 < hlen
            and 0 <= nparts <= MAX_PARTS
            and 0 <= body
            and 16 * nparts + hlen <= mlen <= MAX_META
            and hbytes == CTRL + in_head
            and (count is None or count == hbytes)
        ):
            raise ProtocolError(
                f"rank {peer} sent a bad control block {[kind, hbytes, hlen, nparts, body, mlen]} "
                f"({count} bytes arrived)",
                mid,
            )
        self.bytes_received += hbytes
        try:
            return self._recv_body(peer, h, mid, hlen, nparts, body, mlen, in_head)
        except ProtocolError as e:
            e.msg_id = mid if e.msg_id is None else e.msg_id
            raise

    def _recv_body(
        self, peer: int, h: np.ndarray, mid: Optional[int], hlen: int, nparts: int, body: int, mlen: int, in_head: int
    ) -> Tuple[str, Any]:
        if mlen <= in_head:
            meta = h[CTRL : CTRL + mlen]
        else:  # the rest of the meta block is one message (at most MAX_META bytes)
            meta = np.zeros(mlen, dtype=np.uint8)
            meta[:in_head] = h[CTRL : CTRL + in_head]
            self._recv_exact(peer, mlen - in_head, out=meta[in_head:])
            self.bytes_received += mlen - in_head
        first = 16 * nparts + hlen
        table = meta[: 16 * nparts].copy().view(np.int64).reshape(-1, 2).tolist()  # Python ints: no overflow
        if not table_ok(table, first, mlen, body):
            # the pieces it announces cannot be trusted either: the next message is read as a new head
            raise ProtocolError(f"rank {peer} sent a part table that does not match its sizes", mid)
        header = meta[16 * nparts : first].tobytes()
        if CTRL + mlen + body > self.max_message_bytes or hlen > MAX_HEADER:
            for s, o in table:  # drain: the bytes are on the wire already
                for a, b in pieces(s if o < 0 else 0):
                    self._recv_exact(peer, b - a)
                    self.bytes_received += b - a
            what = (
                f"message of {CTRL + mlen + body} bytes exceeds distributed.max_message_mb "
                f"({self.max_message_bytes} bytes)"
                if hlen <= MAX_HEADER
                else f"message header of {hlen} bytes exceeds {MAX_HEADER} bytes (many small leaves: send one "
                f"batched dict of tensors instead of a list of items)"
            )
            return ERROR, (mid, CodecError(what))
        parts = self._recv_parts(peer, meta, table)
        try:
            return MESSAGE, decode(header, parts, self.allow_pickle)
        except CodecError as e:
            return ERROR, (mid, e)

    def _recv_parts(self, peer: int, meta: np.ndarray, table: List[List[int]]) -> List[np.ndarray]:
        """The parts of a checked table: inline ones copied out of the meta block, the others received piece by
        piece into recycled or newly allocated memory."""
        parts = []
        pool = self._pool(peer)
        for s, o in table:
            if o >= 0:
                parts.append(meta[o : o + s].copy())  # owned: decoded tensors never share one buffer
                continue
            part = pool.take(s)  # warm memory of an earlier part of this size that nothing holds any more
            for a, b in pieces(s):
                if part is None:  # allocated once its first piece has arrived: memory follows the data
                    first_piece = np.asarray(self._recv_exact(peer, b - a))
                    if b == s:
                        part = first_piece
                        pool.keep(part)
                        self.bytes_received += b - a
                        break
                    part = np.zeros(s, dtype=np.uint8)  # calloc: pages are not touched until written
                    part[a:b] = first_piece.reshape(-1)
                    del first_piece
                    pool.keep(part)
                else:
                    self._recv_exact(peer, b - a, out=part[a:b])
                self.bytes_received += b - a
            parts.append(part.reshape(-1) if part is not None else np.empty(0, np.uint8))
        return parts

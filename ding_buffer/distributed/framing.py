"""The frame layout of the torch / MPI transports: a 64-byte control block, the meta block (part table, JSON
header, small parts inline) and out-of-line parts cut into pieces; ``frame`` builds one, ``table_ok`` checks a
received part table with Python integers."""

from typing import List, Optional, Tuple

import numpy as np

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


def pieces(n: int):
    """``(start, end)`` of each piece of an ``n``-byte part (a generator: ``n`` may be a hostile 2**62)."""
    return ((a, min(a + PIECE, n)) for a in range(0, n, PIECE))


def table_ok(table: List[List[int]], first: int, mlen: int, body: int) -> bool:
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


def pad16(n: int) -> int:
    return (n + 15) & ~15


def frame(
    header: bytes, parts: List[np.ndarray], msg_id: int = -1, kind: int = DATA
) -> Tuple[np.ndarray, Optional[np.ndarray], List[np.ndarray], int]:
    """``(head, extra meta or None, out-of-line parts, total bytes)`` for one message."""
    n = len(parts)
    table = np.empty(2 * n, dtype=np.int64)
    inline = []
    off = pad16(16 * n + len(header))
    for i, p in enumerate(parts):
        table[2 * i] = p.nbytes
        if p.nbytes <= INLINE and CTRL + pad16(off + p.nbytes) <= HEAD:
            table[2 * i + 1] = off
            inline.append((off, p))
            off = pad16(off + p.nbytes)
        else:
            table[2 * i + 1] = -1
    out = [p for i, p in enumerate(parts) if table[2 * i + 1] < 0]
    body = sum(p.nbytes for p in out)
    in_head = min(off, HEAD - CTRL)
    # control + meta in one buffer, so inline parts are copied once; the head and the overflow are views of it
    buf = np.zeros(CTRL + off, dtype=np.uint8)
    buf[:CTRL].view(np.int64)[:] = (MAGIC, kind, msg_id, CTRL + in_head, len(header), n, body, off)
    meta = buf[CTRL:]
    meta[: 16 * n] = table.view(np.uint8)
    meta[16 * n : 16 * n + len(header)] = np.frombuffer(header, dtype=np.uint8)
    for o, p in inline:
        meta[o : o + p.nbytes] = p
    head = buf[: CTRL + in_head]
    extra = buf[CTRL + in_head :] if off > in_head else None
    return head, extra, out, len(buf) + body

"""``RecvPool``: receive buffers a peer's large parts land in, recycled once nothing holds them any more.

A fresh multi-megabyte buffer costs a page fault per 4 KiB page (and the kernel zeroing each page) on its first
write, which at 5 MB is as much time as the copy itself. A transport's receive thread keeps the buffers of its
peer's recent large parts here and reuses one for a part of the same size once every view of it is gone: the
manager's handler copies a push into the buffer's storage and drops the message, so the next push of the same
size lands in warm memory. A part that something still references (a list storage holding the decoded tensors,
a reply a caller has not read yet) is never reused: the pool checks the buffer's reference count, which every
numpy view and every tensor made over it keeps raised. Bytes a short gloo message leaves in a reused buffer come
from the same peer's earlier message (one pool per peer), never from another peer's. Only sizes that recur are
kept (a size missed twice among the last ``RECENT`` misses), so a peer whose parts vary in size pins nothing.
"""

import sys
from collections import deque
from typing import List, Optional

import numpy as np

MIN_PART = 64 << 10  # smaller parts are cheap to allocate (and mostly travel inline in the head)
MAX_PART = 64 << 20  # larger parts are not kept between messages
MAX_BUFFERS = 4
MAX_BYTES = 64 << 20  # per peer
RECENT = 8


class RecvPool:
    """
    Overview:
        Up to ``MAX_BUFFERS`` buffers (``MAX_BYTES`` in all) of one peer's recent parts. ``take(n)`` returns one
        of exactly ``n`` bytes that nothing else references, or None; ``keep(buf)`` adds a freshly allocated one
        when its size recurs (the oldest are let go past the limits).
    Thread-safety:
        One pool per peer, used only by that peer's receive thread.
    """

    def __init__(self) -> None:
        self._bufs: List[np.ndarray] = []
        self._missed: 'deque[int]' = deque(maxlen=RECENT)  # sizes of the latest misses
        self.hits = 0

    def take(self, n: int) -> Optional[np.ndarray]:
        if not MIN_PART <= n <= MAX_PART:
            return None
        for i in range(len(self._bufs)):
            # 2 references: the list's and getrefcount's argument; any view or tensor over it adds one
            if self._bufs[i].nbytes == n and sys.getrefcount(self._bufs[i]) == 2:
                self.hits += 1
                buf = self._bufs.pop(i)
                self._bufs.append(buf)  # most recently used last
                return buf
        self._missed.append(n)
        return None

    def keep(self, buf: np.ndarray) -> None:
        if not MIN_PART <= buf.nbytes <= MAX_PART or buf.base is not None or self._missed.count(buf.nbytes) < 2:
            return
        self._bufs.append(buf)
        while len(self._bufs) > MAX_BUFFERS or sum(b.nbytes for b in self._bufs) > MAX_BYTES:
            self._bufs.pop(0)

    def clear(self) -> None:
        self._bufs.clear()

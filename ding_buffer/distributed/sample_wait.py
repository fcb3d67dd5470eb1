"""A client-side ``sample(..., timeout=t)``: re-ask until a batch comes or ``t`` seconds pass. The manager never
blocks on a sample (it answers None while too few items are stored), so waiting is the client's job; the
``RemoteBuffer`` and the sharded client share this loop."""

import time
from typing import Any, Callable, Optional

from ..buffers.common import LOCK_GRACE
from ..errors import SampleTimeoutError

FIRST_PAUSE, MAX_PAUSE = 0.001, 0.05  # seconds between two asks: doubling from / to


def poll_for_batch(attempt: Callable[[float], Optional[Any]], size: int, timeout: float, who: str) -> Any:
    """
    Overview:
        Call ``attempt(left)`` (``left``: seconds until the deadline, > 0; at least ``LOCK_GRACE`` for the first
        call, which is always made, as a local buffer's ``timeout=0`` draws when it can) until it returns a batch
        (not None); between two calls pause 1 ms, doubling up to 50 ms (never past the deadline). Raises
        ``SampleTimeoutError`` naming ``who`` and ``size`` once ``timeout`` seconds passed. ``attempt`` bounds
        its own wait by ``left``.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    left = max(timeout, LOCK_GRACE)  # the first ask, always made (``timeout=0`` too), gets what a local lock wait gets
    while True:
        out = attempt(left)
        if out is not None:
            return out
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(pause * 2, MAX_PAUSE)
        left = deadline - time.monotonic()
        if left <= 0:
            raise SampleTimeoutError(f"{who} could not sample {size} items within {timeout}s")

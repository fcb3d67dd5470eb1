"""Waiting on MPI without a blocking call: MPI has no receive or send completion with a timeout, and a blocking
one spins a core inside Open MPI's progress loop for as long as the peer is silent, so the MPI transport polls.

The policy trades wake-up latency against CPU by what is expected: a few tens of microseconds back to back
(a reply to a small request is often there by then), then short sleeps of ~30 us while a message is expected
soon (the peer was active, or we just sent it something), then pauses growing to 1 ms while the peer is idle;
an event ends such a pause at once when this side sends. ``time.sleep(0)`` is never used: with Linux's default
50 us timer slack it sleeps 50-80 us; the polling threads set their own timer slack to 1 us
(``precise_sleeps``), so a 10 us sleep costs ~30 us instead of ~100 us.
"""

import ctypes
import os
import sys
import threading
import time
from typing import Callable, Optional

SPIN = 5e-5  # seconds of back-to-back polls before sleeping
FAST_PAUSE = 1e-5  # sleep between polls while a message is expected
IDLE_FIRST, IDLE_MAX = 2e-5, 1e-3  # pauses while the peer is idle grow from / to
PR_SET_TIMERSLACK = 29

_libc = None
_yield = getattr(os, 'sched_yield', None) or (lambda: time.sleep(0))  # (no sched_yield on Windows)


def precise_sleeps() -> None:
    """Set the calling thread's timer slack to 1 us (Linux; elsewhere, or if it fails, nothing happens)."""
    global _libc
    if not sys.platform.startswith('linux'):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def poll(
    done: Callable[[], bool],
    deadline: float,
    busy_until: Optional[Callable[[], float]] = None,
    kick: Optional[threading.Event] = None,
    spin: float = SPIN,
) -> bool:
    """
    Overview:
        Call ``done()`` until it returns True (then True) or ``deadline`` (a ``time.monotonic()`` value) passes
        (then False). Back to back for ``spin`` seconds, yielding the core between calls; then every
        ``FAST_PAUSE`` while ``time.monotonic() < busy_until()``; then with
        pauses growing from ``IDLE_FIRST`` to ``IDLE_MAX``. Setting ``kick`` ends an idle pause and starts over
        from the back-to-back polls.
    """
    while True:
        now = time.monotonic()
        end_spin = now + spin
        while now < end_spin:
            if done():
                return True
            _yield()  # releases the GIL and lets another runnable process have the core
            now = time.monotonic()
        while busy_until is not None and now < busy_until():
            if done():
                return True
            if now > deadline:
                return False
            time.sleep(FAST_PAUSE)
            now = time.monotonic()
        pause = IDLE_FIRST
        while True:
            if done():
                return True
            if time.monotonic() > deadline:
                return False
            if kick is not None:
                if kick.wait(pause):
                    kick.clear()
                    break
            else:
                time.sleep(pause)
            pause = min(pause * 1.5, IDLE_MAX)

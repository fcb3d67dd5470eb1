"""``RateLimiter``: when a push or a sample may happen -- DI-engine's thruput controller plus the minimum-size rule,
and the blocking wait of ``sample(timeout=...)``.

One part with one job, shared by every preset: the decayed push / sample ratio (``ThruputController``), the rule
"sample only while ``count >= sample_min_limit_ratio * batch``" and a condition variable on the buffer's lock, so
a sampler waiting for data is woken by each push (and polls every 50 ms, because rate limits also change with
time as the counters decay). Config section (``thruput_controller``):

* ``push_sample_rate_limit=dict(max=inf, min=0.0)`` -- allowed range of pushed / sampled items;
* ``window_seconds=30.0`` -- the counters decay by x0.01 over this many seconds;
* ``sample_min_limit_ratio`` -- 1.0 on ``advanced`` (DI-engine); 0.0 elsewhere (the preset's own rule applies).

**It never stalls.** DI-engine's two ratio rules can refuse a push *and* a sample at the same time -- with
``min`` close to ``max`` (say 1.0 / 1.0, pushes of 8, samples of 32), once the ratio sits between what one
push and one sample would make it, every push and every sample is refused forever (decay scales both counters
alike, so time does not help). Here a call that the ratio refuses goes through when the other kind of call
would be refused too (the other kind judged at its last size, a sample also by the minimum-size rule and by the
table's own shortfall, e.g. fewer items than a draw without replacement needs): then the limiter lets the one
that is asked make progress, so from every state a push or a sample is possible.
Pushes are never refused while the buffer holds too little to sample.

Not thread-safe on its own: every verb runs under the buffer's lock (``wait`` releases it while waiting).
"""

import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..config import INF, as_float
from ..errors import SampleTimeoutError
from .thruput import ThruputController


def limiter_config(min_ratio: float) -> Dict[str, Any]:
    """The ``thruput_controller`` default section of a preset (the keys of the module docstring; ``min_ratio``: its
    ``sample_min_limit_ratio``)."""
    return dict(push_sample_rate_limit=dict(max=INF, min=0.0), window_seconds=30.0, sample_min_limit_ratio=min_ratio)


def limiter_checks(least: float) -> Dict[str, Tuple[Callable[[Any], bool], str]]:
    """Value checks of the section; ``least`` is the smallest ``sample_min_limit_ratio`` the preset accepts."""
    return {
        # (inf is refused too: no sample could ever be drawn)
        'thruput_controller.sample_min_limit_ratio': (lambda x: least <= as_float(x) < INF, f'a number >= {least:g}'),
    }


class RateLimiter:
    """
    Overview:
        The push / sample gate of a buffer (see the module docstring); ``cfg`` is a ``thruput_controller``
        section, ``lock`` the buffer's lock.
    Examples:
        >>> lim = RateLimiter(limiter_config(min_ratio=1.0), threading.RLock())  # advanced's minimum-size rule
        >>> lim.why_not(count=3, size=4)
        '3 items < sample_min_limit_ratio 1 x batch 4'
        >>> lim.why_not(count=4, size=4), lim.can_push(8, count=4)  # '': allowed; the ratio is unlimited
        ('', (True, ''))
    """

    def __init__(self, cfg: Mapping, lock: threading.RLock) -> None:
        self.min_ratio = float(cfg['sample_min_limit_ratio'])
        self._cfg = cfg
        self.thruput = ThruputController(cfg)
        self._cond = threading.Condition(lock)
        self.waiting = 0  # samplers inside ``wait``: a push notifies only when someone listens (hot path)
        # Whether the push / sample ratio is limited (the defaults allow everything); a plain attribute, read on
        # every push, and ``checks``: whether a sample needs ``why_not`` at all.
        self.active = self.thruput.active
        self.checks = self.active or self.min_ratio > 0
        self._last_push, self._last_sample = 1, 1  # sizes the other side is judged at (never-stall rule)
        self._shortfall: Optional[Callable[[], str]] = None  # the last sample's table rules (never-stall rule)

    # ------------------------------------------------------------------ push
    def can_push(self, n: int, count: int) -> Tuple[bool, str]:
        """Whether ``n`` elements may be pushed now into a table of ``count`` (ratio rule; never a stall)."""
        self._last_push = n
        ok, why = self.thruput.can_push(n)
        if ok or self._sample_blocked(count, self._last_sample):
            return True, ''
        return ok, why

    def _sample_blocked(self, count: int, size: int) -> bool:
        """Whether a sample of ``size`` would be refused: nothing or too little stored (the table's own shortfall
        at the last sample, e.g. fewer items than a draw without replacement needs), or the ratio."""
        short = self._shortfall is not None and bool(self._shortfall())  # (asked now: pushes since may have served it)
        return count == 0 or short or count / size < self.min_ratio or not self.thruput.can_sample(size)[0]

    def on_push(self, n: int) -> None:
        """Count ``n`` pushed elements and wake waiting samplers (callers may skip it while neither ``active``
        nor ``waiting``)."""
        if self.active:
            self.thruput.on_push(n)
        if self.waiting:
            self._cond.notify_all()

    # ------------------------------------------------------------------ sample
    def why_not(self, count: int, size: int, shortfall: Optional[Callable[[], str]] = None) -> str:
        """'' when ``size`` may be sampled from ``count`` stored elements now, else the reasons; ``shortfall``: why
        the table cannot serve it by its own rules ('' when it can; kept, and asked again, for the never-stall
        rule)."""
        self._shortfall = shortfall
        if count and count >= self.min_ratio * size and not self.active:
            return ''
        self._last_sample = size
        if count == 0:
            return 'nothing is stored'
        if count / size < self.min_ratio:
            return f"{count} items < sample_min_limit_ratio {self.min_ratio:g} x batch {size}"
        ok, why = self.thruput.can_sample(size)
        if ok or not self.thruput.can_push(self._last_push)[0]:  # a push is refused too: the sample goes
            return ''
        return why

    def on_sample(self, n: int) -> None:
        if self.active:
            self.thruput.on_sample(n)

    def wait(
        self,
        why_not: Callable[[], str],
        timeout: Optional[float],
        what: str,
        check_open: Callable[[], None],
        deadline: Optional[float] = None,
    ) -> str:
        """
        Overview:
            Re-evaluate ``why_not()`` until it is '' or ``timeout`` seconds pass -- by ``deadline`` (monotonic) when
            the call began earlier -- (then ``SampleTimeoutError`` naming ``what`` and the last reason).
            ``timeout=None`` evaluates once and returns the reason. Must be called holding the buffer's lock; it is
            released while waiting.
        """
        why = why_not()
        if not why or timeout is None:
            return why
        deadline = time.monotonic() + timeout if deadline is None else deadline
        self.waiting += 1
        try:
            while why:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SampleTimeoutError(f"{what} within {timeout}s: {why}")
                self._cond.wait(min(left, 0.05))  # rate limits also change with time (decay)
                check_open()
                why = why_not()
        finally:
            self.waiting -= 1
        return why

    def wake(self) -> None:
        """Wake every waiting sampler (a push, ``close``)."""
        self._cond.notify_all()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, float]:
        return self.thruput.state_dict()

    def restored(self, state: Mapping) -> ThruputController:
        """A controller loaded from ``state`` (validated; swapped in with ``swap`` by the caller)."""
        return self.thruput.restored(state, self._cfg)

    def swap(self, thruput: ThruputController) -> None:
        self.thruput = thruput

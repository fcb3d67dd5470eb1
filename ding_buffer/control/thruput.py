"""``ThruputController``: DI-engine's push/sample rate limiter, without its decay thread.

Two decayed counters, ``push`` and ``sample``, count accepted items. Every whole second since construction
both are multiplied by ``0.01 ** (1 / window_seconds)`` (after ``window_seconds`` idle seconds they are x0.01).
DI-engine applies the ticks from a daemon thread; here they are applied lazily, from the clock, whenever a
counter is read -- the same discrete one-second steps, no thread to leak, and deterministic under a fake clock.

Rules (DI-engine's): ``can_push(n)`` is refused when ``sample > 1e-5`` and ``(push + n) / sample > max``;
``can_sample(n)`` is refused when ``push / (sample + n) < min``. The controller is inactive (everything
allowed, O(1)) with the defaults ``max=inf, min=0``.
Not thread-safe on its own: the buffer's lock serialises calls.
"""

import math
import time
from typing import Callable, Dict, Mapping, Tuple

from ..config import as_float
from ..errors import SampleTimeoutError  # noqa: F401 (raised here, re-exported)


class ThruputController:
    """
    Overview:
        The decayed ``push`` / ``sample`` counters and DI-engine's two ratio rules (see the module docstring).
        ``clock`` (seconds) is ``time.monotonic`` unless a test passes its own.
    Examples:
        >>> now = [0.0]  # a fake clock
        >>> cfg = dict(push_sample_rate_limit=dict(max=2.0, min=0.0), window_seconds=30.0)
        >>> tc = ThruputController(cfg, clock=lambda: now[0])
        >>> tc.on_push(4); tc.on_sample(2)
        >>> tc.can_push(1)  # (4 + 1) / 2 > max
        (False, 'push/sample rate 2.500 would exceed max 2.0')
        >>> now[0] = 30.0  # one window later both counters are x0.01: the ratio stays
        >>> round(tc.push_count, 9), round(tc.sample_count, 9), tc.can_push(1)[0]
        (0.04, 0.02, False)
    """

    def __init__(self, cfg: Mapping, clock: Callable[[], float] = time.monotonic) -> None:
        limit = cfg['push_sample_rate_limit']
        self.max_rate = as_float(limit['max'])  # (NaN for an int beyond the float range: refused below)
        self.min_rate = as_float(limit['min'])
        self.window_seconds = as_float(cfg['window_seconds'])
        if not 0 <= self.min_rate < math.inf or math.isnan(self.max_rate) or self.max_rate <= 0:
            raise ValueError(
                f"config key 'thruput_controller.push_sample_rate_limit' needs a finite min >= 0 (an infinite one "
                f"refuses every sample) and max > 0, got min={limit['min']!r:.40} max={limit['max']!r:.40}"
            )
        if self.min_rate > self.max_rate:
            raise ValueError(
                f"config key 'thruput_controller.push_sample_rate_limit' has min {self.min_rate} > max "
                f"{self.max_rate}: no push/sample ratio could ever satisfy both (it would deadlock)"
            )
        if not self.window_seconds > 0:
            raise ValueError(
                f"config key 'thruput_controller.window_seconds' must be a number > 0, got "
                f"{cfg['window_seconds']!r:.40}"
            )
        self.active = self.max_rate != math.inf or self.min_rate != 0
        self._decay = 0.01 ** (1.0 / self.window_seconds)
        self._clock = clock
        self._t0 = clock()
        self._ticks = 0
        self._push = 0.0
        self._sample = 0.0

    def _tick(self) -> None:
        ticks = int(self._clock() - self._t0)
        if ticks > self._ticks:
            factor = self._decay ** (ticks - self._ticks)
            self._push *= factor
            self._sample *= factor
            self._ticks = ticks

    @property
    def push_count(self) -> float:
        self._tick()
        return self._push

    @property
    def sample_count(self) -> float:
        self._tick()
        return self._sample

    def can_push(self, n: int) -> Tuple[bool, str]:
        if not self.active:
            return True, ''
        self._tick()
        if self._sample < 1e-5:
            return True, ''
        ratio = (self._push + n) / self._sample
        if ratio > self.max_rate:
            return False, f"push/sample rate {ratio:.3f} would exceed max {self.max_rate}"
        return True, ''

    def can_sample(self, n: int) -> Tuple[bool, str]:
        if not self.active:
            return True, ''
        self._tick()
        ratio = self._push / (self._sample + n)
        if ratio < self.min_rate:
            return False, f"push/sample rate {ratio:.3f} would fall below min {self.min_rate}"
        return True, ''

    def on_push(self, n: int) -> None:
        if self.active:
            self._tick()
            self._push += n

    def on_sample(self, n: int) -> None:
        if self.active:
            self._tick()
            self._sample += n

    def state_dict(self) -> Dict[str, float]:
        self._tick()
        return {'push': self._push, 'sample': self._sample}

    def restored(self, state: Mapping, cfg: Mapping) -> 'ThruputController':
        """A new controller of ``cfg`` holding the saved counters (validated; the decay window restarts now)."""
        push, sample = float(state['push']), float(state['sample'])
        if not (push >= 0 and sample >= 0 and math.isfinite(push) and math.isfinite(sample)):
            raise ValueError(f"invalid thruput counters: push={push} sample={sample}")
        new = ThruputController(cfg, self._clock)
        new._push, new._sample = push, sample
        return new

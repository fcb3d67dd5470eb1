"""``baseline_log_reward`` for score dicts (torchgfn's manager): the log-reward a new item must reach.

Order of precedence on every push: a value synced by a worker (``baseline_sync``) overrides everything; else,
with strategy ``min`` / ``percentile`` and a *full* buffer that keeps log-rewards, the minimum / the
``percentile`` quantile (linear interpolation) of the stored finite log-rewards; else the EMA of the minima of
incoming batches (``ema = alpha * m + (1 - alpha) * ema``, first value ``m``; non-finite values ignored);
else no baseline.
"""

from typing import Optional

import numpy as np


class BaselineTracker:
    def __init__(self, strategy: Optional[str], percentile: float, alpha: float) -> None:
        self.strategy = strategy
        self.percentile = float(percentile)
        self.alpha = float(alpha)
        self.ema: Optional[float] = None
        self.synced: Optional[float] = None

    def observe(self, incoming: Optional[np.ndarray]) -> None:
        """Update the EMA with the minimum of the incoming batch's finite log-rewards."""
        if incoming is None:
            return
        finite = incoming[np.isfinite(incoming)]
        if not len(finite):
            return
        m = float(finite.min())
        self.ema = m if self.ema is None else self.alpha * m + (1 - self.alpha) * self.ema

    def sync(self, value: float) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or np.isnan(value):
            raise ValueError(f"baseline_sync value must be a number, got {value!r}")
        self.synced = float(value)

    def value(self, stored: Optional[np.ndarray], full: bool) -> Optional[float]:
        """The baseline, or None. ``stored``: log-rewards of the stored items (None: the buffer keeps none)."""
        if self.strategy is None:
            return None
        if self.synced is not None:
            return self.synced
        if self.strategy in ('min', 'percentile') and full and stored is not None:
            finite = stored[np.isfinite(stored)]
            if len(finite):
                if self.strategy == 'min':
                    return float(finite.min())
                return float(np.quantile(finite.astype(np.float64), self.percentile))
        return self.ema

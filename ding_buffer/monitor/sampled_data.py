"""``SampledDataAttrMonitor``: moving statistics of the last ``average_range`` sampled batches (DI-engine's).

Each ``sample`` call records the batch's ``use``, ``priority`` and ``staleness`` arrays and ``beta``; the per-batch
statistics (``use_avg/max``, ``priority_avg/max/min``, ``staleness_avg/max``) are computed only when read, so
recording costs O(1) on the sampling hot path.
``averages()`` returns, over the window, the mean of the ``*_avg`` entries, the max of the ``*_max`` entries,
the min of the ``*_min`` entries and the latest ``beta``. Every ``print_freq`` calls (starting with the first)
``record`` returns what is due -- a table for the log and ``{instance}_iter/<key>`` (step: learner iter, skipped
when -1) and ``{instance}_step/<key>`` (step: last collector env step, skipped when -1) scalars -- which the
buffer writes with ``monitor.tb.emit`` after releasing its lock.
Not thread-safe on its own: the buffer calls ``record`` under its lock.
"""

import collections
import logging
import math
from typing import Any, Dict

from .tb import Due

EMPTY_WINDOW = {'calls': 0, 'rows': []}  # (a state saved before the window was)
KEYS = ('use_avg', 'use_max', 'priority_avg', 'priority_max', 'priority_min', 'staleness_avg', 'staleness_max', 'beta')


# how a key's values over the window combine, by the key's suffix (beta: the latest)
def _finite(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


_REDUCE = {'avg': lambda v: sum(v) / len(v), 'max': max, 'min': min, 'beta': lambda v: v[-1]}


class SampledDataAttrMonitor:
    """
    Overview:
        The moving window of sampled-batch statistics (see the module docstring).
    Examples:
        >>> import numpy as np
        >>> monitor = SampledDataAttrMonitor('buffer', average_range=2, print_freq=100, logger=None, tb_logger=None)
        >>> text, scalars = monitor.record(np.array([1, 2]), np.array([1.0, 3.0]), np.array([0, 4]), 0.4, 0, -1)
        >>> text.splitlines()[0], scalars  # the first call is due; no tb_logger: no scalars
        ('=== Sample data 0 Times ===', [])
        >>> monitor.record(np.array([3, 3]), np.array([2.0, 2.0]), np.array([1, 1]), 0.5, 1, -1) is None
        True
        >>> avg = monitor.averages()  # mean of the averages, max of the maxima, the latest beta
        >>> avg['use_avg'], avg['use_max'], avg['priority_min'], avg['staleness_max'], avg['beta']
        (2.25, 3.0, 1.0, 4.0, 0.5)
    """

    def __init__(
        self, instance_name: str, average_range: int, print_freq: int, logger: logging.Logger, tb_logger: Any
    ) -> None:
        self.instance_name = instance_name
        self.print_freq = print_freq
        self.logger = logger
        self.tb_logger = tb_logger
        self.window = collections.deque(maxlen=average_range)
        self.calls = 0

    @staticmethod
    def _row(use, priority, staleness, beta) -> Dict[str, float]:
        return {
            'use_avg': float(use.mean()),
            'use_max': float(use.max()),
            'priority_avg': float(priority.mean()),
            'priority_max': float(priority.max()),
            'priority_min': float(priority.min()),
            'staleness_avg': float(staleness.mean()),
            'staleness_max': float(staleness.max()),
            'beta': float(beta),
        }

    def averages(self) -> Dict[str, float]:
        if not self.window:
            return {}
        rows = [entry if type(entry) is dict else self._row(*entry) for entry in self.window]  # (dict: restored)
        return {k: _REDUCE[k.rsplit('_', 1)[-1]]([row[k] for row in rows]) for k in KEYS}

    def state_dict(self) -> Dict[str, Any]:
        """The window as each batch's statistics in ``KEYS`` order (plain floats) and the call count."""
        rows = [entry if type(entry) is dict else self._row(*entry) for entry in self.window]
        return {'calls': self.calls, 'rows': [[row[k] for k in KEYS] for row in rows]}

    def restored(self, state: Any) -> 'SampledDataAttrMonitor':
        """A monitor like this one holding a saved ``state_dict()`` (checked; ``ValueError`` / ``TypeError``
        naming what is wrong); the window keeps its last ``average_range`` batches."""
        if type(state) is not dict or set(state) != {'calls', 'rows'}:
            raise TypeError(f"saved 'sampled' must be a dict of 'calls' and 'rows', got {state!r:.80}")
        calls, rows = state['calls'], state['rows']
        if type(calls) is not int or not 0 <= calls < 1 << 62:
            raise ValueError(f"saved 'sampled.calls' must be an int in [0, 2**62), got {calls!r:.40}")
        if type(rows) is not list or len(rows) > calls:
            raise ValueError(f"saved 'sampled.rows' must be a list of at most 'calls' = {calls} rows")
        window = collections.deque(maxlen=self.window.maxlen)
        for row in rows[-self.window.maxlen :]:
            if type(row) is not list or len(row) != len(KEYS) or not all(_finite(v) for v in row):
                raise ValueError(f"saved 'sampled.rows' entries must be {len(KEYS)} finite numbers, got {row!r:.80}")
            window.append({k: float(v) for k, v in zip(KEYS, row)})
        new = SampledDataAttrMonitor(self.instance_name, 1, self.print_freq, self.logger, self.tb_logger)
        new.window, new.calls = window, calls
        return new

    def record(self, use, priority, staleness, beta: float, cur_learner_iter: int, cur_collector_envstep: int) -> Due:
        """Record one sampled batch (numpy arrays; they are not modified afterwards by the buffer); returns the
        log table and scalars due now (every ``print_freq`` calls), or None."""
        calls, self.calls = self.calls, self.calls + 1  # (first: a stop between the two keeps rows <= calls)
        self.window.append((use, priority, staleness, beta))
        if calls % self.print_freq:
            return None
        avg = self.averages()
        text = f"=== Sample data {calls} Times ===\n" + '\n'.join(f"{k:>14} | {v:.6g}" for k, v in avg.items())
        scalars = []
        if self.tb_logger is not None:
            for k, v in avg.items():
                if cur_learner_iter != -1:
                    scalars.append((f'{self.instance_name}_iter/{k}', v, cur_learner_iter))
                if cur_collector_envstep != -1:
                    scalars.append((f'{self.instance_name}_step/{k}', v, cur_collector_envstep))
        return text, scalars

"""``PeriodicThruputMonitor``: every ``seconds``, how many items were pushed, sampled and removed in the period.

Pull-based: a daemon thread reads the buffer's cumulative counters through ``read()`` (cheap, takes the
buffer's lock briefly) and reports the differences since the previous period -- the buffer keeps no per-period
state. It logs a line and writes DI-engine's tags ``{instance}_sec/pushed_in``, ``.../sampled_out``,
``.../removed`` and ``.../current_have`` with step = period index (0, 1, 2, ...).
The thread starts with ``start()`` (idempotent), wakes up promptly on ``close()``, and is joined there; ``close()``
then writes the last, partial period (so a run shorter than one period still gets its ``_sec`` scalars) and
flushes the writer.
"""

import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

from .. import forks

TAGS = (('pushed_in', 'push_items'), ('sampled_out', 'sampled_items'), ('removed', 'remove_count'))


class PeriodicThruputMonitor:
    """
    Overview:
        The thread of the module docstring: ``read()`` gives the cumulative counters ``push_items``,
        ``sampled_items``, ``remove_count`` and ``count``; ``tb_logger`` is anything with ``add_scalar``.
    Examples:
        >>> class Writer:  # a stand-in for a SummaryWriter
        ...     def add_scalar(self, tag, value, step):
        ...         print(tag, value, step)
        >>> counters = dict(push_items=0, sampled_items=0, remove_count=0, count=0)
        >>> monitor = PeriodicThruputMonitor('buffer', 60.0, lambda: dict(counters), logging.getLogger(), Writer())
        >>> monitor.start()
        >>> counters.update(push_items=10, sampled_items=4, count=10)
        >>> monitor.close()  # joins the thread and writes the partial period
        buffer_sec/pushed_in 10 0
        buffer_sec/sampled_out 4 0
        buffer_sec/removed 0 0
        buffer_sec/current_have 10 0
    """

    def __init__(
        self,
        instance_name: str,
        seconds: float,
        read: Callable[[], Dict[str, float]],
        logger: logging.Logger,
        tb_logger: Any,
    ) -> None:
        self.instance_name = instance_name
        self.seconds = float(seconds)
        self.read = read
        self.logger = logger
        self.tb_logger = tb_logger
        self.period = 0
        self._last: Optional[Dict[str, float]] = None
        self._last_at = 0.0
        self._closed = False
        self._reserved = 0  # closed: the steps taken, its last period included (written or not)
        self._step_lock = forks.lock(reentrant=False)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            if self._last is None:  # (a start that found no thread keeps its baseline for the next try)
                self._last, self._last_at = self.read(), time.monotonic()
            thread = threading.Thread(target=self._run, name=f'{self.instance_name}_thruput', daemon=True)
            if forks.started(thread):  # (else no periods until a later push or sample starts one)
                self._thread = thread

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            try:
                if self.report() is None:  # the buffer is gone
                    return
            except Exception:  # a failing writer must not kill the thread silently
                self.logger.exception("[%s] periodic thruput monitor failed", self.instance_name)

    def report(self) -> Optional[Dict[str, float]]:
        """Write one period (also callable directly); ``None`` when ``read()`` says the buffer is gone."""
        now = self.read()
        if now is None:
            return None
        last = self._last or {k: 0 for k in now}
        values = {tag: now[key] - last.get(key, 0) for tag, key in TAGS}
        values['current_have'] = now['count']
        self._last, elapsed = now, (time.monotonic() - self._last_at if self._last_at else self.seconds)
        self._last_at = time.monotonic()
        self.logger.info(
            "[%s] In the past %.1f seconds, buffer statistics is as follows: %s",
            self.instance_name,
            min(elapsed, self.seconds),
            ', '.join(f'{k}={v:g}' for k, v in values.items()),
        )
        with self._step_lock:  # (one step for the period's scalars, whatever a load sets meanwhile)
            step, self.period = self.period, self.period + 1
        if self.tb_logger is not None:
            for tag, v in values.items():
                self.tb_logger.add_scalar(f'{self.instance_name}_sec/{tag}', v, step)
        return values

    def go_on_from(self, steps: int) -> None:
        """Continue the x-axis of a saved monitor whose ``steps_taken`` was ``steps`` (a state loaded): this
        monitor's ``steps_taken`` is ``steps`` again (an earlier state: its steps are written again, as its counters
        are)."""
        with self._step_lock:
            self.period = max(0, steps - (self._thread is not None and not self._closed))

    def steps_taken(self) -> int:
        """The x-axis steps written, and the step of the period under way (written at the next report or at
        ``close``, which may come after a state is saved): where a buffer loaded from a state taken now goes on."""
        if self._thread is None:
            return self.period
        return max(self._reserved, self.period) if self._closed else self.period + 1

    def stop(self) -> None:
        """Tell the thread to end now, without waiting for it (a buffer dropped without ``close``)."""
        self._stop.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop and join the thread, then write the partial period since the last report (when anything was
        pushed, sampled or removed in it) and flush the writer. Idempotent."""
        self._stop.set()
        if self._thread is None or self._closed:
            return
        self._reserved = self.period + 1
        self._closed = True
        if self._thread is threading.current_thread():  # closed by a report's own writer: that report is the last
            return
        self._thread.join(timeout)
        self._reserved = max(self._reserved, self.period + 1)  # (a report the thread was writing)
        if self._thread.is_alive():  # still inside a slow report: a final one now would race it for the same step
            self.logger.warning(
                "[%s] periodic thruput monitor still reporting after %.1fs; no final report",
                self.instance_name,
                timeout,
            )
            return
        try:
            now, last = self.read(), self._last
            if now is not None and last is not None and any(now[k] != last.get(k, 0) for _, k in TAGS):
                self.report()
            if self.tb_logger is not None and hasattr(self.tb_logger, 'flush'):
                self.tb_logger.flush()
        except Exception:  # closing must not fail because a writer does
            self.logger.exception("[%s] final periodic thruput report failed", self.instance_name)

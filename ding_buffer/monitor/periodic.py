"""``PeriodicThruputMonitor``: every ``seconds``, how many items were pushed, sampled and removed in the period.

Pull-based: a daemon thread reads the buffer's cumulative counters through ``read()`` (cheap, takes the
buffer's lock briefly) and reports the differences since the previous period -- the buffer keeps no per-period
state. It logs a line and writes DI-engine's tags ``{instance}_sec/pushed_in``, ``.../sampled_out``,
``.../removed`` and ``.../current_have`` with step = period index (0, 1, 2, ...).
The thread starts with ``start()`` (idempotent), wakes up promptly on ``close()``, and is joined there.
"""
import logging
import threading
from typing import Any, Callable, Dict, Optional

TAGS = (('pushed_in', 'push_items'), ('sampled_out', 'sampled_items'), ('removed', 'remove_count'))


class PeriodicThruputMonitor:

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
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._last = self.read()
            self._thread = threading.Thread(target=self._run, name=f'{self.instance_name}_thruput', daemon=True)
            self._thread.start()

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
        self._last = now
        self.logger.info(
            "[%s] In the past %.1f seconds, buffer statistics is as follows: %s", self.instance_name, self.seconds,
            ', '.join(f'{k}={v:g}' for k, v in values.items())
        )
        if self.tb_logger is not None:
            for tag, v in values.items():
                self.tb_logger.add_scalar(f'{self.instance_name}_sec/{tag}', v, self.period)
        self.period += 1
        return values

    def stop(self) -> None:
        """Tell the thread to end now, without waiting for it (a buffer dropped without ``close``)."""
        self._stop.set()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

"""TensorBoard writer of a buffer: borrowed when passed in, else optionally owned under DI-engine's path."""

import logging
import os
import threading
from typing import Any, Callable, List, Optional, Tuple

from .. import forks

# What a monitor computed under the buffer's lock and the buffer writes after releasing it:
# (a log message or None, [(tag, value, step), ...]).
Due = Optional[Tuple[Optional[str], List[Tuple[str, float, int]]]]


def emit(due: Due, logger: Optional[logging.Logger], tb: Any) -> None:
    """Write a monitor's due output: call it *outside* the buffer's lock (TensorBoard writes are I/O)."""
    if not due:
        return
    text, scalars = due
    if text and logger is not None:
        logger.info(text)
    if tb is not None:
        for tag, value, step in scalars:
            tb.add_scalar(tag, value, step)


WRITER_WAIT_S = 10.0  # how long a flush / close waits for the writer (one whose thread is gone never returns)


def bounded(call: Callable[[], Any], what: str) -> None:
    """``call()`` (a writer's flush or close) in a helper thread, waited for at most ``WRITER_WAIT_S``: torch's writer
    waits for its writing thread, which a writer made before a fork lacks in the child. A failure is logged."""
    log = logging.getLogger('ding_buffer')

    def run() -> None:
        try:
            call()
        except Exception:  # a writer failing at the end must not fail the buffer's close
            log.warning('TensorBoard writer %s failed', what, exc_info=True)

    helper = threading.Thread(target=run, name='tb_writer_wait', daemon=True)
    if not forks.started(helper):  # (no thread to be had: called here, unbounded)
        run()
        return
    helper.join(WRITER_WAIT_S)
    if helper.is_alive():
        log.warning(
            "TensorBoard writer %s did not return within %.0fs (a writer made before a fork?)", what, WRITER_WAIT_S
        )


def rank() -> int:
    """torch.distributed rank, 0 when not initialised (only rank 0 writes TensorBoard, as in DI-engine)."""
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


def build_tb_logger(tb_logger: Any, enabled: bool, exp_name: str, instance_name: str) -> Tuple[Optional[Any], bool]:
    """
    Overview:
        ``(writer, owned)``. A passed-in writer is used as is and never closed by the buffer; otherwise, when
        ``enabled`` and on rank 0, a ``SummaryWriter`` at ``./{exp_name}/log/{instance_name}/{instance_name}_tb_logger``
        that the buffer closes.
    """
    if tb_logger is not None:
        return tb_logger, False
    if not enabled or rank() != 0:
        return None, False
    from torch.utils.tensorboard import SummaryWriter

    # (an absolute exp_name is kept: DI-engine's buffers format './{exp_name}' and write below the working directory;
    # another value, None included, is named as DI-engine formats it)
    path = os.path.join('.', str(exp_name), 'log', instance_name, f'{instance_name}_tb_logger')
    return SummaryWriter(path), True


def writer_closed(tb: Any) -> bool:
    """Whether a ``SummaryWriter`` (torch's or tensorboardX's) has been closed: both drop their file writers on
    ``close()`` (``all_writers = None``) and would open a second event file on the next write. Other writers
    are taken as open."""
    return getattr(tb, 'all_writers', 0) is None


class TBSink:
    """
    Overview:
        The one way a buffer writes TensorBoard: ``add_scalar`` / ``flush`` / ``close`` keep a lock of their own
        (never the buffer's), and ``close`` waits for the writes under way, so a write racing the buffer's
        ``close()`` in another thread either happens before the writer closes or not at all -- no
        ``OSError('Writer is closed')``. The writer itself is called without that lock: a writer may read or close
        its buffer, from any thread. A borrowed writer (``owned``
        False) is never closed here, and a write after its owner closed it -- or that its owner's ``close()``
        overtook -- is dropped (logged at DEBUG) instead of opening a second event file or raising. Any other failing
        write is logged as a warning, never raised: the call it follows is done.
    Examples:
        >>> class Writer:
        ...     all_writers = {}
        ...     def add_scalar(self, tag, value, step):
        ...         print(tag, value, step)
        ...     def flush(self):
        ...         pass
        ...     def close(self):
        ...         self.all_writers = None
        >>> borrowed = Writer()
        >>> sink = TBSink(borrowed, owned=False)
        >>> sink.add_scalar('buffer_sec/pushed_in', 8, 0)
        buffer_sec/pushed_in 8 0
        >>> borrowed.close()  # the pipeline closed its writer
        >>> sink.add_scalar('buffer_sec/pushed_in', 3, 1)  # dropped: no stray event file
    """

    def __init__(self, writer: Any, owned: bool) -> None:
        self.writer = writer
        self.owned = owned
        self._lock = forks.lock()  # re-entrant: a writer's own code may close the buffer, or sample from it
        # the writer is called without the lock (a writer that reads its buffer from a report's thread would wait
        # for the buffer's lock, which a thread waiting here may hold): close waits for the writes under way
        self._idle = threading.Condition(self._lock)
        self._writing = 0
        self._mine = threading.local()  # this thread's writes under way (a writer closing its buffer is one)
        self._closed = False
        self._failed = False
        forks.tell_children(self)

    def _after_fork(self) -> None:
        """A forked child drops its writes: the writer's thread stayed in the parent (a flush would wait for it)."""
        self._closed = True

    def _usable(self) -> bool:
        if self._closed or (not self.owned and writer_closed(self.writer)):
            logging.getLogger('ding_buffer').debug('TensorBoard write after the writer was closed: dropped')
            return False
        return True

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        with self._lock:
            if not self._usable():
                return
            self._writing += 1
        mine = getattr(self._mine, 'n', 0)
        self._mine.n = mine + 1
        try:
            self.writer.add_scalar(tag, value, step)
        except Exception as e:
            # the owner closed a borrowed writer under this write (its close is not ours to lock out); torch's
            # close() shuts the file writers before it marks the SummaryWriter closed, so the message counts too
            if not self.owned and (writer_closed(self.writer) or 'closed' in str(e).lower()):
                logging.getLogger('ding_buffer').debug('TensorBoard writer closed by its owner during a write')
                return
            # any other failure (a full disk) is logged: the push or sample it follows is already done, and a
            # raise would report a call that changed the buffer as failed (its batch lost)
            level = logging.DEBUG if self._failed else logging.WARNING  # (a full disk: once, not every write)
            self._failed = True
            logging.getLogger('ding_buffer').log(level, 'TensorBoard write of %r failed: %r', tag, e)
        finally:
            self._mine.n = mine
            with self._lock:
                self._writing -= 1
                self._idle.notify_all()

    def flush(self) -> None:
        with self._lock:
            if self._usable() and hasattr(self.writer, 'flush'):
                bounded(self.writer.flush, 'flush')

    def close(self) -> None:
        """Idempotent: flush; close the writer only when owned. Later writes are dropped."""
        with self._lock:
            if self._closed:
                return
            usable = self._usable()
            self._closed = True
            if not usable:
                return
            mine = getattr(self._mine, 'n', 0)  # (this thread's own write waits for this close, not the reverse)
            self._idle.wait_for(lambda: self._writing <= mine, timeout=WRITER_WAIT_S)
            bounded(self._end_writer, 'close')

    def _end_writer(self) -> None:
        if hasattr(self.writer, 'flush'):
            self.writer.flush()
        if self.owned:
            self.writer.close()

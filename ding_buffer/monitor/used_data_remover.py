"""``UsedDataRemover``: deletes the files behind items that left the buffer (``enable_track_used_data``).

Items are "meta" data whose payload lives on disk at ``item['data_id']``. When a buffer overwrites, clears or
evicts such an item it hands it here; a background thread deletes the path with ``os.remove`` /
``shutil.rmtree`` (never a shell). ``close()`` stops the thread, then deletes what is still queued, so after
``close()`` returns every handed-over file is gone. Thread-safe (a ``queue.Queue`` between producers and the
worker).
"""

import logging
import os
import queue
import shutil
import threading
from typing import Any, Iterable, List, Optional

from .. import forks


def check_trackable(item: Any, i: int) -> None:
    """Raise unless ``item`` is a dict with a path-like ``data_id``."""
    if not isinstance(item, dict) or 'data_id' not in item:
        raise ValueError(f"enable_track_used_data needs dict items with a 'data_id' path; item {i} is {item!r:.80}")
    data_id = item['data_id']
    if not isinstance(data_id, (str, os.PathLike)):
        raise TypeError(f"item {i} field 'data_id' must be a path (str), got {type(data_id).__name__}")
    if not isinstance(data_id, str):  # read now (os.fspath checks it gives str or bytes): a later eviction hands it on
        try:
            os.fspath(data_id)
        except Exception as e:
            raise TypeError(f"item {i} field 'data_id' ({type(data_id).__name__}) gives no path: {e}") from None


def check_trackable_batch(batch: Any) -> None:
    """Raise unless the batched push ``batch`` holds a ``data_id`` path for every item (as ``check_trackable``)."""
    ids = batch.get('data_id') if hasattr(batch, 'get') else None
    if ids is None or isinstance(ids, (str, bytes)) or not hasattr(ids, '__len__'):
        raise ValueError(
            f"enable_track_used_data needs a batch whose 'data_id' field holds a path for each item, got "
            f"{type(ids).__name__}"
        )
    for i, data_id in enumerate(ids):
        check_trackable({'data_id': data_id}, i)


class UsedDataRemover:
    """
    Overview:
        The deleting thread of the module docstring; buffers with ``enable_track_used_data=True`` own one.
    Examples:
        >>> import tempfile
        >>> from ding_buffer import create_buffer
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     paths = [os.path.join(tmp, f'{i}.pt') for i in range(3)]
        ...     for path in paths:
        ...         open(path, 'w').close()
        ...     buf = create_buffer(dict(type='naive', replay_buffer_size=2, enable_track_used_data=True))
        ...     n = buf.push([{'data_id': path} for path in paths])  # the first item is overwritten
        ...     buf.close()  # after close() every file handed over is gone
        ...     print(n, [os.path.exists(path) for path in paths])
        3 [False, True, True]
    """

    def __init__(self, logger: Optional[logging.Logger] = None, poll_seconds: float = 0.05) -> None:
        self._queue: 'queue.Queue[str]' = queue.Queue()
        self._logger = logger or logging.getLogger(__name__)
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._held: List[str] = []  # the files of the last batch used up (``add(hold=True)``)
        self._forked = False  # a forked child's copy deletes nothing: the files are its parent's items'
        forks.tell_children(self)

    def _after_fork(self) -> None:
        self._forked = True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        thread = threading.Thread(target=self._run, name='delete_used_data', daemon=True)
        if forks.started(thread):
            self._thread = thread
        else:  # the queued files go now, in the caller (the next call tries a thread again)
            self._drain()

    def add(self, items: Iterable[Any], hold: bool = False) -> None:
        """Queue the ``data_id`` of every dict item (others are ignored: they own no file). ``hold``: items a sample
        just returned and used up (``max_use``): their files are kept until the next such call (the batch stays
        readable while it is used), or ``close()``; the files held before are queued now."""
        paths = [os.fspath(item['data_id']) for item in items if isinstance(item, dict) and 'data_id' in item]
        if hold:
            paths, self._held = self._held, paths
        for path in paths:
            self._queue.put(path)

    def keep(self, items: Iterable[Any]) -> None:
        """``items`` are stored (pushed again, or a loaded state's): their files are no longer held for deletion."""
        if self._held:
            live = {os.fspath(item['data_id']) for item in items if isinstance(item, dict) and 'data_id' in item}
            self._held = [path for path in self._held if path not in live]

    def pending(self) -> int:
        return self._queue.qsize() + len(self._held)

    def _delete(self, path: str) -> None:
        if self._forked:
            return
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        except OSError as e:
            self._logger.warning("could not delete used data %r: %s", path, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                path = self._queue.get(timeout=self._poll)
            except queue.Empty:
                continue
            self._delete(path)

    def close(self, timeout: float = 10.0) -> None:
        """Stop and join the thread, then delete whatever is still queued or held. Idempotent."""
        self._stop.set()
        self.add((), hold=True)  # the held files are queued
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._logger.warning("used-data remover thread did not stop within %.1fs", timeout)
            self._thread = None
        self._drain()

    def _drain(self) -> None:
        """Delete every queued file, in the calling thread."""
        while True:
            try:
                self._delete(self._queue.get_nowait())
            except queue.Empty:
                break

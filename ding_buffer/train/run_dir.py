"""Run directories of the training jobs: made only once the input is known good, and removed again -- with
every parent the job created -- when the job fails to start, so a rejected run leaves nothing on disk."""

import logging
import os
import shutil
from typing import Any, Iterable, Optional

LOG = logging.getLogger(__name__)


def first_missing_dir(path: str) -> Optional[str]:
    """The top-most directory of ``path`` that does not exist yet (what ``os.makedirs(path)`` creates first), or
    ``None`` when ``path`` exists."""
    path = os.path.abspath(path)
    top = None
    while not os.path.lexists(path):
        top, parent = path, os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return top


def discard_run_dir(run_dir: str, created: Optional[str], parts: Iterable[Any] = ()) -> None:
    """Close ``parts`` (a buffer, a TensorBoard writer; None and objects without ``close`` are skipped); if the job
    created the run directory (``created``: ``first_missing_dir`` before it did), remove it and then each parent it
    created that is still empty (another run may have put its own directory there meanwhile)."""
    for part in parts:
        if part is not None and hasattr(part, 'close'):
            try:
                part.close()
            except Exception as err:  # already failing: the first error is the one to report
                LOG.warning('closing %s after a failed start: %s', type(part).__name__, err)
    if created is None:
        return
    path = os.path.abspath(run_dir)
    shutil.rmtree(path, ignore_errors=True)
    while path != created and os.path.dirname(path) != path:
        path = os.path.dirname(path)
        try:
            os.rmdir(path)
        except OSError:
            return

"""Run directories of the training jobs: made only once the input is known good, and removed again -- with
every parent the job created -- when the job fails to start, so a rejected run leaves nothing on disk. Also the
jobs' progress bar."""

import logging
import os
import shutil
from typing import Any, Callable, Iterable, Optional

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


def build_in_run_dir(job: Any, build: Callable[[], None]) -> None:
    """Create ``job.run_dir``, then ``build()`` the job in it (setting ``job.buffer`` / ``job.tb``, None until
    then); if either fails, close those and remove what was created (``discard_run_dir``)."""
    created, job.tb, job.buffer = first_missing_dir(job.run_dir), None, None
    try:
        os.makedirs(job.run_dir, exist_ok=True)  # only now: invalid input must leave nothing on disk
    except OSError as e:
        discard_run_dir(job.run_dir, created)  # the parents makedirs made before it failed
        raise ValueError(f"config key 'log_dir': cannot create run directory '{job.run_dir}': {e.strerror or e}") from e
    try:
        build()
    except BaseException:  # a job that failed to build leaves no half-made run directory
        discard_run_dir(job.run_dir, created, (job.buffer, job.tb))
        raise


def progress_bar(job: Any, total: int, initial: int, unit: str) -> Any:
    """The tqdm bar of a training ``job`` (``cfg.exp_name``, ``progress``: False hides it)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit=unit,
        dynamic_ncols=True,
        disable=not job.progress,
        desc=job.cfg.exp_name,
        mininterval=0.5,
    )

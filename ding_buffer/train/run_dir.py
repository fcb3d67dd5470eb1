"""Run directories of the training jobs: made only once the input is known good, and removed again -- with
every parent the job created -- when the job fails to start, so a rejected run leaves nothing on disk. Also the
jobs' progress bar."""

import contextlib
import contextvars
import errno
import fcntl
import logging
import os
import shutil
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

LOG = logging.getLogger(__name__)
_CLAIMED: Dict[str, int] = {}  # run directories this process trains in: the open descriptor holding each one's lock
_CLAIMING = contextvars.ContextVar('claiming', default=False)


@contextlib.contextmanager
def claiming() -> Iterator[None]:
    """Jobs built inside claim their run directory (``claim``): the command line's do, a job built in a user's
    own process does not."""
    token = _CLAIMING.set(True)
    try:
        yield
    finally:
        _CLAIMING.reset(token)


def claim(run_dir: str) -> None:
    """One trainer per run directory: an exclusive lock on the directory itself, held until this process exits
    (two trainers in one directory published checkpoints of the same steps over each other and mixed their logs);
    ``ValueError`` naming the directory when another process holds it."""
    path = os.path.realpath(run_dir)
    if path in _CLAIMED:  # (a job run again in this process: a resume after a run, in one interpreter)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):  # a filesystem without such locks (NFS, Lustre)
            LOG.warning("run directory '%s' cannot be locked (%s): a second trainer there is not refused", run_dir, e)
            _CLAIMED[path] = -1
            return
        raise ValueError(
            f"run directory '{run_dir}' is in use by another `ding-buffer train` (one run per directory: wait for "
            "it to stop, or pick another exp_name / seed / log_dir)"
        ) from None
    _CLAIMED[path] = fd


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
    if _CLAIMING.get():
        claim(job.run_dir)  # (refused: the directory is the other trainer's, removed by nobody)
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

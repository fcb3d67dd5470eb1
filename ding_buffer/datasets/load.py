"""``load_dataset``: validate a whole dataset file, then fill a buffer from it chunk by chunk, all or nothing."""

import os
import sys
from typing import Any, Optional

from .d4rl import D4RLReader
from .detect import detect_format
from .dingengine import DingEngineHDF5Reader, DingEnginePickleReader
from .feed import EpisodeSink, Target, TransitionSink
from .hdf5 import FileError
from .minari import MinariReader

READERS = {
    'd4rl': D4RLReader,
    'minari': MinariReader,
    'dingengine_hdf5': DingEngineHDF5Reader,
    'dingengine_pkl': DingEnginePickleReader,
}
FORMATS = tuple(READERS)


def load_dataset(
    buffer: Any,
    path: str,
    format: Optional[str] = None,
    *,
    chunk_size: int = 10_000,
    limit: Optional[int] = None,
    progress: Optional[bool] = None,
    allow_pickle: bool = False,
    atomic: bool = True,
) -> int:
    """
    Overview:
        Fill ``buffer`` (any type of transitions or episodes, list or tensor storage, memmap, frames) from the
        dataset file ``path``. The whole file is checked first (keys, lengths, dtypes, shapes, readable to its
        end); then it is read ``chunk_size`` rows at a time, so a file larger than memory fills a buffer with
        ``memmap_dir``. A failure leaves the buffer as it was (see ``atomic``).
    Arguments:
        - buffer (:obj:`IBuffer`): a buffer of transitions (naive, advanced, elastic, sequence, deque) or of \
            episodes (episode, prioritized_episode)
        - path (:obj:`str`): the file
        - format (:obj:`str`): 'd4rl', 'minari', 'dingengine_hdf5', 'dingengine_pkl'; None or 'auto': told from \
            the file
        - chunk_size (:obj:`int`): rows read (and pushed) at a time
        - limit (:obj:`int`): store only the first ``limit`` transitions
        - progress (:obj:`bool`): a tqdm progress bar (if tqdm is installed); None: when stderr is a terminal
        - allow_pickle (:obj:`bool`): read 'dingengine_pkl' files, which run code from the file
        - atomic (:obj:`bool`): snapshot ``buffer.state_dict()`` before and restore it on failure (a copy of what \
            the buffer holds: free for an empty buffer)
    Returns:
        - stored (:obj:`int`): the items pushed: transitions, or episodes for an episode buffer
    Examples:
        >>> from ding_buffer import create_buffer
        >>> from ding_buffer.datasets import load_dataset, write_d4rl
        >>> import numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), 'tiny.hdf5')
        >>> write_d4rl(path, dict(observations=np.zeros((3, 2)), actions=np.zeros((3, 1)), rewards=np.ones(3),
        ...                       terminals=np.array([False, False, True])))
        3
        >>> load_dataset(create_buffer(dict(type='naive')), path, progress=False)
        3
    """
    options = checked_options(format, chunk_size, limit, progress, allow_pickle, atomic)
    target = Target.of(buffer)
    path = os.fspath(path)
    if not os.path.isfile(path):
        if os.path.isdir(path):
            raise FileNotFoundError(f"no dataset file at {path!r}: it is a directory (give the file in it)")
        raise FileNotFoundError(f"no dataset file at {path!r}")
    fmt = detect_format(path) if format in (None, 'auto') else format
    try:
        with READERS[fmt].open(path, frames=target.frames is not None, **options) as r:
            target.check(path, r, columns=fmt != 'dingengine_pkl')  # (pickled items hold any field)
            total = r.validate(chunk_size)
            if limit is not None:
                total = min(total, limit)
            return _fill(buffer, target, r, path, chunk_size, total, progress, atomic)
    except _BufferFailed as failed:
        raise failed.error from None


class _BufferFailed(Exception):
    """The buffer's own error (a RuntimeError: e.g. it is closed), carried out of the file's context, which reads a
    RuntimeError raised inside it as damage to the file."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def checked_options(format: Any, chunk_size: Any, limit: Any, progress: Any, allow_pickle: Any, atomic: Any) -> dict:
    if format not in (None, 'auto') + FORMATS:
        raise ValueError(
            f"format {format!r} is not a dataset layout; expected one of {list(FORMATS)}, or None / 'auto'"
        )
    if type(chunk_size) is not int or chunk_size < 1:
        raise ValueError(f"chunk_size {chunk_size!r} must be a positive int (rows read at a time)")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError(f"limit {limit!r} must be None or an int >= 0 (the first transitions stored)")
    for name, value in (('allow_pickle', allow_pickle), ('atomic', atomic)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} {value!r} must be a bool")
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress {progress!r} must be None or a bool")
    return {'allow_pickle': allow_pickle}


def _fill(
    buffer: Any, target: Target, reader: Any, path: str, chunk_size: int, total: int, progress: Any, atomic: bool
) -> int:
    snapshot = buffer.state_dict() if atomic else None
    sink = EpisodeSink(buffer, target, path) if target.episodes else TransitionSink(buffer, target)
    bar = _progress_bar(total, progress, os.path.basename(path))
    stored = at = 0  # items pushed; transitions read
    try:
        if target.frames is not None:  # the file's first step starts an episode: an online one left open ends here
            buffer.storage.end_streams()
        for chunk in reader.chunks(chunk_size):
            if at >= total:
                break
            chunk = chunk.part(0, total - at) if at + len(chunk) > total else chunk
            stored += sink.put(chunk)
            at += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        stored += sink.finish()
        if target.frames is not None:  # the data's last episode may be unfinished: the next push starts an episode
            buffer.storage.end_streams()
    except BaseException as e:
        if snapshot is not None:
            try:
                buffer.load_state_dict(snapshot)
            except Exception as refused:  # (a closed buffer refuses it as it refused the push)
                raise _BufferFailed(refused) from e
        if isinstance(e, RuntimeError):  # the buffer's own state (closed), not the file's: its error as it is
            raise _BufferFailed(e) from None
        if isinstance(e, FileError) or not isinstance(e, Exception):
            raise
        raise ValueError(
            f"{path!r}: buffer type {target.name!r} refused the transitions from {sink.stored} on"
            f"{'' if snapshot is None else ' (the buffer is as it was before the load)'}: {type(e).__name__}: {e}"
        ) from e
    finally:
        if bar is not None:
            bar.close()
    return stored


def _progress_bar(total: int, progress: Optional[bool], name: str) -> Any:
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit='transition', desc=f'loading {name}')


__all__ = ['FORMATS', 'load_dataset']

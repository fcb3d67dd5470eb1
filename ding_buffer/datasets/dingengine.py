"""The files DI-engine's offline pipelines read (``policy.collect.data_type`` ``'hdf5'`` and ``'naive'``).

``dingengine_hdf5``: an HDF5 file of flat arrays named as the transition fields, one row per transition: ``obs``,
``action``, ``reward``, ``done``, ``next_obs`` (what DI-engine's ``hdf5_save`` writes), plus any other top-level
dataset of the same length (``collect_iter``, ``logit``, ...), each stored as the field of its name.

``dingengine_pkl``: one pickle of a list of transition dicts (what DI-engine's ``naive_save`` writes and its
``NaiveRLDataset`` reads); every dict has the keys of the first, including ``obs``, ``action``, ``reward``,
``next_obs`` and ``done``. The items are stored as they are. Reading a pickle runs code from the file, so it is read
only with ``allow_pickle=True``, and a pickle is read whole (it is one object).

Episodes end after a ``done`` transition, and the rows after the last one are an episode too.
"""

import contextlib
import pickle
from collections.abc import Mapping
from typing import Any, Iterator, Tuple

import numpy as np

from .columns import Chunk
from .hdf5 import HDF5Reader, check_array, check_flags, fail, names, node, read, read_flags, scan, shown

REQUIRED = ('obs', 'action', 'reward', 'done', 'next_obs')


class DingEngineHDF5Reader(HDF5Reader):
    layout = 'dingengine_hdf5'
    flags = ('done',)  # (DI-engine's transitions have no time-limit flag: a 'timeout' array is a field as any other)

    def __init__(self, path: str, f: Any, **_: Any) -> None:
        self.path, self.f = path, f
        missing = [k for k in REQUIRED if k not in f]
        if missing:
            raise fail(
                path,
                missing[0],
                f"is missing; DI-engine's hdf5 layout needs {list(REQUIRED)} (present: {shown(f.keys())})",
            )
        # every top-level key is a field: one dataset each (a group, or a link to nothing, is a FileError naming it)
        self.fields = {k: node(path, f, k) for k in names(path, f)}
        obs = self.fields['obs']
        self.rows = obs.shape[0] if obs.ndim else 0
        for key, ds in self.fields.items():
            if key == 'done':
                check_flags(path, key, ds, self.rows)
            else:
                check_array(path, key, ds, self.rows, obs.shape[1:] if key == 'next_obs' else None)

    @property
    def obs_shape(self) -> tuple:
        return tuple(self.fields['obs'].shape[1:])

    @property
    def names(self) -> Tuple[str, ...]:  # type: ignore[override]
        return tuple(self.fields)

    def validate(self, chunk: int) -> int:
        scan(self.path, [(k, ds, k == 'done') for k, ds in self.fields.items()], self.rows, chunk)
        return self.rows

    def chunks(self, size: int) -> Iterator[Chunk]:
        for start in range(0, self.rows, size):
            stop = min(start + size, self.rows)
            cols = {k: read(self.path, k, ds, start, stop) for k, ds in self.fields.items() if k != 'done'}
            cols['done'] = read_flags(self.path, 'done', self.fields['done'], start, stop)
            ends = cols['done'].copy()
            if stop == self.rows:
                ends[-1] = True
            yield Chunk(ends, columns=cols)


class DingEnginePickleReader:
    layout = 'dingengine_pkl'
    flags = ('done',)  # (DI-engine's transitions have no time-limit flag)

    def __init__(self, path: str, items: Any) -> None:
        self.path = path
        if not isinstance(items, (list, tuple)):
            raise fail(
                path, None, f"holds a {type(items).__name__}; DI-engine's pickle layout is a list of transition dicts"
            )
        keys = None
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise fail(path, None, f"holds a {type(item).__name__} at index {i}; expected transition dicts")
            if keys is None:
                keys = set(item)
                missing = [k for k in REQUIRED if k not in keys]
                if missing:
                    raise fail(
                        path, missing[0], f"is missing from transition 0; DI-engine's transitions have {list(REQUIRED)}"
                    )
            elif set(item) != keys:
                odd = sorted(set(item) ^ keys, key=str)[0]
                where = 'missing from' if odd in keys else 'extra in'
                raise fail(
                    path,
                    odd,
                    f"is {where} transition {i}; every transition has the keys of the first {sorted(keys, key=str)}",
                )
        self.items = list(items)
        self.rows = len(self.items)

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str, allow_pickle: bool = False, **_: Any) -> Iterator['DingEnginePickleReader']:
        if not allow_pickle:
            raise fail(
                path,
                None,
                "is a pickle (DI-engine's list of transition dicts); reading it runs code from the file. Pass "
                "allow_pickle=True (the buffer owner's config: dataset.allow_pickle) only for a file you trust",
            )
        try:
            with open(path, 'rb') as f:
                items = pickle.load(f)
        except Exception as e:  # a damaged or foreign pickle raises nearly anything
            raise fail(path, None, f"is not a readable pickle (truncated or damaged?): {type(e).__name__}: {e}") from e
        yield cls(path, items)

    @property
    def obs_shape(self) -> tuple:
        return tuple(np.shape(self.items[0]['obs'])) if self.items else ()

    @property
    def names(self) -> Tuple[Any, ...]:
        return tuple(self.items[0]) if self.items else ()

    def validate(self, chunk: int) -> int:
        self.ends = np.zeros(self.rows, dtype=bool)
        for i, item in enumerate(self.items):
            try:
                flag = np.asarray(item['done'].detach().cpu() if hasattr(item['done'], 'detach') else item['done'])
            except (TypeError, ValueError, RuntimeError):
                flag = np.asarray(None)
            if flag.size != 1 or flag.dtype.kind not in 'biuf' or flag.reshape(()).item() not in (0, 1):
                raise fail(self.path, 'done', f"of transition {i} is {item['done']!r:.60}, expected one bool or 0 / 1")
            self.ends[i] = bool(flag.reshape(()).item())
        if self.rows:
            self.ends[-1] = True
        return self.rows

    def chunks(self, size: int) -> Iterator[Chunk]:
        for start in range(0, self.rows, size):
            yield Chunk(self.ends[start : start + size], rows=self.items[start : start + size])

"""The D4RL layout: one HDF5 file of flat arrays, one row per step.

=====================  ==========  ===========================================================================
key                    rows        transition field
=====================  ==========  ===========================================================================
``observations``       N           ``obs``
``actions``            N           ``action``
``rewards``            N           ``reward``
``terminals``          N           ``done`` (bool or 0/1): the episode terminated
``timeouts``           N           ``timeout`` (optional; missing: all false): the episode was cut by a time limit
``next_observations``  N           ``next_obs`` (optional)
=====================  ==========  ===========================================================================

Episodes end where ``terminals | timeouts``; the rows after the last such step are an episode too. Without
``next_observations`` the next observation of a step is the observation of the next row, inside its episode. The
last step of an episode has none: a terminated one keeps its step with a ``next_obs`` of zeros (the target does
not read it: ``done`` is true), as TorchRL fills it; a step cut by a time limit (or the file's last row) is dropped,
as ``d4rl.qlearning_dataset`` and DI-engine's D4RL dataset drop it, and the step before it -- now the last stored
step of its episode -- gets ``timeout`` true. Other keys (``infos/...``, ``metadata/...``) are not read.
"""

from typing import Any, Iterator

import numpy as np

from .columns import Chunk
from .hdf5 import HDF5Reader, check_array, check_flags, node, read, read_flags, scan

KEYS = {'observations': 'obs', 'actions': 'action', 'rewards': 'reward'}


class D4RLReader(HDF5Reader):
    """Reads a D4RL file in row ranges (see the module). ``frames``: a terminated step's missing next observation
    is its own stack shifted by one zero frame (what a frames buffer accepts) instead of zeros."""

    layout = 'd4rl'

    def __init__(self, path: str, f: Any, frames: bool = False, **_: Any) -> None:
        self.path, self.f, self.frames = path, f, frames
        self.obs = node(path, f, 'observations')
        self.rows = self.obs.shape[0] if self.obs.ndim else 0
        check_array(path, 'observations', self.obs, self.rows)
        self.fields = {KEYS[k]: node(path, f, k) for k in KEYS}
        self.terminals = node(path, f, 'terminals')
        self.timeouts = node(path, f, 'timeouts') if 'timeouts' in f else None
        self.next_obs = node(path, f, 'next_observations') if 'next_observations' in f else None
        for key in ('actions', 'rewards'):
            check_array(path, key, self.fields[KEYS[key]], self.rows)
        if self.next_obs is not None:
            check_array(path, 'next_observations', self.next_obs, self.rows, self.obs.shape[1:])
        check_flags(path, 'terminals', self.terminals, self.rows)
        if self.timeouts is not None:
            check_flags(path, 'timeouts', self.timeouts, self.rows)

    @property
    def obs_shape(self) -> tuple:
        return tuple(self.obs.shape[1:])

    def validate(self, chunk: int) -> int:
        """Read the whole file (a truncated or damaged one fails here); returns the number of transitions."""
        items = [('observations', self.obs, False), ('terminals', self.terminals, True)]
        items += [(k, self.f[k], False) for k in ('actions', 'rewards')]
        items += [('timeouts', self.timeouts, True)] if self.timeouts is not None else []
        items += [('next_observations', self.next_obs, False)] if self.next_obs is not None else []
        scan(self.path, items, self.rows, chunk)
        if self.next_obs is not None:
            return self.rows
        return self.rows - sum(
            int(self._flags(a, min(a + chunk, self.rows))[3].sum()) for a in range(0, self.rows, chunk)
        )

    def _flags(self, start: int, stop: int) -> tuple:
        """(terminal, timeout, ends, dropped) of rows ``[start, stop)``: ends = ends its episode (the file's last
        row too); dropped = ends its episode without terminating, with no recorded next observation (only
        meaningful without ``next_observations``)."""
        terminal = read_flags(self.path, 'terminals', self.terminals, start, stop)
        timeout = (
            np.zeros_like(terminal)
            if self.timeouts is None
            else read_flags(self.path, 'timeouts', self.timeouts, start, stop)
        )
        ends = terminal | timeout
        if stop == self.rows and stop > start:
            ends[-1] = True
        return terminal, timeout, ends, ends & ~terminal

    def chunks(self, size: int) -> Iterator[Chunk]:
        for start in range(0, self.rows, size):
            yield self._chunk(start, min(start + size, self.rows))

    def _chunk(self, start: int, stop: int) -> Chunk:
        n, path = stop - start, self.path
        cols = {'obs': read(path, 'observations', self.obs, start, stop)}
        cols.update(
            {name: read(path, key, self.fields[name], start, stop) for key, name in KEYS.items() if name != 'obs'}
        )
        if self.next_obs is not None:
            terminal, timeout, ends, _ = self._flags(start, stop)
            cols['next_obs'] = read(path, 'next_observations', self.next_obs, start, stop)
            cols.update(done=terminal, timeout=timeout)
            return Chunk(ends, columns=cols)
        # without next observations: look one row ahead (the next observation, and whether that row is dropped)
        ahead = min(stop + 1, self.rows)
        terminal, timeout, ends, dropped = self._flags(start, ahead)
        ends = ends[:n]  # the look-ahead row is the next chunk's
        following = read(path, 'observations', self.obs, start + 1, ahead)
        if len(following) < n:  # the file's last row: dropped below (or terminal: filled below)
            following = np.concatenate([following, np.zeros_like(cols['obs'][:1])])
        nxt = np.array(following, copy=True)
        last_terminal = ends & terminal[:n]
        if last_terminal.any():
            nxt[last_terminal] = self._fill(cols['obs'][last_terminal])
        cut = ~ends & np.append(dropped[1:], False)[:n]  # the step before a dropped one ends its stored episode
        cols.update(next_obs=nxt, done=terminal[:n], timeout=timeout[:n] | cut)
        keep = ~dropped[:n]
        cols = {k: v[keep] for k, v in cols.items()}
        return Chunk((ends | cut)[keep], columns=cols)

    def _fill(self, obs: np.ndarray) -> np.ndarray:
        if not self.frames:
            return np.zeros_like(obs)
        return np.concatenate([obs[:, 1:], np.zeros_like(obs[:, :1])], axis=1)

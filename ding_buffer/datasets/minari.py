"""Minari's HDF5 layout (``main_data.hdf5``): one group ``episode_<id>`` per episode, read in the order of the ids.

An episode of N steps holds ``observations`` (N + 1 rows: the reset observation and one after every step),
``actions``, ``rewards``, ``terminations`` and ``truncations`` (N rows). Observations and actions of ``Dict`` /
``Tuple`` spaces are groups (a ``Tuple``'s members are named ``_index_0``, ``_index_1``, ...): they become nested
dicts of the same keys, which list storage keeps as they are and tensor storage stores one column per leaf
(``obs.image``, ...). Step ``t`` is ``obs = observations[t]``, ``next_obs = observations[t + 1]``, ``action``,
``reward``, ``done = terminations[t]``, ``timeout = truncations[t]``. Each group is an episode (and so is a piece
ending with a termination or truncation inside one). ``infos`` and the groups' attributes are not read.
"""

import re
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from .columns import Chunk, Rechunker
from .hdf5 import (
    HDF5Reader,
    check_array,
    check_flags,
    fail,
    leaves,
    node,
    read_flags,
    read_tree,
    scan,
    shown,
)

EPISODE = re.compile(r'episode_(\d+)')


class MinariReader(HDF5Reader):
    layout = 'minari'

    def __init__(self, path: str, f: Any, frames: bool = False, **_: Any) -> None:
        self.path, self.f, self.frames = path, f, frames
        text = [name for name in f.keys() if isinstance(name, str)]  # (h5py gives a name that is not text as bytes)
        ids = sorted((int(m.group(1)), name) for name in text if (m := EPISODE.fullmatch(name)))
        if not ids:
            raise fail(
                path, None, f"has no 'episode_<id>' groups (Minari layout expected; keys: {shown(f.keys())[:8]})"
            )
        self.episodes: List[Dict[str, Any]] = []
        for _, name in ids:
            self.episodes.append(self._episode(name))
        self.rows = sum(e['steps'] for e in self.episodes)

    def _episode(self, name: str) -> Dict[str, Any]:
        path, group = self.path, node(self.path, self.f, name, group_only=True)
        ep = {'name': name, 'obs': node(path, group, 'observations', group_ok=True)}
        ep['action'] = node(path, group, 'actions', group_ok=True)
        for key in ('rewards', 'terminations', 'truncations'):
            ep[key] = node(path, group, key)
        # steps: what most step columns say (observations hold one row more), so a check blames the odd one out
        lengths = [ep[k].shape[0] if ep[k].ndim else 0 for k in ('rewards', 'terminations', 'truncations')]
        for part, key, extra in (('action', 'actions', 0), ('obs', 'observations', 1)):
            lengths += [ds.shape[0] - extra for _, ds in leaves(path, ep[part], f'{name}/{key}') if ds.ndim]
        steps = max(lengths, key=lengths.count)
        check_array(path, f'{name}/rewards', ep['rewards'], steps)
        for key in ('terminations', 'truncations'):
            check_flags(path, f'{name}/{key}', ep[key], steps)
        layout: Dict[str, Tuple[tuple, str]] = {}
        for part, rows, key in (('obs', steps + 1, 'observations'), ('action', steps, 'actions')):
            for full, ds in leaves(path, ep[part], f'{name}/{key}'):
                check_array(path, full, ds, rows)
                layout[full.split('/', 1)[1]] = (tuple(ds.shape[1:]), str(ds.dtype))
        layout['rewards'] = (tuple(ep['rewards'].shape[1:]), str(ep['rewards'].dtype))  # one column for all
        first = self.episodes[0] if self.episodes else None
        for key in sorted(set(layout) | set(first['layout'] if first else layout)):
            if first and first['layout'].get(key) != layout.get(key):
                got, want = _shape(layout.get(key)), _shape(first['layout'].get(key))
                raise fail(path, f'{name}/{key}', f"is {got}, expected {want} as in {first['name']}")
        ep.update(steps=steps, layout=layout)
        return ep

    @property
    def obs_shape(self) -> tuple:
        """Per-step shape of the observations (``()`` for nested ones)."""
        obs = self.episodes[0]['obs']
        return tuple(obs.shape[1:]) if hasattr(obs, 'shape') else ()

    def validate(self, chunk: int) -> int:
        for ep in self.episodes:
            name = ep['name']
            obs = [(k, ds, False) for k, ds in leaves(self.path, ep['obs'], f'{name}/observations')]
            acts = [(k, ds, False) for k, ds in leaves(self.path, ep['action'], f'{name}/actions')]
            flags = [(f'{name}/{k}', ep[k], True) for k in ('terminations', 'truncations')]
            scan(self.path, acts + flags + [(f'{name}/rewards', ep['rewards'], False)], ep['steps'], chunk)
            scan(self.path, obs, ep['steps'] + 1, chunk)
        return self.rows

    def chunks(self, size: int) -> Iterator[Chunk]:
        regroup = Rechunker(size)
        for ep in self.episodes:
            for start in range(0, ep['steps'], size):
                yield from regroup.add(self._piece(ep, start, min(start + size, ep['steps'])))
        yield from regroup.flush()

    def _piece(self, ep: Dict[str, Any], start: int, stop: int) -> Chunk:
        path, name = self.path, ep['name']
        terminal = read_flags(path, f'{name}/terminations', ep['terminations'], start, stop)
        timeout = read_flags(path, f'{name}/truncations', ep['truncations'], start, stop)
        ends = terminal | timeout
        if stop == ep['steps']:
            ends[-1] = True
            timeout[-1] |= self.frames and not terminal[-1]  # (a frames buffer's stream ends with a flag, as in D4RL)
        cols = {
            'obs': read_tree(path, ep['obs'], f'{name}/observations', start, stop),
            'action': read_tree(path, ep['action'], f'{name}/actions', start, stop),
            'reward': read_tree(path, ep['rewards'], f'{name}/rewards', start, stop),
            'next_obs': read_tree(path, ep['obs'], f'{name}/observations', start + 1, stop + 1),
            'done': terminal,
            'timeout': timeout,
        }
        return Chunk(np.asarray(ends), columns=cols)


def _shape(layout: Any) -> str:
    return 'missing' if layout is None else f'rows of shape {layout[0]} and dtype {layout[1]}'

"""Putting read transitions into a buffer as its type takes them, all or nothing.

* types of transitions (``item_kind`` ``'transition'`` / ``'sequence'``: naive, advanced, elastic, sequence, deque):
  a chunk at a time, ``extend`` of the chunk's columns on tensor storage, ``push`` of one dict a transition on list
  storage (and for items read as dicts);
* ``storage.frames``: ``push`` of the chunk's transitions in order, so each episode is one stream;
* types of episodes (``'episode'``: episode, prioritized_episode): one ``push`` of the episodes a chunk completes,
  each a dict of ``[T, ...]`` tensors (a list of dicts when read as dicts).

A push the buffer refuses (an error, or fewer items taken, as a rate limiter answers) fails the load; the buffer is
then restored from the ``state_dict()`` taken before it (``atomic``).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..config import machine_memory
from .columns import Chunk, rows_of, to_torch, tree_concat, tree_leaves
from .hdf5 import fail

TRANSITION_KINDS = ('transition', 'sequence')
_FLAG_KEYS = {'done': ('done_key', 'done'), 'timeout': ('truncated_key', 'truncated')}  # flag: frames key, default
EPISODE_KINDS = ('episode',)


class Refused(ValueError):
    """The buffer took fewer items than it was given."""


@dataclass
class Target:
    """What a buffer takes: its type name, whether it stores episodes, its storage, its frames settings."""

    name: str
    episodes: bool
    tensor: bool
    frames: Optional[Dict[str, Any]]
    flags: Tuple[str, ...] = ()  # the reader's episode-end flags (``check``): 'done', and 'timeout' where it has one

    @classmethod
    def of(cls, buffer: Any) -> 'Target':
        cfg = getattr(buffer, 'cfg', None) or {}
        name = cfg.get('type', type(buffer).__name__)
        members = getattr(buffer, 'member_names', None)
        if members is not None:  # a mixture: which member the file is for is the user's to say
            raise ValueError(
                f"buffer type {name!r} holds the member buffers {list(members)}; fill one of them, e.g. "
                f"load_dataset(buffer.members[{members[0]!r}], path), or give that member a 'dataset' section"
            )
        kind = buffer.capabilities()['item_kind']
        if kind not in TRANSITION_KINDS + EPISODE_KINDS:
            raise ValueError(
                f"buffer type {name!r} stores items of kind {kind!r}; a dataset fills a buffer of transitions "
                f"(naive, advanced, elastic, sequence, deque) or of episodes (episode, prioritized_episode)"
            )
        storage = cfg.get('storage') or {}
        frames = storage.get('frames')
        return cls(
            name,
            kind in EPISODE_KINDS,
            storage.get('type', 'list') == 'tensor',
            None if frames is None else dict(frames),
        )

    def _renamed(self) -> Dict[str, str]:
        """A frames buffer's streams end at its flags: the reader's terminal flag ``done`` goes under the frames'
        ``done_key``, its time-limit flag ``timeout`` under ``truncated_key`` (None: kept as they are)."""
        if self.frames is None:
            return {}
        names = {flag: self.frames.get(*_FLAG_KEYS[flag]) for flag in self.flags}
        return {flag: name for flag, name in names.items() if name is not None and name != flag}

    def flags_named(self, columns: Any) -> Any:
        """``columns`` (or a row) with the flags renamed at once (``_renamed``; ``check`` refused a clash)."""
        names = self._renamed()
        if not names or not isinstance(columns, dict):
            return columns
        return {names.get(k, k): v for k, v in columns.items()}

    def check(self, path: str, reader: Any, columns: bool = True) -> None:
        """A frames buffer needs stacks: ``obs`` / ``next_obs`` fields of per-step shape ``[stack, *frame]``; from a
        file of ``columns`` (D4RL, Minari, DI-engine HDF5), in one stream (no field there names an environment); its
        streams end at the ``reader``'s flags, under names no other field of the file has."""
        self.flags, obs_shape = reader.flags, reader.obs_shape
        if self.frames is None:
            return
        if columns and self.frames.get('env_key') is not None:
            raise ValueError(
                f"buffer type {self.name!r} splits frame streams by the field {self.frames['env_key']!r} "
                f"(storage.frames.env_key); a dataset's transitions are one stream, in file order, with no such "
                f"field: set env_key=None to load it"
            )
        renamed = self._renamed()
        for flag in self.flags:
            key, name = _FLAG_KEYS[flag][0], self.frames.get(*_FLAG_KEYS[flag])
            if name is None and not self.episodes:  # (an episode is a stream of its own)
                raise ValueError(
                    f"config key 'storage.frames.{key}' is None: this buffer's frame streams would not end at the "
                    f"dataset's {flag!r} flags, so the step after one would be refused; name a field for them"
                )
            if name in reader.names and flag in renamed and name not in renamed:
                raise ValueError(
                    f"config key 'storage.frames.{key}' is {name!r}, a field the dataset holds too: its {flag!r} "
                    f"flags would replace it; name another field"
                )
        keys = (self.frames.get('key', 'obs'), self.frames.get('next_key', 'next_obs'))
        if keys != ('obs', 'next_obs'):
            raise ValueError(
                f"buffer type {self.name!r} keeps frames of the fields {keys}; a dataset's observations are the "
                f"fields ('obs', 'next_obs'): set storage.frames key='obs', next_key='next_obs'"
            )
        stack = self.frames.get('stack')
        if len(obs_shape) < 2 or (stack is not None and obs_shape[0] != stack):
            want = f"[{stack or 'stack'}, *frame]"
            raise ValueError(
                f"{path!r}: observations of per-step shape {obs_shape} are not frame stacks {want}, which a buffer "
                f"with storage.frames stores one frame a step; stack the frames in the file first (each step's obs "
                f"the last {stack or 'k'} frames, next_obs the same shifted by one) or use a buffer without frames"
            )


class TransitionSink:
    """``stored``: the transitions the buffer has taken so far."""

    def __init__(self, buffer: Any, target: Target) -> None:
        self.buffer, self.target, self.stored = buffer, target, 0

    def put(self, chunk: Chunk) -> int:
        if not len(chunk):  # every row of it dropped (time-limit ends without next observations): nothing to push
            return 0
        if chunk.rows is not None:
            n = _push(self.buffer, [self.target.flags_named(row) for row in chunk.rows])
        elif self.target.tensor and self.target.frames is None:
            n = self.buffer.extend(to_torch(chunk.columns))
            _check_taken(n, len(chunk))
        else:
            n = _push(self.buffer, rows_of(self.target.flags_named(chunk.columns)))
        self.stored += n
        return n

    def finish(self) -> int:
        return 0


class EpisodeSink:
    """Cuts chunks at episode ends; an episode spanning chunks is held until its end (or the end of the data). An
    episode that would not fit in memory twice over (held, then joined) is a ``FileError`` naming ``path``."""

    def __init__(self, buffer: Any, target: Target, path: str) -> None:
        self.buffer, self.target, self.stored, self.path = buffer, target, 0, path
        self.held: List[Chunk] = []
        self.held_bytes = 0

    def put(self, chunk: Chunk) -> int:
        done, start = [], 0
        for end in np.flatnonzero(chunk.ends):
            self._hold(chunk.part(start, end + 1))
            done.append(self._episode())
            start = end + 1
        if start < len(chunk):
            self._hold(chunk.part(start))
        return self._push(done)

    def _hold(self, part: Chunk) -> None:
        self.held.append(part)
        if part.columns is not None:
            self.held_bytes += sum(a.nbytes for _, a in tree_leaves(part.columns))
            if 2 * self.held_bytes > machine_memory():
                steps = sum(len(p) for p in self.held)
                raise fail(
                    self.path,
                    None,
                    f"holds an episode of more than {steps} steps ({self.held_bytes:.3g} bytes so far) from transition "
                    f"{self.stored} on: joined, it needs more than this machine's memory (no episode end flagged?)",
                )

    def finish(self) -> int:
        return self._push([self._episode()] if self.held else [])

    def _push(self, episodes: list) -> int:
        if not episodes:
            return 0
        n = _push(self.buffer, [e for e, _ in episodes])
        self.stored += sum(steps for _, steps in episodes)
        return n

    def _episode(self) -> tuple:
        """(the held episode as the buffer takes it, its steps)."""
        parts, self.held, self.held_bytes = self.held, [], 0
        steps = sum(len(p) for p in parts)
        named = self.target.flags_named  # (the flags under a frames buffer's names)
        if parts[0].rows is not None:
            return [named(row) for p in parts for row in p.rows], steps
        return to_torch(named(tree_concat([p.columns for p in parts])), copy=not self.target.tensor), steps


def _push(buffer: Any, items: list) -> int:
    n = buffer.push(items)
    _check_taken(n, len(items))
    return n


def _check_taken(n: int, given: int) -> None:
    if n != given:
        raise Refused(f"the buffer took {n} of {given} items (a rate limiter or a rule of its own refused the rest)")

"""Episode stores behind ``EpisodeReplayBuffer``: which episodes exist, how long they are, and their data.

* ``ObjectEpisodes`` (list storage): each episode is one stored object (a list of transitions or a dict of
  time-stacked leaves) in a ``ListStorage`` whose ring is the episode ring.
* ``FlatEpisodes`` (tensor storage): transitions of all episodes live contiguously (modulo wrap-around) in one
  ``TensorStorage`` of ``max_transitions`` slots; a separate episode ring records each episode's first slot
  and length. Windows are gathered with one ``[B, T]`` index per field.

Both evict the oldest *whole* episodes until a new one fits the episode and transition limits, so the
transition ring never overwrites live data and stays hole-free. Per episode slot they keep the length and the
``collect_iter`` column (the min over the episode's transitions; ``NO_ITER`` without one) that staleness reads.
A ``listener`` (e.g. ``WindowPriorities``) hears ``episode_added`` / ``episode_removed`` with the episode's first
transition slot (``FlatEpisodes``; -1 for ``ObjectEpisodes``) and length. Not thread-safe (the buffer's lock).
"""

import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..config import check_fits_memory
from ..storage import FrameStorage, ListStorage, RingIndex, build_storage, storage_from_state
from ..storage.base import NO_ITER, collect_iter_of
from ..storage.tensordict_io import is_tensordict
from ..storage.tree import batch_len, flatten, path_name, unflatten


def episode_length(episode: Any, i: int) -> int:
    """Length of a list episode or of a dict of time-stacked leaves; raises for anything else."""
    if isinstance(episode, list):
        if not episode:
            raise ValueError(f"episode {i} is empty")
        return len(episode)
    if isinstance(episode, Mapping):
        flat = flatten(episode)
        if not flat:
            raise ValueError(f"episode {i} is an empty dict")
        lengths = {path_name(p): batch_len(v, p) for p, v in flat.items()}
        n = next(iter(lengths.values()))
        if any(v != n for v in lengths.values()):
            raise ValueError(f"episode {i} has fields of different lengths: {lengths}")
        if n == 0:
            raise ValueError(f"episode {i} has length 0")
        return n
    raise TypeError(
        f"episode {i} must be a list of transitions or a dict of time-stacked tensors, got {type(episode).__name__}"
    )


def object_collect_iter(episode: Any) -> int:
    """The min ``collect_iter`` of a list episode's transitions or of a dict episode's leaf; ``NO_ITER`` if none."""
    if isinstance(episode, list):
        return collect_iter_of([t.get('collect_iter') if isinstance(t, Mapping) else None for t in episode])
    return collect_iter_of(flatten(episode).get(('collect_iter',)))


# Keys a window batch adds (tensor storage) or a padded dict window adds (list storage): an episode carrying a
# field of that name would be overwritten in the output, so it is refused at push.
FLAT_WINDOW_KEYS = ('mask', 'episode_id', 'episode_idx', 'start')
PADDED_WINDOW_KEYS = ('mask',)


def check_reserved(episode: Any, i: int, reserved: Tuple[str, ...]) -> None:
    """Refuse an episode with a top-level field the window output would overwrite."""
    fields = (
        episode if isinstance(episode, Mapping) else (episode[0] if episode and isinstance(episode[0], Mapping) else {})
    )
    clash = sorted(k for k in reserved if k in fields)
    if clash:
        raise ValueError(
            f"episode {i} has field(s) {clash}, which sampled windows add; rename them (reserved: {list(reserved)})"
        )


class _EpisodeStore:
    """Shared eviction logic; subclasses provide the ring, the lengths and the data access."""

    ring: RingIndex
    length: np.ndarray

    reserved: Tuple[str, ...] = ()

    def __init__(self, max_episodes: int, max_transitions: Optional[int]) -> None:
        # per episode: a flag, a length, a collect_iter and (flat) a start, checked before they are allocated
        check_fits_memory("config key 'replay_buffer_size'", max_episodes, max_episodes * 25)
        self.max_episodes = max_episodes
        self.max_transitions = max_transitions
        self.length = np.zeros(max_episodes, dtype=np.int64)
        self.ci = np.full(max_episodes, NO_ITER, dtype=np.int64)
        self.transitions = 0
        self.listener: Any = None

    def release(self) -> None:
        """Free the storage's memmap files (``close``)."""
        self.storage.release()

    def reserve(self, keys: Tuple[str, ...]) -> None:
        """More keys the sampler adds to its output (prioritized windows: ``priority``, ``IS``)."""
        self.reserved = tuple(self.reserved) + tuple(keys)

    def listen(self, listener: Any) -> None:
        """Tell ``listener`` (``episode_added`` / ``episode_removed``) about every episode that comes or goes."""
        self.listener = listener

    def first(self, slot: int) -> int:
        """First transition slot of an episode (flat stores); -1 where episodes are objects."""
        return -1

    def _added(self, slot: int, n: int) -> None:
        self.ci[slot] = self.episode_collect_iter(slot)
        if self.listener is not None:
            self.listener.episode_added(slot, self.first(slot), n)

    def _removing(self, slots: np.ndarray) -> None:
        self.ci[slots] = NO_ITER
        if self.listener is not None:
            for slot in slots.tolist():
                self.listener.episode_removed(slot, self.first(slot), int(self.length[slot]))

    def oldest(self, k: int) -> np.ndarray:
        return self.ring.oldest(k)

    def live(self, slots: np.ndarray) -> np.ndarray:
        return self.ring.valid[slots]

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return self.ci[slots]

    def episode_collect_iter(self, slot: int) -> int:
        raise NotImplementedError

    def _recompute_ci(self) -> None:
        for slot in self.ring.ordered_slots().tolist():
            self.ci[slot] = self.episode_collect_iter(slot)

    def check_fits(self, n: int, i: int) -> None:
        if self.max_transitions is not None and n > self.max_transitions:
            raise ValueError(f"episode {i} has {n} transitions, more than max_transitions={self.max_transitions}")

    def make_room(self, n: int) -> List[Any]:
        """Evict the oldest whole episodes until one more episode of ``n`` transitions fits."""
        evicted: List[Any] = []
        while self.ring.count and self._needs_room(n):
            evicted += self.remove(self.ring.oldest(1))
        return evicted

    def _needs_room(self, n: int) -> bool:
        # the ring writes at its tail: an episode removed from the middle (max_use, a rule) leaves a hole the
        # ring does not fill, so the slot at the tail may still hold a live episode
        ring = self.ring
        return (
            ring.count >= self.max_episodes
            or bool(ring.valid[ring.tail])
            or (self.max_transitions is not None and self.transitions + n > self.max_transitions)
        )

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        return self.length[slots]

    def window_counts(self, slots: np.ndarray, unroll_len: int, pad: bool) -> np.ndarray:
        """Windows of ``unroll_len`` steps each episode offers: ``L - T + 1`` (one if shorter and ``pad``)."""
        lengths = self.length[slots]
        # every T longer than any episode can be counts alike (a T beyond int64 would overflow the subtraction)
        unroll_len = min(unroll_len, 1 << 62)
        windows = np.maximum(lengths - unroll_len + 1, 0)
        return np.where(lengths < unroll_len, 1, windows) if pad else windows

    def remove(self, slots: np.ndarray) -> List[Any]:
        raise NotImplementedError


class ObjectEpisodes(_EpisodeStore):
    def __init__(self, max_episodes: int, max_transitions: Optional[int]) -> None:
        super().__init__(max_episodes, max_transitions)
        self.storage = ListStorage(max_episodes, item_columns=False)  # an episode's collect_iter is read here
        self.ring = self.storage.ring

    def prepare(self, episodes: List[Any]) -> List[Tuple[Any, int]]:
        out = []
        for i, ep in enumerate(episodes):
            n = episode_length(ep, i)
            self.check_fits(n, i)
            if isinstance(ep, Mapping):
                check_reserved(ep, i, PADDED_WINDOW_KEYS)
            try:
                object_collect_iter(ep)  # validated now: it is read again once the episode is stored
            except ValueError as e:
                raise ValueError(f"episode {i}: {e}") from None
            out.append((ep, n))
        return out

    def write(self, episode: Any, n: int) -> List[Any]:
        evicted = self.make_room(n)
        result = self.storage.write(self.storage.prepare([episode]))
        self.length[result.slots] = n
        self.transitions += n
        self._added(int(result.slots[0]), n)
        return evicted

    def episode_collect_iter(self, slot: int) -> int:
        return object_collect_iter(self.storage.get(slot))

    def remove(self, slots: np.ndarray) -> List[Any]:
        slots = slots[self.ring.valid[slots]]
        self._removing(slots)
        self.transitions -= int(self.length[slots].sum())
        self.length[slots] = 0
        return self.storage.remove(slots)

    def clear(self, reset_push_count: bool = False) -> List[Any]:
        self.length[:] = 0
        self.ci[:] = NO_ITER
        self.transitions = 0
        return self.storage.clear(reset_push_count)

    def episodes(self, slots: np.ndarray) -> List[Any]:
        return self.storage.gather(slots)

    def windows(self, slots: np.ndarray, starts: np.ndarray, unroll_len: int, pad: bool) -> List[Any]:
        """List episodes give lists (padded with ``None``); dict episodes give dicts of ``[T, ...]`` slices
        (zero-padded) with a ``mask`` bool tensor when ``pad``; TensorDict episodes give the same fields as a
        TensorDict with ``batch_size=[T]`` (the episode's own type, as whole episodes come back)."""
        out = []
        for ep, s in zip(self.storage.gather(slots), starts.tolist()):
            if isinstance(ep, list):
                window = ep[s : s + unroll_len]
                out.append(window + [None] * (unroll_len - len(window)) if pad else window)
                continue
            leaves = flatten(ep)
            flat = {p: v[s : s + unroll_len] for p, v in leaves.items()}
            valid = batch_len(next(iter(flat.values())), ())
            if pad:
                flat = {p: _pad_leaf(leaves[p], v, unroll_len) for p, v in flat.items()}
                window = unflatten(flat)
                window['mask'] = torch.arange(unroll_len) < valid
            else:
                window = unflatten(flat)
            out.append(_tensordict_window(window, ep, unroll_len) if is_tensordict(ep) else window)
        return out

    def state_dict(self) -> Dict[str, Any]:
        return {'storage': self.storage.state_dict(), 'length': torch.from_numpy(self.length.copy())}

    def restored(self, state: Mapping, storage_cfg: Mapping) -> 'ObjectEpisodes':
        """A new store like this one holding ``state`` (validated against its data; nothing changes here)."""
        new = ObjectEpisodes(self.max_episodes, self.max_transitions)
        new.storage = storage_from_state(storage_cfg, self.max_episodes, state['storage'], item_columns=False)
        new.ring = new.storage.ring
        new.length = _restore_lengths(state, new.ring, self.max_episodes, self.max_transitions)
        for slot in new.ring.ordered_slots():
            if episode_length(new.storage.get(int(slot)), int(slot)) != new.length[slot]:
                raise ValueError(f"saved length of episode slot {slot} does not match its data")
        new.transitions = int(new.length.sum())
        new._recompute_ci()
        if self.max_transitions is not None and new.transitions > self.max_transitions:
            raise ValueError(
                f"saved buffer holds {new.transitions} transitions, more than max_transitions={self.max_transitions}"
            )
        return new


class FlatEpisodes(_EpisodeStore):
    """Transitions of all episodes in one tensor storage (``storage_cfg``: the buffer's ``storage`` section; with
    ``frames`` each frame is stored once, every episode a stream of its own, see ``FrameStorage``)."""

    def __init__(self, max_episodes: int, max_transitions: int, storage_cfg: Mapping) -> None:
        super().__init__(max_episodes, max_transitions)
        self.storage = build_storage(storage_cfg, max_transitions, episodes=max_episodes, key='max_transitions')
        self.frames = isinstance(self.storage, FrameStorage)
        self.ring = RingIndex(max_episodes)
        self.start = np.zeros(max_episodes, dtype=np.int64)
        self._writing: Any = None  # the prepared episode being written (its frames may need room: _needs_room)

    def prepare(self, episodes: List[Any]) -> List[Tuple[Any, int]]:
        out, schema, after = [], self.storage.schema, None
        for i, ep in enumerate(episodes):
            n = episode_length(ep, i)
            self.check_fits(n, i)
            check_reserved(ep, i, FLAT_WINDOW_KEYS + self.reserved)
            more = {'after': after} if self.frames else {}  # an earlier episode of this push is written first
            try:
                prepared = (
                    self.storage.prepare(ep, schema, **more)
                    if isinstance(ep, list)
                    else self.storage.prepare_batch(ep, schema, **more)
                )
            except (TypeError, ValueError) as e:
                raise type(e)(f"episode {i}: {e}") from None
            # the schema the next episode must match (a frame storage wraps the tensor storage's payload)
            schema, after = (prepared.payload[0][0] if self.frames else prepared.payload[0]), prepared
            out.append((prepared, n))
        return out

    def write(self, prepared: Any, n: int) -> List[Any]:
        self._writing = prepared
        try:
            evicted = self.make_room(n)
        finally:
            self._writing = None
        # the transitions first: a write that fails (the fields allocated at the first push: memory, a memmap
        # directory) leaves no empty episode behind
        result = self.storage.write(prepared)
        slot = self.ring.next_slot()  # its columns before the index counts it (``Storage.write``)
        # make_room guarantees no overwrite, of transitions or of their frames
        assert prepared.dropped == 0 and len(result.slots) == n and result.expired is None
        self.start[slot] = result.slots[0]
        self.length[slot] = n
        self.ring.commit(1)
        self.transitions += n
        self._added(slot, n)
        return evicted

    def first(self, slot: int) -> int:
        return int(self.start[slot])

    def _needs_room(self, n: int) -> bool:
        """Also while the next ``n`` transition slots hold live data: an episode removed from the middle (by
        ``max_use`` or a rule) leaves a hole the ring does not write into, so the oldest must make way."""
        ring = self.storage.ring
        return super()._needs_room(n) or bool(ring.valid[ring.next_slots(n)].any()) or self._frames_short()

    def _frames_short(self) -> bool:
        """The episode being written overwrites frames of the oldest stored episode (every later one's frames
        are newer: episodes are written, and leave, in order)."""
        if not self.frames or self._writing is None or not self.ring.count:
            return False
        below = self.storage.overwrites_below(self._writing)
        return below is not None and self.storage.oldest_frame_of(self.first(int(self.ring.oldest(1)[0]))) < below

    def episode_collect_iter(self, slot: int) -> int:
        ci = self.storage.collect_iter(self._transition_slots(np.array(slot), np.arange(self.length[slot])))
        return int(ci.min()) if len(ci) else NO_ITER

    def _transition_slots(self, ep_slots: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        return (self.start[ep_slots][..., None] + offsets) % self.storage.capacity

    def remove(self, slots: np.ndarray) -> List[Any]:
        slots = slots[self.ring.valid[slots]]
        self._removing(slots)
        for slot in slots.tolist():
            self.storage.remove(self._transition_slots(np.array(slot), np.arange(self.length[slot])))
        self.transitions -= int(self.length[slots].sum())
        self.length[slots] = 0
        self.ring.remove(slots)
        return []

    def clear(self, reset_push_count: bool = False) -> List[Any]:
        self.ring.clear(reset_push_count)
        self.storage.clear()
        self.length[:] = 0
        self.ci[:] = NO_ITER
        self.transitions = 0
        return []

    def episodes(self, slots: np.ndarray) -> List[Dict[str, Any]]:
        return [self.storage.gather(self._transition_slots(np.array(s), np.arange(self.length[s]))) for s in slots]

    def windows(self, slots: np.ndarray, starts: np.ndarray, unroll_len: int, pad: bool) -> Dict[str, Any]:
        """One dict of ``[B, T, ...]`` tensors plus ``mask`` [B, T] (False on padding, which is zeroed),
        ``episode_id``/``episode_idx``/``start`` [B]; ``replay_buffer_idx``/``replay_unique_id`` are -1 on padding."""
        steps = starts[:, None] + np.arange(unroll_len)[None, :]
        lengths = self.length[slots][:, None]
        mask = steps < lengths
        steps = np.minimum(steps, lengths - 1)  # padding reads the last transition, then gets zeroed
        out = self.storage.gather(self._transition_slots(slots, steps))
        device = self.storage.device
        mask_t = torch.from_numpy(mask).to(device)
        if not mask.all():
            _zero_padding(out, ~mask_t)
            out['replay_buffer_idx'][~mask_t] = -1
            out['replay_unique_id'][~mask_t] = -1
        out['mask'] = mask_t
        out['episode_id'] = torch.from_numpy(self.ring.uids(slots)).to(device)
        out['episode_idx'] = torch.from_numpy(slots.astype(np.int64)).to(device)
        out['start'] = torch.from_numpy(starts.astype(np.int64)).to(device)
        return out

    def state_dict(self) -> Dict[str, Any]:
        return {
            'storage': self.storage.state_dict(),
            'ring': self.ring.state_dict(),
            'start': torch.from_numpy(self.start.copy()),
            'length': torch.from_numpy(self.length.copy()),
        }

    def restored(self, state: Mapping, storage_cfg: Mapping) -> 'FlatEpisodes':
        """A new store like this one holding ``state`` (validated against its data; nothing changes here)."""
        new = FlatEpisodes.__new__(FlatEpisodes)
        _EpisodeStore.__init__(new, self.max_episodes, self.max_transitions)
        new.reserve(self.reserved)
        new.storage = storage_from_state(
            storage_cfg, self.max_transitions, state['storage'], episodes=self.max_episodes
        )
        new.frames, new._writing = self.frames, None
        new.ring = RingIndex.from_state(state['ring'], self.max_episodes)
        new.length = _restore_lengths(state, new.ring, self.max_episodes, self.max_transitions)
        new.start = np.asarray(state['start'], dtype=np.int64).copy()
        if new.start.shape != (self.max_episodes,):
            raise ValueError("saved episode starts have the wrong shape")
        if ((new.start < 0) | (new.start >= self.max_transitions)).any():
            raise ValueError(f"saved episode starts must be transition slots in [0, {self.max_transitions})")
        covered = np.zeros(self.max_transitions, dtype=np.int64)
        for slot in new.ring.ordered_slots().tolist():
            covered[new._transition_slots(np.array(slot), np.arange(new.length[slot]))] += 1
        if not np.array_equal(covered > 0, new.storage.ring.valid) or (covered > 1).any():
            raise ValueError("saved episodes do not match the stored transitions")
        new.transitions = int(new.length.sum())
        new._recompute_ci()
        return new


def _restore_lengths(state: Mapping, ring: RingIndex, max_episodes: int, limit: Optional[int]) -> np.ndarray:
    """The saved episode lengths, checked against the ring and, before anything is built from them, within the
    ``limit`` of transitions (``max_transitions``; None: none)."""
    length = np.asarray(state['length'], dtype=np.int64).copy()
    if length.shape != (max_episodes,):
        raise ValueError(f"saved episode lengths have shape {length.shape}, expected ({max_episodes},)")
    if (length[ring.valid] <= 0).any() or (length[~ring.valid] != 0).any():
        raise ValueError("saved episode lengths do not match the stored episodes")
    if limit is not None and ((length > limit).any() or int(length.sum()) > limit):
        raise ValueError(f"saved episode lengths add up to more than max_transitions={limit}")
    return length


def _tensordict_window(window: Dict[str, Any], episode: Any, unroll_len: int) -> Any:
    """A window of a TensorDict episode as a TensorDict of ``batch_size=[unroll_len]`` on the episode's device (the
    leaves are the window's slices; ``tensordict`` is loaded, since ``episode`` is one)."""
    return sys.modules['tensordict'].TensorDict(window, batch_size=[unroll_len], device=episode.device)


def _pad_leaf(whole: Any, leaf: Any, unroll_len: int) -> Any:
    """A dict window's ``leaf`` (a slice of the episode's ``whole`` leaf) zero-padded to ``unroll_len`` steps as a
    tensor; where no tensor can hold the whole leaf (strings, objects, ragged rows) it stays a list, padded with
    ``None`` as a list episode is -- decided by the whole leaf, so every window of it comes back alike."""
    if not isinstance(whole, torch.Tensor) and not (isinstance(whole, np.ndarray) and whole.dtype.kind in 'biufc'):
        try:
            torch.as_tensor(whole)
        except (TypeError, ValueError, RuntimeError):
            return list(leaf) + [None] * (unroll_len - len(leaf))
    if isinstance(leaf, np.ndarray):  # (torch takes neither big-endian data, as h5py gives, nor negative strides)
        leaf = np.ascontiguousarray(leaf, dtype=leaf.dtype.newbyteorder('='))
    return _pad_time(torch.as_tensor(leaf), unroll_len)


def _pad_time(t: torch.Tensor, unroll_len: int) -> torch.Tensor:
    if t.shape[0] == unroll_len:
        return t
    pad = torch.zeros((unroll_len - t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad])


def _zero_padding(out: Dict[str, Any], pad_mask: torch.Tensor) -> None:
    for key, value in out.items():
        if isinstance(value, dict):
            _zero_padding(value, pad_mask)
        elif key not in ('replay_buffer_idx', 'replay_unique_id'):
            try:
                value[pad_mask] = 0
            except (RuntimeError, NotImplementedError):  # uint16/32/64, float8: no masked fill; all-zero bits are 0
                value.view(_INT_OF_WIDTH[value.element_size()])[pad_mask] = 0


_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

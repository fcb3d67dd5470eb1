"""``EpisodeReplayBuffer`` (``type='episode'``): whole episodes in, whole episodes or fixed-length windows out."""
from typing import Any, Dict, List, Optional

import numpy as np

from ..base import BUFFER_REGISTRY
from ..config import optional_positive_int, positive_int
from ..sampling import uniform_indices
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG
from .common import BufferCore
from .episode_store import FlatEpisodes, ObjectEpisodes


@BUFFER_REGISTRY.register('episode')
class EpisodeReplayBuffer(BufferCore):
    """
    Overview:
        Each element is a whole episode: a list of transition dicts, or a dict of time-stacked leaves
        (``[T, ...]``). ``push`` takes one dict episode or a list of episodes (a list is always a list of
        episodes, as in DI-engine: wrap a single list episode as ``[episode]``).
        Capacity is ``replay_buffer_size`` episodes and, optionally, ``max_transitions`` transitions; the
        oldest whole episodes are evicted to make room.
        ``sample(size)`` returns whole episodes; ``sample(size, unroll_len=T)`` returns windows of ``T``
        consecutive transitions drawn uniformly among all valid windows of all stored episodes.
    Output:
        list storage -- whole episodes: a list of the stored episodes; windows: a list of windows of the
        episode's own type (list episodes padded with ``None``; dict episodes zero-padded plus ``mask``).
        tensor storage -- whole episodes: a list of dicts of ``[L, ...]`` tensors; windows: one dict of
        ``[B, T, ...]`` tensors with ``mask`` [B, T], ``episode_id``, ``episode_idx``, ``start`` [B] and
        ``replay_buffer_idx``/``replay_unique_id`` [B, T].
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(L); sample O(episodes + batch * T) (a cumulative sum over episode window counts).
    """
    config = dict(
        type='episode',
        # Maximum number of stored episodes.
        replay_buffer_size=1000,
        # Maximum number of stored transitions (required with storage.type='tensor'); None = no limit.
        max_transitions=None,
        # Let episodes shorter than unroll_len give one zero-padded window (with a mask) instead of none.
        pad_short_episodes=False,
        deepcopy=False,
        # Not supported for episodes (kept so DI-engine configs load); must stay False.
        enable_track_used_data=False,
        periodic_thruput_seconds=60,
        seed=None,
        storage=STORAGE_CONFIG,
    )
    checks = dict(
        replay_buffer_size=(positive_int, 'a positive int (number of episodes)'),
        max_transitions=(optional_positive_int, 'None or a positive int'),
        enable_track_used_data=(lambda x: x is False, 'False (episode buffers do not track used data)'),
        periodic_thruput_seconds=(lambda x: x > 0, 'a positive number of seconds'),
        seed=(lambda x: x is None or (isinstance(x, int) and x >= 0), 'None or an int >= 0'),
        **STORAGE_CHECKS,
    )

    def _build(self) -> None:
        self._store = self._new_store()

    def _new_store(self):
        cfg = self._cfg
        if cfg.storage.type == 'tensor':
            if cfg.max_transitions is None:
                raise ValueError("config key 'max_transitions' must be set with storage.type='tensor'")
            kwargs = dict(device=cfg.storage.device, memmap_dir=cfg.storage.memmap_dir)
            return FlatEpisodes(cfg.replay_buffer_size, cfg.max_transitions, kwargs)
        if cfg.storage.memmap_dir is not None:
            raise ValueError("config key 'storage.memmap_dir' needs storage.type='tensor', got 'list'")
        return ObjectEpisodes(cfg.replay_buffer_size, cfg.max_transitions)

    # ------------------------------------------------------------------ properties
    @property
    def push_count(self) -> int:
        """Episodes accepted since construction or the last ``clear``."""
        return self._store.ring.push_count

    @property
    def episode_len(self) -> List[int]:
        """Lengths of the stored episodes, oldest first (empty slots are not listed)."""
        with self._lock:
            return self._store.lengths(self._store.ring.ordered_slots()).tolist()

    @property
    def transition_count(self) -> int:
        """Total number of stored transitions."""
        return self._store.transitions

    def count(self) -> int:
        """Number of stored episodes."""
        return self._store.ring.count

    # ------------------------------------------------------------------ push
    def _push_items(self, items: List[Any]) -> int:
        prepared = self._store.prepare(items)  # validates every episode before writing any
        for payload, n in prepared:
            self._evicted(self._store.write(payload, n))
        return len(prepared)

    def _push_batch(self, batch: Any) -> int:
        raise TypeError("EpisodeReplayBuffer stores whole episodes; push a dict episode or a list of episodes")

    # ------------------------------------------------------------------ sample
    def sample(
            self,
            size: int,
            cur_learner_iter: int = -1,
            sample_range: Optional[slice] = None,
            replace: bool = False,
            unroll_len: Optional[int] = None,
            pad: Optional[bool] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Sample ``size`` whole episodes (uniform over episodes), or with ``unroll_len=T`` ``size`` windows of
            ``T`` consecutive transitions, uniform over all valid windows (an episode of length ``L`` offers
            ``L - T + 1``; with ``pad`` an episode shorter than ``T`` offers one padded window).
            ``sample_range`` selects episodes by insertion order. Returns ``None`` (logged) when there are
            fewer candidates than ``size`` without ``replace``.
        """
        self._check_size(size)
        if unroll_len is not None and (not isinstance(unroll_len, (int, np.integer)) or unroll_len <= 0):
            raise ValueError(f"unroll_len must be a positive int, got {unroll_len!r}")
        pad = self._cfg.pad_short_episodes if pad is None else bool(pad)
        with self._lock:
            ordered = self._store.ring.ordered_slots()
            slots = ordered[self._range_positions(len(ordered), sample_range)] if sample_range is not None else ordered
            if len(slots) == 0:
                return self._refuse('buffer is empty' if len(ordered) == 0 else f'{sample_range} selects nothing')
            if unroll_len is None:
                if not replace and len(slots) < size:
                    return self._refuse(f'{len(slots)} episodes < batch size {size} and replace=False')
                chosen = slots[uniform_indices(self._rng, len(slots), int(size), replace)]
                return self._copy_out(self._store.episodes(chosen))
            lengths = self._store.lengths(slots)
            windows = np.maximum(lengths - unroll_len + 1, 0)
            if pad:
                windows = np.where(lengths < unroll_len, 1, windows)
            cum = np.cumsum(windows)
            total = int(cum[-1])
            if total == 0:
                return self._refuse(f'no episode has {unroll_len} transitions (set pad=True to pad short ones)')
            if not replace and total < size:
                return self._refuse(f'{total} windows of length {unroll_len} < batch size {size} and replace=False')
            u = uniform_indices(self._rng, total, int(size), replace)
            which = np.searchsorted(cum, u, side='right')
            starts = u - (cum[which] - windows[which])
            out = self._store.windows(slots[which], starts, int(unroll_len), pad)
            return self._copy_out(out) if isinstance(out, list) else out

    # ------------------------------------------------------------------ clear / state
    def _clear(self) -> List[Any]:
        removed = self._store.clear()
        self._store.ring.push_count = 0
        return removed

    def _state(self) -> Dict[str, Any]:
        return {'episodes': self._store.state_dict(), 'transitions': self._store.transitions}

    def _restore(self, state: Dict[str, Any]) -> None:
        if 'episodes' not in state:
            raise ValueError("state has no 'episodes' entry")
        new = self._store.restore(state['episodes'], self._cfg.storage)  # KeyError -> ValueError in load_state_dict
        if new.transitions != state.get('transitions'):
            raise ValueError("saved transition count does not match the stored episodes")
        self._store = new

    def __repr__(self) -> str:
        return (
            f"EpisodeReplayBuffer(instance_name={self._instance_name!r}, episodes={self.count()}, "
            f"transitions={self.transition_count}, storage={self._store.storage!r})"
        )

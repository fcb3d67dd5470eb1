"""``EpisodeTable``: whole episodes as elements -- the table of ``episode`` and ``prioritized_episode``.

Episodes live in an episode store (``ObjectEpisodes`` on list storage, ``FlatEpisodes``: one tensor storage of
transitions with ``max_transitions``); the oldest whole episodes leave to make room. A sample returns whole
episodes, or windows of ``unroll_len`` consecutive transitions drawn uniformly among all valid windows, or (with
``sampler=dict(type='prioritized', ...)``) prioritized windows (R2D2: ``PrioritizedWindows``).
"""

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..control.samplers import PrioritizedSpec, UniformSampler, build_sampler
from ..storage import check_list_storage, refuse_items_output
from ..storage.tensordict_io import is_tensordict, update_info
from .common import ENGINE_KEYS, SAMPLE_LIMIT, check_range, check_size, range_positions
from .episode_store import FlatEpisodes, ObjectEpisodes
from .prioritized_windows import PrioritizedWindows
from .table import Drawn, Needs, Parts, Request, Restored, Table, Write, Written

NO_FLAT = "prioritized windows need the flat transitions of storage.type='tensor' (with max_transitions)"


class Listener:
    """What hears the episode store's episodes come and go (it holds no reference to the table, nor to the store: a
    cycle would keep the store's fields, memmap files included, until the garbage collector ran): a new or removed
    episode's use count restarts, prioritized windows follow."""

    def __init__(self, uses: Any, prio: Optional[PrioritizedWindows]) -> None:
        self.uses, self.windows = uses, None if prio is None else prio.windows

    def episode_added(self, slot: int, first: int, length: int) -> None:
        if self.uses is not None:
            self.uses.reset(slot)
        if self.windows is not None:
            self.windows.episode_added(slot, first, length)

    def episode_removed(self, slot: int, first: int, length: int) -> None:
        if self.uses is not None:
            self.uses.reset(slot)
        if self.windows is not None:
            self.windows.episode_removed(slot, first, length)


class EpisodeTable(Table):
    """
    Overview:
        Whole episodes in an episode store, sampled as episodes or windows (see the module docstring). Its
        ``Listener`` hears the store's episodes come and go to keep use counts and window priorities in step.
    """

    state_keys = ENGINE_KEYS | {'episodes', 'transitions', 'windows'}

    def build(self) -> Needs:
        cfg = self.cfg
        prioritized = cfg.sampler.get('type') == 'prioritized'  # (its windows need tensor storage)
        refuse_items_output(cfg.storage, cfg.type, 'whole episodes or windows of them', list_ok=not prioritized)
        spec = build_sampler(cfg.sampler, 'uniform', (cfg.storage.type == 'tensor', NO_FLAT))
        self._store = self.new_store()
        self.prio: Optional[PrioritizedWindows] = None
        if isinstance(spec, PrioritizedSpec):
            unroll = cfg.sampler.get('unroll_len')
            if not cfg.pad_short_episodes and cfg.max_transitions is not None and (unroll or 0) > cfg.max_transitions:
                logging.getLogger(f'ding_buffer.{self.name}').warning(
                    "config key 'sampler.unroll_len' is %s, more than max_transitions=%s: no episode can ever hold a "
                    "window, so every sample refuses; set pad_short_episodes=True or a shorter unroll_len",
                    unroll,
                    cfg.max_transitions,
                )
            self.prio = PrioritizedWindows(spec, self._store, cfg.pad_short_episodes, self.name)
            self._store.reserve(PrioritizedWindows.OUTPUT_KEYS)
        elif not (hasattr(spec, 'draw') or hasattr(spec, 'select')):
            raise ValueError(f"config key 'sampler.type' is {cfg.sampler.get('type')!r}: not an episode sampler")
        self.use_sampler(spec if self.prio is None else UniformSampler())  # prioritized windows draw by themselves
        return Needs(cfg.replay_buffer_size, period=cfg.periodic_thruput_seconds)

    def new_store(self):
        cfg = self.cfg
        if cfg.storage.type == 'tensor':
            if cfg.max_transitions is None:
                raise ValueError("config key 'max_transitions' must be set with storage.type='tensor'")
            return FlatEpisodes(cfg.replay_buffer_size, cfg.max_transitions, cfg.storage)
        check_list_storage(cfg.storage)
        return ObjectEpisodes(cfg.replay_buffer_size, cfg.max_transitions)

    # ------------------------------------------------------------------ properties
    @property
    def push_count(self) -> int:
        """Episodes accepted since construction or the last ``clear``."""
        return self._store.ring.push_count

    @property
    def episode_len(self) -> List[int]:
        """Lengths of the stored episodes, oldest first (empty slots are not listed)."""
        with self.lock:
            return self._store.lengths(self._store.ring.ordered_slots()).tolist()

    @property
    def transition_count(self) -> int:
        """Total number of stored transitions."""
        return self._store.transitions

    @property
    def storage(self) -> Any:
        """Where the data lives: the episodes' ``ListStorage`` (list) or the transitions' ``TensorStorage``."""
        return self._store.storage

    # ------------------------------------------------------------------ table verbs
    @property
    def store(self) -> Any:
        return self._store

    def drop(self, slots: np.ndarray) -> List[Any]:
        return self._store.remove(slots)

    def tensordict_out(self) -> bool:
        return self._store.storage.tensordict_out

    def device(self) -> Any:
        return getattr(self._store.storage, 'device', None)

    def attach(self, parts: Parts) -> None:
        super().attach(parts)
        self._store.listen(Listener(parts.uses, self.prio))

    # ------------------------------------------------------------------ push
    def prepare(self, items: List[Any]) -> Write:
        prepared = self._store.prepare(items)  # validates every episode before writing any
        return Write(len(prepared), prepared)

    def prepare_batch(self, batch: Any) -> Write:
        raise TypeError("EpisodeReplayBuffer stores whole episodes; push a dict episode or a list of episodes")

    def write(self, w: Write, report_evicted: bool) -> Written:
        """The episodes in order; the oldest whole episodes leave to make room (the store's listener restarts the
        new episodes' use counts)."""
        before, evicted = self.count(), []
        for payload, n in w.plan:
            evicted.extend(self._store.write(payload, n))
        return Written(w.n, None, before + w.n - self.count(), evicted)

    # ------------------------------------------------------------------ sample
    def request(
        self,
        size: int,
        sample_range: Optional[slice] = None,
        replace: Optional[bool] = None,
        unroll_len: Optional[int] = None,
        pad: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> Request:
        if unroll_len is not None and (
            not isinstance(unroll_len, (int, np.integer)) or isinstance(unroll_len, bool) or unroll_len <= 0
        ):
            raise ValueError(f"unroll_len must be a positive int, got {unroll_len!r}")
        unroll_len = None if unroll_len is None else int(unroll_len)  # (numpy's uint64 minus an int is a float)
        check_range(sample_range)
        for name, flag in (('replace', replace), ('pad', pad)):
            if flag is not None and type(flag) is not bool and type(flag) is not np.bool_:
                raise TypeError(f"{name} must be None or a bool, got {type(flag).__name__} {flag!r:.40}")
        if self.prio is not None:
            self.prio.check_args(sample_range, replace, unroll_len, pad)
            self._check_padded(size, self.prio.unroll_len, self.cfg.pad_short_episodes)
            # (the shortfall is asked of whichever windows index holds then: a load waited through replaces it)
            return Request(size, lambda rng: self.draw_prioritized(rng, size), lambda: self.prio.shortfall(), timeout)
        pad = self.cfg.pad_short_episodes if pad is None else bool(pad)
        self._check_padded(size, unroll_len, pad)
        replace = bool(replace)
        return Request(
            size,
            lambda rng: self.draw(rng, size, sample_range, replace, unroll_len, pad),
            lambda: self.candidates(size, sample_range, replace, unroll_len, pad)[0],
            timeout,
        )

    @staticmethod
    def _check_padded(size: Any, unroll_len: Optional[int], pad: bool) -> None:
        """Padded windows: their length, not the stored data, sizes a sample (at most 2**31 transitions)."""
        if pad and unroll_len is not None:
            check_size(size)
            if int(unroll_len) * int(size) > SAMPLE_LIMIT:  # (int64 arithmetic would wrap: windows of 0 steps)
                raise ValueError(
                    f"unroll_len={unroll_len} with sample size {size} asks for {int(unroll_len) * int(size)} padded "
                    f"transitions; a sample holds at most 2**31"
                )

    def candidates(self, size, sample_range, replace, unroll_len, pad):
        """(shortfall reason or '', episode slots, window counts per episode or None)."""
        ordered = self._store.ring.ordered_slots()
        slots = ordered[range_positions(len(ordered), sample_range)] if sample_range is not None else ordered
        if len(slots) == 0:
            return ('buffer is empty' if len(ordered) == 0 else f'{sample_range} selects nothing'), slots, None
        if unroll_len is None:
            short = (
                f'{len(slots)} episodes < batch size {size} and replace=False'
                if not replace and len(slots) < size
                else ''
            )
            return short, slots, None
        windows = self._store.window_counts(slots, unroll_len, pad)
        total = int(windows.sum())
        if total == 0:
            return f'no episode has {unroll_len} transitions (set pad=True to pad short ones)', slots, windows
        if not replace and total < size:
            return f'{total} windows of length {unroll_len} < batch size {size} and replace=False', slots, windows
        return '', slots, windows

    def draw(self, rng, size, sample_range, replace, unroll_len, pad) -> Any:
        why, slots, windows = self.candidates(size, sample_range, replace, unroll_len, pad)
        if why:
            return why
        if windows is None:
            picked = self.positions(rng, len(slots), int(size), replace, lambda: slots)
            if type(picked) is str:
                return picked
            chosen = slots[picked]
            return Drawn(chosen, int(size), self._store.episodes(chosen), copy=True)
        cum = np.cumsum(windows)
        u = self.positions(rng, int(cum[-1]), int(size), replace, lambda: np.repeat(slots, windows))
        if type(u) is str:
            return u
        which = np.searchsorted(cum, u, side='right')
        starts = u - (cum[which] - windows[which])
        out = self._store.windows(slots[which], starts, int(unroll_len), pad)
        return Drawn(slots[which], int(size), out, copy=isinstance(out, list))

    def draw_prioritized(self, rng: np.random.Generator, size: int) -> Any:
        out = self.prio.draw(rng, int(size))
        if out is None:
            return self.prio.shortfall()
        return Drawn(out['episode_idx'].cpu().numpy(), int(size), out)  # the drawn windows' episode slots

    # ------------------------------------------------------------------ update
    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """See ``EpisodeReplayBuffer.update``."""
        if self.prio is None:
            return super().update(info)
        if type(info) is not dict and is_tensordict(info):
            info = update_info(info)
        plan = self.prio.update(info)
        if plan is None:
            return {'updated': 0, 'stale': 0}

        def apply(spent: Callable[[np.ndarray], np.ndarray]) -> Tuple[int, int]:
            result = self.prio.apply(plan)
            return result['updated'], result['updated'] + result['stale']

        return apply

    def stats(self, out: Dict[str, float]) -> Dict[str, float]:
        out.update(transitions=self._store.transitions, push_count=self.push_count)
        if self.prio is not None:
            out.update(
                beta=self.prio.beta.value,
                max_priority=self.prio.windows.max_priority,
                priority_mass=self.prio.windows.index.tree.total(),
                priority_min_leaf=self.prio.windows.index.tree.min_leaf(),
            )
        return out

    # ------------------------------------------------------------------ clear / state
    def clear(self) -> List[Any]:
        for slot in self._store.ring.ordered_slots().tolist():
            self._store.listener.episode_removed(slot, self._store.first(slot), int(self._store.length[slot]))
        if self.prio is not None:
            self.prio.clear()  # the running max priority restarts at 1.0, as on advanced and in DI-engine
        return self._store.clear(reset_push_count=True)

    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        out = {'episodes': self._store.state_dict(), 'transitions': self._store.transitions, **engine}
        if self.prio is not None:
            out['windows'] = self.prio.state_dict()
        return out

    def restore(self, state: Dict[str, Any]) -> Restored:
        if 'episodes' not in state:
            raise ValueError("state has no 'episodes' entry")
        new = self._store.restored(state['episodes'], self.cfg.storage)  # KeyError -> ValueError in load_state_dict
        if new.transitions != state.get('transitions'):
            raise ValueError("saved transition count does not match the stored episodes")
        if (self.prio is not None) != ('windows' in state):
            raise ValueError(
                "state has no 'windows' entry (it was saved without prioritized windows)"
                if self.prio is not None
                else "state has a 'windows' entry (saved with prioritized windows); this buffer's windows are uniform "
                "(config key 'sampler')"
            )
        prio = self.prio.restored(state['windows'], new) if self.prio is not None else None

        def swap() -> None:
            new.listen(Listener(self.parts.uses, prio))
            old, self._store, self.prio = self._store, new, prio
            old.listen(None)  # (the replaced store tells nobody of its episodes any more)
            if old.storage is not new.storage:
                old.release()  # its memmap files, now

        return Restored(swap, state)  # files of 0.1 have no counters: not required

    def describe(self) -> str:
        return f"episodes={self.count()}, transitions={self.transition_count}, storage={self._store.storage!r}"


__all__ = ['EpisodeTable', 'NO_FLAT']

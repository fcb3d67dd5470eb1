"""``EpisodeReplayBuffer`` (``type='episode'``): whole episodes in, whole episodes or fixed-length windows out --
uniformly, or (``sampler=dict(type='prioritized', unroll_len=T, ...)``, registered as ``prioritized_episode``)
prioritized sequence replay. Any of the engine's parts compose by config: ``max_use`` and ``max_staleness``
(per episode), ``thruput_controller``, ``removers``."""

from typing import Any, Dict, List, Optional

import numpy as np

from ..base import BUFFER_REGISTRY
from ..config import SEED_CHECK, dingengine_ignored, optional_positive_int, positive_int
from ..control.samplers import PrioritizedSpec, UniformSampler, build_sampler, check_positions
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, refuse_items_output
from ..storage.tensordict_io import is_tensordict, update_info
from .engine import Engine, parts_checks, parts_config
from .episode_store import FlatEpisodes, ObjectEpisodes
from .prioritized_windows import PrioritizedWindows

NO_FLAT = "prioritized windows need the flat transitions of storage.type='tensor' (with max_transitions)"


# The default config (DI-engine style: every key commented) and the value checks of each key.
EPISODE_CONFIG = dict(
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
    # Period of the push/sample/remove report written to a tb_logger passed in (DI-engine key).
    periodic_thruput_seconds=60,
    seed=None,
    # {} = uniform; dict(type='prioritized', unroll_len=T, alpha=0.6, beta=0.4, eta=0.9, eps=1e-5,
    # anneal_step=0) = prioritized windows (tensor storage).
    sampler={},
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(0.0),
    storage=STORAGE_CONFIG,
)
EPISODE_CHECKS = dict(
    replay_buffer_size=(positive_int, 'a positive int (number of episodes)'),
    max_transitions=(optional_positive_int, 'None or a positive int'),
    enable_track_used_data=(lambda x: x is False, 'False (episode buffers do not track used data)'),
    periodic_thruput_seconds=(lambda x: x > 0, 'a positive number of seconds'),
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **STORAGE_CHECKS,
)


@BUFFER_REGISTRY.register('episode')
class EpisodeReplayBuffer(Engine):
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
        episode's own type (list episodes padded with ``None``; dict episodes zero-padded plus ``mask``;
        TensorDict episodes as TensorDicts of ``batch_size=[T]``, zero-padded plus ``mask``).
        tensor storage -- whole episodes: a list of dicts of ``[L, ...]`` tensors; windows: one dict of
        ``[B, T, ...]`` tensors with ``mask`` [B, T], ``episode_id``, ``episode_idx``, ``start`` [B] and
        ``replay_buffer_idx``/``replay_unique_id`` [B, T].
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(L); sample O(episodes + batch * T) (a cumulative sum over episode window counts).
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='episode', replay_buffer_size=4, seed=0))
        >>> buf.push([[{'ep': e, 't': t} for t in range(n)] for e, n in ((0, 3), (1, 5))])  # two list episodes
        2
        >>> buf.count(), buf.transition_count, buf.episode_len
        (2, 8, [3, 5])
        >>> sorted(len(episode) for episode in buf.sample(2))  # whole episodes
        [3, 5]
        >>> windows = buf.sample(3, unroll_len=2)  # windows of 2 consecutive steps of one episode
        >>> [len(w) for w in windows], {(w[1]['ep'] - w[0]['ep'], w[1]['t'] - w[0]['t']) for w in windows}
        ([2, 2, 2], {(0, 1)})
        >>> buf.close()
    """

    item_kind = 'episode'
    sample_kwargs = ('cur_learner_iter', 'sample_range', 'replace', 'unroll_len', 'pad')

    config = EPISODE_CONFIG
    checks = EPISODE_CHECKS
    ignored_keys = dingengine_ignored(EPISODE_CONFIG, 'episode')
    tensordict_batch_is_items = False  # a TensorDict with batch_size [T] is one episode of T steps

    def _build(self) -> None:
        cfg = self._cfg
        refuse_items_output(cfg.storage, cfg.type, 'whole episodes or windows of them')
        spec = build_sampler(cfg.sampler, 'uniform', (cfg.storage.type == 'tensor', NO_FLAT))
        self._store = self._new_store()
        self._store.listen(self)
        self._prio: Optional[PrioritizedWindows] = None
        if isinstance(spec, PrioritizedSpec):
            self._prio = PrioritizedWindows(spec, self._store, cfg.pad_short_episodes, self._instance_name)
            self._store.reserve(PrioritizedWindows.OUTPUT_KEYS)
        elif not hasattr(spec, 'draw'):
            raise ValueError(f"config key 'sampler.type' is {cfg.sampler.get('type')!r}: not an episode sampler")
        self._sampler = spec
        self._own_sampler = self._prio is None and type(spec) is not UniformSampler  # its answers are checked
        self._build_engine(cfg.replay_buffer_size)
        self._build_monitors(False, cfg.periodic_thruput_seconds)

    def _new_store(self):
        cfg = self._cfg
        if cfg.storage.type == 'tensor':
            if cfg.max_transitions is None:
                raise ValueError("config key 'max_transitions' must be set with storage.type='tensor'")
            return FlatEpisodes(cfg.replay_buffer_size, cfg.max_transitions, cfg.storage)
        for key in ('memmap_dir', 'frames'):
            if cfg.storage.get(key) is not None:
                raise ValueError(f"config key 'storage.{key}' needs storage.type='tensor', got 'list'")
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

    @property
    def storage(self) -> Any:
        """Where the data lives: the episodes' ``ListStorage`` (list) or the transitions' ``TensorStorage``."""
        return self._store.storage

    # ------------------------------------------------------------------ table verbs
    @property
    def _table(self) -> Any:
        return self._store

    def _drop(self, slots: np.ndarray) -> List[Any]:
        return self._store.remove(slots)

    def _tensordict_out(self) -> bool:
        return self._store.storage.tensordict_out

    def _table_device(self) -> Any:
        return getattr(self._store.storage, 'device', None)

    def episode_added(self, slot: int, first: int, length: int) -> None:
        """The store's listener: a new episode at ``slot`` (its use count restarts; windows get priorities)."""
        self._fresh(slot)
        if self._prio is not None:
            self._prio.windows.episode_added(slot, first, length)

    def episode_removed(self, slot: int, first: int, length: int) -> None:
        if self._uses is not None:
            self._uses.reset(slot)
        if self._prio is not None:
            self._prio.windows.episode_removed(slot, first, length)

    # ------------------------------------------------------------------ push
    def _push_items(self, items: List[Any]) -> int:
        prepared = self._store.prepare(items)  # validates every episode before writing any
        if not self._admit(len(prepared)):
            return 0
        before = self.count()
        for payload, n in prepared:
            self._evicted(self._store.write(payload, n))
        self._pushed(len(prepared), before + len(prepared) - self.count())
        return len(prepared)

    def _push_batch(self, batch: Any) -> int:
        raise TypeError("EpisodeReplayBuffer stores whole episodes; push a dict episode or a list of episodes")

    # ------------------------------------------------------------------ sample
    def sample(
        self,
        size: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        replace: Optional[bool] = None,
        unroll_len: Optional[int] = None,
        pad: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Sample ``size`` whole episodes (uniform over episodes), or with ``unroll_len=T`` ``size`` windows of
            ``T`` consecutive transitions, uniform over all valid windows (an episode of length ``L`` offers
            ``L - T + 1``; with ``pad`` an episode shorter than ``T`` offers one padded window).
            ``sample_range`` selects episodes by insertion order. Returns ``None`` (logged) when there are
            fewer candidates than ``size`` without ``replace`` (default False); with ``timeout`` (seconds) it
            waits for them and raises ``SampleTimeoutError`` if they never come.
            With the prioritized sampler: windows of the configured ``sampler.unroll_len`` (the default of
            ``unroll_len``), drawn with replacement by window priority, plus ``priority`` and ``IS`` [B];
            ``sample_range``, ``pad`` and ``replace=False`` are refused.
        """
        if unroll_len is not None and (
            not isinstance(unroll_len, (int, np.integer)) or isinstance(unroll_len, bool) or unroll_len <= 0
        ):
            raise ValueError(f"unroll_len must be a positive int, got {unroll_len!r}")
        self._check_range(sample_range)
        for name, flag in (('replace', replace), ('pad', pad)):
            if flag is not None and type(flag) is not bool:
                raise TypeError(f"{name} must be None or a bool, got {type(flag).__name__} {flag!r:.40}")
        if self._prio is not None:
            self._prio.check_args(sample_range, replace, unroll_len, pad)
            return self._sample_flow(
                size, cur_learner_iter, timeout, lambda: self._draw_prioritized(size), self._prio.shortfall
            )
        pad = self._cfg.pad_short_episodes if pad is None else bool(pad)
        replace = bool(replace)
        return self._sample_flow(
            size,
            cur_learner_iter,
            timeout,
            lambda: self._draw(size, sample_range, replace, unroll_len, pad),
            lambda: self._candidates(size, sample_range, replace, unroll_len, pad)[0],
        )

    def _candidates(self, size, sample_range, replace, unroll_len, pad):
        """(shortfall reason or '', episode slots, window counts per episode or None)."""
        ordered = self._store.ring.ordered_slots()
        slots = ordered[self._range_positions(len(ordered), sample_range)] if sample_range is not None else ordered
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

    def _draw(self, size, sample_range, replace, unroll_len, pad) -> Optional[Any]:
        why, slots, windows = self._candidates(size, sample_range, replace, unroll_len, pad)
        if why:
            return self._refused(why)
        if windows is None:
            picked = self._positions(len(slots), int(size), replace)
            if picked is None:
                return self._refused(f'sampler {self._cfg.sampler.get("type")!r} refused')
            chosen = slots[picked]
            out = self._copy_out(self._store.episodes(chosen))
            self._drawn(chosen, int(size))
            return out
        cum = np.cumsum(windows)
        u = self._positions(int(cum[-1]), int(size), replace)
        if u is None:
            return self._refused(f'sampler {self._cfg.sampler.get("type")!r} refused')
        which = np.searchsorted(cum, u, side='right')
        starts = u - (cum[which] - windows[which])
        out = self._store.windows(slots[which], starts, int(unroll_len), pad)
        self._drawn(slots[which], int(size))
        return self._copy_out(out) if isinstance(out, list) else out

    def _positions(self, m: int, size: int, replace: bool) -> Optional[np.ndarray]:
        """``size`` positions in ``[0, m)`` from the sampler; ``None`` when it refuses. A user sampler's answer is
        checked before anything reads it (``check_positions``: a ``RuntimeError`` naming it, nothing changed)."""
        idx = self._sampler.draw(self._rng, m, size, replace)
        if self._own_sampler and idx is not None:
            idx = check_positions(idx, m, size, self._cfg.sampler.get('type'))
        return idx

    def _draw_prioritized(self, size: int) -> Optional[Any]:
        out = self._prio.draw(self._rng, int(size))
        if out is None:
            return self._refused(self._prio.shortfall())
        self._drawn(self._prio.episodes_of(out), int(size))
        return out

    # ------------------------------------------------------------------ update
    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """
        Overview:
            With prioritized windows: new priorities for sampled windows (see ``prioritized_windows``), keyed by
            the ``replay_unique_id`` / ``replay_buffer_idx`` a sample returned; stale entries are counted. All or
            nothing. With uniform sampling a no-op returning ``{'updated': 0, 'stale': 0}``.
        """
        if self._prio is None:
            return super().update(info)
        if type(info) is not dict and is_tensordict(info):
            info = update_info(info)
        plan = self._prio.update(info)
        if plan is None:
            return {'updated': 0, 'stale': 0}
        with self._lock:
            result = self._prio.apply(plan)
            self._counters['updated'] += result['updated']
            self._counters['stale_updates'] += result['stale']
        return result

    def stats(self) -> Dict[str, float]:
        with self._lock:
            out = super().stats()
            out.update(transitions=self._store.transitions, push_count=self.push_count)
            if self._prio is not None:
                out.update(
                    beta=self._prio.beta.value,
                    max_priority=self._prio.windows.max_priority,
                    priority_mass=self._prio.windows.index.tree.total(),
                )
            return out

    # ------------------------------------------------------------------ clear / state
    def _clear(self) -> List[Any]:
        for slot in self._store.ring.ordered_slots().tolist():
            self.episode_removed(slot, self._store.first(slot), int(self._store.length[slot]))
        if self._prio is not None:
            self._prio.clear()  # the running max priority restarts at 1.0, as on advanced and in DI-engine
        return self._store.clear(reset_push_count=True)

    def _state(self) -> Dict[str, Any]:
        out = {'episodes': self._store.state_dict(), 'transitions': self._store.transitions, **self._engine_state()}
        if self._prio is not None:
            out['windows'] = self._prio.state_dict()
        return out

    def _restore(self, state: Dict[str, Any]) -> None:
        if 'episodes' not in state:
            raise ValueError("state has no 'episodes' entry")
        new = self._store.restored(state['episodes'], self._cfg.storage)  # KeyError -> ValueError in load_state_dict
        if new.transitions != state.get('transitions'):
            raise ValueError("saved transition count does not match the stored episodes")
        if self._prio is not None and 'windows' not in state:
            raise ValueError("state has no 'windows' entry (it was saved without prioritized windows)")
        prio = self._prio.restored(state['windows'], new) if self._prio is not None else None
        swap = self._engine_restored(state, None, required=False)  # files of 0.1 have no counters
        new.listen(self)
        self._store, self._prio = new, prio
        swap()

    def __repr__(self) -> str:
        return (
            f"EpisodeReplayBuffer(instance_name={self._instance_name!r}, episodes={self.count()}, "
            f"transitions={self.transition_count}, storage={self._store.storage!r})"
        )


@BUFFER_REGISTRY.register('prioritized_episode')
class PrioritizedEpisodeReplayBuffer(EpisodeReplayBuffer):
    """
    Overview:
        Prioritized sequence replay (R2D2): the episode buffer on tensor storage with
        ``sampler=dict(type='prioritized', ...)`` and the paper's defaults (priority exponent 0.9, importance
        exponent 0.6, eta 0.9, sequences of 80 steps). ``sample(B)`` returns ``[B, T, ...]`` windows with ``mask``,
        ``priority`` and ``IS``; ``update`` takes per-window or per-step priorities back by id.
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='prioritized_episode', replay_buffer_size=4, max_transitions=32, seed=0,
        ...                          sampler=dict(unroll_len=4)))  # the other sampler keys keep the defaults
        >>> buf.push([{'obs': torch.zeros(n, 3), 'act': torch.arange(n)} for n in (6, 8)])  # dicts of [L, ...]
        2
        >>> out = buf.sample(3)  # 3 windows of 4 steps
        >>> tuple(out['obs'].shape), tuple(out['mask'].shape), out['act'].diff(dim=1).tolist()[0], out['IS'].tolist()
        ((3, 4, 3), (3, 4), [1, 1, 1], [1.0, 1.0, 1.0])
        >>> buf.update({'replay_unique_id': out['replay_unique_id'], 'replay_buffer_idx': out['replay_buffer_idx'],
        ...             'priority': torch.tensor([2.0, 0.5, 1.0])})  # one priority per window
        {'updated': 3, 'stale': 0}
        >>> buf.close()
    """

    config = dict(
        EpisodeReplayBuffer.config,
        type='prioritized_episode',
        max_transitions=100000,
        sampler=dict(type='prioritized', unroll_len=80, alpha=0.9, beta=0.6, eta=0.9, eps=1e-5, anneal_step=0),
        storage=dict(EpisodeReplayBuffer.config['storage'], type='tensor'),
    )

"""GFlowNet replay buffers (torchgfn's behaviour, with its reported problems fixed):

* ``gfn`` -- ``GFlowNetReplayBuffer``: keep the best ``replay_buffer_size`` items by log-reward
  (``prioritized_capacity``) or the newest (FIFO); sample uniformly or by reward (``prioritized_sampling``,
  torchgfn#336), with or without replacement; ``lazy_sort`` defers truncation to ``2 * capacity`` items.
* ``gfn_diverse`` -- ``DiverseGFlowNetReplayBuffer`` (torchgfn's ``NormBasedDiversePrioritizedReplayBuffer``):
  keep-best plus a p-norm diversity filter on the terminating states once the buffer is full.
* ``terminating_state`` -- ``TerminatingStateBuffer``: only terminating states and their log-rewards
  (torchgfn#201: any container kind goes in).

Differences from torchgfn, on purpose: ``sample`` sees items waiting in a lazy buffer (torchgfn raises "Buffer
is empty" before its first flush); ties in reward are broken by age (oldest leaves first) instead of by an
unstable sort; the diverse filter compares a batch with the *stored* items only and computes exact distances
(torchgfn#175); an empty or too-small buffer returns ``None`` from ``sample`` (the ``IBuffer`` contract) instead
of raising or silently returning fewer items; ``save_data``/``load_data`` round-trip contents, counters and
settings (torchgfn's save is skipped as broken upstream).
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..base import BUFFER_REGISTRY
from ..config import SEED_CHECK, positive_int
from ..control.diversity import StateSet  # noqa: F401 (annotations)
from ..control.keep_best import RewardIndex
from ..storage import device_ok
from .common import check_step
from .engine import Engine, parts_checks, parts_config
from .gfn_data import GFNBatch
from .gfn_parts import check_kind, make_parts, make_store
from .gfn_state import GFlowNetState
from .gfn_stats import GFlowNetStats


def _key(x: Any) -> bool:
    return isinstance(x, str) and bool(x)


# The default config (DI-engine style: every key commented) and the value checks of each key.
GFN_CONFIG = dict(
    type='gfn',
    # Capacity in items (torchgfn's default is 1000).
    replay_buffer_size=1000,
    # Keep the highest log-rewards when full (ties: the newest stay); False keeps the newest (FIFO).
    prioritized_capacity=False,
    # Sample with probability softmax(log_reward) instead of uniformly.
    prioritized_sampling=False,
    # None: with replacement only when asked for more items than stored (torchgfn); True / False: always.
    sample_replacement=None,
    # Defer truncation until stored + incoming reaches 2 * capacity (waiting items are sampled too).
    lazy_sort=False,
    # Field names in dict batches: the terminating state, its log-reward and an optional condition.
    state_key='state',
    log_reward_key='log_reward',
    condition_key=None,
    # Device of dict-batch tensors (containers stay where they are).
    device='cpu',
    # Seed of the buffer's own RNG; None draws it from numpy's global RNG.
    seed=None,
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(0.0),
    monitor=dict(
        # Write stats() to TensorBoard every `log_every` pushes ({instance}_iter/...).
        tensorboard=False,
        log_every=100,
    ),
)
GFN_CHECKS = dict(
    replay_buffer_size=(positive_int, 'a positive int'),
    sample_replacement=(lambda x: x is None or isinstance(x, bool), 'None, True or False'),
    state_key=(_key, 'a non-empty str'),
    log_reward_key=(_key, 'a non-empty str'),
    condition_key=(lambda x: x is None or _key(x), 'None or a non-empty str'),
    device=(device_ok, "'cpu', 'cuda' or 'cuda:N'"),
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **{'monitor.log_every': (positive_int, 'a positive int')},
)


@BUFFER_REGISTRY.register('gfn')
class GFlowNetReplayBuffer(GFlowNetStats, GFlowNetState, Engine):
    """
    Overview:
        Reward-aware buffer of GFlowNet samples. ``push`` takes a dict of batched tensors, a list of item dicts
        or a Container (torchgfn ``Trajectories`` / ``Transitions`` / ``StatesContainer``); ``sample`` returns
        the same kind: one dict of batched tensors (with ``replay_unique_id`` / ``replay_buffer_idx``) or a
        container of the pushed type. ``add`` is torchgfn's name for ``push``.
    Interfaces:
        ``push``/``add``, ``sample``, ``stats``, ``clear``, ``count``, ``state_dict``, ``load_state_dict``,
        ``save_data``, ``load_data``, ``close``; ``update`` is a no-op (the priority is the log-reward).
        The engine's parts compose by config: ``max_use``, ``max_staleness`` (items' ``collect_iter`` field),
        ``thruput_controller`` (with ``sample(timeout=)``) and ``removers``.
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(batch) while below capacity -- stored items are never copied: dict batches and torchgfn
    containers are written in place at their slots (``ColumnStore``, ``ContainerRing``); a truncating push adds
    O(evicted) index work for FIFO (insertion order is kept) and O(capacity) for ``prioritized_capacity``, no data
    copy (``lazy_sort``: once per ``capacity`` items); unique states are hashed in bulk when ``stats()`` reads them
    (O(1) amortised per item); sample O(capacity + size log size) index work plus O(size) data (uniform from a full
    buffer: O(size)).
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='gfn', replay_buffer_size=3, prioritized_capacity=True, seed=0))
        >>> buf.push({'state': torch.arange(10).reshape(5, 2), 'log_reward': torch.tensor([0.0, 4.0, 1.0, 3.0, 2.0])})
        3
        >>> batch = buf.sample(3)  # the 3 best rewards were kept
        >>> sorted(batch), tuple(batch['state'].shape), sorted(batch['log_reward'].tolist())
        (['log_reward', 'replay_buffer_idx', 'replay_unique_id', 'state'], (3, 2), [2.0, 3.0, 4.0])
        >>> buf.close()
    """

    item_kind = 'trajectory'
    sample_kwargs = ('cur_learner_iter', 'replace', 'n_samples')
    has_log_rewards = True

    diverse = False
    config = GFN_CONFIG
    checks = GFN_CHECKS
    key_aliases = {'capacity': 'replay_buffer_size'}  # torchgfn's name of the key

    # ------------------------------------------------------------------ construction
    @classmethod
    def distributed_profile(cls, cfg: Any) -> Dict[str, Any]:
        """A pushed dict is a batch; the manager scores with the state, log-reward and condition fields."""
        get = lambda k: cfg.get(k, cls.config[k])  # noqa: E731
        scoring = [get('state_key'), get('log_reward_key')] + ([get('condition_key')] if get('condition_key') else [])
        return {
            'dict_is_batch': True,
            'log_reward_key': get('log_reward_key'),
            'scoring_keys': scoring,
            **cls.capabilities(),
        }

    def _build(self) -> None:
        cfg = self._cfg
        if cfg.device.startswith('cuda') and not torch.cuda.is_available():
            raise ValueError(f"config key 'device' is {cfg.device!r} but CUDA is not available here")
        self._store: Any = None
        self._index: Optional[RewardIndex] = None
        self._states: Optional[StateSet] = None
        # GFlowNet counters (saved as 'counters'); the engine's own are in stats() too
        self._tally = dict(
            pushed=0,
            admitted=0,
            evicted=0,
            sampled=0,
            filter_checked=0,
            rejected_by_reward=0,
            rejected_by_distance=0,
            push_calls=0,
        )
        self._build_engine(0)  # use counts are sized with the store (physical slots)
        self._build_monitors(cfg.monitor.get('tensorboard', False), None)
        self._last_logged: Dict[str, int] = dict(self._tally)
        self._load_env: Any = None

    @property
    def capacity(self) -> int:
        return self._cfg.replay_buffer_size

    # torchgfn's attributes, read by code written against its buffers
    @property
    def prioritized_capacity(self) -> bool:
        return self._prioritized_capacity()

    @property
    def prioritized_sampling(self) -> bool:
        return bool(self._cfg.prioritized_sampling)

    @property
    def device(self) -> torch.device:
        return torch.device(self._cfg.device)

    @property
    def env(self) -> Any:
        """The environment of the stored torchgfn containers (None before the first container is pushed, and
        for dict batches)."""
        return getattr(self._store, 'env', None)

    @property
    def training_container(self) -> Any:
        """Every stored item, oldest first, as one batch of the stored kind (a copy: a container, or a dict of
        batched tensors); None before the first push."""
        with self._lock:
            if self._index is None:
                return None
            slots = self._index.oldest(self._index.count)
            return self._store.read(slots, self._index.seq[slots])

    @property
    def storage(self) -> Any:
        """``ColumnStore``, ``ContainerRing`` or ``ContainerStore`` (None before the first push)."""
        return self._store

    def count(self) -> int:
        return 0 if self._index is None else self._index.count

    def _prioritized_capacity(self) -> bool:
        return bool(self._cfg.prioritized_capacity) or self.diverse

    def _parts_for(self, store: Any):
        """A fresh ``(RewardIndex, StateSet)`` sized for ``store`` (nothing is swapped in)."""
        return make_parts(self._cfg, store, self._prioritized_capacity(), self.diverse)

    def _make_store(self, data: Any) -> Any:
        return make_store(self._cfg, data)

    def _new_parts(self, store: Any) -> None:
        self._index, self._states = self._parts_for(store)
        self._store = store
        if self._uses is not None:
            self._uses.resize(self._index.physical)

    # ------------------------------------------------------------------ table verbs
    def oldest(self, k: int) -> np.ndarray:
        return np.empty(0, dtype=np.int64) if self._index is None else self._index.oldest(k)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return self._store.collect_iter(slots)

    def _drop(self, slots: np.ndarray) -> List[Any]:
        self._evict(slots)
        return []

    def _release_table(self) -> None:
        """GFlowNet stores live in memory: nothing to free."""

    def _live(self, slots: np.ndarray) -> np.ndarray:
        return np.zeros(len(slots), dtype=bool) if self._index is None else self._index.alive[slots]

    # ------------------------------------------------------------------ push
    def add(self, data: Any) -> None:
        """torchgfn's ``add``: ``push`` without a return value."""
        self.push(data)

    def push(self, data: Any, cur_collector_envstep: int = -1, batched: Optional[bool] = None) -> int:
        """
        Overview:
            Offer a batch; returns how many of its items were stored (filters and capacity may drop some).
            All or nothing on bad input: a ``TypeError``/``ValueError`` leaves the buffer unchanged.
        Arguments:
            - data: dict of batched tensors, list of item dicts, or a Container.
            - cur_collector_envstep (:obj:`int`): recorded for monitors.
            - batched: accepted for ``IBuffer`` compatibility; dicts are always batches here.
        """
        self._check_open()
        if data is None:
            raise TypeError("cannot push None into a GFlowNet buffer")
        cur_collector_envstep = check_step(cur_collector_envstep, 'cur_collector_envstep')
        with self._lock:
            data = self._convert(data)
            if isinstance(data, list) and not data:
                return 0
            store = self._store if self._store is not None else self._make_store(data)
            check_kind(store, data)
            batch = store.prepare(data, need_rows=True)
            self._validate(batch)
            if batch.n == 0 or not self._admit(batch.n):
                return 0
            if self._store is None:
                self._new_parts(store)
            before = self._tally['evicted']
            stored = self._insert(batch)
            self._pushed(stored, self._tally['evicted'] - before)
            self._last_envstep = cur_collector_envstep
            self._tally['push_calls'] += 1
            due = self._due_scalars()
        if due is not None:
            self._emit(due)  # TensorBoard is I/O: written outside the lock
        return stored

    def _convert(self, data: Any) -> Any:
        """Hook of ``terminating_state``: what is actually stored for ``data``."""
        return data

    def _validate(self, batch: GFNBatch) -> None:
        """Everything that can reject the batch, checked before anything changes."""
        needs_reward = self._prioritized_capacity() or self._cfg.prioritized_sampling
        if needs_reward and batch.n and np.isnan(batch.log_reward).any():
            raise ValueError(
                "log_rewards must be defined for prioritized replay (prioritized_capacity / prioritized_sampling / "
                "gfn_diverse); the container has none"
            )
        if batch.rows is not None and self._states is not None:
            self._states.check_dim(batch.rows, 'the terminating-state representation')

    def _admission(self, batch: GFNBatch) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """Which items of the batch go on to the capacity rule (positions, in order; None: every item, as here)
        and the batch's ``row_hashes`` where the rule computed them (else None: the ``StateSet`` hashes the stored
        ones when it needs them). The diverse preset's filter is an admission rule overriding this."""
        return None, None

    def _insert(self, batch: GFNBatch) -> int:
        """Admission, then capacity, then write. Returns the number stored."""
        index, states, c = self._index, self._states, self._tally
        r = batch.log_reward
        c['pushed'] += batch.n
        order, hashes = self._admission(batch)
        if order is not None and not len(order):
            return 0
        keep_new, evict = index.admit(r if order is None else r[order])
        seqs = index.claim_seqs(len(keep_new))  # every admitted item consumes an id, stored or not
        self._evict(evict)
        if order is None and keep_new.all():  # the common case: the whole batch, in order (no copies)
            chosen, m, r_chosen, rows, h = None, batch.n, r, batch.rows, hashes
        else:
            chosen = (np.arange(batch.n, dtype=np.int64) if order is None else order)[keep_new]
            m, r_chosen, seqs = len(chosen), r[chosen], seqs[keep_new]
            rows = None if batch.rows is None else batch.rows[chosen]
            h = None if hashes is None else hashes[chosen]
        slots = self._slots_for(m)
        self._store.write(slots, batch, chosen)
        index.store(slots, r_chosen, seqs)
        if rows is None:
            states.disable()  # an item without a single terminating state: stop counting unique states
        else:
            states.add(slots, rows, h)
        c['admitted'] += m
        return m

    def _evict(self, slots: np.ndarray) -> None:
        if len(slots):
            self._states.remove(slots)
            self._index.evict(slots)
            if self._uses is not None:
                self._uses.reset(slots)
            self._tally['evicted'] += len(slots)

    def _slots_for(self, n: int) -> np.ndarray:
        index = self._index
        if self._store.reuses_slots:
            return index.free_slots(n)
        if index.end + n > 2 * (index.count + n) and index.end:  # half dead: compact (amortised O(1) per item)
            keep = index.live_slots()
            self._store.compact(keep)
            index.compact(keep)
            self._states.compact(keep)
            if self._uses is not None:
                self._uses.compact(keep)
        slots = index.append_slots(n)
        self._states.grow(index.physical)
        if self._uses is not None:
            self._uses.resize(index.physical)
        return slots

    # ------------------------------------------------------------------ sample
    def sample(
        self,
        size: Optional[int] = None,
        cur_learner_iter: int = -1,
        replace: Optional[bool] = None,
        timeout: Optional[float] = None,
        n_samples: Optional[int] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Draw ``size`` items: uniformly, or with probability ``softmax(log_reward)`` when
            ``prioritized_sampling``. ``replace`` (default: the config's ``sample_replacement``; None = only when
            ``size`` exceeds the stored count). Items waiting in a lazy buffer are included. ``timeout``
            (seconds) waits until the draw is possible, else ``SampleTimeoutError``.
        Returns:
            - batch: dict of batched tensors, or a container of the pushed type; ``None`` (logged) when the
              buffer is empty, or holds fewer than ``size`` items and sampling is without replacement.
            ``n_samples`` is torchgfn's name for ``size``.
        """
        if n_samples is not None:
            if size is not None:
                raise TypeError(f"sample() got both size={size!r} and n_samples={n_samples!r}; give one")
            size = n_samples
        elif size is None:
            raise TypeError("sample() needs the number of items: size (or torchgfn's n_samples)")
        if replace is not None and not isinstance(replace, bool):
            raise TypeError(f"replace must be None or a bool, got {replace!r}")
        return self._sample_flow(
            size,
            cur_learner_iter,
            timeout,
            lambda: self._draw(int(size), replace),
            lambda: self._shortfall(int(size), replace),
        )

    def _replace(self, size: int, replace: Optional[bool]) -> bool:
        rep = self._cfg.sample_replacement if replace is None else replace
        return size > self.count() if rep is None else rep

    def _shortfall(self, size: int, replace: Optional[bool]) -> str:
        m = self.count()
        if m == 0:
            return 'buffer is empty'
        if not self._replace(size, replace) and size > m:
            return f'{m} items < batch size {size} and sampling is without replacement'
        return ''

    def _draw(self, size: int, replace: Optional[bool]) -> Any:
        why = self._shortfall(size, replace)
        if why:
            return self._refused(why)
        slots = self._index.sample(self._rng, size, bool(self._cfg.prioritized_sampling), self._replace(size, replace))
        out = self._store.read(slots, self._index.seq[slots])
        self._drawn(slots, size)  # first: a broken rule of the user's fails the sample with nothing counted
        self._tally['sampled'] += size
        return out

    # ------------------------------------------------------------------ clear / state
    def _clear(self) -> List[Any]:
        if self._index is not None:
            if self._uses is not None:
                self._uses.reset(self._index.live_slots())
            self._index.clear()
            self._states.clear()
            self._store.clear()
        return []

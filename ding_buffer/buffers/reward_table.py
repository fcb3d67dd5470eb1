"""``RewardTable``: GFlowNet items ranked by log-reward -- the table of ``gfn``, ``gfn_diverse`` and
``terminating_state``.

Parts: the item store (``ColumnStore`` for dict batches, ``ContainerRing`` / ``ContainerStore`` for torchgfn
containers; the first push decides), the ``RewardIndex`` (capacity by age or by log-reward, sampling uniformly or by
softmax of the log-reward) and the ``StateSet`` (unique terminating states; the diversity filter's rows). A push is
admission (``diverse``: the diversity filter), then capacity, then write; ``terminating``: only terminating states
and their log-rewards are stored. Saving and restoring: ``gfn_state``; the numbers it reports: ``gfn_stats``.
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..control.diversity import StateSet  # noqa: F401 (annotations)
from ..control.keep_best import RewardIndex
from . import gfn_state, gfn_stats
from .gfn_admission import diverse_admission, terminating_states
from .gfn_data import GFNBatch, is_torchgfn
from .gfn_parts import check_kind, check_slot_memory, make_parts, make_store, physical_slots
from .table import Drawn, Needs, Request, Restored, Table, Write, Written


def sample_size(size: Any, n_samples: Any) -> Any:
    """A sample's number of items: ``size``, or torchgfn's ``n_samples`` (one of the two; ``TypeError`` else)."""
    if n_samples is not None:
        if size is not None:
            raise TypeError(f"sample() got both size={size!r} and n_samples={n_samples!r}; give one")
        return n_samples
    if size is None:
        raise TypeError("sample() needs the number of items: size (or torchgfn's n_samples)")
    return size


class RewardTable(Table):
    """
    Overview:
        Reward-ranked GFlowNet items (see the module docstring). ``diverse``: keep-best plus the diversity filter
        once full; ``terminating``: store terminating states only.
    """

    state_keys = frozenset(
        {'settings', 'store', 'index', 'track_states', 'counters', 'logged', 'engine', 'use', 'layout', 'slots', 'free'}
    )

    def __init__(
        self,
        cfg: Any,
        name: str,
        lock: Any,
        defaults: Mapping,
        checks: Mapping,
        diverse: bool = False,
        terminating: bool = False,
    ) -> None:
        super().__init__(cfg, name, lock)
        self.defaults, self.checks = defaults, checks  # the preset's: a restore rebuilds the config with saved keys
        self.diverse = diverse
        self.terminating = terminating

    def build(self) -> Needs:
        cfg = self.cfg
        if cfg.device.startswith('cuda') and not torch.cuda.is_available():
            raise ValueError(f"config key 'device' is {cfg.device!r} but CUDA is not available here")
        check_slot_memory(cfg, physical_slots(cfg, True), "config key 'replay_buffer_size'")
        named: Dict[str, str] = {}  # field -> the key naming it: each key names a field of its own
        for key in ('state_key', 'log_reward_key', 'condition_key'):
            field = cfg[key]
            if field is not None and named.setdefault(field, key) != key:
                raise ValueError(
                    f"config key '{key}' is {field!r}, the same field as '{named[field]}'; expected a field of its own"
                )
        self._store: Any = None
        self.index: Optional[RewardIndex] = None
        self.states: Optional[StateSet] = None
        # GFlowNet counters (saved as 'counters'); the engine's own are in stats() too
        self.tally = dict(
            pushed=0,
            admitted=0,
            evicted=0,
            sampled=0,
            filter_checked=0,
            rejected_by_reward=0,
            rejected_by_distance=0,
            push_calls=0,
        )
        self.last_logged: Dict[str, int] = dict(self.tally)
        self.load_env: Any = None
        return Needs(0, tensorboard=cfg.monitor.get('tensorboard', False))  # use counts grow with the store

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.cfg.device)

    @property
    def env(self) -> Any:
        """The environment of the stored torchgfn containers (None before the first container is pushed, and
        for dict batches)."""
        return getattr(self._store, 'env', None)

    @property
    def training_container(self) -> Any:
        """Every stored item, oldest first, as one batch of the stored kind (a copy: a container, or a dict of
        batched tensors); None before the first push."""
        with self.lock:
            if self.index is None:
                return None
            slots = self.index.oldest(self.index.count)
            return self._store.read(slots, self.index.seq)

    @property
    def storage(self) -> Any:
        """``ColumnStore``, ``ContainerRing`` or ``ContainerStore`` (None before the first push)."""
        return self._store

    def count(self) -> int:
        return 0 if self.index is None else self.index.count

    def prioritized(self) -> bool:
        return bool(self.cfg.prioritized_capacity) or self.diverse

    def parts_for(self, store: Any):
        """A fresh ``(RewardIndex, StateSet)`` sized for ``store`` (nothing is swapped in)."""
        return make_parts(self.cfg, store, self.prioritized(), self.diverse)

    def new_parts(self, store: Any) -> None:
        self.index, self.states = self.parts_for(store)
        self._store = store
        if self.parts.uses is not None:
            self.parts.uses.resize(self.index.physical)

    # ------------------------------------------------------------------ table verbs
    def oldest(self, k: int) -> np.ndarray:
        return np.empty(0, dtype=np.int64) if self.index is None else self.index.oldest(k)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        if self._store is None:  # (before the first push: no slot is held, ``oldest`` names none)
            return np.empty(0, dtype=np.int64)
        return self._store.collect_iter(slots)

    def drop(self, slots: np.ndarray) -> List[Any]:
        self.evict(slots)
        if not self.index.count:  # emptied by a rule: the next push fixes the layout, as after clear() or a reload
            self.index.clear()  # (the append position too: the cleared store appends from slot 0 again)
            self._store.clear()
            self.states.clear()
        return []

    def release(self) -> None:
        """GFlowNet stores live in memory: nothing to free."""

    def live(self, slots: np.ndarray) -> np.ndarray:
        return np.zeros(len(slots), dtype=bool) if self.index is None else self.index.alive[slots]

    # ------------------------------------------------------------------ push
    def prepare_push(self, data: Any) -> Optional[Write]:
        """A pushed batch validated (under the buffer's lock; raising with nothing changed); None: nothing to
        write."""
        if data is None:
            raise TypeError("cannot push None into a GFlowNet buffer")
        data = self.convert(data)
        if isinstance(data, list) and not data or is_torchgfn(data) and len(data) == 0:  # (of any kind: a no-op)
            return None
        store = self._store if self._store is not None else make_store(self.cfg, data)
        check_kind(store, data)
        batch = store.prepare(data, need_rows=self.diverse)  # others read the stored rows back when counting
        self.validate(batch)
        if not batch.n:
            return None
        store.check_joins(data)
        return Write(batch.n, (store, batch))

    def write(self, w: Write, report_evicted: bool) -> Written:
        """Admission, then capacity, then write (``insert``); the monitors' scalars every ``log_every`` pushes."""
        store, batch = w.plan
        if self._store is None:
            self.new_parts(store)
        before = self.tally['evicted']
        stored = self.insert(batch)
        self.tally['push_calls'] += 1
        return Written(stored, None, self.tally['evicted'] - before, due=self.due_scalars())

    def convert(self, data: Any) -> Any:
        """What is actually stored for ``data``: the data itself, or (``terminating_state``) its terminating
        states and their log-rewards (``gfn_admission.terminating_states``)."""
        return terminating_states(self.cfg, data) if self.terminating else data

    def needs_rewards(self) -> bool:
        """Whether every item needs a log-reward (prioritized capacity or sampling); otherwise an item of a container
        without log-rewards (torchgfn's backward trajectories) is kept with NaN, in files too."""
        return self.prioritized() or self.cfg.prioritized_sampling

    def validate(self, batch: GFNBatch) -> None:
        """Everything that can reject the batch, checked before anything changes."""
        if self.needs_rewards() and batch.n and np.isnan(batch.log_reward).any():
            raise ValueError(
                "log_rewards must be defined for prioritized replay (prioritized_capacity / prioritized_sampling / "
                "gfn_diverse); the container has none"
            )
        if batch.width is not None and self.states is not None:
            self.states.check_dim(batch.width, 'the terminating-state representation (state values, then conditions)')
        if self.diverse:
            if batch.rows is not None and not np.isfinite(batch.rows).all():
                raise ValueError("gfn_diverse needs finite terminating states (and conditions); got NaN or inf")
            if batch.width is None and batch.n:
                raise ValueError(
                    "gfn_diverse needs each item's terminating state as one row of numbers (its distances are between "
                    "them); these items have none (Transitions: no single terminating state each)"
                )

    def admission(self, batch: GFNBatch) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """Which items of the batch go on to the capacity rule (positions, in order; None: every item) and the
        batch's ``row_hashes`` where the rule computed them (else None: the ``StateSet`` hashes the stored ones when
        it needs them). ``gfn_diverse``: the diversity filter (``gfn_admission.diverse_admission``)."""
        return diverse_admission(self, batch) if self.diverse else (None, None)

    def insert(self, batch: GFNBatch) -> int:
        """Admission, then capacity, then write. Returns the number stored."""
        index, states, c = self.index, self.states, self.tally
        r = batch.log_reward
        c['pushed'] += batch.n
        order, hashes = self.admission(batch)
        if order is not None and not len(order):
            return 0
        offered = r if order is None else r[order]
        keep_new, evict = index.admit(offered)
        seqs = index.claim_seqs(len(offered))  # every admitted item consumes an id, stored or not
        if order is None and keep_new is None:  # the common case: the whole batch, in order (no copies)
            chosen, m, r_chosen, rows, h = None, batch.n, r, batch.rows, hashes
        else:
            chosen = np.arange(batch.n, dtype=np.int64) if order is None else order
            if keep_new is not None:
                chosen, seqs = chosen[keep_new], seqs[keep_new]
            m, r_chosen = len(chosen), r[chosen]
            rows = None if batch.rows is None else batch.rows[chosen]
            h = None if hashes is None else hashes[chosen]
        full = m and len(evict) == m and self._store.reuses_slots  # a full buffer: the new items take the freed slots
        if full:
            slots = evict
            self._forget(slots)
        else:
            self.evict(evict)
            slots = self.slots_for(m)
        self._store.write(slots, batch, chosen)
        (index.replace if full else index.store)(slots, r_chosen, seqs)
        if batch.width is not None:
            states.add(slots, rows, h, batch.width)  # (rows None: read back from the store when counted)
        else:
            states.disable()  # an item without a single terminating state: stop counting unique states
        c['admitted'] += m
        return m

    def evict(self, slots: np.ndarray) -> None:
        if len(slots):
            self._forget(slots)
            self.index.evict(slots)

    def _forget(self, slots: np.ndarray) -> None:
        """What evicting ``slots`` changes outside the index: the unique states, use counts and the tally."""
        self.states.remove(slots)
        if self.parts.uses is not None:
            self.parts.uses.reset(slots)
        self.tally['evicted'] += len(slots)

    def slots_for(self, n: int) -> np.ndarray:
        index = self.index
        if self._store.reuses_slots:
            return index.free_slots(n)
        if index.end + n > 2 * (index.count + n) and index.end:  # half dead: compact (amortised O(1) per item)
            keep = index.live_slots()
            self._store.compact(keep)
            index.compact(keep)
            self.states.compact(keep)
            if self.parts.uses is not None:
                self.parts.uses.compact(keep)
        slots = index.append_slots(n)
        self.states.grow(index.physical)
        if self.parts.uses is not None:
            self.parts.uses.resize(index.physical)
        return slots

    # ------------------------------------------------------------------ sample
    def request(
        self,
        size: Optional[int] = None,
        replace: Optional[bool] = None,
        timeout: Optional[float] = None,
        n_samples: Optional[int] = None,
    ) -> Request:
        """``n_samples`` is torchgfn's name for ``size`` (one of the two)."""
        size = sample_size(size, n_samples)
        if replace is not None and not isinstance(replace, (bool, np.bool_)):
            raise TypeError(f"replace must be None or a bool, got {replace!r}")
        draw, shortfall = lambda rng: self.draw(rng, int(size), replace), lambda: self.shortfall(int(size), replace)
        return Request(size, draw, shortfall, timeout)

    def replace(self, size: int, replace: Optional[bool]) -> bool:
        rep = self.cfg.sample_replacement if replace is None else replace
        return size > self.count() if rep is None else rep

    def shortfall(self, size: int, replace: Optional[bool]) -> str:
        m = self.count()
        if m == 0:
            return 'buffer is empty'
        if not self.replace(size, replace) and size > m:
            return f'{m} items < batch size {size} and sampling is without replacement'
        return ''

    def draw(self, rng: np.random.Generator, size: int, replace: Optional[bool]) -> Any:
        why = self.shortfall(size, replace)
        if why:
            return why
        slots = self.index.sample(rng, size, bool(self.cfg.prioritized_sampling), self.replace(size, replace))
        return Drawn(slots, size, self._store.read(slots, self.index.seq), done=self.count_sampled(size))

    def count_sampled(self, size: int) -> Callable[[int], None]:
        """Counted once the engine counted the draw (a broken rule of the user's fails the sample first)."""

        def done(envstep: int) -> None:
            self.tally['sampled'] += size

        return done

    # ------------------------------------------------------------------ clear / state
    def clear(self) -> List[Any]:
        if self.index is not None:  # (the engine then resets use counts)
            self.index.clear()
            self.states.clear()
            self._store.clear()
        return []

    # ------------------------------------------------------------------ what the parts read
    @property
    def store(self) -> Any:
        return self._store

    def ordered_slots(self) -> np.ndarray:
        return self.oldest(self.count())

    def next_id(self) -> int:
        return 0 if self.index is None else int(self.index.next_seq)

    # ------------------------------------------------------------------ stats / state
    def stats(self, out: Dict[str, float]) -> Dict[str, float]:
        return gfn_stats.stats(self, out)

    def due_scalars(self) -> Any:
        return gfn_stats.due_scalars(self)

    def log_rewards(self) -> np.ndarray:
        return gfn_stats.log_rewards(self)

    def describe(self) -> str:
        return gfn_stats.describe(self)

    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        return gfn_state.state(self, engine)

    def restore(self, state: Dict[str, Any]) -> Restored:
        return gfn_state.restore(self, state)

    def restoring_with(self, env: Any, load: Callable[[], None]) -> None:
        """Run ``load`` (a restore) with torchgfn containers rebuilt on ``env`` (default: the env of the container
        this table already holds; None inside another ``restoring_with`` keeps that one's)."""
        before = self.load_env
        self.load_env = before if env is None else env
        try:
            load()
        finally:
            self.load_env = before


__all__ = ['RewardTable']

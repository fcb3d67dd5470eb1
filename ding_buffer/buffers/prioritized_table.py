"""``PrioritizedTable``: a slot table with a priority column -- the table of ``advanced`` (and of ``deque`` with
``priority=True``).

Composition: the slot table's storage and write paths + ``PriorityIndex`` (priorities, sum / min trees; told of
every write and removal through the slot table's ``written`` / ``removed`` hooks) + ``BetaSchedule`` + the
sampled-data monitor. Differences from DI-engine are fixes of what ``anchors/dingengine-buffers.md`` marks as
bugs: ``sample_range`` is exact for every slice (insertion order), non-finite or negative priorities are
``ValueError`` (all or nothing), ``update`` reports stale entries and never revives retired items, pushed and
stored dicts are never mutated, refusals are counted in ``stats()``.
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..control.capacity import index_for
from ..control.priority import (
    MAX_PRIORITY,
    BetaSchedule,
    PriorityIndex,
    batch_priorities,
    item_priorities,
    parse_update,
    priority_of,
)
from ..control.samplers import SAMPLER_REGISTRY, build_sampler
from ..monitor.sampled_data import EMPTY_WINDOW, SampledDataAttrMonitor
from ..monitor.tb import emit, rank
from ..storage import storage_from_state
from ..storage.tensordict_io import is_tensordict, update_info
from .common import check_derived, check_range
from .outputs import with_extras
from .slot_table import SlotTable, ring_counts
from .table import Drawn, Needs, Parts, Request, Restored, Write

# Keys added to sampled items; ignored (tensor storage) when such an item is pushed back.
SAMPLE_KEYS = ('priority', 'IS', 'staleness', 'use')

# Priority dtypes the compiled update takes (native byte order); float16 (mixed precision) and others take the
# checking path, which converts them.
_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _flat_array(x: Any) -> Optional[np.ndarray]:
    """A 1-d numpy view of a CPU tensor or array (no copy), else None."""
    if type(x) is not np.ndarray:
        if not isinstance(x, torch.Tensor):
            return None
        try:  # CPU tensors only; numpy() refuses the others (device, grad, conj / neg bits, layout)
            x = x.numpy()
        except (TypeError, RuntimeError):
            if not x.requires_grad:
                return None
            try:
                x = x.detach().numpy()
            except (TypeError, RuntimeError):
                return None
    return x if x.ndim == 1 else None


def check_sampler(section: Mapping) -> bool:
    """The ``sampler`` section of ``advanced``: ``{}`` or ``dict(type='prioritized')`` (the priority draw: False), or
    another registered sampler (True: it draws the batches); arguments of the priority draw here are a
    ``ValueError`` saying where they go.

    Examples:
        >>> check_sampler({}), check_sampler(dict(type='prioritized')), check_sampler(dict(type='uniform'))
        (False, False, True)
        >>> check_sampler(dict(type='prioritized', alpha=0.9))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: config key 'sampler.alpha': type 'advanced' takes its prioritized sampler's arguments ...
    """
    section = dict(section)
    name = section.pop('type', 'prioritized')
    if not isinstance(name, str):
        raise ValueError(f"config key 'sampler.type' must be a str, got {name!r}")
    SAMPLER_REGISTRY.get(name)  # an unknown name: the registry's message (registered names, import_names)
    if name != 'prioritized':
        return True
    if section:
        raise ValueError(
            f"config key 'sampler.{sorted(section)[0]}': type 'advanced' takes its prioritized sampler's arguments "
            "as top-level keys (alpha, beta, anneal_step, eps); leave sampler={} or dict(type='prioritized')"
        )
    return False


class PrioritizedTable(SlotTable):
    """
    Overview:
        Prioritized experience replay (Schaul et al.) over a slot table: ``sample`` draws stratified by priority
        (with replacement) and adds ``replay_unique_id``, ``replay_buffer_idx``, ``priority``, ``staleness``,
        ``use`` and ``IS``; ``update`` takes those ids back with new priorities.
    Complexity: push O(n log8 C), sample O(B log8 C) (O(m) with ``sample_range`` selecting m items),
        update O(B log8 C), stats O(1).
    """

    uses_counted = True
    indexed = True
    slot_bytes = 25  # its priority trees (padded to a power of two) and priority column, measured
    state_keys = frozenset({'storage', 'index', 'beta', 'sampled', 'counters', 'thruput', 'envstep'})  # use: in index
    resets_push_count = False  # DI-engine's advanced buffer keeps push_count on clear
    reserved_keys = SAMPLE_KEYS
    admission_columns = ('priority',)
    mutable_columns = ('priority',)
    retires_used = True  # DI-engine: with used-data tracking an item that reached max_use keeps its file

    # ------------------------------------------------------------------ construction
    def build_sampler(self) -> None:
        """The priority draw (``sampler=None``), or the sampler the config names: it draws the batches instead, among
        the items the priority draw could reach; ``IS`` is 1 then, priorities stay for ``update`` and capacity
        rules."""
        self.sampler = None
        if check_sampler(self.cfg.sampler):
            self.use_sampler(build_sampler(self.cfg.sampler, 'prioritized', (True, '')))

    def build_index(self) -> None:
        cfg = self.cfg
        self.index = self.new_index()
        self.alpha = float(cfg.alpha)
        self.beta = BetaSchedule(cfg.beta, int(cfg.anneal_step))

    def needs(self) -> Needs:
        cfg = self.cfg
        return Needs(
            cfg.replay_buffer_size,
            tensorboard=cfg.monitor.get('tensorboard', False),
            period=cfg.monitor.periodic_thruput.seconds,
        )

    def attach(self, parts: Parts) -> None:
        super().attach(parts)
        # update() may apply without naming the slots: no max_use to check, no capacity rule to tell
        self.update_direct = parts.use_limit is None and not parts.capacity
        attr = self.cfg.monitor.sampled_data_attr
        self.sampled_monitor = SampledDataAttrMonitor(
            self.name, attr.average_range, attr.print_freq, parts.logger, parts.tb if rank() == 0 else None
        )

    def new_index(self) -> PriorityIndex:
        cfg = self.cfg
        return PriorityIndex(
            cfg.replay_buffer_size, cfg.alpha, cfg.eps, cfg.max_priority_within_buffer, cfg.max_priority_plus_eps
        )

    # ------------------------------------------------------------------ write / remove hooks
    def removed(self, slots: np.ndarray) -> None:
        self.index.clear_slots(slots)

    def written(self, slots: np.ndarray, priorities: Optional[np.ndarray]) -> None:
        self.index.set_new(slots, priorities)

    def cleared(self, slots: np.ndarray) -> None:
        self.index.reset()

    def retire(self, slots: np.ndarray) -> None:
        self.index.retire(slots)

    # ------------------------------------------------------------------ columns (capacity rules read them)
    def columns(self) -> Dict[str, Any]:
        return {**super().columns(), 'priority': lambda slots: self.index.priorities(slots)}

    def new_values(self, column: str, priorities: Optional[np.ndarray], n: int) -> np.ndarray:
        """The priorities of ``n`` items about to be written, as ``priority`` will report them."""
        p = np.full(n, self.index.default_priority()) if priorities is None else priorities
        return self.index.as_stored(p)

    # ------------------------------------------------------------------ push
    def prepare(self, items: List[Any]) -> Write:
        prepared = self._storage.prepare(items)  # validated before the limiter decides (a bad push is an error)
        priorities = item_priorities(items, self.index.default_priority())  # validated before anything is written
        return Write(prepared.n, prepared, prepared.dropped, priorities[prepared.dropped :])

    def write_one(self, item: Any) -> Optional[int]:
        """The single-push hot path (O(fields) + one compiled tree update). None -- with nothing changed -- when
        the item is not a plain match; the checking path then handles (and reports) it."""
        if type(item) is not dict:
            return None
        p = item.get('priority')
        if p is None:
            p = self.index.default_priority()
        elif type(p) is not float or not 0 <= p <= MAX_PRIORITY:
            return None
        slot = self._storage.write_one(item)
        if slot is not None:
            self.index.set_new_one(slot, p)
        return slot

    def write_batch(self, batch: Any) -> Optional[np.ndarray]:
        checked = self._storage.check_batch(batch)  # O(fields), nothing written
        if checked is None:
            return None
        p = batch.get('priority')
        if p is None:
            slots = self._storage.write_batch(checked)
            self.index.fill_new(slots, self.index.default_priority())
            return slots
        p = _flat_array(p)
        if (
            p is not None
            and p.dtype in _KERNEL_FLOATS
            and len(p) == checked[1]
            and len(p)
            and p.min() >= 0
            and p.max() <= MAX_PRIORITY
        ):  # NaN fails; else the checking path reports
            slots = self._storage.write_batch(checked)
            self.index.set_new(slots, p)
            return slots
        return None

    def prepare_batch(self, batch: Any) -> Write:
        if type(batch) is not dict and not isinstance(batch, Mapping):
            raise TypeError(f"a batched push needs a dict of batched leaves, got {type(batch).__name__}")
        if (
            type(batch) is not dict and is_tensordict(batch) and batch.batch_dims > 1 and self._storage.kind == 'list'
        ):  # (list storage keeps each row as it is)
            raise ValueError(
                f"a TensorDict batch of batch_size {list(batch.batch_size)} would store items of batch_size "
                f"{list(batch.batch_size[1:])}; a prioritized buffer's items have batch_size [] (one priority each)"
            )
        prepared = self._storage.prepare_batch(batch)
        priorities = batch_priorities(priority_of(batch), prepared, self.index.default_priority())
        return Write(prepared.n, prepared, prepared.dropped, priorities)

    # ------------------------------------------------------------------ sample
    def request(
        self,
        size: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        timeout: Optional[float] = None,
    ) -> Request:
        """``cur_learner_iter`` too: the staleness of each drawn item is measured against it."""
        check_range(sample_range)
        return Request(size, lambda rng: self.draw(rng, size, cur_learner_iter, sample_range), self._massless, timeout)

    def _massless(self) -> str:
        """Why the priority draw over every item would draw nothing though items are stored ('' otherwise; a
        ``sample_range`` or a sampler of its own is judged by the draw)."""
        if self.sampler is None and not self.index.tree.total() > 0 and self.count():  # (total: what the draw reads)
            return 'every candidate item has priority 0'
        parts = self.parts
        if self.sampler is not None and parts.tracked and parts.use_limit is not None and self.count():
            every = self.slots_at(self.candidates(None))  # (as ``draw_selected``: retired items are no candidates)
            if parts.use_limit.spent(parts.uses[every]).all():
                return 'every stored item is used up (max_use; kept for enable_track_used_data)'
        return ''

    def draw(self, rng: np.random.Generator, size: int, cur_learner_iter: int, sample_range: Optional[slice]) -> Any:
        index = self.index
        if self.sampler is not None:
            return self.draw_selected(rng, size, cur_learner_iter, sample_range)
        if sample_range is None and index.can_draw():  # the hot path: one compiled pass, same draws
            if not index.tree.total() > 0:
                return 'every candidate item has priority 0'
            u = rng.random(size)
            beta = self.beta.draw()
            slots, weights, priority, use, ids = index.draw(u, beta, self.parts.uses.counts, self._storage.ring)
            return self.drawn_batch(slots, size, weights, priority, use, cur_learner_iter, ids)
        candidates = None
        if sample_range is not None:
            positions = self.candidates(sample_range)
            if not len(positions):
                return f'{sample_range} selects nothing'
            candidates = self.slots_at(positions)
        slots = index.sample(rng, size, candidates)
        if slots is None:
            return 'every candidate item has priority 0'
        beta = self.beta.draw()
        weights = index.is_weights(slots, beta)
        priority = index.priorities(slots)
        use = self.parts.uses.bump(slots)
        return self.drawn_batch(slots, size, weights, priority, use, cur_learner_iter)

    def draw_selected(
        self, rng: np.random.Generator, size: int, cur_learner_iter: int, sample_range: Optional[slice]
    ) -> Any:
        """A draw by the config's own sampler, with replacement as the priority draw; items retired by ``max_use``
        (kept while tracked: their use count is at the limit) are no candidates. O(candidates) per draw."""
        every = self.slots_at(self.candidates(sample_range))
        parts = self.parts
        if parts.tracked and parts.use_limit is not None:
            every = every[~parts.use_limit.spent(parts.uses[every])]
        if len(every) == 0:
            return 'buffer is empty' if self.count() == 0 else f'{sample_range} selects no item that may be drawn'
        idx = self.positions(rng, len(every), size, True, lambda: every)
        if type(idx) is str:
            return idx
        slots = every[idx]
        self.beta.draw()
        use = self.parts.uses.bump(slots)
        return self.drawn_batch(slots, size, np.ones(size), self.index.priorities(slots), use, cur_learner_iter)

    def drawn_batch(
        self,
        slots: np.ndarray,
        size: int,
        weights: np.ndarray,
        priority: np.ndarray,
        use: np.ndarray,
        cur_learner_iter: int,
        ids: Optional[np.ndarray] = None,
    ) -> Drawn:
        """The batch of a draw (use counts already bumped, beta annealed; ``ids`` of the slots when known):
        staleness and output; the monitor records it once the engine counted the draw (a broken rule of the user's
        fails it first), with the beta annealed by this draw, as DI-engine's monitor writes it."""
        try:
            staleness = self._storage.staleness(slots, cur_learner_iter)
            extras = dict(priority=priority, staleness=staleness, use=use, IS=weights)
            out = with_extras(self._storage, slots, extras, self.name, ids)
        except BaseException:  # (no memory for the batch): the draw's use counts are taken back (the engine
            self.parts.uses.unbump(slots)  # restores beta and the RNG from its snapshot)
            raise
        monitor, beta = self.sampled_monitor, self.beta.value

        def done(envstep: int) -> Any:
            return monitor.record(use, priority, staleness, beta, cur_learner_iter, envstep)

        return Drawn(slots, size, out, use, done, self._storage.kind == 'list')  # (list: the stored objects)

    def snapshot(self, python_random: bool) -> Any:
        return self.beta.value, super().snapshot(python_random)

    def restore_snapshot(self, snapshot: Any) -> None:
        self.beta.set(snapshot[0])
        super().restore_snapshot(snapshot[1])

    def emit(self, due: Any) -> None:
        emit(due, self.sampled_monitor.logger, self.sampled_monitor.tb_logger)

    # ------------------------------------------------------------------ update
    def update(self, info: Dict[str, Any]) -> Any:
        """``info`` parsed and checked here; applied under the engine's lock (``Engine.update``)."""
        if type(info) is not dict and is_tensordict(info):
            info = update_info(info)
        # the compiled path applies without naming the slots; a capacity rule reading priorities must hear of them
        fast = self.fast_entries(info) if self.update_direct else None
        if fast is not None:
            return lambda spent: self.apply_fast(fast, info, spent)
        parsed = parse_update(info, self.name, self.capacity())
        if parsed is None:
            return {'updated': 0, 'stale': 0}
        return lambda spent: self.apply(parsed, spent)

    def apply(self, parsed: Tuple[np.ndarray, ...], spent: Callable[[np.ndarray], np.ndarray]) -> Tuple[Any, ...]:
        """New priorities where the id still lives in its slot and the item has not reached ``max_use``: (applied,
        total, the slots whose priorities changed)."""
        priorities, ids, slots, mine = parsed
        match = self._storage.ring.holds(slots, ids, mine) & ~spent(slots)
        n = int(np.count_nonzero(match))
        if n == len(slots):
            self.index.update(slots, priorities)
            return n, len(slots), slots
        if n:
            self.index.update(slots[match], priorities[match])
        return n, len(slots), slots[match]

    def fast_entries(self, info: Any) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The hot path of ``update``: what a tensor-storage sample returned (1-d CPU tensors or arrays: int ids,
        int slots, float32 / float64 priorities), as (slots, ids, priorities) for one compiled kernel; ``None`` for
        anything else (the checking path then applies or reports it)."""
        if type(info) is not dict:
            return None
        p, ids, slots = (_flat_array(info.get(k)) for k in ('priority', 'replay_unique_id', 'replay_buffer_idx'))
        if (
            p is None
            or ids is None
            or slots is None
            or p.dtype not in _KERNEL_FLOATS
            or ids.dtype.kind not in 'iu'
            or slots.dtype.kind not in 'iu'
            or not len(p) == len(ids) == len(slots)
        ):
            return None
        return slots.astype(np.int64, copy=False), ids.astype(np.int64, copy=False), p

    def apply_fast(self, fast: Tuple[np.ndarray, ...], info: Any, spent: Any) -> Tuple[int, int]:
        """The kernel applies every entry, or none when it finds an invalid one: the checking path then applies
        or reports it (nothing changed)."""
        slots, ids, p = fast
        n = self.index.update_by_ids(self._storage.ring, slots, ids, p)
        if n is not None:
            return n, len(slots)
        parsed = parse_update(info, self.name, self.capacity())
        return (0, 0) if parsed is None else self.apply(parsed, spent)

    # ------------------------------------------------------------------ stats / state
    def stats(self, out: Dict[str, float]) -> Dict[str, float]:
        out.update(
            push_count=self.push_count,
            beta=self.beta.value,
            max_priority=self.index.max_priority,
            priority_mass=self.index.tree.total(),
            priority_min_leaf=self.index.tree.min_leaf(),
        )
        out.update(self.sampled_monitor.averages())
        out['beta'] = self.beta.value  # the current beta, not the last sampled batch's
        return out

    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        index = {**self.index.state_dict(), 'use': engine.pop('use')}  # the file layout of version 1
        sampled = self.sampled_monitor.state_dict()
        return {
            'storage': self._storage.state_dict(),
            'index': index,
            'beta': self.beta.value,
            'sampled': sampled,
            **engine,
        }

    def restore(self, state: Dict[str, Any]) -> Restored:
        for key in ('storage', 'index', 'beta'):
            if key not in state:
                raise ValueError(f"state has no '{key}' entry")
        storage = storage_from_state(
            self.cfg.storage, self.capacity(), state['storage'], SAMPLE_KEYS, index_for(self.cfg)
        )
        check_derived(state.get('counters'), ring_counts(storage.ring), 'its storage ring counts')
        if storage.kind == 'list':  # what push refuses is refused in a state too
            items = storage.gather(storage.ring.ordered_slots())
            bad = next((i for i, x in enumerate(items) if not isinstance(x, Mapping)), None)
            if bad is not None:
                raise ValueError(f"saved item {bad} is not a dict; a prioritized buffer stores dicts")
        index = self.index.restored(state['index'], storage.ring.valid)
        beta = BetaSchedule.checked(state['beta'], 'saved beta')
        monitor = self.sampled_monitor  # (files written before the window was saved load with an empty one)
        monitor = monitor.restored(state['sampled']) if 'sampled' in state else monitor.restored(EMPTY_WINDOW)

        def swap() -> None:
            self._storage, self.index, self.sampled_monitor = storage, index, monitor
            self.beta.value = beta  # (checked above: nothing in a swap may fail)

        return Restored(swap, {**state, 'use': state['index']['use']}, storage.ring.valid, required=True)

    def describe(self) -> str:
        return (
            f"count={self.count()}, replay_buffer_size={self.capacity()}, alpha={self.alpha}, "
            f"beta={self.beta.value:.4f}, storage={self._storage!r}"
        )


__all__ = ['PrioritizedTable', 'SAMPLE_KEYS', 'check_sampler']

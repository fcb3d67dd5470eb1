"""``SlotTable``: items in a slot storage (list / tensor / memmap ring) -- the table of ``naive``, ``elastic``,
``sequence`` and (with a priority column, ``PrioritizedTable``) ``advanced`` and ``deque``.

It writes a batch or one item (the single-push hot path), asks a capacity rule which items leave a full table,
removes slots, and draws uniformly (or with the configured ``sampler``) among insertion positions: all of them, a
``sample_range`` of them, the newest ``current_buffer_size`` (a ``NewestWindow``: ``elastic``) or runs of
consecutive items (``runs_request``: ``sequence``). A prioritized table adds its index through two hooks,
``written`` and ``removed``, instead of copying the write path.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from ..control.capacity import index_for
from ..control.samplers import build_sampler
from ..storage import build_storage, refuse_items_output, storage_from_state
from .common import ENGINE_KEYS, check_derived, check_range, check_size, range_positions
from .newest_window import NewestWindow, checked_size
from .outputs import prioritized_items
from .table import Drawn, Needs, Request, Restored, Table, Write, Written

NO_PRIORITY = "items of type {!r} carry no priority: use type='advanced' for prioritized replay"


def check_replace(replace: Any) -> None:
    """``replace`` is a bool (``TypeError`` naming it otherwise)."""
    if type(replace) is not bool and type(replace) is not np.bool_:
        raise TypeError(f"replace must be a bool, got {type(replace).__name__} {replace!r:.40}")


def ring_counts(ring: Any) -> Dict[str, int]:
    """What a ring counts: every write (its ids, never reused, dropped items included) is pushed; what left is
    everything pushed that is no longer stored."""
    return {'push_items': ring.next_uid, 'remove_count': ring.next_uid - ring.count}


class SlotTable(Table):
    """
    Overview:
        Items in a slot storage, drawn by insertion position. ``window``: sample only the newest
        ``current_buffer_size`` items (``NewestWindow``); ``runs``: the table is sampled as runs of consecutive
        items (no capacity rule then: one evicting from the middle would break runs).
    """

    state_keys = ENGINE_KEYS | {'storage', 'current_buffer_size'}
    capacity_rules = True
    hot_path = True
    resets_push_count = True  # DI-engine's naive buffer restarts push_count on clear (advanced keeps it)
    indexed = False  # whether the table keeps a per-slot index the write hooks update (advanced: priorities)
    reserved_keys: Tuple[str, ...] = ()
    slot_bytes = 0  # what the table keeps per slot besides its storage's arrays (checked against memory at build)

    def __init__(self, cfg: Any, name: str, lock: Any, window: bool = False, runs: bool = False) -> None:
        super().__init__(cfg, name, lock)
        self.window: Optional[NewestWindow] = None
        self.runs = runs
        if runs:
            self.capacity_rules = False
        self._window_wanted = window

    def build(self) -> Needs:
        cfg = self.cfg
        if self.runs:
            refuse_items_output(cfg.storage, cfg.type, '[batch][sequence] runs')
        self.build_sampler()
        # list storage with storage.output='items': samples are new dicts carrying the item's id and slot
        self.list_items = cfg.storage.get('type', 'list') == 'list' and cfg.storage.get('output') == 'items'
        self._storage = build_storage(
            cfg.storage,
            cfg.replay_buffer_size,
            reserved_keys=self.reserved_keys,
            index_cls=index_for(cfg),
            table_bytes=self.slot_bytes,
        )
        self.build_index()
        self.bind_hot_path()
        if self._window_wanted:
            self.window = NewestWindow(cfg.set_buffer_size, cfg.replay_buffer_size)
        return self.needs()

    def bind_hot_path(self) -> None:
        """Without an index to tell, a single push is the storage's own (``write_one``: one call less)."""
        if not self.indexed:
            self.write_one = self._storage.write_one

    def build_sampler(self) -> None:
        self.use_sampler(build_sampler(self.cfg.sampler, 'uniform', (False, NO_PRIORITY.format(self.cfg.type))))

    def build_index(self) -> None:
        """A prioritized table builds its priority index here."""

    def needs(self) -> Needs:
        return Needs(self.cfg.replay_buffer_size, period=self.cfg.periodic_thruput_seconds)

    # ------------------------------------------------------------------ what the parts read
    @property
    def store(self) -> Any:
        return self._storage

    @property
    def storage(self) -> Any:
        """The item storage (``ListStorage`` or ``TensorStorage``)."""
        return self._storage

    @property
    def push_count(self) -> int:
        """Items accepted (``naive`` restarts it on ``clear``, ``advanced`` keeps it, as in DI-engine)."""
        return self._storage.ring.push_count

    def expires(self) -> bool:
        return bool(getattr(self._storage, 'expires', False))

    def tensordict_out(self) -> bool:
        return self._storage.tensordict_out

    def device(self) -> Any:
        return self._storage.device

    def items_out(self) -> bool:
        return self._storage.kind == 'tensor' and self.cfg.storage.get('output') == 'items'

    def units(self) -> int:
        n = self.count()
        return n if self.window is None else min(n, self.window.size)

    def derived(self) -> Dict[str, int]:
        """The ring counts every write (its ids, never reused, dropped items included): what was pushed is
        ``next_uid`` and what left is everything pushed that is no longer stored."""
        return ring_counts(self._storage.ring)

    # ------------------------------------------------------------------ removal
    def drop(self, slots: np.ndarray) -> List[Any]:
        self.removed(slots)
        return self._storage.remove(slots)

    def removed(self, slots: np.ndarray) -> None:
        """Hook: slots about to be emptied (a prioritized table zeroes their priorities)."""

    def cleared(self, slots: np.ndarray) -> None:
        """Hook: every stored item (at ``slots``) is about to leave by ``clear``."""

    def clear(self) -> List[Any]:
        """Every item leaves (the engine then resets use counts and rebuilds a capacity rule)."""
        self.cleared(self._storage.ring.ordered_slots())
        return self._storage.clear(reset_push_count=self.resets_push_count)

    # ------------------------------------------------------------------ writing
    def written(self, slots: np.ndarray, priorities: Optional[np.ndarray]) -> None:
        """Hook: fresh items at ``slots`` (a prioritized table sets their priorities)."""

    def check_pushed(self, items: List[Any]) -> None:
        """A pushed list on list storage is checked by the storage's ``prepare``, in one pass that also reads the
        items' ``collect_iter`` column (``None`` items and bad values are refused there, before anything changes);
        with the used-data remover the generic check comes first (it reads every item's data id)."""
        if self._storage.kind != 'list' or self.parts.tracked:
            super().check_pushed(items)

    def prepare(self, items: List[Any]) -> Write:
        prepared = self._storage.prepare(items)  # validated before the limiter decides (a bad push is an error)
        return Write(prepared.n, prepared, prepared.dropped)

    def prepare_batch(self, batch: Any) -> Write:
        prepared = self._storage.prepare_batch(batch)
        return Write(prepared.n, prepared, prepared.dropped)

    def select(self, w: Write, admitted: np.ndarray) -> Write:
        plan = self._storage.select(w.plan, admitted)
        return Write(plan.n, plan, 0, None if w.values is None else np.asarray(w.values)[admitted])

    def discard(self, w: Write) -> Optional[np.ndarray]:
        return self._storage.discard(w.plan)

    def write(self, w: Write, report_evicted: bool) -> Written:
        result = self._store(w, report_evicted)
        if self.indexed:
            self.written(result.slots, w.values)
        return Written(w.n + w.dropped, result.slots, 0, result.evicted, result.expired)

    def _store(self, w: Write, report_evicted: bool) -> Any:
        """The storage's write of ``w``; one that empties the storage (more items than it holds) empties the index
        first, so a call stopped between the two (a Ctrl-C) keeps no index of emptied slots."""
        if w.dropped and self.indexed:
            self.removed(self._storage.ring.ordered_slots())  # (not ``cleared``: the running max priority stays)
        return self._storage.write(w.plan, report_evicted=report_evicted)

    def write_one(self, item: Any) -> Optional[int]:
        return self._storage.write_one(item)

    def write_items(self, items: List[Any]) -> np.ndarray:
        """The list hot path (no used-data remover, capacity rule, rate limit or expiring frames): ``prepare`` and
        ``write`` in one call, raising as ``prepare`` with nothing changed. Returns the slots written."""
        w = self.prepare(items)
        slots = self._store(w, False).slots
        if self.indexed:
            self.written(slots, w.values)
        return slots

    def write_batch(self, batch: Any) -> Optional[np.ndarray]:
        checked = self._storage.check_batch(batch)  # O(fields), nothing written
        return None if checked is None else self._storage.write_batch(checked)

    def candidates(self, sample_range: Optional[slice]) -> range:
        """Insertion positions (0 = oldest) a ``sample_range`` selects among the items sampling may use (all, or
        the newest ``current_buffer_size``)."""
        n = self._storage.ring.count
        if self.window is None:
            return range_positions(n, sample_range)
        return range_positions(n, sample_range, range(max(0, n - self.window.size), n))

    def slots_at(self, positions: range) -> np.ndarray:
        """The slots of a range of insertion positions (0 = the oldest item)."""
        return self._storage.ring.slots_of_positions(np.arange(positions.start, positions.stop, positions.step))

    # ------------------------------------------------------------------ uniform sample
    def request(
        self, size: int, sample_range: Optional[slice] = None, replace: bool = False, timeout: Optional[float] = None
    ) -> Request:
        check_range(sample_range)
        check_replace(replace)
        return Request(
            size,
            lambda rng: self.draw(rng, size, sample_range, replace),
            lambda: self.shortfall(size, sample_range, replace)[0],
            timeout,
        )

    def shortfall(self, size: int, sample_range: Optional[slice], replace: bool):
        """(why ``size`` items cannot be drawn now or '', the candidate insertion positions)."""
        positions = self.candidates(sample_range)
        m = len(positions)
        if m == 0:
            return ('buffer is empty' if self.count() == 0 else f'{sample_range} selects nothing'), positions
        if not replace and m < size:
            return f'{m} candidate items < batch size {size} and replace=False', positions
        return '', positions

    def draw(self, rng: np.random.Generator, size: int, sample_range: Optional[slice], replace: bool) -> Any:
        why, positions = self.shortfall(size, sample_range, replace)
        if why:
            return why
        m, size = len(positions), int(size)
        idx = self.positions(rng, m, size, replace, lambda: self.slots_at(positions))
        if type(idx) is str:
            return idx
        if positions.start or positions.step != 1:  # a sample_range, or the newest window
            idx = positions.start + idx * positions.step
        slots = self._storage.ring.slots_of_positions(idx)
        out = self._storage.gather(slots)
        if self._storage.kind != 'list':
            return Drawn(slots, size, out)
        if self.list_items:  # new dicts carrying replay_unique_id / replay_buffer_idx, as on tensor storage
            out = prioritized_items(out, self.name, self._storage.ring.uids(slots), slots, {})
        return Drawn(slots, size, out, None, None, True)

    # ------------------------------------------------------------------ runs of consecutive items
    def runs_request(
        self,
        batch: int,
        sequence: int,
        sample_range: Optional[slice] = None,
        replace: bool = False,
        timeout: Optional[float] = None,
    ) -> Request:
        """``batch`` runs of ``sequence`` consecutive items (see ``SequenceReplayBuffer.sample``)."""
        check_size(batch)
        if isinstance(sequence, (bool, np.bool_)) or not isinstance(sequence, (int, np.integer)) or sequence <= 0:
            raise ValueError(f"sequence must be an int > 0, got {type(sequence).__name__} {sequence!r:.40}")
        check_range(sample_range)
        if sample_range is not None and sample_range.step not in (None, 1):
            raise ValueError(f"sample_range of a sequence sample must be contiguous (step 1), got {sample_range!r}")
        check_replace(replace)
        batch, sequence = int(batch), int(sequence)
        return Request(
            batch * sequence,
            lambda rng: self.draw_runs(rng, batch, sequence, sample_range, replace),
            lambda: self.run_shortfall(batch, sequence, sample_range, replace)[0],
            timeout,
        )

    def run_shortfall(self, batch: int, sequence: int, sample_range: Optional[slice], replace: bool):
        """(why the runs cannot be drawn now or '', the insertion positions where a run may start)."""
        positions = self.candidates(sample_range)
        if self.count() == 0:
            return 'buffer is empty', None
        if len(positions) < sequence:
            where = f' in {sample_range}' if sample_range is not None else ''
            return f'{len(positions)} items{where} < sequence length {sequence}', None
        starts = self.run_starts(positions, sequence)
        if len(starts) == 0:
            return f'no {sequence} consecutive items are stored (removals left gaps)', None
        if not replace and len(starts) < batch:
            return f'{len(starts)} run starts < batch size {batch} and replace=False', None
        return '', starts

    def run_starts(self, positions: range, sequence: int) -> Union[range, np.ndarray]:
        """Insertion positions where a run of ``sequence`` consecutive pushes starts. Without removal rules every
        position up to ``len - sequence`` does (a ``range``: a draw costs O(batch), not O(capacity)); ``max_use``
        or a rule of your own may remove items from the middle, and a run must not jump over such a gap (its ids
        are consecutive) -- until one does, a ring's items are all consecutive (``count == span``)."""
        last = positions.start + len(positions) - sequence
        ring = self._storage.ring
        if not self.parts.gaps or getattr(ring, 'span', None) == ring.count:
            return range(positions.start, last + 1)
        pos = np.arange(positions.start, positions.start + len(positions), dtype=np.int64)
        uids = np.asarray(ring.uids(ring.slots_of_positions(pos)), dtype=np.int64)
        ok = uids[sequence - 1 :] - uids[: len(uids) - sequence + 1] == sequence - 1
        return pos[: len(ok)][ok]

    def draw_runs(
        self, rng: np.random.Generator, batch: int, sequence: int, sample_range: Optional[slice], replace: bool
    ) -> Any:
        why, candidates = self.run_shortfall(batch, sequence, sample_range, replace)
        if why:
            return why
        if isinstance(candidates, range):
            candidates = np.arange(candidates.start, candidates.stop, dtype=np.int64) if self.selects else candidates
        idx = self.positions(
            rng, len(candidates), batch, replace, lambda: self._storage.ring.slots_of_positions(candidates)
        )
        if type(idx) is str:
            return idx
        idx = np.asarray(idx, dtype=np.int64)
        starts = candidates.start + idx if isinstance(candidates, range) else candidates[idx]
        runs = starts[:, None] + np.arange(sequence, dtype=np.int64)[None, :]
        slots = self._storage.ring.slots_of_positions(runs.reshape(-1))
        if self._storage.kind != 'list':
            return Drawn(slots, batch * sequence, self._storage.gather(slots.reshape(batch, sequence)))
        items = self._storage.gather(slots)
        return Drawn(
            slots, batch * sequence, [items[i * sequence : (i + 1) * sequence] for i in range(batch)], None, None, True
        )

    # ------------------------------------------------------------------ update
    def update(self, info: Any) -> Optional[Dict[str, int]]:
        """A naive table keeps no priorities: ``update(priority_info)`` is a no-op; with a ``NewestWindow``,
        ``update(envstep)`` moves the window (DI-engine's elastic buffer)."""
        size = None if self.window is None else self.window.asked(info)
        if size is None:
            return super().update(info)
        return self._move(size)

    def resize(self, size: Any) -> Callable[[Any], None]:
        """The ``NewestWindow``'s size set directly (checked first), applied as ``update(envstep)`` is."""
        return self._move(checked_size(size, 'size'))

    def _move(self, size: int) -> Callable[[Any], None]:
        """What the engine applies under the buffer's lock (a closed buffer refuses it); DI-engine's elastic
        update returns None."""
        return lambda spent: setattr(self.window, 'size', size)

    # ------------------------------------------------------------------ state
    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        out = {'storage': self._storage.state_dict(), **engine}
        if self.window is not None:
            out['current_buffer_size'] = self.window.size
        return out

    def restore(self, state: Dict[str, Any]) -> Restored:
        size = self.window.saved(state) if self.window is not None else None
        if 'storage' not in state:
            raise ValueError("state has no 'storage' entry")
        storage = storage_from_state(
            self.cfg.storage, self.cfg.replay_buffer_size, state['storage'], self.reserved_keys, index_for(self.cfg)
        )
        check_derived(state.get('counters'), ring_counts(storage.ring), 'its storage ring counts')

        hot = None if self.indexed else storage.write_one  # (``bind_hot_path``'s, bound before the swap)

        def swap() -> None:
            self._storage = storage  # (and the hot path with it: no call between them, where a Ctrl-C may land)
            if hot is not None:
                self.write_one = hot
            if size is not None:
                self.window.size = size

        return Restored(swap, state, storage.ring.valid)  # files of 0.1 have no counters: not required

    def describe(self) -> str:
        window = '' if self.window is None else f", current_buffer_size={self.window.size}"
        return f"count={self.count()}, replay_buffer_size={self.capacity()}{window}, storage={self._storage!r}"


__all__ = ['SlotTable', 'NO_PRIORITY']

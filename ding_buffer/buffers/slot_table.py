"""``SlotTable``: items in a slot storage (list / tensor / memmap ring) -- the table of ``naive``, ``elastic``,
``sequence`` and (with a priority column, ``PrioritizedTable``) ``advanced`` and ``deque``.

It writes a batch or one item (the single-push hot path), asks a capacity rule which items leave a full table,
removes slots, and draws uniformly (or with the configured ``sampler``) among insertion positions: all of them, a
``sample_range`` of them, the newest ``current_buffer_size`` (a ``NewestWindow``: ``elastic``) or runs of
consecutive items (``runs_request``: ``sequence``). A prioritized table adds its index through two hooks,
``written`` and ``removed``, instead of copying the write path.
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..control.capacity import index_for
from ..control.samplers import UniformSampler, build_sampler
from ..storage import build_storage, refuse_items_output, storage_from_state
from .common import check_range, check_size, range_positions
from .newest_window import NewestWindow, checked_size
from .outputs import prioritized_items
from .table import Drawn, Request, Table

NO_PRIORITY = "a naive buffer's items carry no priority: use type='advanced' for prioritized replay"


def check_replace(replace: Any) -> None:
    """``replace`` is a bool (``TypeError`` naming it otherwise)."""
    if type(replace) is not bool:
        raise TypeError(f"replace must be a bool, got {type(replace).__name__} {replace!r:.40}")


class SlotTable(Table):
    """
    Overview:
        Items in a slot storage, drawn by insertion position. ``window``: sample only the newest
        ``current_buffer_size`` items (``NewestWindow``); ``runs``: the table is sampled as runs of consecutive
        items (no capacity rule then: one evicting from the middle would break runs).
    """

    capacity_rules = True
    resets_push_count = True  # DI-engine's naive buffer restarts push_count on clear (advanced keeps it)
    indexed = False  # whether the table keeps a per-slot index the write hooks update (advanced: priorities)
    reserved_keys: Tuple[str, ...] = ()

    def __init__(self, engine: Any, cfg: Any, window: bool = False, runs: bool = False) -> None:
        super().__init__(engine, cfg)
        self.window: Optional[NewestWindow] = None
        self.runs = runs
        if runs:
            self.capacity_rules = False
        self._window_wanted = window

    def build(self) -> None:
        e, cfg = self.e, self.cfg
        if self.runs:
            refuse_items_output(cfg.storage, cfg.type, '[batch][sequence] runs')
        self.build_sampler()
        # list storage with storage.output='items': samples are new dicts carrying the item's id and slot
        self.list_items = cfg.storage.get('type', 'list') == 'list' and cfg.storage.get('output') == 'items'
        self._storage = build_storage(
            cfg.storage, cfg.replay_buffer_size, reserved_keys=self.reserved_keys, index_cls=index_for(cfg)
        )
        self.build_index()
        e._build_engine(cfg.replay_buffer_size)
        self.build_monitors()
        # parts fixed for the buffer's life, held here so the hot paths do not reach through the engine's proxy
        self.limiter, self.lock, self.periodic = e._limiter, e._lock, e._periodic
        # the single-push hot path: no used-data remover must see the overwritten item, no capacity rule decides
        self.one_fast = e._remover is None and e._capacity is None
        if self._window_wanted:
            self.window = NewestWindow(cfg.set_buffer_size, cfg.replay_buffer_size)
        # A batch may take the hot path: no remover must see overwritten items, no limiter or capacity rule decides
        self.batch_fast = e._remover is None and not self.limiter.active and e._capacity is None
        # No part to tell about a single push (no rate limit, use counts or report): the storage's fast path alone
        self.lean = (
            not self.limiter.active
            and e._uses is None
            and e._periodic is None
            and e._remover is None
            and e._capacity is None
        )

    def build_sampler(self) -> None:
        self.sampler = build_sampler(self.cfg.sampler, 'uniform', (False, NO_PRIORITY))
        self.own_sampler = type(self.sampler) is not UniformSampler  # its answers are checked

    def build_index(self) -> None:
        """A prioritized table builds its priority index here."""

    def build_monitors(self) -> None:
        self.e._build_monitors(False, self.cfg.periodic_thruput_seconds)

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
        ring = self._storage.ring
        return {'push_items': ring.next_uid, 'remove_count': ring.next_uid - ring.count}

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

    def written_one(self, slot: int, priority: Optional[float]) -> None:
        """Hook of the single-push hot path (scalar arguments, no arrays)."""

    def check_pushed(self, items: List[Any]) -> None:
        """A pushed list on list storage is checked by the storage's ``prepare``, in one pass that also reads the
        items' ``collect_iter`` column (``None`` items and bad values are refused there, before anything changes);
        with the used-data remover the generic check comes first (it reads every item's data id)."""
        if self._storage.kind != 'list' or self.e._remover is not None:
            super().check_pushed(items)

    def push_items(self, items: List[Any]) -> int:
        if len(items) == 1:  # tensor storage's single-item fast path
            if self.lean:
                if self._storage.write_one(items[0]) is not None:
                    if self.limiter.waiting:
                        self.limiter.on_push(1)  # wake samplers waiting for data
                    return 1
            elif not self.limiter.active and self.e._remover is None and self.write_one(items[0]):
                return 1
        prepared = self._storage.prepare(items)  # validated before the limiter decides (a bad push is an error)
        if self.limiter.active and not self.e._admit(len(items)):
            return self.not_written(prepared)
        return self.write(prepared)

    def push_batch(self, batch: Any) -> int:
        if self.batch_fast:
            checked = self._storage.check_batch(batch)
            if checked is not None:
                return len(self.write_batch_fast(checked))
        prepared = self._storage.prepare_batch(batch)
        if self.limiter.active and not self.e._admit(prepared.n + prepared.dropped):
            return self.not_written(prepared)
        return self.write(prepared)

    def make_room(self, prepared: Any, priorities: Optional[np.ndarray]) -> Tuple[Any, Optional[np.ndarray]]:
        """With a capacity rule: before a write that does not fit, the rule names the stored items that leave
        (counted ``removed_by_<rule>``) and, if it may refuse new ones, which new items enter (the others are
        counted ``refused_by_<rule>``). Returns what is written. Nothing changes if the rule answers garbage."""
        e = self.e
        rule = e._capacity
        need = prepared.n - (self.capacity() - self._storage.ring.count)
        if rule is None or prepared.dropped or need <= 0:
            return prepared, priorities
        values = self.new_values(rule.column, priorities, prepared.n) if rule.admission else None
        try:
            victims, admitted = rule.plan(e.view, values, need)
            victims = e._rule_slots(rule, victims)
            refused = 0 if admitted is None else int(len(admitted) - np.count_nonzero(admitted))
            if len(victims) + refused < need:
                raise RuntimeError(
                    f"capacity rule {rule.name!r} freed {len(victims)} slots and refused {refused} new items; the "
                    f"write needs {need} more slots"
                )
        except BaseException:
            e._capacity_rebuilt()  # its own structure may have moved: rebuilt from the unchanged table
            raise
        e._remove(victims, f'removed_by_{rule.name}')
        if refused:
            e._counters[f'refused_by_{rule.name}'] += refused
            prepared = self._storage.select(prepared, admitted) if refused < len(admitted) else None
            if priorities is not None and prepared is not None:
                priorities = np.asarray(priorities)[admitted]
        return prepared, priorities

    def not_written(self, prepared: Any) -> int:
        """A validated push the rate limiter or a capacity rule refused whole: the storage settles it (see
        ``Storage.discard``). Returns 0 (items accepted)."""
        expired = self._storage.discard(prepared)
        if expired is not None:
            self.e._remove(expired, 'removed_by_frames')
        return 0

    def write(self, prepared: Any, priorities: Optional[np.ndarray] = None) -> int:
        """Commit a validated batch (``priorities`` for the items kept); returns the items accepted."""
        e = self.e
        if e._capacity is not None:
            whole = prepared
            prepared, priorities = self.make_room(prepared, priorities)
            if prepared is None:  # every new item refused
                return self.not_written(whole)
        n = prepared.n + prepared.dropped
        if e._periodic is not None:
            e._periodic.start()  # first: its baseline must not include this push
        result = self._storage.write(prepared, report_evicted=e._remover is not None)
        if self.indexed:
            self.written(result.slots, priorities)
        if e._uses is not None:
            e._uses.reset(result.slots)
        if result.evicted:
            e._evicted(result.evicted)
        if result.expired is not None:  # the frames of older items were overwritten (storage.frames)
            e._remove(result.expired, 'removed_by_frames')
        if e._capacity is not None:
            if prepared.dropped:  # a push larger than the table replaced everything
                e._capacity_rebuilt()
            else:
                e._capacity.on_written(e.view, result.slots)
        limiter = self.limiter
        if limiter.active or limiter.waiting:
            limiter.on_push(n)
        return n

    def write_one(self, item: Any, priority: Optional[float] = None) -> bool:
        """The single-push hot path: True when the storage took ``item`` directly, False -- nothing changed --
        when the generic path must handle (and report on) it, or must see the overwritten item leave (the
        used-data remover)."""
        if not self.one_fast:
            return False
        if self.periodic is not None:
            self.periodic.start()  # first: its baseline must not include this push
        slot = self._storage.write_one(item)
        if slot is None:
            return False
        if self.indexed:
            self.written_one(slot, priority)
        uses = self.e._uses  # replaced by a restore: read through the engine
        if uses is not None:
            uses.reset(slot)
        limiter = self.limiter
        if limiter.active or limiter.waiting:
            limiter.on_push(1)
        return True

    def write_batch_fast(self, checked: Any) -> np.ndarray:
        """The batched hot path: write a batch the storage checked (``check_batch``) -- the caller made sure no
        used-data remover waits for overwritten items and the rate limiter is inactive. Returns the slots; a
        prioritized table then sets their priorities."""
        if self.periodic is not None:
            self.periodic.start()  # first: its baseline must not include this push
        slots = self._storage.write_batch(checked)
        uses = self.e._uses
        if uses is not None:
            uses.reset(slots)
        if self.limiter.waiting:
            self.limiter.on_push(len(slots))  # wake samplers waiting for data
        return slots

    def candidates(self, sample_range: Optional[slice]) -> range:
        """Insertion positions (0 = oldest) a ``sample_range`` selects among the items sampling may use (all, or
        the newest ``current_buffer_size``)."""
        n = self._storage.ring.count
        if self.window is None:
            return range_positions(n, sample_range)
        window = range(max(0, n - self.window.size), n)
        return window if sample_range is None else window[sample_range]

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
        idx = self.positions(rng, m, size, replace)
        if type(idx) is str:
            return idx
        if positions.start or positions.step != 1:  # a sample_range, or the newest window
            idx = positions.start + idx * positions.step
        slots = self._storage.ring.slots_of_positions(idx)
        out = self._storage.gather(slots)
        if self._storage.kind != 'list':
            return Drawn(slots, size, out)
        if self.list_items:  # new dicts carrying replay_unique_id / replay_buffer_idx, as on tensor storage
            deep = bool(self.cfg.get('deepcopy', False))
            out = prioritized_items(out, self.name, self._storage.ring.uids(slots), slots, {}, deep)
            return Drawn(slots, size, out)
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

    def run_starts(self, positions: range, sequence: int) -> np.ndarray:
        """Insertion positions where a run of ``sequence`` consecutive pushes starts. Without removal rules every
        position up to ``len - sequence`` does; ``max_use`` or a rule of your own may remove items from the middle,
        and a run must not jump over such a gap (its ids are consecutive)."""
        last = positions.start + len(positions) - sequence
        if not self.e._rules:
            return np.arange(positions.start, last + 1, dtype=np.int64)
        pos = np.arange(positions.start, positions.start + len(positions), dtype=np.int64)
        ring = self._storage.ring
        uids = np.asarray(ring.uids(ring.slots_of_positions(pos)), dtype=np.int64)
        ok = uids[sequence - 1 :] - uids[: len(uids) - sequence + 1] == sequence - 1
        return pos[: len(ok)][ok]

    def draw_runs(
        self, rng: np.random.Generator, batch: int, sequence: int, sample_range: Optional[slice], replace: bool
    ) -> Any:
        why, candidates = self.run_shortfall(batch, sequence, sample_range, replace)
        if why:
            return why
        idx = self.positions(rng, len(candidates), batch, replace)
        if type(idx) is str:
            return idx
        starts = candidates[np.asarray(idx, dtype=np.int64)]
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
        if self.window is not None:
            size = self.window.asked(info)
            if size is None:
                return super().update(info)

            def move(spent: Any) -> None:  # under the engine's lock; DI-engine's elastic update returns None
                self.window.size = size

            return move
        return super().update(info)

    def resize(self, size: Any) -> None:
        """The ``NewestWindow``'s size set directly (checked first)."""
        size = checked_size(size, 'size')
        with self.e._lock:
            self.window.size = size

    # ------------------------------------------------------------------ state
    def state(self) -> Dict[str, Any]:
        out = {'storage': self._storage.state_dict(), **self.e._engine_state()}
        if self.window is not None:
            out['current_buffer_size'] = self.window.size
        return out

    def restore(self, state: Dict[str, Any]) -> None:
        e = self.e
        size = self.window.saved(state) if self.window is not None else None
        if 'storage' not in state:
            raise ValueError("state has no 'storage' entry")
        storage = storage_from_state(
            self.cfg.storage, self.cfg.replay_buffer_size, state['storage'], self.reserved_keys, index_for(self.cfg)
        )
        swap = e._engine_restored(state, storage.ring.valid, required=False)  # files of 0.1 have no counters
        self._storage = storage
        swap()
        if size is not None:
            self.window.size = size
        e._capacity_rebuilt()

    def describe(self) -> str:
        window = '' if self.window is None else f", current_buffer_size={self.window.size}"
        return f"count={self.count()}, replay_buffer_size={self.capacity()}{window}, storage={self._storage!r}"


__all__ = ['SlotTable', 'NO_PRIORITY']

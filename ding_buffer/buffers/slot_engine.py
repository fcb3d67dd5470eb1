"""``SlotEngine``: the engine over a slot storage (list / tensor / memmap ring) -- the table of ``naive`` and
``advanced``. It owns the table verbs the parts read (``oldest``, ``collect_iter``, ``count``), writing a batch or
one item (the single-push hot path) and removing slots; a prioritized preset adds its priority index through two
hooks, ``_on_written`` and ``_on_removed``, instead of copying the write path."""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .engine import Engine


class SlotEngine(Engine):
    resets_push_count = False  # whether ``clear`` restarts ``push_count`` (naive) or keeps it (advanced)
    indexed = False  # whether the preset keeps a per-slot index the write hooks update (advanced: priorities)

    @property
    def storage(self) -> Any:
        """The item storage (``ListStorage`` or ``TensorStorage``)."""
        return self._storage

    @property
    def push_count(self) -> int:
        """Items accepted (``naive`` restarts it on ``clear``, ``advanced`` keeps it, as in DI-engine)."""
        return self._storage.ring.push_count

    # ------------------------------------------------------------------ table verbs
    @property
    def _table(self) -> Any:
        return self._storage

    def _tensordict_out(self) -> bool:
        return self._storage.tensordict_out

    def _table_device(self) -> Any:
        return self._storage.device

    def _items_out(self) -> bool:
        return self._storage.kind == 'tensor' and self._cfg.storage.get('output') == 'items'

    def _derived(self) -> Dict[str, int]:
        """The ring counts every write (its ids, never reused, dropped items included): what was pushed is
        ``next_uid`` and what left is everything pushed that is no longer stored."""
        ring = self._storage.ring
        return {'push_items': ring.next_uid, 'remove_count': ring.next_uid - ring.count}

    def _drop(self, slots: np.ndarray) -> List[Any]:
        self._on_removed(slots)
        return self._storage.remove(slots)

    def _on_removed(self, slots: np.ndarray) -> None:
        """Hook: slots about to be emptied (a prioritized preset zeroes their priorities)."""

    def _on_cleared(self, slots: np.ndarray) -> None:
        """Hook: every stored item (at ``slots``) is about to leave by ``clear``."""

    def _clear(self) -> List[Any]:
        slots = self._storage.ring.ordered_slots()
        if self._uses is not None:
            self._uses.reset(slots)
        self._on_cleared(slots)
        removed = self._storage.clear(reset_push_count=self.resets_push_count)
        self._capacity_rebuilt()
        return removed

    def _on_written(self, slots: np.ndarray, priorities: Optional[np.ndarray]) -> None:
        """Hook: fresh items at ``slots`` (a prioritized preset sets their priorities)."""

    def _on_written_one(self, slot: int, priority: Optional[float]) -> None:
        """Hook of the single-push hot path (scalar arguments, no arrays)."""

    # ------------------------------------------------------------------ writing
    def _check_pushed(self, items: List[Any]) -> None:
        """A pushed list on list storage is checked by the storage's ``prepare``, in one pass that also reads the
        items' ``collect_iter`` column (``None`` items and bad values are refused there, before anything changes);
        with the used-data remover the generic check comes first (it reads every item's data id)."""
        if self._storage.kind != 'list' or self._remover is not None:
            super()._check_pushed(items)

    capacity_rules = True

    def _make_room(self, prepared: Any, priorities: Optional[np.ndarray]) -> Tuple[Any, Optional[np.ndarray]]:
        """With a capacity rule: before a write that does not fit, the rule names the stored items that leave
        (counted ``removed_by_<rule>``) and, if it may refuse new ones, which new items enter (the others are
        counted ``refused_by_<rule>``). Returns what is written. Nothing changes if the rule answers garbage."""
        rule = self._capacity
        need = prepared.n - (self.replay_buffer_size - self._storage.ring.count)
        if rule is None or prepared.dropped or need <= 0:
            return prepared, priorities
        values = self._new_values(rule.column, priorities, prepared.n) if rule.admission else None
        try:
            victims, admitted = rule.plan(self.view, values, need)
            victims = self._rule_slots(rule, victims)
            refused = 0 if admitted is None else int(len(admitted) - np.count_nonzero(admitted))
            if len(victims) + refused < need:
                raise RuntimeError(
                    f"capacity rule {rule.name!r} freed {len(victims)} slots and refused {refused} new items; the "
                    f"write needs {need} more slots"
                )
        except BaseException:
            self._capacity_rebuilt()  # its own structure may have moved: rebuilt from the unchanged table
            raise
        self._remove(victims, f'removed_by_{rule.name}')
        if refused:
            self._counters[f'refused_by_{rule.name}'] += refused
            prepared = self._storage.select(prepared, admitted) if refused < len(admitted) else None
            if priorities is not None and prepared is not None:
                priorities = np.asarray(priorities)[admitted]
        return prepared, priorities

    def _not_written(self, prepared: Any) -> int:
        """A validated push the rate limiter or a capacity rule refused whole: the storage settles it (see
        ``Storage.discard``). Returns 0 (items accepted)."""
        expired = self._storage.discard(prepared)
        if expired is not None:
            self._remove(expired, 'removed_by_frames')
        return 0

    def _write(self, prepared: Any, priorities: Optional[np.ndarray] = None) -> int:
        """Commit a validated batch (``priorities`` for the items kept); returns the items accepted."""
        if self._capacity is not None:
            whole = prepared
            prepared, priorities = self._make_room(prepared, priorities)
            if prepared is None:  # every new item refused
                return self._not_written(whole)
        n = prepared.n + prepared.dropped
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        result = self._storage.write(prepared, report_evicted=self._remover is not None)
        if self.indexed:
            self._on_written(result.slots, priorities)
        if self._uses is not None:
            self._uses.reset(result.slots)
        if result.evicted:
            self._evicted(result.evicted)
        if result.expired is not None:  # the frames of older items were overwritten (storage.frames)
            self._remove(result.expired, 'removed_by_frames')
        if self._capacity is not None:
            if prepared.dropped:  # a push larger than the table replaced everything
                self._capacity_rebuilt()
            else:
                self._capacity.on_written(self.view, result.slots)
        limiter = self._limiter
        if limiter.active or limiter.waiting:
            limiter.on_push(n)
        return n

    def _write_one(self, item: Any, priority: Optional[float] = None) -> bool:
        """The single-push hot path: True when the storage took ``item`` directly, False -- nothing changed --
        when the generic path must handle (and report on) it, or must see the overwritten item leave (the
        used-data remover)."""
        if self._remover is not None or self._capacity is not None:
            return False
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        slot = self._storage.write_one(item)
        if slot is None:
            return False
        if self.indexed:
            self._on_written_one(slot, priority)
        if self._uses is not None:
            self._uses.reset(slot)
        limiter = self._limiter
        if limiter.active or limiter.waiting:
            limiter.on_push(1)
        return True

    def _write_batch_fast(self, checked: Any) -> np.ndarray:
        """The batched hot path: write a batch the storage checked (``check_batch``) -- the caller made sure no
        used-data remover waits for overwritten items and the rate limiter is inactive. Returns the slots; a
        prioritized preset then sets their priorities."""
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        slots = self._storage.write_batch(checked)
        if self._uses is not None:
            self._uses.reset(slots)
        if self._limiter.waiting:
            self._limiter.on_push(len(slots))  # wake samplers waiting for data
        return slots

    def _batch_fast_ok(self) -> bool:
        """Whether a batch may take the hot path: no remover must see overwritten items, no limiter decides."""
        return self._remover is None and not self._limiter.active and self._capacity is None

    def _candidates(self, sample_range: Optional[slice]) -> range:
        """Insertion positions (0 = oldest) a ``sample_range`` selects among the stored items."""
        return self._range_positions(self._storage.ring.count, sample_range)

"""``Engine``: the one class that owns the lock, the counters and ``stats()``, and calls the parts.

A preset is a composition: a table (where elements live: a slot storage, an episode store, a reward index), a
sampler, removers (``control.limits``: ``max_use``, ``max_staleness``, user rules), the rate limiter
(``control.limiter``: thruput controller + minimum size + blocking ``sample(timeout=)``) and monitors. The engine
runs every call in the same order, so a rule configured on one preset behaves the same on every other::

    push:    validate (all or nothing) -> limiter.can_push -> table write -> counters -> limiter.on_push
    sample:  removers.before_sample -> limiter.why_not (+ the preset's shortfall; wait up to `timeout`)
             -> sampler draw -> use counts -> removers.after_sample -> counters -> limiter.on_sample
             -> monitors (written after the lock is released)

A sample is all or nothing: every rule answers before the engine removes anything (``before_sample`` and
``after_sample`` each ask all rules first), so a rule of your own that raises or answers garbage fails the call
with nothing changed -- the draw's use counts are taken back and, with such a rule configured, the RNG and what the
preset's ``_sample_snapshot`` names (advanced: beta) are restored. (Elements the ``before_sample`` answers removed
stay removed when an ``after_sample`` answer fails later in the same call: they were due before the draw.)

Presets implement the table verbs ``oldest``, ``collect_iter`` and ``_drop(slots)`` (remove and return what
left, for the used-data remover) and call ``_sample_flow`` / ``_admit`` / ``_pushed`` / ``_drawn``. Nothing
outside a part assigns the part's fields.
"""

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..config import INF
from ..control.capacity import CapacityRule, find_capacity_rule
from ..control.limiter import RateLimiter, limiter_checks, limiter_config
from ..control.limits import StalenessLimit, UseCounts, UseLimit, build_removers, find_rule, limit_ok
from ..monitor.periodic import PeriodicThruputMonitor
from ..monitor.tb import TBSink, build_tb_logger, emit, rank
from ..storage.tensordict_io import to_tensordict
from .common import STEP_LIMIT, BufferCore, check_step, check_wait_timeout
from .outputs import as_items
from .view import TableView

# Counters every engine keeps (``stats()``); each remover adds ``removed_by_<name>``.
COUNTERS = (
    'push_items',
    'sample_calls',
    'sampled_items',
    'remove_count',
    'removed_by_use',
    'removed_by_staleness',
    'refused_push',
    'refused_push_items',
    'refused_sample',
    'updated',
    'stale_updates',
)


def parts_config(min_ratio: float) -> Dict[str, Any]:
    """The keys every preset takes for the engine's parts, merged into each preset's default config
    (``min_ratio``: the preset's default ``thruput_controller.sample_min_limit_ratio``)."""
    return dict(
        # Remove an element once it has been sampled this many times (inf: never).
        max_use=INF,
        # Remove the oldest elements while cur_learner_iter - collect_iter >= max_staleness (inf: never).
        max_staleness=INF,
        # Your own removal rules: [dict(type=NAME, **arguments)] registered in REMOVER_REGISTRY (import_names).
        removers=[],
        thruput_controller=limiter_config(min_ratio),
    )


def parts_checks(min_ratio: float) -> Dict[str, Any]:
    """Value checks of ``parts_config``."""
    return dict(
        max_use=(limit_ok, 'a number > 0 or inf'),
        max_staleness=(limit_ok, 'a number > 0 or inf'),
        **limiter_checks(min_ratio),
    )


class Engine(BufferCore):
    uses_counted = False  # whether every element has a use count even without max_use (advanced reports it)
    capacity_rules = False  # whether the preset's table takes a capacity rule (``control.capacity``)
    admission_columns: Tuple[str, ...] = ()  # columns whose values the preset knows for elements not yet written

    def _build_engine(self, slots: int) -> None:
        """Build the parts every preset shares; ``slots`` sizes the use-count column."""
        cfg = self._cfg
        self._rules = build_removers(cfg)
        self._use_limit = find_rule(self._rules, UseLimit)
        self._capacity: Optional[CapacityRule] = find_capacity_rule(self._rules)
        # a rule of the user's may raise or answer garbage mid-sample: the sample then snapshots what the draw moves
        self._fallible = any(
            type(r) not in (UseLimit, StalenessLimit) and not isinstance(r, CapacityRule) for r in self._rules
        )
        self._view: Optional[TableView] = None
        self._uses: Optional[UseCounts] = UseCounts(slots) if (self._use_limit or self.uses_counted) else None
        self._limiter = RateLimiter(cfg.thruput_controller, self._lock)
        names = [f'removed_by_{r.name}' for r in self._rules]
        if getattr(getattr(self, '_storage', None), 'expires', False):  # storage.frames: see WriteResult.expired
            names.append('removed_by_frames')
        if self._capacity is not None and self._capacity.admission:
            names.append(f'refused_by_{self._capacity.name}')
        self._counters: Dict[str, int] = dict.fromkeys(list(COUNTERS) + [n for n in names if n not in COUNTERS], 0)
        if self._capacity is not None:
            self._check_capacity_rule()
        self._due: Any = None  # monitor output computed under the lock, written after it
        self._tb: Optional[TBSink] = None
        self._periodic: Optional[PeriodicThruputMonitor] = None
        self._last_use: Optional[np.ndarray] = None  # use counts after the last draw (last_sample_use)

    def _build_monitors(self, tensorboard: bool, period: Optional[float]) -> None:
        """The TensorBoard writer (borrowed, or owned when ``tensorboard``) and, with a writer on rank 0, the
        periodic push / sample / remove report every ``period`` seconds (DI-engine's ``{instance}_sec/`` tags;
        ``None``: no periodic report)."""
        writer, owned = build_tb_logger(self._tb_logger, tensorboard, self._exp_name, self._instance_name)
        self._tb = None if writer is None else TBSink(writer, owned)
        if owned:  # closed by close(), or when the buffer is dropped without it (its writer thread too)
            weakref.finalize(self, self._tb.close)
        if self._tb is None or rank() != 0 or period is None:
            return
        me = weakref.ref(self)  # the monitor thread must not keep an unclosed, unreachable buffer alive

        def read() -> Optional[Dict[str, float]]:
            buf = me()
            return None if buf is None else buf._counter_snapshot()

        self._periodic = PeriodicThruputMonitor(self._instance_name, period, read, self._logger, self._tb)
        weakref.finalize(self, self._periodic.stop)  # dropped without close(): the thread ends at once

    def _counter_snapshot(self) -> Dict[str, float]:
        with self._lock:
            return {**self._all_counters(), 'count': self.count()}

    # ------------------------------------------------------------------ the table's read-only view
    @property
    def view(self) -> TableView:
        """The read-only view of this buffer's table that its parts read (counts, order, named columns)."""
        if self._view is None:
            self._view = TableView(self, self._columns())
        return self._view

    def _columns(self) -> Dict[str, Callable[[np.ndarray], np.ndarray]]:
        """The table's named per-slot columns (a preset adds its own)."""
        out = {'collect_iter': lambda slots: self.collect_iter(slots)}
        if self._uses is not None:
            out['use'] = lambda slots: self._uses[slots]
        if self._has_ring():
            out['id'] = lambda slots: self._table.ring.uids(slots)
        return out

    def _has_ring(self) -> bool:
        """Whether the table keeps its elements in a slot index (``ring``) that names ids and insertion order."""
        try:
            return hasattr(self._table, 'ring')
        except NotImplementedError:
            return False

    def _ordered_slots(self) -> np.ndarray:
        """Every stored element's slot, oldest first."""
        return self._table.ring.ordered_slots()

    def _next_id(self) -> int:
        return self._table.ring.next_uid

    def _check_capacity_rule(self) -> None:
        """A capacity rule fits this table: the preset takes one, and the column it reads exists (and, for a rule
        that may refuse new elements, is known before they are written)."""
        rule, kind = self._capacity, self._cfg.get('type')
        if not self.capacity_rules:
            raise ValueError(
                f"config key 'removers' names the capacity rule {rule.name!r}, which type {kind!r} does not take "
                f"(capacity rules choose what leaves a full table of items: types 'naive', 'elastic', 'advanced')"
            )
        column = rule.column
        if column is not None and column not in self.view.columns:
            raise ValueError(
                f"config key 'removers' names the capacity rule {rule.name!r}, which reads column {column!r}; a "
                f"{kind!r} table has the columns {', '.join(self.view.columns)} (priorities: type 'advanced')"
            )
        if rule.admission and column not in self.admission_columns:
            known = ', '.join(self.admission_columns) or 'none'
            raise ValueError(
                f"config key 'removers' names {rule.name!r} with column {column!r}: it compares new elements' values "
                f"before they are stored, which a {kind!r} table knows for: {known}"
            )

    def _new_values(self, column: str, priorities: Optional[np.ndarray], n: int) -> np.ndarray:
        """Column ``column`` of ``n`` elements about to be written (``admission_columns``)."""
        raise NotImplementedError

    def _capacity_rebuilt(self) -> None:
        """The table was replaced or emptied (restore, load, clear): the capacity rule rebuilds from it."""
        if self._capacity is not None:
            self._capacity.rebuild(self.view)

    # ------------------------------------------------------------------ table verbs (preset)
    @property
    def _table(self) -> Any:
        """The preset's table: offers ``oldest(k)``, ``collect_iter(slots)`` and ``live(slots)``."""
        raise NotImplementedError

    def count(self) -> int:
        """Number of stored elements (items; episodes for the episode buffer)."""
        return self._table.ring.count

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest stored elements' slots, oldest first (what removers read)."""
        return self._table.oldest(k)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """Each element's ``collect_iter`` (int64; ``NO_ITER`` where it has none)."""
        return self._table.collect_iter(slots)

    def _live(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` (non-negative ints) that hold an element; ``IndexError`` past the table's end."""
        return self._table.live(slots)

    def _drop(self, slots: np.ndarray) -> List[Any]:
        """Remove the elements at ``slots`` from the table; return the removed items (used-data remover)."""
        raise NotImplementedError

    def _rule_slots(self, rule: Any, slots: Any) -> np.ndarray:
        """A rule's answer as distinct live slots; a rule answering garbage raises ``RuntimeError`` naming it
        (nothing is removed for that answer)."""
        arr = np.unique(np.asarray(slots).reshape(-1))
        if not len(arr):
            return arr.astype(np.int64)
        if arr.dtype.kind not in 'iu' or arr[0] < 0:
            raise RuntimeError(f"remover {rule.name!r} returned {arr.dtype} slots {arr[:4]}...; expected ints >= 0")
        arr = arr.astype(np.int64)
        try:
            return arr[self._live(arr)]
        except IndexError:
            raise RuntimeError(f"remover {rule.name!r} returned slot {int(arr[-1])}, past the table's end") from None

    def _remove_answers(self, answers: List[np.ndarray]) -> None:
        """Remove what each rule answered (``_rule_slots``, in rule order), each slot once: counted under the first
        rule that named it."""
        done = None  # slots an earlier rule removed in this call: a later rule cannot remove them again
        for rule, gone in zip(self._rules, answers):
            if done is not None and len(gone):
                gone = np.setdiff1d(gone, done)
            if len(gone):
                if rule is self._use_limit:
                    self._drop_used(gone)
                else:
                    self._remove(gone, f'removed_by_{rule.name}')
                done = gone if done is None else np.union1d(done, gone)

    def _drop_used(self, slots: np.ndarray) -> None:
        """Elements that reached ``max_use``: removed (advanced with used-data tracking retires them instead)."""
        self._remove(slots, 'removed_by_use')

    def _remove(self, slots: np.ndarray, counter: str) -> None:
        if not len(slots):
            return
        removed = self._drop(slots)
        if self._uses is not None:
            self._uses.reset(slots)
        self._counters['remove_count'] += len(slots)
        self._counters[counter] += len(slots)
        self._evicted(removed)

    # ------------------------------------------------------------------ push
    def _admit(self, n: int) -> bool:
        """Whether the rate limiter lets ``n`` elements in (a refusal is counted and logged)."""
        ok, why = self._limiter.can_push(n, self._units())
        if not ok:
            self._counters['refused_push'] += 1
            self._counters['refused_push_items'] += n
            self._logger.info("[%s] refuse to push %d items: %s", self._instance_name, n, why)
        return ok

    def _pushed(self, n: int, removed: int) -> None:
        """After a write of ``n`` elements that displaced ``removed`` older ones (tables whose ring counts
        every write derive both counters instead: ``_derived``)."""
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        self._counters['push_items'] += n
        self._counters['remove_count'] += removed
        self._limiter.on_push(n)

    def _derived(self) -> Dict[str, int]:
        """Counters the table knows better than a tally (overlaid on ``_counters`` wherever they are read)."""
        return {}

    def _all_counters(self) -> Dict[str, int]:
        return {**self._counters, **self._derived()}

    def _fresh(self, slots: Any) -> None:
        """Slots just written: their use counts restart at 0."""
        if self._uses is not None:
            self._uses.reset(slots)

    # ------------------------------------------------------------------ sample
    def _why_not(self, size: int, cur_learner_iter: int, shortfall: Optional[Callable[[], str]]) -> str:
        if self._rules:  # every rule answers (on the same table) before anything is removed: all or nothing
            answers = [self._rule_slots(rule, rule.before_sample(self.view, cur_learner_iter)) for rule in self._rules]
            self._remove_answers(answers)
        short = shortfall() if shortfall is not None else ''
        units = self._units()
        limit = self._limiter.why_not(units, size)
        if short and limit and units:
            return f'{short}; {limit}'
        return short or limit  # an empty buffer: the preset's reason says it

    def _units(self) -> int:
        """What ``sample_min_limit_ratio`` compares with the batch size: the stored elements."""
        return self.count()

    def _sample_flow(
        self,
        size: Any,
        cur_learner_iter: int,
        timeout: Optional[float],
        draw: Callable[[], Any],
        shortfall: Optional[Callable[[], str]] = None,
    ) -> Optional[Any]:
        """Run a ``sample`` call: rules, limits and ``shortfall`` (waiting up to ``timeout``), then ``draw()`` under
        the lock. Without rules, limits or a timeout only ``draw()`` runs: it must refuse by itself (``_refused``)
        when ``shortfall()`` would say why not."""
        self._check_size(size)
        if type(cur_learner_iter) is not int or not -STEP_LIMIT < cur_learner_iter < STEP_LIMIT:
            cur_learner_iter = check_step(cur_learner_iter, 'cur_learner_iter')
        check_wait_timeout(timeout)
        self._check_open()
        with self._lock:
            # Rules, limits or a wait to run first? Otherwise ``draw`` refuses by itself (the hot path).
            why = (
                self._why_not(size, cur_learner_iter, shortfall)
                if self._rules or self._limiter.checks or timeout is not None
                else ''
            )
            if why and timeout is not None:
                why = self._limiter.wait(
                    lambda: self._why_not(size, cur_learner_iter, shortfall),
                    timeout,
                    f"buffer '{self._instance_name}' could not sample {size} items",
                    self._check_open,
                )
            if why:
                self._counters['refused_sample'] += 1
                return self._refuse(why)
            if self._fallible:  # a rule of the user's answers inside draw(): restore what the draw moved if it fails
                snapshot = self._sample_snapshot()
                try:
                    out = draw()
                except BaseException:
                    self._sample_restore(snapshot)
                    raise
            else:
                out = draw()
            if out is not None:
                if self._tensordict_out():
                    out = to_tensordict(out, self._table_device())
                elif self._items_out():
                    out = as_items(out, self._instance_name)
            due, self._due = self._due, None
        if due is not None:
            self._emit(due)  # outside the lock
        return out

    def _sample_snapshot(self) -> Any:
        """What a draw changes besides use counts (``_drawn`` takes those back): the RNG's state; presets add theirs."""
        return self._rng.bit_generator.state

    def _sample_restore(self, snapshot: Any) -> None:
        """Undo a failed draw (``_sample_snapshot``'s answer from before it)."""
        self._rng.bit_generator.state = snapshot

    def _tensordict_out(self) -> bool:
        """Whether samples leave as TensorDicts (the table's tensor storage first stored one; ``tensordict_io``)."""
        return False

    def _table_device(self) -> Any:
        """The device of sampled tensors (the TensorDict's ``device``)."""
        return None

    def _items_out(self) -> bool:
        """Whether a batched sample leaves as per-item dicts (``storage.output='items'`` on tensor storage)."""
        return False

    def _emit(self, due: Any) -> None:
        emit(due, self._logger, self._tb)

    def _refused(self, why: str) -> None:
        """A draw that found nothing to sample (counted like the limiter's refusals)."""
        self._counters['refused_sample'] += 1
        return self._refuse(why)

    def _drawn(self, slots: np.ndarray, size: int, use: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """After a draw of ``slots`` (``size`` elements): use counts (unless the preset counted them already
        and passes ``use``), ``max_use`` removal, counters, limiter. Returns the use counts after this draw
        (None when the preset keeps none)."""
        if use is None and self._uses is not None:
            use = self._uses.bump(slots)
        if self._rules:  # usually none or one
            try:  # every rule answers before anything is removed: a broken rule fails the call with nothing changed
                answers = [self._rule_slots(rule, rule.after_sample(self.view, slots, use)) for rule in self._rules]
            except BaseException:
                if self._uses is not None:
                    self._uses.unbump(slots)  # this draw's use counts (bumped here or by the preset's draw)
                raise
            self._remove_answers(answers)
        self._last_use = use
        c = self._counters
        c['sample_calls'] += 1
        c['sampled_items'] += size
        if self._limiter.active:
            self._limiter.on_sample(size)
        return use

    def last_sample_use(self) -> Optional[np.ndarray]:
        """Use counts of the elements the last ``sample`` drew, counting that draw (None when this buffer keeps
        no use counts: no ``max_use`` and not a prioritized buffer)."""
        with self._lock:
            return None if self._last_use is None else self._last_use.copy()

    def _count_update(self, n: int, total: int) -> Dict[str, int]:
        """An ``update`` applied ``n`` of ``total`` entries (the rest were stale): counted, and its result."""
        self._counters['updated'] += n
        self._counters['stale_updates'] += total - n
        return {'updated': n, 'stale': total - n}

    def _spent(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` whose elements reached ``max_use`` (``update`` leaves them alone)."""
        if self._use_limit is None:
            return np.zeros(len(slots), dtype=bool)
        return self._use_limit.spent(self._uses[slots])

    # ------------------------------------------------------------------ stats / state
    def stats(self) -> Dict[str, float]:
        """A flat dict of numbers, O(1): ``count``, ``replay_buffer_size``, counters and the limiter's counts."""
        with self._lock:
            return {
                'count': self.count(),
                'replay_buffer_size': self.replay_buffer_size,
                **self._all_counters(),
                'thruput_push': self._limiter.thruput.push_count,
                'thruput_sample': self._limiter.thruput.sample_count,
            }

    def _engine_state(self) -> Dict[str, Any]:
        out = {'counters': self._all_counters(), 'thruput': self._limiter.state_dict()}
        if self._uses is not None:
            out['use'] = self._uses.state_dict()
        return out

    def _engine_restored(
        self, state: Dict[str, Any], valid: Optional[np.ndarray], required: bool
    ) -> Callable[[], None]:
        """Validate the engine's part of ``state``; return the function that swaps it in. Old files (written
        before a preset had counters) load with ``required=False``: counters start at 0."""
        for key in ('counters', 'thruput'):
            if required and key not in state:
                raise ValueError(f"state has no '{key}' entry")
        saved = state.get('counters')
        counters = dict.fromkeys(self._counters, 0)
        if saved is not None:
            for k in counters:
                if k in COUNTERS or k in saved:
                    counters[k] = int(saved[k])
            if any(v < 0 for v in counters.values()):
                raise ValueError("saved counters must be >= 0")
        thruput = self._limiter.restored(state['thruput']) if 'thruput' in state else None
        uses = None
        if self._uses is not None:
            uses = self._uses.restored(state['use'], valid) if 'use' in state else UseCounts(len(self._uses.counts))

        def swap() -> None:
            self._counters = counters
            if thruput is not None:
                self._limiter.swap(thruput)
            if uses is not None:
                self._uses = uses

        return swap

    def _wake(self) -> None:
        with self._lock:
            self._limiter.wake()

    def start(self) -> None:
        super().start()
        if self._periodic is not None:
            self._periodic.start()

    def close(self) -> None:
        """Wake waiting samplers (they raise), stop the monitor thread, flush TensorBoard (close it only if the
        buffer created it). Idempotent; stored data stays readable through ``state_dict``."""
        if self._closed:
            return
        super().close()
        self._wake()
        if self._periodic is not None:
            self._periodic.close()
        if self._tb is not None:
            self._tb.close()  # flushes; closes the writer only if the buffer created it
        self._release_table()

    def _release_table(self) -> None:
        """Free what the table holds outside the process (memmap files: working memory, not a save)."""
        self._table.release()


__all__ = ['Engine', 'COUNTERS', 'parts_config', 'parts_checks']

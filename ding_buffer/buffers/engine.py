"""``Engine``: the one concrete buffer class. Every preset is an ``Engine`` that names its table and its parts.

The engine owns what every buffer shares: the validated config, the one lock, the RNG, the lifecycle, the
used-data remover, the state / persistence envelope, the counters and ``stats()``, and the parts -- removers
(``control.limits``: ``max_use``, ``max_staleness``, capacity rules, user rules), the rate limiter
(``control.limiter``: thruput controller + minimum size + blocking ``sample(timeout=)``) and monitors. A *table*
(``buffers.table``: slots, episodes, reward-ranked items, chunks) holds the data and the type's verbs; the engine
runs every call in the same order, so a rule configured on one preset behaves the same on every other::

    push:    arguments checked -> table validates (all or nothing) -> limiter.can_push -> a capacity rule makes
             room (or refuses new elements) -> table write -> use counts of the written slots restart, items that
             left go to the used-data remover, expired frames leave, the capacity rule hears of it -> counters
             -> limiter.on_push
    sample:  arguments checked -> removers.before_sample -> limiter.why_not (+ the table's shortfall; wait up to
             `timeout`) -> table draw -> use counts -> removers.after_sample -> counters -> limiter.on_sample
             -> table's done -> monitors (written after the lock is released)

A sample is all or nothing: every rule answers before the engine removes anything (``before_sample`` and
``after_sample`` each ask all rules first), so a rule of your own that raises or answers garbage fails the call
with nothing changed -- the draw's use counts are taken back and, with such a rule configured, the RNG and what the
table's ``snapshot`` names (advanced: beta) are restored. (Elements the ``before_sample`` answers removed stay
removed when an ``after_sample`` answer fails later in the same call: they were due before the draw.)

A preset is data: ``config`` (DI-engine's commented default config), ``checks``, ``table`` (the table class) and
``table_args``, its declared capabilities (``IBuffer.capabilities``) and the type's own public verbs, each a
forwarder to the table. Public methods take ``self._lock`` (an ``RLock``), so push / sample / update / clear /
state_dict are mutually exclusive; the table and parts assume single-threaded calls.
"""

import copy
import logging
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
import torch
from easydict import EasyDict

from .. import forks
from ..base import IBuffer
from ..config import INF, build_config
from ..control.capacity import CapacityRule, find_capacity_rule
from ..control.limiter import RateLimiter, limiter_checks, limiter_config
from ..control.limits import (
    REMOVER_REGISTRY,
    StalenessLimit,
    UseCounts,
    UseLimit,
    build_removers,
    find_rule,
    limit_ok,
)
from ..errors import SampleTimeoutError
from ..monitor.periodic import TAGS as PERIODIC_TAGS
from ..monitor.periodic import PeriodicThruputMonitor
from ..monitor.tb import TBSink, build_tb_logger, rank
from ..monitor.used_data_remover import UsedDataRemover, check_trackable, check_trackable_batch
from ..persistence import load_state, refuse_meta, refuse_unknown, restoring, save_state
from ..storage.tensordict_io import check_batched, is_tensordict, to_tensordict
from ..storage.tree import copy_memo
from .common import (
    LOCK_GRACE,
    STEP_LIMIT,
    CallMarks,
    check_deepcopy,
    check_instance_name,
    check_size,
    check_state_type,
    check_step,
    check_wait_timeout,
    depth,
    new_rng,
    release_to,
    restored_rng,
    saved_count,
    short_form,
)
from .outputs import as_items
from .table import Needs, Parts, Request, Restored, Write
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


def table_attribute(name: str, doc: str, check: Optional[Callable[[Any], Any]] = None) -> property:
    """A preset's attribute that is its table's ``name``, read at each access (a restore may replace what the table
    holds); with ``check``, assigning it assigns the table's the checked value (``check`` raises on a bad one)."""
    fset = (lambda self, value: setattr(self._t, name, check(value))) if check is not None else None
    return property(lambda self: getattr(self._t, name), fset, doc=doc)


def _check_tracked(state: Mapping) -> None:
    """``enable_track_used_data``: every item of a (list storage) state a dict with a path-like ``data_id``, as a
    push checks it; ``ValueError`` otherwise."""
    storage = state.get('storage')
    for i, item in enumerate(storage.get('items') or () if isinstance(storage, Mapping) else ()):
        try:
            check_trackable(item, i)
        except TypeError as e:
            raise ValueError(f"invalid state: {e}") from None


def _deep_copied(items: List[Any]) -> List[Any]:
    """``copy.deepcopy(items)`` (config ``deepcopy``); an item no copy takes is a ``TypeError`` naming it."""
    try:
        return copy.deepcopy(items, copy_memo(items, None))  # (a view: a tensor of its own, not its whole storage)
    except (RuntimeError, TypeError, copy.Error) as e:  # (a non-leaf tensor that requires grad, a lock, ...)
        raise TypeError(
            f"config key 'deepcopy' is True and {_grad_leaf(items)} cannot be copied ({type(e).__name__}: {e}); "
            f"detach tensors that require grad, or set deepcopy=False"
        ) from e


def _grad_leaf(items: List[Any]) -> str:
    """'item i field 'a.b'' of the first tensor of ``items`` that is part of a graph (no deepcopy takes it), else
    'a pushed item'."""

    seen = set()  # (containers already walked: an item may hold a cycle)

    def walk(v: Any, path: str) -> Optional[str]:
        if isinstance(v, torch.Tensor):
            return path if v.requires_grad and not v.is_leaf else None
        if id(v) in seen:
            return None
        seen.add(id(v))
        kids = v.items() if isinstance(v, Mapping) else enumerate(v) if isinstance(v, (list, tuple)) else ()
        return next((p for k, x in kids if (p := walk(x, f'{path}.{k}' if path else str(k)))), None)

    for i, item in enumerate(items):
        path = walk(item, '')
        if path is not None:
            return f"item {i} field '{path}'"
    return 'a pushed item'


def _rule_counter(key: Any) -> bool:
    """Whether ``key`` is the counter of a registered rule (``removed_by_<name>`` / ``refused_by_<name>``, the name
    it is registered under or counts under)."""
    head, _, rule = str(key).partition('_by_')
    if head not in ('removed', 'refused'):
        return False
    return rule in REMOVER_REGISTRY or any(getattr(cls, 'name', None) == rule for cls in REMOVER_REGISTRY.values())


def _builtin_capacity(rule: Any) -> bool:
    """One of the package's capacity rules (a user's own, a subclass of one included, may fail mid-sample)."""
    return isinstance(rule, CapacityRule) and type(rule).__module__ == CapacityRule.__module__


class Engine(IBuffer):
    """
    Overview:
        The buffer every preset is: the config, lock, RNG, lifecycle, state envelope, counters and parts around
        the preset's table (see the module docstring). Constructor: ``(cfg, tb_logger=None,
        exp_name='default_experiment', instance_name='buffer')``, as every DI-engine buffer.
    """

    checks: Dict[str, Any] = {}
    # key -> why it has no effect: accepted with a warning (config.dingengine_ignored)
    ignored_keys: Dict[str, str] = {}
    key_aliases: Dict[str, str] = {}  # another library's key name -> ours (config.resolve_aliases)
    # push(td) of a TensorDict with batch_size [B, ...] is a batch of B items (False: one element, e.g. an episode)
    tensordict_batch_is_items = True
    table: Any = None  # the preset's table class (``buffers.table.Table``), or a function choosing one by config
    monitors_take_tb_logger = True  # the engine's monitors write to the ``tb_logger`` passed in
    table_args: Dict[str, Any] = {}  # keyword arguments of the table's constructor

    def __init__(
        self,
        cfg: Optional[Mapping] = None,
        tb_logger: Any = None,
        exp_name: str = 'default_experiment',
        instance_name: str = 'buffer',
    ) -> None:
        # Fewer than 30 attributes per buffer: CPython 3.11 keeps instance attributes of one class in a shared-key
        # table of at most 30 names, past which every attribute read on the hot paths slows down.
        self._cfg: EasyDict = self._config(cfg)
        check_instance_name(instance_name)
        self._instance_name = instance_name
        self._logger = logging.getLogger(f'ding_buffer.{instance_name}')
        self._lock = forks.lock()  # (free in a forked child)
        self._rng = new_rng(self._cfg.get('seed'))
        if self._cfg.get('seed') is None:
            forks.tell_children(self)
        self._remover: Optional[UsedDataRemover] = None
        if self._cfg.get('enable_track_used_data', False):
            if self._cfg.storage.type != 'list':
                raise ValueError(
                    "config key 'enable_track_used_data' needs storage.type='list' (items carry 'data_id')"
                )
            self._remover = UsedDataRemover(self._logger)
            # dropped without close(), or open at exit: its thread stops and the queued files go (at exit before
            # the interpreter tears its modules down, which a __del__ then would meet)
            weakref.finalize(self, self._remover.close, 1.0)
        self._closed = False
        self._last_envstep = -1
        self._deepcopy = bool(self._cfg.get('deepcopy', False))  # read on every push and sample
        self._t = self.table(self._cfg, instance_name, self._lock, **self.table_args)
        self._build_parts(self._t.build(), tb_logger, exp_name)  # tb_logger: borrowed, never closed here
        self._lend_parts(tb_logger)
        # The hot paths of a push: no used-data remover must see an overwritten item, no capacity rule decides
        # (a batch: and no rate limit); the table's verbs bound once (a single push is a few microseconds).
        self._one_fast = self._t.hot_path and self._remover is None and self._capacity is None
        self._batch_fast = self._one_fast and not self._limiter.active and not self._t.expires()  # (frames: expiry)
        # nothing to tell about a single push (no use counts, periodic report or rate limit): the storage alone
        self._lean = self._batch_fast and self._uses is None and self._periodic is None
        self._write_one, self._check_pushed = self._t.write_one, self._t.check_pushed

    def _config(self, cfg: Optional[Mapping]) -> EasyDict:
        """The user's config merged into the preset's defaults and checked (``ValueError`` naming the key)."""
        return build_config(self.config, cfg, self.checks, ignored=self.ignored_keys, aliases=self.key_aliases)

    # ------------------------------------------------------------------ parts
    def _build_parts(self, needs: Needs, tb_logger: Any, exp_name: str) -> None:
        """Build the parts every preset shares, as the table's ``Needs`` say: the use-count column, removal rules,
        the rate limiter, the counters and the monitors."""
        cfg = self._cfg
        self._rules = build_removers(cfg) if needs.rules is None else needs.rules
        self._use_limit = find_rule(self._rules, UseLimit)
        self._capacity: Optional[CapacityRule] = find_capacity_rule(self._rules)
        # a rule or sampler of the user's (or a copy of the user's objects) may raise or answer garbage mid-sample:
        # the sample then snapshots what the draw moves
        self._fallible = (
            getattr(self._t, 'own_sampler', False)
            or (bool(cfg.get('deepcopy', False)) and cfg.get('storage', {}).get('type') == 'list')  # copies of the
            # user's objects may raise too (tensor storage hands out gathered tensors: nothing to copy)
            or any(type(r) not in (UseLimit, StalenessLimit) and not _builtin_capacity(r) for r in self._rules)
        )
        counted = self._use_limit or self._t.uses_counted
        self._uses: Optional[UseCounts] = UseCounts(needs.slots) if counted else None
        self._limiter = RateLimiter(cfg.thruput_controller if needs.limiter is None else needs.limiter, self._lock)
        names = [f'removed_by_{r.name}' for r in self._rules]
        if self._t.expires():  # storage.frames: see WriteResult.expired
            names.append('removed_by_frames')
        if self._capacity is not None and self._capacity.admission:
            names.append(f'refused_by_{self._capacity.name}')
        self._counters: Dict[str, int] = dict.fromkeys(list(COUNTERS) + [n for n in names if n not in COUNTERS], 0)
        self._due: Any = None  # monitor output computed under the lock, written after it
        self._calls = CallMarks(self._instance_name)  # the calls that run the user's code, each thread's
        self._tb: Optional[TBSink] = None
        self._periodic: Optional[PeriodicThruputMonitor] = None
        self._last_use: Optional[np.ndarray] = None  # use counts after the last draw (last_sample_use)
        if needs.monitors:
            self._build_monitors(needs.tensorboard, needs.period, tb_logger, exp_name)

    def _lend_parts(self, tb_logger: Any) -> None:
        """The table is lent the parts it reads; then the parts see it through its view (a capacity rule checked
        against the view's columns)."""
        tracked, gaps, capacity = self._remover is not None, bool(self._rules), self._capacity is not None
        self._t.attach(Parts(self._uses, self._logger, self._tb, tb_logger, tracked, gaps, self._use_limit, capacity))
        self._view = TableView(self._t)
        if capacity:
            self._check_capacity_rule()

    def _build_monitors(self, tensorboard: bool, period: Optional[float], tb_logger: Any, exp_name: str) -> None:
        """The TensorBoard writer (borrowed, or owned when ``tensorboard``) and, with a writer on rank 0, the
        periodic push / sample / remove report every ``period`` seconds (DI-engine's ``{instance}_sec/`` tags;
        ``None``: no periodic report)."""
        given = tb_logger if self.monitors_take_tb_logger else None
        writer, owned = build_tb_logger(given, tensorboard, exp_name, self._instance_name)
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
        self._load_shift = {key: 0 for _, key in PERIODIC_TAGS}
        weakref.finalize(self, self._periodic.stop)  # dropped without close(): the thread ends at once

    def _counter_snapshot(self) -> Optional[Dict[str, float]]:
        """The periodic report's cumulative counters (a load does not move them: ``_load_shift``); None once the
        buffer is closing, when the lock stays taken (``with buffer.lock: buffer.close()``): the monitor's thread
        then ends, and ``close()`` writes the last period from its own thread."""
        held, got = depth(self._lock), False  # (a first push reads it on the caller's thread: a Ctrl-C may land)
        try:
            while not self._lock.acquire(timeout=0.05):
                if self._closed:
                    return None
            got = True
            out = {**self._all_counters(), 'count': self.count()}
            for key, shift in self._load_shift.items():
                out[key] += shift
            return out
        finally:
            if got:
                self._lock.release()
            else:  # (an exception as ``acquire`` returned)
                release_to(self._lock, held)

    # ------------------------------------------------------------------ properties
    @property
    def cfg(self) -> EasyDict:
        return self._cfg

    @property
    def instance_name(self) -> str:
        return self._instance_name

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    @property
    def replay_buffer_size(self) -> int:
        """Capacity (items; episodes for the episode buffer; fragments for the chunk buffer)."""
        return self._t.capacity()

    # ------------------------------------------------------------------ the table's read-only view
    @property
    def view(self) -> TableView:
        """The read-only view of this buffer's table that its parts read (counts, order, named columns)."""
        return self._view

    def _check_capacity_rule(self) -> None:
        """A capacity rule fits this table: the table takes one, and the column it reads exists (and, for a rule
        that may refuse new elements, is known before they are written)."""
        rule, kind = self._capacity, self._cfg.get('type')
        if not self._t.capacity_rules:
            raise ValueError(
                f"config key 'removers' names the capacity rule {rule.name!r}, which type {kind!r} does not take "
                f"(capacity rules choose what leaves a full table of items: types 'naive', 'elastic', 'advanced', "
                f"'deque'; 'chunk' takes 'fifo' and 'max_use')"
            )
        column = rule.column
        if column is not None and column not in self.view.columns:
            raise ValueError(
                f"config key 'removers' names the capacity rule {rule.name!r}, which reads column {column!r}; a "
                f"{kind!r} table has the columns {', '.join(self.view.columns)} (priorities: type 'advanced')"
            )
        if rule.admission and column not in self._t.admission_columns:
            known = ', '.join(self._t.admission_columns) or 'none'
            raise ValueError(
                f"config key 'removers' names {rule.name!r} with column {column!r}: it compares new elements' values "
                f"before they are stored, which a {kind!r} table knows for: {known}"
            )

    def _tell(self, verb: str, *slots: np.ndarray) -> Optional[RuntimeError]:
        """The capacity rule hears of a change made (``on_written`` / ``on_changed`` / ``rebuild``). A rule whose
        ``on_written`` / ``on_changed`` raises is rebuilt from the table, which puts it in step: the error is logged
        and the call goes on. Returns the error naming the rule when it cannot be put in step (its ``rebuild``
        raised), for the caller to raise once its own bookkeeping of the change is done."""
        rule = self._capacity
        if rule is None:
            return None
        try:
            getattr(rule, verb)(self._view, *slots)
            return None
        except Exception as e:
            error = e
        if verb != 'rebuild':
            try:
                rule.rebuild(self._view)
                self._logger.error(
                    "[%s] capacity rule %r raised in %s (rebuilt from the table): %s: %s",
                    self._instance_name,
                    rule.name,
                    verb,
                    type(error).__name__,
                    error,
                    exc_info=error,
                )
                return None
            except Exception as e:
                error, verb = e, f'{verb}, then in rebuild'
        out = RuntimeError(
            f"capacity rule {rule.name!r} raised in {verb} ({type(error).__name__}: {error}); the change it was told "
            f"of stands (its verbs hear of a change already made)"
        )
        out.__cause__ = error
        return out

    # ------------------------------------------------------------------ table verbs (what parts read)
    def count(self) -> int:
        """Number of stored elements (items; episodes for the episode buffer; chunks for the chunk buffer)."""
        return self._t.count()

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest stored elements' slots, oldest first (what removers read)."""
        return self._t.oldest(k)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """Each element's ``collect_iter`` (int64; ``NO_ITER`` where it has none)."""
        return self._t.collect_iter(slots)

    def _rule_slots(self, rule: Any, slots: Any) -> np.ndarray:
        """A rule's answer as distinct live slots; a rule answering garbage raises ``RuntimeError`` naming it
        (nothing is removed for that answer)."""
        arr = np.unique(np.asarray(slots).reshape(-1))
        if not len(arr):
            return arr.astype(np.int64)
        if arr.dtype.kind not in 'iu' or arr[0] < 0 or arr[-1] >= 1 << 63:  # (sorted: uint64 past int64 too)
            raise RuntimeError(f"remover {rule.name!r} returned {arr.dtype} slots {arr[:4]}...; expected ints >= 0")
        arr = arr.astype(np.int64)
        try:
            live = self._t.live(arr)
        except IndexError:
            raise RuntimeError(f"remover {rule.name!r} returned slot {int(arr[-1])}, past the table's end") from None
        if not live.all():
            raise RuntimeError(
                f"remover {rule.name!r} returned slot {int(arr[~live][0])}, which holds no element; expected slots of "
                f"stored elements"
            )
        return arr

    def _remove_answers(self, answers: List[np.ndarray]) -> None:
        """Remove what each rule answered (``_rule_slots``, in rule order), each slot once: counted under the first
        rule that named it."""
        done = None  # slots an earlier rule removed in this call: a later rule cannot remove them again
        for rule, gone in zip(self._rules, answers):
            if done is not None and len(gone):
                gone = np.setdiff1d(gone, done)
            if len(gone):
                if rule is self._use_limit and self._remover is not None and self._t.retires_used:
                    self._t.retire(gone)  # DI-engine: the item (its file) stays, never drawn again
                    self._changed(gone)
                else:  # (a batch's used-up items keep their files until the next batch uses items up)
                    self._remove(gone, f'removed_by_{rule.name}', hold=rule is self._use_limit)
                done = gone if done is None else np.union1d(done, gone)

    def _remove(self, slots: np.ndarray, counter: str, hold: bool = False) -> None:
        """Remove the elements at ``slots`` (counted under ``counter``); their items go to the used-data remover
        (``hold``: as ``UsedDataRemover.add``)."""
        if not len(slots):
            return
        removed = self._t.drop(slots)
        if self._uses is not None:
            self._uses.reset(slots)
        self._counters['remove_count'] += len(slots)
        self._counters[counter] += len(slots)
        self._evicted(removed, hold)

    def _changed(self, slots: np.ndarray) -> None:
        """A mutable column of ``slots`` changed in place (priorities): a capacity rule reading it hears of it."""
        rule = self._capacity
        if rule is not None and rule.column in self._t.mutable_columns and len(slots):
            failed = self._tell('on_changed', slots)
            if failed is not None:
                raise failed

    def _evicted(self, items: List[Any], hold: bool = False) -> None:
        """Hand items that left the buffer to the used-data remover (under the lock; once closed, their files go at
        once, with no thread)."""
        if self._remover is not None and items:
            self._remover.add(items, hold)
            if self._closed:
                self._remover.close()
            else:
                self._remover.start()

    # ------------------------------------------------------------------ push
    def push(self, data: Any, cur_collector_envstep: int = -1, batched: bool = False) -> int:
        """
        Overview:
            Store one item, a list of items, or (``batched=True``) one dict whose leaves share a leading batch
            dimension. A list longer than the capacity keeps its newest items. All or nothing: an invalid item
            raises ``TypeError``/``ValueError`` and nothing is stored. An empty list is a no-op.
            A TensorDict with ``batch_size=[]`` is one item; with ``batch_size=[B, ...]`` it is a batch of ``B``
            items (as ``extend``) -- except for the episode buffer, where it is one episode of ``B`` steps
            (``storage.tensordict_io``).
        Arguments:
            - data (:obj:`Any`): the item(s).
            - cur_collector_envstep (:obj:`int`): collector env step, recorded for monitors.
            - batched (:obj:`bool`): ``data`` is a batch dict (see ``extend``).
        Returns:
            - pushed (:obj:`int`): number of items pushed.
        """
        if self._closed:  # (first, as every call; again under the lock below)
            self._check_open()
        if self._calls.count:
            self._calls.refuse('push')
        if type(cur_collector_envstep) is not int or not -STEP_LIMIT < cur_collector_envstep < STEP_LIMIT:
            cur_collector_envstep = check_step(cur_collector_envstep, 'cur_collector_envstep')
        if type(data) is not dict and type(data) is not list and is_tensordict(data):
            if batched:
                check_batched(data)
            elif self.tensordict_batch_is_items and data.batch_size:
                batched = True  # its batch_size declares the items: TorchRL's extend
        if batched:
            if self._remover is not None:
                check_trackable_batch(data)
            with self._lock:
                if self._closed:  # (checked under the lock: a close() that began meanwhile has released the storage)
                    self._check_open()
                return self._took(self._push_batch(data), cur_collector_envstep, data)
        items = data if isinstance(data, list) else [data]
        if not items:
            return 0
        if len(items) > 1:
            self._check_pushed(items)
        elif items[0] is None:
            raise TypeError("cannot push None (item 0)")
        if self._remover is not None:
            for i, item in enumerate(items):
                check_trackable(item, i)
        if self._deepcopy:
            items = _deep_copied(items)
        with self._lock:
            if self._closed:
                self._check_open()
            return self._took(self._push_items(items), cur_collector_envstep, items)

    def _took(self, n: int, envstep: int, pushed: Any = ()) -> int:
        """A push at ``envstep`` of ``pushed`` (items, or a batch) stored ``n`` elements: the env step of the latest
        push taken, the ``_step`` scalars' x-axis, moves (a push that stored nothing moves nothing), and a file held
        since a sample used up an item of that ``data_id`` is the new item's. Returns ``n``."""
        if n:
            self._last_envstep = envstep
            if self._remover is not None:
                batch = pushed.get('data_id', ()) if isinstance(pushed, Mapping) else None
                self._remover.keep(pushed if batch is None else [{'data_id': d} for d in batch])
        return n

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        """Push a whole batch: a dict whose leaves share a leading dimension (``push(batch, batched=True)``)."""
        return self.push(batch, cur_collector_envstep, batched=True)

    def _push_items(self, items: List[Any]) -> int:
        """A list of items in the push order (``_write``); a single plain item may take the table's hot path."""
        if len(items) == 1 and self._lean:
            slot = self._write_one(items[0])
            if slot is not None:
                if self._limiter.waiting:
                    self._limiter.on_push(1)  # wake samplers waiting for data
                return 1
        elif len(items) == 1 and self._one_fast:
            lim = self._limiter
            if not lim.active or lim.can_push(1, self._t.units())[0]:  # a refusal is counted by the checking path
                if self._periodic is not None:
                    self._periodic.start()  # first: its baseline must not include this push
                slot = self._write_one(items[0])
                if slot is not None:
                    if self._uses is not None:
                        self._uses.reset(slot)
                    if lim.active or lim.waiting:
                        lim.on_push(1)
                    return 1
        elif self._batch_fast:
            if self._periodic is not None:
                self._periodic.start()
            return self._fast_written(self._t.write_items(items), len(items))
        return self._write(self._t.prepare(items))

    def _push_batch(self, batch: Any) -> int:
        """A batch dict in the push order; without a remover, rate limit or capacity rule the table's hot path."""
        if self._batch_fast:
            if self._periodic is not None:
                self._periodic.start()
            slots = self._t.write_batch(batch)
            if slots is not None:
                return self._fast_written(slots, len(slots))
        return self._write(self._t.prepare_batch(batch))

    def _fast_written(self, slots: np.ndarray, n: int) -> int:
        """After a hot-path write of ``n`` elements (kept at ``slots``): their use counts restart, samplers waiting
        for data wake. Returns ``n``."""
        if self._uses is not None:
            self._uses.reset(slots)
        if self._limiter.waiting:
            self._limiter.on_push(n)
        return n

    def _push_with(self, cur_collector_envstep: int, prepare: Callable[[], Optional[Write]]) -> int:
        """A preset's own push: under the lock the table's ``prepare`` (None: nothing to write), then ``_write``;
        the monitors' output is written after the lock is released."""
        self._check_open()
        if self._calls.count:
            self._calls.refuse('push')
        cur_collector_envstep = check_step(cur_collector_envstep, 'cur_collector_envstep')
        with self._lock:
            if self._closed:
                self._check_open()
            w = prepare()
            if w is None:
                return 0
            n = self._took(self._write(w), cur_collector_envstep)
            due, self._due = self._due, None
        if due is not None:
            self._t.emit(due)
        return n

    def _write(self, w: Write) -> int:
        """Every push of a validated write, in the order the module docstring gives. Returns the elements
        accepted."""
        if self._limiter.active and not self._admit(w.n + w.dropped):
            return self._not_written(w)
        rule = self._capacity
        if rule is not None:
            whole, w = w, self._make_room(w)
            if w is None:  # every new element refused
                return self._not_written(whole)
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        done = self._t.write(w, self._remover is not None)
        if self._uses is not None and done.slots is not None:
            self._uses.reset(done.slots)
        if done.evicted:
            self._evicted(done.evicted)
        if done.expired is not None:  # the frames of older items were overwritten (storage.frames)
            self._remove(done.expired, 'removed_by_frames')
        failed = None
        if rule is not None:  # (a push larger than the table replaced everything)
            failed = self._tell('rebuild') if w.dropped else self._tell('on_written', done.slots)
        c = self._counters
        c['push_items'] += done.n
        c['remove_count'] += done.removed
        if done.due is not None:
            self._due = done.due
        lim = self._limiter
        if lim.active or lim.waiting:
            lim.on_push(done.n)
        if failed is not None:
            raise failed
        return done.n

    def _make_room(self, w: Write) -> Optional[Write]:
        """With a capacity rule: before a write that does not fit, the rule names the stored elements that leave
        (counted ``removed_by_<rule>``) and, if it may refuse new ones, which new elements enter (the others are
        counted ``refused_by_<rule>``). Returns what is written (None: nothing). Nothing changes if the rule
        answers garbage."""
        rule, t = self._capacity, self._t
        need = w.n - (t.capacity() - t.count())
        if w.dropped or need <= 0:
            return w
        values = t.new_values(rule.column, w.values, w.n) if rule.admission else None
        try:
            victims, admitted = rule.plan(self._view, values, need)
            victims = self._rule_slots(rule, victims)
            refused = 0 if admitted is None else int(len(admitted) - np.count_nonzero(admitted))
            if len(victims) + refused < need or len(victims) > need:
                raise RuntimeError(
                    f"capacity rule {rule.name!r} freed {len(victims)} slots and refused {refused} new items; the "
                    f"write needs {need} more slots (and no more)"
                )
        except BaseException:
            self._tell('rebuild')  # its own structure may have moved: rebuilt from the unchanged table
            raise
        self._remove(victims, f'removed_by_{rule.name}')
        if refused:
            self._counters[f'refused_by_{rule.name}'] += refused
            return t.select(w, np.asarray(admitted, dtype=bool)) if refused < len(admitted) else None
        return w

    def _not_written(self, w: Write) -> int:
        """A validated write the rate limiter or a capacity rule refused whole: the table settles it (frames may
        expire older items: ``Storage.discard``). Returns 0 (elements accepted)."""
        expired = self._t.discard(w)
        if expired is not None:
            self._remove(expired, 'removed_by_frames')
        return 0

    def _admit(self, n: int) -> bool:
        """Whether the rate limiter lets ``n`` elements in (a refusal is counted and logged)."""
        ok, why = self._limiter.can_push(n, self._t.units())
        if not ok:
            self._counters['refused_push'] += 1
            self._counters['refused_push_items'] += n
            self._logger.info("[%s] refuse to push %d items: %s", self._instance_name, n, why)
        return ok

    def _all_counters(self) -> Dict[str, int]:
        return {**self._counters, **self._t.derived()}

    # ------------------------------------------------------------------ sample
    def sample(self, size: int, cur_learner_iter: int = -1, **kwargs: Any) -> Optional[Any]:
        """Draw ``size`` elements (the preset's own ``sample`` names its arguments); ``None`` when not possible."""
        return self._sample(cur_learner_iter, self._t.request(size, **kwargs))

    def _refuse(self, reason: str) -> None:
        self._counters['refused_sample'] += 1
        self._logger.info("[%s] refuse to sample: %s", self._instance_name, reason)
        return None

    def _why_not(self, size: int, cur_learner_iter: int, shortfall: Optional[Callable[[], str]]) -> str:
        if self._rules:  # every rule answers (on the same table) before anything is removed: all or nothing
            answers = [self._rule_slots(rule, rule.before_sample(self.view, cur_learner_iter)) for rule in self._rules]
            self._remove_answers(answers)
        short = shortfall() if shortfall is not None else ''
        units = self._t.units()
        limit = self._limiter.why_not(units, size, shortfall)
        if short and limit and units:
            return f'{short}; {limit}'
        return short or limit  # an empty buffer: the table's reason says it

    def _ready(
        self,
        size: int,
        cur_learner_iter: int,
        shortfall: Any,
        timeout: Any,
        deadline: Optional[float] = None,
        verb: str = 'sample',
    ) -> str:
        """Under the lock: why a draw of ``size`` would return nothing now ('' when it would draw), after the
        removal rules that are due ran (marked as ``verb``: they are the user's code); with ``timeout``, waits for it
        until ``deadline`` (``SampleTimeoutError``)."""
        marked = self._calls.mark(verb)
        try:
            if timeout is None:
                return self._why_not(size, cur_learner_iter, shortfall)
            why_not = lambda: self._why_not(size, cur_learner_iter, shortfall)  # noqa: E731
            return self._limiter.wait(why_not, timeout, self._t.wait_what(size), self._check_open, deadline)
        finally:
            self._calls.unmark(marked)

    def why_not_sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None) -> str:
        """
        Overview:
            Why ``sample(size, cur_learner_iter)`` would return None now, or '' when it would draw; nothing is
            drawn. The removal rules that are due run first (as in a sample). ``timeout``: wait up to that many
            seconds for a sample to become possible (``SampleTimeoutError`` if it does not). Hold ``lock`` around
            this call and the ``sample`` to make them one step.
        """
        check_size(size)
        cur_learner_iter = check_step(cur_learner_iter, 'cur_learner_iter')
        timeout = check_wait_timeout(timeout)
        self._check_open()
        self._calls.refuse('why_not_sample')
        shortfall = self._t.request(size).shortfall
        held, deadline = None if timeout is None else depth(self._lock), None
        try:
            deadline = None if timeout is None else self._hold(timeout, size)
            with self._lock:
                self._check_open()
                return self._ready(size, cur_learner_iter, shortfall, timeout, deadline, 'why_not_sample')
        finally:  # (no call before the release: a Ctrl-C may land at a call's start)
            if deadline is not None:
                self._lock.release()
            elif held is not None:  # (an exception -- a Ctrl-C -- between ``_hold``'s acquire and its return)
                release_to(self._lock, held)

    def _hold(self, timeout: float, size: int) -> float:
        """Take the lock once more within ``timeout`` seconds (the caller releases it) and return the call's
        deadline: its wait for data gets what is left (``SampleTimeoutError`` when another call held the lock
        throughout)."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=max(timeout, LOCK_GRACE)):
            raise SampleTimeoutError(f"{self._t.wait_what(size)} within {timeout}s: another call held the buffer")
        return deadline

    @property
    def lock(self) -> threading.RLock:
        """The buffer's re-entrant lock, which every public method takes: hold it to make several calls one step."""
        return self._lock

    @property
    def sample_may_fail(self) -> bool:
        """Whether a sample may still fail or refuse once its draw began, though ``why_not_sample`` said it would
        draw: a sampler or rule of the user's, or deep copies of list items (each such call undoes its own draw)."""
        return self._fallible

    def _sample(self, cur_learner_iter: int, request: Request) -> Optional[Any]:
        """Every ``sample`` call, in the order the module docstring gives, then the request's ``finish``. Without
        rules, limits or a timeout only the draw runs: it refuses by itself when ``shortfall()`` would."""
        size, draw, shortfall, timeout, finish = request
        check_size(size)
        if type(cur_learner_iter) is not int or not -STEP_LIMIT < cur_learner_iter < STEP_LIMIT:
            cur_learner_iter = check_step(cur_learner_iter, 'cur_learner_iter')
        if self._calls.count:  # (a nested sample runs the removal rules: max_use would take items from under it)
            self._calls.refuse('sample')
        timeout = check_wait_timeout(timeout)
        held, deadline = None if timeout is None else depth(self._lock), None
        try:
            deadline = None if timeout is None else self._hold(timeout, size)  # (its wait for the lock counts too)
            with self._lock:
                if self._closed:
                    self._check_open()
                if self._periodic is not None:  # (before anything counts: a buffer only sampled, e.g. loaded, too)
                    self._periodic.start()
                first = self._rules or self._limiter.checks or timeout is not None  # else the draw refuses by itself
                why = self._ready(size, cur_learner_iter, shortfall, timeout, deadline, 'sample') if first else ''
                if why:
                    return self._refuse(why)
                if self._reseed_due:  # (a forked child's first draw)
                    self._reseed()
                # a draw that fails -- a rule or sampler of the user's, or no memory for the batch -- or that a
                # user's sampler refuses is taken back (Python's ``random``, which an unseeded deque draws from:
                # only where a user's part may fail)
                rng, snapshot = self._rng.bit_generator.state, self._t.snapshot(self._fallible)
                marked = self._calls.mark('sample')  # (the user's code runs below)
                try:
                    drawn = draw(self._rng)
                    if type(drawn) is str:
                        self._rng.bit_generator.state = rng
                        self._t.restore_snapshot(snapshot)
                    out = self._drawn(self._shaped(drawn))
                    if out is not None and finish is not None:
                        out = finish(out, self._last_use)
                except BaseException:
                    self._rng.bit_generator.state = rng
                    self._t.restore_snapshot(snapshot)
                    raise
                finally:
                    self._calls.unmark(marked)
                due, self._due = self._due, None
        finally:  # (no call before the release: a Ctrl-C may land at a call's start)
            if deadline is not None:
                self._lock.release()
            elif held is not None:  # (an exception -- a Ctrl-C -- between ``_hold``'s acquire and its return)
                release_to(self._lock, held)
        if due is not None:
            self._t.emit(due)  # outside the lock
        return out

    def _shaped(self, drawn: Any) -> Any:
        """A drawn batch in the output the config asks for (items; TensorDicts), before anything counts the draw:
        a conversion that fails (no memory) takes back the use counts the table's draw counted."""
        if type(drawn) is str:
            return drawn
        items = self._t.items_out()  # (asked for by name: it wins over the TensorDict output)
        if not items and not self._t.tensordict_out():
            return drawn
        try:
            out = as_items(drawn.out, self._instance_name) if items else to_tensordict(drawn.out, self._t.device())
        except BaseException:
            if drawn.use is not None and self._uses is not None:
                self._uses.unbump(drawn.slots)
            raise
        return drawn._replace(out=out)

    def _drawn(self, drawn: Any) -> Optional[Any]:
        """After a table's draw: its refusal (a str) counted, or for a ``Drawn``: use counts (unless the table
        counted them and passes ``use``), removal rules (``max_use`` removes after the batch was gathered), counters,
        the limiter, then the table's ``done``. Returns the batch."""
        if type(drawn) is str:
            return self._refuse(drawn)
        slots, size, out, use, done, copied = drawn
        if copied and self._deepcopy:  # first: a copy that raises (an object's own __deepcopy__) changes nothing
            try:
                out = copy.deepcopy(out, copy_memo(out, None))  # (a view: a tensor of its own)
            except BaseException:
                if use is not None and self._uses is not None:
                    self._uses.unbump(slots)  # counted by the table's draw
                raise
        if use is None and self._uses is not None:
            use = self._uses.bump(slots)
        if self._rules:  # usually none or one
            try:  # every rule answers before anything is removed: a broken rule fails the call with nothing changed
                answers = [
                    self._rule_slots(rule, rule.after_sample(self.view, slots.copy(), use)) for rule in self._rules
                ]
            except BaseException:
                if self._uses is not None:
                    self._uses.unbump(slots)  # this draw's use counts (bumped here or by the table's draw)
                raise
            self._remove_answers(answers)
        self._last_use = use
        c = self._counters
        c['sample_calls'] += 1
        c['sampled_items'] += int(size)  # (np.int64 sizes: files hold plain ints)
        if self._limiter.active:
            self._limiter.on_sample(size)
        if done is not None:
            self._due = done(self._last_envstep)
        return out

    def last_sample_use(self) -> Optional[np.ndarray]:
        """Use counts of the elements the last ``sample`` drew, counting that draw (None when this buffer keeps
        no use counts: no ``max_use`` and not a prioritized buffer)."""
        with self._lock:
            return None if self._last_use is None else self._last_use.copy()

    # ------------------------------------------------------------------ update
    def update(self, info: Any) -> Optional[Dict[str, int]]:
        """New information about sampled elements (priorities on prioritized tables; a no-op returning
        ``{'updated': 0, 'stale': 0}`` where the table keeps none). The table checks ``info`` (raising before
        anything changes) and answers the call's result, or what to apply: the engine applies it under the lock,
        handing it ``_spent`` (entries whose elements reached ``max_use`` are left alone), and counts the
        ``(applied, total)`` it answers (``None``: nothing to count, the call returns None)."""
        return self._update(self._t.update, info)

    def _update(self, ask: Callable[[Any], Any], info: Any, verb: str = 'update') -> Optional[Dict[str, int]]:
        """Every ``update`` call, in one order (see ``update``): ``ask(info)`` is the table's answer (a preset's own
        ``update`` names the table's verb that answers it)."""
        self._check_open()  # first, as push: a closed buffer refuses even bad information
        if self._calls.count:
            self._calls.refuse(verb)
        out = ask(info)
        if type(out) is dict or out is None:
            return out
        with self._lock:
            self._check_open()  # a closed buffer takes no new information, as it takes no data
            counts = out(self._spent)
            return None if counts is None else self._count_update(*counts)

    def _count_update(self, n: int, total: int, changed: Optional[np.ndarray] = None) -> Dict[str, int]:
        """An ``update`` applied ``n`` of ``total`` entries (the rest were stale; ``changed``: the slots whose
        mutable columns it set): counted, and its result."""
        self._counters['updated'] += n
        self._counters['stale_updates'] += total - n
        if changed is not None:
            self._changed(changed)
        return {'updated': n, 'stale': total - n}

    def _spent(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` whose elements reached ``max_use`` (``update`` leaves them alone)."""
        if self._use_limit is None:
            return np.zeros(len(slots), dtype=bool)
        return self._use_limit.spent(self._uses[slots])

    # ------------------------------------------------------------------ clear / stats
    def clear(self) -> None:
        """Remove every element (files of tracked items are deleted; each counts in ``remove_count``). Ids keep
        counting."""
        self._calls.refuse('clear')
        with self._lock:
            self._check_open()
            n = self.count()
            uses = None if self._uses is None else self._uses.counts.copy()
            if uses is not None:  # nothing will be stored: every use count restarts (first: a call stopped before
                self._uses.reset(slice(None))  # the table cleared -- a Ctrl-C -- keeps no count of an empty slot)
            try:
                removed = self._t.clear()  # (a table that fails to clear changes nothing)
            except Exception:
                if uses is not None:
                    self._uses.counts[:] = uses
                raise
            self._counters['remove_count'] += n  # (a table deriving its own count overrides this one)
            failed = self._tell('rebuild')
            self._evicted(removed)
            if failed is not None:
                raise failed

    def stats(self) -> Dict[str, float]:
        """A flat dict of numbers: ``count``, ``replay_buffer_size``, counters, the limiter's counts and what the
        table reports (priorities, rewards, chunks, ...)."""
        with self._lock:
            out = {
                'count': self.count(),
                'replay_buffer_size': self.replay_buffer_size,
                **self._all_counters(),
                'thruput_push': self._limiter.thruput.push_count,
                'thruput_sample': self._limiter.thruput.sample_count,
            }
            return self._t.stats(out)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """A deep copy of the full state (data, counters, ids, RNG); never live references."""
        with self._lock:
            if self._reseed_due:  # (a forked child's new seed, taken by whichever comes first: this or a draw)
                self._reseed()
            marked = self._calls.mark('state_dict')  # (copies run the user's code)
            try:
                return {
                    'type': self.__class__.__name__,
                    **self._t.state(self._engine_state()),
                    'rng': copy.deepcopy(self._rng.bit_generator.state),
                }
            finally:
                self._calls.unmark(marked)

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """
        Overview:
            Restore a ``state_dict()`` (all or nothing: invalid states raise ``ValueError`` and change nothing).
            ``{'data': [...]}`` alone pushes the items, as DI-engine does. ``deepcopy=True`` (DI-engine's
            argument) restores from a deep copy, so the buffer shares no object with ``state``.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        check_deepcopy(deepcopy)
        self._check_open()  # close() released the storage (memmap files): a closed buffer takes no data
        self._calls.refuse('load_state_dict')
        if deepcopy:
            state = copy.deepcopy(dict(state))
        items = short_form(state)
        if items is not None:
            self.push(items)
            return
        self._check_made_here(state)
        if self._remover is not None:  # (a stored item whose file cannot be named fails the push that evicts it)
            _check_tracked(state)
        rng = restored_rng(state)
        with self._lock:
            self._check_open()
            try:
                restored = self._t.restore(dict(state))
                swap = self._engine_restored(restored)
            except (KeyError, TypeError, IndexError, AttributeError, OverflowError, MemoryError, RuntimeError) as e:
                # a malformed state (missing entry, wrong type; sizes no memory holds; tensors torch will not read
                # back, e.g. one that requires grad) is bad input, reported like the others
                refuse_meta(state, lists=True)  # (a tensor column without values: named)
                raise ValueError(f"invalid {self.__class__.__name__} state: {type(e).__name__}: {e}") from e
            before = self._all_counters() if self._periodic is not None else None
            restored.swap()  # the table's part (it may still fail, e.g. a full disk, with nothing changed)
            self._write_one = self._t.write_one  # the hot path may be bound to the replaced storage (no call before
            swap()  # this line: a Ctrl-C may land at a call's start, and a push must never reach the old storage)
            if before is not None:  # the periodic report counts what the buffer did, not what a load replaced
                after = self._all_counters()
                for key in self._load_shift:
                    self._load_shift[key] += before[key] - after[key]
            self._rng, self._reseed_due = rng, False  # (a forked child's loaded RNG is what it draws from)
            self._cfg = self._t.cfg  # the table may restore saved settings (GFlowNet's ranking and sampling keys)
            failed = self._tell('rebuild')
            if self._remover is not None:  # the restored items' files are theirs, whatever a sample used up before
                self._remover.keep(state['storage'].get('items') or ())
            if self._limiter.waiting:
                self._limiter.on_push(0)  # samplers waiting for data see the restored elements
            if failed is not None:
                raise failed

    def _check_made_here(self, state: Mapping) -> None:
        """``ValueError`` unless ``state`` is a state of this buffer type: its ``type``, and no key its table does not
        write (a damaged or edited name must not load as a missing entry)."""
        check_state_type(state, self.__class__.__name__)
        if self._t.state_keys:  # (a table that declares none is not checked)
            refuse_unknown(state, self._t.state_keys | {'type', 'rng'}, 'state')
        refuse_meta(state)

    def _engine_state(self) -> Dict[str, Any]:
        out = {'counters': self._all_counters(), 'thruput': self._limiter.state_dict(), 'envstep': self._last_envstep}
        taken = 0 if self._periodic is None else self._periodic.steps_taken()
        if taken:  # the ``_sec`` scalars' x-axis goes on after a load
            out['thruput']['periods'] = taken
        if self._uses is not None:
            out['use'] = self._uses.state_dict(self._t.live(np.arange(len(self._uses.counts))))
        return out

    def _engine_restored(self, restored: Restored) -> Callable[[], None]:
        """Validate the engine's part of a restored state; return the function that swaps it in. Old files (written
        before a preset had counters) load with ``required=False``: counters start at 0."""
        state, valid, required = restored.engine, restored.valid, restored.required
        if not isinstance(state, Mapping):
            raise ValueError(f"state has an invalid engine entry of type {type(state).__name__}")
        for key in ('counters', 'thruput'):
            if required and key not in state:
                raise ValueError(f"state has no '{key}' entry")
        saved = state.get('counters')
        counters = dict.fromkeys(self._counters, 0)
        if saved is not None:
            if not isinstance(saved, Mapping):
                raise ValueError(f"saved 'counters' must be a dict, got {type(saved).__name__}")
            # a state of this type with other rules loads: their counters (of registered rules) are not this buffer's
            refuse_unknown(saved, counters.keys() | {k for k in saved if _rule_counter(k)}, "saved 'counters'")
            for k in counters:
                if k in COUNTERS or k in saved:
                    counters[k] = saved_count(saved[k], f"saved counters['{k}']")
        thruput = self._limiter.restored(state['thruput']) if 'thruput' in state else None
        periods = state['thruput'].get('periods') if thruput is not None else None
        if periods is not None and not saved_count(periods, "saved thruput['periods']") < STEP_LIMIT:
            raise ValueError(f"saved thruput['periods'] must be below {STEP_LIMIT}, got {periods}")
        try:  # the env step of the last push taken: the x-axis of the ``_step`` scalars (older files: none yet)
            envstep = check_step(state.get('envstep', -1), "saved 'envstep'")
        except TypeError as e:
            raise ValueError(str(e)) from None
        uses = restored.uses
        if self._uses is not None and uses is None:
            uses = self._uses.restored(state['use'], valid) if 'use' in state else UseCounts(len(self._uses.counts))

        def swap() -> None:
            self._counters = counters
            self._last_envstep = envstep
            if thruput is not None:
                self._limiter.swap(thruput)
            if self._periodic is not None:  # (an older state, or one of a buffer without a monitor: from 0)
                self._periodic.go_on_from(int(periods or 0))
            if self._uses is not None:
                self._uses.counts = uses.counts  # in place: the table reads the same object

        return swap

    def save_data(self, path: str) -> None:
        """Atomically write the whole buffer (data, counters, ids) to ``path`` (temporary file + rename)."""
        state = self.state_dict()
        save_state(path, self.__class__.__name__, state)

    def load_data(self, path: str, allow_pickle: bool = False) -> None:
        """
        Overview:
            Restore a file written by ``save_data``. Tensor storage loads with ``weights_only=True``; list
            storage holding arbitrary objects needs ``allow_pickle=True`` (it can execute code: trust the file).
            A corrupt, truncated or foreign file raises ``ValueError`` (one that does not fit in memory
            ``MemoryError``) and leaves the buffer unchanged.
        """
        state = self.read_data(path, allow_pickle)
        with restoring(path):
            self.load_state_dict(state)

    def read_data(self, path: str, allow_pickle: bool = False) -> Dict[str, Any]:
        """The state a file of ``save_data`` holds, read and checked as ``load_data`` reads it; nothing changes."""
        return load_state(path, self.__class__.__name__, allow_pickle=allow_pickle, allowed=self._t.file_globals())

    # ------------------------------------------------------------------ lifecycle
    def _verb(self, verb: Callable[..., Any], *args: Any) -> Any:
        """A table verb of the preset's own that changes the table: refused once the buffer is closed, run under
        the lock."""
        with self._lock:
            self._check_open()
            return verb(*args)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"buffer '{self._instance_name}' is closed")

    def start(self) -> None:
        with self._lock:  # (one thread of each kind, however many calls race; none once close() began)
            self._check_open()
            if self._remover is not None:
                self._remover.start()
            if self._periodic is not None:
                self._periodic.start()

    def close(self) -> None:
        """Wake waiting samplers (they raise), stop the monitor thread, flush TensorBoard (close it only if the
        buffer created it), stop the used-data remover (tracked files still queued are deleted). Idempotent;
        stored data stays readable through ``state_dict``."""
        with self._lock:  # a call that passed its own check before this one finishes first; later ones refuse
            if self._closed:
                return
            self._closed = True
            self._limiter.wake()
        failed: Optional[BaseException] = None
        for part in (self._remover, self._periodic, self._tb):  # (the tb sink flushes; closes only its own writer)
            try:
                if part is not None:
                    part.close()
            except Exception as e:  # the other parts still close, and the table is still released
                failed = failed or e
        with self._lock:  # (a read of the data in another thread finishes first)
            self._t.release()
        if failed is not None:
            raise failed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(instance_name={self._instance_name!r}, {self._t.describe()})"


__all__ = ['Engine', 'COUNTERS', 'parts_config', 'parts_checks', 'table_attribute']

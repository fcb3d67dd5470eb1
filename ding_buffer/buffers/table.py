"""``Table``: what a preset's table offers the engine -- where its elements live and the type's verbs.

A table holds the data (a slot storage, an episode store, reward-ranked items, chunks of fragments) and answers the
engine's calls; it never calls the engine, which owns it. The engine writes the order of every call once
(``buffers.engine``) and asks the table: ``build`` (storage sized from the config; answers the ``Needs`` the engine
builds its parts from), ``attach`` (the ``Parts`` the table reads: use counts, the monitors' writers),
``prepare`` / ``prepare_batch`` (validate everything, change nothing: a ``Write``), ``write`` (commit it: a
``Written`` the engine counts), ``write_one`` / ``write_batch`` (the hot paths), ``discard`` / ``select`` (a write
the limiter or a capacity rule refused whole or in part), ``request`` (a sample's arguments checked, answered as a
``Request`` whose ``draw`` answers a ``Drawn``), ``drop``, ``update``, ``clear``, ``state`` / ``restore`` (validate
everything, answer a ``Restored`` whose ``swap`` the engine runs) and the read verbs the parts see through the
``TableView`` (``count``, ``oldest``, ``ordered_slots``, ``live``, ``columns``).

This base class holds the defaults every table shares; a table overrides what differs. A table never imports a
preset or the engine.
"""

import random
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, NamedTuple, Optional, Tuple, Union

import numpy as np

from ..control.samplers import PythonRandomSampler, UniformSampler, check_positions
from ..monitor.tb import emit
from .common import has_none
from .view import TableView


class Needs(NamedTuple):
    """What a table's ``build`` asks the engine to build around it."""

    slots: int  # the use-count column's length (0: the table grows it with ``UseCounts.resize``)
    rules: Optional[List[Any]] = None  # removal rules (None: the config's max_use, max_staleness, removers)
    limiter: Optional[Mapping] = None  # the rate limiter's section (None: the config's thruput_controller)
    monitors: bool = True  # a TensorBoard sink (the borrowed writer, or an owned one with ``tensorboard``)
    tensorboard: bool = False  # the buffer writes TensorBoard files of its own
    period: Optional[float] = None  # seconds between periodic push / sample / remove reports (None: none)


class Parts(NamedTuple):
    """The engine's parts a table reads, lent once they are built (``Table.attach``); never the engine itself."""

    uses: Any  # ``UseCounts`` (one object for the buffer's life: a restore fills it) or None
    logger: Any  # the buffer's ``logging.Logger``
    tb: Any  # the ``TBSink`` the monitors write to, or None
    tb_logger: Any  # the writer the buffer was given (borrowed), or None
    tracked: bool  # a used-data remover receives the items that leave
    gaps: bool  # removal rules may empty slots in the middle of the insertion order
    use_limit: Any  # the ``max_use`` rule (``UseLimit``: ``spent(use)``), or None
    capacity: bool  # a capacity rule is configured


class Write(NamedTuple):
    """A validated push (``Table.prepare``): ``n`` new elements (``dropped`` more were cut because the push
    exceeds the capacity: the write replaces everything), the table's ``plan``, and the new elements' values of the
    table's admission column (priorities) where it knows them."""

    n: int
    plan: Any
    dropped: int = 0
    values: Optional[np.ndarray] = None


class Written(NamedTuple):
    """What a committed write answers the engine: ``n`` elements accepted (``push_items``, the limiter),
    ``slots`` written (their use counts restart; None: the table's listener restarted them), ``removed`` older
    elements it displaced (``remove_count``), ``evicted`` items that left (for the used-data remover), ``expired``
    slots whose frames the write overwrote (``removed_by_frames``), ``due`` monitor output (written after the
    lock is released)."""

    n: int
    slots: Any = None
    removed: int = 0
    evicted: Any = ()
    expired: Optional[np.ndarray] = None
    due: Any = None


class Restored(NamedTuple):
    """A validated state (``Table.restore``): ``swap()`` puts the table's part in place (it may still raise, e.g.
    a full disk, before changing anything); ``engine`` is the engine's part (counters, thruput, use), ``valid`` the
    slots holding an element (use counts elsewhere must be 0), ``required`` whether those entries must be there
    (files written before a preset had counters load without); ``uses``: the use counts when the table placed them."""

    swap: Callable[[], None]
    engine: Mapping
    valid: Optional[np.ndarray] = None
    required: bool = False
    uses: Any = None


class Drawn(NamedTuple):
    """What a table's draw answers the engine (or a str: why it drew nothing). The engine then counts the draw:
    use counts of ``slots`` (unless the table counted them: ``use``), removal rules, counters of ``size`` drawn
    elements, then ``done(envstep)`` (what the monitors write outside the lock, or None), and returns ``out``
    (deep-copied with ``deepcopy=True`` when ``copy``)."""

    slots: np.ndarray  # the drawn elements' slots: what use counts and removal rules read
    size: int  # elements drawn (counters, rate limiter)
    out: Any  # the batch, gathered before any rule removes what was drawn
    use: Optional[np.ndarray] = None  # use counts after this draw, when the table counted them itself
    done: Optional[Callable[[int], Any]] = None  # after counting: the table's own tallies and monitor record
    copy: bool = False  # the batch holds the stored objects themselves (list storage)


class Request(NamedTuple):
    """A ``sample`` call, its arguments checked by the table (``Table.request``): ``size`` elements (the engine
    checks it is a positive int), ``draw(rng)`` answers a ``Drawn`` or why it drew nothing; ``shortfall()`` says
    why it could not draw now ('' when it could; what a ``timeout`` waits on); ``timeout`` in seconds or None;
    ``finish(batch, use)``, under the lock, makes what the call returns of a drawn batch (``use``: the drawn
    elements' use counts, or None)."""

    size: Any
    draw: Callable[[np.random.Generator], Union[Drawn, str]]
    shortfall: Optional[Callable[[], str]] = None
    timeout: Optional[float] = None
    finish: Optional[Callable[[Any, Any], Any]] = None


class Table:
    uses_counted = False  # whether every element has a use count even without max_use (advanced reports it)
    capacity_rules = False  # whether the table takes a capacity rule (``control.capacity``)
    admission_columns: Tuple[str, ...] = ()  # columns whose values the table knows for elements not yet written
    mutable_columns: Tuple[str, ...] = ()  # columns that change in place (a capacity rule reading one hears of it)
    retires_used = False  # elements that reach max_use stay stored, never drawn again, while a used-data remover runs
    hot_path = False  # whether ``write_one`` / ``write_batch`` may write without ``prepare``
    state_keys: FrozenSet[str] = frozenset()  # the top-level keys ``state`` writes (any other one is refused)

    def __init__(self, cfg: Any, name: str, lock: Any) -> None:
        self.cfg = cfg  # the buffer's validated config (an EasyDict); a restore may replace it (``Engine.cfg``)
        self.name = name  # what errors and TensorBoard tags name the buffer by
        self.lock = lock  # the buffer's lock, for the table's own verbs (the engine takes it around its calls)
        self.parts: Optional[Parts] = None

    def build(self) -> Needs:
        """Build the storage; answer what the engine builds around it."""
        raise NotImplementedError

    def attach(self, parts: Parts) -> None:
        """The engine's parts, built from ``build``'s ``Needs``."""
        self.parts = parts

    # ------------------------------------------------------------------ what the parts read
    @property
    def store(self) -> Any:
        """The object holding the elements: offers ``ring``, ``oldest(k)``, ``collect_iter(slots)``, ``live(slots)``
        and ``release()``."""
        raise NotImplementedError

    def capacity(self) -> int:
        return self.cfg.replay_buffer_size

    def count(self) -> int:
        return self.store.ring.count

    def oldest(self, k: int) -> np.ndarray:
        return self.store.oldest(k)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return self.store.collect_iter(slots)

    def live(self, slots: np.ndarray) -> np.ndarray:
        return self.store.live(slots)

    def ordered_slots(self) -> np.ndarray:
        return self.store.ring.ordered_slots()

    def next_id(self) -> int:
        return self.store.ring.next_uid

    def columns(self) -> Dict[str, Callable[[np.ndarray], np.ndarray]]:
        """The table's named per-slot columns: ``collect_iter``, ``use`` (where draws are counted) and ``id`` (where
        a slot index names ids); a table adds its own (``priority``)."""
        out = {'collect_iter': self.collect_iter}
        uses = self.parts.uses
        if uses is not None:
            out['use'] = uses.__getitem__
        if hasattr(self.store, 'ring'):
            out['id'] = lambda slots: self.store.ring.uids(slots)
        return out

    def expires(self) -> bool:
        """Whether writes may expire older elements by themselves (``storage.frames``: ``removed_by_frames``)."""
        return False

    def units(self) -> int:
        """What ``sample_min_limit_ratio`` compares with the batch size: the stored elements."""
        return self.count()

    def derived(self) -> Dict[str, int]:
        """Counters the table knows better than a tally (overlaid on the engine's wherever they are read)."""
        return {}

    def new_values(self, column: str, priorities: Optional[np.ndarray], n: int) -> np.ndarray:
        """Column ``column`` of ``n`` elements about to be written (``admission_columns``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ removal
    def drop(self, slots: np.ndarray) -> List[Any]:
        """Remove the elements at ``slots``; return the removed items (for the used-data remover)."""
        raise NotImplementedError

    def retire(self, slots: np.ndarray) -> None:
        """Elements that reached ``max_use`` while a used-data remover runs (``retires_used``): never drawn again."""
        raise NotImplementedError

    # ------------------------------------------------------------------ push / sample / update
    def check_pushed(self, items: List[Any]) -> None:
        """Refuse what no pushed list may hold (``None``), before anything changes; a table that checks fields of
        the items at push does it here too, in the same pass (a single item is checked by the engine)."""
        if has_none(items):
            raise TypeError(f"cannot push None (item {next(i for i, x in enumerate(items) if x is None)})")

    def prepare(self, items: List[Any]) -> Write:
        """Validate ``items`` (raising before anything changes); the ``Write`` that commits them."""
        raise NotImplementedError

    def prepare_batch(self, batch: Any) -> Write:
        """Validate a batch dict (``push(batched=True)``) as ``prepare``."""
        raise TypeError(f"buffer '{self.name}' takes no batched push")

    def write(self, w: Write, report_evicted: bool) -> Written:
        """Commit a validated write (``report_evicted``: list the items that left, for the used-data remover)."""
        raise NotImplementedError

    def write_one(self, item: Any) -> Optional[int]:
        """The single-push hot path: the slot written, or None -- nothing changed -- when the item needs the
        checking path (``prepare``)."""
        return None

    def write_batch(self, batch: Any) -> Optional[np.ndarray]:
        """The batched hot path: the slots written, or None -- nothing changed -- as ``write_one``."""
        return None

    def discard(self, w: Write) -> Optional[np.ndarray]:
        """A validated write refused whole (rate limiter, capacity rule): slots the storage expired settling it."""
        return None

    def select(self, w: Write, admitted: np.ndarray) -> Write:
        """The part of ``w`` a capacity rule admitted (a bool mask over its new elements, some True)."""
        raise NotImplementedError

    def request(self, size: Any, **kwargs: Any) -> Request:
        """A sample of ``size`` elements: its arguments checked (raising before anything changes)."""
        raise NotImplementedError

    def update(self, info: Any) -> Any:
        """``info`` checked (raising before anything changes), answered with the call's result, or with what to
        apply under the engine's lock: ``apply(spent) -> (applied, total)`` or None (see ``Engine.update``).
        Tables without per-element priorities: a no-op returning ``{'updated': 0, 'stale': 0}``."""
        return {'updated': 0, 'stale': 0}

    def use_sampler(self, sampler: Any) -> None:
        """Draw with ``sampler`` (``control.samplers``): one answering ``draw(rng, m, size, replace)`` from a count,
        or ``select(rng, view, slots, size, replace)`` from the candidates' columns (a column-weighted sampler)."""
        self.sampler = sampler
        self.own_sampler = type(sampler) not in (UniformSampler, PythonRandomSampler)  # a user's: answers checked
        self.selects = callable(getattr(sampler, 'select', None))

    def positions(
        self,
        rng: np.random.Generator,
        m: int,
        size: int,
        replace: bool,
        slots: Optional[Callable[[], np.ndarray]] = None,
    ) -> Union[np.ndarray, str]:
        """``size`` positions in ``[0, m)`` from the table's ``sampler``, or why not when it refuses. A selecting
        sampler reads the table's view at the candidates' slots (``slots()``: the ``m`` candidates, in the order
        positions count them). A user sampler's answer (``own_sampler``) is checked before anything reads it
        (``check_positions``: a ``RuntimeError`` naming it, nothing changed)."""
        if self.selects:
            # (a copy: the draw reads the candidates after the sampler, which may use its own as it likes)
            idx = self.sampler.select(rng, TableView(self), slots().copy(), size, replace)
        else:
            idx = self.sampler.draw(rng, m, size, replace)
        if idx is None:
            return f"sampler {self.cfg.sampler.get('type')!r} refused"
        return check_positions(idx, m, size, self.cfg.sampler.get('type')) if self.own_sampler else idx

    def snapshot(self, python_random: bool) -> Any:
        """What a draw changes besides the RNG and use counts (restored when the draw fails): with
        ``python_random``, Python's global ``random`` state, when the sampler draws from it (DI-engine's deque)."""
        if python_random and type(getattr(self, 'sampler', None)) is PythonRandomSampler:
            return random.getstate()
        return None

    def restore_snapshot(self, snapshot: Any) -> None:
        """Undo a failed draw (``snapshot``'s answer from before it)."""
        if snapshot is not None:
            random.setstate(snapshot)

    def wait_what(self, size: int) -> str:
        """What a ``sample(timeout=)`` that timed out could not do (the ``SampleTimeoutError`` message)."""
        return f"buffer '{self.name}' could not sample {size} items"

    def tensordict_out(self) -> bool:
        """Whether samples leave as TensorDicts (the storage first stored one; ``tensordict_io``)."""
        return False

    def file_globals(self) -> tuple:
        """The classes this table's files may name besides tensors (``load_data`` without ``allow_pickle``)."""
        return ()

    def device(self) -> Any:
        """The device of sampled tensors (the TensorDict's ``device``)."""
        return None

    def items_out(self) -> bool:
        """Whether a batched sample leaves as per-item dicts (``storage.output='items'`` on tensor storage)."""
        return False

    def emit(self, due: Any) -> None:
        """Write what the monitors computed under the lock (called after it is released)."""
        emit(due, self.parts.logger, self.parts.tb)

    # ------------------------------------------------------------------ stats / state / lifecycle
    def stats(self, out: Dict[str, float]) -> Dict[str, float]:
        """The engine's numbers plus the table's own."""
        return out

    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        """The table's state, holding ``engine`` (the engine's counters, thruput and use counts) where its file
        layout keeps them."""
        raise NotImplementedError

    def restore(self, state: Dict[str, Any]) -> Restored:
        """Validate ``state`` fully (raising with nothing changed); the ``Restored`` whose ``swap`` puts it in."""
        raise NotImplementedError

    def clear(self) -> List[Any]:
        """Remove every element; return the removed items (for the used-data remover)."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the table holds outside the process (memmap files: working memory, not a save)."""
        self.store.release()

    def describe(self) -> str:
        """The ``repr`` of the buffer after its instance name."""
        return f"count={self.count()}, replay_buffer_size={self.capacity()}"


__all__ = ['Drawn', 'Needs', 'Parts', 'Request', 'Restored', 'Table', 'Write', 'Written']

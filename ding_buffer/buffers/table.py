"""``Table``: what a preset's table offers the engine -- where its elements live and the type's verbs.

A table holds the data (a slot storage, an episode store, reward-ranked items, chunks of fragments) and answers the
engine's calls: ``build`` (storage and parts sized from the config), ``push_items`` / ``push_batch`` (validate
everything first, then write; the engine's ``_admit`` / ``_pushed`` / ``_remove`` count and limit), ``request``
(a sample's arguments checked, answered as a ``Request``: the engine runs removers, limits and waits, then the
request's ``draw``, whose ``Drawn`` it counts), ``update``, ``clear``, ``state`` / ``restore`` (validate
everything, then swap) and the read verbs the parts see through the ``TableView`` (``count``, ``oldest``,
``ordered_slots``, ``live``, ``columns``).

This base class holds the defaults every table shares; a table overrides what differs. It reaches its engine's
services (config, lock-protected counters, parts) through ``self.e``, a weak proxy: the engine owns its table,
so a buffer nobody refers to is freed at once (its monitor thread stops, its memory returns) without waiting for
the cyclic garbage collector. A table never imports a preset.
"""

import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from ..control.samplers import check_positions
from ..monitor.tb import emit
from .common import has_none


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
    ``finish(batch)``, under the lock, makes what the call returns of a drawn batch."""

    size: Any
    draw: Callable[[np.random.Generator], Union[Drawn, str]]
    shortfall: Optional[Callable[[], str]] = None
    timeout: Optional[float] = None
    finish: Optional[Callable[[Any], Any]] = None


class Table:
    uses_counted = False  # whether every element has a use count even without max_use (advanced reports it)
    capacity_rules = False  # whether the table takes a capacity rule (``control.capacity``)
    admission_columns: Tuple[str, ...] = ()  # columns whose values the table knows for elements not yet written

    def __init__(self, engine: Any, cfg: Any) -> None:
        self.e = weakref.proxy(engine)
        self.cfg = cfg  # the buffer's validated config (an EasyDict); a restore may replace it (``Engine.cfg``)
        self.name = engine.instance_name  # what errors and TensorBoard tags name the buffer by

    def build(self) -> None:
        """Build the storage and the engine's parts (``e._build_engine``, ``e._build_monitors``)."""
        raise NotImplementedError

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
        e = self.e
        out = {'collect_iter': lambda slots: e.collect_iter(slots)}
        if e._uses is not None:
            out['use'] = lambda slots: e._uses[slots]
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

    def drop_used(self, slots: np.ndarray) -> None:
        """Elements that reached ``max_use``: removed (advanced with used-data tracking retires them instead)."""
        self.e._remove(slots, 'removed_by_use')

    # ------------------------------------------------------------------ push / sample / update
    def check_pushed(self, items: List[Any]) -> None:
        """Refuse what no pushed list may hold (``None``), before anything changes; a table that checks fields of
        the items at push does it here too, in the same pass (a single item is checked by ``push_items``)."""
        if has_none(items):
            raise TypeError(f"cannot push None (item {next(i for i, x in enumerate(items) if x is None)})")

    def push_items(self, items: List[Any]) -> int:
        raise NotImplementedError

    def push_batch(self, batch: Any) -> int:
        raise NotImplementedError

    def request(self, size: Any, **kwargs: Any) -> Request:
        """A sample of ``size`` elements: its arguments checked (raising before anything changes)."""
        raise NotImplementedError

    def update(self, info: Any) -> Any:
        """``info`` checked (raising before anything changes), answered with the call's result, or with what to
        apply under the engine's lock: ``apply(spent) -> (applied, total)`` or None (see ``Engine.update``).
        Tables without per-element priorities: a no-op returning ``{'updated': 0, 'stale': 0}``."""
        return {'updated': 0, 'stale': 0}

    def positions(self, rng: np.random.Generator, m: int, size: int, replace: bool) -> Union[np.ndarray, str]:
        """``size`` positions in ``[0, m)`` from the table's ``sampler`` (slot and episode tables), or why not when
        it refuses. A user sampler's answer (``own_sampler``) is checked before anything reads it
        (``check_positions``: a ``RuntimeError`` naming it, nothing changed)."""
        idx = self.sampler.draw(rng, m, size, replace)
        if idx is None:
            return f"sampler {self.cfg.sampler.get('type')!r} refused"
        return check_positions(idx, m, size, self.cfg.sampler.get('type')) if self.own_sampler else idx

    def snapshot(self) -> Any:
        """What a draw changes besides the RNG and use counts (restored when a user's rule fails the draw)."""
        return None

    def restore_snapshot(self, snapshot: Any) -> None:
        """Undo a failed draw (``snapshot``'s answer from before it)."""

    def wait_what(self, size: int) -> str:
        """What a ``sample(timeout=)`` that timed out could not do (the ``SampleTimeoutError`` message)."""
        return f"buffer '{self.name}' could not sample {size} items"

    def tensordict_out(self) -> bool:
        """Whether samples leave as TensorDicts (the storage first stored one; ``tensordict_io``)."""
        return False

    def device(self) -> Any:
        """The device of sampled tensors (the TensorDict's ``device``)."""
        return None

    def items_out(self) -> bool:
        """Whether a batched sample leaves as per-item dicts (``storage.output='items'`` on tensor storage)."""
        return False

    def emit(self, due: Any) -> None:
        """Write what the monitors computed under the lock (called after it is released)."""
        emit(due, self.e._logger, self.e._tb)

    # ------------------------------------------------------------------ stats / state / lifecycle
    def stats(self, out: Dict[str, float]) -> Dict[str, float]:
        """The engine's numbers plus the table's own."""
        return out

    def state(self) -> Dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: Dict[str, Any]) -> None:
        """Validate ``state`` fully, then swap it in (all or nothing)."""
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


__all__ = ['Drawn', 'Request', 'Table']

"""Capacity rules: which stored elements leave when a write needs room -- Reverb's remover selectors (FIFO, LIFO,
MinHeap) and TorchRL's max-value writer, configured like any remover::

    removers=[dict(type='min_priority')]                   # evict the lowest priority first (advanced)
    removers=[dict(type='keep_best', column='priority')]   # keep the best `capacity` items by a column

A buffer takes at most one capacity rule; without one it evicts the oldest (FIFO, the ring). With one, its table
reuses any freed slot (``storage.free_list.FreeListIndex``), and the engine asks the rule, before a write that
exceeds the capacity, which stored elements leave; ``keep_best`` may also refuse a new element that is worse than
every stored one (TorchRL's writer skips it the same way). A single push of more elements than the capacity keeps
its newest ``capacity`` elements and nothing stored, whatever the rule (as on every table). Types: ``naive``,
``elastic`` (FIFO / LIFO) and ``advanced`` (also by priority). A rule reads its column through the table's read-only
view (``TableView``); a table without that column is refused by name at construction.

Ordering: the lowest value first, ties broken by age (the oldest first), as Reverb's heap selector. The rules keep
a heap of ``(value, id, slot)`` entries, told about every write and value change (``on_written``,
``on_changed``); entries of items that left or changed are skipped when they reach the top (lazy deletion), and
the heap is rebuilt from the table when stale entries outnumber the live ones. O(log n) per write or change.

Not thread-safe: the buffer's lock serialises every call.
"""

import heapq
from typing import Any, List, Mapping, Optional, Tuple

import numpy as np

from ..storage.free_list import FreeListIndex
from ..storage.ring import RingIndex
from .limits import _EMPTY, REMOVER_REGISTRY, Remover


class CapacityRule(Remover):
    """
    Overview:
        The interface of a capacity rule (a ``Remover`` the table asks for room). ``column`` names the column it
        reads (``None``: none). ``evict(view, n)`` answers ``n`` distinct stored slots to free; ``admits(view,
        value)`` says whether a new element with ``value`` (of ``column``) may replace the worst stored one when
        the table is full. The ``on_*`` verbs keep a rule's own structure in step with the table. A rule is
        counted (``removed_by_<name>``, ``refused_by_<name>``) and named in errors under the type it is registered
        and configured as, unless its class declares a ``name`` of its own (``limits.build_remover``).
    """

    column: Optional[str] = None

    # whether the rule may refuse new elements (it then reads their ``column`` values before they are written)
    admission = False

    def evict(self, view: Any, n: int) -> np.ndarray:
        raise NotImplementedError

    def plan(self, view: Any, values: Optional[np.ndarray], need: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """A write of new elements (``values``: their ``column`` values, oldest first; ``None`` without
        admission) finds ``need`` slots short: ``(stored slots to free, mask of the new elements that enter)``
        (``None``: all). By default the ``need`` slots ``evict`` names leave and every new element enters."""
        return self.evict(view, need), None

    def rebuild(self, view: Any) -> None:
        """Rebuild from the table (after a load or a restore)."""

    def on_written(self, view: Any, slots: np.ndarray) -> None:
        """Elements just stored at ``slots``."""

    def on_changed(self, view: Any, slots: np.ndarray) -> None:
        """The column changed at ``slots`` (e.g. new priorities)."""


@REMOVER_REGISTRY.register('fifo')
class OldestFirst(CapacityRule):
    """Evict the oldest (the default, what the ring does; named for configs that want to say so).

    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive', replay_buffer_size=3, removers=[dict(type='fifo')]))
        >>> buf.push([{'obs': i} for i in range(3)]), buf.push([{'obs': 3}, {'obs': 4}])
        (3, 2)
        >>> sorted(d['obs'] for d in buf.sample(3)), buf.stats()['removed_by_fifo']
        ([2, 3, 4], 2)
        >>> buf.close()
    """

    name = 'fifo'

    def evict(self, view: Any, n: int) -> np.ndarray:
        return view.oldest(n)


@REMOVER_REGISTRY.register('lifo')
class NewestFirst(CapacityRule):
    """Evict the newest (Reverb's LIFO remover): a full buffer keeps its first items and cycles the last slot.

    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive', replay_buffer_size=3, removers=[dict(type='lifo')]))
        >>> buf.push([{'obs': i} for i in range(3)])
        3
        >>> buf.push({'obs': 3}), buf.push({'obs': 4})
        (1, 1)
        >>> sorted(d['obs'] for d in buf.sample(3))
        [0, 1, 4]
        >>> buf.close()
    """

    name = 'lifo'

    def evict(self, view: Any, n: int) -> np.ndarray:
        return view.newest(n)


class _ByColumn(CapacityRule):
    """The lowest value of ``column`` first, ties by age: a lazy heap of ``(value, id, slot)``."""

    def __init__(self, column: str) -> None:
        self.column = column
        self._heap: List[Tuple[float, int, int]] = []

    def _entries(self, view: Any, slots: np.ndarray) -> List[Tuple[float, int, int]]:
        values = view.column(self.column, slots).tolist()
        return list(zip(values, view.column('id', slots).tolist(), np.asarray(slots).tolist()))

    def _push(self, view: Any, slots: np.ndarray) -> None:
        if not len(slots):
            return
        for entry in self._entries(view, slots):
            heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * view.count() + 64:
            self.rebuild(view)

    def rebuild(self, view: Any) -> None:
        self._heap = self._entries(view, view.ordered_slots())
        heapq.heapify(self._heap)

    def on_written(self, view: Any, slots: np.ndarray) -> None:
        self._push(view, slots)

    def on_changed(self, view: Any, slots: np.ndarray) -> None:
        self._push(view, np.unique(np.asarray(slots, dtype=np.int64)))

    def _current(self, view: Any, entry: Tuple[float, int, int]) -> bool:
        value, uid, slot = entry
        s = np.array([slot], dtype=np.int64)
        return bool(view.live(s)[0]) and int(view.column('id', s)[0]) == uid and view.column(self.column, s)[0] == value

    def _lowest(self, view: Any, n: int) -> List[Tuple[float, int, int]]:
        """The ``n`` lowest current entries, lowest first (popped; the caller pushes back what stays)."""
        out = []
        heap = self._heap
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            if self._current(view, entry) and all(entry[2] != e[2] for e in out):
                out.append(entry)
        return out

    def evict(self, view: Any, n: int) -> np.ndarray:
        chosen = self._lowest(view, n)
        return np.asarray([e[2] for e in chosen], dtype=np.int64) if chosen else _EMPTY


@REMOVER_REGISTRY.register('min_priority')
class LowestPriorityFirst(_ByColumn):
    """Evict the lowest priority first (the oldest among equal ones): Reverb's MinHeap remover. Needs a table
    with priorities (``advanced``).

    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='advanced', replay_buffer_size=3, removers=[dict(type='min_priority')]))
        >>> buf.push([{'obs': 0, 'priority': 5.0}, {'obs': 1, 'priority': 0.5}, {'obs': 2, 'priority': 3.0}])
        3
        >>> buf.push({'obs': 3, 'priority': 4.0})  # full: obs 1 (priority 0.5) leaves, not obs 0 (the oldest)
        1
        >>> sorted({d['obs'] for _ in range(20) for d in buf.sample(3)}), buf.stats()['removed_by_min_priority']
        ([0, 2, 3], 1)
        >>> buf.close()
    """

    name = 'min_priority'

    def __init__(self) -> None:
        super().__init__('priority')


@REMOVER_REGISTRY.register('keep_best')
class KeepBest(_ByColumn):
    """Keep the best ``capacity`` elements by ``column``: when the table is full a new element replaces the
    lowest stored one if its value is at least that low value, and is refused otherwise (TorchRL's
    ``TensorDictMaxValueWriter``); ties among the stored go by age (the oldest leaves first).

    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(
        ...     dict(type='advanced', replay_buffer_size=2, removers=[dict(type='keep_best', column='priority')])
        ... )
        >>> buf.push([{'obs': 0, 'priority': 5.0}, {'obs': 1, 'priority': 2.0}])
        2
        >>> buf.push({'obs': 2, 'priority': 1.0}), buf.push({'obs': 3, 'priority': 9.0})  # 1.0 < 2.0: refused
        (0, 1)
        >>> sorted({d['obs'] for _ in range(20) for d in buf.sample(2)}), buf.stats()['refused_by_keep_best']
        ([0, 3], 1)
        >>> buf.close()
    """

    name = 'keep_best'
    admission = True
    checks = {'column': (lambda x: isinstance(x, str) and len(x) > 0, 'a column name (str)')}

    def __init__(self, column: str = 'priority') -> None:
        super().__init__(column)

    def plan(self, view: Any, values: Optional[np.ndarray], need: int) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        """Of the stored elements and the new ones (newer than every stored one, in order), the ``need`` lowest
        by ``(value, id)`` do not stay: stored ones leave, new ones are refused. The same items stay as when the
        new elements are written one by one, each replacing the lowest stored one when it is at least as high; the
        counters differ (a new element that one-by-one writing would store and then evict within the same push is
        counted as refused here, never as removed)."""
        lowest = self._lowest(view, need)  # the need lowest stored, lowest first
        first_new = view.next_id
        candidates = [(v, u, s, True) for v, u, s in lowest]
        candidates += [(float(v), first_new + i, i, False) for i, v in enumerate(np.asarray(values).tolist())]
        candidates.sort(key=lambda c: (c[0], c[1]))
        out = candidates[:need]
        stays = [c for c in candidates[need:] if c[3]]
        for v, u, s, _ in stays:  # popped, but they stay: back into the heap
            heapq.heappush(self._heap, (v, u, s))
        victims = np.asarray([c[2] for c in out if c[3]], dtype=np.int64)
        admitted = np.ones(len(values), dtype=bool)
        admitted[[c[2] for c in out if not c[3]]] = False
        return victims, admitted


def index_for(cfg: Mapping) -> type:
    """The slot index a table of config ``cfg`` needs: ``FreeListIndex`` when its ``removers`` name a capacity
    rule (it frees slots anywhere), else the FIFO ``RingIndex``."""
    for entry in cfg.get('removers') or []:
        name = entry.get('type') if isinstance(entry, Mapping) else None
        cls = REMOVER_REGISTRY[name] if isinstance(name, str) and name in REMOVER_REGISTRY else None
        if isinstance(cls, type) and issubclass(cls, CapacityRule):
            return FreeListIndex
    return RingIndex


def find_capacity_rule(rules: List[Remover]) -> Optional[CapacityRule]:
    """The capacity rule among ``rules`` (``None`` without one); more than one is a ``ValueError``."""
    found = [r for r in rules if isinstance(r, CapacityRule)]
    if len(found) > 1:
        raise ValueError(
            f"config key 'removers' holds {len(found)} capacity rules ({', '.join(r.name for r in found)}); a "
            f"buffer takes at most one (it decides which element leaves a full table)"
        )
    return found[0] if found else None


__all__ = [
    'CapacityRule',
    'KeepBest',
    'LowestPriorityFirst',
    'NewestFirst',
    'OldestFirst',
    'find_capacity_rule',
    'index_for',
]

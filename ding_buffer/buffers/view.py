"""``TableView``: the read-only face of a buffer's table that parts (removers, capacity rules, samplers) read.

A part never sees the buffer itself: it asks the view for counts, order and per-slot columns, and answers with
slots; the engine alone changes the table. Columns are named: ``collect_iter`` (``NO_ITER`` where an element has
none), ``id`` (the element's unique id, on slot tables), ``use`` (times drawn, where the table counts draws: a
prioritized table, or one with ``max_use``); a preset adds its own (``priority`` on prioritized tables).
``column(name, slots)`` raises a ``KeyError`` naming the columns there are.
"""

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np


class TableView:
    """
    Overview:
        Read-only verbs over a buffer's table: ``count()``, ``capacity``, ``oldest(k)``, ``newest(k)``,
        ``ordered_slots()``, ``live(slots)``, ``collect_iter(slots)``, ``columns`` and ``column(name, slots)``.
    Examples:
        >>> import numpy as np
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='advanced', replay_buffer_size=4))
        >>> buf.push([{'obs': i, 'priority': float(i + 1), 'collect_iter': i} for i in range(3)])
        3
        >>> view = buf.view
        >>> view.count(), view.columns
        (3, ('collect_iter', 'id', 'priority', 'use'))
        >>> slots = view.oldest(3)
        >>> view.column('priority', slots).round(3).tolist(), view.column('id', slots).tolist()
        ([1.0, 2.0, 3.0], [0, 1, 2])
        >>> view.column('reward', slots)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        KeyError: "no column 'reward' in this table; its columns: collect_iter, id, priority, use"
        >>> buf.close()
    """

    def __init__(self, table: Any) -> None:
        self._table = table  # the view forwards to the table's read verbs, never to anything that writes
        self._cached: Optional[Dict[str, Callable[[np.ndarray], np.ndarray]]] = None

    @property
    def _readers(self) -> Dict[str, Callable[[np.ndarray], np.ndarray]]:
        """The table's named columns, read once the engine lent the table its parts (``Table.columns``)."""
        if self._cached is None:
            self._cached = self._table.columns()
        return self._cached

    @property
    def capacity(self) -> int:
        return self._table.capacity()

    @property
    def next_id(self) -> int:
        """The id the next element written will get."""
        return self._table.next_id()

    @property
    def columns(self) -> Tuple[str, ...]:
        return tuple(sorted(self._readers))

    def count(self) -> int:
        return self._table.count()

    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest stored elements' slots, oldest first."""
        return np.asarray(self._table.oldest(k), dtype=np.int64).copy()

    def ordered_slots(self) -> np.ndarray:
        """Every stored element's slot, oldest first."""
        return np.asarray(self._table.ordered_slots(), dtype=np.int64).copy()

    def newest(self, k: int) -> np.ndarray:
        """The ``k`` newest stored elements' slots, newest first."""
        order = self.ordered_slots()
        k = min(max(int(k), 0), len(order))
        return order[len(order) - k :][::-1].copy()

    def live(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` that hold an element."""
        return np.asarray(self._table.live(np.asarray(slots, dtype=np.int64)), dtype=bool)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return self.column('collect_iter', slots)

    def column(self, name: str, slots: np.ndarray) -> np.ndarray:
        """The values of column ``name`` at ``slots`` (a copy)."""
        reader = self._readers.get(name)
        if reader is None:
            raise KeyError(f"no column {name!r} in this table; its columns: {', '.join(self.columns)}")
        return np.array(reader(np.asarray(slots, dtype=np.int64)))

    def has_column(self, name: str) -> bool:
        return name in self._readers


__all__ = ['TableView']

"""``ListStorage``: a slot ring of arbitrary Python objects (DI-engine's list-of-dicts layout).

Output of ``gather``: a ``list`` of the stored objects themselves, in the order of the requested slots
(the buffer copies them when its ``deepcopy`` flag is set). Persistence keeps the objects as they are, so
loading a file that holds anything but tensors, numbers, strings and containers needs ``allow_pickle=True``.
"""

import copy
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from .base import (
    ALL_ABSENT,
    NO_ITER,
    Prepared,
    Storage,
    check_state,
    collect_iter_column,
    collect_iter_of,
    first_bad_collect_iter,
    trim_newest,
)
from .ring import RingIndex
from .tensordict_io import is_tensordict, rows
from .tree import batch_row, batched_leaves, copy_memo

# what ``copy.deepcopy`` raises for an object that cannot be copied: Python's TypeError, torch's NotImplementedError
# (a nested tensor); a RuntimeError (a copy hook calling back into its buffer) comes through as it is
_UNCOPYABLE = (TypeError, NotImplementedError)


def deep_copy(items: Any) -> Any:
    """A deep copy of stored objects (``tree.copy_memo``): tensors inside an autograd graph (a pushed ``x * 2`` of a
    tensor that requires grad: they refuse ``deepcopy``) are copied detached, as tensor storage stores them, and a
    view (a row of a batch) with the bytes it spans, not its whole storage; a tensor subclass that ``deepcopy``
    refuses as its ``clone``."""
    try:
        return copy.deepcopy(items, copy_memo(items, 'graph'))
    except RuntimeError:  # (a tensor subclass deepcopy refuses: copied by its clone)
        memo = copy_memo(items, 'graph', subclasses=True)
        if not any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in memo.values()):
            raise
        return copy.deepcopy(items, memo)


def _copies(x: Any) -> bool:
    try:
        deep_copy(x)
    except _UNCOPYABLE:
        return False
    return True


class ListStorage(Storage):
    """
    Overview:
        ``capacity`` slots of any Python objects; ``gather`` returns the stored objects themselves.
    Examples:
        >>> storage = ListStorage(3)
        >>> res = storage.write(storage.prepare([{'a': i} for i in range(4)]))  # 4 items, 3 slots: the newest stay
        >>> res.slots.tolist(), res.uids.tolist(), len(storage)  # the item with id u lives at slot u % 3
        ([1, 2, 0], [1, 2, 3], 3)
        >>> storage.gather(storage.ring.ordered_slots())  # oldest first
        [{'a': 1}, {'a': 2}, {'a': 3}]
    """

    kind = 'list'

    slot_bytes = 16  # a reference to the item and its collect_iter

    def __init__(self, capacity: int, index_cls: type = RingIndex, item_columns: bool = True) -> None:
        super().__init__(capacity, index_cls)
        # whether the items are the buffer's elements, whose collect_iter this storage reads (False: a store of
        # whole episodes, which reads its own; then items are stored as they are)
        self.item_columns = item_columns
        self._data: List[Any] = [None] * capacity
        # each slot's collect_iter (a sequence's min; NO_ITER without one), read once, when its item is stored
        # (prepare validates and reads it in the same pass): staleness costs one index per sampled item, whatever
        # the items hold (R2D2 keeps one per step), and a stored dict changed later does not change it
        self._ci = np.full(capacity, NO_ITER, dtype=np.int64)
        self._ci_written = False  # whether any item had one (until then the column is NO_ITER throughout)
        self._pending_ci: Optional[np.ndarray] = None

    def prepare(self, items: List[Any]) -> Prepared:
        """Validates every item (``None`` is a ``TypeError``, a bad ``collect_iter`` a ``ValueError`` naming the
        item) and reads their ``collect_iter`` column in the same pass."""
        column = collect_iter_column(items) if self.item_columns else ALL_ABSENT
        kept, dropped = trim_newest(len(items), self.capacity)
        if not dropped and type(items) is list:  # read only until written: the caller's list is not copied
            return Prepared(items, kept, 0, [], False, column)
        if column is not ALL_ABSENT:
            column = column[dropped:]
        return Prepared(list(items[dropped:]), kept, dropped, list(items[:dropped]), False, column)

    def prepare_batch(self, batch: Any) -> Prepared:
        """A batch dict becomes item dicts; a TensorDict ``[B, ...]`` becomes ``B`` TensorDict items. Of a batch
        larger than the storage only the newest ``capacity`` rows become items here: the older ones are never
        stored (every row's ``collect_iter`` is checked; the used-data remover reads the older rows one by one)."""
        if type(batch) is not dict and is_tensordict(batch):
            items = rows(batch)
        else:
            flat, n = batched_leaves(batch)
            items = [batch_row(flat, i) for i in range(max(0, n - self.capacity), n)]
            if n > self.capacity:
                dropped = n - self.capacity
                ci = {p: leaf for p, leaf in flat.items() if p[0] == 'collect_iter'}
                if self.item_columns and ci:  # every row's, as when each row was an item (raises naming it)
                    _check_collect_iters(ci, n)
                older = _Rows(flat, dropped)
                return self.prepare(items)._replace(dropped=dropped, skipped=older)
        if not items:
            raise ValueError("a batched push got a batch of size 0")  # as tensor storage says
        return self.prepare(items)

    def select(self, prepared: Prepared, keep: np.ndarray) -> Prepared:
        """The items of ``prepared`` where ``keep`` (a mask over its kept items) holds, as a new ``Prepared``."""
        payload = [item for item, k in zip(prepared.payload, np.asarray(keep).tolist()) if k]
        column = prepared.meta
        if column is not None and column is not ALL_ABSENT:
            column = column[np.asarray(keep, dtype=bool)]
        return Prepared(payload, len(payload), 0, [], prepared.tensordict, column)

    def write_one(self, item: Any) -> Optional[int]:
        """One item in O(1) scalar work (the single-push hot path). The overwritten item is not reported:
        callers that must see it leave (the used-data remover) use ``prepare`` + ``write``."""
        if (type(item) is dict or isinstance(item, Mapping)) and 'collect_iter' in item:
            return None  # the generic path checks it (and reports a bad one)
        ring = self.ring
        slot = ring.next_slot()  # written before the index counts it (``Storage.write``)
        self._data[slot] = item
        if self._ci_written:
            self._ci[slot] = NO_ITER
        ring.commit_one()
        return slot

    def _reserve(self, prepared: Prepared) -> None:
        column = prepared.meta
        if column is None:  # a Prepared made elsewhere: read (and check) the column now, before anything changes
            column = collect_iter_column(prepared.payload) if self.item_columns else ALL_ABSENT
        self._pending_ci = column

    def _write(self, slots: np.ndarray, payload: List[Any]) -> None:
        """``payload`` at ``slots``, the consecutive run (modulo capacity) the ring committed."""
        column, self._pending_ci = self._pending_ci, None  # read by _reserve, which every write calls first
        data = self._data
        first, n = int(slots[0]), len(payload)
        if column is not ALL_ABSENT:
            self._ci_written = True
        if self.ring.derived_ids and first + n <= len(data):  # a ring's run, no wrap: slice assignments
            data[first : first + n] = payload
            if self._ci_written:
                self._ci[first : first + n] = NO_ITER if column is ALL_ABSENT else column
            return
        if self._ci_written:
            self._ci[slots] = NO_ITER if column is ALL_ABSENT else column
        for slot, item in zip(slots.tolist(), payload):
            data[slot] = item

    def _erase(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        for s in slots.tolist():
            self._data[s] = None
        self._ci[slots] = NO_ITER

    def gather(self, slots: np.ndarray, uids: Optional[np.ndarray] = None) -> List[Any]:
        data = self._data
        return [data[s] for s in np.asarray(slots).tolist()]

    _take = gather  # the items leaving ``slots`` are the stored objects themselves

    def get(self, slot: int) -> Any:
        return self._data[slot]

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        return self._ci[np.asarray(slots, dtype=np.int64)]

    def __repr__(self) -> str:
        return f"ListStorage(capacity={self.capacity}, count={len(self)})"

    def state_dict(self) -> Dict[str, Any]:
        slots = self.ring.ordered_slots()
        items = self.gather(slots)
        try:
            copied = deep_copy(items)
        except _UNCOPYABLE as e:  # an object that cannot be copied (a lock, a generator): name the item holding it
            bad = next((i for i, x in enumerate(items) if not _copies(x)), None)
            raise TypeError(
                f"stored item {bad} (0 = the oldest) cannot be copied into a state or file ({e}); list storage keeps "
                f"the pushed objects themselves: push data that copies (with deepcopy=True such a push is refused)"
            ) from e
        state = {
            'kind': self.kind,
            'ring': self.ring.state_dict(),
            'slots': torch.from_numpy(slots.astype(np.int64)),
            'items': copied,
        }
        if self.item_columns:  # as read when each item was stored (a dict changed since does not change it)
            state['collect_iter'] = torch.from_numpy(self._ci[slots])
        return state

    @classmethod
    def from_state(
        cls, state: Dict[str, Any], capacity: int, index_cls: type = RingIndex, item_columns: bool = True, **kwargs
    ) -> 'ListStorage':
        check_state(state, cls.kind, ('ring', 'slots', 'items'), ('collect_iter',))
        storage = cls(capacity, index_cls, item_columns)
        storage.ring = index_cls.from_state(state['ring'], capacity)
        slots = np.asarray(state['slots'], dtype=np.int64)
        items = state['items']
        if not isinstance(items, list) or len(items) != len(slots):
            got = f'{len(items)} items' if isinstance(items, list) else f'items of type {type(items).__name__}'
            raise ValueError(f"saved storage has {len(slots)} slots but {got}")
        if not np.array_equal(np.sort(slots), np.flatnonzero(storage.ring.valid)):
            raise ValueError("saved storage slots do not match the ring's valid slots")
        items = deep_copy(items)
        if item_columns:
            if 'collect_iter' in state:
                column = saved_collect_iters(state['collect_iter'], len(slots))
            else:  # (a state of an older version: read from the items)
                column = collect_iter_column(items)  # a bad collect_iter refuses the state
            storage._ci[slots] = NO_ITER if column is ALL_ABSENT else column
            storage._ci_written = True
        for slot, item in zip(slots.tolist(), items):
            storage._data[slot] = item
        return storage


def saved_collect_iters(column: Any, n: int) -> np.ndarray:
    """A saved ``collect_iter`` column of ``n`` items, checked: int64, each a whole number within +-2**60 or
    ``NO_ITER`` (none)."""
    tensor = isinstance(column, torch.Tensor)
    if not tensor or column.dtype != torch.int64 or tuple(column.shape) != (n,) or column.is_meta or column.is_sparse:
        what = (
            f"{column.dtype} {column.layout} tensor of shape {tuple(column.shape)} on {column.device}"
            if tensor
            else column
        )
        raise ValueError(
            f"saved list storage 'collect_iter' must be a dense int64 tensor of shape ({n},), got {what!r:.120}"
        )
    values = column.detach().cpu().resolve_neg().numpy().copy()
    bad = (values != NO_ITER) & ((values <= -(2**60)) | (values >= 2**60))
    if bad.any():
        raise ValueError(f"saved list storage 'collect_iter' holds {int(values[bad][0])}, beyond +-2**60")
    return values


def _check_collect_iters(ci: Dict[Any, Any], n: int) -> None:
    """The ``collect_iter`` of every row of a batch (``ci``: its ``collect_iter`` leaves), without making the rows:
    an array or tensor column is checked as a whole, and only from its first bad row on row by row (for the
    message); other columns row by row, up to the first bad one."""
    leaf, start = ci.get(('collect_iter',)), 0
    if len(ci) == 1 and isinstance(leaf, (np.ndarray, torch.Tensor)):
        start = first_bad_collect_iter(leaf)
        if start is None:
            return
    for i in range(start, n):
        try:
            collect_iter_of(batch_row(ci, i)['collect_iter'])
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None


class _Rows(Sequence):
    """The first ``n`` rows of a flattened batch as item dicts, each made when read."""

    def __init__(self, flat: Dict[Any, Any], n: int) -> None:
        self.flat, self.n = flat, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return batch_row(self.flat, i % self.n)

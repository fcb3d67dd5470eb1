"""``ListStorage``: a slot ring of arbitrary Python objects (DI-engine's list-of-dicts layout).

Output of ``gather``: a ``list`` of the stored objects themselves, in the order of the requested slots
(the buffer copies them when its ``deepcopy`` flag is set). Persistence keeps the objects as they are, so
loading a file that holds anything but tensors, numbers, strings and containers needs ``allow_pickle=True``.
"""

import copy
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch

from .base import NO_ITER, Prepared, Storage, check_state, collect_iter_of, trim_newest
from .ring import RingIndex
from .tensordict_io import is_tensordict, rows
from .tree import unbatch


def collect_iters(items: List[Any]) -> np.ndarray:
    """Each item's ``collect_iter`` as one int64 (``collect_iter_of``; ``NO_ITER`` for a non-dict or none)."""
    return np.fromiter(
        (collect_iter_of(x.get('collect_iter')) if isinstance(x, Mapping) else NO_ITER for x in items),
        dtype=np.int64,
        count=len(items),
    )


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

    def __init__(self, capacity: int, index_cls: type = RingIndex) -> None:
        super().__init__(capacity, index_cls)
        self._data: List[Any] = [None] * capacity
        # each slot's collect_iter (a sequence's min; NO_ITER without one), read from its item the first time it
        # is asked for and kept until the slot is written again: staleness costs one index per sampled item,
        # whatever the items hold (R2D2 keeps one per step), and a buffer that never reads it never pays for it
        self._ci = np.full(capacity, NO_ITER, dtype=np.int64)
        self._ci_known = np.zeros(capacity, dtype=bool)

    def prepare(self, items: List[Any]) -> Prepared:
        kept, dropped = trim_newest(len(items), self.capacity)
        if not dropped and type(items) is list:  # read only until written: the caller's list is not copied
            return Prepared(items, kept, 0)
        return Prepared(list(items[dropped:]), kept, dropped, list(items[:dropped]))

    def prepare_batch(self, batch: Any) -> Prepared:
        """A batch dict becomes item dicts; a TensorDict ``[B, ...]`` becomes ``B`` TensorDict items."""
        items = rows(batch) if type(batch) is not dict and is_tensordict(batch) else unbatch(batch)
        if not items:
            raise ValueError("a batched push got a batch of size 0")  # as tensor storage says
        return self.prepare(items)

    def select(self, prepared: Prepared, keep: np.ndarray) -> Prepared:
        """The items of ``prepared`` where ``keep`` (a mask over its kept items) holds, as a new ``Prepared``."""
        payload = [item for item, k in zip(prepared.payload, np.asarray(keep).tolist()) if k]
        return Prepared(payload, len(payload), 0, [], prepared.tensordict)

    def write_one(self, item: Any) -> Optional[int]:
        """One item in O(1) scalar work (the single-push hot path). The overwritten item is not reported:
        callers that must see it leave (the used-data remover) use ``prepare`` + ``write``."""
        if (type(item) is dict or isinstance(item, Mapping)) and 'collect_iter' in item:
            return None  # the generic path checks it (and reports a bad one)
        slot, _ = self.ring.commit_one()
        self._data[slot] = item
        self._ci_known[slot] = False
        return slot

    def _write(self, slots: np.ndarray, payload: List[Any]) -> None:
        """``payload`` at ``slots``, the consecutive run (modulo capacity) the ring committed."""
        data = self._data
        first, n = int(slots[0]), len(payload)
        if self.ring.derived_ids and first + n <= len(data):  # a ring's run, no wrap: slice assignments
            data[first : first + n] = payload
            self._ci_known[first : first + n] = False
            return
        self._ci_known[slots] = False
        for slot, item in zip(slots.tolist(), payload):
            data[slot] = item

    def _take(self, slots: np.ndarray) -> List[Any]:
        return [self._data[s] for s in np.asarray(slots).tolist()]

    def _erase(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        for s in slots.tolist():
            self._data[s] = None
        self._ci_known[slots] = False

    def gather(self, slots: np.ndarray, uids: Optional[np.ndarray] = None) -> List[Any]:
        data = self._data
        return [data[s] for s in np.asarray(slots).tolist()]

    def get(self, slot: int) -> Any:
        return self._data[slot]

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        unknown = slots[~self._ci_known[slots]]
        if len(unknown):
            unknown = np.unique(unknown)
            data = self._data
            self._ci[unknown] = collect_iters([data[s] for s in unknown.tolist()])
            self._ci_known[unknown] = True
        return self._ci[slots]

    def __repr__(self) -> str:
        return f"ListStorage(capacity={self.capacity}, count={len(self)})"

    def state_dict(self) -> Dict[str, Any]:
        slots = self.ring.ordered_slots()
        return {
            'kind': self.kind,
            'ring': self.ring.state_dict(),
            'slots': torch.from_numpy(slots.astype(np.int64)),
            'items': copy.deepcopy(self.gather(slots)),
        }

    @classmethod
    def from_state(cls, state: Dict[str, Any], capacity: int, index_cls: type = RingIndex, **kwargs) -> 'ListStorage':
        check_state(state, cls.kind, ('ring', 'slots', 'items'))
        storage = cls(capacity, index_cls)
        storage.ring = index_cls.from_state(state['ring'], capacity)
        slots = np.asarray(state['slots'], dtype=np.int64)
        items = state['items']
        if not isinstance(items, list) or len(items) != len(slots):
            got = f'{len(items)} items' if isinstance(items, list) else f'items of type {type(items).__name__}'
            raise ValueError(f"saved storage has {len(slots)} slots but {got}")
        if not np.array_equal(np.sort(slots), np.flatnonzero(storage.ring.valid)):
            raise ValueError("saved storage slots do not match the ring's valid slots")
        items = copy.deepcopy(items)
        for slot, item in zip(slots.tolist(), items):
            storage._data[slot] = item
        return storage

"""``Storage``: where items live. Subclasses decide the representation; the ring decides the slots.

Every write goes through two steps so that a rejected batch leaves the storage untouched:
``prepare`` validates and converts (no side effects, may raise), then ``write`` commits the ring and stores.
Not thread-safe: the owning buffer's lock serialises every call.
"""

import itertools
import math
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import torch

from ..persistence import refuse_unknown
from .ring import RingIndex

# the fields a sample adds to the stored ones: the ids (every type), then priorities, IS weights, use counts and
# staleness; a field of a user's own may not take these names where it would be replaced in samples
SAMPLE_FIELDS = ('replay_unique_id', 'replay_buffer_idx', 'priority', 'IS', 'use', 'staleness')

NO_ITER = np.iinfo(np.int64).min // 4  # collect_iter of an element without one (never stale; staleness -1)


class Prepared(NamedTuple):
    """A validated batch ready to be written: ``n`` items kept (the newest), ``dropped`` older ones skipped
    (``skipped`` holds those items for list storage, so the used-data remover sees them leave; ``tensordict``: the
    items came as TensorDicts, which a tensor storage's first write remembers -- see ``tensordict_io``)."""

    payload: Any
    n: int
    dropped: int
    skipped: List[Any] = []
    tensordict: bool = False
    # what the storage read from the kept items while validating them (list storage: their collect_iter column)
    meta: Any = None


class WriteResult(NamedTuple):
    slots: np.ndarray  # slots written, in write order
    uids: np.ndarray  # unique ids of the written items
    evicted: List[Any]  # previous items of overwritten slots (list storage) -- for the used-data remover
    # live slots whose data the write overwrote (frames layout: their oldest frame): the buffer removes them
    expired: Optional[np.ndarray] = None


class Storage(ABC):
    """Fixed-capacity slot store. ``prepare``/``prepare_batch`` validate, ``write`` commits, ``gather`` reads slots,
    ``remove``/``clear`` invalidate. ``state_dict``/``from_state`` copy the full contents."""

    kind = 'base'
    # Whether a write may report live items whose data it overwrote (``WriteResult.expired``; the frames layout).
    expires = False
    # Whether samples are TensorDicts (tensor storage whose first item was one; ``tensordict_io``).
    tensordict_out = False

    slot_bytes = 0  # what the storage keeps per slot besides its fields (those are checked as they are allocated)

    def __init__(self, capacity: int, index_cls: type = RingIndex) -> None:
        # RingIndex (FIFO, ids derived from slots) or FreeListIndex (any freed slot reused: capacity rules)
        self.ring = index_cls(capacity)

    @property
    def capacity(self) -> int:
        return self.ring.capacity

    def __len__(self) -> int:
        return self.ring.count

    # ------------------------------------------------------------------ writing
    @abstractmethod
    def prepare(self, items: List[Any]) -> Prepared:
        """Validate a non-empty list of items; keeps only the newest ``capacity``. Raises, never writes."""

    @abstractmethod
    def prepare_batch(self, batch: Any) -> Prepared:
        """Validate a batch (dict whose leaves share a leading dimension). Raises, never writes."""

    def write(self, prepared: Prepared, report_evicted: bool = True) -> WriteResult:
        """Commit ``prepared`` to the next slots, overwriting the oldest items when full. O(n). ``evicted`` lists
        the items that left (list storage) unless ``report_evicted`` is False (nobody tracks them)."""
        self._reserve(prepared)  # may fail (e.g. memmap files); nothing has changed yet
        ring = self.ring
        evicted: List[Any] = []
        if prepared.dropped:
            # More items than slots: every stored item goes, the oldest pushed items are never stored,
            # but counters and ids advance as if they had been (DI-engine's tail arithmetic).
            stale = ring.ordered_slots()
            if report_evicted:
                evicted = self._take(stale) + list(prepared.skipped)
            ring.skip(prepared.dropped)
            self._erase(stale)
        # the items are written before the index counts them, so that a call stopped in between (a Ctrl-C) leaves
        # no item counted without its data: an empty slot written is not read, an overwritten one keeps its id
        slots = ring.next_slots(prepared.n)
        if report_evicted:
            overwritten = slots[ring.valid[slots]]
            if len(overwritten):
                evicted += self._take(overwritten)
        self._write(slots, prepared.payload)
        slots, uids, _ = ring.commit(prepared.n, slots)
        return WriteResult(slots, uids, evicted)

    def discard(self, prepared: Prepared) -> Optional[np.ndarray]:
        """``prepared`` will not be written (a rate limiter or a capacity rule refused its items). A storage that
        keeps state across pushes settles it (the frames layout writes the refused steps' frames, so their streams
        go on); returns live slots that lost their data meanwhile (``WriteResult.expired``), or None."""
        return None

    def write_one(self, item: Any) -> Optional[int]:
        """Fast path for one item: its slot, or ``None`` (nothing changed) -- then use prepare + write. It does
        not report the item it overwrote: a caller tracking items that leave must use prepare + write."""
        return None

    def check_batch(self, batch: Any) -> Any:
        """Fast path for a batch: an opaque checked batch for ``write_batch`` (O(fields)), or ``None`` -- then use
        ``prepare_batch`` + ``write``, which check and report. Nothing is written."""
        return None

    def write_batch(self, checked: Any) -> np.ndarray:
        """Write a batch ``check_batch`` accepted at the next slots; returns them. Like ``write_one`` it does not
        report the items it overwrote."""
        raise NotImplementedError

    def _reserve(self, prepared: Prepared) -> None:
        """Acquire what the write needs (tensor storage allocates its fields on the first write)."""

    @abstractmethod
    def _write(self, slots: np.ndarray, payload: Any) -> None:
        """Store ``payload`` at ``slots``; must not fail once ``_reserve`` succeeded."""

    def _take(self, slots: np.ndarray) -> List[Any]:
        """Items about to be dropped from ``slots`` (only list storage returns them)."""
        return []

    # ------------------------------------------------------------------ reading / removing
    def oldest(self, k: int) -> np.ndarray:
        """The ``k`` oldest valid slots, oldest first."""
        return self.ring.oldest(k)

    def release(self) -> None:
        """Free what the storage holds outside the process (memmap files); a no-op for in-memory storage."""

    def live(self, slots: np.ndarray) -> np.ndarray:
        """Mask of ``slots`` holding an item."""
        return self.ring.valid[slots]

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """Each element's ``collect_iter`` (int64; the min of a sequence; ``NO_ITER`` where it has none)."""
        return np.full(len(slots), NO_ITER, dtype=np.int64)

    def staleness(self, slots: np.ndarray, cur_learner_iter: int) -> np.ndarray:
        """``cur_learner_iter - collect_iter`` of each element (int64), -1 where it has no ``collect_iter``."""
        ci = self.collect_iter(slots)
        return np.where(ci == NO_ITER, -1, cur_learner_iter - ci)

    @abstractmethod
    def gather(self, slots: np.ndarray, uids: Optional[np.ndarray] = None) -> Any:
        """Read the items at ``slots`` (which must be valid)."""

    def remove(self, slots: np.ndarray) -> List[Any]:
        """Invalidate ``slots``; returns the removed items (list storage) for the used-data remover."""
        slots = np.unique(np.asarray(slots, dtype=np.int64))
        removed = self._take(slots[self.ring.valid[slots]])
        self._erase(self.ring.remove(slots))
        return removed

    def clear(self, reset_push_count: bool = False) -> List[Any]:
        slots = self.ring.ordered_slots()
        removed = self._take(slots)
        self.ring.clear(reset_push_count)  # (first, as ``remove``: no counted item ever lost its data)
        self._erase(slots)
        return removed

    def _erase(self, slots: np.ndarray) -> None:
        """Drop references held at ``slots`` (list storage); tensors are simply left to be overwritten."""

    # ------------------------------------------------------------------ persistence
    @abstractmethod
    def state_dict(self) -> Dict[str, Any]:
        """Copies of the ring and of every valid item (insertion order), serialisable with ``torch.save``."""

    @classmethod
    @abstractmethod
    def from_state(cls, state: Dict[str, Any], **kwargs) -> 'Storage':
        """Build a new storage from ``state`` (validated); the caller swaps it in, so loading is all-or-nothing."""


def check_state(state: Any, kind: str, keys: Tuple[str, ...], optional: Tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` unless ``state`` is a dict saved by a ``kind`` storage holding ``keys`` (and perhaps
    ``optional`` ones; no other)."""
    if not isinstance(state, dict):
        raise ValueError(f"{kind} storage state must be a dict, got {type(state).__name__}")
    if state.get('kind') != kind:
        raise ValueError(f"saved storage is '{state.get('kind')}', config 'storage.type' is '{kind}'")
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"{kind} storage state is missing {missing}")
    refuse_unknown(state, ('kind',) + keys + optional, f"saved {kind} storage")


def trim_newest(n: int, capacity: int) -> Tuple[int, int]:
    """(kept, dropped) for a push of ``n`` items into ``capacity`` slots: the newest ``capacity`` are kept."""
    kept = min(n, capacity)
    return kept, n - kept


def collect_iter_of(value: Any) -> int:
    """A ``collect_iter`` value as one int: the min of a sequence / tensor / array; ``NO_ITER`` when absent.

    A learner iteration is a whole number: a fractional value (1.5), NaN or inf is a ``ValueError``, as a tensor
    storage whose ``collect_iter`` field is an int refuses it. A float that is a whole number (2.0, a float array of
    whole numbers) is read as that int: the rule is on the value, not its dtype, because a list storage has no
    schema to fix one (a tensor storage keeps the dtype its first item gave the field).

    Examples:
        >>> collect_iter_of(3), collect_iter_of([5, 2.0, None]), collect_iter_of(None) == NO_ITER
        (3, 2, True)
        >>> collect_iter_of(1.5)
        Traceback (most recent call last):
        ValueError: 'collect_iter' must be a whole number (a learner iteration), got 1.5
    """
    if value is None:
        return NO_ITER
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise ValueError(f"'collect_iter' must be ints, got a {value.dtype} tensor")
        if value.dtype in WIDE_UNSIGNED or (value.is_floating_point() and value.element_size() == 1):  # (no min)
            return collect_iter_of(value.double() if value.is_floating_point() else value.detach().cpu().numpy())
        if value.is_floating_point() and value.numel() and not bool((value == value.trunc()).all()):
            raise ValueError(f"'collect_iter' must be whole numbers (learner iterations), got {value!r:.60}")
        return collect_iter_of(value.min().item()) if value.numel() else NO_ITER
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in 'iuf':
            raise ValueError(f"'collect_iter' must be ints, got an array of {value.dtype}")
        if value.dtype.kind == 'f' and value.size and not bool((value == np.trunc(value)).all()):
            raise ValueError(f"'collect_iter' must be whole numbers (learner iterations), got {value!r:.60}")
        return collect_iter_of(value.min().item()) if value.size else NO_ITER
    if isinstance(value, (list, tuple)):
        vals = [v for v in (collect_iter_of(x) for x in value) if v != NO_ITER]
        return min(vals) if vals else NO_ITER
    if isinstance(value, (bool, str, bytes, np.bool_, np.complexfloating, np.timedelta64, np.datetime64)):
        raise ValueError(f"'collect_iter' must be an int (or ints), got {type(value).__name__} {value!r:.40}")
    if isinstance(value, (int, np.integer)):
        if not -_INT_LIMIT < int(value) < _INT_LIMIT:  # (exact: a numpy int compared with a float rounds)
            raise ValueError(f"'collect_iter' must be a finite int within +-2**60, got {value!r:.40}")
        return int(value)
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"'collect_iter' must be an int (or ints), got {type(value).__name__} {value!r}") from None
    if not math.isfinite(out) or not -_ITER_LIMIT < out < _ITER_LIMIT:
        raise ValueError(f"'collect_iter' must be a finite int within +-2**60, got {value!r:.40}")
    if out != math.trunc(out):
        raise ValueError(f"'collect_iter' must be a whole number (a learner iteration), got {value!r:.40}")
    return int(out)


_ITER_LIMIT = float(2**60)
_INT_LIMIT = 2**60
WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def first_bad_collect_iter(column: Any) -> Optional[int]:
    """The first row of a batched array / tensor ``column`` whose ``collect_iter_of`` would raise (None: none),
    found with whole-column operations."""
    if isinstance(column, torch.Tensor):
        if column.dtype == torch.bool or column.is_complex():
            return 0 if len(column) else None
        column = column.detach().cpu()
        column = (column.double() if column.is_floating_point() else column).numpy()
    n = column.shape[0]
    if column.dtype.kind not in 'iuf':
        return 0 if n else None
    rows = column.reshape(n, -1)
    if not n or not rows.shape[1]:
        return None  # (an empty row is no collect_iter)
    mins = rows.min(axis=1)
    if column.dtype.kind == 'f':
        bad = ~(rows == np.trunc(rows)).all(axis=1) | ~(np.abs(mins.astype(np.float64)) < _ITER_LIMIT)
    else:
        bad = (mins <= -_INT_LIMIT) | (mins >= _INT_LIMIT) if mins.dtype.itemsize == 8 else np.zeros(n, bool)
    hit = np.flatnonzero(bad)
    return int(hit[0]) if len(hit) else None


# every item's collect_iter absent: the column is NO_ITER throughout (what ``collect_iter_column`` answers cheaply)
ALL_ABSENT = np.empty(0, dtype=np.int64)


def collect_iter_column(items: List[Any]) -> np.ndarray:
    """
    Overview:
        The items' ``collect_iter`` values as one int64 column (``collect_iter_of``: a sequence's min, ``NO_ITER``
        for a non-mapping item or an absent field), validated: ``ValueError`` naming the item for a bad value,
        ``TypeError`` for a ``None`` item. Returns ``ALL_ABSENT`` (an empty array) when no item has the field.
        A dict's field is read as stored (``dict.get``, even where a subclass overrides ``get``); a list of dicts
        costs one C-level pass.
    Examples:
        >>> collect_iter_column([{'collect_iter': 3}, {'x': 1}, [5]]).tolist() == [3, NO_ITER, NO_ITER]
        True
        >>> collect_iter_column([{'x': 1}]) is ALL_ABSENT
        True
    """
    try:  # every item a dict (the common case)
        values = list(map(_DICT_GET, items, itertools.repeat('collect_iter', len(items))))
    except TypeError:  # None, or items of other kinds
        values = []
        for i, item in enumerate(items):
            if item is None:
                raise TypeError(f"cannot push None (item {i})") from None
            if isinstance(item, dict):
                values.append(_DICT_GET(item, 'collect_iter'))
            else:
                values.append(item.get('collect_iter') if isinstance(item, Mapping) else None)
    try:
        if values.count(None) == len(values):  # None matches by identity; no other value is compared then
            return ALL_ABSENT
    except (ValueError, TypeError, RuntimeError):  # an array's == None is element-wise: read one by one below
        pass
    out = np.full(len(values), NO_ITER, dtype=np.int64)
    limit = _INT_LIMIT
    for i, value in enumerate(values):
        if value is None:
            continue
        if type(value) is int and -limit < value < limit:
            out[i] = value
            continue
        try:
            out[i] = collect_iter_of(value)
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None
    return out


_DICT_GET = dict.get

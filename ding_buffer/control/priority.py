"""``PriorityIndex``: per-slot priorities and the priority tree of a prioritized sampler.

Per slot: the tree leaf ``priority ** alpha`` (float64; 0 for an empty or retired slot, so it is never drawn);
use counts live in the engine's ``UseCounts`` column. The reported priority is recovered as ``leaf ** (1 / alpha)``
rounded to
float32 (what a stored float32 would give; the rounding removes the last-bit error of the round trip, so
5.0 comes back as 5.0); only an ``alpha`` below ``COLUMN_ALPHA`` keeps a float32 priority array (alpha 0: every leaf
is 1; a tiny alpha: a leaf's last bit, magnified ``1 / alpha`` times, is more than a float32 step of the priority).
Memory: ~10.4 bytes per slot with the 8-ary trees (leaves 8, sum and min nodes 2 x 1.2).

Sampling is stratified (one uniform draw per equal stratum of the total mass), the whole batch descends the
tree in one compiled call. Importance weights are ``(leaf_i / leaf_min) ** (-beta)`` -- DI-engine's
``w_i / w_max`` -- so equal priorities give exactly 1.0.
Not thread-safe: the owning buffer's lock serialises every call.
"""

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .. import tree_kernels as kern
from .._numba import ready, warmer
from ..segment_tree import PriorityTree
from ..storage.ring import RingIndex
from ..storage.tensordict_io import is_tensordict

NOT_IN_NUMPY = frozenset(
    getattr(torch, name)
    for name in ('bfloat16', 'float8_e4m3fn', 'float8_e5m2', 'float8_e4m3fnuz', 'float8_e5m2fnuz')
    if hasattr(torch, name)
)


def as_numpy(x: Any) -> Any:
    """A tensor (any device) as a numpy array without a copy where possible; anything else unchanged. A dtype numpy
    lacks (bfloat16, a mixed-precision learner's TD errors; float8) is read as float32, which holds it exactly."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.is_neg() or x.is_conj():  # a lazy negation / conjugate: numpy cannot view it
            x = x.resolve_conj().resolve_neg()
        if x.dtype in NOT_IN_NUMPY:
            x = x.float()
        return (x if x.device.type == 'cpu' else x.cpu()).numpy()
    return x


def _flat(values: Any) -> Any:
    """The numbers of nested lists / tuples, in order (per-step priorities may come as lists of lists)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


# Priorities are reported (and saved) as float32: a larger one would come back as inf.
MAX_PRIORITY = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32
# below it a priority derived from its leaf may miss its float32 value (relative error about 2e-16 / alpha)
COLUMN_ALPHA = 1e-6


def check_one_each(shape: Tuple[int, ...], key: str = 'priority') -> None:
    """``ValueError`` unless ``shape`` holds one number an item: ``[n]`` or ``[n, 1]`` (a learner's column)."""
    if len(shape) > 1 and tuple(shape[1:]) != (1,):
        raise ValueError(f"'{key}' must be one number an item, shape [n] or [n, 1]; got shape {list(shape)}")


def real_numbers(values: Any, key: str = 'priority') -> np.ndarray:
    """``values`` (tensors of any dtype and device, arrays, nested lists, numbers) as a numpy array of real numbers
    (ints or floats; not bools, strings or complex) -- else ``TypeError`` / ``ValueError`` naming the key and the
    entry. Values are not checked."""
    raw = as_numpy(values)
    if type(raw) is list and all(type(v) is float for v in raw):  # a learner's ``tolist()``: no entry to check
        raw = np.array(raw, dtype=np.float64)
    entries = raw if isinstance(raw, (list, tuple)) else [raw] if isinstance(raw, int) else None
    if entries is not None:  # numpy would turn True or '1.5' into numbers, and fail on 10 ** 400: check entries
        for i, v in enumerate(_flat(entries)):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"'{key}' must be real numbers; entry {i} is {type(v).__name__} {v!r:.40}")
            if isinstance(v, int) and abs(v) > MAX_PRIORITY:
                raise ValueError(
                    f"'{key}' must be finite in float32 (<= {MAX_PRIORITY!r}); entry {i} is an int "
                    f"of {len(str(abs(v)))} digits"
                )
    try:
        arr = raw if type(raw) is np.ndarray else np.asarray(raw)
    except ValueError as e:  # nested lists of different lengths
        raise ValueError(f"'{key}' must be numbers in one shape; its nested lists differ in length") from e
    if arr.dtype.kind not in 'iuf':
        raise TypeError(
            f"'{key}' must be real numbers (ints / floats), got dtype {arr.dtype} ({type(values).__name__})"
        )
    return arr


def as_priorities(values: Any, key: str = 'priority', one_each: bool = False) -> np.ndarray:
    """``values`` as a float64 array: real numbers (``real_numbers``), each finite in float32 and >= 0 -- else
    ``TypeError`` / ``ValueError`` naming the key and the entry. ``one_each``: of shape ``[n]`` or ``[n, 1]`` (a
    learner's column of losses), one an item."""
    arr = real_numbers(values, key)
    if one_each:
        check_one_each(arr.shape, key)
    arr = arr.astype(np.float64, copy=False).reshape(-1)
    if len(arr) and arr.min() >= 0 and arr.max() <= MAX_PRIORITY:  # NaN fails the first test: two reductions
        return arr
    bad = ~(np.abs(arr) <= MAX_PRIORITY) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"'{key}' must be finite in float32 (<= {MAX_PRIORITY!r}) and >= 0; entry {i} is {arr[i]} "
            f"(nothing was changed)"
        )
    return arr


def from_leaves(leaves: np.ndarray, alpha: float, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The priorities ``leaves`` stand for, ``leaf ** (1 / alpha)`` rounded to float32 (as stored), as float64. A
    leaf a rounding above the largest priority's (``max_leaf``; a small alpha magnifies a leaf's last bit) stands
    for the largest float32, never inf."""
    p = np.power(leaves, 1.0 / alpha, out=out)
    return np.minimum(p, MAX_PRIORITY, out=p).astype(np.float32).astype(np.float64)


def max_leaf(alpha: float) -> float:
    """The largest leaf a write can make (``alpha`` > 0): the largest priority's, give or take a few float64 ulps
    (the leaf kernels and numpy round ``priority ** alpha`` each their own way)."""
    return float(np.power(MAX_PRIORITY, alpha)) * (1 + 8 * np.finfo(np.float64).eps)


class PriorityIndex:
    """
    Overview:
        Priorities of ``capacity`` slots as tree leaves ``priority ** alpha`` (see the module docstring).
    Examples:
        >>> idx = PriorityIndex(capacity=4, alpha=1.0, eps=0.0)
        >>> idx.set_new(np.arange(4), np.array([1.0, 1.0, 2.0, 0.0]))  # slot 3: priority 0, never drawn
        >>> idx.sample(np.random.default_rng(0), 4).tolist()  # stratified: slot 2 holds half the mass
        [0, 1, 2, 2]
        >>> idx.is_weights(np.array([0, 2]), beta=1.0).tolist()  # (leaf / min leaf) ** -beta
        [1.0, 0.5]
        >>> idx.update(np.array([3]), np.array([4.0]))
        >>> idx.priorities(np.arange(4)).tolist(), idx.max_priority
        ([1.0, 1.0, 2.0, 4.0], 4.0)
    """

    def __init__(
        self, capacity: int, alpha: float, eps: float = 1e-5, with_max: bool = False, eps_in_max: bool = False
    ) -> None:
        self.capacity = capacity
        self.alpha = float(alpha)
        self.eps = float(eps)
        # the running max takes the priority an update stores (priority + eps: DI-engine's deque) or the one given
        # (its advanced buffer): what an update adds to its largest priority
        self.eps_in_max = eps_in_max
        self._max_eps = self.eps if eps_in_max else 0.0
        self.tree = PriorityTree(capacity, with_max=with_max)
        self._priority = np.zeros(capacity, np.float32) if self.alpha < COLUMN_ALPHA else None  # else from leaves
        self.max_priority = 1.0  # largest priority ever set (DI-engine); new items default to it

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Stored priorities at ``slots`` (float32 values, as float64)."""
        if self._priority is not None:
            return self._priority[slots].astype(np.float64)
        return from_leaves(self.tree.leaves[slots], self.alpha)

    def as_stored(self, priorities: np.ndarray) -> np.ndarray:
        """What ``priorities`` reports for new items pushed with ``priorities`` (``set_new``): the same rounding,
        so a new item's value compares exactly with the stored ones (a capacity rule's admission)."""
        priorities = np.asarray(priorities, dtype=np.float64)
        if self._priority is not None:
            return priorities.astype(np.float32).astype(np.float64)
        return from_leaves(kern.leaf_values(priorities, 0.0, self.alpha), self.alpha)

    # ------------------------------------------------------------------ writes
    def default_priority(self) -> float:
        """Priority of a pushed item that brings none: the running max, or with a max tree the max stored."""
        if self.tree.has_max and self.alpha > 0:
            top = self.tree.max_leaf()
            if top > 0:
                if self._priority is not None:  # (a tiny alpha: the leaf misses the priority's last digits)
                    return float(self._priority.max())
                try:  # (a leaf's last bit can pass float32's max)
                    p = min(top ** (1.0 / self.alpha), MAX_PRIORITY)
                except OverflowError:
                    return MAX_PRIORITY
                # a priority whose leaf is the top leaf itself (equal leaves: IS 1.0) or else the top item's
                # priority as stored (``from_leaves``), whose leaf gives it back: either way pushes do not ratchet
                # the max by a rounding each (below float32's normal range that rounding would lose the priority's
                # digits, or all of it: the float64 value)
                if p**self.alpha == top:
                    return p
                q = float(np.float32(p))
                return q if q >= _FLOAT32_TINY else p
        return self.max_priority

    def set_new(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Fresh items at ``slots`` (priorities already validated)."""
        if self._priority is not None:
            self._priority[slots] = priorities
        self.tree.set(slots, kern.leaf_values(priorities, 0.0, self.alpha))

    def fill_new(self, slots: np.ndarray, priority: float) -> None:
        """Fresh items at ``slots``, all with ``priority`` (a batched push without priorities)."""
        if self._priority is not None:
            self._priority[slots] = priority
        self.tree.fill(slots, priority**self.alpha)

    def set_new_one(self, slot: int, priority: float) -> None:
        if self._priority is not None:
            self._priority[slot] = priority
        self.tree.set_one(slot, priority**self.alpha)

    def clear_slots(self, slots: np.ndarray) -> None:
        """Removed items: zero leaf (never drawn)."""
        self.retire(slots)

    def raise_max(self, priority: float) -> None:
        """Priorities were set elsewhere (per-step priorities of windows): keep the running max."""
        self.max_priority = max(self.max_priority, float(priority))

    def load_max(self, priority: float) -> None:
        self.max_priority = float(priority)

    def reset(self) -> None:
        """Every slot empty and the running max back to 1 (``clear``)."""
        self.tree.load_leaves(np.zeros(self.capacity))
        if self._priority is not None:
            self._priority[:] = 0
        self.max_priority = 1.0

    def retire(self, slots: np.ndarray) -> None:
        """Keep the items but stop sampling them (max_use reached while used data is tracked, as DI-engine)."""
        if len(slots):
            self.tree.set(slots, np.zeros(len(slots)))
            if self._priority is not None:
                self._priority[slots] = 0

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set ``priority + eps`` at matched slots (validated by the caller); raises the running max."""
        if self._priority is not None:
            self._priority[slots] = priorities + self.eps
        self.tree.set(slots, kern.leaf_values(priorities, self.eps, self.alpha))
        if len(priorities):
            self.max_priority = max(self.max_priority, float(priorities.max()) + self._max_eps)

    def update_by_ids(self, ring: Any, slots: np.ndarray, ids: np.ndarray, priorities: np.ndarray) -> Optional[int]:
        """
        Overview:
            ``update`` in one compiled pass (checks, identity against ``ring``, leaves, trees): returns how many
            entries applied, or ``None`` -- with nothing changed -- when an entry is invalid (the checking path
            then reports it) or this index cannot take the fused path (no numba, or alpha 0 and its column).
            ``slots`` / ``ids`` are int64 arrays, ``priorities`` a float array, all of one length.
        """
        if self._priority is not None or not ready() or not ring.derived_ids:
            return None  # the kernel derives ids from slots (a free-list index stores them)
        out = np.empty(4)
        kern.prio_update_by_id(
            *self.tree.arrays,
            *self.tree.deferred,
            ring.valid,
            ring.next_uid,
            ring.capacity,
            slots,
            ids,
            priorities,
            self.eps,
            self.alpha,
            MAX_PRIORITY,
            out,
        )
        if out[3]:
            return None
        if out[0]:
            self.max_priority = max(self.max_priority, float(out[1]) + self._max_eps)
        return int(out[0])

    # ------------------------------------------------------------------ sampling
    def sample(
        self, rng: np.random.Generator, size: int, candidates: Optional[np.ndarray] = None
    ) -> Optional[np.ndarray]:
        """
        Overview:
            Stratified prioritized draw of ``size`` slots (with replacement), over all slots or over the slots
            ``candidates``. ``None`` when the selected mass is zero. O(size * log8(capacity)) over all slots;
            O(len(candidates)) with candidates (a cumulative sum over them).
        """
        if candidates is None:
            total = self.tree.total()
            if not total > 0:
                return None  # before any draw: a refusal leaves the RNG as it was
            return self.tree.find((np.arange(size) + rng.random(size)) / size * total)
        cum = np.cumsum(self.tree.leaves[candidates])
        if not len(cum) or not cum[-1] > 0:
            return None
        u = (np.arange(size) + rng.random(size)) / size
        pos = np.searchsorted(cum, u * cum[-1], side='right')
        pos = np.minimum(pos, len(cum) - 1)
        # float error can land past the last positive leaf: step back to it (same rule as the tree)
        last_pos = int(np.flatnonzero(self.tree.leaves[candidates] > 0)[-1])
        return candidates[np.minimum(pos, last_pos)]

    def can_draw(self) -> bool:
        """Whether ``draw`` takes this index: compiled kernels loaded, and priorities derived from the leaves (alpha >
        0). Until the kernels are loaded ``sample`` + ``is_weights`` + ``priorities`` give the same draw."""
        return self._priority is None and ready()

    def draw(self, u: np.ndarray, beta: float, counts: np.ndarray, ring: Any) -> Optional[Tuple[np.ndarray, ...]]:
        """
        Overview:
            ``sample`` over all slots, with what a prioritized batch reports, in one compiled pass (``can_draw``
            must hold): ``u`` are the strata offsets (``rng.random(size)``), ``counts`` the use counts to bump,
            ``ring`` the slots' ``RingIndex`` (for the ids). The same slots, weights and priorities as ``sample`` +
            ``is_weights`` + ``priorities``.
        Returns:
            ``(slots, IS weights, priorities, use counts, ids)``, or ``None`` -- nothing drawn or counted -- when
            the total priority is zero.
        """
        n = len(u)
        slots, leaf, use, ids = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
        low = kern.prio_draw(
            *self.tree.arrays, *self.tree.deferred, u, counts, ring.next_uid, ring.capacity, slots, leaf, use, ids
        )
        if low < 0:
            raise ValueError("priority tree is inconsistent: a positive total over zero leaves")
        if not low > 0:
            return None
        if not ring.derived_ids:  # the kernel derived the ids from the slots; a free-list index stores them
            ids = ring.uids(slots)
        weights = np.divide(low, leaf)  # (leaf / low) ** -beta, as (low / leaf) ** beta: in (0, 1], no overflow
        np.power(weights, beta, out=weights)
        return slots, weights, from_leaves(leaf, self.alpha, out=leaf), use, ids

    def is_weights(self, slots: np.ndarray, beta: float) -> np.ndarray:
        return np.power(self.tree.min_leaf() / self.tree.leaves[slots], beta)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        return {
            'leaves': torch.from_numpy(self.tree.leaves[: self.capacity].copy()),
            'priority': torch.from_numpy(self.priorities(np.arange(self.capacity)).astype(np.float32)),
            'max_priority': self.max_priority,
            'alpha': self.alpha,
        }

    def restored(self, state: Mapping, valid: np.ndarray) -> 'PriorityIndex':
        """A new index like this one holding ``state``, validated against the ring's ``valid`` mask (raises
        ``ValueError``; nothing changes here -- the caller swaps the new index in)."""
        if float(state['alpha']) != self.alpha:  # leaves are priority ** alpha: they would not match the config
            raise ValueError(f"state was saved with alpha={state['alpha']}, config 'alpha' is {self.alpha}")
        leaves = np.asarray(state['leaves'], dtype=np.float64)
        priority = np.asarray(state['priority'], dtype=np.float32)
        for name, arr in (('leaves', leaves), ('priority', priority)):
            if arr.shape != (self.capacity,):
                raise ValueError(f"saved '{name}' has shape {arr.shape}, expected ({self.capacity},)")
        if not np.isfinite(priority).all() or (priority < 0).any():
            raise ValueError("saved priorities must be finite and >= 0")
        if (leaves[~valid] != 0).any():
            raise ValueError("saved priority leaves are non-zero at empty slots")
        # the priorities leaves stand for (leaf ** (1 / alpha)) are finite in float32, as every write keeps them
        if not (leaves >= 0).all():  # NaN too
            raise ValueError("saved priority leaves must be >= 0")
        top = np.max(leaves, initial=0.0)
        if not top <= (max_leaf(self.alpha) if self.alpha else 1.0):  # alpha 0: every leaf is 1
            raise ValueError(f"saved priority leaf {top:g} stands for a priority beyond float32")
        max_priority = float(state['max_priority'])
        if not (math.isfinite(max_priority) and 0 <= max_priority <= MAX_PRIORITY):
            raise ValueError(f"saved max_priority must be finite and >= 0, got {max_priority} (finite in float32)")
        new = PriorityIndex(self.capacity, self.alpha, self.eps, self.tree.has_max, self.eps_in_max)
        new.tree.load_leaves(leaves)
        if new._priority is not None:
            if (priority[~valid] != 0).any():
                raise ValueError("saved priorities are non-zero at empty slots")
            new._priority[:] = priority
        if self.alpha:  # each priority is saved twice, once as its leaf: they must agree (the leaf is what samples)
            if new._priority is not None:  # the column is the priority: its leaf is priority ** alpha (a leaf
                # cannot give the priority back to float32 at a tiny alpha; at 1e-18 every leaf > 0 is 1.0) of the
                # pushed value, which float32 kept to within one step (a priority below its smallest is kept as 0)
                with np.errstate(over='ignore'):  # (the step above float32's max is inf)
                    lo, hi = (np.nextafter(priority, np.float32(x)).astype(np.float64) for x in (0, np.inf))
                off = ~((leaves >= lo**self.alpha * (1 - 1e-9)) & (leaves <= hi**self.alpha * (1 + 1e-9)))
            else:  # two float32 ulps
                off = ~np.isclose(from_leaves(leaves, self.alpha), priority, rtol=3e-7, atol=0)
            if off.any():
                i = int(np.flatnonzero(off)[0])
                raise ValueError(
                    f"saved 'priority' {priority[i]:g} at slot {i} disagrees with its leaf (priority ** alpha), which "
                    f"stands for {from_leaves(leaves[i : i + 1], self.alpha)[0]:g}"
                )
        new.max_priority = max_priority
        return new


_LEADING_ZERO = re.compile(r',0[0-9]')


def is_id_text(text: str) -> bool:
    """Whether ``text`` is how an id is written in a DI-engine id string: ASCII digits, no leading zero."""
    return text.isdecimal() and text.isascii() and (text[0] != '0' or len(text) == 1)


def split_ids(ids: Any, instance_name: str) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """
    Overview:
        Unique ids as int64 plus a mask of those that belong to this buffer (``None``: all of them). Accepts
        ints / int arrays / tensors, or DI-engine strings ``f"{instance_name}_{n}"`` (a string of another
        buffer is "foreign").
    """
    ids = as_numpy(ids)
    if isinstance(ids, np.ndarray) and ids.dtype.kind in 'iu':
        return ids.reshape(-1).astype(np.int64, copy=False), None
    prefix = instance_name + '_'
    if type(ids) is list and all(type(x) is str for x in ids):  # what a DI-engine learner sends: one pass
        n = len(prefix)
        tails = [x[n:] if x.startswith(prefix) else '' for x in ids]
        try:
            out = np.fromiter((int(t) if t.isdecimal() else -1 for t in tails), dtype=np.int64, count=len(tails))
        except (OverflowError, ValueError):  # beyond int64, or more digits than Python converts: one at a time
            out = None
        # each tail is the id's own text ('7', never '07' or other scripts' digits): one scan of the joined tails
        joined = ',' + ','.join(tails)
        if out is None or not joined.isascii() or (',0' in joined and _LEADING_ZERO.search(joined) is not None):
            out = _as_int64([_id_value(t) for t in tails])
        return out, out >= 0
    out, mine = [], []
    for i, x in enumerate(list(np.asarray(ids, dtype=object).reshape(-1))):
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            out.append(int(x))
            mine.append(True)
        elif isinstance(x, str):
            value = _id_value(x[len(prefix) :]) if x.startswith(prefix) else -1
            out.append(value)
            mine.append(value >= 0)
        else:
            raise TypeError(f"'replay_unique_id' entry {i} is {type(x).__name__} {x!r}; expected an int or a str id")
    return _as_int64(out), np.asarray(mine, dtype=bool)


def _id_value(text: str) -> int:
    """The id a DI-engine id string's tail writes (``is_id_text``), -1 when it writes none; ``ValueError`` for one
    beyond int64 (one of more than 100 digits is not read: Python converts no more than 4300)."""
    if not is_id_text(text):
        return -1
    if len(text) > 100:
        raise ValueError(
            f"'replay_unique_id' {text[:20]}... ({len(text)} digits) is beyond int64: no item has such an id"
        )
    return int(text)


def _as_int64(ids: List[int]) -> np.ndarray:
    try:
        return np.asarray(ids, dtype=np.int64)
    except OverflowError:
        bad = next(v for v in ids if not -(1 << 63) <= v < 1 << 63)
        shown = bad if bad.bit_length() < 300 else f'of {bad.bit_length()} bits'  # (Python prints 4300 digits at most)
        raise ValueError(f"'replay_unique_id' {shown} is beyond int64: no item has such an id") from None


def has_priorities(info: Any) -> bool:
    """Whether an ``update`` carries priorities (False: a no-op); ``info`` must then name the items by
    ``replay_unique_id`` and ``replay_buffer_idx`` (``ValueError``; ``TypeError`` when it is no dict)."""
    if type(info) is not dict and not isinstance(info, Mapping):
        raise TypeError(f"update info must be a dict, got {type(info).__name__}")
    if info.get('priority') is None:
        return False
    for key in ('replay_unique_id', 'replay_buffer_idx'):
        if key not in info:
            raise ValueError(f"update info has 'priority' but no '{key}'")
    return True


def parse_update(
    info: Any, instance_name: str, capacity: int
) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray]]]:
    """
    Overview:
        Validate a prioritized ``update`` (all or nothing; nothing is changed here): ``info`` holds
        ``replay_unique_id``, ``replay_buffer_idx`` and ``priority`` of equal length. Returns ``None`` without
        ``priority`` (a no-op), else ``(priorities, ids, slots, mine)``; ``mine`` masks ids of this buffer
        (``None``: all). NaN / inf / negative priorities, bad slots or mismatched lengths raise ``ValueError``,
        wrong types ``TypeError``.
    """
    if not has_priorities(info):
        return None
    priorities = as_priorities(info['priority'], one_each=True)
    ids, mine = split_ids(info['replay_unique_id'], instance_name)
    slots = np.asarray(as_numpy(info['replay_buffer_idx'])).reshape(-1)
    if len(slots) and slots.dtype.kind not in 'iu':
        raise TypeError(f"'replay_buffer_idx' must be ints, got dtype {slots.dtype}")
    slots = slots.astype(np.int64, copy=False)
    if not len(priorities) == len(ids) == len(slots):
        raise ValueError(
            f"update info lengths differ: priority {len(priorities)}, replay_unique_id {len(ids)}, "
            f"replay_buffer_idx {len(slots)}"
        )
    if len(slots) and (slots.min() < 0 or slots.max() >= capacity):
        raise ValueError(f"'replay_buffer_idx' must be in [0, {capacity}), got {slots.min()}..{slots.max()}")
    return priorities, ids, slots, mine


def priority_of(data: Mapping) -> Any:
    """A pushed item's or batch's ``priority`` (None: none); a TensorDict's non-tensor one as its value."""
    if type(data) is not dict and is_tensordict(data):
        return data['priority'] if 'priority' in data.keys() else None
    return data.get('priority')


def item_priorities(items: Any, default: float) -> np.ndarray:
    """Each pushed item's ``priority`` (``default`` where missing or None), validated: all or nothing."""
    out = np.empty(len(items))
    for i, item in enumerate(items):
        if type(item) is dict:  # (the common case: one lookup)
            p = item.get('priority')
        elif not isinstance(item, Mapping):
            raise TypeError(f"a prioritized buffer stores dicts; item {i} is {type(item).__name__}")
        else:
            if is_tensordict(item) and item.batch_dims:  # one priority, IS weight, id each: an element is one step
                raise ValueError(
                    f"item {i} is a TensorDict with batch_size {list(item.batch_size)}; a prioritized buffer's items "
                    f"have batch_size [] (push the TensorDict itself, or extend(td), to store its rows)"
                )
            p = priority_of(item)
        if p is None:
            out[i] = default
        elif isinstance(p, (int, float)) and not isinstance(p, bool):
            if not 0 <= p <= MAX_PRIORITY:  # also NaN and ints no float holds
                raise ValueError(f"item {i} 'priority' must be finite in float32 and >= 0, got {p!r:.40}")
            out[i] = p
        else:
            arr = as_priorities(p, f'item {i} priority')
            if arr.shape != (1,):
                raise ValueError(f"item {i} 'priority' must be one number, got shape {tuple(np.shape(p))}")
            out[i] = arr[0]
    return as_priorities(out, 'priority')


def batch_priorities(p: Any, prepared: Any, default: float) -> np.ndarray:
    """Priorities of the items a batched push keeps (``prepared``): ``p`` (one per pushed item, validated) or
    ``default`` for each."""
    n = prepared.n + prepared.dropped
    if p is None:
        return np.full(prepared.n, default)
    priorities = as_priorities(p, 'priority')
    if len(priorities) != n:
        raise ValueError(f"batched 'priority' has {len(priorities)} entries, the batch has {n} items")
    return priorities[prepared.dropped :]


class BetaSchedule:
    """The importance-sampling exponent: starts at ``beta``, grows linearly to 1 over ``anneal_step`` draws
    (0: constant). One home for the advanced buffer and prioritized windows.

    Examples:
        >>> beta = BetaSchedule(0.4, anneal_step=3)
        >>> [round(beta.draw(), 6) for _ in range(5)]  # + (1 - 0.4) / 3 per draw, up to 1
        [0.4, 0.6, 0.8, 1.0, 1.0]
    """

    def __init__(self, beta: float, anneal_step: int) -> None:
        self.value = self.checked(beta, 'beta')
        self._step = (1.0 - beta) / anneal_step if anneal_step else 0.0

    @staticmethod
    def checked(value: Any, what: str) -> float:
        """``value`` as a float in [0, 1]: a real number (a 0-dim array or tensor too), not a bool, complex or str."""
        try:
            arr = np.asarray(as_numpy(value))  # (a tensor of a dtype numpy lacks: as float32, which holds it exactly)
            number = float(arr) if arr.ndim == 0 and arr.dtype.kind in 'iufO' else None
        except (TypeError, ValueError, OverflowError):  # (None; 10**400)
            number = None
        if number is None or not 0 <= number <= 1:
            raise ValueError(f"{what} must be in [0, 1], got {f'{value!r:.40}' if number is None else number}")
        return number

    def set(self, value: float) -> None:
        self.value = self.checked(value, 'beta')

    def draw(self) -> float:
        """The beta of this draw; the next one is annealed."""
        beta = self.value
        if self._step:
            self.value = min(1.0, beta + self._step)
        return beta


@warmer
def _warm_kernels() -> None:
    """Every compiled path of a prioritized buffer once, on a tiny index with the hot paths' dtypes (float32 and
    float64 priorities from a learner, int64 ids and slots from a sample, int64 use counts)."""
    ring = RingIndex(16)
    ring.commit(16)
    slots = np.arange(4, dtype=np.int64)
    ids = ring.uids(slots)
    for with_max in (False, True):
        index = PriorityIndex(16, 0.6, with_max=with_max)
        index.set_new(np.arange(8, dtype=np.int64), np.ones(8))
        index.fill_new(np.arange(8, 16, dtype=np.int64), index.default_priority())
        index.set_new_one(3, 2.0)
        index.draw(np.full(4, 0.5), 0.4, np.zeros(16, dtype=np.int64), ring)
        for dtype in (np.float32, np.float64):
            index.update_by_ids(ring, slots, ids, np.ones(4, dtype=dtype))
        index.update(slots, np.ones(4))
        index.sample(np.random.default_rng(0), 4)
        index.retire(slots[:1])
        index.tree.total()

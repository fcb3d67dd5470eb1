"""Removers: rules that decide which stored elements leave the buffer, behind one small interface.

A remover is asked twice per ``sample`` call, under the buffer's lock, and answers with slots to remove:

* ``before_sample(table, cur_learner_iter)`` -- e.g. ``StalenessLimit``: the oldest elements whose
  ``cur_learner_iter - collect_iter >= max_staleness`` (DI-engine's walk from the oldest, stopping at the first
  fresh element or one without ``collect_iter``);
* ``after_sample(table, slots, use)`` -- e.g. ``UseLimit``: elements drawn ``max_use`` times.

``table`` is what the preset stores elements in, seen through three read-only verbs: ``oldest(k)`` (the ``k``
oldest slots, oldest first), ``collect_iter(slots)`` (int64, ``NO_ITER`` where an element has none) and
``count``. Removers never change the table: the engine removes what they return and counts it under
``removed_by_<name>``. Users add their own rules with ``REMOVER_REGISTRY.register('name')`` and the config key
``removers=[dict(type='name', ...)]`` (their module listed in ``import_names``). A rule's class may declare
``checks`` (argument -> (predicate, what was expected)): its arguments are checked when the buffer is built, as the
top-level keys are (the built-in ``max_use`` / ``max_staleness`` reached by name take the same values as the keys).

``UseCounts`` is the per-slot column the use rule reads (times each element was drawn).
Not thread-safe: the buffer's lock serialises every call.

A rule of your own, registered and configured (keep only the 2 newest elements):

>>> from ding_buffer import create_buffer
>>> @REMOVER_REGISTRY.register('doc_keep_newest')
... class KeepNewest(Remover):
...     name = 'newest'
...     def before_sample(self, table, cur_learner_iter):
...         return table.oldest(max(table.count() - 2, 0))
>>> buf = create_buffer(dict(type='naive', removers=[dict(type='doc_keep_newest')]))
>>> buf.push([{'obs': i} for i in range(5)])
5
>>> sorted(d['obs'] for d in buf.sample(2)), buf.count(), buf.stats()['removed_by_newest']
([3, 4], 2, 3)
>>> buf.close(); del REMOVER_REGISTRY['doc_keep_newest']  # (a doctest: leave the registry as it was)
"""

from typing import Any, List, Mapping, Optional

import numpy as np
import torch

from .. import tree_kernels as kern
from ..base import Registry
from ..config import INF, apply_checks
from ..storage.base import NO_ITER, collect_iter_of  # noqa: F401 (re-exported)

_EMPTY = np.zeros(0, dtype=np.int64)

REMOVER_REGISTRY = Registry(what='remover type', key='removers[].type')


def limit_ok(x: Any) -> bool:
    """A ``max_use`` / ``max_staleness`` value: a number > 0, or inf (no limit)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


class Remover:
    """The interface (every verb optional). ``name`` is the counter suffix, ``removed_by_<name>``: a rule built from
    its registry name (``removers=[dict(type=...)]``) without a ``name`` of its own is counted under that name.

    Examples:
        >>> class DropEarly(Remover):  # register it with REMOVER_REGISTRY to use it (see the module docstring)
        ...     name = 'early'
        ...     def before_sample(self, table, cur_learner_iter):  # table: a buffer, read-only
        ...         slots = table.oldest(table.count())
        ...         return slots[table.collect_iter(slots) < 2]
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive'))
        >>> buf.push([{'obs': i, 'collect_iter': i} for i in range(4)])
        4
        >>> DropEarly().before_sample(buf, 0).tolist(), Remover().before_sample(buf, 0).tolist()  # the base: none
        ([0, 1], [])
        >>> buf.close()
    """

    name = 'rule'
    # Argument checks applied when a config builds the rule: argument -> (predicate, what was expected).
    checks: Mapping[str, Any] = {}

    def before_sample(self, table: Any, cur_learner_iter: int) -> np.ndarray:
        return _EMPTY

    def after_sample(self, table: Any, slots: np.ndarray, use: Optional[np.ndarray]) -> np.ndarray:
        return _EMPTY


@REMOVER_REGISTRY.register('max_use')
class UseLimit(Remover):
    """Remove an element once it has been drawn ``max_use`` times (within one batch too).

    Examples:
        >>> UseLimit(max_use=2).after_sample(None, slots=np.array([5, 7, 7]), use=np.array([2, 1, 2])).tolist()
        [5, 7]
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive', max_use=1))  # the config key builds this rule
        >>> buf.push([{'obs': i} for i in range(3)])
        3
        >>> len(buf.sample(2)), buf.count(), buf.stats()['removed_by_use']
        (2, 1, 2)
        >>> buf.close()
    """

    name = 'use'
    checks = {'max_use': (limit_ok, 'a number > 0 or inf')}

    def __init__(self, max_use: float) -> None:
        self.max_use = max_use

    def spent(self, use: np.ndarray) -> np.ndarray:
        """Mask of use counts at the limit (``update`` refuses those elements too)."""
        return use >= self.max_use

    def after_sample(self, table: Any, slots: np.ndarray, use: Optional[np.ndarray]) -> np.ndarray:
        return np.unique(slots[self.spent(use)])


@REMOVER_REGISTRY.register('max_staleness')
class StalenessLimit(Remover):
    """Remove the oldest elements while ``cur_learner_iter - collect_iter >= max_staleness``.

    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive', max_staleness=3))  # the config key builds this rule
        >>> buf.push([{'obs': i, 'collect_iter': i} for i in range(5)])
        5
        >>> StalenessLimit(3).before_sample(buf, cur_learner_iter=5).tolist()  # staleness 5, 4, 3 (2, 1 stay)
        [0, 1, 2]
        >>> sorted(d['obs'] for d in buf.sample(2, cur_learner_iter=5)), buf.stats()['removed_by_staleness']
        ([3, 4], 3)
        >>> buf.close()
    """

    name = 'staleness'
    checks = {'max_staleness': (limit_ok, 'a number > 0 or inf')}

    def __init__(self, max_staleness: float) -> None:
        self.max_staleness = max_staleness

    def before_sample(self, table: Any, cur_learner_iter: int) -> np.ndarray:
        chunk = 64
        while True:
            slots = table.oldest(chunk)
            if not len(slots):
                return _EMPTY
            ci = table.collect_iter(slots)
            stale = (ci != NO_ITER) & (cur_learner_iter - ci >= self.max_staleness)
            k = len(stale) if stale.all() else int(np.argmin(stale))
            if k < len(slots) or len(slots) < chunk:
                return slots[:k]
            chunk *= 2


def build_removers(cfg: Mapping) -> List[Remover]:
    """The rules of a preset config: ``max_staleness`` and ``max_use`` where finite, then ``removers`` entries --
    each entry's type looked up (an unknown name: ``ValueError`` with the registered name it is closest to) and its
    arguments checked with the class's ``checks`` (``ValueError`` naming ``removers[i].<argument>``, the value and
    what was expected) before the rule is built."""
    out: List[Remover] = []
    if cfg.get('max_staleness', INF) != INF:
        out.append(StalenessLimit(cfg.max_staleness))
    if cfg.get('max_use', INF) != INF:
        out.append(UseLimit(cfg.max_use))
    for i, entry in enumerate(cfg.get('removers') or []):
        out.append(build_remover(entry, f'removers[{i}]'))
    return out


def build_remover(entry: Any, where: str) -> Remover:
    """One ``removers`` entry (``where``: its config key, e.g. ``'removers[0]'``) as a rule, arguments checked.

    Examples:
        >>> build_remover(dict(type='max_use', max_use=3), 'removers[0]').max_use
        3
        >>> build_remover(dict(type='max_staleness', max_staleness=-5), 'removers[0]')
        Traceback (most recent call last):
        ValueError: config key 'removers[0].max_staleness' has invalid value -5; expected a number > 0 or inf
        >>> build_remover(dict(type='max_uses', max_use=3), 'removers[1]')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: unknown remover type 'max_uses' (config key 'removers[1].type'); did you mean 'max_use'? ...
    """
    if not isinstance(entry, Mapping) or not isinstance(entry.get('type'), str):
        raise ValueError(f"config key '{where}' must be a dict with a 'type', got {entry!r}")
    name = entry['type']
    cls = REMOVER_REGISTRY.get(name, key=f'{where}.type')
    kwargs = {k: v for k, v in entry.items() if k != 'type'}
    apply_checks(kwargs, getattr(cls, 'checks', None) or {}, prefix=f'{where}.')
    try:
        rule = cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"config key '{where}' ({name!r}) has bad arguments {kwargs}: {e}") from e
    if rule.name != name and not _names_itself(rule):  # counted under its registry name, removed_by_<type>
        try:
            rule.name = name
        except AttributeError:
            raise ValueError(
                f"config key '{where}': remover type {name!r} answers name {rule.name!r} and cannot be renamed; give "
                f"the class a 'name' of its own"
            ) from None
    if rule.name in _BUILT_IN_COUNTERS and not isinstance(rule, (UseLimit, StalenessLimit)):
        raise ValueError(
            f"config key '{where}': remover type {name!r} would be counted as removed_by_{rule.name}, the counter of "
            f"the built-in {_BUILT_IN_COUNTERS[rule.name]!r} rule; give the class another 'name'"
        )
    return rule


# counters of the built-in rules whose names differ from their registry names: a user rule never shares them
_BUILT_IN_COUNTERS = {'use': 'max_use', 'staleness': 'max_staleness'}


def _names_itself(rule: Remover) -> bool:
    """Whether ``rule`` has a ``name`` of its own: set on the instance, or declared by its own class (not the base
    interfaces' ``'rule'``). A name inherited from another class -- an interface (``CapacityRule``) or a rule it
    extends (``class Mine(OldestFirst)`` is not ``'fifo'``) -- is not its own: such a rule is counted and named under
    its registry name. Subclasses of ``UseLimit`` / ``StalenessLimit`` keep theirs (``removed_by_use`` /
    ``removed_by_staleness``: the engine counts the use limit under that name)."""
    if rule.name == Remover.name:
        return False
    if isinstance(rule, (UseLimit, StalenessLimit)) or 'name' in getattr(rule, '__dict__', {}):
        return True
    return 'name' in vars(type(rule))


def find_rule(rules: List[Remover], kind: type) -> Optional[Remover]:
    return next((r for r in rules if isinstance(r, kind)), None)


USE_MAX = 1 << 62  # the largest saved use count a buffer takes (then counted on in int64, never wrapping)


class UseCounts:
    """Times each slot's element was drawn (int64 per slot; reset when a slot is written or emptied).

    Examples:
        >>> use = UseCounts(4)
        >>> use.bump(np.array([1, 1, 3])).tolist(), use[np.arange(4)].tolist()
        ([1, 2, 1], [0, 2, 0, 1])
    """

    def __init__(self, capacity: int) -> None:
        self.counts = np.zeros(capacity, dtype=np.int64)

    def __getitem__(self, slots: Any) -> np.ndarray:
        return self.counts[slots]

    def bump(self, slots: np.ndarray) -> np.ndarray:
        """Count one draw per entry (in order: a slot drawn twice reports 1 then 2); returns the new counts."""
        out = np.empty(len(slots), dtype=np.int64)
        kern.bump_counts(self.counts, np.asarray(slots, dtype=np.int64), out)
        return out

    def unbump(self, slots: np.ndarray) -> None:
        """Take back one draw per entry of ``slots`` (what ``bump`` of the same slots added): a sample that failed."""
        np.subtract.at(self.counts, np.asarray(slots, dtype=np.int64), 1)

    def reset(self, slots: Any) -> None:
        self.counts[slots] = 0

    def resize(self, n: int) -> None:
        """Grow to ``n`` slots (append-only tables)."""
        if n > len(self.counts):
            self.counts = np.concatenate([self.counts, np.zeros(n - len(self.counts), dtype=np.int64)])

    def compact(self, keep: np.ndarray) -> None:
        """Slot ``keep[i]`` becomes slot ``i``; the rest are zero."""
        moved = self.counts[keep]
        self.counts[:] = 0
        self.counts[: len(keep)] = moved

    @classmethod
    def placed(cls, n: int, slots: np.ndarray, values: np.ndarray) -> 'UseCounts':
        """A column of ``n`` slots with ``values`` at ``slots`` (a restored append-only table), zero elsewhere."""
        new = cls(n)
        new.counts[slots] = values
        return new

    def state_dict(self, live: Optional[np.ndarray] = None) -> torch.Tensor:
        """The counts; 0 where ``live`` (a mask of the slots holding an element) is False: a count an emptied slot
        kept (a removal stopped part-way, by a Ctrl-C, before it reset them) counts nothing."""
        return torch.from_numpy(self.counts.copy() if live is None else np.where(live, self.counts, 0))

    def restored(self, state: Any, valid: Optional[np.ndarray] = None) -> 'UseCounts':
        """A new column from ``state`` (validated: shape, >= 0, zero at empty slots); raises ``ValueError``."""
        arr = np.asarray(state)
        if arr.shape != self.counts.shape or arr.dtype.kind not in 'iu':
            raise ValueError(f"saved 'use' has shape {arr.shape} dtype {arr.dtype}, expected ints {self.counts.shape}")
        if len(arr) and not (arr.min() >= 0 and arr.max() <= USE_MAX):  # (room to count on: no wrap)
            raise ValueError(f"saved use counts must be >= 0 and at most 2**62, got {arr.min()}..{arr.max()}")
        if valid is not None and (arr[~valid] != 0).any():
            raise ValueError("saved use counts are non-zero at empty slots")
        new = UseCounts(len(arr))
        new.counts[:] = arr
        return new

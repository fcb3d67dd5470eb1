"""``DequeTable`` / ``PrioritizedDequeTable``: DI-engine's ``DequeBufferWrapper`` semantics -- the tables of ``deque``.

Each is a slot table (``SlotTable``: uniform draws; ``PrioritizedTable`` with ``priority=True``) with the wrapper's
verbs mixed in (``DequeVerbs``): ``deque_request(size, train_iter)`` returns the pushed data (the table's own keys
dropped, ``'IS'`` kept with ``priority_IS_weight``) and remembers the batch, ``deque_update(meta)`` sets the
priorities of that *last sampled batch* (clipped at ``priority_max_limit``), and TensorBoard gets
``{instance_name}_iter/use_count_avg``, ``.../priority_avg``, ``.../priority_max`` and ``.../buffer_data_count``
every ``train_iter_per_log`` learner iterations and on the first.
"""

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from ..config import INF
from ..control.priority import as_priorities, check_one_each, real_numbers, split_ids
from ..monitor.tb import TBSink
from ..persistence import refuse_unknown
from ..storage.tensordict_io import is_tensordict
from .common import STEP_LIMIT, check_step
from .outputs import as_items
from .prioritized_table import PrioritizedTable
from .slot_table import SlotTable
from .table import Needs, Request, Restored

# Keys the slot table adds to a sampled item; the wrapper returns the pushed data (and 'IS').
INNER_KEYS = ('replay_unique_id', 'replay_buffer_idx', 'priority', 'staleness', 'use', 'IS')
INNER_TYPES = {False: 'NaiveReplayBuffer', True: 'AdvancedReplayBuffer'}  # what a saved 'inner' state names


def _without(item: Any, keys: List[str]) -> Any:
    """A sampled list item without ``keys``: a TensorDict stays one, an object that is no mapping stays as it is."""
    if is_tensordict(item):
        return item.exclude(*keys)
    if isinstance(item, Mapping):
        return {k: v for k, v in item.items() if k not in keys}
    return item


class _DequeDue(NamedTuple):
    """What a deque sample writes after the lock: the table's own due output and the deque's scalars."""

    inner: Any
    scalars: List[tuple]


def numbers(priority: Any) -> np.ndarray:
    """``update``'s priorities as a float64 vector: real numbers (``real_numbers``), one an item."""
    arr = real_numbers(priority)
    check_one_each(arr.shape)
    return arr.astype(np.float64).reshape(-1)


def items_out(cfg: Mapping) -> bool:
    """Whether samples leave as per-item dicts from tensor storage (``storage.output='items'``)."""
    return cfg.storage.get('type') == 'tensor' and cfg.storage.get('output') == 'items'


class DequeVerbs:
    """
    Overview:
        The wrapper's verbs and state (the last sampled batch, the last logged iteration) on top of a slot table
        (mixed into ``SlotTable`` / ``PrioritizedTable``: ``DequeTable`` / ``PrioritizedDequeTable``). The slot
        table's own ``request`` and ``update`` stay as they are (``deque.inner`` samples and updates with them);
        the deque's are ``deque_request`` and ``deque_update``.
    """

    state_keys = frozenset({'inner', 'last_log_train_iter', 'last_batch'})

    def __init__(self, cfg: Any, name: str, lock: Any, deque_cfg: Any, any_stored: bool = False) -> None:
        super().__init__(cfg, name, lock)  # ``cfg``, the engine's own, is the slot table's (``inner_config``)
        self.deque_cfg = deque_cfg
        self.any_stored = any_stored  # a sample needs only one stored item (DI-engine's prioritized deque)
        self.priority = bool(deque_cfg.priority)
        self._items = items_out(deque_cfg)
        self._tag = f'{name}_iter'
        self._last_log = -1
        self._last_batch: Optional[tuple] = None  # (ids, slots) of the last sample, for update()
        self._sink: Optional[TBSink] = None  # the borrowed writer's, made at the first write

    def needs(self) -> Needs:
        """The slot table's; ``any_stored``: a rate limiter without the minimum-size rule (the config keeps the
        ``advanced`` one: the translated config and ``deque.inner`` stay an advanced buffer's)."""
        needs = super().needs()
        if not self.any_stored:
            return needs
        return needs._replace(limiter={**dict(self.cfg.thruput_controller), 'sample_min_limit_ratio': 0.0})

    # ------------------------------------------------------------------ sample / update
    def deque_request(self, size: int, train_iter: int, timeout: Optional[float]) -> Request:
        """The slot table's sample (``train_iter`` is the prioritized table's learner iteration), finished by
        ``sampled``; the scalars it logs are written by ``emit``, after the lock (the draw's ``done`` hands them
        on with the table's own due output)."""
        train_iter = check_step(train_iter, 'train_iter')
        if self.priority:
            request = self.request(size, train_iter, timeout=timeout)
        else:
            request = self.request(size, timeout=timeout)
        scalars: List[tuple] = []  # filled by ``sampled`` (under the lock, after ``done``)
        meta: List[Any] = []  # list storage: the annotations of the drawn copies, for ``sampled``

        def draw(rng: Any) -> Any:
            drawn = request.draw(rng)
            if type(drawn) is str:
                return drawn
            if type(drawn.out) is list and (self.priority or self.cfg.storage.get('output') == 'items'):
                meta.append(drawn.out)  # (before any copy: the engine deep-copies the items, not these)
                drawn = drawn._replace(out=self._as_pushed(drawn.out, drawn.slots))
            if self.parts.tb_logger is None:
                return drawn
            done = drawn.done
            return drawn._replace(done=lambda envstep: _DequeDue(done(envstep) if done else None, scalars))

        return request._replace(
            draw=draw, finish=lambda out, use: self.sampled(out, use, train_iter, scalars, meta[-1] if meta else None)
        )

    def emit(self, due: Any) -> None:
        if type(due) is not _DequeDue:
            return super().emit(due)
        if due.inner is not None:
            super().emit(due.inner)
        if due.scalars:
            if self._sink is None:
                self._sink = TBSink(self.parts.tb_logger, owned=False)  # (borrowed: never closed here)
            for tag, value, step in due.scalars:
                self._sink.add_scalar(tag, value, step)

    def release(self) -> None:
        """At ``close``: the borrowed writer's last scalars are flushed (it stays open), then the slot table's."""
        if self._sink is not None:
            self._sink.close()
        super().release()

    def sampled(
        self, out: Any, use: Optional[np.ndarray], train_iter: int, scalars: List[tuple], annotated: Any = None
    ) -> Any:
        """Under the lock, after a sample: the batch is remembered for ``update``, the TensorBoard scalars due every
        ``train_iter_per_log`` put in ``scalars``; returns the batch without the slot table's id columns
        (``annotated``: list items already made as pushed, and the slot table's items they came from)."""
        tensor = not isinstance(out, list)
        src = out if annotated is None else annotated
        if self.priority:
            ids = src['replay_unique_id'].tolist() if tensor else [d['replay_unique_id'] for d in src]
            slots = src['replay_buffer_idx'].tolist() if tensor else [int(d['replay_buffer_idx']) for d in src]
            priority = np.asarray(src['priority'] if tensor else [d['priority'] for d in src], dtype=np.float64)
            self._last_batch = (ids, slots)
        else:
            priority = None
        self._log(train_iter, priority, use, scalars)
        return out if annotated is not None else self._data(out, tensor)

    def _as_pushed(self, out: List[Any], slots: np.ndarray) -> List[Any]:
        """List items as pushed (DI-engine's wrapper returns the pushed data): the slot table's annotations took the
        place of the user's fields of their names in each drawn copy, so a plain dict is made again from the stored
        one -- without the 'priority' a prioritized deque's push took, with this draw's 'IS' under
        ``priority_IS_weight``. Other items (TensorDicts) lose the annotations."""
        drop = self._dropped()
        weights = self.priority and self.deque_cfg.priority_IS_weight
        made = []
        for drawn, item in zip(out, self._storage.gather(slots)):
            if type(drawn) is not dict or not isinstance(item, Mapping) or is_tensordict(item):
                made.append(_without(drawn, drop))
                continue
            d = {k: v for k, v in item.items() if not (self.priority and k == 'priority')}
            if weights:
                d['IS'] = drawn['IS']
            made.append(d)
        return made

    def _dropped(self) -> List[str]:
        """The slot table's keys a sample of the deque does not return."""
        if not self.priority:
            return list(INNER_KEYS[:2])
        return [k for k in INNER_KEYS if not (self.deque_cfg.priority_IS_weight and k == 'IS')]

    def _data(self, out: Any, tensor: bool) -> Any:
        drop = self._dropped()  # (the naive table adds ids to tensor batches and, output='items', to list items)
        if not self.priority and not tensor and self.cfg.storage.get('output') != 'items':
            return out  # stored dicts
        if tensor:
            if type(out) is not dict:  # a TensorDict (tensordict_io); output='items' asked for items by name
                if not self._items:
                    return out.exclude(*drop)
                out = out.to_dict()
            out = {k: v for k, v in out.items() if k not in drop}
            return as_items(out, self.name) if self._items else out
        return [_without(d, drop) for d in out]

    def _log(self, train_iter: int, priority: Any, use: Any, scalars: List[tuple]) -> None:
        if self.parts.tb_logger is None or not (
            self._last_log == -1 or train_iter - self._last_log >= self.deque_cfg.train_iter_per_log
        ):
            return
        if self.deque_cfg.max_use != INF and use is not None and len(use):
            scalars.append((f'{self._tag}/use_count_avg', float(np.mean(use)), train_iter))
        if priority is not None and len(priority):
            scalars.append((f'{self._tag}/priority_avg', float(priority.mean()), train_iter))
            scalars.append((f'{self._tag}/priority_max', float(priority.max()), train_iter))
        scalars.append((f'{self._tag}/buffer_data_count', self.count(), train_iter))
        self._last_log = train_iter

    def deque_update(self, meta: Any) -> Any:
        if not isinstance(meta, Mapping):
            raise TypeError(f"update takes a dict with 'priority', got {type(meta).__name__}")
        if meta.get('priority') is None:
            return {'updated': 0, 'stale': 0}
        priority = numbers(meta['priority'])  # checked even when there is nothing to apply it to
        if not self.priority:
            return {'updated': 0, 'stale': 0}
        # values as the batch's update checks them (after clipping at the limit), with or without a batch to apply to
        as_priorities(np.minimum(priority, float(self.deque_cfg.priority_max_limit)))

        def apply(spent: Any) -> Tuple[int, int]:  # under the engine's lock: the last batch stays put
            batch = self._last_batch
            if batch is None:
                return 0, 0
            if len(priority) != len(batch[0]):
                raise ValueError(
                    f"update: {len(priority)} priorities for the last sampled batch of {len(batch[0])} items"
                )
            clipped = np.minimum(priority, float(self.deque_cfg.priority_max_limit))  # NaN stays NaN: refused
            out = self.update({'replay_unique_id': batch[0], 'replay_buffer_idx': batch[1], 'priority': clipped})
            counts = out(spent) if callable(out) else (out['updated'], out['updated'] + out['stale'])
            self._last_batch = None
            return counts

        return apply

    # ------------------------------------------------------------------ clear / state

    def state(self, engine: Dict[str, Any]) -> Dict[str, Any]:
        return {'inner': {'type': INNER_TYPES[self.priority], **super().state(engine)}, **self.wrapper_state()}

    def wrapper_state(self) -> Dict[str, Any]:
        """The wrapper's own entries of the state: the last logged iteration and the last sampled batch."""
        batch = self._last_batch
        return {
            'last_log_train_iter': self._last_log,
            'last_batch': None if batch is None else {'ids': list(batch[0]), 'slots': list(batch[1])},
        }

    def restore(self, state: Dict[str, Any]) -> Restored:
        last = state.get('last_log_train_iter')
        if type(last) is not int or not -STEP_LIMIT < last < STEP_LIMIT:  # what sample's train_iter may be
            raise ValueError(
                f"state has an invalid 'last_log_train_iter' entry {last!r:.40}; expected an int within +-2**60"
            )
        inner = state.get('inner')
        if not isinstance(inner, Mapping):
            raise ValueError("state has no 'inner' entry (the state of the table doing the work)")
        if inner.get('type') != INNER_TYPES[self.priority]:
            raise ValueError(
                f"state's 'inner' entry was made by {inner.get('type')!r}; this deque keeps "
                f"{INNER_TYPES[self.priority]!r} state (priority={self.priority})"
            )
        refuse_unknown(inner, super().state_keys | {'type'}, "state 'inner'")
        batch = self._checked_batch(state.get('last_batch'))
        restored = super().restore(dict(inner))

        def swap() -> None:
            restored.swap()
            self._last_log, self._last_batch = last, batch

        return restored._replace(swap=swap)

    def _checked_batch(self, batch: Any) -> Optional[tuple]:
        """A saved 'last sampled batch': None, or ids (str / int) and slots (ints in range) of equal length."""
        if batch is None:
            return None
        ids, slots = (batch.get('ids'), batch.get('slots')) if isinstance(batch, Mapping) else (None, None)
        ok = (
            isinstance(ids, list)
            and isinstance(slots, list)
            and len(ids) == len(slots)
            and all(type(i) is str or (type(i) is int and 0 <= i < 1 << 63) for i in ids)
            and all(type(k) is int and 0 <= k < self.capacity() for k in slots)
        )
        if ok:
            try:
                split_ids(ids, self.name)  # as update reads them: a str id past int64 would fail every update
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(
                f"state has an invalid 'last_batch' entry {batch!r:.80}; expected None or "
                f"{{'ids': [str or int in [0, 2**63) ...], 'slots': [slot ints]}} of equal length"
            )
        return list(ids), list(slots)

    def describe(self) -> str:
        return f"priority={self.priority}, {super().describe()}"


class DequeTable(DequeVerbs, SlotTable):
    """The table of a deque with ``priority=False``: uniform draws without replacement."""


class PrioritizedDequeTable(DequeVerbs, PrioritizedTable):
    """The table of a deque with ``priority=True``: prioritized draws, ``update`` of the last batch."""


def deque_table(cfg: Any, name: str, lock: Any, deque_cfg: Any, any_stored: bool = False) -> DequeVerbs:
    """The deque's table, as its config asks (``priority``)."""
    return (PrioritizedDequeTable if deque_cfg.priority else DequeTable)(cfg, name, lock, deque_cfg, any_stored)


__all__ = ['DequeTable', 'PrioritizedDequeTable', 'deque_table', 'INNER_KEYS', 'items_out', 'numbers']

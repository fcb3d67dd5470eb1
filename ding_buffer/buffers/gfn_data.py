"""What a GFlowNet buffer stores: validated incoming batches and the three item stores behind the buffers.

A push is one of

* a dict of tensors with a leading batch dimension (``state_key``, ``log_reward_key``, optional
  ``condition_key``, any other fields), or a list of such item dicts without the batch dimension: kept by
  ``ColumnStore`` (one preallocated tensor per field, on the configured device; slots are reused);
* a torchgfn ``Trajectories``, ``Transitions`` or ``StatesContainer`` of tensor states: kept by ``ContainerRing``
  (one tensor per per-item field of the container, written in place at the item's slot; slots are reused, so a
  push costs O(batch) -- no copy of the stored items -- and a sample gathers only the drawn items);
* any other object with the Container protocol (``__len__``, ``__getitem__`` with an index tensor, ``extend``,
  ``log_rewards``, ``terminating_states``): kept by ``ContainerStore`` (one container of the pushed type,
  append-only, compacted with one indexing call once half of it is dead; its ``extend`` decides the cost).

``GFNBatch`` carries what the buffer decides on: the log-rewards (float64) and, where an item has one
terminating state, its representation row (state flattened, condition concatenated; float64).
"""
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch

from ..storage.base import NO_ITER
from ..storage.tensor_storage import TensorStorage, export_schema, import_fields


class GFNBatch(NamedTuple):
    payload: Any  # store-specific: a ``Prepared`` (columns) or a container
    n: int
    log_reward: np.ndarray  # float64 (n,); NaN where the container carries no log-rewards
    rows: Optional[np.ndarray]  # float64 (n, d) representations, or None when items have no single state


def check_log_reward(r: np.ndarray, key: str) -> None:
    """NaN and +inf are refused (-inf is a reward of 0 and fine)."""
    if np.isfinite(r).all():  # the common case: one pass
        return
    bad = np.flatnonzero(np.isnan(r) | (r == np.inf))
    if len(bad):
        raise ValueError(
            f"'{key}' must be finite or -inf; item {int(bad[0])} is {r[bad[0]]} ({len(bad)} bad value(s))"
        )


def representation(state: torch.Tensor, condition: Optional[torch.Tensor], n: int) -> np.ndarray:
    """Rows ``[state.flatten(), condition.flatten()]`` as float64 (the diversity filter's input)."""
    rows = state.detach().reshape(n, -1).to('cpu', torch.float64)
    if condition is not None:
        rows = torch.cat([rows, condition.detach().reshape(n, -1).to('cpu', torch.float64)], dim=1)
    return rows.numpy()


def is_container(data: Any) -> bool:
    """The Container protocol (checked on the class, so no property is evaluated)."""
    cls = type(data)
    return all(hasattr(cls, a) for a in ('__len__', '__getitem__', 'extend', 'log_rewards', 'terminating_states'))


class ColumnStore:
    """Dicts of tensors in a ``TensorStorage`` whose slots the buffer assigns (``write_at`` / ``read_at``)."""
    reuses_slots = True
    kind = 'columns'

    def __init__(self, physical: int, device: str, state_key: str, log_reward_key: str,
                 condition_key: Optional[str]) -> None:
        self.storage = TensorStorage(physical, device=device)
        self.state_key, self.log_reward_key, self.condition_key = state_key, log_reward_key, condition_key

    def prepare(self, data: Any, need_rows: bool) -> GFNBatch:
        if isinstance(data, list):
            prepared = self.storage.prepare(data, trim=False)
        else:
            prepared = self.storage.prepare_batch(data, trim=False)
        _, columns = prepared.payload
        n = prepared.n
        for key in (self.state_key, self.log_reward_key, self.condition_key):
            if key is not None and (key, ) not in columns:
                found = sorted('.'.join(p) for p in columns)
                raise ValueError(f"GFlowNet batch has no field '{key}' (config key naming it); fields: {found}")
        r_t = columns[(self.log_reward_key, )]
        if r_t.dim() != 1 or not r_t.dtype.is_floating_point:
            raise ValueError(
                f"field '{self.log_reward_key}' must hold one float log-reward per item, got shape "
                f"{tuple(r_t.shape)} dtype {r_t.dtype}"
            )
        r = r_t.detach().to('cpu', torch.float64).numpy()
        check_log_reward(r, self.log_reward_key)
        rows = None
        if need_rows:
            cond = columns[(self.condition_key, )] if self.condition_key is not None else None
            rows = representation(columns[(self.state_key, )], cond, n)
        return GFNBatch(prepared, n, r, rows)

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: np.ndarray) -> None:
        self.storage.write_at(slots, batch.payload, rows)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """The items' ``collect_iter`` field (staleness); ``NO_ITER`` without one."""
        return self.storage.collect_iter(slots)

    def read(self, slots: np.ndarray, ids: np.ndarray) -> Dict[str, Any]:
        out = self.storage.read_at(slots)
        device = self.storage.device
        out['replay_buffer_idx'] = torch.from_numpy(np.array(slots, dtype=np.int64)).to(device)
        out['replay_unique_id'] = torch.from_numpy(np.array(ids, dtype=np.int64)).to(device)
        return out

    def state_dict(self, slots: np.ndarray) -> Dict[str, Any]:
        st = self.storage
        fields = [] if st.schema is None else [t.cpu() for t in st.read_fields(slots)]
        return {'kind': self.kind, 'schema': export_schema(st.schema), 'fields': fields}

    def restored(self, state: Dict[str, Any], n: int, slots: Optional[np.ndarray] = None) -> 'ColumnStore':
        """A new store with the saved ``n`` items at ``slots`` (default ``0..n-1``; validated by the index)."""
        if state.get('kind') != self.kind:
            raise ValueError(f"saved GFlowNet store is {state.get('kind')!r}, this buffer stores {self.kind!r}")
        new = ColumnStore(self.storage.capacity, str(self.storage.device), self.state_key, self.log_reward_key,
                          self.condition_key)
        schema, fields = import_fields(state['schema'], state['fields'], n)
        if schema:
            new.storage.allocate(schema)
            new.storage.write_fields(np.arange(n, dtype=np.int64) if slots is None else slots, fields)
        return new

    def clear(self) -> None:
        pass  # the slots are simply overwritten later


_CACHED_FIELDS = ('log_probs', 'estimator_outputs')


class ContainerStoreBase:
    """What both container stores share: the Container protocol's log-rewards and terminating-state rows, no
    ``collect_iter``, and persistence (torchgfn containers as plain tensors, other objects pickled)."""
    kind = 'container'
    cls: Optional[type] = None

    @staticmethod
    def log_rewards_of(data: Any, n: int) -> np.ndarray:
        r = data.log_rewards
        if r is None:
            return np.full(n, np.nan)
        r = torch.as_tensor(r).detach().to('cpu', torch.float64).reshape(-1).numpy()
        if len(r) != n:
            raise ValueError(f"container log_rewards has {len(r)} entries for {n} items")
        check_log_reward(r, 'log_rewards')
        return r

    @staticmethod
    def rows_of(data: Any, n: int) -> Optional[np.ndarray]:
        """One row per item when the container has exactly one terminating state per item."""
        ts = data.terminating_states
        tensor = ts if isinstance(ts, torch.Tensor) else getattr(ts, 'tensor', None)
        if tensor is None or tensor.shape[0] != n:
            return None
        cond = getattr(ts, 'conditions', None)
        return representation(tensor, cond if isinstance(cond, torch.Tensor) else None, n)

    def read(self, slots: np.ndarray, ids: Any = None) -> Any:
        raise NotImplementedError

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """Containers carry no ``collect_iter``: never stale."""
        return np.full(len(slots), NO_ITER, dtype=np.int64)

    def state_dict(self, slots: np.ndarray) -> Dict[str, Any]:
        if self.cls is None:
            return {'kind': self.kind, 'format': 'empty'}
        live = self.read(slots, slots)
        if type(live).__module__.startswith('gfn.') and hasattr(live, 'to_tensordict'):
            # torchgfn: plain tensors only, loadable with weights_only=True (rebuilt with the env on load)
            return {'kind': self.kind, 'format': 'torchgfn', 'class': _qualified(type(live)),
                    'tensors': live.to_tensordict().to_dict()}
        return {'kind': self.kind, 'format': 'object', 'container': live}  # needs allow_pickle on load


class ContainerStore(ContainerStoreBase):
    """One container of the first pushed type. Slots are positions in it (append-only until ``compact``)."""
    reuses_slots = False

    def __init__(self) -> None:
        self.container: Any = None
        self.cls: Optional[type] = None

    def __len__(self) -> int:
        return 0 if self.container is None else len(self.container)

    @property
    def env(self) -> Any:
        return getattr(self.container, 'env', None)

    def prepare(self, data: Any, need_rows: bool) -> GFNBatch:
        if self.cls is not None and type(data) is not self.cls:
            raise TypeError(f"this buffer holds {self.cls.__name__} containers, got {type(data).__name__}")
        n = len(data)
        r = self.log_rewards_of(data, n)
        return GFNBatch(data, n, r, self.rows_of(data, n) if need_rows else None)

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: np.ndarray) -> None:
        """Append items ``rows`` of the batch; ``slots`` are the next positions."""
        assert len(slots) == 0 or int(slots[0]) == len(self), 'container slots are appended in order'
        part = batch.payload[torch.from_numpy(np.asarray(rows, dtype=np.int64))]  # a copy, never the caller's
        if self.container is None:
            self.container, self.cls = part, type(batch.payload)
        else:
            self.container.extend(part)
        for attr in _CACHED_FIELDS:  # replayed data is re-evaluated by the learner (torchgfn does the same)
            if getattr(self.container, attr, None) is not None:
                setattr(self.container, attr, None)

    def read(self, slots: np.ndarray, ids: Any = None) -> Any:
        return self.container[torch.from_numpy(np.asarray(slots, dtype=np.int64))]

    def compact(self, keep: np.ndarray) -> None:
        """Position ``keep[i]`` becomes position ``i`` (one indexing call)."""
        if self.container is not None:
            self.container = self.container[torch.from_numpy(np.asarray(keep, dtype=np.int64))]

    def clear(self) -> None:
        if self.container is not None:
            self.container = self.container[torch.zeros(0, dtype=torch.int64)]

    def place(self, container: Any, slots: np.ndarray) -> None:
        """Hold a restored ``container`` (its positions are the items' slots ``0..n-1``)."""
        self.container, self.cls = container, type(container)


# ---------------------------------------------------------------------------------------------------- ring
class _Col(NamedTuple):
    """One per-item tensor of a torchgfn container. ``get`` reads it (None when absent); ``time`` is -1 for a
    batch-major tensor ``[n, ...]`` and ``k >= 0`` for a time-major one ``[t + k, n, ...]`` (Trajectories: states
    have ``t + 1`` rows and actions ``t`` for a longest item of ``t`` steps), padded past an item's end with
    ``pad(container)`` (the sink state, the dummy action, -inf conditions: what torchgfn's ``extend`` pads with)."""
    name: str
    get: Callable[[Any], Any]
    optional: bool  # may be None (log-rewards, conditions): kept while every push has it, as torchgfn's extend does
    time: int = -1
    pad: Optional[Callable[[Any], Any]] = None


def _states_cols(attr: str, time: int = -1) -> Tuple[_Col, ...]:
    sf = (lambda c: type(getattr(c, attr)).sf) if time >= 0 else None
    inf = (lambda c: float('-inf')) if time >= 0 else None
    return (_Col(attr, lambda c: getattr(c, attr).tensor, False, time, sf),
            _Col(attr + '.conditions', lambda c: getattr(c, attr).conditions, True, time, inf))


_LOG_REWARDS = _Col('log_rewards', lambda c: c._log_rewards, True)  # what torchgfn's to_tensordict saves
_TERMINATING = _Col('is_terminating', lambda c: c.is_terminating, False)
_LAYOUTS: Dict[str, Tuple[_Col, ...]] = {
    'StatesContainer': _states_cols('states') + (_TERMINATING, _LOG_REWARDS),
    'Transitions': _states_cols('states') + (_Col('actions', lambda c: c.actions.tensor, False), _TERMINATING)
    + _states_cols('next_states') + (_LOG_REWARDS, ),
    'Trajectories': _states_cols('states', 1) + (
        _Col('actions', lambda c: c.actions.tensor, False, 0, lambda c: type(c.actions).dummy_action),
        _Col('terminating_idx', lambda c: c.terminating_idx, False), _LOG_REWARDS),
}
_MODULES = ('gfn.containers.states_container', 'gfn.containers.transitions', 'gfn.containers.trajectories')


class ContainerRing(ContainerStoreBase):
    """
    Overview:
        torchgfn's ``Trajectories`` / ``Transitions`` / ``StatesContainer`` (tensor states) as one tensor per
        per-item field (states, conditions, actions, masks, terminating indices, log-rewards), indexed by slot
        on the item dimension. ``log_probs`` and ``estimator_outputs`` are not kept (replayed data is
        re-evaluated by the learner; torchgfn's buffers drop them too). ``read`` builds a container of the
        pushed class from the drawn slots, equal to what indexing one concatenated container would give.
    Complexity: ``write`` O(items written x item size): one ``index_copy_`` per field, no copy of stored
        items; the tensors grow by doubling up to ``physical`` slots, and in time (Trajectories longer than any
        stored one) by at least 1.25x, so growth is O(1) amortised per stored item. ``read`` O(drawn items).
    Not thread-safe (the buffer's lock serialises calls).
    """
    reuses_slots = True

    def __init__(self, physical: int) -> None:
        self.physical = physical
        self.cls: Optional[type] = None
        self.env: Any = None
        self.is_backward = False
        self.device: Optional[torch.device] = None
        self.layout: Tuple[_Col, ...] = ()
        self.cols: Dict[str, Optional[torch.Tensor]] = {}  # None: a field dropped (or never pushed)
        self.pads: Dict[str, torch.Tensor] = {}
        self.types: Dict[str, Tuple[type, bool]] = {}  # states / next_states / actions: (class, debug)
        self.size = 0  # item capacity of the tensors
        self.steps = 0  # Trajectories: time capacity (actions rows; states have one more)
        self.tidx: Optional[np.ndarray] = None  # Trajectories: terminating_idx per slot (trims reads)
        self.end = 0  # slots below have been written

    @staticmethod
    def accepts(data: Any) -> bool:
        """torchgfn's own three container classes with tensor states (graph states go to ``ContainerStore``)."""
        cls = type(data)
        if cls.__module__ not in _MODULES or cls.__name__ not in _LAYOUTS:
            return False
        return all(isinstance(getattr(getattr(data, a), 'tensor', None), torch.Tensor)
                   for a in ('states', 'next_states', 'actions') if hasattr(data, a))

    def __len__(self) -> int:
        return self.end

    @property
    def container(self) -> Any:
        """Slots ``0..len-1`` as one container (a copy; slots not live hold stale items). For inspection."""
        return None if self.cls is None else self.read(np.arange(self.end, dtype=np.int64))

    # ------------------------------------------------------------------ push
    def prepare(self, data: Any, need_rows: bool) -> GFNBatch:
        if self.cls is not None and type(data) is not self.cls:
            raise TypeError(f"this buffer holds {self.cls.__name__} containers, got {type(data).__name__}")
        n = len(data)
        r = self.log_rewards_of(data, n)
        self._check(data, n)
        return GFNBatch(data, n, r, self.rows_of(data, n) if need_rows else None)

    def rows_of(self, data: Any, n: int) -> Optional[np.ndarray]:
        """As ``ContainerStoreBase.rows_of``; StatesContainer / Transitions: their terminating states are the
        ``is_terminating`` rows, so one per item exactly when every row is terminating (no gather needed)."""
        mask = getattr(data, 'is_terminating', None)
        if mask is None:
            return ContainerStoreBase.rows_of(data, n)
        if not bool(mask.all()):
            return None
        states = data.states
        return representation(states.tensor, states.conditions, n)

    def _check(self, data: Any, n: int) -> None:
        """Everything a write could fail on, checked before anything changes: every field a tensor of ``n`` items
        and, once a first push fixed them, the stored item shape and device."""
        name = type(data).__name__
        for col in _LAYOUTS[name]:
            x = col.get(data)
            if x is None:
                if col.optional:
                    continue
                raise ValueError(f"{name}.{col.name} is None; stored {name} need it")
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}.{col.name} is a {type(x).__name__}, not a tensor")
            b = 0 if col.time < 0 else 1
            if x.dim() <= b or x.shape[b] != n:
                raise ValueError(f"{name}.{col.name} has shape {tuple(x.shape)}: not {n} items on dim {b}")
            ring = self.cols.get(col.name)
            if ring is not None and (x.shape[b + 1:] != ring.shape[b + 1:] or x.device != ring.device):
                raise ValueError(
                    f"{name}.{col.name} holds items of shape {tuple(x.shape[b + 1:])} on {x.device}; the stored "
                    f"ones are {tuple(ring.shape[b + 1:])} on {ring.device}")

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: np.ndarray) -> None:
        """Items ``rows`` of the (prepared) batch go to ``slots``: one ``index_copy_`` per field; time-major fields
        are written up to the longest written item and padded after it."""
        m = len(rows)
        if not m:
            return
        data = batch.payload
        if self.cls is None:
            self._adopt(data)
        rows = np.asarray(rows, dtype=np.int64)
        whole = m == batch.n and (m == 1 or bool((rows[1:] > rows[:-1]).all()))  # rows == 0..n-1
        sel = None if whole else torch.from_numpy(rows).to(self.device)
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)
        self._reserve(int(slots.max()) + 1)
        t = 0
        if self.tidx is not None:
            tid = data.terminating_idx.detach().cpu().numpy()
            tid = np.maximum(tid if whole else tid[rows], 0)
            self.tidx[slots] = tid
            t = int(tid.max())
            self._grow_time(t)
        with torch.no_grad():
            for col in self.layout:
                ring = self.cols[col.name]
                if ring is None:
                    continue
                x = col.get(data)
                if x is None:  # a push without it: dropped for good (torchgfn's extend sets it to None)
                    self.cols[col.name] = None
                    continue
                ring = self._widen(col.name, x.dtype)
                if col.time < 0:
                    ring.index_copy_(0, idx, (x if sel is None else x.index_select(0, sel)).to(ring.dtype))
                    continue
                # stored item-major ([slot, step, ...]): an item is one contiguous block, so scattering m items
                # touches m blocks (time-major storage would touch steps x m scattered rows)
                k = min(t + col.time, x.shape[0])
                src = x[:k] if sel is None else x[:k].index_select(1, sel)
                block = ring.new_empty((m, ) + tuple(ring.shape[1:]))
                block[:, :k] = src.transpose(0, 1)
                block[:, k:] = self.pads[col.name]
                ring.index_copy_(0, idx, block)
        self.end = max(self.end, int(slots.max()) + 1)

    def _adopt(self, data: Any) -> None:
        """The first write fixes the class, env, direction and the fields' dtypes and item shapes."""
        self.cls, self.env = type(data), data.env
        self.is_backward = bool(getattr(data, 'is_backward', False))
        self.layout = _LAYOUTS[self.cls.__name__]
        self.types = {a: (type(getattr(data, a)), bool(getattr(getattr(data, a), 'debug', False)))
                      for a in ('states', 'next_states', 'actions') if hasattr(data, a)}
        self.size = min(self.physical, max(64, len(data)))
        self.steps = 0
        for col in self.layout:
            x = col.get(data)
            if x is None:
                self.cols[col.name] = None
                continue
            self.device = x.device
            if col.time < 0:
                shape = (self.size, ) + tuple(x.shape[1:])
            else:  # item-major: [slot, step, ...]
                shape = (self.size, self.steps + col.time) + tuple(x.shape[2:])
                self.pads[col.name] = torch.as_tensor(col.pad(data), dtype=x.dtype).to(x.device)
            self.cols[col.name] = torch.empty(shape, dtype=x.dtype, device=x.device)
        self.tidx = np.zeros(self.size, dtype=np.int64) if 'terminating_idx' in self.cols else None

    def _widen(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The stored field, promoted when a push brings a wider dtype (as ``torch.cat`` would)."""
        ring = self.cols[name]
        if dtype != ring.dtype:
            wider = torch.promote_types(ring.dtype, dtype)
            if wider != ring.dtype:
                ring = self.cols[name] = ring.to(wider)
                if name in self.pads:
                    self.pads[name] = self.pads[name].to(wider)
        return ring

    def _reserve(self, items: int) -> None:
        """Room for slots ``0..items-1`` (doubling, at most ``physical``)."""
        if items <= self.size:
            return
        size = min(self.physical, max(items, 2 * self.size))
        for col in self.layout:
            ring = self.cols[col.name]
            if ring is None:
                continue
            new = ring.new_empty((size, ) + tuple(ring.shape[1:]))
            new[:self.size] = ring
            self.cols[col.name] = new
        if self.tidx is not None:
            self.tidx = np.concatenate([self.tidx, np.zeros(size - self.size, dtype=np.int64)])
        self.size = size

    def _grow_time(self, steps: int) -> None:
        """Trajectories: room for ``steps`` actions per item (at least 1.25x, the new rows padded)."""
        if steps <= self.steps:
            return
        steps = max(steps, self.steps + self.steps // 4)
        for col in self.layout:
            ring = self.cols[col.name]
            if ring is None or col.time < 0:
                continue
            new = ring.new_empty((ring.shape[0], steps + col.time) + tuple(ring.shape[2:]))
            new[:, :ring.shape[1]] = ring
            new[:, ring.shape[1]:] = self.pads[col.name]
            self.cols[col.name] = new
        self.steps = steps

    # ------------------------------------------------------------------ read
    def read(self, slots: np.ndarray, ids: Any = None) -> Any:
        """The items at ``slots`` as one container of the stored class (a copy; Trajectories are trimmed to the
        longest drawn item, as torchgfn's indexing does)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        idx = torch.from_numpy(slots).to(self.device)
        t = int(self.tidx[slots].max()) if self.tidx is not None and len(slots) else 0
        out = {}
        for col in self.layout:
            ring = self.cols[col.name]
            if ring is not None:
                out[col.name] = ring.index_select(0, idx) if col.time < 0 else \
                    ring[:, :t + col.time].index_select(0, idx).transpose(0, 1).contiguous()
        return self._build(out)

    def _build(self, t: Dict[str, torch.Tensor]) -> Any:
        def states(attr: str) -> Any:
            cls, debug = self.types[attr]
            return cls(tensor=t[attr], conditions=t.get(attr + '.conditions'), debug=debug)

        name, r = self.cls.__name__, t.get('log_rewards')
        if name == 'StatesContainer':
            return self.cls(env=self.env, states=states('states'), is_terminating=t['is_terminating'], log_rewards=r)
        acls, adebug = self.types['actions']
        actions = acls(t['actions'], debug=adebug)
        if name == 'Transitions':
            return self.cls(env=self.env, states=states('states'), actions=actions, is_terminating=t['is_terminating'],
                            next_states=states('next_states'), is_backward=self.is_backward, log_rewards=r)
        return self.cls(env=self.env, states=states('states'), actions=actions, terminating_idx=t['terminating_idx'],
                        is_backward=self.is_backward, log_rewards=r)

    def clear(self) -> None:
        self.end = 0  # the tensors stay; slots are simply overwritten later

    def place(self, container: Any, slots: np.ndarray) -> None:
        """Hold a restored ``container``: its item ``i`` at ``slots[i]``."""
        n = len(container)
        if n:
            self.write(np.asarray(slots, dtype=np.int64), GFNBatch(container, n, np.empty(0), None),
                       np.arange(n, dtype=np.int64))
        else:
            self._adopt(container)


# ---------------------------------------------------------------------------------------------------- both
def container_store(data: Any, physical: int) -> ContainerStoreBase:
    """The store for containers like ``data``: ``ContainerRing`` for torchgfn's tensor containers, else the
    append-only ``ContainerStore``."""
    return ContainerRing(physical) if ContainerRing.accepts(data) else ContainerStore()


def rebuild_container(state: Dict[str, Any], n: int, env: Any) -> Any:
    """The container a container store saved (``n`` items; torchgfn containers are rebuilt with ``env``), or None
    for a store that never held one."""
    if state.get('kind') != ContainerStoreBase.kind:
        raise ValueError(f"saved GFlowNet store is {state.get('kind')!r}, this buffer stores "
                         f"{ContainerStoreBase.kind!r}")
    fmt = state.get('format')
    if fmt == 'empty':
        return None
    if fmt == 'object':
        container = state['container']
    elif fmt == 'torchgfn':
        cls = _torchgfn_class(state['class'])
        if env is None:
            raise ValueError(f"rebuilding torchgfn {cls.__name__} needs its environment: pass env=... to load_data")
        from tensordict import TensorDict
        container = cls.from_tensordict(env, TensorDict(state['tensors']))
    else:
        raise ValueError(f"unknown saved container format {fmt!r}")
    if not is_container(container) or len(container) != n:
        raise ValueError(f"saved container holds {len(container)} items, the index {n}")
    return container


def _qualified(cls: type) -> str:
    return f'{cls.__module__}:{cls.__qualname__}'


def _torchgfn_class(name: str) -> type:
    """Only torchgfn's own container classes are rebuilt by name (nothing else is imported from a file)."""
    import importlib
    module, _, qual = str(name).partition(':')
    if not module.startswith('gfn.containers') or '.' in qual:
        raise ValueError(f"refusing to rebuild container class {name!r}: only gfn.containers classes load")
    cls = getattr(importlib.import_module(module), qual, None)
    if not isinstance(cls, type) or not hasattr(cls, 'from_tensordict'):
        raise ValueError(f"{name!r} is not a torchgfn container class")
    return cls

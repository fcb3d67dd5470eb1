"""``ContainerRing``: torchgfn's ``Trajectories`` / ``Transitions`` / ``StatesContainer`` (tensor states) kept as one
preallocated tensor per per-item field, written in place at the items' slots (a push costs O(batch), no copy of the
stored items; a sample gathers only the drawn items). ``container_store`` picks it, or the append-only
``ContainerStore`` for any other Container."""

import functools
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .gfn_data import ContainerStore, ContainerStoreBase, GFNBatch, all_true, representation, row_width


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
    return (
        _Col(attr, lambda c: getattr(c, attr).tensor, False, time, sf),
        _Col(attr + '.conditions', lambda c: getattr(c, attr).conditions, True, time, inf),
    )


_LOG_REWARDS = _Col('log_rewards', lambda c: c._log_rewards, True)  # what torchgfn's to_tensordict saves
# what a ring keeps of a States / Actions object (its ``*_cache`` attributes are recomputed)
_REBUILT = frozenset({'tensor', '_conditions', 'debug'})
_TERMINATING = _Col('is_terminating', lambda c: c.is_terminating, False)
_LAYOUTS: Dict[str, Tuple[_Col, ...]] = {
    'StatesContainer': _states_cols('states') + (_TERMINATING, _LOG_REWARDS),
    'Transitions': _states_cols('states')
    + (_Col('actions', lambda c: c.actions.tensor, False), _TERMINATING)
    + _states_cols('next_states')
    + (_LOG_REWARDS,),
    'Trajectories': _states_cols('states', 1)
    + (
        _Col('actions', lambda c: c.actions.tensor, False, 0, lambda c: type(c.actions).dummy_action),
        _Col('terminating_idx', lambda c: c.terminating_idx, False),
        _LOG_REWARDS,
    ),
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
        stored one) by at least 1.5x, so growth is O(1) amortised per stored item; the first write reserves 1,024 items
        (or the capacity, if smaller), so a small buffer fills without regrowing. ``read`` O(drawn items).
    Not thread-safe (the buffer's lock serialises calls).
    """

    reuses_slots = True
    # StatesContainer / Transitions: every field keeps its item shape (``_check``), so stored rows can be read back
    # later; a Trajectories' terminating states are a gather, whose rows are built at push
    lazy_rows = True

    def __init__(self, physical: int) -> None:
        self.physical = physical
        self.cls: Optional[type] = None
        self.env: Any = None
        self.is_backward = False
        self.device: Optional[torch.device] = None
        self.cpu = False  # the device is the CPU
        self.layout: Tuple[_Col, ...] = ()
        self.cols: Dict[str, Optional[torch.Tensor]] = {}  # None: a field dropped (or never pushed)
        self.pads: Dict[str, torch.Tensor] = {}
        self.types: Dict[str, Tuple[type, bool]] = {}  # states / next_states / actions: (class, debug)
        self.size = 0  # item capacity of the tensors
        self.steps = 0  # Trajectories: time capacity (actions rows; states have one more)
        self.tidx: Optional[np.ndarray] = None  # Trajectories: terminating_idx per slot (trims reads)
        self.end = 0  # slots below have been written
        self._views: Dict[str, Tuple[torch.Tensor, Optional[np.ndarray]]] = {}  # CPU fields' numpy views (_view)

    @staticmethod
    def accepts(data: Any) -> bool:
        """torchgfn's own three container classes with tensor states that hold nothing else per state (graph
        states, or states with fields of their own such as BitSequence's ``length``, go to ``ContainerStore``,
        which keeps the containers themselves: a ring rebuilds states from their tensor and conditions)."""
        cls = type(data)
        if cls.__module__ not in _MODULES or cls.__name__ not in _LAYOUTS:
            return False
        return all(
            isinstance(getattr(getattr(data, a), 'tensor', None), torch.Tensor)
            and all(k in _REBUILT or k.endswith('_cache') for k in vars(getattr(data, a)))
            for a in ('states', 'next_states', 'actions')
            if hasattr(data, a)
        )

    def __len__(self) -> int:
        return self.end

    @property
    def container(self) -> Any:
        """Slots ``0..len-1`` as one container (a copy; slots not live hold stale items). For inspection."""
        return None if self.cls is None else self.read(np.arange(self.end, dtype=np.int64))

    # ------------------------------------------------------------------ push
    def rows_of(self, data: Any, n: int) -> Optional[np.ndarray]:
        """As ``ContainerStoreBase.rows_of``; StatesContainer / Transitions: their terminating states are the
        ``is_terminating`` rows, so one per item exactly when every row is terminating (no gather needed)."""
        mask = getattr(data, 'is_terminating', None)
        if mask is None or getattr(data, 'is_backward', False):
            return ContainerStoreBase.rows_of(data, n)
        if not all_true(mask):
            return None
        states = data.states
        return representation(states.tensor, states.conditions, n)

    def prepare(self, data: Any, need_rows: bool) -> GFNBatch:
        return super().prepare(data, need_rows or not hasattr(data, 'is_terminating'))  # Trajectories: built

    def row_width(self, data: Any) -> Optional[int]:
        """StatesContainer / Transitions: the width of their states' rows when every row is terminating (backward
        transitions: None, as ``rows_of``)."""
        if getattr(data, 'is_backward', False) or not all_true(data.is_terminating):
            return None
        states = data.states
        return row_width(states.tensor, states.conditions)

    def _check(self, data: Any, n: int) -> None:
        """Everything a write could fail on, checked before anything changes: every field a tensor of ``n`` items
        of a dtype torch can write by index and, once a first push fixed them, the stored item shape and device and
        a dtype torch can promote the stored one with."""
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
            ring = self.cols.get(col.name) if self.end else None  # (an emptied ring takes any layout: ``write``)
            if ring is not None and (x.shape[b + 1 :] != ring.shape[b + 1 :] or x.device != ring.device):
                raise ValueError(
                    f"{name}.{col.name} holds items of shape {tuple(x.shape[b + 1 :])} on {x.device}; the stored "
                    f"ones are {tuple(ring.shape[b + 1 :])} on {ring.device}"
                )
            if ring is None or x.dtype != ring.dtype:  # (the stored dtype passed these checks when it came)
                numpy_ok = col.time < 0 and x.device.type == 'cpu'  # (written through a numpy view)
                _check_dtype(f"{name}.{col.name}", x.dtype, None if ring is None else ring.dtype, numpy_ok)
        _check_steps(data)

    def held_backward(self) -> Optional[bool]:
        return self.is_backward if self.end else None

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: Optional[np.ndarray]) -> None:
        """Items ``rows`` of the (prepared) batch (None: all of them) go to ``slots``: one ``index_copy_`` per field;
        time-major fields are written up to the longest written item and padded after it."""
        m = batch.n if rows is None else len(rows)
        if not m:
            return
        data = batch.payload
        if self.cls is None or self.end == 0:  # an empty ring takes the layout of what comes (as torchgfn's extend)
            self._adopt(data)
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
        whole = rows is None or (m == batch.n and (m == 1 or bool((rows[1:] > rows[:-1]).all())))  # 0..n-1
        cpu = self.cpu
        sel = None if whole else torch.from_numpy(rows) if cpu else torch.from_numpy(rows).to(self.device)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        idx = None if cpu else torch.from_numpy(slots).to(self.device)
        top = int(slots.max()) + 1 if self.end < self.physical else self.end  # a full ring keeps its size
        at = _at(slots, m) or (slots if cpu else idx)  # (where a batch-major field's items go)
        if top > self.size:
            self._reserve(top)
        t = 0
        if self.tidx is not None:
            tid = data.terminating_idx.detach().cpu().numpy()
            tid = np.maximum(tid if whole else tid[rows], 0)
            self.tidx[slots] = tid
            t = int(tid.max())
            self._grow_time(t)
        for col in self.layout:
            ring, x = self._incoming(col, data)
            if x is None:
                continue
            if col.time < 0:
                _scatter(
                    ring, at, x if sel is None else x.index_select(0, sel), self._view(col.name, ring) if cpu else None
                )
                continue
            # stored time-major ([step, slot, ...], as the container holds it): a sample gathers its items with
            # one index_select straight into the container's layout (item-major storage needed a second copy
            # to transpose); a write scatters the same bytes either way
            k = min(t + col.time, x.shape[0])
            idx = torch.from_numpy(slots) if idx is None else idx
            ring[:k].index_copy_(1, idx, x[:k] if sel is None else x[:k].index_select(1, sel))
            if k < ring.shape[0]:
                ring[k:, idx] = self.pads[col.name]
        self.end = max(self.end, top)

    def _incoming(self, col: Any, data: Any) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``col``'s ring and the pushed values to write into it, in its dtype; ``(None, None)``: nothing to write."""
        ring = self.cols[col.name]
        if ring is None:
            return None, None
        x = col.get(data)
        if x is None:  # a push without it: dropped for good (torchgfn's extend sets it to None)
            self.cols[col.name] = None
            return None, None
        if x.dtype != ring.dtype:
            ring = self._widen(col.name, x.dtype)
            if x.dtype != ring.dtype:
                x = x.to(ring.dtype)
        return ring, x.detach() if x.requires_grad else x  # (the ring never joins the caller's graph)

    def __getstate__(self) -> Dict[str, Any]:
        """A copy (``copy.deepcopy``) makes its own views: copied ones would not share its tensors' memory."""
        return {**self.__dict__, '_views': {}}

    def _view(self, name: str, ring: torch.Tensor) -> Optional[np.ndarray]:
        """A numpy view of the CPU field ``ring`` (None where numpy lacks its dtype), made once per tensor: a field
        replaced by a new tensor (grown, widened) gets a new view."""
        v = self._views.get(name)
        if v is None or v[0] is not ring:
            try:
                view = ring.numpy()
            except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks
                view = None
            v = self._views[name] = (ring, view)
        return v[1]

    def _adopt(self, data: Any) -> None:
        """The first write fixes the class, env, direction and the fields' dtypes and item shapes."""
        self.cls, self.env = type(data), data.env
        self.is_backward = bool(getattr(data, 'is_backward', False))
        self.layout = _LAYOUTS[self.cls.__name__]
        self.types = {
            a: (type(getattr(data, a)), bool(getattr(getattr(data, a), 'debug', False)))
            for a in ('states', 'next_states', 'actions')
            if hasattr(data, a)
        }
        self.size = min(self.physical, max(1024, len(data)))
        self.steps = 0
        for col in self.layout:
            x = col.get(data)
            if x is None:
                self.cols[col.name] = None
                continue
            self.device = x.device
            self.cpu = x.device.type == 'cpu'
            if col.time < 0:
                shape = (self.size,) + tuple(x.shape[1:])
            else:  # time-major: [step, slot, ...]
                shape = (self.steps + col.time, self.size) + tuple(x.shape[2:])
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
            if col.time < 0:
                new = ring.new_empty((size,) + tuple(ring.shape[1:]))
                new[: self.size] = ring
            else:
                new = ring.new_empty((ring.shape[0], size) + tuple(ring.shape[2:]))
                new[:, : self.size] = ring
            self.cols[col.name] = new
        if self.tidx is not None:
            self.tidx = np.concatenate([self.tidx, np.zeros(size - self.size, dtype=np.int64)])
        self.size = size

    def _grow_time(self, steps: int) -> None:
        """Trajectories: room for ``steps`` actions per item (at least 1.5x, the new rows padded)."""
        if steps <= self.steps:
            return
        steps = max(steps, self.steps + self.steps // 2)
        for col in self.layout:
            ring = self.cols[col.name]
            if ring is None or col.time < 0:
                continue
            new = ring.new_empty((steps + col.time,) + tuple(ring.shape[1:]))
            new[: ring.shape[0]] = ring
            new[ring.shape[0] :] = self.pads[col.name]
            self.cols[col.name] = new
        self.steps = steps

    # ------------------------------------------------------------------ read
    def read(self, slots: np.ndarray, seq: Any = None) -> Any:
        """The items at ``slots`` as one container of the stored class (a copy; Trajectories are trimmed to the
        longest drawn item, as torchgfn's indexing does)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        cpu, idx = self.cpu, None
        t = int(self.tidx[slots].max()) if self.tidx is not None and len(slots) else 0
        out = {}
        for col in self.layout:
            whole = self.cols[col.name]
            if whole is None:
                continue
            view = self._view(col.name, whole) if cpu else None
            if view is not None:  # numpy's take: a third of index_select's fixed cost for a small gather
                out[col.name] = torch.from_numpy(
                    view.take(slots, 0) if col.time < 0 else view[: t + col.time].take(slots, 1)
                )
                continue
            if idx is None:
                idx = torch.from_numpy(slots) if cpu else torch.from_numpy(slots).to(self.device)
            out[col.name] = whole.index_select(0, idx) if col.time < 0 else whole[: t + col.time].index_select(1, idx)
        return self._build(out)

    def _build(self, t: Dict[str, torch.Tensor]) -> Any:
        def states(attr: str) -> Any:
            cls, debug = self.types[attr]
            # torchgfn's own indexing builds its states with ``_make_view`` (no re-validation: conditions of a
            # default dtype changed since the push stay readable); older torchgfn releases lack it
            make = getattr(cls, '_make_view', None)
            if make is not None:
                return make(t[attr], conditions=t.get(attr + '.conditions'), debug=debug)
            return cls(tensor=t[attr], conditions=t.get(attr + '.conditions'), debug=debug)

        name, r = self.cls.__name__, t.get('log_rewards')
        if name == 'StatesContainer':
            return self.cls(env=self.env, states=states('states'), is_terminating=t['is_terminating'], log_rewards=r)
        acls, adebug = self.types['actions']
        actions = acls(t['actions'], debug=adebug)
        shared = dict(env=self.env, states=states('states'), actions=actions, is_backward=self.is_backward)
        if name == 'Transitions':
            return self.cls(
                **shared, is_terminating=t['is_terminating'], next_states=states('next_states'), log_rewards=r
            )
        return self.cls(**shared, terminating_idx=t['terminating_idx'], log_rewards=r)  # Trajectories

    def clear(self) -> None:
        self.end = 0  # the tensors stay; slots are simply overwritten later

    def place(self, container: Any, slots: np.ndarray) -> None:
        """Hold a restored ``container``: its item ``i`` at ``slots[i]``."""
        n = len(container)
        _check_steps(container)
        if n:
            self.write(
                np.asarray(slots, dtype=np.int64),
                GFNBatch(container, n, np.empty(0), None, None),
                np.arange(n, dtype=np.int64),
            )
        else:
            self._adopt(container)


def _check_steps(data: Any) -> None:
    """Trajectories: every ``terminating_idx`` within the steps the container holds (``ValueError`` otherwise: the
    stored time axis grows to the largest one, and a negative one reads another item's steps)."""
    tid = getattr(data, 'terminating_idx', None)
    if isinstance(tid, torch.Tensor) and tid.numel():
        steps = data.states.tensor.shape[0] - 1
        low, top = int(tid.min()), int(tid.max())
        if top > steps or low < 0:
            bad = top if top > steps else low
            raise ValueError(f"Trajectories.terminating_idx holds {bad}, outside the 0..{steps} steps its states hold")


def _check_dtype(field: str, dtype: torch.dtype, stored: Optional[torch.dtype], numpy_ok: bool) -> None:
    """``dtype`` can be written (through numpy where ``numpy_ok`` and numpy has it, else by ``index_copy_``, which
    torch lacks for e.g. float8 on the CPU) and, with a ``stored`` dtype, promoted with it (torch joins no uint16 /
    uint32 / uint64 with a signed integer): else ``ValueError``, before the write could fail midway."""
    wider = dtype
    if stored is not None:
        try:
            wider = torch.promote_types(stored, dtype)
        except RuntimeError as e:
            raise ValueError(f"{field} has dtype {dtype}, the stored ones {stored}: torch cannot join them") from e
    if not _writable(wider, numpy_ok):
        raise ValueError(f"{field} would be stored as {wider}, which torch cannot write by index; convert it first")


@functools.lru_cache(maxsize=None)
def _writable(dtype: torch.dtype, numpy_ok: bool) -> bool:
    """Whether a field of ``dtype`` can be written: numpy has it (``numpy_ok``), or torch's ``index_copy_`` takes
    it on the CPU (tried once per dtype)."""
    if numpy_ok:
        try:
            torch.zeros(1, dtype=dtype).numpy()
            return True
        except (TypeError, RuntimeError):
            pass
    try:
        torch.zeros(2, dtype=dtype).index_copy_(0, torch.ones(1, dtype=torch.int64), torch.zeros(1, dtype=dtype))
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _at(slots: np.ndarray, m: int) -> Optional[slice]:
    """The ``m`` slots as a slice when they are a run ``s[0], s[0] + 1, ...`` (else None)."""
    lo = int(slots[0])
    return slice(lo, lo + m) if int(slots[-1]) - lo == m - 1 and (slots - lo).tobytes() == _run(m) else None


@functools.lru_cache(maxsize=64)
def _run(m: int) -> bytes:
    """The int64 bytes of ``0, 1, ..., m - 1``: slots ``s`` are the run ``s[0], s[0] + 1, ...`` exactly when
    ``(s - s[0]).tobytes()`` equals them (cheaper than numpy's ``all`` of a comparison)."""
    return np.arange(m, dtype=np.int64).tobytes()


def _scatter(ring: torch.Tensor, at: Any, src: torch.Tensor, view: Any) -> None:
    """``ring[at] = src`` on the item dimension, ``at`` a slice (a run of slots: a copy of half a scatter's cost),
    a numpy array of slots (CPU) or an index tensor on ``ring``'s device; through ``view``, ``ring``'s numpy view
    (None: none), where numpy has the dtype (a small scatter costs a third of ``index_copy_``'s dispatch there)."""
    if view is not None:
        try:
            view[at] = src.numpy()
            return
        except (TypeError, RuntimeError):  # a neg / conj bit
            pass
    if isinstance(at, slice):
        ring[at] = src
    else:
        ring.index_copy_(0, torch.from_numpy(at) if isinstance(at, np.ndarray) else at, src)


# ---------------------------------------------------------------------------------------------------- choice
def container_store(data: Any, physical: int) -> ContainerStoreBase:
    """The store for containers like ``data``: ``ContainerRing`` for torchgfn's tensor containers, else the
    append-only ``ContainerStore``."""
    return ContainerRing(physical) if ContainerRing.accepts(data) else ContainerStore()

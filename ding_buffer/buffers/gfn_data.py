"""What a GFlowNet buffer stores: validated incoming batches and the three item stores behind the buffers.

A push is one of

* a dict of tensors with a leading batch dimension (``state_key``, ``log_reward_key``, optional
  ``condition_key``, any other fields), or a list of such item dicts without the batch dimension: kept by
  ``ColumnStore`` (one preallocated tensor per field, on the configured device; slots are reused);
* a torchgfn ``Trajectories``, ``Transitions`` or ``StatesContainer`` of tensor states: kept by ``ContainerRing``
  (``gfn_ring``: one tensor per per-item field of the container, written in place at the item's slot; slots are
  reused, so a push costs O(batch) -- no copy of the stored items -- and a sample gathers only the drawn items);
* any other object with the Container protocol (``__len__``, ``__getitem__`` with an index tensor, ``extend``,
  ``log_rewards``, ``terminating_states``): kept by ``ContainerStore`` (one container of the pushed type,
  append-only, compacted with one indexing call once half of it is dead; its ``extend`` decides the cost).

``GFNBatch`` carries what the buffer decides on: the log-rewards (float64) and, where an item has one
terminating state, its representation row (state flattened, condition concatenated; float64).
"""

import copy
import functools
import math
from typing import Any, Dict, NamedTuple, Optional

import numpy as np
import torch

from ..persistence import refuse_unknown
from ..storage.base import NO_ITER
from ..storage.tensor_storage import TensorStorage, export_schema, import_fields


class GFNBatch(NamedTuple):
    payload: Any  # store-specific: a ``Prepared`` (columns) or a container
    n: int
    log_reward: np.ndarray  # float64 (n,); NaN where the container carries no log-rewards
    rows: Optional[np.ndarray]  # float64 (n, d) representations; None when not built, or items have no single state
    width: Optional[int]  # d (rows built, or read back from the store later); None: no single terminating state


def check_log_reward(r: np.ndarray, key: str) -> None:
    """NaN and +inf are refused (-inf is a reward of 0 and fine)."""
    if not len(r) or math.isfinite(r.max()):  # the common case, in one reduction: a NaN or +inf makes the max one
        return
    bad = np.flatnonzero(np.isnan(r) | (r == np.inf))
    if len(bad):
        raise ValueError(f"'{key}' must be finite or -inf; item {int(bad[0])} is {r[bad[0]]} ({len(bad)} bad value(s))")


def float64_numpy(t: torch.Tensor, copy: bool = False) -> np.ndarray:
    """``t`` as a float64 numpy array on the CPU (numpy converts a small tensor faster than torch does; the same
    values: both round to nearest). Shares memory with ``t`` when it already is a CPU float64 tensor, unless
    ``copy``."""
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    if t.is_complex():  # (float64 would drop the imaginary part: distinct states would count as one)
        raise ValueError(f"GFlowNet states, conditions and log-rewards must be real numbers, got {t.dtype}")
    try:
        a = t.numpy()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks; tensors with a neg / conj bit
        return t.resolve_neg().resolve_conj().to(torch.float64).numpy()  # (a new tensor: numpy could not view t)
    return a.astype(np.float64, copy=copy)


def representation(state: torch.Tensor, condition: Optional[torch.Tensor], n: int) -> np.ndarray:
    """Rows ``[state.flatten(), condition.flatten()]`` as float64 (the diversity filter's input): always a new
    array, never a view of the caller's tensors (which the caller may change after the push)."""
    rows = _rows(state, n)
    if condition is not None:
        rows = np.concatenate([rows, _rows(condition, n)], axis=1)
    return rows


def row_width(state: torch.Tensor, condition: Optional[torch.Tensor]) -> int:
    """The number of values in a ``representation`` row of these batched tensors, without building the rows."""
    return state.shape[1:].numel() + (0 if condition is None else condition.shape[1:].numel())


def _rows(x: torch.Tensor, n: int) -> np.ndarray:
    """``x`` as ``n`` flat float64 rows (a copy); an empty batch keeps its row width (``reshape(0, -1)`` is
    ambiguous)."""
    a = float64_numpy(x, copy=True)
    return a.reshape(n, -1) if n else a.reshape(0, int(np.prod(a.shape[1:], dtype=np.int64)))


def all_true(mask: torch.Tensor) -> bool:
    """``bool(mask.all())``, through numpy on the CPU (a third of torch's fixed cost for a small mask)."""
    if mask.is_cpu and not mask.requires_grad:
        return np.count_nonzero(mask.numpy()) == mask.numel()
    return bool(mask.all())


def is_torchgfn(data: Any) -> bool:
    """Whether ``data`` is of a torchgfn class or of a subclass of one (a user's ``MyStates(StatesContainer)``)."""
    return _of_torchgfn(type(data))


@functools.lru_cache(maxsize=256)
def _of_torchgfn(cls: type) -> bool:
    return any(c.__module__.startswith('gfn.') for c in cls.__mro__)


def is_container(data: Any) -> bool:
    """The Container protocol (checked on the class, so no property is evaluated)."""
    return _container_class(type(data))


@functools.lru_cache(maxsize=256)
def _container_class(cls: type) -> bool:
    return all(hasattr(cls, a) for a in ('__len__', '__getitem__', 'extend', 'log_rewards', 'terminating_states'))


class ColumnStore:
    """Dicts of tensors in a ``TensorStorage`` whose slots the buffer assigns (``write_at`` / ``read_at``)."""

    reuses_slots = True
    kind = 'columns'
    lazy_rows = True  # the storage keeps one shape per field: stored rows can be read back (``rows_at``) later

    def __init__(
        self, physical: int, device: str, state_key: str, log_reward_key: str, condition_key: Optional[str]
    ) -> None:
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
            if key is not None and (key,) not in columns:
                found = sorted('.'.join(p) for p in columns)
                raise ValueError(f"GFlowNet batch has no field '{key}' (config key naming it); fields: {found}")
        r_t = columns[(self.log_reward_key,)]
        if r_t.dim() != 1 or not r_t.dtype.is_floating_point:
            raise ValueError(
                f"field '{self.log_reward_key}' must hold one float log-reward per item, got shape "
                f"{tuple(r_t.shape)} dtype {r_t.dtype}"
            )
        r = float64_numpy(r_t)
        check_log_reward(r, self.log_reward_key)
        cond = columns[(self.condition_key,)] if self.condition_key is not None else None
        state = columns[(self.state_key,)]
        for key, t in ((self.state_key, state), (self.condition_key, cond)):
            if t is not None and t.is_complex():  # (rows are float64: its imaginary part would be dropped later)
                raise ValueError(f"field '{key}' must hold real numbers (GFlowNet states are compared), got {t.dtype}")
        rows = representation(state, cond, n) if need_rows else None
        return GFNBatch(prepared, n, r, rows, row_width(state, cond))

    def check_joins(self, data: Any) -> None:
        """Dict batches: any joins (their fields were checked by ``prepare``)."""

    def rows_at(self, slots: np.ndarray) -> np.ndarray:
        """The representations of the stored items at ``slots``."""
        data = self.storage.read_at(slots)
        cond = data[self.condition_key] if self.condition_key is not None else None
        return representation(data[self.state_key], cond, len(slots))

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: Optional[np.ndarray]) -> None:
        """Items ``rows`` of the batch (None: all of them) go to ``slots``."""
        self.storage.write_at(slots, batch.payload, np.arange(batch.n, dtype=np.int64) if rows is None else rows)

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """The items' ``collect_iter`` field (staleness); ``NO_ITER`` without one."""
        return self.storage.collect_iter(slots)

    def read(self, slots: np.ndarray, seq: np.ndarray) -> Dict[str, Any]:
        """The items at ``slots``, their slots and ids (``seq``: the index's ids by slot) as tensors."""
        out = self.storage.read_at(slots)
        device = self.storage.device
        out['replay_buffer_idx'] = torch.from_numpy(np.array(slots, dtype=np.int64)).to(device)
        out['replay_unique_id'] = torch.from_numpy(np.array(seq[slots], dtype=np.int64)).to(device)
        return out

    def state_dict(self, slots: np.ndarray) -> Dict[str, Any]:
        st = self.storage
        fields = [] if st.schema is None else [t.cpu() for t in st.read_fields(slots)]
        return {'kind': self.kind, 'schema': export_schema(st.schema), 'fields': fields}

    def restored(
        self, state: Dict[str, Any], n: int, slots: Optional[np.ndarray], log_rewards: np.ndarray
    ) -> 'ColumnStore':
        """A new store with the saved ``n`` items at ``slots`` (None: ``0..n-1``; validated by the index), whose
        fields are the config's keys and whose log-rewards are the saved index's ``log_rewards`` (in saved order)."""
        if state.get('kind') != self.kind:
            raise ValueError(f"saved GFlowNet store is {state.get('kind')!r}, this buffer stores {self.kind!r}")
        new = ColumnStore(
            self.storage.capacity, str(self.storage.device), self.state_key, self.log_reward_key, self.condition_key
        )
        schema, fields = import_fields(state['schema'], state['fields'], n)
        for key in (self.state_key, self.log_reward_key, self.condition_key) if schema else ():
            if key is not None and (key,) not in schema:
                raise ValueError(f"saved GFlowNet store has no field '{key}' (config key naming it)")
        if schema:
            saved = fields[list(schema).index((self.log_reward_key,))]
            if saved.dim() != 1 or not np.array_equal(float64_numpy(saved), log_rewards):
                raise ValueError(f"saved field '{self.log_reward_key}' disagrees with the saved index's log-rewards")
            new.storage.allocate(schema)
            new.storage.write_fields(np.arange(n, dtype=np.int64) if slots is None else slots, fields)
        return new

    def clear(self) -> None:
        pass  # the slots are simply overwritten later


_CACHED_FIELDS = ('log_probs', 'estimator_outputs')


def terminating_states_of(data: Any) -> Any:
    """``data.terminating_states``, except for backward torchgfn containers: a backward trajectory starts at its
    terminating state (``states[0]``; torchgfn's property reads the state before ``terminating_idx``, a child of
    s0 there), and backward transitions have none that can be told (None)."""
    if not getattr(data, 'is_backward', False):
        return data.terminating_states
    return data.states[0] if hasattr(data, 'terminating_idx') else None


def _check_conditions(data: Any, advice: str = 'make them under that default') -> None:
    """torchgfn's states take conditions of torch's default dtype (its buffers refuse others, with an assert): a
    ``ValueError`` naming the field otherwise (``advice`` says what to do)."""
    for attr in ('states', 'next_states'):
        cond = getattr(getattr(data, attr, None), 'conditions', None)
        if isinstance(cond, torch.Tensor) and cond.dtype != torch.get_default_dtype():
            raise ValueError(
                f"{type(data).__name__}.{attr}.conditions has dtype {cond.dtype}; torchgfn's states take conditions "
                f"of torch's default dtype ({torch.get_default_dtype()} now), as its own buffers do: {advice}"
            )


class ContainerStoreBase:
    """What both container stores share: the Container protocol's log-rewards and terminating-state rows, no
    ``collect_iter``, and persistence (torchgfn containers as plain tensors, other objects pickled)."""

    kind = 'container'
    cls: Optional[type] = None
    lazy_rows = False  # rows are built at push (another Container's items need not keep one shape)

    @staticmethod
    def log_rewards_of(data: Any, n: int) -> np.ndarray:
        r = data.log_rewards
        if r is None:
            return np.full(n, np.nan)
        if type(r) is not torch.Tensor or r.dim() != 1:
            r = torch.as_tensor(r).reshape(-1)
        r = float64_numpy(r)
        if len(r) != n:
            raise ValueError(f"container log_rewards has {len(r)} entries for {n} items")
        check_log_reward(r, 'log_rewards')
        return r

    @staticmethod
    def rows_of(data: Any, n: int) -> Optional[np.ndarray]:
        """One row per item when the container has exactly one terminating state per item."""
        ts = terminating_states_of(data)
        tensor = ts if isinstance(ts, torch.Tensor) else getattr(ts, 'tensor', None)
        if not isinstance(tensor, torch.Tensor) or tensor.shape[0] != n:  # (graph states: a torch_geometric batch)
            return None
        cond = getattr(ts, 'conditions', None)
        return representation(tensor, cond if isinstance(cond, torch.Tensor) else None, n)

    def prepare(self, data: Any, need_rows: bool) -> GFNBatch:
        if self.cls is not None and type(data) is not self.cls:
            raise TypeError(f"this buffer holds {self.cls.__name__} containers, got {type(data).__name__}")
        states = getattr(data, 'states', None)  # (torchgfn's: saved as tensors; other containers are pickled)
        tensor = getattr(states, 'tensor', None)
        if is_torchgfn(data) and not isinstance(tensor, (torch.Tensor, type(None))):
            raise TypeError(
                f"{type(data).__name__} of {type(states).__name__}: the GFlowNet buffers keep torchgfn states held "
                "in one tensor (their state_dict and save_data files are tensors); these are not (graph states)"
            )
        if is_torchgfn(data):
            _check_conditions(data)
        n = len(data)
        r = self.log_rewards_of(data, n)
        self._check(data, n)
        if need_rows or not self.lazy_rows:
            rows = self.rows_of(data, n)
            return GFNBatch(data, n, r, rows, None if rows is None else rows.shape[1])
        return GFNBatch(data, n, r, None, self.row_width(data))

    def row_width(self, data: Any) -> Optional[int]:
        """``lazy_rows`` stores: the width of ``data``'s rows without building them (None: no single terminating
        state per item)."""
        raise NotImplementedError

    def rows_at(self, slots: np.ndarray) -> Optional[np.ndarray]:
        """The representations of the stored items at ``slots`` (None: no single terminating state each)."""
        return self.rows_of(self.read(slots), len(slots))

    def _check(self, data: Any, n: int) -> None:
        """Everything a write could fail on, checked before anything changes (``ContainerRing``'s tensors)."""

    def check_joins(self, data: Any) -> None:
        """``ValueError`` when the items of ``data`` (not empty) cannot join the stored ones: a sample is one
        container, of one direction. Checked after the table's own checks."""
        held = self.held_backward()
        if held is not None and bool(getattr(data, 'is_backward', False)) != held:
            name = type(data).__name__
            raise ValueError(
                f"{name} with is_backward={not held}: this buffer holds {'backward' if held else 'forward'} {name} "
                f"(a sample is one container, of one direction); keep each direction in a buffer of its own"
            )

    def held_backward(self) -> Optional[bool]:
        """The direction of the stored items (None: none stored, any joins)."""
        raise NotImplementedError

    def read(self, slots: np.ndarray, seq: Any = None) -> Any:
        raise NotImplementedError

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """Containers carry no ``collect_iter``: never stale."""
        return np.full(len(slots), NO_ITER, dtype=np.int64)

    def state_dict(self, slots: np.ndarray) -> Dict[str, Any]:
        if self.cls is None:
            return {'kind': self.kind, 'format': 'empty'}
        live = self.read(slots)
        if type(live).__module__.startswith('gfn.') and hasattr(live, 'to_tensordict'):
            # torchgfn: plain tensors only, loadable with weights_only=True (rebuilt with the env on load)
            return {
                'kind': self.kind,
                'format': 'torchgfn',
                'class': _qualified(type(live)),
                'tensors': live.to_tensordict().to_dict(),
            }
        return {'kind': self.kind, 'format': 'object', 'container': live}  # needs allow_pickle on load


class ContainerStore(ContainerStoreBase):
    """One container of the first pushed type. Slots are positions in it (append-only until ``compact``)."""

    reuses_slots = False

    def __init__(self) -> None:
        self.container: Any = None
        self.cls: Optional[type] = None

    def __len__(self) -> int:
        return 0 if self.container is None else len(self.container)

    def held_backward(self) -> Optional[bool]:
        return bool(getattr(self.container, 'is_backward', False)) if len(self) else None

    @property
    def env(self) -> Any:
        return getattr(self.container, 'env', None)

    def check_joins(self, data: Any) -> None:
        """Also: the stored container's own ``extend`` takes ``data`` (tried on a copy of one stored item and a
        copy of ``data``: ``extend`` changes both containers in place, and may refuse a join after it changed the
        first, e.g. another env's states of the same width)."""
        super().check_joins(data)
        if not len(self) or not len(data):
            return
        head = self.container[torch.zeros(1, dtype=torch.int64)]
        try:
            head.extend(data[torch.arange(len(data))])
        except MemoryError:
            raise
        except Exception as e:
            raise ValueError(
                f"{type(data).__name__} cannot join the stored {self.cls.__name__} items (another env's or "
                f"kind's states?): their extend raised {type(e).__name__}: {e}"
            ) from None

    def write(self, slots: np.ndarray, batch: GFNBatch, rows: Optional[np.ndarray]) -> None:
        """Append items ``rows`` of the batch (None: all of them); ``slots`` are the next positions."""
        assert len(slots) == 0 or int(slots[0]) == len(self), 'container slots are appended in order'
        if rows is None:
            rows = np.arange(batch.n, dtype=np.int64)
        part = batch.payload[torch.from_numpy(np.asarray(rows, dtype=np.int64))]  # a copy, never the caller's
        if not len(self):  # (an emptied one too: the new items' direction, not the old container's)
            self.container, self.cls = part, type(batch.payload)
        else:
            n = len(self)
            try:
                self.container.extend(part)
            except BaseException:  # (``check_joins`` tried it: no memory) the items held before, and no others
                self.container = self.container[torch.arange(n)]
                raise
        for attr in _CACHED_FIELDS:  # replayed data is re-evaluated by the learner (torchgfn does the same)
            if getattr(self.container, attr, None) is not None:
                setattr(self.container, attr, None)

    def read(self, slots: np.ndarray, seq: Any = None) -> Any:
        try:
            return self.container[torch.from_numpy(np.asarray(slots, dtype=np.int64))]
        except AssertionError:  # torchgfn's indexing rebuilt states whose conditions the default dtype no longer fits
            _check_conditions(self.container, 'set that default back to read the stored ones')
            raise

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


# ---------------------------------------------------------------------------------------------------- load
def rebuild_container(state: Dict[str, Any], n: int, env: Any) -> Any:
    """The container a container store saved (``n`` items; torchgfn containers are rebuilt with ``env``), or None
    for a store that never held one."""
    if state.get('kind') != ContainerStoreBase.kind:
        raise ValueError(
            f"saved GFlowNet store is {state.get('kind')!r}, this buffer stores {ContainerStoreBase.kind!r}"
        )
    refuse_unknown(state, ('kind', 'format', 'class', 'tensors', 'container'), 'saved GFlowNet store')
    fmt = state.get('format')
    if fmt == 'empty':
        return None
    if fmt == 'object':
        container = copy.deepcopy(state['container'])  # (a state's objects stay the caller's)
    elif fmt == 'torchgfn':
        cls = _torchgfn_class(state['class'])
        if env is None:
            raise ValueError(
                f"rebuilding torchgfn {cls.__name__} needs its environment: pass env=... to load_data or "
                "load_state_dict"
            )
        from tensordict import TensorDict

        _own_bytes(state['tensors'], cls.__name__)
        for key, t in state['tensors'].items():  # torchgfn's states take conditions of the default dtype only
            if str(key).endswith('conditions') and isinstance(t, torch.Tensor) and t.dtype != torch.get_default_dtype():
                raise ValueError(
                    f"saved {cls.__name__} has {key} of dtype {t.dtype}, and torch's default dtype is "
                    f"{torch.get_default_dtype()} now: torchgfn builds states only with conditions of the default "
                    f"dtype; load it under torch.set_default_dtype({t.dtype})"
                )
        try:  # (torchgfn checks its tensors with assert: a bare AssertionError, or nothing under python -O)
            tensors = TensorDict(state['tensors']).clone()  # (saved on the CPU; the caller's tensors stay theirs)
            device = getattr(env, 'device', None)
            container = cls.from_tensordict(env, tensors if device is None else tensors.to(device))
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AssertionError) as e:
            raise ValueError(f"saved {cls.__name__} does not fit env {type(env).__name__}: {e!r}") from e
        # what the rebuilt container does not hold again was ignored: a damaged name ('log_rewards' lost would
        # give samples the env's rewards)
        refuse_unknown(state['tensors'], set(container.to_tensordict().keys()), f"saved {cls.__name__}")
        r = getattr(container, 'log_rewards', None)
        if isinstance(r, torch.Tensor) and r.shape[:1] != (len(container),):
            raise ValueError(f"saved {cls.__name__} has {tuple(r.shape)} log_rewards for {len(container)} items")
        _check_env_shape(container, env)
    else:
        raise ValueError(f"unknown saved container format {fmt!r}")
    if not is_container(container) or len(container) != n:
        raise ValueError(f"saved container holds {len(container)} items, the index {n}")
    return container


def _own_bytes(tensors: Any, name: str) -> None:
    """Saved container tensors hold a value of their own for each element (a container saves them so): an expanded
    (stride 0) one stands for a huge shape in a few bytes, and the store would copy it out in full."""
    for key, t in dict(tensors).items():
        if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > t.untyped_storage().nbytes():
            raise ValueError(f"saved {name}.{key} of shape {tuple(t.shape)} is held in fewer bytes (expanded)")


def _check_env_shape(container: Any, env: Any) -> None:
    """The rebuilt container's states and actions have the env's state and action shapes (another env's would
    sample silently, or break the next write)."""
    for attr, env_attr, what in (('states', 'state_shape', 'states'), ('actions', 'action_shape', 'actions')):
        shape = tuple(getattr(env, env_attr, ()) or ())
        held = getattr(getattr(container, attr, None), 'tensor', None)
        if not shape or not isinstance(held, torch.Tensor):
            continue
        got = tuple(held.shape[max(held.dim() - len(shape), 0) :])
        if got != shape:
            raise ValueError(
                f"saved {type(container).__name__} holds {what} of shape {got}, but the env passed to load has "
                f"{env_attr} {shape}: pass the env the buffer was saved with"
            )


def _qualified(cls: type) -> str:
    return f'{cls.__module__}:{cls.__qualname__}'


def _torchgfn_class(name: str) -> type:
    """Only torchgfn's own container classes are rebuilt by name (nothing else is imported from a file)."""
    import importlib

    module, _, qual = str(name).partition(':')
    if not (module == 'gfn.containers' or module.startswith('gfn.containers.')) or '.' in qual:
        raise ValueError(f"refusing to rebuild container class {name!r}: only gfn.containers classes load")
    try:
        cls = getattr(importlib.import_module(module), qual, None)
    except ImportError as e:  # (a damaged name, or a torchgfn without that module)
        raise ValueError(f"container class {name!r} cannot be imported: {e}") from None
    if not isinstance(cls, type) or not hasattr(cls, 'from_tensordict'):
        raise ValueError(f"{name!r} is not a torchgfn container class")
    return cls

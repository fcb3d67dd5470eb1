"""``TensorStorage``: columnar storage, one preallocated tensor ``[capacity, *shape]`` per leaf field.

The schema is inferred from the first item written and every later item must match it (``tensor_schema``: a
mismatch is a ``ValueError`` naming the field, and nothing is written). With ``memmap_dir`` every field lives in a
memory-mapped file (``tensor_fields``), so buffers larger than RAM work.

Output of ``gather(slots)``: one nested dict of batched tensors ``[len(slots), *shape]`` (any slot shape, e.g.
``[B, T]`` for sequences) on the storage device, plus the meta fields ``replay_buffer_idx`` (int64 slots) and
``replay_unique_id`` (int64 ids). Those two keys are ignored when pushed back in, so a sampled item can be
pushed again. TensorDicts are taken like the dicts they hold; when the first item stored was one,
``tensordict_out`` is True and the buffer samples TensorDicts (``tensordict_io``; kept by ``clear`` and in the state).

Complexity: push of ``n`` items O(n * fields) with one indexed write per field; a batched push does one or
two slice assignments per field (two when it wraps around the ring); ``gather`` one index per field.
The single-item and flat-batch fast paths on CPU are ``fast_write``'s.
"""

import os
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .base import NO_ITER, WIDE_UNSIGNED, Prepared, Storage, check_state, trim_newest
from .fast_write import COLLECT_ITER_SAFE, FastWriter
from .frames import bits_of
from .ring import RingIndex
from .tensor_fields import allocate_fields, memmap_file, new_token, numpy_views, remove_files

# buffers.gfn_data imports export_schema / import_fields from here (they stay importable where they were)
from .tensor_schema import (
    Schema,
    batched_tensor,
    check_leaves,
    dtype_name,
    export_schema,
    import_fields,
    infer_schema,
    item_flat,
)
from .tensordict_io import check_item, is_tensordict
from .tree import Path, batch_len, path_name, to_tensor, unflatten

META_KEYS = ('replay_buffer_idx', 'replay_unique_id')


class TensorStorage(Storage):
    """
    Overview:
        One preallocated tensor per field, shaped by the first item (see the module docstring).
    Examples:
        >>> storage = TensorStorage(4)
        >>> res = storage.write(storage.prepare([{'obs': torch.zeros(3), 'rew': 1.0} for _ in range(2)]))
        >>> batch = storage.gather(res.slots)  # one dict of batched tensors, plus the slots and ids
        >>> sorted(batch), tuple(batch['obs'].shape), batch['rew'].dtype, batch['replay_unique_id'].tolist()
        (['obs', 'replay_buffer_idx', 'replay_unique_id', 'rew'], (2, 3), torch.float32, [0, 1])
        >>> storage.prepare([{'obs': torch.zeros(4), 'rew': 1.0}])
        Traceback (most recent call last):
        ValueError: item 0: field 'obs' has shape (4,), expected (3,)

        With ``memmap_dir`` each field is a file in that directory:

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     storage = TensorStorage(8, memmap_dir=tmp)
        ...     res = storage.write(storage.prepare_batch({'obs': torch.ones(5, 2)}))  # a batch of 5
        ...     print(len(storage), len(os.listdir(tmp)), storage.gather(np.array([4]))['obs'].tolist())
        ...     storage.release()  # removes the files (a buffer's close() does)
        ...     print(os.listdir(tmp))
        5 1 [[1.0, 1.0]]
        []
    """

    kind = 'tensor'

    def __init__(
        self,
        capacity: int,
        device: str = 'cpu',
        memmap_dir: Optional[str] = None,
        reserved_keys: Tuple[str, ...] = (),
        index_cls: type = RingIndex,
    ) -> None:
        super().__init__(capacity, index_cls)
        self.device = torch.device(device)
        if self.device.type == 'cuda' and not torch.cuda.is_available():
            raise ValueError(f"config key 'storage.device' is {device!r} but CUDA is not available here")
        if memmap_dir is not None and self.device.type != 'cpu':
            raise ValueError(f"config key 'storage.memmap_dir' needs storage.device='cpu', got {device!r}")
        if memmap_dir is not None and os.path.exists(memmap_dir) and not os.path.isdir(memmap_dir):
            raise ValueError(f"config key 'storage.memmap_dir' is {memmap_dir!r}, which is a file, not a directory")
        # absolute: files created after a chdir are still the ones close() removes
        self.memmap_dir = None if memmap_dir is None else os.path.abspath(memmap_dir)
        self.skip_keys = tuple(META_KEYS) + tuple(reserved_keys)
        self.schema: Optional[Schema] = None
        self.fields: Dict[Path, torch.Tensor] = {}
        self._views: Dict[Path, np.ndarray] = {}  # numpy views of CPU fields (shared memory)
        self._token = ''  # names this storage's memmap files
        self._release: Optional[weakref.finalize] = None
        self._fast: Optional[FastWriter] = None  # the single-item fast path, once the schema is known

    # ------------------------------------------------------------------ writing
    def prepare(self, items: List[Any], schema: Optional[Schema] = None, trim: bool = True) -> Prepared:
        """``schema`` (default: the stored one) lets a caller validate several batches before writing any;
        ``trim=False`` keeps every item (the caller picks the slots, see ``write_at``)."""
        kept, dropped = trim_newest(len(items), self.capacity if trim else len(items))
        schema = self.schema or schema
        columns: Dict[Path, List[torch.Tensor]] = {}
        for i, item in enumerate(items):  # every item is checked, also the ones dropped for space
            if type(item) is not dict and is_tensordict(item):
                check_item(item, i)
            flat = item_flat(item, i, self.skip_keys)
            if schema is None:
                schema = infer_schema({p: to_tensor(v, p) for p, v in flat.items()})
            checked = check_leaves(flat, schema, f"item {i}", batched=False)
            if i >= dropped:
                for path, tensor in checked.items():
                    columns.setdefault(path, []).append(tensor)
        payload = {p: torch.stack(ts) for p, ts in columns.items()}
        _check_collect_iter(payload)
        return Prepared((schema, payload), kept, dropped, [], type(items[0]) is not dict and is_tensordict(items[0]))

    def prepare_batch(self, batch: Any, schema: Optional[Schema] = None, trim: bool = True) -> Prepared:
        flat = item_flat(batch, 0, self.skip_keys)
        sizes = {path_name(p): batch_len(v, p) for p, v in flat.items()}
        n = next(iter(sizes.values()))
        if any(s != n for s in sizes.values()):
            raise ValueError(f"batched fields have different leading dimensions: {sizes}")
        if n == 0:
            raise ValueError("a batched push got a batch of size 0")
        schema = self.schema or schema
        if schema is None:
            schema = {p: (tuple(t.shape[1:]), t.dtype) for p, t in ((p, batched_tensor(v, p)) for p, v in flat.items())}
        checked = check_leaves(flat, schema, 'batch', batched=True)
        _check_collect_iter(checked)
        kept, dropped = trim_newest(n, self.capacity if trim else n)
        payload = {p: t[dropped:] for p, t in checked.items()}
        return Prepared((schema, payload), kept, dropped, [], type(batch) is not dict and is_tensordict(batch))

    def memmap_file(self, index: int, path: Path) -> str:
        """File of the ``index``-th field (of this storage's allocation): numbered, so fields never share one."""
        return memmap_file(self.memmap_dir, index, path, self._token)

    def allocate(self, schema: Schema) -> None:
        """Create every field of ``schema`` now (all or nothing: on failure the storage keeps no schema and no
        fields)."""
        token = new_token()
        fields = allocate_fields(schema, self.capacity, self.device, self.memmap_dir, token)
        views = numpy_views(fields) if self.device.type == 'cpu' else {}
        self.fields, self.schema, self._views, self._token = fields, schema, views, token  # together
        self._fast = FastWriter.build(schema, views, self.device, self.skip_keys)
        if self.memmap_dir is not None:  # the files go with this storage (release, or garbage collection)
            files = [self.memmap_file(i, p) for i, p in enumerate(schema)]
            self._release = weakref.finalize(self, remove_files, files, os.getpid())

    def release(self) -> None:
        """Remove this storage's memmap files now (``close()``); the data stays readable until the storage is
        dropped. A no-op without memmap. Idempotent."""
        if self._release is not None:
            self._release()

    def write_one(self, item: Any) -> Optional[int]:
        """Fast path for one flat item on CPU (``FastWriter``): the slot, or ``None`` -- with nothing changed -- when
        the item is not a plain match (first item, nested dict, any mismatch); then the generic path reports errors."""
        fast = self._fast
        if fast is None:
            return None
        if type(item) is dict:
            ci = item.get('collect_iter', 0)
            if type(ci) is not int or not -COLLECT_ITER_SAFE < ci < COLLECT_ITER_SAFE:
                return None  # the generic path checks a collect_iter that is no plain int within range
        return fast.write(item, self.ring)

    def check_batch(self, batch: Any) -> Optional[Tuple[List[np.ndarray], int]]:
        """Fast path for a flat batch of arrays on CPU (``FastWriter.check_batch``): ``(columns, n)`` or ``None``
        -- nothing changed -- when the generic path must take it (first batch, nested or converted leaves, any
        mismatch, more items than slots)."""
        return None if self._fast is None else self._fast.check_batch(batch)

    def write_batch(self, checked: Tuple[List[np.ndarray], int]) -> np.ndarray:
        return self._fast.put_batch(checked[0], checked[1], self.ring)

    def _reserve(self, prepared: Prepared) -> None:
        """The fields on the first write; the columns that are not written through a numpy view copied to the device
        now (a CUDA out-of-memory error there fails the push before anything changed)."""
        columns = prepared.payload[1]
        for path, column in columns.items():
            if path not in self._views:  # (before the first write allocates: its views do not exist yet)
                columns[path] = column.to(self.device, non_blocking=True)
        if self.schema is None:
            self.allocate(prepared.payload[0])
            self.tensordict_out = prepared.tensordict  # the first item decides what samples are (tensordict_io)

    def _write(self, slots: np.ndarray, payload: Any) -> None:
        _, columns = payload
        n = len(slots)
        first = int(slots[0])
        if not self.ring.derived_ids:  # a free-list index writes to any free slots: scatter them
            self._scatter(slots, columns)
            return
        for path, column in columns.items():
            # CPU: numpy slice assignment (a third of torch's per-call overhead); else torch on the device
            dst = self._views.get(path)
            if dst is not None:
                src = column.numpy()
            else:
                dst, src = self.fields[path], column  # (on the device: ``_reserve``)
            if first + n <= self.capacity:  # contiguous: one slice assignment per field
                dst[first : first + n] = src
            else:  # wraps around the ring: two slices
                k = self.capacity - first
                dst[first:] = src[:k]
                dst[: n - k] = src[k:]

    def _scatter(self, slots: np.ndarray, columns: Dict[Path, torch.Tensor]) -> None:
        """Each column's rows to ``slots`` (any order): numpy fancy assignment on CPU views, torch elsewhere."""
        idx = None
        for path, column in columns.items():
            dst = self._views.get(path)
            if dst is not None:
                dst[slots] = column.numpy()
            else:
                if idx is None:
                    idx = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(self.device)
                dst, src, bits = self.fields[path], column, bits_of(column.dtype)  # (on the device: ``_reserve``)
                if bits is not None:  # float8_e8m0fnu has no index_put: its bit patterns go instead
                    dst, src = dst.view(bits), src.view(bits)
                dst[idx] = src

    def select(self, prepared: Prepared, keep: np.ndarray) -> Prepared:
        """The items of ``prepared`` where ``keep`` (a mask over its kept items) holds, as a new ``Prepared``."""
        schema, columns = prepared.payload
        rows = torch.from_numpy(np.flatnonzero(keep))
        payload = {p: t.index_select(0, _on(rows, t)) for p, t in columns.items()}
        return Prepared((schema, payload), len(rows), 0, [], prepared.tensordict)

    def write_at(self, slots: np.ndarray, prepared: Prepared, rows: Optional[np.ndarray] = None) -> None:
        """Scatter rows ``rows`` (default: all) of ``prepared`` to arbitrary ``slots``, bypassing the ring (for
        buffers that manage slots themselves). Allocates the fields on first use."""
        self._reserve(prepared)
        _, columns = prepared.payload
        if rows is not None:
            rows_t = torch.from_numpy(np.asarray(rows, dtype=np.int64))
            columns = {path: column.index_select(0, _on(rows_t, column)) for path, column in columns.items()}
        self._scatter(slots, columns)

    def read_at(self, slots: np.ndarray) -> Dict[str, Any]:
        """The fields at ``slots`` as a nested dict of batched tensors, without the meta keys. On CPU numpy
        ``take`` is ~2x faster than ``index_select`` on small rows; elsewhere ``index_select`` is 2-2.5x faster
        than advanced indexing on large random gathers."""
        slots = np.asarray(slots, dtype=np.int64)
        fast = self._fast
        if fast is not None:  # a flat schema on CPU: one take per field, no nesting to rebuild
            return {key: torch.from_numpy(view.take(slots, axis=0)) for key, view, _, _, _, _ in fast.spec}
        flat = {}
        for p, field in self.fields.items():
            view = self._views.get(p)
            flat[p] = (
                torch.from_numpy(view.take(slots, axis=0))
                if view is not None
                else torch.index_select(field, 0, torch.from_numpy(slots).to(self.device))
            )
        return unflatten(flat)

    # ------------------------------------------------------------------ reading
    def gather(self, slots: np.ndarray, uids: Optional[np.ndarray] = None) -> Dict[str, Any]:
        """The items at ``slots`` (see the module doc); ``uids``: their ids when the caller computed them."""
        slots = np.asarray(slots, dtype=np.int64)
        uids = torch.from_numpy(self.ring.uids(slots) if uids is None else uids)
        if slots.ndim == 1:
            out = self.read_at(slots)
            idx = torch.from_numpy(slots.copy())  # independent of the caller
            if self._fast is not None:  # on CPU already
                out['replay_buffer_idx'], out['replay_unique_id'] = idx, uids
            else:
                out['replay_buffer_idx'], out['replay_unique_id'] = idx.to(self.device), uids.to(self.device)
            return out
        idx = torch.tensor(slots, device=self.device)  # a copy: the caller's array stays independent
        out = unflatten({p: field[idx] for p, field in self.fields.items()})
        out['replay_buffer_idx'] = idx
        out['replay_unique_id'] = uids.to(self.device)
        return out

    def collect_iter(self, slots: np.ndarray) -> np.ndarray:
        field = self.fields.get(('collect_iter',))
        if field is None:
            return np.full(len(slots), NO_ITER, dtype=np.int64)
        vals = field[torch.as_tensor(slots, device=field.device)]
        if vals.dim() > 1:
            if not vals.shape[1:].numel():  # an empty collect_iter per item: none (as list storage)
                return np.full(len(slots), NO_ITER, dtype=np.int64)
            if vals.is_floating_point() or vals.dtype in WIDE_UNSIGNED:  # (torch has no min of float8 / wide uint)
                vals = vals.double() if vals.is_floating_point() else vals.to(torch.int64)
            vals = vals.flatten(1).min(dim=1).values
        return vals.to(torch.int64).cpu().numpy()

    def staleness(self, slots: np.ndarray, cur_learner_iter: int) -> np.ndarray:
        if ('collect_iter',) not in self.fields:
            return np.full(len(slots), -1, dtype=np.int64)  # no element has one: skip the column of NO_ITER
        return super().staleness(slots, cur_learner_iter)

    def nbytes_per_item(self) -> int:
        """Bytes of field data per slot (what a transition costs in this storage)."""
        return sum(f[0].numel() * f.element_size() for f in self.fields.values())

    def __repr__(self) -> str:
        fields = '(schema not yet known: inferred from the first item)'
        if self.schema is not None:
            fields = ', '.join(
                f"'{path_name(p)}': {{'shape': {shape}, 'dtype': {dtype_name(dtype)}}}"
                for p, (shape, dtype) in self.schema.items()
            )
            fields = '{' + fields + '}'
        where = f", memmap_dir={self.memmap_dir!r}" if self.memmap_dir else ''
        return (
            f"TensorStorage(capacity={self.capacity}, count={len(self)}, device={self.device}{where}, fields={fields})"
        )

    # ------------------------------------------------------------------ persistence
    def read_fields(self, slots: np.ndarray) -> List[torch.Tensor]:
        """Copies of every field at ``slots``, in schema order."""
        idx = torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(self.device)
        return [self.fields[p][idx] for p in self.schema or {}]

    def write_fields(self, slots: np.ndarray, fields: List[torch.Tensor]) -> None:
        """Write per-field tensors (schema order, validated by ``import_fields``) at ``slots``."""
        self._scatter(slots, {p: f.to(self.device) for p, f in zip(self.schema, fields)})

    def state_dict(self) -> Dict[str, Any]:
        slots = self.ring.ordered_slots()
        fields = [] if self.schema is None else [t.cpu() for t in self.read_fields(slots)]
        out = {
            'kind': self.kind,
            'ring': self.ring.state_dict(),
            'slots': torch.from_numpy(slots.astype(np.int64)),
            'schema': export_schema(self.schema),
            'fields': fields,
        }
        if self.tensordict_out:  # only then: files of dict buffers stay as they were
            out['container'] = 'tensordict'
        return out

    @classmethod
    def from_state(
        cls,
        state: Dict[str, Any],
        capacity: int,
        device: str = 'cpu',
        memmap_dir: Optional[str] = None,
        reserved_keys: Tuple[str, ...] = (),
        index_cls: type = RingIndex,
    ) -> 'TensorStorage':
        check_state(state, cls.kind, ('ring', 'slots', 'schema', 'fields'), ('container',))
        ring = index_cls.from_state(state['ring'], capacity)
        slots = np.asarray(state['slots'], dtype=np.int64)
        if not np.array_equal(np.sort(slots), np.flatnonzero(ring.valid)):
            raise ValueError("saved storage slots do not match the ring's valid slots")
        schema, fields = import_fields(state['schema'], state['fields'], len(slots))
        if ring.count and not schema:
            raise ValueError("saved storage holds items but no schema")
        container = state.get('container', 'dict')
        if container not in ('dict', 'tensordict') or (container == 'tensordict' and not schema):
            raise ValueError(
                f"saved storage has container {container!r:.40}; expected 'dict' or 'tensordict' (with a schema)"
            )
        storage = cls(capacity, device=device, memmap_dir=memmap_dir, reserved_keys=reserved_keys, index_cls=index_cls)
        if schema:
            storage.allocate(schema)
            storage.write_fields(slots, fields)
        storage.tensordict_out = container == 'tensordict'
        storage.ring = ring
        return storage


def _check_collect_iter(columns: Dict[Path, torch.Tensor]) -> None:
    """A ``collect_iter`` field holds finite real numbers within +-2**60 (staleness reads it later)."""
    t = columns.get(('collect_iter',))
    if t is None:
        return
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"field 'collect_iter' must be ints, got dtype {t.dtype}")
    limit = 1 << 60  # (ints compared as ints: a double rounds 2**60 - 1 up to 2**60)
    wide = t.double() if t.is_floating_point() else None  # (float8 has no trunc)
    if wide is not None:
        inside = bool((wide.abs() < limit).all())  # NaN fails too
    elif t.dtype == torch.uint64:  # (torch compares no uint64)
        inside = bool((t.cpu().numpy() < limit).all())
    else:
        inside = bool(((t.to(torch.int64) > -limit) & (t.to(torch.int64) < limit)).all())
    if t.numel() and not inside:
        raise ValueError("field 'collect_iter' must be finite ints within +-2**60 (got NaN, inf or a huge value)")
    if wide is not None and t.numel() and not bool((wide == wide.trunc()).all()):  # list storage's rule too
        raise ValueError("field 'collect_iter' must be whole numbers (learner iterations), got a fractional value")


def _on(index: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """A CPU ``index`` where ``column`` is (``index_select`` needs both on one device: a pushed column may be on the
    GPU)."""
    return index if column.is_cpu else index.to(column.device)

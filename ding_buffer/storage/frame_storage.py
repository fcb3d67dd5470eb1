"""``FrameStorage``: tensor storage with image observations stored one frame a transition (``storage.frames``).

The layout and the stream rules are in ``frames``; here they meet the tensor storage. Every field but the two
stacks is stored as ``TensorStorage`` stores it; the stacks become two id columns (``'<key>:frames'``
``[stack]`` and ``'<next_key>:frame'``), and ``gather`` puts the rebuilt stacks back under their own names, so a
sample looks exactly like one of a storage holding the stacks in full.

Writes: ``prepare`` + ``write`` (any push; ``WriteResult.expired`` lists the live transitions whose oldest frame
the new frames overwrote, which the buffer removes: ``removed_by_frames``), ``write_one`` (one step), ``discard`` (a
push refused whole). A push that raised changes nothing. Batches go row by row: there is no fast batch path.
"""

import os
import weakref
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..persistence import refuse_unknown
from ..sampling import sorted_unique
from .base import Prepared, WriteResult, check_state
from .frames import IDS_SUFFIX, NEXT_SUFFIX, FrameRing, StreamEncoder, bits_of, default_rows, frame_spec
from .tensor_fields import allocate_fields, memmap_file, new_token, remove_files
from .tensor_schema import dtype_name
from .tensor_storage import TensorStorage
from .tensordict_io import check_batched, check_item, is_tensordict, to_plain
from .tree import flatten, path_name, unflatten

N_STEP_KEYS = ('n_step', 'n_step_discount')  # what an n-step sample adds
NONE = np.iinfo(np.int64).max  # no frame id (an empty slot's oldest)


class FrameStorage(TensorStorage):
    """
    Overview:
        ``TensorStorage`` with ``spec['key']`` / ``spec['next_key']`` frame stacks stored once (see the module
        docstring and ``frames``).
    Examples:
        >>> import numpy as np
        >>> s = FrameStorage(8, frames=dict(key='obs', next_key='next_obs'))
        >>> f = [np.full((2, 2), k, dtype=np.uint8) for k in range(4)]  # frames 0, 1, 2, 3 of one episode
        >>> steps = [{'obs': np.stack(f[t : t + 2]), 'next_obs': np.stack(f[t + 1 : t + 3]), 'done': False}
        ...          for t in range(2)]
        >>> res = s.write(s.prepare(steps))
        >>> out = s.gather(res.slots)
        >>> out['obs'][:, :, 0, 0].tolist(), out['next_obs'][:, :, 0, 0].tolist(), s.frames_stored()
        ([[0, 1], [1, 2]], [[1, 2], [2, 3]], 4)
    """

    expires = True  # a write reports the live items whose oldest frame it overwrote

    def __init__(
        self, capacity: int, frames: Optional[Mapping] = None, episodes: Optional[int] = None, **kwargs: Any
    ) -> None:
        super().__init__(capacity, **kwargs)
        self.spec: Dict[str, Any] = {}
        # An episode table's transitions (at most ``episodes`` episodes): every ``prepare`` is one whole episode,
        # one stream of its own that starts at its first step (environment ids and earlier pushes do not matter).
        self.episodes = episodes
        if frames is not None:
            self._configure(frames)

    @property
    def frames_spec(self) -> Dict[str, Any]:
        """The layout's options (``storage.frames`` with its defaults filled in)."""
        return dict(self.spec)

    def _configure(self, frames: Mapping) -> None:
        self.spec = frame_spec(frames)
        if self.episodes is not None and self.spec['n_step'] > 1:
            raise ValueError(
                f"config key 'storage.frames.n_step' is {self.spec['n_step']}: an episode table returns windows of "
                f"consecutive steps, from which the learner builds its n-step targets; use n_step=1"
            )
        self.encoder = StreamEncoder(self.spec if self.episodes is None else dict(self.spec, env_key=None))
        self.stack: Optional[int] = self.spec['stack']
        if self.stack is not None:
            self._check_room(self.stack)
        self.frame_ring = FrameRing(0)  # sized and allocated by the first write, when the frames are known
        self.streams: Dict[Any, Tuple[Tuple[int, ...], bool]] = {}
        # each slot's oldest frame id (the frame that leaves the ring first), and a lower bound of it over the
        # stored items: while the ring's overwrite point stays below it, no stored item loses a frame (O(1))
        self.oldest_frame = np.full(self.capacity, NONE, dtype=np.int64)
        self._floor = NONE
        self._frame_release: Optional[weakref.finalize] = None
        # n-step: each slot's successor in its stream (slot and item id; -1: none yet) and each stream's last item
        self.succ = np.full(self.capacity, -1, dtype=np.int64)
        self.succ_uid = np.full(self.capacity, -1, dtype=np.int64)
        self.last: Dict[Any, Tuple[int, int]] = {}
        self._prune_at = 64  # (streams: pruned when they reach it; ``_forget_streams``)

    # ------------------------------------------------------------------ writing
    def write_one(self, item: Any) -> Optional[int]:
        """The single-step fast path: the frames are matched against the stream as ``prepare`` does (a broken
        stream raises the same error), the other fields go through the tensor storage's fast writer. None --
        nothing changed -- before the first write, for anything but a plain dict matching the schema, and when
        the new frames would overwrite a stored item's (the checking path removes and reports those)."""
        if type(item) is not dict or self._fast is None or not self.frame_ring.allocated():
            return None
        rows, pending, _ = self.encoder.encode([item], self.frame_ring, self.streams, self.stack, None, self._rows)
        ring = self.frame_ring
        row = rows[0]
        oldest = int(row[self.encoder.ids_key].min())
        threshold = ring.next_id + len(pending.frames) - ring.rows
        if oldest < threshold or self._losing(threshold) is not None:
            return None  # frames of stored items (or of this one) leave: the checking path removes and reports them
        slot = TensorStorage.write_one(self, row)
        if slot is None:
            return None
        self._settle(pending, np.ones(1, dtype=bool), np.array([slot]), np.array([int(self.ring.uids(slot))]))
        self.oldest_frame[slot] = oldest
        self._floor = min(self._floor, oldest)
        return slot

    def check_batch(self, batch: Any) -> Optional[Tuple[List[np.ndarray], int]]:
        return None

    def prepare(
        self, items: List[Any], schema: Optional[Any] = None, trim: bool = True, after: Optional[Prepared] = None
    ) -> Prepared:
        """Validate (frames against the streams, the other fields against the schema); no side effects. The
        payload: the tensor storage's, the pending frames, the stack size and which kept items are written (None:
        all; ``select`` narrows it). ``after``: a push prepared before this one and written before it (an episode
        table's earlier episode of the same push): this one's frames follow its frames."""
        tensordict = bool(items) and type(items[0]) is not dict and is_tensordict(items[0])
        plain = []
        for i, item in enumerate(items):  # TensorDict steps are read as dicts; samples are TensorDicts again
            if type(item) is not dict and is_tensordict(item):
                check_item(item, i)
                item = to_plain(item)
            plain.append(item)
        items = plain
        for i, item in enumerate(items):
            for name in N_STEP_KEYS if self.spec['n_step'] > 1 and isinstance(item, dict) else ():
                if name in item:
                    raise ValueError(f"item {i}: field {name!r} is reserved by storage.frames.n_step")
        first, stack = None, self.stack
        if after is not None:
            before = after.payload[1]
            first, stack = before.first + len(before.frames), after.payload[2]
        streams = {} if self.episodes is not None else self.streams  # an episode starts its own stream
        # (an episode's frames all fit in the ring or it is refused below: its steps never store a stack again)
        planned = self._rows if self.episodes is None else None
        rows, pending, stack = self.encoder.encode(items, self.frame_ring, streams, stack, first, planned)
        if not self.frame_ring.allocated() and stack is not None:
            self._check_room(stack)
        if self.episodes is not None and pending.frames:  # an episode's frames must all fit in the ring at once
            room = self.frame_ring.rows if self.frame_ring.allocated() else self._rows(stack)
            if len(pending.frames) > room:
                raise ValueError(
                    f"the episode needs {len(pending.frames)} frames; the frame ring has {room} rows "
                    f"(max_transitions + storage.frames.spare={self.spec['spare']}); raise storage.frames.spare or "
                    f"leave it None (room for every episode's first stack)"
                )
        if after is not None and pending.frames and after.payload[1].frames:
            a, b = after.payload[1], pending
            if (a.frames[0].shape, a.dtype) != (b.frames[0].shape, b.dtype):
                raise ValueError(
                    f"field {self.spec['key']!r} has frames of shape {b.frames[0].shape} and dtype {b.dtype}; the "
                    f"push's earlier steps have {a.frames[0].shape} and {a.dtype}"
                )
        prepared = super().prepare(rows, schema, trim)
        self._check_schema(prepared.payload[0], stack)
        return prepared._replace(payload=(prepared.payload, pending, stack, None), tensordict=tensordict)

    def _check_schema(self, schema: Any, stack: int) -> None:
        """The fields a frames table needs: both id columns as written, no stacked field, no n-step output name,
        and with ``n_step > 1`` a reward of one real number a step and flags of one value."""
        spec, enc = self.spec, self.encoder
        for key, shape in ((enc.ids_key, (stack,)), (enc.next_id_key, ())):
            entry = schema.get((key,))
            if entry is None or tuple(entry[0]) != shape or entry[1] != torch.int64:
                raise ValueError(f"field {key!r} (storage.frames) must be int64 of shape {shape}, got {entry}")
        for key in (spec['key'], spec['next_key']) + (N_STEP_KEYS if spec['n_step'] > 1 else ()):
            if any(p[0] == key for p in schema):
                raise ValueError(f"field {key!r} cannot be a stored column of a storage.frames table")
        if spec['n_step'] == 1:
            return
        for key, need in ((spec['reward_key'], True), (spec['done_key'], False), (spec['truncated_key'], False)):
            entry = schema.get((key,)) if key is not None else None
            if entry is None:
                if need:
                    raise ValueError(
                        f"storage.frames.n_step={spec['n_step']} sums the field {key!r} "
                        f"(storage.frames.reward_key), which the items do not have"
                    )
                continue
            shape, dtype = entry
            if tuple(shape) not in ((), (1,)) or dtype.is_complex:
                raise ValueError(
                    f"storage.frames.n_step needs field {key!r} to be one real number a step, got shape {shape} "
                    f"and dtype {dtype}"
                )

    def prepare_batch(
        self, batch: Any, schema: Optional[Any] = None, trim: bool = True, after: Optional[Prepared] = None
    ) -> Prepared:
        tensordict = type(batch) is not dict and is_tensordict(batch)
        if tensordict:
            check_batched(batch)
            batch = to_plain(batch)
        if not isinstance(batch, dict):
            raise TypeError(f"storage.frames takes a batch as a dict of batched leaves, got {type(batch).__name__}")
        flat = flatten(batch)  # nested fields (TorchRL's 'next'): split by path, each row rebuilt nested
        lens = {}
        for path, v in flat.items():
            if not isinstance(v, (np.ndarray, torch.Tensor, list, tuple)) or not len(getattr(v, 'shape', (len(v),))):
                raise ValueError(
                    f"storage.frames takes a batch of batched leaves: field {path_name(path)!r} must be an array, "
                    f"tensor or list with a leading batch dimension, got {type(v).__name__}"
                )
            lens[path_name(path)] = len(v)
        if not lens or len(set(lens.values())) != 1:
            raise ValueError(f"a batched push needs leaves with one leading dimension, got lengths {lens}")
        n = next(iter(lens.values()))
        if n == 0:
            raise ValueError("a batched push got a batch of size 0")
        rows = [unflatten({p: v[j] for p, v in flat.items()}) for j in range(n)]
        return self.prepare(rows, schema, trim, after)._replace(tensordict=tensordict)

    def select(self, prepared: Prepared, keep: np.ndarray) -> Prepared:
        """The kept items where ``keep`` holds (a capacity rule's admission): every pending frame is still
        written (the refused steps' streams go on), the refused items are not stored."""
        inner, pending, stack, mask = prepared.payload
        keep = np.asarray(keep, dtype=bool)
        full = keep.copy() if mask is None else mask.copy()
        if mask is not None:
            full[np.flatnonzero(mask)] = keep
        kept = super().select(prepared._replace(payload=inner), keep)
        return kept._replace(payload=(kept.payload, pending, stack, full), dropped=prepared.dropped)  # (as pushed)

    def _reserve_frames(self, stack: int, pending: Any) -> None:
        ring = self.frame_ring
        if ring.allocated() or not pending.frames:
            return
        self.frame_ring = self._new_ring(stack, tuple(pending.frames[0].shape), pending.dtype)
        self.stack = stack

    def _check_room(self, stack: int) -> None:
        """A transition refers to ``stack + 1`` frames: a ring of fewer rows would lose each one as it is stored."""
        rows = self._rows(stack)
        if self.episodes is None and rows <= stack:
            raise ValueError(
                f"config key 'storage.frames.spare' is {self.spec['spare']}: the frame ring would have {rows} rows "
                f"(replay_buffer_size {self.capacity} + spare), fewer than the {stack + 1} frames a transition's two "
                f"stacks of {stack} refer to; raise it, or leave it None"
            )

    def _rows(self, stack: int) -> int:
        """Rows of this storage's frame ring for frame stacks of ``stack``."""
        return default_rows(self.capacity, stack, self.spec['spare'], self.episodes)

    def frames_like(self) -> Optional[Tuple[int, Tuple[int, ...], torch.dtype]]:
        """``(stack, frame shape, dtype)`` of the stored frames; None until the first write (or a state) sets them."""
        ring = self.frame_ring
        if self.stack is None or ring.shape is None or ring.dtype is None:
            return None
        return self.stack, tuple(ring.shape), ring.dtype

    def _new_ring(self, stack: int, shape: Tuple[int, ...], dtype: torch.dtype) -> FrameRing:
        """An allocated frame ring for this storage (in memory, or a memory-mapped file removed with it)."""
        rows = self._rows(stack)
        token = new_token()
        try:
            field = allocate_fields({('frames',): (shape, dtype)}, rows, self.device, self.memmap_dir, token)
        except ValueError as e:  # (too large for memory: the rows come from the capacity and the spare rows)
            raise ValueError(
                f"{e} (the frame ring's {rows} rows: capacity {self.capacity} + storage.frames.spare "
                f"{self.spec['spare']})"
            ) from None
        ring = FrameRing(rows)
        ring.adopt(field[('frames',)])
        if self.memmap_dir is not None:
            if self._frame_release is not None:  # the ring it replaces (a restore)
                self._frame_release()
            self._frame_release = weakref.finalize(
                self, remove_files, [memmap_file(self.memmap_dir, 0, ('frames',), token)], os.getpid()
            )
        return ring

    def write(self, prepared: Prepared, report_evicted: bool = True) -> WriteResult:
        inner, pending, stack, mask = prepared.payload
        before = self.frame_ring, self.stack
        self._reserve_frames(stack, pending)  # may fail (memory, files): nothing has changed yet
        try:
            result = super().write(prepared._replace(payload=inner), report_evicted)
        except BaseException:  # (the fields' first allocation failed: the new ring goes too, with its file)
            if self.frame_ring is not before[0]:
                if self._frame_release is not None:
                    self._frame_release()
                self.frame_ring, self.stack, self._frame_release = *before, None
            raise
        stored = np.ones(len(pending.envs), dtype=bool)
        stored[: prepared.dropped] = False
        if mask is not None:
            stored[prepared.dropped :] = mask
        self._settle(pending, stored, result.slots, result.uids)
        ids = inner[1][(self.encoder.ids_key,)].numpy()
        if len(ids):
            oldest = ids.reshape(len(ids), -1).min(axis=1)
            self.oldest_frame[result.slots] = oldest
            self._floor = min(self._floor, int(oldest.min()))
        return result._replace(expired=self._losing(self.frame_ring.next_id - self.frame_ring.rows))

    def overwrites_below(self, prepared: Prepared) -> Optional[int]:
        """Writing ``prepared`` overwrites the frames with ids below this (None: none, the ring is not built yet);
        an episode table removes the episodes holding such frames first."""
        ring = self.frame_ring
        return None if not ring.allocated() else ring.next_id + len(prepared.payload[1].frames) - ring.rows

    def oldest_frame_of(self, slot: int) -> int:
        """The id of the oldest frame the item at ``slot`` refers to."""
        return int(self.oldest_frame[slot])

    def discard(self, prepared: Prepared) -> Optional[np.ndarray]:
        """A prepared push refused whole: its frames are written and its streams go on (the next step of each
        continues), none of its items is stored. Returns the stored items that lost frames, if any."""
        _, pending, stack, _ = prepared.payload
        self._reserve_frames(stack, pending)
        self._settle(pending, np.zeros(len(pending.envs), dtype=bool), np.zeros(0, np.int64), np.zeros(0, np.int64))
        return self._losing(self.frame_ring.next_id - self.frame_ring.rows)

    def _settle(self, pending: Any, stored: np.ndarray, slots: np.ndarray, uids: np.ndarray) -> None:
        """After a push (written, in part or not at all): its frames go into the ring, its streams move on, and
        the stored items join their streams' chains (``_link``)."""
        self.frame_ring.commit(pending)
        self.streams.update(pending.streams)
        self._link(pending, stored, slots, uids)
        if len(self.streams) > self._prune_at:
            self._forget_streams()

    def _forget_streams(self) -> None:
        """Drop the streams whose frames the ring no longer holds, and their last items: the next step of such a
        stream starts an episode either way (its last item lost its frames too), so nothing changes but memory.
        Amortised (run when the streams doubled since the last run): a run with a new environment id per episode
        keeps streams, and its saved state, bounded by the ring instead of growing with every id it saw."""
        ring = self.frame_ring
        for env in [env for env, (sids, _) in self.streams.items() if not ring.holds(np.array(sids)).all()]:
            del self.streams[env]
            self.last.pop(env, None)
        self._prune_at = max(64, 2 * len(self.streams))

    def _link(self, pending: Any, stored: Any, slots: np.ndarray, uids: np.ndarray) -> None:
        """Each stored item (``stored``: a mask over the pushed items; ``slots`` / ``uids`` of the stored ones, in
        order) becomes its stream's last, and its stream's previous item (still stored, same episode) points to
        it. An item not stored (dropped for space, refused) ends its stream's chain: the next one starts anew."""
        uids_now = self.ring.uids
        last: Dict[Any, Optional[Tuple[int, int]]] = {}
        k = 0
        for env, cont, keep in zip(pending.envs, pending.continues, stored):
            if not keep:
                last[env] = None
                continue
            slot, uid = int(slots[k]), int(uids[k])
            k += 1
            self.succ[slot] = self.succ_uid[slot] = -1
            prev = (last[env] if env in last else self.last.get(env)) if cont else None
            if prev is not None and self.ring.valid[prev[0]] and int(uids_now(np.array([prev[0]]))[0]) == prev[1]:
                self.succ[prev[0]], self.succ_uid[prev[0]] = slot, uid
            last[env] = (slot, uid)
        for env, item in last.items():
            if item is None:
                self.last.pop(env, None)
            else:
                self.last[env] = item

    def _losing(self, threshold: int) -> Optional[np.ndarray]:
        """Stored items whose oldest frame id is below ``threshold`` (frames with such ids are, or are about to
        be, overwritten), oldest first; None when there are none. O(1) while ``threshold`` stays below the floor;
        otherwise one pass over the slots, which also raises the floor to the true minimum."""
        if threshold <= self._floor:
            return None
        oldest = np.where(self.ring.valid, self.oldest_frame, NONE)
        self._floor = int(oldest.min())  # (the lost ones stay stored until the buffer removes them)
        lost = np.flatnonzero(oldest < threshold)
        return lost[np.argsort(oldest[lost], kind='stable')] if len(lost) else None

    def clear(self, reset_push_count: bool = False) -> List[Any]:
        out = super().clear(reset_push_count)
        self.streams, self.last = {}, {}
        self.oldest_frame[:] = NONE
        self._floor = NONE
        self.succ[:] = -1
        self.succ_uid[:] = -1
        return out

    def release(self) -> None:
        super().release()
        if self._frame_release is not None:
            self._frame_release()

    # ------------------------------------------------------------------ reading
    def gather(self, slots: np.ndarray, uids: Optional[np.ndarray] = None) -> Dict[str, Any]:
        out = super().gather(slots, uids)
        enc = self.encoder
        if enc.ids_key not in out:  # nothing stored yet
            return out
        ids = out.pop(enc.ids_key)
        last_ids, new = ids, out.pop(enc.next_id_key)
        if self.spec['n_step'] > 1:
            last_ids, new = self._n_step(out, np.asarray(slots, dtype=np.int64), ids, new)
        if last_ids is ids:  # next_obs is obs shifted by one frame: copied, plus one frame read
            out[enc.key], out[enc.next_key] = self.frame_ring.gather_pair(ids, new)
            return out
        out[enc.key] = self.frame_ring.gather(ids)
        out[enc.next_key] = self.frame_ring.gather(torch.cat([last_ids[..., 1:], new.unsqueeze(-1)], dim=-1))
        return out

    def _column(self, key: Optional[str], slots: np.ndarray) -> Optional[np.ndarray]:
        field = self.fields.get((key,)) if key is not None else None
        if field is None:
            return None
        view = self._views.get((key,))
        if view is not None:
            return view[slots].reshape(len(slots))
        vals = field[torch.from_numpy(slots).to(field.device)].cpu()
        try:
            return vals.numpy().reshape(len(slots))
        except TypeError:  # (bfloat16, float8: numpy has no such dtype; float64 holds them)
            return vals.to(torch.float64).numpy().reshape(len(slots))

    def _n_step(
        self, out: Dict[str, Any], slots: np.ndarray, ids: torch.Tensor, new: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """n-step targets in ``out`` (any slot shape): ``reward`` the discounted sum over up to ``n_step`` steps of
        the item's stream, cut after a step that ended its episode or where the next step is not stored;
        ``done`` / ``truncated`` of the last step summed; ``n_step`` (steps summed, k) and ``n_step_discount``
        (gamma ** k, to bootstrap from ``next_obs``, which becomes the last step's). Returns the last steps' ``obs``
        frame ids and new-frame ids (their ``next_obs``)."""
        spec, enc = self.spec, self.encoder
        shape = slots.shape
        flat = slots.reshape(-1)
        rk, dk, tk = spec['reward_key'], spec['done_key'], spec['truncated_key']

        def ended(idx: np.ndarray) -> np.ndarray:
            e = np.zeros(len(idx), dtype=bool)
            for key in (dk, tk):
                col = self._column(key, idx)
                if col is not None:
                    e |= col.astype(bool)
            return e

        ret = self._column(rk, flat).astype(np.float64)
        k = np.ones(len(flat), dtype=np.int64)
        cur = flat.copy()
        alive = ~ended(cur)
        gamma, g = float(spec['gamma']), 1.0
        for _ in range(1, spec['n_step']):
            nxt, nuid = self.succ[cur], self.succ_uid[cur]
            ok = alive & (nxt >= 0)
            where = np.flatnonzero(ok)
            if len(where):
                cand = nxt[where]
                ok[where] = self.ring.valid[cand] & (self.ring.uids(cand) == nuid[where])
            if not ok.any():
                break
            g *= gamma
            ret[ok] += g * self._column(rk, nxt[ok]).astype(np.float64)  # (g times float32 stays float32 in numpy 2)
            k[ok] += 1
            cur = np.where(ok, nxt, cur)
            alive = ok & ~ended(cur)
        moved = not np.array_equal(cur, flat)
        dev = new.device
        field = self.fields[(rk,)]
        dtype = field.dtype if field.dtype.is_floating_point else torch.float32  # (a sum of discounted ints)
        out[rk] = torch.from_numpy(ret).to(dtype).reshape(*shape, *field.shape[1:]).to(dev)
        if moved:
            for key in (dk, tk):
                if key is not None and (key,) in self.fields:
                    f = self.fields[(key,)]
                    out[key] = f[torch.from_numpy(cur).to(f.device)].reshape(*shape, *f.shape[1:]).to(dev)
        out['n_step'] = torch.from_numpy(k.reshape(shape)).to(dev)
        out['n_step_discount'] = torch.from_numpy((gamma**k).astype(np.float32).reshape(shape)).to(dev)
        if not moved:
            return ids, new
        at = [self.fields[(key,)] for key in (enc.ids_key, enc.next_id_key)]
        idx = torch.from_numpy(cur).to(at[0].device)
        return at[0][idx].reshape(*shape, -1).to(dev), at[1][idx].reshape(shape).to(dev)

    def end_streams(self, env: Any = None) -> None:
        """End every stream (or ``env``'s): its next step starts an episode, whatever its ``obs``. For an
        environment reset without a terminal step first, e.g. a training run resumed from a checkpoint."""
        for key in list(self.streams) if env is None else [env]:
            if key in self.streams:
                self.streams[key] = (self.streams[key][0], True)
            self.last.pop(key, None)

    def frames_stored(self) -> int:
        """Distinct frames written so far (the ring holds the newest ``rows`` of them)."""
        return self.frame_ring.next_id

    def nbytes_per_item(self) -> int:
        ring = self.frame_ring
        if not ring.allocated():
            return super().nbytes_per_item()
        frame = ring.frames[0].numel() * ring.frames.element_size()
        return super().nbytes_per_item() + -(-frame * ring.rows // self.capacity)

    def __repr__(self) -> str:
        ring = self.frame_ring
        rows = f"{ring.rows} rows of {ring.shape} {dtype_name(ring.dtype)}" if ring.allocated() else '-'
        frames = {'key': self.spec['key'], 'next_key': self.spec['next_key'], 'stack': self.stack, 'ring': rows}
        return f"{super().__repr__()[:-1]}, frames={frames})"

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> Dict[str, Any]:
        """The tensor storage's state with the frames the items and streams refer to, numbered from 0 at the oldest
        of them, with the gaps between them kept and the ring's next id (``next``): a restored ring holds each frame
        at its place, so it overwrites them when this one would."""
        out = super().state_dict()
        enc, ring = self.encoder, self.frame_ring
        cols: Dict[str, np.ndarray] = {}
        if self.schema is not None:
            slots = torch.from_numpy(self.ring.ordered_slots().astype(np.int64))
            for key in (enc.ids_key, enc.next_id_key):
                cols[key] = self.fields[(key,)][slots].cpu().numpy()
        streams = [
            (env, np.asarray(sids, dtype=np.int64), bool(ended))
            for env, (sids, ended) in self.streams.items()
            if ring.allocated() and ring.holds(np.array(sids)).all()
        ]
        used = [c.reshape(-1) for c in cols.values()] + [sids for _, sids, _ in streams]
        ids = sorted_unique(np.concatenate(used)) if used else np.zeros(0, dtype=np.int64)
        if len(ids) and not ring.holds(ids).all():
            raise RuntimeError("a stored transition refers to a frame the ring no longer holds (internal error)")
        lo = int(ids[0]) if len(ids) else 0
        names = list(self.schema or ())  # the id columns as the new numbers (the fields list is in schema order)
        for key, col in cols.items():
            out['fields'][names.index((key,))] = torch.from_numpy(col - lo)
        data = torch.from_numpy(ring.read(ids)) if len(ids) else torch.zeros(0, dtype=torch.uint8)
        if len(ids) and ring.bits is not None:  # read as their bit patterns (bfloat16, float8)
            data = data.view(ring.dtype)
        out['frames'] = {
            'ids': torch.from_numpy(ids - lo),
            'next': int(ring.next_id) - lo if len(ids) else 0,
            'data': data,
            'stack': self.stack,
            'streams': [[env, (sids - lo).tolist(), ended] for env, sids, ended in streams],
            'shape': None if ring.shape is None else list(ring.shape),
            'dtype': None if ring.dtype is None else dtype_name(ring.dtype),
        }
        order = self.ring.ordered_slots()
        out['links'] = {
            'succ': torch.from_numpy(self.succ[order].copy()),
            'succ_uid': torch.from_numpy(self.succ_uid[order].copy()),
            'last': [[env, *self.last[env]] for env, _, _ in streams if env in self.last],  # (of the saved streams)
        }
        return out

    @classmethod
    def from_state(
        cls,
        state: Dict[str, Any],
        capacity: int,
        frames: Optional[Mapping] = None,
        episodes: Optional[int] = None,
        **kwargs: Any,
    ):
        check_state(state, cls.kind, ('ring', 'slots', 'schema', 'fields', 'frames'), ('container', 'links'))
        saved = state['frames']
        if not isinstance(saved, Mapping) or not {'ids', 'data', 'stack', 'streams'} <= set(saved):
            raise ValueError("saved storage 'frames' must be a dict with ids, data, stack and streams")
        refuse_unknown(saved, ('ids', 'data', 'stack', 'streams', 'shape', 'dtype', 'next'), "saved storage 'frames'")
        storage = super().from_state(
            {k: v for k, v in state.items() if k not in ('frames', 'links')}, capacity, **kwargs
        )
        if not np.array_equal(np.asarray(state['slots'], dtype=np.int64), storage.ring.ordered_slots()):
            # (a plain tensor storage may take them in any order; here each step's frames follow the one before)
            raise ValueError("saved storage slots are not in the ring's order, which the frame streams follow")
        storage.episodes = episodes
        storage._configure(frames)
        storage._restore_frames(saved)
        storage._restore_links(state.get('links'))
        return storage

    def _restore_links(self, links: Any) -> None:
        if links is None:  # (a state without them: no item has a successor yet)
            return
        if not isinstance(links, Mapping) or not {'succ', 'succ_uid', 'last'} <= set(links):
            raise ValueError("saved storage 'links' must be a dict with succ, succ_uid and last")
        refuse_unknown(links, ('succ', 'succ_uid', 'last'), "saved storage 'links'")
        order = self.ring.ordered_slots()
        succ = np.asarray(torch.as_tensor(links['succ']).cpu(), dtype=np.int64).reshape(-1)
        suid = np.asarray(torch.as_tensor(links['succ_uid']).cpu(), dtype=np.int64).reshape(-1)
        if (
            len(succ) != len(order)
            or len(suid) != len(order)
            or (len(succ) and (succ.min() < -1 or succ.max() >= self.capacity))
        ):
            raise ValueError(f"saved links must be {len(order)} successor slots in [-1, {self.capacity})")
        last = {}
        for entry in links['last']:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
                raise ValueError(f"saved stream end {entry!r:.60} is not [env, slot, item id]")
            env, slot, uid = entry
            _check_env(env)
            if type(slot) is not int or not 0 <= slot < self.capacity or type(uid) is not int:
                raise ValueError(f"saved stream end {entry!r:.60} names no slot of this storage")
            if env in last:
                raise ValueError(f"saved stream ends name environment {env!r:.40} twice")
            last[env] = (slot, uid)
        self.succ[order], self.succ_uid[order], self.last = succ, suid, last
        self._check_links()

    def _check_links(self) -> None:
        """A restored state's links must be the ones its frames make (``ValueError`` otherwise): an item's live
        successor is the stored item whose newest frame is its next frame (frame ids are never shared), and a
        stream's last item, when stored and its episode goes on, is the one whose next frames are the stream's.
        Else an n-step sample follows another environment's steps, or stops early, and the next push links to the
        wrong item."""
        slots = np.flatnonzero(self.ring.valid)
        if self.schema is None or not len(slots):
            return
        enc = self.encoder
        index = torch.from_numpy(slots)
        obs = self.fields[(enc.ids_key,)][index].cpu().numpy().reshape(len(slots), -1)
        nxt = self.fields[(enc.next_id_key,)][index].cpu().numpy().reshape(-1)
        uids = np.asarray(self.ring.uids(slots), dtype=np.int64)
        by_frame = dict(zip(obs[:, -1].tolist(), range(len(slots))))
        want = np.array([by_frame.get(f, -1) for f in nxt.tolist()], dtype=np.int64)  # the item continuing each
        want = np.where((want >= 0) & (uids[np.maximum(want, 0)] > uids), slots[np.maximum(want, 0)], -1)
        succ = self.succ[slots]
        live = succ >= 0
        live[live] = self.ring.valid[succ[live]] & (self.ring.uids(succ[live]) == self.succ_uid[slots][live])
        bad = np.flatnonzero(np.where(live, succ != want, want >= 0))
        if len(bad):
            raise ValueError(
                f"saved links give the item in slot {int(slots[bad[0]])} the successor {int(succ[bad[0]])} (item id "
                f"{int(self.succ_uid[slots[bad[0]]])}); its frames make it {int(want[bad[0]])} (-1: none stored)"
            )
        at = dict(zip(slots.tolist(), range(len(slots))))
        for env, (sids, ended) in self.streams.items():
            if ended:  # (the next push starts an episode: no item links to it; end_streams also drops the last)
                continue
            slot, uid = self.last.get(env, (-1, -1))
            i = at.get(slot, -1)
            if i >= 0 and uids[i] != uid:
                i = -1  # (a last item overwritten since: the next push links to nothing)
            ends = [j for j in np.flatnonzero(nxt == sids[-1]).tolist()]
            if (i < 0 and ends) or (i >= 0 and tuple(obs[i, 1:].tolist()) + (int(nxt[i]),) != tuple(sids)):
                raise ValueError(
                    f"saved stream of environment {env!r:.40} ends in frames {list(sids)} that its saved last item "
                    f"(slot {slot}, id {uid}) does not end in"
                )

    @staticmethod
    def _saved_frame_like(saved: Mapping) -> Optional[Tuple[Tuple[int, ...], torch.dtype]]:
        """The frame shape and dtype a state names (None: it names none)."""
        shape, dtype = saved.get('shape'), saved.get('dtype')
        if shape is None and dtype is None:
            return None
        ok_shape = isinstance(shape, (list, tuple)) and all(type(x) is int and x >= 0 for x in shape)
        tdtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
        if not ok_shape or not isinstance(tdtype, torch.dtype) or tdtype.is_complex:  # (as a push checks frames)
            raise ValueError(f"saved frame shape / dtype {shape!r:.40} / {dtype!r:.20} are not a frame's")
        return tuple(shape), tdtype

    def _saved_stack(self, stack: Any) -> Optional[int]:
        """A state's frame stack (None: no frame seen yet), checked against ``storage.frames.stack`` and the ring's
        size (``_check_room``)."""
        if stack is not None and (type(stack) is not int or stack < 1):
            raise ValueError(f"saved frame stack is {stack!r:.40}; expected None or an int >= 1")
        if self.spec['stack'] is not None and stack is not None and stack != self.spec['stack']:
            raise ValueError(
                f"saved frames have a stack of {stack}; config key 'storage.frames.stack' is {self.spec['stack']}"
            )
        if stack is not None:
            self._check_room(stack)
        return stack

    def _restore_frames(self, saved: Mapping) -> None:
        ids = np.asarray(torch.as_tensor(saved['ids']).cpu(), dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or np.any(np.diff(ids) <= 0)):
            raise ValueError("saved frame ids must be distinct ints >= 0 in increasing order")
        data, stack = torch.as_tensor(saved['data']), self._saved_stack(saved['stack'])
        slots = np.flatnonzero(self.ring.valid)
        has_items = self.schema is not None and len(slots)
        if self.schema is not None:  # what the next push would be checked against must be a frames table's
            if stack is None:
                raise ValueError("saved storage has a schema but no frame stack")
            self._check_schema(self.schema, stack)
        like = self._saved_frame_like(saved)
        if not len(ids):
            if has_items or _saved_next(saved, ids):  # (which checks a saved next: 0 or None here)
                raise ValueError("saved storage has items but no frames")
            self.stack = stack if stack is not None else self.stack
            if like is not None:  # the frames a first push must match, as before the save
                self.frame_ring.shape, self.frame_ring.dtype = like
            return
        if data.dim() < 1 or data.shape[0] != len(ids):
            raise ValueError(f"saved frame data has shape {tuple(data.shape)}; expected {len(ids)} frames")
        if stack is None:
            raise ValueError("saved frames have no stack")
        if like is not None and (tuple(data.shape[1:]), data.dtype) != like:
            raise ValueError(f"saved frame data {tuple(data.shape[1:])} {data.dtype} does not match its shape / dtype")
        rows = self._rows(stack)
        if len(ids) > rows:
            raise ValueError(f"saved buffer refers to {len(ids)} frames; this storage's frame ring has {rows} rows")
        new_cols = self._remapped_columns(ids, slots, stack) if has_items else {}
        streams = _saved_streams(ids, saved['streams'], stack)
        _check_all_used(len(ids), new_cols, streams)  # (positions among the saved frames, then their ring ids)
        new_ids, next_id = _saved_places(ids, _saved_next(saved, ids), rows)
        new_cols = {key: new_ids[col] for key, col in new_cols.items()}
        streams = {env: (tuple(new_ids[list(sids)].tolist()), ended) for env, (sids, ended) in streams.items()}
        # valid: build the ring (the frames at their places, in the old order) and swap the columns
        ring = self._new_ring(stack, tuple(data.shape[1:]), data.dtype)
        bits = bits_of(data.dtype)  # frames numpy lacks (bfloat16, float8) go in as their bit patterns
        ring.place(new_ids, (data if bits is None else data.view(bits)).cpu().numpy(), next_id)
        for key, col in new_cols.items():
            self.fields[(key,)][torch.from_numpy(slots)] = torch.from_numpy(col).to(self.device)
        self.frame_ring, self.stack, self.streams = ring, stack, streams
        if has_items:
            oldest = new_cols[self.encoder.ids_key].min(axis=1)
            self.oldest_frame[slots] = oldest
            self._floor = int(oldest.min())

    def _remapped_columns(self, ids: np.ndarray, slots: np.ndarray, stack: int) -> Dict[str, np.ndarray]:
        """The stored items' frame-id columns (at ``slots``), as positions among the saved frame ``ids``."""
        enc, out = self.encoder, {}
        for key in (enc.ids_key, enc.next_id_key):
            col = self.fields[(key,)]
            if col.dtype != torch.int64:
                raise ValueError(f"saved column {key!r} has dtype {col.dtype}; expected int64")
            old = col[torch.from_numpy(slots)].cpu().numpy()
            if key == enc.ids_key and (old.ndim != 2 or old.shape[1] != stack):
                raise ValueError(f"saved column {key!r} has shape {old.shape[1:]}; expected ({stack},)")
            out[key] = _remap(ids, old.reshape(-1), f"items' {key!r}").reshape(old.shape)
        return out


def _saved_next(saved: Mapping, ids: np.ndarray) -> Optional[int]:
    """A state's ``next`` (None: a state of an earlier version), checked: an int above every saved frame id (0
    without frames)."""
    nxt, last = saved.get('next'), int(ids[-1]) if len(ids) else -1
    if nxt is not None and (type(nxt) is not int or not last < nxt < 2**63 or (not len(ids) and nxt)):
        expected = f"an int above the last frame id {last}, below 2**63" if len(ids) else "0 (no frames saved)"
        raise ValueError(f"saved frame 'next' is {nxt!r:.40}; expected {expected}")
    return nxt


def _saved_places(ids: np.ndarray, saved_next: Optional[int], rows: int) -> Tuple[np.ndarray, int]:
    """``(ring ids of the saved frames, the ring's next id)``, numbered from 0 at the oldest: with the saved gaps
    where the state keeps the frames' places (``next``) and they fit ``rows``; else ``0 .. k-1`` (a state without
    ``next``, or a smaller ring: each frame is then overwritten later than in the saved buffer)."""
    lo = int(ids[0])
    if saved_next is None or saved_next - lo > rows:
        return np.arange(len(ids), dtype=np.int64), len(ids)
    return ids - lo, saved_next - lo


def _remap(ids: np.ndarray, old: np.ndarray, what: str) -> np.ndarray:
    """Saved frame ids ``old`` as positions among the saved frames ``ids`` (sorted)."""
    pos = np.searchsorted(ids, old)
    if len(old) and (pos.max() >= len(ids) or not np.array_equal(ids[np.minimum(pos, len(ids) - 1)], old)):
        raise ValueError(f"saved {what} refer to frames the saved state does not hold")
    return pos.astype(np.int64)


def _check_all_used(n: int, cols: Dict[str, np.ndarray], streams: Dict[Any, Tuple[Tuple[int, ...], bool]]) -> None:
    """A state holds the ``n`` frames its items' columns and streams refer to, and no other (``ValueError``)."""
    used = np.zeros(n, dtype=bool)
    for col in cols.values():
        used[col.reshape(-1)] = True
    for sids, _ in streams.values():
        used[list(sids)] = True
    if not used.all():
        raise ValueError(f"saved frames hold {int((~used).sum())} frame(s) that no item or stream refers to")


def _saved_streams(ids: np.ndarray, saved: Any, stack: int) -> Dict[Any, Tuple[Tuple[int, ...], bool]]:
    """Each environment's last ``stack`` frames (as new ids) and whether its episode ended, checked."""
    streams = {}
    for entry in saved:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and len(entry[1]) == stack):
            raise ValueError(f"saved stream {entry!r:.60} is not [env, {stack} frame ids, ended]")
        env, sids, ended = entry
        _check_env(env)
        if env in streams:  # (the later would replace the earlier: one stream lost, the next push refused)
            raise ValueError(f"saved streams name environment {env!r:.40} twice")
        streams[env] = (tuple(int(x) for x in _remap(ids, np.asarray(sids, dtype=np.int64), 'streams')), bool(ended))
    return streams


def _check_env(env: Any) -> None:
    """An environment id in a state: what a push takes (an int or a str)."""
    if isinstance(env, bool) or not isinstance(env, (int, str)):
        raise ValueError(f"saved environment id {env!r:.40} is not an int or a str")


__all__ = ['FrameStorage', 'IDS_SUFFIX', 'NEXT_SUFFIX']

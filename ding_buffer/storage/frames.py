"""Frames stored once: the config of the layout (``storage.frames``), the frame ring, and the streams that turn
pushed stacks into frame ids.

A transition of an image task pushes ``obs`` and ``next_obs`` as stacks ``[stack, *frame]`` (gymnasium's
``FrameStackObservation``: ``next_obs`` is ``obs`` shifted by one frame, with one new frame at the end). Stored in
full that is ``2 * stack`` frames a transition; stored once it is one frame a transition, plus the frames of each
episode's first stack (its repeated reset frame, or zero padding, is one or two distinct frames).

Each frame gets an id (0, 1, 2, ... in write order) and a row ``id % rows`` of the frame ring; a transition keeps
the ids of its ``obs`` stack and of the new frame of ``next_obs``, and ``sample`` rebuilds both stacks by gathering
rows, exactly as they were pushed. The ring holds a few more rows than the table holds transitions
(``storage.frames.spare``); a transition whose oldest frame was overwritten (a table kept older items than the
frames that back them, e.g. many very short episodes) is removed by the buffer, counted ``removed_by_frames``.

Streams. Every environment is a stream (``env_key``: the field naming it; one stream without it). A step continues
its stream when the stream's previous step did not end its episode (``done_key`` / ``truncated_key`` false): its
``obs`` must then equal that step's ``next_obs`` (checked with ``check=True``) and reuses its frames; otherwise it
starts an episode and its ``obs`` frames are stored. With ``check`` a push that breaks this -- a stream continued
with other frames, ``next_obs`` that is not ``obs`` shifted by one frame -- is refused naming the item and field,
and nothing is stored.
"""

from functools import lru_cache
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import torch

from ..config import MAX_CAPACITY
from .base import SAMPLE_FIELDS
from .tensor_schema import dtype_name

# a frames field of a name a sample adds would be replaced in samples; collect_iter has a meaning of its own
_TAKEN = SAMPLE_FIELDS + ('collect_iter',)


def _name(x: Any) -> bool:
    return isinstance(x, str) and bool(x) and x not in _TAKEN


def _none_or_int(low: int) -> Any:
    return lambda v: v is None or (type(v) is int and low <= v <= MAX_CAPACITY)  # (larger: a typo, refused by name)


def _unit(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1


# ``storage.frames``: each option's default, its check and what the check expects
_OPTIONS = {
    'key': ('obs', _name, f'a field name, not one of {_TAKEN}'),
    'next_key': ('next_obs', _name, f'a field name, not one of {_TAKEN}'),
    'stack': (None, _none_or_int(1), 'None (read from the first push) or an int in [1, 2**40]'),
    'env_key': (None, lambda v: v is None or _name(v), f'None (one stream) or a field name, not one of {_TAKEN}'),
    'done_key': ('done', lambda v: v is None or _name(v), f'None or a field name, not one of {_TAKEN}'),
    'truncated_key': ('truncated', lambda v: v is None or _name(v), f'None or a field name, not one of {_TAKEN}'),
    'spare': (None, _none_or_int(0), 'None (automatic) or an int in [0, 2**40]'),
    'check': (True, lambda v: type(v) is bool, 'a bool'),
    'n_step': (1, lambda v: type(v) is int and 1 <= v <= 1000, 'an int in [1, 1000]'),
    'gamma': (0.99, _unit, 'a number in [0, 1]'),
    'reward_key': ('reward', _name, f'a field name, not one of {_TAKEN}'),
}
FRAMES_DEFAULTS = {k: default for k, (default, _, _) in _OPTIONS.items()}
# suffixes of the stored id columns: '<key>:frames' (the obs stack's ids), '<next_key>:frame' (the new frame's id)
IDS_SUFFIX, NEXT_SUFFIX = ':frames', ':frame'


def check_frames(section: Any) -> bool:
    """``storage.frames``: None, or a dict of ``FRAMES_DEFAULTS`` keys; ``ValueError`` naming the key otherwise."""
    if section is None:
        return True
    if not isinstance(section, Mapping):
        raise ValueError(
            f"config key 'storage.frames' must be None or a dict with keys {sorted(FRAMES_DEFAULTS)}, got "
            f"{type(section).__name__} {section!r:.60}"
        )
    for k, v in section.items():
        if k not in FRAMES_DEFAULTS:
            raise ValueError(f"unknown config key 'storage.frames.{k}'; valid keys: {sorted(FRAMES_DEFAULTS)}")
        _, ok, expected = _OPTIONS[k]
        if not ok(v):
            raise ValueError(f"config key 'storage.frames.{k}' has invalid value {v!r:.60}; expected {expected}")
    spec = dict(FRAMES_DEFAULTS, **section)
    names = [(k, spec[k]) for k in ('key', 'next_key', 'env_key', 'done_key', 'truncated_key') if spec[k] is not None]
    if spec['n_step'] > 1:
        names.append(('reward_key', spec['reward_key']))
    seen: Dict[str, str] = {}
    for k, v in names:
        if v in seen:
            raise ValueError(f"config keys 'storage.frames.{seen[v]}' and 'storage.frames.{k}' are both {v!r}")
        seen[v] = k
    return True


def frame_spec(section: Mapping) -> Dict[str, Any]:
    check_frames(section)
    return dict(FRAMES_DEFAULTS, **section)


def default_rows(capacity: int, stack: int, spare: Optional[int], episodes: Optional[int] = None) -> int:
    """Frame rows for a table of ``capacity`` transitions: one a transition, plus ``spare`` (default
    ``capacity // 256 + 4 * stack``: room for the first frame of about one episode in 256 steps; an episode table
    of at most ``episodes`` episodes: ``episodes * stack``, the first stack of every one of them)."""
    if spare is not None:
        return capacity + spare
    return capacity + (episodes * stack if episodes is not None else capacity // 256 + 4 * stack)


class Pending(NamedTuple):
    """Frames a prepared push adds (ids ``first .. first + len(frames) - 1``) and the streams it leaves behind."""

    frames: List[np.ndarray]
    first: int
    streams: Dict[Any, Tuple[Tuple[int, ...], bool]]  # env -> (ids of its last next_obs stack, episode ended)
    envs: List[Any] = []  # each item's environment
    continues: List[bool] = []  # whether each item continues its stream's previous step (same episode)
    dtype: Optional[torch.dtype] = None  # the frames' dtype (``encode`` sets it whenever there are frames)


@lru_cache(maxsize=None)
def bits_of(dtype: torch.dtype) -> Optional[torch.dtype]:
    """The integer dtype of the same width that frames of ``dtype`` are handled as where numpy has no such dtype
    (``bfloat16``, the ``float8`` types): their bit patterns, viewed as ``dtype`` again when read, so frames round
    trip bit-exactly and compare bitwise. None for a dtype numpy holds, or that is no frame's (complex)."""
    if not dtype.is_floating_point:
        return None
    try:
        torch.empty(0, dtype=dtype).numpy()
        return None
    except TypeError:
        return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(
            torch.empty(0, dtype=dtype).element_size()
        )


def frame_dtype(dtype: torch.dtype) -> Any:
    """How ``stack_of`` names frames of the torch ``dtype``: numpy's dtype, or ``dtype`` itself where numpy has
    none (``bits_of``)."""
    return dtype if bits_of(dtype) is not None else torch.empty(0, dtype=dtype).numpy().dtype


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of frames that ``stack_of`` names ``dtype`` (``frame_dtype``'s inverse)."""
    return dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class FrameRing:
    """The frames: a tensor ``[rows, *frame]`` (in memory or memory-mapped), the id held by each row, and the
    next id. Ids only grow; a row is reused after ``rows`` more frames."""

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self.frames: Optional[torch.Tensor] = None
        self.view: Optional[np.ndarray] = None  # numpy view on CPU
        self.ids = np.full(self.rows, -1, dtype=np.int64)  # the id each row holds
        self.next_id = 0
        self.shape: Optional[Tuple[int, ...]] = None
        self.dtype: Optional[torch.dtype] = None
        self.bits: Optional[torch.dtype] = None  # the dtype numpy handles the frames as, where it lacks theirs

    def allocated(self) -> bool:
        return self.frames is not None

    def adopt(self, frames: torch.Tensor) -> None:
        self.frames = frames
        self.bits = bits_of(frames.dtype)  # numpy reads and writes such frames as their bit patterns
        self.view = (
            (frames if self.bits is None else frames.view(self.bits)).numpy() if frames.device.type == 'cpu' else None
        )
        self.shape, self.dtype = tuple(frames.shape[1:]), frames.dtype

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        """Frames read through the numpy view as a tensor of the ring's dtype."""
        out = torch.from_numpy(arr)
        return out if self.bits is None else out.view(self.dtype)

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Mask: the frame of each id is still in the ring."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self.rows:
            return np.zeros(ids.shape, dtype=bool)
        return (ids >= 0) & (ids < self.next_id) & (self.ids[ids % self.rows] == ids)

    def read(self, ids: np.ndarray) -> np.ndarray:
        """The frames of ``ids`` (all held) as one numpy array (CPU) -- for checks at push."""
        rows = np.asarray(ids, dtype=np.int64) % self.rows
        if self.view is not None:
            return self.view[rows]
        out = self.frames[torch.from_numpy(rows).to(self.frames.device)]
        return (out if self.bits is None else out.view(self.bits)).cpu().numpy()

    def commit(self, pending: Pending) -> None:
        """Write the pending frames at their rows (ids from ``next_id`` on, as ``prepare`` gave them out)."""
        n = len(pending.frames)
        if not n:
            return
        if n > self.rows:  # more new frames than rows: only the newest can stay (earlier ones would be overwritten)
            pending = Pending(pending.frames[n - self.rows :], pending.first + n - self.rows, pending.streams)
            n = self.rows
        if n == 1 and self.view is not None:  # one step's new frame: no stacking
            row = pending.first % self.rows
            self.view[row] = pending.frames[0]
            self.ids[row] = pending.first
            self.next_id = pending.first + 1
            return
        self.place(np.arange(pending.first, pending.first + n, dtype=np.int64), np.stack(pending.frames))

    def place(self, ids: np.ndarray, data: np.ndarray, next_id: Optional[int] = None) -> None:
        """Frames ``data`` (as the numpy view holds them) at ``ids``, increasing and within the last ``rows`` ids
        below ``next_id`` (default: the id after the last): a commit, or a restore that keeps each frame's place."""
        rows = ids % self.rows
        if self.view is not None:
            self.view[rows] = data
        else:
            self.frames[torch.from_numpy(rows).to(self.frames.device)] = self._tensor(data).to(self.frames.device)
        self.ids[rows] = ids
        self.next_id = int(ids[-1]) + 1 if next_id is None else next_id

    def gather_pair(self, ids: torch.Tensor, new: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(obs, next_obs)`` stacks of transitions whose obs frames are ``ids`` (``[*S, stack]``) and whose
        ``next_obs`` adds the frame ``new`` (``[*S]``): ``next_obs`` is ``obs`` shifted by one frame, so it copies
        ``stack - 1`` frames from ``obs`` and reads one (one random read a frame of ``obs``, one for ``next_obs``)."""
        if self.view is None:
            return self.gather(ids), self.gather(torch.cat([ids[..., 1:], new.unsqueeze(-1)], dim=-1))
        stack = ids.shape[-1]
        flat = ids.reshape(-1, stack).cpu().numpy()
        obs = self.view.take(self._held_rows(flat.reshape(-1)), axis=0).reshape(len(flat), stack, *self.shape)
        nxt = np.empty_like(obs)
        nxt[:, :-1] = obs[:, 1:]
        nxt[:, -1] = self.view.take(self._held_rows(new.reshape(-1).cpu().numpy()), axis=0)
        out_shape = (*ids.shape, *self.shape)
        return self._tensor(obs).reshape(out_shape), self._tensor(nxt).reshape(out_shape)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Frames of ``ids`` (any shape ``S``) as a new tensor ``[*S, *frame]`` on the ring's device."""
        rows = self._held_rows(ids.reshape(-1).cpu().numpy())
        if self.view is not None:
            out = self._tensor(self.view.take(rows, axis=0))
        else:
            out = self.frames.index_select(0, torch.from_numpy(rows).to(self.frames.device))
        return out.reshape(*ids.shape, *self.shape)

    def _held_rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows of the frames of ``ids``, which sampled transitions refer to: all must be held."""
        if len(ids) and not self.holds(ids).all():
            raise RuntimeError("a sampled transition refers to a frame the ring no longer holds (internal error)")
        return ids % self.rows


def _one(item: Mapping, key: str, i: int, what: str) -> Any:
    """Field ``key`` of item ``i``, a tensor or array of one element read as that element."""
    v = item[key]
    if isinstance(v, (torch.Tensor, np.ndarray)):
        if (v.size if isinstance(v, np.ndarray) else v.numel()) != 1:
            raise ValueError(f"item {i}: field {key!r} must be one {what}, got shape {tuple(v.shape)}")
        v = v.item()
    return v


def flag_of(item: Mapping, key: Optional[str], i: int) -> bool:
    if key is None or key not in item:
        return False
    v = _one(item, key, i, 'flag')
    if isinstance(v, (bool, np.bool_, int, np.integer, float, np.floating)):
        return bool(v)
    raise ValueError(f"item {i}: field {key!r} must be a bool (or 0 / 1), got {type(v).__name__} {v!r:.40}")


def ended_of(item: Mapping, spec: Mapping, i: int) -> bool:
    """Whether step ``i`` ends its episode (``done_key`` or ``truncated_key`` true)."""
    return flag_of(item, spec['done_key'], i) or flag_of(item, spec['truncated_key'], i)


def env_of(item: Mapping, key: Optional[str], i: int) -> Any:
    if key is None:
        return 0
    if key not in item:
        raise ValueError(f"item {i} has no field {key!r} (storage.frames.env_key) naming its environment")
    v = _one(item, key, i, 'id')
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, str)):
        raise ValueError(f"item {i}: field {key!r} must be an int or str environment id, got {type(v).__name__}")
    return int(v) if isinstance(v, np.integer) else v


_NUMPY_TORCH = (  # frame dtypes numpy holds; the others are read as their bit patterns (``bits_of``)
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.float32,
    torch.float64,
)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Frames equal bit for bit (a NaN pixel equals itself, -0.0 differs from 0.0): what dedup and the stream checks
    compare, so every stack comes back exactly as it was pushed."""
    if a.dtype.kind == 'f':
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        a, b = a.view(f'u{a.itemsize}'), b.view(f'u{b.itemsize}')
    return np.array_equal(a, b)


def stack_of(
    item: Mapping,
    key: str,
    i: int,
    stack: Optional[int],
    like: Optional[Tuple[Tuple[int, ...], Any]],
    with_dtype: bool = False,
):
    """Field ``key`` of item ``i``, a frame stack ``[stack, *frame]``, as a numpy array, checked against ``stack``
    and ``like`` (frame shape, dtype as ``frame_dtype`` names it). Frames of a dtype numpy lacks (bfloat16,
    float8) come as their bit patterns (``bits_of``); ``with_dtype``: ``(array, the frames' dtype)``."""
    if key not in item:
        raise ValueError(f"item {i} has no field {key!r} (storage.frames)")
    v = item[key]
    dtype = None
    if isinstance(v, torch.Tensor):
        if v.dtype not in _NUMPY_TORCH:
            bits = bits_of(v.dtype)
            if bits is None:
                raise ValueError(f"item {i}: field {key!r} must hold real numbers (frames), got dtype {v.dtype}")
            dtype, v = v.dtype, v.detach().view(bits)
        if v.is_neg() or v.is_conj():  # a lazy negation / conjugate: numpy cannot view it
            v = v.resolve_conj().resolve_neg()
        v = v.detach().cpu().numpy()
    elif not isinstance(v, np.ndarray):
        raise ValueError(f"item {i}: field {key!r} must be an array or tensor [stack, *frame], got {type(v).__name__}")
    if v.ndim < 1 or v.shape[0] < 1:
        raise ValueError(f"item {i}: field {key!r} must be [stack, *frame], got shape {v.shape}")
    if v.dtype.kind not in 'biuf':
        raise ValueError(f"item {i}: field {key!r} must hold real numbers (frames), got dtype {v.dtype}")
    if not v.dtype.isnative:  # big-endian data (h5py, np.load of such a file): the same values, as tensor storage
        v = v.astype(v.dtype.newbyteorder('='))
    if stack is not None and v.shape[0] != stack:
        raise ValueError(f"item {i}: field {key!r} has a stack of {v.shape[0]} frames, expected {stack}")
    dtype = v.dtype if dtype is None else dtype
    if like is not None and (tuple(v.shape[1:]) != tuple(like[0]) or not _same_dtype(dtype, like[1])):
        raise ValueError(
            f"item {i}: field {key!r} has frames of shape {tuple(v.shape[1:])} and dtype {dtype_name(dtype)}, "
            f"expected {like[0]} and {dtype_name(like[1])}"
        )
    return (v, dtype) if with_dtype else v


def _same_dtype(a: Any, b: Any) -> bool:
    """Frame dtypes as ``frame_dtype`` names them: a numpy dtype never equals a torch one (int16 is not the bit
    pattern of bfloat16)."""
    return isinstance(a, torch.dtype) == isinstance(b, torch.dtype) and a == b


class StreamEncoder:
    """Turns pushed items into id columns and pending frames (no side effects: ``prepare`` may be refused
    later), given the committed streams and ring."""

    def __init__(self, spec: Mapping) -> None:
        self.spec = spec
        self.key, self.next_key = spec['key'], spec['next_key']
        self.ids_key, self.next_id_key = spec['key'] + IDS_SUFFIX, spec['next_key'] + NEXT_SUFFIX

    def encode(
        self,
        items: List[Mapping],
        ring: FrameRing,
        streams: Dict[Any, Tuple[Tuple[int, ...], bool]],
        stack: Optional[int],
        first: Optional[int] = None,
        planned: Optional[Callable[[int], int]] = None,
    ) -> Tuple[List[Dict[str, Any]], Pending, int]:
        """``(items with the id columns in place of the stacks, pending frames, stack)``; the new frames get ids
        from ``first`` on (default: the ring's next id; later for a push prepared after another not written yet).
        ``planned(stack)``: the rows the first write gives a ring not allocated yet; None: a continuing stream
        always reuses its frames (an episode's frames all fit in the ring at once, or it is refused)."""
        spec = self.spec
        check = spec['check']
        first = ring.next_id if first is None else first
        frames: List[np.ndarray] = []
        local: Dict[Any, Tuple[Tuple[int, ...], bool]] = {}
        like = (ring.shape, frame_dtype(ring.dtype)) if ring.shape is not None else None
        out: List[Dict[str, Any]] = []
        envs: List[Any] = []
        continues: List[bool] = []

        def frames_of(ids: Tuple[int, ...]) -> Optional[np.ndarray]:
            """The frames of ids pushed earlier (this push's pending ones included); None if one is gone."""
            if max(ids) < first:  # all written before this push: one lookup
                arr = np.array(ids, dtype=np.int64)
                return ring.read(arr) if ring.holds(arr).all() else None
            got = []
            for fid in ids:
                if fid >= first:
                    got.append(frames[fid - first])
                elif ring.holds(np.array([fid]))[0]:
                    got.append(ring.read(np.array([fid]))[0])
                else:
                    return None
            return np.stack(got)

        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"item {i}: storage.frames stores dict items, got {type(item).__name__}")
            for name in (self.ids_key, self.next_id_key):
                if name in item:
                    raise ValueError(f"item {i}: field {name!r} is reserved by storage.frames")
            obs, dtype = stack_of(item, self.key, i, stack, like, with_dtype=True)
            stack = obs.shape[0]
            if like is None:
                like = (tuple(obs.shape[1:]), dtype)
            nxt = stack_of(item, self.next_key, i, stack, like)
            env = env_of(item, spec['env_key'], i)
            ended = ended_of(item, spec, i)
            prev = local.get(env, streams.get(env))
            envs.append(env)
            continues.append(prev is not None and not prev[1])
            obs_ids: Optional[Tuple[int, ...]] = None
            if prev is not None and not prev[1]:  # the stream continues: obs is its previous next_obs
                # (its frames are kept only if this item's own new frame, written at id first + len(frames), does
                # not overwrite the oldest of them: the item would lose its stack as it is written)
                rows = None if planned is None else ring.rows if ring.allocated() else planned(stack)
                kept = rows is None or min(prev[0]) > first + len(frames) - rows
                if not check:  # frames of this push are pending: only earlier ones can have left the ring
                    earlier = [fid for fid in prev[0] if fid < first]
                    if kept and (not earlier or ring.holds(np.array(earlier)).all()):
                        obs_ids = prev[0]
                else:
                    before = frames_of(prev[0])
                    if before is not None:
                        if not same_bits(before, obs):
                            raise ValueError(
                                f"item {i}: field {self.key!r} does not continue environment {env!r}: it differs "
                                f"from the {self.next_key!r} of that environment's previous step, which did not end "
                                f"its episode ({spec['done_key']!r} / {spec['truncated_key']!r} false); push each "
                                f"environment's steps in order"
                                + ("" if spec['env_key'] else " and name the environment (storage.frames.env_key)")
                            )
                        obs_ids = prev[0] if kept else None
            if obs_ids is None:  # an episode starts (or its previous frames left the ring): store its first stack
                ids: List[int] = []
                for k in range(stack):
                    if k and same_bits(obs[k], obs[k - 1]):
                        ids.append(ids[-1])  # repeated (reset padding): one frame
                    else:
                        frames.append(np.array(obs[k], copy=True))
                        ids.append(first + len(frames) - 1)
                obs_ids = tuple(ids)
            if check and stack > 1 and not same_bits(nxt[:-1], obs[1:]):
                raise ValueError(
                    f"item {i}: field {self.next_key!r} is not {self.key!r} shifted by one frame (frames "
                    f"0..{stack - 2} of {self.next_key!r} must equal frames 1..{stack - 1} of {self.key!r}, as a "
                    f"frame stack's are)"
                )
            frames.append(np.array(nxt[-1], copy=True))
            new = first + len(frames) - 1
            local[env] = (obs_ids[1:] + (new,), ended)
            row = {k: v for k, v in item.items() if k != self.key and k != self.next_key}
            row[self.ids_key] = np.array(obs_ids, dtype=np.int64)
            row[self.next_id_key] = np.int64(new)
            out.append(row)
        dtype = None if like is None else torch_dtype(like[1])
        return out, Pending(frames, first, local, envs, continues, dtype), stack

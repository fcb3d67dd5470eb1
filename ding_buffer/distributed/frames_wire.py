"""Frames on the wire: a worker whose manager keeps frames once (``storage.frames``) sends each step's new frame
instead of two full stacks.

A step of an image task carries ``obs`` and ``next_obs`` as stacks ``[stack, *frame]``; within an episode ``obs``
is the previous step's ``next_obs`` and ``next_obs`` is ``obs`` shifted by one frame plus one new frame. So a worker
needs to send only that new frame (``2 * stack`` times fewer frame bytes: 8x for Atari's stacks of 4):

* ``FramesWireEncoder`` (worker side, one per ``RemoteBuffer``) remembers the last ``next_obs`` it sent for each
  environment (``storage.frames.env_key``). A step whose ``obs`` equals it travels without ``obs`` (``cont``); when
  every step's ``next_obs`` is its ``obs`` shifted by one frame, each ``next_obs`` travels as its last frame only
  (``shift``). Anything it cannot read as steps is sent as pushed (and its memory is cleared).
* ``FramesWireDecoder`` (manager side) rebuilds the full stacks from what it holds for that worker, before the
  push reaches the buffer, which checks and stores the steps as if the worker had pushed them locally.

Both sides derive what they hold from the same pushes in the same order: every push names the sequence number
of the push its memory comes from (``base``; ``None``: none). The manager rebuilds a push only on top of exactly
that push of the same worker, and refuses it otherwise with ``FramesOutOfStepError`` (it restarted, forgot the
worker to stay within ``distributed.frames_wire_mb``, or missed the push after a refusal); the worker's pipeline
then sends the same push again with full stacks (same sequence number: nothing of the refused one was stored).
A push refused for any other reason clears the worker's memory, so the next push starts a new chain.
"""

from collections import OrderedDict
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..errors import FramesOutOfStepError
from ..storage.frames import ended_of, env_of, frame_dtype, frame_spec, same_bits, stack_of

META_KEYS = ('v', 'base', 'cont', 'shift')

# a step as the encoder reads it: (obs, next_obs as numpy, environment id, whether it ends its episode)
Step = Tuple[np.ndarray, np.ndarray, Any, bool]


def _numpy(v: Any) -> Any:
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


def _length(v: Any) -> Optional[int]:
    try:
        return len(v)
    except TypeError:  # (no length, or a 0-d array)
        return None


def _rows_of(data: Any, batched: bool, spec: Mapping) -> Optional[List[Step]]:
    """The steps of a push, or None where it is not a push of steps (the buffer then judges it as it is)."""
    key, nkey = spec['key'], spec['next_key']
    try:
        if batched:
            if type(data) is not dict or key not in data or nkey not in data:
                return None
            obs, nxt = _numpy(data[key]), _numpy(data[nkey])
            if not isinstance(obs, np.ndarray) or not isinstance(nxt, np.ndarray) or obs.ndim < 2:
                return None
            n = len(obs)
            if len(nxt) != n or n == 0:
                return None
            items = [{k: v[i] for k, v in data.items() if k in _flags(spec)} for i in range(n)]
            steps = [(obs[i], nxt[i]) for i in range(n)]
        else:
            items = data if isinstance(data, list) else [data]
            if not items or not all(type(it) is dict and key in it and nkey in it for it in items):
                return None
            steps = [(_numpy(it[key]), _numpy(it[nkey])) for it in items]
            if not all(isinstance(o, np.ndarray) and isinstance(x, np.ndarray) and o.ndim >= 1 for o, x in steps):
                return None
        return [
            (o, x, env_of(it, spec['env_key'], i), ended_of(it, spec, i))
            for i, (it, (o, x)) in enumerate(zip(items, steps))
        ]
    except (ValueError, TypeError, IndexError):  # a field the buffer refuses: it says so itself
        return None


def _flags(spec: Mapping) -> Tuple[str, ...]:
    return tuple(spec[k] for k in ('env_key', 'done_key', 'truncated_key') if spec[k] is not None)


def _same(a: Optional[np.ndarray], b: np.ndarray) -> bool:
    """Bit for bit, as the buffer's stream checks compare (-0.0 is not 0.0): a step it would refuse is sent whole."""
    return a is not None and a.shape == b.shape and a.dtype == b.dtype and same_bits(a, b)


class FramesWireEncoder:
    """
    Overview:
        Worker side: ``encode(data, batched, seq)`` answers ``(what to send, meta)`` (meta None: send as pushed);
        ``reset()`` forgets every environment (the next push starts a new chain). ``stats``: steps sent, stacks
        left out (``obs_omitted``), ``next_obs`` sent as one frame (``next_as_frame``), pushes sent again in full
        after the manager did not hold their chain (``resent_full``).
    """

    def __init__(self, spec: Mapping) -> None:
        self.spec = dict(spec)
        self._last: Dict[Any, np.ndarray] = {}
        self._base: Optional[int] = None
        self.stats = dict(steps=0, obs_omitted=0, next_as_frame=0, resent_full=0)

    def reset(self) -> None:
        self._last = {}
        self._base = None

    def encode(self, data: Any, batched: bool, seq: int) -> Tuple[Any, Optional[Dict[str, Any]]]:
        rows = _rows_of(data, batched, self.spec)
        if rows is None:
            self.reset()
            return data, None
        last = dict(self._last)
        cont: List[bool] = []
        shift = True
        for obs, nxt, env, ended in rows:
            cont.append(_same(last.get(env), obs))
            if shift and not (obs.shape == nxt.shape and obs.dtype == nxt.dtype and same_bits(nxt[:-1], obs[1:])):
                shift = False
            if ended:
                last.pop(env, None)
            else:
                last[env] = nxt
        for env, nxt in last.items():  # keep copies: the caller may reuse its arrays after the push
            if self._last.get(env) is not nxt:
                last[env] = np.array(nxt, copy=True)
        meta = dict(v=1, base=self._base, cont=cont, shift=shift)
        self._last, self._base = last, int(seq)
        self.stats['steps'] += len(rows)
        self.stats['obs_omitted'] += sum(cont)
        self.stats['next_as_frame'] += len(rows) if shift else 0
        return self._compact(data, batched, cont, shift), meta

    def _compact(self, data: Any, batched: bool, cont: List[bool], shift: bool) -> Any:
        key, nkey = self.spec['key'], self.spec['next_key']
        if batched:
            out = dict(data)
            keep = np.logical_not(np.array(cont, dtype=bool))
            obs = data[key]
            out[key] = obs[torch.from_numpy(keep)] if isinstance(obs, torch.Tensor) else obs[keep]
            if shift:
                out[nkey] = data[nkey][:, -1:]
            return out
        items = data if isinstance(data, list) else [data]
        out_items = []
        for it, c in zip(items, cont):
            row = {k: v for k, v in it.items() if not (c and k == key)}
            if shift:
                row[nkey] = it[nkey][-1:]
            out_items.append(row)
        return out_items if isinstance(data, list) else out_items[0]


# bytes counted for each environment and each worker held besides their frames (keys, dicts, arrays' headers)
ENV_OVERHEAD, CLIENT_OVERHEAD = 256, 512
MAX_CLIENTS = 1 << 16


class FramesWireDecoder:
    """
    Overview:
        Manager side: ``expand(client, seq, data, batched, meta)`` rebuilds a compact push's stacks and answers
        ``(full data, commit)``: ``commit()`` -- called once the buffer took the push -- makes it the worker's
        chain. It raises ``FramesOutOfStepError`` where it does not hold the push's chain, ``ValueError`` for a
        malformed push (stacks and frames that are not the buffer's); nothing changes then. ``forget(client)``
        drops a worker's chain (a push of it without ``meta``). A chain is the sender's and the client's
        (``sender``: the transport's peer, as push dedup keys its records): a peer naming another's client id
        cannot replace its chain. What it holds per worker is the last ``next_obs`` of each of its environments,
        at most ``budget`` bytes over all workers, overheads counted (the least recently seen workers are forgotten
        first), and at most ``MAX_CLIENTS`` workers. A step is rebuilt from at
        least one frame it carries into at most ``2 * stack`` frames of the buffer's stack; until the buffer holds
        frames (and so a stack) nothing is rebuilt: such pushes come again as they were pushed.
    """

    def __init__(self, spec: Mapping, budget: int, storage_of: Optional[Callable[[], Any]] = None) -> None:
        self.spec = dict(spec)
        self.budget = int(budget)
        self.storage_of = storage_of  # the buffer's FrameStorage now: the stack and frames a push must have
        self._held: 'OrderedDict[Tuple[Any, str], Tuple[int, Dict[Any, np.ndarray], int]]' = OrderedDict()
        self._bytes = 0
        self.counters = dict(frames_wire_steps=0, frames_wire_out_of_step=0)

    @property
    def held_bytes(self) -> int:
        """What the held stacks count against ``budget`` (frames and overheads)."""
        return self._bytes

    @property
    def held_workers(self) -> int:
        return len(self._held)

    def forget(self, client: Any, sender: Any = None) -> None:
        held = self._held.pop((sender, client), None)
        if held is not None:
            self._bytes -= held[2]

    def expand(self, client: Any, seq: Any, data: Any, batched: bool, meta: Any, sender: Any = None) -> Tuple[Any, Any]:
        cont, shift, base = self._check_meta(client, seq, meta)
        held = self._held.get((sender, client))  # (seq, stacks, bytes)
        storage = self.storage_of() if self.storage_of is not None else None
        like = storage.frames_like() if storage is not None else None
        if like is None and (shift or any(cont)):
            # the buffer holds no frames yet, so no stack to rebuild to: the worker sends this push as it is
            self.counters['frames_wire_out_of_step'] += 1
            raise FramesOutOfStepError(
                "this push sends steps as new frames, but the manager's buffer holds no frames yet (nothing fixes "
                "their stack); the worker sends it again as it was pushed"
            )
        if base is None:
            stacks: Dict[Any, np.ndarray] = {}
        elif held is None or held[0] != base or like is None:
            self.counters['frames_wire_out_of_step'] += 1
            holds = 'none of that worker' if held is None else f'push {held[0]}'
            raise FramesOutOfStepError(
                f"this push continues the frame stacks of push {base} of worker {client[:12]!r}, which the manager "
                f"does not hold (it holds {holds if like is not None else 'no frames yet'}); the worker sends it "
                f"again with full stacks"
            )
        else:
            stacks = held[1]
        # the buffer's stack and frames (None: it holds none, and then nothing is rebuilt): a step sent with its
        # obs must have them, so no step grows past 2 * stack frames here
        known = None if like is None else (like[0], (like[1], frame_dtype(like[2])))  # bfloat16: no numpy dtype
        expand = self._expand_batch if batched else self._expand_items
        out, last = expand(data, cont, shift, stacks, known)
        self.counters['frames_wire_steps'] += len(cont)

        def commit() -> None:
            self._keep((sender, client), int(seq), stacks, last)

        return out, commit

    def _check_meta(self, client: Any, seq: Any, meta: Any) -> Tuple[List[bool], bool, Optional[int]]:
        ok = (
            isinstance(meta, dict)
            and sorted(meta) == sorted(META_KEYS)
            and meta['v'] == 1
            and (meta['base'] is None or (type(meta['base']) is int and 0 <= meta['base'] < (1 << 63)))
            and isinstance(meta['cont'], list)
            and all(type(c) is bool for c in meta['cont'])
            and type(meta['shift']) is bool
        )
        if not ok:
            raise ValueError(
                f"push argument 'frames' must be a dict {{'v': 1, 'base': None or an int >= 0, 'cont': [bool, ...], "
                f"'shift': bool}}, got {str(meta)[:120]!r}"
            )
        if not meta['cont']:
            raise ValueError("push argument 'frames' needs at least one step ('frames.cont' is empty)")
        if not isinstance(client, str) or type(seq) is not int:
            raise ValueError("a push with argument 'frames' needs the worker's 'client' and 'seq'")
        if meta['base'] is not None and meta['base'] >= seq:
            raise ValueError(f"push argument 'frames.base' ({meta['base']}) must be below the push's seq ({seq})")
        return meta['cont'], meta['shift'], meta['base']

    def _step(
        self, i: int, item: Mapping, cont: bool, shift: bool, env: Any, prev: Optional[np.ndarray], known: Any
    ) -> Tuple[np.ndarray, np.ndarray]:
        key, nkey = self.spec['key'], self.spec['next_key']
        if cont:
            if key in item:
                raise ValueError(f"item {i}: field {key!r} is sent although push argument 'frames.cont' leaves it out")
            if prev is None:
                raise ValueError(
                    f"item {i}: continues environment {env!r}, which has no step before it in this chain (it was "
                    f"never sent, or its episode ended)"
                )
            obs = prev
        else:
            obs = stack_of(item, key, i, *(known or (None, None)))
        like = (tuple(obs.shape[1:]), obs.dtype)
        if not shift:
            return obs, stack_of(item, nkey, i, obs.shape[0], like)
        new = stack_of(item, nkey, i, 1, like)
        return obs, np.concatenate([obs[1:], new])

    def _expand_items(
        self, data: Any, cont: List[bool], shift: bool, stacks: Dict[Any, np.ndarray], known: Any
    ) -> Tuple[Any, Dict[Any, Optional[np.ndarray]]]:
        items = data if isinstance(data, list) else [data]
        if len(items) != len(cont):
            raise ValueError(f"push argument 'frames.cont' has {len(cont)} flags for {len(items)} items")
        spec, key, nkey = self.spec, self.spec['key'], self.spec['next_key']
        last: Dict[Any, Optional[np.ndarray]] = {}
        out = []
        for i, (item, c) in enumerate(zip(items, cont)):
            if not isinstance(item, dict):
                raise ValueError(f"item {i}: storage.frames stores dict items, got {type(item).__name__}")
            env = env_of(item, spec['env_key'], i)
            obs, nxt = self._step(i, item, c, shift, env, last[env] if env in last else stacks.get(env), known)
            row = dict(item)
            row[key], row[nkey] = obs, nxt
            out.append(row)
            last[env] = None if ended_of(item, spec, i) else nxt
        return (out if isinstance(data, list) else out[0]), last

    def _expand_batch(
        self, data: Any, cont: List[bool], shift: bool, stacks: Dict[Any, np.ndarray], known: Any
    ) -> Tuple[Any, Dict[Any, Optional[np.ndarray]]]:
        spec, key, nkey = self.spec, self.spec['key'], self.spec['next_key']
        if not isinstance(data, dict) or nkey not in data:
            raise ValueError(f"a batched push with argument 'frames' must be a dict with the field {nkey!r}")
        n = len(cont)
        try:  # (the worker's encoder sends frames numpy cannot read as they are, without 'frames')
            sent = _numpy(data[key]) if key in data else np.zeros((0,), dtype=np.uint8)
            nxt_in = _numpy(data[nkey])
        except TypeError as e:
            raise ValueError(f"a batched push with argument 'frames' has frames numpy cannot read: {e}") from None
        flags = _flags(spec)
        for k in flags:
            if k in data and _length(data[k]) != n:
                raise ValueError(f"a batched push with argument 'frames' needs {n} rows of {k!r}")
        if not isinstance(sent, np.ndarray) or not isinstance(nxt_in, np.ndarray) or len(nxt_in) != n:
            raise ValueError(
                f"a batched push with argument 'frames' needs {n} rows of {nkey!r} (one a 'frames.cont' flag)"
            )
        if len(sent) != n - sum(cont):
            raise ValueError(
                f"a batched push with argument 'frames' needs {n - sum(cont)} rows of {key!r} (its steps that do "
                f"not continue), got {len(sent)}"
            )
        last: Dict[Any, Optional[np.ndarray]] = {}
        obs_rows, nxt_rows = [], []
        j = 0
        for i, c in enumerate(cont):
            item = {k: data[k][i] for k in flags if k in data}
            if not c:
                item[key] = sent[j]
                j += 1
            item[nkey] = nxt_in[i]
            env = env_of(item, spec['env_key'], i)
            obs, nxt = self._step(i, item, c, shift, env, last[env] if env in last else stacks.get(env), known)
            if obs_rows and (obs.shape != obs_rows[0].shape or obs.dtype != obs_rows[0].dtype):
                raise ValueError(f"row {i}: field {key!r} has shape {obs.shape}, row 0 {obs_rows[0].shape}")
            obs_rows.append(obs)
            nxt_rows.append(nxt)
            last[env] = None if ended_of(item, spec, i) else nxt
        out = dict(data)
        out[key], out[nkey] = np.stack(obs_rows), np.stack(nxt_rows)
        return out, last

    def _keep(
        self, key: Tuple[Any, str], seq: int, before: Dict[Any, np.ndarray], last: Dict[Any, Optional[np.ndarray]]
    ) -> None:
        """The worker's chain (``key``: sender, client) now ends at push ``seq``: what it held before (``before``)
        updated by ``last``."""
        self.forget(key[1], key[0])
        stacks = dict(before)
        for env, nxt in last.items():
            if nxt is None:
                stacks.pop(env, None)
            else:
                stacks[env] = np.array(nxt, copy=True)  # not a view of the message's receive buffer
        size = CLIENT_OVERHEAD + sum(
            s.nbytes + ENV_OVERHEAD + (len(env) if isinstance(env, str) else 0) for env, s in stacks.items()
        )
        self._held[key] = (seq, stacks, size)
        self._bytes += size
        while (self._bytes > self.budget or len(self._held) > MAX_CLIENTS) and self._held:
            _, (_, _, freed) = self._held.popitem(last=False)  # the least recently seen workers first
            self._bytes -= freed


def frames_spec_of(cfg: Any) -> Optional[Dict[str, Any]]:
    """The ``storage.frames`` spec of a buffer config (None without one, or on list storage)."""
    storage = cfg.get('storage') if isinstance(cfg, Mapping) else None
    if not isinstance(storage, Mapping) or storage.get('frames') is None or storage.get('type', 'list') != 'tensor':
        return None
    return frame_spec(storage['frames'])


def frames_encoder(cfg: Any, dcfg: Any) -> Optional[FramesWireEncoder]:
    """A worker's encoder where its buffer config keeps frames once and ``distributed.frames_wire`` is on."""
    spec = frames_spec_of(cfg) if dcfg.get('frames_wire', True) else None
    return None if spec is None else FramesWireEncoder(spec)


def frames_storage(buffer: Any) -> Any:
    """The buffer's storage where it keeps frames once (a deque's is its inner buffer's), else None; looked up
    each time, since a restore replaces it."""
    for owner in (buffer, getattr(buffer, 'inner', None)):
        storage = getattr(owner, 'storage', None)
        if getattr(storage, 'frames_spec', None) is not None:
            return storage
    return None


def frames_decoder(buffer: Any, dcfg: Any) -> Optional[FramesWireDecoder]:
    """The manager's decoder where its buffer's storage keeps frames once."""
    storage = frames_storage(buffer)
    if storage is None:
        return None
    budget = int(dcfg.get('frames_wire_mb', 256.0) * (1 << 20))
    return FramesWireDecoder(storage.frames_spec, budget, lambda: frames_storage(buffer))


__all__ = [
    'FramesWireEncoder',
    'FramesWireDecoder',
    'frames_encoder',
    'frames_decoder',
    'frames_spec_of',
    'frames_storage',
]

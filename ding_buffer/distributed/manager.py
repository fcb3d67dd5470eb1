"""The manager: one process (or Ray actor) owns the real buffer and answers workers' requests.

``ManagerCore`` is transport-free: ``handle(sender, request) -> reply`` for one decoded request (the messages are
``protocol``'s; the worker re-raises an error reply as the same exception type). ``ReplayBufferManager`` runs it
over the torch / MPI transports; ``ray_backend`` runs it inside an actor.

Ops: push, sample, update, count, stats, metadata, state_dict, load_state_dict, save_data, load_data, clear,
model_version, baseline_sync, ping (heartbeat, no reply), exit (reply marked final).

Trust: a request can never relax the manager's safety. ``load_data`` unpickles only when the manager's own
``distributed.allow_pickle`` is set, and ``save_data`` / ``load_data`` paths are confined to the manager's
``distributed.file_root`` (refused when it is None). Pushes carry ``client`` and ``seq``: a push whose sequence
number was already applied for that client is answered from the record of the first one and stored again
never, so a retry after a timeout is safe.

Neighbours: ``liveness`` (who is alive, lost, back, exited), ``push_dedup`` (each push applied once),
``file_root`` (workers' paths confined to ``distributed.file_root``).
"""

import logging
import numbers
from typing import Any, Callable, Dict, Optional

from ..buffers.common import check_size, check_step
from ..errors import CodecError, SampleTimeoutError
from .baseline import BaselineTracker
from .batching import count_items, log_rewards_of
from .blobs import BlobStore, check_stamp
from .codec import DATA_DEPTH, STATE_DEPTH, check_depth
from .config import resolve_callable
from .file_root import check_checkpoint_path, confine, resolve_file_root
from .frames_wire import frames_decoder
from .liveness import Liveness
from .protocol import error_reply, ok_reply
from .push_dedup import PushDedup, StoredThenFailed
from .shm_ring import RingIntake

logger = logging.getLogger('ding_buffer.distributed')

# the keyword arguments of the buffers' sample() a worker may pass; anything else is refused by name
SAMPLE_KWARGS = ('cur_learner_iter', 'sample_range', 'replace', 'unroll_len', 'pad')
MAX_WINDOW_ROWS = 1 << 16  # rows a windowed sample may always reply, however few steps the buffer holds
# the ops a request may name besides 'ping', each served by the method '_<op>'
OPS = (
    'push sample update count stats metadata state_dict load_state_dict save_data load_data clear model_version '
    'baseline_sync exit put_blob get_blob shm_open why_not_sample end_load'
).split()


class ManagerCore:
    """
    Overview:
        Serves one buffer to many senders. Single-threaded: the caller serialises ``handle`` calls.
    Interfaces:
        ``handle``, ``summary``, ``shutdown``; attributes ``buffer``, ``per_sender`` and ``liveness`` (a
        ``Liveness``: ``seen``, ``lose``, ``check_silent``, ``merge_heard``, ``exited``, ``lost``, ...).
    """

    def __init__(self, buffer: Any, dcfg: Any, log_reward_key: str) -> None:
        # resolved once: a later chdir of the manager must not move the directory workers may use
        self._file_root = resolve_file_root(dcfg.file_root)
        check_checkpoint_path(dcfg.checkpoint_path)
        self.buffer = buffer
        self.cfg = dcfg
        self.log_reward_key = log_reward_key
        self.scoring_function: Optional[Callable] = resolve_callable(dcfg.scoring_function, 'scoring_function')
        self.metadata_function: Optional[Callable] = resolve_callable(dcfg.metadata_function, 'metadata_function')
        self.baseline = BaselineTracker(dcfg.baseline_strategy, dcfg.baseline_percentile, dcfg.baseline_ema_alpha)
        self.model_version = -1
        self.session_id: Any = None  # (None: no session yet; 0 and '' are sessions)
        self.liveness = Liveness(dcfg)
        self.per_sender: Dict[Any, Dict[str, int]] = {}
        self.counters = dict(
            push_requests=0, pushed_items=0, rejected_stale=0, sample_requests=0, errors=0, duplicate_pushes=0
        )
        self.push_dedup = PushDedup(self.counters)
        # storage.frames: workers send each step's new frame; their stacks are rebuilt here (frames_wire)
        self.frames_wire = frames_decoder(buffer, dcfg)
        if self.frames_wire is not None:
            self.counters.update(frames_wire_steps=0, frames_wire_out_of_step=0)
            self.frames_wire.counters = self.counters
        self._ops = {op: getattr(self, f'_{op}') for op in OPS}
        self.blobs = BlobStore(dcfg.max_blob_mb * (1 << 20))
        # distributed.shared_memory: workers on this host push through rings, committed by the runner's thread
        # (a buffer with capacity rules or removers judges push by push: a batch of pushes could keep other items)
        per_push = bool((getattr(buffer, 'cfg', None) or {}).get('removers'))
        capacity = 1 if per_push else getattr(buffer, 'replay_buffer_size', None)
        self.rings = RingIntake(dcfg, self.counters, capacity) if dcfg.shared_memory else None
        # load_data(undo=True): per sender, the buffer's state before that load and the load's generation, until its
        # end_load; a later load (or clear) of another sender moves the generation on, and that state is not put back
        self._undo: Dict[Any, tuple] = {}
        self._loads = 0

    # ------------------------------------------------------------------ dispatch
    def handle(self, sender: Any, request: Any) -> Optional[Dict[str, Any]]:
        """Serve one request; returns the reply (None for heartbeats). Never raises for bad requests."""
        rid = request.get('id') if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict) or not isinstance(request.get('op'), str):
                raise ValueError(f"a request must be a dict with an 'op' str, got {str(request)[:100]!r}")
            op = request['op']
            self.liveness.seen(sender)
            if self._undo:  # a sender lost before its end_load: its kept state goes
                for gone in [k for k in self._undo if k in self.liveness.lost]:
                    del self._undo[gone]
            stats = self.per_sender.setdefault(sender, dict(requests=0))
            stats['requests'] += 1
            if self.rings is not None:  # what the sender wrote into its rings comes before what it asks now
                self.rings.commit(self._ring_push, sender)
            if op == 'ping':
                return None
            if request.get('shard', 0) != self.cfg.shard:
                raise ValueError(
                    f"request for shard {request.get('shard')!r} reached the manager of shard {self.cfg.shard}"
                )
            fn = self._ops.get(op)
            if fn is None:
                raise ValueError(f"unknown op {op!r}; expected one of {sorted(self._ops) + ['ping']}")
            args = request.get('args') or {}
            if not isinstance(args, dict):
                raise TypeError(f"'args' of op {op!r} must be a dict, got {type(args).__name__}")
            result = fn(sender, **args)
            reply = ok_reply(rid, result)
            if op == 'exit':
                reply['final'] = True
            return reply
        except Exception as e:  # a bad request is answered, never fatal to the manager
            self.counters['errors'] += 1
            logger.debug("request %r from %r failed: %s", rid, sender, e)
            return error_reply(rid, e)

    # ------------------------------------------------------------------ ops
    def _push(
        self,
        sender,
        data,
        batched=False,
        envstep=-1,
        model_version=None,
        session_id=None,
        client=None,
        seq=None,
        frames=None,
    ) -> Dict[str, Any]:
        check_depth(data, "push 'data'")

        def apply() -> Dict[str, Any]:
            full, commit = self._full_stacks(sender, client, seq, data, batched, frames)
            reply = self._apply_push(sender, full, batched, envstep, model_version, session_id)
            commit()  # the worker's chain moves on only with a push the buffer took
            return reply

        return self.push_dedup.once(sender, client, seq, apply)

    def _full_stacks(self, sender, client, seq, data, batched, frames) -> Any:
        """A push whose steps travelled as new frames (``frames``: see ``frames_wire``) with its stacks rebuilt;
        a push without ``frames`` ends its worker's chain."""
        if frames is None:
            if self.frames_wire is not None and client is not None:
                self.frames_wire.forget(client, sender)
            return data, lambda: None
        if self.frames_wire is None:
            raise ValueError(
                "push argument 'frames' (steps sent as new frames) reached a manager whose buffer does not keep "
                "frames once; give the manager and its workers the same storage.frames config"
            )
        return self.frames_wire.expand(client, seq, data, bool(batched), frames, sender)

    def _apply_push(self, sender, data, batched, envstep, model_version, session_id, tentative=False) -> Dict:
        """``tentative``: a shared-memory commit's first try of several pushes as one: if the buffer stores none of
        it (or raises), nothing is counted here, as the ring's intake then applies the pushes one by one."""
        if not tentative:
            self.counters['push_requests'] += 1
        n = count_items(data, batched)
        score: Dict[str, Any] = {}
        model_version, session_id = check_stamp(model_version, session_id)
        if self._stale(model_version, session_id):
            self.counters['rejected_stale'] += n
            return {'stored': 0, 'rejected_stale': n, 'score': score}
        incoming = log_rewards_of(data, self.log_reward_key) if self.baseline.strategy is not None else None
        stored = 0
        if self.cfg.store_locally:
            stored = self.buffer.push(data, envstep, batched=batched)
        if tentative:
            if not stored:
                return {'stored': 0, 'score': score}
            self.counters['push_requests'] += 1
        self.counters['pushed_items'] += n
        self.baseline.observe(incoming)
        if self.scoring_function is not None:  # scored after storing, as torchgfn does (novelty sees the batch)
            try:
                out = self.scoring_function(data, sender=sender, buffer=self.buffer)
            except Exception as e:
                raise StoredThenFailed(
                    type(e)(
                        f"distributed.scoring_function raised {type(e).__name__}: {e} (the "
                        f"{stored} pushed items were stored)"
                    )
                ) from e
            if not isinstance(out, dict):
                raise StoredThenFailed(
                    TypeError(
                        f"distributed.scoring_function must return a dict, got "
                        f"{type(out).__name__} (the {stored} pushed items were stored)"
                    )
                )
            score.update(out)
        base = self.baseline.value(*self._stored_log_rewards())
        if base is not None:
            score['baseline_log_reward'] = base
        return {'stored': int(stored), 'score': score}

    def _ring_push(self, sender, data, batched, envstep, tentative=False) -> int:
        return int(self._apply_push(sender, data, batched, envstep, None, None, tentative)['stored'])

    def commit_rings(self) -> int:
        """Apply what every worker's shared-memory ring holds, and close the rings of workers counted lost (the
        runner's ring thread, under its lock)."""
        if self.rings is None:
            return 0
        if self.liveness.lost:
            self.rings.close_lost(self.liveness.lost, self._ring_push)
        return self.rings.commit(self._ring_push)

    def _shm_open(self, sender, client, host, fields) -> Optional[Dict[str, Any]]:
        if self.rings is None:
            raise ValueError("this manager takes no shared-memory pushes (its distributed.shared_memory is False)")
        return self.rings.open(sender, client, host, fields, self._ring_push, self.liveness.exited)

    def _stale(self, version, session) -> bool:
        if self.cfg.max_version_lag is None or version is None:
            return False
        if session is not None and self.session_id is not None and session != self.session_id:
            return True
        return self.model_version - version > self.cfg.max_version_lag

    def _stored_log_rewards(self):
        if not self.buffer.has_log_rewards:  # declared by the buffer type (IBuffer.capabilities)
            return None, False
        return self.buffer.log_rewards(), self.buffer.count() >= self.buffer.replay_buffer_size

    def _sample(self, sender, size, kwargs=None, poll=False) -> Any:
        """``poll=True`` (a worker's ``sample(timeout=)`` asking again): the buffer's ``sample(timeout=0)``, None
        when it times out -- a wait that ends in a batch or a timeout counts no refused sample, as a local one's."""
        self.counters['sample_requests'] += 1
        check_size(size)  # (the buffer's own rule: a numpy int too)
        size = int(size)
        if type(poll) is not bool:
            raise TypeError(f"sample 'poll' must be a bool, got {type(poll).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"sample 'kwargs' must be a dict, got {type(kwargs).__name__}")
        kwargs = dict(kwargs or {})
        if 'timeout' in kwargs:
            raise ValueError("sample's 'timeout' is handled by the worker; the manager never blocks")
        bad = sorted(str(k) for k in kwargs if k not in SAMPLE_KWARGS)
        if bad:
            raise ValueError(f"sample got unexpected keyword arguments {bad}; a worker may pass {list(SAMPLE_KWARGS)}")
        takes = self.buffer.sample_kwargs  # declared by the buffer type (IBuffer.capabilities)
        bad = sorted(k for k in kwargs if k not in takes)
        if bad:
            raise ValueError(
                f"sample got keyword arguments {bad} that a {type(self.buffer).__name__}'s sample does not take; "
                f"it takes {[k for k in takes if k in SAMPLE_KWARGS]}"
            )
        self._check_reply(size, kwargs)
        if 'cur_learner_iter' in takes:
            kwargs['cur_learner_iter'] = self._learner_iter(kwargs.get('cur_learner_iter', -1))
        if poll:
            try:
                return self.buffer.sample(size, timeout=0, **kwargs)
            except SampleTimeoutError:
                return None
        return self.buffer.sample(size, **kwargs)

    def _why_not_sample(self, sender, size, cur_learner_iter=-1) -> str:
        check_size(size)
        if 'unroll_len' not in self.buffer.sample_kwargs:  # (windows: the sample's own unroll_len bounds it)
            self._check_reply(int(size), {})  # what ``sample`` of that size refuses, it refuses too
        return self.buffer.why_not_sample(int(size), self._learner_iter(cur_learner_iter))

    def _learner_iter(self, cur_learner_iter: Any) -> Any:
        """With ``max_version_lag``, a sample that names no learner iteration is judged by the model version."""
        cur_learner_iter = check_step(cur_learner_iter, 'cur_learner_iter')  # (before comparing: -1.0 is no int)
        if self.cfg.max_version_lag is not None and cur_learner_iter == -1 and self.model_version >= 0:
            return self.model_version
        return cur_learner_iter

    def _check_reply(self, size: int, kwargs: Dict[str, Any]) -> None:
        """Never more rows than the buffer holds (a reply is at most the size of the buffer itself): ``size`` items
        at most the capacity; windows (``unroll_len``, or a prioritized window buffer's own) at most the steps
        stored, or ``MAX_WINDOW_ROWS`` rows -- their count is not bounded by the capacity in episodes."""
        unroll = kwargs.get('unroll_len')
        if unroll is None and hasattr(self.buffer, 'transition_count'):
            unroll = (self.buffer.cfg.get('sampler') or {}).get('unroll_len')  # prioritized windows: the config's
        if not isinstance(unroll, numbers.Integral) or isinstance(unroll, bool) or unroll <= 0:
            cap = self.buffer.replay_buffer_size
            if size > cap:
                raise ValueError(f"sample size must be an int of at most {cap} (the buffer's capacity), got {size}")
            return
        unroll = int(unroll)
        self._check_padding(size, unroll)
        steps = getattr(self.buffer, 'transition_count', 0)
        if size * unroll > max(steps, MAX_WINDOW_ROWS):
            raise ValueError(
                f"sample of {size} windows of {unroll} steps would reply {size * unroll} rows, more than the "
                f"buffer's {steps} stored steps and {MAX_WINDOW_ROWS}"
            )

    def _check_padding(self, size: int, unroll: int) -> None:
        """Windows longer than every stored episode are padding (``pad``), which no stored data bounds: such a
        sample may reply at most the steps the buffer holds, or ``MAX_WINDOW_ROWS``."""
        steps = getattr(self.buffer, 'transition_count', 0)
        if size * unroll <= max(steps, MAX_WINDOW_ROWS):
            return
        longest = max(getattr(self.buffer, 'episode_len', None) or [0])  # (O(episodes): only for large replies)
        if unroll > longest:
            raise ValueError(
                f"sample of {size} windows of unroll_len={unroll} steps, longer than every stored episode "
                f"({longest}), would reply {size * unroll} padded rows, more than the buffer's {steps} stored "
                f"steps and {MAX_WINDOW_ROWS}"
            )

    def _update(self, sender, info) -> Any:
        return self.buffer.update(info)

    def _count(self, sender) -> int:
        return self.buffer.count()

    def _stats(self, sender) -> Dict[str, Any]:
        out = dict(self.buffer.stats())
        out.update({f'manager/{k}': v for k, v in self.counters.items()})
        out['manager/model_version'] = self.model_version
        out['manager/exited'] = len(self.liveness.exited)
        out.update({f'manager/blob_version/{k}': v for k, v in self.blobs.versions().items()})
        return out

    def _metadata(self, sender) -> Dict[str, Any]:
        out = {
            'model_version': self.model_version,
            'session_id': '' if self.session_id is None else self.session_id,  # ('': none set yet)
            'count': self.buffer.count(),
            'buffer_type': type(self.buffer).__name__,
            'shard': self.cfg.shard,
        }
        base = self.baseline.value(*self._stored_log_rewards())
        if base is not None:
            out['baseline_log_reward'] = base
        if self.metadata_function is not None:
            extra = self.metadata_function(self.buffer)
            if not isinstance(extra, dict):
                raise TypeError(f"distributed.metadata_function must return a dict, got {type(extra).__name__}")
            out.update(extra)
        return out

    def _state_dict(self, sender) -> Any:
        return self.buffer.state_dict()

    def _load_state_dict(self, sender, state) -> None:
        """A state nested as deep as pushed data may be loads as it is. A deeper one (the buffer's own states nest
        its items a few levels deeper than a push) loads only if the buffer's state afterwards is no deeper than
        ``STATE_DEPTH``, else the state before it is put back: its items could come from a shallower form (e.g.
        ``{'data': [...]}``) than the buffer's own, which then no request could carry."""
        check_depth(state, "load_state_dict 'state'", STATE_DEPTH)
        with self.buffer.lock:
            try:
                check_depth(state, '', DATA_DEPTH)
                before = None
            except CodecError:
                before = self.buffer.state_dict()  # (a restore swaps the storage in: this state stays)
            self.buffer.load_state_dict(state)
            if before is not None:
                try:
                    check_depth(self.buffer.state_dict(), "the buffer's state after load_state_dict", STATE_DEPTH)
                except CodecError:
                    self.buffer.load_state_dict(before)
                    raise
            self._loads += 1

    def _save_data(self, sender, path) -> str:
        where = self.resolve_path(path)
        self.buffer.save_data(where)
        return where

    def _load_data(self, sender, path, undo=False) -> str:
        """``undo``: the buffer's state before the load is kept (this process only) until the sender's ``end_load``
        puts it back or lets it go -- a sharded client's all-or-nothing load of several managers."""
        # allow_pickle is the manager's own setting: unpickling a file runs code in this process
        if type(undo) is not bool:
            raise TypeError(f"load_data 'undo' must be a bool, got {type(undo).__name__}")
        where = self.resolve_path(path)
        before = self.buffer.state_dict() if undo else None  # (a restore swaps the storage in: this state stays)
        self.buffer.load_data(where, allow_pickle=bool(self.cfg.allow_pickle))
        self._loads += 1
        if undo:
            self._undo[sender] = (self._loads, before)
        return where

    def _end_load(self, sender, restore) -> bool:
        """End the sender's ``load_data(undo=True)``: ``restore`` puts the state before it back. False: none kept."""
        if type(restore) is not bool:
            raise TypeError(f"end_load 'restore' must be a bool, got {type(restore).__name__}")
        kept = self._undo.pop(sender, None)
        if kept is None:
            return False
        generation, before = kept
        if restore and generation == self._loads:  # (loaded again since, by another sender: that load stays)
            self.buffer.load_state_dict(before)
            self._loads += 1
        return True

    def resolve_path(self, path: Any) -> str:
        """A worker's file path as a path inside ``distributed.file_root``; ``PermissionError`` otherwise."""
        return confine(self._file_root, path)

    def _clear(self, sender) -> None:
        self.buffer.clear()
        self._loads += 1

    def _model_version(self, sender, version, session_id=None) -> Dict[str, Any]:
        version, session_id = check_stamp(version, session_id, required=True)  # all checked before anything changes
        out = {'model_version': version, 'session_id': session_id, 'cleared': 0}
        if self.buffer.version_gate:  # a buffer with its own gate (the chunk buffer), declared by its type
            out.update(self.buffer.update_model_version(version, session_id))
        if session_id is not None and session_id != self.session_id:
            if self.session_id is not None and self.cfg.max_version_lag is not None:
                out['cleared'] = self.buffer.count()
                self.buffer.clear()  # MineStudio drops data of another session
            self.session_id = session_id
        self.model_version = version
        out['session_id'] = self.session_id
        return out

    def _put_blob(self, sender, name, version, payload) -> Dict[str, Any]:
        check_depth(payload, "put_blob 'payload'")
        return self.blobs.put(name, version, payload)

    def _get_blob(self, sender, name, newer_than=-1) -> Optional[Dict[str, Any]]:
        return self.blobs.get(name, newer_than)

    def _baseline_sync(self, sender, value) -> None:
        self.baseline.sync(value)

    def _exit(self, sender) -> Dict[str, Any]:
        self._undo.pop(sender, None)  # (a load it kept for undo stays)
        if self.rings is not None:
            self.rings.close(sender, self._ring_push)
        return {'exited': self.liveness.exit(sender)}

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> Optional[str]:
        """Checkpoint the buffer when ``checkpoint_path`` is set; returns the path written."""
        if self.rings is not None:
            self.rings.close_all(self._ring_push)
        path = self.cfg.checkpoint_path
        if path:
            self.buffer.save_data(path)
            logger.info("manager saved its buffer (%d items) to %s", self.buffer.count(), path)
        return path

    def summary(self) -> Dict[str, Any]:
        return {
            'counters': dict(self.counters),
            'per_sender': {str(k): dict(v) for k, v in self.per_sender.items()},
            **self.liveness.summary(),
        }

"""The manager: one process (or Ray actor) owns the real buffer and answers workers' requests.

``ManagerCore`` is transport-free: ``handle(sender, request) -> reply`` for one decoded request. Requests are
``{'op', 'id', 'shard', 'args'}``; replies ``{'id', 'ok': True, 'result'}`` or ``{'id', 'ok': False, 'error',
'message'}`` (the worker re-raises the same exception type). ``ReplayBufferManager`` runs it over the torch /
MPI transports; ``ray_backend`` runs it inside an actor.

Ops: push, sample, update, count, stats, metadata, state_dict, load_state_dict, save_data, load_data, clear,
model_version, baseline_sync, ping (heartbeat, no reply), exit (reply marked final).

Trust: a request can never relax the manager's safety. ``load_data`` unpickles only when the manager's own
``distributed.allow_pickle`` is set, and ``save_data`` / ``load_data`` paths are confined to the manager's
``distributed.file_root`` (refused when it is None). Pushes carry ``client`` and ``seq``: a push whose sequence
number was already applied for that client is answered from the record of the first one and stored again
never, so a retry after a timeout is safe.
"""
import logging
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple


from ..control.thruput import SampleTimeoutError
from .baseline import BaselineTracker
from .batching import count_items, log_rewards_of
from .codec import CodecError
from .config import resolve_callable

logger = logging.getLogger('ding_buffer.distributed')

# exception types a worker re-raises as themselves; anything else arrives as RemoteError
REMOTE_EXCEPTIONS = {e.__name__: e for e in (ValueError, TypeError, KeyError, IndexError, RuntimeError,
                                             NotImplementedError, SampleTimeoutError, FileNotFoundError)}
REMOTE_EXCEPTIONS['CodecError'] = CodecError
REMOTE_EXCEPTIONS['PermissionError'] = PermissionError

# the keyword arguments of the buffers' sample() a worker may pass; anything else is refused by name
SAMPLE_KWARGS = ('cur_learner_iter', 'sample_range', 'replace', 'unroll_len', 'pad')
MAX_CLIENTS = 1 << 16  # push-dedup records kept (oldest dropped first)


class _StoredThenFailed(Exception):
    """A push stored its data, then scoring failed: ``error`` is what the worker gets (every time it asks)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def error_reply(rid: Any, e: BaseException) -> Dict[str, Any]:
    return {'id': rid, 'ok': False, 'error': type(e).__name__, 'message': str(e)}


class ManagerCore:
    """
    Overview:
        Serves one buffer to many senders. Single-threaded: the caller serialises ``handle`` calls.
    Interfaces:
        ``handle``, ``summary``, ``shutdown``; attributes ``buffer``, ``exited``, ``per_sender``.
    """

    def __init__(self, buffer: Any, dcfg: Any, log_reward_key: str) -> None:
        if dcfg.file_root is not None and not os.path.isdir(dcfg.file_root):
            raise ValueError(f"config key 'distributed.file_root' is {dcfg.file_root!r}, which is not a directory; "
                             f"create it, or set None to refuse workers' save_data / load_data")
        self.buffer = buffer
        self.cfg = dcfg
        # resolved once: a later chdir of the manager must not move the directory workers may use
        self._file_root = os.path.realpath(dcfg.file_root) if dcfg.file_root is not None else None
        self.log_reward_key = log_reward_key
        self.scoring_function: Optional[Callable] = resolve_callable(dcfg.scoring_function, 'scoring_function')
        self.metadata_function: Optional[Callable] = resolve_callable(dcfg.metadata_function, 'metadata_function')
        self.baseline = BaselineTracker(dcfg.baseline_strategy, dcfg.baseline_percentile, dcfg.baseline_ema_alpha)
        self.model_version = -1
        self.session_id = ''
        self.exited: set = set()
        self.lost: Dict[Any, str] = {}
        self.rejoined: Dict[Any, int] = {}
        self.last_seen: Dict[Any, float] = {}
        self._last_check: Optional[float] = None
        self.per_sender: Dict[Any, Dict[str, int]] = {}
        self._applied: Dict[str, Tuple[int, Dict[str, Any]]] = {}  # client -> (last push seq, its reply)
        self.counters = dict(push_requests=0, pushed_items=0, rejected_stale=0, sample_requests=0, errors=0,
                             duplicate_pushes=0)
        self._ops = {
            'push': self._push, 'sample': self._sample, 'update': self._update, 'count': self._count,
            'stats': self._stats, 'metadata': self._metadata, 'state_dict': self._state_dict,
            'load_state_dict': self._load_state_dict, 'save_data': self._save_data, 'load_data': self._load_data,
            'clear': self._clear, 'model_version': self._model_version, 'baseline_sync': self._baseline_sync,
            'exit': self._exit,
        }

    # ------------------------------------------------------------------ dispatch
    def handle(self, sender: Any, request: Any) -> Optional[Dict[str, Any]]:
        """Serve one request; returns the reply (None for heartbeats). Never raises for bad requests."""
        rid = request.get('id') if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict) or not isinstance(request.get('op'), str):
                raise ValueError(f"a request must be a dict with an 'op' str, got {str(request)[:100]!r}")
            op = request['op']
            self.seen(sender)
            stats = self.per_sender.setdefault(sender, dict(requests=0))
            stats['requests'] += 1
            if op == 'ping':
                return None
            if request.get('shard', 0) != self.cfg.shard:
                raise ValueError(f"request for shard {request.get('shard')!r} reached the manager of shard {self.cfg.shard}")
            fn = self._ops.get(op)
            if fn is None:
                raise ValueError(f"unknown op {op!r}; expected one of {sorted(self._ops) + ['ping']}")
            args = request.get('args') or {}
            if not isinstance(args, dict):
                raise TypeError(f"'args' of op {op!r} must be a dict, got {type(args).__name__}")
            result = fn(sender, **args)
            reply = {'id': rid, 'ok': True, 'result': result}
            if op == 'exit':
                reply['final'] = True
            return reply
        except Exception as e:  # a bad request is answered, never fatal to the manager
            self.counters['errors'] += 1
            logger.debug("request %r from %r failed: %s", rid, sender, e)
            return error_reply(rid, e)

    # ------------------------------------------------------------------ ops
    def _push(self, sender, data, batched=False, envstep=-1, model_version=None, session_id=None, client=None,
              seq=None) -> Dict[str, Any]:
        if client is not None or seq is not None:
            if not (isinstance(client, str) and 0 < len(client) <= 128 and isinstance(seq, int)
                    and not isinstance(seq, bool) and 0 <= seq < (1 << 63)):
                raise ValueError(f"push 'client' must be a str of 1..128 chars and 'seq' an int in [0, 2**63), got "
                                 f"{str(client)[:40]!r} and {str(seq)[:40]!r}")
            done = self._applied.get(client)
            if done is not None and seq <= done[0]:  # a retry of a push that was applied: never store it twice
                self.counters['duplicate_pushes'] += 1
                if seq == done[0] and isinstance(done[1], BaseException):
                    raise done[1]  # the first attempt stored the data, then failed: the same answer again
                reply = dict(done[1]) if seq == done[0] else {'stored': 0, 'score': {}}
                reply['duplicate'] = True
                return reply
        try:
            reply: Any = self._apply_push(sender, data, batched, envstep, model_version, session_id)
        except _StoredThenFailed as e:  # the data is in: a retry must not store it again, nor hide the error
            reply = e.error
        if client is not None:
            self._applied.pop(client, None)
            self._applied[client] = (seq, reply)
            if len(self._applied) > MAX_CLIENTS:
                self._applied.pop(next(iter(self._applied)))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _apply_push(self, sender, data, batched, envstep, model_version, session_id) -> Dict[str, Any]:
        self.counters['push_requests'] += 1
        n = count_items(data, batched)
        score: Dict[str, Any] = {}
        if self._stale(model_version, session_id):
            self.counters['rejected_stale'] += n
            return {'stored': 0, 'rejected_stale': n, 'score': score}
        incoming = log_rewards_of(data, self.log_reward_key) if self.baseline.strategy is not None else None
        stored = 0
        if self.cfg.store_locally:
            stored = self.buffer.push(data, envstep, batched=batched)
        self.counters['pushed_items'] += n
        self.baseline.observe(incoming)
        if self.scoring_function is not None:  # scored after storing, as torchgfn does (novelty sees the batch)
            try:
                out = self.scoring_function(data, sender=sender, buffer=self.buffer)
            except Exception as e:
                raise _StoredThenFailed(type(e)(f"distributed.scoring_function raised {type(e).__name__}: {e} (the "
                                                f"{stored} pushed items were stored)")) from e
            if not isinstance(out, dict):
                raise _StoredThenFailed(TypeError(f"distributed.scoring_function must return a dict, got "
                                                  f"{type(out).__name__} (the {stored} pushed items were stored)"))
            score.update(out)
        base = self.baseline.value(*self._stored_log_rewards())
        if base is not None:
            score['baseline_log_reward'] = base
        return {'stored': int(stored), 'score': score}

    def _stale(self, version, session) -> bool:
        if self.cfg.max_version_lag is None or version is None:
            return False
        if session is not None and self.session_id and session != self.session_id:
            return True
        return self.model_version - int(version) > self.cfg.max_version_lag

    def _stored_log_rewards(self):
        fn = getattr(self.buffer, 'log_rewards', None)
        if fn is None:
            return None, False
        capacity = self._capacity()
        return fn(), capacity is not None and self.buffer.count() >= capacity

    def _capacity(self) -> Optional[int]:
        return getattr(self.buffer, 'capacity', None) or getattr(self.buffer, 'replay_buffer_size', None)

    def _sample(self, sender, size, kwargs=None) -> Any:
        self.counters['sample_requests'] += 1
        cap = self._capacity()
        if not isinstance(size, int) or isinstance(size, bool) or (cap is not None and size > cap):
            # never more rows than the buffer holds: a reply is at most the size of the buffer itself
            raise ValueError(f"sample size must be an int of at most {cap} (the buffer's capacity), got {str(size)[:40]}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"sample 'kwargs' must be a dict, got {type(kwargs).__name__}")
        kwargs = dict(kwargs or {})
        if 'timeout' in kwargs:
            raise ValueError("sample's 'timeout' is handled by the worker; the manager never blocks")
        bad = sorted(str(k) for k in kwargs if k not in SAMPLE_KWARGS)
        if bad:
            raise ValueError(f"sample got unexpected keyword arguments {bad}; a worker may pass {list(SAMPLE_KWARGS)}")
        if self.cfg.max_version_lag is not None and kwargs.get('cur_learner_iter', -1) == -1 and self.model_version >= 0:
            kwargs['cur_learner_iter'] = self.model_version
        return self.buffer.sample(size, **kwargs)

    def _update(self, sender, info) -> Any:
        return self.buffer.update(info)

    def _count(self, sender) -> int:
        return self.buffer.count()

    def _stats(self, sender) -> Dict[str, Any]:
        fn = getattr(self.buffer, 'stats', None)
        out = dict(fn()) if fn is not None else {'count': self.buffer.count()}
        out.update({f'manager/{k}': v for k, v in self.counters.items()})
        out['manager/model_version'] = self.model_version
        out['manager/exited'] = len(self.exited)
        return out

    def _metadata(self, sender) -> Dict[str, Any]:
        out = {'model_version': self.model_version, 'session_id': self.session_id, 'count': self.buffer.count(),
               'buffer_type': type(self.buffer).__name__, 'shard': self.cfg.shard}
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
        self.buffer.load_state_dict(state)

    def _save_data(self, sender, path) -> str:
        where = self.resolve_path(path)
        self.buffer.save_data(where)
        return where

    def _load_data(self, sender, path) -> str:
        # allow_pickle is the manager's own setting: unpickling a file runs code in this process
        where = self.resolve_path(path)
        self.buffer.load_data(where, allow_pickle=bool(self.cfg.allow_pickle))
        return where

    def resolve_path(self, path: Any) -> str:
        """A worker's file path as a path inside ``distributed.file_root``; ``PermissionError`` otherwise."""
        base = self._file_root
        if base is None:
            raise PermissionError("workers may not read or write files on the manager: its config has "
                                  "distributed.file_root=None (set it to a directory to allow save_data / load_data)")
        if not isinstance(path, str) or not path or '\0' in path or len(path) > 4096:
            raise ValueError(f"path must be a non-empty str without NUL bytes, got {str(path)[:80]!r}")
        where = os.path.realpath(os.path.join(base, path))
        if os.path.isabs(path) or os.path.commonpath([base, where]) != base or where == base:
            raise PermissionError(f"path {path!r} resolves to {where!r}, outside distributed.file_root {base!r}; "
                                  f"workers may name relative paths inside it only")
        return where

    def _clear(self, sender) -> None:
        self.buffer.clear()

    def _model_version(self, sender, version, session_id=None) -> Dict[str, Any]:
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"model version must be an int, got {version!r}")
        cleared = 0
        if session_id is not None and session_id != self.session_id:
            if self.session_id and self.cfg.max_version_lag is not None:
                cleared = self.buffer.count()
                self.buffer.clear()  # MineStudio drops data of another session
            self.session_id = session_id
        self.model_version = version
        return {'model_version': version, 'session_id': self.session_id, 'cleared': cleared}

    def _baseline_sync(self, sender, value) -> None:
        self.baseline.sync(value)

    def _exit(self, sender) -> Dict[str, Any]:
        self.exited.add(sender)
        self.lost.pop(sender, None)
        self.last_seen.pop(sender, None)  # never silent again: the watchdog's scan stays O(live senders)
        return {'exited': len(self.exited)}

    # ------------------------------------------------------------------ liveness (used by every backend)
    def seen(self, sender: Any, now: Optional[float] = None) -> None:
        """Record a message of ``sender``; a sender counted lost that speaks again rejoins."""
        self.last_seen[sender] = time.monotonic() if now is None else now
        if sender in self.lost:
            why = self.lost.pop(sender)
            self.rejoined[sender] = self.rejoined.get(sender, 0) + 1
            logger.warning("manager: worker %s was counted lost (%s) and is back; serving it again", sender, why)

    def merge_heard(self, stamps: Dict[Any, float]) -> None:
        """Fold arrival times recorded without the buffer's lock (heartbeats, requests waiting for it) into the
        liveness record: a newer stamp counts as a message; an exited sender stays exited."""
        for sender, t in list(stamps.items()):
            if sender not in self.exited and t > self.last_seen.get(sender, float('-inf')):
                self.seen(sender, t)

    def lose(self, sender: Any, why: str) -> None:
        if sender not in self.lost and sender not in self.exited:
            self.lost[sender] = why
            logger.warning("manager: lost worker %s: %s; serving the others", sender, why)

    def check_silent(self, now: Optional[float] = None, busy: Any = ()) -> None:
        """
        Overview:
            Count as lost every sender silent for longer than ``distributed.peer_timeout``, except the ``busy``
            ones (a request of theirs waits for the buffer). Call it often (at least every ``peer_timeout / 2``):
            a longer gap means this process did not run (frozen, or a long request held the buffer), and that
            time is not held against anyone: every sender's silence is shifted by the gap.
        """
        limit = self.cfg.peer_timeout
        if limit is None:
            return
        now = time.monotonic() if now is None else now
        gap = now - self._last_check if self._last_check is not None else 0.0
        self._last_check = now
        if gap > limit / 2:
            for w in self.last_seen:
                self.last_seen[w] += gap
        for w, t in list(self.last_seen.items()):
            if w not in self.lost and w not in self.exited and w not in busy and now - t > limit:
                self.lose(w, f"no message or heartbeat for {now - t:.1f}s (distributed.peer_timeout={limit})")

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> Optional[str]:
        """Checkpoint the buffer when ``checkpoint_path`` is set; returns the path written."""
        path = self.cfg.checkpoint_path
        if path:
            self.buffer.save_data(path)
            logger.info("manager saved its buffer (%d items) to %s", self.buffer.count(), path)
        return path

    def summary(self) -> Dict[str, Any]:
        return {'counters': dict(self.counters), 'per_sender': {str(k): dict(v) for k, v in self.per_sender.items()},
                'exited': sorted(str(s) for s in self.exited), 'lost': {str(k): v for k, v in self.lost.items()},
                'rejoined': {str(k): v for k, v in self.rejoined.items()}}

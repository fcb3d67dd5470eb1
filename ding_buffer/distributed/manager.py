"""The manager: one process (or Ray actor) owns the real buffer and answers workers' requests.

``ManagerCore`` is transport-free: ``handle(sender, request) -> reply`` for one decoded request. Requests are
``{'op', 'id', 'shard', 'args'}``; replies ``{'id', 'ok': True, 'result'}`` or ``{'id', 'ok': False, 'error',
'message'}`` (the worker re-raises the same exception type). ``ReplayBufferManager`` runs it over the torch /
MPI transports; ``ray_backend`` runs it inside an actor.

Ops: push, sample, update, count, stats, metadata, state_dict, load_state_dict, save_data, load_data, clear,
model_version, baseline_sync, ping (heartbeat, no reply), exit (reply marked final).
"""
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional


from ..control.thruput import SampleTimeoutError
from .baseline import BaselineTracker
from .batching import count_items, log_rewards_of
from .codec import CodecError
from .config import resolve_callable
from .transport import ERROR, LOST, TransportError

logger = logging.getLogger('ding_buffer.distributed')

# exception types a worker re-raises as themselves; anything else arrives as RemoteError
REMOTE_EXCEPTIONS = {e.__name__: e for e in (ValueError, TypeError, KeyError, IndexError, RuntimeError,
                                             NotImplementedError, SampleTimeoutError, FileNotFoundError)}
REMOTE_EXCEPTIONS['CodecError'] = CodecError


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
        self.buffer = buffer
        self.cfg = dcfg
        self.log_reward_key = log_reward_key
        self.scoring_function: Optional[Callable] = resolve_callable(dcfg.scoring_function, 'scoring_function')
        self.metadata_function: Optional[Callable] = resolve_callable(dcfg.metadata_function, 'metadata_function')
        self.baseline = BaselineTracker(dcfg.baseline_strategy, dcfg.baseline_percentile, dcfg.baseline_ema_alpha)
        self.model_version = -1
        self.session_id = ''
        self.exited: set = set()
        self.per_sender: Dict[Any, Dict[str, int]] = {}
        self.counters = dict(push_requests=0, pushed_items=0, rejected_stale=0, sample_requests=0, errors=0)
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
    def _push(self, sender, data, batched=False, envstep=-1, model_version=None, session_id=None) -> Dict[str, Any]:
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
            out = self.scoring_function(data, sender=sender, buffer=self.buffer)
            if not isinstance(out, dict):
                raise TypeError(f"distributed.scoring_function must return a dict, got {type(out).__name__} "
                                f"(the {stored} pushed items were stored)")
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
        capacity = getattr(self.buffer, 'capacity', None) or getattr(self.buffer, 'replay_buffer_size', None)
        return fn(), capacity is not None and self.buffer.count() >= capacity

    def _sample(self, sender, size, kwargs=None) -> Any:
        self.counters['sample_requests'] += 1
        kwargs = dict(kwargs or {})
        if 'timeout' in kwargs:
            raise ValueError("sample's 'timeout' is handled by the worker; the manager never blocks")
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

    def _save_data(self, sender, path) -> None:
        self.buffer.save_data(path)

    def _load_data(self, sender, path, allow_pickle=False) -> None:
        self.buffer.load_data(path, allow_pickle=allow_pickle)

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
        return {'exited': len(self.exited)}

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
                'exited': sorted(str(s) for s in self.exited)}


class ReplayBufferManager:
    """
    Overview:
        The manager rank of the torch / MPI backends: ``run()`` serves the workers until each has sent EXIT
        (``RemoteBuffer.close``) or was lost, then checkpoints (``checkpoint_path``) and returns a summary.
        A worker whose connection breaks, who sends garbage, or who is silent for ``peer_timeout`` seconds
        (workers send heartbeats) is counted as lost; the others keep being served.
    Interfaces:
        ``run``, ``buffer``, ``close`` (an ``IBuffer``-like handle so pipeline code can ``close()`` it too).
    """

    def __init__(self, buffer: Any, transport: Any, dcfg: Any, workers, log_reward_key: str) -> None:
        self.buffer = buffer
        self.transport = transport
        self.cfg = dcfg
        self.workers = set(workers)
        self.core = ManagerCore(buffer, dcfg, log_reward_key)
        self.lost: Dict[int, str] = {}
        self._lock = threading.Lock()  # serialises ManagerCore.handle across the receive threads
        self._last_seen: Dict[int, float] = {}

    def run(self, timeout: Optional[float] = None, poll: float = 0.5) -> Dict[str, Any]:
        """
        Overview:
            Serve requests until every worker exited or was lost (or ``timeout`` seconds passed, then
            ``TimeoutError``). Returns the summary: counters, per-sender requests, exited and lost ranks.
            Requests are served on the transport's per-worker receive threads, one at a time (a lock around
            the buffer); this thread watches for exits, lost workers and silence.
        """
        start = time.monotonic()
        self._last_seen = {w: start for w in self.workers}
        self.transport.on_item = self._serve
        self.transport.start()
        try:
            while self.workers - self.core.exited - set(self.lost):
                if timeout is not None and time.monotonic() - start > timeout:
                    raise TimeoutError(f"manager run() exceeded {timeout}s; still waiting for ranks "
                                       f"{sorted(self.workers - self.core.exited - set(self.lost))}")
                item = self.transport.recv(timeout=poll)  # lost peers and wake-ups after an EXIT
                if item is not None and item[1] == LOST:
                    self._lose(item[0], item[2])
                self._check_silent(self._last_seen, time.monotonic())
        finally:
            self.transport.close()
        self.core.shutdown()
        out = self.core.summary()
        out['lost'] = {str(k): v for k, v in self.lost.items()}
        out['bytes_received'] = self.transport.bytes_received
        out['bytes_sent'] = self.transport.bytes_sent
        return out

    def _serve(self, peer: int, kind: str, obj: Any) -> None:
        """One request of ``peer``, on its receive thread: handle it under the lock and send the reply."""
        if peer in self.lost:
            return
        self._last_seen[peer] = time.monotonic()
        if kind == ERROR:
            reply = error_reply(*obj)
        else:
            with self._lock:
                reply = self.core.handle(peer, obj)
        if reply is not None:
            try:
                try:
                    self.transport.send(peer, reply)
                except TypeError as e:  # a result the codec cannot carry (e.g. arbitrary objects)
                    self.transport.send(peer, error_reply(reply.get('id'), e))
            except TransportError as e:
                self.transport.inbox.put((peer, LOST, str(e)))
        if reply is not None and reply.get('final'):
            self.transport.inbox.put((peer, 'exited', None))  # wake run() to re-check the exit condition

    def _check_silent(self, last_seen: Dict[int, float], now: float) -> None:
        limit = self.cfg.peer_timeout
        if limit is None:
            return
        for w, t in last_seen.items():
            if w not in self.lost and w not in self.core.exited and now - t > limit:
                self._lose(w, f"no message or heartbeat for {now - t:.1f}s (distributed.peer_timeout={limit})")

    def _lose(self, peer: int, why: str) -> None:
        if peer not in self.lost and peer not in self.core.exited:
            self.lost[peer] = why
            logger.warning("manager: lost worker rank %s: %s; serving the others", peer, why)

    def close(self) -> None:
        self.transport.close()
        self.buffer.close()

    def __getattr__(self, name: str) -> Any:  # stats(), count(), sample() ... of the owned buffer
        if name in ('buffer', 'core'):
            raise AttributeError(name)
        return getattr(self.buffer, name)

"""``RemoteBuffer``: the worker side. An ``IBuffer`` whose calls are requests to the manager.

Pushes go through the torchgfn worker pipeline: accumulate ``remote_buffer_freq`` pushes -> (optionally) keep
only scoring fields -> drop rows below the manager's ``baseline_log_reward`` (with refresh) -> send; in
``async_score`` mode the send does not wait and the score of the previous send is collected first.

Every call is bounded by ``distributed.timeout``, sending and waiting for the reply together: a manager that
died, hangs or is frozen makes the call raise ``ManagerUnavailableError`` within the timeout.

Delivery guarantee of pushes: every push carries this client's id and a sequence number, and the manager
applies each sequence number at most once. A push that raised ``ManagerUnavailableError`` is *in doubt*: it may
have been stored or not. The RemoteBuffer keeps it and sends it again, with the same sequence number, before
anything else on the next push / flush / close, so it is stored exactly once if the manager comes back; a
push of the same data right after the failure is recognised as the caller's retry and adds nothing new.
Not thread-safe: use one RemoteBuffer per thread.
"""
import hashlib
import time
import uuid
from typing import Any, Dict, List, Optional

import numpy as np

from ..base import IBuffer
from ..control.thruput import SampleTimeoutError
from .batching import concat_batches, count_items, filter_items, log_rewards_of, select_fields
from .codec import encode
from .manager import REMOTE_EXCEPTIONS
from ..errors import ManagerUnavailableError, RemoteError  # noqa: F401 (re-exported)
from .channel import PeerChannel, deadline_in  # noqa: F401 (PeerChannel re-exported)


def _digest(data: Any, batched: bool, allow_pickle: bool) -> Optional[bytes]:
    """A content digest of a push's data (None if it cannot be encoded)."""
    try:
        header, parts = encode(data, allow_pickle)
    except TypeError:
        return None
    h = hashlib.blake2b(header, digest_size=16)
    h.update(b'1' if batched else b'0')
    for p in parts:
        h.update(memoryview(p))
    return h.digest()


class RemoteBuffer(IBuffer):
    """
    Overview:
        Worker-side handle of a buffer owned by a manager (torch / MPI rank or Ray actor). Same calls as a local
        buffer: ``push``/``extend``, ``sample`` (``timeout=`` waits on the worker side), ``update``, ``count``,
        ``stats``, ``state_dict``/``load_state_dict``, ``save_data``/``load_data`` (paths inside the manager's
        ``distributed.file_root``), ``clear``, ``close`` (sends EXIT after draining). Distributed extras:
        ``last_score``, ``drain_pending_score``, ``metadata``, ``set_model_version`` (stamps pushes),
        ``update_model_version`` (moves the manager's version), ``baseline_sync``, ``baseline_log_reward``,
        ``unacknowledged`` (pushes in doubt, sent again by the next call).
    """

    def __init__(self, cfg: Any, dcfg: Any, channel: Any, local: Optional[IBuffer] = None,
                 dict_is_batch: bool = False, scoring_keys: Optional[List[str]] = None,
                 log_reward_key: str = 'log_reward') -> None:
        self._cfg = cfg
        self._dcfg = dcfg
        self._channel = channel
        self._local = local
        self._dict_is_batch = dict_is_batch
        self._scoring_keys = scoring_keys
        self._log_reward_key = log_reward_key
        self._pending: List[Any] = []
        self._pending_batched: Optional[bool] = None
        self._push_calls = 0
        self._client = uuid.uuid4().hex
        self._seq = 0
        self._unacked: List[Dict[str, Any]] = []  # push args in doubt, resent (same seq) before anything else
        self._retry_of: Optional[bytes] = None  # digest of the data of the push call that raised
        self._inflight: Optional[Any] = None  # async_score: (ticket, args) of the unanswered push
        self.last_score: Optional[Dict[str, Any]] = None
        self.baseline_log_reward = -np.inf
        self._model_version: Optional[int] = None
        self._session_id: Optional[str] = None
        self._consecutive_empty = 0
        self.filter_stats = dict(total=0, kept=0, skipped_sends=0, sends=0)
        self.resent_pushes = 0  # pushes in doubt sent again
        self._closed = False

    # ------------------------------------------------------------------ requests
    def _request(self, op: str, timeout: Optional[float] = None, deadline: Optional[float] = None, **args) -> Any:
        """One request and its reply, both within ``deadline`` (or ``timeout`` seconds, default the config's)."""
        self._check_open()
        if deadline is None:
            deadline = deadline_in(self._dcfg.timeout if timeout is None else timeout)
        ticket = self._channel.submit(self._msg(op, args), deadline)
        return self._reply(self._channel.result(ticket, op, deadline), op)

    def _msg(self, op: str, args: Dict[str, Any]) -> Dict[str, Any]:
        return {'op': op, 'shard': self._dcfg.shard, 'args': args}

    @staticmethod
    def _reply(reply: Dict[str, Any], op: str) -> Any:
        if reply.get('ok'):
            return reply.get('result')
        exc = REMOTE_EXCEPTIONS.get(reply.get('error'), RemoteError)
        raise exc(f"manager: {reply.get('message')}" if exc is not RemoteError else
                  f"manager raised {reply.get('error')} for {op!r}: {reply.get('message')}")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("remote buffer is closed")

    # ------------------------------------------------------------------ push pipeline
    def push(self, data: Any, cur_collector_envstep: int = -1, batched: bool = False) -> int:
        """
        Overview:
            Queue ``data`` for the manager; every ``remote_buffer_freq``-th push sends the accumulated batch.
            Returns how many items were handed over (the manager's ``stored`` count is in ``last_score``).
            Pushes in doubt (an earlier ``ManagerUnavailableError``) are sent again first; a push of the same
            data as the call that raised is taken as its retry and adds nothing new.
        """
        self._check_open()
        if data is None:
            raise TypeError("cannot push None")
        batched = bool(batched) or (self._dict_is_batch and isinstance(data, dict))
        n = count_items(data, batched)
        deadline = deadline_in(self._dcfg.timeout)  # one bound for everything this call sends and waits for
        if self._retry_of is not None:
            if self._retry_of == _digest(data, batched, self._dcfg.allow_pickle):
                # the caller's retry of the call that raised: its data is kept already (in doubt or pending),
                # so send what is owed and add nothing; if that fails too, the next call is still its retry
                self._send_owed(cur_collector_envstep, deadline)
                self._retry_of = None
                return n
            self._retry_of = None
        self._resend_unacked(deadline)  # raises before this call's data is taken
        if self._pending and self._pending_batched != batched:
            self._flush(cur_collector_envstep, deadline)  # a batch and single items cannot be merged (raises: not taken)
        if self._local is not None:
            self._local.push(data, cur_collector_envstep, batched=batched)
        self._pending.append(data)
        self._pending_batched = batched
        self._push_calls += 1
        if self._push_calls % self._dcfg.remote_buffer_freq == 0:
            try:
                self._flush(cur_collector_envstep, deadline)
            except ManagerUnavailableError:  # this call's data is kept (in doubt): a push of it again is a retry
                self._retry_of = _digest(data, batched, self._dcfg.allow_pickle)
                raise
        return n

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        return self.push(batch, cur_collector_envstep, batched=True)

    def add(self, data: Any) -> None:
        """torchgfn's name for ``push``."""
        self.push(data)

    def flush(self) -> None:
        """Send what is pending now, pushes in doubt first (``close`` does it too)."""
        self._check_open()
        self._send_owed(-1, deadline_in(self._dcfg.timeout))

    @property
    def unacknowledged(self) -> int:
        """Pushes not acknowledged yet: those in doubt (a call raised ``ManagerUnavailableError``; they are sent
        again by the next call) plus, with ``async_score``, the last push whose score is not collected yet."""
        return len(self._unacked) + (self._inflight is not None)

    def _send_owed(self, envstep: int, deadline: float) -> None:
        self._resend_unacked(deadline)
        self._flush(envstep, deadline)

    def _resend_unacked(self, deadline: float) -> None:
        while self._unacked:
            args = self._unacked[0]
            self.resent_pushes += 1
            result = self._request('push', deadline=deadline, **args)  # raises: it stays in doubt
            self._unacked.pop(0)
            self._take_score(result)

    def _merged(self) -> Any:
        pending, batched = self._pending, self._pending_batched
        self._pending, self._pending_batched = [], None
        if len(pending) == 1:
            return pending[0], batched
        if batched and all(isinstance(p, dict) for p in pending):
            return concat_batches(pending), True
        if not batched:
            items: List[Any] = []
            for p in pending:
                items.extend(p if isinstance(p, list) else [p])
            return items, False
        cat = getattr(type(pending[0]), 'extend', None)
        if cat is None:
            raise TypeError(f"cannot merge pending pushes of type {type(pending[0]).__name__}; "
                            f"use remote_buffer_freq=1")
        merged = pending[0]
        for p in pending[1:]:
            merged.extend(p)
        return merged, True

    def _flush(self, envstep: int, deadline: float) -> None:
        if not self._pending:
            return
        data, batched = self._merged()
        if self._dcfg.scoring_only and self._scoring_keys:
            data = select_fields(data, self._scoring_keys)
        data = self._baseline_filter(data)
        if data is None:
            return
        args = dict(data=data, batched=batched, envstep=envstep, model_version=self._model_version,
                    session_id=self._session_id, client=self._client, seq=self._seq)
        self._seq += 1
        self.filter_stats['sends'] += 1
        if not self._dcfg.async_score:
            try:
                result = self._request('push', deadline=deadline, **args)
            except ManagerUnavailableError:
                self._unacked.append(args)
                raise
            self._take_score(result)
            return
        try:
            ticket = self._channel.submit(self._msg('push', args), deadline)
        except ManagerUnavailableError:
            self._unacked.append(args)
            raise
        previous, self._inflight = self._inflight, (ticket, args)
        if previous is not None:
            self._take_score(self._collect(previous, deadline))

    def _collect(self, inflight: Any, deadline: float) -> Dict[str, Any]:
        ticket, args = inflight
        try:
            return self._reply(self._channel.result(ticket, 'push', deadline), 'push')
        except ManagerUnavailableError:
            self._unacked.append(args)
            raise

    def _baseline_filter(self, data: Any) -> Any:
        if not self._dcfg.baseline_filtering or not np.isfinite(self.baseline_log_reward):
            return data
        lr = log_rewards_of(data, self._log_reward_key)
        if lr is None:
            return data
        mask = lr >= self.baseline_log_reward
        kept = int(mask.sum())
        self.filter_stats['total'] += len(mask)
        self.filter_stats['kept'] += kept
        if kept == len(mask):
            self._consecutive_empty = 0
            return data
        if kept == 0:
            self.filter_stats['skipped_sends'] += 1
            self._consecutive_empty += 1
            refresh = self._dcfg.baseline_refresh_after
            if refresh is not None and self._consecutive_empty >= refresh:
                self._consecutive_empty = 0
                return data  # refresh: send it all so the baseline can move
            return None
        self._consecutive_empty = 0
        return filter_items(data, mask)

    def _take_score(self, result: Dict[str, Any]) -> None:
        score = dict(result.get('score') or {})
        score['stored'] = result.get('stored', 0)
        for k in ('rejected_stale', 'duplicate'):
            if k in result:
                score[k] = result[k]
        self.last_score = score
        if 'baseline_log_reward' in score:
            self.baseline_log_reward = float(score['baseline_log_reward'])

    def drain_pending_score(self, timeout: float = 30.0) -> Optional[Dict[str, Any]]:
        """
        Overview:
            Async mode: wait at most ``timeout`` seconds for the score of the last push and return it (None if
            nothing was outstanding). Raises ``ManagerUnavailableError`` if it does not arrive in time (the push
            is then in doubt and sent again by the next call).
        """
        if self._inflight is None:
            return None
        inflight, self._inflight = self._inflight, None
        self._take_score(self._collect(inflight, deadline_in(timeout)))
        return self.last_score

    # ------------------------------------------------------------------ the rest of IBuffer
    def sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None, **kwargs) -> Optional[Any]:
        """
        Overview:
            Sample from the manager (or the local copy). ``timeout`` (seconds) re-asks until a batch is
            available and raises ``SampleTimeoutError`` after it; the manager itself never blocks.
        """
        if self._local is not None:
            return self._local.sample(size, cur_learner_iter, **kwargs) if timeout is None else \
                self._local.sample(size, cur_learner_iter, timeout=timeout, **kwargs)
        kwargs['cur_learner_iter'] = cur_learner_iter
        if timeout is None:
            return self._request('sample', size=size, kwargs=kwargs)
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SampleTimeoutError(f"remote buffer could not sample {size} items within {timeout}s")
            out = self._request('sample', timeout=min(self._dcfg.timeout, left), size=size, kwargs=kwargs)
            if out is not None:
                return out
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.05)

    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        if self._local is not None:
            return self._local.update(info)
        return self._request('update', info=info)

    def clear(self) -> None:
        if self._local is not None:
            self._local.clear()
        self._request('clear')

    def count(self) -> int:
        if self._local is not None:
            return self._local.count()
        return self._request('count')

    def stats(self) -> Dict[str, Any]:
        """The manager's buffer stats plus its ``manager/*`` counters."""
        return self._request('stats')

    def metadata(self) -> Dict[str, Any]:
        return self._request('metadata')

    def state_dict(self) -> Dict[str, Any]:
        return self._request('state_dict')

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._request('load_state_dict', state=state)

    def save_data(self, path: str) -> str:
        """Ask the manager to write its buffer to ``path``, relative to the manager's ``distributed.file_root``
        (refused with ``PermissionError`` when the manager sets none, or when the path leaves it). Returns the
        path written on the manager's machine."""
        return self._request('save_data', path=path)

    def load_data(self, path: str, allow_pickle: bool = False) -> str:
        """Ask the manager to load ``path`` (relative to its ``distributed.file_root``). Whether a pickled file
        may be loaded is the manager's own ``distributed.allow_pickle``: a request never carries that flag."""
        if allow_pickle and not self._dcfg.allow_pickle:
            raise ValueError("load_data(allow_pickle=True) on a remote buffer: unpickling runs code on the manager, "
                             "so it is allowed only by the manager's own config (distributed.allow_pickle=True), "
                             "never by a request")
        return self._request('load_data', path=path)

    def set_model_version(self, version: int, session_id: Optional[str] = None) -> None:
        """Stamp later pushes with the model version (and session) that produced them."""
        self._model_version = int(version)
        self._session_id = session_id

    def update_model_version(self, version: int, session_id: Optional[str] = None) -> Dict[str, Any]:
        """Learner: move the manager to ``version`` (a new session clears data of the old one when gating)."""
        self.set_model_version(version, session_id)
        return self._request('model_version', version=int(version), session_id=session_id)

    def baseline_sync(self, value: float) -> None:
        """Fix the manager's baseline_log_reward to ``value`` (overrides every strategy from now on)."""
        self._request('baseline_sync', value=float(value))

    @property
    def local(self) -> Optional[IBuffer]:
        return self._local

    def close(self, timeout: Optional[float] = None) -> None:
        """Send what is owed (pushes in doubt, pending pushes), collect the last async score, send EXIT and say
        goodbye, all within one ``timeout`` (default ``distributed.timeout``). Idempotent. Raises
        ``ManagerUnavailableError`` if the manager is gone or does not answer in time (after closing locally;
        pushes still in doubt are then lost with this worker)."""
        if self._closed:
            return
        deadline = deadline_in(self._dcfg.timeout if timeout is None else timeout)
        left = lambda: max(deadline - time.monotonic(), 0.0)  # noqa: E731
        try:
            self._send_owed(-1, deadline)
            if self._inflight is not None:
                self.drain_pending_score(left())
            stop = getattr(self._channel, 'stop_heartbeat', None)
            if stop is not None:
                stop()
            self._request('exit', timeout=left())
        finally:
            self._closed = True
            self._channel.close(left())
            if self._local is not None:
                self._local.close()

    def __repr__(self) -> str:
        return f"RemoteBuffer(type={self._cfg.get('type')!r}, {self._channel.where}, backend={self._dcfg.backend!r})"


def new_client_id() -> str:
    return uuid.uuid4().hex

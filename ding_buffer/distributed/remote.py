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
Not thread-safe: use one RemoteBuffer per thread (on Ray; on torch and MPI a process holds one buffer per manager
for the whole job: a second ``create_buffer`` to it raises ``RuntimeError`` while the first is open).

Neighbour: ``push_pipeline`` (``PushPipeline``: the pushes' stages and their delivery bookkeeping).
"""

import os
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..base import BUFFER_REGISTRY, IBuffer
from ..buffers.common import check_deepcopy, check_wait_timeout
from ..buffers.reward_table import sample_size
from ..errors import ManagerTimeoutError, ManagerUnavailableError, SampleTimeoutError
from .blobs import check_name, check_stamp, check_version
from .channel import deadline_in
from .frames_wire import frames_encoder
from .protocol import request_msg, result_of
from .push_pipeline import PushPipeline, not_taken
from .sample_wait import poll_for_batch
from .shm_ring import RingPusher, WireRest


class RemoteBuffer(IBuffer):
    """
    Overview:
        Worker-side handle of a buffer owned by a manager (torch / MPI rank or Ray actor). Same calls as a local
        buffer: ``push``/``extend``, ``sample`` (``timeout=`` waits on the worker side), ``update``, ``count``,
        ``stats``, ``state_dict``/``load_state_dict``, ``save_data``/``load_data`` (paths inside the manager's
        ``distributed.file_root``), ``clear``, ``close`` (sends EXIT after draining). Distributed extras:
        ``drain_pending_score``, ``metadata``, ``set_model_version`` (stamps pushes), ``update_model_version``
        (moves the manager's version), ``put_blob`` / ``get_blob`` (versioned blobs such as the learner's
        weights), ``baseline_sync``; what the pushes learned, read-only: ``last_score`` and
        ``baseline_log_reward`` (from the manager's replies), ``filter_stats``, ``unacknowledged`` (pushes in doubt,
        sent again by the next call), ``resent_pushes``. ``pushes`` is the push pipeline that holds them.
    """

    def __init__(
        self,
        cfg: Any,
        dcfg: Any,
        channel: Any,
        local: Optional[IBuffer] = None,
        dict_is_batch: bool = False,
        scoring_keys: Optional[List[str]] = None,
        log_reward_key: str = 'log_reward',
    ) -> None:
        self._cfg = cfg
        self._dcfg = dcfg
        self._channel = channel
        self._local = local
        self.pushes = PushPipeline(
            dcfg,
            channel,
            local=local,
            dict_is_batch=dict_is_batch,
            scoring_keys=scoring_keys,
            log_reward_key=log_reward_key,
            frames=frames_encoder(cfg, dcfg),
        )
        self._closed = False
        # distributed.shared_memory: pushes that fit a ring go through memory when the manager is on this host
        # (a weak reference back: the pusher must not keep a dropped RemoteBuffer alive, its channel beating)
        me = weakref.ref(self)
        request = lambda *a, **k: me()._request(*a, **k)  # noqa: E731
        self.rings = RingPusher(request, self.pushes.client, dcfg.timeout) if dcfg.shared_memory else None

    # ------------------------------------------------------------------ requests
    def _request(self, op: str, timeout: Optional[float] = None, deadline: Optional[float] = None, **args) -> Any:
        """One request and its reply, both within ``deadline`` (or ``timeout`` seconds, default the config's)."""
        self._check_open()
        if deadline is None:
            deadline = deadline_in(self._dcfg.timeout if timeout is None else timeout)
        ticket = self._channel.submit(request_msg(op, self._dcfg.shard, args), deadline)
        return result_of(self._channel.result(ticket, op, deadline), op)

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
        if self.rings is not None and not self.pushes.is_retry(data, batched):
            if self.pushes.unacknowledged:  # a wire push in doubt goes first: the order of pushes is kept
                try:
                    self.flush()
                except ManagerUnavailableError as e:
                    raise not_taken(e) from e
            try:
                n = self.rings.push(data, batched, cur_collector_envstep)
            except WireRest as rest:  # the ring closed under the push and no new one could be made: the rest
                self.pushes.push(rest.rest, cur_collector_envstep, batched, whole=data)
                return rest.total
            if n is not None:
                return n
        return self.pushes.push(data, cur_collector_envstep, batched)

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        return self.push(batch, cur_collector_envstep, batched=True)

    # what the pushes learned, under the names the docs use (the push pipeline holds them)
    @property
    def last_score(self) -> Optional[Dict[str, Any]]:
        """The score dict of the last acknowledged push (``{'stored': n, ...}``; None before the first)."""
        return self.pushes.last_score

    @property
    def baseline_log_reward(self) -> float:
        """The manager's baseline log-reward, from its last push reply (``-inf`` before one names it)."""
        return self.pushes.baseline_log_reward

    @property
    def filter_stats(self) -> Dict[str, int]:
        """Worker-side baseline filtering: rows seen (``total``) and ``kept``, ``sends`` and ``skipped_sends``."""
        return self.pushes.filter_stats

    @property
    def unacknowledged(self) -> int:
        """Pushes in doubt (plus an uncollected async push), sent again by the next call."""
        return self.pushes.unacknowledged

    @property
    def resent_pushes(self) -> int:
        """Pushes in doubt that were sent again."""
        return self.pushes.resent_pushes

    def add(self, data: Any) -> None:
        """torchgfn's name for ``push``."""
        self.push(data)

    def flush(self) -> None:
        """Send what is pending now, pushes in doubt first (``close`` does it too)."""
        self._check_open()
        self.pushes.send_owed(-1, deadline_in(self._dcfg.timeout))

    def drain_pending_score(self, timeout: float = 30.0) -> Optional[Dict[str, Any]]:
        """
        Overview:
            Async mode: wait at most ``timeout`` seconds for the score of the last push and return it (None if
            nothing was outstanding). Raises ``ManagerUnavailableError`` if it does not arrive in time (the push
            is then in doubt and sent again by the next call).
        """
        return self.pushes.drain(timeout)

    # ------------------------------------------------------------------ the rest of IBuffer
    def sample(
        self, size: Optional[int] = None, cur_learner_iter: int = -1, timeout: Optional[float] = None, **kwargs
    ) -> Optional[Any]:
        """
        Overview:
            Sample from the manager (or the local copy). ``timeout`` (seconds) re-asks until a batch is
            available and raises ``SampleTimeoutError`` after it; the manager itself never blocks. A manager that
            does not answer a poll within ``timeout`` (busy, frozen or gone without a word) ends in
            ``SampleTimeoutError`` too; a lost connection, or a poll that outlives ``distributed.timeout``, in
            ``ManagerUnavailableError``.
        """
        timeout = check_wait_timeout(timeout)  # before anything is asked: NaN or inf would poll forever
        if 'n_samples' in kwargs or size is None:  # torchgfn's name of the size (GFlowNet buffers take it too)
            cls = BUFFER_REGISTRY.get(self._cfg.type)
            if 'n_samples' in kwargs and 'n_samples' not in cls.sample_kwargs:  # (as the local buffer's sample)
                raise TypeError(f"{cls.__name__}.sample() got an unexpected keyword argument 'n_samples'")
            size = sample_size(size, kwargs.pop('n_samples', None))
        if self._local is not None:
            if timeout is not None:
                kwargs['timeout'] = timeout
            return self._local.sample(size, cur_learner_iter, **kwargs)
        kwargs['cur_learner_iter'] = cur_learner_iter
        if timeout is None:
            return self._request('sample', size=size, kwargs=kwargs)
        return self._poll('sample', size, timeout, lambda batch: batch, kwargs=kwargs, poll=True)

    def _poll(self, op: str, size: int, timeout: float, ready: Callable[[Any], Any], **args: Any) -> Any:
        """Ask ``op`` again until ``ready(reply)`` is not None (then it is returned) or ``timeout`` seconds pass
        (``SampleTimeoutError``)."""

        def attempt(left: float) -> Optional[Any]:
            try:
                return ready(self._request(op, timeout=min(self._dcfg.timeout, left), size=size, **args))
            except ManagerTimeoutError as e:
                # a poll bounded by this call's own deadline ran out: the sample timed out (a lost connection,
                # or a poll bounded by distributed.timeout, is the manager being unavailable)
                if left < self._dcfg.timeout:
                    raise SampleTimeoutError(
                        f"remote buffer could not sample {size} items within {timeout}s (the "
                        f"manager did not answer the last poll in time)"
                    ) from e
                raise

        return poll_for_batch(attempt, size, timeout, 'remote buffer')

    def why_not_sample(self, size: int, cur_learner_iter: int = -1, timeout: Optional[float] = None) -> str:
        """Why ``sample(size, cur_learner_iter)`` would return None now, or '' when it would draw (the manager's
        buffer's answer); ``timeout`` asks again until it is '' and raises ``SampleTimeoutError`` after it."""
        timeout = check_wait_timeout(timeout)
        if self._local is not None:
            return self._local.why_not_sample(size, cur_learner_iter, timeout)
        if timeout is None:
            return self._request('why_not_sample', size=size, cur_learner_iter=cur_learner_iter)
        return self._poll(
            'why_not_sample', size, timeout, lambda why: None if why else why, cur_learner_iter=cur_learner_iter
        )

    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        if self._local is not None:
            return self._local.update(info)
        if isinstance(info, dict):  # numpy text arrays, and object arrays of ids (list storage's), travel as lists
            kinds = {k: v.dtype.kind for k, v in info.items() if isinstance(v, np.ndarray)}
            ids = 'replay_unique_id'
            lists = {k: info[k].tolist() for k, c in kinds.items() if c in 'US' or (c == 'O' and k == ids)}
            info = {**info, **lists}
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

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """Restore the manager's buffer from ``state`` (which travels encoded: the manager never shares objects
        with it, so ``deepcopy`` -- DI-engine's argument -- changes nothing here)."""
        check_deepcopy(deepcopy)
        self._request('load_state_dict', state=state)

    def save_data(self, path: str) -> str:
        """Ask the manager to write its buffer to ``path``, relative to the manager's ``distributed.file_root``
        (refused with ``PermissionError`` when the manager sets none, or when the path leaves it). Returns the
        path written on the manager's machine."""
        return self._request('save_data', path=os.fspath(path) if isinstance(path, os.PathLike) else path)

    def load_data(self, path: str, allow_pickle: bool = False, undo: bool = False) -> str:
        """Ask the manager to load ``path`` (relative to its ``distributed.file_root``). Whether a pickled file
        may be loaded is the manager's own ``distributed.allow_pickle``: a request never carries that flag.
        ``undo``: the manager keeps its buffer's state from before the load until ``end_load`` (several managers
        loaded as one: ``ShardedBuffer.load_data``)."""
        if type(undo) is not bool:
            raise TypeError(f"undo must be a bool, got {type(undo).__name__} {undo!r:.40}")
        if type(allow_pickle) is not bool:  # 'False' from a config file is not False (as on a local buffer)
            raise TypeError(f"allow_pickle must be a bool, got {type(allow_pickle).__name__} {allow_pickle!r:.40}")
        if allow_pickle and not self._dcfg.allow_pickle:
            raise ValueError(
                "load_data(allow_pickle=True) on a remote buffer: unpickling runs code on the manager, "
                "so it is allowed only by the manager's own config (distributed.allow_pickle=True), "
                "never by a request"
            )
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        return self._request('load_data', path=path, **({'undo': True} if undo else {}))

    def end_load(self, restore: bool) -> bool:
        """End a ``load_data(undo=True)``: ``restore`` puts the manager's buffer back as it was before that load.
        False when the manager kept no state for this worker."""
        if type(restore) is not bool:
            raise TypeError(f"restore must be a bool, got {type(restore).__name__} {restore!r:.40}")
        return bool(self._request('end_load', restore=restore))

    def set_model_version(self, version: int, session_id: Optional[str] = None) -> None:
        """Stamp later pushes with the model version (and session) that produced them."""
        version, session_id = check_stamp(version, session_id, required=True)
        self.pushes.model_version, self.pushes.session_id = version, session_id

    def update_model_version(self, version: int, session_id: Optional[str] = None) -> Dict[str, Any]:
        """Learner: move the manager to ``version`` (a new session clears data of the old one when gating); once the
        manager took it, this worker's later pushes carry it too (a refused or failed call changes neither)."""
        version, session_id = check_stamp(version, session_id, required=True)
        out = self._request('model_version', version=version, session_id=session_id)
        self.pushes.model_version, self.pushes.session_id = version, session_id
        return out

    def put_blob(self, name: str, version: int, payload: Any) -> Dict[str, Any]:
        """Keep ``payload`` on the manager as version ``version`` of ``name`` (e.g. the learner's weights), unless
        it already keeps a version >= ``version``. Returns ``{'stored', 'version'}``; see ``blobs``."""
        return self._request('put_blob', name=check_name(name), version=check_version(version), payload=payload)

    def get_blob(self, name: str, newer_than: int = -1) -> Optional[Dict[str, Any]]:
        """``{'version', 'payload'}`` of the manager's blob ``name`` when its version is above ``newer_than``,
        else None (one round trip; the payload travels only when it is newer)."""
        return self._request('get_blob', name=check_name(name), newer_than=check_version(newer_than, 'newer_than', -1))

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
        pushes still in doubt are then lost with this worker); the buffer's refusal of a last push (pending, or an
        async one's), and ``ValueError`` when it refused rows of the last pushes through shared memory, after
        closing: EXIT was sent, which no later push could report."""
        if self._closed:
            return
        deadline = deadline_in(self._dcfg.timeout if timeout is None else timeout)
        left = lambda: max(deadline - time.monotonic(), 0.0)  # noqa: E731
        refused = owed = None
        try:
            for send in (lambda: self.pushes.send_owed(-1, deadline), lambda: self.drain_pending_score(left())):
                try:  # (drain: nothing when no async push is outstanding)
                    send()
                except ManagerUnavailableError:
                    raise
                except Exception as e:  # the buffer refused a last push: said once EXIT is sent (the worker exited)
                    owed = owed or e
            stop = getattr(self._channel, 'stop_heartbeat', None)
            if stop is not None:
                stop()
            self._request('exit', timeout=left())
        finally:
            self._closed = True
            if self.rings is not None:  # EXIT committed the rings: what the buffer refused of them is known now
                refused = self.rings.close()
            self._channel.close(left())
            if self._local is not None:
                self._local.close()
        if owed is not None:
            raise owed
        if refused is not None:
            raise refused

    def __repr__(self) -> str:
        return f"RemoteBuffer(type={self._cfg.get('type')!r}, {self._channel.where}, backend={self._dcfg.backend!r})"

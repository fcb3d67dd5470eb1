"""``PushPipeline``: a worker's pushes on their way to the manager, delivered once (``RemoteBuffer`` holds one).

Stages, as in torchgfn's worker: pushes accumulate until every ``remote_buffer_freq``-th one; the merged batch
keeps only the scoring fields (``scoring_only``), loses the rows below the manager's last
``baseline_log_reward`` (``baseline_filtering``, sent whole after ``baseline_refresh_after`` empty sends), and
goes out as one push request. With ``async_score`` the request is not waited for: its reply is collected
before the next one goes out, or by ``drain``. Every reply's score becomes ``last_score``.

Bookkeeping of the delivery guarantee: each request carries this client's id and the next sequence number. A
request that raised ``ManagerUnavailableError`` stays in ``unacked`` and is resent with its own sequence
number before anything else is sent; the content digest of the push call that raised is remembered, so that
the caller's retry of that call sends what is owed instead of adding the data a second time.
"""

import copy
import hashlib
import logging
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..base import IBuffer
from ..errors import FramesOutOfStepError, ManagerUnavailableError
from .batching import concat_batches, count_items, filter_items, log_rewards_of, select_fields
from .channel import deadline_in
from .codec import encode
from .frames_wire import FramesWireEncoder
from .protocol import request_msg, result_of


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


def not_taken(e: ManagerUnavailableError) -> ManagerUnavailableError:
    """The error of a push that took none of its data: what it owed (a push in doubt, pending items) went first
    and failed -- unlike a push kept in doubt, it must be pushed again."""
    return type(e)(
        f"{e}; what earlier pushes owed went first and failed: this push's own data was not taken, push it again"
    )


class PushPipeline:
    """
    Overview:
        The push half of a ``RemoteBuffer``, sending over the buffer's channel (which it does not own: the
        buffer closes it). It holds nothing of the buffer itself, so a dropped buffer is freed at once and its
        channel's heartbeat stops. Readable state: ``last_score``, ``baseline_log_reward``, ``filter_stats``,
        ``resent_pushes``, ``unacknowledged``; ``model_version`` / ``session_id`` stamp the requests.
    """

    def __init__(
        self,
        dcfg: Any,
        channel: Any,
        local: Optional[IBuffer] = None,
        dict_is_batch: bool = False,
        scoring_keys: Optional[List[str]] = None,
        log_reward_key: str = 'log_reward',
        frames: Optional[FramesWireEncoder] = None,
    ) -> None:
        self._dcfg = dcfg
        self.frames = frames  # storage.frames: steps travel as their new frames (frames_wire)
        self._channel = channel
        self._local = local
        self.dict_is_batch = dict_is_batch
        self._scoring_keys = scoring_keys
        self._log_reward_key = log_reward_key
        self._pending: List[Any] = []
        self._pending_batched: Optional[bool] = None
        self._pending_stamp: Tuple[Optional[int], Any] = (None, None)  # the model version and session they were made by
        self._push_calls = 0
        self.client = uuid.uuid4().hex
        self._seq = 0
        self._unacked: List[Dict[str, Any]] = []  # push args in doubt, resent (same seq) before anything else
        self._retry_of: Optional[bytes] = None  # digest of the data of the push call that raised
        self.inflight: Optional[Any] = None  # async_score: (ticket, args) of the unanswered push
        self.last_score: Optional[Dict[str, Any]] = None
        self.baseline_log_reward = -np.inf
        self.model_version: Optional[int] = None
        self.session_id: Optional[str] = None
        self._consecutive_empty = 0
        self.filter_stats = dict(total=0, kept=0, skipped_sends=0, sends=0)
        self.resent_pushes = 0  # pushes in doubt sent again

    def push(self, data: Any, envstep: int, batched: bool, whole: Any = None) -> int:
        """Take ``data`` (sending what is owed first, and the accumulated batch on every ``remote_buffer_freq``-th
        call); returns how many items it holds. A repeat of the call that raised is its retry: nothing is added.
        ``whole``: the caller's push when ``data`` is only its rest (the rows a shared-memory ring did not take);
        its retry is a repeat of ``whole``."""
        if data is None:
            raise TypeError("cannot push None")
        batched = bool(batched) or (self.dict_is_batch and isinstance(data, dict))
        n = count_items(data, batched)
        deadline = deadline_in(self._dcfg.timeout)  # one bound for everything this call sends and waits for
        if self.is_retry(data, batched):
            # the caller's retry of the call that raised: its data is kept already (in doubt or pending), so send
            # what is owed and add nothing; if that fails too, the next call is still its retry
            self.send_owed(envstep, deadline)
            self._retry_of = None
            return n
        self._retry_of = None
        try:  # what is owed first; raising, this call takes none of its data (the caller pushes it again)
            self._resend_unacked(deadline)
            if self._pending and (self._pending_batched != batched or self._pending_stamp != self.stamp):
                self._flush(envstep, deadline)  # a batch and single items cannot be merged, nor another model's
        except ManagerUnavailableError as e:
            raise not_taken(e) from e
        sends = (self._push_calls + 1) % self._dcfg.remote_buffer_freq == 0
        # a push that waits for a later call keeps what the data hold now, as a local push stores it (a collector
        # refills its arrays for the next step); one sent now is encoded now
        kept = data if sends else copy.deepcopy(data)
        if self._local is not None:
            self._local.push(data, envstep, batched=batched)
        self._push_calls += 1
        if not self._pending:
            self._pending_stamp = self.stamp
        self._pending.append(kept)
        self._pending_batched = batched
        if not sends:
            return n
        try:
            self._flush(envstep, deadline)
        except ManagerUnavailableError:  # this call's data is kept (in doubt): a push of it again is a retry
            self._retry_of = _digest(data if whole is None else whole, batched, self._dcfg.allow_pickle)
            raise
        return n

    def is_retry(self, data: Any, batched: bool) -> bool:
        """Whether a push of ``data`` repeats the call that raised ``ManagerUnavailableError`` (its retry)."""
        batched = bool(batched) or (self.dict_is_batch and isinstance(data, dict))
        return self._retry_of is not None and self._retry_of == _digest(data, batched, self._dcfg.allow_pickle)

    @property
    def stamp(self) -> Tuple[Optional[int], Any]:
        """The model version and session this worker's pushes are made by now (``set_model_version``)."""
        return self.model_version, self.session_id

    @property
    def unacknowledged(self) -> int:
        """Pushes not acknowledged yet: those in doubt (a call raised ``ManagerUnavailableError``; they are sent
        again by the next call) plus, with ``async_score``, the last push whose score is not collected yet."""
        return len(self._unacked) + (self.inflight is not None)

    def _submit(self, args: Dict[str, Any], deadline: float) -> Any:
        """Send one push request without waiting; returns the channel's ticket for its reply."""
        sent = {k: v for k, v in args.items() if k != 'raw'} if 'raw' in args else args  # 'raw': see _encode
        return self._channel.submit(request_msg('push', self._dcfg.shard, sent), deadline)

    def _result(self, ticket: Any, deadline: float, args: Dict[str, Any]) -> Dict[str, Any]:
        """The manager's answer to the push request ``args`` sent with ``ticket`` (its error raised as its own
        type). A push whose steps travelled as new frames on top of a push the manager does not hold is sent again
        as it was pushed (same sequence number); any other refusal starts the frames chain anew."""
        try:
            return result_of(self._channel.result(ticket, 'push', deadline), 'push')
        except FramesOutOfStepError:
            if self.frames is None or 'raw' not in args:
                raise
            # sent again as it was pushed (same sequence number: the refused one stored nothing); the next push
            # starts a new chain
            self.frames.reset()
            self.frames.stats['resent_full'] += 1
            args['data'] = args['raw']
            args.pop('frames', None)
            return result_of(self._channel.result(self._submit(args, deadline), 'push', deadline), 'push')
        except ManagerUnavailableError:
            raise  # in doubt: sent again as it is
        except Exception:
            if self.frames is not None:
                self.frames.reset()
            raise

    def _encode(self, args: Dict[str, Any]) -> None:
        """With ``frames_wire``: the push's steps as new frames where the manager holds the rest."""
        if self.frames is None:
            return
        if 'raw' not in args:
            # an async push may have to go again in full after the caller's next push: keep what it was, since the
            # caller may write its next step into the same arrays
            args['raw'] = copy.deepcopy(args['data']) if self._dcfg.async_score else args['data']
        raw = args['raw']
        args['data'], meta = self.frames.encode(raw, args['batched'], args['seq'])
        if meta is None:
            args.pop('frames', None)
        else:
            args['frames'] = meta

    def send_owed(self, envstep: int, deadline: float) -> None:
        """Send the pushes in doubt, then what is pending."""
        self._resend_unacked(deadline)
        self._flush(envstep, deadline)

    def _settle_inflight(self, deadline: float) -> None:
        """With ``frames_wire``: the unanswered async push is answered before anything else is sent, so a push that
        must go again in full (``FramesOutOfStepError``) does so before any later one, in order."""
        if self.frames is not None and self.inflight is not None:
            previous, self.inflight = self.inflight, None
            self._take_score(self._collect(previous, deadline))

    def _resend_unacked(self, deadline: float) -> None:
        self._settle_inflight(deadline)
        while self._unacked:
            args = self._unacked[0]
            self.resent_pushes += 1
            result = self._result(self._submit(args, deadline), deadline, args)  # raises: it stays in doubt
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
            raise TypeError(
                f"cannot merge pending pushes of type {type(pending[0]).__name__}; use remote_buffer_freq=1"
            )
        merged = pending[0]
        for p in pending[1:]:
            merged.extend(p)
        return merged, True

    def _flush(self, envstep: int, deadline: float) -> None:
        if not self._pending:
            return
        self._settle_inflight(deadline)
        parts, batched = self._pending, self._pending_batched
        try:
            data, batched = self._merged()
        except Exception:  # pushes that cannot be merged go one by one
            if len(parts) < 2:
                raise
            return self._one_by_one(parts, batched, envstep, deadline)
        try:
            self._send(data, batched, envstep, deadline)
        except ManagerUnavailableError:
            raise
        except Exception as e:  # refused as a whole (nothing stored): the good pushes must not go with the bad one
            if len(parts) < 2 or getattr(e, 'stored', False) or self._dcfg.async_score:
                raise
            self._one_by_one(parts, batched, envstep, deadline)

    def _one_by_one(self, parts: List[Any], batched: Any, envstep: int, deadline: float) -> None:
        """Pending pushes (``remote_buffer_freq``) that could not be merged, or that the manager refused together,
        sent again one by one: the good ones are stored, and the refusals raised after, naming the first."""
        refused = []
        for i, part in enumerate(parts):
            try:
                self._send(part, batched, envstep, deadline)
            except ManagerUnavailableError:  # this one is in doubt (sent again later), the rest still pending
                self._pending, self._pending_batched = list(parts[i + 1 :]), batched if i + 1 < len(parts) else None
                for k, e in refused:  # (the manager's unavailability is what the caller hears of)
                    logging.getLogger(__name__).warning("pending push %d of %d refused: %s", k + 1, len(parts), e)
                raise
            except Exception as e:
                refused.append((i, e))
        if refused:
            i, e = refused[0]
            rest = 'the others stored' if len(refused) < len(parts) else 'none stored'
            note = f" (pending push {i + 1} of {len(parts)}; {len(refused)} refused, {rest})"
            try:
                error = type(e)(str(e) + note)
            except Exception:  # an exception type that takes no message
                raise e from None
            raise error from e

    def _send(self, data: Any, batched: Any, envstep: int, deadline: float) -> None:
        """One push request of ``data`` (answered now, or with ``async_score`` by the next push)."""
        if self._dcfg.scoring_only and self._scoring_keys:
            data = select_fields(data, self._scoring_keys)
        data = self._baseline_filter(data)
        if data is None:
            return
        args = dict(
            data=data,
            batched=batched,
            envstep=envstep,
            model_version=self._pending_stamp[0],
            session_id=self._pending_stamp[1],
            client=self.client,
            seq=self._seq,
        )
        self._seq += 1
        self._encode(args)
        self.filter_stats['sends'] += 1
        try:
            ticket = self._submit(args, deadline)
            if not self._dcfg.async_score:
                result = self._result(ticket, deadline, args)
        except ManagerUnavailableError:
            self._unacked.append(args)
            raise
        if not self._dcfg.async_score:
            self._take_score(result)
            return
        previous, self.inflight = self.inflight, (ticket, args)
        if previous is not None:
            self._take_score(self._collect(previous, deadline))

    def _collect(self, inflight: Any, deadline: float) -> Dict[str, Any]:
        ticket, args = inflight
        try:
            return self._result(ticket, deadline, args)
        except ManagerUnavailableError:
            self._unacked.append(args)
            self._unacked.sort(key=lambda a: a['seq'])  # resent in the order they were first sent
            raise

    def _baseline_filter(self, data: Any) -> Any:
        if not self._dcfg.baseline_filtering or not np.isfinite(self.baseline_log_reward):
            return data
        lr = log_rewards_of(data, self._log_reward_key)
        if lr is None:
            return data
        mask = ~(lr < self.baseline_log_reward)  # (NaN rows go on: the manager's buffer refuses them by name)
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

    def drain(self, timeout: float) -> Optional[Dict[str, Any]]:
        """Collect the score of the unanswered async push within ``timeout`` seconds (None: nothing was
        outstanding); if it does not come, that push is in doubt."""
        if self.inflight is None:
            return None
        inflight, self.inflight = self.inflight, None
        self._take_score(self._collect(inflight, deadline_in(timeout)))
        return self.last_score

"""``PeerChannel``: a worker's requests to the manager over a ``ThreadedTransport`` (torch / MPI), each bounded
by a deadline, with the heartbeat that keeps the worker counted as alive."""

import threading
import time
import weakref
from typing import Any, Dict, Optional

from ..errors import CodecError, ManagerTimeoutError, ManagerUnavailableError, SendTimeout, TransportError
from .frame_reader import BYE, ERROR, LOST

MAX_EARLY = 64  # replies kept for requests other than the one awaited


def deadline_in(timeout: float) -> float:
    """The ``time.monotonic()`` value ``timeout`` seconds from now."""
    return time.monotonic() + timeout


def heartbeat_loop(channel_ref: 'weakref.ref', stop: threading.Event, every: float) -> None:
    """Call ``channel._beat()`` every ``every`` seconds while the channel lives (a ``False`` return or an error
    ends it). It holds only a weak reference, so a RemoteBuffer dropped without ``close()`` stops beating and
    the manager counts it lost after ``peer_timeout``. Shared by the torch / MPI and Ray channels."""
    while not stop.wait(every):
        channel = channel_ref()
        if channel is None:
            return
        try:
            if not channel._beat():
                return
        except Exception:  # the transport or Ray went away: stop beating
            return
        finally:
            del channel


def start_heartbeat(channel: Any, stop: threading.Event, every: float, name: str) -> threading.Thread:
    """A daemon thread running ``heartbeat_loop`` for ``channel`` (held weakly) until ``stop`` is set."""
    thread = threading.Thread(target=heartbeat_loop, args=(weakref.ref(channel), stop, every), daemon=True, name=name)
    thread.start()
    return thread


class PeerChannel:
    """Requests to the manager over a ``ThreadedTransport`` (torch / MPI). Replies arrive in request order."""

    def __init__(self, transport: Any, manager_rank: int, timeout: float, heartbeat: float) -> None:
        self.transport = transport
        self.manager = manager_rank
        self.timeout = timeout
        self.where = f"manager rank {manager_rank}"
        self._next = 0
        self._early: Dict[int, Dict[str, Any]] = {}  # replies that arrived while another request was awaited
        self._outstanding: set = set()  # submitted, not yet collected nor given up on
        self._dead: Optional[str] = None
        self._stop = threading.Event()
        self._beat_lock = threading.Lock()
        transport.start()
        self._beat_thread = start_heartbeat(self, self._stop, heartbeat, 'ding_buffer-heartbeat')

    def _beat(self) -> bool:
        """One ping, only when nothing else waits to leave (a ping never queues behind a stuck frame)."""
        with self._beat_lock:  # never a ping after stop_heartbeat(): nobody would receive it after EXIT
            if self._stop.is_set():
                return False
            try:
                self.transport.send(self.manager, {'op': 'ping'}, wait=False, limit=1)
            except SendTimeout:
                pass
            return True

    def stop_heartbeat(self) -> None:
        with self._beat_lock:
            self._stop.set()

    def submit(self, request: Dict[str, Any], deadline: Optional[float] = None) -> int:
        """Send ``request``; returns its id once it left. Raises ``ManagerUnavailableError`` when it could not
        leave before ``deadline`` (a frame already queued is still delivered later: the request is in doubt)."""
        if self._dead:
            raise ManagerUnavailableError(self._dead)
        deadline = deadline_in(self.timeout) if deadline is None else deadline
        rid = self._next
        self._next += 1
        request['id'] = rid
        self._outstanding.add(rid)  # (if the send times out it may still arrive: result() gives it up)
        try:
            self.transport.send(self.manager, request, msg_id=rid, deadline=deadline, wait=True, limit=1)
        except SendTimeout as e:
            raise ManagerTimeoutError(
                f"{self.where} did not take {request.get('op')!r} within "
                f"{self.timeout}s (distributed.timeout); it may be frozen, dead or "
                f"overloaded: {e}"
            ) from e
        except TransportError as e:
            self._dead = (
                f"{self.where} has shut down (it said goodbye)"
                if self.transport.goodbye_received(self.manager)
                else f"{self.where} is unreachable: {e}"
            )
            raise ManagerUnavailableError(self._dead) from e
        return rid

    def result(self, rid: int, op: str, deadline: Optional[float] = None) -> Dict[str, Any]:
        """The reply to request ``rid``. Replies to other outstanding requests that arrive meanwhile are kept for
        their own ``result`` call (an async push in flight; at most ``MAX_EARLY``); replies to requests given up
        on are dropped."""
        deadline = deadline_in(self.timeout) if deadline is None else deadline
        try:
            return self._early.pop(rid) if rid in self._early else self._await(rid, op, deadline)
        finally:
            self._outstanding.discard(rid)  # answered, or given up on: a late reply is dropped

    def _await(self, rid: int, op: str, deadline: float) -> Dict[str, Any]:
        while True:
            if self._dead:
                raise ManagerUnavailableError(self._dead)
            left = deadline - time.monotonic()
            item = self.transport.recv(timeout=left) if left > 0 else None
            if item is None:
                raise ManagerTimeoutError(
                    f"{self.where} did not answer {op!r} within {self.timeout}s (distributed.timeout); it may "
                    f"have died or be frozen or overloaded"
                )
            _, kind, obj = item
            if kind == LOST:
                self._dead = f"{self.where} is gone (connection lost: {obj})"
                raise ManagerUnavailableError(self._dead)
            if kind == BYE:
                self._dead = f"{self.where} has shut down (it said goodbye)"
                raise ManagerUnavailableError(self._dead)
            if kind == ERROR:
                if obj[0] in (rid, None):  # this reply could not be read (too large, undecodable)
                    raise CodecError(f"the reply of {self.where} to {op!r} could not be read: {obj[1]}")
                continue
            if isinstance(obj, dict) and (obj.get('id') == rid or (obj.get('id') is None and obj.get('ok') is False)):
                return obj  # an id-less error answers the oldest unanswered request: this one (replies are in order)
            other = obj.get('id') if isinstance(obj, dict) else None
            if other in self._outstanding:
                self._early[other] = obj  # another outstanding request's reply (an async push in flight)
                while len(self._early) > MAX_EARLY:
                    self._early.pop(min(self._early))

    def close(self, grace: Optional[float] = None) -> None:
        self.stop_heartbeat()
        # final: the channel is not used again; the goodbye gets this one grace, at exit too
        self.transport.close(self.timeout if grace is None else grace, final=True)

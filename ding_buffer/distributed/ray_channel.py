"""``RayChannel``: a worker's requests to the manager actor (``ray_backend``), and the Ray wire format both sides use.

A message travels as the codec's ``(header, parts)``: the header bytes plus one uint8 ndarray per tensor
(``to_wire`` / ``from_wire``), which Ray moves through its object store without pickling the data. A ticket is the
ObjectRef of the actor's ``call``. Every channel pings the actor every ``heartbeat_seconds`` from a daemon thread
that holds only a weak reference to it, on the actor's ``BEAT_GROUP`` lane, so a worker that dies, or a task that
returns without ``close()``, stops beating. The first ping carries a token, an object the worker's process owns:
Ray reports its owner dead once that process died, which the manager asks about a silent worker. A channel
garbage-collected without ``close()`` tells the manager so on its way out.
"""

import threading
import time
import weakref
from typing import Any, Dict, Optional

import numpy as np

from ..errors import CodecError, ManagerTimeoutError, ManagerUnavailableError
from .channel import start_heartbeat
from .codec import decode, encode

BEAT_GROUP = 'beat'  # the actor's concurrency group for pings and readiness checks


def import_ray():
    """The ``ray`` module (an ``ImportError`` naming the extra when it is not installed)."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("distributed.backend='ray' needs ray (pip install 'ding_buffer[ray]')") from e
    return ray


def to_wire(obj: Any, allow_pickle: bool):
    """``obj`` encoded as a Ray message: the header as a uint8 array, then the parts."""
    header, parts = encode(obj, allow_pickle)
    return [np.frombuffer(header, dtype=np.uint8)] + list(parts)


def from_wire(msg, allow_pickle: bool) -> Any:
    """The object a ``to_wire`` message carries; ``CodecError`` when ``msg`` is not one."""
    if not isinstance(msg, (list, tuple)) or not msg:
        raise CodecError(f"a message must be a non-empty list of byte arrays, got {type(msg).__name__}")
    return decode(bytes(msg[0]), msg[1:], allow_pickle)


def worker_key(ray: Any) -> Optional[str]:
    """Who this client works for, as ``num_workers`` counts workers: inside a Ray task, the task (its id survives
    retries: a retried task is the same worker, and its RemoteBuffers count once); anywhere else (a driver, an
    actor) None: each RemoteBuffer is a worker of its own."""
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id():
        return None
    if getattr(getattr(ctx, 'worker', None), 'mode', None) == getattr(ray, 'WORKER_MODE', 1):
        task = ctx.get_task_id()
        if task:
            return f'task:{task}'
    return None


def _dropped(stop: threading.Event, closed: threading.Event, actor: Any, client: str) -> None:
    """A channel was garbage-collected (or the process exits) without ``close()``: stop its heartbeat and tell the
    manager (one fire-and-forget call on the beat lane), which counts the worker lost now rather than after
    ``peer_timeout``."""
    stop.set()
    if closed.is_set():
        return
    try:
        ray = import_ray()
        if ray.is_initialized():
            actor.dropped.options(concurrency_group=BEAT_GROUP).remote(client)
    except Exception:  # noqa: BLE001 - Ray or the actor is gone already: the heartbeat's silence says the same
        pass


class RayChannel:
    """Requests to the manager actor; a ticket is the ObjectRef of the call."""

    def __init__(self, actor: Any, dcfg: Any, client_id: str) -> None:
        self.actor = actor
        self.timeout = dcfg.timeout
        self.allow_pickle = bool(dcfg.allow_pickle)
        self.client = client_id
        self.where = f"manager actor {dcfg.namespace}/{dcfg.actor_name}"
        self._next = 0
        self._shutdown = False
        self._dead: Optional[str] = None
        self._ping_ref: Any = None
        self._stop = threading.Event()
        self._beat_lock = threading.Lock()
        self._closed = threading.Event()
        # a dropped channel stops its heartbeat thread and, unless it was closed, tells the manager at once
        self._finalizer = weakref.finalize(self, _dropped, self._stop, self._closed, actor, client_id)
        try:  # the manager knows this worker from now on, even if it dies before its first request; the token,
            # an object this process owns, lets the manager ask Ray whether the process still lives
            ray = import_ray()
            self._beat(token=[ray.put(client_id)], worker=worker_key(ray))
        except Exception:  # noqa: BLE001 - an unreachable manager fails the first request instead
            pass
        self._beat_thread = start_heartbeat(self, self._stop, dcfg.heartbeat_seconds, 'ding_buffer-ray-heartbeat')

    def _beat(self, token: Optional[list] = None, worker: Optional[str] = None) -> bool:
        """One fire-and-forget ping (skipped while the previous one is unanswered); False: stop beating. The first
        carries ``token`` (``[ObjectRef]`` of an object this process owns) and ``worker`` (``worker_key``)."""
        ray = import_ray()
        with self._beat_lock:  # never a ping after stop_heartbeat(): nobody would receive it after EXIT
            if self._stop.is_set() or self._dead or not ray.is_initialized():  # no ray call may auto-start Ray
                return False
            prev = self._ping_ref
            if prev is not None:
                ready, _ = ray.wait([prev], timeout=0)
                if not ready:
                    return True  # the beat lane is busy: one ping waits at most
                self._ping_ref = None
                try:
                    ray.get(prev, timeout=0)
                except ray.exceptions.RayActorError:
                    return False  # the manager is gone
                except ray.exceptions.RayError:
                    pass
            args = (self.client,) if token is None else (self.client, token, worker)
            self._ping_ref = self.actor.ping.options(concurrency_group=BEAT_GROUP).remote(*args)
            return True

    def stop_heartbeat(self) -> None:
        with self._beat_lock:
            self._stop.set()

    def _unavailable(self, why: str, dead: bool = False) -> ManagerUnavailableError:
        if dead:
            self._dead = why
            self._stop.set()
        return ManagerUnavailableError(why)

    def submit(self, request: Dict[str, Any], deadline: Optional[float] = None):
        """Hand ``request`` to Ray (it does not wait for the actor); returns the ObjectRef of its reply."""
        ray = import_ray()
        if self._dead:
            raise ManagerUnavailableError(self._dead)
        if not ray.is_initialized():
            raise self._unavailable(
                f"{self.where} is unreachable: Ray is not initialised in this process (shut down?)", dead=True
            )
        request['id'] = self._next
        self._next += 1
        wire = to_wire(request, self.allow_pickle)  # TypeError (no pickle) before anything is sent
        try:
            return self.actor.call.remote(self.client, *wire)
        except ray.exceptions.RayError as e:
            raise self._unavailable(f"{self.where} is unreachable: {type(e).__name__}: {e}") from e

    def result(self, ref: Any, op: str, deadline: Optional[float] = None) -> Dict[str, Any]:
        """The reply to ``ref``; ``ManagerUnavailableError`` when it does not arrive before ``deadline``."""
        ray = import_ray()
        if self._dead:
            raise ManagerUnavailableError(self._dead)
        if not ray.is_initialized():
            raise self._unavailable(f"{self.where} is unreachable: Ray is not initialised in this process", dead=True)
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        try:
            msg = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0))
        except ray.exceptions.GetTimeoutError as e:
            raise ManagerTimeoutError(
                f"{self.where} did not answer {op!r} within {self.timeout}s "
                f"(distributed.timeout); it may be overloaded, frozen or gone"
            ) from e
        except ray.exceptions.RayActorError as e:  # ActorDiedError and friends derive from it
            raise self._unavailable(f"{self.where} is gone: {type(e).__name__}", dead=True) from e
        except ray.exceptions.RayError as e:  # the object was lost, the task failed in Ray itself
            raise ManagerUnavailableError(f"{self.where} did not answer {op!r}: {type(e).__name__}: {e}") from e
        reply = from_wire(msg, self.allow_pickle)
        if not isinstance(reply, dict):
            raise CodecError(f"the reply of {self.where} to {op!r} is a {type(reply).__name__}, not a reply")
        if reply.get('shutdown'):
            self._shutdown = True
        if reply.get('ok') is False and reply.get('error') == 'ManagerUnavailableError':
            raise self._unavailable(f"{self.where}: {reply.get('message')}", dead=True)
        return reply

    def close(self, grace: Optional[float] = None) -> None:
        """Stop the heartbeat; the worker whose EXIT was the last one ends the actor."""
        self._closed.set()
        self.stop_heartbeat()
        if self._shutdown:
            ray = import_ray()
            if ray.is_initialized():
                try:
                    ray.kill(self.actor, no_restart=True)
                except Exception:  # noqa: BLE001 - it ended already
                    pass

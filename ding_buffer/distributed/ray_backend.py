"""Ray backend: the manager is a named actor (get-or-create); any driver, task or actor can be a worker.

Requests travel as the codec's ``(header, parts)``: the header bytes plus one uint8 ndarray per tensor, which
Ray moves through its object store without pickling the data. The actor serves one call at a time
(``max_concurrency=1``), so ``ManagerCore`` needs no lock; it never blocks (sampling with a timeout waits on
the worker side).
"""
import time
from typing import Any, Dict, Optional

import numpy as np

from .codec import decode, encode
from .manager import ManagerCore, error_reply

_ACTOR = None


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError("distributed.backend='ray' needs ray (pip install 'ding_buffer[ray]')") from e
    return ray


def _wire(obj: Any, allow_pickle: bool):
    header, parts = encode(obj, allow_pickle)
    return [np.frombuffer(header, dtype=np.uint8)] + list(parts)


def _unwire(msg, allow_pickle: bool) -> Any:
    return decode(bytes(msg[0]), msg[1:], allow_pickle)


class _ManagerActorImpl:
    """Body of the Ray actor: builds the buffer from the config and serves ``call``."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        from . import build_manager_buffer
        buffer, dcfg, key = build_manager_buffer(cfg)
        self.core = ManagerCore(buffer, dcfg, key)
        self.allow_pickle = bool(dcfg.allow_pickle)
        self.num_workers = dcfg.num_workers
        self.started = time.time()

    def call(self, client: str, *msg) -> list:
        try:
            request = _unwire(msg, self.allow_pickle)
        except Exception as e:
            return _wire(error_reply(None, e), False)
        reply = self.core.handle(client, request)
        if reply is None:
            return []
        if request.get('op') == 'exit' and self.num_workers is not None and len(self.core.exited) >= self.num_workers:
            try:
                self.core.shutdown()
            except Exception as e:  # the EXIT is acknowledged either way; the error goes back to the worker
                return _wire(error_reply(reply.get('id'), e), False)
            reply['shutdown'] = True  # the worker that sent the last EXIT kills the actor
        try:
            return _wire(reply, self.allow_pickle)
        except TypeError as e:
            return _wire(error_reply(reply.get('id'), e), False)

    def summary(self) -> Dict[str, Any]:
        return self.core.summary()


def actor_class():
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = _ray().remote(_ManagerActorImpl)
    return _ACTOR


def get_or_create_actor(cfg: Dict[str, Any], dcfg: Any):
    """Connect to (or start) Ray and return the manager actor named ``actor_name`` in ``namespace``."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=dcfg.ray_address, namespace=dcfg.namespace, log_to_driver=False)
    opts = dict(name=dcfg.actor_name, namespace=dcfg.namespace, get_if_exists=True, max_concurrency=1,
                max_restarts=0)
    if dcfg.detached:
        opts['lifetime'] = 'detached'
    return actor_class().options(**opts).remote(cfg)


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

    def submit(self, request: Dict[str, Any]):
        request['id'] = self._next
        self._next += 1
        return self.actor.call.remote(self.client, *_wire(request, self.allow_pickle))

    def result(self, ref: Any, op: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        from .remote import ManagerUnavailableError
        ray = _ray()
        timeout = self.timeout if timeout is None else timeout
        try:
            msg = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise ManagerUnavailableError(f"{self.where} did not answer {op!r} within {timeout}s "
                                          f"(distributed.timeout); it may be overloaded") from e
        except ray.exceptions.RayActorError as e:  # ActorDiedError and friends derive from it
            raise ManagerUnavailableError(f"{self.where} is gone: {type(e).__name__}") from e
        reply = _unwire(msg, self.allow_pickle)
        if reply.get('shutdown'):
            self._shutdown = True
        return reply

    def close(self) -> None:
        if self._shutdown:
            ray = _ray()
            ray.kill(self.actor, no_restart=True)

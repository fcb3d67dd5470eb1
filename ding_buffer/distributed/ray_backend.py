"""Ray backend: the manager is a named actor (get-or-create); any driver, task or actor can be a worker, whose
requests go through a ``ray_channel.RayChannel``.

Requests travel in ``ray_channel``'s wire format: the codec's header bytes plus one uint8 ndarray per tensor, which
Ray moves through its object store without pickling the data. The actor serves requests one at a time
(``call``, ``max_concurrency=1``); it never blocks (sampling with a timeout waits on the worker side). A message
larger than ``distributed.max_message_mb`` or one that is not a request is answered with an error reply.

Liveness. Every ``RayChannel`` pings the actor every ``heartbeat_seconds`` from a daemon thread that holds only
a weak reference to it, so a worker that dies, or a task that returns without ``close()`` (its RemoteBuffer is
dropped), stops beating. Pings run on the actor's own ``'beat'`` lane (a second concurrency group), so a busy
manager still hears them; a watchdog thread in the actor folds them into ``ManagerCore`` and counts senders
silent for ``peer_timeout`` seconds as lost, under the lock ``call`` holds. Sooner where Ray can tell: a channel's
first ping carries a token its process owns, and a sender silent for two heartbeats whose token's owner Ray
reports dead (the process died: SIGKILL, OOM, a lost node) is lost at once; a channel garbage-collected without
``close()`` (a task returned without closing its RemoteBuffer) says so on its way out and is lost at once too.
With ``num_workers`` set, once that many workers (``workers_done``) exited or were lost the actor checkpoints
(``checkpoint_path``) and ends itself; when the last one left with EXIT, that worker ends it (``close()``), and the
watchdog does after ``timeout`` seconds if it does not.

Start-up is bounded by ``distributed.startup_timeout``: an explicit ``host:port`` address must accept a TCP
connection and ``ray.init`` must finish within it, and the actor must answer a readiness check within it (a cluster
without a free CPU to place it fails with ``TimeoutError`` instead of waiting forever).
"""

import logging
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..errors import CodecError, ManagerUnavailableError
from .codec import decode, peek_id
from .config import startup_seconds
from .manager import ManagerCore
from .protocol import error_reply
from .ray_channel import BEAT_GROUP, import_ray, to_wire
from .shm_ring import start_commit_thread
from .startup import connect_ray

logger = logging.getLogger('ding_buffer.distributed')

_ACTOR = None
MAX_CLIENT_CHARS = 128
MAX_TOKENS = 100_000  # live clients whose process the manager can ask Ray about


def _message_bytes(msg: Tuple[Any, ...]) -> int:
    """Total bytes of a wire message (header + parts); ``CodecError`` when it is not one."""
    if not msg:
        raise CodecError("empty message: a request is a header and its parts")
    total = 0
    for i, p in enumerate(msg):
        if isinstance(p, np.ndarray):
            total += int(p.nbytes)
        elif isinstance(p, (bytes, bytearray, memoryview)):
            total += memoryview(p).nbytes
        else:
            raise CodecError(f"message piece {i} is a {type(p).__name__}; a request is uint8 arrays or bytes")
    return total


def _is_client(client: Any) -> bool:
    return isinstance(client, str) and 0 < len(client) <= MAX_CLIENT_CHARS


def _is_token(token: Any) -> bool:
    """``[ObjectRef]``: what a channel's first ping carries (anything else is ignored)."""
    return isinstance(token, list) and len(token) == 1 and isinstance(token[0], import_ray().ObjectRef)


class _ManagerActorImpl:
    """Body of the Ray actor: builds the buffer from the config, serves ``call`` and watches its senders."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        from .local import build_manager_buffer

        buffer, dcfg, key = build_manager_buffer(cfg)
        self.core = ManagerCore(buffer, dcfg, key)
        self.cfg = dcfg
        self.allow_pickle = bool(dcfg.allow_pickle)
        self.num_workers = dcfg.num_workers
        self.max_bytes = int(dcfg.max_message_mb * (1 << 20))
        self._lock = threading.Lock()  # ManagerCore: call (actor thread) and the watchdog
        self._beats: Dict[str, float] = {}  # client -> monotonic time of its last ping (the beat lane)
        self._beats_lock = threading.Lock()
        self._dropped: set = set()  # clients whose channel was garbage-collected without close()
        self._tokens: Dict[str, Any] = {}  # client -> an ObjectRef its process owns (dead owner: dead worker)
        self._probed: Dict[str, float] = {}  # client -> when its token was last asked about
        self._worker_of: Dict[str, str] = {}  # client -> the worker (task / actor / driver) it belongs to
        self._ended = False  # checkpointed: requests are refused from now on
        self._ended_at: Optional[float] = None  # when the last EXIT was answered (the worker ends the actor)
        timeout = dcfg.peer_timeout
        self._every = max(0.05, min(dcfg.heartbeat_seconds, timeout / 4 if timeout is not None else np.inf))
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name='ding_buffer-watchdog')
        self._watchdog.start()
        self._rings = start_commit_thread(self.core, self._lock, lambda: self._ended)

    # ------------------------------------------------------------------ requests (default lane, one at a time)
    def call(self, client: Any, *msg) -> list:
        """One request; always returns a reply message (``[]`` for a ping), never raises."""
        try:
            return self._call(client, msg)
        except Exception as e:  # noqa: BLE001 - a request must never break the actor
            logger.exception("manager actor: request of %r failed unexpectedly", str(client)[:40])
            try:
                return to_wire(error_reply(None, RuntimeError(f"{type(e).__name__}: {e}")), False)
            except Exception:  # noqa: BLE001
                return []

    def _call(self, client: Any, msg: Tuple[Any, ...]) -> list:
        try:
            if not _is_client(client):
                raise CodecError(
                    f"the sender id must be a str of 1..{MAX_CLIENT_CHARS} chars, got {type(client).__name__}"
                )
            size = _message_bytes(msg)
            if size > self.max_bytes:
                raise CodecError(f"message of {size} bytes exceeds distributed.max_message_mb ({self.max_bytes} bytes)")
            request = decode(bytes(msg[0]), msg[1:], self.allow_pickle)
        except Exception as e:  # noqa: BLE001 - refused before decoding, or undecodable: answered
            rid = peek_id(msg[0]) if msg and isinstance(msg[0], (np.ndarray, bytes, bytearray)) else None
            with self._lock:
                if _is_client(client):
                    self.core.liveness.seen(client)
                self.core.counters['errors'] += 1
            return to_wire(error_reply(rid, e if isinstance(e, CodecError) else CodecError(str(e))), False)
        op = request.get('op') if isinstance(request, dict) else None
        with self._lock:
            if self._ended and op != 'ping':
                rid = request.get('id') if isinstance(request, dict) else None
                err = ManagerUnavailableError(
                    "the manager has shut down (every worker exited or was lost) and is ending"
                )
                return to_wire(error_reply(rid, err), False)
            reply = self.core.handle(client, request)
            if reply is None:
                return []
            if op == 'exit' and reply.get('ok') and self._all_done():
                self._ended, self._ended_at = True, time.monotonic()
                try:
                    self.core.shutdown()
                except Exception as e:  # noqa: BLE001 - the EXIT is acknowledged either way; the error goes back
                    logger.exception("manager actor: checkpoint failed")
                    return to_wire(dict(error_reply(reply.get('id'), e), shutdown=True), False)
                reply['shutdown'] = True  # the worker that sent the last EXIT ends the actor
        try:
            return to_wire(reply, self.allow_pickle)
        except TypeError as e:  # a result the codec cannot carry (e.g. arbitrary objects)
            return to_wire(error_reply(reply.get('id'), e), False)

    def summary(self) -> Dict[str, Any]:
        with self._lock:
            self._merge_beats()
            return self.core.summary()

    # ------------------------------------------------------------------ the beat lane (concurrent with call)
    def ping(self, client: Any, token: Any = None, worker: Any = None) -> None:
        """A heartbeat: recorded without waiting for the request in progress. A channel's first ping carries
        ``[ObjectRef]``, an object its process owns (kept once per client, while the client is live), and the
        worker it belongs to (``ray_channel.worker_key``: the clients of one Ray task count once in ``num_workers``)."""
        if _is_client(client):
            now = time.monotonic()
            with self._beats_lock:
                self._beats[client] = now
                if _is_token(token) and client not in self._tokens and len(self._tokens) < MAX_TOKENS:
                    self._tokens[client] = token[0]
                if _is_client(worker) and client not in self._worker_of and len(self._worker_of) < MAX_TOKENS:
                    self._worker_of[client] = worker

    def dropped(self, client: Any) -> None:
        """The client's channel was garbage-collected (or its process exits) without ``close()``: the watchdog
        counts it lost at its next round."""
        if _is_client(client):
            with self._beats_lock:
                self._dropped.add(client)

    def ready(self) -> bool:
        return True

    # ------------------------------------------------------------------ liveness
    def workers_done(self) -> int:
        """Workers every client of which exited or was lost: the RemoteBuffers made inside one Ray task (across
        its retries) are one worker; any other client (a driver's, an actor's) is a worker of its own."""
        live = self.core.liveness
        with self._beats_lock:
            worker_of = dict(self._worker_of)
        done: Dict[str, bool] = {}  # (a client known from its pings alone, not merged yet, is one not done)
        for c in set(live.exited) | set(live.lost) | set(live.last_seen) | set(worker_of):
            w = worker_of.get(c, c)
            done[w] = done.get(w, True) and live.done(c)
        return sum(done.values())

    def _all_done(self) -> bool:
        return self.num_workers is not None and self.workers_done() >= self.num_workers

    def _merge_beats(self) -> None:
        with self._beats_lock:
            beats, self._beats = self._beats, {}
            dropped, self._dropped = self._dropped, set()
        live = self.core.liveness
        live.merge_heard(beats)
        for client in dropped:
            live.lose(client, "its RemoteBuffer was dropped without close() (no EXIT)")
        with self._beats_lock:  # (ping adds tokens on the beat lane)
            for client in [c for c in self._tokens if c in live.exited or c in live.lost]:
                del self._tokens[client]  # (a client that comes back is watched by its silence alone)
                self._probed.pop(client, None)

    def _probe_silent(self) -> None:
        """Ask Ray about the token of every client silent for two heartbeats (at most once a heartbeat each): an
        owner Ray reports dead is a worker process that died, counted lost now rather than after
        ``peer_timeout``. Outside the lock; it never waits for Ray (the fetches it starts answer in a later round)."""
        every = self.cfg.heartbeat_seconds
        now = time.monotonic()
        with self._lock:
            live = self.core.liveness
            with self._beats_lock:
                tokens = list(self._tokens.items())
            quiet = [
                (c, ref)
                for c, ref in tokens
                if now - live.last_seen.get(c, now) > 2 * every and now - self._probed.get(c, 0.0) > every
            ]
        if not quiet:
            return
        ray = import_ray()
        dead = []
        for client, _ in quiet:
            self._probed[client] = now
        # all at once and without waiting: Ray may take a while to learn that an owner is gone (it tries to reach
        # it first), and the watchdog must keep its pace (a blocked round would read as this process not running)
        ready, _ = ray.wait([ref for _, ref in quiet], num_returns=len(quiet), timeout=0, fetch_local=True)
        ready = set(ready)
        for client, ref in quiet:
            if ref not in ready:
                continue  # no answer yet: asked again next heartbeat (its silence decides in the end: peer_timeout)
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.ObjectLostError as e:  # OwnerDiedError among them
                dead.append((client, type(e).__name__))
            except Exception:  # noqa: BLE001 - a slow or unreachable node: its silence decides (peer_timeout)
                pass
        if dead:
            with self._lock:
                for client, why in dead:
                    if client not in self.core.liveness.exited:
                        self.core.liveness.lose(client, f"its process died (Ray: {why})")

    def _watch(self) -> None:
        while True:
            time.sleep(self._every)
            try:
                self._probe_silent()
                with self._lock:
                    self._merge_beats()
                    self.core.liveness.check_silent()
                    end = False
                    if not self._ended and self._all_done():
                        self._ended, end = True, True
                        logger.warning(
                            "manager actor: every one of the %d workers exited or was lost (lost: %s); "
                            "checkpointing and ending",
                            self.num_workers,
                            sorted(self.core.liveness.lost),
                        )
                        try:
                            self.core.shutdown()
                        except Exception:  # noqa: BLE001 - nobody to report to: log it and end anyway
                            logger.exception("manager actor: checkpoint failed")
                    elif self._ended_at is not None and time.monotonic() - self._ended_at > self.cfg.timeout:
                        end = True  # the worker that sent the last EXIT did not end the actor
                if end:
                    self._end_self()
                    return
            except Exception:  # noqa: BLE001 - the watchdog must keep watching
                logger.exception("manager actor: watchdog error")

    @staticmethod
    def _end_self() -> None:
        ray = import_ray()
        try:
            ctx = ray.get_runtime_context()
            if ctx.get_actor_id() is None:
                return  # not inside an actor (e.g. a test built this class directly): nothing to end
            ray.kill(ctx.current_actor, no_restart=True)
        except Exception:  # noqa: BLE001
            logger.exception("manager actor: could not end itself with ray.kill; exiting the process")
            os._exit(0)


def actor_class():
    global _ACTOR
    if _ACTOR is None:
        _ACTOR = import_ray().remote(concurrency_groups={BEAT_GROUP: 1})(_ManagerActorImpl)
    return _ACTOR


def _plain(cfg: Any) -> Any:
    """The config as plain dicts (what the Ray actor receives)."""
    if isinstance(cfg, dict):
        return {k: _plain(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(_plain(v) for v in cfg)
    return cfg


def get_or_create_actor(cfg: Any, dcfg: Any):
    """Connect to (or start) Ray and return the manager actor named ``actor_name`` in ``namespace`` serving the
    buffer config ``cfg`` (sent as plain dicts), once it answers; all of it within ``startup_timeout`` seconds
    (``TimeoutError`` naming what was waited for)."""
    ray = import_ray()
    seconds = startup_seconds(dcfg)
    deadline = time.monotonic() + seconds
    if not ray.is_initialized():
        connect_ray(ray, dcfg, deadline, seconds)
    opts = dict(name=dcfg.actor_name, namespace=dcfg.namespace, max_concurrency=1, max_restarts=0)
    if dcfg.detached:
        opts['lifetime'] = 'detached'
    for key, value in (dcfg.get('ray_actor_options') or {}).items():  # where it runs (validated by the config)
        opts[key] = dict(value) if key == 'resources' else value
    plain, cls = _plain(cfg), actor_class().options(**opts)
    try:  # one step: of two drivers racing for the name, one creates the actor, the other gets it
        actor, created = cls.remote(plain), True
    except ValueError:  # the name is taken: that actor serves
        actor, created = ray.get_actor(dcfg.actor_name, namespace=dcfg.namespace), False
    where = f"manager actor {dcfg.namespace}/{dcfg.actor_name}"
    try:
        ray.get(
            actor.ready.options(concurrency_group=BEAT_GROUP).remote(), timeout=max(deadline - time.monotonic(), 0.0)
        )
    except ray.exceptions.GetTimeoutError as e:
        if created:  # an actor that could not be placed would hold the name: a corrected config would wait on it
            ray.kill(actor, no_restart=True)
        raise TimeoutError(
            f"{where} did not start within {seconds}s (distributed.startup_timeout): the cluster may "
            f"have no free CPU to place it (see `ray status`), or building its buffer is slow"
            f"{'; the actor this call created was removed' if created else ''}"
        ) from e
    except ray.exceptions.RayActorError as e:
        raise ManagerUnavailableError(f"{where} could not start: {e}") from e
    return actor

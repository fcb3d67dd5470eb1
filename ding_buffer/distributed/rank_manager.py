"""``ReplayBufferManager``: the manager rank of the torch / MPI backends. Serves ``ManagerCore`` on the
transport's receive threads under one lock, watches exits, goodbyes, lost connections and silence, and ends
with a goodbye to every connected worker and the checkpoint."""

import threading
import time
from typing import Any, Dict, Optional

from ..errors import TransportError
from .frame_reader import BYE, ERROR, LOST
from .framing import MAX_QUEUED
from .manager import ManagerCore
from .protocol import error_reply
from .shm_ring import start_commit_thread


class ReplayBufferManager:
    """
    Overview:
        The manager rank of the torch / MPI backends: ``run()`` serves the workers until each has sent EXIT
        (``RemoteBuffer.close``) or was lost, then says goodbye to every connected worker, checkpoints
        (``checkpoint_path``) and returns a summary. A worker whose connection breaks, who closes without EXIT,
        who does not take its replies within ``timeout``, or who is silent for ``peer_timeout`` seconds (workers
        send heartbeats) is counted as lost; the others keep being served, and a lost worker that speaks again rejoins.
    Interfaces:
        ``run``, ``buffer``, ``close`` (an ``IBuffer``-like handle so pipeline code can ``close()`` it too).
    """

    def __init__(self, buffer: Any, transport: Any, dcfg: Any, workers, log_reward_key: str) -> None:
        self.buffer = buffer
        self.transport = transport
        self.cfg = dcfg
        self.workers = set(workers)
        self.core = ManagerCore(buffer, dcfg, log_reward_key)
        self._lock = threading.Lock()  # serialises ManagerCore across the receive threads
        self._stopping = False  # set once run() decided to end: nothing is applied after that
        self._heard: Dict[Any, float] = {}  # peer -> last arrival, stamped before waiting for the lock
        self._busy: Dict[Any, int] = {}  # peer -> its requests waiting for / holding the lock
        self._finishing: set = set()  # peers whose EXIT was applied and whose final reply is not queued yet

    def _waiting_for(self) -> set:
        with self._lock:
            live = self.core.liveness
            return {w for w in self.workers if not live.done(w) or w in self._finishing}

    def run(self, timeout: Optional[float] = None, poll: float = 0.5) -> Dict[str, Any]:
        """
        Overview:
            Serve requests until every worker exited or was lost (or ``timeout`` seconds passed, then
            ``TimeoutError``). Returns the summary: counters, per-sender requests, exited, lost and rejoined
            ranks, and ``unanswered_goodbye`` (workers that did not answer the final goodbye in time).
            Requests are served on the transport's per-worker receive threads, one at a time (a lock around
            the buffer); this thread watches for exits, lost workers and silence.
        """
        start = time.monotonic()
        for w in self.workers:
            self.core.liveness.last_seen[w] = start
        self.transport.on_item = self._serve
        self.transport.start()
        rings = start_commit_thread(self.core, self._lock, lambda: self._stopping)
        stuck: list = []
        try:
            while self._waiting_for():
                if timeout is not None and time.monotonic() - start > timeout:
                    raise TimeoutError(
                        f"manager run() exceeded {timeout}s; still waiting for ranks {sorted(self._waiting_for())}"
                    )
                item = self.transport.recv(timeout=poll)  # lost peers, goodbyes, wake-ups after an EXIT
                with self._lock:
                    # arrivals first: a goodbye or a broken connection comes after the peer's last message
                    self.core.liveness.merge_heard(self._heard)
                    if item is not None and item[1] == LOST:
                        self.core.liveness.lose(item[0], item[2])
                    elif item is not None and item[1] == BYE and item[0] not in self.core.liveness.exited:
                        self.core.liveness.lose(item[0], "it closed its connection without EXIT")
                    self.core.liveness.check_silent(busy=[p for p, n in list(self._busy.items()) if n])
        finally:
            with self._lock:
                self._stopping = True
            if rings is not None:
                rings.set()
            # final: nothing is served after run(); a worker that never answers the goodbye (frozen, or dead where
            # MPI cannot tell) gets one distributed.timeout, at exit too, and its threads are then abandoned
            stuck = self.transport.close(self.cfg.timeout, final=True)
            self.core.shutdown()  # however run() ends: the rings close (their workers learn it), the checkpoint
        out = self.core.summary()
        out['unanswered_goodbye'] = [str(p) for p in stuck]
        out['protocol_errors'] = self.transport.protocol_errors
        out['bytes_received'] = self.transport.bytes_received
        out['recv_buffers_reused'] = getattr(self.transport, 'recv_buffers_reused', 0)
        out['bytes_sent'] = self.transport.bytes_sent
        return out

    def _serve(self, peer: int, kind: str, obj: Any) -> None:
        """One message of ``peer``, on its receive thread: handle it under the lock and queue the reply. After
        ``run()`` ended nothing is applied (the goodbye tells the worker; its request is in doubt)."""
        if self._stopping:
            return
        self._heard[peer] = time.monotonic()  # alive, whatever the lock is doing
        self._busy[peer] = self._busy.get(peer, 0) + 1
        try:
            if kind == ERROR:  # undecodable / oversized / broken framing: answered, the peer stays served
                rid, err = obj
                with self._lock:
                    self.core.liveness.seen(peer)
                    self.core.counters['errors'] += 1
                reply: Optional[Dict[str, Any]] = error_reply(rid, err)
            else:
                with self._lock:
                    if self._stopping:
                        return
                    reply = self.core.handle(peer, obj)
                    if reply is not None and reply.get('final'):
                        self._finishing.add(peer)  # run() must not close the transport before this reply is queued
        finally:
            self._busy[peer] -= 1
            self._heard[peer] = time.monotonic()
        if reply is None:
            return
        rid = reply.get('id')
        rid = rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < (1 << 63) else -1
        # an id-less error (garbage) is answered only when nothing else waits for that peer. A reply waits for
        # room behind the peer's MAX_QUEUED earlier ones for up to distributed.timeout (the peer's own wait for
        # it), here on that peer's receive thread: its next requests are not read meanwhile (backpressure). A
        # frame counts as queued until the sender thread sees it complete, which under CPU contention may lag
        # well behind the peer having read it (MPI's Isend), so a full outbox alone does not mean the peer is
        # gone; a reply that cannot leave within the timeout does.
        limit, deadline = (MAX_QUEUED, time.monotonic() + self.cfg.timeout) if rid >= 0 else (1, None)
        try:
            self._reply(peer, reply, rid, limit, deadline)
        finally:
            if reply.get('final'):
                with self._lock:
                    self._finishing.discard(peer)
                self.transport.inbox.put((peer, 'exited', None))  # wake run() to re-check the exit condition

    def _reply(self, peer: int, reply: Dict[str, Any], rid: int, limit: int, deadline: Optional[float]) -> None:
        try:
            try:
                self.transport.send(peer, reply, msg_id=rid, deadline=deadline, wait=False, limit=limit)
            except TransportError:
                raise
            except Exception as e:  # a result the codec cannot carry: an object, too deep, too large
                self.transport.send(
                    peer, error_reply(reply.get('id'), e), msg_id=rid, deadline=deadline, wait=False, limit=limit
                )
        except TransportError as e:
            if rid >= 0:
                with self._lock:
                    self.core.liveness.lose(peer, f"its replies are not taken: {e}")

    def close(self) -> None:
        self.transport.close(0.0)
        self.buffer.close()

    def __getattr__(self, name: str) -> Any:  # stats(), count(), sample() ... of the owned buffer
        if name in ('buffer', 'core'):
            raise AttributeError(name)
        return getattr(self.buffer, name)

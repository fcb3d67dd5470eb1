"""A manager and its workers in one process, over queues (no ranks, no sockets): for tests of the request / reply
path that need a real ``ReplayBufferManager`` and real ``RemoteBuffer`` channels."""

import queue
import threading

import numpy as np
from easydict import EasyDict

from ding_buffer.distributed import RemoteBuffer, build_manager_buffer
from ding_buffer.distributed.transport import ThreadedTransport
from ding_buffer.errors import TransportError


class InProcessNet(ThreadedTransport):
    """In-process transport over queues (``wires[(sender, receiver)]``): a manager and workers in one process."""

    def __init__(self, me, peers, wires, timeout):
        super().__init__(peers, False, 1 << 30, grace=timeout)
        self.me, self.wires = me, wires
        self.sent_bytes = 0  # what this end handed to its wires

    def _send_buf(self, peer, buf):
        self.sent_bytes += len(buf)
        self.wires.setdefault((self.me, peer), queue.Queue()).put(np.array(buf, np.uint8, copy=True))

    def _next(self, peer):
        q = self.wires.setdefault((peer, self.me), queue.Queue())
        while True:
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                if self._abandon:
                    raise TransportError('closed') from None

    def _recv_head(self, peer):
        msg = self._next(peer)
        return msg, len(msg)

    def _recv_exact(self, peer, n, out=None):
        msg = self._next(peer)
        buf = np.empty(n, np.uint8) if out is None else out
        buf[:] = msg
        return buf


def in_process_job(cfg, n_workers=1):
    """A ReplayBufferManager serving ``n_workers`` RemoteBuffers over ``_Net`` in this process; returns
    (manager, its run() summary dict (filled when run ends), run thread, workers)."""
    from ding_buffer.distributed import ReplayBufferManager
    from ding_buffer.distributed.channel import PeerChannel

    buf, dcfg, key = build_manager_buffer(cfg)
    wires = {}
    ranks = list(range(1, n_workers + 1))
    mgr = ReplayBufferManager(buf, InProcessNet(0, ranks, wires, 10.0), dcfg, ranks, key)
    out = {}
    th = threading.Thread(target=lambda: out.update(mgr.run(timeout=60)), daemon=True)
    th.start()
    local_cfg = EasyDict({k: v for k, v in dict(cfg).items() if k != 'distributed'})
    workers = [
        RemoteBuffer(local_cfg, dcfg, PeerChannel(InProcessNet(r, [0], wires, 10.0), 0, 10.0, 5.0), log_reward_key=key)
        for r in ranks
    ]
    return mgr, out, th, workers

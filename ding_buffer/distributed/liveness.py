"""``Liveness``: the manager's record of which senders are alive, lost, back again, or exited.

Every message of a sender (request or heartbeat) stamps it as seen; a sender silent for longer than
``distributed.peer_timeout`` is counted lost (the backends also report senders whose connection broke), and a
lost sender that speaks again rejoins. A sender that sent EXIT is never lost afterwards. Single-threaded like
``ManagerCore``, which holds one and serves its calls.
"""

import logging
import time
from typing import Any, Dict, Optional

logger = logging.getLogger('ding_buffer.distributed')


class Liveness:
    """
    Overview:
        Liveness bookkeeping of one manager. Attributes ``exited`` (set), ``lost`` (sender -> why),
        ``rejoined`` (sender -> how often), ``last_seen`` (sender -> ``time.monotonic()`` of its last message).
    """

    def __init__(self, dcfg: Any) -> None:
        self.cfg = dcfg  # read when checking: ``peer_timeout`` is the config's value at that time
        self.exited: set = set()
        self.lost: Dict[Any, str] = {}
        self.rejoined: Dict[Any, int] = {}
        self.last_seen: Dict[Any, float] = {}
        self.silent_since: Dict[Any, float] = {}  # lost senders that were lost by silence: when
        self._last_check: Optional[float] = None

    def seen(self, sender: Any, now: Optional[float] = None) -> None:
        """Record a message of ``sender``; a sender counted lost that speaks again rejoins."""
        self.last_seen[sender] = time.monotonic() if now is None else now
        if sender in self.lost:
            why = self.lost.pop(sender)
            self.silent_since.pop(sender, None)
            self.rejoined[sender] = self.rejoined.get(sender, 0) + 1
            logger.warning("manager: worker %s was counted lost (%s) and is back; serving it again", sender, why)

    def merge_heard(self, stamps: Dict[Any, float]) -> None:
        """Fold arrival times recorded without the buffer's lock (heartbeats, requests waiting for it) into the
        liveness record: a newer stamp counts as a message; an exited sender stays exited."""
        for sender, t in list(stamps.items()):
            if sender not in self.exited and t > self.last_seen.get(sender, float('-inf')):
                self.seen(sender, t)

    def lose(self, sender: Any, why: str, silent: bool = False) -> None:
        """Count ``sender`` lost (``silent``: for silence alone -- it may be behind a partition, or this manager
        may be; see ``done``)."""
        if sender not in self.lost and sender not in self.exited:
            self.lost[sender] = why
            if silent:
                self.silent_since[sender] = time.monotonic()
            logger.warning("manager: lost worker %s: %s; serving the others", sender, why)

    def done(self, sender: Any, now: Optional[float] = None) -> bool:
        """Whether the manager waits for ``sender`` no more: it exited, or it was lost -- for silence alone, only
        once ``distributed.lost_grace`` more seconds passed without a word (None: ``peer_timeout``), so a manager
        whose own link was cut, which hears nobody, does not end the job before its workers are heard again."""
        if sender in self.exited:
            return True
        if sender not in self.lost:
            return False
        since = self.silent_since.get(sender)
        if since is None:
            return True
        grace = self.cfg.get('lost_grace')
        grace = self.cfg.peer_timeout if grace is None else grace
        return (time.monotonic() if now is None else now) - since >= (grace or 0.0)

    def exit(self, sender: Any) -> int:
        """``sender`` said goodbye: exited for good, never lost or silent again. Returns how many have exited."""
        self.exited.add(sender)
        self.lost.pop(sender, None)
        self.silent_since.pop(sender, None)
        self.last_seen.pop(sender, None)  # never silent again: the watchdog's scan stays O(live senders)
        return len(self.exited)

    def check_silent(self, now: Optional[float] = None, busy: Any = ()) -> None:
        """
        Overview:
            Count as lost every sender silent for longer than ``distributed.peer_timeout``, except the ``busy``
            ones (a request of theirs waits for the buffer). Call it often (at least every ``peer_timeout / 2``):
            a longer gap means this process did not run (frozen, or a long request held the buffer), and that
            time is not held against anyone: every sender's silence is shifted by the gap.
        """
        limit = self.cfg.peer_timeout
        if limit is None:
            return
        now = time.monotonic() if now is None else now
        gap = now - self._last_check if self._last_check is not None else 0.0
        self._last_check = now
        if gap > limit / 2:
            for w in self.last_seen:
                self.last_seen[w] += gap
        for w, t in list(self.last_seen.items()):
            if w not in self.lost and w not in self.exited and w not in busy and now - t > limit:
                why = f"no message or heartbeat for {now - t:.1f}s (distributed.peer_timeout={limit})"
                self.lose(w, why, silent=True)

    def summary(self) -> Dict[str, Any]:
        """The ``exited`` / ``lost`` / ``rejoined`` part of the manager's summary (senders as strings)."""
        return {
            'exited': sorted(str(s) for s in self.exited),
            'lost': {str(k): v for k, v in self.lost.items()},
            'rejoined': {str(k): v for k, v in self.rejoined.items()},
        }

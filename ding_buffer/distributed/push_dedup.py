"""``PushDedup``: the manager applies each worker push at most once.

Pushes carry ``client`` and ``seq``: a push whose sequence number was already applied for that client is
answered from the record of the first one (marked ``duplicate``) and stored again never, so a worker's retry
after a timeout is safe. A push that stored its data and then failed (``StoredThenFailed``) is recorded with
its error: every retry gets the same error, and the data is not stored twice. One record per client of each
sender (the transport's identity of the peer, which a peer cannot choose on torch and MPI): a sender's records are
its own, so no peer can push another's out. At most ``PER_SENDER`` records a sender (its oldest dropped first) and
``MAX_CLIENTS`` in all (the least recently active sender's oldest dropped first).
"""

from typing import Any, Callable, Dict, Tuple

MAX_CLIENTS = 1 << 16  # push-dedup records kept in all
PER_SENDER = 256  # push-dedup records kept for one sender (one per RemoteBuffer of that process)


class StoredThenFailed(Exception):
    """A push stored its data, then scoring failed: ``error`` is what the worker gets (every time it asks)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def check_client_seq(client: Any, seq: Any) -> None:
    """``ValueError`` unless ``client`` is a str of 1..128 chars and ``seq`` an int in [0, 2**63)."""
    if not (
        isinstance(client, str)
        and 0 < len(client) <= 128
        and isinstance(seq, int)
        and not isinstance(seq, bool)
        and 0 <= seq < (1 << 63)
    ):
        raise ValueError(
            f"push 'client' must be a str of 1..128 chars and 'seq' an int in [0, 2**63), got "
            f"{str(client)[:40]!r} and {str(seq)[:40]!r}"
        )


class PushDedup:
    """
    Overview:
        The last applied ``(seq, reply)`` of every client. ``once`` runs a push unless it is a retry;
        ``counters['duplicate_pushes']`` (the manager's counters) counts the retries answered from the record.
    """

    def __init__(self, counters: Dict[str, int]) -> None:
        self.counters = counters
        # sender -> client -> (last push seq, its reply or error); senders in order of their last push
        self._applied: Dict[Any, Dict[str, Tuple[int, Any]]] = {}
        self._records = 0

    def once(self, sender: Any, client: Any, seq: Any, apply: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        """
        Overview:
            The reply of push ``seq`` of ``client`` from ``sender``: ``apply()``'s, or, for a sequence number already
            applied, the recorded one (an older one: nothing stored). Pushes without ``client`` and ``seq`` always
            apply. ``apply`` raising ``StoredThenFailed`` makes its error the recorded answer, raised now and on
            retries.
        """
        if client is not None or seq is not None:
            check_client_seq(client, seq)
            done = self._applied.get(sender, {}).get(client)
            if done is not None and seq <= done[0]:  # a retry of a push that was applied: never store it twice
                self.counters['duplicate_pushes'] += 1
                if seq == done[0] and isinstance(done[1], BaseException):
                    raise done[1]  # the first attempt stored the data, then failed: the same answer again
                reply = dict(done[1]) if seq == done[0] else {'stored': 0, 'score': {}}
                reply['duplicate'] = True
                return reply
        try:
            reply: Any = apply()
        except StoredThenFailed as e:  # the data is in: a retry must not store it again, nor hide the error
            reply = e.error
            reply.stored = True  # (error_reply tells the worker)
        if client is not None:
            self._record(sender, client, (seq, reply))
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _record(self, sender: Any, client: str, record: Tuple[int, Any]) -> None:
        mine = self._applied.pop(sender, None) or {}
        self._applied[sender] = mine  # (now the most recently active sender)
        self._records += 1 - (mine.pop(client, None) is not None)
        mine[client] = record
        if len(mine) > PER_SENDER:
            self._drop(sender)
        if self._records > MAX_CLIENTS:
            self._drop(next(iter(self._applied)))

    def _drop(self, sender: Any) -> None:
        """Forget the oldest record of ``sender``."""
        mine = self._applied[sender]
        mine.pop(next(iter(mine)))
        self._records -= 1
        if not mine:
            del self._applied[sender]

"""Every public exception of ding_buffer in one place: the modules that raise or catch them import them from here,
and the packages export them as public names (``ding_buffer.CodecError``, ``ding_buffer.distributed.CodecError``)."""


class SampleTimeoutError(TimeoutError):
    """``sample(..., timeout=s)`` waited ``s`` seconds and the buffer still could not serve the batch."""


class CodecError(ValueError):
    """A message could not be decoded (bad JSON, unknown tag, part sizes that do not match) or is too large."""


class TransportError(RuntimeError):
    """The transport could not deliver or receive a message (peer gone, protocol broken)."""


class SendTimeout(TransportError):
    """A message was not handed to the peer before the deadline. A frame that was queued is still delivered
    later (in order); one refused because an earlier frame was still queued was not sent at all."""


class ProtocolError(TransportError):
    """A peer sent bytes that break the framing; ``msg_id`` is the id of the broken frame when it is known."""

    def __init__(self, message: str, msg_id=None) -> None:
        super().__init__(message)
        self.msg_id = msg_id


class ManagerUnavailableError(RuntimeError):
    """The manager did not answer within ``distributed.timeout``, its connection broke, or it shut down."""


class ManagerTimeoutError(ManagerUnavailableError):
    """The manager did not take a request or answer it before the caller's deadline (its connection is intact:
    it may be busy, frozen or gone); a ``ManagerUnavailableError``."""


class RemoteError(RuntimeError):
    """The manager raised an exception type that is not re-raised as itself."""


class FramesOutOfStepError(ValueError):
    """A worker sent a step of a frames-once buffer (``storage.frames``) as a continuation of its previous push,
    which the manager does not hold (it restarted, forgot the worker, or missed that push). The worker's push
    pipeline sends the push again with full stacks; nothing of the refused one was stored."""

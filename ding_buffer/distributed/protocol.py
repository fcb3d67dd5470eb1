"""The request / reply messages between workers and the manager: what both sides build and read.

A request is ``{'op', 'id', 'shard', 'args'}`` (the worker builds it with ``request_msg``; its channel adds the
``id``). A reply is ``{'id', 'ok': True, 'result'}`` (``ok_reply``) or ``{'id', 'ok': False, 'error', 'message'}``
(``error_reply``); the worker reads it with ``result_of``, which re-raises an error as the same exception type when
it is in ``REMOTE_EXCEPTIONS`` and as ``RemoteError`` otherwise.
"""

from typing import Any, Dict

from ..errors import CodecError, FramesOutOfStepError, RemoteError, SampleTimeoutError

# exception types a worker re-raises as themselves; anything else arrives as RemoteError
REMOTE_EXCEPTIONS = {
    e.__name__: e
    for e in (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        RuntimeError,
        NotImplementedError,
        SampleTimeoutError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
        CodecError,
        PermissionError,
        FramesOutOfStepError,
    )
}


def request_msg(op: str, shard: int, args: Dict[str, Any]) -> Dict[str, Any]:
    """A worker's request (the channel adds its ``id``)."""
    return {'op': op, 'shard': shard, 'args': args}


def ok_reply(rid: Any, result: Any) -> Dict[str, Any]:
    """The manager's answer to request ``rid``: its result."""
    return {'id': rid, 'ok': True, 'result': result}


def error_reply(rid: Any, e: BaseException) -> Dict[str, Any]:
    """The manager's answer to request ``rid``: the exception it raised (type name and message; ``stored``: a push
    that stored its data before it failed, which must not be sent again)."""
    out = {'id': rid, 'ok': False, 'error': type(e).__name__, 'message': str(e)}
    if getattr(e, 'stored', False) is True:
        out['stored'] = True
    return out


def result_of(reply: Dict[str, Any], op: str) -> Any:
    """Worker side: the result of a reply to ``op``; an error reply is raised as its type (``RemoteError`` for a
    type not in ``REMOTE_EXCEPTIONS``)."""
    if reply.get('ok'):
        return reply.get('result')
    exc = REMOTE_EXCEPTIONS.get(reply.get('error'), RemoteError)
    error = exc(
        f"manager: {reply.get('message')}"
        if exc is not RemoteError
        else f"manager raised {reply.get('error')} for {op!r}: {reply.get('message')}"
    )
    error.stored = reply.get('stored') is True  # a push that stored its data, then failed (see error_reply)
    raise error

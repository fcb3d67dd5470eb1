"""Workers' file paths on the manager, confined to the manager's ``distributed.file_root``.

``save_data`` / ``load_data`` requests name a path relative to that directory; one that is absolute, leaves
it (``..``, a link) or names the directory itself is refused with ``PermissionError``, and so is every path
when the manager's config sets ``file_root=None``. The root is resolved once, when the manager starts: a
later ``chdir`` of the manager must not move the directory workers may use.
"""

import os
from typing import Any, Optional


def resolve_file_root(file_root: Optional[str]) -> Optional[str]:
    """``distributed.file_root`` as a real path (None stays None); ``ValueError`` if it is not a directory."""
    if file_root is not None and not os.path.isdir(file_root):
        raise ValueError(
            f"config key 'distributed.file_root' is {file_root!r}, which is not a directory on the manager's "
            f"host; expected an existing directory (create it), or None to refuse workers' save_data / load_data"
        )
    return os.path.realpath(file_root) if file_root is not None else None


def check_checkpoint_path(path: Any) -> None:
    """``distributed.checkpoint_path`` (None: nothing) must be a file the manager can write when it stops: not a
    directory, and under a writable directory (missing ones are made at the save). ``ValueError`` otherwise, at
    start-up: the shutdown save is the buffer's last."""
    if path is None:
        return
    where = os.path.abspath(os.fspath(path))
    above = os.path.dirname(where)
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    why = (
        'is a directory'
        if os.path.isdir(where)
        else f'lies under {above!r}, which is not a directory'
        if not os.path.isdir(above)
        else f'lies under {above!r}, where this process cannot write'
        if not os.access(above, os.W_OK | os.X_OK)
        else None
    )
    if why is not None:
        raise ValueError(
            f"config key 'distributed.checkpoint_path' is {os.fspath(path)!r}, which {why}; expected a file path "
            f"the manager can write when it stops (its buffer's save_data)"
        )


def confine(base: Optional[str], path: Any) -> str:
    """A worker's file path as a path inside ``base`` (a resolved file root); ``PermissionError`` otherwise."""
    if base is None:
        raise PermissionError(
            "workers may not read or write files on the manager: its config has "
            "distributed.file_root=None (set it to a directory to allow save_data / load_data)"
        )
    if not isinstance(path, str) or not path or '\0' in path or len(path) > 4096:
        raise ValueError(f"path must be a non-empty str without NUL bytes, got {str(path)[:80]!r}")
    where = os.path.realpath(os.path.join(base, path))
    if os.path.isabs(path) or os.path.commonpath([base, where]) != base or where == base:
        raise PermissionError(
            f"path {path!r} resolves to {where!r}, outside distributed.file_root {base!r}; "
            f"workers may name relative paths inside it only"
        )
    return where

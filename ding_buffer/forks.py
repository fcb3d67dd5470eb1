"""What a forked child (``os.fork``, ``multiprocessing``'s ``fork`` start, a ``DataLoader``'s workers) needs of the
package's objects it inherits.

- Locks start free there. A thread that held one at the fork does not exist in the child, so the lock would stay
  taken for good and every later call on the buffer would wait on it. (A re-entrant lock the forking thread itself
  holds stays held: that thread goes on in the child and releases it.)
- Objects told (``tell_children``) run their ``_after_fork()`` there: a buffer built without a seed draws a new one
  at its next draw, TensorBoard sinks drop their writes (the writer's thread stayed in the parent), and the parts
  that delete files leave the parent's alone.
"""

import os
import threading
import weakref
from typing import Any

_RLOCK = type(threading.RLock())
_LOCKS: 'weakref.WeakSet[Any]' = weakref.WeakSet()
_TOLD: 'weakref.WeakSet[Any]' = weakref.WeakSet()


def lock(reentrant: bool = True) -> Any:
    """A new lock (``threading.RLock``, or ``threading.Lock``) that a forked child gets free."""
    made = threading.RLock() if reentrant else threading.Lock()
    _LOCKS.add(made)
    return made


def started(thread: threading.Thread) -> bool:
    """Start ``thread``; False where no thread can start (at interpreter exit on Python 3.12.0-3.12.1, or at a
    thread limit): the caller goes on without it."""
    try:
        thread.start()
    except RuntimeError:
        return False
    return True


def rng(seed: Any = None) -> Any:
    """``numpy.random.default_rng(seed)`` whose lock a forked child gets free (numpy holds it while a draw runs
    without the GIL: a thread of the parent drawing at the fork left it taken in the child, whose first draw waited
    for good)."""
    import numpy as np

    made = np.random.default_rng(seed)
    _LOCKS.add(made.bit_generator.lock)
    return made


def tell_children(owner: Any) -> None:
    """``owner._after_fork()`` runs in each forked child."""
    _TOLD.add(owner)


def new_seed(rng: Any) -> None:
    """``rng`` (a numpy ``Generator``, in place: whatever holds it sees the change) continues from a seed drawn from
    numpy's global RNG, as a buffer built without a seed draws its first (``np.random.seed`` reproduces it)."""
    import numpy as np  # (here: ``import ding_buffer`` loads nothing heavy before the command line's first line)

    bits = rng.bit_generator
    bits.state = type(bits)(np.random.randint(0, 2**63 - 1)).state


def _after_fork_child() -> None:
    for held in list(_LOCKS):
        if not (isinstance(held, _RLOCK) and held._is_owned()):
            held._at_fork_reinit()
    for owner in list(_TOLD):
        owner._after_fork()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_child)

__all__ = ['lock', 'new_seed', 'rng', 'tell_children']

"""What a forked child (``os.fork``, ``multiprocessing``'s ``fork`` start, a ``DataLoader``'s workers) needs of the
package's objects it inherits.

- Locks start free there. A thread that held one at the fork does not exist in the child, so the lock would stay
  taken for good and every later call on the buffer would wait on it. (A re-entrant lock the forking thread itself
  holds stays held: that thread goes on in the child and releases it.)
- A buffer built without a seed draws a new one there, so forked workers do not repeat one another's draws (a buffer
  given a seed goes on drawing what it would have drawn).
"""

import os
import threading
import weakref
from typing import Any

import numpy as np

_LOCKS: 'weakref.WeakSet[Any]' = weakref.WeakSet()
_UNSEEDED: 'weakref.WeakSet[Any]' = weakref.WeakSet()  # objects whose ``_reseed()`` gives their RNG a new seed


def lock(reentrant: bool = True) -> Any:
    """A new lock (``threading.RLock``, or ``threading.Lock``) that a forked child gets free."""
    made = threading.RLock() if reentrant else threading.Lock()
    _LOCKS.add(made)
    return made


def reseed_in_children(owner: Any) -> None:
    """``owner._reseed()`` runs in each forked child (``owner`` drew its own seed)."""
    _UNSEEDED.add(owner)


def new_seed(rng: np.random.Generator) -> None:
    """``rng`` (in place: whatever holds it sees the change) continues from a seed of fresh OS entropy."""
    bits = rng.bit_generator
    bits.state = type(bits)(np.random.SeedSequence()).state


def _after_fork_child() -> None:
    for held in list(_LOCKS):
        if not (isinstance(held, type(threading.RLock())) and held._is_owned()):
            held._at_fork_reinit()
    for owner in list(_UNSEEDED):
        owner._reseed()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_child)

__all__ = ['lock', 'new_seed', 'reseed_in_children']

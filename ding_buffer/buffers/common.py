"""What every buffer shares: its RNG (new or restored), argument checks (instance names, learner iterations / env
steps as ints, ``sample(timeout=...)`` values, ``None`` in a pushed list)."""

import copy
import itertools
import numbers
import operator
import sys
import threading
from typing import Any, List, Mapping, Optional

import numpy as np

from .. import forks
from ..config import STEP_LIMIT, as_float


def new_rng(seed: Optional[int]) -> np.random.Generator:
    """A buffer's own RNG; ``seed=None`` draws the seed from numpy's global RNG, so ``np.random.seed`` reproduces."""
    return forks.rng(np.random.randint(0, 2**63 - 1) if seed is None else seed)


def restored_rng(state: Mapping) -> np.random.Generator:
    """A new RNG in the state ``state['rng']`` saved, or ``ValueError`` when it is missing or invalid."""
    rng = forks.rng()
    try:
        saved = copy.deepcopy(dict(state['rng']))
        rng.bit_generator.state = saved
        if rng.bit_generator.state != saved:  # (numpy 1.x wraps an out-of-range int, with only a warning)
            raise ValueError(f"it reads back as {rng.bit_generator.state} (a value out of range)")
    except Exception as e:
        raise ValueError(f"state has an invalid 'rng' entry: {e}") from e
    return rng


ENGINE_KEYS = frozenset({'counters', 'thruput', 'envstep', 'use'})  # what the engine keeps in a state


class CallMarks:
    """
    Overview:
        Which of a buffer's calls that run the user's code (a sample's samplers and rules, a state_dict's copies) each
        thread is inside: from there a call that changes the same buffer (``refuse``) would act on a call half
        done -- hand out items no longer stored, save a torn state -- so it is a ``RuntimeError`` naming both.
        Other threads are never refused (they wait for the buffer's lock). ``count`` is how many calls are marked
        now, so a hot path reads one int unless one is.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self._local = threading.local()

    def mark(self, verb: str) -> Any:
        """Under the buffer's lock: this thread's ``verb`` (called from the caller's frame) runs the user's code from
        now on; ``unmark`` with the answer."""
        local = self._local
        marked, caller = (getattr(local, 'verb', None), getattr(local, 'caller', None)), sys._getframe(1)
        local.verb, local.caller = verb, caller
        self.count += 1
        return marked

    def unmark(self, marked: Any) -> None:
        self._local.verb, self._local.caller = marked
        self.count -= 1

    def refuse(self, verb: str) -> None:
        inside = getattr(self._local, 'verb', None)
        if inside is not None and not _running(self._local.caller):  # its call ended without ``unmark``: stopped
            self._local.verb, self._local.caller = None, None  # in its ``finally`` (a Ctrl-C); none is inside now
            self.count -= 1
            inside = None
        if inside is not None:
            raise RuntimeError(
                f"buffer '{self.name}': {verb}() was called from inside its own {inside}() (a sampler, rule or copy "
                f"hook of yours) on the same thread; call it after {inside}() returns"
            )


def _running(frame: Any) -> bool:
    """Whether ``frame`` is on the calling thread's stack."""
    f = sys._getframe(2)
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


def check_deepcopy(deepcopy: Any) -> None:
    """``load_state_dict``'s ``deepcopy`` (DI-engine's argument) is a bool: ``TypeError`` otherwise."""
    if type(deepcopy) is not bool:
        raise TypeError(f"deepcopy must be a bool, got {type(deepcopy).__name__} {deepcopy!r:.40}")


def short_form(state: Mapping) -> Optional[List[Any]]:
    """The items of DI-engine's ``{'data': [items]}`` (a ``load_state_dict`` that pushes them), or None for any other
    state; ``TypeError`` for a ``data`` that is no list of items."""
    if set(state.keys()) != {'data'}:
        return None
    data = state['data']
    if isinstance(data, (str, bytes, Mapping)) or not hasattr(data, '__iter__'):
        raise TypeError(f"state 'data' must be a list of items, got {type(data).__name__}")
    return list(data)


def check_state_type(state: Mapping, name: str) -> None:
    """``ValueError`` unless ``state`` names the buffer class ``name`` as its ``type``."""
    if 'type' not in state:
        raise ValueError(
            f"state has no 'type' entry (keys {sorted(map(str, state))[:6]}); expected a state_dict() of this "
            f"buffer, or {{'data': [items]}}"
        )
    if state.get('type') != name:
        raise ValueError(f"state was made by {state.get('type')!r}, this buffer is {name}")


def check_derived(saved: Any, derived: Mapping, what: str) -> None:
    """Saved counters that are also derived from other saved parts (``derived``, what ``what`` says) must equal
    them: where they disagree, the state is damaged (one side would be dropped without a word). What is no count at
    all, or missing (older files), is left to the counters' own check."""
    if not isinstance(saved, Mapping):
        return
    for key, value in derived.items():
        got = saved.get(key)
        if isinstance(got, (int, np.integer)) and not isinstance(got, (bool, np.bool_)) and got >= 0 and got != value:
            raise ValueError(f"saved counters['{key}'] is {got}, {what} {value}")


def saved_count(value: Any, what: str) -> int:
    """A counter read back from a saved state: an int >= 0 (a float is refused, not truncated), else ``ValueError``
    naming ``what``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {str(value)[:60]!r}")
    return int(value)


def check_instance_name(instance_name: Any) -> None:
    if not isinstance(instance_name, str) or not instance_name:
        raise ValueError(f"instance_name must be a non-empty str, got {instance_name!r}")


def check_step(value: Any, name: str) -> int:
    """A learner iteration or env step argument as an int, or ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = int(value)
        if -STEP_LIMIT < value < STEP_LIMIT:
            return value
        raise ValueError(f"{name} must be within +-2**60, got {value}")
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")


MAX_NAME = 128  # characters of a worker or session name


def checked_session(session_id: Any) -> str:
    """A session id: a printable str of at most ``MAX_NAME`` characters (``ValueError`` otherwise)."""
    if not isinstance(session_id, str) or len(session_id) > MAX_NAME or not session_id.isprintable():
        raise ValueError(f"session_id must be a printable str of at most {MAX_NAME} characters, got {session_id!r:.60}")
    return session_id


def check_wait_timeout(timeout: Any) -> Optional[float]:
    """A ``sample(timeout=...)`` argument as a float: None, or a number of seconds (numpy's too) in [0,
    ``threading.TIMEOUT_MAX``] (NaN and inf would wait forever); ``ValueError`` otherwise."""
    if timeout is None:
        return None
    if not isinstance(timeout, (bool, np.bool_)) and isinstance(timeout, numbers.Real):
        seconds = as_float(timeout)  # (NaN for an int beyond the float range: refused below)
        if 0 <= seconds <= threading.TIMEOUT_MAX:
            return seconds
    raise ValueError(
        f"timeout must be None or a number of seconds in [0, {threading.TIMEOUT_MAX:g}], got {timeout!r:.40}"
    )


SAMPLE_LIMIT = 1 << 31  # more rows than any batch (with replacement a size may exceed the stored count)


# a call with a timeout waits at most its timeout for the buffer's lock, and at least this long: other calls hold the
# lock for microseconds, so timeout=0 ("do not wait for data") is not failed by a push running at that moment
LOCK_GRACE = 0.1


def depth(lock: Any) -> int:
    """How many times the calling thread holds the re-entrant ``lock`` (Python 3.10's locks tell only 0 or 1)."""
    count = getattr(lock, '_recursion_count', None)
    return count() if count is not None else int(lock._is_owned())


def release_to(lock: Any, held: int) -> None:
    """After an exception: release ``lock`` until the calling thread holds it ``held`` times (its ``depth`` before
    the call), also where the exception -- a Ctrl-C -- came after an ``acquire`` took it but before the call knew."""
    while depth(lock) > held:
        lock.release()


def check_size(size: Any) -> None:
    """A sample ``size`` is a positive int of at most ``SAMPLE_LIMIT`` (``TypeError`` / ``ValueError`` naming it)."""
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
        raise TypeError(f"sample size must be an int, got {type(size).__name__} {size!r}")
    if size <= 0:
        raise ValueError(f"sample size must be > 0, got {size}")
    if size > SAMPLE_LIMIT:
        raise ValueError(f"sample size must be at most 2**31, got {size}")


def check_range(sample_range: Any) -> None:
    """``sample_range`` is None or a slice of ints (checked before a sample changes anything)."""
    if sample_range is None:
        return
    if not isinstance(sample_range, slice):
        raise TypeError(f"sample_range must be a slice, got {type(sample_range).__name__} {sample_range!r:.40}")
    try:
        range(0)[sample_range]
    except (TypeError, ValueError) as e:
        raise type(e)(f"sample_range {sample_range!r:.60} is not a slice of ints with a non-zero step: {e}") from None


def range_positions(n: int, sample_range: Optional[slice], among: Optional[range] = None) -> range:
    """Insertion positions (0 = oldest) that ``sample_range`` (checked: ``check_range``) selects among ``among``
    (default: all ``n`` elements)."""
    among = range(n) if among is None else among
    if sample_range is None:
        return among
    r = among[sample_range]
    return r if len(r) > 1 else range(r.start, r.start + len(r))  # (a step beyond int64 selects one at most)


def has_none(items: List[Any]) -> bool:
    """Whether ``items`` holds ``None``, by identity (items may be arrays, which ``None in items`` would compare
    element-wise), in C: ``map`` over ``operator.is_``."""
    return any(map(operator.is_, items, itertools.repeat(None)))

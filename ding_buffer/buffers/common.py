"""Argument checks every buffer shares: learner iterations / env steps as ints, ``sample(timeout=...)`` values, and
``None`` in a pushed list."""

import itertools
import operator
import threading
from typing import Any, List, Optional

import numpy as np

STEP_LIMIT = 2**60  # learner iterations / env steps beyond this are not counters (and overflow int64 math)


def check_step(value: Any, name: str) -> int:
    """A learner iteration or env step argument as an int, or ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = int(value)
        if -STEP_LIMIT < value < STEP_LIMIT:
            return value
        raise ValueError(f"{name} must be within +-2**60, got {value}")
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")


def check_wait_timeout(timeout: Any) -> Optional[float]:
    """A ``sample(timeout=...)`` argument: None, or a number of seconds in [0, ``threading.TIMEOUT_MAX``]
    (NaN and inf would wait forever); ``ValueError`` otherwise."""
    if timeout is not None and (
        isinstance(timeout, (bool, np.bool_))
        or not isinstance(timeout, (int, float))
        or not 0 <= timeout <= threading.TIMEOUT_MAX
    ):
        raise ValueError(
            f"timeout must be None or a number of seconds in [0, {threading.TIMEOUT_MAX:g}], got {timeout!r:.40}"
        )
    return timeout


def has_none(items: List[Any]) -> bool:
    """Whether ``items`` holds ``None``, by identity (items may be arrays, which ``None in items`` would compare
    element-wise), in C: ``map`` over ``operator.is_``."""
    return any(map(operator.is_, items, itertools.repeat(None)))

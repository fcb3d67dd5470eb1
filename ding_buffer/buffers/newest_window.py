"""``NewestWindow``: sampling sees only the newest ``size`` items of a slot table (DI-engine's elastic buffer).

``set_buffer_size`` (a callable ``envstep -> int``, from the owner's config) answers the size for an env step;
``update(envstep)`` asks it, ``resize(n)`` sets it directly. A shrunk window keeps every stored item -- growing it
again brings the older ones back.
"""

import math
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..storage.tensordict_io import is_tensordict
from .common import STEP_LIMIT, check_step


def checked_size(value: Any, what: str) -> int:
    """A window size: an int >= 1 (numpy ints, and floats with an integral value, as a scheduler multiplying
    sizes may return); ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 1 <= value < STEP_LIMIT:
        raise ValueError(f"{what} must be an int in [1, 2**60), got {type(value).__name__} {value!r:.60}")
    return int(value)


class NewestWindow:
    """
    Overview:
        The number of newest items sampling may use (``size``, may exceed what is stored), and how it changes.
    """

    def __init__(self, size_fn: Optional[Callable[[int], Any]], capacity: int) -> None:
        self._size_fn = size_fn
        self._capacity = capacity
        # DI-engine asks for the size at envstep 0 when it builds the buffer
        self.size = self._ask(0) if size_fn is not None else capacity

    def _ask(self, envstep: int) -> int:
        try:
            size = self._size_fn(envstep)
        except Exception as e:
            raise ValueError(
                f"config key 'set_buffer_size' raised at envstep {envstep}: {type(e).__name__}: {e}"
            ) from e
        return checked_size(size, f'set_buffer_size({envstep})')

    def asked(self, info: Any) -> Optional[int]:
        """``update(info)``'s new size: ``set_buffer_size(envstep)`` for an int ``info``; ``None`` for a dict (a
        learner's ``priority_info``, which changes nothing). Checked before anything changes."""
        if isinstance(info, dict) or is_tensordict(info):  # a sampled TensorDict is a dict here
            return None
        if isinstance(info, (bool, np.bool_)) or not isinstance(info, (int, np.integer)):
            raise TypeError(f"update takes an envstep (int) or a dict, got {type(info).__name__} {info!r:.40}")
        info = check_step(info, 'envstep')
        if self._size_fn is None:
            raise ValueError(
                "update(envstep) needs config key 'set_buffer_size' (a callable envstep -> size); "
                "without it, call resize(n)"
            )
        return self._ask(int(info))

    def saved(self, state: Dict[str, Any]) -> int:
        """The size a saved state holds (the whole ring for states saved without one)."""
        return checked_size(state.get('current_buffer_size', self._capacity), 'saved current_buffer_size')


__all__ = ['NewestWindow', 'checked_size']

"""``ElasticReplayBuffer`` (``type='elastic'``): the naive ring whose *usable* size changes while training runs.

DI-engine's model-based pipelines (MBPO's imagination buffer) keep ``replay_buffer_size`` items but sample only
the newest ``set_buffer_size(envstep)`` of them; ``update(envstep)`` moves that window as the run goes on. Here:

* ``set_buffer_size``: a callable ``envstep -> int`` (the owner's config, never the wire), or ``None`` for a
  window that ``resize(n)`` sets (the whole ring until then);
* ``update(envstep)`` asks ``set_buffer_size`` for the new size; ``update(priority_info)`` (a dict, from a
  DI-engine learner) is the naive buffer's no-op;
* a shrunk window keeps every stored item -- sampling just sees the newest ``current_buffer_size`` ones -- so
  growing it again brings the older items back, as DI-engine's does. ``sample_range`` selects within the window.

Everything else (storage, ``max_use``, ``max_staleness``, the limiter, monitors) is the naive buffer's.
"""

import math
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..base import BUFFER_REGISTRY
from ..config import dingengine_ignored
from ..storage.tensordict_io import is_tensordict
from .common import STEP_LIMIT, check_step
from .naive import NAIVE_CHECKS, NAIVE_CONFIG, NaiveReplayBuffer

ELASTIC_CONFIG = dict(
    NAIVE_CONFIG,
    type='elastic',
    # Callable envstep -> number of newest items sampling may use (DI-engine's key); None: resize(n) sets it.
    set_buffer_size=None,
)
ELASTIC_CHECKS = dict(
    NAIVE_CHECKS,
    set_buffer_size=(lambda x: x is None or callable(x), 'None or a callable envstep -> size'),
)


def checked_size(value: Any, what: str) -> int:
    """A window size: an int >= 1 (numpy ints, and floats with an integral value, as a scheduler multiplying
    sizes may return); ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 1 <= value < STEP_LIMIT:
        raise ValueError(f"{what} must be an int in [1, 2**60), got {type(value).__name__} {value!r:.60}")
    return int(value)


@BUFFER_REGISTRY.register('elastic')
class ElasticReplayBuffer(NaiveReplayBuffer):
    """
    Overview:
        A naive buffer that samples only among its newest ``current_buffer_size`` items (DI-engine's
        ``ElasticReplayBuffer``); the size follows ``set_buffer_size(envstep)`` on ``update(envstep)``, or
        ``resize(n)``.
    Interfaces:
        the naive buffer's, plus ``update(envstep)``, ``resize``.
    Property:
        ``current_buffer_size``
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='elastic', replay_buffer_size=10, seed=0))
        >>> buf.push([{'obs': i} for i in range(10)])
        10
        >>> buf.resize(3)  # sample among the newest 3 only
        >>> buf.current_buffer_size, sorted(item['obs'] for item in buf.sample(3)), buf.sample(4)
        (3, [7, 8, 9], None)
        >>> buf.close()
        >>> buf = create_buffer(dict(type='elastic', set_buffer_size=lambda envstep: 2 + envstep // 100))
        >>> buf.update(300)  # asks set_buffer_size(300)
        >>> buf.current_buffer_size
        5
        >>> buf.close()
    """

    config = ELASTIC_CONFIG
    checks = ELASTIC_CHECKS
    ignored_keys = dingengine_ignored(ELASTIC_CONFIG, 'elastic')

    def _build(self) -> None:
        super()._build()
        self._size_fn: Optional[Callable[[int], Any]] = self._cfg.set_buffer_size
        # DI-engine asks for the size at envstep 0 when it builds the buffer
        self._current = self._ask(0) if self._size_fn is not None else self.replay_buffer_size

    def _ask(self, envstep: int) -> int:
        try:
            size = self._size_fn(envstep)
        except Exception as e:
            raise ValueError(
                f"config key 'set_buffer_size' raised at envstep {envstep}: {type(e).__name__}: {e}"
            ) from e
        return checked_size(size, f'set_buffer_size({envstep})')

    @property
    def current_buffer_size(self) -> int:
        """How many of the newest items sampling may use (may exceed what is stored)."""
        return self._current

    def resize(self, size: int) -> None:
        """Sample among the newest ``size`` items from now on (stored items are kept)."""
        size = checked_size(size, 'size')
        with self._lock:
            self._current = size

    def update(self, info: Any) -> Optional[Dict[str, int]]:
        """
        Overview:
            ``update(envstep)``: set the window to ``set_buffer_size(envstep)`` (DI-engine). A dict (a learner's
            ``priority_info``) changes nothing, as on the naive buffer.
        """
        if isinstance(info, dict) or is_tensordict(info):  # a sampled TensorDict is a dict here
            return super().update(info)
        if isinstance(info, (bool, np.bool_)) or not isinstance(info, (int, np.integer)):
            raise TypeError(f"update takes an envstep (int) or a dict, got {type(info).__name__} {info!r:.40}")
        info = check_step(info, 'envstep')
        if self._size_fn is None:
            raise ValueError(
                "update(envstep) needs config key 'set_buffer_size' (a callable envstep -> size); "
                "without it, call resize(n)"
            )
        size = self._ask(int(info))  # checked before anything changes
        with self._lock:
            self._current = size
        return None

    # ------------------------------------------------------------------ the window
    def _candidates(self, sample_range: Optional[slice]) -> range:
        n = self._storage.ring.count
        window = range(max(0, n - self._current), n)
        return window if sample_range is None else window[sample_range]

    def _units(self) -> int:
        return min(self.count(), self._current)

    # ------------------------------------------------------------------ state
    def _state(self) -> Dict[str, Any]:
        return {**super()._state(), 'current_buffer_size': self._current}

    def _restore(self, state: Dict[str, Any]) -> None:
        size = checked_size(state.get('current_buffer_size', self.replay_buffer_size), 'saved current_buffer_size')
        super()._restore(state)
        self._current = size

    def __repr__(self) -> str:
        return (
            f"ElasticReplayBuffer(instance_name={self._instance_name!r}, count={self.count()}, "
            f"replay_buffer_size={self.replay_buffer_size}, current_buffer_size={self._current})"
        )

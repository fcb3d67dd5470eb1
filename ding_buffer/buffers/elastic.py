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

from typing import Any, Dict, Optional

from ..base import BUFFER_REGISTRY
from ..config import dingengine_ignored
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
    table_args = dict(window=True)

    @property
    def current_buffer_size(self) -> int:
        """How many of the newest items sampling may use (may exceed what is stored)."""
        return self._t.window.size

    def resize(self, size: int) -> None:
        """Sample among the newest ``size`` items from now on (stored items are kept)."""
        self._update(self._t.resize, size, 'resize')

    def update(self, info: Any) -> Optional[Dict[str, int]]:
        """
        Overview:
            ``update(envstep)``: set the window to ``set_buffer_size(envstep)`` (DI-engine). A dict (a learner's
            ``priority_info``) changes nothing, as on the naive buffer.
        """
        return self._update(self._t.update, info)

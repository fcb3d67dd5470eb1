"""``NaiveReplayBuffer`` (``type='naive'``): FIFO ring, uniform sampling, DI-engine semantics -- plus any of the
engine's parts by config: ``max_use`` (DI-engine's impala configs set it on a naive buffer), ``max_staleness``,
``thruput_controller``, a ``sampler`` of your own and ``removers``."""

from typing import Any, Optional

from ..base import BUFFER_REGISTRY
from ..config import CAPACITY_CHECK, SECONDS_CHECK, SEED_CHECK, dingengine_ignored
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG
from .engine import Engine, parts_checks, parts_config, table_attribute
from .slot_table import SlotTable

# The default config (DI-engine style: every key commented) and the value checks of each key.
NAIVE_CONFIG = dict(
    type='naive',
    # Maximum number of items; the oldest is overwritten when full.
    replay_buffer_size=10000,
    # Deep-copy items on push and sampled items on sample (list storage).
    deepcopy=False,
    # Items are dicts whose payload is a file at item['data_id']; delete it when the item leaves.
    enable_track_used_data=False,
    # Period of the push/sample/remove report written to a tb_logger passed in (DI-engine key).
    periodic_thruput_seconds=60.0,
    # Seed of the buffer's own RNG; None draws it from numpy's global RNG (np.random.seed reproduces).
    seed=None,
    # Which items a sample draws: {} = uniform; dict(type=NAME, ...) for a sampler in SAMPLER_REGISTRY.
    sampler={},
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(0.0),
    storage=STORAGE_CONFIG,
)
NAIVE_CHECKS = dict(
    replay_buffer_size=CAPACITY_CHECK,
    periodic_thruput_seconds=SECONDS_CHECK,
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **STORAGE_CHECKS,
)


@BUFFER_REGISTRY.register('naive')
class NaiveReplayBuffer(Engine):
    """
    Overview:
        First-in-first-out ring with uniform sampling. On list storage ``sample`` returns a list of the stored
        objects (copies when ``deepcopy``); on tensor storage one dict of batched tensors with
        ``replay_buffer_idx`` and ``replay_unique_id``.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update`` (no-op), ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``replay_buffer_size``, ``push_count``, ``storage``
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(n), sample O(batch) (with or without replacement), clear O(capacity).
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='naive', replay_buffer_size=4, seed=0))
        >>> buf.push([{'obs': i} for i in range(6)])  # the 2 oldest are overwritten
        6
        >>> sorted(item['obs'] for item in buf.sample(4)), buf.sample(5)  # 5 of 4 without replacement: None
        ([2, 3, 4, 5], None)
        >>> buf.close()
        >>> buf = create_buffer(dict(type='naive', storage=dict(type='tensor')))
        >>> buf.push([{'obs': torch.zeros(3), 'act': 1} for _ in range(5)])
        5
        >>> {key: tuple(value.shape) for key, value in buf.sample(2).items()}  # one dict of batched tensors
        {'obs': (2, 3), 'act': (2,), 'replay_buffer_idx': (2,), 'replay_unique_id': (2,)}
        >>> buf.close()
    """

    sample_kwargs = ('cur_learner_iter', 'sample_range', 'replace')

    config = NAIVE_CONFIG
    checks = NAIVE_CHECKS
    ignored_keys = dingengine_ignored(NAIVE_CONFIG, 'naive')
    table = SlotTable

    storage = table_attribute('storage', 'The item storage (ListStorage or TensorStorage).')

    push_count = table_attribute(
        'push_count', "Items accepted since construction or the last clear (DI-engine's naive buffer restarts it)."
    )

    def sample(
        self,
        size: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        replace: bool = False,
        timeout: Optional[float] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Sample ``size`` items uniformly (or with the configured ``sampler``). ``sample_range`` is a slice over
            insertion order (0 = oldest, ``slice(-k, None)`` = the newest ``k``). Returns ``None`` (and logs
            why) when there are fewer candidates than ``size`` without ``replace``, or none at all; with
            ``timeout`` (seconds) it waits for them and raises ``SampleTimeoutError`` if they never come.
            Stale items (``max_staleness``) leave first; items reaching ``max_use`` leave after the draw.
        Arguments:
            - size (:obj:`int`): batch size (> 0).
            - cur_learner_iter (:obj:`int`): learner iteration (staleness = it - collect_iter).
            - sample_range (:obj:`slice`): restrict to these insertion positions.
            - replace (:obj:`bool`): sample with replacement.
            - timeout (:obj:`float`): ``None`` answers at once (DI-engine); seconds to wait otherwise.
        Returns:
            - batch: a list of items (list storage) or a dict of batched tensors (tensor storage), or ``None``.
        """
        return self._sample(cur_learner_iter, self._t.request(size, sample_range, replace, timeout))

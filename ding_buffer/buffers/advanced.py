"""``AdvancedReplayBuffer`` (``type='advanced'``): prioritized replay with DI-engine's config and semantics.

The engine over a ``PrioritizedTable`` (a slot storage with a priority column: sum / min trees, IS weights, beta
annealing, the sampled-data monitor); eviction by use count and staleness, the rate limiter and monitors are the
engine's parts. Differences from DI-engine are fixes of what ``anchors/dingengine-buffers.md`` marks as bugs (see
``prioritized_table``).
"""

from typing import Any, Dict, Optional

from ..base import BUFFER_REGISTRY
from ..config import CAPACITY_CHECK, SECONDS_CHECK, SEED_CHECK, STEP_CHECK, dingengine_ignored, positive_int
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG
from .engine import Engine, parts_checks, parts_config, table_attribute
from .prioritized_table import PrioritizedTable

# The default config (DI-engine style: every key commented) and the value checks of each key.
ADVANCED_CONFIG = dict(
    type='advanced',
    # Maximum number of items; the oldest is overwritten when full.
    replay_buffer_size=4096,
    # Priority exponent: leaf = priority ** alpha (0 = uniform).
    alpha=0.6,
    # Importance-sampling exponent at the start; annealed to 1 over anneal_step sample calls.
    beta=0.4,
    # Sample calls over which beta grows linearly to 1 (0: no annealing).
    anneal_step=100000,
    # Added to every updated priority so that no item becomes unsampleable.
    eps=1e-5,
    # New items without a priority get the max priority among stored items (TorchRL) instead of the
    # running max of all priorities ever set (DI-engine). Keeps a max tree (+1.2 bytes per item).
    max_priority_within_buffer=False,
    # The running max takes the priority an update stores (priority + eps: DI-engine's PriorityExperienceReplay,
    # behind its deque and task buffers) instead of the one given (DI-engine's AdvancedReplayBuffer).
    max_priority_plus_eps=False,
    # Items are dicts whose payload is a file at item['data_id']; delete it when the item leaves.
    enable_track_used_data=False,
    # Deep-copy items on push and sampled items on sample (list storage).
    deepcopy=False,
    # Seed of the buffer's own RNG; None draws it from numpy's global RNG (np.random.seed reproduces).
    seed=None,
    # Which items a sample draws: {} or dict(type='prioritized') -- by priority, with the keys above (the only
    # sampler of this type; a uniform or a sampler of your own goes on type='naive').
    sampler={},
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(1.0),
    monitor=dict(
        # Moving window (sample calls) and print/TensorBoard period (sample calls) of sampled-data stats.
        sampled_data_attr=dict(average_range=5, print_freq=200),
        # Period of the push/sample/remove throughput report.
        periodic_thruput=dict(seconds=60.0),
        # Without a tb_logger passed in, write TensorBoard to ./{exp_name}/log/{instance_name}/.
        tensorboard=False,
    ),
    storage=STORAGE_CONFIG,
)
ADVANCED_CHECKS = dict(
    replay_buffer_size=CAPACITY_CHECK,
    alpha=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    beta=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    anneal_step=STEP_CHECK,
    eps=(lambda x: 0 <= x <= 1, 'a number in [0, 1] (added to every priority, which is kept in float32)'),
    seed=SEED_CHECK,
    **parts_checks(1.0),
    **{
        'monitor.sampled_data_attr.average_range': (  # the length of a deque: a C ssize_t
            lambda x: positive_int(x) and x < 1 << 63,
            'a positive int < 2**63',
        ),
        'monitor.sampled_data_attr.print_freq': (positive_int, 'a positive int'),
        'monitor.periodic_thruput.seconds': SECONDS_CHECK,
    },
    **STORAGE_CHECKS,
)


@BUFFER_REGISTRY.register('advanced')
class AdvancedReplayBuffer(Engine):
    """
    Overview:
        Prioritized experience replay (Schaul et al.) with use-count and staleness eviction, a push/sample
        rate limiter and monitors. ``sample`` draws stratified by priority (with replacement) and adds
        ``replay_unique_id``, ``replay_buffer_idx``, ``priority``, ``staleness``, ``use`` and ``IS``;
        ``update`` takes those ids back with new priorities.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update``, ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``beta`` (settable), ``alpha``, ``replay_buffer_size``, ``push_count``, ``storage``
    Thread-safety: every public method holds the buffer's lock; ``sample(timeout=...)`` waits on a condition
        of that lock, so pushes proceed while a sampler waits.
    Complexity: push O(n log8 C), sample O(B log8 C) (O(m) with ``sample_range`` selecting m items),
        update O(B log8 C), stats O(1).
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='advanced', replay_buffer_size=8, seed=0))
        >>> buf.push([{'obs': i} for i in range(8)])
        8
        >>> batch = buf.sample(4)
        >>> len(batch), sorted(batch[0])
        (4, ['IS', 'obs', 'priority', 'replay_buffer_idx', 'replay_unique_id', 'staleness', 'use'])
        >>> [item['IS'] for item in batch]  # new items get the running max priority (1.0): equal weights
        [1.0, 1.0, 1.0, 1.0]
        >>> ids, idx = [item['replay_unique_id'] for item in batch], [item['replay_buffer_idx'] for item in batch]
        >>> buf.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': [2.0, 2.0, 2.0, 2.0]})
        {'updated': 4, 'stale': 0}
        >>> buf.close()
    """

    sample_kwargs = ('cur_learner_iter', 'sample_range')

    config = ADVANCED_CONFIG
    checks = ADVANCED_CHECKS
    ignored_keys = dingengine_ignored(ADVANCED_CONFIG, 'advanced')
    table = PrioritizedTable

    storage = table_attribute('storage', 'The item storage (ListStorage or TensorStorage).')

    push_count = table_attribute(
        'push_count', "Items accepted since construction (DI-engine's advanced buffer keeps counting across clear)."
    )

    @property
    def beta(self) -> float:
        return self._t.beta.value

    @beta.setter
    def beta(self, value: float) -> None:
        self._t.beta.set(value)

    alpha = table_attribute('alpha', 'The priority exponent (config key alpha; fixed for the buffer).')

    def sample(
        self,
        size: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        timeout: Optional[float] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Draw ``size`` items with probability ``priority ** alpha / sum`` (stratified, with replacement).
            Stale items are evicted first; items reaching ``max_use`` are removed after the draw; beta anneals
            once per call. ``sample_range`` restricts the draw to a slice of insertion order (0 = oldest).
        Arguments:
            - size (:obj:`int`): batch size (> 0).
            - cur_learner_iter (:obj:`int`): learner iteration (staleness = it - collect_iter).
            - sample_range (:obj:`slice`): e.g. ``slice(-1000, None)`` for the newest 1000 items.
            - timeout (:obj:`float`): ``None`` returns ``None`` at once when not allowed (DI-engine); a number
              of seconds waits until allowed and raises ``SampleTimeoutError`` if it never is.
        Returns:
            - batch: list of dicts (list storage) or one dict of batched tensors (tensor storage), or ``None``.
        """
        return self._sample(cur_learner_iter, self._t.request(size, cur_learner_iter, sample_range, timeout))

    def update(self, info: Dict[str, Any]) -> Dict[str, int]:
        """
        Overview:
            Set new priorities for sampled items. ``info`` holds ``replay_unique_id``, ``replay_buffer_idx`` and
            ``priority`` (lists, arrays or tensors of equal length). An entry applies only where the id still
            lives in that slot (and the item is not retired by ``max_use``); the others are counted as stale.
            Stored priority is ``priority + eps``. Without ``priority`` it is a no-op.
            All or nothing: NaN / inf / negative priorities, bad slots or mismatched lengths raise
            ``ValueError`` (``TypeError`` for wrong types) and change nothing. A sampled TensorDict is taken as
            the dict of its entries.
        Returns:
            - result (:obj:`dict`): ``{'updated': n, 'stale': m}``.
        """
        return self._update(self._t.update, info)

"""GFlowNet replay buffers (torchgfn's behaviour, with its reported problems fixed):

* ``gfn`` -- ``GFlowNetReplayBuffer``: keep the best ``replay_buffer_size`` items by log-reward
  (``prioritized_capacity``) or the newest (FIFO); sample uniformly or by reward (``prioritized_sampling``,
  torchgfn#336), with or without replacement; ``lazy_sort`` defers truncation to ``2 * capacity`` items.
* ``gfn_diverse`` -- ``DiverseGFlowNetReplayBuffer`` (torchgfn's ``NormBasedDiversePrioritizedReplayBuffer``):
  keep-best plus a p-norm diversity filter on the terminating states once the buffer is full.
* ``terminating_state`` -- ``TerminatingStateBuffer``: only terminating states and their log-rewards
  (torchgfn#201: any container kind goes in).

Differences from torchgfn, on purpose: ``sample`` sees items waiting in a lazy buffer (torchgfn raises "Buffer
is empty" before its first flush); ties in reward are broken by age (oldest leaves first) instead of by an
unstable sort; the diverse filter compares a batch with the *stored* items only and computes exact distances
(torchgfn#175); an empty or too-small buffer returns ``None`` from ``sample`` (the ``IBuffer`` contract) instead
of raising or silently returning fewer items; ``save_data``/``load_data`` round-trip contents, counters and
settings (torchgfn's save is skipped as broken upstream).
"""

from typing import Any, Dict, Optional

import numpy as np

from ..base import BUFFER_REGISTRY
from ..config import CAPACITY_CHECK, SEED_CHECK, positive_int
from ..storage import META_KEYS, device_ok
from .engine import Engine, parts_checks, parts_config, table_attribute
from .reward_table import RewardTable


def _key(x: Any) -> bool:
    """A field name a dict batch can hold: not one of the ids a sample adds (storage drops them from a push)."""
    return isinstance(x, str) and bool(x) and x not in META_KEYS


# The default config (DI-engine style: every key commented) and the value checks of each key.
GFN_CONFIG = dict(
    type='gfn',
    # Capacity in items (torchgfn's default is 1000).
    replay_buffer_size=1000,
    # Keep the highest log-rewards when full (ties: the newest stay); False keeps the newest (FIFO).
    prioritized_capacity=False,
    # Sample with probability softmax(log_reward) instead of uniformly.
    prioritized_sampling=False,
    # None: with replacement only when asked for more items than stored (torchgfn); True / False: always.
    sample_replacement=None,
    # Defer truncation until stored + incoming reaches 2 * capacity (waiting items are sampled too).
    lazy_sort=False,
    # Field names in dict batches: the terminating state, its log-reward and an optional condition.
    state_key='state',
    log_reward_key='log_reward',
    condition_key=None,
    # Device of dict-batch tensors (containers stay where they are).
    device='cpu',
    # Seed of the buffer's own RNG; None draws it from numpy's global RNG.
    seed=None,
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(0.0),
    monitor=dict(
        # Write stats() to TensorBoard every `log_every` pushes ({instance}_iter/...).
        tensorboard=False,
        log_every=100,
    ),
)
GFN_CHECKS = dict(
    replay_buffer_size=CAPACITY_CHECK,
    sample_replacement=(lambda x: x is None or isinstance(x, bool), 'None, True or False'),
    state_key=(_key, 'a non-empty str, not replay_unique_id / replay_buffer_idx'),
    log_reward_key=(_key, 'a non-empty str, not replay_unique_id / replay_buffer_idx'),
    condition_key=(lambda x: x is None or _key(x), 'None or a non-empty str, not replay_unique_id / replay_buffer_idx'),
    device=(device_ok, "'cpu', 'cuda' or 'cuda:N'"),
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **{'monitor.log_every': (positive_int, 'a positive int')},
)


@BUFFER_REGISTRY.register('gfn')
class GFlowNetReplayBuffer(Engine):
    """
    Overview:
        Reward-aware buffer of GFlowNet samples. ``push`` takes a dict of batched tensors, a list of item dicts
        or a Container (torchgfn ``Trajectories`` / ``Transitions`` / ``StatesContainer``); ``sample`` returns
        the same kind: one dict of batched tensors (with ``replay_unique_id`` / ``replay_buffer_idx``) or a
        container of the pushed type. ``add`` is torchgfn's name for ``push``.
    Interfaces:
        ``push``/``add``, ``sample``, ``stats``, ``clear``, ``count``, ``state_dict``, ``load_state_dict``,
        ``save_data``, ``load_data``, ``close``; ``update`` is a no-op (the priority is the log-reward).
        The engine's parts compose by config: ``max_use``, ``max_staleness`` (items' ``collect_iter`` field),
        ``thruput_controller`` (with ``sample(timeout=)``) and ``removers``.
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(batch) while below capacity -- stored items are never copied: dict batches and torchgfn
    containers are written in place at their slots (``ColumnStore``, ``ContainerRing``); a truncating push adds
    O(evicted) index work for FIFO (insertion order is kept) and O(capacity) for ``prioritized_capacity``, no data
    copy (``lazy_sort``: once per ``capacity`` items); unique states are hashed in bulk when ``stats()`` reads them
    (O(1) amortised per item); sample O(capacity + size log size) index work plus O(size) data (uniform from a full
    buffer: O(size)).
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='gfn', replay_buffer_size=3, prioritized_capacity=True, seed=0))
        >>> buf.push({'state': torch.arange(10).reshape(5, 2), 'log_reward': torch.tensor([0.0, 4.0, 1.0, 3.0, 2.0])})
        3
        >>> batch = buf.sample(3)  # the 3 best rewards were kept
        >>> sorted(batch), tuple(batch['state'].shape), sorted(batch['log_reward'].tolist())
        (['log_reward', 'replay_buffer_idx', 'replay_unique_id', 'state'], (3, 2), [2.0, 3.0, 4.0])
        >>> buf.close()
    """

    item_kind = 'trajectory'
    sample_kwargs = ('cur_learner_iter', 'replace', 'n_samples')
    has_log_rewards = True

    config = GFN_CONFIG
    checks = GFN_CHECKS
    key_aliases = {'capacity': 'replay_buffer_size'}  # torchgfn's name of the key

    # ------------------------------------------------------------------ construction
    @classmethod
    def distributed_profile(cls, cfg: Any) -> Dict[str, Any]:
        """A pushed dict is a batch; the manager scores with the state, log-reward and condition fields."""
        get = lambda k: cfg.get(k, cls.config[k])  # noqa: E731
        scoring = [get('state_key'), get('log_reward_key')] + ([get('condition_key')] if get('condition_key') else [])
        return {
            'dict_is_batch': True,
            'log_reward_key': get('log_reward_key'),
            'scoring_keys': scoring,
            **cls.capabilities(),
        }

    table = RewardTable
    table_args = dict(defaults=GFN_CONFIG, checks=GFN_CHECKS)  # a restore rebuilds the config with saved settings

    @property
    def capacity(self) -> int:
        return self._cfg.replay_buffer_size

    # torchgfn's attributes, read by code written against its buffers
    @property
    def prioritized_capacity(self) -> bool:
        return self._t.prioritized()

    @property
    def prioritized_sampling(self) -> bool:
        return bool(self._cfg.prioritized_sampling)

    device = table_attribute('torch_device', 'The device of dict-batch tensors (config key device).')

    env = table_attribute(
        'env',
        'The environment of the stored torchgfn containers (None before the first container is pushed, '
        'and for dict batches).',
    )

    training_container = table_attribute(
        'training_container',
        'Every stored item, oldest first, as one batch of the stored kind (a copy); None before the first push.',
    )

    storage = table_attribute('storage', 'ColumnStore, ContainerRing or ContainerStore (None before the first push).')

    def add(self, data: Any) -> None:
        """torchgfn's ``add``: ``push`` without a return value."""
        self.push(data)

    def push(self, data: Any, cur_collector_envstep: int = -1, batched: Optional[bool] = None) -> int:
        """
        Overview:
            Offer a batch; returns how many of its items were stored (filters and capacity may drop some).
            All or nothing on bad input: a ``TypeError``/``ValueError`` leaves the buffer unchanged.
        Arguments:
            - data: dict of batched tensors, list of item dicts, or a Container.
            - cur_collector_envstep (:obj:`int`): recorded for monitors.
            - batched: accepted for ``IBuffer`` compatibility; dicts are always batches here.
        """
        return self._push_with(cur_collector_envstep, lambda: self._t.prepare_push(data))

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        """A batch: ``push`` (dicts are always batches here)."""
        return self.push(batch, cur_collector_envstep, True)

    def sample(
        self,
        size: Optional[int] = None,
        cur_learner_iter: int = -1,
        replace: Optional[bool] = None,
        timeout: Optional[float] = None,
        n_samples: Optional[int] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Draw ``size`` items: uniformly, or with probability ``softmax(log_reward)`` when
            ``prioritized_sampling``. ``replace`` (default: the config's ``sample_replacement``; None = only when
            ``size`` exceeds the stored count). Items waiting in a lazy buffer are included. ``timeout``
            (seconds) waits until the draw is possible, else ``SampleTimeoutError``.
        Returns:
            - batch: dict of batched tensors, or a container of the pushed type; ``None`` (logged) when the
              buffer is empty, or holds fewer than ``size`` items and sampling is without replacement.
            ``n_samples`` is torchgfn's name for ``size``.
        """
        return self._sample(cur_learner_iter, self._t.request(size, replace, timeout, n_samples))

    def log_rewards(self) -> np.ndarray:
        """Log-rewards of the stored items (float64 copy, any order; used for the manager's baseline)."""
        return self._t.log_rewards()

    def load_data(self, path: str, allow_pickle: bool = False, env: Any = None) -> None:
        """
        Overview:
            Restore a ``save_data`` file: contents, counters and settings (capacity, flags, keys, filter).
            torchgfn containers are rebuilt from plain tensors with ``env`` (default: the env of the container
            this buffer already holds); other container objects need ``allow_pickle=True``.
        """
        self._t.restoring_with(env, lambda: Engine.load_data(self, path, allow_pickle=allow_pickle))

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False, env: Any = None) -> None:
        """Restore a ``state_dict()``, as ``load_data`` restores a file (``env``: the environment torchgfn
        containers are rebuilt with; default: the env of the container this buffer already holds)."""
        self._t.restoring_with(env, lambda: Engine.load_state_dict(self, state, deepcopy))

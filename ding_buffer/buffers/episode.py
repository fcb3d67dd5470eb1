"""``EpisodeReplayBuffer`` (``type='episode'``): whole episodes in, whole episodes or fixed-length windows out --
uniformly, or (``sampler=dict(type='prioritized', unroll_len=T, ...)``, registered as ``prioritized_episode``)
prioritized sequence replay. Any of the engine's parts compose by config: ``max_use`` and ``max_staleness``
(per episode), ``thruput_controller``, ``removers``."""

from typing import Any, Dict, Optional

from ..base import BUFFER_REGISTRY
from ..config import SECONDS_CHECK, SEED_CHECK, capacity_int, dingengine_ignored
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG
from .engine import Engine, parts_checks, parts_config, table_attribute
from .episode_table import EpisodeTable

# The default config (DI-engine style: every key commented) and the value checks of each key.
EPISODE_CONFIG = dict(
    type='episode',
    # Maximum number of stored episodes.
    replay_buffer_size=1000,
    # Maximum number of stored transitions (required with storage.type='tensor'); None = no limit.
    max_transitions=None,
    # Let episodes shorter than unroll_len give one zero-padded window (with a mask) instead of none.
    pad_short_episodes=False,
    deepcopy=False,
    # Not supported for episodes (kept so DI-engine configs load); must stay False.
    enable_track_used_data=False,
    # Period of the push/sample/remove report written to a tb_logger passed in (DI-engine key).
    periodic_thruput_seconds=60.0,
    seed=None,
    # {} = uniform; dict(type='prioritized', unroll_len=T, alpha=0.6, beta=0.4, eta=0.9, eps=1e-5,
    # anneal_step=0) = prioritized windows (tensor storage).
    sampler={},
    # max_use, max_staleness, removers, thruput_controller: the engine's parts (engine.parts_config).
    **parts_config(0.0),
    storage=STORAGE_CONFIG,
)
EPISODE_CHECKS = dict(
    replay_buffer_size=(capacity_int, 'a positive int at most 2**40 (number of episodes)'),
    max_transitions=(lambda x: x is None or capacity_int(x), 'None or a positive int at most 2**40'),
    enable_track_used_data=(lambda x: x is False, 'False (episode buffers do not track used data)'),
    periodic_thruput_seconds=SECONDS_CHECK,
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **STORAGE_CHECKS,
)


@BUFFER_REGISTRY.register('episode')
class EpisodeReplayBuffer(Engine):
    """
    Overview:
        Each element is a whole episode: a list of transition dicts, or a dict of time-stacked leaves
        (``[T, ...]``). ``push`` takes one dict episode or a list of episodes (a list is always a list of
        episodes, as in DI-engine: wrap a single list episode as ``[episode]``).
        Capacity is ``replay_buffer_size`` episodes and, optionally, ``max_transitions`` transitions; the
        oldest whole episodes are evicted to make room.
        ``sample(size)`` returns whole episodes; ``sample(size, unroll_len=T)`` returns windows of ``T``
        consecutive transitions drawn uniformly among all valid windows of all stored episodes.
    Output:
        list storage -- whole episodes: a list of the stored episodes; windows: a list of windows of the
        episode's own type (list episodes padded with ``None``; dict episodes zero-padded plus ``mask``;
        TensorDict episodes as TensorDicts of ``batch_size=[T]``, zero-padded plus ``mask``).
        tensor storage -- whole episodes: a list of dicts of ``[L, ...]`` tensors; windows: one dict of
        ``[B, T, ...]`` tensors with ``mask`` [B, T], ``episode_id``, ``episode_idx``, ``start`` [B] and
        ``replay_buffer_idx``/``replay_unique_id`` [B, T].
    Thread-safety: every public method holds the buffer's lock.
    Complexity: push O(L); sample O(episodes + batch * T) (a cumulative sum over episode window counts).
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='episode', replay_buffer_size=4, seed=0))
        >>> buf.push([[{'ep': e, 't': t} for t in range(n)] for e, n in ((0, 3), (1, 5))])  # two list episodes
        2
        >>> buf.count(), buf.transition_count, buf.episode_len
        (2, 8, [3, 5])
        >>> sorted(len(episode) for episode in buf.sample(2))  # whole episodes
        [3, 5]
        >>> windows = buf.sample(3, unroll_len=2)  # windows of 2 consecutive steps of one episode
        >>> [len(w) for w in windows], {(w[1]['ep'] - w[0]['ep'], w[1]['t'] - w[0]['t']) for w in windows}
        ([2, 2, 2], {(0, 1)})
        >>> buf.close()
    """

    item_kind = 'episode'
    sample_kwargs = ('cur_learner_iter', 'sample_range', 'replace', 'unroll_len', 'pad')

    config = EPISODE_CONFIG
    checks = EPISODE_CHECKS
    ignored_keys = dingengine_ignored(EPISODE_CONFIG, 'episode')
    tensordict_batch_is_items = False  # a TensorDict with batch_size [T] is one episode of T steps

    table = EpisodeTable

    push_count = table_attribute('push_count', 'Episodes accepted since construction or the last clear.')

    episode_len = table_attribute(
        'episode_len', 'Lengths of the stored episodes, oldest first (empty slots are not listed).'
    )

    transition_count = table_attribute('transition_count', 'Total number of stored transitions.')

    storage = table_attribute(
        'storage', "Where the data lives: the episodes' ListStorage (list) or the transitions' TensorStorage."
    )

    def sample(
        self,
        size: int,
        cur_learner_iter: int = -1,
        sample_range: Optional[slice] = None,
        replace: Optional[bool] = None,
        unroll_len: Optional[int] = None,
        pad: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> Optional[Any]:
        """
        Overview:
            Sample ``size`` whole episodes (uniform over episodes), or with ``unroll_len=T`` ``size`` windows of
            ``T`` consecutive transitions, uniform over all valid windows (an episode of length ``L`` offers
            ``L - T + 1``; with ``pad`` an episode shorter than ``T`` offers one padded window).
            ``sample_range`` selects episodes by insertion order. Returns ``None`` (logged) when there are
            fewer candidates than ``size`` without ``replace`` (default False); with ``timeout`` (seconds) it
            waits for them and raises ``SampleTimeoutError`` if they never come.
            With the prioritized sampler: windows of the configured ``sampler.unroll_len`` (the default of
            ``unroll_len``), drawn with replacement by window priority, plus ``priority`` and ``IS`` [B];
            ``sample_range``, ``pad`` and ``replace=False`` are refused.
        """
        return self._sample(cur_learner_iter, self._t.request(size, sample_range, replace, unroll_len, pad, timeout))

    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """
        Overview:
            With prioritized windows: new priorities for sampled windows (see ``prioritized_windows``), keyed by
            the ``replay_unique_id`` / ``replay_buffer_idx`` a sample returned; stale entries are counted. All or
            nothing. With uniform sampling a no-op returning ``{'updated': 0, 'stale': 0}``.
        """
        return self._update(self._t.update, info)


# the R2D2 preset is the episode buffer with prioritized windows by default (and an EpisodeReplayBuffer for isinstance)
@BUFFER_REGISTRY.register('prioritized_episode')
class PrioritizedEpisodeReplayBuffer(EpisodeReplayBuffer):
    """
    Overview:
        Prioritized sequence replay (R2D2): the episode buffer on tensor storage with
        ``sampler=dict(type='prioritized', ...)`` and the paper's defaults (priority exponent 0.9, importance
        exponent 0.6, eta 0.9, sequences of 80 steps). ``sample(B)`` returns ``[B, T, ...]`` windows with ``mask``,
        ``priority`` and ``IS``; ``update`` takes per-window or per-step priorities back by id.
    Examples:
        >>> import torch
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='prioritized_episode', replay_buffer_size=4, max_transitions=32, seed=0,
        ...                          sampler=dict(unroll_len=4)))  # the other sampler keys keep the defaults
        >>> buf.push([{'obs': torch.zeros(n, 3), 'act': torch.arange(n)} for n in (6, 8)])  # dicts of [L, ...]
        2
        >>> out = buf.sample(3)  # 3 windows of 4 steps
        >>> tuple(out['obs'].shape), tuple(out['mask'].shape), out['act'].diff(dim=1).tolist()[0], out['IS'].tolist()
        ((3, 4, 3), (3, 4), [1, 1, 1], [1.0, 1.0, 1.0])
        >>> buf.update({'replay_unique_id': out['replay_unique_id'], 'replay_buffer_idx': out['replay_buffer_idx'],
        ...             'priority': torch.tensor([2.0, 0.5, 1.0])})  # one priority per window
        {'updated': 3, 'stale': 0}
        >>> buf.close()
    """

    config = dict(
        EpisodeReplayBuffer.config,
        type='prioritized_episode',
        max_transitions=100000,
        sampler=dict(type='prioritized', unroll_len=80, alpha=0.9, beta=0.6, eta=0.9, eps=1e-5, anneal_step=0),
        storage=dict(EpisodeReplayBuffer.config['storage'], type='tensor'),
    )
    # (the defaults above are merged into the user's sampler section: they belong to the prioritized sampler only)
    checks = dict(
        EPISODE_CHECKS,
        **{'sampler.type': (lambda x: x == 'prioritized', "'prioritized' (type='episode' takes other samplers)")},
    )

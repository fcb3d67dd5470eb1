"""``NaiveReplayBuffer`` (``type='naive'``): FIFO ring, uniform sampling, DI-engine semantics -- plus any of the
engine's parts by config: ``max_use`` (DI-engine's impala configs set it on a naive buffer), ``max_staleness``,
``thruput_controller``, a ``sampler`` of your own and ``removers``."""

from typing import Any, Dict, List, Optional

from ..base import BUFFER_REGISTRY
from ..config import SEED_CHECK, dingengine_ignored, positive_int
from ..control.capacity import index_for
from ..control.samplers import UniformSampler, build_sampler, check_positions
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, build_storage, storage_from_state
from .engine import parts_checks, parts_config
from .slot_engine import SlotEngine

NO_PRIORITY = "a naive buffer's items carry no priority: use type='advanced' for prioritized replay"


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
    replay_buffer_size=(positive_int, 'a positive int'),
    periodic_thruput_seconds=(lambda x: x > 0, 'a positive number of seconds'),
    seed=SEED_CHECK,
    **parts_checks(0.0),
    **STORAGE_CHECKS,
)


@BUFFER_REGISTRY.register('naive')
class NaiveReplayBuffer(SlotEngine):
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

    resets_push_count = True  # DI-engine's naive buffer restarts push_count on clear

    def _build(self) -> None:
        cfg = self._cfg
        self._sampler = build_sampler(cfg.sampler, 'uniform', (False, NO_PRIORITY))
        self._storage = build_storage(cfg.storage, cfg.replay_buffer_size, index_cls=index_for(cfg))
        self._build_engine(cfg.replay_buffer_size)
        self._build_monitors(False, cfg.periodic_thruput_seconds)
        # No part to tell about a single push (no rate limit, use counts or report): the storage's fast path alone
        self._lean = (
            not self._limiter.active
            and self._uses is None
            and self._periodic is None
            and self._remover is None
            and self._capacity is None
        )
        self._own_sampler = type(self._sampler) is not UniformSampler  # its answers are checked

    # ------------------------------------------------------------------ push
    def _push_items(self, items: List[Any]) -> int:
        if len(items) == 1:  # tensor storage's single-item fast path
            if self._lean:
                if self._storage.write_one(items[0]) is not None:
                    if self._limiter.waiting:
                        self._limiter.on_push(1)  # wake samplers waiting for data
                    return 1
            elif not self._limiter.active and self._remover is None and self._write_one(items[0]):
                return 1
        prepared = self._storage.prepare(items)  # validated before the limiter decides (a bad push is an error)
        if self._limiter.active and not self._admit(len(items)):
            return self._not_written(prepared)
        return self._write(prepared)

    def _push_batch(self, batch: Any) -> int:
        if self._batch_fast_ok():
            checked = self._storage.check_batch(batch)
            if checked is not None:
                return len(self._write_batch_fast(checked))
        prepared = self._storage.prepare_batch(batch)
        if self._limiter.active and not self._admit(prepared.n + prepared.dropped):
            return self._not_written(prepared)
        return self._write(prepared)

    # ------------------------------------------------------------------ sample
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
        self._check_range(sample_range)
        if type(replace) is not bool:
            raise TypeError(f"replace must be a bool, got {type(replace).__name__} {replace!r:.40}")
        return self._sample_flow(
            size,
            cur_learner_iter,
            timeout,
            lambda: self._draw(size, sample_range, replace),
            lambda: self._shortfall(size, sample_range, replace)[0],
        )

    def _shortfall(self, size: int, sample_range: Optional[slice], replace: bool):
        """(why ``size`` items cannot be drawn now or '', the candidate insertion positions)."""
        positions = self._candidates(sample_range)
        m = len(positions)
        if m == 0:
            return ('buffer is empty' if self.count() == 0 else f'{sample_range} selects nothing'), positions
        if not replace and m < size:
            return f'{m} candidate items < batch size {size} and replace=False', positions
        return '', positions

    def _draw(self, size: int, sample_range: Optional[slice], replace: bool) -> Optional[Any]:
        why, positions = self._shortfall(size, sample_range, replace)
        if why:
            return self._refused(why)
        m, size = len(positions), int(size)
        idx = self._sampler.draw(self._rng, m, size, replace)
        if self._own_sampler:
            if idx is None:
                return self._refused(f'sampler {self._cfg.sampler.get("type")!r} refused')
            idx = check_positions(idx, m, size, self._cfg.sampler.get('type'))
        if positions.start or positions.step != 1:  # a sample_range, or a preset's window (elastic)
            idx = positions.start + idx * positions.step
        slots = self._storage.ring.slots_of_positions(idx)
        out = self._storage.gather(slots)
        self._drawn(slots, size)
        return self._copy_out(out) if self._storage.kind == 'list' else out

    # ------------------------------------------------------------------ clear / state
    def _state(self) -> Dict[str, Any]:
        return {'storage': self._storage.state_dict(), **self._engine_state()}

    def _restore(self, state: Dict[str, Any]) -> None:
        if 'storage' not in state:
            raise ValueError("state has no 'storage' entry")
        storage = storage_from_state(
            self._cfg.storage, self._cfg.replay_buffer_size, state['storage'], index_cls=index_for(self._cfg)
        )
        swap = self._engine_restored(state, storage.ring.valid, required=False)  # files of 0.1 have no counters
        self._storage = storage
        swap()
        self._capacity_rebuilt()

    def __repr__(self) -> str:
        return (
            f"NaiveReplayBuffer(instance_name={self._instance_name!r}, count={self.count()}, "
            f"replay_buffer_size={self.replay_buffer_size}, storage={self._storage!r})"
        )

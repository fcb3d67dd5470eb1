"""``AdvancedReplayBuffer`` (``type='advanced'``): prioritized replay with DI-engine's config and semantics.

Composition: a storage (list or tensor) + ``PriorityIndex`` (priorities, use counts, sum/min trees) + eviction
by use count and staleness + ``ThruputController`` + monitors. Differences from DI-engine are fixes of what
``anchors/dingengine-buffers.md`` marks as bugs: ``sample_range`` is exact for every slice (insertion order),
non-finite or negative priorities are ``ValueError`` (all or nothing), ``update`` reports stale entries and
never revives retired items, pushed and stored dicts are never mutated, refusals are counted in ``stats()``.
"""

from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch

from ..base import BUFFER_REGISTRY
from ..config import INF, SEED_CHECK, dingengine_ignored, positive_int
from ..control.capacity import index_for
from ..control.priority import (
    MAX_PRIORITY,
    BetaSchedule,
    PriorityIndex,
    batch_priorities,
    item_priorities,
    parse_update,
)
from ..control.samplers import SAMPLER_REGISTRY
from ..errors import SampleTimeoutError  # noqa: F401 (re-exported: raised by sample(timeout=...))
from ..monitor.sampled_data import SampledDataAttrMonitor
from ..monitor.tb import emit, rank
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, build_storage, storage_from_state
from ..storage.tensordict_io import is_tensordict, update_info
from .engine import COUNTERS, parts_checks, parts_config  # noqa: F401 (COUNTERS re-exported)
from .outputs import with_extras
from .slot_engine import SlotEngine

# Keys added to sampled items; ignored (tensor storage) when such an item is pushed back.
SAMPLE_KEYS = ('priority', 'IS', 'staleness', 'use')


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
    replay_buffer_size=(positive_int, 'a positive int'),
    alpha=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    beta=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    anneal_step=(lambda x: x >= 0 and x == int(x), 'an int >= 0'),
    eps=(lambda x: 0 <= x < INF, 'a finite number >= 0'),
    seed=SEED_CHECK,
    **parts_checks(1.0),
    **{
        'monitor.sampled_data_attr.average_range': (positive_int, 'a positive int'),
        'monitor.sampled_data_attr.print_freq': (positive_int, 'a positive int'),
        'monitor.periodic_thruput.seconds': (lambda x: x > 0, 'a positive number of seconds'),
    },
    **STORAGE_CHECKS,
)


# Priority dtypes the compiled update takes (native byte order); float16 (mixed precision) and others take the
# checking path, which converts them.
_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _flat_array(x: Any) -> Optional[np.ndarray]:
    """A 1-d numpy view of a CPU tensor or array (no copy), else None."""
    if type(x) is not np.ndarray:
        if not isinstance(x, torch.Tensor):
            return None
        try:  # CPU tensors only; numpy() refuses the others (device, grad, conj / neg bits, layout)
            x = x.numpy()
        except (TypeError, RuntimeError):
            if not x.requires_grad:
                return None
            try:
                x = x.detach().numpy()
            except (TypeError, RuntimeError):
                return None
    return x if x.ndim == 1 else None


def check_sampler(section: Mapping) -> None:
    """The ``sampler`` section of ``advanced``: ``{}`` or ``dict(type='prioritized')`` (what it does anyway); anything
    else is a ``ValueError`` saying why.

    Examples:
        >>> check_sampler({}), check_sampler(dict(type='prioritized'))
        (None, None)
        >>> check_sampler(dict(type='uniform'))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: config key 'sampler.type' is 'uniform', but type 'advanced' draws by priority ...
    """
    section = dict(section)
    name = section.pop('type', 'prioritized')
    if not isinstance(name, str):
        raise ValueError(f"config key 'sampler.type' must be a str, got {name!r}")
    SAMPLER_REGISTRY.get(name)  # an unknown name: the registry's message (registered names, import_names)
    if name != 'prioritized':
        raise ValueError(
            f"config key 'sampler.type' is {name!r}, but type 'advanced' draws by priority (its sum tree, IS weights "
            f"and update() are that sampler); for {name!r} draws use type='naive' with sampler=dict(type={name!r})"
        )
    if section:
        raise ValueError(
            f"config key 'sampler.{sorted(section)[0]}': type 'advanced' takes its prioritized sampler's arguments "
            "as top-level keys (alpha, beta, anneal_step, eps); leave sampler={} or dict(type='prioritized')"
        )


@BUFFER_REGISTRY.register('advanced')
class AdvancedReplayBuffer(SlotEngine):
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

    uses_counted = True
    indexed = True

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        cfg = self._cfg
        check_sampler(cfg.sampler)
        self._storage = build_storage(
            cfg.storage, cfg.replay_buffer_size, reserved_keys=SAMPLE_KEYS, index_cls=index_for(cfg)
        )
        self._index = self._new_index()
        self.alpha = float(cfg.alpha)
        self._beta = BetaSchedule(cfg.beta, int(cfg.anneal_step))
        self._build_engine(cfg.replay_buffer_size)
        self._build_monitors(cfg.monitor.get('tensorboard', False), cfg.monitor.periodic_thruput.seconds)
        attr = cfg.monitor.sampled_data_attr
        self._sampled_monitor = SampledDataAttrMonitor(
            self._instance_name, attr.average_range, attr.print_freq, self._logger, self._tb if rank() == 0 else None
        )

    def _new_index(self) -> PriorityIndex:
        cfg = self._cfg
        return PriorityIndex(cfg.replay_buffer_size, cfg.alpha, cfg.eps, with_max=cfg.max_priority_within_buffer)

    # ------------------------------------------------------------------ properties / table verbs
    @property
    def beta(self) -> float:
        return self._beta.value

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta.set(value)

    def _on_removed(self, slots: np.ndarray) -> None:
        self._index.clear_slots(slots)

    def _on_written(self, slots: np.ndarray, priorities: Optional[np.ndarray]) -> None:
        self._index.set_new(slots, priorities)

    def _on_written_one(self, slot: int, priority: Optional[float]) -> None:
        self._index.set_new_one(slot, priority)

    def _drop_used(self, slots: np.ndarray) -> None:
        if self._remover is not None:  # DI-engine: keep the item (its file), just never sample it again
            self._index.retire(slots)
            self._priorities_changed(slots)
        else:
            self._remove(slots, 'removed_by_use')

    # ------------------------------------------------------------------ columns (capacity rules read them)
    admission_columns = ('priority',)

    def _columns(self) -> Dict[str, Any]:
        return {**super()._columns(), 'priority': lambda slots: self._index.priorities(slots)}

    def _new_values(self, column: str, priorities: Optional[np.ndarray], n: int) -> np.ndarray:
        """The priorities of ``n`` items about to be written, as ``priority`` will report them."""
        p = np.full(n, self._index.default_priority()) if priorities is None else priorities
        return self._index.as_stored(p)

    def _priorities_changed(self, slots: np.ndarray) -> None:
        if self._capacity is not None and self._capacity.column == 'priority':
            self._capacity.on_changed(self.view, slots)

    # ------------------------------------------------------------------ push
    def _push_items(self, items: List[Any]) -> int:
        if len(items) == 1 and self._push_one_fast(items[0]):
            return 1
        prepared = self._storage.prepare(items)  # validated before the limiter decides (a bad push is an error)
        priorities = item_priorities(items, self._index.default_priority())  # validated before anything is written
        if not self._admit(len(items)):
            return self._not_written(prepared)
        return self._write(prepared, priorities[prepared.dropped :])

    def _push_one_fast(self, item: Any) -> bool:
        """The single-push hot path (O(fields) + one compiled tree update). False -- with nothing changed --
        when the item is not a plain match; the generic path then handles (and reports) it."""
        if type(item) is not dict:
            return False
        p = item.get('priority')
        if p is None:
            p = self._index.default_priority()
        elif type(p) is not float or not 0 <= p <= MAX_PRIORITY:
            return False
        if self._limiter.active and not self._limiter.can_push(1, self.count())[0]:
            return False  # the generic path counts and logs the refusal
        return self._write_one(item, p)

    def _push_batch(self, batch: Any) -> int:
        if self._batch_fast_ok():
            checked = self._storage.check_batch(batch)  # O(fields), nothing written
            if checked is not None:
                p = batch.get('priority')
                if p is None:
                    slots = self._write_batch_fast(checked)
                    self._index.fill_new(slots, self._index.default_priority())
                    return len(slots)
                p = _flat_array(p)
                if (
                    p is not None
                    and p.dtype in _KERNEL_FLOATS
                    and len(p) == checked[1]
                    and len(p)
                    and p.min() >= 0
                    and p.max() <= MAX_PRIORITY
                ):  # NaN fails; else the checking path reports
                    slots = self._write_batch_fast(checked)
                    self._index.set_new(slots, p)
                    return len(slots)
        if type(batch) is not dict and not isinstance(batch, Mapping):
            raise TypeError(f"a batched push needs a dict of batched leaves, got {type(batch).__name__}")
        prepared = self._storage.prepare_batch(batch)
        priorities = batch_priorities(batch.get('priority'), prepared, self._index.default_priority())
        if not self._admit(prepared.n + prepared.dropped):
            return self._not_written(prepared)
        return self._write(prepared, priorities)

    # ------------------------------------------------------------------ sample
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
        self._check_range(sample_range)
        return self._sample_flow(
            size, cur_learner_iter, timeout, lambda: self._draw(size, cur_learner_iter, sample_range)
        )

    def _draw(self, size: int, cur_learner_iter: int, sample_range: Optional[slice]) -> Optional[Any]:
        index = self._index
        if sample_range is None and index.can_draw():  # the hot path: one compiled pass, same draws
            if not index.tree.total() > 0:
                return self._refused('every candidate item has priority 0')
            u = self._rng.random(size)
            beta = self._beta.draw()
            slots, weights, priority, use, ids = index.draw(u, beta, self._uses.counts, self._storage.ring)
            return self._drawn_batch(slots, size, weights, priority, use, cur_learner_iter, beta, ids)
        candidates = None
        if sample_range is not None:
            positions = self._candidates(sample_range)
            if not len(positions):
                return self._refused(f'{sample_range} selects nothing')
            candidates = self._storage.ring.slots_of_positions(
                positions.start + np.arange(len(positions)) * positions.step
            )
        slots = index.sample(self._rng, size, candidates)
        if slots is None:
            return self._refused('every candidate item has priority 0')
        beta = self._beta.draw()
        weights = index.is_weights(slots, beta)
        priority = index.priorities(slots)
        use = self._uses.bump(slots)
        return self._drawn_batch(slots, size, weights, priority, use, cur_learner_iter, beta)

    def _drawn_batch(
        self,
        slots: np.ndarray,
        size: int,
        weights: np.ndarray,
        priority: np.ndarray,
        use: np.ndarray,
        cur_learner_iter: int,
        beta: float,
        ids: Optional[np.ndarray] = None,
    ) -> Any:
        """The batch of a draw (use counts already bumped; ``ids`` of the slots when known): staleness, output,
        removal rules, monitor."""
        staleness = self._storage.staleness(slots, cur_learner_iter)
        out = self._output(slots, weights, use, priority, staleness, ids)
        self._drawn(slots, size, use)  # first: a broken rule of the user's fails the call before the monitor counts
        self._due = self._sampled_monitor.record(use, priority, staleness, beta, cur_learner_iter, self._last_envstep)
        return out

    def _sample_snapshot(self) -> Any:
        return super()._sample_snapshot(), self._beta.value

    def _sample_restore(self, snapshot: Any) -> None:
        super()._sample_restore(snapshot[0])
        self._beta.set(snapshot[1])

    def _output(self, slots, weights, use, priority, staleness, ids=None) -> Any:
        extras = dict(priority=priority, staleness=staleness, use=use, IS=weights)
        return with_extras(self._storage, slots, extras, self._instance_name, self._cfg.deepcopy, ids)

    def _emit(self, due: Any) -> None:
        emit(due, self._sampled_monitor.logger, self._sampled_monitor.tb_logger)

    # ------------------------------------------------------------------ update
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
        if type(info) is not dict and is_tensordict(info):
            info = update_info(info)
        # the compiled path applies without naming the slots; a capacity rule reading priorities must hear of them
        fast = self._update_fast(info) if self._use_limit is None and self._capacity is None else None
        if fast is not None:
            return fast
        parsed = parse_update(info, self._instance_name, self.replay_buffer_size)
        if parsed is None:
            return {'updated': 0, 'stale': 0}
        priorities, ids, slots, mine = parsed
        with self._lock:
            match = self._storage.ring.holds(slots, ids, mine)
            if self._use_limit is not None:
                match &= ~self._spent(slots)
            n = int(np.count_nonzero(match))
            if n == len(slots):
                self._index.update(slots, priorities)
                self._priorities_changed(slots)
            elif n:
                self._index.update(slots[match], priorities[match])
                self._priorities_changed(slots[match])
            return self._count_update(n, len(slots))

    def _update_fast(self, info: Any) -> Optional[Dict[str, int]]:
        """The hot path of ``update``: what a tensor-storage sample returned (1-d CPU tensors or arrays: int ids,
        int slots, float32 / float64 priorities) goes to one compiled kernel. ``None`` for anything else, or for an
        entry the
        kernel finds invalid (nothing changed): the checking path then applies or reports it."""
        if type(info) is not dict:
            return None
        p, ids, slots = (_flat_array(info.get(k)) for k in ('priority', 'replay_unique_id', 'replay_buffer_idx'))
        if (
            p is None
            or ids is None
            or slots is None
            or p.dtype not in _KERNEL_FLOATS
            or ids.dtype.kind not in 'iu'
            or slots.dtype.kind not in 'iu'
            or not len(p) == len(ids) == len(slots)
        ):
            return None
        with self._lock:
            n = self._index.update_by_ids(
                self._storage.ring, slots.astype(np.int64, copy=False), ids.astype(np.int64, copy=False), p
            )
            return None if n is None else self._count_update(n, len(slots))

    # ------------------------------------------------------------------ stats / clear / state
    def stats(self) -> Dict[str, float]:
        """A flat dict of numbers, O(1): counters, refusals, beta, priorities and the sampled-data window."""
        with self._lock:
            out = super().stats()
            out.update(
                push_count=self.push_count,
                beta=self.beta,
                max_priority=self._index.max_priority,
                priority_mass=self._index.tree.total(),
                priority_min_leaf=self._index.tree.min_leaf(),
            )
            out.update(self._sampled_monitor.averages())
            out['beta'] = self.beta  # the current beta, not the last sampled batch's
            return out

    def _on_cleared(self, slots: np.ndarray) -> None:
        self._index.reset()

    def _state(self) -> Dict[str, Any]:
        engine = self._engine_state()
        index = {**self._index.state_dict(), 'use': engine.pop('use')}  # the file layout of version 1
        return {'storage': self._storage.state_dict(), 'index': index, 'beta': self.beta, **engine}

    def _restore(self, state: Dict[str, Any]) -> None:
        for key in ('storage', 'index', 'beta'):
            if key not in state:
                raise ValueError(f"state has no '{key}' entry")
        storage = storage_from_state(
            self._cfg.storage, self.replay_buffer_size, state['storage'], SAMPLE_KEYS, index_for(self._cfg)
        )
        if storage.kind == 'list':  # what push refuses is refused in a state too
            items = storage.gather(storage.ring.ordered_slots())
            bad = next((i for i, x in enumerate(items) if not isinstance(x, Mapping)), None)
            if bad is not None:
                raise ValueError(f"saved item {bad} is not a dict; a prioritized buffer stores dicts")
        index = self._index.restored(state['index'], storage.ring.valid)
        beta = BetaSchedule.checked(state['beta'], 'saved beta')
        swap = self._engine_restored({**state, 'use': state['index']['use']}, storage.ring.valid, required=True)
        self._storage, self._index = storage, index
        self._beta.set(beta)
        swap()
        self._capacity_rebuilt()

    def __repr__(self) -> str:
        return (
            f"AdvancedReplayBuffer(instance_name={self._instance_name!r}, count={self.count()}, "
            f"replay_buffer_size={self.replay_buffer_size}, alpha={self.alpha}, beta={self.beta:.4f}, "
            f"storage={self._storage!r})"
        )

"""``AdvancedReplayBuffer`` (``type='advanced'``): prioritized replay with DI-engine's config and semantics.

Composition: a storage (list or tensor) + ``PriorityIndex`` (priorities, use counts, sum/min trees) + eviction
by use count and staleness + ``ThruputController`` + monitors. Differences from DI-engine are fixes of what
``anchors/dingengine-buffers.md`` marks as bugs: ``sample_range`` is exact for every slice (insertion order),
non-finite or negative priorities are ``ValueError`` (all or nothing), ``update`` reports stale entries and
never revives retired items, pushed and stored dicts are never mutated, refusals are counted in ``stats()``.
"""
import copy
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
import torch

from ..base import BUFFER_REGISTRY
from ..config import positive_int
from ..control.priority import PriorityIndex, as_numpy, as_priorities, split_ids
from ..control.thruput import SampleTimeoutError, ThruputController
from ..monitor.periodic import PeriodicThruputMonitor
from ..monitor.sampled_data import SampledDataAttrMonitor
from ..monitor.tb import build_tb_logger, emit, rank
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, build_storage, storage_from_state
from .common import BufferCore

INF = float('inf')
# Keys added to sampled items; ignored (tensor storage) when such an item is pushed back.
SAMPLE_KEYS = ('priority', 'IS', 'staleness', 'use')
COUNTERS = (
    'push_items', 'sample_calls', 'sampled_items', 'remove_count', 'removed_by_use', 'removed_by_staleness',
    'refused_push', 'refused_push_items', 'refused_sample', 'updated', 'stale_updates'
)


def _nonneg_or_inf(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


@BUFFER_REGISTRY.register('advanced')
class AdvancedReplayBuffer(BufferCore):
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
    """
    config = dict(
        type='advanced',
        # Maximum number of items; the oldest is overwritten when full.
        replay_buffer_size=4096,
        # Remove an item once it has been sampled this many times (inf: never).
        max_use=INF,
        # Remove items with cur_learner_iter - collect_iter >= max_staleness, oldest first (inf: never).
        max_staleness=INF,
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
        thruput_controller=dict(
            # Allowed range of (pushed items / sampled items), measured over a decaying window.
            push_sample_rate_limit=dict(max=INF, min=0.0),
            # Counters decay by x0.01 over this many seconds (in whole-second steps).
            window_seconds=30.0,
            # Sample only while count >= sample_min_limit_ratio * batch size.
            sample_min_limit_ratio=1.0,
        ),
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
    checks = dict(
        replay_buffer_size=(positive_int, 'a positive int'),
        max_use=(_nonneg_or_inf, 'a number > 0 or inf'),
        max_staleness=(_nonneg_or_inf, 'a number > 0 or inf'),
        alpha=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
        beta=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
        anneal_step=(lambda x: x >= 0 and x == int(x), 'an int >= 0'),
        eps=(lambda x: 0 <= x < INF, 'a finite number >= 0'),
        seed=(lambda x: x is None or (isinstance(x, int) and x >= 0), 'None or an int >= 0'),
        **{
            'thruput_controller.sample_min_limit_ratio': (lambda x: x >= 1, 'a number >= 1'),
            'monitor.sampled_data_attr.average_range': (positive_int, 'a positive int'),
            'monitor.sampled_data_attr.print_freq': (positive_int, 'a positive int'),
            'monitor.periodic_thruput.seconds': (lambda x: x > 0, 'a positive number of seconds'),
        },
        **STORAGE_CHECKS,
    )

    # ------------------------------------------------------------------ construction
    def _build(self) -> None:
        cfg = self._cfg
        self._storage = build_storage(cfg.storage, cfg.replay_buffer_size, reserved_keys=SAMPLE_KEYS)
        self._index = self._new_index()
        self.alpha = float(cfg.alpha)
        self._beta = float(cfg.beta)
        self._anneal = (1.0 - cfg.beta) / cfg.anneal_step if cfg.anneal_step else 0.0
        self._max_use = cfg.max_use
        self._max_staleness = cfg.max_staleness
        self._min_ratio = float(cfg.thruput_controller.sample_min_limit_ratio)
        self._thruput = ThruputController(cfg.thruput_controller)
        self._cond = threading.Condition(self._lock)
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._tb, self._owns_tb = build_tb_logger(
            self._tb_logger, cfg.monitor.tensorboard, self._exp_name, self._instance_name
        )
        attr = cfg.monitor.sampled_data_attr
        self._sampled_monitor = SampledDataAttrMonitor(
            self._instance_name, attr.average_range, attr.print_freq, self._logger, self._tb if rank() == 0 else None
        )
        self._due = None  # monitor output computed under the lock, written after it
        me = weakref.ref(self)  # the monitor thread must not keep an unclosed, unreachable buffer alive

        def read() -> Optional[Dict[str, float]]:
            buf = me()
            return None if buf is None else buf._counter_snapshot()

        self._periodic = PeriodicThruputMonitor(
            self._instance_name, cfg.monitor.periodic_thruput.seconds, read, self._logger, self._tb
        ) if self._tb is not None and rank() == 0 else None

    def _new_index(self) -> PriorityIndex:
        cfg = self._cfg
        return PriorityIndex(cfg.replay_buffer_size, cfg.alpha, cfg.eps, with_max=cfg.max_priority_within_buffer)

    # ------------------------------------------------------------------ properties
    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not 0 <= value <= 1:
            raise ValueError(f"beta must be in [0, 1], got {value}")
        self._beta = float(value)

    @property
    def push_count(self) -> int:
        """Items accepted since construction (DI-engine's Advanced keeps it across ``clear``)."""
        return self._storage.ring.push_count

    # ------------------------------------------------------------------ push
    def _priorities_of_items(self, items: List[Any]) -> np.ndarray:
        """Each item's ``priority`` (the default where missing or None), validated: all or nothing."""
        default = self._index.default_priority()
        out = np.empty(len(items))
        for i, item in enumerate(items):
            if type(item) is not dict and not isinstance(item, Mapping):
                raise TypeError(f"advanced buffer stores dicts; item {i} is {type(item).__name__}")
            p = item.get('priority')
            if p is None:
                out[i] = default
            elif isinstance(p, (int, float)) and not isinstance(p, bool):
                out[i] = p
            else:
                arr = as_priorities(p, f'item {i} priority')
                if arr.shape != (1, ):
                    raise ValueError(f"item {i} 'priority' must be one number, got shape {tuple(np.shape(p))}")
                out[i] = arr[0]
        return as_priorities(out, 'priority')

    def _admit(self, n: int) -> bool:
        ok, why = self._thruput.can_push(n)
        if not ok:
            self._counters['refused_push'] += 1
            self._counters['refused_push_items'] += n
            self._logger.info("[%s] refuse to push %d items: %s", self._instance_name, n, why)
        return ok

    def _push_items(self, items: List[Any]) -> int:
        if len(items) == 1 and self._push_one_fast(items[0]):
            return 1
        priorities = self._priorities_of_items(items)  # validated before anything is written
        if not self._admit(len(items)):
            return 0
        prepared = self._storage.prepare(items)
        self._commit(prepared, priorities[prepared.dropped:], len(items))
        return len(items)

    def _push_one_fast(self, item: Any) -> bool:
        """The single-push hot path (O(fields) + one compiled tree update). False -- with nothing changed --
        when the item is not a plain match; the generic path then handles (and reports) it."""
        if type(item) is not dict:
            return False
        p = item.get('priority')
        if p is None:
            p = self._index.default_priority()
        elif type(p) is not float or not 0 <= p < INF:
            return False
        if self._thruput.active and not self._thruput.can_push(1)[0]:
            return False  # the generic path counts and logs the refusal
        before = len(self._storage)
        slot = self._storage.write_one(item)
        if slot is None:
            return False
        self._index.set_new_one(slot, p)
        self._after_push(1, before + 1 - len(self._storage))
        return True

    def _push_batch(self, batch: Any) -> int:
        if type(batch) is not dict and not isinstance(batch, Mapping):
            raise TypeError(f"a batched push needs a dict of batched leaves, got {type(batch).__name__}")
        prepared = self._storage.prepare_batch(batch)
        n = prepared.n + prepared.dropped
        p = batch.get('priority')
        if p is None:
            priorities = np.full(prepared.n, self._index.default_priority())
        else:
            priorities = as_priorities(p, 'priority')
            if len(priorities) != n:
                raise ValueError(f"batched 'priority' has {len(priorities)} entries, the batch has {n} items")
            priorities = priorities[prepared.dropped:]
        if not self._admit(n):
            return 0
        self._commit(prepared, priorities, n)
        return n

    def _commit(self, prepared: Any, priorities: np.ndarray, n: int) -> None:
        before = len(self._storage)
        result = self._storage.write(prepared)
        self._index.set_new(result.slots, priorities)
        self._evicted(result.evicted)
        self._after_push(n, before + n - len(self._storage))  # overwritten (+ dropped) items

    def _after_push(self, n: int, removed: int) -> None:
        if self._periodic is not None:
            self._periodic.start()  # first: its baseline must not include this push
        self._counters['push_items'] += n
        self._counters['remove_count'] += removed
        self._thruput.on_push(n)
        self._cond.notify_all()

    # ------------------------------------------------------------------ sample
    def _evict_stale(self, cur_learner_iter: int) -> None:
        """Remove the oldest items while ``cur_learner_iter - collect_iter >= max_staleness`` (DI-engine's
        walk from the head; stops at the first fresh item or one without ``collect_iter``)."""
        if self._max_staleness == INF or len(self._storage) == 0:
            return
        ring = self._storage.ring
        chunk = 64
        while len(self._storage):
            slots = ring.oldest(chunk)
            ci = self._collect_iter(slots)
            stale = (ci != _NO_ITER) & (cur_learner_iter - ci >= self._max_staleness)
            k = len(stale) if stale.all() else int(np.argmin(stale))
            if k:
                self._remove(slots[:k], 'removed_by_staleness')
            if k < len(slots):
                return
            chunk *= 2

    def _collect_iter(self, slots: np.ndarray) -> np.ndarray:
        """collect_iter per slot (its min when it is a sequence); ``_NO_ITER`` where absent."""
        if self._storage.kind == 'list':
            out = np.empty(len(slots), dtype=np.int64)
            for i, s in enumerate(slots.tolist()):
                ci = self._storage.get(s).get('collect_iter')
                out[i] = _NO_ITER if ci is None else (min(ci) if isinstance(ci, (list, tuple)) else int(ci))
            return out
        field = self._storage.fields.get(('collect_iter', ))
        if field is None:
            return np.full(len(slots), _NO_ITER, dtype=np.int64)
        vals = field[torch.as_tensor(slots, device=field.device)]
        if vals.dim() > 1:
            vals = vals.flatten(1).min(dim=1).values
        return vals.to(torch.int64).cpu().numpy()

    def _remove(self, slots: np.ndarray, reason: str) -> None:
        removed = self._storage.remove(slots)
        self._index.clear_slots(slots)
        self._counters['remove_count'] += len(slots)
        self._counters[reason] += len(slots)
        self._evicted(removed)

    def _why_not(self, size: int, cur_learner_iter: int) -> str:
        """'' if ``size`` items can be sampled now, else the reason (evicts stale items first)."""
        self._evict_stale(cur_learner_iter)
        reasons = []
        count = len(self._storage)
        if count == 0 or count / size < self._min_ratio:
            reasons.append(f"{count} items < sample_min_limit_ratio {self._min_ratio:g} x batch {size}")
        ok, why = self._thruput.can_sample(size)
        if not ok:
            reasons.append(why)
        return '; '.join(reasons)

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
        self._check_size(size)
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout}")
        self._check_open()
        with self._lock:
            why = self._why_not(size, cur_learner_iter)
            if why and timeout is not None:
                deadline = time.monotonic() + timeout
                while why:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SampleTimeoutError(
                            f"buffer '{self._instance_name}' could not sample {size} items within {timeout}s: {why}"
                        )
                    self._cond.wait(min(left, 0.05))  # rate limits also change with time (decay)
                    self._check_open()
                    why = self._why_not(size, cur_learner_iter)
            if why:
                self._counters['refused_sample'] += 1
                return self._refuse(why)
            out = self._draw(size, cur_learner_iter, sample_range)
            due, self._due = self._due, None
        emit(due, self._sampled_monitor.logger, self._sampled_monitor.tb_logger)  # outside the lock
        return out

    def _draw(self, size: int, cur_learner_iter: int, sample_range: Optional[slice]) -> Optional[Any]:
        index = self._index
        candidates = None
        if sample_range is not None:
            positions = self._range_positions(len(self._storage), sample_range)
            if not len(positions):
                self._counters['refused_sample'] += 1
                return self._refuse(f'{sample_range} selects nothing')
            candidates = self._storage.ring.slots_of_positions(positions.start + np.arange(len(positions)) * positions.step)
        slots = index.sample(self._rng, size, candidates)
        if slots is None:
            self._counters['refused_sample'] += 1
            return self._refuse('every candidate item has priority 0')
        beta = self._beta
        weights = index.is_weights(slots, beta)
        use = index.bump_use(slots)
        priority = index.priorities(slots)
        ci = self._collect_iter(slots)
        staleness = np.where(ci == _NO_ITER, -1, cur_learner_iter - ci)
        out = self._output(slots, weights, use, priority, staleness)
        self._due = self._sampled_monitor.record(use, priority, staleness, beta, cur_learner_iter, self._last_envstep)
        if self._max_use != INF:
            used_up = np.unique(slots[use >= self._max_use])
            if len(used_up):
                if self._remover is not None:  # DI-engine: keep the item (its file), just never sample it again
                    index.retire(used_up)
                else:
                    self._remove(used_up, 'removed_by_use')
        if self._anneal:
            self._beta = min(1.0, self._beta + self._anneal)
        self._counters['sample_calls'] += 1
        self._counters['sampled_items'] += size
        self._thruput.on_sample(size)
        return out

    def _output(self, slots, weights, use, priority, staleness) -> Any:
        if self._storage.kind == 'tensor':
            out = self._storage.gather(slots)
            dev = self._storage.device
            out['priority'] = torch.from_numpy(priority.astype(np.float32)).to(dev)
            out['IS'] = torch.from_numpy(weights.astype(np.float32)).to(dev)
            out['staleness'] = torch.from_numpy(staleness).to(dev)
            out['use'] = torch.from_numpy(use).to(dev)
            return out
        ids = self._storage.ring.uids(slots).tolist()
        items = self._storage.gather(slots)
        deep = self._cfg.deepcopy
        out = []
        for k, item in enumerate(items):
            d = copy.deepcopy(item) if deep else dict(item)  # a new dict: stored items are never mutated
            d['replay_unique_id'] = f'{self._instance_name}_{ids[k]}'
            d['replay_buffer_idx'] = int(slots[k])
            d['priority'] = float(priority[k])
            d['staleness'] = int(staleness[k])
            d['use'] = int(use[k])
            d['IS'] = float(weights[k])
            out.append(d)
        return out

    # ------------------------------------------------------------------ update
    def update(self, info: Dict[str, Any]) -> Dict[str, int]:
        """
        Overview:
            Set new priorities for sampled items. ``info`` holds ``replay_unique_id``, ``replay_buffer_idx`` and
            ``priority`` (lists, arrays or tensors of equal length). An entry applies only where the id still
            lives in that slot (and the item is not retired by ``max_use``); the others are counted as stale.
            Stored priority is ``priority + eps``. Without ``priority`` it is a no-op.
            All or nothing: NaN / inf / negative priorities, bad slots or mismatched lengths raise
            ``ValueError`` (``TypeError`` for wrong types) and change nothing.
        Returns:
            - result (:obj:`dict`): ``{'updated': n, 'stale': m}``.
        """
        if type(info) is not dict and not isinstance(info, Mapping):
            raise TypeError(f"update info must be a dict, got {type(info).__name__}")
        if info.get('priority') is None:
            return {'updated': 0, 'stale': 0}
        for key in ('replay_unique_id', 'replay_buffer_idx'):
            if key not in info:
                raise ValueError(f"update info has 'priority' but no '{key}'")
        priorities = as_priorities(info['priority'])
        ids, mine = split_ids(info['replay_unique_id'], self._instance_name)
        slots = np.asarray(as_numpy(info['replay_buffer_idx'])).reshape(-1)
        if len(slots) and slots.dtype.kind not in 'iu':
            raise TypeError(f"'replay_buffer_idx' must be ints, got dtype {slots.dtype}")
        slots = slots.astype(np.int64, copy=False)
        if not len(priorities) == len(ids) == len(slots):
            raise ValueError(
                f"update info lengths differ: priority {len(priorities)}, replay_unique_id {len(ids)}, "
                f"replay_buffer_idx {len(slots)}"
            )
        cap = self.replay_buffer_size
        if len(slots) and (slots.min() < 0 or slots.max() >= cap):
            raise ValueError(f"'replay_buffer_idx' must be in [0, {cap}), got {slots.min()}..{slots.max()}")
        with self._lock:
            ring = self._storage.ring
            match = ring.valid[slots] & (ring.uids(slots) == ids)
            if mine is not None:
                match &= mine
            if self._max_use != INF:
                match &= self._index.use[slots] < self._max_use
            n = int(np.count_nonzero(match))
            if n == len(slots):
                self._index.update(slots, priorities)
            elif n:
                self._index.update(slots[match], priorities[match])
            self._counters['updated'] += n
            self._counters['stale_updates'] += len(slots) - n
        return {'updated': n, 'stale': len(slots) - n}

    # ------------------------------------------------------------------ stats / monitors
    def _counter_snapshot(self) -> Dict[str, float]:
        with self._lock:
            return {**self._counters, 'count': len(self._storage)}

    def stats(self) -> Dict[str, float]:
        """A flat dict of numbers, O(1): counters, refusals, beta, priorities and the sampled-data window."""
        with self._lock:
            out = {
                'count': len(self._storage), 'replay_buffer_size': self.replay_buffer_size,
                'push_count': self.push_count, **self._counters, 'beta': self._beta,
                'max_priority': self._index.max_priority, 'priority_mass': self._index.tree.total(),
                'thruput_push': self._thruput.push_count, 'thruput_sample': self._thruput.sample_count,
            }
            out.update(self._sampled_monitor.averages())
            out['beta'] = self._beta  # the current beta, not the last sampled batch's
            return out

    # ------------------------------------------------------------------ clear / state
    def _clear(self) -> List[Any]:
        slots = self._storage.ring.ordered_slots()
        removed = self._storage.clear()
        self._index.clear_slots(slots)
        self._index.max_priority = 1.0
        self._counters['remove_count'] += len(slots)
        return removed

    def _state(self) -> Dict[str, Any]:
        return {
            'storage': self._storage.state_dict(), 'index': self._index.state_dict(), 'beta': self._beta,
            'counters': dict(self._counters), 'thruput': self._thruput.state_dict()
        }

    def _restore(self, state: Dict[str, Any]) -> None:
        for key in ('storage', 'index', 'beta', 'counters', 'thruput'):
            if key not in state:
                raise ValueError(f"state has no '{key}' entry")
        storage = storage_from_state(self._cfg.storage, self.replay_buffer_size, state['storage'], SAMPLE_KEYS)
        index = self._new_index()
        index.load_state_dict(state['index'], storage.ring.valid)
        beta = float(state['beta'])
        if not 0 <= beta <= 1:
            raise ValueError(f"saved beta must be in [0, 1], got {beta}")
        counters = {k: int(state['counters'][k]) for k in COUNTERS}
        thruput = ThruputController(self._cfg.thruput_controller)
        thruput.load_state_dict(state['thruput'])
        self._storage, self._index, self._beta, self._counters, self._thruput = storage, index, beta, counters, thruput

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        super().start()
        if self._periodic is not None:
            self._periodic.start()

    def close(self) -> None:
        """Stop the monitor thread, flush TensorBoard (close it only if the buffer created it), wake waiting
        samplers (they raise). Idempotent; stored data stays readable through ``state_dict``."""
        if self._closed:
            return
        super().close()
        with self._lock:
            self._cond.notify_all()
        if self._periodic is not None:
            self._periodic.close()
        if self._tb is not None:
            self._tb.flush()
            if self._owns_tb:
                self._tb.close()

    def __repr__(self) -> str:
        return (
            f"AdvancedReplayBuffer(instance_name={self._instance_name!r}, count={self.count()}, "
            f"replay_buffer_size={self.replay_buffer_size}, alpha={self.alpha}, beta={self._beta:.4f}, "
            f"storage={self._storage!r})"
        )


_NO_ITER = np.iinfo(np.int64).min // 4  # collect_iter placeholder for items without one (staleness -1)

"""``DequeReplayBuffer`` (``type='deque'``): DI-engine's ``DequeBufferWrapper`` config and API, made of our presets.

DI-engine's DQN / acrobot / pendulum configs name ``type='deque'``: the new-generation ``DequeBuffer`` with its
``use_time_check`` and ``PriorityExperienceReplay`` middleware behind the old API. Here the same config builds:

* ``priority=False``: a naive ring (uniform draws without replacement), with ``max_use`` as its remover; without
  a ``seed`` it draws with Python's global ``random`` exactly as DI-engine's ``DequeBuffer`` does
  (``random.sample`` over the items, oldest first), so a pipeline seeded by ``set_pkg_seed`` samples the same
  batches as with DI-engine's own buffer; with a ``seed`` it draws from its own RNG;
* ``priority=True``: a prioritized (advanced) ring with ``alpha = priority_power_factor``, ``beta =
  IS_weight_power_factor`` annealed to 1 over ``IS_weight_anneal_train_iter`` sample calls, and ``max_use``.

The engine's part keys go to that buffer as they are, with the semantics they have there: ``max_use``,
``max_staleness`` (``train_iter`` is the learner iteration staleness is measured at), ``thruput_controller``
(``sample_min_limit_ratio`` >= 1, default 1: DI-engine's deque refuses a sample while fewer than ``size`` items are
stored; ``sample(..., timeout=s)`` waits for it) and ``removers``.

The wrapper's API: ``push(list, cur_collector_envstep)`` (a pushed item's ``'priority'`` is its initial
priority and is not part of the returned data), ``sample(size, train_iter)`` -> a list of the pushed dicts (with
``'IS'`` when ``priority_IS_weight``) or ``None``, and ``update({'priority': [...]})``, which sets the priorities
of the *last sampled batch*, each clipped at ``priority_max_limit``. TensorBoard (a ``tb_logger`` passed in):
``{instance_name}_iter/use_count_avg`` (with ``max_use``), ``.../priority_avg``, ``.../priority_max`` (with
``priority``) and ``.../buffer_data_count``, every ``train_iter_per_log`` learner iterations and on the first.

Fixed, not copied (``anchors/dingengine-buffers.md``): DI-engine remembers the batch for ``update`` only on
logging iterations, so most updates are dropped -- here every sample is remembered; an entry whose item has since
left the buffer is skipped (the advanced buffer's identity check); ``max_use`` together with ``priority`` works
(DI-engine raises ``TypeError`` there); pushed dicts are never mutated.
"""

import copy
import threading
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from ..base import BUFFER_REGISTRY, IBuffer
from ..config import INF, SEED_CHECK, build_config, dingengine_ignored, positive_int
from ..persistence import load_state, save_state
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG
from .advanced import AdvancedReplayBuffer
from .common import STEP_LIMIT, check_step
from .engine import parts_checks, parts_config
from .naive import NaiveReplayBuffer
from .outputs import as_items

# Keys the inner buffer adds to a sampled item; the wrapper returns the pushed data (and 'IS').
INNER_KEYS = ('replay_unique_id', 'replay_buffer_idx', 'priority', 'staleness', 'use', 'IS')

DEQUE_CONFIG = dict(
    type='deque',
    # Maximum number of items; the oldest is overwritten when full.
    replay_buffer_size=10000,
    # Learner iterations between two TensorBoard writes (and the first sample writes).
    train_iter_per_log=100,
    # Prioritized replay (otherwise uniform without replacement).
    priority=False,
    # Add importance-sampling weights ('IS') to sampled items (needs priority).
    priority_IS_weight=False,
    # Priority exponent (alpha).
    priority_power_factor=0.6,
    # Importance-sampling exponent (beta) at the start; annealed to 1.
    IS_weight_power_factor=0.4,
    # Sample calls over which beta grows to 1 (0: no annealing).
    IS_weight_anneal_train_iter=int(1e5),
    # update() clips priorities at this value.
    priority_max_limit=1000.0,
    # Seed of the buffer's own RNG; None draws it from numpy's global RNG.
    seed=None,
    # max_use (an item leaves after this many draws), max_staleness, removers, thruput_controller: the engine's
    # parts, passed to the naive / advanced buffer doing the work (engine.parts_config).
    **parts_config(1.0),
    storage=STORAGE_CONFIG,
)
DEQUE_CHECKS = dict(
    replay_buffer_size=(positive_int, 'a positive int'),
    train_iter_per_log=(positive_int, 'a positive int'),
    priority_power_factor=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    IS_weight_power_factor=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    IS_weight_anneal_train_iter=(lambda x: x >= 0 and x == int(x), 'an int >= 0'),
    priority_max_limit=(lambda x: x > 0, 'a number > 0 (inf: no clipping)'),
    seed=SEED_CHECK,
    **parts_checks(1.0),
    **STORAGE_CHECKS,
)


def numbers(priority: Any) -> np.ndarray:
    """``update``'s priorities as a float64 vector: lists, arrays or tensors of real numbers (not strings)."""
    if hasattr(priority, 'detach'):
        priority = priority.detach().cpu().numpy()
    arr = np.asarray(priority)
    if arr.dtype.kind not in 'biuf':
        raise TypeError(f"update: 'priority' must be real numbers, got {type(priority).__name__} {priority!r:.60}")
    return arr.astype(np.float64).reshape(-1)


def items_out(cfg: Mapping) -> bool:
    """Whether samples leave as per-item dicts from tensor storage (``storage.output='items'``)."""
    return cfg.storage.get('type') == 'tensor' and cfg.storage.get('output') == 'items'


def inner_config(cfg: Mapping) -> Dict[str, Any]:
    """The naive / advanced config that realises a deque config."""
    storage = copy.deepcopy(dict(cfg.storage))
    if items_out(cfg):  # the wrapper drops its keys from the batch first, then splits it (one pass less)
        storage['output'] = None
    common = dict(
        replay_buffer_size=cfg.replay_buffer_size,
        max_use=cfg.max_use,
        max_staleness=cfg.max_staleness,
        removers=copy.deepcopy(list(cfg.removers)),
        thruput_controller=copy.deepcopy(dict(cfg.thruput_controller)),
        seed=cfg.seed,
        storage=storage,
    )
    if not cfg.priority:
        if cfg.seed is None:
            # DI-engine's DequeBuffer draws with Python's global `random`: the same batches under the same seed
            # (set_pkg_seed). The inner buffer's own RNG is then unused: a fixed seed keeps numpy's global
            # stream, which DI-engine's exploration draws from, untouched.
            common.update(seed=0, sampler=dict(type='python_random'))
        return dict(type='naive', **common)
    return dict(
        type='advanced',
        alpha=cfg.priority_power_factor,
        beta=cfg.IS_weight_power_factor,
        anneal_step=int(cfg.IS_weight_anneal_train_iter),
        **common,
    )


@BUFFER_REGISTRY.register('deque')
class DequeReplayBuffer(IBuffer):
    """
    Overview:
        DI-engine's ``DequeBufferWrapper`` API over a naive (uniform) or advanced (prioritized) buffer.
    Interfaces:
        ``push``, ``sample(size, train_iter)``, ``update(meta)``, ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``replay_buffer_size``, ``push_count``, ``cfg``, ``instance_name``, ``inner`` (the buffer doing the work)
    Thread-safety: the inner buffer's lock guards the data; this wrapper's lock makes a sample and the batch it
        remembers (and an update and the batch it consumes) one step. Pushes take only the inner lock.
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='deque', priority=True, priority_IS_weight=True, seed=0))
        >>> type(buf.inner).__name__
        'AdvancedReplayBuffer'
        >>> buf.push([{'obs': i} for i in range(4)], 0)
        4
        >>> [sorted(item) for item in buf.sample(2, 0)]  # the pushed dicts, with 'IS'
        [['IS', 'obs'], ['IS', 'obs']]
        >>> buf.update({'priority': [5.0, 0.5]})  # the priorities of the last sampled batch
        {'updated': 2, 'stale': 0}
        >>> buf.close()
    """

    sample_kwargs = ('train_iter',)  # DI-engine's DequeBuffer names it so

    config = DEQUE_CONFIG
    checks = DEQUE_CHECKS
    ignored_keys = dingengine_ignored(DEQUE_CONFIG, 'deque')
    not_distributable = (
        "update() applies to the last sampled batch, which many workers would share; use type "
        "'advanced' (updates by id) with a manager"
    )

    def __init__(
        self,
        cfg: Optional[Mapping] = None,
        tb_logger: Any = None,
        exp_name: str = 'default_experiment',
        instance_name: str = 'buffer',
    ) -> None:
        self._cfg = build_config(self.config, cfg, self.checks, ignored=self.ignored_keys)
        if self._cfg.priority_IS_weight and not self._cfg.priority:
            raise ValueError(
                "config key 'priority_IS_weight' = True needs 'priority' = True (IS weights come from priorities)"
            )
        self._items = items_out(self._cfg)
        inner_cls = AdvancedReplayBuffer if self._cfg.priority else NaiveReplayBuffer
        self._inner = inner_cls(inner_config(self._cfg), None, exp_name, instance_name)
        self._instance_name = instance_name
        self._tb_logger = tb_logger  # borrowed: never closed here
        self._tag = f'{instance_name}_iter'
        self._last_log = -1
        self._last_batch: Optional[tuple] = None  # (ids, slots) of the last sample, for update()
        self._lock = threading.RLock()  # the remembered batch and log step change with the inner buffer's data

    # ------------------------------------------------------------------ properties
    @property
    def cfg(self) -> Any:
        return self._cfg

    @property
    def instance_name(self) -> str:
        return self._instance_name

    @property
    def inner(self) -> IBuffer:
        return self._inner

    @property
    def replay_buffer_size(self) -> int:
        return self._inner.replay_buffer_size

    @property
    def push_count(self) -> int:
        return self._inner.push_count

    # ------------------------------------------------------------------ push / sample / update
    def push(self, data: Any, cur_collector_envstep: int = -1) -> int:
        """Store a list of dicts (or one dict); an item's ``'priority'`` is its initial priority."""
        return self._inner.push(data, cur_collector_envstep)

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        """Store a batch (a dict of ``[B, ...]`` leaves or a TensorDict) as its ``B`` items."""
        return self._inner.extend(batch, cur_collector_envstep)

    def sample(self, size: int, train_iter: int = 0, timeout: Optional[float] = None) -> Optional[List[Any]]:
        """
        Overview:
            Draw ``size`` items (prioritized with ``priority``); ``None`` (logged) when fewer than ``size`` are
            stored. The batch is remembered for ``update``. Writes TensorBoard every ``train_iter_per_log``.
        Returns:
            - data: the pushed dicts (``'IS'`` added with ``priority_IS_weight``; copies then, the stored dicts
              otherwise) -- or, on tensor storage, one dict of batched tensors.
        """
        train_iter = check_step(train_iter, 'train_iter')
        with self._lock:  # push does not take it: a sample waiting for data (timeout) does not block pushes
            out = self._inner.sample(size, train_iter, timeout=timeout)
            if out is None:
                return None
            tensor = not isinstance(out, list)  # one dict (or TensorDict) of batched tensors
            if self._cfg.priority:
                ids = out['replay_unique_id'].tolist() if tensor else [d['replay_unique_id'] for d in out]
                slots = out['replay_buffer_idx'].tolist() if tensor else [int(d['replay_buffer_idx']) for d in out]
                priority = np.asarray(out['priority'] if tensor else [d['priority'] for d in out], dtype=np.float64)
                self._last_batch = (ids, slots)
            else:
                priority = None
            self._log(train_iter, priority)
        return self._data(out, tensor)

    def _data(self, out: Any, tensor: bool) -> Any:
        if not self._cfg.priority:  # the naive buffer adds ids only to tensor batches
            drop = list(INNER_KEYS[:2])
            if not tensor:
                return out  # stored dicts
        else:
            drop = [k for k in INNER_KEYS if not (self._cfg.priority_IS_weight and k == 'IS')]
        if tensor:
            if type(out) is not dict:  # a TensorDict (tensordict_io)
                return out.exclude(*drop)
            out = {k: v for k, v in out.items() if k not in drop}
            return as_items(out, self._instance_name) if self._items else out
        return [{k: v for k, v in d.items() if k not in drop} for d in out]

    def _log(self, train_iter: int, priority: Optional[np.ndarray]) -> None:
        tb = self._tb_logger
        if tb is None or not (self._last_log == -1 or train_iter - self._last_log >= self._cfg.train_iter_per_log):
            return
        if self._cfg.max_use != INF:
            use = self._inner.last_sample_use()
            if use is not None and len(use):
                tb.add_scalar(f'{self._tag}/use_count_avg', float(np.mean(use)), train_iter)
        if priority is not None and len(priority):
            tb.add_scalar(f'{self._tag}/priority_avg', float(priority.mean()), train_iter)
            tb.add_scalar(f'{self._tag}/priority_max', float(priority.max()), train_iter)
        tb.add_scalar(f'{self._tag}/buffer_data_count', self._inner.count(), train_iter)
        self._last_log = train_iter

    def update(self, meta: Any) -> Dict[str, int]:
        """
        Overview:
            Set the priorities of the last sampled batch (``meta['priority']``, one per sampled item, in order),
            each clipped at ``priority_max_limit``; items that left the buffer since are skipped (``'stale'``).
            Without ``priority``, or before any sample, a no-op. Bad priorities (NaN, negative, wrong length)
            raise ``ValueError`` and change nothing: the batch stays remembered.
        Returns:
            - result (:obj:`dict`): ``{'updated': n, 'stale': m}``.
        """
        if not isinstance(meta, Mapping):
            raise TypeError(f"update takes a dict with 'priority', got {type(meta).__name__}")
        if meta.get('priority') is None:
            return {'updated': 0, 'stale': 0}
        priority = numbers(meta['priority'])  # checked even when there is nothing to apply it to
        with self._lock:
            batch = self._last_batch
            if not self._cfg.priority or batch is None:
                return {'updated': 0, 'stale': 0}
            if len(priority) != len(batch[0]):
                raise ValueError(
                    f"update: {len(priority)} priorities for the last sampled batch of {len(batch[0])} items"
                )
            clipped = np.minimum(priority, float(self._cfg.priority_max_limit))  # NaN stays NaN: the inner refuses it
            result = self._inner.update(
                {'replay_unique_id': batch[0], 'replay_buffer_idx': batch[1], 'priority': clipped}
            )
            self._last_batch = None
            return result

    # ------------------------------------------------------------------ the rest: the inner buffer's
    def clear(self) -> None:
        with self._lock:
            self._inner.clear()
            self._last_batch = None

    def count(self) -> int:
        return self._inner.count()

    def stats(self) -> Dict[str, float]:
        return self._inner.stats()

    def state_dict(self) -> Dict[str, Any]:
        with self._lock:
            batch = (
                None
                if self._last_batch is None
                else {'ids': list(self._last_batch[0]), 'slots': list(self._last_batch[1])}
            )
            return {
                'type': type(self).__name__,
                'inner': self._inner.state_dict(),
                'last_log_train_iter': self._last_log,
                'last_batch': batch,
            }

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """Restore a ``state_dict()`` (all or nothing); ``{'data': [...]}`` alone pushes the items."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if set(state.keys()) == {'data'}:
            self._inner.load_state_dict(state, deepcopy)
            return
        if state.get('type') != type(self).__name__:
            raise ValueError(f"state was made by {state.get('type')!r}, this buffer is {type(self).__name__}")
        last = state.get('last_log_train_iter')
        if type(last) is not int or not -1 <= last < STEP_LIMIT:
            raise ValueError(
                f"state has an invalid 'last_log_train_iter' entry {last!r:.40}; expected an int in [-1, 2**60)"
            )
        if not isinstance(state.get('inner'), Mapping):
            raise ValueError("state has no 'inner' entry (the state of the buffer doing the work)")
        batch = self._checked_batch(state.get('last_batch'))
        with self._lock:
            self._inner.load_state_dict(state['inner'], deepcopy)
            self._last_log, self._last_batch = last, batch

    def _checked_batch(self, batch: Any) -> Optional[tuple]:
        """A saved 'last sampled batch': None, or ids (str / int) and slots (ints in range) of equal length."""
        if batch is None:
            return None
        ids, slots = (batch.get('ids'), batch.get('slots')) if isinstance(batch, Mapping) else (None, None)
        ok = (
            isinstance(ids, list)
            and isinstance(slots, list)
            and len(ids) == len(slots)
            and all(type(i) in (str, int) for i in ids)
            and all(type(k) is int and 0 <= k < self.replay_buffer_size for k in slots)
        )
        if not ok:
            raise ValueError(
                f"state has an invalid 'last_batch' entry {batch!r:.80}; expected None or "
                f"{{'ids': [...], 'slots': [slot ints]}} of equal length"
            )
        return list(ids), list(slots)

    def save_data(self, path: str) -> None:
        save_state(path, type(self).__name__, self.state_dict())

    def load_data(self, path: str, allow_pickle: bool = False) -> None:
        self.load_state_dict(load_state(path, type(self).__name__, allow_pickle=allow_pickle))

    def start(self) -> None:
        self._inner.start()

    def close(self) -> None:
        self._inner.close()

    def __repr__(self) -> str:
        return (
            f"DequeReplayBuffer(instance_name={self._instance_name!r}, priority={self._cfg.priority}, "
            f"inner={self._inner!r})"
        )

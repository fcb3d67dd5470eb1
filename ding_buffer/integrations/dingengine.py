"""DI-engine's pipelines on ding_buffer, enabled from the config: the serial pipeline builds its buffer here when
this module is in the buffer section's ``import_names``; the task pipeline (``ding.framework``) takes a
``TaskBuffer``. Importing this module imports DI-engine (``ding``); ``import ding_buffer`` never does.

Serial pipeline (``ding.entry.serial_pipeline`` and every entry that builds its buffer with
``ding.worker.create_buffer``). One line in the create config replaces DI-engine's buffer with ours::

    replay_buffer=dict(type='advanced', import_names=['ding_buffer.integrations.dingengine'],
                       storage=dict(type='tensor')),

DI-engine imports a buffer section's ``import_names`` in ``compile_config`` (for the class's defaults) and in
``create_buffer``; importing this module registers, in DI-engine's ``BUFFER_REGISTRY`` of this process:

* DI-engine's six names (``naive``, ``advanced``, ``elastic``, ``episode``, ``sequence``, ``deque``) for
  ding_buffer's presets of those names, replacing DI-engine's own classes (``force_overwrite``);
* ``ding_buffer_<type>`` for every other ding_buffer type but the GFlowNet ones
  (``ding_buffer_prioritized_episode``, ``ding_buffer_chunk``, ...), which DI-engine has no name for.

The registered presets sample per-item dicts on tensor storage too (``storage.output='items'``): DI-engine's
policies collate a list of dicts (``default_preprocess_learn``) and its learner reads ``replay_unique_id`` /
``replay_buffer_idx`` per item for ``priority_info``. Everything else is the preset's own config; DI-engine's
keys that a preset does not read are accepted with a warning, as DI-engine's buffers ignore them.

Task pipeline: ``TaskBuffer`` is a ``ding.data.Buffer``, so ``data_pusher``, ``OffPolicyLearner`` (its
``offpolicy_data_fetcher``) and the priority updates of the fetcher take it; a ding_buffer preset does the work
(PER, ``max_use``, ``max_staleness``, rate limits from the config).
"""

import copy
import logging
import math
import numbers
from typing import Any, Dict, List, Mapping, Optional

import treetensor.torch as ttorch
from ding.data.buffer import Buffer, BufferedData
from ding.data.buffer.middleware import PriorityExperienceReplay
from ding.utils import BUFFER_REGISTRY as DI_BUFFER_REGISTRY

from .. import forks
from ..base import BUFFER_REGISTRY, IBuffer, create_buffer, get_buffer_cls
from ..config import deep_merge_dicts
from ..control.priority import as_priorities, is_id_text
from ..persistence import restoring, save_state

logger = logging.getLogger('ding_buffer.integrations.dingengine')

# DI-engine's registered buffer names; ding_buffer has a preset of the same name and semantics for each
DINGENGINE_NAMES = ('naive', 'advanced', 'elastic', 'episode', 'sequence', 'deque')
# presets whose samples are a flat batch of items (the others refuse storage.output='items')
ITEM_PRESETS = ('naive', 'advanced', 'elastic', 'deque')
PREFIX = 'ding_buffer_'
# the GFlowNet buffers are not DI-engine buffers: its RL pipelines have no use for them, and its compile_config
# cannot write their config (it writes every entry of a 'monitor' section as a dict; theirs holds log_every)
NOT_REGISTERED = ('gfn', 'gfn_diverse', 'terminating_state')


def pipeline_class(buffer_type: str) -> type:
    """The class DI-engine's registry builds for ``buffer_type``: a subclass of the preset that changes only its
    defaults -- ``storage.output='items'`` where its samples are a batch of items, and no ``monitor.tensorboard``
    flag (a pipeline passes its own writer; and DI-engine's ``compile_config`` writes every ``monitor`` entry as a
    dict, so a bool there makes it fail)."""
    cls = get_buffer_cls({'type': buffer_type})
    config = deep_merge_dicts(cls.config, {})
    if isinstance(config.get('monitor'), dict):
        config.monitor.pop('tensorboard', None)
    if buffer_type in ITEM_PRESETS:
        config.storage.output = 'items'
    doc = (
        f"ding_buffer's ``{buffer_type}`` preset as DI-engine's registry builds it: per-item samples on every storage."
    )
    return type(cls.__name__, (cls,), {'config': config, '__module__': __name__, '__doc__': doc})


def register(replace_dingengine: bool = True) -> Dict[str, type]:
    """
    Overview:
        Register ding_buffer's presets in DI-engine's ``BUFFER_REGISTRY`` (importing this module does it):
        ``ding_buffer_<type>`` for every type and, with ``replace_dingengine``, DI-engine's own names too.
        Idempotent (a re-import in a notebook registers again).
    Returns:
        - registered (:obj:`dict`): DI-engine name -> class.
    """
    # DI-engine registers its own buffers when these modules are first imported, refusing names already taken:
    # import them first, so ours replace theirs whatever the user's code imports later
    import ding.data.buffer.deque_buffer_wrapper  # noqa: F401
    import ding.worker.replay_buffer  # noqa: F401

    out = {}
    for name in sorted(BUFFER_REGISTRY.keys()):
        if name in NOT_REGISTERED:
            continue
        cls = pipeline_class(name)
        out[PREFIX + name] = cls
        if replace_dingengine and name in DINGENGINE_NAMES:
            out[name] = cls
    for name, cls in out.items():
        DI_BUFFER_REGISTRY.register(name, cls, force_overwrite=True)
    return out


REGISTERED = register()


# ---------------------------------------------------------------------------------------------- task pipeline
TASK_PRESETS = ('naive', 'advanced', 'elastic')
# meta keys a sampled BufferedData carries (update reads 'priority' and 'replay_buffer_idx' back): the slot, then
# what a prioritized preset adds
META_KEYS = ('replay_buffer_idx', 'priority', 'IS', 'use', 'staleness')
# the state_dict() key of the metas pushed with the stored items
META_STATE = 'task_meta'


class TaskBuffer(Buffer):
    """
    Overview:
        A ``ding.data.Buffer`` backed by a ding_buffer preset, for DI-engine's task pipeline: ``data_pusher``
        pushes into it, ``OffPolicyLearner`` samples from it, and the fetcher's per-item priority updates reach
        the preset's priorities (by id, stale ones skipped). The preset comes from ``cfg`` (a ding_buffer config:
        ``type`` ``naive`` / ``advanced`` / ``elastic``, ``replay_buffer_size``, ``storage``, ``max_use``,
        ``max_staleness``, ``thruput_controller``, ...); ``size`` overrides ``replay_buffer_size``.

        ``buffer.use(PriorityExperienceReplay(buffer, ...))`` (DI-engine's PER example) makes an empty
        non-prioritized buffer prioritized with the middleware's factors (``alpha = priority_power_factor``,
        ``beta = IS_weight_power_factor`` annealed over ``IS_weight_anneal_train_iter`` draws); other middleware
        is refused with the config key that does its job (``max_use`` for ``use_time_check``, ...).
    Interfaces:
        ``push(data, meta)``, ``sample(size, replace=, sample_range=, ignore_insufficient=)``,
        ``update(index, data=None, meta)``, ``count``, ``clear``, ``save_data``, ``load_data``, ``use``,
        ``stats``, ``close``; ``cur_learner_iter`` (set it to the learner's iteration for staleness rules).
    Thread-safety: one lock around each call (the preset has its own).
    """

    def __init__(
        self,
        cfg: Optional[Mapping] = None,
        size: Optional[int] = None,
        tb_logger: Any = None,
        exp_name: str = 'default_experiment',
        instance_name: str = 'buffer',
    ) -> None:
        cfg = deep_merge_dicts({'type': 'naive'}, cfg or {})
        if size is not None:
            cfg.replay_buffer_size = size
        if cfg.type not in TASK_PRESETS:
            raise ValueError(
                f"TaskBuffer: config key 'type' is {cfg.type!r}; DI-engine's task pipeline samples flat batches of "
                f"items, which types {list(TASK_PRESETS)} give (prioritized replay: 'advanced')"
            )
        storage = dict(cfg.get('storage') or {})
        if storage.get('output') == 'batch':
            raise ValueError(
                "TaskBuffer: config key 'storage.output' is 'batch'; DI-engine's middleware takes per-item data "
                "(use None or 'items')"
            )
        cfg.storage = dict(storage, output='items')
        self._cfg = cfg
        self._build_args = (tb_logger, exp_name, instance_name)
        self._inner: IBuffer = create_buffer(cfg, tb_logger=tb_logger, exp_name=exp_name, instance_name=instance_name)
        super().__init__(self._inner.replay_buffer_size)
        self._prefix = instance_name + '_'
        self._lock = forks.lock()
        self._pending: List[tuple] = []  # (id, slot, priority) of updates not yet applied
        self._meta: Dict[int, dict] = {}  # id -> the meta pushed with it (pruned to the stored ids now and then)
        self._closed = False
        self._next_uid = int(self._inner.stats()['push_items'])
        self.cur_learner_iter = -1

    # ------------------------------------------------------------------ properties
    @property
    def inner(self) -> IBuffer:
        """The ding_buffer preset doing the work."""
        return self._inner

    @property
    def prioritized(self) -> bool:
        return self._cfg.type == 'advanced'

    # ------------------------------------------------------------------ push / sample / update
    def push(self, data: Any, meta: Optional[dict] = None) -> Optional[BufferedData]:
        """Store ``data`` (one item) with ``meta``, which its samples return (as ``DequeBuffer``);
        ``meta['priority']`` is its initial priority on a prioritized buffer, ``meta['train_iter_data_collected']``
        its ``collect_iter`` (what ``max_staleness`` reads). The returned ``index`` is the item's id (what ``sample``
        reports and ``update`` takes). An item the buffer turns away (its rate limit,
        ``thruput_controller.push_sample_rate_limit``, or a capacity rule such as keep_best) is dropped and counted in
        ``stats()['refused_push']``, as the serial pipeline's push does: the return is then None, and DI-engine's
        ``data_pusher`` goes on."""
        meta = {} if meta is None else meta
        if not isinstance(meta, Mapping):
            raise TypeError(f"TaskBuffer.push: meta must be a dict or None, got {type(meta).__name__}")
        # DI-engine's collectors hand over treetensor trees: stored as the nested dict of tensors they hold
        item = data.json() if isinstance(data, ttorch.Tensor) else data
        if not isinstance(item, Mapping):  # a sample hands each item back with its id, a key of the dict
            raise TypeError(f"TaskBuffer.push: data must be a dict or a treetensor, got {type(data).__name__}")
        if self.prioritized and meta.get('priority') is not None:
            item = dict(item, priority=meta['priority'])  # the caller's dict is not changed
        collected = meta.get('train_iter_data_collected')  # (what DI-engine's staleness_check reads)
        if collected is not None and 'collect_iter' not in item and math.isfinite(self._inner.cfg.max_staleness):
            if not isinstance(collected, numbers.Integral) or isinstance(collected, bool):
                raise TypeError(
                    f"TaskBuffer.push: meta 'train_iter_data_collected' is {collected!r:.40}; expected the int "
                    "learner iteration the item was collected at"
                )
            if not -(1 << 60) < collected < 1 << 60:  # (the bound an item's collect_iter has)
                raise ValueError(
                    f"TaskBuffer.push: meta 'train_iter_data_collected' is {collected!r:.40}; expected an int within "
                    "+-2**60 (a learner iteration)"
                )
            item = dict(item, collect_iter=int(collected))
        meta = own_copy(meta) if meta else {}
        with self._lock:
            self._flush()  # a new item's priority is the max of every update taken before it (DI-engine's PER)
            if self._inner.push(item) != 1:
                return None
            uid = self._next_uid
            self._next_uid += 1
            if meta:
                self._meta[uid] = meta
                if len(self._meta) > 2 * self.size + 64:  # (amortised: a pass over the stored ids per `size` metas)
                    self._prune()
        return BufferedData(data=data, index=f'{self._prefix}{uid}', meta=dict(meta))

    def _prune(self) -> None:
        """Forget the metas of items no longer stored."""
        view = self._inner.view
        live = set(view.column('id', view.ordered_slots()).tolist())
        self._meta = {uid: m for uid, m in self._meta.items() if uid in live}

    def sample(
        self,
        size: Optional[int] = None,
        indices: Optional[List[str]] = None,
        replace: bool = False,
        sample_range: Optional[slice] = None,
        ignore_insufficient: bool = False,
        groupby: Optional[str] = None,
        unroll_len: Optional[int] = None,
    ) -> List[BufferedData]:
        """
        Overview:
            Draw ``size`` items (prioritized on an ``advanced`` buffer, which draws with replacement; uniform
            otherwise, with or without ``replace``). Too few items: ``ValueError`` (DI-engine's fetcher then skips
            the step), or ``[]`` with ``ignore_insufficient``. ``indices``, ``groupby`` and ``unroll_len`` are
            DI-engine ``DequeBuffer`` features this buffer does not have: ``NotImplementedError``.
        Returns:
            - data (:obj:`list`): ``BufferedData(data=item, index=id, meta={'priority', 'IS', ...})``.
        """
        for name, value in (('indices', indices), ('groupby', groupby), ('unroll_len', unroll_len)):
            if value is not None:
                raise NotImplementedError(
                    f"TaskBuffer.sample({name}=...) is not supported: sequences are sampled by ding_buffer's "
                    f"'episode' / 'prioritized_episode' types (windows of episodes)"
                )
        if size is None:
            raise ValueError("TaskBuffer.sample: give size")
        kwargs: Dict[str, Any] = {'sample_range': sample_range}
        if not self.prioritized:
            kwargs['replace'] = replace
        with self._lock:
            self._flush()
            out = self._inner.sample(size, self.cur_learner_iter, **kwargs)
            if out is None:
                if ignore_insufficient:
                    return []
                raise ValueError(f"There are less than {size} records in buffer ({self._inner.count()})")
            metas = self._meta
            return [BufferedData(data=d, index=d['replay_unique_id'], meta=self._sampled_meta(d, metas)) for d in out]

    def _sampled_meta(self, d: Mapping, metas: Dict[int, dict]) -> dict:
        """The meta pushed with item ``d`` (a copy), with the buffer's own keys of this draw."""
        pushed = metas.get(int(d['replay_unique_id'][len(self._prefix) :])) if metas else None
        # (without priorities the data's own fields of those names are the user's: only the slot is the buffer's)
        own = {k: d[k] for k in (META_KEYS if self.prioritized else META_KEYS[:1]) if k in d}
        if pushed and self._cfg.get('deepcopy'):  # (DI-engine's clone_object: a sample shares nothing)
            pushed = copy.deepcopy(pushed)
        return {**pushed, **own} if pushed else own

    def update(self, index: str, data: Optional[Any] = None, meta: Optional[dict] = None) -> bool:
        """
        Overview:
            Set the priority of the item ``index`` to ``meta['priority']`` (``meta`` as ``sample`` returned it,
            with its ``replay_buffer_idx``). Updates are queued and applied together before the next call that
            reads or sets priorities (``push``, ``sample``, ``count``, ``stats``, ``state_dict``, ``save_data``),
            where an item that left the buffer meanwhile is skipped (counted as stale in ``stats()``). Replacing
            ``data`` is not supported (``NotImplementedError``); a ``meta`` without ``priority`` is a
            ``ValueError``, as NaN or negative ones are. Returns whether an update was queued (False without the
            priority middleware).
        """
        if data is not None:
            raise NotImplementedError("TaskBuffer.update(data=...) is not supported: stored items are not replaced")
        if not self.prioritized:
            return False
        if not isinstance(meta, dict) or meta.get('priority') is None:  # (DI-engine's middleware fails on it too)
            raise ValueError(
                f"TaskBuffer.update: meta 'priority' is missing (meta {meta!r:.60}); expected the meta sample "
                f"returned with the new 'priority' set"
            )
        tail = index[len(self._prefix) :] if isinstance(index, str) and index.startswith(self._prefix) else ''
        if not (is_id_text(tail) and len(tail) < 20 and int(tail) < 1 << 63):  # (the queued updates stay good)
            raise ValueError(f"TaskBuffer.update: index {index!r:.60} is not an id of this buffer")
        slot = meta.get('replay_buffer_idx')
        if type(slot) is not int or not 0 <= slot < self.size:
            raise ValueError(
                f"TaskBuffer.update: meta 'replay_buffer_idx' is {slot!r:.40}; expected the int in [0, {self.size}) "
                f"that sample returned in the meta"
            )
        priority = as_priorities(meta['priority'], 'priority')  # NaN, inf, negative: ValueError naming it
        if priority.shape != (1,):
            raise ValueError(f"TaskBuffer.update: meta 'priority' must be one number, got shape {priority.shape}")
        with self._lock:
            if self._closed:
                raise RuntimeError("TaskBuffer.update: the buffer is closed")
            self._pending.append((index, slot, float(priority[0])))
        return True

    def _flush(self) -> None:
        """Apply the queued priority updates in one ``update`` call (all or nothing: a bad priority raises and
        the queue is dropped, naming it)."""
        if not self._pending:
            return
        ids, slots, priorities = zip(*self._pending)
        self._pending = []
        self._inner.update(
            {'replay_unique_id': list(ids), 'replay_buffer_idx': list(slots), 'priority': list(priorities)}
        )

    # ------------------------------------------------------------------ the rest
    def delete(self, index: str) -> None:
        raise NotImplementedError(
            "TaskBuffer.delete is not supported: items leave by the configured rules (capacity, max_use, "
            "max_staleness, removers)"
        )

    def get(self, idx: int) -> BufferedData:
        raise NotImplementedError("TaskBuffer.get is not supported: sample the buffer instead")

    def count(self) -> int:
        with self._lock:
            self._flush()
            return self._inner.count()

    def clear(self) -> None:
        with self._lock:
            self._pending = []
            self._inner.clear()
            self._meta = {}

    def stats(self) -> Dict[str, float]:
        with self._lock:
            self._flush()
            return self._inner.stats()

    def state_dict(self) -> Dict[str, Any]:
        """The preset's ``state_dict()``, with the metas pushed with the stored items under ``'task_meta'``
        (id -> meta; absent when there are none)."""
        with self._lock:
            self._flush()
            state = self._inner.state_dict()
            if self._meta:
                self._prune()
            if self._meta:
                state[META_STATE] = copy.deepcopy(self._meta)
            return state

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """Restore a ``state_dict()`` (a TaskBuffer's, or its preset's); all or nothing."""
        metas = state.get(META_STATE, {}) if isinstance(state, Mapping) else {}
        if not isinstance(metas, Mapping) or not all(type(k) is int and isinstance(m, dict) for k, m in metas.items()):
            raise ValueError(f"TaskBuffer.load_state_dict: state '{META_STATE}' must map int ids to meta dicts")
        metas = {uid: own_copy(m, f"state '{META_STATE}'[{uid}]", ValueError) for uid, m in metas.items()}
        if META_STATE in state:
            state = {k: v for k, v in state.items() if k != META_STATE}
        pushes = isinstance(state, Mapping) and set(state.keys()) == {'data'}  # (DI-engine's form: pushes the items)
        with self._lock:
            if pushes:
                self._flush()  # the stored items stay, with their queued updates and metas
            self._inner.load_state_dict(state, deepcopy=deepcopy)
            self._next_uid = int(self._inner.stats()['push_items'])
            if not pushes:
                self._pending = []
                self._meta = dict(metas)
            if self._meta:
                self._prune()

    def save_data(self, file_name: str) -> None:
        """Atomically write the buffer and the metas pushed with its items (``state_dict()``) to ``file_name``."""
        with self._lock:
            save_state(file_name, type(self._inner).__name__, self.state_dict())

    def load_data(self, file_name: str, allow_pickle: bool = False) -> None:
        """Restore a file of ``save_data`` (``allow_pickle``: as for the buffer it wraps: items holding numpy
        arrays or other objects on list storage need it, and only a file you trust)."""
        with self._lock:
            state = self._inner.read_data(file_name, allow_pickle=allow_pickle)
            with restoring(file_name):
                self.load_state_dict(state)

    def close(self) -> None:
        """The queued priority updates are applied first (they were taken); later ones are refused, as by the
        buffer itself, and ``count`` / ``stats`` / ``state_dict`` stay readable."""
        with self._lock:
            self._flush()
            self._closed = True
        self._inner.close()

    def __copy__(self) -> 'TaskBuffer':
        raise NotImplementedError("TaskBuffer has no views (DI-engine's Buffer.view): use the buffer itself")

    def use(self, func: Any) -> 'TaskBuffer':
        """
        Overview:
            DI-engine middleware where it applies: ``PriorityExperienceReplay`` makes this buffer prioritized
            (an empty ``naive`` one becomes ``advanced`` with the middleware's factors; an ``advanced`` one keeps
            its config). The middleware object is kept in ``_middleware`` (DI-engine's fetcher looks there to
            send priorities back) but never called: the preset's priority index does its job. Any other
            middleware raises ``TypeError`` naming the config key that does its job.
        """
        if isinstance(func, PriorityExperienceReplay):
            with self._lock:
                if not self.prioritized:
                    if self._cfg.get('type', 'naive') != 'naive':
                        raise ValueError(
                            f"TaskBuffer.use(PriorityExperienceReplay) makes a 'naive' buffer 'advanced'; this one is "
                            f"{self._cfg.get('type')!r}, whose own rules (e.g. elastic's window) 'advanced' does not "
                            "keep: configure type='advanced' instead"
                        )
                    if self._inner.count():
                        raise ValueError(
                            "TaskBuffer.use(PriorityExperienceReplay): the buffer already holds items; make it "
                            "prioritized before pushing (or configure type='advanced')"
                        )
                    self._become_prioritized(func)
                self._middleware.append(func)
            return self
        name = getattr(func, '__qualname__', type(func).__name__).split('.')[0]
        hint = {
            'use_time_check': "config key 'max_use'",
            'staleness_check': (
                "config key 'max_staleness' (it removes at staleness >= max_staleness: staleness_check's "
                "max_staleness=k is max_staleness=k + 1; the push meta 'train_iter_data_collected' is the item's "
                "collect_iter)"
            ),
            'clone_object': "config key 'deepcopy' (list storage); tensor storage samples copies already",
        }.get(name, "the buffer's config (see docs/composing.md)")
        raise TypeError(f"TaskBuffer.use({name}): DI-engine middleware is not run here; use {hint} instead")

    def _become_prioritized(self, per: Any) -> None:
        steps = per.IS_weight_anneal_train_iter
        if isinstance(steps, bool) or not isinstance(steps, numbers.Real) or not float(steps).is_integer() or steps < 0:
            raise ValueError(
                f"PriorityExperienceReplay's IS_weight_anneal_train_iter must be a whole number of draws >= 0 (the "
                f"buffer's anneal_step), got {steps!r:.40}"
            )
        cfg = deep_merge_dicts(
            self._cfg,
            {
                'type': 'advanced',
                'alpha': per.priority_power_factor,
                'beta': per.IS_weight_power_factor,
                'anneal_step': int(steps),
                'max_priority_plus_eps': True,  # (its running max takes priority + 1e-5)
            },
        )
        cfg.pop('sampler', None)  # naive's sampler key; advanced samples by priority
        tb_logger, exp_name, instance_name = self._build_args
        inner = create_buffer(cfg, tb_logger=tb_logger, exp_name=exp_name, instance_name=instance_name)
        self._inner.close()
        self._inner, self._cfg = inner, cfg
        self._next_uid = int(inner.stats()['push_items'])
        self._pending, self._meta = [], {}  # (of items that left: the new buffer's ids start again)


def own_copy(meta: Mapping, what: str = 'meta', error: type = TypeError) -> dict:
    """A deep copy of a meta the buffer keeps (the caller may change theirs; ``state_dict`` hands out copies):
    ``error`` naming it where it cannot be copied (a lock, a tensor in an autograd graph)."""
    try:
        return copy.deepcopy(dict(meta))
    except Exception as e:  # noqa: BLE001 - whatever __deepcopy__ raises
        raise error(f"TaskBuffer: {what} {meta!r:.60} cannot be copied ({type(e).__name__}: {e})") from None


__all__ = ['DINGENGINE_NAMES', 'NOT_REGISTERED', 'REGISTERED', 'TaskBuffer', 'pipeline_class', 'register']

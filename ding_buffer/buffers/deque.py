"""``DequeReplayBuffer`` (``type='deque'``): DI-engine's ``DequeBufferWrapper`` config and API, on the engine.

DI-engine's DQN / acrobot / pendulum configs name ``type='deque'``: the new-generation ``DequeBuffer`` with its
``use_time_check`` and ``PriorityExperienceReplay`` middleware behind the old API. Here the same config builds:

* ``priority=False``: a naive ring (uniform draws without replacement), with ``max_use`` as its remover (then with
  the ``fifo`` capacity rule: a spent item's slot is reused, as a deque frees its place); without
  a ``seed`` it draws with Python's global ``random`` exactly as DI-engine's ``DequeBuffer`` does
  (``random.sample`` over the items, oldest first), so a pipeline seeded by ``set_pkg_seed`` samples the same
  batches as with DI-engine's own buffer; with a ``seed`` it draws from its own RNG;
* ``priority=True``: a prioritized (advanced) ring with ``alpha = priority_power_factor``, ``beta =
  IS_weight_power_factor`` annealed to 1 over ``IS_weight_anneal_train_iter`` sample calls, and ``max_use``.

The engine's part keys apply as they do on that table: ``max_use``,
``max_staleness`` (``train_iter`` is the learner iteration staleness is measured at), ``thruput_controller``
(``sample_min_limit_ratio`` >= 1: a sample waits for ``ratio * size`` items; by default, as DI-engine's deque, a
uniform deque refuses a sample while fewer than ``size`` items are stored and a prioritized one draws a full batch,
with replacement, once anything is; ``sample(..., timeout=s)`` waits for it) and ``removers``.

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
import numbers
from typing import Any, Dict, List, Mapping, Optional

from easydict import EasyDict

from ..base import BUFFER_REGISTRY
from ..config import (
    CAPACITY_CHECK,
    INF,
    SEED_CHECK,
    STEP_CHECK,
    as_float,
    build_config,
    dingengine_ignored,
    positive_int,
)
from ..control.capacity import index_for
from ..storage import STORAGE_CHECKS, STORAGE_CONFIG, FreeListIndex
from .advanced import AdvancedReplayBuffer
from .deque_inner import inner_of
from .deque_table import deque_table, items_out
from .engine import Engine, parts_checks, parts_config, table_attribute
from .naive import NaiveReplayBuffer

_DEQUE_PARTS = parts_config(1.0)
_DEQUE_PARTS['thruput_controller']['sample_min_limit_ratio'] = None
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
    # parts, passed to the naive / advanced buffer doing the work (engine.parts_config). The thruput controller's
    # sample_min_limit_ratio None is DI-engine's rule: a uniform deque waits for `size` items, a prioritized one
    # draws (with replacement) once anything is stored.
    **_DEQUE_PARTS,
    storage=STORAGE_CONFIG,
)
DEQUE_CHECKS = dict(
    replay_buffer_size=CAPACITY_CHECK,
    train_iter_per_log=(positive_int, 'a positive int'),
    priority_power_factor=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    IS_weight_power_factor=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    IS_weight_anneal_train_iter=STEP_CHECK,
    priority_max_limit=(lambda x: as_float(x) > 0, 'a number > 0 (inf: no clipping)'),
    seed=SEED_CHECK,
    **parts_checks(1.0),
    **STORAGE_CHECKS,
)
DEQUE_CHECKS['thruput_controller.sample_min_limit_ratio'] = (
    lambda x: x is None or (isinstance(x, numbers.Real) and not isinstance(x, bool) and 1 <= x < INF),
    "None (DI-engine's rule) or a number >= 1",
)


def inner_config(cfg: Mapping) -> Dict[str, Any]:
    """The naive / advanced config that realises a deque config."""
    storage = copy.deepcopy(dict(cfg.storage))
    if items_out(cfg):  # the wrapper drops its keys from the batch first, then splits it (one pass less)
        storage['output'] = None
    ratio = cfg.thruput_controller.sample_min_limit_ratio
    removers = copy.deepcopy(list(cfg.removers))
    if cfg.max_use != INF and index_for(dict(removers=removers)) is not FreeListIndex:
        # DI-engine's deque: an item spent by max_use frees its place, which the next push fills (a ring would
        # overwrite its oldest live item): a full deque drops its oldest item, any freed slot is reused
        removers.append(dict(type='fifo'))
    common = dict(
        replay_buffer_size=cfg.replay_buffer_size,
        max_use=cfg.max_use,
        max_staleness=cfg.max_staleness,
        removers=removers,
        # DI-engine's rule (None) is a ratio of 1 there; a prioritized deque's table lifts it (DequeVerbs.needs)
        thruput_controller=copy.deepcopy(dict(cfg.thruput_controller, sample_min_limit_ratio=ratio or 1.0)),
        seed=cfg.seed,
        storage=storage,
    )
    if not cfg.priority:
        if cfg.seed is None:
            # DI-engine's DequeBuffer draws with Python's global `random`: the same batches under the same seed
            # (set_pkg_seed). The buffer's own RNG is then unused: a fixed seed keeps numpy's global
            # stream, which DI-engine's exploration draws from, untouched.
            common.update(seed=0, sampler=dict(type='python_random'))
        return dict(type='naive', **common)
    return dict(
        type='advanced',
        alpha=cfg.priority_power_factor,
        beta=cfg.IS_weight_power_factor,
        anneal_step=int(cfg.IS_weight_anneal_train_iter),
        max_priority_plus_eps=True,  # DI-engine's deque: its PriorityExperienceReplay middleware
        **common,
    )


@BUFFER_REGISTRY.register('deque')
class DequeReplayBuffer(Engine):
    """
    Overview:
        DI-engine's ``DequeBufferWrapper`` API on the engine: a slot table with uniform draws, or (``priority``)
        prioritized ones, configured from the deque's keys (``inner_config``), and the wrapper's ``sample`` /
        ``update`` semantics (``deque_table``).
    Interfaces:
        ``push``, ``sample(size, train_iter)``, ``update(meta)``, ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``.
    Property:
        ``replay_buffer_size``, ``push_count``, ``cfg`` (the deque config), ``instance_name``, ``storage``
    Thread-safety: every public method holds the buffer's lock; a sample waiting for data (``timeout``) releases
        it while it waits, so pushes go on.
    Examples:
        >>> from ding_buffer import create_buffer
        >>> buf = create_buffer(dict(type='deque', priority=True, priority_IS_weight=True, seed=0))
        >>> buf.push([{'obs': i} for i in range(4)], 0)
        4
        >>> [sorted(item) for item in buf.sample(2, 0)]  # the pushed dicts, with 'IS'
        [['IS', 'obs'], ['IS', 'obs']]
        >>> buf.update({'priority': [5.0, 0.5]})  # the priorities of the last sampled batch
        {'updated': 2, 'stale': 0}
        >>> buf.stats()['max_priority']  # the largest priority stored: DI-engine's deque adds 1e-5
        5.00001
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
    table = staticmethod(deque_table)
    monitors_take_tb_logger = False  # DI-engine's deque writes its own tags only (the table's ``_log``)

    def _config(self, cfg: Optional[Mapping]) -> EasyDict:
        """The deque's config checked, then translated into the naive / advanced config its table reads."""
        own = build_config(self.config, cfg, self.checks, ignored=self.ignored_keys)
        if own.priority_IS_weight and not own.priority:
            raise ValueError(
                "config key 'priority_IS_weight' = True needs 'priority' = True (IS weights come from priorities)"
            )
        # DI-engine's prioritized deque draws by index with replacement: a full batch once anything is stored
        # (unless the config sets a minimum ratio)
        rule = own.thruput_controller.sample_min_limit_ratio is None
        self.table_args = dict(deque_cfg=own, any_stored=bool(own.priority) and rule)  # the table keeps them
        kind = AdvancedReplayBuffer if own.priority else NaiveReplayBuffer
        return build_config(
            kind.config, inner_config(own), kind.checks, ignored=kind.ignored_keys, aliases=kind.key_aliases
        )

    @property
    def cfg(self) -> EasyDict:
        """The deque config (the one given, with its defaults)."""
        return self._t.deque_cfg

    @property
    def inner(self) -> Any:
        """The ``naive`` / ``advanced`` buffer this deque is configured as: an alias of the deque itself, with that
        buffer's verbs (``sample`` with ``sample_range``, ``update`` by ids, ``beta``) and its translated config."""
        return inner_of(self)

    storage = table_attribute('storage', 'The item storage (ListStorage or TensorStorage).')

    push_count = table_attribute(
        'push_count', 'Items accepted (the naive table restarts it on clear, the prioritized one keeps it).'
    )

    def push(self, data: Any, cur_collector_envstep: int = -1, batched: bool = False) -> int:
        """As ``naive``'s ``push``; a tuple is a sequence of items, as DI-engine's deque iterates what it is given."""
        return super().push(list(data) if type(data) is tuple and not batched else data, cur_collector_envstep, batched)

    def sample(self, size: int, train_iter: int = 0, timeout: Optional[float] = None) -> Optional[List[Any]]:
        """
        Overview:
            Draw ``size`` items (prioritized with ``priority``, with replacement); ``None`` (logged) when fewer
            than ``size`` are stored (``priority``: when none is, unless ``thruput_controller`` asks for more). The
            batch is remembered for ``update``. Writes TensorBoard every ``train_iter_per_log``.
        Returns:
            - data: the pushed dicts (``'IS'`` added with ``priority_IS_weight``; copies then, the stored dicts
              otherwise) -- or, on tensor storage, one dict of batched tensors.
        """
        return self._sample(train_iter, self._t.deque_request(size, train_iter, timeout))  # the table checks train_iter

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
        return self._update(self._t.deque_update, meta)


__all__ = ['DequeReplayBuffer', 'inner_config', 'items_out']

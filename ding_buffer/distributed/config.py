"""The ``distributed`` config section (accepted on every buffer type) and its validation."""

import os
from typing import Any, Mapping

from easydict import EasyDict

from ..config import SECONDS_CHECK, build_config, finite_number, optional_positive_int, positive_int, seconds

BACKENDS = ('torch', 'mpi', 'ray')
BASELINES = ('min', 'percentile', 'ema')


# checks shared by several keys
_OPTIONAL_SECONDS = (lambda x: x is None or seconds(x), 'None or a positive number of seconds, at most 1e7')
_MIB = (lambda x: finite_number(x) and 0 < x <= (1 << 23), 'a finite positive number of MiB (at most 8 TiB)')
_NAME = (lambda x: isinstance(x, str) and bool(x), 'a non-empty str')
_FUNCTION = (
    lambda x: x is None or callable(x) or (isinstance(x, str) and ':' in x),
    "None, a callable or 'module:function'",
)


DISTRIBUTED_CONFIG = dict(
    # None: a local buffer. 'torch' (torch.distributed gloo, torchrun), 'mpi' (mpi4py, mpirun) or 'ray'. 'torch'
    # assumes the ranks trust each other: gloo aborts a process that receives more bytes than it posted (a rank
    # that lies about a message's size); 'mpi' and 'ray' answer such a message with an error reply.
    backend=None,
    # torch / mpi: the rank that owns the buffer (-1: the last rank). Every other rank is a worker.
    manager_rank=-1,
    # torch / mpi: the worker ranks (None: all ranks but the manager). The manager stops once each has sent
    # EXIT (``close()``) or was lost.
    worker_ranks=None,
    # ray: name and namespace of the manager actor (get-or-create), whether it outlives its creator, the
    # address passed to ray.init when Ray is not initialised yet (None: RAY_ADDRESS or a local instance), and
    # how many workers exited or lost end it (a Ray task's RemoteBuffers, across retries, count once; None: never).
    actor_name='ding_buffer_manager',
    namespace='ding_buffer',
    detached=False,
    # Ray: where the manager actor runs, as Ray's actor options (keys num_cpus, num_gpus, memory, resources), e.g.
    # dict(resources={'replay_node': 1}) to place it on the node started with that custom resource.
    ray_actor_options=None,
    ray_address=None,
    num_workers=None,
    # Seconds a worker call may take (send + reply) before it raises ManagerUnavailableError; also bounds the
    # manager's wait for a worker to take its reply, and the goodbye exchange at close.
    timeout=60.0,
    # Seconds start-up may take (torch: reaching the master and every peer rank; ray: reaching the cluster);
    # None: `timeout`. A rank that cannot start raises naming what it waited for.
    startup_timeout=None,
    # Workers send a heartbeat every this many seconds (torch / mpi); the manager counts a worker as lost
    # after `peer_timeout` seconds without any message from it (None: only when its connection breaks).
    heartbeat_seconds=5.0,
    peer_timeout=120.0,
    # Manager side: a worker lost for silence alone (no message for peer_timeout: behind a partition, or the
    # manager's own link was cut) still holds the manager this many more seconds before the manager ends on its
    # account (when every other worker exited or was lost); one that speaks again meanwhile rejoins. None:
    # peer_timeout. Workers whose connection broke or whose process died are done at once.
    lost_grace=None,
    # Larger messages are refused with an error reply (MiB).
    max_message_mb=2048.0,
    # Manager side: all versioned blobs (put_blob, e.g. a learner's weights) together may hold this many MiB.
    max_blob_mb=256.0,
    # Allow pickled objects on the wire (needed for non-tensor leaves such as torchgfn containers). The
    # manager's own value also decides whether its load_data may unpickle a file a worker names: unpickling
    # runs code, so only set it where every rank trusts every other. A request never carries this flag.
    allow_pickle=False,
    # Manager side: the directory a worker's save_data / load_data paths are resolved in (relative paths that
    # must stay inside it, symlinks included). None: workers may not touch the manager's files at all.
    file_root=None,
    # Worker side: send accumulated pushes every `remote_buffer_freq` pushes (torchgfn's pending batch).
    remote_buffer_freq=1,
    # Worker side: do not wait for the score of a push; the next push returns it (one push stale).
    async_score=False,
    # Worker side: keep a full local copy built from the same config; sample / update / count use it and the
    # manager is a write-only global pool (torchgfn's pattern).
    local_buffer=False,
    # Worker side, with storage.frames: send each step's new frame instead of its obs / next_obs stacks (the
    # manager rebuilds them; 2 * stack times fewer frame bytes). False: send the stacks as pushed.
    frames_wire=True,
    # Manager side: the last stack of every worker environment kept to rebuild those steps, all workers together
    # (MiB); beyond it the least recently seen workers are forgotten and send their next push in full once.
    frames_wire_mb=256.0,
    # Worker side: send only state, log-reward and condition fields (GFlowNet dict batches).
    scoring_only=False,
    # Worker side: drop rows whose log-reward is below the manager's baseline_log_reward; after
    # `baseline_refresh_after` consecutive fully-filtered sends, send one unfiltered (None: never).
    baseline_filtering=False,
    baseline_refresh_after=None,
    # Manager side: 'module:function' or a callable (batch, sender, buffer) -> dict of numbers, merged into
    # the score dict of every push. `metadata_function`: (buffer) -> dict for metadata requests.
    scoring_function=None,
    metadata_function=None,
    # Manager side: store pushed data (False: only score it).
    store_locally=True,
    # Manager side: add 'baseline_log_reward' to score dicts: None, 'min', 'percentile' or 'ema'.
    baseline_strategy=None,
    baseline_percentile=0.1,
    baseline_ema_alpha=0.1,
    # Field holding the log-reward in dict batches / items (GFlowNet buffers use their own log_reward_key).
    log_reward_key='log_reward',
    # Manager side (MineStudio): refuse pushes made with a model older than current - max_version_lag or
    # from another session (None: no gating); a new session clears the buffer.
    max_version_lag=None,
    # Manager side: remove an item after it was sampled this many times (sets the buffer's max_use).
    max_reuse=None,
    # Manager side: write the buffer here (save_data) when it shuts down.
    checkpoint_path=None,
    # Workers on the manager's host push through a shared-memory ring of `shm_ring_mb` MiB each (one copy, no
    # reply per push) instead of the wire; workers on other hosts keep the wire. Pushes that need a reply (scores,
    # baselines, version gates) or a local copy cannot take it.
    shared_memory=False,
    shm_ring_mb=16.0,
    # Shard id carried by every message (one manager per shard).
    shard=0,
    # Ray: this many managers (actors '<actor_name>-shard<k>'), used as one buffer by the client (sharded.py):
    # pushes routed round-robin or by a hash of the item field shard_key, samples drawn as one buffer would.
    num_shards=1,
    shard_route='round_robin',
    shard_key=None,
)


def _actor_options_ok(x: Any) -> bool:
    if not isinstance(x, Mapping) or not set(x) <= {'num_cpus', 'num_gpus', 'memory', 'resources'}:
        return False
    for k in ('num_cpus', 'num_gpus'):
        if k in x and not (finite_number(x[k]) and x[k] >= 0):
            return False
    if 'memory' in x and not (type(x['memory']) is int and x['memory'] > 0):
        return False
    res = x.get('resources', {})
    return isinstance(res, Mapping) and all(
        isinstance(k, str) and k and finite_number(v) and v >= 0 for k, v in res.items()
    )


DISTRIBUTED_CHECKS = dict(
    backend=(lambda x: x is None or x in BACKENDS, f"None or one of {BACKENDS}"),
    manager_rank=(lambda x: isinstance(x, int) and x >= -1, 'an int >= -1'),
    worker_ranks=(
        lambda x: (
            x is None
            or (
                isinstance(x, (list, tuple))
                and all(type(r) is int and r >= 0 for r in x)  # (type(): a bool is no rank)
                and len(set(x)) == len(x)
            )
        ),
        'None or a list of distinct ranks',
    ),
    actor_name=_NAME,
    namespace=_NAME,
    ray_address=(lambda x: x is None or isinstance(x, str), "None or a cluster address str ('host:port')"),
    checkpoint_path=(
        lambda x: x is None or (isinstance(x, (str, os.PathLike)) and str(x) != '' and '\0' not in str(x)),
        'None or a file path (written by the manager at shutdown)',
    ),
    log_reward_key=(lambda x: isinstance(x, str) and bool(x), 'a non-empty str (a field name)'),
    num_workers=(optional_positive_int, 'None or a positive int'),
    ray_actor_options=(
        lambda x: x is None or _actor_options_ok(x),
        "None or a dict of Ray actor options: num_cpus / num_gpus (numbers >= 0), memory (bytes, an int > 0), "
        "resources (a dict of resource name -> number >= 0)",
    ),
    timeout=SECONDS_CHECK,
    startup_timeout=_OPTIONAL_SECONDS,
    heartbeat_seconds=SECONDS_CHECK,
    peer_timeout=_OPTIONAL_SECONDS,
    lost_grace=(lambda x: x is None or (finite_number(x) and 0 <= x <= 1e7), 'None or a finite number of seconds >= 0'),
    max_message_mb=_MIB,
    max_blob_mb=_MIB,
    file_root=(lambda x: x is None or (isinstance(x, str) and x and '\0' not in x), 'None or a directory path'),
    remote_buffer_freq=(positive_int, 'a positive int'),
    frames_wire=(lambda x: type(x) is bool, 'a bool'),
    frames_wire_mb=(lambda x: finite_number(x) and 0 <= x <= (1 << 23), 'a finite number of MiB >= 0 (at most 8 TiB)'),
    baseline_refresh_after=(optional_positive_int, 'None or a positive int'),
    scoring_function=_FUNCTION,
    metadata_function=_FUNCTION,
    baseline_strategy=(lambda x: x is None or x in BASELINES, f"None or one of {BASELINES}"),
    baseline_percentile=(lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    baseline_ema_alpha=(lambda x: 0 < x <= 1, 'a number in (0, 1]'),
    max_version_lag=(
        lambda x: x is None or (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62),
        'None or an int in [0, 2**62)',
    ),
    max_reuse=(optional_positive_int, 'None or a positive int'),
    shard=(lambda x: isinstance(x, int) and x >= 0, 'an int >= 0'),
    shared_memory=(lambda x: type(x) is bool, 'a bool'),
    shm_ring_mb=(
        lambda x: finite_number(x) and 0 < x <= 4096,
        'a finite positive number of MiB (at most 4096: all rings together hold at most 4 GiB)',
    ),
    num_shards=(lambda x: isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1024, 'an int in [1, 1024]'),
    shard_route=(lambda x: x in ('round_robin', 'hash'), "'round_robin' or 'hash'"),
    shard_key=(lambda x: x is None or (isinstance(x, str) and bool(x)), 'None or an item field name'),
)


def build_distributed_config(user: Any) -> EasyDict:
    """Validate the ``distributed`` section (unknown keys, types, values) and fill in the defaults."""
    if user is not None and not isinstance(user, Mapping):
        raise TypeError(f"config key 'distributed' must be a dict, got {type(user).__name__}")
    user = dict(user or {})
    # callables are not config-typed values: validate the rest, then put them back
    fns = {k: user.pop(k) for k in ('scoring_function', 'metadata_function') if callable(user.get(k))}
    cfg = build_config(DISTRIBUTED_CONFIG, user, DISTRIBUTED_CHECKS, prefix='distributed.')
    cfg.update(fns)
    if cfg.peer_timeout is not None and cfg.heartbeat_seconds > cfg.peer_timeout / 2:
        raise ValueError(
            f"config key 'distributed.heartbeat_seconds' is {cfg.heartbeat_seconds}, more than half of "
            f"'distributed.peer_timeout' ({cfg.peer_timeout}): the manager would count live idle workers "
            f"as lost between two heartbeats; use heartbeat_seconds <= peer_timeout / 2"
        )
    if cfg.baseline_filtering and cfg.baseline_strategy is None:
        raise ValueError(
            "config key 'distributed.baseline_filtering' is True but 'distributed.baseline_strategy' "
            "is None: the manager would never send a baseline; set it to 'min', 'percentile' or 'ema'"
        )
    if cfg.shared_memory:
        needs_reply = [k for k in SHM_EXCLUDES if cfg[k] != DISTRIBUTED_CONFIG[k]]
        if needs_reply:
            raise ValueError(
                f"config key 'distributed.shared_memory' is True together with {needs_reply}: a push through shared "
                f"memory has no reply (no score, baseline or version gate) and no local copy; turn those off or "
                f"set shared_memory=False"
            )
    return cfg


# what a push through shared memory cannot do (it has no reply and skips the worker's push pipeline)
SHM_EXCLUDES = (
    'remote_buffer_freq', 'async_score', 'local_buffer', 'scoring_only', 'baseline_filtering', 'scoring_function',
    'baseline_strategy', 'max_version_lag', 'num_shards',
)  # fmt: skip


def startup_seconds(dcfg: Any) -> float:
    return dcfg.timeout if dcfg.startup_timeout is None else dcfg.startup_timeout


def resolve_callable(spec: Any, key: str) -> Any:
    """``None`` / a callable / ``'module:function'`` -> callable or None."""
    if spec is None or callable(spec):
        return spec
    import importlib

    module, _, name = spec.partition(':')
    expected = "expected 'module:function' naming a callable importable by the manager's process"
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as e:  # ImportError, AttributeError, or the module's own code failing on import
        raise ValueError(
            f"config key 'distributed.{key}' is {spec!r}, which cannot be imported ({type(e).__name__}: {e}); "
            f"{expected}"
        ) from e
    if not callable(fn):
        raise ValueError(
            f"config key 'distributed.{key}' is {spec!r}, which is a {type(fn).__name__}, not callable; {expected}"
        )
    return fn

"""Building a distributed buffer from its config: the manager on the manager rank(s), a ``RemoteBuffer`` (or a
``ShardedBuffer`` of them) everywhere else and with Ray.

``create_if_distributed`` is what ``create_buffer`` calls for a config with a ``distributed`` section (the package
registers it with ``base.register_distributed``); ``create_distributed`` builds either end for a config whose
``distributed.backend`` is set.
"""

import copy
import uuid
from typing import Any

from ..base import get_buffer_cls
from ..config import check_section
from .config import build_distributed_config, startup_seconds
from .local import _local_cfg, build_manager_buffer, check_manager_side, profile
from .rank_manager import ReplayBufferManager
from .remote import RemoteBuffer


def create_distributed(cls: type, cfg: Any, *args, **kwargs) -> Any:
    """``create_buffer`` for configs with ``distributed.backend``: a ReplayBufferManager or a RemoteBuffer."""
    dcfg = build_distributed_config(cfg.get('distributed'))
    if dcfg.backend and getattr(cls, 'not_distributable', None):
        raise ValueError(f"config key 'distributed' is set on type {cfg.get('type')!r}: {cls.not_distributable}")
    if dcfg.max_version_lag is not None and cls.capabilities()['version_gate']:
        raise ValueError(
            f"config key 'distributed.max_version_lag' is {dcfg.max_version_lag}, but type {cfg.get('type')!r} gates "
            f"model versions itself (its 'max_staleness', applied to every fragment and chunk; the manager passes "
            f"update_model_version on): leave distributed.max_version_lag None, one gate decides"
        )
    local_cfg = _local_cfg(cfg)
    # every rank fails fast on a bad buffer section
    check_section(cls, local_cfg)
    max_bytes = int(dcfg.max_message_mb * (1 << 20))
    if dcfg.num_shards > 1 and dcfg.local_buffer:
        raise ValueError("config keys 'distributed.num_shards' > 1 and 'distributed.local_buffer' do not combine")
    if dcfg.num_shards > 1 and dcfg.backend == 'ray':
        return _create_sharded(cls, cfg, dcfg, local_cfg, *args, **kwargs)
    if dcfg.backend == 'ray':
        from .ray_backend import get_or_create_actor
        from .ray_channel import RayChannel, import_ray
        from .startup import starts_local_ray

        if not import_ray().is_initialized() and starts_local_ray(dcfg):
            # the manager actor (created from this config unless it exists) will run on this host: what it would
            # refuse fails here, before Ray starts. On a cluster it may run elsewhere: it checks itself.
            check_manager_side(cfg, dcfg)
        actor = get_or_create_actor(cfg, dcfg)
        channel = RayChannel(actor, dcfg, uuid.uuid4().hex)
    else:
        from .peer_transports import MPITransport, TorchTransport
        from .startup import init_mpi, init_torch, known_rank_world, mpi_recovery

        # what this rank can check alone -- the layout, and the settings of its own role -- before any network
        # call (torch: reaching the master and the other ranks; MPI: MPI_Init, which waits for every rank)
        early_rank, early_world = known_rank_world(dcfg.backend)
        try:
            if early_world is not None:
                managers, workers = rank_layout(dcfg, early_world)
                if early_rank is not None:
                    check_role(cfg, dcfg, local_cfg, early_rank, managers, workers)
        except ValueError:
            if dcfg.backend == 'mpi' and mpi_recovery():
                # under mpirun --enable-recovery a rank that leaves before MPI_Init holds every other rank inside
                # MPI_Init for good (Open MPI 4.1): join it first (every rank was started), then raise
                init_mpi()
            raise
        if dcfg.backend == 'torch':
            rank, world = init_torch(startup_seconds(dcfg))
        else:
            rank, world = init_mpi()
        managers, workers = rank_layout(dcfg, world)
        if (early_rank, early_world) != (rank, world):  # the launcher's variables did not say: check now
            check_role(cfg, dcfg, local_cfg, rank, managers, workers)
        cls_t = TorchTransport if dcfg.backend == 'torch' else MPITransport
        if rank in managers:
            transport = cls_t(workers, dcfg.allow_pickle, max_bytes, grace=dcfg.timeout)
            sub = cfg
            if len(managers) > 1:  # shard k of K: its requests carry shard k
                sub = _shard_cfg(cls, cfg, dcfg, managers.index(rank))
            buffer, mdcfg, key = build_manager_buffer(sub, *args, **kwargs)
            return ReplayBufferManager(buffer, transport, mdcfg, workers, key)
        from .channel import PeerChannel

        if len(managers) > 1:  # one transport, channel and RemoteBuffer per shard, used as one buffer
            from .sharded import ShardedBuffer

            shards = []
            for k, manager in enumerate(managers):
                transport = cls_t([manager], dcfg.allow_pickle, max_bytes, grace=dcfg.timeout)
                channel = PeerChannel(transport, manager, dcfg.timeout, dcfg.heartbeat_seconds)
                sub_dcfg = copy.deepcopy(dcfg)
                sub_dcfg.shard = k
                shards.append(worker_buffer(cls, local_cfg, sub_dcfg, channel))
            return ShardedBuffer(shards, local_cfg, dcfg.shard_route, dcfg.shard_key, seed=local_cfg.get('seed'))
        transport = cls_t([managers[0]], dcfg.allow_pickle, max_bytes, grace=dcfg.timeout)
        channel = PeerChannel(transport, managers[0], dcfg.timeout, dcfg.heartbeat_seconds)
    return worker_buffer(cls, local_cfg, dcfg, channel, *args, **kwargs)


def check_role(cfg: Any, dcfg: Any, local_cfg: Any, rank: int, managers: list, workers: list) -> None:
    """What rank ``rank`` of the layout ``(managers, workers)`` would refuse in its own role, checked without the
    network (``ValueError`` naming the key): a manager's ``check_manager_side`` (its callables, ``file_root``,
    ``max_reuse``), a worker's type profile and sharded routing; a rank that is neither is refused. Manager-side
    keys are not checked on workers: their ``file_root`` or scoring module may exist on the manager's host only."""
    if rank in managers:  # (with shards, the checkpoint this manager writes is its shard's)
        if dcfg.num_shards > 1 and dcfg.checkpoint_path:
            from .sharded import shard_path

            dcfg = type(dcfg)(dcfg, checkpoint_path=shard_path(dcfg.checkpoint_path, managers.index(rank)))
        check_manager_side(cfg, dcfg)
    elif rank not in workers:
        raise ValueError(
            f"config key 'distributed.worker_ranks' is {dcfg.worker_ranks!r}: rank {rank} is neither a manager "
            f"({managers}) nor a worker ({workers}); expected every rank of the job to have a role"
        )
    else:  # what worker_buffer asks of the type (e.g. shared memory for its items), before any transport starts
        profile(get_buffer_cls(cfg), local_cfg, dcfg)
        if len(managers) > 1:
            from .sharded import ShardedBuffer

            ShardedBuffer.check(local_cfg, dcfg.shard_route, dcfg.shard_key)


def worker_buffer(cls: type, local_cfg: Any, dcfg: Any, channel: Any, *args, **kwargs) -> RemoteBuffer:
    """A worker's ``RemoteBuffer`` over ``channel``: told what the type's pushes look like (its
    ``distributed_profile``), with a local buffer of the type where ``distributed.local_buffer`` asks for one."""
    prof = profile(cls, local_cfg, dcfg)
    local = cls(copy.deepcopy(local_cfg), *args, **kwargs) if dcfg.local_buffer else None
    return RemoteBuffer(
        local_cfg,
        dcfg,
        channel,
        local=local,
        dict_is_batch=prof['dict_is_batch'],
        scoring_keys=prof['scoring_keys'],
        log_reward_key=prof['log_reward_key'],
    )


def _shard_cfg(cls: type, cfg: Any, dcfg: Any, k: int, **extra: Any) -> Any:
    """The buffer config of shard ``k``: its requests carry shard ``k``, its shutdown checkpoint is
    ``checkpoint_path.shard<k>`` (the shards must not overwrite one file), and its minimum-size rule is the type's
    default: the sharded client applies ``sample_min_limit_ratio`` to the shards' total, as one buffer would (a
    shard judging its own part by it refused parts that one buffer of all the items draws)."""
    from .sharded import shard_path

    sub = copy.deepcopy(cfg)
    least = cls.default_config().get('thruput_controller', {}).get('sample_min_limit_ratio')
    if least is not None:
        sub['thruput_controller'] = dict(sub.get('thruput_controller') or {}, sample_min_limit_ratio=least)
    section = dict(sub['distributed'], shard=k, **extra)
    if dcfg.checkpoint_path:
        section['checkpoint_path'] = shard_path(dcfg.checkpoint_path, k)
    sub['distributed'] = section
    return sub


def rank_layout(dcfg: Any, world: int) -> tuple:
    """``(managers, workers)``: the manager rank(s) -- ``manager_rank`` (default the last rank); with ``num_shards``
    K > 1 the last K ranks -- and the worker ranks (``worker_ranks``, default every other rank) of a ``world``-rank
    job; ``ValueError`` naming the key when they do not fit it. Needs nothing but the config and the world size,
    so a rank checks it before waiting for the others."""
    if world < 2:
        launcher = 'torchrun --nproc_per_node N' if dcfg.backend == 'torch' else 'mpirun -n N'
        raise ValueError(
            f"config key 'distributed.backend' is {dcfg.backend!r} but this job has {world} rank: a "
            f"distributed buffer needs a manager and at least one worker; launch with {launcher} "
            f"(N >= 2), or set distributed.backend=None for a local buffer"
        )
    k = dcfg.num_shards
    if k > 1:
        if dcfg.manager_rank >= 0:
            raise ValueError(
                f"config key 'distributed.manager_rank' is {dcfg.manager_rank}: with num_shards {k} the "
                f"managers are the last {k} ranks (leave manager_rank at -1)"
            )
        if k >= world:
            raise ValueError(
                f"config key 'distributed.num_shards' is {k}: the job has {world} ranks, and at least one "
                f"must be a worker"
            )
        managers = list(range(world - k, world))
    else:
        manager = dcfg.manager_rank if dcfg.manager_rank >= 0 else world - 1
        if manager >= world:
            raise ValueError(
                f"config key 'distributed.manager_rank' is {manager}; the job has {world} ranks (0..{world - 1})"
            )
        managers = [manager]
    workers = [r for r in range(world) if r not in managers] if dcfg.worker_ranks is None else list(dcfg.worker_ranks)
    if not workers or set(managers) & set(workers) or any(r >= world for r in workers):
        raise ValueError(
            f"config key 'distributed.worker_ranks' {workers} must name ranks < {world} other than "
            f"the manager{'s' if len(managers) > 1 else ''} {managers if len(managers) > 1 else managers[0]}"
        )
    return managers, workers


def _create_sharded(cls: type, cfg: Any, dcfg: Any, local_cfg: Any, *args, **kwargs) -> Any:
    """Ray: ``distributed.num_shards`` manager actors (``<actor_name>-shard<k>``) used as one buffer."""
    from .sharded import ShardedBuffer

    # fail before any actor starts on what the client refuses (type, route, key)
    ShardedBuffer.check(local_cfg, dcfg.shard_route, dcfg.shard_key)
    shards = []
    try:
        for k in range(dcfg.num_shards):
            sub = _shard_cfg(cls, cfg, dcfg, k, num_shards=1, actor_name=f"{dcfg.actor_name}-shard{k}")
            shards.append(create_distributed(cls, sub, *args, **kwargs))
    except BaseException:
        for shard in shards:
            shard.close(timeout=5.0)
        raise
    return ShardedBuffer(shards, local_cfg, dcfg.shard_route, dcfg.shard_key, seed=local_cfg.get('seed'))


def create_if_distributed(cls: type, cfg: Any, *args, **kwargs) -> Any:
    """The factory ``create_buffer`` calls for a config with a ``distributed`` section (validated even when its
    backend is None, which means a local buffer: returns None)."""
    if build_distributed_config(cfg.get('distributed')).backend is None:
        return None
    return create_distributed(cls, cfg, *args, **kwargs)

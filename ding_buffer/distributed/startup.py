"""Start-up of the distributed backends, every step bounded by ``distributed.startup_timeout``: joining the
torch.distributed job (reaching the master's store, then a presence barrier that names the ranks that never
came), MPI's thread level, and reaching a Ray cluster (a TCP probe first, then ``ray.init`` on a bounded thread).
"""

import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional, Tuple


def wait_listening(host: str, port: int, deadline: float) -> None:
    """Return once something accepts TCP connections at ``host:port`` (a head node may still be starting);
    ``TimeoutError`` at ``deadline`` (a ``time.monotonic()`` value)."""
    pause, last = 0.05, None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"nothing listens at {host}:{port} ({type(last).__name__ if last else 'no attempt'}: {last})"
            )
        try:
            socket.create_connection((host, port), timeout=min(left, 2.0)).close()
            return
        except OSError as e:
            last = e
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.5)


def _presence_barrier(store: Any, rank: int, world: int, deadline: float, prefix: str, configured: float) -> None:
    """Every rank marks itself present in the store and waits (until ``deadline``, the end of the configured
    start-up time of ``configured`` seconds) for the others."""
    keys = [f'{prefix}/{r}' for r in range(world)]
    pause = 0.01
    while True:
        try:
            store.set(keys[rank], '1')
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception as e:  # the store's host went away (it gave up waiting, or died)
            raise TimeoutError(
                f"distributed start-up: lost the store while waiting for the other ranks "
                f"({type(e).__name__}: {e}); did every rank start?"
            ) from e
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"distributed start-up: ranks {missing} of {world} did not join within {configured}s "
                f"(distributed.startup_timeout); were they started, with the same MASTER_ADDR/PORT?"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _env_int(*keys: str) -> Optional[int]:
    for key in keys:
        try:
            return int(os.environ[key])
        except (KeyError, ValueError):
            continue
    return None


def known_rank_world(backend: str) -> Tuple[Optional[int], Optional[int]]:
    """``(rank, world size)`` as far as this process knows them before any network call (None where it does not):
    torch: the default group's when it exists, else ``RANK`` / ``WORLD_SIZE`` (torchrun / env:// launches); MPI:
    ``COMM_WORLD``'s when mpi4py already initialised MPI, else the launcher's variables (Open MPI's
    ``OMPI_COMM_WORLD_RANK`` / ``_SIZE``, MPICH / Intel MPI's ``PMI_RANK`` / ``PMI_SIZE``). Importing mpi4py is
    not done here: ``MPI_Init`` is the MPI backend's first network wait."""
    if backend == 'torch':
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return _env_int('RANK'), _env_int('WORLD_SIZE')
    mpi = sys.modules.get('mpi4py.MPI')
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    if 'OMPI_COMM_WORLD_SIZE' in os.environ:
        return _env_int('OMPI_COMM_WORLD_RANK'), _env_int('OMPI_COMM_WORLD_SIZE')
    return _env_int('PMI_RANK'), _env_int('PMI_SIZE')


def mpi_recovery() -> bool:
    """Whether this process runs under ``mpirun --enable-recovery`` (Open MPI): the job outlives a rank that dies
    or leaves, and a rank that leaves before ``MPI_Init`` keeps the others waiting inside it."""
    return os.environ.get('OMPI_MCA_orte_enable_recovery', '').lower() in ('1', 'true', 'yes', 't', 'y')


def init_torch(startup_s: float) -> Tuple[int, int]:
    """
    Overview:
        Join (or reuse) the default gloo process group from torchrun's / SLURM-style env variables. Start-up is
        bounded by ``startup_s``: reaching the master's store, then every rank marking itself present.
        The group itself gets a week-long timeout: gloo closes every connection when one of its own waits
        expires, and the manager may legitimately wait for hours between pushes (our timeouts live in the
        inbox and the outboxes instead).
    """
    import datetime

    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("distributed.backend='torch' needs torch.distributed, which this torch build lacks")
    if dist.is_initialized():
        backend = str(dist.get_backend())
        if backend != 'gloo' and 'cpu:gloo' not in backend.split(','):  # (e.g. 'cpu:gloo,cuda:nccl')
            raise ValueError(
                f"distributed.backend='torch' sends CPU tensors over the default process group, whose CPU backend "
                f"must be gloo; it uses {backend!r}: init_process_group('gloo') or ('cpu:gloo,cuda:nccl')"
            )
        return dist.get_rank(), dist.get_world_size()
    missing = [k for k in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE') if k not in os.environ]
    if missing:
        raise RuntimeError(
            f"distributed.backend='torch' needs the env variables {missing} (set by torchrun, or by "
            f"you for env:// launches); run the job under torchrun --nproc_per_node N"
        )
    host, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    where = f"{host}:{port}"
    # torchrun hosts the store in its agent; otherwise rank 0 does. The store does not wait for its clients: the
    # presence barrier below does, and names the ranks that never came.
    agent = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
    master = rank == 0 and not agent
    deadline = time.monotonic() + startup_s
    try:
        if not master:  # the store's own client retries with random back-off past its timeout: probe first
            wait_listening(host, port, deadline)
        store = dist.TCPStore(
            host,
            port,
            world,
            is_master=master,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.5)),
        )
    except Exception as e:
        raise TimeoutError(
            f"distributed start-up (rank {rank} of {world}): could not reach the torch.distributed "
            f"master at {where} within {startup_s}s (distributed.startup_timeout): "
            f"{type(e).__name__}: {e}"
        ) from e
    restart = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    _presence_barrier(store, rank, world, deadline, f'ding_buffer/present/{restart}', startup_s)
    long = datetime.timedelta(seconds=max(startup_s, 7 * 24 * 3600))
    store.set_timeout(long)
    dist.init_process_group('gloo', store=store, rank=rank, world_size=world, timeout=long)
    return rank, world


def init_mpi() -> Tuple[int, int]:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            "distributed.backend='mpi' needs mpi4py (pip install 'ding_buffer[mpi]', and Open MPI: "
            "apt-get install openmpi-bin libopenmpi-dev)"
        ) from e
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError("distributed.backend='mpi' needs MPI_THREAD_MULTIPLE (mpi4py's default thread level)")
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _tcp_target(address: Optional[str]) -> Optional[Tuple[str, int]]:
    """``(host, port)`` of an explicit cluster address (``host:port``, ``ray://host:port``); None for None,
    'auto', 'local' and anything else Ray resolves itself."""
    if not isinstance(address, str) or address in ('', 'auto', 'local'):
        return None
    rest = address.split('://', 1)[1] if '://' in address else address
    host, sep, port = rest.rpartition(':')
    host = host.strip('[]')
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


class _DropThreadWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return 'SIGTERM handler is not set' not in record.getMessage()


def _sigterm_exit(signum, frame):
    sys.exit(signum)


def _init_bounded(ray: Any, address: str, namespace: str, deadline: float, seconds: float) -> None:
    """``ray.init`` on a helper thread, so a port that accepts connections but never answers like a Ray
    cluster cannot hold the caller past ``deadline``."""
    previous = None
    if threading.current_thread() is threading.main_thread() and sys.platform != 'win32':
        previous = signal.signal(signal.SIGTERM, _sigterm_exit)  # what ray.init installs itself on the main thread
    errors: list = []

    def init() -> None:
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    quiet = _DropThreadWarning()
    ray_logger = logging.getLogger('ray._private.worker')
    ray_logger.addFilter(quiet)
    try:
        t = threading.Thread(target=init, daemon=True, name='ding_buffer-ray-init')
        t.start()
        t.join(max(deadline - time.monotonic(), 0.0))
    finally:
        ray_logger.removeFilter(quiet)
    if (t.is_alive() or errors) and previous is not None:  # a failed start leaves the process's handler as it was
        signal.signal(signal.SIGTERM, previous)
    if t.is_alive():
        raise TimeoutError(
            f"the Ray cluster at {address!r} (distributed.ray_address) accepts connections but "
            f"ray.init did not finish within {seconds}s (distributed.startup_timeout); is it a Ray "
            f"head node (GCS port) and reachable with this Ray version?"
        )
    if errors:
        raise errors[0]


def starts_local_ray(dcfg: Any) -> bool:
    """Whether ``connect_ray`` would start (or join) a Ray instance of this host rather than a cluster's address:
    ``distributed.ray_address`` is ``'local'``, or None with no ``RAY_ADDRESS``."""
    address = dcfg.ray_address
    return address == 'local' or (address is None and not os.environ.get('RAY_ADDRESS'))


def connect_ray(ray: Any, dcfg: Any, deadline: float, seconds: float) -> None:
    """``ray.init`` for the manager actor's cluster, bounded by ``deadline``."""
    address = dcfg.ray_address
    shown = address if address not in (None, 'auto') else os.environ.get('RAY_ADDRESS')
    target = _tcp_target(shown)
    if target is None:  # a local instance or Ray's own lookup of a running one
        ray.init(address=address, namespace=dcfg.namespace, log_to_driver=False)
        return
    try:
        wait_listening(*target, deadline)
    except TimeoutError as e:
        raise TimeoutError(
            f"could not reach the Ray cluster at {shown!r} (distributed.ray_address) within {seconds}s "
            f"(distributed.startup_timeout): {e}"
        ) from e
    _init_bounded(ray, address, dcfg.namespace, deadline, seconds)

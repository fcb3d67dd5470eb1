"""Distributed buffers: one manager owns the buffer, workers reach it over torch.distributed, MPI or Ray.

``create_buffer(cfg)`` with ``cfg.distributed.backend`` set calls ``create_distributed`` (``factory``): on the manager
rank (torch / MPI) it returns a ``ReplayBufferManager`` (call ``run()``), on the other ranks and everywhere with Ray a
``RemoteBuffer``. The modules: ``protocol`` (the request / reply messages both sides use), ``codec`` (wire format),
``transport`` (torch / MPI framing and receive threads), ``manager`` (``ManagerCore``), ``rank_manager`` (the rank
loop), ``ray_backend`` (the manager actor), ``remote`` (worker side), ``channel`` / ``ray_channel`` (a worker's
requests over torch / MPI or Ray), ``shm_ring`` (pushes of workers on the manager's host through shared memory),
``baseline``, ``batching``. This package registers the factory with ``base``
and exports the public names.
"""

from ..base import register_distributed
from ..errors import (
    CodecError,
    FramesOutOfStepError,
    ManagerTimeoutError,
    ManagerUnavailableError,
    RemoteError,
    SendTimeout,
    TransportError,
)
from .codec import decode, encode
from .config import DISTRIBUTED_CONFIG, build_distributed_config
from .factory import create_distributed, create_if_distributed
from .local import build_manager_buffer, profile
from .manager import ManagerCore
from .rank_manager import ReplayBufferManager
from .remote import RemoteBuffer

register_distributed(create_if_distributed)

__all__ = [
    'create_distributed',
    'build_manager_buffer',
    'RemoteBuffer',
    'ReplayBufferManager',
    'ManagerCore',
    'ManagerUnavailableError',
    'ManagerTimeoutError',
    'RemoteError',
    'FramesOutOfStepError',
    'TransportError',
    'SendTimeout',
    'CodecError',
    'encode',
    'decode',
    'DISTRIBUTED_CONFIG',
    'build_distributed_config',
    'profile',
]

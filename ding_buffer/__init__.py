"""ding_buffer: replay buffers with DI-engine's API -- ``create_buffer(cfg)`` builds any registered preset."""
from .base import BUFFER_REGISTRY, IBuffer, create_buffer, get_buffer_cls
from .buffers import (AdvancedReplayBuffer, DequeReplayBuffer, DiverseGFlowNetReplayBuffer, ElasticReplayBuffer,
                      EpisodeReplayBuffer, GFlowNetReplayBuffer, NaiveReplayBuffer, SequenceReplayBuffer,
                      TerminatingStateBuffer)
from .config import deep_merge_dicts
from . import distributed  # noqa: F401  (registers the distributed wrapper with create_buffer)
from .errors import (CodecError, ManagerUnavailableError, RemoteError, SampleTimeoutError, SendTimeout,
                     TransportError)

__version__ = '0.1.0'

__all__ = [
    'IBuffer', 'BUFFER_REGISTRY', 'create_buffer', 'get_buffer_cls', 'deep_merge_dicts', 'NaiveReplayBuffer',
    'ElasticReplayBuffer', 'SequenceReplayBuffer', 'DequeReplayBuffer', 'EpisodeReplayBuffer', 'AdvancedReplayBuffer', 'GFlowNetReplayBuffer', 'DiverseGFlowNetReplayBuffer',
    'TerminatingStateBuffer', 'SampleTimeoutError', 'CodecError', 'TransportError', 'SendTimeout',
    'ManagerUnavailableError', 'RemoteError', '__version__'
]

"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""
from .common import BufferCore
from .episode import EpisodeReplayBuffer
from .naive import NaiveReplayBuffer
from .advanced import AdvancedReplayBuffer
from .gflownet import DiverseGFlowNetReplayBuffer, GFlowNetReplayBuffer, TerminatingStateBuffer

__all__ = [
    "BufferCore", "NaiveReplayBuffer", "EpisodeReplayBuffer", "AdvancedReplayBuffer", "GFlowNetReplayBuffer",
    "DiverseGFlowNetReplayBuffer", "TerminatingStateBuffer"
]

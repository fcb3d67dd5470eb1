"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""
from .common import BufferCore
from .engine import Engine
from .episode import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
from .naive import NaiveReplayBuffer
from .advanced import AdvancedReplayBuffer
from .gflownet import GFlowNetReplayBuffer
from .gfn_variants import DiverseGFlowNetReplayBuffer, TerminatingStateBuffer

__all__ = [
    "BufferCore", "Engine", "NaiveReplayBuffer", "EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer", "AdvancedReplayBuffer", "GFlowNetReplayBuffer",
    "DiverseGFlowNetReplayBuffer", "TerminatingStateBuffer"
]

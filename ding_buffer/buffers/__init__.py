"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""
from .common import BufferCore
from .engine import Engine
from .episode import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
from .naive import NaiveReplayBuffer
from .elastic import ElasticReplayBuffer
from .sequence import SequenceReplayBuffer
from .advanced import AdvancedReplayBuffer
from .deque import DequeReplayBuffer
from .gflownet import GFlowNetReplayBuffer
from .gfn_variants import DiverseGFlowNetReplayBuffer, TerminatingStateBuffer
from .chunk import ChunkReplayBuffer

__all__ = [
    "BufferCore", "Engine", "NaiveReplayBuffer", "ElasticReplayBuffer", "SequenceReplayBuffer", "EpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer", "AdvancedReplayBuffer", "DequeReplayBuffer", "GFlowNetReplayBuffer",
    "DiverseGFlowNetReplayBuffer", "TerminatingStateBuffer", "ChunkReplayBuffer"
]

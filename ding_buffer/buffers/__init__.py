"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""

from .advanced import AdvancedReplayBuffer
from .chunk import ChunkReplayBuffer
from .deque import DequeReplayBuffer
from .elastic import ElasticReplayBuffer
from .engine import Engine
from .episode import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
from .gflownet import GFlowNetReplayBuffer
from .gfn_variants import DiverseGFlowNetReplayBuffer, TerminatingStateBuffer
from .mixture import MixtureReplayBuffer
from .naive import NaiveReplayBuffer
from .sequence import SequenceReplayBuffer

__all__ = [
    "Engine",
    "NaiveReplayBuffer",
    "ElasticReplayBuffer",
    "SequenceReplayBuffer",
    "EpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer",
    "AdvancedReplayBuffer",
    "DequeReplayBuffer",
    "GFlowNetReplayBuffer",
    "DiverseGFlowNetReplayBuffer",
    "TerminatingStateBuffer",
    "ChunkReplayBuffer",
    "MixtureReplayBuffer",
]

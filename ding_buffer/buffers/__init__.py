"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""
from .common import BufferCore
from .episode import EpisodeReplayBuffer
from .naive import NaiveReplayBuffer
from .advanced import AdvancedReplayBuffer

__all__ = ["BufferCore", "NaiveReplayBuffer", "EpisodeReplayBuffer", "AdvancedReplayBuffer"]

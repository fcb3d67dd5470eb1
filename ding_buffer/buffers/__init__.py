"""Buffer presets, each registered in ``BUFFER_REGISTRY`` by name."""
from .common import BufferCore
from .episode import EpisodeReplayBuffer
from .naive import NaiveReplayBuffer

__all__ = ['BufferCore', 'NaiveReplayBuffer', 'EpisodeReplayBuffer']

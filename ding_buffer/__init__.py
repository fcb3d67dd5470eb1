"""ding_buffer: replay buffers with DI-engine's API -- ``create_buffer(cfg)`` builds any registered preset.

The public names load on first use (PEP 562), so ``import ding_buffer`` -- and the ``ding-buffer`` command's first
line -- does not wait for torch; ``from ding_buffer import create_buffer`` works as usual.
"""

import importlib
from typing import Any, List

from . import base as _base  # the contract only: easydict, no torch

__version__ = '0.1.0'

# public name -> the submodule that defines it
_EXPORTS = {
    'IBuffer': 'base',
    'BUFFER_REGISTRY': 'base',
    'create_buffer': 'base',
    'get_buffer_cls': 'base',
    'deep_merge_dicts': 'config',
    'NaiveReplayBuffer': 'buffers',
    'ElasticReplayBuffer': 'buffers',
    'SequenceReplayBuffer': 'buffers',
    'DequeReplayBuffer': 'buffers',
    'EpisodeReplayBuffer': 'buffers',
    'AdvancedReplayBuffer': 'buffers',
    'GFlowNetReplayBuffer': 'buffers',
    'DiverseGFlowNetReplayBuffer': 'buffers',
    'TerminatingStateBuffer': 'buffers',
    'MixtureReplayBuffer': 'buffers',
    'SampleTimeoutError': 'errors',
    'CodecError': 'errors',
    'TransportError': 'errors',
    'SendTimeout': 'errors',
    'ManagerUnavailableError': 'errors',
    'ManagerTimeoutError': 'errors',
    'RemoteError': 'errors',
    'FramesOutOfStepError': 'errors',
}
_SUBPACKAGES = (
    'base',
    'buffers',
    'config',
    'control',
    'datasets',
    'distributed',
    'errors',
    'monitor',
    'persistence',
    'sampling',
    'segment_tree',
    'storage',
    'train',
    'utils',
)

__all__ = [*_EXPORTS, '__version__']  # the lazily loaded names, in _EXPORTS' order


def _load_presets() -> None:
    """Register the built-in presets, the distributed wrapper and the dataset loader (what ``base`` calls on the first
    lookup)."""
    importlib.import_module('.buffers', __name__)
    importlib.import_module('.distributed', __name__)
    importlib.import_module('.datasets.config', __name__)


_base.set_preset_loader(_load_presets)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f'.{_EXPORTS[name]}', __name__), name)
        _load_presets()
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f'.{name}', __name__)
    raise AttributeError(f"module 'ding_buffer' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))

"""The `ding-buffer train` pipeline: config-driven DQN on gymnasium with any ding_buffer buffer (gymnasium,
matplotlib and tqdm come with the ``examples`` extra).

The public names load on first use (PEP 562): importing a light module of this package (``train.env``, as the CLI
does before torch loads) does not import the job's config, its buffers and torch.
"""

from typing import Any, List

__all__ = ['TRAIN_DEFAULTS', 'build_train_config', 'load_config_file']


def __getattr__(name: str) -> Any:
    if name in __all__:  # each is defined in .config
        from . import config

        globals()[name] = value = getattr(config, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))

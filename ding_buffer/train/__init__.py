"""The `ding-buffer train` pipeline: config-driven DQN on gymnasium with any ding_buffer buffer (gymnasium,
matplotlib and tqdm come with the ``examples`` extra)."""

from .config import TRAIN_DEFAULTS, build_train_config, load_config_file

__all__ = ['TRAIN_DEFAULTS', 'build_train_config', 'load_config_file']

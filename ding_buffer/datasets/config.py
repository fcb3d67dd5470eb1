"""A buffer config's ``dataset`` section: ``create_buffer(dict(type='naive', ..., dataset=dict(path=...)))`` builds
the buffer from the config without the section, then fills it with ``load_dataset`` (registered with
``base.register_dataset`` when the package loads its presets).

The section's keys are ``load_dataset``'s options (``DEFAULTS``); an unknown key is refused with the closest one.
``allow_pickle`` comes from this config, the buffer owner's. A ``distributed`` section is refused with it: load the
dataset on the owner (the manager's buffer) yourself, or push it from a worker.
"""

import os
from typing import Any

from .. import base
from ..config import check_keys_and_types, plain_numbers
from .load import checked_options, load_dataset

DEFAULTS = dict(
    path='',  # the dataset file (required)
    format=None,  # 'd4rl', 'minari', 'dingengine_hdf5', 'dingengine_pkl'; None / 'auto': told from the file
    chunk_size=10_000,  # rows read and pushed at a time
    limit=None,  # store only the first `limit` transitions
    progress=None,  # progress bar (tqdm); None: when stderr is a terminal
    allow_pickle=False,  # read 'dingengine_pkl' files, which run code from the file
    atomic=True,  # restore the buffer's state on a failed load (see load_dataset)
)
NULLABLE = frozenset({'dataset.format', 'dataset.limit', 'dataset.progress'})


def create_with_dataset(cls: type, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """``create_buffer`` for a config with a ``dataset`` section (``None``: no dataset)."""
    section = cfg.get('dataset')
    cfg = type(cfg)({k: v for k, v in cfg.items() if k != 'dataset'})
    if section is None:
        return base.create_buffer(cfg, *args, **kwargs)
    options = checked_section(section)
    if cfg.get('distributed') is not None:
        raise ValueError(
            "config keys 'dataset' and 'distributed' do not combine: a dataset fills one buffer. Build the manager's "
            "buffer without 'dataset' and call ding_buffer.datasets.load_dataset on it before serving, or push the "
            "dataset from one worker"
        )
    buffer = cls(cfg, *args, **kwargs)
    try:
        load_dataset(buffer, options.pop('path'), **options)
    except BaseException:
        buffer.close()
        raise
    return buffer


def checked_section(section: Any) -> dict:
    """The section's options, every key and value checked (what a job calls before it builds anything)."""
    if not hasattr(section, 'items'):
        raise ValueError(f"config key 'dataset' must be a dict of {sorted(DEFAULTS)}, got {type(section).__name__}")
    section = plain_numbers(section)  # (a numpy number is accepted wherever its Python number is)
    if isinstance(section.get('path'), os.PathLike):  # (a pathlib.Path, as load_dataset takes it)
        section = {**section, 'path': os.fspath(section['path'])}
    check_keys_and_types(DEFAULTS, section, prefix='dataset.', nullable=NULLABLE)
    options = {**DEFAULTS, **dict(section)}
    if not options['path']:
        raise ValueError("config key 'dataset.path' is required: the dataset file to load")
    try:
        checked_options(*(options[k] for k in ('format', 'chunk_size', 'limit', 'progress', 'allow_pickle', 'atomic')))
    except ValueError as e:
        raise ValueError(f"config key 'dataset': {e}") from e
    return options


base.register_dataset(create_with_dataset)

"""Offline RL datasets into any buffer: ``load_dataset(buffer, path, format=...)`` reads D4RL, Minari and DI-engine
files chunk by chunk into a buffer of transitions or episodes, all or nothing; ``write_d4rl(path, data)`` saves
transitions or episodes in the D4RL layout. A buffer config's ``dataset`` section does the same at
``create_buffer`` (``ding_buffer.datasets.config``). HDF5 needs h5py: ``pip install "ding_buffer[datasets]"``.
"""

from .load import FORMATS, load_dataset
from .writer import write_d4rl

__all__ = ['FORMATS', 'load_dataset', 'write_d4rl']

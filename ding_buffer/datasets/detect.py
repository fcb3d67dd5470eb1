"""Which layout a dataset file has, from its first bytes and (HDF5) its top-level keys."""

import re

from .hdf5 import fail, is_hdf5, open_hdf5

PICKLE_PROTOCOL_2_PLUS = 0x80  # a pickle of protocol 2 or later starts with the PROTO opcode


def detect_format(path: str) -> str:
    """``'d4rl'``, ``'minari'``, ``'dingengine_hdf5'`` or ``'dingengine_pkl'``; a file that fits none, or more than
    one, is a ValueError asking for ``format=``."""
    if is_hdf5(path):
        with open_hdf5(path, 'any HDF5') as f:
            keys = {k for k in f.keys() if isinstance(k, str)}  # (a name that is not text names no layout's key)
        found = []
        if {'observations', 'actions'} <= keys:
            found.append('d4rl')
        if any(re.fullmatch(r'episode_\d+', k) for k in keys):
            found.append('minari')
        if {'obs', 'next_obs'} <= keys:
            found.append('dingengine_hdf5')
        if len(found) == 1:
            return found[0]
        what = f"fits the layouts {found}" if found else "fits no known layout"
        raise fail(path, None, f"is an HDF5 file whose keys {sorted(keys)[:8]} {what}; pass format=")
    with open(path, 'rb') as f:
        head = f.read(1)
    if head and head[0] == PICKLE_PROTOCOL_2_PLUS:
        return 'dingengine_pkl'
    raise fail(path, None, "is neither an HDF5 file nor a pickle: its format cannot be told; pass format=")

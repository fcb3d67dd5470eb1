"""``write_d4rl``: save transitions or episodes atomically as a D4RL file (what ``load_dataset`` reads)."""

import errno
import os
from collections.abc import Mapping
from typing import Any, Dict, List

import numpy as np

try:
    import resource
except ImportError:  # (not on Windows)
    resource = None

from ..persistence import atomic_write
from .hdf5 import import_h5py, numeric

# transition field -> D4RL key; either name is accepted
D4RL_KEYS = {
    'obs': 'observations',
    'action': 'actions',
    'reward': 'rewards',
    'done': 'terminals',
    'timeout': 'timeouts',
    'next_obs': 'next_observations',
}
REQUIRED = ('observations', 'actions', 'rewards', 'terminals')
FLAGS = ('terminals', 'timeouts')


def write_d4rl(path: str, data: Any) -> int:
    """
    Overview:
        Write ``data`` to ``path`` in the D4RL layout (``observations``, ``actions``, ``rewards``, ``terminals``,
        ``timeouts`` and, if given, ``next_observations``), through a temporary file renamed into place: a crash
        or a bad input leaves the old file or none. Returns the number of steps written.
    Arguments:
        - path (:obj:`str`): the file to write
        - data: a dict of arrays with one row per step (keys the D4RL names or the transition fields ``obs``, \
            ``action``, ``reward``, ``done``, ``timeout``, ``next_obs``), or a list of episodes, each such a dict \
            of ``[T, ...]`` arrays or a list of transition dicts. An episode whose last step has neither ``done`` \
            nor ``timeout`` gets ``timeout`` there, so that it stays an episode of its own when read back.
    """
    columns = _columns(data)
    h5py = import_h5py()

    def write(f: Any) -> None:
        check_room(f, sum(a.nbytes + min(a.nbytes, 1 << 20) for a in columns.values()))  # (+ the last chunk's pad)
        with h5py.File(f.name, 'w') as out:
            for key, array in columns.items():
                out.create_dataset(key, data=array, fletcher32=True)  # a checksum a chunk: damage is refused on read

    atomic_write(path, write, mode='w+b')
    return len(columns['observations'])


def check_room(f: Any, nbytes: int) -> None:
    """``OSError`` (ENOSPC / EFBIG) unless the filesystem of the open file ``f`` has room for about ``nbytes`` and
    the process may write a file that large: HDF5 crashes the process when a write fails at its close."""
    need = int(nbytes * 1.02) + (64 << 10)  # (chunk checksums, indexes and metadata)
    st = os.fstatvfs(f.fileno())
    room = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize  # (root may use the reserved blocks)
    if st.f_blocks and need > room:  # (no blocks: a filesystem without a limit, such as ramfs)
        raise OSError(errno.ENOSPC, f"the file needs about {need} bytes; {room} are free", f.name)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource is not None else -1
    if 0 <= limit < need:
        raise OSError(
            errno.EFBIG, f"the file needs about {need} bytes; files of this process are limited to {limit}", f.name
        )


def _columns(data: Any) -> Dict[str, np.ndarray]:
    if isinstance(data, Mapping):
        columns = _named(data, 'data')
    elif isinstance(data, (list, tuple)):
        numbered = [(i, _episode(ep, i)) for i, ep in enumerate(data)]
        numbered = [(i, ep) for i, ep in numbered if len(ep['observations'])]  # (empty episodes add nothing)
        if not numbered:
            raise ValueError("write_d4rl: the list of episodes holds no step")
        first, keys = numbered[0][0], set(numbered[0][1])
        for i, ep in numbered:
            if set(ep) != keys:
                raise ValueError(f"write_d4rl: episode {i} has the keys {sorted(ep)}, episode {first} {sorted(keys)}")
        columns = {k: np.concatenate([ep[k] for _, ep in numbered]) for k in numbered[0][1]}
    else:
        raise ValueError(
            f"write_d4rl: data is a {type(data).__name__}; expected a dict of arrays or a list of episodes"
        )
    return columns


def _episode(episode: Any, i: int) -> Dict[str, np.ndarray]:
    if isinstance(episode, (list, tuple)):
        if not all(isinstance(step, Mapping) for step in episode):
            raise ValueError(f"write_d4rl: episode {i} is a list of something else than transition dicts")
        keys = list(episode[0]) if episode else list(REQUIRED)
        for t, step in enumerate(episode):
            if set(step) != set(keys):
                raise ValueError(
                    f"write_d4rl: episode {i} step {t} has keys {sorted(map(str, step))}; its step 0 has "
                    f"{sorted(map(str, keys))} (every step of an episode has the same keys)"
                )
        episode = {k: [step[k] for step in episode] for k in keys} if episode else {}
    elif not isinstance(episode, Mapping):
        raise ValueError(f"write_d4rl: episode {i} is a {type(episode).__name__}; expected a dict of arrays or a list")
    if not episode:
        return {'observations': np.zeros(0)}
    columns = _named(episode, f'episode {i}')
    if len(columns['terminals']) and not (columns['terminals'][-1] or columns['timeouts'][-1]):
        columns['timeouts'][-1] = True
    return columns


def _named(data: Mapping, where: str) -> Dict[str, np.ndarray]:
    out: Dict[str, np.ndarray] = {}
    for key, value in data.items():
        name = D4RL_KEYS.get(key, key)
        if name not in D4RL_KEYS.values():
            known = sorted(set(D4RL_KEYS) | set(D4RL_KEYS.values()))
            raise ValueError(f"write_d4rl: {where} has key {key!r}; the D4RL layout has {known}")
        if name in out:
            raise ValueError(f"write_d4rl: {where} names {name!r} twice (as {key!r} and its other name)")
        out[name] = _array(value, f'{where}: key {key!r}')
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ValueError(f"write_d4rl: {where} is missing {missing[0]!r}; the D4RL layout needs {list(REQUIRED)}")
    if out['observations'].ndim == 0:
        raise ValueError(f"write_d4rl: {where}: 'observations' is one number, not one row a step")
    rows = len(out['observations'])
    if not rows and where == 'data':  # (an empty episode is skipped)
        raise ValueError(f"write_d4rl: {where} holds no step ('observations' has 0 rows)")
    out.setdefault('timeouts', np.zeros(rows, dtype=bool))
    for name, array in out.items():
        if array.ndim == 0 or len(array) != rows:
            raise ValueError(f"write_d4rl: {where}: {name!r} has {array.shape[:1]} rows, 'observations' {rows}")
        if name in FLAGS:
            flat = array.reshape(rows, -1) if rows else array.reshape(0, 1)  # (an empty episode's flags)
            if flat.shape[1] != 1 or not np.isin(flat, (0, 1)).all():
                raise ValueError(
                    f"write_d4rl: {where}: {name!r} must hold one bool (or 0 / 1) a step, got {array.shape}"
                )
            out[name] = flat[:, 0].astype(bool)
    shapes = out['observations'].shape, out.get('next_observations', out['observations']).shape
    if shapes[0] != shapes[1]:
        raise ValueError(f"write_d4rl: {where}: 'next_observations' has shape {shapes[1]}, 'observations' {shapes[0]}")
    return out


def _array(value: Any, where: str) -> np.ndarray:
    try:  # torch tensors (alone, or steps of a list, mixed with arrays and numbers) as numpy arrays
        value = [_numpy(v) for v in value] if isinstance(value, (list, tuple)) else _numpy(value)
        array = np.asarray(value)
    except (ValueError, TypeError, RuntimeError) as e:  # (ragged steps; dtypes numpy lacks, e.g. bfloat16)
        raise ValueError(f"write_d4rl: {where} is not an array of numbers of one shape: {e}") from None
    if not numeric(array.dtype):
        raise ValueError(
            f"write_d4rl: {where} has dtype {array.dtype}; expected numbers or bools (floats of at most 64 bits)"
        )
    return array


def _numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (its values: lazy negation / conjugation resolved); anything else as it is."""
    if hasattr(value, 'detach'):
        return value.detach().cpu().resolve_neg().resolve_conj().numpy()
    return value


__all__: List[str] = ['write_d4rl']

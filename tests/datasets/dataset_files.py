"""Small dataset files of every layout, built from the published layouts with h5py / pickle (not with the package),
the transitions each should give (a plain-loop reference of the documented rules), and the stored transitions of a
buffer read back through its public API (``state_dict()``; ``sample`` for frames)."""

import pickle

import numpy as np
import pytest
import torch

h5py = pytest.importorskip('h5py')


# ================================================================================ files
def write_h5(path, arrays):
    """``arrays``: {key: array or dict (a group)}."""
    with h5py.File(path, 'w') as f:
        _write_group(f, arrays)
    return path


def _write_group(group, arrays):
    for key, value in arrays.items():
        if isinstance(value, dict):
            _write_group(group.create_group(key), value)
        else:
            group.create_dataset(key, data=value)


def d4rl_arrays(rng, ends=(('t', 3), ('o', 4), ('t', 1), (None, 3)), next_obs=True, obs_shape=(3,)):
    """D4RL arrays of episodes ``(how it ends: 't' terminal, 'o' timeout, None unfinished, length)``."""
    n = sum(length for _, length in ends)
    terminals, timeouts, at = np.zeros(n, bool), np.zeros(n, bool), 0
    for how, length in ends:
        at += length
        if how == 't':
            terminals[at - 1] = True
        elif how == 'o':
            timeouts[at - 1] = True
    arrays = {
        'observations': rng.standard_normal((n, *obs_shape)).astype(np.float32),
        'actions': rng.standard_normal((n, 2)).astype(np.float32),
        'rewards': rng.standard_normal(n).astype(np.float32),
        'terminals': terminals,
        'timeouts': timeouts,
        'infos/qpos': rng.standard_normal((n, 2)),  # what real D4RL files carry besides; not read
    }
    if next_obs:
        arrays['next_observations'] = rng.standard_normal((n, *obs_shape)).astype(np.float32)
    return arrays


def d4rl_expected(a, timeout_key='timeout', frames=False):
    """The transitions of D4RL arrays, one step at a time (the documented rules)."""
    n, out = len(a['observations']), []
    timeouts = a.get('timeouts', np.zeros(n, bool))
    for i in range(n):
        end = bool(a['terminals'][i] or timeouts[i] or i == n - 1)
        t = {'obs': a['observations'][i], 'action': a['actions'][i], 'reward': a['rewards'][i]}
        if 'next_observations' in a:
            t['next_obs'] = a['next_observations'][i]
        elif end and not a['terminals'][i]:  # no next observation, not terminal: dropped, the step before ends
            if out and not out[-1]['_end']:
                out[-1][timeout_key] = np.bool_(True)
                out[-1]['_end'] = True
            continue
        elif end:  # terminal: zeros (frames: the stack shifted by a zero frame)
            o = a['observations'][i]
            t['next_obs'] = np.concatenate([o[1:], np.zeros_like(o[:1])]) if frames else np.zeros_like(o)
        else:
            t['next_obs'] = a['observations'][i + 1]
        t.update(done=np.bool_(a['terminals'][i]), **{timeout_key: np.bool_(timeouts[i])}, _end=end)
        out.append(t)
    return out


def minari_file(path, rng, lengths=(3, 5, 2), nested=True, shuffle_names=True):
    """Minari groups ``episode_<id>``; the ids are written out of order (10 sorts after 2)."""
    ids = list(range(len(lengths)))
    if len(ids) > 2:
        ids = [0, 1, 10][: len(lengths)] if shuffle_names else ids
    episodes = {}
    for eid, n in zip(ids, lengths):
        obs = rng.standard_normal((n + 1, 2)).astype(np.float32)
        if nested:
            obs = {'pos': obs, 'camera': {'pixels': rng.integers(0, 255, (n + 1, 2, 2), dtype=np.uint8)}}
        term, trunc = np.zeros(n, bool), np.zeros(n, bool)
        (term if eid % 2 == 0 else trunc)[-1] = True
        episodes[f'episode_{eid}'] = {
            'observations': obs,
            'actions': rng.integers(0, 4, n),
            'rewards': rng.standard_normal(n),
            'terminations': term,
            'truncations': trunc,
        }
    write_h5(path, {name: episodes[name] for name in reversed(list(episodes))})  # file order is not id order
    return [episodes[f'episode_{eid}'] for eid in sorted(ids)]


def minari_expected(episodes):
    out = []
    for ep in episodes:
        n = len(ep['rewards'])
        for t in range(n):
            obs = _tree(ep['observations'], lambda a, t=t: a[t])
            nxt = _tree(ep['observations'], lambda a, t=t: a[t + 1])
            out.append(
                {
                    'obs': obs,
                    'action': ep['actions'][t],
                    'reward': ep['rewards'][t],
                    'next_obs': nxt,
                    'done': ep['terminations'][t],
                    'timeout': ep['truncations'][t],
                    '_end': t == n - 1,
                }
            )
    return out


def dingengine_arrays(rng, n=9, dones=(2, 6)):
    done = np.zeros(n, bool)
    done[list(dones)] = True
    return {
        'obs': rng.standard_normal((n, 4)).astype(np.float32),
        'action': rng.integers(0, 2, (n,)),
        'reward': rng.standard_normal((n, 1)).astype(np.float32),
        'done': done,
        'next_obs': rng.standard_normal((n, 4)).astype(np.float32),
        'collect_iter': np.arange(n),
    }


def dingengine_expected(a):
    n = len(a['obs'])
    return [dict({k: v[i] for k, v in a.items()}, _end=bool(a['done'][i] or i == n - 1)) for i in range(n)]


def pickle_file(path, transitions):
    with open(path, 'wb') as f:
        pickle.dump(transitions, f)
    return path


def dingengine_transitions(rng, n=7, dones=(3,)):
    return [
        {
            'obs': torch.from_numpy(rng.standard_normal(4).astype(np.float32)),
            'action': torch.tensor(int(rng.integers(0, 2))),
            'reward': torch.tensor([float(rng.standard_normal())]),
            'next_obs': torch.from_numpy(rng.standard_normal(4).astype(np.float32)),
            'done': i in dones,
        }
        for i in range(n)
    ]


def _tree(x, fn):
    return {k: _tree(v, fn) for k, v in x.items()} if isinstance(x, dict) else fn(x)


# ================================================================================ reading a buffer back
def stored_transitions(buffer):
    """Every stored transition, oldest first, as nested dicts of tensors."""
    storage = buffer.cfg.get('storage') or {}
    if storage.get('frames') is not None:
        batch = buffer.sample(buffer.count())  # every item, once: ordered by id below
        order = torch.argsort(batch['replay_unique_id'])
        skip = ('replay_unique_id', 'replay_buffer_idx')
        return [{k: v[i] for k, v in batch.items() if k not in skip} for i in order.tolist()]
    return _rows(buffer.state_dict()['storage'])


def stored_episodes(buffer):
    """Every stored episode, oldest first: a dict of [T, ...] tensors, or a list of transition dicts."""
    if (buffer.cfg.get('storage') or {}).get('frames') is not None:  # frame ids in the state: sample them all
        skip = ('replay_unique_id', 'replay_buffer_idx')
        episodes = sorted(buffer.sample(buffer.count(), replace=False), key=lambda e: int(e['replay_unique_id'][0]))
        return [{k: v for k, v in e.items() if k not in skip} for e in episodes]
    state = buffer.state_dict()['episodes']
    storage = state['storage']
    if storage['kind'] == 'list':
        return list(storage['items'])
    rows, lengths, out, at = _rows(storage), [int(x) for x in state['length'] if x > 0], [], 0
    for n in lengths:
        episode = rows[at : at + n]
        out.append(_stack(episode))
        at += n
    return out


def _stack(rows):
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    return torch.stack(rows)


def _rows(storage):
    if storage['kind'] == 'list':
        return list(storage['items'])
    paths = [tuple(p) for p, _, _ in storage['schema']]
    n = len(storage['fields'][0]) if storage['fields'] else 0
    out = []
    for i in range(n):
        item = {}
        for path, column in zip(paths, storage['fields']):
            node = item
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = column[i]
        out.append(item)
    return out


def episodes_of(expected):
    """Split expected transitions after each ``_end``."""
    out, cur = [], []
    for t in expected:
        cur.append(t)
        if t['_end']:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def assert_transition(got, want, where):
    """``got`` (tensors) equals ``want`` (numpy / tensors): same fields, dtypes and values."""
    want = {k: v for k, v in want.items() if k != '_end'}
    assert set(got) == set(want), f"{where}: fields {sorted(got)} != {sorted(want)}"
    for key, value in want.items():
        if isinstance(value, dict):
            assert_transition(got[key], value, f'{where}.{key}')
            continue
        g = got[key]
        w = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))
        if not isinstance(g, torch.Tensor):
            g = torch.as_tensor(g)
        assert g.dtype == w.dtype, f"{where}.{key}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape and torch.equal(g, w), f"{where}.{key}: {g} != {w}"


def assert_episode(got, want, where):
    """A stored episode (dict of [T, ...] tensors, or list of dicts) equals the expected transitions."""
    if isinstance(got, list):
        assert len(got) == len(want), f"{where}: {len(got)} steps, expected {len(want)}"
        for t, (g, w) in enumerate(zip(got, want)):
            assert_transition(g, w, f'{where}[{t}]')
        return
    for t, w in enumerate(want):
        assert_transition(_tree(got, lambda a, t=t: a[t]), w, f'{where}[{t}]')
    lengths = {len(a) for a in _leaves(got)}
    assert lengths == {len(want)}, f"{where}: lengths {lengths}, expected {len(want)}"


def _leaves(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    else:
        yield tree

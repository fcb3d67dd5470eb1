"""Offline data for the DQN job: a trained policy's episodes written as a D4RL file (``dataset_out``), and the
datasets a run's buffer loads (``dataset`` sections, a mixture's members' included) made first, when missing, by
training the config named in ``dataset_source`` -- so one config goes from nothing to offline-to-online
fine-tuning."""

import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, List

import numpy as np

from .config import BUFFER_SECTION, buffer_sections

_MAKING = set()  # the datasets being written by a dataset_source run of this process (a source needing its own)


def write_policy_episodes(job: Any, as_stored: Callable[[Any], np.ndarray]) -> Dict[str, Any]:
    """``dataset_out.episodes`` episodes of ``job``'s trained policy (epsilon-greedy with ``dataset_out.epsilon``,
    on a fresh env seeded from the run's seed) written to ``dataset_out.path`` in the D4RL layout, each observation
    as ``as_stored`` keeps it (the job's own rule); what was written."""
    from ..datasets import write_d4rl
    from .gym_envs import make_env

    out, cfg = job.cfg.dataset_out, job.cfg
    env = make_env(cfg.env)
    rng = np.random.default_rng(cfg.seed + 7_000_003)
    episodes: List[Dict[str, np.ndarray]] = []
    for k in range(out.episodes):
        obs, _ = env.reset(seed=int(cfg.seed * 1_000_003 + 5_000_000 + k))
        steps: Dict[str, list] = {key: [] for key in ('obs', 'action', 'reward', 'next_obs', 'done', 'timeout')}
        while True:
            explore = rng.random() < out.epsilon
            action = int(rng.integers(env.action_space.n)) if explore else job.greedy(obs)
            next_obs, r, term, trunc, _ = env.step(action)
            for key, value in zip(steps, (as_stored(obs), action, r, as_stored(next_obs), term, trunc and not term)):
                steps[key].append(value)
            if term or trunc:
                break
            obs = next_obs
        episodes.append({key: np.asarray(v) for key, v in steps.items()})
        episodes[-1]['reward'] = episodes[-1]['reward'].astype(np.float32)  # D4RL's dtype
    env.close()
    written = write_d4rl(out.path, episodes)
    returns = [float(ep['reward'].sum()) for ep in episodes]
    return {'path': out.path, 'episodes': len(episodes), 'steps': written, 'return_mean': float(np.mean(returns))}


def dataset_paths(buffer_cfg: Any) -> List[str]:
    """Every ``dataset.path`` of a buffer section (a mixture's members' too), in order."""
    datasets = [s['dataset'] for _, s in buffer_sections(buffer_cfg) if isinstance(s.get('dataset'), Mapping)]
    return [d['path'] for d in datasets if d.get('path')]


def ensure_datasets(cfg: Any, source_of: Callable[[str], str], train: Callable[[str, Dict[str, Any]], int]) -> int:
    """
    Overview:
        Make every dataset the run's buffer loads that does not exist yet, by training ``cfg.dataset_source``
        (``source_of(name)`` is its file; ``train(file, user_config)`` runs it and returns its exit code) with
        ``dataset_out.path`` set to the missing file. Without ``dataset_source`` a missing file is a ``ValueError``
        naming the key and the path. Returns 0, or the exit code of a source run that was stopped (Ctrl-C, SIGTERM:
        it wrote no dataset; the run that needs it does not start).
    """
    from .config import load_config_file

    for path in dataset_paths(cfg.policy.other.replay_buffer):
        if os.path.exists(path):
            continue
        if cfg.dataset_source is None:
            raise ValueError(
                f"dataset file '{path}' (config key '{BUFFER_SECTION}...dataset.path') does not exist; set "
                f"'dataset_source' to the training config that writes it (its 'dataset_out'), or write it first"
            )
        source = source_of(cfg.dataset_source)
        user = load_config_file(source)
        dataset_out = dict(user.get('dataset_out') or {})
        if not dataset_out.get('episodes'):
            raise ValueError(
                f"config key 'dataset_source' names '{source}', whose 'dataset_out.episodes' is not set: it would "
                f"write no dataset"
            )
        user['dataset_out'] = dict(dataset_out, path=path)
        if os.path.abspath(path) in _MAKING:  # the source needs the very file it is to write
            raise ValueError(
                f"config key 'dataset_source' names '{source}', whose run needs the dataset '{path}' it writes"
            )
        print(f"dataset '{path}' does not exist yet: training {source} to write it", flush=True)
        _MAKING.add(os.path.abspath(path))
        try:
            code = train(source, user)
        finally:
            _MAKING.discard(os.path.abspath(path))
        if code:
            return code
        if not os.path.exists(path):
            raise RuntimeError(f"config '{source}' finished without writing the dataset '{path}'")
    return 0


__all__ = ['write_policy_episodes', 'dataset_paths', 'ensure_datasets']

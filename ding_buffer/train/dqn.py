"""Config-driven DQN (double DQN, Huber loss, optional n-step) on a gymnasium env with any ``ding_buffer`` buffer.

The buffer comes from ``create_buffer(cfg.policy.other.replay_buffer, tb_logger=..., exp_name=...)`` -- the call a
DI-engine pipeline makes. With a prioritized buffer (``type='advanced'``) the learner weights the loss by the
sampled ``IS`` and sends ``|TD error|`` back through ``buffer.update``; with a uniform one both are no-ops.

Run directory ``<log_dir>/<exp_name>_seed<seed>/``: ``log/`` (TensorBoard: buffer monitors + training curves),
``eval.csv``, ``learning_curve.png``, ``checkpoints/`` (see ``checkpoint.py``), ``summary.json``.
"""

import collections
import contextlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from easydict import EasyDict

from ..base import create_buffer
from ..persistence import atomic_json, safe_load
from .checkpoint import check_checkpoints, load_latest, purge_tensorboard, save_checkpoint
from .config import BUFFER_SECTION, buffer_sections
from .evals import write_eval_csv
from .gym_envs import make_env
from .offline import write_policy_episodes
from .plot import plot_runs, write_run_info
from .run_dir import build_in_run_dir, progress_bar


class QNet(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: List[int]) -> None:
        super().__init__()
        layers, last = [], obs_dim
        for h in hidden_sizes:
            layers += [nn.Linear(last, h), nn.ReLU()]
            last = h
        layers.append(nn.Linear(last, n_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


class NatureQNet(nn.Module):
    """The DQN network of Mnih et al. (2015) for ``[stack, 84, 84]`` uint8 frame stacks (scaled to [0, 1] here):
    three convolutions (32 8x8 /4, 64 4x4 /2, 64 3x3 /1) and a 512-unit layer."""

    def __init__(self, in_shape: Tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        c = in_shape[0]
        self.conv = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            n = self.conv(torch.zeros(1, *in_shape)).shape[1]
        self.head = nn.Sequential(nn.Linear(n, 512), nn.ReLU(), nn.Linear(512, n_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(obs.float() / 255.0))


def build_qnet(model_cfg: Any, obs_shape: Tuple[int, ...], n_actions: int) -> nn.Module:
    """``policy.model``: ``type='mlp'`` (``hidden_sizes``, flat observations) or ``'nature_cnn'`` (frame stacks)."""
    if model_cfg.get('type', 'mlp') == 'nature_cnn':
        if len(obs_shape) != 3:
            raise ValueError(
                f"config key 'policy.model.type' is 'nature_cnn', which needs [stack, H, W] observations, got "
                f"shape {tuple(obs_shape)} (set env.wrapper='atari')"
            )
        return NatureQNet(tuple(obs_shape), n_actions)
    return QNet(int(np.prod(obs_shape)), n_actions, list(model_cfg.hidden_sizes))


def as_stored(obs: Any) -> np.ndarray:
    """An observation as the buffer keeps it: uint8 frames stay bytes (what the frames layout stores once),
    everything else float32."""
    arr = np.asarray(obs)
    return arr if arr.dtype == np.uint8 else arr.astype(np.float32)


class NStep:
    """Turns one-step transitions into n-step ones: reward = sum gamma^k r_k, ``discount`` = gamma^m for the m
    steps used (m < n at episode ends), ``done`` = the episode terminated within them."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.window: collections.deque = collections.deque()

    def add(self, t: Dict[str, Any], episode_over: bool) -> List[Dict[str, Any]]:
        self.window.append(t)
        out = []
        if len(self.window) == self.n:
            out.append(self._emit())
            self.window.popleft()
        if episode_over:
            while self.window:
                out.append(self._emit())
                self.window.popleft()
        return out

    def _emit(self) -> Dict[str, Any]:
        first, reward, done, m = self.window[0], 0.0, False, 0
        last = first
        for k, t in enumerate(self.window):
            reward += (self.gamma**k) * t['reward']
            last, m = t, k + 1
            if t['done']:
                done = True
                break
        return dict(first, reward=float(reward), next_obs=last['next_obs'], done=done, discount=float(self.gamma**m))


def learn_step(
    net: nn.Module,
    target_net: nn.Module,
    optim: torch.optim.Optimizer,
    batch: Dict[str, torch.Tensor],
    learn: EasyDict,
    device: torch.device,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One gradient step of (double) DQN on a sampled batch (``obs``, ``action``, ``reward``, ``next_obs``,
    ``done``, ``discount``; ``IS`` weights the Huber loss when present). Returns the loss and the TD errors
    (detached, on the CPU: what ``buffer.update`` takes as priorities once made absolute)."""
    obs, next_obs = batch['obs'].to(device), batch['next_obs'].to(device)
    action = batch['action'].to(device).long()
    reward, done = batch['reward'].to(device).float(), batch['done'].to(device).float()
    discount = batch['discount'].to(device).float()
    q = net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        if learn.double:
            next_a = net(next_obs).argmax(1, keepdim=True)
            next_q = target_net(next_obs).gather(1, next_a).squeeze(1)
        else:
            next_q = target_net(next_obs).max(1).values
        target = reward + discount * (1.0 - done) * next_q
    td = target - q
    weights = batch['IS'].to(device) if 'IS' in batch else torch.ones_like(td)
    loss = (weights * F.huber_loss(q, target, reduction='none', delta=learn.huber_delta)).mean()
    optim.zero_grad()
    loss.backward()
    if learn.grad_clip is not None:
        nn.utils.clip_grad_norm_(net.parameters(), learn.grad_clip)
    optim.step()
    return loss.detach(), td.detach().cpu()


@torch.no_grad()
def greedy_returns(net: nn.Module, env: Any, episodes: int, seed_base: int, device: torch.device) -> List[float]:
    """Returns of ``episodes`` greedy episodes on ``env``, reset with seeds ``seed_base + k``."""
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed_base + k)
        total, over = 0.0, False
        while not over:
            q = net(torch.as_tensor(as_stored(obs), device=device).unsqueeze(0))
            obs, r, term, trunc, _ = env.step(int(q.argmax(1).item()))
            total += float(r)
            over = term or trunc
        returns.append(total)
    return returns


def evaluate_greedy(job: Any) -> Dict[str, float]:
    """One evaluation of a DQN / Ape-X learner ``job`` (``cfg``, ``net``, ``eval_env``, ``device``, ``evals``,
    ``env_step``, ``train_iter``, ``tb``, ``solved_step``, ``run_dir``, ``wall_time()``): ``env.eval_episodes``
    greedy episodes with seeds that depend on the run's seed and the evaluation's number; the row goes to
    ``evals``, ``eval.csv`` and TensorBoard, and ``solved_step`` is set the first time the mean reaches
    ``env.stop_value``."""
    cfg = job.cfg
    base = cfg.seed * 1_000_003 + 10_000 + len(job.evals) * cfg.env.eval_episodes
    returns = greedy_returns(job.net, job.eval_env, cfg.env.eval_episodes, base, job.device)
    row = {
        'env_step': job.env_step,
        'train_iter': job.train_iter,
        'return_mean': float(np.mean(returns)),
        'return_std': float(np.std(returns)),
        'wall_time': job.wall_time(),
        'return_min': float(np.min(returns)),
        'return_max': float(np.max(returns)),
    }
    job.evals.append(row)
    job.tb.add_scalar('eval/return_mean', row['return_mean'], job.env_step)
    if job.solved_step is None and row['return_mean'] >= cfg.env.stop_value:
        job.solved_step = job.env_step
    write_eval_csv(job.run_dir, job.evals)
    return row


LEARNER_MODULES = ('net', 'target', 'optim')
SUMMARY_BUFFER_KEYS = ('count', 'push_items', 'sample_calls', 'updated', 'stale_updates', 'max_priority', 'beta')


def init_learner(job: Any, obs_shape: Tuple[int, ...], n_actions: int) -> None:
    """The networks, optimizer and evaluation state of a DQN / Ape-X learner ``job`` (``cfg``, ``device``): ``net``
    seeded by the run's seed, ``target`` a copy of it, Adam over ``net``; no evaluation, checkpoint or loss yet."""
    cfg = job.cfg
    torch.manual_seed(cfg.seed)
    job.net = build_qnet(cfg.policy.model, obs_shape, n_actions).to(job.device)
    job.target = build_qnet(cfg.policy.model, obs_shape, n_actions).to(job.device)
    job.target.load_state_dict(job.net.state_dict())
    job.optim = torch.optim.Adam(job.net.parameters(), lr=cfg.policy.learn.learning_rate)
    job.evals: List[Dict[str, float]] = []
    job.solved_step: Optional[int] = None
    job.wall_offset = 0.0
    job.last_loss = float('nan')
    job.resumed_from: Optional[str] = None


def train_on(job: Any, batch: Dict[str, torch.Tensor]) -> bool:
    """One gradient step of a DQN / Ape-X learner ``job`` on a sampled ``batch``: ``learn_step``, ``|TD error|``
    back to the buffer as priorities, ``train_iter`` + 1, the target network synced every
    ``policy.learn.target_update_freq`` steps. Every 100 steps it records the loss (``last_loss``) and the mean
    ``|TD error|`` in TensorBoard and returns True."""
    learn = job.cfg.policy.learn
    loss, td = learn_step(job.net, job.target, job.optim, batch, learn, job.device)
    info = {'replay_unique_id': batch['replay_unique_id'], 'replay_buffer_idx': batch['replay_buffer_idx']}
    member_key = getattr(job.buffer, 'member_key', None)  # a mixture routes each priority to its member
    if member_key is not None:
        info[member_key] = batch[member_key]
    job.buffer.update({**info, 'priority': td.abs()})
    job.train_iter += 1
    if job.train_iter % learn.target_update_freq == 0:
        job.target.load_state_dict(job.net.state_dict())
    if job.train_iter % 100 != 0:
        return False
    job.last_loss = float(loss)
    job.tb.add_scalar('train/loss', job.last_loss, job.env_step)
    job.tb.add_scalar('train/td_error_abs_mean', float(td.abs().mean()), job.env_step)
    return True


def learner_state(job: Any, **counters: Any) -> Dict[str, Any]:
    """What a DQN / Ape-X checkpoint holds of the learner ``job``: networks, optimizer, counters (``env_step``,
    ``train_iter``, the job's own ``counters``, ``solved_step`` (-1: none), ``wall_time``), evaluations and the torch
    RNG state."""
    return {
        **{name: getattr(job, name).state_dict() for name in LEARNER_MODULES},
        'counters': {
            'env_step': job.env_step,
            'train_iter': job.train_iter,
            **counters,
            'solved_step': -1 if job.solved_step is None else job.solved_step,
            'wall_time': job.wall_time(),
        },
        'evals': [dict(r) for r in job.evals],
        'rng': {'torch': torch.get_rng_state()},
    }


def load_learner_state(job: Any, path: str, buffer_file: str) -> Dict[str, Any]:
    """Load what ``learner_state`` saved in the checkpoint ``path`` into ``job`` (and its buffer from
    ``buffer_file``, as ``buffer.load_data`` names it); ``eval.csv`` drops rows written after the checkpoint.
    Returns the state, for the job's own counters and RNG states."""
    state = safe_load(os.path.join(path, 'trainer.pt'))  # (CRC-32 checked: a flipped bit is damage)
    job.buffer.load_data(buffer_file)
    for name in LEARNER_MODULES:
        getattr(job, name).load_state_dict(state[name])
    c = state['counters']
    job.train_iter = int(c['train_iter'])
    job.solved_step = None if c['solved_step'] < 0 else int(c['solved_step'])
    job.wall_offset = float(c['wall_time'])
    job.evals = [dict(r) for r in state['evals']]
    torch.set_rng_state(state['rng']['torch'])
    write_eval_csv(job.run_dir, job.evals)
    return state


def write_summary(job: Any, stats: Dict[str, Any], head: Dict[str, Any], **tail: Any) -> Dict[str, Any]:
    """The ``summary.json`` of a finished DQN / Ape-X run ``job``, written with its learning curve (when it has an
    evaluation); ``head`` and ``tail``: the job's own entries, before the evaluation results and after them."""
    best = max(job.evals, key=lambda r: r['return_mean']) if job.evals else None
    summary = {
        'exp_name': job.cfg.exp_name,
        'seed': job.cfg.seed,
        'run_dir': job.run_dir,
        **head,
        'best_eval_return': best['return_mean'] if best else None,
        'best_eval_step': best['env_step'] if best else None,
        'final_eval_return': job.evals[-1]['return_mean'] if job.evals else None,
        'solved_step': job.solved_step,
        'stop_value': job.cfg.env.stop_value,
        'wall_time_s': round(job.wall_time(), 1),
        'resumed_from': job.resumed_from,
        **tail,
        'buffer': {k: stats[k] for k in SUMMARY_BUFFER_KEYS if k in stats},
    }
    atomic_json(summary, os.path.join(job.run_dir, 'summary.json'))
    if job.evals:  # a run stopped before its first evaluation has no curve yet
        plot_runs([job.run_dir], os.path.join(job.run_dir, 'learning_curve.png'), title=job.cfg.exp_name)
    job.tb.flush()
    return summary


def solved_text(s: Dict[str, Any]) -> str:
    """Whether the DQN / Ape-X run of summary ``s`` reached its stop value, and at which env step (printed)."""
    if s['solved_step'] is None:
        return f"did not reach {s['stop_value']:g}"
    return f"reached {s['stop_value']:g} at env step {s['solved_step']}"


def _tensor_buffer_cfg(section: Any, seed: int, where: str = BUFFER_SECTION) -> EasyDict:
    """A copy of the buffer section ``section`` (at ``where``) for training: tensor storage (the default; the learner
    needs batched tensors) and ``seed`` unless it sets its own; a mixture's members each get them (their seeds
    differ: ``seed + 1``, ``seed + 2``, ...)."""
    buffer_cfg = EasyDict(dict(section))
    buffer_cfg.setdefault('seed', seed)
    if buffer_cfg.get('members') is not None and buffer_cfg.get('type') == 'mixture':
        buffer_cfg.members = {
            name: _tensor_buffer_cfg(member, seed + i, f'{where}members.{name}.')
            for i, (name, member) in enumerate(dict(buffer_cfg.members).items(), 1)
        }
        return buffer_cfg
    buffer_cfg.setdefault('storage', {})
    buffer_cfg.storage = EasyDict(dict(buffer_cfg.storage))
    buffer_cfg.storage.setdefault('type', 'tensor')
    if buffer_cfg.storage.type != 'tensor':
        raise ValueError(
            f"config key '{where}storage.type' must be 'tensor' for training "
            f"(the learner needs batched tensors), got {buffer_cfg.storage.type!r}"
        )
    return buffer_cfg


class DQNTrainer:
    """
    Overview:
        One training run. ``run()`` collects, learns, evaluates and checkpoints until ``env.max_env_step``,
        then writes the learning curve and returns the summary. ``resume=True`` continues from the latest
        complete checkpoint of ``run_dir``.
    """

    def __init__(
        self,
        cfg: EasyDict,
        run_dir: str,
        resume: bool = False,
        progress: bool = True,
        started_at: Optional[float] = None,
    ) -> None:
        import gymnasium as gym

        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.started_at = started_at  # time.monotonic() the wall time counts from (the CLI: process start)
        self.device = torch.device(cfg.policy.device)
        if self.device.type == 'cuda' and not torch.cuda.is_available():
            raise ValueError(f"device '{cfg.policy.device}' requested but CUDA is not available on this machine")
        self.ckpt_dir = os.path.join(run_dir, 'checkpoints')
        check_checkpoints(run_dir, resume)
        self.env, self.eval_env = make_env(cfg.env), make_env(cfg.env)
        if not isinstance(self.env.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"config key 'env.env_id': DQN needs a discrete action space, {cfg.env.env_id} has "
                f"{self.env.action_space}"
            )
        buffer_cfg = _tensor_buffer_cfg(cfg.policy.other.replay_buffer, cfg.seed)
        if resume:  # the checkpoint holds the whole buffer, the datasets' items included: no file is read again
            for _, section in buffer_sections(buffer_cfg):
                section.pop('dataset', None)
        build_in_run_dir(self, lambda: self._build(buffer_cfg, resume))

    def _build(self, buffer_cfg: EasyDict, resume: bool) -> None:
        """Networks, optimizer, TensorBoard writer, buffer and counters (``run_dir`` exists); load a checkpoint."""
        cfg, run_dir = self.cfg, self.run_dir
        self.n_actions = int(self.env.action_space.n)
        init_learner(self, tuple(self.env.observation_space.shape), self.n_actions)
        self.rng = np.random.default_rng(cfg.seed)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(os.path.join(run_dir, 'log'))
        try:
            self.buffer = create_buffer(buffer_cfg, tb_logger=self.tb, exp_name=cfg.exp_name, instance_name='buffer')
        except ValueError as e:  # the buffer names keys within its own section
            raise ValueError(str(e).replace("config key '", f"config key '{BUFFER_SECTION}")) from e
        self.nstep = NStep(cfg.policy.nstep, cfg.policy.discount_factor)
        self.env_step = self.train_iter = self.episodes = 0
        self.recent_returns: collections.deque = collections.deque(maxlen=20)
        # frames stored once (storage.frames): the buffer links the steps of the one env stream, and builds
        # n-step returns itself when its n_step > 1
        self.frames = (buffer_cfg.get('storage') or {}).get('frames') is not None  # (a mixture's members: no frames)
        if resume:
            self.resumed_from, _ = load_latest(self.ckpt_dir, self._load_checkpoint)
            if self.resumed_from is not None:  # what a stopped run logged after it is hidden, never what it logged
                # before: the curves' x-axes are env steps and (buffer_iter) learner iterations
                purge_tensorboard(self.tb, max(self.env_step, self.train_iter) + 1)
            if self.frames:  # the env restarts below, mid-episode for the stream the checkpoint holds
                self.buffer.storage.end_streams()
        self.obs, _ = self.env.reset(seed=None if resume else cfg.seed)

    # ------------------------------------------------------------------ acting / learning
    def epsilon(self) -> float:
        c = self.cfg.policy.collect
        frac = min(1.0, self.env_step / c.eps_decay_steps)
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> int:
        q = self.net(torch.as_tensor(as_stored(obs), device=self.device).unsqueeze(0))
        return int(q.argmax(1).item())

    def learn(self) -> None:
        batch = self.buffer.sample(self.cfg.policy.learn.batch_size, cur_learner_iter=self.train_iter)
        if batch is None:
            return
        if 'n_step_discount' in batch:  # the buffer built n-step returns: gamma ** k of each
            batch['discount'] = batch['n_step_discount']
        elif 'discount' not in batch:  # one-step items without the field (a mixture with a dataset; nstep is 1)
            batch['discount'] = torch.full_like(batch['reward'], self.cfg.policy.discount_factor)
        train_on(self, batch)

    evaluate = evaluate_greedy

    def wall_time(self) -> float:
        return self.wall_offset + time.monotonic() - self._t0

    # ------------------------------------------------------------------ main loop
    def run(self, stop: Any = None) -> Dict[str, Any]:
        """Train until ``env.max_env_step`` or until ``stop.requested`` (a ``StopSignals``) turns true; either
        way the last step is checkpointed and the summary written (``summary['stopped_early']``)."""
        cfg = self.cfg
        write_run_info(self.run_dir, cfg, 'dqn')  # run.json: what the plot groups the run by, before summary.json
        self._t0 = time.monotonic() if self.started_at is None else self.started_at
        ep_return = 0.0
        bar = progress_bar(self, cfg.env.max_env_step, self.env_step, 'step')
        while self.env_step < cfg.env.max_env_step and not (stop is not None and stop.requested):
            eps = self.epsilon()
            action = int(self.rng.integers(self.n_actions)) if self.rng.random() < eps else self.greedy(self.obs)
            next_obs, r, term, trunc, _ = self.env.step(action)
            t = {
                'obs': as_stored(self.obs),
                'action': action,
                'reward': float(r),
                'next_obs': as_stored(next_obs),
                'done': bool(term),
                'collect_iter': self.train_iter,
                'discount': float(cfg.policy.discount_factor),
            }
            if self.frames:  # the buffer's streams end at truncations too (and bootstrap there)
                t['truncated'] = bool(trunc)
            for item in self.nstep.add(t, term or trunc):
                self.buffer.push(item, cur_collector_envstep=self.env_step)
            self.env_step += 1
            ep_return += float(r)
            self.obs = next_obs
            if term or trunc:
                self.episodes += 1
                self.recent_returns.append(ep_return)
                self.tb.add_scalar('train/episode_return', ep_return, self.env_step)
                ep_return = 0.0
                self.obs, _ = self.env.reset()
            learn = cfg.policy.learn
            if self.env_step >= learn.warmup_steps and self.env_step % learn.train_freq == 0:
                for _ in range(learn.updates_per_step):
                    self.learn()
            if stop is not None and stop.requested:
                break
            if self.env_step % cfg.env.eval_freq == 0 or self.env_step == cfg.env.max_env_step:
                self.evaluate()
            if self.env_step % 250 == 0 or self.env_step == cfg.env.max_env_step:
                self.tb.add_scalar('train/epsilon', eps, self.env_step)
                bar.set_postfix(
                    ret=f"{np.mean(self.recent_returns):.0f}" if self.recent_returns else '-',
                    eval=f"{self.evals[-1]['return_mean']:.0f}" if self.evals else '-',
                    loss=f"{self.last_loss:.3f}",
                    buf=str(self.buffer.count()),
                    refresh=False,
                )
                bar.update(self.env_step - bar.n)
            freq = cfg.checkpoint.freq
            if freq and self.env_step % freq == 0 and self.env_step < cfg.env.max_env_step:
                self.checkpoint()
        bar.update(self.env_step - bar.n)
        bar.close()
        with contextlib.nullcontext() if stop is None else stop.holding():  # a 2nd Ctrl-C must not cut these
            self.checkpoint()
            return self.finish()

    def finish(self) -> Dict[str, Any]:
        stats = self.buffer.stats() if hasattr(self.buffer, 'stats') else {'count': self.buffer.count()}
        head = {
            'buffer_type': self.cfg.policy.other.replay_buffer.type,
            'env_steps': self.env_step,
            'train_iters': self.train_iter,
            'episodes': self.episodes,
        }
        early = self.env_step < self.cfg.env.max_env_step
        if self.cfg.dataset_out.episodes and not early:  # the trained policy's episodes: offline data (a run
            head['dataset_out'] = write_policy_episodes(self, as_stored)  # stopped early writes them when resumed)
        summary = write_summary(self, stats, head, stopped_early=early)
        self.buffer.close()
        self.tb.close()
        return summary

    # ------------------------------------------------------------------ persistence
    def checkpoint(self) -> str:
        state = learner_state(self, episodes=self.episodes)
        state['recent_returns'] = [float(x) for x in self.recent_returns]
        state['rng'].update(numpy=self.rng.bit_generator.state, env=self.env.unwrapped.np_random.bit_generator.state)
        return save_checkpoint(self.ckpt_dir, self.env_step, state, self.buffer.save_data, self.cfg.checkpoint.keep)

    def _load_checkpoint(self, path: str) -> Dict[str, Any]:
        state = load_learner_state(self, path, os.path.join(path, 'buffer.pt'))
        self.env_step, self.episodes = int(state['counters']['env_step']), int(state['counters']['episodes'])
        self.recent_returns.extend(state['recent_returns'])
        self.rng.bit_generator.state = state['rng']['numpy']
        self.env.unwrapped.np_random.bit_generator.state = state['rng']['env']
        return state


__all__ = ['DQNTrainer', 'QNet', 'NatureQNet', 'NStep', 'build_qnet', 'as_stored', 'learn_step', 'greedy_returns']

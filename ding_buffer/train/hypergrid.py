"""Trajectory-balance GFlowNet on torchgfn's HyperGrid, replaying through a ``ding_buffer`` GFlowNet buffer.

    ding-buffer train config/hypergrid_tb_gfn.py [--seed N] [--iterations N] [--resume RUN_DIR] [--device cpu]

Each iteration samples ``policy.learn.batch_size`` trajectories on-policy (epsilon-uniform exploration optional),
pushes them -- the torchgfn ``Trajectories`` container itself -- into the buffer made by
``create_buffer(cfg.policy.other.replay_buffer, tb_logger=writer)``, and takes one Adam step on the TB loss of the
on-policy trajectories plus ``policy.learn.replay_batch_size`` replayed ones (``buffer.sample(n)``, once the buffer
holds ``policy.learn.replay_warmup`` items). ``replay_buffer=None`` trains on-policy only;
``type='torchgfn:ReplayBuffer'`` / ``'torchgfn:NormBasedDiversePrioritizedReplayBuffer'`` use torchgfn's own
buffers with the same settings, for comparison. The loss is the mean over on-policy and replayed trajectories
(replayed ones have their log-probabilities recomputed by the current policy).

Every ``env.eval_freq`` iterations: the L1 distance between the empirical distribution of ``env.eval_samples``
terminating states (fresh from the policy, or the last ones sampled in training: ``env.eval_source``) and the
exact ``R(x)/Z``, the modes found so far in training (corners of the grid, see ``hypergrid_metrics``), the TB
loss, learned vs true ``log Z`` and wall time: to TensorBoard (``train/*``, ``eval/*`` and the buffer's own
monitors), ``eval.csv`` and ``learning_curve.png``.

Run directory ``<log_dir>/<exp_name>_seed<seed>/``: ``log/``, ``eval.csv``, ``learning_curve.png``,
``checkpoints/`` (``checkpoint.py``: model, optimizer, counters, RNG state, buffer), ``summary.json``.
"""

import argparse
import collections
import contextlib
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import torch
from easydict import EasyDict

from ..base import create_buffer, get_buffer_cls
from ..config import (
    SECONDS_CHECK,
    STEPS_CHECK,
    build_config,
    check_section,
    optional_positive_int,
    positive_int,
    seed_ok,
)
from ..persistence import atomic_json, atomic_save, check_integrity, safe_load
from .checkpoint import check_checkpoints, load_latest, purge_tensorboard, save_checkpoint
from .config import BUFFER_SECTION, device_ok, make_trainer, run_dir_of, split_buffer_section
from .hypergrid_metrics import GridTruth, plot_curve, write_eval_csv
from .plot import write_run_info
from .run_dir import build_in_run_dir, progress_bar
from .signals import StopSignals

HYPERGRID_DEFAULTS = {
    'exp_name': 'hypergrid_tb',
    # runs go to <log_dir>/<exp_name>_seed<seed>/ (None: the working directory)
    'log_dir': None,
    'seed': 0,
    'env': {
        # HyperGrid {0..height-1}^ndim with the 'original' reward R0 + R1 * ring + R2 * band (hypergrid_metrics).
        'ndim': 2,
        'height': 8,
        'R0': 0.1,
        'R1': 0.5,
        'R2': 2.0,
        # Evaluate every eval_freq iterations (and at the end) on eval_samples terminating states: 'fresh' samples
        # them from the current policy (no exploration), 'visited' takes the last ones sampled in training.
        'eval_freq': 100,
        'eval_samples': 20_000,
        'eval_source': 'fresh',
    },
    'policy': {
        # 'cpu' or 'cuda' (the command line's --device overrides it).
        'device': 'cpu',
        'model': {
            # MLPs on the k-hot encoded state; PB shares PF's trunk unless uniform_pb (a fixed uniform backward
            # policy, no parameters).
            'hidden_dim': 256,
            'n_hidden_layers': 2,
            'uniform_pb': False,
        },
        'learn': {
            # Training iterations (one gradient step each; the command line's --iterations overrides it).
            'iterations': 1000,
            # On-policy trajectories per iteration.
            'batch_size': 16,
            # Replayed trajectories per iteration, once the buffer holds replay_warmup items (0: push only).
            'replay_batch_size': 16,
            'replay_warmup': 64,
            'learning_rate': 1e-3,
            # log Z has its own (larger) learning rate and initial value.
            'logZ_learning_rate': 0.1,
            'init_logZ': 0.0,
            # Gradient-norm clip (None: no clipping).
            'grad_clip': 1.0,
        },
        # Probability of a uniformly random valid action at each step of the on-policy sampler.
        'collect': {'epsilon': 0.0},
        # replay_buffer: a ding_buffer GFlowNet buffer section ('gfn', 'gfn_diverse'), a torchgfn buffer
        # ('torchgfn:ReplayBuffer', 'torchgfn:NormBasedDiversePrioritizedReplayBuffer') or None (on-policy only).
        'other': {'replay_buffer': None},
    },
    # Save every freq iterations (None: only at the end), atomically, keeping the newest `keep`.
    'checkpoint': {'freq': 500, 'keep': 2},
    # With a `distributed` part in the buffer section (hypergrid_dist): the learner publishes its policy every
    # publish_freq iterations, a sampler pushes at most publish_freq batches per published policy and stops when
    # the learner published nothing for learner_silence seconds.
    'distributed_job': {'publish_freq': 10, 'learner_silence': 300.0},
}

_non_negative_int = (lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 0, 'an int >= 0')
HYPERGRID_CHECKS = {
    'exp_name': (lambda x: isinstance(x, str) and x != '', 'a non-empty string'),
    'log_dir': (lambda x: x is None or (isinstance(x, str) and x != ''), 'None or a directory path'),
    'seed': (lambda x: x is not None and seed_ok(x), 'an int in [0, 2**63)'),
    'env.ndim': (positive_int, 'a positive int'),
    'env.height': (lambda x: positive_int(x) and x >= 2, 'an int >= 2'),
    'env.R0': (lambda x: x > 0, 'a number > 0 (log R0 must be finite)'),
    'env.R1': (lambda x: x >= 0, 'a number >= 0'),
    'env.R2': (lambda x: x > 0, 'a number > 0 (the mode bonus)'),
    'env.eval_freq': (positive_int, 'a positive int'),
    'env.eval_samples': (positive_int, 'a positive int'),
    'env.eval_source': (lambda x: x in ('fresh', 'visited'), "'fresh' or 'visited'"),
    'policy.device': (lambda x: device_ok(x), "'cpu' or 'cuda[:N]'"),
    'policy.model.hidden_dim': (positive_int, 'a positive int'),
    'policy.model.n_hidden_layers': (positive_int, 'a positive int'),
    'policy.learn.iterations': STEPS_CHECK,
    'policy.learn.batch_size': (positive_int, 'a positive int'),
    'policy.learn.replay_batch_size': _non_negative_int,
    'policy.learn.replay_warmup': _non_negative_int,
    'policy.learn.learning_rate': (lambda x: x > 0, 'a positive number'),
    'policy.learn.logZ_learning_rate': (lambda x: x > 0, 'a positive number'),
    'policy.learn.init_logZ': (lambda x: math.isfinite(x), 'a finite number'),
    'policy.learn.grad_clip': (lambda x: x is None or x > 0, 'None or a positive number'),
    'policy.collect.epsilon': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
    'checkpoint.freq': (optional_positive_int, 'None or a positive int'),
    'checkpoint.keep': (positive_int, 'a positive int'),
    'distributed_job.publish_freq': (positive_int, 'a positive int'),
    'distributed_job.learner_silence': SECONDS_CHECK,
}

# torchgfn's buffers, built with the same settings as ours: class name -> (config defaults, value checks).
TORCHGFN_PREFIX = 'torchgfn:'
_TORCHGFN_COMMON = {'replay_buffer_size': 1000}
TORCHGFN_BUFFERS = {
    'ReplayBuffer': (
        dict(_TORCHGFN_COMMON, prioritized_capacity=False, prioritized_sampling=False),
        {'replay_buffer_size': (positive_int, 'a positive int')},
    ),
    'NormBasedDiversePrioritizedReplayBuffer': (
        dict(_TORCHGFN_COMMON, cutoff_distance=0.0, p_norm_distance=1.0),
        {'replay_buffer_size': (positive_int, 'a positive int'), 'p_norm_distance': (lambda x: x > 0, 'a number > 0')},
    ),
}
# Largest grid the exact metrics enumerate (true distribution, log Z, modes): 2**24 states, ~1 GB at ndim 4.
MAX_STATES = 2**24
# Cap on the visited-state window kept for env.eval_source='visited' (states are stored as int64 indices).
MAX_VISITED = 1_000_000


# ---------------------------------------------------------------------------------------------------- config
def build_hypergrid_config(user: Mapping, source: str = '<config>') -> EasyDict:
    """
    Overview:
        Merge ``user`` (a ``main_config`` without ``job``) over ``HYPERGRID_DEFAULTS`` with validation; the
        replay buffer section is validated by the buffer class (ours) or against ``TORCHGFN_BUFFERS``.
        ``ValueError`` / ``TypeError`` name ``source``, the key, the value and what was expected.
    """
    try:
        user, buffer_cfg = split_buffer_section(user)
        cfg = build_config(HYPERGRID_DEFAULTS, user, HYPERGRID_CHECKS)
        cfg.policy.other.replay_buffer = _check_buffer_section(buffer_cfg, cfg)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{source}: {e}") from e
    return cfg


def _check_buffer_section(buffer_cfg: Any, cfg: EasyDict) -> Optional[EasyDict]:
    """The validated buffer section (``None``: no buffer): a ``type`` of ours (checked by its class, which must
    store torchgfn trajectories) or ``torchgfn:<class>`` (``TORCHGFN_BUFFERS``); a ``distributed`` part (ours only);
    ``policy.learn.replay_batch_size`` and ``replay_warmup`` must fit in the buffer."""
    if buffer_cfg is None:
        return None
    if not isinstance(buffer_cfg, Mapping):
        raise TypeError(
            f"config key '{BUFFER_SECTION[:-1]}' is {buffer_cfg!r:.60}; expected None (on-policy only) "
            "or a dict with a 'type'"
        )
    buffer_cfg = dict(buffer_cfg)
    name = buffer_cfg.get('type')
    if not name or not isinstance(name, str):
        raise ValueError(
            f"config key '{BUFFER_SECTION}type' is {name!r}; expected 'gfn', 'gfn_diverse', "
            f"'{TORCHGFN_PREFIX}<class>' or the whole section None"
        )
    torchgfn = name.startswith(TORCHGFN_PREFIX)
    dist = buffer_cfg.pop('distributed', None)
    if dist is not None:
        if torchgfn:
            raise ValueError(
                f"config key '{BUFFER_SECTION}distributed' is set on {name!r}: the distributed job serves one "
                "of our buffers ('gfn', 'gfn_diverse') from the manager"
            )
        from ..distributed.config import build_distributed_config

        try:
            build_distributed_config(dist)
        except (ValueError, TypeError) as e:
            msg = str(e).replace("config key 'distributed.", f"config key '{BUFFER_SECTION}distributed.")
            raise type(e)(msg) from e
    if torchgfn:
        full = _check_torchgfn_section(buffer_cfg, name)
    else:
        full = _check_trajectory_buffer_section(buffer_cfg, name)
        buffer_cfg.setdefault('seed', cfg.seed)
    for key in ('replay_batch_size', 'replay_warmup'):
        if cfg.policy.learn[key] > full.replay_buffer_size:
            raise ValueError(
                f"config key 'policy.learn.{key}' = {cfg.policy.learn[key]} is larger than "
                f"'{BUFFER_SECTION}replay_buffer_size' = {full.replay_buffer_size}: the buffer never holds that many "
                f"trajectories; expected {key} <= replay_buffer_size"
            )
    if dist is not None:
        buffer_cfg['distributed'] = dict(dist)
    return full if torchgfn else EasyDict(buffer_cfg)


def _check_torchgfn_section(buffer_cfg: Dict[str, Any], name: str) -> EasyDict:
    """The full section of the torchgfn buffer ``name`` (``torchgfn:<class>``): ``TORCHGFN_BUFFERS`` defaults
    completed by ``buffer_cfg`` and checked."""
    cls_name = name[len(TORCHGFN_PREFIX) :]
    if cls_name not in TORCHGFN_BUFFERS:
        raise ValueError(
            f"config key '{BUFFER_SECTION}type' is {name!r}; expected one of "
            + ', '.join(repr(TORCHGFN_PREFIX + k) for k in TORCHGFN_BUFFERS)
        )
    defaults, checks = TORCHGFN_BUFFERS[cls_name]
    full = build_config(defaults, {k: v for k, v in buffer_cfg.items() if k != 'type'}, checks, prefix=BUFFER_SECTION)
    full.type = name
    return full


def _check_trajectory_buffer_section(buffer_cfg: Dict[str, Any], name: str) -> EasyDict:
    """The full section of our buffer ``name``, checked by its class, which must store torchgfn trajectories."""
    cls = get_buffer_cls(EasyDict(buffer_cfg))
    kind = cls.capabilities()['item_kind']  # declared by the type
    if kind == 'state':
        raise ValueError(
            f"config key '{BUFFER_SECTION}type' is {name!r} ({cls.__name__}), which the trajectory-balance job "
            "cannot train on: it stores terminating states (its sample is a StatesContainer, not Trajectories) "
            "and the TB loss needs whole trajectories; expected 'gfn' or 'gfn_diverse'"
        )
    if kind != 'trajectory':
        raise ValueError(
            f"config key '{BUFFER_SECTION}type' is {name!r} ({cls.__name__}), which stores no torchgfn "
            "trajectories; expected 'gfn', 'gfn_diverse' or a torchgfn buffer ('torchgfn:ReplayBuffer')"
        )
    return check_section(cls, buffer_cfg, BUFFER_SECTION)


# ---------------------------------------------------------------------------------------------------- trainer
def make_grid(cfg: EasyDict, device: Any = 'cpu') -> Tuple[Any, Any, Any]:
    """The HyperGrid of ``cfg.env`` ('original' reward) on ``device``, its k-hot preprocessor and the forward
    policy's MLP (``policy.model``), made in that order (the order of the draws from the torch RNG)."""
    from gfn.gym import HyperGrid
    from gfn.preprocessors import KHotPreprocessor
    from gfn.utils.modules import MLP

    e, m = cfg.env, cfg.policy.model
    env = HyperGrid(
        ndim=e.ndim,
        height=e.height,
        reward_fn_str='original',
        reward_fn_kwargs={'R0': e.R0, 'R1': e.R1, 'R2': e.R2},
        device=device,
        validate_modes=False,
    )
    pre = KHotPreprocessor(height=e.height, ndim=e.ndim)
    return env, pre, MLP(pre.output_dim, env.n_actions, hidden_dim=m.hidden_dim, n_hidden_layers=m.n_hidden_layers)


class HyperGridTrainer:
    """
    Overview:
        One TB training run. ``run()`` samples, replays, learns, evaluates and checkpoints until
        ``policy.learn.iterations``, then writes the curve and the summary. ``resume=True`` continues from the
        latest complete checkpoint of ``run_dir``.
    """

    def __init__(self, cfg: EasyDict, run_dir: str, resume: bool = False, progress: bool = True) -> None:
        self.cfg, self.run_dir, self.progress = cfg, run_dir, progress
        self.device = torch.device(cfg.policy.device)
        if self.device.type == 'cuda' and not torch.cuda.is_available():
            raise ValueError(f"config key 'policy.device' is {cfg.policy.device!r} but CUDA is not available here")
        self.ckpt_dir = os.path.join(run_dir, 'checkpoints')
        check_checkpoints(run_dir, resume)
        e = cfg.env
        if e.height**e.ndim > MAX_STATES:
            raise ValueError(
                f"config keys 'env.height' = {e.height}, 'env.ndim' = {e.ndim}: "
                f"{e.height**e.ndim} states; expected height ** ndim <= {MAX_STATES} (the exact "
                "metrics enumerate every state)"
            )
        self.truth = GridTruth(e.ndim, e.height, e.R0, e.R1, e.R2)
        if self.truth.n_mode_states == 0:
            raise ValueError(
                f"config key 'env.height' = {e.height}: this grid has no mode state (no coordinate with "
                "0.3 < |i/(height-1) - 0.5| < 0.4); expected height >= 5"
            )
        build_in_run_dir(self, lambda: self._build(resume))

    def _build(self, resume: bool) -> None:
        from gfn.estimators import DiscretePolicyEstimator
        from gfn.gflownet import TBGFlowNet
        from gfn.samplers import Sampler
        from gfn.utils.modules import MLP, DiscreteUniform
        from torch.utils.tensorboard import SummaryWriter

        cfg, m = self.cfg, self.cfg.policy.model
        torch.manual_seed(cfg.seed)
        self.env, pre, pf = make_grid(cfg, self.device)
        n_actions = self.env.n_actions
        pb = (
            DiscreteUniform(n_actions - 1)
            if m.uniform_pb
            else MLP(pre.output_dim, n_actions - 1, hidden_dim=m.hidden_dim, trunk=pf.trunk)
        )
        self.pf = DiscretePolicyEstimator(pf, n_actions, preprocessor=pre, is_backward=False)
        self.pb = DiscretePolicyEstimator(pb, n_actions, preprocessor=pre, is_backward=True)
        self.gfn = TBGFlowNet(pf=self.pf, pb=self.pb, init_logZ=float(cfg.policy.learn.init_logZ)).to(self.device)
        self.sampler = Sampler(estimator=self.pf)
        learn = cfg.policy.learn
        self.optim = torch.optim.Adam(self.gfn.pf_pb_parameters(), lr=learn.learning_rate)
        self.optim.add_param_group({'params': self.gfn.logz_parameters(), 'lr': learn.logZ_learning_rate})
        self.tb = SummaryWriter(os.path.join(self.run_dir, 'log'))
        self.buffer_type = 'none'
        self.buffer = self._make_buffer(cfg.policy.other.replay_buffer)
        self.iteration = self.replayed = 0
        self.evals: list[dict[str, float]] = []
        self.mode_states: set[int] = set()
        self.visited: collections.deque = collections.deque()  # index tensors of the newest sampled states
        self.n_visited = 0
        self.loss_sum, self.loss_n = 0.0, 0
        self.last_loss = float('nan')
        self.first_mode_iter: Optional[int] = None
        self.wall_offset = 0.0
        self.resumed_from: Optional[str] = None
        if resume:
            self.resumed_from, _ = load_latest(self.ckpt_dir, self._load_checkpoint)
            purge_tensorboard(self.tb, self.iteration + 1)  # (what it logged at the checkpoint's step stays)

    def _make_buffer(self, bcfg: Optional[EasyDict]) -> Any:
        if bcfg is None:
            return None
        self.buffer_type = bcfg.type
        if bcfg.type.startswith(TORCHGFN_PREFIX):
            from gfn.containers import replay_buffer as tgfn

            cls = getattr(tgfn, bcfg.type[len(TORCHGFN_PREFIX) :])
            kwargs = {k: v for k, v in bcfg.items() if k not in ('type', 'replay_buffer_size')}
            return cls(self.env, capacity=bcfg.replay_buffer_size, **kwargs)
        try:
            return create_buffer(bcfg, tb_logger=self.tb, exp_name=self.cfg.exp_name, instance_name='buffer')
        except ValueError as err:  # the buffer names keys within its own section
            raise ValueError(str(err).replace("config key '", f"config key '{BUFFER_SECTION}")) from err

    @property
    def torchgfn_buffer(self) -> bool:
        return self.buffer_type.startswith(TORCHGFN_PREFIX)

    def buffer_count(self) -> int:
        if self.buffer is None:
            return 0
        return len(self.buffer) if self.torchgfn_buffer else self.buffer.count()

    # ------------------------------------------------------------------ one iteration
    def step(self) -> float:
        """Sample on-policy, push, replay, one gradient step; returns the loss."""
        learn, eps = self.cfg.policy.learn, float(self.cfg.policy.collect.epsilon)
        on = self.sampler.sample_trajectories(self.env, n=learn.batch_size, save_logprobs=eps == 0, epsilon=eps)
        self._record(self.truth.indices(on.terminating_states.tensor))
        replay = None
        if self.buffer is not None:
            if self.torchgfn_buffer:
                self.buffer.add(on)
            else:
                self.buffer.push(on, cur_collector_envstep=self.iteration)
            n = learn.replay_batch_size
            if n and self.buffer_count() >= max(learn.replay_warmup, 1):
                kwargs = {} if self.torchgfn_buffer else {'cur_learner_iter': self.iteration}  # torchgfn's take n only
                replay = self.buffer.sample(n, **kwargs)
        # mean TB loss over on-policy + replayed trajectories; replayed log-probs come from the current policy
        total = self.gfn.loss(self.env, on, recalculate_all_logprobs=eps > 0, reduction='sum')
        count = len(on)
        if replay is not None and len(replay):
            total = total + self.gfn.loss(self.env, replay, recalculate_all_logprobs=True, reduction='sum')
            count += len(replay)
            self.replayed += len(replay)
        loss = total / count
        self.optim.zero_grad()
        loss.backward()
        if learn.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.gfn.parameters(), learn.grad_clip)
        self.optim.step()
        self.iteration += 1
        return float(loss.item())

    def _record(self, idx: torch.Tensor) -> None:
        """Keep the newest sampled terminating states (for eval_source 'visited') and the mode states found."""
        new = self.truth.mode_states_in(idx) - self.mode_states
        if new:
            self.mode_states |= new
            if self.first_mode_iter is None:
                self.first_mode_iter = self.iteration + 1
        if self.cfg.env.eval_source == 'visited':
            self.visited.append(idx)
            self.n_visited += len(idx)
            keep = min(self.cfg.env.eval_samples, MAX_VISITED)
            while self.n_visited - len(self.visited[0]) >= keep:
                self.n_visited -= len(self.visited.popleft())

    def modes_found(self) -> int:
        return len(self.truth.modes_of(self.mode_states))

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        e = self.cfg.env
        if e.eval_source == 'fresh':
            # sampled with the training RNG stream; restored afterwards so evaluation does not perturb training
            rng = torch.get_rng_state()
            chunks = []
            for i in range(0, e.eval_samples, 10_000):  # at most 10k states per draw
                states = self.gfn.sample_terminating_states(self.env, min(10_000, e.eval_samples - i))
                chunks.append(self.truth.indices(states.tensor))
            torch.set_rng_state(rng)
            idx = torch.cat(chunks)
        else:
            idx = torch.cat(list(self.visited))[-e.eval_samples :] if self.visited else torch.empty(0, dtype=torch.long)
        loss = self.loss_sum / self.loss_n if self.loss_n else self.last_loss
        self.loss_sum, self.loss_n = 0.0, 0
        row = {
            'iteration': self.iteration,
            'trajectories': self.iteration * self.cfg.policy.learn.batch_size,
            'l1_dist': self.truth.l1(idx),
            'modes_found': self.modes_found(),
            'mode_states_found': len(self.mode_states),
            'loss': loss,
            'logZ': float(self.gfn.logZ.item()),
            'logZ_true': self.truth.log_z,
            'wall_time': round(self.wall_time(), 3),
        }
        self.evals.append(row)
        t = self.iteration
        for key in ('l1_dist', 'modes_found', 'mode_states_found'):
            self.tb.add_scalar(f'eval/{key}', row[key], t)
        self.tb.add_scalar('eval/logZ_error', abs(row['logZ'] - row['logZ_true']), t)
        self.tb.add_scalar('eval/wall_time', row['wall_time'], t)
        write_eval_csv(self.run_dir, self.evals)
        return row

    def wall_time(self) -> float:
        return self.wall_offset + time.monotonic() - self._t0

    # ------------------------------------------------------------------ main loop
    def run(self, stop: Any = None, started_at: Optional[float] = None) -> dict[str, Any]:
        """Train until ``policy.learn.iterations`` or ``stop.requested`` (a ``StopSignals``); either way the last
        iteration is checkpointed. ``started_at``: the ``time.monotonic()`` the wall time counts from."""
        cfg = self.cfg
        write_run_info(self.run_dir, cfg, 'hypergrid')  # run.json: the seed a resume keeps, before summary.json
        total = cfg.policy.learn.iterations
        self._t0 = time.monotonic() if started_at is None else started_at
        if not self.evals and cfg.env.eval_source == 'fresh':
            self.evaluate()  # the untrained policy: the curve's starting point ('visited': nothing visited yet)
        bar = progress_bar(self, total, min(self.iteration, total), 'it')
        while self.iteration < total and not (stop is not None and stop.requested):
            loss = self.step()
            self.last_loss = loss
            self.loss_sum += loss
            self.loss_n += 1
            t = self.iteration
            if t % 10 == 0 or t == total:
                self.tb.add_scalar('train/loss', loss, t)
                self.tb.add_scalar('train/logZ', float(self.gfn.logZ.item()), t)
                self.tb.add_scalar('train/replay_size', self.buffer_count(), t)
            if t % cfg.env.eval_freq == 0 or t == total:
                row = self.evaluate()
                bar.set_postfix(
                    loss=f'{loss:.3f}',
                    l1=f"{row['l1_dist']:.3f}",
                    modes=row['modes_found'],
                    logZ=f"{row['logZ']:.2f}",
                    buf=str(self.buffer_count()),
                    refresh=False,
                )
            bar.update(t - bar.n)
            freq = cfg.checkpoint.freq
            if freq and t % freq == 0 and t < total:
                self.checkpoint()
        bar.close()
        with contextlib.nullcontext() if stop is None else stop.holding():  # a 2nd Ctrl-C must not cut these
            self.checkpoint()
            return self.finish()

    def finish(self) -> dict[str, Any]:
        summary = self.summary()
        atomic_json(summary, os.path.join(self.run_dir, 'summary.json'))
        plot_curve(
            self.evals,
            os.path.join(self.run_dir, 'learning_curve.png'),
            self.cfg.exp_name,
            self.truth.n_modes,
            self.truth.l1_floor(self.cfg.env.eval_samples),
        )
        self.tb.flush()
        self.close()
        return summary

    def close(self) -> None:
        if self.buffer is not None and hasattr(self.buffer, 'close'):  # torchgfn's buffers have nothing to close
            self.buffer.close()
        self.tb.close()

    def summary(self) -> dict[str, Any]:
        last = self.evals[-1] if self.evals else {}
        first = self.evals[0] if self.evals else {}
        best = min(self.evals, key=lambda r: r['l1_dist']) if self.evals else {}
        e = self.cfg.env
        return {
            'exp_name': self.cfg.exp_name,
            'seed': self.cfg.seed,
            'run_dir': self.run_dir,
            'buffer_type': self.buffer_type,
            'grid': f'{e.height}^{e.ndim}',
            'iterations': self.iteration,
            'trajectories': self.iteration * self.cfg.policy.learn.batch_size,
            'initial_l1_dist': first.get('l1_dist'),
            'final_l1_dist': last.get('l1_dist'),
            'best_l1_dist': best.get('l1_dist'),
            'best_l1_iteration': best.get('iteration'),
            'l1_exact_samples': round(self.truth.l1_floor(e.eval_samples), 4),
            'modes_found': self.modes_found(),
            'n_modes': self.truth.n_modes,
            'mode_states_found': len(self.mode_states),
            'n_mode_states': self.truth.n_mode_states,
            'first_mode_iteration': self.first_mode_iter,
            'final_loss': last.get('loss'),
            'logZ': float(self.gfn.logZ.item()),
            'logZ_true': self.truth.log_z,
            'buffer_count': self.buffer_count(),
            'replayed_trajectories': self.replayed,
            'wall_time_s': round(self.wall_time(), 1),
            'resumed_from': self.resumed_from,
        }

    # ------------------------------------------------------------------ persistence
    def checkpoint(self) -> str:
        state = {
            'gflownet': self.gfn.state_dict(),
            'optim': self.optim.state_dict(),
            'counters': {
                'iteration': self.iteration,
                'replayed': self.replayed,
                'wall_time': self.wall_time(),
                'first_mode_iter': -1 if self.first_mode_iter is None else self.first_mode_iter,
                'loss_sum': self.loss_sum,
                'loss_n': self.loss_n,
                'last_loss': self.last_loss,
            },
            'evals': [dict(r) for r in self.evals],
            'mode_states': sorted(self.mode_states),
            'visited': torch.cat(list(self.visited)) if self.visited else torch.empty(0, dtype=torch.long),
            'rng': {'torch': torch.get_rng_state()},
            # whether the checkpoint holds buffer.pt (a torchgfn buffer that holds nothing writes none)
            'buffer_saved': self.buffer is not None
            and (not self.torchgfn_buffer or self.buffer.training_container is not None),
        }
        if self.device.type == 'cuda':
            state['rng']['cuda'] = torch.cuda.get_rng_state(self.device)
        return save_checkpoint(self.ckpt_dir, self.iteration, state, self._save_buffer, self.cfg.checkpoint.keep)

    def _save_buffer(self, path: str) -> None:
        if self.buffer is None:
            return
        if not self.torchgfn_buffer:
            self.buffer.save_data(path)
        elif self.buffer.training_container is not None:  # torchgfn's own save is not atomic: same data, atomically
            atomic_save(self.buffer.training_container.to_tensordict().to_dict(), path)

    def _load_checkpoint(self, path: str) -> dict[str, Any]:
        state = safe_load(os.path.join(path, 'trainer.pt'))  # (CRC-32 checked: a flipped bit is damage)
        buffer_file = os.path.join(path, 'buffer.pt')
        if state.get('buffer_saved') and self.buffer is not None and not os.path.isfile(buffer_file):
            raise ValueError(f"{path} lacks the buffer.pt it was written with")  # damage: the previous one loads
        if self.buffer is not None and os.path.isfile(buffer_file):
            if self.torchgfn_buffer:
                from gfn.containers import Trajectories

                check_integrity(buffer_file)  # (torchgfn's own load checks no CRC-32: a flipped bit is damage)
                self.buffer.training_container = Trajectories.load(self.env, buffer_file)
            else:
                self.buffer.load_data(buffer_file, env=self.env)
        self.gfn.load_state_dict(state['gflownet'])
        self.optim.load_state_dict(state['optim'])
        c = state['counters']
        self.iteration, self.replayed = int(c['iteration']), int(c['replayed'])
        self.wall_offset = float(c['wall_time'])
        self.first_mode_iter = None if c['first_mode_iter'] < 0 else int(c['first_mode_iter'])
        self.loss_sum, self.loss_n, self.last_loss = float(c['loss_sum']), int(c['loss_n']), float(c['last_loss'])
        self.evals = [dict(r) for r in state['evals']]
        self.mode_states = {int(s) for s in state['mode_states']}
        self.visited.clear()
        self.n_visited = len(state['visited'])
        if self.n_visited:
            self.visited.append(state['visited'])
        torch.set_rng_state(state['rng']['torch'])
        if 'cuda' in state['rng'] and self.device.type == 'cuda':
            torch.cuda.set_rng_state(state['rng']['cuda'], self.device)
        write_eval_csv(self.run_dir, self.evals)  # drop rows written after this checkpoint
        return state


# ---------------------------------------------------------------------------------------------------- entry point
def config_from_args(user: dict, args: argparse.Namespace) -> EasyDict:
    """The job's config: ``user`` (a ``main_config`` without ``job``) with the command line's ``--seed``,
    ``--device`` and ``--iterations`` over it, validated (``build_hypergrid_config``)."""
    if args.env_steps is not None:
        raise ValueError(
            f"{args.config}: --env-steps is for the DQN job; the 'hypergrid' job counts training "
            "iterations: use --iterations (config key 'policy.learn.iterations')"
        )
    user = dict(user)
    if args.seed is not None:
        user['seed'] = args.seed
    if args.device is not None or args.iterations is not None:
        policy = dict(user.get('policy') or {})
        if args.device is not None:
            policy['device'] = args.device
        if args.iterations is not None:
            policy['learn'] = dict(policy.get('learn') or {}, iterations=args.iterations)
        user['policy'] = policy
    return build_hypergrid_config(user, source=args.config)


def run_local(cfg: EasyDict, args: argparse.Namespace) -> int:
    """The job in this process (a buffer section without ``distributed``): train (or resume), print a summary."""
    if args.nproc is not None:
        raise ValueError(
            f"{args.config}: --nproc {args.nproc} needs a distributed buffer (config key "
            f"'{BUFFER_SECTION}distributed.backend': 'torch', 'mpi' or 'ray'); this config trains in "
            "one process"
        )
    run_dir = args.resume or run_dir_of(cfg)
    torch.set_num_threads(args.threads)
    trainer = make_trainer(HyperGridTrainer, cfg, run_dir, args)
    if trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at iteration {trainer.iteration}")
    with StopSignals() as stop:
        s = trainer.run(stop=stop, started_at=getattr(args, 'started_at', None))
    buffer = 'no' if s['buffer_type'] == 'none' else s['buffer_type']
    first_mode = f", first at iteration {s['first_mode_iteration']}" if s['first_mode_iteration'] else ''
    print(
        f"\n== {s['exp_name']} (seed {s['seed']}, {buffer} buffer, grid {s['grid']}) ==\n"
        f"  iterations {s['iterations']}, trajectories {s['trajectories']}, wall time {s['wall_time_s']:.0f} s\n"
        f"  L1 distance to R/Z: {s['initial_l1_dist']:.3f} -> {s['final_l1_dist']:.3f} (best {s['best_l1_dist']:.3f} "
        f"at iteration {s['best_l1_iteration']}; exact samples would show {s['l1_exact_samples']:.3f})\n"
        f"  modes found {s['modes_found']}/{s['n_modes']} ({s['mode_states_found']}/{s['n_mode_states']} mode "
        f"states{first_mode}); logZ {s['logZ']:.3f} (true {s['logZ_true']:.3f})\n"
        f"  buffer: {s['buffer_count']} items, {s['replayed_trajectories']} trajectories replayed\n"
        f"  run dir: {s['run_dir']} (TensorBoard: tensorboard --logdir {os.path.join(s['run_dir'], 'log')}; "
        f"curve: learning_curve.png)"
    )
    return stop.report(args, s['run_dir'], f"iteration {s['iterations']}")


__all__ = ['HYPERGRID_DEFAULTS', 'HyperGridTrainer', 'build_hypergrid_config', 'config_from_args', 'run_local']

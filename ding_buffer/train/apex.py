"""Ape-X DQN over the distributed buffer manager: ``ding-buffer train config/cartpole_apex.py --nproc N``.

Roles. One process is the manager (it owns an ``advanced`` buffer and serves it), one is the learner, the others
are actors. With torch.distributed or MPI these are ranks: the manager is ``distributed.manager_rank`` (default:
the last), the learner the lowest other rank, the actors the rest. With Ray the manager is the named actor that
``create_buffer`` starts, and the learner and actors are Ray tasks started by this driver.

Actor ``i`` of ``n`` explores with epsilon ``eps_base ** (1 + eps_alpha * i / (n - 1))`` (the Ape-X ladder),
builds n-step transitions, computes their initial priorities ``|TD error|`` with its own copy of the network and
pushes them in batches of ``apex.push_batch`` (one ``extend`` with a ``priority`` column). The learner samples,
learns (double DQN, IS-weighted Huber loss), sends ``|TD error|`` back with ``update`` and publishes its weights
every ``apex.publish_freq`` gradient steps as a versioned blob on the manager (``put_blob('weights', version,
...)``); actors ask for a newer version every ``apex.weight_sync_steps`` env steps (``get_blob``: one round trip,
the weights travel only when they changed). The blob goes through the same manager on every backend, so weight
sharing needs nothing beyond the buffer's own connection; a run on several machines needs no shared disk for it.

The run ends when the learner has seen ``env.max_env_step`` transitions stored: it publishes a last version
with ``stop`` set, actors flush and close, and the manager returns once every worker has left. A killed actor
is counted as lost by the manager after ``distributed.peer_timeout`` and the run goes on; a killed manager makes
every worker's next call raise ``ManagerUnavailableError`` within ``distributed.timeout``, and each rank exits
with that message (exit status 3). Actors also stop (status 3) when the learner publishes nothing new for
``apex.learner_silence`` seconds.

The learner writes what the single-process job writes in ``<log_dir>/<exp_name>_seed<seed>/``: TensorBoard
(``log/``: learner curves, and the buffer's ``stats()`` under ``buffer/`` -- counters, the sampled window's
priority / use / staleness, the manager's ``manager/*`` counters), ``eval.csv``, ``learning_curve.png``,
``checkpoints/`` (learner state plus the buffer, written by the
manager into the run directory, its ``distributed.file_root``) and ``summary.json``. ``--resume RUN_DIR`` loads
the latest complete checkpoint on the learner and the buffer on the manager.
"""

import argparse
import contextlib
import copy
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from easydict import EasyDict

from ..config import SECONDS_CHECK, build_config, check_section, positive_int
from ..errors import ManagerUnavailableError
from .checkpoint import load_latest, purge_tensorboard, save_checkpoint
from .config import (
    BUFFER_SECTION,
    TRAIN_CHECKS,
    TRAIN_DEFAULTS,
    check_new_run_dir,
    run_dir_of,
    split_buffer_section,
    with_env_steps,
)
from .dqn import (
    NStep,
    build_qnet,
    evaluate_greedy,
    init_learner,
    learner_state,
    load_learner_state,
    solved_text,
    train_on,
    write_summary,
)
from .env import LAUNCHED
from .launch import in_file_root, publish_weights, run_roles, with_remote
from .plot import write_run_info
from .run_dir import progress_bar

BACKENDS = ('torch', 'mpi', 'ray')

APEX_DEFAULTS = copy.deepcopy(TRAIN_DEFAULTS)
APEX_DEFAULTS.update(exp_name='cartpole_apex')
APEX_DEFAULTS['policy']['nstep'] = 3
APEX_DEFAULTS['policy']['learn'].update(updates_per_step=0.25)
APEX_DEFAULTS['policy'].pop('collect')  # actors use the epsilon ladder below
for _key in ('dataset_out', 'dataset_source'):  # the DQN job's offline data (the Ape-X job writes and reads none)
    APEX_DEFAULTS.pop(_key)
# the Ape-X job runs classic-control envs with the MLP (image envs and their network: the DQN job)
for _section, _key in (('env', 'wrapper'), ('env', 'max_episode_steps')):
    APEX_DEFAULTS[_section].pop(_key)
APEX_DEFAULTS['policy']['model'].pop('type')
APEX_DEFAULTS['policy']['learn'].pop('train_freq')
APEX_DEFAULTS['apex'] = dict(
    # Epsilon of actor i of n: eps_base ** (1 + eps_alpha * i / (n - 1)) (one actor: eps_base).
    eps_base=0.4,
    eps_alpha=7.0,
    # Transitions per actor push (one batched extend with their initial priorities).
    push_batch=50,
    # Actor env steps between two asks for newer weights; learner gradient steps between two publishes.
    weight_sync_steps=200,
    publish_freq=50,
    # Learner gradient steps between two TensorBoard records of the buffer's stats().
    buffer_log_freq=200,
    # True: an actor stays at most ~2 weight publishes ahead of what the learner's replay ratio
    # (policy.learn.updates_per_step) needs -- Reverb's sample-to-insert rate limit, so a run's transition budget
    # buys gradient steps on a small machine. False: actors run free, as in the Ape-X paper (a learner on a GPU).
    throttle_actors=True,
    # Seconds an actor waits for the learner's first weights, and for any newer version after that; and seconds
    # the learner waits for a new transition before it gives up (every actor gone).
    learner_silence=300.0,
    # Seconds a sample waits for a batch before the learner checks the run is still alive.
    sample_timeout=30.0,
)

APEX_CHECKS = {k: v for k, v in TRAIN_CHECKS.items() if not k.startswith('policy.collect.')}
APEX_CHECKS.update(
    {
        'policy.learn.updates_per_step': (lambda x: x > 0, 'a positive number (gradient steps per stored transition)'),
        'apex.eps_base': (lambda x: 0 <= x <= 1, 'a number in [0, 1]'),
        'apex.eps_alpha': (lambda x: x >= 0, 'a number >= 0'),
        'apex.push_batch': (positive_int, 'a positive int'),
        'apex.weight_sync_steps': (positive_int, 'a positive int'),
        'apex.publish_freq': (positive_int, 'a positive int'),
        'apex.buffer_log_freq': (positive_int, 'a positive int'),
        'apex.throttle_actors': (lambda x: isinstance(x, bool), 'True or False'),
        'apex.learner_silence': SECONDS_CHECK,
        'apex.sample_timeout': SECONDS_CHECK,
    }
)


# ---------------------------------------------------------------------------------------------- config
def build_apex_config(user: Dict[str, Any], source: str) -> EasyDict:
    """``user`` merged over ``APEX_DEFAULTS`` and checked; the buffer section must be an ``advanced`` buffer with a
    ``distributed.backend``. Errors name ``source`` and the key."""
    try:
        user, buffer_cfg = split_buffer_section(copy.deepcopy(user))
        cfg = build_config(APEX_DEFAULTS, user, APEX_CHECKS)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{source}: {e}") from e
    if not isinstance(buffer_cfg, dict) or buffer_cfg.get('type') != 'advanced':
        got = buffer_cfg.get('type') if isinstance(buffer_cfg, dict) else buffer_cfg
        raise ValueError(
            f"{source}: config key '{BUFFER_SECTION}type' is {got!r}; the Ape-X job needs 'advanced' "
            f"(prioritized replay)"
        )
    dist = dict(buffer_cfg.get('distributed') or {})
    if dist.get('backend') not in BACKENDS:
        raise ValueError(
            f"{source}: config key '{BUFFER_SECTION}distributed.backend' is {dist.get('backend')!r}; "
            f"expected one of {list(BACKENDS)}"
        )
    storage = dict(buffer_cfg.get('storage') or {})
    if storage.get('type', 'tensor') != 'tensor':
        raise ValueError(
            f"{source}: config key '{BUFFER_SECTION}storage.type' must be 'tensor' (the learner needs "
            f"batched tensors), got {storage.get('type')!r}"
        )
    storage['type'] = 'tensor'
    buffer_cfg = dict(buffer_cfg, storage=storage, distributed=dist)
    buffer_cfg.setdefault('seed', cfg.seed)
    try:  # every key of the buffer section is checked before any process starts
        from ..base import get_buffer_cls
        from ..distributed.config import build_distributed_config

        cls = get_buffer_cls(EasyDict(buffer_cfg))
        check_section(cls, buffer_cfg, BUFFER_SECTION)
        build_distributed_config(dist)
    except (ValueError, TypeError) as e:
        raise type(e)(
            f"{source}: {str(e).replace(chr(39) + 'distributed.', chr(39) + BUFFER_SECTION + 'distributed.')}"
        ) from e
    cfg.policy.other.replay_buffer = EasyDict(buffer_cfg)
    return cfg


def epsilon_ladder(i: int, n: int, base: float, alpha: float) -> float:
    """Ape-X's per-actor exploration: ``base ** (1 + alpha * i / (n - 1))``; one actor gets ``base``."""
    return float(base ** (1 + alpha * i / (n - 1))) if n > 1 else float(base)


# ---------------------------------------------------------------------------------------------- roles
class Actor:
    """One Ape-X actor: acts with its epsilon, pushes prioritized n-step batches, follows the learner's weights."""

    def __init__(self, cfg: EasyDict, buffer: Any, index: int, n_actors: int) -> None:
        import gymnasium as gym

        self.cfg, self.buffer, self.index = cfg, buffer, index
        self.env = gym.make(cfg.env.env_id)
        self.net = build_qnet(cfg.policy.model, self.env.observation_space.shape, int(self.env.action_space.n))
        self.eps = epsilon_ladder(index, n_actors, cfg.apex.eps_base, cfg.apex.eps_alpha)
        self.rng = np.random.default_rng([cfg.seed, 1 + index])
        self.nstep = NStep(cfg.policy.nstep, cfg.policy.discount_factor)
        self.version = -1
        self.env_at_publish, self.allowed_env, self.steps_at_publish = 0, float('inf'), 0
        self.stop = False
        self.pending: List[Dict[str, Any]] = []
        self.steps = 0

    def sync(self, wait: bool) -> None:
        """Load newer weights if the learner published some (``wait``: until there are, within
        ``apex.learner_silence``)."""
        deadline = time.monotonic() + self.cfg.apex.learner_silence
        while True:
            got = self.buffer.get_blob('weights', self.version)
            if got is not None:
                self.net.load_state_dict(got['payload']['net'])
                self.version, self.stop = got['version'], bool(got['payload']['stop'])
                self.env_at_publish = int(got['payload']['env_step'])
                self.allowed_env = float(got['payload']['allowed_env'])
                self.steps_at_publish = self.steps
                self._last_news = time.monotonic()
                return
            now = time.monotonic()
            if not wait:
                if now - self._last_news > self.cfg.apex.learner_silence:
                    raise ManagerUnavailableError(
                        f"actor {self.index}: the learner published no weights for {self.cfg.apex.learner_silence:g}s "
                        "(config key 'apex.learner_silence'); it is gone or stuck"
                    )
                return
            if now > deadline:
                raise ManagerUnavailableError(
                    f"actor {self.index}: no weights from the learner within {self.cfg.apex.learner_silence:g}s "
                    "(config key 'apex.learner_silence')"
                )
            time.sleep(0.2)

    def ahead(self) -> bool:
        """Whether the transitions stored so far -- as the learner last reported them, plus this actor's since --
        exceed what the learner allows before its next publishes (``Learner.allowed_env``). Counting every actor's
        transitions, not a per-actor share, keeps the run going when an actor dies."""
        return self.env_at_publish + (self.steps - self.steps_at_publish) > self.allowed_env

    def throttle(self) -> None:
        """Wait (asking for newer weights) while this actor is ahead of the learner."""
        while not self.stop and self.ahead():
            time.sleep(0.02)
            self.sync(wait=False)

    @torch.no_grad()
    def _priorities(self, batch: Dict[str, np.ndarray]) -> np.ndarray:
        """Initial priorities: ``|TD error|`` of each transition under this actor's network (no target network)."""
        q = self.net(torch.from_numpy(batch['obs'])).gather(1, torch.from_numpy(batch['action'])[:, None])[:, 0]
        nxt = self.net(torch.from_numpy(batch['next_obs'])).max(1).values
        target = (
            torch.from_numpy(batch['reward'])
            + torch.from_numpy(batch['discount']) * (1.0 - torch.from_numpy(batch['done']).float()) * nxt
        )
        return (target - q).abs().numpy().astype(np.float32)

    def _push(self) -> None:
        items, self.pending = self.pending, []
        batch = {
            'obs': np.stack([t['obs'] for t in items]),
            'next_obs': np.stack([t['next_obs'] for t in items]),
            'action': np.array([t['action'] for t in items], dtype=np.int64),
            'reward': np.array([t['reward'] for t in items], dtype=np.float32),
            'done': np.array([t['done'] for t in items], dtype=bool),
            'discount': np.array([t['discount'] for t in items], dtype=np.float32),
            'collect_iter': np.full(len(items), max(self.version, 0), dtype=np.int64),
        }
        batch['priority'] = self._priorities(batch)
        self.buffer.extend(batch)

    def run(self) -> Dict[str, Any]:
        cfg = self.cfg
        self._last_news = time.monotonic()
        self.sync(wait=True)
        obs, _ = self.env.reset(seed=cfg.seed * 1_000_003 + 7919 * (self.index + 1))
        episodes, ret, returns = 0, 0.0, []
        while not self.stop:
            if self.rng.random() < self.eps:
                action = int(self.rng.integers(self.env.action_space.n))
            else:
                with torch.no_grad():
                    action = int(self.net(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(1).item())
            next_obs, r, term, trunc, _ = self.env.step(action)
            t = {
                'obs': np.asarray(obs, np.float32),
                'action': action,
                'reward': float(r),
                'next_obs': np.asarray(next_obs, np.float32),
                'done': bool(term),
                'discount': float(cfg.policy.discount_factor),
            }
            self.pending += self.nstep.add(t, term or trunc)
            self.steps += 1
            ret += float(r)
            obs = next_obs
            if term or trunc:
                episodes += 1
                returns.append(ret)
                ret = 0.0
                obs, _ = self.env.reset()
            if len(self.pending) >= cfg.apex.push_batch:
                self._push()
                if cfg.apex.throttle_actors:
                    self.throttle()
            if self.steps % cfg.apex.weight_sync_steps == 0:
                self.sync(wait=False)
        if self.pending:
            self._push()
        return {
            'role': 'actor',
            'index': self.index,
            'epsilon': self.eps,
            'env_steps': self.steps,
            'episodes': episodes,
            'last_version': self.version,
            'mean_return_last_20': float(np.mean(returns[-20:])) if returns else None,
        }


class Learner:
    """The Ape-X learner: samples, learns, updates priorities, publishes weights, evaluates and checkpoints."""

    def __init__(self, cfg: EasyDict, buffer: Any, run_dir: str, resume: bool, progress: bool) -> None:
        import gymnasium as gym
        from torch.utils.tensorboard import SummaryWriter

        self.cfg, self.buffer, self.run_dir, self.progress = cfg, buffer, run_dir, progress
        self.device = torch.device(cfg.policy.device)
        self.eval_env = gym.make(cfg.env.env_id)
        init_learner(self, tuple(self.eval_env.observation_space.shape), int(self.eval_env.action_space.n))
        self.ckpt_dir = os.path.join(run_dir, 'checkpoints')
        self.tb = SummaryWriter(os.path.join(run_dir, 'log'))
        self.train_iter = self.version = 0
        self.env_base = 0  # transitions stored before this process started (resume)
        self.push_base: Optional[int] = None
        self.env_step = 0
        self._schedule()
        if resume:
            self.resumed_from, _ = load_latest(self.ckpt_dir, self._load)
            if self.resumed_from is None:
                raise ValueError(f"--resume {run_dir}: no complete checkpoint in {self.ckpt_dir}")
            purge_tensorboard(self.tb, self.env_step + 1)  # (its curves are on the env step)

    # ------------------------------------------------------------------ helpers
    def _schedule(self) -> None:
        """The first evaluation and checkpoint steps after ``env_step`` (``next_ckpt`` 0: no periodic checkpoint)."""
        freq = self.cfg.checkpoint.freq
        self.next_eval = (self.env_step // self.cfg.env.eval_freq + 1) * self.cfg.env.eval_freq
        self.next_ckpt = (self.env_step // freq + 1) * freq if freq else 0

    def _pushed(self) -> int:
        return int(self.buffer.stats().get('push_items', 0))

    def _refresh_env_step(self) -> None:
        pushed = self._pushed()
        if self.push_base is None:
            self.push_base = pushed
        self.env_step = self.env_base + pushed - self.push_base

    def allowed_env(self) -> float:
        """Transitions the actors may store before the learner's next publishes: what the replay ratio needs for
        two more publishes (``apex.throttle_actors``; inf when actors run free)."""
        cfg = self.cfg
        if not cfg.apex.throttle_actors:
            return float('inf')
        learn = cfg.policy.learn
        return learn.warmup_steps + (self.train_iter + 2 * cfg.apex.publish_freq) / learn.updates_per_step

    def publish(self, stop: bool = False) -> None:
        self.version += 1
        state = {k: v.detach().cpu() for k, v in self.net.state_dict().items()}
        publish_weights(
            self.buffer,
            self.version,
            {
                'net': state,
                'stop': stop,
                'train_iter': self.train_iter,
                'env_step': self.env_step,
                'allowed_env': self.allowed_env(),
            },
        )

    def wall_time(self) -> float:
        return self.wall_offset + time.monotonic() - self._t0

    evaluate = evaluate_greedy

    def log_buffer(self) -> None:
        stats = self.buffer.stats()
        for k, v in stats.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
                self.tb.add_scalar(f'buffer/{k}', v, self.env_step)

    # ------------------------------------------------------------------ main loop
    def run(self) -> Dict[str, Any]:
        """Train to ``env.max_env_step``. A learner that fails on the way still tells the actors to stop (a
        best-effort stop publish) so the job ends now, not after their ``apex.learner_silence``."""
        try:
            return self._run()
        except Exception:
            with contextlib.suppress(Exception):  # the manager is gone too: the actors stop on their own (silence)
                self.publish(stop=True)
            raise

    def _run(self) -> Dict[str, Any]:
        cfg = self.cfg
        learn = cfg.policy.learn
        write_run_info(self.run_dir, cfg, 'apex')  # run.json: what the plot groups the run by, before summary.json
        self._t0 = time.monotonic()
        self._refresh_env_step()
        self.publish()
        bar = progress_bar(self, cfg.env.max_env_step, min(self.env_step, cfg.env.max_env_step), 'step')
        last_poll = 0.0
        seen, seen_at = self.env_step, time.monotonic()
        while self.env_step < cfg.env.max_env_step:
            now = time.monotonic()
            if now - last_poll > 0.1:  # one stats() round trip: how many transitions the actors stored
                self._refresh_env_step()
                last_poll = now
                bar.update(min(self.env_step, cfg.env.max_env_step) - bar.n)
                if self.env_step != seen:
                    seen, seen_at = self.env_step, now
            allowed = learn.updates_per_step * max(self.env_step - learn.warmup_steps, 0)
            if self.env_step < learn.warmup_steps or self.train_iter >= allowed:
                if now - seen_at > cfg.apex.learner_silence:
                    raise RuntimeError(
                        f"no transition arrived for {cfg.apex.learner_silence:g}s (config key "
                        f"'apex.learner_silence') while the learner waits for them: every actor is "
                        f"gone or stuck ({self.env_step} of {cfg.env.max_env_step} stored)"
                    )
                time.sleep(0.01)  # wait for the actors: warm-up, or the replay ratio reached
                continue
            batch = self.buffer.sample(
                learn.batch_size, cur_learner_iter=self.train_iter, timeout=cfg.apex.sample_timeout
            )
            logged = train_on(self, batch)
            if self.train_iter % cfg.apex.publish_freq == 0:
                self.publish()
            if logged:
                bar.set_postfix(
                    eval=f"{self.evals[-1]['return_mean']:.0f}" if self.evals else '-',
                    loss=f"{self.last_loss:.3f}",
                    it=self.train_iter,
                    refresh=False,
                )
            if self.train_iter % cfg.apex.buffer_log_freq == 0:
                self.log_buffer()
            if self.env_step >= self.next_eval:
                self.evaluate()
                self.next_eval = (self.env_step // cfg.env.eval_freq + 1) * cfg.env.eval_freq
            if self.next_ckpt and self.env_step >= self.next_ckpt:
                self.checkpoint()
                self.next_ckpt = (self.env_step // cfg.checkpoint.freq + 1) * cfg.checkpoint.freq
        self.publish(stop=True)
        bar.update(min(self.env_step, cfg.env.max_env_step) - bar.n)
        bar.close()
        if not self.evals or self.evals[-1]['env_step'] != self.env_step:
            self.evaluate()
        self.log_buffer()
        self.checkpoint()
        return self.finish()

    def finish(self) -> Dict[str, Any]:
        head = {
            'job': 'apex',
            'backend': self.cfg.policy.other.replay_buffer.distributed.backend,
            'buffer_type': 'advanced',
            'env_steps': self.env_step,
            'train_iters': self.train_iter,
            'weight_versions': self.version,
        }
        summary = write_summary(self, self.buffer.stats(), head)
        self.tb.close()
        return summary

    # ------------------------------------------------------------------ persistence
    def checkpoint(self) -> str:
        state = learner_state(self, version=self.version)
        return save_checkpoint(
            self.ckpt_dir,
            self.env_step,
            state,
            lambda p: self.buffer.save_data(in_file_root(self.run_dir, p)),
            self.cfg.checkpoint.keep,
        )

    def _load(self, path: str) -> Dict[str, Any]:
        state = load_learner_state(self, path, in_file_root(self.run_dir, os.path.join(path, 'buffer.pt')))
        self.env_base, self.version = int(state['counters']['env_step']), int(state['counters']['version'])
        self.env_step = self.env_base
        self._schedule()
        return state


# ---------------------------------------------------------------------------------------------- one process
def _role_main(
    cfg: EasyDict, run_dir: str, role: str, index: int, n_workers: int, resume: bool, progress: bool, remote: Any = None
) -> Dict[str, Any]:
    """Run ``role`` ('learner' / 'actor' ``index`` of ``n_workers - 1``) with ``remote`` (a RemoteBuffer; built
    here when None, e.g. in a Ray task). Closes it; raises ``ManagerUnavailableError`` when the manager is gone."""
    torch.set_num_threads(1)
    if role == 'learner':
        return with_remote(cfg, run_dir, n_workers, remote, lambda r: Learner(cfg, r, run_dir, resume, progress).run())
    return with_remote(cfg, run_dir, n_workers, remote, lambda r: Actor(cfg, r, index, n_workers - 1).run())


def _print_summary(s: Dict[str, Any]) -> None:
    print(
        f"\n== {s['exp_name']} (Ape-X, {s['backend']} backend, seed {s['seed']}) ==\n"
        f"  transitions stored {s['env_steps']}, gradient steps {s['train_iters']}, weight versions "
        f"{s['weight_versions']}, wall time {s['wall_time_s']:.0f} s\n"
        f"  eval return: best {s['best_eval_return']:.1f} (step {s['best_eval_step']}), final "
        f"{s['final_eval_return']:.1f}; {solved_text(s)}\n"
        f"  run dir: {s['run_dir']} (TensorBoard: tensorboard --logdir {os.path.join(s['run_dir'], 'log')})",
        flush=True,
    )


def run(user: Dict[str, Any], args: argparse.Namespace) -> int:
    """``ding-buffer train`` for ``job='apex'``."""
    if args.iterations is not None:
        raise ValueError(
            f"{args.config}: --iterations is for GFlowNet jobs; the Ape-X job runs env.max_env_step "
            f"transitions (--env-steps)"
        )
    if args.seed is not None:
        user['seed'] = args.seed
    if args.env_steps is not None:
        with_env_steps(user, args.env_steps)
    if args.device is not None:
        user['policy'] = dict(user.get('policy') or {}, device=args.device)
    cfg = build_apex_config(user, args.config)
    run_dir = os.path.abspath(args.resume or run_dir_of(cfg))  # absolute: Ray tasks may run elsewhere
    if args.resume is None and os.environ.get(LAUNCHED) != '1':  # the launcher checked it for its ranks
        check_new_run_dir(run_dir, cfg.log_dir)
    if args.resume is not None and not os.path.isdir(args.resume):
        raise ValueError(f"--resume {args.resume}: not a run directory")
    return run_roles(_role_main, cfg, run_dir, args, 'Ape-X', 'actor', _print_summary)


__all__ = ['run', 'build_apex_config', 'epsilon_ladder', 'Actor', 'Learner']

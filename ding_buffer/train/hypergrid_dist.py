"""Distributed HyperGrid: torchgfn's replay-manager pattern over our distributed buffer manager.

``ding-buffer train config/hypergrid_tb_distributed.py --nproc N`` (or under torchrun / mpirun; Ray with
``distributed.backend='ray'``). The buffer section carries a ``distributed`` part, so the ranks are:

- the **manager** (last rank, or the Ray actor): owns the ``gfn`` / ``gfn_diverse`` buffer, scores every push and
  answers with ``baseline_log_reward`` (``distributed.baseline_strategy``: the minimum / a percentile of the stored
  log-rewards once full, or an EMA of incoming minima);
- the **learner** (rank 0): the local job's ``HyperGridTrainer`` -- on-policy batches plus replay -- whose buffer is
  the manager; it publishes the policy's weights every ``distributed_job.publish_freq`` iterations as the
  manager's ``'weights'`` blob and evaluates (L1, modes, log Z) as the local job does;
- **samplers** (the other ranks): sample ``policy.learn.batch_size`` trajectories with the latest published
  policy and push them; with ``distributed.baseline_filtering`` the worker side drops those below the manager's
  baseline before sending (torchgfn's workers filter the same way). A sampler pushes at most
  ``publish_freq`` batches per weights version, so samplers follow the learner instead of flooding the buffer.

On the wire a batch of trajectories is a dict of padded tensors (``trajectories_to_batch``: the terminating
``state``, its ``log_reward``, the item-major ``traj_states`` / ``traj_actions`` padded with the sink state and
the dummy action, ``length``), not a pickled container: no ``allow_pickle`` anywhere. The manager stores them as
items of fixed shape; ``batch_to_trajectories`` rebuilds the ``Trajectories`` on the learner.

A killed sampler is counted as lost by the manager and the run goes on; a killed manager ends every rank with
``ManagerUnavailableError`` (exit status 3). Checkpoints hold the learner's state and, written by the manager
into the run directory (its ``distributed.file_root``), the buffer.
"""

import argparse
import contextlib
import os
import time
from typing import Any, Dict, Optional

import torch
from easydict import EasyDict

from ..errors import ManagerUnavailableError
from .config import run_dir_of
from .hypergrid import HyperGridTrainer, make_grid
from .launch import in_file_root, publish_weights, run_roles, with_remote


# ---------------------------------------------------------------------------------------------- wire format
def max_actions(ndim: int, height: int) -> int:
    """Longest HyperGrid trajectory in actions: every coordinate to ``height - 1``, then the exit action."""
    return ndim * (height - 1) + 1


def trajectories_to_batch(tr: Any, length: int) -> Dict[str, torch.Tensor]:
    """Forward ``Trajectories`` (with log-rewards) as a dict batch of fixed-shape items: ``state`` [B, D] (the
    terminating state), ``log_reward`` [B], ``traj_states`` [B, length + 1, D] and ``traj_actions`` [B, length]
    (item-major, padded with the sink state / the dummy action, as torchgfn pads time-major), ``length`` [B]."""
    states = tr.states.tensor  # [T + 1, B, D]
    actions = tr.actions.tensor[..., 0]  # [T, B]
    t1, b, d = states.shape
    if t1 - 1 > length:
        raise ValueError(f"a trajectory of {t1 - 1} actions is longer than the grid allows ({length})")
    sink = tr.env.sf.to(states.dtype)
    out_s = sink.expand(b, length + 1, d).clone()
    out_s[:, :t1] = states.transpose(0, 1)
    dummy = tr.env.Actions.dummy_action.to(actions.dtype)
    out_a = dummy.reshape(1, 1).expand(b, length).clone()
    out_a[:, : t1 - 1] = actions.transpose(0, 1)
    return {
        'state': tr.terminating_states.tensor.clone(),
        'log_reward': tr.log_rewards.detach().float().clone(),
        'traj_states': out_s,
        'traj_actions': out_a,
        'length': tr.terminating_idx.long().clone(),
    }


def batch_to_trajectories(batch: Dict[str, torch.Tensor], env: Any) -> Optional[Any]:
    """The ``Trajectories`` of a dict batch made by ``trajectories_to_batch`` (trimmed to its longest item). Items
    whose ``length`` is not in ``[1, padded length]`` -- only a broken or lying sampler pushes them -- are left out
    (None when none is left): the TB loss of such an item would index past its own trajectory."""
    from gfn.containers import Trajectories

    length = batch['length'].long()
    ok = (length >= 1) & (length <= batch['traj_actions'].shape[1])
    if not bool(ok.all()):
        if not bool(ok.any()):
            return None
        batch = {k: v[ok] for k, v in batch.items()}
        length = batch['length'].long()
    t = int(length.max()) if len(length) else 0
    states = batch['traj_states'][:, : t + 1].transpose(0, 1).contiguous()
    actions = batch['traj_actions'][:, :t].transpose(0, 1).unsqueeze(-1).contiguous()
    return Trajectories(
        env=env,
        states=env.states_from_tensor(states),
        actions=env.actions_from_tensor(actions),
        terminating_idx=length,
        is_backward=False,
        log_rewards=batch['log_reward'].float(),
    )


class ManagerReplay:
    """The learner's view of the manager's buffer, with the local buffer's calls: ``push`` / ``sample`` take and
    return ``Trajectories``; ``save_data`` / ``load_data`` name files in the run directory (the manager's
    ``file_root``)."""

    def __init__(self, remote: Any, env: Any, length: int, run_dir: str) -> None:
        self.remote, self.env, self.length, self.run_dir = remote, env, length, run_dir

    def push(self, tr: Any, cur_collector_envstep: int = -1) -> int:
        return self.remote.extend(trajectories_to_batch(tr, self.length), cur_collector_envstep)

    def sample(self, n: int, cur_learner_iter: int = -1) -> Optional[Any]:
        batch = self.remote.sample(n, cur_learner_iter=cur_learner_iter)
        return None if batch is None else batch_to_trajectories(batch, self.env)

    def count(self) -> int:
        return self.remote.count()

    def save_data(self, path: str) -> None:
        self.remote.save_data(in_file_root(self.run_dir, path))

    def load_data(self, path: str, env: Any = None) -> None:
        self.remote.load_data(in_file_root(self.run_dir, path))

    def close(self) -> None:
        self.remote.close()


# ---------------------------------------------------------------------------------------------- roles
# the manager's stats a learner's summary reports
_MANAGER_STATS = (
    'count',
    'push_items',
    'sample_calls',
    'manager/push_requests',
    'manager/pushed_items',
    'manager/exited',
)


def _learner(cfg: EasyDict, run_dir: str, remote: Any, resume: bool, progress: bool) -> Dict[str, Any]:
    e = cfg.env
    length = max_actions(e.ndim, e.height)
    job = cfg.distributed_job

    class Trainer(HyperGridTrainer):
        def _make_buffer(self, bcfg: Any) -> Any:
            self.buffer_type = f"{bcfg.type} (manager, {bcfg.distributed.backend})"
            return ManagerReplay(remote, self.env, length, run_dir)

        def step(self) -> float:
            loss = super().step()
            if self.iteration % job.publish_freq == 0:
                self.publish(stop=False)
            return loss

        def publish(self, stop: bool) -> None:
            self.version = getattr(self, 'version', 0) + 1
            weights = {k: v.detach().cpu() for k, v in self.pf.state_dict().items()}
            publish_weights(remote, self.version, {'pf': weights, 'stop': stop, 'iteration': self.iteration})

        def run(self) -> Dict[str, Any]:
            self.publish(stop=False)
            try:
                return super().run()
            finally:
                with contextlib.suppress(Exception):  # the manager is gone: the samplers stop on their own (silence)
                    self.publish(stop=True)

        def summary(self) -> Dict[str, Any]:
            out = super().summary()
            stats = remote.stats()
            out['manager'] = {k: stats[k] for k in _MANAGER_STATS if k in stats}
            out['own_pushed_items'] = self.iteration * cfg.policy.learn.batch_size
            return out

        def close(self) -> None:
            self.tb.close()  # the buffer (the manager connection) is closed by the caller

    trainer = Trainer(cfg, run_dir, resume=resume, progress=progress)
    if trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at iteration {trainer.iteration}", flush=True)
    return trainer.run()


def _sampler(cfg: EasyDict, remote: Any, index: int) -> Dict[str, Any]:
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.samplers import Sampler

    e, job = cfg.env, cfg.distributed_job
    torch.manual_seed(cfg.seed * 1_000_003 + 7919 * (index + 1))
    env, pre, mlp = make_grid(cfg)
    pf = DiscretePolicyEstimator(mlp, env.n_actions, preprocessor=pre)
    sampler = Sampler(estimator=pf)
    length = max_actions(e.ndim, e.height)
    version, stop, batches, pushed, since = -1, False, 0, 0, 0
    last_news = time.monotonic()
    while not stop:
        got = remote.get_blob('weights', version)
        if got is not None:
            pf.load_state_dict(got['payload']['pf'])
            version, stop, since = got['version'], bool(got['payload']['stop']), 0
            last_news = time.monotonic()
            continue
        if time.monotonic() - last_news > job.learner_silence:
            raise ManagerUnavailableError(
                f"sampler {index}: no news from the learner for {job.learner_silence:g}s "
                "(config key 'distributed_job.learner_silence')"
            )
        if version < 0 or since >= job.publish_freq:
            time.sleep(0.05)  # wait for the first / a newer policy
            continue
        with torch.no_grad():
            tr = sampler.sample_trajectories(
                env, n=cfg.policy.learn.batch_size, epsilon=float(cfg.policy.collect.epsilon)
            )
        pushed += remote.extend(trajectories_to_batch(tr, length))
        batches += 1
        since += 1
    pushes = getattr(remote, 'pushes', None)  # a RemoteBuffer's push pipeline (a ShardedBuffer has none)
    return {
        'role': 'sampler',
        'index': index,
        'batches': batches,
        'pushed_items': pushed,
        'last_version': version,
        'filtered': dict(pushes.filter_stats) if pushes is not None else None,
    }


def _role_main(
    cfg: EasyDict, run_dir: str, role: str, index: int, n_workers: int, resume: bool, progress: bool, remote: Any = None
) -> Dict[str, Any]:
    torch.set_num_threads(1)
    if role == 'learner':
        return with_remote(cfg, run_dir, n_workers, remote, lambda r: _learner(cfg, run_dir, r, resume, progress))
    return with_remote(cfg, run_dir, n_workers, remote, lambda r: _sampler(cfg, r, index))


def _print(s: Dict[str, Any]) -> None:
    print(
        f"\n== {s['exp_name']} (distributed HyperGrid, seed {s['seed']}, {s['buffer_type']}) ==\n"
        f"  iterations {s['iterations']}, wall time {s['wall_time_s']:.0f} s\n"
        f"  L1 distance to R/Z: {s['initial_l1_dist']:.3f} -> {s['final_l1_dist']:.3f} (best {s['best_l1_dist']:.3f});"
        f" modes found {s['modes_found']}/{s['n_modes']}; logZ {s['logZ']:.3f} (true {s['logZ_true']:.3f})\n"
        f"  run dir: {s['run_dir']}",
        flush=True,
    )


def run_distributed(cfg: EasyDict, args: argparse.Namespace) -> int:
    """``ding-buffer train`` of a HyperGrid config whose buffer section has ``distributed.backend``."""
    run_dir = os.path.abspath(args.resume or run_dir_of(cfg))
    return run_roles(_role_main, cfg, run_dir, args, 'distributed HyperGrid', 'sampler', _print)


__all__ = ['run_distributed', 'trajectories_to_batch', 'batch_to_trajectories', 'max_actions', 'ManagerReplay']

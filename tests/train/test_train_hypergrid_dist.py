"""The distributed HyperGrid job (torchgfn's replay-manager pattern) with real processes: a manager rank owning a
keep-best ``gfn`` buffer that answers pushes with a baseline log-reward, sampler ranks pushing trajectories of the
latest published policy, and the learner training on its own batches plus the manager's replay.

The wire format (trajectories as dicts of padded tensors, no pickle) is checked against torchgfn itself: the
trajectory-balance loss of a rebuilt batch equals the original's."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

gfn = pytest.importorskip('gfn')

from helpers import need_mpi  # noqa: E402
from train_helpers import CONFIG_DIR, assert_user_error, cli, finish, ranks_of, start, wait_for, write_config  # noqa: E402

DIST_CONFIG = CONFIG_DIR / 'hypergrid_tb_distributed.py'
ITERS = 150


def config(tmp_path: Path, backend: str, **dist) -> Path:
    d = dict(dict(backend=backend, timeout=20.0, heartbeat_seconds=1.0, peer_timeout=6.0), **dist)
    return write_config(
        tmp_path / 'cfg.py',
        DIST_CONFIG,
        {
            'log_dir': str(tmp_path / 'runs'),
            'env': {'eval_freq': 50, 'eval_samples': 4000},
            'policy': {'learn': {'iterations': ITERS}, 'other': {'replay_buffer': {'distributed': d}}},
        },
    )


def check_run(run_dir: Path) -> dict:
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['iterations'] == ITERS
    assert s['final_l1_dist'] < 0.5 * s['initial_l1_dist'], s  # learned
    assert s['modes_found'] >= 3, s
    # the samplers' trajectories reached the manager: more stored than the learner pushed itself
    assert s['manager']['push_items'] > s['own_pushed_items'], s
    assert s['replayed_trajectories'] > 0 and s['manager']['count'] > 0
    assert (run_dir / 'learning_curve.png').exists() and (run_dir / 'eval.csv').exists()
    assert any((run_dir / 'checkpoints').glob('step_*/COMPLETE'))
    return s


def test_wire_format_round_trip_keeps_the_tb_loss():
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gflownet import TBGFlowNet
    from gfn.gym import HyperGrid
    from gfn.preprocessors import KHotPreprocessor
    from gfn.samplers import Sampler
    from gfn.utils.modules import MLP

    from ding_buffer.train.hypergrid_dist import batch_to_trajectories, max_actions, trajectories_to_batch

    torch.manual_seed(0)
    env = HyperGrid(ndim=2, height=8, validate_modes=False)
    pre = KHotPreprocessor(height=8, ndim=2)
    pf = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions, preprocessor=pre)
    pb = DiscretePolicyEstimator(
        MLP(pre.output_dim, env.n_actions - 1), env.n_actions, preprocessor=pre, is_backward=True
    )
    net = TBGFlowNet(pf=pf, pb=pb)
    tr = Sampler(pf).sample_trajectories(env, n=32)
    batch = trajectories_to_batch(tr, max_actions(2, 8))
    assert batch['traj_states'].shape == (32, max_actions(2, 8) + 1, 2) and batch['traj_actions'].shape == (32, 15)
    back = batch_to_trajectories(batch, env)
    assert torch.equal(back.terminating_idx, tr.terminating_idx)
    assert torch.equal(back.terminating_states.tensor, tr.terminating_states.tensor)
    assert torch.equal(back.states.tensor, tr.states.tensor) and torch.equal(back.actions.tensor, tr.actions.tensor)
    a = net.loss(env, tr, recalculate_all_logprobs=True, reduction='sum')
    b = net.loss(env, back, recalculate_all_logprobs=True, reduction='sum')
    assert torch.allclose(a, b)
    # items with an impossible length (a lying sampler) are left out; none left: None
    bad = {k: v.clone() for k, v in batch.items()}
    bad['length'][:3] = torch.tensor([0, 99, -5])
    kept = batch_to_trajectories(bad, env)
    assert len(kept) == 29 and torch.equal(kept.terminating_idx, tr.terminating_idx[3:])
    assert batch_to_trajectories({k: v[:3] for k, v in bad.items()}, env) is None
    # a subset (what a sample returns) rebuilds too, trimmed to its longest item
    sub = {k: v[:5] for k, v in batch.items()}
    part = batch_to_trajectories(sub, env)
    assert len(part) == 5 and part.actions.tensor.shape[0] == int(sub['length'].max())


@pytest.mark.slow
def test_torch_run_learns_with_samplers_and_survives_a_killed_sampler(tmp_path):
    p = start(config(tmp_path, 'torch'), tmp_path, '--nproc', '4')
    ranks = ranks_of(p)
    run_dir = tmp_path / 'runs' / 'hypergrid_tb_distributed_seed0'
    wait_for(run_dir / 'eval.csv', 120)
    time.sleep(1.0)
    os.kill(ranks[1], signal.SIGKILL)  # sampler 0
    rc, out, err = finish(p)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert 'lost' in out, out[-2000:]
    check_run(run_dir)


@pytest.mark.slow
def test_killed_manager_ends_every_rank_with_a_clear_error(tmp_path):
    p = start(config(tmp_path, 'torch', timeout=5.0), tmp_path, '--nproc', '3', '--iterations', '100000')
    ranks = ranks_of(p, count=3)
    wait_for(tmp_path / 'runs' / 'hypergrid_tb_distributed_seed0' / 'eval.csv', 120)
    t0 = time.monotonic()
    os.kill(ranks[2], signal.SIGKILL)  # the manager (last rank)
    rc, out, err = finish(p, timeout=90)
    assert rc == 3, out[-2000:] + err[-3000:]
    assert 'ding-buffer: error: learner rank 0' in err, err[-3000:]
    assert time.monotonic() - t0 < 60
    for pid in ranks.values():
        assert not Path(f'/proc/{pid}').exists() or 'zombie' in Path(f'/proc/{pid}/status').read_text().lower()


@pytest.mark.slow
def test_mpi_run_learns(tmp_path):
    need_mpi()
    rc, out, err = finish(start(config(tmp_path, 'mpi'), tmp_path, '--nproc', '3'))
    assert rc == 0, out[-3000:] + err[-3000:]
    check_run(tmp_path / 'runs' / 'hypergrid_tb_distributed_seed0')


@pytest.mark.slow
def test_ray_run_learns(tmp_path):
    pytest.importorskip('ray')
    cfg = config(tmp_path, 'ray', namespace=f'hg_test_{os.getpid()}', startup_timeout=120.0)
    rc, out, err = finish(start(cfg, tmp_path, '--nproc', '3'))
    assert rc == 0, out[-3000:] + err[-3000:]
    check_run(tmp_path / 'runs' / 'hypergrid_tb_distributed_seed0')


@pytest.mark.slow
def test_distributed_section_on_a_torchgfn_buffer_is_refused(tmp_path):
    cfg = write_config(
        tmp_path / 'bad.py',
        DIST_CONFIG,
        {'log_dir': str(tmp_path / 'runs')},
        buffer=dict(
            type='torchgfn:ReplayBuffer',
            prioritized_capacity=False,
            prioritized_sampling=False,
            distributed=dict(backend='torch'),
        ),
    )
    r = cli('train', cfg, '--nproc', '3', cwd=tmp_path)
    assert_user_error(r.returncode, r.stderr, 'policy.other.replay_buffer.distributed')
    assert not (tmp_path / 'runs').exists()

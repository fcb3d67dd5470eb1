"""`ding-buffer train config/cartpole_apex.py`: Ape-X DQN over the distributed manager, with real processes.

Each launch here is the real command line (``python -m ding_buffer train ... --nproc N``) starting real ranks
(plain env:// ranks for torch, ``mpirun`` for MPI, a local Ray cluster for Ray), bounded by timeouts; the shipped
config is loaded and only budgets, the log directory and timeouts are overridden. What is checked: the run
learns something (a greedy evaluation return far above a random policy's ~22), TensorBoard has the learner's
and the buffer's tags, the artefacts exist, a killed actor does not stop the run, a killed manager ends every
rank with a clear error, ``--resume`` continues the counters, and config errors exit 2 naming the key.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import need_mpi
from train_helpers import (
    CONFIG_DIR,
    ENV,
    LEARNED_RETURN,
    assert_user_error,
    cli,
    finish,
    ranks_of,
    read_csv,
    start,
    wait_for,
    write_config,
)

APEX_CONFIG = CONFIG_DIR / 'cartpole_apex.py'
SHORT = dict(
    env=dict(max_env_step=4500, eval_freq=1000, eval_episodes=5),
    checkpoint=dict(freq=2000, keep=2),
    policy=dict(learn=dict(warmup_steps=500, updates_per_step=1.0)),
)


def _config(root: Path, backend: str, name: str, **dist) -> Path:
    d = dict(dict(backend=backend, timeout=20.0, heartbeat_seconds=1.0, peer_timeout=6.0), **dist)
    policy = dict(SHORT['policy'], other=dict(replay_buffer=dict(distributed=d)))
    return write_config(
        root / name,
        APEX_CONFIG,
        log_dir=str(root / 'runs'),
        env=SHORT['env'],
        checkpoint=SHORT['checkpoint'],
        policy=policy,
    )


def tb_tags(log_dir: Path) -> set:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for root, _, files in os.walk(log_dir):
        if any(f.startswith('events.') for f in files):
            acc = EventAccumulator(root)
            acc.Reload()
            tags |= set(acc.Tags()['scalars'])
    return tags


def check_learned(run_dir: Path, backend: str, min_steps: int = 4500) -> dict:
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['backend'] == backend and summary['job'] == 'apex'
    assert summary['env_steps'] >= min_steps and summary['train_iters'] > 1000 and summary['weight_versions'] > 10
    assert summary['buffer']['updated'] > 0 and summary['buffer']['push_items'] >= min_steps
    assert summary['best_eval_return'] > LEARNED_RETURN, summary
    rows = read_csv(run_dir / 'eval.csv')
    assert len(rows) >= 4 and [int(r['env_step']) for r in rows] == sorted(int(r['env_step']) for r in rows)
    assert (run_dir / 'learning_curve.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert any((run_dir / 'checkpoints').glob('step_*/COMPLETE'))
    return summary


# ---------------------------------------------------------------------------------------------------- torch
@pytest.mark.slow
def test_torch_run_learns_survives_a_killed_actor_and_logs(tmp_path):
    """4 ranks (manager, learner, 2 actors); one actor is SIGKILLed once the learner has published weights: the
    run still finishes its budget, learns, and TensorBoard holds the learner's and the buffer's tags."""
    p = start(_config(tmp_path, 'torch', 'apex.py'), tmp_path, '--nproc', '4')
    ranks = ranks_of(p)
    wait_for(tmp_path / 'runs' / 'cartpole_apex_seed0' / 'eval.csv', 120)  # the learner is learning
    os.kill(ranks[1], signal.SIGKILL)  # actor 0
    rc, out, err = finish(p)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert 'lost' in out, out[-2000:]  # the manager counted the killed actor as lost
    run_dir = tmp_path / 'runs' / 'cartpole_apex_seed0'
    check_learned(run_dir, 'torch')
    tags = tb_tags(run_dir / 'log')
    for tag in (
        'train/loss',
        'eval/return_mean',
        'buffer/push_items',
        'buffer/updated',
        'buffer/sample_calls',
        'buffer/priority_avg',
        'buffer/use_avg',
        'buffer/staleness_avg',
        'buffer/manager/pushed_items',
    ):
        assert tag in tags, sorted(tags)


@pytest.mark.slow
def test_killed_manager_ends_every_rank_with_a_clear_error(tmp_path):
    p = start(_config(tmp_path, 'torch', 'apex.py', timeout=5.0), tmp_path, '--nproc', '4')
    ranks = ranks_of(p)
    wait_for(tmp_path / 'runs' / 'cartpole_apex_seed0' / 'eval.csv', 120)
    t0 = time.monotonic()
    os.kill(ranks[3], signal.SIGKILL)  # the manager (last rank)
    rc, out, err = finish(p, timeout=90)
    assert rc == 3, out[-2000:] + err[-3000:]
    assert 'ManagerUnavailable' in err or 'manager' in err.lower(), err[-3000:]
    assert 'learner rank 0' in err, err[-3000:]
    assert time.monotonic() - t0 < 60
    for pid in ranks.values():  # no rank left behind
        assert not Path(f'/proc/{pid}').exists() or 'zombie' in Path(f'/proc/{pid}/status').read_text().lower()


@pytest.mark.slow
def test_sigterm_to_the_launcher_ends_every_rank_and_exits_143(tmp_path):
    """A scheduler's stop (SIGTERM to the launcher alone) ended the launcher by default and left every rank training
    as an orphan: it is passed on, as Ctrl-C is."""
    p = start(_config(tmp_path, 'torch', 'apex.py'), tmp_path, '--nproc', '3')
    ranks = ranks_of(p, count=3)
    wait_for(tmp_path / 'runs' / 'cartpole_apex_seed0' / 'eval.csv', 120)
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p, timeout=90)
    assert rc == 143, out[-2000:] + err[-3000:]
    assert 'stopped by SIGTERM: every rank ended' in out or 'stopped by SIGTERM before' in out, out[-2000:]
    for pid in ranks.values():  # no rank left behind
        assert not Path(f'/proc/{pid}').exists() or 'zombie' in Path(f'/proc/{pid}/status').read_text().lower()


@pytest.mark.slow
def test_resume_under_torchrun_continues_counters_and_buffer(tmp_path):
    """A run started with --nproc, resumed by the ranks torchrun starts (RANK / WORLD_SIZE set, no --nproc):
    each rank finds its role, and the counters and the buffer continue."""
    cfg = _config(tmp_path, 'torch', 'apex.py')
    rc, out, err = finish(start(cfg, tmp_path, '--nproc', '3', '--env-steps', '3000'))
    assert rc == 0, err[-3000:]
    run_dir = tmp_path / 'runs' / 'cartpole_apex_seed0'
    first = json.loads((run_dir / 'summary.json').read_text())
    cmd = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--standalone',
        '--nnodes',
        '1',
        '--nproc_per_node',
        '3',
        '-m',
        'ding_buffer',
        'train',
        str(cfg),
        '--no-progress',
        '--env-steps',
        '4500',
        '--resume',
        str(run_dir),
    ]
    p = subprocess.Popen(
        cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    rc, out, err = finish(p)
    assert rc == 0, out[-3000:] + err[-3000:]
    second = json.loads((run_dir / 'summary.json').read_text())
    assert second['backend'] == 'torch' and second['resumed_from']
    assert second['train_iters'] > first['train_iters'] and second['weight_versions'] > first['weight_versions']
    assert second['env_steps'] >= 4500
    # the buffer came back: the manager holds the first run's items plus the new ones (capacity 50k)
    assert second['buffer']['count'] >= first['buffer']['count'] + 1000
    evals = read_csv(run_dir / 'eval.csv')
    assert [int(r['env_step']) for r in evals] == sorted(int(r['env_step']) for r in evals)


# ---------------------------------------------------------------------------------------------------- mpi / ray
@pytest.mark.slow
def test_mpi_run_learns(tmp_path):
    need_mpi()
    rc, out, err = finish(start(_config(tmp_path, 'mpi', 'apex.py'), tmp_path, '--nproc', '3'))
    assert rc == 0, out[-3000:] + err[-3000:]
    check_learned(tmp_path / 'runs' / 'cartpole_apex_seed0', 'mpi')


@pytest.mark.slow
def test_mpi_run_with_actors_on_shared_memory_learns(tmp_path):
    """The actors push through shared-memory rings (the learner samples and updates over MPI, as before)."""
    need_mpi()
    rc, out, err = finish(start(_config(tmp_path, 'mpi', 'apex.py', shared_memory=True), tmp_path, '--nproc', '4'))
    assert rc == 0, out[-3000:] + err[-3000:]
    run_dir = tmp_path / 'runs' / 'cartpole_apex_seed0'
    check_learned(run_dir, 'mpi')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    shm_rows = []
    for root, _, files in os.walk(run_dir / 'log'):
        if any(f.startswith('events.') for f in files):
            acc = EventAccumulator(root)
            acc.Reload()
            if 'buffer/manager/shm_rows' in acc.Tags()['scalars']:
                shm_rows += [e.value for e in acc.Scalars('buffer/manager/shm_rows')]
    assert shm_rows and max(shm_rows) > 1000, shm_rows  # the actors' transitions came through the rings


@pytest.mark.slow
def test_ray_run_learns(tmp_path):
    pytest.importorskip('ray')
    cfg = _config(tmp_path, 'ray', 'apex.py', namespace=f'apex_test_{os.getpid()}', startup_timeout=120.0)
    rc, out, err = finish(start(cfg, tmp_path, '--nproc', '3'))
    assert rc == 0, out[-3000:] + err[-3000:]
    check_learned(tmp_path / 'runs' / 'cartpole_apex_seed0', 'ray')


@pytest.mark.slow
def test_ray_address_nobody_answers_is_a_one_line_error_within_the_startup_timeout(tmp_path):
    """``distributed.ray_address`` names the cluster to join; an address where nothing listens fails within
    ``startup_timeout`` naming the key (exit 2), not an endless ray.init."""
    pytest.importorskip('ray')
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    cfg = _config(tmp_path, 'ray', 'apex.py', ray_address=f'127.0.0.1:{port}', startup_timeout=3.0)
    t0 = time.monotonic()
    r = cli('train', cfg, '--nproc', '3', cwd=tmp_path, timeout=60)
    assert_user_error(r.returncode, r.stderr, 'distributed.ray_address', f'127.0.0.1:{port}', 'startup_timeout')
    assert time.monotonic() - t0 < 40


@pytest.mark.slow
def test_ray_managers_unimportable_scoring_function_is_a_one_line_error_before_ray_starts(tmp_path):
    """The manager actor would run on this host (a local Ray instance): what it would refuse is refused before Ray
    starts and before the run directory is made, exit 2 naming the key and its value."""
    pytest.importorskip('ray')
    cfg = _config(tmp_path, 'ray', 'apex.py', scoring_function='nomodule_xyz:score')
    r = cli('train', cfg, '--nproc', '3', cwd=tmp_path, timeout=120)
    assert_user_error(r.returncode, r.stderr, 'distributed.scoring_function', 'nomodule_xyz:score')
    assert not (tmp_path / 'runs').exists()


# ---------------------------------------------------------------------------------------------------- errors
@pytest.mark.slow
@pytest.mark.parametrize(
    'overrides,needles',
    [
        (dict(apex=dict(eps_base=2.0)), ["apex.eps_base", "2.0"]),
        (dict(apex=dict(push_batchh=5)), ["apex.push_batchh", "push_batch"]),
        (
            dict(policy=dict(other=dict(replay_buffer=dict(type='naive')))),
            ["policy.other.replay_buffer.type", "'naive'"],
        ),
        (
            dict(policy=dict(other=dict(replay_buffer=dict(distributed=dict(backend=None))))),
            ["distributed.backend", "None", "'torch'"],
        ),
        (dict(policy=dict(other=dict(replay_buffer=dict(alpha=-1)))), ["alpha"]),
    ],
)
def test_config_errors_exit_2_naming_the_key(tmp_path, overrides, needles):
    cfg = write_config(tmp_path / 'bad.py', APEX_CONFIG, log_dir=str(tmp_path / 'runs'), **overrides)
    r = cli('train', cfg, '--nproc', '3', cwd=tmp_path)
    assert_user_error(r.returncode, r.stderr, *needles)
    assert not (tmp_path / 'runs').exists()


@pytest.mark.slow
def test_without_nproc_or_a_launcher_it_says_how_to_launch(tmp_path):
    cfg = write_config(tmp_path / 'a.py', APEX_CONFIG, log_dir=str(tmp_path / 'runs'))
    r = cli('train', cfg, cwd=tmp_path)
    assert_user_error(r.returncode, r.stderr, '--nproc', 'torchrun')
    r = cli('train', cfg, '--nproc', '2', cwd=tmp_path)
    assert_user_error(r.returncode, r.stderr, 'at least 3')


def test_epsilon_ladder():
    from ding_buffer.train.apex import epsilon_ladder

    eps = [epsilon_ladder(i, 4, 0.4, 7.0) for i in range(4)]
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert eps == sorted(eps, reverse=True)
    assert epsilon_ladder(0, 1, 0.4, 7.0) == pytest.approx(0.4)


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-v']))

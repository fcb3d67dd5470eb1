"""Offline data in the DQN job: ``dataset_out`` writes a trained policy's episodes as a D4RL file that loads back
step by step; ``dataset_source`` makes a missing dataset first; the shipped offline-to-online config runs end to end
(shortened); bad settings are refused by name before anything runs."""

import json
import re

import numpy as np
import pytest
from train_helpers import CONFIG_DIR, write_config

from ding_buffer import create_buffer
from ding_buffer.cli import main
from ding_buffer.train.config import build_train_config

h5py = pytest.importorskip('h5py')

DATASET_CONFIG = CONFIG_DIR / 'cartpole_dqn_dataset.py'
O2O_CONFIG = CONFIG_DIR / 'cartpole_offline_to_online.py'
SHORT = dict(env=dict(max_env_step=300, eval_freq=300, eval_episodes=1))


def summary(run_dir):
    with open(run_dir / 'summary.json') as f:
        return json.load(f)


@pytest.mark.slow
def test_dataset_out_writes_the_trained_policys_episodes_and_they_load_back(tmp_path, capsys):
    path = tmp_path / 'episodes.hdf5'
    cfg = write_config(
        tmp_path / 'src.py',
        DATASET_CONFIG,
        SHORT,
        log_dir=str(tmp_path / 'runs'),
        policy=dict(learn=dict(warmup_steps=100, batch_size=16)),
        dataset_out=dict(path=str(path), episodes=3, epsilon=0.5),
    )
    assert main(['train', str(cfg), '--no-progress']) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    written = summary(tmp_path / 'runs' / 'cartpole_dqn_dataset_seed100')['dataset_out']
    assert written['episodes'] == 3 and f"dataset: 3 episodes, {written['steps']} steps" in out
    with h5py.File(path, 'r') as f:
        obs, nxt = f['observations'][:], f['next_observations'][:]
        ends = f['terminals'][:] | f['timeouts'][:]
        rewards = f['rewards'][:]
        assert len(obs) == written['steps'] and obs.shape[1:] == (4,) and obs.dtype == np.float32
        assert ends.sum() == 3 and ends[-1]  # three episodes, each ending in a terminal or a timeout
        inside = np.flatnonzero(~ends[:-1])
        assert np.array_equal(nxt[inside], obs[inside + 1])  # within an episode, next_obs is the next obs
        assert rewards.sum() == pytest.approx(written['return_mean'] * 3)
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=10_000, storage=dict(type='tensor'), dataset=dict(path=str(path)))
    )
    assert buf.count() == written['steps']  # every step (next_observations present: none dropped)
    stored = buf.sample(buf.count())
    order = stored['replay_unique_id'].argsort()
    assert np.array_equal(stored['obs'][order].numpy(), obs)
    buf.close()


@pytest.mark.slow
def test_the_offline_to_online_config_makes_its_dataset_first_then_fine_tunes(tmp_path, capsys, monkeypatch):
    """The shipped config, shortened: the dataset is missing, so its source trains and writes it; the fine-tuning run
    then samples half of every batch from it (learning starts, the offline member holds every stored step)."""
    monkeypatch.chdir(tmp_path)  # the configs' relative paths: the dataset file and the run directories
    source = write_config(
        tmp_path / 'src.py',
        DATASET_CONFIG,
        SHORT,
        policy=dict(learn=dict(warmup_steps=100, batch_size=16)),
        dataset_out=dict(episodes=2),
    )
    cfg = write_config(
        tmp_path / 'o2o.py',
        O2O_CONFIG,
        SHORT,
        policy=dict(learn=dict(warmup_steps=100, batch_size=16)),
        dataset_source=str(source),
    )
    assert main(['train', str(cfg), '--no-progress']) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "dataset 'cartpole_dqn_episodes.hdf5' does not exist yet: training" in out
    src = summary(tmp_path / 'cartpole_dqn_dataset_seed100')
    o2o = summary(tmp_path / 'cartpole_offline_to_online_seed0')
    assert (tmp_path / 'cartpole_dqn_episodes.hdf5').is_file() and src['dataset_out']['episodes'] == 2
    assert o2o['buffer_type'] == 'mixture' and o2o['train_iters'] == 201  # 300 env steps, learning from step 100
    assert o2o['buffer']['count'] == src['dataset_out']['steps'] + 300  # offline: the dataset; online: every step
    # a second run finds the dataset and trains no source
    assert main(['train', str(cfg), '--no-progress', '--seed', '1']) == 0, capsys.readouterr().err
    assert 'does not exist yet' not in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_fine_tuning_run_reads_no_dataset_file(tmp_path, capsys):
    """The checkpoint holds the whole buffer, the dataset's items included: a resume refused when the file had gone
    (and with a dataset_source would have trained the source again)."""
    from ding_buffer.datasets import write_d4rl

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(41, 4)).astype(np.float32)
    steps = dict(obs=obs[:-1], next_obs=obs[1:], action=rng.integers(0, 2, 40), reward=np.ones(40, np.float32))
    steps.update(done=np.arange(40) == 39, timeout=np.zeros(40, bool))
    data = tmp_path / 'ds.hdf5'
    assert write_d4rl(str(data), steps) == 40
    members = dict(offline=dict(dataset=dict(path=str(data))))
    cfg = write_config(
        tmp_path / 'o2o.py',
        O2O_CONFIG,
        dict(env=dict(max_env_step=200, eval_freq=200, eval_episodes=1)),
        log_dir=str(tmp_path / 'runs'),
        dataset_source=None,
        checkpoint=dict(freq=100),
        policy=dict(learn=dict(warmup_steps=50, batch_size=16), other=dict(replay_buffer=dict(members=members))),
    )
    assert main(['train', str(cfg), '--no-progress']) == 0, capsys.readouterr().err
    run = tmp_path / 'runs' / 'cartpole_offline_to_online_seed0'
    data.unlink()
    assert main(['train', str(cfg), '--no-progress', '--resume', str(run), '--env-steps', '300']) == 0, (
        capsys.readouterr().err
    )
    assert summary(run)['buffer']['count'] == 40 + 300  # the dataset's steps came back from the checkpoint


@pytest.mark.slow
def test_a_stop_while_the_dataset_source_trains_stops_the_whole_command(tmp_path):
    """Ctrl-C in the source run: it wrote its half-trained policy's episodes as the dataset, the fine-tuning ran on
    them anyway and the command exited 0. Now the command stops (130) with no dataset and no fine-tuning run; run
    again, it continues the source run from its checkpoint, which writes the file the fine-tuning reads (here not
    the source config's own dataset_out.path), and fine-tunes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    source = write_config(
        tmp_path / 'src.py',
        DATASET_CONFIG,
        dict(env=dict(max_env_step=1500, eval_freq=1500, eval_episodes=1)),
        policy=dict(learn=dict(warmup_steps=100, batch_size=16)),
        checkpoint=dict(freq=200),
        dataset_out=dict(episodes=2),
    )
    members = dict(offline=dict(dataset=dict(path='ft_data.hdf5')))
    cfg = write_config(
        tmp_path / 'o2o.py',
        O2O_CONFIG,
        SHORT,
        dataset_source=str(source),
        policy=dict(learn=dict(warmup_steps=100, batch_size=16), other=dict(replay_buffer=dict(members=members))),
    )
    command = [sys.executable, '-m', 'ding_buffer', 'train', str(cfg), '--no-progress']
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        checkpoints = tmp_path / 'cartpole_dqn_dataset_seed100' / 'checkpoints'
        while not (checkpoints.is_dir() and any(n.startswith('step_') for n in os.listdir(checkpoints))):
            assert proc.poll() is None, proc.stderr.read()  # (the source run ends by itself: no wait is endless)
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert not (tmp_path / 'ft_data.hdf5').exists() and not (tmp_path / 'cartpole_offline_to_online_seed0').exists()
    assert 'run this command again' in out and 'resume with' not in out, out
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert 'resumed from' in again.stdout and (tmp_path / 'ft_data.hdf5').is_file()
    assert summary(tmp_path / 'cartpole_dqn_dataset_seed100')['env_steps'] == 1500
    assert summary(tmp_path / 'cartpole_offline_to_online_seed0')['env_steps'] == 300


def test_a_missing_dataset_without_a_source_is_refused_naming_the_path(tmp_path, capsys):
    cfg = write_config(tmp_path / 'o2o.py', O2O_CONFIG, SHORT, log_dir=str(tmp_path / 'runs'), dataset_source=None)
    assert main(['train', str(cfg), '--no-progress']) == 2
    err = capsys.readouterr().err
    assert "dataset file 'cartpole_dqn_episodes.hdf5'" in err and "'dataset_source'" in err
    assert not (tmp_path / 'runs').exists()


def test_n_step_items_with_a_dataset_are_refused_by_name():
    members = dict(offline=dict(type='naive', dataset=dict(path='x.hdf5')), online=dict(type='naive'))
    buffer = dict(type='mixture', members=members)
    with pytest.raises(ValueError, match="'policy.nstep' is 3, but the buffer loads a dataset of one-step"):
        build_train_config(dict(policy=dict(nstep=3, other=dict(replay_buffer=buffer))))
    assert build_train_config(dict(policy=dict(nstep=1, other=dict(replay_buffer=buffer)))).policy.nstep == 1


@pytest.mark.parametrize(
    'key, value, needle',
    [
        ('dataset_out', dict(episodes=-1), "'dataset_out.episodes' has invalid value -1"),
        ('dataset_out', dict(epsilon=2.0), "'dataset_out.epsilon' has invalid value 2.0"),
        ('dataset_out', dict(path=''), "'dataset_out.path' has invalid value ''"),
        ('dataset_source', '', "'dataset_source' has invalid value ''"),
    ],
)
def test_bad_offline_settings_are_refused_by_name(key, value, needle):
    with pytest.raises(ValueError, match=needle):
        build_train_config({key: value, 'policy': dict(other=dict(replay_buffer=dict(type='naive')))})


def test_the_ape_x_job_takes_no_offline_keys():
    from ding_buffer.train.apex import APEX_DEFAULTS

    assert 'dataset_out' not in APEX_DEFAULTS and 'dataset_source' not in APEX_DEFAULTS


@pytest.mark.parametrize(
    'dataset, needle',
    [
        (dict(pth='x.hdf5'), "'policy.other.replay_buffer.members.offline.dataset.pth'.*did you mean"),
        (dict(path='x.hdf5', format='d5rl'), "'policy.other.replay_buffer.members.offline.dataset': format 'd5rl'"),
        (dict(path='x.hdf5', chunk_size=0), "'policy.other.replay_buffer.members.offline.dataset': chunk_size 0"),
    ],
)
def test_a_bad_dataset_section_is_refused_before_its_source_trains(tmp_path, capsys, dataset, needle):
    buffer = dict(
        type='mixture',
        weights=dict(offline=0.5, online=0.5),
        members=dict(offline=dict(type='naive', dataset=dataset), online=dict(type='naive')),
    )
    cfg = write_config(tmp_path / 'o2o.py', O2O_CONFIG, SHORT, log_dir=str(tmp_path / 'runs'), buffer=buffer)
    assert main(['train', str(cfg), '--no-progress']) == 2
    captured = capsys.readouterr()
    assert re.search(needle, captured.err), captured.err
    assert 'does not exist yet' not in captured.out and not (tmp_path / 'runs').exists()


def test_a_source_that_needs_the_dataset_it_writes_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the fine-tuning config names itself as the source (with dataset_out set): it would train itself forever
    cfg = tmp_path / 'o2o.py'
    write_config(cfg, O2O_CONFIG, SHORT, dataset_out=dict(episodes=2), dataset_source=str(cfg))
    assert main(['train', str(cfg), '--no-progress']) == 2
    assert "whose run needs the dataset 'cartpole_dqn_episodes.hdf5' it writes" in capsys.readouterr().err


@pytest.mark.parametrize(
    'user, key',
    [
        (dict(policy=[1]), "'policy' must be a dict"),
        (dict(policy=dict(other=5)), "'policy.other' must be a dict"),
        (dict(policy=dict(other=dict(replay_buffer=[1]))), "'policy.other.replay_buffer' must be a dict"),
    ],
)
def test_a_section_that_is_not_a_dict_is_named(user, key):
    """'cannot convert dictionary update sequence element #0' named neither the key nor the section."""
    with pytest.raises(ValueError, match=key):
        build_train_config(user)

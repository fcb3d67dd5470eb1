"""`ding-buffer train config/pong_dqn_per.py`: DQN + PER + 3-step returns on real Atari Pong with frames stored once,
end to end on the shipped config (budgets and checkpoint frequency shortened): it starts, fills, learns gradient
steps, checkpoints, and a resumed run continues from the checkpoint (its env restarts mid-episode: the buffer's
stream starts a new episode rather than refusing the reset frames)."""

import json
import os

import pytest
from train_helpers import CONFIG_DIR, cli, write_config

PONG = CONFIG_DIR / 'pong_dqn_per.py'


def _need_atari():
    try:
        import ale_py  # noqa: F401
        import cv2  # noqa: F401
    except ImportError as e:
        if os.environ.get('CI'):
            raise
        pytest.skip(f"the atari extra is not installed ({e})")


@pytest.mark.slow
def test_pong_short_run_learns_steps_checkpoints_and_resumes(tmp_path):
    _need_atari()
    cfg = write_config(
        tmp_path / 'pong.py',
        PONG,
        log_dir=str(tmp_path / 'runs'),
        env=dict(eval_freq=100_000, max_episode_steps=400),
        policy=dict(
            learn=dict(warmup_steps=400, target_update_freq=100),
            other=dict(replay_buffer=dict(replay_buffer_size=2_000)),
        ),
        checkpoint=dict(freq=800, keep=2),
    )
    first = cli('train', cfg, '--env-steps', 1200, '--no-progress', cwd=tmp_path, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run_dir = tmp_path / 'runs' / 'pong_dqn_per_seed0'
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['env_steps'] == 1200 and s['train_iters'] == (1200 - 400) // 4 + 1
    assert s['buffer']['count'] == 1200 and s['buffer']['updated'] > 0
    assert (run_dir / 'checkpoints' / 'step_000000800' / 'COMPLETE').exists()
    second = cli('train', cfg, '--resume', run_dir, '--env-steps', 1600, '--no-progress', cwd=tmp_path, timeout=400)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert 'resumed from' in second.stdout and 'at env step 1200' in second.stdout, second.stdout[-2000:]
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['env_steps'] == 1600 and s['buffer']['count'] == 1600 and s['train_iters'] > (1200 - 400) // 4


def test_the_trainers_own_n_step_is_refused_with_frames_naming_both_keys():
    """The trainer's n-step items are not one stream's consecutive steps (next_obs jumps n frames): with frames
    stored once the buffer builds the returns, and policy.nstep > 1 is refused before anything runs."""
    from ding_buffer.train.config import build_train_config, load_config_file

    user = load_config_file(str(PONG))
    user['policy']['nstep'] = 3
    with pytest.raises(ValueError, match=r"policy.nstep' is 3.*storage.frames.n_step=3"):
        build_train_config(user, source='pong')

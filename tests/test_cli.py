"""The `ding-buffer` command: the README's demo runs end to end; user errors exit 2 without a traceback."""
import os
import subprocess
import sys

import pytest

from ding_buffer.cli import main


def test_demo_runs_end_to_end_and_reports_round_trips(tmp_path):
    proc = subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'demo', '--out', str(tmp_path / 'out')],
        capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("next sample identical to the original's: True") == 2
    assert 'each window within one episode: True' in out
    assert 'episode lengths equal: True' in out
    assert sorted(os.listdir(tmp_path / 'out')) == ['episode_tensor.pt', 'naive_list.pt', 'naive_tensor.pt']
    assert sorted(os.listdir(tmp_path)) == ['out']  # nothing else in the working directory


def test_unknown_command_exits_with_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(['no-such-command'])
    assert e.value.code == 2


@pytest.mark.parametrize('threads', ['0', '-2', 'two', '1.5'])
def test_train_threads_below_one_is_a_usage_error(tmp_path, capsys, threads):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("main_config = dict(policy=dict(other=dict(replay_buffer=dict(type='naive'))))\n")
    with pytest.raises(SystemExit) as e:
        main(['train', str(cfg), '--threads', threads, '--no-progress'])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    assert f"argument --threads: expected an int >= 1 (torch CPU threads), got '{threads}'" in err, err
    assert os.listdir(tmp_path) == ['cfg.py']


def test_train_threads_zero_in_a_subprocess_exits_2_without_traceback(tmp_path):
    (tmp_path / 'cfg.py').write_text("main_config = dict(policy=dict(other=dict(replay_buffer=dict(type='naive'))))\n")
    proc = subprocess.run([sys.executable, '-m', 'ding_buffer', 'train', 'cfg.py', '--threads', '0'],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert '--threads' in proc.stderr and '>= 1' in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == ['cfg.py']

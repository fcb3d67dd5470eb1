"""The `ding-buffer` command: the README's demo runs end to end; user errors exit 2 with one line and no
traceback; ready configs by name; a first line before torch loads; signals stop a run with a final checkpoint."""

import ast
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ding_buffer.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_runs_end_to_end_and_reports_round_trips(tmp_path):
    proc = subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'demo', '--out', str(tmp_path / 'out')],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
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


@pytest.mark.slow
def test_train_threads_zero_in_a_subprocess_exits_2_without_traceback(tmp_path):
    (tmp_path / 'cfg.py').write_text("main_config = dict(policy=dict(other=dict(replay_buffer=dict(type='naive'))))\n")
    proc = subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'train', 'cfg.py', '--threads', '0'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert '--threads' in proc.stderr and '>= 1' in proc.stderr, proc.stderr
    assert os.listdir(tmp_path) == ['cfg.py']


# ------------------------------------------------------------------------------------------ every bad flag: exit 2
def _one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert 'Traceback' not in err and ': error: ' in lines[0], err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    'argv, needles',
    [
        (['train', 'CFG', '--seed', '-1'], ['--seed', '>= 0']),
        (['train', 'CFG', '--seed', 'abc'], ['--seed']),
        (['train', 'CFG', '--env-steps', '0'], ['--env-steps', '>= 1']),
        (['train', 'CFG', '--env-steps', '1e3'], ['--env-steps']),
        (['train', 'CFG', '--device', 'tpu'], ['--device', "'tpu'"]),
        (['train', 'CFG', '--device', 'mps'], ['--device', "'mps'", "'cpu', 'cuda' or 'cuda:N'"]),  # the key's rule
        (['train', 'CFG', '--device', 'cuda:x'], ['--device', "'cuda:x'"]),
        (['train', 'CFG', '--resume', 'no_such_run_dir'], ['--resume', 'no such directory']),
        (['train', 'CFG', '--resume', 'CFG'], ['--resume', 'a file']),
        (['train', 'CFG', '--nproc', '0'], ['--nproc']),
        (['train', 'CFG', '--iterations', '-4'], ['--iterations']),
        # beyond 2**60: no step counter (10**400 started the run, then its progress bar raised OverflowError)
        (['train', 'CFG', '--env-steps', '1' + '0' * 400], ['--env-steps', 'at most 1152921504606846976']),
        (['train', 'CFG', '--iterations', str(2**60 + 1)], ['--iterations', 'at most 1152921504606846976']),
        (['train', 'CFG', '--no-such-flag'], ['--no-such-flag']),
        (['train', '--env-stepz', '5', 'CFG'], ["did you mean '--env-steps' for '--env-stepz'"]),
        (['train', 'CFG', '--therads=2'], ["did you mean '--threads' for '--therads'"]),
        (['train', 'CFG', '--title', 'x'], ["'--title' is an option of 'ding-buffer plot' only"]),  # not "did you mean"
        (['train', 'cartpole_dqn_pr'], ["'cartpole_dqn_pr'", "did you mean 'cartpole_dqn_per'?"]),
        (['train', 'config/cartpole_apx.py'], ["did you mean 'cartpole_apex'?"]),
        (['train'], ['config']),
        (['train', 'no_such_config_name'], ["'no_such_config_name'", 'cartpole_dqn_per', 'ding-buffer configs']),
        (['train', 'CFG', '--iterations', '5'], ['--iterations', "'dqn'"]),
        (['demo', '--seed', '-3'], ['--seed']),
        (['demo', '--out', 'CFG'], ['--out', 'an existing file']),
        (['demo', '--out', 'CFG/sub'], ['--out', 'is a file']),
        (['train', 'CFG', '--threads', '100000'], ['--threads', 'at most']),
        (['train', 'advanced_buffer_config'], ['advanced_buffer_config', 'not a training config']),
        (['train', 'apex_distributed_config'], ['not a training config']),
        (['plot', '.', '--out', 'curves.txt'], ['--out', '.png']),
        (['plot', '.', '--out', '.'], ['--out']),
        (['no-such-command'], ['no-such-command']),
    ],
)
def test_every_bad_flag_exits_2_with_one_line_and_changes_nothing(tmp_path, capsys, argv, needles):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("main_config = dict(policy=dict(other=dict(replay_buffer=dict(type='naive'))))\n")
    argv = [a.replace('CFG', str(cfg)) for a in argv]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    finally:
        os.chdir(cwd)
    assert rc == 2
    _one_line_error(capsys.readouterr().err, *needles)
    assert os.listdir(tmp_path) == ['cfg.py']


@pytest.mark.parametrize('env', ["'CartPole-v1'", '[1, 2]'])
def test_env_steps_on_an_env_that_is_not_a_dict_names_the_config_key(tmp_path, capsys, env):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f"main_config = dict(env={env}, policy=dict(other=dict(replay_buffer=dict(type='naive'))))\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        try:
            rc = main(['train', str(cfg), '--env-steps', '5'])
        except SystemExit as e:
            rc = e.code
    finally:
        os.chdir(cwd)
    assert rc == 2
    _one_line_error(capsys.readouterr().err, "config key 'env'", 'expected dict')
    assert os.listdir(tmp_path) == ['cfg.py']


@pytest.mark.slow
def test_bad_flag_in_a_subprocess_is_one_line_without_usage_block(tmp_path):
    proc = subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'train', 'cartpole_dqn_per', '--device', 'gpu'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    _one_line_error(proc.stderr, '--device', "'gpu'")
    assert proc.stdout == '' and os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------ ready configs by name
def test_configs_lists_every_ready_config_with_its_job(capsys):
    from ding_buffer.ready_configs import list_configs

    assert main(['configs']) == 0
    out = capsys.readouterr().out
    found = {c.name: c for c in list_configs()}
    shipped = sorted(p.stem for p in (REPO / 'config').glob('*.py') if not p.stem.startswith('_'))
    assert sorted(found) == shipped
    assert found['cartpole_dqn_per'].job == 'dqn' and found['cartpole_apex'].job == 'apex'
    assert found['hypergrid_tb_gfn'].job == 'hypergrid' and found['naive_buffer_config'].job == '-'
    rows = {
        line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line.strip() and line.split()[0] in found
    }
    assert rows == {name: (c.job if c.job != '-' else 'buffer') for name, c in found.items()}
    # each description is the first paragraph of the config's docstring, whole (wrapped under its column)
    start = out.splitlines()[0].index('description')
    described, name = {}, None
    for line in out.splitlines()[1:]:
        if not line.strip() or line.startswith('job '):
            name = None
            continue
        if line[:start].strip():
            name = line.split()[0]
        if name in found:
            described[name] = (described.get(name, '') + ' ' + line[start:].strip()).strip()
    assert set(described) == set(found)
    for config_name, text in described.items():
        doc = ast.get_docstring(ast.parse(Path(found[config_name].path).read_text()))
        assert text == ' '.join(doc.strip().split('\n\n')[0].split()), config_name
        assert text.endswith(('.', ')')), (config_name, text)  # a whole sentence, not cut mid-way


@pytest.mark.parametrize('arg', ['cartpole_dqn_per', 'cartpole_dqn_per.py', 'config/cartpole_dqn_per.py'])
def test_a_ready_config_resolves_by_name_from_any_directory(tmp_path, arg):
    from ding_buffer.ready_configs import resolve_config

    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        path = resolve_config(arg)
    finally:
        os.chdir(cwd)
    assert os.path.samefile(path, REPO / 'config' / 'cartpole_dqn_per.py')


def test_an_existing_file_wins_over_a_ready_config_of_the_same_name(tmp_path):
    from ding_buffer.ready_configs import resolve_config

    own = tmp_path / 'cartpole_dqn_per.py'
    own.write_text("main_config = dict()\n")
    assert resolve_config(str(own)) == str(own)
    with pytest.raises(FileNotFoundError, match="'elsewhere/cartpole_dqn_per.py' does not exist"):
        resolve_config('elsewhere/cartpole_dqn_per.py')  # a path in another folder is not a name


# ------------------------------------------------------------------------------------------ start-up, clock
@pytest.mark.slow
def test_the_cli_module_loads_without_torch_so_the_first_line_comes_first():
    code = (
        "import sys, ding_buffer, ding_buffer.cli, ding_buffer.ready_configs\n"
        "print(sorted(m for m in ('torch', 'numpy', 'gymnasium') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '[]'


@pytest.mark.slow
def test_process_start_is_the_start_of_the_process_not_of_the_call():
    code = (
        "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.0: pass\n"
        "from ding_buffer.cli import process_start\nprint(time.monotonic() - process_start())"
    )
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    age = float(proc.stdout)
    assert 1.0 <= age < 60.0


# ------------------------------------------------------------------------------------------ signals, warm-up
def _small_dqn_config(tmp_path, **overrides):
    base = REPO / 'config' / 'cartpole_dqn_per.py'
    merged = dict(
        log_dir=str(tmp_path / 'runs'),
        env=dict(eval_freq=1000, eval_episodes=2),
        policy=dict(learn=dict(warmup_steps=200)),
        checkpoint=dict(freq=300),
    )
    for k, v in overrides.items():
        merged[k] = dict(merged.get(k, {}), **v) if isinstance(v, dict) else v
    path = tmp_path / 'small.py'
    path.write_text(
        f"import runpy\nmain_config = runpy.run_path({str(base)!r})['main_config']\n"
        "def _merge(d, u):\n    for k, v in u.items():\n"
        "        if isinstance(v, dict) and isinstance(d.get(k), dict):\n            _merge(d[k], v)\n"
        "        else:\n            d[k] = v\n"
        f"_merge(main_config, {merged!r})\n"
    )
    return path


def _wait_for_checkpoint(proc, ck_dir, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ck_dir.is_dir() and any(n.startswith('step_') for n in os.listdir(ck_dir)):
            return
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no checkpoint appeared in {ck_dir} (exit {proc.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize('sig, code', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_training_with_a_final_checkpoint_and_the_resume_command(tmp_path, sig, code):
    cfg = _small_dqn_config(tmp_path)
    run_dir = tmp_path / 'runs' / 'cartpole_dqn_per_seed3'
    proc = subprocess.Popen(
        [
            sys.executable,
            '-m',
            'ding_buffer',
            'train',
            str(cfg),
            '--seed',
            '3',
            '--env-steps',
            '200000',
            '--no-progress',
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_checkpoint(proc, run_dir / 'checkpoints')
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert 'Traceback' not in err
    summary = json.loads((run_dir / 'summary.json').read_text())
    stopped_at = summary['env_steps']
    assert summary['stopped_early'] and 300 <= stopped_at < 200000
    steps = sorted(int(n.split('_')[1]) for n in os.listdir(run_dir / 'checkpoints') if n.startswith('step_'))
    assert steps[-1] == stopped_at  # the final checkpoint is of the step it stopped at
    resume = [line for line in out.splitlines() if line.startswith('resume with: ')]
    assert len(resume) == 1, out
    argv = shlex.split(resume[0][len('resume with: ') :])
    assert argv[:3] == ['ding-buffer', 'train', str(cfg)]
    assert argv[argv.index('--seed') + 1] == '3' and argv[argv.index('--env-steps') + 1] == '200000'
    assert os.path.samefile(argv[argv.index('--resume') + 1], run_dir)
    if sig == signal.SIGINT:  # the printed command continues the run (to a nearer end, for time)
        argv[argv.index('--env-steps') + 1] = str(stopped_at + 300)
        proc = subprocess.run(
            [sys.executable, '-m', 'ding_buffer', *argv[1:], '--no-progress'],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert 'resumed from' in proc.stdout and f'at env step {stopped_at}' in proc.stdout
        summary = json.loads((run_dir / 'summary.json').read_text())
        assert summary['env_steps'] == stopped_at + 300 and not summary['stopped_early']


def _train_quietly(cfg, cwd, env_steps: int):
    """``ding-buffer train CFG --env-steps N --no-progress`` in a subprocess (2 minutes at most)."""
    return subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'train', str(cfg), '--env-steps', str(env_steps), '--no-progress'],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_warmup_at_or_past_the_last_env_step_warns(tmp_path):
    cfg = _small_dqn_config(tmp_path, policy=dict(learn=dict(warmup_steps=1000)), checkpoint=dict(freq=None))
    proc = _train_quietly(cfg, tmp_path, 400)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if 'warning' in line]
    assert len(warning) == 1 and 'warmup_steps (1000) >= env.max_env_step (400)' in warning[0], proc.stderr
    assert 'gradient steps 0' in proc.stdout
    assert proc.stdout.splitlines()[0].startswith(f'ding-buffer train {cfg}: a new run')


@pytest.mark.slow
@pytest.mark.parametrize('warmup, env_steps, train_freq', [(302, 302, 4), (201, 203, 4), (300, 300, 1)])
def test_the_warmup_warning_counts_the_gradient_steps_that_run(tmp_path, warmup, env_steps, train_freq):
    """The warning's count bounds the gradient steps the run makes: learning happens only at env steps that
    are multiples of train_freq (302 with 4: none; 300 with 1: the last step); 201 to 203 with 4 trains nothing
    either, though the warm-up ends before the last step."""
    learn = dict(warmup_steps=warmup, train_freq=train_freq, updates_per_step=1)
    cfg = _small_dqn_config(tmp_path, policy=dict(learn=learn), checkpoint=dict(freq=None))
    proc = _train_quietly(cfg, tmp_path, env_steps)
    assert proc.returncode == 0, proc.stderr
    ran = int(re.search(r'gradient steps (\d+)', proc.stdout).group(1))
    warning = [line for line in proc.stderr.splitlines() if 'warning' in line]
    assert ran == (1 if train_freq == 1 else 0) and len(warning) == 1, (ran, proc.stderr)
    assert (f'at most {ran} gradient step will run' if ran else 'no gradient steps will run') in warning[0]


@pytest.mark.slow
def test_env_steps_on_a_config_whose_env_is_none_trains_with_the_default_env(tmp_path):
    """``env=None`` in a config means the default env section; ``--env-steps`` then sets its length (it raised a
    TypeError)."""
    cfg = _small_dqn_config(tmp_path, env=None, policy=dict(learn=dict(warmup_steps=1000)), checkpoint=dict(freq=None))
    proc = _train_quietly(cfg, tmp_path, 300)
    assert proc.returncode == 0, proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr
    assert 'env steps 300' in proc.stdout, proc.stdout


def test_ctrl_c_of_a_distributed_job_names_its_newest_checkpoint_and_the_resume_command(tmp_path, capsys):
    """The launcher of `--nproc` jobs after Ctrl-C ended every rank (the ranks checkpoint every checkpoint.freq;
    the manager holding the buffer got the signal too, so no final one)."""
    import argparse

    from ding_buffer.train.launch import interrupted

    args = argparse.Namespace(
        config='/cfg/cartpole_apex.py',
        config_arg='cartpole_apex',
        seed=2,
        env_steps=None,
        device=None,
        iterations=None,
        nproc=4,
        threads=1,
    )
    run_dir = tmp_path / 'cartpole_apex_seed2'
    interrupted(args, str(run_dir))
    assert 'before the first checkpoint' in capsys.readouterr().out
    for step, complete in ((100, True), (200, True), (300, False)):  # 300: a checkpoint cut short
        d = run_dir / 'checkpoints' / f'step_{step:09d}'
        d.mkdir(parents=True)
        if complete:
            (d / 'COMPLETE').write_text('{}')
    interrupted(args, str(run_dir))
    out = capsys.readouterr().out
    assert f"newest complete checkpoint is {run_dir / 'checkpoints' / 'step_000000200'}" in out
    resume = [line for line in out.splitlines() if line.startswith('resume with: ')]
    assert shlex.split(resume[0][len('resume with: ') :]) == [
        'ding-buffer',
        'train',
        'cartpole_apex',
        '--seed',
        '2',
        '--nproc',
        '4',
        '--resume',
        str(run_dir),
    ]


def test_a_config_file_need_not_end_in_py(tmp_path):
    from ding_buffer.train.config import load_config_file

    path = tmp_path / 'my.cfg'
    path.write_text("main_config = dict(seed=3)\n")
    assert load_config_file(str(path)) == {'seed': 3}
    (tmp_path / 'j.txt').write_text("main_config = dict(job=[1])\n")
    assert main(['train', str(tmp_path / 'j.txt')]) == 2  # a non-str job is a config error, not a crash


def test_a_second_signal_while_the_final_checkpoint_is_written_is_held():
    from ding_buffer.train.signals import StopSignals

    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.requested and stop.signame == 'SIGTERM'
        with stop.holding():
            os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt outside holding()
            time.sleep(0.05)
        assert stop.exit_code == 143  # the first signal decides
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)


def test_the_first_training_run_says_that_numba_compiles_the_kernels(tmp_path, monkeypatch):
    """A newcomer's first run spends about half a minute compiling: the command says so, and only while numba's
    cache beside the package holds no compiled kernel."""
    import ding_buffer.cli as cli

    pytest.importorskip('numba')
    monkeypatch.delenv('DING_BUFFER_NO_NUMBA', raising=False)
    monkeypatch.delenv('NUMBA_CACHE_DIR', raising=False)
    monkeypatch.setattr(cli, '__file__', str(tmp_path / 'cli.py'))
    assert not cli._kernels_cached()  # no cache folder yet
    (tmp_path / '__pycache__').mkdir()
    (tmp_path / '__pycache__' / 'sampling._first_distinct_loop-50.py311.nbi').write_text('')
    assert not cli._kernels_cached()  # not the tree kernels
    (tmp_path / '__pycache__' / 'tree_kernels._combine-24.py311.nbi').write_text('')
    assert cli._kernels_cached()
    monkeypatch.setenv('DING_BUFFER_NO_NUMBA', '1')
    (tmp_path / '__pycache__' / 'tree_kernels._combine-24.py311.nbi').unlink()
    assert cli._kernels_cached()  # nothing will compile


def test_a_typo_is_matched_against_the_named_subcommands_own_flags(tmp_path, capsys):
    """'--sed' after `plot` suggested `--seed`, a flag `plot` then refuses too; `train CFG --titel` suggested
    `plot`'s `--title`. Only the subcommand's own flags are suggested; another's is named as its own."""
    cases = [
        (['plot', str(tmp_path), '--sed', '1'], None),
        (['train', 'cartpole_dqn_per', '--titel', 'x'], None),
        (['train', 'cartpole_dqn_per', '--sed', '1'], "did you mean '--seed' for '--sed'?"),
    ]
    for argv, hint in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count('\n') == 1, err
        if hint is None:
            assert 'did you mean' not in err, err
        else:
            assert hint in err, err


def test_a_directory_given_as_the_config_is_named_a_directory(tmp_path):
    from ding_buffer.ready_configs import resolve_config

    with pytest.raises(FileNotFoundError, match=f"config file '{tmp_path}' is a directory, not a config file,"):
        resolve_config(str(tmp_path))

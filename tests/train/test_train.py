"""`ding-buffer train` / `ding-buffer plot`: a short DQN run learns CartPole and writes its artefacts, runs resume
from their checkpoints with identical counters (also after SIGKILL in the middle of a checkpoint, and past a
damaged newest checkpoint), user errors exit 2 with a message naming the file and key (no traceback), and the
n-step / checkpoint building blocks behave as documented.

Every run lives in ``tmp_path``: the config files written here load a shipped config and override a few keys
(``log_dir``, small budgets), so the shipped files are what is exercised.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import (
    CONFIG_DIR,
    ENV,
    LEARNED_RETURN,
    PNG_MAGIC,
    assert_user_error,
    cli,
    cli_cmd,
    read_csv,
    write_config,
)

from ding_buffer.cli import main
from ding_buffer.train import TRAIN_DEFAULTS, build_train_config
from ding_buffer.train import checkpoint as ckpt
from ding_buffer.train.dqn import NStep

UNIFORM_CONFIG = CONFIG_DIR / 'cartpole_dqn_uniform.py'


# ---------------------------------------------------------------------------------------------------- helpers
def trainer_counters(step_dir) -> dict:
    return torch.load(os.path.join(step_dir, 'trainer.pt'), weights_only=True)['counters']


def temporaries(ck_dir: Path):
    return sorted(n for n in os.listdir(ck_dir) if n.startswith('.tmp-')) if ck_dir.is_dir() else []


# ---------------------------------------------------------------------------------------------------- end to end
E2E_STEPS, E2E_EVAL_FREQ, E2E_WARMUP, E2E_CKPT_FREQ = 4000, 1000, 500, 2000


@pytest.fixture(scope='module')
def e2e_runs(tmp_path_factory):
    """Two short PER runs (seeds 0 and 1, run side by side): {seed: (run_dir, CompletedProcess-like)}."""
    root = tmp_path_factory.mktemp('e2e')
    cfg = write_config(
        root / 'per.py',
        log_dir=str(root / 'runs'),
        env=dict(max_env_step=E2E_STEPS, eval_freq=E2E_EVAL_FREQ),
        policy=dict(learn=dict(warmup_steps=E2E_WARMUP)),
        checkpoint=dict(freq=E2E_CKPT_FREQ),
    )
    procs = {
        seed: subprocess.Popen(
            cli_cmd('train', cfg, '--seed', seed, '--no-progress'),
            cwd=root,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (0, 1)
    }
    out = {}
    try:
        for seed, p in procs.items():
            stdout, stderr = p.communicate(timeout=150)
            out[seed] = (root / 'runs' / f'cartpole_dqn_per_seed{seed}', p.returncode, stdout, stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    out['config'] = cfg
    return out


@pytest.mark.slow
@pytest.mark.parametrize('seed', [0, 1])
def test_short_run_learns_and_writes_its_artefacts(e2e_runs, seed):
    run_dir, rc, out, err = e2e_runs[seed]
    assert rc == 0, err
    assert 'Traceback' not in err
    # the summary is printed
    assert f"== cartpole_dqn_per (seed {seed}, advanced buffer) ==" in out
    assert f"env steps {E2E_STEPS}, gradient steps {E2E_STEPS - E2E_WARMUP + 1}" in out
    assert 'eval return: best' in out and f"run dir: {run_dir} (TensorBoard" in out
    assert sorted(os.listdir(run_dir)) == [
        'checkpoints',
        'eval.csv',
        'learning_curve.png',
        'log',
        'run.json',
        'summary.json',
    ]

    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['exp_name'] == 'cartpole_dqn_per' and summary['seed'] == seed
    assert summary['buffer_type'] == 'advanced'
    assert summary['env_steps'] == E2E_STEPS
    assert summary['train_iters'] == E2E_STEPS - E2E_WARMUP + 1  # one gradient step per env step after warmup
    assert summary['resumed_from'] is None
    # the pipeline learns: clearly above a random policy (~22)
    assert summary['best_eval_return'] > LEARNED_RETURN, summary
    assert summary['buffer']['count'] > 0 and summary['buffer']['sample_calls'] == summary['train_iters']

    rows = read_csv(run_dir / 'eval.csv')
    assert list(rows[0]) == [
        'env_step',
        'train_iter',
        'return_mean',
        'return_std',
        'wall_time',
        'return_min',
        'return_max',
    ]
    assert all(float(r['return_min']) <= float(r['return_mean']) <= float(r['return_max']) for r in rows), rows
    steps = [int(float(r['env_step'])) for r in rows]
    assert steps == list(range(E2E_EVAL_FREQ, E2E_STEPS + 1, E2E_EVAL_FREQ))  # increasing, one per eval_freq
    iters = [int(float(r['train_iter'])) for r in rows]
    assert iters == sorted(iters) and iters[-1] == summary['train_iters']
    assert max(float(r['return_mean']) for r in rows) == pytest.approx(summary['best_eval_return'])
    assert float(rows[-1]['return_mean']) == pytest.approx(summary['final_eval_return'])

    png = (run_dir / 'learning_curve.png').read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000

    events = list((run_dir / 'log').glob('events.out.tfevents.*'))
    assert len(events) == 1 and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / 'log'), size_guidance={'scalars': 0})
    acc.Reload()
    tags = set(acc.Tags()['scalars'])
    for tag in (
        'eval/return_mean',
        'train/loss',
        'train/epsilon',
        'train/episode_return',
        'buffer_iter/priority_avg',
        'buffer_iter/beta',
        'buffer_step/use_avg',
        'buffer_step/staleness_max',
    ):
        assert tag in tags, sorted(tags)
    evals = acc.Scalars('eval/return_mean')
    assert [e.step for e in evals] == steps
    assert [e.value for e in evals] == pytest.approx([float(r['return_mean']) for r in rows])
    eps = acc.Scalars('train/epsilon')
    assert eps[0].value == pytest.approx(1.0, abs=0.05) and all(a.value >= b.value for a, b in zip(eps, eps[1:]))

    # checkpoints: the periodic one at 2000 and the final one, each complete and loadable
    ck = run_dir / 'checkpoints'
    assert sorted(os.listdir(ck)) == ['step_000002000', 'step_000004000']
    for name in os.listdir(ck):
        assert sorted(os.listdir(ck / name)) == ['COMPLETE', 'buffer.pt', 'trainer.pt']
    c = trainer_counters(ck / 'step_000004000')
    assert c['env_step'] == E2E_STEPS and c['train_iter'] == summary['train_iters']
    assert c['episodes'] == summary['episodes']


def scalar_steps(run_dir):
    """Each TensorBoard scalar tag of the run's ``log/`` and its steps, in the order TensorBoard shows them (what a
    later session's start purges is gone)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / 'log'), size_guidance={'scalars': 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()['scalars']}


def repeated_steps(steps, prefixes=('',)):
    """The tags (of those starting with one of ``prefixes``) whose steps do not strictly increase."""
    return {t: s for t, s in steps.items() if t.startswith(prefixes) and any(b <= a for a, b in zip(s, s[1:]))}


@pytest.mark.slow
def test_seeded_runs_differ(e2e_runs):
    """--seed reaches the run: seeds 0 and 1 go to their own directories and produce different curves."""
    a, b = (read_csv(e2e_runs[s][0] / 'eval.csv') for s in (0, 1))
    assert [r['return_mean'] for r in a] != [r['return_mean'] for r in b]


# ---------------------------------------------------------------------------------------------------- resume
@pytest.mark.slow
def test_resume_continues_from_the_checkpoint_with_identical_counters(tmp_path, capsys):
    cfg = write_config(
        tmp_path / 'per.py',
        log_dir=str(tmp_path / 'runs'),
        env=dict(max_env_step=2000, eval_freq=500, eval_episodes=3),
        policy=dict(learn=dict(warmup_steps=500)),
        checkpoint=dict(freq=1000, keep=2),
    )
    run_dir = tmp_path / 'runs' / 'cartpole_dqn_per_seed0'
    first = cli('train', cfg, '--no-progress', cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    ck = run_dir / 'checkpoints'
    assert sorted(os.listdir(ck)) == ['step_000001000', 'step_000002000']  # periodic + final
    state = torch.load(ck / 'step_000002000' / 'trainer.pt', weights_only=True)
    c = state['counters']
    first_summary = json.loads((run_dir / 'summary.json').read_text())
    assert (c['env_step'], c['train_iter'], c['episodes']) == (
        2000,
        first_summary['train_iters'],
        first_summary['episodes'],
    )
    rows_before = read_csv(run_dir / 'eval.csv')
    assert [r['env_step'] for r in rows_before] == ['500', '1000', '1500', '2000']

    # in process: a resumed trainer holds exactly the checkpoint's counters, weights, evals and buffer
    from ding_buffer.train.config import build_train_config, load_config_file
    from ding_buffer.train.dqn import DQNTrainer

    rng_state = torch.get_rng_state()
    trainer = DQNTrainer(
        build_train_config(load_config_file(str(cfg)), source=str(cfg)), str(run_dir), resume=True, progress=False
    )
    try:
        assert trainer.resumed_from == str(ck / 'step_000002000')
        assert (trainer.env_step, trainer.train_iter, trainer.episodes) == (
            c['env_step'],
            c['train_iter'],
            c['episodes'],
        )
        assert trainer.evals == state['evals']
        assert list(trainer.recent_returns) == state['recent_returns']
        for k, v in trainer.net.state_dict().items():
            assert torch.equal(v, state['net'][k]), k
        assert trainer.buffer.count() == first_summary['buffer']['count']
    finally:
        trainer.buffer.close()
        trainer.tb.close()
        torch.set_rng_state(rng_state)

    second = cli('train', cfg, '--resume', run_dir, '--env-steps', 3000, '--no-progress', cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"resumed from {ck / 'step_000002000'} at env step 2000" in second.stdout
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['env_steps'] == 3000 and s['resumed_from'] == str(ck / 'step_000002000')
    assert s['train_iters'] == c['train_iter'] + 1000  # the counter went on from the checkpoint's
    assert s['episodes'] > c['episodes']
    rows = read_csv(run_dir / 'eval.csv')
    assert rows[:4] == rows_before  # earlier rows unchanged
    assert [r['env_step'] for r in rows] == ['500', '1000', '1500', '2000', '2500', '3000']
    assert int(float(rows[4]['train_iter'])) == c['train_iter'] + 500
    assert sorted(os.listdir(ck)) == ['step_000002000', 'step_000003000']  # keep=2
    c3 = trainer_counters(ck / 'step_000003000')
    assert c3['env_step'] == 3000 and c3['train_iter'] == s['train_iters'] and c3['episodes'] == s['episodes']
    steps = scalar_steps(run_dir)  # every curve goes on: one point a step (buffer_sec/* included)
    assert 'buffer_sec/pushed_in' in steps and not repeated_steps(steps), repeated_steps(steps)

    # a new run (no --resume) into a directory that holds checkpoints is refused, nothing is touched
    assert main(['train', str(cfg), '--no-progress', '--threads', str(torch.get_num_threads())]) == 2
    assert_user_error(2, capsys.readouterr().err, str(run_dir), '--resume')
    assert sorted(os.listdir(ck)) == ['step_000002000', 'step_000003000']
    assert read_csv(run_dir / 'eval.csv') == rows


@pytest.mark.slow
def test_resume_of_a_directory_without_checkpoints_exits_2(tmp_path):
    cfg = write_config(tmp_path / 'per.py', log_dir=str(tmp_path / 'runs'))
    empty = tmp_path / 'empty_run'
    empty.mkdir()
    proc = cli('train', cfg, '--resume', empty, '--no-progress', cwd=tmp_path)
    assert_user_error(proc.returncode, proc.stderr, '--resume', str(empty), 'no complete checkpoint')
    assert not (empty / 'checkpoints').exists()


@pytest.mark.slow
def test_resume_of_a_missing_directory_leaves_nothing_behind(tmp_path):
    cfg = write_config(tmp_path / 'per.py', log_dir=str(tmp_path / 'runs'))
    typo = tmp_path / 'no_such_run'
    proc = cli('train', cfg, '--resume', typo, '--no-progress', cwd=tmp_path)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()  # a flag error: one line, before anything is loaded
    assert line.startswith('ding-buffer train: error: argument --resume:') and str(typo) in line
    assert 'no such directory' in line
    assert not typo.exists(), sorted(str(p.relative_to(tmp_path)) for p in typo.rglob('*'))


@pytest.mark.slow
def test_a_run_directory_another_trainer_holds_is_refused(tmp_path):
    """Two trainers in one run directory (a resume while the run still goes on, two runs started together) both
    trained and published checkpoints of the same steps over each other: the second one is refused, touching
    nothing. (A process standing for the first trainer holds the directory's lock, as a running one does.)"""
    cfg = write_config(tmp_path / 'per.py', log_dir=str(tmp_path / 'runs'))
    run_dir = tmp_path / 'runs' / 'cartpole_dqn_per_seed0'
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            '-c',
            'import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); '
            'fcntl.flock(fd, fcntl.LOCK_EX); print("held", flush=True); time.sleep(120)',
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == 'held'
        proc = cli('train', cfg, '--no-progress', cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert_user_error(proc.returncode, proc.stderr, str(run_dir), 'is in use by another `ding-buffer train`')
    assert os.listdir(run_dir) == []


@pytest.mark.slow
def test_a_run_directory_the_filesystem_cannot_lock_still_trains(tmp_path, monkeypatch, caplog):
    """NFS refuses an exclusive lock on a directory opened read-only (EBADF), Lustre without -o flock has none
    (ENOSYS): such a failure is no other trainer, and the run goes on (with a warning) instead of being refused."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.EBADF, 'Bad file descriptor')

    monkeypatch.setattr(fcntl, 'flock', no_locks)
    cfg = write_config(tmp_path / 'per.py', log_dir=str(tmp_path / 'runs'), env=dict(max_env_step=300, eval_freq=300))
    assert main(['train', str(cfg), '--no-progress', '--threads', str(torch.get_num_threads())]) == 0
    assert 'cannot be locked' in caplog.text


# ---------------------------------------------------------------------------------------------------- crash safety
KILL_WARMUP = 500


def _kill_during_checkpoint(proc, ck_dir: Path, after_step: int, phase: str, timeout: float = 20.0):
    """Poll ``ck_dir`` until ``proc`` writes a checkpoint of a step > ``after_step`` and SIGKILL it at once
    (``phase='any'``), or while it writes the checkpoint's ``buffer.pt`` (``phase='buffer'``).
    After ``timeout`` seconds without such a moment it is killed wherever it is.
    Returns (step being written or None, {temporary of ``proc`` left after the kill: its files})."""
    deadline = time.monotonic() + timeout
    step = None
    while step is None and time.monotonic() < deadline:
        assert proc.poll() is None, f"training exited early with {proc.returncode}"
        try:
            names = os.listdir(ck_dir)
        except FileNotFoundError:
            names = []
        for n in names:
            if not (n.startswith('.tmp-step_') and n.endswith(f'-{proc.pid}')):  # not a leftover of a killed run
                continue
            s = int(n[len('.tmp-step_') :].split('-')[0])
            if s <= after_step:
                continue
            if phase == 'buffer':
                try:
                    files = os.listdir(ck_dir / n)
                except FileNotFoundError:
                    continue
                if not any(f.startswith('.buffer.pt.') for f in files):
                    continue
            step = s
            break
        else:
            time.sleep(0.0002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return step, {t: sorted(os.listdir(ck_dir / t)) for t in temporaries(ck_dir) if t.endswith(f'-{proc.pid}')}


@pytest.mark.slow
def test_sigkill_while_checkpointing_then_resume(tmp_path):
    cfg = write_config(
        tmp_path / 'per.py',
        log_dir=str(tmp_path / 'runs'),
        env=dict(max_env_step=10**6, eval_freq=10**6, eval_episodes=2),
        policy=dict(learn=dict(warmup_steps=KILL_WARMUP), other=dict(replay_buffer=dict(replay_buffer_size=100_000))),
        checkpoint=dict(freq=500, keep=2),
    )
    run_dir = tmp_path / 'runs' / 'cartpole_dqn_per_seed0'
    ck = run_dir / 'checkpoints'
    caught, log = set(), []
    latest = 500  # the first kill waits for a checkpoint after step 500, so one complete checkpoint exists
    for attempt, phase in enumerate(['any', 'buffer', 'buffer', 'any', 'buffer']):
        cmd = (
            cli_cmd('train', cfg, '--no-progress')
            if attempt == 0
            else cli_cmd('train', cfg, '--resume', run_dir, '--no-progress')
        )
        with open(tmp_path / f'out{attempt}.txt', 'w') as out:
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=out, stderr=subprocess.STDOUT)
            try:
                step, left = _kill_during_checkpoint(proc, ck, after_step=latest, phase=phase)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        text = (tmp_path / f'out{attempt}.txt').read_text()
        assert 'Traceback' not in text, text
        if attempt:  # the resumed process started from the latest complete checkpoint
            assert f"resumed from {ck / f'step_{latest:09d}'} at env step {latest}" in text, text
        complete = ckpt.complete_checkpoints(str(ck))
        assert complete, "no complete checkpoint survived the kill"
        in_the_act = step is not None and f'.tmp-step_{step:09d}-{proc.pid}' in left
        if in_the_act:  # the interrupted checkpoint was not published; the previous ones are intact
            caught.add(phase)
            assert complete[-1][0] < step
        log.append(dict(phase=phase, step=step, in_the_act=in_the_act, left=left, complete=[s for s, _ in complete]))
        latest = complete[-1][0]
        if caught == {'any', 'buffer'}:
            break
    print(f"\nSIGKILL rounds: {log}")
    assert caught, f"never killed in the middle of a checkpoint: {log}"

    final = cli('train', cfg, '--resume', run_dir, '--env-steps', latest + 500, '--no-progress', cwd=tmp_path)
    assert final.returncode == 0, final.stderr
    assert f"resumed from {ck / f'step_{latest:09d}'} at env step {latest}" in final.stdout
    assert temporaries(ck) == []
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['env_steps'] == latest + 500
    # counters survived every kill: one gradient step per env step after warmup, no more, no less
    assert s['train_iters'] == latest + 500 - KILL_WARMUP + 1
    assert [step for step, _ in ckpt.complete_checkpoints(str(ck))] == [latest, latest + 500]
    c = trainer_counters(ck / f'step_{latest + 500:09d}')
    assert (c['env_step'], c['train_iter'], c['episodes']) == (s['env_steps'], s['train_iters'], s['episodes'])


@pytest.mark.slow
def test_resume_falls_back_when_the_newest_buffer_file_is_truncated(e2e_runs, tmp_path):
    src = e2e_runs[0][0]
    run_dir = tmp_path / src.name
    shutil.copytree(src, run_dir)
    newest = run_dir / 'checkpoints' / 'step_000004000' / 'buffer.pt'
    size = newest.stat().st_size
    with open(newest, 'r+b') as f:
        f.truncate(size // 2)
    rows_before = read_csv(run_dir / 'eval.csv')
    c2 = trainer_counters(run_dir / 'checkpoints' / 'step_000002000')
    proc = cli('train', e2e_runs['config'], '--resume', run_dir, '--env-steps', 2500, '--no-progress', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000002000'} at env step 2000" in proc.stdout
    s = json.loads((run_dir / 'summary.json').read_text())
    assert s['env_steps'] == 2500 and s['train_iters'] == c2['train_iter'] + 500
    rows = read_csv(run_dir / 'eval.csv')
    assert rows[:2] == rows_before[:2]  # rows up to the checkpoint kept, the later ones dropped
    assert [r['env_step'] for r in rows] == ['1000', '2000', '2500']
    # TensorBoard hides what the first run logged after the checkpoint on the env-step curves
    steps = scalar_steps(run_dir)
    assert 2400 < max(steps['train/loss']) <= 2500 and max(steps['eval/return_mean']) == 2500
    assert not repeated_steps(steps, ('train/', 'eval/', 'buffer_step/')), repeated_steps(steps)


@pytest.mark.slow
def test_a_resume_from_an_older_checkpoint_hides_nothing_logged_before_it(tmp_path):
    """Four gradient steps an env step: the learner-iteration curves (buffer_iter/*) run ahead of the env steps, and
    what the stopped run logged on them before the checkpoint stays; nothing after both of its x-axes does."""
    cfg = write_config(
        tmp_path / 'per.py',
        log_dir=str(tmp_path / 'runs'),
        env=dict(max_env_step=1500, eval_freq=500, eval_episodes=1),
        policy=dict(learn=dict(warmup_steps=200, updates_per_step=4)),
        checkpoint=dict(freq=500, keep=3),
    )
    run_dir = tmp_path / 'runs' / 'cartpole_dqn_per_seed0'
    assert cli('train', cfg, '--no-progress', cwd=tmp_path).returncode == 0
    first = scalar_steps(run_dir)
    shutil.rmtree(run_dir / 'checkpoints' / 'step_000001500')  # killed after logging up to 1500
    c = trainer_counters(run_dir / 'checkpoints' / 'step_000001000')
    assert c['train_iter'] > c['env_step']
    proc = cli('train', cfg, '--resume', run_dir, '--env-steps', 1500, '--no-progress', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = scalar_steps(run_dir)
    for tag in ('buffer_iter/beta', 'train/loss', 'buffer_step/use_avg'):
        axis = c['train_iter'] if tag.startswith('buffer_iter') else c['env_step']
        assert [s for s in steps[tag] if s <= axis] == [s for s in first[tag] if s <= axis], tag
    assert not repeated_steps(steps, ('buffer_iter/',)), repeated_steps(steps)


@pytest.mark.slow
def test_resume_falls_back_when_the_newest_trainer_file_is_empty(e2e_runs, tmp_path):
    run_dir = tmp_path / e2e_runs[0][0].name
    shutil.copytree(e2e_runs[0][0], run_dir)
    (run_dir / 'checkpoints' / 'step_000004000' / 'trainer.pt').write_bytes(b'')
    proc = cli('train', e2e_runs['config'], '--resume', run_dir, '--env-steps', 2500, '--no-progress', cwd=tmp_path)
    assert 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000002000'} at env step 2000" in proc.stdout


# ---------------------------------------------------------------------------------------------------- bad input
GOOD_BUFFER = "policy=dict(other=dict(replay_buffer=dict(type='naive')))"


@pytest.mark.parametrize(
    'name, text, extra, needles',
    [
        ('syntax', "main_config = dict(env=dict(\n", [], ['SyntaxError']),
        ('no_main', "x = 1\n", [], ['main_config']),
        ('not_a_dict', "main_config = [1, 2]\n", [], ['main_config', 'list']),
        ('crash', "raise RuntimeError('boom in config')\n", [], ['RuntimeError', 'boom in config']),
        (
            'unknown_key',
            f"main_config = dict(env=dict(max_env_stp=10), {GOOD_BUFFER})\n",
            [],
            ["'env.max_env_stp'", "'env.max_env_step'"],
        ),
        ('unknown_section', f"main_config = dict(polcy=dict(), {GOOD_BUFFER})\n", [], ["'polcy'", "'policy'"]),
        (
            'bad_value',
            "main_config = dict(policy=dict(learn=dict(batch_size=0), other=dict(replay_buffer=dict(type='naive'))))\n",
            [],
            ["'policy.learn.batch_size'", 'invalid value 0'],
        ),
        ('bad_type', f"main_config = dict(seed='zero', {GOOD_BUFFER})\n", [], ["'seed'", "'zero'"]),
        (  # (the type is the defaults' 'advanced': its size is checked against the batch)
            'no_buffer_type',
            "main_config = dict(policy=dict(other=dict(replay_buffer=dict(replay_buffer_size=10))))\n",
            [],
            ["'policy.learn.batch_size'", "'policy.other.replay_buffer.replay_buffer_size' = 10"],
        ),
        # --device tpu and --env-steps 0 are flag errors now, refused by the parser (test_cli.py)
    ],
)
def test_config_errors_exit_2_naming_file_and_key(tmp_path, capsys, name, text, extra, needles):
    path = tmp_path / f'{name}.py'
    path.write_text(text)
    assert main(['train', str(path), '--no-progress', *extra]) == 2
    out, err = capsys.readouterr()
    assert_user_error(2, err, str(path), *needles)
    assert os.listdir(tmp_path) == [path.name]  # nothing written


def test_missing_config_file_exits_2(tmp_path, capsys):
    path = tmp_path / 'missing.py'
    assert main(['train', str(path)]) == 2
    assert_user_error(2, capsys.readouterr().err, str(path), 'does not exist')


@pytest.mark.slow
def test_config_error_in_a_subprocess_has_no_traceback(tmp_path):
    path = tmp_path / 'bad.py'
    path.write_text(f"main_config = dict(env=dict(max_env_stp=10), {GOOD_BUFFER})\n")
    proc = cli('train', path, cwd=tmp_path, timeout=60)
    assert_user_error(proc.returncode, proc.stderr, str(path), 'max_env_stp', 'max_env_step')
    assert proc.stdout == f'ding-buffer train {path}: a new run, loading torch and the job ...\n'  # the first line only


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='CUDA is available here')
def test_device_cuda_without_cuda_exits_2(tmp_path):
    path = write_config(tmp_path / 'per.py', log_dir=str(tmp_path / 'runs'))
    proc = cli('train', path, '--device', 'cuda', '--no-progress', cwd=tmp_path, timeout=60)
    assert_user_error(proc.returncode, proc.stderr, "'cuda'", 'CUDA is not available')
    assert not (tmp_path / 'runs').exists()


@pytest.fixture(scope='module')
def bad_buffer_runs(tmp_path_factory):
    """`train` with an unknown buffer type and with an unknown buffer key, run side by side."""
    root = tmp_path_factory.mktemp('bad_buffer')
    cases = {
        'type': write_config(
            root / 'bad_type.py',
            log_dir=str(root / 'runs_type'),
            policy=dict(other=dict(replay_buffer=dict(type='advanced_typo'))),
        ),
        'key': write_config(
            root / 'bad_key.py',
            log_dir=str(root / 'runs_key'),
            policy=dict(other=dict(replay_buffer=dict(replay_bufer_size=10))),
        ),
    }
    procs = {
        k: subprocess.Popen(
            cli_cmd('train', p, '--no-progress'),
            cwd=root,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, p in cases.items()
    }
    out = {}
    try:
        for k, p in procs.items():
            _, err = p.communicate(timeout=60)
            out[k] = (cases[k], p.returncode, err, root / f'runs_{k}')
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    'case, needles',
    [
        ('type', ["'advanced_typo'", 'advanced', 'naive', 'episode']),
        ('key', ['replay_bufer_size', 'replay_buffer_size']),
    ],
)
def test_buffer_config_errors_exit_2_with_a_message(bad_buffer_runs, case, needles):
    _, rc, err, _ = bad_buffer_runs[case]
    assert_user_error(rc, err, *needles)


@pytest.mark.slow
@pytest.mark.parametrize(
    'case, key', [('type', 'policy.other.replay_buffer.type'), ('key', 'policy.other.replay_buffer.replay_bufer_size')]
)
def test_buffer_config_errors_name_the_file_and_key(bad_buffer_runs, case, key):
    path, rc, err, _ = bad_buffer_runs[case]
    assert_user_error(rc, err, str(path), key)


@pytest.mark.slow
@pytest.mark.parametrize('case', ['type', 'key'])
def test_rejected_buffer_config_leaves_no_run_directory(bad_buffer_runs, case):
    _, rc, err, runs = bad_buffer_runs[case]
    assert rc == 2, err
    assert not runs.exists(), sorted(str(p.relative_to(runs)) for p in runs.rglob('*'))


def tree(root: Path):
    """Every path under ``root``, relative to it (for assertion messages and 'nothing was written' checks)."""
    return sorted(str(q.relative_to(root)) for q in root.rglob('*'))


@pytest.mark.slow
def test_log_dir_that_is_a_file_exits_2_with_one_line_naming_key_and_path(tmp_path):
    a_file = tmp_path / 'a_file'
    a_file.write_text('not a directory')
    cfg = write_config(tmp_path / 'per.py', log_dir=str(a_file))
    proc = cli('train', cfg, '--no-progress', cwd=tmp_path, timeout=60)
    assert_user_error(proc.returncode, proc.stderr, str(cfg), "'log_dir'", str(a_file), 'not a directory')
    assert proc.stderr.count('\n') == 1, proc.stderr  # one line
    assert a_file.read_text() == 'not a directory'
    assert tree(tmp_path) == ['a_file', 'per.py']


@pytest.mark.parametrize('where', ['below_a_file', 'run_dir_is_a_file'])
def test_run_directory_blocked_by_a_file_exits_2_naming_the_path(tmp_path, capsys, where):
    a_file = tmp_path / ('a_file' if where == 'below_a_file' else 'exp_seed0')
    a_file.write_text('x')
    log_dir = a_file / 'runs' if where == 'below_a_file' else tmp_path
    cfg = write_config(tmp_path / 'per.py', log_dir=str(log_dir), exp_name='exp')
    assert main(['train', str(cfg), '--no-progress']) == 2
    key = "'log_dir'" if where == 'below_a_file' else "the run directory (config keys 'log_dir', 'exp_name', 'seed')"
    assert_user_error(2, capsys.readouterr().err, str(cfg), key, str(a_file), 'not a directory')
    assert tree(tmp_path) == sorted([a_file.name, 'per.py'])


@pytest.mark.parametrize('buffer_type', ['gfn', 'episode', 'prioritized_episode', 'gfn_diverse', 'terminating_state'])
def test_buffer_types_the_trainer_cannot_use_are_refused_at_validation(tmp_path, capsys, buffer_type):
    # only the type is set: the refusal must name it, not a key the trainer or the buffer adds
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        f"main_config = dict(log_dir={str(tmp_path / 'runs')!r}, "
        f"policy=dict(other=dict(replay_buffer=dict(type={buffer_type!r}))))\n"
    )
    assert main(['train', str(cfg), '--no-progress']) == 2
    err = capsys.readouterr().err
    assert_user_error(2, err, str(cfg), "'policy.other.replay_buffer.type'", repr(buffer_type), "'advanced'", "'naive'")
    assert 'storage' not in err, err
    assert tree(tmp_path) == ['cfg.py']  # no run directory


@pytest.mark.slow
def test_unusable_buffer_type_in_a_shipped_config_is_refused_before_its_other_keys(tmp_path):
    # the uniform config sets storage=..., which a gfn buffer does not know: the type is what is wrong
    cfg = write_config(
        tmp_path / 'gfn.py',
        UNIFORM_CONFIG,
        log_dir=str(tmp_path / 'runs'),
        policy=dict(other=dict(replay_buffer=dict(type='gfn'))),
    )
    proc = cli('train', cfg, '--no-progress', cwd=tmp_path, timeout=60)
    assert_user_error(
        proc.returncode, proc.stderr, str(cfg), "'policy.other.replay_buffer.type'", "'gfn'", "'advanced' or 'naive'"
    )
    assert proc.stdout.splitlines() == [f'ding-buffer train {cfg}: a new run, loading torch and the job ...']
    assert tree(tmp_path) == ['gfn.py']


@pytest.mark.slow
def test_a_registered_subclass_of_a_supported_buffer_trains(tmp_path, capsys, monkeypatch):
    (tmp_path / 'my_buffers.py').write_text(
        "from ding_buffer import BUFFER_REGISTRY\n"
        "from ding_buffer.buffers.naive import NaiveReplayBuffer\n"
        "@BUFFER_REGISTRY.register('my_naive_for_train_test')\n"
        "class MyNaive(NaiveReplayBuffer):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = write_config(
        tmp_path / 'mine.py',
        UNIFORM_CONFIG,
        log_dir=str(tmp_path / 'runs'),
        env=dict(max_env_step=200, eval_freq=200, eval_episodes=1),
        policy=dict(
            learn=dict(warmup_steps=100, batch_size=16),
            other=dict(
                replay_buffer=dict(type='my_naive_for_train_test', import_names=['my_buffers'], replay_buffer_size=500)
            ),
        ),
    )
    assert main(['train', str(cfg), '--no-progress']) == 0, capsys.readouterr().err
    assert 'gradient steps 101' in capsys.readouterr().out


@pytest.mark.slow
def test_a_mixture_trains_and_routes_priorities_to_its_prioritized_member(tmp_path, capsys):
    """A mixture as the DQN job's buffer: pushes go to push_to; a 50/50 split waits for both members; by size, every
    learner update is routed to the prioritized member by the batch's member key."""
    members = dict(
        seen=dict(type='advanced', replay_buffer_size=500),
        fresh=dict(type='naive', replay_buffer_size=500),
    )
    buffer = dict(type='mixture', members=members, push_to='seen')
    # 'fresh' stays empty: a 50/50 batch is never possible; by size all come from 'seen', so every update goes to the
    # prioritized member (a misroute raises)
    for weights, steps in ((dict(seen=0.5, fresh=0.5), 0), ('size', 101)):
        cfg = write_config(
            tmp_path / f'mix{steps}.py',
            UNIFORM_CONFIG,
            log_dir=str(tmp_path / f'runs{steps}'),
            env=dict(max_env_step=200, eval_freq=200, eval_episodes=1),
            policy=dict(learn=dict(warmup_steps=100, batch_size=16)),
            buffer=dict(buffer, weights=weights),
        )
        assert main(['train', str(cfg), '--no-progress']) == 0, capsys.readouterr().err
        assert f'gradient steps {steps}' in capsys.readouterr().out


@pytest.mark.parametrize(
    'overrides, needles',
    [
        (
            dict(learn=dict(batch_size=64), other=dict(replay_buffer=dict(type='naive', replay_buffer_size=32))),
            ["'policy.learn.batch_size' = 64", "'policy.other.replay_buffer.replay_buffer_size' = 32"],
        ),
        # the advanced buffer's default replay_buffer_size (4096) when the config leaves it out
        (
            dict(learn=dict(batch_size=5000), other=dict(replay_buffer=dict(type='advanced'))),
            ["'policy.learn.batch_size' = 5000", "'policy.other.replay_buffer.replay_buffer_size' = 4096", 'default'],
        ),
    ],
)
def test_batch_size_larger_than_the_buffer_is_refused(tmp_path, capsys, overrides, needles):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(f"main_config = dict(log_dir={str(tmp_path / 'runs')!r}, policy={overrides!r})\n")
    assert main(['train', str(cfg), '--no-progress']) == 2
    assert_user_error(2, capsys.readouterr().err, str(cfg), *needles, 'can never be sampled')
    assert tree(tmp_path) == ['cfg.py']


def test_batch_size_equal_to_the_buffer_is_accepted():
    from ding_buffer.train.config import build_train_config

    cfg = build_train_config(
        dict(
            policy=dict(learn=dict(batch_size=32), other=dict(replay_buffer=dict(type='naive', replay_buffer_size=32)))
        )
    )
    assert cfg.policy.learn.batch_size == 32 and cfg.policy.other.replay_buffer.replay_buffer_size == 32


@pytest.mark.parametrize('sibling', [False, True])
def test_a_trainer_that_fails_to_build_leaves_no_run_directory(tmp_path, capsys, monkeypatch, sibling):
    """A failure after the run directory was made (here: building the buffer) removes it and every parent the
    command made, but nothing that was there before (another run's directory next to it)."""
    from ding_buffer.train import dqn

    def failing_create_buffer(*args, **kwargs):
        raise ValueError("config key 'storage.device' is broken on purpose")

    monkeypatch.setattr(dqn, 'create_buffer', failing_create_buffer)
    runs = tmp_path / 'runs'
    if sibling:
        (runs / 'other_run_seed0').mkdir(parents=True)
    cfg = write_config(tmp_path / 'per.py', log_dir=str(runs / 'a' / 'b'))
    assert main(['train', str(cfg), '--no-progress']) == 2
    assert_user_error(2, capsys.readouterr().err, str(cfg), "'policy.other.replay_buffer.storage.device'")
    assert tree(tmp_path) == (['per.py', 'runs', 'runs/other_run_seed0'] if sibling else ['per.py'])


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='CUDA is available here')
def test_buffer_on_cuda_without_cuda_leaves_no_run_directory(tmp_path):
    cfg = write_config(
        tmp_path / 'per.py',
        log_dir=str(tmp_path / 'runs' / 'nested'),
        policy=dict(other=dict(replay_buffer=dict(storage=dict(type='tensor', device='cuda')))),
    )
    proc = cli('train', cfg, '--no-progress', cwd=tmp_path, timeout=60)
    assert_user_error(proc.returncode, proc.stderr, str(cfg), "'policy.other.replay_buffer.storage.device'", 'CUDA')
    assert tree(tmp_path) == ['per.py']


# ---------------------------------------------------------------------------------------------------- plot
@pytest.mark.slow
def test_plot_overlays_run_directories(e2e_runs, tmp_path, capsys):
    out = tmp_path / 'figs' / 'curves.png'
    assert main(['plot', str(e2e_runs[0][0]), str(e2e_runs[1][0]), '--out', str(out), '--title', 'PER']) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert sorted(os.listdir(out.parent)) == ['curves.png']  # no temporary left
    import matplotlib.image

    img = matplotlib.image.imread(str(out))
    assert img.shape[0] > 200 and img.shape[1] > 300 and img.std() > 0


@pytest.mark.slow
def test_plot_of_a_non_run_directory_exits_2(e2e_runs, tmp_path):
    not_a_run = tmp_path / 'not_a_run'
    not_a_run.mkdir()
    out = tmp_path / 'curves.png'
    proc = cli('plot', e2e_runs[0][0], not_a_run, '--out', out, cwd=tmp_path, timeout=60)
    assert_user_error(proc.returncode, proc.stderr, str(not_a_run), 'eval.csv')
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------- units: NStep
def _t(i, reward, done=False):
    return {
        'obs': f'o{i}',
        'action': i % 2,
        'reward': float(reward),
        'next_obs': f'o{i + 1}',
        'done': done,
        'collect_iter': i,
    }


def _feed(nstep, ts, over_at):
    out = []
    for i, t in enumerate(ts):
        out.append(nstep.add(t, episode_over=(i == over_at)))
    return out


def test_nstep_terminal_episode_matches_hand_computation():
    g = 0.9
    r = [1.0, 2.0, 3.0, 4.0, 5.0]
    ts = [_t(i, r[i], done=(i == 4)) for i in range(5)]
    emitted = _feed(NStep(3, g), ts, over_at=4)
    assert [len(e) for e in emitted] == [0, 0, 1, 1, 3]  # the window fills, then the episode end flushes it
    flat = [x for e in emitted for x in e]
    expect = [  # (first index, reward, next_obs, done, discount)
        (0, r[0] + g * r[1] + g * g * r[2], 'o3', False, g**3),
        (1, r[1] + g * r[2] + g * g * r[3], 'o4', False, g**3),
        (2, r[2] + g * r[3] + g * g * r[4], 'o5', True, g**3),
        (3, r[3] + g * r[4], 'o5', True, g**2),
        (4, r[4], 'o5', True, g),
    ]
    assert len(flat) == len(expect)
    for x, (i, reward, nxt, done, disc) in zip(flat, expect):
        assert x['obs'] == f'o{i}' and x['action'] == i % 2 and x['collect_iter'] == i
        assert x['reward'] == pytest.approx(reward) and x['discount'] == pytest.approx(disc)
        assert x['next_obs'] == nxt and x['done'] is done


def test_nstep_truncation_bootstraps_and_episodes_do_not_mix():
    g = 0.5
    ns = NStep(3, g)
    # a truncated (time-limit) episode of 4 steps: tail transitions are not 'done', they bootstrap from o4
    emitted = [x for e in _feed(ns, [_t(i, 1.0) for i in range(4)], over_at=3) for x in e]
    assert [(x['obs'], x['next_obs'], x['done']) for x in emitted] == [
        ('o0', 'o3', False),
        ('o1', 'o4', False),
        ('o2', 'o4', False),
        ('o3', 'o4', False),
    ]
    assert [x['reward'] for x in emitted] == pytest.approx([1.75, 1.75, 1.5, 1.0])
    assert [x['discount'] for x in emitted] == pytest.approx([g**3, g**3, g**2, g])
    assert len(ns.window) == 0
    # the next episode (terminating after 2 steps, shorter than n) uses none of the previous one's rewards
    emitted = [x for e in _feed(ns, [_t(10, 7.0), _t(11, 3.0, done=True)], over_at=1) for x in e]
    assert [(x['obs'], x['next_obs'], x['done']) for x in emitted] == [('o10', 'o12', True), ('o11', 'o12', True)]
    assert [x['reward'] for x in emitted] == pytest.approx([7.0 + g * 3.0, 3.0])
    assert [x['discount'] for x in emitted] == pytest.approx([g**2, g])


def test_nstep_one_is_plain_one_step():
    ns = NStep(1, 0.99)
    ts = [_t(0, 1.0), _t(1, 2.0), _t(2, 3.0, done=True)]
    for i, t in enumerate(ts):
        (x,) = ns.add(t, episode_over=(i == 2))
        assert x == dict(t, discount=pytest.approx(0.99))
    assert len(ns.window) == 0


# ---------------------------------------------------------------------------------------------------- units: checkpoint
def _save(root, step, keep, payload=None):
    def save_buffer(path):
        torch.save({'buffer_of_step': step}, path)

    return ckpt.save_checkpoint(
        str(root), step, {'step': step, 'payload': payload or torch.arange(3)}, save_buffer, keep=keep
    )


def _loader(path):
    return torch.load(os.path.join(path, 'trainer.pt'), weights_only=True)['step']


def test_save_checkpoint_publishes_complete_directories_and_keeps_the_newest(tmp_path):
    root = tmp_path / 'ck'
    for step in (100, 200, 300, 400, 500):
        path = _save(root, step, keep=2)
        assert path == str(root / f'step_{step:09d}')
        assert sorted(os.listdir(path)) == ['COMPLETE', 'buffer.pt', 'trainer.pt']
        assert json.loads((Path(path) / 'COMPLETE').read_text()) == {'step': step}
    assert sorted(os.listdir(root)) == ['step_000000400', 'step_000000500']
    assert ckpt.complete_checkpoints(str(root)) == [
        (400, str(root / 'step_000000400')),
        (500, str(root / 'step_000000500')),
    ]
    assert torch.load(root / 'step_000000500' / 'buffer.pt', weights_only=True) == {'buffer_of_step': 500}
    _save(root, 600, keep=1)
    assert sorted(os.listdir(root)) == ['step_000000600']


@pytest.mark.parametrize(
    'error',
    [
        MemoryError('Unable to allocate 78.1 MiB'),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 122880000 bytes"),
    ],
)
def test_load_latest_does_not_set_aside_a_checkpoint_that_did_not_fit_in_memory(error, tmp_path):
    root = tmp_path / 'ck'
    for step in (100, 200):
        _save(root, step, keep=5)

    def short_of_memory(path):
        if path.endswith('200'):
            try:
                raise error
            except Exception as e:
                raise ValueError('invalid state') from e  # (as a buffer's load reports it)
        return _loader(path)

    with pytest.raises(ValueError) as err:
        ckpt.load_latest(str(root), short_of_memory)
    assert err.value.__cause__ is error
    assert [s for s, _ in ckpt.complete_checkpoints(str(root))] == [100, 200]  # the newest stays the one to resume
    assert ckpt.load_latest(str(root), _loader) == (str(root / 'step_000000200'), 200)


def test_load_latest_skips_incomplete_and_damaged_checkpoints(tmp_path):
    root = tmp_path / 'ck'
    assert ckpt.load_latest(str(root), _loader) == (None, None)  # no directory at all
    for step in (100, 200):
        _save(root, step, keep=5)
    # a newer directory without the marker (a crash before publication) and a leftover temporary
    shutil.copytree(root / 'step_000000200', root / 'step_000000300')
    (root / 'step_000000300' / 'COMPLETE').unlink()
    shutil.copytree(root / 'step_000000200', root / '.tmp-step_000000400-12345')
    (root / 'step_garbage').mkdir()
    (root / 'step_garbage' / 'COMPLETE').write_text('{}')
    assert [s for s, _ in ckpt.complete_checkpoints(str(root))] == [100, 200]
    assert ckpt.load_latest(str(root), _loader) == (str(root / 'step_000000200'), 200)
    assert not (root / '.tmp-step_000000400-12345').exists()  # temporaries are cleaned on load

    # the newest complete one fails to load -> the previous one
    def picky(path):
        if path.endswith('200'):
            raise ValueError('damaged')
        return _loader(path)

    assert ckpt.load_latest(str(root), picky) == (str(root / 'step_000000100'), 100)
    # the damaged newer one is set aside, so the resumed run publishes its own checkpoint of that step (it used to
    # keep the damaged one, and every later resume fell back past it again)
    assert [s for s, _ in ckpt.complete_checkpoints(str(root))] == [100]
    assert (root / 'damaged-step_000000200').is_dir()
    _save(root, 200, keep=5)
    assert ckpt.load_latest(str(root), _loader) == (str(root / 'step_000000200'), 200)

    # none loads -> ValueError naming every failure
    def broken(path):
        raise RuntimeError(f'bad {os.path.basename(path)}:\n\tMissing key(s) in state_dict')  # (as torch's, on lines)

    with pytest.raises(ValueError, match='no loadable checkpoint') as e:
        ckpt.load_latest(str(root), broken)
    assert 'bad step_000000100' in str(e.value) and 'bad step_000000200' in str(e.value)
    assert '\n' not in str(e.value)  # (the CLI prints it as its one error line)


def test_a_new_save_removes_leftover_temporaries(tmp_path):
    root = tmp_path / 'ck'
    (root / '.tmp-step_000000100-999').mkdir(parents=True)
    _save(root, 200, keep=2)
    assert sorted(os.listdir(root)) == ['step_000000200']


def test_resaving_the_same_step_is_crash_safe(tmp_path, monkeypatch):
    root = tmp_path / 'ck'
    _save(root, 100, keep=1)

    class Killed(BaseException):
        pass

    def killed_at_rename(src, dst):  # a SIGKILL at the moment a replacement would be published
        raise Killed()

    monkeypatch.setattr(ckpt.os, 'rename', killed_at_rename)
    # the step is already complete: the save keeps it (nothing is deleted, nothing renamed)
    assert _save(root, 100, keep=1) == str(root / 'step_000000100')
    monkeypatch.undo()
    assert [s for s, _ in ckpt.complete_checkpoints(str(root))] == [100], sorted(os.listdir(root))


@pytest.mark.parametrize(
    'user',
    [dict(exp_name='x'), dict(policy=dict(other=dict(replay_buffer=dict(replay_buffer_size=5000))))],
    ids=['no buffer section', 'a size only'],
)
def test_an_omitted_buffer_type_takes_the_defaults_type(user):
    """Omitted keys take the defaults (docs/training.md), the buffer's ``type`` too: ``TRAIN_DEFAULTS`` says
    'advanced'."""
    cfg = build_train_config(user)
    assert cfg.policy.other.replay_buffer.type == TRAIN_DEFAULTS['policy']['other']['replay_buffer']['type']
    assert cfg.policy.other.replay_buffer.get('replay_buffer_size') == user.get('policy', {}).get('other', {}).get(
        'replay_buffer', {}
    ).get('replay_buffer_size')


@pytest.mark.parametrize('seed', [0, 3])
def test_resume_with_another_seed_is_refused_before_anything_runs(tmp_path, capsys, seed):
    """A resumed run goes on with its checkpoint's RNGs: ``--seed`` naming another seed would only relabel it
    (run.json, summary.json, the plots), so it is refused naming the flag; its own seed is accepted."""
    run = tmp_path / 'r_seed0'
    run.mkdir()
    (run / 'run.json').write_text(json.dumps({'job': 'dqn', 'exp_name': 'r', 'seed': 0}))
    cfg = tmp_path / 'r.py'
    cfg.write_text(f"main_config = dict(exp_name='r', log_dir={str(tmp_path)!r})\n")
    rc = main(['train', str(cfg), '--no-progress', '--seed', str(seed), '--resume', str(run)])
    err = capsys.readouterr().err
    if seed == 3:
        assert_user_error(rc, err, '--seed 3', str(run), '(0,')
    else:  # the seed matches: on to the job, which finds no checkpoint to resume from
        assert '--seed' not in err
    assert json.loads((run / 'run.json').read_text())['seed'] == 0


def test_a_checkpoint_whose_trainer_file_has_a_flipped_bit_is_damage(tmp_path):
    """``trainer.pt`` (the networks, optimiser and counters) is read with its CRC-32 checked: a flipped bit in a
    weight was loaded as other weights, and the run resumed from it instead of falling back to the checkpoint before."""
    import zipfile

    from ding_buffer.persistence import atomic_save
    from ding_buffer.train.dqn import load_learner_state

    path = tmp_path / 'step_000000300'
    atomic_save({'model': {'w': torch.full((256,), 0.5)}, 'counters': {'train_iter': 3}}, str(path / 'trainer.pt'))
    raw = bytearray((path / 'trainer.pt').read_bytes())
    with zipfile.ZipFile(path / 'trainer.pt') as z:
        info = max(z.infolist(), key=lambda i: i.file_size)  # the weights
    start = info.header_offset + 30 + int.from_bytes(raw[info.header_offset + 26 : info.header_offset + 28], 'little')
    start += int.from_bytes(raw[info.header_offset + 28 : info.header_offset + 30], 'little')
    raw[start + 100] ^= 0x04
    (path / 'trainer.pt').write_bytes(bytes(raw))
    with pytest.raises(ValueError, match='CRC-32'):  # load_latest then falls back to the checkpoint before
        load_learner_state(None, str(path), str(path / 'buffer.pt'))

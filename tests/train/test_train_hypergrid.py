"""`ding-buffer train` with ``job='hypergrid'``: a trajectory-balance GFlowNet learns a small HyperGrid through the
real CLI (in process), writes TensorBoard / eval.csv / PNG / summary.json, resumes from a checkpoint with its
counters and its trajectory intact, runs with each GFlowNet buffer type (ours and torchgfn's), and rejects bad
configs with exit status 2 naming the key. The exact metrics (true distribution, L1, modes) are checked against
torchgfn's own enumeration.

Every run lives in ``tmp_path``; config files load a shipped config and override a few keys (a tiny 8x8 grid,
small networks, few iterations), so the shipped files are what is exercised.
"""

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip('gfn')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import CONFIG_DIR, PNG_MAGIC, read_csv, write_config

from ding_buffer.cli import main
from ding_buffer.train.hypergrid_metrics import GridTruth

CONFIGS = {
    name: CONFIG_DIR / f'hypergrid_tb_{name}.py'
    for name in ('nobuffer', 'gfn', 'gfn_prioritized', 'gfn_diverse', 'torchgfn', 'torchgfn_diverse')
}
# A tiny, fast problem: 64 states, 4 modes (one mode state per corner).
TINY = {
    'env': {'height': 8, 'eval_freq': 50, 'eval_samples': 4000},
    'policy': {'model': {'hidden_dim': 64}, 'learn': {'replay_warmup': 32}},
    'checkpoint': {'freq': 50},
}


def train(
    tmp_path: Path, name: str, *args, overrides: tuple = (), config_name: str = 'cfg.py', buffer: dict | None = None
) -> int:
    cfg = write_config(
        tmp_path / config_name, CONFIGS[name], TINY, {'log_dir': str(tmp_path / 'runs')}, *overrides, buffer=buffer
    )
    return main(['train', str(cfg), '--no-progress', *[str(a) for a in args]])


def run_dir(tmp_path: Path, exp_name: str, seed: int = 0) -> Path:
    return tmp_path / 'runs' / f'{exp_name}_seed{seed}'


def scalars(log_dir: Path) -> dict:
    ea = EventAccumulator(str(log_dir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()['scalars']}


# ---------------------------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize('ndim,height', [(2, 8), (3, 7)])
def test_grid_truth_matches_torchgfn(ndim, height):
    from gfn.gym import HyperGrid

    env = HyperGrid(ndim=ndim, height=height, store_all_states=True)
    truth = GridTruth(ndim, height, 0.1, 0.5, 2.0)
    assert torch.allclose(truth.true_dist.float(), env.true_dist().float(), atol=1e-6)
    assert truth.log_z == pytest.approx(env.log_partition(), abs=1e-5)
    assert truth.n_mode_states == int(env.mode_mask(env.all_states).sum())
    assert torch.equal(truth.indices(env.all_states.tensor), torch.arange(height**ndim))
    # every corner holds mode states, and only mode states count towards modes
    mode_idx = torch.nonzero(truth.is_mode).flatten()
    assert truth.modes_of(mode_idx.tolist()) == set(range(2**ndim))
    assert truth.mode_states_in(torch.nonzero(~truth.is_mode).flatten()) == set()
    # L1 of the exact distribution's own samples shrinks towards 0; a point mass is far away
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(truth.true_dist, 200_000, replacement=True, generator=g)
    assert truth.l1(draws) < 0.05
    assert truth.l1(torch.zeros(10, dtype=torch.long)) > 1.5


# ---------------------------------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_learns_and_writes_artifacts(tmp_path, capsys):
    assert train(tmp_path, 'gfn', '--iterations', 300, '--seed', 3) == 0
    out = capsys.readouterr().out
    d = run_dir(tmp_path, 'hypergrid_tb_gfn', seed=3)
    assert str(d) in out and 'modes found' in out and 'L1 distance' in out
    s = json.loads((d / 'summary.json').read_text())
    assert s['iterations'] == 300 and s['seed'] == 3 and s['buffer_type'] == 'gfn'
    # learned: L1 far below the untrained policy's, every corner visited, log Z close to the truth
    assert s['final_l1_dist'] < 0.5 * s['initial_l1_dist'], s
    assert s['modes_found'] == s['n_modes'] == 4
    assert abs(s['logZ'] - s['logZ_true']) < 0.5, s
    assert s['replayed_trajectories'] == (300 - 1) * 16  # every iteration but the first (warm-up 32 = two pushes)
    assert s['buffer_count'] == 1000  # FIFO capacity
    rows = read_csv(d / 'eval.csv')
    assert [int(r['iteration']) for r in rows] == list(range(0, 301, 50))
    losses = [float(r['loss']) for r in rows[1:]]
    assert losses[-1] < losses[0], losses  # the TB loss decreases
    assert (d / 'learning_curve.png').read_bytes()[:8] == PNG_MAGIC
    tags = scalars(d / 'log')
    for tag in (
        'train/loss',
        'train/logZ',
        'train/replay_size',
        'eval/l1_dist',
        'eval/modes_found',
        'eval/logZ_error',
        'buffer_iter/size',
        'buffer_iter/log_reward_mean',
    ):
        assert tag in tags, sorted(tags)
    l1 = tags['eval/l1_dist']
    assert [step for step, _ in l1] == list(range(0, 301, 50))
    assert l1[-1][1] == pytest.approx(s['final_l1_dist'], rel=1e-5)
    # `ding-buffer plot` draws return curves: a HyperGrid run is refused with a message, not a traceback
    capsys.readouterr()
    assert main(['plot', str(d), '--out', str(tmp_path / 'p.png')]) == 2
    err = capsys.readouterr().err
    assert 'not a DQN / Ape-X run' in err and 'learning_curve.png' in err and not (tmp_path / 'p.png').exists()


@pytest.mark.slow
def test_resume_continues_with_counters_intact(tmp_path, capsys):
    """An interrupted run (stopped at 100 of 150) resumed with --resume ends exactly where an uninterrupted run does:
    same counters, same eval rows, same logZ (model, optimizer, RNG and buffer all restored)."""
    ref_over = ({'exp_name': 'ref'},)
    assert train(tmp_path, 'gfn_prioritized', '--iterations', 150, overrides=ref_over, config_name='ref.py') == 0
    assert train(tmp_path, 'gfn_prioritized', '--iterations', 100) == 0
    d = run_dir(tmp_path, 'hypergrid_tb_gfn_prioritized')
    assert sorted(os.listdir(d / 'checkpoints')) == ['step_000000050', 'step_000000100']
    counters = torch.load(d / 'checkpoints' / 'step_000000100' / 'trainer.pt', weights_only=True)['counters']
    assert counters['iteration'] == 100
    capsys.readouterr()
    assert train(tmp_path, 'gfn_prioritized', '--iterations', 150, '--resume', d) == 0
    assert f"resumed from {d / 'checkpoints' / 'step_000000100'} at iteration 100" in capsys.readouterr().out
    s = json.loads((d / 'summary.json').read_text())
    ref = json.loads((run_dir(tmp_path, 'ref') / 'summary.json').read_text())
    assert s['iterations'] == ref['iterations'] == 150 and s['resumed_from'].endswith('step_000000100')
    for key in (
        'logZ',
        'final_l1_dist',
        'modes_found',
        'mode_states_found',
        'buffer_count',
        'replayed_trajectories',
        'first_mode_iteration',
    ):
        assert s[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-9), key
    rows, ref_rows = read_csv(d / 'eval.csv'), read_csv(run_dir(tmp_path, 'ref') / 'eval.csv')
    assert [r['iteration'] for r in rows] == ['0', '50', '100', '150']
    drop = ('wall_time',)
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in ref_rows
    ]


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    empty = tmp_path / 'nothing_here'
    empty.mkdir()
    assert train(tmp_path, 'gfn', '--iterations', 5, '--resume', empty) == 2
    assert 'no complete checkpoint' in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- buffer types
@pytest.mark.slow
@pytest.mark.parametrize(
    'name,overrides,buffer,expected_type',
    [
        ('nobuffer', (), None, 'none'),
        ('gfn', (), None, 'gfn'),
        ('gfn_prioritized', (), None, 'gfn'),
        ('gfn_diverse', ({'policy': {'other': {'replay_buffer': {'replay_buffer_size': 40}}}},), None, 'gfn_diverse'),
        ('torchgfn', (), None, 'torchgfn:ReplayBuffer'),
        (
            'torchgfn_diverse',
            ({'policy': {'other': {'replay_buffer': {'replay_buffer_size': 40}}}},),
            None,
            'torchgfn:NormBasedDiversePrioritizedReplayBuffer',
        ),
    ],
)
def test_each_buffer_type_trains(tmp_path, name, overrides, buffer, expected_type):
    over = ({'env': {'eval_freq': 10, 'eval_samples': 500}, 'checkpoint': {'freq': 10}},) + overrides
    assert train(tmp_path, name, '--iterations', 12, overrides=over, buffer=buffer) == 0
    d = run_dir(tmp_path, f'hypergrid_tb_{name}')
    s = json.loads((d / 'summary.json').read_text())
    assert s['buffer_type'] == expected_type and s['iterations'] == 12
    if name == 'nobuffer':
        assert s['buffer_count'] == 0 and s['replayed_trajectories'] == 0
    else:
        # 16 pushed per iteration, before replaying: the warm-up of 32 is reached by the second push, so every
        # iteration but the first replays 16
        capacity = 40 if overrides or buffer else 1000
        assert s['buffer_count'] == min(12 * 16, capacity)  # a full buffer stays full (evictions make room)
        assert s['replayed_trajectories'] == 11 * 16
        ck = d / 'checkpoints' / 'step_000000012'
        assert (ck / 'buffer.pt').is_file()


@pytest.mark.slow
def test_torchgfn_buffer_resumes_with_its_contents(tmp_path, capsys):
    assert train(tmp_path, 'torchgfn', '--iterations', 50) == 0
    d = run_dir(tmp_path, 'hypergrid_tb_torchgfn')
    before = json.loads((d / 'summary.json').read_text())['buffer_count']
    assert before == 50 * 16
    assert train(tmp_path, 'torchgfn', '--iterations', 52, '--resume', d) == 0
    assert json.loads((d / 'summary.json').read_text())['buffer_count'] == 52 * 16


@pytest.mark.slow
def test_visited_eval_source(tmp_path):
    over = ({'env': {'eval_source': 'visited', 'eval_samples': 800}},)
    assert train(tmp_path, 'nobuffer', '--iterations', 100, overrides=over) == 0
    d = run_dir(tmp_path, 'hypergrid_tb_nobuffer')
    s = json.loads((d / 'summary.json').read_text())
    # no evaluation before the first iteration (nothing visited yet); then the last 800 sampled states
    assert [r['iteration'] for r in read_csv(d / 'eval.csv')] == ['50', '100']
    assert 0 < s['final_l1_dist'] < s['initial_l1_dist'] < 2


# ---------------------------------------------------------------------------------------------------- user errors
@pytest.mark.parametrize(
    'override,needles,buffer',
    [
        (
            {},
            ["'policy.other.replay_buffer.cutoff_distance'", 'valid keys'],
            {'type': 'torchgfn:ReplayBuffer', 'cutoff_distance': 1.0},
        ),
        ({}, ["'policy.other.replay_buffer'", 'expected None'], 'gfn'),
        ({}, ["'policy.other.replay_buffer.type'", "'gfn'"], {'replay_buffer_size': 10}),
        (
            {'policy': {'learn': {'batch_sise': 16}}},
            ["'policy.learn.batch_sise'", "did you mean 'policy.learn.batch_size'"],
            None,
        ),
        ({'env': {'height': 1}}, ["'env.height'", 'an int >= 2'], None),
        ({'env': {'height': 4}}, ["'env.height' = 4", 'no mode state'], None),
        ({'env': {'ndim': 9, 'height': 8}}, ["'env.height' = 8, 'env.ndim' = 9", 'height ** ndim <= 16777216'], None),
        ({'env': {'eval_source': 'both'}}, ["'env.eval_source'", "'fresh' or 'visited'"], None),
        (
            {'policy': {'other': {'replay_buffer': {'type': 'terminating_state'}}}},
            ["'policy.other.replay_buffer.type'", "'terminating_state'", 'StatesContainer'],
            None,
        ),
        (
            {'policy': {'other': {'replay_buffer': {'type': 'advanced'}}}},
            ["'policy.other.replay_buffer.type'", "'gfn'"],
            None,
        ),
        (
            {'policy': {'other': {'replay_buffer': {'replay_buffer_sise': 10}}}},
            ["'policy.other.replay_buffer.replay_buffer_sise'", 'replay_buffer_size'],
            None,
        ),
        (
            {'policy': {'other': {'replay_buffer': {'type': 'torchgfn:Bogus'}}}},
            ["'policy.other.replay_buffer.type'", "'torchgfn:ReplayBuffer'"],
            None,
        ),
        (
            {'policy': {'learn': {'replay_warmup': 5000}}},
            ["'policy.learn.replay_warmup' = 5000", 'replay_buffer_size'],
            None,
        ),
        ({'policy': {'other': {'extra': 1}}}, ["'policy.other.extra'"], None),
    ],
)
def test_bad_config_exits_2_naming_the_key(tmp_path, capsys, override, needles, buffer):
    assert train(tmp_path, 'gfn', '--iterations', 5, overrides=(override,), buffer=buffer) == 2
    err = capsys.readouterr().err
    assert err.startswith('ding-buffer: error: ') and 'Traceback' not in err
    assert 'cfg.py' in err
    for needle in needles:
        assert needle in err, err
    assert not (tmp_path / 'runs').exists()  # nothing created on bad input


@pytest.mark.parametrize(
    'args,needle',
    [
        (('--nproc', 2), 'distributed.backend'),
        (('--env-steps', 100), '--iterations'),
    ],
)
def test_unsupported_arguments_exit_2(tmp_path, capsys, args, needle):
    assert train(tmp_path, 'gfn', *args) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / 'runs').exists()


@pytest.mark.slow
def test_existing_run_is_not_overwritten(tmp_path, capsys):
    assert train(tmp_path, 'nobuffer', '--iterations', 3) == 0
    capsys.readouterr()
    assert train(tmp_path, 'nobuffer', '--iterations', 3) == 2
    assert '--resume' in capsys.readouterr().err


@pytest.mark.slow
def test_a_checkpoint_without_its_buffer_file_is_damage_and_the_run_keeps_its_seed(tmp_path, capsys):
    """A checkpoint written with a buffer file but found without it is damage: the resume falls back to the one
    before (it went on with an empty buffer). A resumed run keeps the seed it recorded, whatever the config file
    says, and ``--seed`` naming another is refused (it was accepted and relabelled the run)."""
    assert train(tmp_path, 'gfn', '--iterations', 100, '--seed', 2) == 0
    d = run_dir(tmp_path, 'hypergrid_tb_gfn', seed=2)
    full = json.loads((d / 'summary.json').read_text())['buffer_count']
    (d / 'summary.json').unlink()  # (as a killed run leaves it: its seed is in run.json, from its start)
    (d / 'checkpoints' / 'step_000000100' / 'buffer.pt').unlink()
    capsys.readouterr()
    assert train(tmp_path, 'gfn', '--iterations', 101, '--seed', 5, '--resume', d) == 2
    assert '--seed 5 is not the seed of the run being resumed (2,' in capsys.readouterr().err
    assert train(tmp_path, 'gfn', '--iterations', 101, '--resume', d) == 0  # (the config file's seed is 0)
    s = json.loads((d / 'summary.json').read_text())
    assert s['seed'] == 2 and s['resumed_from'].endswith('step_000000050') and s['iterations'] == 101
    assert s['buffer_count'] == full  # (a full buffer: it was restored, then took 51 more pushes)


@pytest.mark.slow
def test_a_run_resumed_from_an_older_checkpoint_logs_each_step_once(tmp_path):
    """Resumed from the checkpoint before the newest (the newest lost, as if killed before it was published), the
    run's TensorBoard points after that checkpoint are logged again, not twice: every tag has the steps of an
    uninterrupted run."""
    assert train(tmp_path, 'gfn', '--iterations', 100, overrides=({'exp_name': 'ref'},), config_name='ref.py') == 0
    assert train(tmp_path, 'gfn', '--iterations', 100) == 0
    d = run_dir(tmp_path, 'hypergrid_tb_gfn')
    for f in (d / 'checkpoints' / 'step_000000100').iterdir():
        f.unlink()
    (d / 'checkpoints' / 'step_000000100').rmdir()
    assert train(tmp_path, 'gfn', '--iterations', 100, '--resume', d) == 0
    got, ref = scalars(d / 'log'), scalars(run_dir(tmp_path, 'ref') / 'log')
    drop = lambda tags: {t: [s for s, _ in v] for t, v in tags.items() if not t.endswith('_sec') and '_sec/' not in t}  # noqa: E731
    assert drop(got) == drop(ref)

"""`ding_buffer.train.plot` / `ding-buffer plot`: runs grouped by config, seeds averaged on the steps they all cover,
stop values from the runs, markers on every curve, the legend outside the axes. Fake run directories: ``eval.csv``
from ``write_eval_csv`` plus the ``run.json`` the jobs write at start."""

import json
import os

import numpy as np
import pytest
from train_helpers import PNG_MAGIC

from ding_buffer.cli import main
from ding_buffer.train.evals import read_eval_csv, write_eval_csv
from ding_buffer.train.plot import config_id, draw_runs, group_runs, mean_band, plot_runs, read_run_info, write_run_info

matplotlib = pytest.importorskip('matplotlib')


def cfg_of(exp_name, seed, stop_value=475.0, env_id='CartPole-v1', lr=1e-3, log_dir=None):
    return {
        'exp_name': exp_name,
        'seed': seed,
        'log_dir': log_dir,
        'env': {'env_id': env_id, 'stop_value': stop_value, 'max_env_step': 1000},
        'policy': {'learn': {'learning_rate': lr}, 'other': {'replay_buffer': {'type': 'advanced'}}},
    }


def fake_run(root, exp_name, seed, steps, returns, stds=None, info=True, **cfg):
    """A run directory ``root/<exp_name>_seed<seed>`` with eval.csv and (``info``) run.json."""
    d = os.path.join(str(root), f'{exp_name}_seed{seed}')
    os.makedirs(d, exist_ok=True)
    stds = [1.0] * len(steps) if stds is None else stds
    write_eval_csv(
        d,
        [
            {'env_step': s, 'train_iter': s, 'return_mean': r, 'return_std': sd, 'wall_time': 0.1}
            for s, r, sd in zip(steps, returns, stds)
        ],
    )
    if info:
        write_run_info(d, cfg_of(exp_name, seed, **cfg), 'dqn')
    return d


def drawn(run_dirs, **kw):
    """``draw_runs`` on a fresh axes: (groups, the axes' lines, its shaded bands / error bars)."""
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        groups = draw_runs(ax, run_dirs, **kw)
        return groups, list(ax.lines), [c for c in ax.collections]
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------------- metadata
def test_run_info_written_by_the_jobs_and_read_back(tmp_path):
    d = fake_run(tmp_path, 'acrobot', 3, [100], [-500.0], stop_value=-100.0, env_id='Acrobot-v1')
    with open(os.path.join(d, 'run.json')) as f:
        raw = json.load(f)
    assert raw['job'] == 'dqn' and raw['config']['env']['env_id'] == 'Acrobot-v1'
    info = read_run_info(d)
    assert (info['exp_name'], info['seed'], info['stop_value'], info['env_id']) == ('acrobot', 3, -100.0, 'Acrobot-v1')
    assert len(info['config_id']) == 12


def test_config_id_ignores_seed_and_run_paths_only(tmp_path):
    a = dict(cfg_of('x', 0), file_root=str(tmp_path / 'x_seed0'))
    b = dict(cfg_of('x', 1, log_dir='elsewhere'), file_root=str(tmp_path / 'x_seed1'))
    assert config_id(a, str(tmp_path / 'x_seed0')) == config_id(b, str(tmp_path / 'x_seed1'))
    assert config_id(cfg_of('x', 0, lr=1e-4), 'r') != config_id(cfg_of('x', 0), 'r')


def test_without_run_json_summary_then_directory_name(tmp_path):
    d = fake_run(tmp_path, 'old', 2, [10, 20], [1.0, 2.0], info=False)
    assert read_run_info(d)['exp_name'] == 'old' and read_run_info(d)['seed'] == 2
    assert read_run_info(d)['stop_value'] is None
    with open(os.path.join(d, 'summary.json'), 'w') as f:
        json.dump({'exp_name': 'old', 'seed': 2, 'stop_value': 195.0}, f)
    assert read_run_info(d)['stop_value'] == 195.0


# ---------------------------------------------------------------------------------------------------- grouping
def test_seeds_of_one_config_form_one_group(tmp_path):
    runs = [fake_run(tmp_path, 'cartpole_dqn_per', s, [10, 20], [1.0, 2.0]) for s in range(5)]
    other = fake_run(tmp_path, 'cartpole_dqn_uniform', 0, [10, 20], [1.0, 2.0])
    groups = group_runs(runs + [other])
    assert [(g.label, g.run_dirs) for g in groups] == [
        ('cartpole_dqn_per (5 seeds)', runs),
        ('cartpole_dqn_uniform (seed 0)', [other]),
    ]


def test_same_run_name_in_two_folders_makes_two_groups_with_distinct_labels(tmp_path):
    a = [fake_run(tmp_path / 'exp_a' / 'runs', 'per', s, [10], [1.0]) for s in (0, 1)]
    b = [fake_run(tmp_path / 'exp_b' / 'runs', 'per', s, [10], [1.0]) for s in (0, 1)]
    groups = group_runs(a + b)
    assert [g.run_dirs for g in groups] == [a, b]
    assert [g.label for g in groups] == [
        os.path.join('exp_a', 'runs', 'per (2 seeds)'),
        os.path.join('exp_b', 'runs', 'per (2 seeds)'),
    ]


def test_different_configs_never_merge_even_in_one_folder(tmp_path):
    r0 = fake_run(tmp_path, 'per', 0, [10], [1.0], lr=1e-3)
    r1 = fake_run(tmp_path, 'per', 1, [10], [1.0], lr=1e-4)
    groups = group_runs([r0, r1, r0])  # a directory given twice counts once
    assert [g.run_dirs for g in groups] == [[r0], [r1]]
    assert len({g.label for g in groups}) == 2 and all(g.label.startswith('per [config ') for g in groups)


def test_fallback_grouping_by_folder_and_name_without_seed(tmp_path):
    runs = [fake_run(tmp_path / 'old', 'dqn', s, [10], [1.0], info=False) for s in (0, 1, 2)]
    (g,) = group_runs(runs)
    assert g.label == 'dqn (3 seeds)' and g.run_dirs == runs


# ---------------------------------------------------------------------------------------------------- alignment
def test_mean_band_interpolates_each_seed_only_inside_its_own_range():
    band = mean_band(
        [
            ([0, 10, 20, 30], [0.0, 10.0, 20.0, 30.0]),  # longer run: only it reaches 30
            ([0, 5, 10, 20], [2.0, 4.0, 6.0, 8.0]),
            ([10, 20], [9.0, 9.0]),
        ]
    )  # starts later: absent (not extrapolated) at 0 and 5
    assert band.steps.tolist() == [0, 5, 10, 20, 30] and band.n.tolist() == [2, 2, 3, 3, 1]
    np.testing.assert_allclose(band.mean, [1.0, 4.5, 25 / 3, 37 / 3, 30.0])  # seed 0 interpolated at 5 -> 5
    np.testing.assert_allclose(band.std[:2], [1.0, 0.5])
    np.testing.assert_allclose(band.std[2], np.std([10.0, 6.0, 9.0]))
    assert band.std[4] == 0.0
    assert len(mean_band([]).steps) == 0


# ---------------------------------------------------------------------------------------------------- drawing
def test_stop_value_comes_from_the_runs(tmp_path):
    runs = [fake_run(tmp_path, 'acrobot', s, [100, 200], [-500.0, -300.0], stop_value=-100.0) for s in (0, 1)]
    _, lines, _ = drawn(runs)
    stops = [ln for ln in lines if ln.get_label().startswith('stop value')]
    assert [(ln.get_label(), ln.get_ydata()[0]) for ln in stops] == [('stop value -100', -100.0)]
    _, lines, _ = drawn(runs, stop_value=-50.0)  # an explicit value overrides
    assert [ln.get_ydata()[0] for ln in lines if ln.get_label().startswith('stop value')] == [-50.0]


def test_different_stop_values_drawn_per_group_in_its_colour(tmp_path):
    a = fake_run(tmp_path, 'acrobot', 0, [100], [-500.0], stop_value=-100.0)
    c = fake_run(tmp_path, 'cartpole', 0, [100], [20.0], stop_value=475.0)
    _, lines, _ = drawn([a, c])
    curves = {ln.get_label(): ln.get_color() for ln in lines if not ln.get_label().startswith('stop')}
    stops = {ln.get_ydata()[0]: ln.get_color() for ln in lines if ln.get_label().startswith('stop')}
    assert stops == {-100.0: curves['acrobot (seed 0)'], 475.0: curves['cartpole (seed 0)']}


def test_single_evaluation_point_is_drawn_as_a_dot(tmp_path):
    d = fake_run(tmp_path, 'short', 0, [500], [42.0])
    _, lines, bands = drawn([d])
    (curve,) = [ln for ln in lines if ln.get_label() == 'short (seed 0)']
    assert curve.get_marker() not in (None, '', 'None') and list(curve.get_xdata()) == [500]
    assert len(bands) == 1  # the eval-episode std band
    out = plot_runs([d], str(tmp_path / 'one.png'))
    with open(out, 'rb') as f:
        data = f.read()
    assert data[:8] == PNG_MAGIC and len(data) > 5_000


def test_a_single_runs_band_stays_within_its_episodes_returns(tmp_path):
    """CartPole's returns end at 500: mean 490 +- std 20 must not shade up to 510."""
    d = fake_run(tmp_path, 'solved', 0, [100, 200, 300], [300.0, 490.0, 500.0], stds=[50.0, 20.0, 0.0])
    rows = read_eval_csv(d)
    for r, (lo, hi) in zip(rows, [(200.0, 380.0), (450.0, 500.0), (500.0, 500.0)]):
        r.update(return_min=lo, return_max=hi)
    write_eval_csv(d, rows)
    _, _, bands = drawn([d])
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.max() == 500.0 and ys.min() == 250.0, ys  # 300 - 50 above its min 200; 490 + 20 capped at 500
    # a run written before the min / max columns existed still draws its +- std band
    old = fake_run(tmp_path, 'old', 0, [100, 200], [300.0, 490.0], stds=[50.0, 20.0])
    assert 'return_max' not in read_eval_csv(old)[0]
    _, _, bands = drawn([old])
    assert bands[0].get_paths()[0].vertices[:, 1].max() == 510.0


def test_several_seeds_draw_mean_band_and_longer_tails(tmp_path):
    r0 = fake_run(tmp_path, 'per', 0, [10, 20, 30], [1.0, 2.0, 3.0])
    r1 = fake_run(tmp_path, 'per', 1, [10, 20], [3.0, 4.0])  # killed early: no summary.json, run.json only
    (group,), lines, bands = drawn([r0, r1])
    (mean,) = [ln for ln in lines if ln.get_label() == 'per (2 seeds)']  # solid: both seeds
    assert mean.get_linestyle() == '-' and mean.get_marker() not in (None, '', 'None') and len(bands) == 1
    x, y = np.asarray(mean.get_xdata(), float), np.asarray(mean.get_ydata(), float)
    assert x[~np.isnan(x)].tolist() == [10, 20] and y.tolist() == [2.0, 3.0, 3.0]
    (tail,) = [ln for ln in lines if ln.get_linestyle() == '--' and not ln.get_label().startswith('stop')]
    x = np.asarray(tail.get_xdata(), float)
    assert x[~np.isnan(x)].tolist() == [20, 30] and group.partial  # dashed: only seed 0 reached 30
    assert tail.get_marker() not in (None, '', 'None')
    (group,), _, _ = drawn([r0, fake_run(tmp_path, 'per', 2, [10, 20, 30], [0.0, 0.0, 0.0])])
    assert not group.partial


def test_plot_runs_writes_png_atomically_with_legend_outside(tmp_path):
    runs = [fake_run(tmp_path, 'per', s, [10, 20, 30], [s + 1.0, s + 5.0, s + 9.0]) for s in range(3)]
    out = tmp_path / 'figs' / 'c.png'
    assert plot_runs(runs, str(out), title='t') == str(out)
    assert sorted(os.listdir(out.parent)) == ['c.png'] and out.read_bytes()[:8] == PNG_MAGIC


def test_hypergrid_run_is_refused_with_a_clear_error(tmp_path):
    d = tmp_path / 'hg_seed0'
    d.mkdir()
    write_eval_csv(str(d), [{'iteration': 0, 'loss': 1.0}], fields=('iteration', 'loss'))
    with pytest.raises(ValueError, match='not a DQN / Ape-X run'):
        plot_runs([str(d)], str(tmp_path / 'p.png'))
    assert not (tmp_path / 'p.png').exists()


def test_cli_plot_exits_0_and_writes_png(tmp_path, capsys):
    runs = [fake_run(tmp_path / f'f{i}', 'per', s, [10, 20], [1.0, 2.0]) for i in (0, 1) for s in (0, 1)]
    out = tmp_path / 'curves.png'
    assert main(['plot', *runs, '--out', str(out)]) == 0
    assert f'wrote {out}' in capsys.readouterr().out
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_run_not_evaluated_yet_plots_without_error(tmp_path):
    empty = fake_run(tmp_path, 'new', 0, [], [])
    other = fake_run(tmp_path, 'new', 1, [10, 20], [1.0, 2.0])
    (group,), lines, _ = drawn([empty, other])
    assert group.label == 'new (2 seeds)' and not group.partial  # the empty seed adds nothing, hides nothing
    assert plot_runs([empty], str(tmp_path / 'e.png')).endswith('e.png')


def test_the_band_of_several_seeds_is_the_standard_error_of_their_mean(tmp_path):
    returns = [[10.0, 100.0], [20.0, 300.0], [60.0, 200.0]]
    runs = [fake_run(tmp_path, 'per', s, [10, 20], r) for s, r in enumerate(returns)]
    _, _, (band,) = drawn(runs)
    (path,) = band.get_paths()
    ys = path.vertices[:, 1]
    for k in range(2):
        col = np.array([r[k] for r in returns])
        sem = np.std(col, ddof=1) / np.sqrt(len(col))
        assert np.isclose(ys, col.mean() + sem).any() and np.isclose(ys, col.mean() - sem).any()
    assert ys.max() <= max(max(r) for r in returns)  # within what the seeds reached (here; a std band is not)


def test_an_eval_csv_row_with_an_empty_value_is_refused_naming_it(tmp_path):
    d = fake_run(tmp_path, 'cut', 0, [100, 200], [10.0, 20.0])
    text = (tmp_path / 'cut_seed0' / 'eval.csv').read_text().splitlines()
    text[2] = text[2].replace('20.0', '', 1)  # row 2's return_mean left empty
    (tmp_path / 'cut_seed0' / 'eval.csv').write_text('\n'.join(text) + '\n')
    with pytest.raises(ValueError, match=r"row 2 of its eval.csv has no value for \['return_mean'\]"):
        drawn([d])


def test_cli_plot_errors_of_the_filesystem_and_the_table_are_one_line(tmp_path, capsys):
    run = fake_run(tmp_path, 'per', 0, [10, 20], [1.0, 2.0])
    long = tmp_path / ('a' * 300 + '.png')  # a name longer than the filesystem takes: the write's OSError
    assert main(['plot', run, '--out', str(long)]) == 2
    err = capsys.readouterr().err
    assert err.startswith('ding-buffer: error: ') and 'Traceback' not in err and len(err.splitlines()) == 1
    csv = tmp_path / 'per_seed0' / 'eval.csv'
    csv.write_text(csv.read_text().replace('2.0', 'abc', 1))
    assert main(['plot', run, '--out', str(tmp_path / 'p.png')]) == 2
    err = capsys.readouterr().err
    assert f'{csv} is not an evaluation table of numbers' in err and "'abc'" in err
    csv.write_text(csv.read_text().replace('abc', '2.0,7', 1))  # a row with a cell more than the header
    assert main(['plot', run, '--out', str(tmp_path / 'p.png')]) == 2
    assert f'{csv} is not an evaluation table of numbers: TypeError' in capsys.readouterr().err

"""Learning curves: evaluation return over env steps for one or several run directories, in one PNG.

What a run directory records for the plot (``read_run_info``): ``run.json``, written atomically by the DQN and Ape-X
jobs when a run starts (``write_run_info``: exp_name, seed, env_id, stop_value, the resolved config and its
``config_id``), so a run still in progress or killed plots like a finished one; else the ``summary.json`` a finished
run wrote (exp_name, seed, stop_value); else nothing but the directory name.

Rules of the figure (``plot_runs``):

* **Groups** (``group_runs``): runs with the same parent folder, exp_name and ``config_id`` -- the hash of the
  resolved config without the seed and the run's own paths -- are the seeds of one group; runs from different
  folders or of different configs never merge. Without ``run.json`` a run's group is (parent folder, directory name
  without ``_seed<N>``). Labels are ``<exp_name> (<N> seeds)`` / ``<exp_name> (seed <S>)``; groups that would share
  a label are qualified by the shortest distinguishing suffix of their parent folder (``a/runs/x`` vs
  ``b/runs/x``), and by their config id when they share the folder too.
* **Curves**: a single run draws the mean evaluation return with a band of +- the std of its evaluation episodes,
  kept within the lowest and highest episode return of each evaluation (runs that recorded them).
  A group of several seeds draws the mean over seeds with a band of +- its standard error (the sample std over
  seeds / sqrt(seeds); ``mean_band`` returns the population std and the seed count) on the union of the group's
  evaluation steps: each seed is linearly interpolated between its own
  evaluations and counts only inside its own evaluated range (never extrapolated). Where every seed counts the
  mean is a solid line; where some seed has not got that far (a run killed or still running, an Ape-X run whose
  evaluations fall at other steps) it is dashed -- the mean of the seeds that did. Every curve has markers, so a
  one-evaluation run shows a dot.
* **Stop value**: from the runs (``stop_value=None``) -- one grey dashed line when every run that records one
  agrees, else one dashed line per group in the group's colour; an explicit ``stop_value`` overrides them all.
* The legend sits below the axes (the figure grows with it), so it never covers data.
"""

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .evals import read_eval_csv

RUN_INFO = 'run.json'
_SEED_SUFFIX = re.compile(r'_seed(-?\d+)$')


# ---------------------------------------------------------------------------------------------------- run metadata
def _plain(obj: Any) -> Any:
    """JSON-able stand-in for what a config may hold besides plain data (a class, a function): its import name."""
    if hasattr(obj, '__qualname__'):
        return f'{getattr(obj, "__module__", "?")}.{obj.__qualname__}'
    return repr(obj)


def config_id(cfg: Mapping, run_dir: str) -> str:
    """
    Overview:
        Identity of a run's config up to the seed: the first 12 hex digits of the SHA-1 of ``cfg`` as sorted JSON,
        without the key ``seed`` (and any nested ``seed`` equal to it), ``log_dir``, and with paths inside
        ``run_dir`` made relative. Seeds of one config share it; any other difference changes it.
    """
    seed = cfg.get('seed')
    root = os.path.abspath(run_dir)

    def strip(x: Any, top: bool) -> Any:
        if isinstance(x, Mapping):
            return {
                k: strip(v, False)
                for k, v in x.items()
                if not (k == 'seed' and (top or v == seed)) and not (top and k == 'log_dir')
            }
        if isinstance(x, (list, tuple)):
            return [strip(v, False) for v in x]
        if isinstance(x, str) and (x == root or x.startswith(root + os.sep)):
            return '<run_dir>' + x[len(root) :]
        return x

    text = json.dumps(strip(cfg, True), sort_keys=True, default=_plain)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def write_run_info(run_dir: str, cfg: Mapping, job: str) -> Dict[str, Any]:
    """
    Overview:
        Write ``run_dir/run.json`` atomically at the start of a DQN / Ape-X run: what the plot needs to group the
        run and draw its stop value before ``summary.json`` exists. Returns what it wrote.
    """
    from ..persistence import atomic_json

    env = cfg.get('env') or {}
    info = {
        'job': job,
        'exp_name': cfg.get('exp_name'),
        'seed': cfg.get('seed'),
        'env_id': env.get('env_id'),
        'stop_value': env.get('stop_value'),
        'config_id': config_id(cfg, run_dir),
        'config': json.loads(json.dumps(cfg, default=_plain)),
    }
    atomic_json(info, os.path.join(run_dir, RUN_INFO))
    return info


def _load_json(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"'{path}' is not readable JSON ({e}); remove it to plot the run without it") from e
    return data if isinstance(data, dict) else None


def read_run_info(run_dir: str) -> Dict[str, Any]:
    """
    Overview:
        What ``run_dir`` records about its run: ``exp_name``, ``seed``, ``stop_value``, ``env_id``, ``config_id``
        (each None when unknown), from ``run.json``, completed by ``summary.json``, completed by the directory
        name (``<exp_name>_seed<seed>``).
    """
    info: Dict[str, Any] = {k: None for k in ('exp_name', 'seed', 'stop_value', 'env_id', 'config_id')}
    for name in ('summary.json', RUN_INFO):  # run.json wins: it carries the config identity
        data = _load_json(os.path.join(run_dir, name)) or {}
        info.update({k: data[k] for k in info if data.get(k) is not None})
    base = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    m = _SEED_SUFFIX.search(base)
    if info['exp_name'] is None:
        info['exp_name'] = base[: m.start()] if m else base
    if info['seed'] is None and m:
        info['seed'] = int(m.group(1))
    return info


# ---------------------------------------------------------------------------------------------------- grouping
@dataclass
class RunGroup:
    """Runs of one config (its seeds): ``label`` for the legend, ``run_dirs`` in the order given, their ``infos``."""

    key: Tuple[str, str, Optional[str]]
    label: str = ''
    run_dirs: List[str] = field(default_factory=list)
    infos: List[Dict[str, Any]] = field(default_factory=list)
    partial: bool = False  # set by draw_runs: part of the mean averages fewer seeds than the group has (dashed)

    @property
    def name(self) -> str:
        return self.key[1]

    @property
    def stop_values(self) -> List[float]:
        """The distinct stop values its runs record (empty when none does)."""
        return sorted({float(i['stop_value']) for i in self.infos if i['stop_value'] is not None})


def _count(group: RunGroup) -> str:
    seeds = [i['seed'] for i in group.infos]
    n = len(seeds)
    if None in seeds:
        return f' ({n} runs)' if n > 1 else ''
    return f' (seed {seeds[0]})' if n == 1 else f' ({n} seeds)'


def _parent_suffixes(parents: Sequence[str]) -> Dict[str, str]:
    """The shortest trailing part of each folder in ``parents`` (distinct paths) that tells them apart."""
    parts = {p: p.strip(os.sep).split(os.sep) for p in parents}
    for k in range(1, max(len(v) for v in parts.values()) + 1):
        tails = {p: os.sep.join(v[-k:]) for p, v in parts.items()}
        if len(set(tails.values())) == len(tails):
            return tails
    return {p: p for p in parents}  # one is a trailing part of another: the full paths differ


def group_runs(run_dirs: Sequence[str]) -> List[RunGroup]:
    """
    Overview:
        Group ``run_dirs`` by config (see the module docstring), in the order of their first run; a directory
        given twice counts once. Each group gets a distinct, readable ``label``.
    Examples:
        >>> [(g.label, len(g.run_dirs)) for g in group_runs(['a/per_seed0', 'a/per_seed1', 'b/per_seed0'])]
        [('a/per (2 seeds)', 2), ('b/per (seed 0)', 1)]
    """
    groups: Dict[Tuple[str, str, Optional[str]], RunGroup] = {}
    seen = set()
    for run in run_dirs:
        path = os.path.realpath(run)
        if path in seen:
            continue
        seen.add(path)
        info = read_run_info(run)
        key = (os.path.dirname(path), str(info['exp_name']), info['config_id'])
        group = groups.setdefault(key, RunGroup(key))
        group.run_dirs.append(run)
        group.infos.append(info)
    by_name: Dict[str, List[RunGroup]] = {}
    for g in groups.values():
        by_name.setdefault(g.name, []).append(g)
    for name, same in by_name.items():
        parents = sorted({g.key[0] for g in same})
        tails = _parent_suffixes(parents) if len(parents) > 1 else {parents[0]: ''}
        for g in same:
            label = f'{tails[g.key[0]]}/{name}' if tails[g.key[0]] else name
            if sum(h.key[0] == g.key[0] for h in same) > 1:  # same folder and name, another config
                label += f' [config {g.key[2] or "unrecorded"}]'
            g.label = label + _count(g)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------------- aggregation
class Band(NamedTuple):
    """Mean over seeds at ``steps``, the (population) ``std`` over seeds, and ``n``: how many seeds each point
    averages (a seed counts only inside its own evaluated range)."""

    steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    n: np.ndarray


def _sorted_curve(steps: Sequence[float], *columns: Sequence[float]) -> Tuple[np.ndarray, ...]:
    """``steps`` sorted, and each of ``columns`` in that order; a step evaluated twice keeps its last values."""
    x = np.asarray(steps, float)
    order = np.argsort(x, kind='stable')
    keep = np.append(x[order][1:] != x[order][:-1], True)[: len(x)]
    return tuple(np.asarray(c, float)[order][keep] for c in (steps, *columns))


def mean_band(curves: Sequence[Tuple[Sequence[float], Sequence[float]]]) -> Band:
    """
    Overview:
        Mean and population std over seeds of ``curves`` (``(env_steps, returns)`` per seed) on the union of all
        seeds' evaluation steps. At each step a seed contributes its value linearly interpolated between its own
        evaluations -- only inside its own ``[first, last]`` evaluated step, never extrapolated -- and ``n`` counts
        the seeds that contributed; ``n == len(curves)`` on the steps every seed covers.
    Examples:
        >>> b = mean_band([([0, 10, 20], [0., 10., 20.]), ([0, 5, 10], [2., 4., 6.])])
        >>> b.steps.tolist(), b.mean.tolist(), b.n.tolist()
        ([0.0, 5.0, 10.0, 20.0], [1.0, 4.5, 8.0, 20.0], [2, 2, 2, 1])
    """
    xy = [_sorted_curve(x, y) for x, y in curves if len(x)]
    grid = np.unique(np.concatenate([x for x, _ in xy])) if xy else np.zeros(0)
    vals = np.full((len(xy), len(grid)), np.nan)
    for i, (x, y) in enumerate(xy):
        inside = (grid >= x[0]) & (grid <= x[-1])
        vals[i, inside] = np.interp(grid[inside], x, y)
    n = np.sum(~np.isnan(vals), axis=0)
    mean = np.nanmean(vals, axis=0) if len(grid) else grid
    std = np.sqrt(np.nanmean((vals - mean) ** 2, axis=0)) if len(grid) else grid
    return Band(grid, mean, std, n)


# ---------------------------------------------------------------------------------------------------- drawing
def _read_returns(run: str) -> List[Dict[str, float]]:
    rows = read_eval_csv(run)
    needed = {'env_step', 'return_mean', 'return_std'}
    blank = next((k for k, r in enumerate(rows) if not needed <= r.keys()), None)
    if blank is not None and blank > 0:  # a DQN / Ape-X file whose later row left a value empty
        raise ValueError(
            f"'{run}': row {blank + 1} of its eval.csv has no value for {sorted(needed - rows[blank].keys())}"
        )
    if rows and not needed <= rows[0].keys():
        raise ValueError(
            f"'{run}' is not a DQN / Ape-X run (its eval.csv has columns {sorted(rows[0])}); "
            f"this plot draws evaluation returns -- a HyperGrid run draws its own "
            f"learning_curve.png in its directory"
        )
    return rows


def _band(ax: Any, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str) -> None:
    """The shaded band between ``lo`` and ``hi``; at a single step (no width to shade) an error bar instead."""
    if len(x) == 1:
        ax.errorbar(x, (lo + hi) / 2, yerr=(hi - lo) / 2, fmt='none', ecolor=color, alpha=0.5, capsize=4)
    else:
        ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)


def _draw_single_run(ax: Any, group: RunGroup, run_rows: List[Dict[str, float]], color: str) -> None:
    """The one run of ``group`` (the single-run rule of the module docstring)."""
    keys = ['env_step', 'return_mean', 'return_std']
    if all('return_min' in r and 'return_max' in r for r in run_rows):  # never outside the episodes' range
        keys += ['return_min', 'return_max']
    x, y, std, *episode_range = _sorted_curve(*([r[k] for r in run_rows] for k in keys))
    lo, hi = y - std, y + std
    if episode_range:
        lo, hi = np.maximum(lo, episode_range[0]), np.minimum(hi, episode_range[1])
    ax.plot(x, y, color=color, lw=1.5, marker='o', ms=4, label=group.label)
    _band(ax, x, lo, hi, color)


def _draw_seed_mean(ax: Any, group: RunGroup, curves: List[Tuple[np.ndarray, np.ndarray]], color: str) -> None:
    """The seeds of ``group`` (``curves``: their sorted evaluation returns): the mean over seeds, solid where every
    seed counts and dashed where only some do (``group.partial``), with a band of +- its standard error."""
    band = mean_band(curves)
    full = band.n == sum(len(x) > 0 for x, _ in curves)  # a run not evaluated yet has nothing to add
    if np.any(full):
        ax.plot(np.where(full, band.steps, np.nan), band.mean, color=color, lw=1.8, marker='o', ms=4, label=group.label)
    group.partial = bool(np.any(~full))
    if group.partial:  # steps not every seed reaches: the mean of those that do, dashed
        partial = ~full
        partial[1:] |= ~full[:-1]  # with the neighbouring full points: the dashed part joins the solid one
        partial[:-1] |= ~full[1:]
        ax.plot(
            np.where(partial, band.steps, np.nan),
            band.mean,
            color=color,
            lw=1.2,
            ls='--',
            marker='o',
            ms=3,
            label=None if np.any(full) else group.label,
        )
    # standard error of the mean over seeds: sample std / sqrt(n) = population std / sqrt(n - 1)
    sem = np.where(band.n > 1, band.std / np.sqrt(np.maximum(band.n - 1, 1)), 0.0)
    _band(ax, band.steps, band.mean - sem, band.mean + sem, color)


def _draw_stop_values(ax: Any, groups: List[RunGroup], colors: List[str], stop_value: Optional[float]) -> None:
    """``stop_value`` as one grey dashed line; when None, the runs' own: one grey line when they all agree, else one
    line per group in the group's colour."""
    values = [stop_value] if stop_value is not None else sorted({v for g in groups for v in g.stop_values})
    if len(values) == 1:
        ax.axhline(values[0], color='grey', ls='--', lw=1, label=f'stop value {values[0]:g}')
        return
    for k, group in enumerate(groups):
        for v in group.stop_values:
            ax.axhline(v, color=colors[k % len(colors)], ls='--', lw=1, alpha=0.8, label=f'stop value {v:g}')


def draw_runs(ax: Any, run_dirs: Sequence[str], stop_value: Optional[float] = None) -> List[RunGroup]:
    """
    Overview:
        Draw the learning curves of ``run_dirs`` on the matplotlib axes ``ax`` (the rules of the module docstring;
        legend labels set on the artists) and return their groups. ``stop_value``: None draws the runs' own.
    """
    import matplotlib.pyplot as plt

    rows = {run: _read_returns(run) for run in run_dirs}  # every run checked before anything is drawn
    groups = group_runs(run_dirs)
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for k, group in enumerate(groups):
        color = colors[k % len(colors)]
        if len(group.run_dirs) == 1:
            _draw_single_run(ax, group, rows[group.run_dirs[0]], color)
            continue
        curves = [
            _sorted_curve([r['env_step'] for r in rows[run]], [r['return_mean'] for r in rows[run]])
            for run in group.run_dirs
        ]
        _draw_seed_mean(ax, group, curves, color)
    _draw_stop_values(ax, groups, colors, stop_value)
    return groups


def _add_legend(fig: Any, ax: Any, groups: List[RunGroup]) -> None:
    """The legend of ``ax`` below the axes, titled with what the bands (and dashes) of ``groups`` mean; the figure
    grows to make room for it."""
    notes = []
    if any(len(g.run_dirs) == 1 for g in groups):
        notes.append('single run: mean ± std of its evaluation episodes')
    if any(len(g.run_dirs) > 1 for g in groups):
        notes.append(
            'several seeds: mean ± standard error over seeds'
            + (' (dashed: not every seed reached those steps)' if any(g.partial for g in groups) else '')
        )
    handles, labels = ax.get_legend_handles_labels()
    ncols = 1 if max((len(s) for s in labels), default=0) > 45 else min(len(labels), 3)
    rows = -(-len(labels) // max(ncols, 1))
    fig.set_size_inches(8, 4.6 + 0.22 * (rows + len(notes)))
    fig.legend(
        handles,
        labels,
        loc='outside lower center',
        ncols=max(ncols, 1),
        fontsize=8,
        frameon=False,
        title='\n'.join(notes),
        title_fontsize=8,
    )


def _save_figure(fig: Any, out: str) -> str:
    """Save ``fig`` to ``out`` atomically (a temporary file renamed over it) and return its absolute path."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f'{out}.tmp-{os.getpid()}.png'
    try:
        fig.savefig(tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out


def plot_runs(run_dirs: List[str], out: str, title: Optional[str] = None, stop_value: Optional[float] = None) -> str:
    """
    Overview:
        Plot ``eval.csv`` of every run directory into ``out`` (PNG), written atomically, and return its absolute
        path: one curve per config (its seeds averaged), markers on every evaluation, the stop value(s) the runs
        record (or ``stop_value``), the legend below the axes. See the module docstring for the rules.
    """
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(8, 4.6), dpi=110, layout='constrained')
    ax = fig.add_subplot()
    try:
        groups = draw_runs(ax, run_dirs, stop_value)
        ax.set_xlabel('env steps')
        ax.set_ylabel('mean evaluation return')
        ax.set_title(title or ', '.join(dict.fromkeys(g.name for g in groups)))
        ax.grid(alpha=0.3)
        _add_legend(fig, ax, groups)
        out = _save_figure(fig, out)
    finally:
        plt.close(fig)
    return out


__all__ = [
    'plot_runs',
    'draw_runs',
    'group_runs',
    'mean_band',
    'Band',
    'RunGroup',
    'read_run_info',
    'write_run_info',
    'config_id',
]

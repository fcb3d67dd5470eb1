"""Learning curves: evaluation return over env steps for one or several run directories, in one PNG."""
import os
from typing import List, Optional

from .evals import read_eval_csv


def plot_runs(run_dirs: List[str], out: str, title: Optional[str] = None, stop_value: Optional[float] = 475.0) -> str:
    """
    Overview:
        Plot ``eval.csv`` of every run directory (mean +- std of the evaluation episodes) into ``out`` (PNG),
        written atomically. Runs whose names differ only by ``_seed<N>`` share a colour.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    groups = {}
    for run in run_dirs:
        name = os.path.basename(os.path.normpath(run))
        rows = read_eval_csv(run)
        if rows and not {'env_step', 'return_mean', 'return_std'} <= rows[0].keys():
            raise ValueError(f"'{run}' is not a DQN / Ape-X run (its eval.csv has columns {sorted(rows[0])}); "
                             f"this plot draws evaluation returns -- a HyperGrid run draws its own "
                             f"learning_curve.png in its directory")
        groups.setdefault(name.rsplit('_seed', 1)[0], []).append((name, rows))
    colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for k, (group, runs) in enumerate(sorted(groups.items())):
        color = colors[k % len(colors)]
        for i, (name, rows) in enumerate(runs):
            x = [r['env_step'] for r in rows]
            y = [r['return_mean'] for r in rows]
            ax.plot(x, y, color=color, alpha=0.85 if len(runs) == 1 else 0.55, lw=1.4,
                    label=group if i == 0 else None)
            if len(runs) == 1:
                lo = [r['return_mean'] - r['return_std'] for r in rows]
                hi = [r['return_mean'] + r['return_std'] for r in rows]
                ax.fill_between(x, lo, hi, color=color, alpha=0.15)
    if stop_value is not None:
        ax.axhline(stop_value, color='grey', ls='--', lw=1, label=f'{stop_value:g}')
    ax.set_xlabel('env steps')
    ax.set_ylabel('mean evaluation return')
    ax.set_title(title or ', '.join(sorted(groups)))
    ax.grid(alpha=0.3)
    ax.legend(loc='lower right', fontsize=8)
    fig.tight_layout()
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = f'{out}.tmp-{os.getpid()}.png'
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return out

"""The main job's results: DQN on CartPole-v1 with prioritized vs uniform replay, several seeds each.

Runs ``ding-buffer train config/cartpole_dqn_{per,uniform}.py --seed S`` as separate processes (``--jobs`` at a
time, one torch thread each), then prints a table per config -- env steps until the mean evaluation return
first reached ``stop_value`` (475), best and final evaluation return, wall time -- and writes the overlay plot
and a JSON of all summaries.

    python benchmarks/train_cartpole.py [--seeds 0 1 2 3 4] [--jobs 2] [--out-dir benchmarks/results/cartpole]
                                        [--plot docs/cartpole_per_vs_uniform.png]

The issue's target: with the PER config, >= 475 within 50,000 env steps for at least 4 of 5 seeds, each run
under 5 minutes on this 2-core CPU machine.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {'per': 'config/cartpole_dqn_per.py', 'uniform': 'config/cartpole_dqn_uniform.py'}


def run_all(
    configs: List[str],
    seeds: List[int],
    jobs: int,
    out_dir: str,
    timeout: float,
    exp_of=lambda name: f'cartpole_dqn_{name}',
) -> Dict[str, List[dict]]:
    """Run ``out_dir/<name>.py`` for every config and seed, ``jobs`` at a time; each run's summary (its run directory
    is ``out_dir/runs/<exp_of(name)>_seed<seed>``), or a failure record."""
    pending = [(name, seed) for seed in seeds for name in configs]  # interleaved: both configs see the same load
    running, results = [], {name: [] for name in configs}
    while pending or running:
        while pending and len(running) < jobs:
            name, seed = pending.pop(0)
            cfg_path = os.path.join(out_dir, f'{name}.py')
            cmd = [sys.executable, '-m', 'ding_buffer', 'train', cfg_path, '--seed', str(seed), '--no-progress']
            log = open(os.path.join(out_dir, f'{name}_seed{seed}.log'), 'w')
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            running.append((proc, name, seed, time.monotonic(), log))
            print(f'started {name} seed {seed}', flush=True)
        for entry in list(running):
            proc, name, seed, t0, log = entry
            if proc.poll() is None and time.monotonic() - t0 < timeout:
                continue
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()
            running.remove(entry)
            summary_path = os.path.join(out_dir, 'runs', f'{exp_of(name)}_seed{seed}', 'summary.json')
            if proc.returncode == 0 and os.path.isfile(summary_path):
                with open(summary_path) as f:
                    results[name].append(json.load(f))
                print(f'finished {name} seed {seed}', flush=True)
            else:
                results[name].append({'seed': seed, 'failed': True, 'returncode': proc.returncode})
                print(f'FAILED {name} seed {seed} (exit {proc.returncode}); see its log', flush=True)
        time.sleep(0.5)
    return results


def write_configs(configs: List[str], out_dir: str) -> None:
    """Copies of the ready configs whose runs go under ``out_dir/runs`` (the configs themselves are untouched)."""
    for name in configs:
        with open(os.path.join(ROOT, CONFIGS[name])) as f:
            text = f.read()
        text += (
            f"\nmain_config['log_dir'] = {os.path.join(out_dir, 'runs')!r}\nmain_config['checkpoint'] = "
            "dict(freq=None, keep=1)\n"
        )
        with open(os.path.join(out_dir, f'{name}.py'), 'w') as f:
            f.write(text)


def table(name: str, rows: List[dict]) -> str:
    lines = [
        f'**{name}**',
        '',
        '| seed | env steps to 475 | best eval return | final eval return | wall time (s) |',
        '|---:|---:|---:|---:|---:|',
    ]
    for r in sorted(rows, key=lambda r: r['seed']):
        if r.get('failed'):
            lines.append(f"| {r['seed']} | failed (exit {r['returncode']}) | | | |")
            continue
        solved = f"{r['solved_step']:,}" if r['solved_step'] is not None else 'not reached'
        lines.append(
            f"| {r['seed']} | {solved} | {r['best_eval_return']:.1f} | {r['final_eval_return']:.1f} | "
            f"{r['wall_time_s']:.0f} |"
        )
    ok = [r for r in rows if not r.get('failed')]
    solved = [r for r in ok if r['solved_step'] is not None]
    lines.append('')
    lines.append(
        f"solved (>= 475 within the run) {len(solved)}/{len(rows)}; max wall time "
        f"{max((r['wall_time_s'] for r in ok), default=float('nan')):.0f} s"
    )
    return '\n'.join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    p.add_argument('--configs', nargs='+', default=['per', 'uniform'], choices=sorted(CONFIGS))
    p.add_argument('--jobs', type=int, default=2)
    p.add_argument('--out-dir', default=os.path.join(ROOT, 'benchmarks', 'results', 'cartpole'))
    p.add_argument('--plot', default=os.path.join(ROOT, 'docs', 'cartpole_per_vs_uniform.png'))
    p.add_argument('--timeout', type=float, default=900.0, help='seconds before a run is killed')
    args = p.parse_args()
    out_dir = os.path.abspath(args.out_dir)
    if os.path.isdir(os.path.join(out_dir, 'runs')):
        raise SystemExit(f"{out_dir}/runs exists: remove it (or pass another --out-dir) for a fresh measurement")
    os.makedirs(out_dir, exist_ok=True)
    write_configs(args.configs, out_dir)
    t0 = time.monotonic()
    results = run_all(args.configs, args.seeds, args.jobs, out_dir, args.timeout)
    print(
        f"\n# CartPole-v1 DQN, {len(args.seeds)} seeds, {args.jobs} runs at a time "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, total {time.monotonic() - t0:.0f} s)\n"
    )
    exp_of = lambda name: f'cartpole_dqn_{name}'  # noqa: E731
    report(results, args.seeds, out_dir, exp_of, args.plot, 'CartPole-v1 DQN: prioritized vs uniform replay')
    return 0


def report(results: Dict[str, List[dict]], seeds: List[int], out_dir: str, exp_of, plot: str, title: str) -> None:
    """Print a table per config, write the overlay plot of every run's curve and ``out_dir/results.json``."""
    for name in results:
        print(table(exp_of(name), results[name]) + '\n')
    sys.path.insert(0, ROOT)
    from ding_buffer.train.plot import plot_runs

    runs = [os.path.join(out_dir, 'runs', f'{exp_of(n)}_seed{s}') for n in results for s in seeds]
    runs = [r for r in runs if os.path.isfile(os.path.join(r, 'eval.csv'))]
    if runs:
        print('wrote', plot_runs(runs, plot, title=title))
    with open(os.path.join(out_dir, 'results.json'), 'w') as f:
        json.dump(results, f, indent=2)


if __name__ == '__main__':
    sys.exit(main())

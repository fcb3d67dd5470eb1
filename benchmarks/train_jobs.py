"""Result tables of the distributed and GFlowNet training jobs, several seeds each (the README's tables).

    python benchmarks/train_jobs.py apex [--seeds 0 1 2] [--backends torch mpi ray] [--nproc 4] [--env-steps N]
    python benchmarks/train_jobs.py hypergrid [--seeds 0 1 2] [--iterations N] [--configs nobuffer gfn ...]

``apex``: ``ding-buffer train config/cartpole_apex.py --nproc N --seed S`` with ``distributed.backend`` set to
each backend (a copy of the config under ``--out-dir``; the shipped file is untouched). Columns: transitions
until the greedy evaluation first reached 475, best and final evaluation return, gradient steps, wall time of
the whole command (start-up of every rank included).

``hypergrid``: ``ding-buffer train config/hypergrid_tb_<name>.py --seed S --iterations N`` for the local configs
(no buffer, ``gfn`` FIFO, ``gfn`` prioritized, ``gfn_diverse``, torchgfn's ``ReplayBuffer``) and the distributed
one (``--nproc``). Columns: final and best L1 distance to the exact target, modes found, |log Z error|, wall time.

Runs are sequential (a job uses every core it gets). Each run's summary.json and log stay under ``--out-dir``;
the tables are printed as markdown with the date, the machine and this command.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYPERGRID = ('nobuffer', 'gfn', 'gfn_prioritized', 'gfn_diverse', 'torchgfn', 'torchgfn_diverse', 'distributed')


def cpu() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def config_copy(out_dir: str, name: str, base: str, backend: str = None) -> str:
    """A config file under ``out_dir`` that loads ``base`` and sends runs to ``out_dir/runs`` (and sets the
    distributed backend when given)."""
    path = os.path.join(out_dir, f'{name}.py')
    lines = [
        "import runpy",
        f"main_config = runpy.run_path({os.path.join(ROOT, base)!r})['main_config']",
        f"main_config['log_dir'] = {os.path.join(out_dir, 'runs')!r}",
        f"main_config['exp_name'] = {name!r}",
    ]
    if backend is not None:
        lines.append(f"main_config['policy']['other']['replay_buffer']['distributed']['backend'] = {backend!r}")
        if backend == 'ray':
            lines.append(f"main_config['policy']['other']['replay_buffer']['distributed']['namespace'] = {name!r}")
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def run(cmd: List[str], log: str, timeout: float) -> Dict:
    t0 = time.monotonic()
    with open(log, 'w') as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 'timeout'
    return {'returncode': rc, 'wall_s': time.monotonic() - t0}


def summary_of(out_dir: str, name: str, seed: int) -> Dict:
    path = os.path.join(out_dir, 'runs', f'{name}_seed{seed}', 'summary.json')
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def fmt_mean(values: List[float], spec: str = '.3f') -> str:
    if not values:
        return '-'
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.mean(values), spec)} ± {format(statistics.stdev(values), spec)}"


def apex(args: argparse.Namespace) -> None:
    rows = []
    for backend in args.backends:
        name = f'apex_{backend}'
        cfg = config_copy(args.out_dir, name, 'config/cartpole_apex.py', backend)
        for seed in args.seeds:
            cmd = [
                sys.executable,
                '-m',
                'ding_buffer',
                'train',
                cfg,
                '--seed',
                str(seed),
                '--nproc',
                str(args.nproc),
                '--no-progress',
                '--env-steps',
                str(args.env_steps),
            ]
            r = run(cmd, os.path.join(args.out_dir, f'{name}_seed{seed}.log'), args.timeout)
            s = summary_of(args.out_dir, name, seed)
            rows.append((backend, seed, r, s))
            print(
                f"{backend} seed {seed}: exit {r['returncode']}, {r['wall_s']:.0f} s, solved at {s.get('solved_step')}",
                flush=True,
            )
    print(
        f"\n*{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu()}; "
        f"`{' '.join(['python', 'benchmarks/train_jobs.py'] + sys.argv[1:])}`*\n"
    )
    print(
        '| backend | seed | transitions to 475 | best eval return | final eval return | gradient steps | '
        'wall time (s) |'
    )
    print('|---|---:|---:|---:|---:|---:|---:|')
    for backend, seed, r, s in rows:
        if not s:
            print(f"| {backend} | {seed} | failed (exit {r['returncode']}) | | | | {r['wall_s']:.0f} |")
            continue
        print(
            f"| {backend} | {seed} | {s['solved_step'] if s['solved_step'] is not None else 'not reached'} | "
            f"{s['best_eval_return']:.0f} | {s['final_eval_return']:.0f} | {s['train_iters']:,} | {r['wall_s']:.0f} |"
        )


def hypergrid(args: argparse.Namespace) -> None:
    results: Dict[str, List] = {}
    for name in args.configs:
        base = f'config/hypergrid_tb_{name}.py'
        run_name = f'hg_{name}'
        cfg = config_copy(args.out_dir, run_name, base)
        for seed in args.seeds:
            cmd = [
                sys.executable,
                '-m',
                'ding_buffer',
                'train',
                cfg,
                '--seed',
                str(seed),
                '--no-progress',
                '--iterations',
                str(args.iterations),
            ]
            if name == 'distributed':
                cmd += ['--nproc', str(args.nproc)]
            r = run(cmd, os.path.join(args.out_dir, f'{run_name}_seed{seed}.log'), args.timeout)
            s = summary_of(args.out_dir, run_name, seed)
            results.setdefault(name, []).append((seed, r, s))
            print(
                f"{name} seed {seed}: exit {r['returncode']}, {r['wall_s']:.0f} s, final L1 {s.get('final_l1_dist')}",
                flush=True,
            )
    print(
        f"\n*{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu()}; "
        f"`{' '.join(['python', 'benchmarks/train_jobs.py'] + sys.argv[1:])}`*\n"
    )
    print('| config | buffer | seeds | final L1 | best L1 | modes found | \\|log Z error\\| | wall time (s) |')
    print('|---|---|---:|---:|---:|---:|---:|---:|')
    for name, runs in results.items():
        ok = [s for _, r, s in runs if s]
        buf = ok[0]['buffer_type'] if ok else '-'
        modes = ', '.join(f"{s['modes_found']}/{s['n_modes']}" for s in ok)
        print(
            f"| `hypergrid_tb_{name}` | {buf} | {len(ok)}/{len(runs)} | "
            f"{fmt_mean([s['final_l1_dist'] for s in ok])} | {fmt_mean([s['best_l1_dist'] for s in ok])} | "
            f"{modes} | {fmt_mean([abs(s['logZ'] - s['logZ_true']) for s in ok])} | "
            f"{fmt_mean([r['wall_s'] for _, r, s in runs if s], '.0f')} |"
        )
    floor = next((s['l1_exact_samples'] for runs in results.values() for _, _, s in runs if s), None)
    if floor is not None:
        print(f"\nL1 that exact samples of the target show at this evaluation size: {floor}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = ap.add_subparsers(dest='job', required=True)
    a = sub.add_parser('apex')
    a.add_argument('--backends', nargs='+', default=['torch', 'mpi', 'ray'])
    a.add_argument('--env-steps', type=int, default=40_000)
    a.add_argument('--nproc', type=int, default=4)
    h = sub.add_parser('hypergrid')
    h.add_argument('--configs', nargs='+', default=list(HYPERGRID), choices=HYPERGRID)
    h.add_argument('--iterations', type=int, default=1000)
    h.add_argument('--nproc', type=int, default=3, help='processes of the distributed config')
    for p in (a, h):
        p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
        p.add_argument('--out-dir', default='/tmp/ding_buffer_train_jobs')
        p.add_argument('--timeout', type=float, default=900.0)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    (apex if args.job == 'apex' else hypergrid)(args)


if __name__ == '__main__':
    main()

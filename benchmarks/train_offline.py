"""Offline-to-online DQN on CartPole-v1: a 50/50 mixture of a trained policy's episodes and online data, against the
same agent from scratch and against offline-only training, several seeds each.

First trains ``config/cartpole_dqn_dataset.py`` once (it writes the dataset: 20 episodes of its trained policy), then
runs, for every seed, ``config/cartpole_dqn_uniform.py`` (from scratch), ``config/cartpole_offline_to_online.py``
(50/50) and the latter with weights offline=1, online=0 (offline-only: the agent acts, but learns from the dataset
alone), ``--jobs`` at a time with one torch thread each; prints a table per config and writes the overlay plot and a
JSON of all summaries.

    python benchmarks/train_offline.py [--seeds 0 1 2 3 4] [--jobs 2] [--env-steps 30000] [--eval-freq 1000]
        [--out-dir benchmarks/results/offline] [--plot docs/cartpole_offline_to_online.png]
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_cartpole import ROOT, report, run_all  # noqa: E402 (this folder's script)

CONFIGS = {
    'scratch': ('config/cartpole_dqn_uniform.py', ''),
    'offline_to_online': ('config/cartpole_offline_to_online.py', ''),
    'offline_only': (
        'config/cartpole_offline_to_online.py',
        "main_config['policy']['other']['replay_buffer']['weights'] = dict(offline=1.0, online=0.0)\n",
    ),
}
DATASET = 'cartpole_dqn_episodes.hdf5'


def write_config(name: str, path: str, extra: str, out_dir: str, env: str = '') -> str:
    """A copy of the ready config ``path`` whose run goes to ``out_dir/runs/<name>_seed<seed>``, reading the dataset
    from ``out_dir`` (``env``: lines setting the compared runs' length and evaluation period); the ready config itself
    is untouched."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    text += (
        f"\nmain_config['exp_name'] = {name!r}\nmain_config['log_dir'] = {os.path.join(out_dir, 'runs')!r}\n"
        "main_config['checkpoint'] = dict(freq=None, keep=1)\n" + extra + env
    )
    if 'dataset_source' in text:
        text += (
            "main_config['dataset_source'] = None\nmain_config['policy']['other']['replay_buffer']['members']"
            f"['offline']['dataset']['path'] = {os.path.join(out_dir, DATASET)!r}\n"
        )
    if name == 'dataset':
        text += f"main_config['dataset_out']['path'] = {os.path.join(out_dir, DATASET)!r}\n"
    out = os.path.join(out_dir, f'{name}.py')
    with open(out, 'w') as f:
        f.write(text)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
    p.add_argument('--jobs', type=int, default=2)
    p.add_argument('--out-dir', default=os.path.join(ROOT, 'benchmarks', 'results', 'offline'))
    p.add_argument('--plot', default=os.path.join(ROOT, 'docs', 'cartpole_offline_to_online.png'))
    p.add_argument('--timeout', type=float, default=1800.0, help='seconds before a run is killed')
    p.add_argument('--env-steps', type=int, default=30_000, help='env steps of each compared run')
    p.add_argument('--eval-freq', type=int, default=1_000, help='env steps between evaluations of the compared runs')
    args = p.parse_args()
    out_dir = os.path.abspath(args.out_dir)
    if os.path.isdir(os.path.join(out_dir, 'runs')):
        raise SystemExit(f"{out_dir}/runs exists: remove it (or pass another --out-dir) for a fresh measurement")
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    source = write_config('dataset', 'config/cartpole_dqn_dataset.py', '', out_dir)
    cmd = [sys.executable, '-m', 'ding_buffer', 'train', source, '--no-progress']
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    print(done.stdout[-800:], flush=True)
    if done.returncode != 0:
        raise SystemExit(f"the dataset run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    env = f"main_config['env'].update(max_env_step={args.env_steps}, eval_freq={args.eval_freq})\n"
    for name, (path, extra) in CONFIGS.items():
        write_config(name, path, extra, out_dir, env)
    results = run_all(list(CONFIGS), args.seeds, args.jobs, out_dir, args.timeout, exp_of=lambda name: name)
    print(
        f"\n# CartPole-v1 DQN, offline-to-online, {len(args.seeds)} seeds, {args.jobs} runs at a time "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, total {time.monotonic() - t0:.0f} s)\n"
    )
    report(
        results,
        args.seeds,
        out_dir,
        lambda name: name,
        args.plot,
        'CartPole-v1 DQN: offline-to-online, scratch, offline',
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())

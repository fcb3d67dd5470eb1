"""The ``ding-buffer`` command.

``ding-buffer demo``: an end-to-end tour -- build buffers from configs, push CartPole-like transitions and
episodes, sample, save atomically, reload into a fresh buffer and check the round trip. User errors exit 2
with a one-line message; nothing is written to the working directory unless ``--out`` says so.
"""
import argparse
import os
import sys
from typing import List, Optional

import torch



def demo(args: argparse.Namespace) -> int:
    from .demo import demo as run_demo
    return run_demo(args)


def _missing_extra(e: ImportError) -> int:
    print(f"ding-buffer: error: {e.name or e} is not installed; install the examples extra: "
          "pip install -e \".[examples]\"", file=sys.stderr)
    return 2


# ``main_config['job']`` picks the training job a config file runs (default 'dqn'): name -> (module, function).
# The function takes the loaded ``main_config`` (a dict) and the parsed arguments and returns the exit status.
JOBS = {
    'dqn': None,  # the single-process DQN job below
    'apex': ('.train.apex', 'run'),
    'hypergrid': ('.train.hypergrid', 'run'),
}


def train(args: argparse.Namespace) -> int:
    """Run (or resume) a training job from a DI-engine-style config file (``main_config['job']`` picks it)."""
    from .train.config import load_config_file
    user = load_config_file(args.config)
    job = user.pop('job', 'dqn')
    if job not in JOBS:
        raise ValueError(f"{args.config}: config key 'job' is {job!r}; expected one of {sorted(JOBS)}")
    if JOBS[job] is not None:
        import importlib
        module, func = JOBS[job]
        try:
            run = getattr(importlib.import_module(module, __package__), func)
        except ImportError as e:
            return _missing_extra(e)
        return run(user, args)
    if args.nproc is not None:
        raise ValueError(f"{args.config}: --nproc is for distributed jobs ('apex', 'hypergrid'); this config runs "
                         f"the single-process 'dqn' job")
    return _train_dqn(user, args)


def _train_dqn(user: dict, args: argparse.Namespace) -> int:
    try:
        from .train.dqn import DQNTrainer
    except ImportError as e:
        return _missing_extra(e)
    from .train.config import build_train_config, check_run_dir, run_dir_of
    if args.seed is not None:
        user['seed'] = args.seed
    if args.env_steps is not None:
        user.setdefault('env', {})
        user['env'] = dict(user['env'], max_env_step=args.env_steps)
    if args.device is not None:
        user['policy'] = dict(user.get('policy') or {}, device=args.device)
    cfg = build_train_config(user, source=args.config)
    run_dir = args.resume or run_dir_of(cfg)
    torch.set_num_threads(args.threads)
    try:
        if args.resume is None:
            check_run_dir(run_dir, cfg.log_dir)
        trainer = DQNTrainer(cfg, run_dir, resume=args.resume is not None, progress=not args.no_progress)
    except ValueError as e:
        raise ValueError(f"{args.config}: {e}") from e
    if trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at env step {trainer.env_step}")
    s = trainer.run()
    solved = f"reached {s['stop_value']:g} at env step {s['solved_step']}" if s['solved_step'] is not None \
        else f"did not reach {s['stop_value']:g}"
    buf = ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else f'{k} {v}' for k, v in s['buffer'].items())
    print(
        f"\n== {s['exp_name']} (seed {s['seed']}, {s['buffer_type']} buffer) ==\n"
        f"  env steps {s['env_steps']}, gradient steps {s['train_iters']}, episodes {s['episodes']}, "
        f"wall time {s['wall_time_s']:.0f} s\n"
        f"  eval return: best {s['best_eval_return']:.1f} (step {s['best_eval_step']}), final "
        f"{s['final_eval_return']:.1f}; {solved}\n"
        f"  buffer: {buf}\n"
        f"  run dir: {s['run_dir']} (TensorBoard: tensorboard --logdir {os.path.join(s['run_dir'], 'log')}; "
        f"curve: learning_curve.png)"
    )
    return 0


def plot(args: argparse.Namespace) -> int:
    """Overlay the evaluation curves of run directories in one PNG."""
    try:
        from .train.plot import plot_runs
    except ImportError as e:
        return _missing_extra(e)
    out = plot_runs(args.run_dirs, args.out, title=args.title)
    print(f"wrote {out}")
    return 0


def _at_least_one(what: str):
    """An argparse type: an int >= 1 (anything else is a usage error naming ``what``, exit 2)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"expected an int >= 1 ({what}), got {text!r}")
        return n
    return parse


_threads = _at_least_one('torch CPU threads')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='ding-buffer', description='ding_buffer command line')
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('demo', help='push, sample, save and reload buffers, printing what happens')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=None, help='keep the saved buffers in this directory (default: a temp dir)')
    p.set_defaults(func=demo)
    p = sub.add_parser('train', help='run a training job from a DI-engine-style config (e.g. config/cartpole_dqn_per.py; '
                                     "main_config['job'] picks dqn / apex / hypergrid)")
    p.add_argument('config', help='config file defining main_config')
    p.add_argument('--seed', type=int, default=None, help='override the config seed')
    p.add_argument('--env-steps', type=int, default=None, help='override env.max_env_step')
    p.add_argument('--resume', default=None, metavar='RUN_DIR', help='continue the run in RUN_DIR from its latest '
                   'complete checkpoint')
    p.add_argument('--device', default=None, help="'cpu' or 'cuda' (overrides policy.device)")
    p.add_argument('--threads', type=_threads, default=1, help='torch CPU threads (1 is fastest for small networks)')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    p.add_argument('--nproc', type=_at_least_one('ranks to start'), default=None, metavar='N',
                   help='distributed jobs: start N ranks on this machine (default: join the ranks torchrun / mpirun '
                        'started, or run locally)')
    p.add_argument('--iterations', type=_at_least_one('training iterations'), default=None, metavar='N',
                   help='GFlowNet jobs: override the number of training iterations')
    p.set_defaults(func=train)
    p = sub.add_parser('plot', help='overlay the evaluation curves of run directories in one PNG')
    p.add_argument('run_dirs', nargs='+', metavar='RUN_DIR')
    p.add_argument('--out', default='learning_curves.png')
    p.add_argument('--title', default=None)
    p.set_defaults(func=plot)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"ding-buffer: error: {e}", file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())

"""The ``ding-buffer`` command: ``train``, ``configs``, ``plot``, ``demo``.

User errors (a bad flag, a bad config) exit 2 with one line and no traceback. This module imports nothing heavy
at the top: ``train`` prints its first line before torch loads. SIGINT / SIGTERM during a training job stop it at
the next step with a final checkpoint and the command that resumes it (exit 130 / 143); a second signal stops at
once.
"""

import argparse
import difflib
import os
import re
import shutil
import sys
import textwrap
import time
from typing import Any, Dict, List, NoReturn, Optional

from .config import STEP_LIMIT
from .ready_configs import list_configs, resolve_config
from .train.env import LAUNCHED


def demo(args: argparse.Namespace) -> int:
    from .demo import demo as run_demo

    return run_demo(args)


def _missing_extra(e: ImportError) -> int:
    print(
        f"ding-buffer: error: {e.name or e} is not installed; install the examples extra: "
        "pip install -e \".[examples]\"",
        file=sys.stderr,
    )
    return 2


# ``main_config['job']`` picks the training job a config file runs (default 'dqn'): name -> (module, function).
# The function takes the loaded ``main_config`` (a dict) and the parsed arguments and returns the exit status.
JOBS = {
    'dqn': None,  # the single-process DQN job below
    'apex': ('.train.apex', 'run'),
    'hypergrid': ('.train.hypergrid_job', 'run'),
}


def _kernels_cached() -> bool:
    """Whether numba's cache beside the package holds compiled kernels (True as well where nothing will compile:
    numba absent or disabled, or its cache kept elsewhere by ``NUMBA_CACHE_DIR``). Reads the folder only: no
    import of numba or torch."""
    import importlib.util

    if os.environ.get('DING_BUFFER_NO_NUMBA', '') not in ('', '0') or os.environ.get('NUMBA_CACHE_DIR'):
        return True
    if importlib.util.find_spec('numba') is None:
        return True
    cache = os.path.join(os.path.dirname(os.path.abspath(__file__)), '__pycache__')
    try:
        return any(name.startswith('tree_kernels.') and name.endswith('.nbi') for name in os.listdir(cache))
    except OSError:
        return False


def train(args: argparse.Namespace) -> int:
    """Run (or resume) a training job from a DI-engine-style config file (``main_config['job']`` picks it)."""
    args.config_arg, args.config = args.config, resolve_config(args.config)
    ready = {c.path: c for c in list_configs()}.get(args.config)
    if ready is not None and ready.job == '-':
        raise ValueError(
            f"{args.config_arg}: a buffer section for create_buffer(...), not a training config; "
            f"`ding-buffer configs` lists the training configs (job dqn / apex / hypergrid)"
        )
    what = f"--resume {args.resume}" if args.resume else 'a new run'
    if os.environ.get(LAUNCHED) != '1':
        print(f"ding-buffer train {args.config}: {what}, loading torch and the job ...", flush=True)
        if not _kernels_cached():
            print(
                "ding-buffer: first run: numba compiles the replay kernels in the background (about half a minute "
                "on a 2-core CPU; numba caches them for later runs)",
                flush=True,
            )
    from .train.config import load_config_file

    user = load_config_file(args.config)
    _keep_resumed_seed(args)
    job = user.pop('job', 'dqn')
    if not isinstance(job, str) or job not in JOBS:
        raise ValueError(f"{args.config}: config key 'job' is {job!r}; expected one of {sorted(JOBS)}")
    if JOBS[job] is not None:
        import importlib

        module, func = JOBS[job]
        try:
            run = getattr(importlib.import_module(module, __package__), func)
        except ImportError as e:
            return _missing_extra(e)
        return run(user, args)
    for flag, value, jobs in (
        ('--nproc', args.nproc, "distributed jobs ('apex', 'hypergrid')"),
        ('--iterations', args.iterations, "GFlowNet jobs ('hypergrid')"),
    ):
        if value is not None:
            raise ValueError(f"{args.config}: {flag} is for {jobs}; this config runs the single-process 'dqn' job")
    return _train_dqn(user, args)


def _train_dqn(user: dict, args: argparse.Namespace) -> int:
    """The single-process DQN job: apply the command-line overrides, train (or resume), print a summary."""
    try:
        from .train.dqn import DQNTrainer
    except ImportError as e:
        return _missing_extra(e)
    import torch

    from .train.checkpoint import complete_checkpoints
    from .train.config import build_train_config, make_trainer, run_dir_of
    from .train.offline import ensure_datasets
    from .train.signals import StopSignals

    _apply_overrides(user, args)
    cfg = build_train_config(user, source=args.config)
    # the source run: its own config; one stopped before (its checkpoints) goes on from there
    fresh = {'seed': None, 'env_steps': None, 'resume': None, 'config_arg': None, 'makes_dataset': True}
    if getattr(args, 'makes_dataset', False) and complete_checkpoints(os.path.join(run_dir_of(cfg), 'checkpoints')):
        args.resume = run_dir_of(cfg)
    if args.resume is None:  # (a resumed run's buffer, datasets' items included, comes from its checkpoint)
        code = ensure_datasets(
            cfg,
            resolve_config,
            lambda path, u: _train_dqn(u, argparse.Namespace(**{**vars(args), **fresh, 'config': path})),
        )
        if code:
            print(
                f"ding-buffer train {args.config_arg or args.config}: stopped while its dataset was being made; run "
                f"this command again to continue that run from its last checkpoint (it writes the dataset at its end)"
            )
            return code
    run_dir = args.resume or run_dir_of(cfg)
    _warn_if_warmup_too_long(cfg)
    torch.set_num_threads(args.threads)
    trainer = make_trainer(DQNTrainer, cfg, run_dir, args, started_at=args.started_at)
    if trainer.resumed_from:
        print(f"resumed from {trainer.resumed_from} at env step {trainer.env_step}")
    with StopSignals() as stop:
        s = trainer.run(stop=stop)
    _print_summary(s)
    return stop.report(args, s['run_dir'], f"env step {s['env_steps']}", resume=not getattr(args, 'makes_dataset', 0))


def _keep_resumed_seed(args: argparse.Namespace) -> None:
    """A resumed run keeps its own seed (its RNGs come from its checkpoint; its evaluations and records use it too):
    without ``--seed`` it is the seed the run recorded (``run.json``, else ``summary.json``), whatever the config
    file says; ``--seed`` naming another one would only relabel the run, so it is refused."""
    if args.resume is None:
        return
    import json

    seed = None
    for record in ('run.json', 'summary.json'):
        try:
            with open(os.path.join(args.resume, record)) as f:
                seed = json.load(f).get('seed')
        except (OSError, ValueError, AttributeError):
            continue  # (no record of the run's seed there)
        if isinstance(seed, int) and not isinstance(seed, bool):
            break
        seed = None
    if seed is None:
        return
    if args.seed is not None and seed != args.seed:
        raise ValueError(
            f"{args.config}: --seed {args.seed} is not the seed of the run being resumed ({seed}, in "
            f"{args.resume}); a resumed run goes on with its own seed: drop --seed, or start a new run"
        )
    args.seed = seed  # (over the config file's)


def _apply_overrides(user: dict, args: argparse.Namespace) -> None:
    """Write ``--seed``, ``--env-steps`` and ``--device`` (those given) into the loaded ``main_config``."""
    if args.seed is not None:
        user['seed'] = args.seed
    if args.env_steps is not None:
        from .train.config import with_env_steps

        with_env_steps(user, args.env_steps)
    if args.device is not None:
        user['policy'] = dict(user.get('policy') or {}, device=args.device)


def _warn_if_warmup_too_long(cfg) -> None:
    """Warn on stderr when the warm-up reaches ``env.max_env_step`` or leaves no gradient step before it. Learning
    runs after the env steps ``warmup_steps .. max_env_step`` (counted from 1) that are multiples of ``train_freq``,
    ``updates_per_step`` times at each, once the buffer can give a batch (so the count is an upper bound)."""
    learn, last = cfg.policy.learn, cfg.env.max_env_step
    first, freq = max(learn.warmup_steps, 1), learn.train_freq
    steps = max(0, last // freq - (first - 1) // freq) * learn.updates_per_step
    if learn.warmup_steps >= last or not steps:
        why = f">= env.max_env_step ({last})" if learn.warmup_steps >= last else f"with train_freq {freq}"
        print(
            f"ding-buffer: warning: policy.learn.warmup_steps ({learn.warmup_steps}) {why}: "
            f"{'no' if not steps else f'at most {steps}'} gradient step{'' if steps == 1 else 's'} will run; "
            "lower the warm-up or raise --env-steps",
            file=sys.stderr,
            flush=True,
        )


def _print_summary(s: dict) -> None:
    """Print the end-of-run summary of a DQN run from the trainer's summary dict ``s``."""
    from .train.dqn import solved_text

    evals = 'no evaluation yet'
    if s['best_eval_return'] is not None:
        evals = f"eval return: best {s['best_eval_return']:.1f} (step {s['best_eval_step']}), final "
        evals += f"{s['final_eval_return']:.1f}"
    buf = ', '.join(f'{k} {v:.4g}' if isinstance(v, float) else f'{k} {v}' for k, v in s['buffer'].items())
    print(
        f"\n== {s['exp_name']} (seed {s['seed']}, {s['buffer_type']} buffer) ==\n"
        f"  env steps {s['env_steps']}, gradient steps {s['train_iters']}, episodes {s['episodes']}, "
        f"wall time {s['wall_time_s']:.0f} s\n"
        f"  {evals}; {solved_text(s)}\n"
        f"  buffer: {buf}\n"
        f"  run dir: {s['run_dir']} (TensorBoard: tensorboard --logdir {os.path.join(s['run_dir'], 'log')}; "
        f"curve: learning_curve.png)"
    )
    if s.get('dataset_out'):
        d = s['dataset_out']
        print(f"  dataset: {d['episodes']} episodes, {d['steps']} steps, mean return {d['return_mean']:.1f}")
        print(f"  dataset file: {d['path']}")


def configs(args: argparse.Namespace) -> int:
    """List the ready configs (installed with the package): name, job, what it is."""
    found = list_configs()
    if not found:
        print("no ready configs found (the package was installed without ding_buffer.configs)", file=sys.stderr)
        return 1
    width = max(len(c.name) for c in found)
    indent = ' ' * (width + 2 + 9 + 2)
    columns = max(shutil.get_terminal_size((120, 24)).columns, len(indent) + 40)
    print(f"{'name':<{width}}  {'job':<9}  description")
    for c in found:
        job = c.job if c.job != '-' else 'buffer'
        head = f"{c.name:<{width}}  {job:<9}  "
        # the whole first paragraph of the config's docstring, wrapped under the description column
        print(
            textwrap.fill(
                c.summary or '-',
                columns,
                initial_indent=head,
                subsequent_indent=indent,
                break_on_hyphens=False,
                break_long_words=False,  # a long class name stays whole (it may run past the column)
            )
        )
    print(
        f"\njob 'buffer': a buffer section for create_buffer(...), not a training job; train one with "
        f"`ding-buffer train NAME`; copy one to edit it (files in {os.path.dirname(found[0].path)})"
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


def _int_at_least(low: int, what: str, below: Optional[int] = None):
    """An argparse type: an int >= ``low`` (and < ``below`` when given); anything else is a usage error naming
    ``what``, exit 2."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low or (below is not None and n >= below):
            most = '' if below is None else f" and at most {below - 1}"
            raise argparse.ArgumentTypeError(f"expected an int >= {low}{most} ({what}), got {text!r:.60}")
        return n

    return parse


def _device(text: str) -> str:
    if not re.fullmatch(r'cpu|cuda(:\d+)?', text):  # (the rule of the config key 'policy.device')
        raise argparse.ArgumentTypeError(f"expected 'cpu', 'cuda' or 'cuda:N', got {text!r}")
    return text


def _run_dir(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"expected an existing run directory, got {text!r} "
            f"({'a file' if os.path.exists(text) else 'no such directory'})"
        )
    return text


def _out_png(text: str) -> str:
    if os.path.isdir(text) or not text.lower().endswith('.png'):
        raise argparse.ArgumentTypeError(f"expected a .png file path, got {text!r}")
    return text


def _out_dir(text: str) -> str:
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r} (an existing file)")
    parent = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(parent):  # the first existing ancestor must be a directory we can create in
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"expected a directory, got {text!r} ({parent!r} is a file)")
    return text


MAX_THREADS = max(4, 4 * (os.cpu_count() or 1))  # torch crashes (SIGSEGV) on absurd counts such as 100000


def _threads(text: str) -> int:
    n = _int_at_least(1, 'torch CPU threads')(text)
    if n > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_THREADS} torch CPU threads (4 x the {os.cpu_count()} CPUs here), got {text!r}"
        )
    return n


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (no usage block) and exit status 2."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)  # (the hint below reads the subcommand named)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> 'NoReturn':
        hint = ''
        if message.startswith('unrecognized arguments:'):
            owners = _option_owners(self, '')
            command = next((f'{self.prog} {a}' for a in getattr(self, '_given', []) if a in _commands(self)), None)
            mine = sorted(f for f, who in owners.items() if command is None or command in who)
            for token in message.split(':', 1)[1].split():
                flag = token.split('=', 1)[0]
                if flag in owners and flag not in mine:  # refused here, an option of another subcommand
                    hint += f"; {flag!r} is an option of {' / '.join(repr(o) for o in owners[flag])} only"
                    continue
                close = difflib.get_close_matches(flag, mine, n=1) if flag.startswith('--') else []
                if close:
                    hint += f"; did you mean {close[0]!r} for {flag!r}?"
        self.exit(2, f"{self.prog}: error: {message}{hint} (see {self.prog} --help)\n")


def _commands(parser: argparse.ArgumentParser) -> List[str]:
    """The subcommands of ``parser``."""
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


def _option_owners(parser: argparse.ArgumentParser, name: str) -> Dict[str, List[str]]:
    """Every long option of ``parser`` (called ``name``) and of its subcommands, with the commands that take it."""
    out: Dict[str, List[str]] = {}
    for action in parser._actions:
        for s in action.option_strings:
            if s.startswith('--') and s != '--help':
                out.setdefault(s, []).append(f'{parser.prog.split()[0]} {name}'.strip())
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                for s, owners in _option_owners(sub, sub_name).items():
                    out.setdefault(s, []).extend(owners)
    return out


def _add_train(sub: "argparse._SubParsersAction") -> None:
    """The `train` subcommand and its options."""
    p = sub.add_parser(
        'train',
        help='run a training job from a DI-engine-style config (a ready config by name, e.g. '
        "cartpole_dqn_per, or a file; main_config['job'] picks dqn / apex / hypergrid)",
    )
    p.add_argument(
        'config', help='a ready config name (`ding-buffer configs` lists them) or a config file defining main_config'
    )
    p.add_argument('--seed', type=_int_at_least(0, 'seed', below=2**63), default=None, help='override the config seed')
    p.add_argument(
        '--env-steps',
        type=_int_at_least(1, 'env steps', below=STEP_LIMIT + 1),
        default=None,
        help='override env.max_env_step',
    )
    p.add_argument(
        '--resume',
        type=_run_dir,
        default=None,
        metavar='RUN_DIR',
        help='continue the run in RUN_DIR from its latest complete checkpoint',
    )
    p.add_argument('--device', type=_device, default=None, help="'cpu' or 'cuda' (overrides policy.device)")
    p.add_argument('--threads', type=_threads, default=1, help='torch CPU threads (1 is fastest for small networks)')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    p.add_argument(
        '--nproc',
        type=_int_at_least(1, 'ranks to start'),
        default=None,
        metavar='N',
        help='distributed jobs: start N ranks on this machine (default: join the ranks torchrun / mpirun '
        'started, or run locally)',
    )
    p.add_argument(
        '--iterations',
        type=_int_at_least(1, 'training iterations', below=STEP_LIMIT + 1),
        default=None,
        metavar='N',
        help='GFlowNet jobs: override the number of training iterations',
    )
    p.set_defaults(func=train)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog='ding-buffer', description='ding_buffer command line')
    sub = parser.add_subparsers(dest='command', required=True)
    p = sub.add_parser('demo', help='a tour of every buffer type: push, sample, save and reload, printing what happens')
    p.add_argument('--seed', type=_int_at_least(0, 'seed', below=2**63), default=0)
    p.add_argument(
        '--out', type=_out_dir, default=None, help='keep the saved buffers in this directory (default: a temp dir)'
    )
    p.set_defaults(func=demo)

    _add_train(sub)

    sub.add_parser('configs', help='list the ready configs installed with the package').set_defaults(func=configs)

    p = sub.add_parser('plot', help='overlay the evaluation curves of run directories in one PNG')
    p.add_argument('run_dirs', nargs='+', type=_run_dir, metavar='RUN_DIR')
    p.add_argument('--out', type=_out_png, default='learning_curves.png', help='the PNG to write')
    p.add_argument('--title', default=None)
    p.set_defaults(func=plot)
    return parser


def main(argv: Optional[List[str]] = None, started_at: Optional[float] = None) -> int:
    """
    Overview:
        Run the command ``argv`` (default ``sys.argv[1:]``); returns the exit status. ``started_at`` is the
        ``time.monotonic()`` a run's wall time counts from (the console script passes the process start; by
        default, this call).
    """
    started_at = time.monotonic() if started_at is None else started_at
    args = build_parser().parse_args(argv)
    args.started_at = started_at
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. `head`, which closed it: not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, OSError, MemoryError) as e:  # (OSError: a path missing, read-only, ...)
        print(f"ding-buffer: error: {str(e) or type(e).__name__}", file=sys.stderr)  # (MemoryError(): no message)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside a training loop
        if os.environ.get(LAUNCHED) != '1':
            print("\nding-buffer: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    """The ``ding-buffer`` console script (and ``python -m ding_buffer``): wall time counts from process start."""
    sys.exit(main(started_at=process_start()))


def process_start() -> float:
    """``time.monotonic()`` at this process's start (Linux: /proc; elsewhere: now)."""
    try:
        with open('/proc/self/stat') as f:
            ticks = int(f.read().rsplit(')', 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open('/proc/uptime') as f:
            uptime = float(f.read().split()[0])
        age = uptime - ticks / os.sysconf('SC_CLK_TCK')
        if 0 <= age < 3600:
            return time.monotonic() - age
    except (OSError, ValueError, IndexError):
        pass
    return time.monotonic()


if __name__ == '__main__':
    console_main()

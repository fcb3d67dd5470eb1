"""DI-engine's own training pipelines on DI-engine's buffers and on ding_buffer, CartPole, several seeds.

What runs
    dizoo's CartPole configs (``cartpole_dqn_config``: stop value 195, 8 collector envs, batch 64, 5 updates per
    collect; ``cartpole_r2d2_config``) through DI-engine 0.5.3's pipelines, unchanged but for the buffer:

    * ``serial-dqn``: ``ding.entry.serial_pipeline``, DQN with uniform replay: DI-engine's ``deque`` (the config's
      own buffer) vs ding_buffer's ``deque`` on list storage vs on tensor storage;
    * ``serial-per``: the same with ``policy.priority=True, priority_IS_weight=True`` and ``type='advanced'``:
      DI-engine's ``advanced`` vs ding_buffer's ``advanced`` (list, tensor);
    * ``task-per``: the task pipeline in the shape of DI-engine's ``ding/example/dqn_per.py`` (``OffPolicyLearner``,
      ``data_pusher``, ``buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))``): DI-engine's
      ``DequeBuffer`` vs ding_buffer's ``TaskBuffer`` (list, tensor);
    * ``r2d2``: R2D2 (a recurrent policy whose items are sequences of 42 steps) through the serial pipeline, a short
      run: DI-engine's ``advanced`` (the buffer the dizoo config gets) vs ding_buffer's ``advanced`` (list, tensor).

    ding_buffer's buffer is the one create-config line (serial pipeline)::

        replay_buffer=dict(type='deque', import_names=['ding_buffer.integrations.dingengine'],
                           storage=dict(type='tensor')),

What is measured, per run
    * env steps at the first evaluation whose mean return reached the stop value (the serial pipeline stops there;
      the task pipeline's evaluator ends the task there); ``--max-env-step`` caps a run that does not get there;
    * the last evaluation's mean return, the learner iterations, the wall time of the pipeline call;
    * learner it/s: learner iterations / the time spent in the learner loop only -- buffer sample + learner train +
      buffer priority update, timed by wrapping those calls in this driver (serial: the buffer's ``sample`` /
      ``update`` and ``BaseLearner.train``; task: the ``OffPolicyLearner`` call, which samples and trains, plus
      the buffer's ``update`` calls the fetcher makes after the step), so env stepping and evaluation do not
      count. The same split gives the buffer's share (sample + update, ms per iteration). Each is also taken per
      round of training (the iterations between two collections) and the median over the rounds reported: on a
      machine shared with other jobs it moves little where a slowed round moves the whole-run figure.

How
    Every run is its own fresh interpreter (this script with ``--worker``), in a scratch directory (DI-engine
    writes its experiment folder there), one run at a time; runs are interleaved (seed by seed, contenders in
    turn) so all contenders see the same machine load. ``--lock FILE`` holds an exclusive ``flock`` on FILE while a
    run goes (other jobs that take the same lock wait). Results go to ``--out`` (JSON, written after every run;
    ``--resume`` skips runs already there) and the tables to stdout and ``--out`` with ``.md``. Nothing is asserted.
    DI-engine needs its own environment (``numpy<2``, an old gym): see docs/benchmarks.md.

Run
    python benchmarks/dingengine_pipelines.py [--suites serial-dqn serial-per task-per r2d2] [--seeds 0 1 2 3 4]
        [--max-env-step 20000] [--r2d2-env-step 10000] [--r2d2-seeds 0 1] [--timeout 1800] [--lock FILE]
"""

import argparse
import datetime
import fcntl
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS_MODULE = 'ding_buffer.integrations.dingengine'
STOP_VALUE = 195

SUITES = {
    'serial-dqn': ('serial pipeline, DQN, uniform replay', ['dingengine', 'ours_list', 'ours_tensor']),
    'serial-per': ('serial pipeline, DQN, prioritized replay', ['dingengine', 'ours_list', 'ours_tensor']),
    'task-per': ('task pipeline, DQN, prioritized replay', ['dingengine', 'ours_list', 'ours_tensor']),
    'r2d2': ('serial pipeline, R2D2 (sequences of 42 steps)', ['dingengine', 'ours_list', 'ours_tensor']),
}
BUFFER_NAMES = {
    ('serial-dqn', 'dingengine'): "DI-engine `deque`",
    ('serial-dqn', 'ours_list'): "ding_buffer `deque`, list storage",
    ('serial-dqn', 'ours_tensor'): "ding_buffer `deque`, tensor storage",
    ('serial-per', 'dingengine'): "DI-engine `advanced`",
    ('serial-per', 'ours_list'): "ding_buffer `advanced`, list storage",
    ('serial-per', 'ours_tensor'): "ding_buffer `advanced`, tensor storage",
    ('task-per', 'dingengine'): "DI-engine `DequeBuffer` + PER middleware",
    ('task-per', 'ours_list'): "ding_buffer `TaskBuffer`, list storage",
    ('task-per', 'ours_tensor'): "ding_buffer `TaskBuffer`, tensor storage",
    ('r2d2', 'dingengine'): "DI-engine `advanced`",
    ('r2d2', 'ours_list'): "ding_buffer `advanced`, list storage",
    ('r2d2', 'ours_tensor'): "ding_buffer `advanced`, tensor storage",
}


# ------------------------------------------------------------------------------------------------ worker side
class Clock:
    """Seconds spent in the timed calls, by name, in total and per round of learning (the iterations between two
    collections), and how often each was called. ``loop``: the call is part of the learner loop (its seconds count
    towards learner it/s); ``buffer``: it is the buffer's (its seconds count as buffer time; a buffer call inside a
    loop call is counted once in the loop)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}
        self.rounds: List[List[float]] = []  # [loop seconds, buffer seconds, iterations]

    def new_round(self) -> None:
        if not self.rounds or self.rounds[-1] != [0.0, 0.0, 0]:
            self.rounds.append([0.0, 0.0, 0])

    def add_iterations(self, n: int) -> None:
        if self.rounds:
            self.rounds[-1][2] += n

    def wrap(self, name: str, fn: Callable, loop: bool, buffer: bool, iteration: bool = False) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self.seconds[name] = self.seconds.get(name, 0.0) + dt
                self.calls[name] = self.calls.get(name, 0) + 1
                if self.rounds:
                    self.rounds[-1][0] += dt if loop else 0.0
                    self.rounds[-1][1] += dt if buffer else 0.0
                if iteration:
                    self.add_iterations(1)

        return timed

    def totals(self) -> Dict[str, float]:
        loop = sum(r[0] for r in self.rounds)
        buffer = sum(r[1] for r in self.rounds)
        return {'loop_s': loop, 'buffer_s': buffer, 'iterations': sum(r[2] for r in self.rounds)}

    def medians(self) -> Dict[str, Optional[float]]:
        """Per round with iterations: it/s, buffer and train ms per iteration; the median of each over the rounds
        (a round slowed down by another process on the machine moves it little)."""
        rounds = [r for r in self.rounds if r[2] > 0 and r[0] > 0]
        if not rounds:
            return {'it_per_s': None, 'buffer_ms': None, 'train_ms': None}
        return {
            'it_per_s': statistics.median(r[2] / r[0] for r in rounds),
            'buffer_ms': statistics.median(1e3 * r[1] / r[2] for r in rounds),
            'train_ms': statistics.median(1e3 * (r[0] - r[1]) / r[2] for r in rounds),
        }


def buffer_section(suite: str, contender: str) -> Dict[str, Any]:
    """The create config's ``replay_buffer`` section of a serial-pipeline run."""
    kind = 'deque' if suite == 'serial-dqn' else 'advanced'
    if contender == 'dingengine':
        if kind == 'deque':  # dizoo's cartpole_dqn_create_config as it is
            return dict(type='deque', import_names=['ding.data.buffer.deque_buffer_wrapper'])
        return dict(type='advanced')
    storage = contender.split('_', 1)[1]
    return dict(type=kind, import_names=[OURS_MODULE], storage=dict(type=storage))


def summarize(evals: List[dict], clock: Clock, train_iter: int, env_step: int, wall: float) -> Dict[str, Any]:
    solved = next((e for e in evals if e['return'] >= STOP_VALUE and e['train_iter'] > 0), None)
    tot, med = clock.totals(), clock.medians()
    loop_s, buffer_s, its = tot['loop_s'], tot['buffer_s'], tot['iterations']
    return {
        'env_step_to_stop': solved['env_step'] if solved else None,
        'train_iter_to_stop': solved['train_iter'] if solved else None,
        'final_return': evals[-1]['return'] if evals else None,
        'evaluations': len(evals),
        'train_iter': train_iter,
        'timed_iterations': its,
        'env_step': env_step,
        'wall_s': wall,
        'learner_loop_s': loop_s,
        'buffer_s': buffer_s,
        'learner_it_per_s': its / loop_s if loop_s > 0 else None,
        'buffer_ms_per_iter': 1e3 * buffer_s / its if its else None,
        'train_ms_per_iter': 1e3 * (loop_s - buffer_s) / its if its else None,
        'rounds': len([r for r in clock.rounds if r[2]]),
        'round_median_it_per_s': med['it_per_s'],
        'round_median_buffer_ms': med['buffer_ms'],
        'round_median_train_ms': med['train_ms'],
        'seconds': clock.seconds,
        'calls': clock.calls,
        'evals': evals,
    }


def run_serial(suite: str, contender: str, seed: int, max_env_step: int) -> Dict[str, Any]:
    import copy
    import pickle

    import ding.entry.serial_entry as serial_entry
    import numpy as np
    from ding.worker import BaseLearner, InteractionSerialEvaluator
    from easydict import EasyDict

    if suite == 'r2d2':
        from dizoo.classic_control.cartpole.config.cartpole_r2d2_config import create_config, main_config
    else:
        from dizoo.classic_control.cartpole.config.cartpole_dqn_config import create_config, main_config
    main, create = copy.deepcopy(main_config), copy.deepcopy(create_config)
    main.exp_name = f'{suite}_{contender}_s{seed}'
    if suite == 'serial-per':
        main.policy.priority = True
        main.policy.priority_IS_weight = True
    create.replay_buffer = EasyDict(buffer_section(suite, contender))

    clock, evals, seen = Clock(), [], {}
    make_buffer = serial_entry.create_buffer

    def create_buffer(*args: Any, **kwargs: Any) -> Any:
        buffer = make_buffer(*args, **kwargs)
        seen['buffer'] = f'{type(buffer).__module__}.{type(buffer).__qualname__}'
        push = buffer.push

        def push_and_start_round(*a: Any, **kw: Any) -> Any:  # the serial pipeline pushes, then trains a round
            out = push(*a, **kw)
            clock.new_round()
            return out

        buffer.push = push_and_start_round
        buffer.sample = clock.wrap('sample', buffer.sample, loop=True, buffer=True)
        buffer.update = clock.wrap('update', buffer.update, loop=True, buffer=True)
        return buffer

    serial_entry.create_buffer = create_buffer
    BaseLearner.train = clock.wrap('learn', BaseLearner.train, loop=True, buffer=False, iteration=True)
    evaluate = InteractionSerialEvaluator.eval

    def eval_hook(self: Any, save_ckpt_fn: Any = None, train_iter: int = -1, envstep: int = -1, **kwargs: Any) -> Any:
        stop, info = evaluate(self, save_ckpt_fn, train_iter, envstep, **kwargs)
        mean = float(np.mean(info['eval_episode_return']))
        evals.append({'train_iter': int(train_iter), 'env_step': int(envstep), 'return': mean})
        return stop, info

    InteractionSerialEvaluator.eval = eval_hook
    learners = []
    base_init = BaseLearner.__init__

    def learner_init(self: Any, *args: Any, **kwargs: Any) -> None:
        base_init(self, *args, **kwargs)
        learners.append(self)

    BaseLearner.__init__ = learner_init

    t0 = time.perf_counter()
    serial_entry.serial_pipeline((main, create), seed=seed, max_env_step=max_env_step)
    wall = time.perf_counter() - t0
    train_iter = learners[-1].train_iter if learners else clock.calls.get('learn', 0)
    with open(os.path.join(main.exp_name, 'result.pkl'), 'rb') as f:  # the pipeline's own record of its end
        env_step = int(pickle.load(f)['env_step'])
    out = summarize(evals, clock, train_iter, env_step, wall)
    out['buffer_class'] = seen.get('buffer')
    return out


def run_task(suite: str, contender: str, seed: int, max_env_step: int) -> Dict[str, Any]:
    import copy

    import gym
    import numpy as np
    from ding.config import compile_config
    from ding.data import DequeBuffer
    from ding.data.buffer.middleware import PriorityExperienceReplay
    from ding.envs import BaseEnvManagerV2, DingEnvWrapper
    from ding.framework import task
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware import (
        CkptSaver,
        OffPolicyLearner,
        StepCollector,
        data_pusher,
        eps_greedy_handler,
        interaction_evaluator,
    )
    from ding.model import DQN
    from ding.policy import DQNPolicy
    from ding.utils import set_pkg_seed
    from dizoo.classic_control.cartpole.config.cartpole_dqn_config import create_config, main_config

    main = copy.deepcopy(main_config)
    main.exp_name = f'{suite}_{contender}_s{seed}'
    main.policy.priority = True
    main.policy.priority_IS_weight = True
    cfg = compile_config(main, create_cfg=copy.deepcopy(create_config), auto=True, seed=seed)
    clock, evals, state = Clock(), [], {}
    t0 = time.perf_counter()
    with task.start(async_mode=False, ctx=OnlineRLContext()):
        collector_env = BaseEnvManagerV2(
            env_fn=[lambda: DingEnvWrapper(gym.make("CartPole-v0")) for _ in range(cfg.env.collector_env_num)],
            cfg=cfg.env.manager,
        )
        evaluator_env = BaseEnvManagerV2(
            env_fn=[lambda: DingEnvWrapper(gym.make("CartPole-v0")) for _ in range(cfg.env.evaluator_env_num)],
            cfg=cfg.env.manager,
        )
        set_pkg_seed(cfg.seed, use_cuda=cfg.policy.cuda)
        model = DQN(**cfg.policy.model)
        size = cfg.policy.other.replay_buffer.replay_buffer_size
        if contender == 'dingengine':
            buffer_ = DequeBuffer(size=size)
        else:
            from ding_buffer.integrations.dingengine import TaskBuffer

            buffer_ = TaskBuffer(dict(type='naive', storage=dict(type=contender.split('_', 1)[1])), size=size)
        buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))
        # the OffPolicyLearner call samples and trains (the loop); the fetcher's priority updates follow in the
        # step's backward pass, before the next learner call (the loop too)
        buffer_.sample = clock.wrap('sample', buffer_.sample, loop=False, buffer=True)
        buffer_.update = clock.wrap('update', buffer_.update, loop=True, buffer=True)
        policy = DQNPolicy(cfg.policy, model=model)
        evaluator = interaction_evaluator(cfg, policy.eval_mode, evaluator_env)

        def evaluate(ctx: Any) -> None:  # the evaluator, recording what it found
            evaluator(ctx)
            if ctx.eval_value != -np.inf:  # the context resets eval_value every step; set: it evaluated
                evals.append(
                    {'train_iter': int(ctx.train_iter), 'env_step': int(ctx.env_step), 'return': float(ctx.eval_value)}
                )

        learner = OffPolicyLearner(cfg, policy.learn_mode, buffer_)
        learn = clock.wrap('learn', learner, loop=True, buffer=False)

        def timed_learner(ctx: Any) -> None:  # a round: this call and the updates after it
            clock.new_round()
            before = ctx.train_iter
            learn(ctx)
            clock.add_iterations(ctx.train_iter - before)

        def cap(ctx: Any) -> None:
            state['train_iter'], state['env_step'] = int(ctx.train_iter), int(ctx.env_step)
            if ctx.env_step >= max_env_step:
                task.finish = True

        task.use(evaluate)
        task.use(eps_greedy_handler(cfg))
        task.use(StepCollector(cfg, policy.collect_mode, collector_env))
        task.use(data_pusher(cfg, buffer_))
        task.use(timed_learner)
        task.use(CkptSaver(policy, cfg.exp_name, train_freq=100))
        task.use(cap)
        task.run()
    wall = time.perf_counter() - t0
    out = summarize(evals, clock, state.get('train_iter', 0), state.get('env_step', 0), wall)
    out['buffer_class'] = f'{type(buffer_).__module__}.{type(buffer_).__qualname__}'
    return out


def worker(args: argparse.Namespace) -> None:
    suite, contender, seed = args.worker
    seed = int(seed)
    info = {'suite': suite, 'contender': contender, 'seed': seed}
    try:
        run = run_task if suite == 'task-per' else run_serial
        info.update(run(suite, contender, seed, args.max_env_step))
        info['ok'] = True
    except BaseException as exc:  # the parent records the failure and goes on
        import traceback

        info['ok'] = False
        info['error'] = f'{type(exc).__name__}: {exc}'[:2000]
        info['traceback'] = traceback.format_exc()[-6000:]
        traceback.print_exc()
    with open(args.result, 'w') as f:
        json.dump(info, f)


# ------------------------------------------------------------------------------------------------ parent side
def cpu_model() -> str:
    try:
        out = subprocess.run(['lscpu'], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.strip().startswith('Model name:'):
                return line.split(':', 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def versions(python: str) -> Dict[str, str]:
    code = (
        "import json, sys, torch, numpy, gym, ding; from importlib.metadata import version; "
        "print(json.dumps({'DI-engine': version('DI-engine'), 'torch': torch.__version__, 'numpy': numpy.__version__, "
        "'gym': gym.__version__, 'python': sys.version.split()[0], 'torch_threads': str(torch.get_num_threads())}))"
    )
    try:
        out = subprocess.run([python, '-c', code], capture_output=True, text=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def git_commit() -> Optional[str]:
    """The checkout's commit, with ``+changes`` when ding_buffer/ differs from it."""
    try:
        git = dict(cwd=ROOT, capture_output=True, text=True, timeout=30)
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], **git)
        dirty = subprocess.run(['git', 'status', '--porcelain', 'ding_buffer'], **git)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ('+changes' if dirty.stdout.strip() else '')


class Lock:
    """An exclusive flock on a file while a run goes (the flock(1) command's lock: both use flock(2))."""

    def __init__(self, path: Optional[str]) -> None:
        self.path, self.fd = path, None

    def __enter__(self) -> 'Lock':
        if self.path:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def run_one(args: argparse.Namespace, suite: str, contender: str, seed: int, log_dir: str) -> Dict[str, Any]:
    max_env_step = args.r2d2_env_step if suite == 'r2d2' else args.max_env_step
    scratch = tempfile.mkdtemp(prefix='dingengine_pipelines_')
    result = os.path.join(scratch, 'result.json')
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', suite, contender, str(seed)]
    cmd += ['--max-env-step', str(max_env_step), '--result', result]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
    log_path = os.path.join(log_dir, f'{suite}_{contender}_s{seed}.log')
    info: Dict[str, Any] = {'suite': suite, 'contender': contender, 'seed': seed, 'ok': False}
    with Lock(args.lock), open(log_path, 'w') as log:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=scratch, env=env, timeout=args.timeout)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
        elapsed = time.perf_counter() - t0
    if os.path.isfile(result):
        with open(result) as f:
            info = json.load(f)
    elif returncode is None:
        info['error'] = f'timed out after {args.timeout:.0f} s'
    else:
        info['error'] = f'exit code {returncode} without a result'
    info['process_s'] = elapsed
    info['max_env_step'] = max_env_step
    shutil.rmtree(scratch, ignore_errors=True)
    return info


def fmt(x: Optional[float], digits: int = 0) -> str:
    if x is None:
        return '-'
    return f'{x:,.{digits}f}'


def median(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def tables(report: Dict[str, Any]) -> str:
    meta = report['meta']
    v = meta.get('versions', {})
    lines = [
        f"CPU: {meta['cpu']} ({meta['cores']} cores); {meta['date']}; DI-engine {v.get('DI-engine', '?')}, "
        f"torch {v.get('torch', '?')} ({v.get('torch_threads', '?')} threads), numpy {v.get('numpy', '?')}, "
        f"gym {v.get('gym', '?')}, Python {v.get('python', '?')}"
        + (f"; ding_buffer at {meta['commit']}." if meta.get('commit') else '.'),
        '',
        f"Command: `{meta['command']}`",
        '',
        f"Env steps to {STOP_VALUE}: at the first evaluation whose mean return reached it; `>N`: not reached in the N "
        "env steps the run made; median over the seeds that reached it (`*`: not all did). Learner it/s: learner "
        "iterations / seconds spent in buffer sample + learner train + buffer update, nothing else; it/s (median "
        "round): the same per round of training between two collections, median over the rounds (a round slowed "
        "by another process moves it little). Buffer ms / it: sample + update; train ms / it: the rest of that loop "
        "(both per round, median). Wall s: the whole pipeline call (env steps, evaluations, learner). Every column "
        "but the first: median over the seeds.",
        '',
    ]
    runs = report['runs']
    for suite, (title, contenders) in SUITES.items():
        rows = [r for r in runs if r['suite'] == suite]
        if not rows:
            continue
        seeds = sorted({r['seed'] for r in rows})
        cap = rows[0].get('max_env_step')
        lines += [f"#### {title}: seeds {', '.join(map(str, seeds))}, at most {cap:,} env steps", '']
        if suite == 'r2d2':
            lines += [
                '| buffer | seed | learner iterations | learner it/s | it/s (median round) | buffer ms / it '
                '| train ms / it | last eval return | env steps | wall s |',
                '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
            ]
            for c in contenders:
                for r in sorted((r for r in rows if r['contender'] == c), key=lambda r: r['seed']):
                    if not r.get('ok'):
                        error = r.get('error', '?')[:150]
                        lines.append(f"| {BUFFER_NAMES[suite, c]} | {r['seed']} | failed: {error} |")
                        continue
                    lines.append(
                        f"| {BUFFER_NAMES[suite, c]} | {r['seed']} | {fmt(r['train_iter'])} | "
                        f"{fmt(r['learner_it_per_s'], 1)} | {fmt(r['round_median_it_per_s'], 1)} | "
                        f"{fmt(r['round_median_buffer_ms'], 2)} | {fmt(r['round_median_train_ms'], 1)} | "
                        f"{fmt(r['final_return'], 1)} | {fmt(r['env_step'])} | {fmt(r['wall_s'], 1)} |"
                    )
            lines.append('')
            continue
        lines += [
            f'| buffer | env steps to {STOP_VALUE}, by seed | median | reached | final eval return | learner it/s '
            '| it/s (median round) | buffer ms / it | train ms / it | wall s |',
            '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|',
        ]
        for c in contenders:
            mine = sorted((r for r in rows if r['contender'] == c), key=lambda r: r['seed'])
            if not mine:
                continue
            ok = [r for r in mine if r.get('ok')]
            steps = []
            for r in mine:
                if not r.get('ok'):
                    steps.append('failed')
                elif r['env_step_to_stop'] is None:
                    steps.append(f">{r['env_step']:,}")
                else:
                    steps.append(f"{r['env_step_to_stop']:,}")
            reached = [r['env_step_to_stop'] for r in ok if r['env_step_to_stop'] is not None]

            def col(key: str, digits: int = 0) -> str:
                return fmt(median([r[key] for r in ok]), digits)

            lines.append(
                f"| {BUFFER_NAMES[suite, c]} | {' / '.join(steps)} | "
                f"{fmt(median(reached)) if len(reached) == len(mine) else fmt(median(reached)) + '*'} | "
                f"{len(reached)}/{len(mine)} | {col('final_return', 1)} | {col('learner_it_per_s')} | "
                f"{col('round_median_it_per_s')} | {col('round_median_buffer_ms', 2)} | "
                f"{col('round_median_train_ms', 2)} | {col('wall_s', 1)} |"
            )
        lines.append('')
    failed = [r for r in runs if not r.get('ok')]
    if failed:
        lines += ['Failed runs:', '']
        for r in failed:
            lines.append(f"- {r['suite']} {r['contender']} seed {r['seed']}: {r.get('error', '?')[:300]}")
        lines.append('')
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--suites', nargs='+', default=list(SUITES), choices=list(SUITES))
    parser.add_argument('--contenders', nargs='+', default=['dingengine', 'ours_list', 'ours_tensor'])
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument('--max-env-step', type=int, default=20000, help='cap of a CartPole DQN run (env steps)')
    parser.add_argument('--r2d2-env-step', type=int, default=10000, help='length of an R2D2 run (env steps)')
    parser.add_argument('--r2d2-seeds', nargs='+', type=int, default=[0, 1])
    parser.add_argument('--timeout', type=float, default=1800, help='seconds per run (the run is killed after)')
    parser.add_argument('--lock', default=None, help='hold an exclusive flock on this file while a run goes')
    parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results', 'dingengine_pipelines.json'))
    parser.add_argument('--resume', action='store_true', help='keep the runs already in --out and skip them')
    parser.add_argument('--report', action='store_true', help='only print the tables of --out')
    parser.add_argument('--worker', nargs=3, metavar=('SUITE', 'CONTENDER', 'SEED'), help=argparse.SUPPRESS)
    parser.add_argument('--result', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    report: Dict[str, Any] = {'runs': []}
    if (args.resume or args.report) and os.path.isfile(args.out):
        with open(args.out) as f:
            report = json.load(f)
    if args.report:
        print(tables(report))
        return
    argv = sys.argv[1:]
    if '--lock' in argv:  # the lock changes when a run starts, not what runs: left out of the recorded command
        i = argv.index('--lock')
        argv = argv[:i] + argv[i + 2 :]
    argv = ' '.join(argv)
    meta = report.get('meta') or {}
    report['meta'] = {
        'cpu': cpu_model(),
        'cores': os.cpu_count(),
        'date': meta.get('date') or datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
        'command': meta.get('command') or f'python benchmarks/dingengine_pipelines.py {argv}'.strip(),
        'versions': versions(sys.executable),
        'commit': git_commit(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    log_dir = os.path.splitext(os.path.abspath(args.out))[0] + '_logs'
    os.makedirs(log_dir, exist_ok=True)
    done = {(r['suite'], r['contender'], r['seed']) for r in report['runs']}
    plan = []
    for suite in args.suites:
        for seed in args.r2d2_seeds if suite == 'r2d2' else args.seeds:
            for contender in SUITES[suite][1]:
                if contender in args.contenders and (suite, contender, seed) not in done:
                    plan.append((suite, contender, seed))
    for i, (suite, contender, seed) in enumerate(plan, 1):
        info = run_one(args, suite, contender, seed, log_dir)
        report['runs'].append(info)
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=1)
        state = (
            f"env steps to {STOP_VALUE}: {info.get('env_step_to_stop')}, it/s {fmt(info.get('learner_it_per_s'))} "
            f"(median round {fmt(info.get('round_median_it_per_s'))}), "
            f"wall {fmt(info.get('wall_s'), 1)} s"
            if info.get('ok')
            else f"FAILED: {info.get('error')}"
        )
        print(f'[{i}/{len(plan)}] {suite} {contender} seed {seed}: {state}', flush=True)
    text = tables(report)
    with open(os.path.splitext(args.out)[0] + '.md', 'w') as f:
        f.write(text + '\n')
    print(text)


if __name__ == '__main__':
    main()

"""Driver of tests/integrations/test_dingengine_pipelines.py: runs inside a venv with DI-engine 0.5.3 (the test
builds it), never imported by the suite (``collect_ignore`` in this folder's conftest.py). Each subcommand does one
run in the current directory and writes what it saw as JSON to the file given by ``--out``; the test reads that file
and the run's own artefacts (exp folder, TensorBoard event files).

* ``serial``: ``ding.entry.serial_pipeline`` on dizoo's CartPole DQN config, with the create config's
  ``replay_buffer`` replaced by ``--buffer`` (a JSON dict, the one line a user writes) and PER switched on in the
  policy. DI-engine's ``serial_pipeline`` does not return its buffer or learner: this driver (test code, not user
  code) wraps the names ``serial_pipeline`` calls to keep references to what it built.
* ``task``: the task pipeline in the shape of ``ding/example/dqn_per.py``, with ``TaskBuffer`` plus
  ``PriorityExperienceReplay``.
* ``example``: DI-engine's own ``ding/example/dqn.py`` / ``dqn_per.py``, run to the stop value with ``TaskBuffer``
  (``--buffer``: its config) in place of ``DequeBuffer``.
* ``badinput``: what DI-engine's side can hand a buffer that it must refuse, whole, naming the field.
"""

import argparse
import copy
import json
import math
import os
import sys
import threading
import time
import traceback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('mode', choices=['serial', 'task', 'example', 'badinput', 'taskbuffer'])
    parser.add_argument('--example', choices=['dqn', 'dqn_per'], help="example: DI-engine's ding/example module")
    parser.add_argument('--out', required=True)
    parser.add_argument('--buffer', help='serial: the create config replay_buffer section (JSON)')
    parser.add_argument('--exp-name', default='exp')
    parser.add_argument('--max-env-step', type=int, default=300)
    parser.add_argument('--max-step', type=int, default=40)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    t0 = time.time()
    modes = {
        'serial': run_serial,
        'task': run_task,
        'example': run_example,
        'badinput': run_badinput,
        'taskbuffer': run_taskbuffer,
    }
    result = modes[args.mode](args)
    result['seconds'] = time.time() - t0
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1, default=repr)


def buffer_info(buffer) -> dict:
    from ding_buffer.base import IBuffer

    cls = type(buffer)
    return {
        'class': f'{cls.__module__}.{cls.__qualname__}',
        'mro': [f'{c.__module__}.{c.__qualname__}' for c in cls.__mro__],
        'is_ding_buffer': isinstance(buffer, IBuffer),
        'stats': dict(buffer.stats()),
    }


# ---------------------------------------------------------------------------------------------- serial pipeline
def run_serial(args) -> dict:
    import ding.entry.serial_entry as serial_entry
    from dizoo.classic_control.cartpole.config.cartpole_dqn_config import create_config, main_config
    from easydict import EasyDict

    main = copy.deepcopy(main_config)
    create = copy.deepcopy(create_config)
    main.exp_name = args.exp_name
    main.policy.priority = True  # PER: the learner sends priority_info to the buffer after every train step
    main.policy.priority_IS_weight = True
    main.policy.eval.evaluator.eval_freq = 50
    create.replay_buffer = EasyDict(json.loads(args.buffer))

    built = {}
    real_create_buffer, real_learner = serial_entry.create_buffer, serial_entry.BaseLearner

    def create_buffer(cfg, *a, **kw):
        built['buffer'] = real_create_buffer(cfg, *a, **kw)
        built['tb_logger'] = kw.get('tb_logger')
        built['exp_name'] = kw.get('exp_name')
        return built['buffer']

    class Learner(real_learner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built['learner'] = self

    serial_entry.create_buffer, serial_entry.BaseLearner = create_buffer, Learner
    serial_entry.serial_pipeline((main, create), seed=args.seed, max_env_step=args.max_env_step)
    buffer = built['buffer']
    out = buffer_info(buffer)
    out['train_iter'] = built['learner'].train_iter
    out['exp_name'] = built['exp_name']  # DI-engine adds a timestamp where the folder exists
    # the pipeline's owner closes its writer; the buffer closes after it (a late periodic report is dropped, not
    # written into a second event file)
    if built['tb_logger'] is not None:
        built['tb_logger'].close()
    buffer.close()
    return out


# ---------------------------------------------------------------------------------------------- task pipeline
def run_task(args) -> dict:
    import gym
    from ding.config import compile_config
    from ding.data.buffer.middleware import PriorityExperienceReplay
    from ding.envs import BaseEnvManagerV2, DingEnvWrapper
    from ding.framework import task
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware import (
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

    from ding_buffer.base import IBuffer
    from ding_buffer.integrations.dingengine import TaskBuffer

    main = copy.deepcopy(main_config)
    main.exp_name = args.exp_name
    main.policy.priority = True
    main.policy.priority_IS_weight = True
    main.policy.eval.evaluator.eval_freq = 100
    cfg = compile_config(main, create_cfg=copy.deepcopy(create_config), auto=True, seed=args.seed)
    seen = {'env_step': [], 'train_iter': []}

    def recorder(ctx):
        seen['env_step'].append(int(ctx.env_step))
        seen['train_iter'].append(int(ctx.train_iter))

    with task.start(async_mode=False, ctx=OnlineRLContext()):
        collector_env = BaseEnvManagerV2(
            env_fn=[lambda: DingEnvWrapper(gym.make('CartPole-v0')) for _ in range(cfg.env.collector_env_num)],
            cfg=cfg.env.manager,
        )
        evaluator_env = BaseEnvManagerV2(
            env_fn=[lambda: DingEnvWrapper(gym.make('CartPole-v0')) for _ in range(cfg.env.evaluator_env_num)],
            cfg=cfg.env.manager,
        )
        set_pkg_seed(cfg.seed, use_cuda=cfg.policy.cuda)
        model = DQN(**cfg.policy.model)
        size = cfg.policy.other.replay_buffer.replay_buffer_size
        buffer_ = TaskBuffer(dict(type='naive', storage=dict(type='tensor')), size=size)
        before = {'prioritized': buffer_.prioritized, 'inner': type(buffer_.inner).__name__}
        buffer_.use(PriorityExperienceReplay(buffer_, IS_weight=True))
        policy = DQNPolicy(cfg.policy, model=model)
        task.use(interaction_evaluator(cfg, policy.eval_mode, evaluator_env))
        task.use(eps_greedy_handler(cfg))
        task.use(StepCollector(cfg, policy.collect_mode, collector_env))
        task.use(data_pusher(cfg, buffer_))
        task.use(OffPolicyLearner(cfg, policy.learn_mode, buffer_))
        task.use(recorder)
        task.run(max_step=args.max_step)
    out = buffer_info(buffer_)
    out.update(
        before=before,
        prioritized=buffer_.prioritized,
        inner=type(buffer_.inner).__name__,
        inner_is_ding_buffer=isinstance(buffer_.inner, IBuffer),
        middleware=[type(m).__name__ for m in buffer_._middleware],
        **seen,
    )
    buffer_.close()
    return out


# ---------------------------------------------------------------------------------------------- DI-engine's examples
def run_example(args) -> dict:
    """DI-engine's own ``ding/example/dqn.py`` or ``dqn_per.py`` as a user runs it, word for word but for the one
    line that builds the buffer: ``DequeBuffer(size=...)`` becomes ``TaskBuffer(--buffer, size=...)``. The run ends
    where the example's evaluator ends it (the mean evaluation return reached the config's ``stop_value``), or at
    ``--max-env-step`` (then ``reached`` is False). Test code wraps the evaluator middleware only to record what it
    measured."""
    import importlib

    from ding.framework import task

    from ding_buffer.integrations.dingengine import TaskBuffer

    example = importlib.import_module(f'ding.example.{args.example}')
    built, evals = [], []

    def task_buffer(size):
        built.append(TaskBuffer(json.loads(args.buffer), size=size))
        return built[-1]

    real_evaluator = example.interaction_evaluator

    def interaction_evaluator(cfg, *a, **kw):
        evaluate = real_evaluator(cfg, *a, **kw)

        def recorded(ctx):
            evaluate(ctx)
            if ctx.last_eval_iter == ctx.train_iter and ctx.eval_value is not None:
                evals.append(
                    {'env_step': int(ctx.env_step), 'train_iter': int(ctx.train_iter), 'value': float(ctx.eval_value)}
                )
            if ctx.env_step >= args.max_env_step:
                task.finish = True

        evals.append({'stop_value': float(cfg.env.stop_value)})
        return recorded

    example.DequeBuffer, example.interaction_evaluator = task_buffer, interaction_evaluator
    example.main()
    stop_value = evals.pop(0)['stop_value']
    buffer = built[0]
    out = buffer_info(buffer)
    out.update(
        stop_value=stop_value,
        evals=evals,
        reached=bool(evals) and evals[-1]['value'] >= stop_value and evals[-1]['train_iter'] > 0,
        prioritized=buffer.prioritized,
        inner=type(buffer.inner).__name__,
        storage=buffer.inner.cfg.storage.type,
    )
    buffer.close()
    return out


# ---------------------------------------------------------------------------------------------- bad input
def snapshot(state):
    """A deep copy of a state: what state_dict returned must not change under a refused call."""
    return copy.deepcopy(state)


def differences(a, b, where='state'):
    """Where ``a`` and ``b`` differ (exact: same types, dtypes, shapes and values; NaN equals NaN)."""
    import numpy as np
    import torch

    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return [f'{where}: keys differ']
        return [d for k in a for d in differences(a[k], b[k], f'{where}.{k}')]
    if isinstance(a, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [f'{where}: {a!r:.80} != {b!r:.80}']
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f'{where}[{i}]')]
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return [f'{where}: tensor type or shape differs']
        if a.is_floating_point():
            same = bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
        else:
            same = torch.equal(a, b)
        return [] if same else [f'{where}: tensor values differ']
    if isinstance(a, np.ndarray):
        if not isinstance(b, np.ndarray) or a.dtype != b.dtype or a.shape != b.shape:
            return [f'{where}: array type or shape differs']
        return [] if np.array_equal(a, b, equal_nan=a.dtype.kind in 'fc') else [f'{where}: array values differ']
    if isinstance(a, float) and math.isnan(a):
        return [] if isinstance(b, float) and math.isnan(b) else [f'{where}: nan != {b!r}']
    return [] if type(a) is type(b) and a == b else [f'{where}: {a!r:.80} != {b!r:.80}']


def refusal(buffer, call, field) -> dict:
    """Run ``call``; report what it raised, whether the message names ``field`` and whether ``state_dict()`` stayed
    exactly the same."""
    before = snapshot(buffer.state_dict())
    out = {'field': field, 'raised': None, 'message': None}
    try:
        returned = call()
        out['returned'] = repr(returned)
    except Exception as e:  # noqa: BLE001 - the test judges which exception
        out['raised'], out['message'] = type(e).__name__, str(e)
        out['traceback'] = traceback.format_exc(limit=-3)
    out['names_field'] = out['message'] is not None and field in out['message']
    out['state_changes'] = differences(before, buffer.state_dict())
    return out


def run_badinput(args) -> dict:
    import torch
    from ding.worker import create_buffer
    from easydict import EasyDict

    from ding_buffer.integrations.dingengine import TaskBuffer

    nan = float('nan')
    cases = {}

    def transition(i):
        return {'obs': torch.full((4,), float(i)), 'action': i % 2, 'reward': float(i), 'done': False}

    # the serial pipeline's buffers, built by DI-engine's create_buffer from the one config line
    for storage in ('tensor', 'list'):
        cfg = EasyDict(
            type='advanced',
            import_names=['ding_buffer.integrations.dingengine'],
            replay_buffer_size=32,
            storage=dict(type=storage),
        )
        buffer = create_buffer(cfg, exp_name='badinput', instance_name=f'buffer_{storage}')
        buffer.push([transition(i) for i in range(20)], cur_collector_envstep=0)
        batch = buffer.sample(8, 0)
        ids = [d['replay_unique_id'] for d in batch]
        idx = [d['replay_buffer_idx'] for d in batch]
        good = [1.0 + i for i in range(8)]
        cases[f'{storage}: sampled types'] = {
            'ids': [type(i).__name__ for i in ids],
            'idx': [type(i).__name__ for i in idx],
        }
        bad = {
            'priority with a NaN': (
                {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': good[:3] + [nan] + good[4:]},
                'priority',
            ),
            'priority with a negative': (
                {'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': good[:3] + [-1.0] + good[4:]},
                'priority',
            ),
            'no replay_unique_id': ({'replay_buffer_idx': idx, 'priority': good}, 'replay_unique_id'),
            'no replay_buffer_idx': ({'replay_unique_id': ids, 'priority': good}, 'replay_buffer_idx'),
            # tensors where ints were sampled: integer tensors name the same slots (accepted below, checked to
            # act exactly as the ints); float, bool or several-element ones are refused
            'replay_buffer_idx as float tensors': (
                {'replay_unique_id': ids, 'replay_buffer_idx': [torch.tensor(float(i)) for i in idx], 'priority': good},
                'replay_buffer_idx',
            ),
            'replay_buffer_idx as bool tensors': (
                {'replay_unique_id': ids, 'replay_buffer_idx': [torch.tensor(True) for i in idx], 'priority': good},
                'replay_buffer_idx',
            ),
            'replay_buffer_idx as 2-element tensors': (
                {'replay_unique_id': ids, 'replay_buffer_idx': [torch.tensor([i, i]) for i in idx], 'priority': good},
                'replay_buffer_idx',
            ),
            'replay_unique_id as float tensors': (
                {
                    'replay_unique_id': [torch.tensor(float(i.rsplit('_', 1)[1])) for i in ids],
                    'replay_buffer_idx': idx,
                    'priority': good,
                },
                'replay_unique_id',
            ),
        }
        for name, (info, field) in bad.items():
            cases[f'{storage}: {name}'] = refusal(buffer, lambda info=info: buffer.update(info), field)
        # the buffer still takes good updates after the refusals; integer tensors act exactly as the ints
        before = snapshot(buffer.state_dict())
        applied = buffer.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': good})
        with_ints = snapshot(buffer.state_dict())
        cases[f'{storage}: good update after'] = {'returned': repr(applied), 'updated': buffer.stats()['updated']}
        for name, as_tensor in (('0-d', torch.tensor), ('1-element', lambda i: torch.tensor([i]))):
            buffer.load_state_dict(snapshot(before))
            returned = buffer.update(
                {'replay_unique_id': ids, 'replay_buffer_idx': [as_tensor(i) for i in idx], 'priority': good}
            )
            cases[f'{storage}: replay_buffer_idx as {name} int tensors'] = {
                'returned': repr(returned),
                'differences_from_ints': differences(with_ints, buffer.state_dict()),
            }
        buffer.close()

    # DI-engine's dizoo default type='deque' with PER: update sets the last sampled batch's priorities
    cfg = EasyDict(
        type='deque',
        import_names=['ding_buffer.integrations.dingengine'],
        replay_buffer_size=32,
        priority=True,
        priority_IS_weight=True,
        storage=dict(type='tensor'),
    )
    deque = create_buffer(cfg, exp_name='badinput', instance_name='buffer_deque')
    deque.push([transition(i) for i in range(20)], cur_collector_envstep=0)
    deque.sample(8, 0)
    for name, priority in (('NaN', [1.0] * 7 + [nan]), ('negative', [1.0] * 7 + [-2.0])):
        cases[f'deque: priority with a {name}'] = refusal(
            deque, lambda p=priority: deque.update({'priority': p}), 'priority'
        )
    deque.close()

    # the task pipeline's buffer: the fetcher calls update(index, data=None, meta) per sampled item
    task_buffer = TaskBuffer(dict(type='advanced', storage=dict(type='tensor')), size=32)
    for i in range(20):
        task_buffer.push(transition(i))
    sampled = task_buffer.sample(4)
    first = sampled[0]
    slot = first.meta['replay_buffer_idx']
    bad_meta = {
        'NaN priority': ({'priority': nan, 'replay_buffer_idx': slot}, 'priority'),
        'negative priority': ({'priority': -1.0, 'replay_buffer_idx': slot}, 'priority'),
        'no priority': ({'replay_buffer_idx': slot}, 'priority'),
        'no replay_buffer_idx': ({'priority': 1.0}, 'replay_buffer_idx'),
        'NaN replay_buffer_idx': ({'priority': 1.0, 'replay_buffer_idx': nan}, 'replay_buffer_idx'),
        'negative replay_buffer_idx': ({'priority': 1.0, 'replay_buffer_idx': -1}, 'replay_buffer_idx'),
    }
    for name, (meta, field) in bad_meta.items():
        cases[f'TaskBuffer: {name}'] = refusal(
            task_buffer, lambda meta=meta: task_buffer.update(first.index, None, dict(meta)), field
        )
    ok = task_buffer.update(first.index, None, dict(first.meta, priority=3.0))
    cases['TaskBuffer: good update after'] = {'returned': repr(ok), 'updated': task_buffer.stats()['updated']}
    task_buffer.close()
    return {'cases': cases}


def run_taskbuffer(args) -> dict:
    """TaskBuffer details a pipeline meets: its own file of numpy items reloads, PriorityExperienceReplay on a type
    it cannot make prioritized, an update naming no id of the buffer, pushes the rate limit refuses (DI-engine's
    data_pusher goes on); and the chunk / mixture registrations built from a dizoo policy's buffer section
    (replay_buffer_size and all)."""
    import numpy as np
    import torch
    import treetensor.torch as ttorch
    from ding.data.buffer.middleware import PriorityExperienceReplay
    from ding.framework.context import OnlineRLContext
    from ding.framework.middleware.functional.data_processor import data_pusher
    from ding.worker.replay_buffer import create_buffer as dingengine_create_buffer
    from easydict import EasyDict

    from ding_buffer.integrations.dingengine import TaskBuffer, register

    out = {}
    path = os.path.join(os.getcwd(), 'tb.pt')
    buf = TaskBuffer(dict(replay_buffer_size=8))
    buf.push({'obs': np.zeros(3), 'reward': 1.0})
    buf.save_data(path)
    again = TaskBuffer(dict(replay_buffer_size=8))
    again.load_data(path, allow_pickle=True)
    out['reloaded'] = again.count()
    try:
        TaskBuffer(dict(type='elastic', replay_buffer_size=8)).use(PriorityExperienceReplay(buf))
        out['elastic_per'] = 'accepted'
    except ValueError as e:
        out['elastic_per'] = str(e)
    fresh = TaskBuffer(dict(replay_buffer_size=8))
    try:  # DI-engine anneals by (1 - beta) / 0.5 a draw; the buffer's anneal_step counts whole draws
        fresh.use(PriorityExperienceReplay(fresh, IS_weight=True, IS_weight_anneal_train_iter=0.5))
        out['half_anneal'] = 'accepted'
    except ValueError as e:
        out['half_anneal'] = str(e)
    out['half_anneal_type'] = type(fresh.inner).__name__
    prio = TaskBuffer(dict(type='advanced', replay_buffer_size=8))
    for i in range(4):
        prio.push({'obs': float(i)})
    batch = prio.sample(2)
    for d in batch:
        prio.update(d.index, meta=dict(d.meta, priority=5.0))
    try:
        prio.update('buffer_' + '9' * 30, meta=dict(batch[0].meta, priority=1.0))
        out['bad_id'] = 'accepted'
    except ValueError as e:
        out['bad_id'] = str(e)
    out['updated_after_bad_id'] = prio.stats()['updated']
    closing = TaskBuffer(dict(type='advanced', replay_buffer_size=8))  # updates queued when it closes
    for i in range(4):
        closing.push({'obs': float(i)})
    for d in closing.sample(2):
        closing.update(d.index, meta=dict(d.meta, priority=3.0))
    closing.close()
    out['after_close'] = {'count': closing.count(), 'updated': closing.stats()['updated']}
    try:
        closing.update(d.index, meta=dict(d.meta, priority=3.0))
        out['update_after_close'] = 'accepted'
    except RuntimeError as e:
        out['update_after_close'] = str(e)
    limited = TaskBuffer(dict(thruput_controller=dict(push_sample_rate_limit=dict(max=2, min=0))), size=100)
    kept = [limited.push({'obs': float(i)}) is not None for i in range(4)]
    limited.sample(2)
    kept += [limited.push({'obs': float(i)}) is not None for i in range(4)]
    out['limited'] = {'kept': kept, 'count': limited.count(), 'refused': limited.stats()['refused_push']}
    out['limited_pusher'] = {}
    for storage in ('list', 'tensor'):  # DI-engine's data_pusher through a rate limit, rounds of 8 pushes, 4 samples
        rated = TaskBuffer(
            dict(storage=dict(type=storage), thruput_controller=dict(push_sample_rate_limit=dict(max=1)))
        )
        pusher, ctx = data_pusher(EasyDict(policy=dict(collect=dict(unroll_len=1))), rated), OnlineRLContext()
        for _ in range(3):
            ctx.trajectories = [ttorch.as_tensor({'obs': torch.randn(4), 'reward': torch.ones(1)}) for _ in range(8)]
            pusher(ctx)
            rated.sample(4)
        out['limited_pusher'][storage] = [rated.count(), rated.stats()['refused_push']]
    out['task_meta'] = {}
    for storage in ('list', 'tensor'):
        out['task_meta'][storage] = task_meta(TaskBuffer, PriorityExperienceReplay, storage)
    register()
    section = {'replay_buffer_size': 100, 'deepcopy': False, 'enable_track_used_data': False}
    built = {}
    for kind, extra in (('ding_buffer_chunk', {}), ('ding_buffer_mixture', {'members': {'a': {'type': 'naive'}}})):
        try:
            built[kind] = type(dingengine_create_buffer(EasyDict(dict(section, type=kind, **extra)))).__name__
        except Exception as e:  # noqa: BLE001 - reported
            built[kind] = f'{type(e).__name__}: {e}'
    out['built'] = built
    return out


def task_meta(TaskBuffer, PriorityExperienceReplay, storage: str) -> dict:
    """As DequeBuffer: an item pushed after an update starts at the max priority that update set; the meta pushed
    with an item comes back with its samples, also after state_dict / save_data round trips; the push meta
    'train_iter_data_collected' is what max_staleness reads."""
    import torch

    out = {}
    per = TaskBuffer(dict(storage=dict(type=storage)), size=8)
    per.use(PriorityExperienceReplay(per, IS_weight=True))
    for i in range(4):
        per.push({'x': float(i)})
    for d in per.sample(2):
        per.update(d.index, meta=dict(d.meta, priority=100.0))
    per.push({'x': 9.0})
    drawn = [d for _ in range(40) for d in per.sample(4)]
    out['new_priority'] = sorted({float(d.meta['priority']) for d in drawn if float(d.data['x']) == 9.0})
    buf = TaskBuffer(dict(storage=dict(type=storage), max_staleness=3), size=4)
    for i in range(6):  # the first two are overwritten: their metas are forgotten
        buf.push({'x': float(i)}, {'env': i, 'train_iter_data_collected': 2 if i == 5 else 0})
    metas = lambda b: sorted((int(d.data['x']), d.meta['env']) for d in b.sample(b.count()))  # noqa: E731
    out['metas'] = metas(buf)
    state = buf.state_dict()
    out['state_meta_ids'] = sorted(state['task_meta'])
    again = TaskBuffer(dict(storage=dict(type=storage), max_staleness=3), size=4)
    again.load_state_dict(state)
    out['metas_state'] = metas(again)
    path = os.path.join(os.getcwd(), f'meta_{storage}.pt')
    buf.save_data(path)
    loaded = TaskBuffer(dict(storage=dict(type=storage), max_staleness=3), size=4)
    loaded.load_data(path)
    out['metas_file'] = metas(loaded)
    buf.cur_learner_iter = 3  # staleness 3 for the items collected at 0: removed; 1 for the last
    out['fresh'] = [int(d.data['x']) for d in buf.sample(1)]
    out['count_fresh'] = buf.count()
    try:  # a meta value beyond an item's collect_iter bound: refused naming the meta key, nothing stored
        buf.push({'x': 9.0}, {'env': 9, 'train_iter_data_collected': 2**70})
        out['huge_collected'] = 'accepted'
    except ValueError as e:
        out['huge_collected'] = ['train_iter_data_collected' in str(e), buf.count()]
    # without max_staleness the meta is only kept: the data keep their fields, pushes with and without it mix
    plain = TaskBuffer(dict(storage=dict(type=storage)), size=4)
    plain.push({'x': 0.0}, {'train_iter_data_collected': 0})
    plain.push({'x': 1.0})
    out['plain_keys'] = sorted(plain.sample(1)[0].data)
    # DI-engine's form {'data': [...]} pushes the items: the stored ones keep their metas
    plain.load_state_dict({'data': [{'x': 2.0}]})
    out['after_data_load'] = sorted(
        (int(d.data['x']), d.meta.get('train_iter_data_collected')) for d in plain.sample(3)
    )
    # refused whole, nothing changed: a meta that cannot be copied, at push and in a state
    before = plain.state_dict()
    refusals = {}
    for name, call in (
        ('push', lambda: plain.push({'x': 3.0}, {'td': torch.ones(1, requires_grad=True) * 2})),
        ('load', lambda: plain.load_state_dict(dict(state, task_meta={2: {'lock': threading.Lock()}}))),
    ):
        try:
            call()
            refusals[name] = 'accepted'
        except (TypeError, ValueError) as e:
            refusals[name] = [
                type(e).__name__,
                'cannot be copied' in str(e),
                not differences(before, plain.state_dict()),
            ]
    out['refusals'] = refusals
    # use(PriorityExperienceReplay) starts a new buffer whose ids begin again: no meta of an item that left
    used = TaskBuffer(dict(storage=dict(type=storage), max_use=1), size=4)
    used.push({'x': 0.0}, {'tag': 'old'})
    used.sample(1)
    used.use(PriorityExperienceReplay(used))
    used.push({'x': 1.0})
    out['after_use'] = 'tag' in used.sample(1)[0].meta
    # deepcopy (what clone_object's refusal names): a sample's meta shares nothing with the kept one
    cloned = TaskBuffer(dict(storage=dict(type=storage), deepcopy=True), size=4)
    cloned.push({'x': 0.0}, {'info': {'tag': 'kept'}})
    cloned.sample(1)[0].meta['info']['tag'] = 'changed'
    out['cloned'] = cloned.sample(1)[0].meta['info']['tag']
    # without priorities, data fields named as the buffer's meta keys are the user's: the meta is the pushed one
    named = TaskBuffer(dict(storage=dict(type=storage)), size=4)
    named.push({'x': 0.0, 'priority': 12.0, 'IS': 5.0, 'use': 7, 'staleness': 9}, {'priority': 3.0, 'tag': 'x'})
    out['named_meta'] = named.sample(1)[0].meta
    return out


if __name__ == '__main__':
    sys.exit(main())

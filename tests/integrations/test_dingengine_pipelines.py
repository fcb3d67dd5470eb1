"""DI-engine's real pipelines on ding_buffer (``ding_buffer.integrations.dingengine``), in a venv with DI-engine 0.5.3
and its pipelines' dependencies (built by this folder's conftest.py, in the background while the rest of the suite
runs). Each run is a subprocess of dingengine_driver.py, in a temporary directory (DI-engine writes its exp folder
relative to the working directory), for a few hundred env steps of dizoo's CartPole DQN with PER:

* the serial pipeline (``ding.entry.serial_pipeline``) with the one create-config line that replaces DI-engine's
  buffer: ``advanced`` on tensor and on list storage, and dizoo's default ``deque`` (prioritized) on tensor storage.
  From the run's own artefacts: the compiled config names our class and module, the learner trained, the priorities
  came back from the learner (the buffer's ``stats()['updated']``), TensorBoard holds the buffer's tags in the
  pipeline's one event file;
* the task pipeline with ``TaskBuffer`` + ``PriorityExperienceReplay`` (``ding/example/dqn_per.py``'s shape): it
  trains, the buffer became prioritized and took the fetcher's priority updates;
* bad input from DI-engine's side (a short driver): refused whole, naming the field, ``state_dict()`` unchanged.
"""

import json
import os
import pickle
import runpy
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DRIVER = HERE / 'dingengine_driver.py'
MODULE = 'ding_buffer.integrations.dingengine'
RUN_TIMEOUT = 300  # seconds, each pipeline run (about 10-20 s here)
MAX_ENV_STEP = 400  # serial: ~210 train iterations (batch 64, 5 per collect of 8)
MAX_STEP = 50  # task: 50 iterations of the middleware loop, 8 env steps each
# DI-engine's examples run to the stop value (about 1,000-2,000 env steps and 1 minute here); a run that has not
# reached it by this many env steps fails
EXAMPLE_MAX_ENV_STEP = 20_000
EXAMPLE_TIMEOUT = 900


@pytest.fixture(scope='module')
def run_env(tmp_path_factory):
    """The environment of the runs: the checkout's ``ding_buffer`` on the path; bytecode cached (a run imports
    thousands of modules: compiled once, by the first run) in a folder of this module (deleted after it), not in the
    venv or the checkout."""
    pycache = tmp_path_factory.mktemp('pycache')
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        PYTHONPYCACHEPREFIX=str(pycache),
        OMP_NUM_THREADS='1',  # the nets are tiny; the machine is shared
        WANDB_MODE='disabled',
        MPLBACKEND='Agg',
        CUDA_VISIBLE_DEVICES='',
    )
    for name in ('PYTHONHOME', 'PYTHONDONTWRITEBYTECODE'):
        env.pop(name, None)
    yield env
    shutil.rmtree(pycache, ignore_errors=True)


def drive(python: Path, env: dict, cwd: Path, label: str, *args: str, timeout: float = RUN_TIMEOUT) -> dict:
    """Run the driver with ``args`` in the DI-engine venv in ``cwd``; its JSON result (with ``wall``: the run's
    seconds, also printed with ``label``)."""
    out = cwd / 'result.json'
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [str(python), str(DRIVER), *args, '--out', str(out)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f'{label}: the run timed out after {timeout} s:\n{(e.stdout or b"")[-3000:]!r}')
    wall = time.monotonic() - t0
    output = proc.stdout[-4000:] + '\n' + proc.stderr[-8000:]
    assert proc.returncode == 0, f'{label}: the run failed (exit {proc.returncode}):\n{output}'
    result = json.loads(out.read_text())
    result['wall'] = wall
    print(f'{label}: {wall:.1f} s wall (driver {result["seconds"]:.1f} s)')
    return result


def event_files(log_dir: Path) -> dict:
    """``{event file: {tag: [steps]}}`` for every TensorBoard event file under ``log_dir``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = {}
    for path in sorted(log_dir.rglob('events.out.tfevents.*')):
        tags = {}
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
        out[path] = tags
    return out


# ---------------------------------------------------------------------------------------------- serial pipeline
SERIAL = {
    # the one create-config line of the docs, with a short throughput period so that buffer_sec/ is written too
    'advanced-tensor': dict(
        type='advanced',
        import_names=[MODULE],
        storage=dict(type='tensor'),
        monitor=dict(periodic_thruput=dict(seconds=0.5)),
    ),
    'advanced-list': dict(
        type='advanced',
        import_names=[MODULE],
        storage=dict(type='list'),
        monitor=dict(periodic_thruput=dict(seconds=0.5)),
    ),
    # dizoo's default type, prioritized through its own keys (DI-engine's DequeBufferWrapper config)
    'deque-tensor': dict(
        type='deque',
        import_names=[MODULE],
        storage=dict(type='tensor'),
        priority=True,
        priority_IS_weight=True,
    ),
}
CFG_TYPES = {'advanced': 'AdvancedReplayBufferDict', 'deque': 'DequeReplayBufferDict'}
CLASSES = {'advanced': 'AdvancedReplayBuffer', 'deque': 'DequeReplayBuffer'}


@pytest.mark.parametrize('case', list(SERIAL))
def test_serial_pipeline(case, dingengine_python, run_env, tmp_path):
    line = SERIAL[case]
    result = drive(
        dingengine_python,
        run_env,
        tmp_path,
        f'serial pipeline {case}',
        'serial',
        '--buffer',
        json.dumps(line),
        '--exp-name',
        'exp',
        '--max-env-step',
        str(MAX_ENV_STEP),
    )
    exp = tmp_path / result['exp_name']
    assert exp.is_dir(), f'no exp folder {exp}: {sorted(p.name for p in tmp_path.iterdir())}'

    # DI-engine compiled and built ours: the saved config names our class and module
    buffer_cfg = runpy.run_path(str(exp / 'total_config.py'))['exp_config']['policy']['other']['replay_buffer']
    assert buffer_cfg['type'] == line['type'], buffer_cfg
    assert buffer_cfg['cfg_type'] == CFG_TYPES[line['type']], buffer_cfg
    assert buffer_cfg['import_names'] == [MODULE], buffer_cfg
    assert buffer_cfg['storage']['type'] == line['storage']['type'], buffer_cfg
    formatted = (exp / 'formatted_total_config.py').read_text()
    assert f"cfg_type='{CFG_TYPES[line['type']]}'" in formatted
    assert f"import_names=['{MODULE}']" in formatted
    assert result['class'] == f'{MODULE}.{CLASSES[line["type"]]}', result['class']
    assert result['is_ding_buffer'], result['mro']

    # it trained on what the buffer sampled, and the learner's priorities reached the buffer
    final = pickle.loads((exp / 'result.pkl').read_bytes())
    assert final['env_step'] >= MAX_ENV_STEP and final['train_iter'] > 100, final
    assert result['train_iter'] == final['train_iter']
    evaluator_log = (exp / 'log' / 'evaluator' / 'evaluator_logger.txt').read_text()
    assert '| train_iter |' in evaluator_log and '| Value | 0.000000 ' in evaluator_log
    assert evaluator_log.count('| train_iter |') >= 2, 'the evaluator ran only before training'
    stats = result['stats']
    assert stats['push_items'] == final['env_step'], stats
    assert stats['sample_calls'] == final['train_iter'], stats
    assert stats['sampled_items'] == 64 * final['train_iter'], stats
    assert stats['updated'] == stats['sampled_items'], stats  # every sampled item got its new priority
    assert stats['stale_updates'] == 0, stats
    assert stats['priority_max'] != stats['priority_min'], stats  # the TD errors, not the initial max priority

    # TensorBoard: the buffer's tags in the pipeline's writer (log/serial), one event file per writer
    files = event_files(exp / 'log')
    by_dir = {}
    for path in files:
        by_dir.setdefault(path.parent, []).append(path.name)
    assert all(len(names) == 1 for names in by_dir.values()), by_dir
    serial = [tags for path, tags in files.items() if path.parent.name == 'serial']
    assert len(serial) == 1, files.keys()
    tags = serial[0]
    buffer_tags = sorted(t for t in tags if t.startswith('buffer_'))
    assert 'buffer_iter/priority_avg' in tags and 'buffer_iter/priority_max' in tags, buffer_tags
    assert max(tags['buffer_iter/priority_avg']) > 0, tags['buffer_iter/priority_avg']  # written after training
    if line['type'] == 'advanced':
        assert any(t.startswith('buffer_sec/') for t in tags), buffer_tags  # the periodic throughput report
    else:
        assert 'buffer_iter/buffer_data_count' in tags, buffer_tags
    assert not [t for path, t in files.items() if path.parent.name != 'serial' and any('buffer' in k for k in t)]


# ---------------------------------------------------------------------------------------------- task pipeline
def test_task_pipeline_with_task_buffer_and_priority_experience_replay(dingengine_python, run_env, tmp_path):
    result = drive(
        dingengine_python, run_env, tmp_path, 'task pipeline', 'task', '--exp-name', 'exp', '--max-step', str(MAX_STEP)
    )
    # TaskBuffer(type='naive') + PriorityExperienceReplay -> a prioritized ding_buffer preset
    assert result['class'] == f'{MODULE}.TaskBuffer', result['class']
    assert result['before'] == {'prioritized': False, 'inner': 'NaiveReplayBuffer'}, result['before']
    assert result['prioritized'] and result['inner'] == 'AdvancedReplayBuffer', result
    assert result['inner_is_ding_buffer'], result
    assert result['middleware'] == ['PriorityExperienceReplay'], result['middleware']
    # it ran and trained: env_step and train_iter advanced
    env_step, train_iter = result['env_step'], result['train_iter']
    assert len(env_step) == MAX_STEP, len(env_step)
    assert env_step == sorted(env_step) and env_step[-1] >= 8 * MAX_STEP, env_step
    assert train_iter == sorted(train_iter) and train_iter[-1] > 100, train_iter
    stats = result['stats']
    assert stats['push_items'] == env_step[-1], stats
    assert stats['sampled_items'] > 0 and stats['sample_calls'] == train_iter[-1], stats
    # the fetcher's per-item updates reached the priorities
    assert stats['updated'] > 0 and stats['updated'] == stats['sampled_items'], stats
    assert stats['priority_max'] != stats['priority_min'], stats


# ---------------------------------------------------------------------------------------------- DI-engine's examples
@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('example', ['dqn', 'dqn_per'])
def test_dingengine_examples_train_to_the_stop_value_with_task_buffer(
    example, storage, dingengine_python, run_env, tmp_path
):
    """DI-engine's own ``ding/example/dqn.py`` and ``dqn_per.py``, with ``TaskBuffer(dict(type='naive',
    storage=...), size=...)`` in place of ``DequeBuffer(size=...)``, train CartPole until their evaluator stops them
    at the config's stop value, on the default list storage as on tensor storage."""
    buffer = json.dumps(dict(type='naive', storage=dict(type=storage)))
    result = drive(
        dingengine_python,
        run_env,
        tmp_path,
        f'{example} on {storage} storage',
        'example',
        '--example',
        example,
        '--buffer',
        buffer,
        '--max-env-step',
        str(EXAMPLE_MAX_ENV_STEP),
        timeout=EXAMPLE_TIMEOUT,
    )
    assert result['storage'] == storage, result
    evals = result['evals']
    assert result['reached'], f"the stop value {result['stop_value']} was not reached by env step {evals[-1:]}"
    assert evals[-1]['value'] >= result['stop_value'] and evals[-1]['train_iter'] > 0, evals
    stats = result['stats']
    assert stats['sample_calls'] >= evals[-1]['train_iter'] and stats['sampled_items'] > 0, stats
    if example == 'dqn_per':  # the middleware made it prioritized; the fetcher's updates reached the priorities
        assert result['prioritized'] and result['inner'] == 'AdvancedReplayBuffer', result
        assert stats['updated'] > 0 and stats['priority_max'] != stats['priority_min'], stats
    else:
        assert not result['prioritized'] and result['inner'] == 'NaiveReplayBuffer', result


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_from_dingengine_is_refused_whole_naming_the_field(dingengine_python, run_env, tmp_path):
    cases = drive(dingengine_python, run_env, tmp_path, 'bad input', 'badinput')['cases']
    refusals = {name: case for name, case in cases.items() if 'field' in case}
    # serial: tensor and list storage (advanced), deque; task: TaskBuffer.update
    assert len(refusals) == 2 * 8 + 2 + 6, sorted(refusals)
    problems = []
    for name, case in refusals.items():
        if case['raised'] not in ('ValueError', 'TypeError'):
            problems.append(f"{name}: raised {case['raised']} ({case.get('returned')}), not ValueError/TypeError")
        elif not case['names_field']:
            problems.append(f"{name}: the message does not name {case['field']!r}: {case['message']}")
        if case['state_changes']:
            problems.append(f"{name}: state_dict() changed: {case['state_changes']}")
    assert not problems, '\n'.join(problems)
    # the sampled ids are DI-engine's strings, the slots ints; afterwards good updates are applied
    for storage in ('tensor', 'list'):
        assert set(cases[f'{storage}: sampled types']['ids']) == {'str'}, cases[f'{storage}: sampled types']
        assert set(cases[f'{storage}: sampled types']['idx']) == {'int'}, cases[f'{storage}: sampled types']
        assert cases[f'{storage}: good update after']['updated'] == 8, cases[f'{storage}: good update after']
        # integer tensors where ints were sampled name the same slots: applied exactly as the ints
        for kind in ('0-d', '1-element'):
            case = cases[f'{storage}: replay_buffer_idx as {kind} int tensors']
            assert case['returned'] == "{'updated': 8, 'stale': 0}" and not case['differences_from_ints'], case
    assert cases['TaskBuffer: good update after'] == {'returned': 'True', 'updated': 1}


def test_task_buffer_details_and_registrations_a_pipeline_meets(dingengine_python, run_env, tmp_path):
    """A TaskBuffer's own file of numpy items reloads (allow_pickle reached its buffer); PriorityExperienceReplay on
    an elastic buffer is refused (it silently became advanced, without its window); an update naming no id of the
    buffer is refused at the call, and the queued ones are applied (they were dropped at the next read); pushes the
    rate limit refuses are dropped and counted; and the chunk / mixture registrations build from a dizoo buffer
    section."""
    out = drive(dingengine_python, run_env, tmp_path, 'task buffer', 'taskbuffer')
    assert out['reloaded'] == 1
    assert "this one is 'elastic'" in out['elastic_per']
    assert 'IS_weight_anneal_train_iter must be a whole number' in out['half_anneal']  # (int() made it 0: never)
    assert out['half_anneal_type'] == 'NaiveReplayBuffer'  # refused: nothing changed
    assert 'is not an id of this buffer' in out['bad_id'] and out['updated_after_bad_id'] == 2
    # close() applies the queued updates; the closed buffer stays readable and refuses new updates
    assert out['after_close'] == {'count': 4, 'updated': 2} and 'closed' in out['update_after_close']
    # a push the limit turns away is dropped and counted (None), as the serial push does: data_pusher goes on
    kept = out['limited']['kept']
    assert kept[:4] == [True] * 4 and False in kept[4:]
    assert out['limited']['count'] == sum(kept) and out['limited']['refused'] == kept.count(False)
    for storage, (count, refused) in out['limited_pusher'].items():  # 24 pushed in rounds, 12 drawn: max=1 holds
        assert count + refused == 24 and refused > 0 and count <= 12 + 8, (storage, count, refused)
    assert out['built'] == {'ding_buffer_chunk': 'ChunkReplayBuffer', 'ding_buffer_mixture': 'MixtureReplayBuffer'}
    for storage, meta in out['task_meta'].items():  # as DequeBuffer and its middleware
        # the update's max, taken before the push: priority + 1e-5, as DI-engine's middleware raises it (float32)
        assert len(meta['new_priority']) == 1 and meta['new_priority'][0] > 100.0, (storage, meta)
        assert meta['new_priority'][0] == pytest.approx(100 + 1e-5, rel=5e-8), (storage, meta)
        kept = [[i, i] for i in range(2, 6)]
        assert meta['metas'] == meta['metas_state'] == meta['metas_file'] == kept, (storage, meta)
        assert meta['state_meta_ids'] == [2, 3, 4, 5], (storage, meta)
        assert meta['fresh'] == [5] and meta['count_fresh'] == 1, (storage, meta)
        assert meta['huge_collected'] == [True, 1], (storage, meta)
        assert meta['plain_keys'] == ['replay_buffer_idx', 'replay_unique_id', 'x'], (storage, meta)
        assert meta['after_data_load'] == [[0, 0], [1, None], [2, None]], (storage, meta)
        assert meta['refusals'] == {'push': ['TypeError', True, True], 'load': ['ValueError', True, True]}, meta
        assert meta['after_use'] is False and meta['cloned'] == 'kept', (storage, meta)
        assert meta['named_meta'] == {'priority': 3.0, 'tag': 'x', 'replay_buffer_idx': 0}, (storage, meta)


def test_the_integration_imported_before_dingengine_registers_its_own_buffers(dingengine_python, run_env, tmp_path):
    """A script that imports the integration first (``from ding_buffer.integrations.dingengine import TaskBuffer``
    at its top), then DI-engine's serial entry or workers: DI-engine's buffers register after ours."""
    code = (
        f'import {MODULE} as integration\n'
        'from ding.entry import serial_pipeline\n'
        'from ding.utils import BUFFER_REGISTRY\n'
        "for name in ('naive', 'advanced', 'deque'):\n"
        '    assert BUFFER_REGISTRY.get(name) is integration.REGISTERED[name], (name, BUFFER_REGISTRY.get(name))\n'
        "print('ok')\n"
    )
    proc = subprocess.run(
        [str(dingengine_python), '-c', code], cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.split()[-1:] == ['ok'], proc.stdout[-2000:] + proc.stderr[-4000:]


# ---------------------------------------------------------------------------------------------- IS weights
DIFF_SCRIPT = r'''
import json, sys, numpy as np
from ding.data.buffer.deque_buffer_wrapper import DequeBufferWrapper
from ding.utils import deep_merge_dicts
from ding.worker.replay_buffer import AdvancedReplayBuffer
from ding_buffer import create_buffer

class TB:
    def add_scalar(self, *a): pass
    def flush(self): pass
    def close(self): pass

def is_of(batch):
    return {int(d['i']): float(d['IS']) for d in batch}

out = {'deque': [], 'advanced': []}
sec = dict(replay_buffer_size=100, priority=True, priority_IS_weight=True, IS_weight_anneal_train_iter=10)
theirs = DequeBufferWrapper(deep_merge_dicts(DequeBufferWrapper.default_config(), sec), tb_logger=TB())
ours = create_buffer(dict(sec, type='deque', seed=0))
for buf in (theirs, ours):
    buf.push([{'i': k, 'priority': p} for k, p in enumerate([1.0, 2.0, 3.0, 4.0])])
for it in range(6):
    out['deque'].append([is_of(theirs.sample(4, it)), is_of(ours.sample(4, it))])
cfg = deep_merge_dicts(AdvancedReplayBuffer.default_config(), dict(replay_buffer_size=64, anneal_step=10))
theirs = AdvancedReplayBuffer(cfg, tb_logger=TB(), exp_name=sys.argv[1], instance_name='theirs')
ours = create_buffer(dict(cfg), tb_logger=TB(), instance_name='ours')
for buf in (theirs, ours):
    buf.push([{'i': k, 'priority': p} for k, p in enumerate([1.0, 2.0, 3.0, 4.0])], 0)
for it in range(6):
    out['advanced'].append([is_of(theirs.sample(4, it)), is_of(ours.sample(4, it))])
theirs.close()
print(json.dumps(out))
'''


def test_is_weights_and_annealing_match_dingengine_buffers(dingengine_python, run_env, tmp_path):
    """DI-engine's own DequeBufferWrapper and AdvancedReplayBuffer next to ours, in the DI-engine venv: items both
    draw get the same IS weight, call after call (beta annealing)."""
    proc = subprocess.run(
        [str(dingengine_python), '-c', DIFF_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=str(tmp_path),
        env=run_env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    compared = 0
    for kind in ('deque', 'advanced'):
        for theirs, ours in out[kind]:
            for item in set(theirs) & set(ours):
                assert ours[item] == pytest.approx(theirs[item], rel=1e-6), (kind, theirs, ours)
                compared += 1
    assert compared >= 12


# ---------------------------------------------------------------------------------------------- docs/dingengine.md
def test_dingengine_doc_blocks_run_with_its_dependencies(dingengine_python, run_env, tmp_path):
    """Every python block of docs/dingengine.md, in page order, in the DI-engine venv (the page says it needs DI-engine
    with its dependencies); each block shows what its text says (tests/test_docs_examples.py's rules)."""
    from test_docs_examples import DINGENGINE_TIMEOUT, PAGES, _launch, page_steps, runner_script

    steps = [s for page in PAGES for s in page_steps(page, 'dingengine')]
    assert steps
    script = runner_script(tmp_path / 'dingengine_blocks.py')
    rc, output = _launch(
        [str(dingengine_python), str(script), json.dumps(steps), str(tmp_path)], tmp_path, run_env, DINGENGINE_TIMEOUT
    )
    assert rc == 0, f'the DI-engine blocks failed (exit {rc}):\n{output[-8000:]}'
    assert json.loads((tmp_path / 'rank0.json').read_text())['done']

"""Every fenced code block of README.md and docs/*.md runs in the test suite and shows what its text says.

The fences are read from the pages when the tests run (file and line), so a new block is run, or the inventory
test (``test_every_fence_is_run_mapped_or_listed``) fails and says what to do with it.

* **python blocks** of one page run in page order in one namespace, as a reader runs them one after the other in one
  session, in a temporary working directory that is also on ``sys.path``. A block whose first line is a comment
  naming a file (``# my_parts.py``) is that file: it is written there, not run. Registry entries a page adds are
  removed afterwards.
* **What a block shows is checked.** A top-level statement whose last line ends in ``# -> TEXT`` must show TEXT: what
  it printed, else the ``repr`` of its value (an expression statement) or of the one name it assigns; ``...``
  matches anything and runs of whitespace are equal (doctest's ELLIPSIS and NORMALIZE_WHITESPACE). What the prose
  next to a block claims is checked by that block's ``check`` in ``PYTHON``. A block with neither fails the
  inventory test, so a block that shows nothing cannot pass.
* ``PYTHON`` also says where a block runs when it cannot run in this process, and ``setup`` gives the names a block
  leaves to its reader (``cfg``, a batch, ...): ``torchrun`` (a real launch of ``nproc`` ranks on this machine in a
  subprocess with a timeout: each rank runs setup, block and check, and reports back), ``dingengine`` (the page's
  blocks in one subprocess of the DI-engine venv that tests/integrations/conftest.py builds, or
  ``DINGENGINE_PYTHON``), ``cuda`` (a GPU; skipped without one). Those tests are ``slow``.
* **bash blocks**: every command (a line, split at ``&&``; the words of a shell loop aside) is run here (``RUN``) or
  mapped in ``MAPPED`` to the tests that run it; a mapped test must exist by name, and the words given must be in
  its source. A new command that is neither fails the inventory test, as does a stale entry.
* **fences without a language** are listed in ``TEXT`` by kind: ``output`` fences are compared with what the
  package prints (``test_output_fences_are_what_the_package_prints``); ``diagram`` and ``layout`` fences must not
  parse as Python. An unlisted fence, or a fence of another language, fails the inventory test.

Fast (not ``slow``): the inventory, every page's in-process blocks, the output fences, ``ding-buffer configs``.
"""

import ast
import contextlib
import dataclasses
import doctest
import importlib.metadata
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest
from helpers import REPO_ROOT, subprocess_env

REPO = REPO_ROOT
PAGES = ['README.md'] + sorted(str(p.relative_to(REPO)) for p in (REPO / 'docs').glob('*.md'))
INTEGRATIONS_CONFTEST = REPO / 'tests' / 'integrations' / 'conftest.py'
LAUNCH_TIMEOUT = 150  # seconds, a torchrun launch (start-up of every rank included; 5-8 s here)
DINGENGINE_TIMEOUT = 300  # seconds, the DI-engine page's subprocess (6 s here; 16 s in a fresh venv)
COMMAND_TIMEOUT = 120  # seconds, a command run from a bash block


# ======================================================================================== the pages' fences
@dataclass(frozen=True)
class Fence:
    page: str  # 'README.md', 'docs/storages.md'
    line: int  # of the opening fence
    lang: str  # '' for a fence without a language
    text: str

    @property
    def first(self) -> int:
        """The page's line of the block's first line."""
        return self.line + 1

    def where(self) -> str:
        return f'{self.page}:{self.line}'


FENCE = re.compile(r'^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)')


def fences(page: str) -> List[Fence]:
    lines = (REPO / page).read_text(encoding='utf-8').splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        marker, lang, start, body = m.group(2), m.group(3).lower(), i, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(marker) and set(lines[i].strip()) == {marker[0]}):
            body.append(lines[i][len(m.group(1)) :] if lines[i].startswith(m.group(1)) else lines[i])
            i += 1
        assert i < len(lines), f'{page}:{start + 1}: the fence opened here is never closed'
        out.append(Fence(page, start + 1, lang, '\n'.join(body) + '\n'))
        i += 1
    return out


def all_fences(lang: Optional[str] = None) -> List[Fence]:
    found = [f for page in PAGES for f in fences(page)]
    return found if lang is None else [f for f in found if f.lang == lang]


# ======================================================================================== the python blocks
@dataclass(frozen=True)
class Py:
    """How one python block runs, found by ``snippet`` (text only that block of ``page`` holds)."""

    page: str
    snippet: str
    where: str = 'here'  # 'here' | 'torchrun' | 'dingengine' | 'cuda'
    setup: str = ''  # run before the block, in its namespace: the names the page leaves to its reader
    check: str = ''  # run after it: asserts what the prose next to it claims (torchrun: report() what the ranks saw)
    nproc: int = 2  # torchrun: ranks


# the ranks' common setup: a batch of transitions as an Ape-X actor pushes them
_TRANSITIONS = """
import torch

batch = {'obs': torch.randn(256, 4), 'action': torch.randint(0, 2, (256,)), 'reward': torch.ones(256),
         'next_obs': torch.randn(256, 4), 'done': torch.zeros(256, dtype=torch.bool)}
td_error = torch.rand(256)
"""

PYTHON = [
    Py(
        'README.md',
        "distributed=dict(backend='torch')",
        where='torchrun',
        setup='from easydict import EasyDict\nfrom ding_buffer import create_buffer  # the quick start imports them'
        + _TRANSITIONS,
        check="""
import os
from ding_buffer.distributed import RemoteBuffer, ReplayBufferManager

if isinstance(buffer, ReplayBufferManager):  # "on the last rank: a ReplayBufferManager; call buffer.run() there"
    report(rank=os.environ['RANK'], kind='manager', summary=buffer.run())
else:
    assert isinstance(buffer, RemoteBuffer), type(buffer)
    buffer.extend(batch)
    report(rank=os.environ['RANK'], kind='worker', count=buffer.count(), last_score=buffer.last_score)
    buffer.close()
""",
    ),
    Py(
        'docs/distributed.md',
        '# serves until every worker closed or was lost',
        where='torchrun',
        setup="from easydict import EasyDict\n\ncfg = EasyDict(type='advanced', replay_buffer_size=10_000, "
        "storage=dict(type='tensor'), distributed=dict(backend='torch', timeout=60))" + _TRANSITIONS,
        check="""
import os

if isinstance(buffer, ReplayBufferManager):
    report(rank=os.environ['RANK'], kind='manager', summary=summary)
else:
    report(rank=os.environ['RANK'], kind='worker', last_score=buffer.last_score, sampled=len(batch['obs']))
""",
    ),
    Py(
        'docs/distributed.md',
        'shared_memory=True))',
        where='torchrun',
        nproc=3,
        check="""
import os

if isinstance(buffer, ReplayBufferManager):  # "the rows that came through shared memory"
    assert summary['counters']['shm_rows'] == 2000, summary['counters']
    report(rank=os.environ['RANK'], kind='manager', summary=summary)
else:  # "answered after the manager committed this actor's ring: every push above counts"
    assert stats['manager/shm_rows'] >= 1000 and stats['count'] >= 1000, stats
    report(rank=os.environ['RANK'], kind='worker', shm_rows=stats['manager/shm_rows'])
""",
    ),
    Py(
        'docs/distributed.md',
        'num_shards=2',
        where='torchrun',
        nproc=3,
        setup="from easydict import EasyDict\nfrom ding_buffer import create_buffer\n\n"
        "cfg = EasyDict(type='advanced', replay_buffer_size=10_000, storage=dict(type='tensor'))" + _TRANSITIONS,
        check="""
import os
from ding_buffer.distributed import ReplayBufferManager

if isinstance(buffer, ReplayBufferManager):  # "managers: run() as before"
    report(rank=os.environ['RANK'], kind='manager', summary=buffer.run())
else:
    for half in (slice(0, 128), slice(128, 256)):  # a push goes to one shard, round-robin per call
        buffer.extend({k: v[half] for k, v in batch.items()})
    sample = buffer.sample(64, timeout=30)
    stats = buffer.stats()
    report(rank=os.environ['RANK'], kind='worker', type=type(buffer).__name__,
           shards=[stats['shard0/count'], stats['shard1/count']], shard_column=sorted(set(sample['shard'].tolist())))
    buffer.close()
""",
    ),
    Py(
        'docs/persistence.md',
        "allow_pickle=True)",
        check="""
try:  # "Without allow_pickle=True the last load raises ValueError"
    create_buffer(dict(type='naive')).load_data('ckpt/list.pt')
except ValueError as e:
    assert 'allow_pickle=True' in str(e), e
else:
    raise AssertionError('a file of arbitrary objects loaded without allow_pickle=True')
""",
    ),
    Py('docs/storages.md', "device='cuda:0'", where='cuda'),
    Py(
        'docs/dingengine.md',
        "type='advanced', import_names=['ding_buffer.integrations.dingengine']",
        check="""
from ding.config import compile_config
from ding.utils import BUFFER_REGISTRY as DING_REGISTRY

# "DI-engine imports a buffer section's import_names in compile_config ... registers this package's presets in
# DI-engine's buffer registry under DI-engine's names ... and under ding_buffer_<type> for the other types but the
# GFlowNet ones"
compile_config(main_config, create_cfg=create_config, auto=True, save_cfg=False)
ours = ['naive', 'advanced', 'elastic', 'episode', 'sequence', 'deque']
ours += ['ding_buffer_prioritized_episode', 'ding_buffer_chunk']
assert {DING_REGISTRY.get(n).__module__ for n in ours} == {'ding_buffer.integrations.dingengine'}
assert not [n for n in DING_REGISTRY if n.startswith('ding_buffer_') and 'gfn' in n], list(DING_REGISTRY)
""",
    ),
    Py(
        'docs/dingengine.md',
        "type='deque'",
        check="""
from ding.config import compile_config
from ding.worker import create_buffer as ding_create_buffer

deque_cfg = compile_config(main_config, create_cfg=create_config, auto=True, save_cfg=False)
built = ding_create_buffer(deque_cfg.policy.other.replay_buffer, exp_name=deque_cfg.exp_name)
name = f'{type(built).__module__}.{type(built).__name__}'  # "the serial pipeline builds ours"
assert name == 'ding_buffer.integrations.dingengine.DequeReplayBuffer', type(built).__mro__
""",
    ),
    Py(
        'docs/dingengine.md',
        '# from ding.worker import create_buffer',
        setup="from tensorboardX import SummaryWriter\n\ntb_logger = SummaryWriter('tb')  # serial_pipeline makes one",
    ),
]
WHERE = ('here', 'torchrun', 'dingengine', 'cuda')
# every block of these pages runs there
PAGE_WHERE = {'docs/dingengine.md': 'dingengine'}


def file_block(fence: Fence) -> Optional[str]:
    """The file name a block is the content of (its first line is ``# NAME.py``), else None."""
    m = re.match(r'#\s*([\w/.-]+\.py)\s*$', fence.text.splitlines()[0] if fence.text.strip() else '')
    return m.group(1) if m else None


def spec_of(fence: Fence) -> Py:
    found = [p for p in PYTHON if p.page == fence.page and p.snippet in fence.text]
    assert len(found) <= 1, f'{fence.where()}: more than one PYTHON entry matches this block: {found}'
    spec = found[0] if found else Py(fence.page, '')
    page_where = PAGE_WHERE.get(fence.page)
    if page_where is not None:
        assert spec.where in ('here', page_where), f'{fence.where()}: every block of {fence.page} runs in {page_where}'
        spec = dataclasses.replace(spec, where=page_where)
    return spec


# ---------------------------------------------------------------- the runner (stdlib only: also sent to subprocesses)
def block_expectations(code):
    """{line of ``code`` (1-based): TEXT} for every ``# -> TEXT`` comment."""
    import io
    import tokenize

    wants = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        body = tok.string[1:].strip()
        if tok.type == tokenize.COMMENT and body.startswith('->'):
            wants[tok.start[0]] = body[2:].strip()
    return wants


def run_code(code, ns, filename, first_line, label):
    """Run ``code`` (line ``first_line`` of ``filename``, for tracebacks) in ``ns`` one top-level statement at a
    time, checking each ``# -> TEXT`` against what the statement shows; returns the number of checks made."""
    import ast
    import contextlib
    import doctest
    import io
    import sys

    wants = block_expectations(code)
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    checked = 0
    for stmt in ast.parse(code).body:
        want = wants.pop(stmt.end_lineno, None)
        line = first_line + stmt.end_lineno - 1
        ast.increment_lineno(stmt, first_line - 1)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            if isinstance(stmt, ast.Expr):
                value = eval(compile(ast.Expression(stmt.value), filename, 'eval'), ns)
            else:
                exec(compile(ast.Module([stmt], type_ignores=[]), filename, 'exec'), ns)
                targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                one = len(targets) == 1 and isinstance(targets[0], ast.Name)
                value = ns.get(targets[0].id) if one else None
        shown = printed.getvalue()
        sys.stdout.write(shown)
        if want is not None:
            got = shown.rstrip('\n') if shown else repr(value)
            if not checker.check_output(want + '\n', got + '\n', flags):
                raise AssertionError(f'{label}, line {line}: the text says it shows\n  {want}\nbut it shows\n  {got}')
            checked += 1
    if wants:
        lines = [first_line + k - 1 for k in sorted(wants)]
        raise AssertionError(f'{label}: `# ->` on line(s) {lines} does not end a top-level statement')
    return checked


def run_steps(steps, ns):
    """Run the steps (dicts: ``kind`` 'file' writes ``code`` to the file ``name``; else ``code`` from ``filename`` at
    ``line``, called ``label``) in ``ns``; returns the number of ``# ->`` checks made."""
    import pathlib

    checked = 0
    for step in steps:
        if step['kind'] == 'file':
            pathlib.Path(step['name']).write_text(step['code'])
        else:
            checked += run_code(step['code'], ns, step['filename'], step['line'], step['label'])
    return checked


RUNNER_MAIN = """
def report(**values):
    '''Record what this process saw: OUT/rank<RANK>.json (the test reads it).'''
    REPORTED.update(values)
    path = pathlib.Path(OUT) / f"rank{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(REPORTED, default=repr))


REPORTED = {}
STEPS, OUT = json.loads(sys.argv[1]), sys.argv[2]
checks = run_steps(STEPS, {'__name__': '__main__', 'report': report})
report(checks=checks, done=True)
"""


def runner_script(path: Path) -> Path:
    """A script running ``run_steps(json argv[1])`` with a ``report()`` writing into argv[2]."""
    source = '\n\n'.join(inspect.getsource(f) for f in (block_expectations, run_code, run_steps))
    path.write_text('import json\nimport os\nimport pathlib\nimport sys\n\n\n' + source + '\n' + RUNNER_MAIN)
    return path


def steps_of(fence: Fence, spec: Py) -> List[dict]:
    """The steps of one block: its setup, the block (or the file it is), its check."""
    name = file_block(fence)
    if name is not None:
        return [{'kind': 'file', 'name': name, 'code': fence.text}]
    page_path = str(REPO / fence.page)
    steps = []
    for kind, code in (('setup', spec.setup), ('block', fence.text), ('check', spec.check)):
        if not code.strip():
            continue
        code = code.strip('\n') + '\n'
        if kind == 'block':
            steps.append(
                {'kind': kind, 'code': code, 'filename': page_path, 'line': fence.first, 'label': fence.where()}
            )
        else:
            label = f'the {kind} of {fence.where()} (in {Path(__file__).name})'
            steps.append({'kind': kind, 'code': code, 'filename': f'<{label}>', 'line': 1, 'label': label})
    return steps


def shows_something(fence: Fence, spec: Py) -> bool:
    return bool(block_expectations(fence.text)) or bool(spec.check.strip())


# ======================================================================================== the bash blocks
# Commands run by this module's tests: command -> the test.
RUN = {
    'ding-buffer configs': 'test_cheap_commands_run',
    'ding-buffer demo': 'test_demo_command_runs',
}
# Commands run elsewhere: command -> ((where, words its source must hold), ...); a test is 'path::name'. CI_LINE:
# the command is part of a README line that .ci/run reads out of README.md and runs (in a fresh venv), checked
# against .ci/run's own patterns.
CI = '.ci/run'
CI_LINE = '.ci/run <- README.md'
APEX = 'tests/train/test_train_apex.py::'
HYPERGRID = 'tests/train/test_train_hypergrid.py::'
TRAIN = 'tests/train/test_train.py::'
PACKAGING = 'tests/test_packaging.py::'
MAPPED: Dict[str, Tuple[Tuple[str, Tuple[str, ...]], ...]] = {
    'python -m venv .venv': ((CI, ('python -m venv',)),),
    '. .venv/bin/activate': ((CI, ('/bin/activate"',)),),
    'pip install torch==2.13.0': ((CI_LINE, ()),),
    # the CPU-index form of that line needs the network: CI runs the plain line (it finds the CPU wheel on disk)
    'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu': ((CI, ('torch_cmd',)),),
    'pip install -e ".[test]"': ((CI_LINE, ()),),
    'pip install --no-deps torchgfn==2.4.1 di-engine==0.5.3': ((CI_LINE, ()),),
    'python -m pytest -q': ((CI_LINE, ()),),
    # CI installs the test extra, which holds the examples extra (test_the_examples_extra_is_within_the_test_extra)
    'pip install -e ".[examples]"': ((CI, ('.[test]',)),),
    'sudo apt-get install openmpi-bin libopenmpi-dev': ((CI, ('apt-get install', 'openmpi-bin libopenmpi-dev')),),
    # DI-engine with its dependencies (docs/dingengine.md): the venv tests/integrations builds, with that list
    # (test_the_dingengine_install_lines_are_the_venv_the_tests_build)
    'python -m venv dingenv': (('tests/integrations/conftest.py', ("'-m', 'venv'",)),),
    '. dingenv/bin/activate': (('tests/integrations/conftest.py', ("'bin' / 'python'",)),),
    'pip install --no-deps di-engine==0.5.3': (('tests/integrations/conftest.py', ("'--no-deps', DINGENGINE",)),),
    'pip install "numpy<2" gym==0.25.1 ...': (('tests/integrations/conftest.py', ("'install dependencies'",)),),
    # the tests put the checkout on the venv's PYTHONPATH
    'pip install --no-deps -e .': (('tests/integrations/test_dingengine_pipelines.py', ('PYTHONPATH=str(REPO)',)),),
    # training jobs
    'ding-buffer train config/cartpole_dqn_per.py': ((TRAIN + 'test_short_run_learns_and_writes_its_artefacts', ()),),
    'ding-buffer train config/cartpole_offline_to_online.py': (
        (
            'tests/train/test_offline.py::test_the_offline_to_online_config_makes_its_dataset_first_then_fine_tunes',
            ('O2O_CONFIG',),
        ),
    ),
    'ding-buffer train cartpole_dqn_per [--seed N] [--env-steps N] [--resume RUN_DIR] [--device cpu|cuda] '
    '[--threads N]': (
        (TRAIN + 'test_short_run_learns_and_writes_its_artefacts', ()),
        (TRAIN + 'test_resume_continues_from_the_checkpoint_with_identical_counters', ("'--resume'",)),
        ('tests/test_cli.py::test_every_bad_flag_exits_2_with_one_line_and_changes_nothing', ()),
        ('tests/test_packaging.py::test_wheel_installed_in_a_fresh_venv_runs_its_configs_outside_the_checkout', ()),
    ),
    'ding-buffer plot RUN_DIR [RUN_DIR ...] [--out PNG] [--title TITLE]': (
        (TRAIN + 'test_plot_overlays_run_directories', ("'--out'", "'--title'")),
        ('tests/train/test_plot.py::test_cli_plot_exits_0_and_writes_png', ()),
    ),
    'pip wheel --no-deps . -w dist': (('tests/test_packaging.py', ("'wheel'", "'--no-deps'")),),
    'pip install torch==2.13.0 "$(ls dist/ding_buffer-*.whl)[examples]"': (
        (PACKAGING + 'test_wheel_installed_in_a_fresh_venv_runs_its_configs_outside_the_checkout', ("'install'",)),
    ),
    'ding-buffer train cartpole_dqn_per --env-steps 5000': (
        (PACKAGING + 'test_wheel_installed_in_a_fresh_venv_runs_its_configs_outside_the_checkout', ("'--env-steps'",)),
    ),
    'ding-buffer train cartpole_dqn_per --seed $s --no-progress': (
        (TRAIN + 'test_short_run_learns_and_writes_its_artefacts', ()),
    ),
    # no test trains the shipped uniform config unchanged: it trains with its buffer class subclassed, and
    # test_configs.py checks the shipped configs
    'ding-buffer train cartpole_dqn_uniform --seed $s --no-progress': (
        (TRAIN + 'test_a_registered_subclass_of_a_supported_buffer_trains', ('UNIFORM_CONFIG',)),
        ('tests/test_configs.py', ('CONFIG_DIR',)),
    ),
    'ding-buffer plot cartpole_dqn_per_seed* cartpole_dqn_uniform_seed* --out per_vs_uniform.png': (
        (TRAIN + 'test_plot_overlays_run_directories', ("'--out'",)),
    ),
    'ding-buffer train config/cartpole_apex.py --nproc 4': (
        (APEX + 'test_torch_run_learns_survives_a_killed_actor_and_logs', ("'--nproc'",)),
    ),
    'torchrun --nproc_per_node 4 -m ding_buffer train config/cartpole_apex.py': (
        (APEX + 'test_resume_under_torchrun_continues_counters_and_buffer', ("'--nproc_per_node'",)),
    ),
    # with backend 'mpi', --nproc starts the ranks with mpirun
    'mpirun -n 4 python -m ding_buffer train config/cartpole_apex.py': ((APEX + 'test_mpi_run_learns', ("'mpi'",)),),
    'ding-buffer train config/cartpole_apex.py --nproc 4 --resume cartpole_apex_seed0': (
        (APEX + 'test_resume_under_torchrun_continues_counters_and_buffer', ("'--resume'", "'--nproc'")),
    ),
    'ding-buffer train config/hypergrid_tb_gfn.py': ((HYPERGRID + 'test_learns_and_writes_artifacts', ()),),
    'ding-buffer train config/hypergrid_tb_gfn.py --seed 1 --iterations 5000': (
        (HYPERGRID + 'test_learns_and_writes_artifacts', ("'--iterations'", "'--seed'")),
    ),
    'ding-buffer train config/hypergrid_tb_gfn.py --resume ./hypergrid_tb_gfn_seed0': (
        (HYPERGRID + 'test_resume_continues_with_counters_intact', ()),
    ),
    # a viewer (a server, not run): the event files it reads are checked by the training test
    'tensorboard --logdir ./hypergrid_tb_gfn_seed0/log': (
        (HYPERGRID + 'test_learns_and_writes_artifacts', ("'log'", 'scalars')),
    ),
    'ding-buffer train config/hypergrid_tb_distributed.py --nproc 4': (
        (
            'tests/train/test_train_hypergrid_dist.py::test_torch_run_learns_with_samplers_and_survives_a_killed_sampler',
            ("'--nproc'",),
        ),
    ),
}
# a key ending in ' ...' maps every command it begins (test_the_dingengine_install_lines_are_the_venv_the_tests_build
# checks the rest of that one)


def mapped_key(command: str) -> Optional[str]:
    for key in MAPPED:
        if key == command or (key.endswith(' ...') and command.startswith(key[:-3])):
            return key
    return None


# lines that are a shell loop's words, not commands
SHELL_SYNTAX = re.compile(r'^(for \w+ in .*; do|do|done)$')


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in '\'"':
            quote = ch
        elif ch == '#' and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(fence: Fence) -> List[Tuple[int, str]]:
    """(page line, command) of each command of a bash block."""
    out, pending, start = [], '', None
    for k, raw in enumerate(fence.text.splitlines()):
        text = strip_comment(raw).rstrip()
        if start is None:
            start = fence.first + k
        if text.endswith('\\'):
            pending += text[:-1] + ' '
            continue
        text, pending = ' '.join((pending + text).split()), ''
        if text and not SHELL_SYNTAX.match(text):
            out.extend((start, part.strip()) for part in text.split(' && '))
        start = None
    return out


def ref_source(ref: str) -> Optional[str]:
    """The source of ``path::test_name`` (the function), or of the file ``path``; None if absent."""
    path, _, name = ref.partition('::')
    if not (REPO / path).is_file():
        return None
    text = (REPO / path).read_text(encoding='utf-8')
    if not name:
        return text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    return None


def ci_readme_lines() -> List[str]:
    """The README lines .ci/run reads out of README.md (its ``grep [-x] -E 'PATTERN' README.md``) and runs."""
    ci = (REPO / CI).read_text()
    lines = (REPO / 'README.md').read_text().splitlines()
    found = []
    for flags, pattern in re.findall(r"grep ([^'|]*?)-E '([^']+)' README\.md", ci):
        match = re.fullmatch if '-x' in flags.split() else re.search
        found += [line for line in lines if match(pattern, line)][:1]  # grep -m1
    return found


# ======================================================================================== fences without a language
@dataclass(frozen=True)
class Text:
    page: str
    snippet: str
    kind: str  # 'output' (compared with what the package prints: OUTPUTS[snippet]) | 'diagram' | 'layout'


TEXT = [
    Text('README.md', 'storage   list | tensor', 'diagram'),
    Text('docs/composing.md', "unknown config key 'replay_bufer_size'", 'output'),
    Text('docs/composing.md', 'table.prepare: validate everything', 'diagram'),
    Text('docs/storages.md', 'TensorStorage(capacity=1000', 'output'),
    Text('docs/training.md', "ding-buffer: error: my_cfg.py: unknown config key 'env.max_env_stp'", 'output'),
    Text('docs/contributing.md', 'ding_buffer/\n  base.py', 'layout'),
]
TEXT_KINDS = ('output', 'diagram', 'layout')
TEXT_LANGS = ('', 'text', 'txt')


def text_of(fence: Fence) -> Optional[Text]:
    found = [t for t in TEXT if t.page == fence.page and t.snippet in fence.text]
    assert len(found) <= 1, f'{fence.where()}: more than one TEXT entry matches this fence: {found}'
    return found[0] if found else None


def _config_error(tmp_path, capsys) -> str:
    from ding_buffer import create_buffer

    with pytest.raises(ValueError) as e:
        create_buffer(dict(type='advanced', replay_bufer_size=10))
    return str(e.value)


def _tensor_storage_repr(tmp_path, capsys) -> str:
    import torch

    from ding_buffer import create_buffer

    buffer = create_buffer(dict(type='naive', replay_buffer_size=1000, storage=dict(type='tensor')))
    buffer.extend(
        {'obs': torch.randn(1000, 4), 'action': torch.ones(1000, dtype=torch.long), 'reward': torch.ones(1000)}
    )
    return repr(buffer.storage)


def _train_config_error(tmp_path, capsys) -> str:
    from ding_buffer.cli import main

    (tmp_path / 'my_cfg.py').write_text('main_config = dict(env=dict(max_env_stp=10))\n')  # in the working directory
    assert main(['train', 'my_cfg.py']) == 2
    return capsys.readouterr().err


OUTPUTS: Dict[str, Callable] = {
    "unknown config key 'replay_bufer_size'": _config_error,
    'TensorStorage(capacity=1000': _tensor_storage_repr,
    "ding-buffer: error: my_cfg.py: unknown config key 'env.max_env_stp'": _train_config_error,
}


# ======================================================================================== the inventory
def test_every_fence_is_run_mapped_or_listed():
    problems = []
    used_py, used_text, used_commands = set(), set(), set()
    for fence in all_fences():
        if fence.lang == 'python':
            spec = spec_of(fence)
            if spec.snippet:
                used_py.add((spec.page, spec.snippet))
            try:
                ast.parse(fence.text)
            except SyntaxError as e:
                problems.append(f'{fence.where()}: the python block does not parse: {e}')
                continue
            if spec.where not in WHERE:
                problems.append(f'{fence.where()}: where={spec.where!r} is not one of {WHERE}')
            if file_block(fence) is None and not shows_something(fence, spec):
                problems.append(
                    f'{fence.where()}: the python block shows nothing: end the statement that shows its result with '
                    '`# -> WHAT IT SHOWS`, or give it a check in PYTHON (what the text next to it claims)'
                )
        elif fence.lang in ('bash', 'sh', 'shell', 'console'):
            for line, command in commands(fence):
                used_commands.add(mapped_key(command) or command)
                if command not in RUN and mapped_key(command) is None:
                    problems.append(
                        f'{fence.page}:{line}: the command {command!r} is neither run here (RUN) nor mapped to the '
                        'test that runs it (MAPPED)'
                    )
        elif fence.lang in TEXT_LANGS:
            text = text_of(fence)
            if text is None:
                problems.append(
                    f'{fence.where()}: a fence without a language that TEXT does not list: label it ```python / '
                    '```bash, or list it in TEXT as output, diagram or layout'
                )
                continue
            used_text.add((text.page, text.snippet))
            if text.kind not in TEXT_KINDS:
                problems.append(f'{fence.where()}: TEXT kind {text.kind!r} is not one of {TEXT_KINDS}')
            elif text.kind == 'output' and text.snippet not in OUTPUTS:
                problems.append(f'{fence.where()}: an output fence with no producer in OUTPUTS')
            elif text.kind != 'output':
                try:
                    ast.parse(fence.text)
                except SyntaxError:
                    pass
                else:
                    problems.append(
                        f'{fence.where()}: a {text.kind} fence that parses as Python: is it a python block?'
                    )
        else:
            problems.append(f'{fence.where()}: a ```{fence.lang} fence: this module runs python and bash blocks only')
    problems += [
        f'PYTHON entry {p.page} {p.snippet!r} matches no python block'
        for p in PYTHON
        if (p.page, p.snippet) not in used_py
    ]
    problems += [
        f'TEXT entry {t.page} {t.snippet!r} matches no fence' for t in TEXT if (t.page, t.snippet) not in used_text
    ]
    problems += [f'RUN / MAPPED command {c!r} is in no bash block' for c in (*RUN, *MAPPED) if c not in used_commands]
    ci_parts = {part for line in ci_readme_lines() for part in line.split(' && ')}
    for command, refs in MAPPED.items():
        for ref, words in refs:
            if ref == CI_LINE:
                if command not in ci_parts:
                    problems.append(f'MAPPED {command!r}: no README line that .ci/run runs holds it')
                continue
            source = ref_source(ref)
            if source is None:
                problems.append(f'MAPPED {command!r}: {ref} does not exist')
            else:
                problems += [f'MAPPED {command!r}: {ref} does not hold {w!r}' for w in words if w not in source]
    for command, test in RUN.items():
        if not callable(globals().get(test)):
            problems.append(f'RUN {command!r}: no test {test} in this module')
    assert not problems, '\n'.join(problems)


def test_the_inventory_sees_every_kind_of_fence():
    """The reader of the pages finds what the pages hold: blocks of each language, with their lines."""
    found = all_fences()
    assert {f.lang for f in found} >= {'python', 'bash', ''}
    assert len([f for f in found if f.lang == 'python']) >= 20
    readme = fences('README.md')
    first = next(f for f in readme if f.lang == 'python')
    lines = (REPO / 'README.md').read_text().splitlines()
    assert lines[first.line - 1] == '```python' and lines[first.first - 1] == first.text.splitlines()[0]


# ======================================================================================== python blocks, in-process
def page_steps(page: str, where: str = 'here') -> List[dict]:
    steps = []
    for fence in fences(page):
        if fence.lang == 'python':
            spec = spec_of(fence)
            if spec.where == where:
                steps += steps_of(fence, spec)
    return steps


def registries() -> list:
    from ding_buffer import BUFFER_REGISTRY
    from ding_buffer.control.limits import REMOVER_REGISTRY
    from ding_buffer.control.samplers import SAMPLER_REGISTRY

    return [BUFFER_REGISTRY, REMOVER_REGISTRY, SAMPLER_REGISTRY]


@contextlib.contextmanager
def reader_session(tmp_path: Path, monkeypatch):
    """A reader's session: the working directory (on sys.path); afterwards, the registries and modules as before."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = [set(r.keys()) for r in registries()]
    modules = set(sys.modules)
    try:
        yield
    finally:
        for registry, names in zip(registries(), before):
            for name in set(registry.keys()) - names:
                del registry[name]
        for name in set(sys.modules) - modules:
            if getattr(sys.modules[name], '__file__', None) and str(tmp_path) in sys.modules[name].__file__:
                del sys.modules[name]


HERE_PAGES = [page for page in PAGES if page_steps(page)]


@pytest.mark.parametrize('page', HERE_PAGES)
def test_python_blocks_run_and_show_what_the_text_says(page, tmp_path, monkeypatch):
    steps = page_steps(page)
    with reader_session(tmp_path, monkeypatch):
        checks = run_steps(steps, {'__name__': '__main__'})
    print(f'{page}: {len([s for s in steps if s["kind"] == "block"])} blocks, {checks} `# ->` checks')


def test_cuda_blocks(tmp_path, monkeypatch):
    import torch

    steps = [s for page in PAGES for s in page_steps(page, 'cuda')]
    assert steps
    if not torch.cuda.is_available():
        pytest.skip('the cuda blocks need a GPU (torch.cuda.is_available() is False)')
    with reader_session(tmp_path, monkeypatch):
        run_steps(steps, {'__name__': '__main__'})


# ======================================================================================== python blocks, launched
def _launch(argv: List[str], cwd: Path, env: dict, timeout: float) -> Tuple[int, str]:
    """Run ``argv`` in its own session; on timeout kill the whole session. (exit status, output)."""
    log = cwd / 'launch.log'
    with open(log, 'wb') as f:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    output = log.read_text(errors='replace')
    assert rc is not None, f'{" ".join(argv[:6])} ... did not end within {timeout} s:\n{output[-6000:]}'
    return rc, output


LAUNCHED = [
    pytest.param(fence, id=f'{fence.page}:{fence.line}')
    for fence in all_fences('python')
    if spec_of(fence).where == 'torchrun'
]


def _expect_launch(fence: Fence, ranks: Dict[int, dict]) -> None:
    """What the text next to each launched block claims, from what its ranks reported."""
    spec = spec_of(fence)
    managers = {r: v for r, v in ranks.items() if v.get('kind') == 'manager'}
    workers = {r: v for r, v in ranks.items() if v.get('kind') == 'worker'}
    if spec.snippet == 'num_shards=2':
        # "the last 2 ranks are the managers (shards 0, 1)"; "workers: a ShardedBuffer with the IBuffer calls"
        assert sorted(managers) == [1, 2] and sorted(workers) == [0], ranks
        (worker,) = workers.values()
        assert worker['type'] == 'ShardedBuffer' and worker['shards'] == [128, 128], worker
        assert worker['shard_column'] == [0, 1], worker  # "the batch carries a shard column"
        return
    if spec.snippet == 'shared_memory=True))':  # two actors on the manager's host, every push through its ring
        assert sorted(managers) == [2] and sorted(workers) == [0, 1], ranks
        assert all(w['shm_rows'] >= 1000 for w in workers.values()), workers
        return
    # both single-manager blocks: the manager on the last rank, a RemoteBuffer elsewhere; the score of a push lands
    # in buffer.last_score ({'stored': n, ...}); run() serves until every worker closed
    assert sorted(managers) == [spec.nproc - 1] and sorted(workers) == list(range(spec.nproc - 1)), ranks
    for worker in workers.values():
        score = worker['last_score']
        assert isinstance(score, dict) and score.get('stored') == 256, f'buffer.last_score is {score!r}'
    (manager,) = managers.values()
    assert isinstance(manager['summary'], dict), manager


@pytest.mark.slow
@pytest.mark.parametrize('fence', LAUNCHED)
def test_launched_blocks_run_on_real_ranks(fence, tmp_path):
    spec = spec_of(fence)
    script = runner_script(tmp_path / 'rank_main.py')
    out = tmp_path / 'out'
    out.mkdir()
    argv = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nnodes', '1']
    argv += ['--nproc_per_node', str(spec.nproc), str(script), json.dumps(steps_of(fence, spec)), str(out)]
    env = {k: v for k, v in subprocess_env(OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1').items()}
    for name in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_WORLD_SIZE'):
        env.pop(name, None)
    t0 = time.monotonic()
    rc, output = _launch(argv, tmp_path, env, LAUNCH_TIMEOUT)
    print(f'{fence.where()}: {spec.nproc} ranks in {time.monotonic() - t0:.1f} s')
    assert rc == 0, f'{fence.where()}: the launch failed (exit {rc}):\n{output[-8000:]}'
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob('rank*.json')}
    assert sorted(ranks) == list(range(spec.nproc)) and all(r.get('done') for r in ranks.values()), output[-4000:]
    _expect_launch(fence, ranks)


# ======================================================================================== python blocks, DI-engine
# docs/dingengine.md's blocks run in the DI-engine venv: tests/integrations/test_dingengine_pipelines.py
# (test_dingengine_doc_blocks_run_with_its_dependencies), beside the other tests that use that venv.


# ======================================================================================== bash and text fences
def _ding_buffer(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``ding-buffer COMMAND`` as the docs write it (the console script, else ``python -m ding_buffer``)."""
    argv = ['ding-buffer', command] if _on_path('ding-buffer') else [sys.executable, '-m', 'ding_buffer', command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd=cwd, env=subprocess_env())


def test_cheap_commands_run(tmp_path):
    listed = _ding_buffer('configs', tmp_path)
    assert listed.returncode == 0, listed.stderr
    # "the ready configs installed with the package"
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert {p.stem for p in (REPO / 'config').glob('*.py') if not p.stem.startswith('_')} <= names, listed.stdout


@pytest.mark.slow
def test_demo_command_runs(tmp_path):
    demo = _ding_buffer('demo', tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    # "a few-second tour of every buffer type"
    assert re.search(r'demo finished in [\d.]+s: 12 buffer types toured', demo.stdout), demo.stdout[-2000:]


def _on_path(program: str) -> bool:
    """``program`` is installed next to this interpreter (the package's console script)."""
    return (Path(sys.executable).parent / program).is_file()


@pytest.mark.parametrize('snippet', sorted(OUTPUTS))
def test_output_fences_are_what_the_package_prints(snippet, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (fence,) = [f for f in all_fences() if f.lang in TEXT_LANGS and snippet in f.text]
    got = OUTPUTS[snippet](tmp_path, capsys).strip()
    want = fence.text.strip()
    ok = doctest.OutputChecker().check_output(want + '\n', got + '\n', doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert ok, f'{fence.where()} shows\n  {want}\nthe package prints\n  {got}'


def test_the_examples_extra_is_within_the_test_extra():
    """README installs `.[examples]` to train; CI installs `.[test]`: what the first brings, the second does too."""

    def extra(name):
        reqs = importlib.metadata.requires('ding-buffer') or []
        return {r.split(';')[0].strip() for r in reqs if re.search(rf'extra\s*==\s*["\']{name}["\']', r)}

    assert extra('examples') and extra('examples') <= extra('test'), (extra('examples'), extra('test'))


def test_the_dingengine_install_lines_are_the_venv_the_tests_build():
    """docs/dingengine.md's install lines for DI-engine with its dependencies name what tests/integrations builds."""
    tree = ast.parse(INTEGRATIONS_CONFTEST.read_text())
    consts = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id in ('DEPENDENCIES', 'DINGENGINE', 'TORCH')
    }
    lines = [c for f in fences('docs/dingengine.md') if f.lang == 'bash' for _, c in commands(f)]
    deps = [c for c in lines if c.startswith('pip install ') and 'gym==' in c]
    assert len(deps) == 1, lines
    named = [w.strip('"\'') for w in deps[0].split()[2:]]
    assert named == consts['DEPENDENCIES'], (named, consts['DEPENDENCIES'])
    assert f"pip install --no-deps {consts['DINGENGINE']}" in lines and f"pip install {consts['TORCH']}" in lines

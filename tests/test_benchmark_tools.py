"""benchmarks/regenerate.py: per-CPU blocks in docs/benchmarks.md (replaced in place, or added before the
benchmark's anchor), reports without their pass / miss lines, and ``--check`` against this CPU's hot-op baseline."""

import importlib.util
import json
import os

import pytest
from helpers import REPO_ROOT


@pytest.fixture(scope='module')
def regen():
    spec = importlib.util.spec_from_file_location('regenerate', REPO_ROOT / 'benchmarks' / 'regenerate.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cpu_blocks_are_added_per_cpu_and_replaced_in_place(regen):
    docs = '## Prioritized\n\nold text\n\n<!-- bench:per -->\n\n## Next\n'
    intel, amd = regen.cpu_slug('Intel(R) Xeon(R) Processor, 2 cores'), regen.cpu_slug('AMD EPYC 7B13, 2 cores')
    assert intel == 'intel-xeon-processor-2-cores' and amd == 'amd-epyc-7b13-2-cores'
    one = regen.splice(docs, 'per', intel, '#### per on Intel\n\ntable 1')
    two = regen.splice(one, 'per', amd, '#### per on AMD\n\ntable A')
    three = regen.splice(two, 'per', intel, '#### per on Intel\n\ntable 2')
    assert three.index('table 2') < three.index('table A') < three.index('<!-- bench:per -->') < three.index('## Next')
    assert 'table 1' not in three and three.count('<!-- bench:per:') == 2 and 'old text' in three
    assert regen.splice('no anchors here', 'per', intel, 'x') is None


def test_reports_lose_their_targets_section_and_headings_go_below_the_docs(regen):
    report = (
        '# bench\n\n## torch\n\n| a |\n\n'
        '| target | measured | result |\n|---|---:|---|\n| first sample | 7 ms | met |\n\n'
        '## targets\n\n- x: 40% -> MISSED (target >= 50%)\n\n## where\n\nmore\n'
    )
    out = regen.demote(regen.without_targets(report), top=5)
    assert 'MISSED' not in out and 'targets' not in out and 'met' not in out and '| a |' in out
    assert out.splitlines()[0] == '##### bench' and '###### torch' in out and '###### where' in out


def test_a_targets_heading_with_words_after_it_goes_but_the_notes_after_its_table_stay(regen):
    """bench_per's "## targets (stated for capacity 1e6)" table is followed by its notes (no heading between);
    bench_gfn's "## target: ..." section by another heading."""
    report = (
        '## ratio\n\n| r |\n|---|\n| 1 |\n\n## targets (stated for capacity 1e6)\n\n'
        '| target | capacity | result |\n|---|---:|---|\n| loop | 10 | NOT met |\n\n'
        'Notes (n/a = none):\n\n- a note\n\n## target: >= 1x per row\n\n| row | met |\n\n## cProfile\n\nx\n'
    )
    out = regen.without_targets(report)
    assert 'target' not in out and 'met' not in out
    assert '| 1 |' in out and 'Notes (n/a = none):' in out and '- a note' in out and '## cProfile' in out


def test_check_without_a_baseline_for_this_cpu_says_how_to_make_one(regen, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(regen, 'RESULTS', str(tmp_path))
    assert regen.main(['--check', '--rounds', '1']) == 2
    assert 'no baseline for this CPU' in capsys.readouterr().err


def test_check_fails_below_the_floor_and_passes_above(regen, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(regen, 'RESULTS', str(tmp_path))
    slug = regen.cpu_slug()
    os.makedirs(tmp_path / slug)
    base = dict(cpu='x', date_utc='then', capacity=1000, target_s=0.1, median={'op a': 100.0, 'op b': 100.0})
    (tmp_path / slug / 'hot_ops.json').write_text(json.dumps(base))
    monkeypatch.setattr(regen, 'hot_ops', lambda rounds, capacity, target_s: {'op a': [99.0], 'op b': [96.0]})
    assert regen.main(['--check', '--rounds', '1']) == 0
    monkeypatch.setattr(regen, 'hot_ops', lambda rounds, capacity, target_s: {'op a': [99.0], 'op b': [90.0]})
    assert regen.main(['--check', '--rounds', '1']) == 1
    assert 'op b: 0.900 of the baseline' in capsys.readouterr().err


def test_the_scaling_benchmark_runs_and_reports_every_capacity_and_operation():
    """benchmarks/bench_scale.py --quick: one row per capacity with a number in every column, then the growth of
    each operation (a smoke run: the numbers themselves are the machine's)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(REPO_ROOT / 'benchmarks' / 'bench_scale.py'), '--quick'],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO_ROOT),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(('| 1,000 |', '| 10,000 |'))]
    assert len(rows) == 2, out.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip('|').split('|')]
        assert len(cells) == 9 and all(float(c.replace(',', '')) > 0 for c in cells), row
    growth = [line for line in out.stdout.splitlines() if line.startswith('- ') and line.endswith('x')]
    assert len(growth) == 5, out.stdout
    assert 'CPU:' in out.stdout


def test_the_request_floor_benchmark_parses_its_options_and_quick_shrinks_the_run():
    """benchmarks/bench_request_floor.py: the defaults, --quick, and a bad transport or client count rejected
    (exit 2) -- parsing only, nothing launched."""
    path = REPO_ROOT / 'benchmarks' / 'bench_request_floor.py'
    spec = importlib.util.spec_from_file_location('bench_request_floor', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = mod.options([])
    assert args.transports == ['torch', 'mpi', 'ray'] and args.clients == [1, 2, 8] and args.seconds == 3.0
    args = mod.options(['--quick', '--transports', 'mpi'])
    assert args.transports == ['mpi'] and args.clients == [1, 2] and args.seconds == 1.0
    for bad in (['--transports', 'torch,gloo'], ['--clients', '1,x'], ['--clients', '0'], ['--seconds', '0']):
        with pytest.raises(SystemExit) as e:
            mod.options(bad)
        assert e.value.code == 2, bad


def test_the_request_floor_benchmark_times_the_managers_own_steps_in_process():
    """bench_request_floor.manager_steps: every step of one small request timed once the storage is warm, the
    buffer push at 1, 8 and 64 rows a call (it raises when a timed push was not stored)."""
    path = REPO_ROOT / 'benchmarks' / 'bench_request_floor.py'
    spec = importlib.util.spec_from_file_location('bench_request_floor', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.manager_steps(n=256)
    steps = [r['step'] for r in rows]
    assert len(steps) == 7 and steps[2].startswith('ManagerCore.handle'), steps
    assert [s.split(', ')[1] for s in steps[4:]] == [
        '1 row(s) in one call',
        '8 row(s) in one call',
        '64 row(s) in one call',
    ]
    assert all(r['us'] > 0 for r in rows), rows

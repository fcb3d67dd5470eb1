"""Regenerate the benchmark tables of docs/benchmarks.md for this CPU, and check the hot operations against them.

Each benchmark below runs as its own subprocess; its markdown report goes to
``benchmarks/results/<cpu>/<name>.md`` (``<cpu>``: a slug of this machine's CPU model and core count). In
docs/benchmarks.md the block between ``<!-- bench:<name>:<cpu> -->`` and ``<!-- /bench:<name>:<cpu> -->`` is then
replaced by that report, under a heading naming the CPU, the date and the command; a CPU without a block yet gets a
new one, placed before the benchmark's anchor ``<!-- bench:<name> -->`` -- so tables of an Intel and an AMD machine
sit side by side, each saying where it comes from. A report's "targets" section (the scripts' own pass / miss
lines) is left out of the docs: the ratios and their references speak for themselves. A benchmark that fails or
is skipped leaves its block as it was and is reported; the exit status is 1 if any failed.

After the benchmarks the hot operations (``compare_commits.py``'s: prioritized push / sample / update / DQN loop,
uniform push / sample on tensor and list storage) are timed on the working tree and kept as this CPU's baseline in
``benchmarks/results/<cpu>/hot_ops.json``. ``--check`` times them again and exits 1 when one runs below 0.95x of
that baseline (2 when this CPU has none yet): a contributor's check before a change lands, not a CI gate (timings
depend on the machine's load).

    python benchmarks/regenerate.py                      # all of them (~40 min on 2 cores)
    python benchmarks/regenerate.py --only per,startup   # some (the hot-op baseline is refreshed too)
    python benchmarks/regenerate.py --quick              # smoke: every script's --quick (docs NOT changed)
    python benchmarks/regenerate.py --check [--rounds 5] # hot operations against this CPU's baseline
    python benchmarks/regenerate.py --diengine-python /tmp/dienv/bin/python   # DI-engine with its deps

| name | script | what | peers |
|---|---|---|---|
| per | bench_per.py | prioritized replay, 1e5 / 1e6, images, bytes per item | cpprb, TorchRL, DI-engine |
| naive | bench_naive.py | uniform replay, 1e5 / 1e6 | cpprb, TorchRL, DI-engine style |
| gfn | bench_gfn.py | ``gfn_diverse`` insert / sample / fill | torchgfn |
| gfn_ops | bench_gfn_ops.py | every GFlowNet buffer's push / sample with real containers, 1k / 10k | torchgfn |
| startup | bench_startup.py | import, first push / sample / update of a fresh process | (none) |
| dingengine | bench_dingengine.py | every DI-engine buffer type | DI-engine (needs its dependencies) |
| distributed | bench_distributed.py | the manager per backend | raw transport, torchgfn |
| local_actors | bench_local_actors.py | 1-32 local actors' one-row pushes, wire and shared memory | cpprb |
| atari | bench_atari.py | frames stored once: push, sample, n-step | cpprb, numpy gather |

Benchmarks are noisy on a shared VM: run this on a quiet machine (nothing else running) and read ratios, which
come from peers interleaved in one process.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCS = os.path.join(ROOT, 'docs', 'benchmarks.md')
RESULTS = os.path.join(HERE, 'results')
CHECK_FLOOR = 0.95  # --check: a hot operation below this fraction of the baseline fails

# name -> (script, arguments of a full run, arguments of a smoke run, DI-engine's python: 'needs' / 'prefers' / '')
BENCHES: Dict[str, Tuple[str, List[str], List[str], str]] = {
    'per': ('bench_per.py', [], ['--quick', '--no-memory'], 'prefers'),  # DI-engine is one of its peers
    'naive': ('bench_naive.py', [], ['--quick'], ''),
    'gfn': ('bench_gfn.py', [], ['--quick'], ''),
    'gfn_ops': ('bench_gfn_ops.py', [], ['--quick'], ''),
    'startup': ('bench_startup.py', [], ['--rounds', '1'], ''),
    'dingengine': (
        'bench_dingengine.py',
        ['--capacity', '100000', '--rounds', '3', '--target-s', '0.5'],
        ['--rounds', '1', '--capacity', '2000'],
        'needs',
    ),
    'distributed': ('bench_distributed.py', [], ['--quick'], ''),
    'local_actors': ('bench_local_actors.py', [], ['--quick'], ''),
    'scale': ('bench_scale.py', ['--target-s', '2.0'], ['--quick'], ''),
    'atari': ('bench_atari.py', ['--capacity', '50000', '--rounds', '3'], ['--capacity', '2000', '--rounds', '1'], ''),
}


# ---------------------------------------------------------------------------------------------- this machine
def cpu_label() -> str:
    """This machine as the tables name it: the CPU model (as every benchmark reads it) and its core count."""
    sys.path.insert(0, HERE)
    from bench_naive import cpu_model

    return f'{cpu_model()}, {os.cpu_count()} cores'


def cpu_slug(label: Optional[str] = None) -> str:
    """A file and marker name for ``label`` (default this machine's): lower case, words joined by dashes."""
    words = re.findall(r'[a-z0-9]+', (label or cpu_label()).lower().replace('(r)', '').replace('(tm)', ''))
    return '-'.join(words)[:80] or 'cpu'


# ---------------------------------------------------------------------------------------------- the docs
def marker(name: str, slug: str) -> Tuple[str, str]:
    return f'<!-- bench:{name}:{slug} -->', f'<!-- /bench:{name}:{slug} -->'


def anchor(name: str) -> str:
    """Where a benchmark's blocks of new CPUs go (before it)."""
    return f'<!-- bench:{name} -->'


def demote(markdown: str, top: int = 4) -> str:
    """Headings of a report shifted so its highest one is ``####``: below the docs' own sections."""
    levels = [len(h) for h in re.findall(r'^(#+) ', markdown, flags=re.M)]
    shift = top - min(levels) if levels else 0
    return re.sub(r'^(#+) ', lambda m: '#' * max(1, min(6, len(m.group(1)) + shift)) + ' ', markdown, flags=re.M)


def without_targets(markdown: str) -> str:
    """The report without its pass / miss verdicts: a "targets" / "target: ..." section (its heading and the table,
    bullet lines and blank lines right after it; the next paragraph or heading stays), and tables headed
    ``| target |``."""
    out, dropping = [], False
    for line in markdown.split('\n'):
        if re.match(r'^#+ targets?\b', line, flags=re.I):
            dropping = True
            continue
        if dropping and (not line.strip() or line.startswith('|') or line.startswith('- ')):
            continue
        dropping = False
        out.append(line)
    return re.sub(r'^\| target \|.*\n(?:^\|.*(?:\n|\Z))*\n?', '', '\n'.join(out), flags=re.M | re.I)


def splice(docs: str, name: str, slug: str, body: str) -> Optional[str]:
    """``docs`` with ``name``'s block for CPU ``slug`` replaced by ``body`` (or added before the benchmark's anchor);
    None when the docs have neither."""
    begin, end = marker(name, slug)
    block = begin + '\n' + body.rstrip() + '\n' + end
    i, j = docs.find(begin), docs.find(end)
    if i >= 0 and j > i:
        return docs[:i] + block + docs[j + len(end) :]
    k = docs.find(anchor(name))
    if k < 0:
        return None
    return docs[:k] + block + '\n\n' + docs[k:]


def block_of(name: str, out: str, wall: float, stamp: str, python: str) -> str:
    script = BENCHES[name][0]
    head = (
        f'#### {name} on {cpu_label()}\n\n'
        f'*{stamp}: `python benchmarks/regenerate.py --only {name}` (`{script}`, {wall:.0f} s)'
        + (f', with `{python}` (where DI-engine imports)' if python != sys.executable else '')
        + '.*\n\n'
    )
    return head + demote(without_targets(out), top=5)


# ---------------------------------------------------------------------------------------------- running
def run(name: str, quick: bool, python: str, timeout: float) -> Tuple[bool, str, float]:
    script, full, smoke, _ = BENCHES[name]
    cmd = [python, os.path.join(HERE, script)] + (smoke if quick else full)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f'timed out after {timeout:.0f} s', time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return False, f'exit {proc.returncode}: {proc.stderr.strip()[-1500:]}', wall
    return True, proc.stdout, wall


def hot_ops(rounds: int, capacity: int, target_s: float) -> Dict[str, List[float]]:
    """The hot operations of ``compare_commits.py`` on the working tree: each round in a fresh process."""
    rates: Dict[str, List[float]] = {}
    for r in range(rounds):
        res = subprocess.run(
            [sys.executable, os.path.join(HERE, 'compare_commits.py'), '--child', ROOT, str(capacity), str(target_s)],
            capture_output=True,
            text=True,
            env={**os.environ, 'PYTHONPATH': ''},
        )
        if res.returncode:
            raise SystemExit(f'hot operations failed:\n{res.stderr[-3000:]}')
        for op, v in json.loads(res.stdout.strip().splitlines()[-1]).items():
            rates.setdefault(op, []).append(v)
        print(f'[regenerate] hot operations: round {r + 1}/{rounds}', file=sys.stderr, flush=True)
    return rates


def baseline_path(slug: str) -> str:
    return os.path.join(RESULTS, slug, 'hot_ops.json')


def save_baseline(slug: str, rates: Dict[str, List[float]], capacity: int, target_s: float) -> None:
    os.makedirs(os.path.dirname(baseline_path(slug)), exist_ok=True)
    with open(baseline_path(slug), 'w') as f:
        json.dump(
            dict(
                cpu=cpu_label(),
                date_utc=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
                capacity=capacity,
                target_s=target_s,
                median={op: statistics.median(v) for op, v in rates.items()},
                rounds=rates,
            ),
            f,
            indent=1,
        )


def check(rounds: int, capacity: int, target_s: float) -> int:
    """Exit status of ``--check``: 0 when every hot operation runs at >= CHECK_FLOOR of this CPU's baseline."""
    slug = cpu_slug()
    path = baseline_path(slug)
    if not os.path.exists(path):
        print(
            f'[regenerate] no baseline for this CPU ({cpu_label()}): run `python benchmarks/regenerate.py` (or '
            f'--only some) here first; it writes {os.path.relpath(path, ROOT)}',
            file=sys.stderr,
        )
        return 2
    with open(path) as f:
        base = json.load(f)
    if base.get('capacity') != capacity:
        print(f"[regenerate] the baseline was timed at capacity {base.get('capacity')}; using it", file=sys.stderr)
        capacity = base.get('capacity', capacity)
    now = hot_ops(rounds, capacity, target_s)
    print(f"\nhot operations on {cpu_label()}: now (median of {rounds}) / baseline of {base['date_utc']}\n")
    print('| operation | baseline | now | now / baseline |')
    print('|---|---:|---:|---:|')
    slow = []
    for op, b in base['median'].items():
        if op not in now:
            continue
        n = statistics.median(now[op])
        ratio = n / b if b else float('inf')
        print(f'| {op} | {b:,.0f} | {n:,.0f} | {ratio:.3f} |')
        if ratio < CHECK_FLOOR:
            slow.append((op, ratio))
    for op, ratio in slow:
        print(f'[regenerate] {op}: {ratio:.3f} of the baseline (< {CHECK_FLOOR})', file=sys.stderr)
    return 1 if slow else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--only', default=None, help=f'comma-separated subset of {",".join(BENCHES)}')
    p.add_argument('--skip', default='', help='comma-separated benchmarks to leave out')
    p.add_argument('--quick', action='store_true', help="every script's smoke run; the docs are not changed")
    p.add_argument('--check', action='store_true', help="time the hot operations against this CPU's baseline")
    p.add_argument('--rounds', type=int, default=5, help='rounds of the hot operations (default 5)')
    p.add_argument('--capacity', type=int, default=100_000, help='buffer capacity of the hot operations')
    p.add_argument('--target-s', type=float, default=0.4, help='seconds per hot operation and round')
    p.add_argument(
        '--diengine-python',
        default=None,
        help='a python where DI-engine imports with its dependencies (see bench_per.py); '
        'without it the dingengine benchmark is skipped',
    )
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per benchmark (default 3600)')
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f'--rounds must be at least 1, got {args.rounds}')
    if args.check:
        return check(args.rounds, args.capacity, args.target_s)
    names = list(BENCHES) if args.only is None else [n.strip() for n in args.only.split(',') if n.strip()]
    skip = {n.strip() for n in args.skip.split(',') if n.strip()}
    unknown = [n for n in names + sorted(skip) if n not in BENCHES]
    if unknown:
        p.error(f'unknown benchmark(s) {unknown}; choose from {",".join(BENCHES)}')
    slug = cpu_slug()
    outdir = os.path.join(RESULTS, slug)
    os.makedirs(outdir, exist_ok=True)
    failed, done = [], []
    for name in names:
        if name in skip:
            continue
        wants = BENCHES[name][3]
        python = (
            args.diengine_python
            if wants == 'needs'
            else (args.diengine_python or sys.executable)
            if wants == 'prefers'
            else sys.executable
        )
        if python is None:
            print(f'[regenerate] {name}: skipped (needs --diengine-python)', file=sys.stderr)
            continue
        print(f'[regenerate] {name}: running {BENCHES[name][0]} ...', file=sys.stderr, flush=True)
        ok, out, wall = run(name, args.quick, python, args.timeout)
        print(f'[regenerate] {name}: {"done" if ok else "FAILED"} in {wall:.0f} s', file=sys.stderr, flush=True)
        if not ok:
            failed.append((name, out))
            continue
        with open(os.path.join(outdir, f'{name}.md'), 'w') as f:
            f.write(out)
        done.append((name, out, wall, python))
    if not args.quick and done:
        with open(DOCS) as f:
            docs = f.read()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
        for name, out, wall, python in done:
            new = splice(docs, name, slug, block_of(name, out, wall, stamp, python))
            if new is None:
                print(
                    f'[regenerate] {name}: docs/benchmarks.md has no {anchor(name)} anchor; report left in '
                    f'{os.path.relpath(os.path.join(outdir, name + ".md"), ROOT)}',
                    file=sys.stderr,
                )
                continue
            docs = new
        tmp = DOCS + '.tmp'
        with open(tmp, 'w') as f:
            f.write(docs)
        os.replace(tmp, DOCS)
        save_baseline(slug, hot_ops(args.rounds, args.capacity, args.target_s), args.capacity, args.target_s)
    for name, why in failed:
        print(f'[regenerate] {name} failed: {why}', file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

"""Regenerate every benchmark table of the README with one command.

Each benchmark below runs as its own subprocess (its markdown report goes to
``benchmarks/results/<name>.md``, its JSON next to it as the script writes it); the README section between
``<!-- bench:<name> -->`` and ``<!-- /bench:<name> -->`` is then replaced by that report (headings demoted
below the README's own, a first line saying when, on what and with which command it was made). A benchmark that
fails or is skipped leaves its README section as it was and is reported; the exit status is 1 if any failed.

    python benchmarks/regenerate.py                      # all of them (~30 min on 2 cores)
    python benchmarks/regenerate.py --only per,startup   # some
    python benchmarks/regenerate.py --quick              # smoke: every script's --quick (tables NOT spliced)
    python benchmarks/regenerate.py --diengine-python /tmp/dienv/bin/python   # DI-engine with its deps

| name | script | what | peers |
|---|---|---|---|
| per | bench_per.py | prioritized replay, 1e5 / 1e6, images, bytes per item | cpprb, TorchRL, DI-engine |
| naive | bench_naive.py | uniform replay, 1e5 / 1e6 | cpprb, TorchRL, DI-engine style |
| gfn | bench_gfn.py | ``gfn_diverse`` insert / sample / fill | torchgfn |
| gfn_ops | bench_gfn_ops.py | every GFlowNet buffer's push / sample with real containers, 1k / 10k | torchgfn |
| startup | bench_startup.py | import, first push / sample / update of a fresh process | (target) |
| dingengine | bench_dingengine.py | every DI-engine buffer type | DI-engine (needs its dependencies) |
| distributed | bench_distributed.py | the manager per backend | raw transport, torchgfn |

Benchmarks are noisy on a shared VM: run this on a quiet machine (nothing else running) and read ratios, which
come from peers interleaved in one process.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
README = os.path.join(ROOT, 'README.md')
RESULTS = os.path.join(HERE, 'results')

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
}


def marker(name: str) -> Tuple[str, str]:
    return f'<!-- bench:{name} -->', f'<!-- /bench:{name} -->'


def demote(markdown: str, top: int = 4) -> str:
    """Headings of a report shifted so its highest one is ``####``: one level below the README's sections."""
    levels = [len(h) for h in re.findall(r'^(#+) ', markdown, flags=re.M)]
    shift = top - min(levels) if levels else 0
    return re.sub(r'^(#+) ', lambda m: '#' * max(1, min(6, len(m.group(1)) + shift)) + ' ', markdown, flags=re.M)


def splice(readme: str, name: str, body: str) -> Optional[str]:
    """``readme`` with the section of ``name`` replaced by ``body``; None if its markers are missing."""
    begin, end = marker(name)
    i, j = readme.find(begin), readme.find(end)
    if i < 0 or j < i:
        return None
    return readme[: i + len(begin)] + '\n' + body.rstrip() + '\n' + readme[j:]


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--only', default=None, help=f'comma-separated subset of {",".join(BENCHES)}')
    p.add_argument('--skip', default='', help='comma-separated benchmarks to leave out')
    p.add_argument('--quick', action='store_true', help="every script's smoke run; the README is not changed")
    p.add_argument(
        '--diengine-python',
        default=None,
        help='a python where DI-engine imports with its dependencies (see bench_per.py); '
        'without it the dingengine benchmark is skipped',
    )
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per benchmark (default 3600)')
    args = p.parse_args(argv)
    names = list(BENCHES) if args.only is None else [n.strip() for n in args.only.split(',') if n.strip()]
    skip = {n.strip() for n in args.skip.split(',') if n.strip()}
    unknown = [n for n in names + sorted(skip) if n not in BENCHES]
    if unknown:
        p.error(f'unknown benchmark(s) {unknown}; choose from {",".join(BENCHES)}')
    os.makedirs(RESULTS, exist_ok=True)
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
        if python != sys.executable:
            out = f'(run with `{python}`, where DI-engine imports with its dependencies)\n\n' + out if ok else out
        print(f'[regenerate] {name}: {"done" if ok else "FAILED"} in {wall:.0f} s', file=sys.stderr, flush=True)
        if not ok:
            failed.append((name, out))
            continue
        with open(os.path.join(RESULTS, f'{name}.md'), 'w') as f:
            f.write(out)
        done.append((name, out, wall))
    if not args.quick and done:
        with open(README) as f:
            readme = f.read()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
        for name, out, wall in done:
            script = BENCHES[name][0]
            head = (
                f'*Regenerated {stamp} by `python benchmarks/regenerate.py --only {name}` '
                f'(`{script}`, {wall:.0f} s).*\n\n'
            )
            new = splice(readme, name, head + demote(out))
            if new is None:
                print(
                    f'[regenerate] {name}: README has no {marker(name)[0]} section; '
                    f'report left in benchmarks/results/{name}.md',
                    file=sys.stderr,
                )
                continue
            readme = new
        tmp = README + '.tmp'
        with open(tmp, 'w') as f:
            f.write(readme)
        os.replace(tmp, README)
    for name, why in failed:
        print(f'[regenerate] {name} failed: {why}', file=sys.stderr)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())

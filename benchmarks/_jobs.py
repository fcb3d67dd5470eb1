"""What the benchmarks that launch jobs of processes share (standard library only: a job imports it without
importing ding_buffer): progress lines, a free port, a process's result file, the environment of a child, and the
grid of cells (counts x contenders) with its skips and failures."""

import datetime
import json
import os
import platform
import socket
import sys
import time
from typing import Callable, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def log(msg: str) -> None:
    print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def save(d: str, who: str, rec: dict) -> None:
    """``rec`` as ``d/result.<who>.json``, written whole (a reader never sees half of it)."""
    with open(os.path.join(d, f'result.{who}.json.tmp'), 'w') as f:
        json.dump(rec, f)
    os.replace(os.path.join(d, f'result.{who}.json.tmp'), os.path.join(d, f'result.{who}.json'))


def child_env() -> dict:
    """This process's environment for a job's process: no torch.distributed rendezvous of its own, one OpenMP
    thread, this repository importable."""
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')}
    env.update(OMP_NUM_THREADS='1', PYTHONPATH=REPO + os.pathsep + env.get('PYTHONPATH', ''))
    return env


def save_report(path: str, cpu: str, cells: List[dict], skipped: Dict[str, str], **extra) -> dict:
    """Write the run (its machine, command, cells and skips) to ``path`` as JSON, print the header line the docs
    quote (CPU, cores, Python, date, command), and return the machine's entry."""
    env = dict(
        cpu=cpu,
        cores=os.cpu_count(),
        python=platform.python_version(),
        date=datetime.datetime.now().strftime('%Y-%m-%d %H:%M'),
        command=' '.join(['python', os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
        **extra,
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        json.dump({'env': env, 'cells': cells, 'skipped': skipped}, f, indent=1)
    print(f'{env["cpu"]}, {env["cores"]} cores, Python {env["python"]}, {env["date"]}; `{env["command"]}`\n')
    return env


def run_cells(
    counts: Sequence[int],
    names: Sequence[str],
    available: Callable[[str], str],
    cell: Callable[[str, int, float], dict],
    seconds: float,
    noun: str,
    summary: Callable[[dict], str],
) -> Tuple[List[dict], Dict[str, str]]:
    """Every ``cell(name, count, seconds)``, counts outermost; returns the cells and, by name (``name xN`` for one
    cell that failed), why each skipped one was skipped: ``available(name)`` said why, or the cell raised."""
    cells: List[dict] = []
    skipped: Dict[str, str] = {}
    for n in counts:
        for name in names:
            why = available(name)
            if why:
                skipped[name] = why
                continue
            log(f'{name} with {n} {noun}{"s" if n > 1 else ""}')
            try:
                c = cell(name, n, seconds)
            except Exception as e:  # noqa: BLE001 - one failing cell is reported, the rest run
                log(f'{name} with {n} {noun}s failed: {type(e).__name__}: {e}')
                skipped[f'{name} x{n}'] = f'{type(e).__name__}: {e}'
                continue
            log(f'  {summary(c)}')
            cells.append(c)
    return cells, skipped

"""Start-up costs of ``ding_buffer`` in a fresh process: import, the first push / sample / update, and when the
compiled kernels are ready.

What is measured
    Each round starts a new Python process that imports ``ding_buffer``, builds a prioritized buffer
    (``type='advanced'``, tensor storage, capacity 10,000), pushes one batch of 1,000 CartPole-like transitions,
    one single transition, then calls ``sample(256)`` and ``update`` with the sampled ids -- a learner's first
    iteration -- and reports wall-clock milliseconds of each call (``time.perf_counter``), whether numba and
    TensorBoard were imported by ``import ding_buffer``, how long after the first push the compiled kernels were
    ready (they load in a background thread; until then numpy fallbacks serve with the same results), and one
    more ``sample(256)`` once they are. The numba cache (``__pycache__`` next to the kernels) is warm: one
    untimed round runs first. Also a list-storage ``naive`` buffer (no kernels at all).

    Target (issue "hot paths"): the first ``sample`` of a process costs < 50 ms after the first run, and
    ``import ding_buffer`` imports neither numba nor TensorBoard.

Run
    python benchmarks/bench_startup.py [--rounds N] [--out PATH]

Output: a markdown table (medians over rounds) on stdout, every round's numbers in ``--out`` (JSON, default
``benchmarks/results/bench_startup.json``).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, 'results', 'bench_startup.json')
sys.path.insert(0, HERE)
from bench_naive import machine  # noqa: E402

CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import ding_buffer
t_import = time.perf_counter() - t0
import numpy as np
from ding_buffer import _numba, create_buffer
out = {'import_ms': 1e3 * t_import, 'numba_on_import': 'numba' in sys.modules,
       'tensorboard_on_import': any(m.startswith('tensorboard') for m in sys.modules)}
rng = np.random.default_rng(0)
batch = {'obs': rng.standard_normal((1000, 4), dtype=np.float32), 'action': rng.integers(0, 2, 1000),
         'reward': rng.standard_normal(1000, dtype=np.float32),
         'next_obs': rng.standard_normal((1000, 4), dtype=np.float32),
         'done': rng.random(1000) < 0.1}
item = {k: v[0] for k, v in batch.items()}
item['action'], item['done'] = int(item['action']), bool(item['done'])

def timed(key, f):
    t = time.perf_counter()
    r = f()
    out[key] = 1e3 * (time.perf_counter() - t)
    return r

buf = timed('build_ms', lambda: create_buffer(dict(type=sys.argv[1], replay_buffer_size=10_000, seed=0,
                                                    storage=dict(type=sys.argv[2]))))
if sys.argv[2] == 'tensor':
    timed('first_batch_push_ms', lambda: buf.extend(batch))
else:
    timed('first_batch_push_ms', lambda: buf.push([dict(item) for _ in range(1000)]))
t_push = time.perf_counter()
timed('first_push_ms', lambda: buf.push(dict(item)))
s = timed('first_sample_ms', lambda: buf.sample(256))
if sys.argv[1] == 'advanced':
    timed('first_update_ms', lambda: buf.update({'replay_unique_id': s['replay_unique_id'],
                                                  'replay_buffer_idx': s['replay_buffer_idx'],
                                                  'priority': np.ones(256, np.float32)}))
out['kernels_ready_at_first_sample'] = _numba._READY.is_set()  # (ready() would start a load)
loading = _numba._thread is not None
deadline = time.monotonic() + 120
while loading and not _numba._READY.is_set() and time.monotonic() < deadline:
    time.sleep(0.005)
out['kernels_ready_after_ms'] = 1e3 * (time.perf_counter() - t_push) if loading else None
timed('sample_when_ready_ms', lambda: buf.sample(256))
timed('second_sample_ms', lambda: buf.sample(256))
print('RESULT ' + json.dumps(out))
'''

CASES = [('advanced', 'tensor'), ('naive', 'list')]
COLUMNS = [
    ('import_ms', 'import ding_buffer'),
    ('build_ms', 'create_buffer'),
    ('first_batch_push_ms', 'first push of 1,000 (batch / list)'),
    ('first_push_ms', 'first single push'),
    ('first_sample_ms', 'first sample(256)'),
    ('first_update_ms', 'first update(256)'),
    ('kernels_ready_after_ms', 'kernels loaded (background), after the first push'),
    ('sample_when_ready_ms', 'sample(256) once ready'),
    ('second_sample_ms', 'a later sample(256)'),
]
TARGET_MS = 50.0


def run_child(kind: str, storage: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'))
    proc = subprocess.run(
        [sys.executable, '-c', CHILD, kind, storage], capture_output=True, text=True, timeout=300, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f'child failed ({kind}, {storage}):\n{proc.stderr[-3000:]}')
    line = next(x for x in proc.stdout.splitlines() if x.startswith('RESULT '))
    return json.loads(line[len('RESULT ') :])


def median(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=5, help='fresh processes per buffer kind (default 5)')
    p.add_argument('--out', default=DEFAULT_OUT, help=f'JSON output (default {DEFAULT_OUT})')
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error('--rounds must be >= 1')
    t0 = time.perf_counter()
    for kind, storage in CASES:
        run_child(kind, storage)  # fills numba's cache if this checkout never ran the kernels
    rows = {f'{k}/{s}': [run_child(k, s) for _ in range(args.rounds)] for k, s in CASES}
    print(f'## Start-up in a fresh process (`python benchmarks/bench_startup.py --rounds {args.rounds}`)\n')
    m = machine(['numpy', 'torch', 'numba'])
    print(
        f'{m["date_utc"]}, {m["cpu"]}, {m["cores"]} cores, '
        f'{", ".join(f"{k} {v}" for k, v in m["versions"].items())}; medians of {args.rounds} fresh '
        f'processes each (milliseconds; numba cache warm).\n'
    )
    print('| step (ms) | ' + ' | '.join(f'`{c}`' for c in rows) + ' |')
    print('|---|' + '---:|' * len(rows))
    for key, label in COLUMNS:
        cells = []
        for c, rs in rows.items():
            m = median(rs, key)
            cells.append('n/a' if m is None else f'{m:.1f}')
        print(f'| {label} | ' + ' | '.join(cells) + ' |')
    adv = rows['advanced/tensor']
    first = median(adv, 'first_sample_ms')
    light = not any(r['numba_on_import'] or r['tensorboard_on_import'] for rs in rows.values() for r in rs)
    print('\n| target | measured | result |\n|---|---:|---|')
    print(
        f'| first `sample` of a process < {TARGET_MS:.0f} ms (advanced, tensor) | {first:.1f} ms | '
        f'{"met" if first < TARGET_MS else "missed"} |'
    )
    print(
        f'| `import ding_buffer` imports neither numba nor TensorBoard | '
        f'{"neither" if light else "imported"} | {"met" if light else "missed"} |'
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump({'rows': rows, 'wall_s': time.perf_counter() - t0}, f, indent=1)


if __name__ == '__main__':
    main()

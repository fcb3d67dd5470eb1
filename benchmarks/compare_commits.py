"""Before / after: the hot operations of ``bench_per.py`` and ``bench_naive.py`` on two commits, in one run.

What is measured
    The operations of the two benchmarks on ``ding_buffer`` itself (no peers), CartPole-like transitions
    (obs f32[4], action i64, reward f32, next_obs f32[4], done bool), buffers filled to capacity first:

    * ``advanced`` (tensor storage, alpha 0.6, beta 0.4): push of a batch of 64, single push (numpy obs, Python
      scalars, as a gym loop makes them), prioritized sample of 256, update of 256 priorities, and a DQN loop
      iteration (4 single pushes + sample 256 + update 256);
    * ``naive`` (tensor and list storage): single push, push of a batch of 64 (``extend`` on tensor storage, a
      list of 64 dicts on list storage), uniform sample of 256 without replacement.

How
    Each commit is checked out into a temporary directory (``git archive``); every measurement runs in a child
    process that imports the package from that directory only (checked). Rounds alternate the commits
    (base, head, base, head, ...) so that drift of the machine hits both alike; each round times every
    operation for ``--target-s`` seconds with the garbage collector paused. The table reports the median rate
    over rounds and the ratio head / base (> 1: head is faster). Nothing is asserted.

Run
    python benchmarks/compare_commits.py --base 70d9a36 --head HEAD [--capacity 100000] [--rounds 5]
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

OPS = (
    'advanced push 64',
    'advanced single push',
    'advanced sample 256',
    'advanced update 256',
    'advanced DQN loop',
    'naive/tensor single push',
    'naive/tensor extend 64',
    'naive/tensor sample 256',
    'naive/list single push',
    'naive/list push 64',
    'naive/list sample 256',
)


# ---------------------------------------------------------------------------------------------- child
def _rate(fn, items: int, target_s: float, min_calls: int) -> float:
    fn()  # warm-up (compiles numba kernels on a fresh checkout)
    gc.disable()
    try:
        calls, t0 = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - t0
            if calls >= min_calls and elapsed >= target_s:
                return calls * items / elapsed
    finally:
        gc.enable()


def child(src: str, capacity: int, target_s: float) -> dict:
    sys.path.insert(0, src)
    import numpy as np
    import torch

    import ding_buffer
    from ding_buffer import create_buffer

    assert os.path.realpath(ding_buffer.__file__).startswith(os.path.realpath(src)), ding_buffer.__file__
    try:  # steady state: the compiled kernels are loaded (they load in the background since the hot-paths work)
        from ding_buffer import _numba

        _numba.load()
    except (ImportError, AttributeError):  # a commit from before lazy loading: they load on first use
        pass
    rng = np.random.default_rng(0)
    pool = 4096
    obs = rng.standard_normal((pool, 4)).astype(np.float32)
    nxt = rng.standard_normal((pool, 4)).astype(np.float32)
    singles = [
        dict(obs=obs[i], action=int(i % 2), reward=1.0, next_obs=nxt[i], done=bool(i % 50 == 0)) for i in range(pool)
    ]
    batch = {
        'obs': torch.from_numpy(obs[:64]),
        'action': torch.zeros(64, dtype=torch.int64),
        'reward': torch.ones(64),
        'next_obs': torch.from_numpy(nxt[:64]),
        'done': torch.zeros(64, dtype=torch.bool),
    }
    out, k = {}, [0]

    def one(buf):
        def push():
            k[0] = (k[0] + 1) % pool
            buf.push(singles[k[0]])

        return push

    def fill(buf, tensor: bool) -> None:
        for start in range(0, capacity, 1024):
            n = min(1024, capacity - start)
            idx = np.arange(start, start + n) % pool
            if tensor:
                buf.extend(
                    {
                        'obs': torch.from_numpy(obs[idx]),
                        'action': torch.zeros(n, dtype=torch.int64),
                        'reward': torch.ones(n),
                        'next_obs': torch.from_numpy(nxt[idx]),
                        'done': torch.zeros(n, dtype=torch.bool),
                    }
                )
            else:
                buf.push([singles[i] for i in idx])

    per = create_buffer(
        dict(type='advanced', replay_buffer_size=capacity, alpha=0.6, beta=0.4, seed=0, storage=dict(type='tensor'))
    )
    fill(per, True)
    prios = torch.rand(256)
    drawn = [per.sample(256) for _ in range(32)]
    upd = [
        {'replay_unique_id': b['replay_unique_id'], 'replay_buffer_idx': b['replay_buffer_idx'], 'priority': prios}
        for b in drawn
    ]
    j = [0]

    def update():
        j[0] = (j[0] + 1) % 32
        per.update(upd[j[0]])

    push1 = one(per)

    def dqn():
        for _ in range(4):
            push1()
        b = per.sample(256)
        per.update(
            {'replay_unique_id': b['replay_unique_id'], 'replay_buffer_idx': b['replay_buffer_idx'], 'priority': prios}
        )

    out['advanced sample 256'] = _rate(lambda: per.sample(256), 256, target_s, 5)
    out['advanced update 256'] = _rate(update, 256, target_s, 5)
    out['advanced DQN loop'] = _rate(dqn, 1, target_s, 5)
    out['advanced push 64'] = _rate(lambda: per.extend(batch), 64, target_s, 5)
    out['advanced single push'] = _rate(push1, 1, target_s, 2000)
    per.close()
    for kind in ('tensor', 'list'):
        buf = create_buffer(dict(type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type=kind)))
        fill(buf, kind == 'tensor')
        out[f'naive/{kind} sample 256'] = _rate(lambda: buf.sample(256), 256, target_s, 5)
        if kind == 'tensor':
            out['naive/tensor extend 64'] = _rate(lambda: buf.extend(batch), 64, target_s, 5)
        else:
            chunk = singles[:64]
            out['naive/list push 64'] = _rate(lambda: buf.push(chunk), 64, target_s, 5)
        out[f'naive/{kind} single push'] = _rate(one(buf), 1, target_s, 2000)
        buf.close()
    return out


# ---------------------------------------------------------------------------------------------- parent
def checkout(rev: str, root: str) -> tuple:
    sha = subprocess.check_output(['git', 'rev-parse', '--short', rev], text=True).strip()
    dest = os.path.join(root, sha)
    os.makedirs(dest)
    archive = subprocess.run(['git', 'archive', sha, 'ding_buffer'], check=True, capture_output=True).stdout
    subprocess.run(['tar', '-x', '-C', dest], input=archive, check=True)
    return sha, dest


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--base', help='the commit before the change (required)')
    p.add_argument('--head', default='HEAD', help='the commit after it (default HEAD)')
    p.add_argument('--capacity', type=int, default=100_000)
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--target-s', type=float, default=0.4)
    p.add_argument('--child', nargs=3, metavar=('SRC', 'CAPACITY', 'TARGET_S'), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), float(args.child[2]))))
        return
    if not args.base:
        p.error('--base is required')
    root = tempfile.mkdtemp(prefix='ding_buffer_compare_')
    try:
        commits = [checkout(args.base, root), checkout(args.head, root)]
        rates = {sha: {op: [] for op in OPS} for sha, _ in commits}
        for r in range(args.rounds):
            for sha, src in commits if r % 2 == 0 else commits[::-1]:
                res = subprocess.run(
                    [sys.executable, __file__, '--child', src, str(args.capacity), str(args.target_s)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, 'PYTHONPATH': ''},
                )
                if res.returncode:
                    raise SystemExit(f'{sha} failed:\n{res.stderr[-3000:]}')
                for op, v in json.loads(res.stdout.strip().splitlines()[-1]).items():
                    rates[sha][op].append(v)
                print(f'round {r + 1}/{args.rounds}: {sha} done', file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    (base, _), (head, _) = commits
    print(f'\ncapacity {args.capacity:,}, {args.rounds} rounds (alternating), median rates; base {base}, head {head}\n')
    print(f'| operation | unit | {base} (base) | {head} (head) | head / base |')
    print('|---|---|---:|---:|---:|')
    for op in OPS:
        b, h = statistics.median(rates[base][op]), statistics.median(rates[head][op])
        unit = 'loops/s' if 'loop' in op else 'items/s'
        print(f'| {op} | {unit} | {b:,.0f} | {h:,.0f} | {h / b:.3f} |')


if __name__ == '__main__':
    main()

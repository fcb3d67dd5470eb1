"""``ding-buffer demo``: the tour covers every registered buffer type, the numbers it prints back its claims, and it
writes nothing outside ``--out``."""

import os
import re
import subprocess
import sys
import time

import pytest

from ding_buffer import BUFFER_REGISTRY
from ding_buffer.demo import DEMOS
from ding_buffer.demo_gfn import check

FILES = ['episode_tensor.pt', 'naive_list.pt', 'naive_tensor.pt']


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('demo')
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', 'ding_buffer', 'demo', '--out', str(cwd / 'out')],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    print(f"ding-buffer demo wall time (subprocess, interpreter start included): {time.monotonic() - t0:.2f}s")
    return proc, cwd


def lines_of(out, name):
    return [line for line in out.splitlines() if line.startswith(f'[{name}]') or line.startswith(f'[{name}/')]


def numbers(pattern, text):
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not found in:\n{text}"
    return [float(x) for x in m.groups()]


@pytest.mark.slow
def test_demo_exits_0_and_writes_only_to_out(demo_run):
    proc, cwd = demo_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'demo failed' not in proc.stdout + proc.stderr
    assert 'WARNING ding_buffer' not in proc.stderr, proc.stderr  # buffers' warnings do not clutter the tour
    assert sorted(os.listdir(cwd)) == ['out']
    assert sorted(os.listdir(cwd / 'out')) == FILES


@pytest.mark.slow
def test_every_registered_type_is_toured(demo_run):
    out = demo_run[0].stdout
    # the built-in types (other tests in the same process may register their own)
    expected = sorted(
        {n for n, cls in BUFFER_REGISTRY.items() if cls.__module__.startswith('ding_buffer.')} - {'distributed'}
    )
    assert {name for name, _ in DEMOS} >= set(expected)
    for name in expected:
        assert 1 <= len(lines_of(out, name)) <= 12, (name, out)  # naive: two storages, 5-6 lines each
    last = out.strip().splitlines()[-1]
    assert '(every registered type)' in last and "'distributed'" in last


@pytest.mark.slow
def test_naive_and_episode_round_trips(demo_run):
    out = demo_run[0].stdout
    assert out.count("next sample identical to the original's: True") == 2
    assert 'each window within one episode: True' in out
    assert 'episode lengths equal: True' in out


@pytest.mark.slow
def test_advanced_draws_follow_priorities_and_max_use_evicts(demo_run):
    text = '\n'.join(lines_of(demo_run[0].stdout, 'advanced'))
    share, expected, uniform = numbers(
        r'of them .*? ([\d.]+)% of the time \(expected .*?= ([\d.]+)%; uniform ([\d.]+)%', text
    )
    assert abs(share - expected) < 2.0 and expected > 2 * uniform
    lo, hi, is_hot = numbers(r'IS weights in \[([\d.]+), ([\d.]+)\] \(expected .*?: ([\d.]+) for priority', text)
    assert abs(lo - is_hot) < 1e-3 and abs(hi - 1.0) < 1e-3
    spent, removed, before, after = numbers(
        r'(\d+) of them twice or more -> removed_by_use=(\d+), count (\d+) -> (\d+)', text
    )
    assert spent == removed > 0 and after == before - removed


@pytest.mark.slow
def test_window_and_fifo_buffers(demo_run):
    out = demo_run[0].stdout
    elastic = '\n'.join(lines_of(out, 'elastic'))
    windows = re.findall(r'window (\d+), sampled steps >= (\d+)', elastic)
    assert [int(w) for w, _ in windows] == [100, 500]
    assert all(int(m) >= 1000 - int(w) for w, m in windows)
    assert 'every run 10 consecutive steps: True' in '\n'.join(lines_of(out, 'sequence'))
    deque = '\n'.join(lines_of(out, 'deque'))
    lo, hi = numbers(r'steps (\d+)\.\.(\d+) drawn', deque)
    assert 50 <= lo <= hi < 150
    assert numbers(r'max_use=1: count (\d+) -> (\d+)', deque) == [100, 68]
    pe = '\n'.join(lines_of(out, 'prioritized_episode'))
    share, expected, by_transitions = numbers(
        r'episodes 0-1 ([\d.]+)% \(expected ([\d.]+)%, by transitions ([\d.]+)%', pe
    )
    assert abs(share - expected) < 2.0 and expected > 2 * by_transitions


@pytest.mark.slow
def test_gflownet_buffers(demo_run):
    out = demo_run[0].stdout
    gfn = '\n'.join(lines_of(out, 'gfn'))
    (count,) = numbers(r'capacity 100: count=(\d+)', gfn)
    before, after = numbers(r'min kept log-reward (-?[\d.]+) when first full -> (-?[\d.]+)', gfn)
    assert count == 100 and after > before
    top, share, uniform = numbers(
        r'best item drawn ([\d.]+)% \(softmax\(log_reward\) share ([\d.]+)%, uniform ([\d.]+)%', gfn
    )
    assert abs(top - share) < 1.0 and share > 2 * uniform
    mean, expected, uniform_mean = numbers(
        r'mean sampled log-reward (-?[\d.]+) \(expected (-?[\d.]+), uniform (-?[\d.]+)\)', gfn
    )
    assert abs(mean - expected) < 0.05 and expected > uniform_mean
    diverse = '\n'.join(lines_of(out, 'gfn_diverse'))
    assert numbers(
        r'rejected_by_distance=(\d+), rejected_by_reward=(\d+), admitted=(\d+) \(cutoff_distance=([\d.]+)\)', diverse
    ) == [10, 10, 10, 0.5]
    with_filter, plain = numbers(
        r'closest pair of kept states \(L1\): ([\d.]+) with the filter, ([\d.]+) in plain', diverse
    )
    assert with_filter > 0.5 >= plain
    ts = '\n'.join(lines_of(out, 'terminating_state'))
    assert "stored fields ['log_reward', 'state']" in ts and 'pairs kept intact: True' in ts


def test_a_false_claim_stops_the_demo():
    with pytest.raises(SystemExit, match='demo failed: the claim'):
        check(False, 'the claim')
    check(True, 'holds')

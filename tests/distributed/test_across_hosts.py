"""The manager and its workers on separate hosts: network namespaces joined by a bridge (``netns_hosts``), each
rank on a host of its own, talking over torch.distributed (gloo over TCP, env:// rendezvous at the first host's
address) -- not loopback. Faults are the network's: a worker host cut off for longer and for shorter than
``distributed.peer_timeout`` and then healed, a host that dies without a word (its link cut, then its processes
killed), links rate-limited with ``tc tbf``. Expected: every call returns or raises within its timeout, pushes
land exactly once (rows counted by content), a healed worker goes on, a dead host is counted lost.

Needs root (namespaces): skipped with the reason elsewhere. Every namespace and process is removed afterwards.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from dist_helpers import BACKENDS, Launch
from helpers import need_mpi
from netns_hosts import IP, Hosts, available, has_netem, leftovers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WHY = available()
ADV_TAGS = lambda rank, steps: sorted(rank * 10000 + s * 100 + i for s in steps for i in range(4))  # noqa: E731


@pytest.fixture
def hosts():
    if WHY:
        pytest.skip(WHY)
    with Hosts(3) as h:
        yield h
    assert h.prefix not in ' '.join(leftovers(h.prefix)), leftovers(h.prefix)
    assert not [h.scratch(i) for i in range(3) if os.path.exists(h.scratch(i))]  # the hosts' own temporary folders


@pytest.mark.parametrize('backend', BACKENDS)
def test_roundtrip_across_hosts_with_rate_limited_links(hosts, tmp_path, backend):
    """Two worker hosts on 1 Gbit/s links (tc tbf) and the manager's host: pushes, samples, priority updates,
    stats, a checkpoint and file requests behave as on one host (MPI: Open MPI's TCP transport between hosts)."""
    if backend == 'mpi':
        need_mpi()
    hosts.shape(0, '1gbit')
    hosts.shape(1, '1gbit')
    run = Launch('roundtrip', backend, tmp_path, hosts=hosts, timeout=120).wait()
    run.require_ok()
    man = run.rank(2)
    want = ADV_TAGS(0, range(5)) + ADV_TAGS(1, range(5)) + ADV_TAGS(0, [60])[:3]  # (and the small push after)
    assert man['obs_ok'] and sorted(man['tags']) == sorted(want), man
    for r in (0, 1):
        w = run.rank(r)
        assert w['update'] == {'updated': 4, 'stale': 0} and w['sample_obs_ok'], w


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('scenario', ['partition_worker', 'partition_short', 'partition_manager'])
def test_a_partitioned_worker_host_goes_on_after_healing_and_its_pushes_land_once(hosts, tmp_path, scenario, backend):
    """Rank 0's host is cut off while it pushes (6 s: longer than peer_timeout, 3 s; or 1.5 s: shorter), or the
    manager's host for 6 s, then healed. Rank 0's calls during the cut raise ManagerUnavailableError within
    distributed.timeout (10 s) and are retried; every row it pushed is stored exactly once; after the heal every
    call succeeds; the other worker is served throughout. A long cut counts the silent workers lost, then
    rejoined (the manager, hearing nobody, waits lost_grace for them instead of ending); a short one loses nobody."""
    if backend == 'mpi':
        need_mpi()
    run = Launch(scenario, backend, tmp_path, hosts=hosts, timeout=150).wait()
    run.require_ok()
    man, w0, w1 = run.rank(2), run.rank(0), run.rank(1)
    s = man['summary']
    assert s['exited'] == ['0', '1'] and s['lost'] == {}, s
    if scenario == 'partition_worker':
        assert s['rejoined'] == {'0': 1}, s
    elif scenario == 'partition_manager':  # the manager heard nobody for 6 s: both lost, both back
        assert s['rejoined'] == {'0': 1, '1': 1}, s
    else:
        assert not s.get('rejoined'), s
    assert sorted(t for t in man['tags'] if t < 10000) == ADV_TAGS(0, range(w0['steps']))  # each row once
    assert len([t for t in man['tags'] if t >= 10000]) % 4 == 0 and any(t >= 10000 for t in man['tags'])
    calls = w0['calls']
    assert max(c['seconds'] for c in calls) < 2 * 10.0, calls  # bounded by distributed.timeout (10 s), wide slack
    after = [c for c in calls if c['start'] > w1['healed_at'] + 0.05]
    assert after and all(c['ok'] for c in after[1:]), after  # healed: every call succeeds (the first may be in doubt)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_lossy_worker_link_loses_and_duplicates_nothing(hosts, tmp_path, backend):
    """Rank 0's link drops 5% of its packets and delays the rest (tc netem, where the kernel has it): its
    pushes (retried where a call times out) are stored exactly once, and nobody is counted lost."""
    if not has_netem():
        pytest.skip('the kernel has no tc netem qdisc (sch_netem): latency and loss cannot be added here')
    if backend == 'mpi':
        need_mpi()
    hosts.netem(0, 'delay', '2ms', 'loss', '5%')
    run = Launch('lossy_worker', backend, tmp_path, hosts=hosts, timeout=150).wait()
    run.require_ok()
    man, w0 = run.rank(2), run.rank(0)
    assert man['summary']['lost'] == {} and man['summary']['exited'] == ['0', '1'], man['summary']
    assert sorted(t for t in man['tags'] if t < 10000) == ADV_TAGS(0, range(w0['steps']))  # each row once


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_host_that_dies_silently_is_counted_lost_and_the_others_are_served(hosts, tmp_path, backend):
    """Rank 0's host dies without a word (its link cut, then every process on it killed: no FIN reaches the
    manager): the manager counts it lost after peer_timeout, serves rank 1 to the end and exits."""
    if backend == 'mpi':
        need_mpi()
    run = Launch('kill_worker_host', backend, tmp_path, hosts=hosts, timeout=120, survive_deaths=True)
    deadline = time.monotonic() + 60
    while not (run.out / 'w0_started').exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run.out / 'w0_started').exists(), run.wait().logs()
    hosts.link(0, up=False)
    hosts.kill(0)
    (run.out / 'host0_dead').touch()
    deadline = time.monotonic() + 90
    while not all((run.out / f'rank{r}.json').exists() for r in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    hosts.link(0, up=True)  # the host comes back, empty (rebooted)
    if backend == 'mpi':
        # every rank left is done; Open MPI's mpirun (4.1) does not end by itself once a host's daemon vanished
        # without a word (a cluster's scheduler ends such a job): end it here, as the scheduler would
        time.sleep(1.0)
        for _, p, _ in run.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
    run.wait()
    run.require_ok(ranks=(1, 2), rc=False)
    s = run.rank(2)['summary']
    assert list(s['lost']) == ['0'] and s['exited'] == ['1'], s
    w1 = run.rank(1)
    # served all along: no push failed (one that waited distributed.timeout, 10 s, would have raised)
    assert w1['pushes_after_death'] > 0 and max(w1['seconds_per_call']) < 2 * 10.0, w1


def _ray_start(hosts, i, temp_dir, env):
    """A Ray node on host ``i`` (the head on host 0) with the custom resource ``host<i>``."""
    import json
    import subprocess

    ray = os.path.join(os.path.dirname(sys.executable), 'ray')
    args = [ray, 'start', '--node-ip-address', hosts.addr(i), '--num-cpus', '2', '--disable-usage-stats']
    args += ['--resources', json.dumps({f'host{i}': 1})]
    if i == 0:
        args += ['--head', '--port', '6379', '--temp-dir', temp_dir, '--include-dashboard=false']
    else:
        args += ['--address', f'{hosts.addr(0)}:6379']
    r = subprocess.run([IP, 'netns', 'exec', hosts.ns(i)] + args, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, f'ray start on host {i} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}'


def _ray_job(hosts, tmp_path, scenario, fault):
    """A three-node Ray cluster (a node per host) and the driver ``ray_hosts_main.py`` on host 0; ``fault()`` runs
    once the driver says its worker task is pushing. Returns the driver's report."""
    pytest.importorskip('ray')
    from helpers import pythonpath

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=pythonpath(here), RAY_AUTH_MODE='disabled', OMP_NUM_THREADS='1')
    temp_dir = f'/tmp/{hosts.prefix}ray'  # (short: Ray's socket paths live under it)
    try:
        for i in range(3):
            _ray_start(hosts, i, temp_dir, env)
        script = os.path.join(here, 'dist_scripts', 'ray_hosts_main.py')
        cmd = [sys.executable, script, str(tmp_path), f'{hosts.addr(0)}:6379', scenario]
        with open(tmp_path / 'driver.log', 'wb') as log:
            driver = hosts.popen(0, cmd, env, stdout=log, stderr=log)
        deadline = time.monotonic() + 120
        while not (tmp_path / 'pushing').exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / 'pushing').exists(), (tmp_path / 'driver.log').read_text()[-4000:]
        fault()
        driver.wait(timeout=150)
        out = json.loads((tmp_path / 'driver.json').read_text())
        assert out.get('ok'), out.get('traceback') or (tmp_path / 'driver.log').read_text()[-4000:]
        return out
    finally:
        for i in range(3):
            hosts.kill(i)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_across_hosts_serves_workers_and_counts_a_dead_host_lost(hosts, tmp_path):
    """A real three-node Ray cluster, a node per host: the manager actor on host 0, worker tasks on hosts 1 and 2
    push, sample and update across the links; host 2 then dies silently while its task pushes (link cut, every
    process killed): the manager counts that worker lost within a few peer_timeouts (3 s) while serving the
    driver; once the other workers close, it checkpoints (every row stored once) and ends."""

    def kill_host_2():
        hosts.link(2, up=False)
        hosts.kill(2)
        (tmp_path / 'host2_dead').touch()

    out = _ray_job(hosts, tmp_path, 'dead_host', kill_host_2)
    assert out['nodes'] == sorted(hosts.addr(i) for i in range(3)) and out['actor_node'] == hosts.addr(0), out
    assert out['roundtrip'] == [{'stored': [4, 4, 4], 'update': {'updated': 4, 'stale': 0}}] * 2, out
    assert out['count_after_roundtrip'] == 24
    assert len(out['lost']) == 1 and out['lost_after_seconds'] < 4 * 3.0, out
    assert max(out['driver_call_seconds'] or [0]) < 20.0, out  # the driver is served while the host is gone
    assert out['checkpoint'], out
    rows = out['checkpoint_rows']
    assert len(rows) == len(set(map(tuple, rows))), 'a row stored twice'
    by_worker = {}
    for wid, step, j in rows:
        by_worker.setdefault(int(wid), []).append((int(step), int(j)))
    assert sorted(by_worker[1]) == sorted(by_worker[2]) == [(s, j) for s in range(3) for j in range(4)]
    assert sorted(by_worker[8]) == [(s, j) for s in range(2) for j in range(3)]
    assert sorted(by_worker[7]) == [(s, 0) for s in range(len(by_worker[7]))]  # the dead host's: a prefix, once


def test_ray_worker_host_partitioned_then_healed_stores_every_row_once(hosts, tmp_path):
    """The Ray node of a pushing worker task is cut off for 6 s (longer than peer_timeout, 3 s), then healed: the
    task pushes through it (a call that fails is retried with the same data), every row is stored exactly once,
    and the manager serves it again after the heal."""

    def cut_host_1():
        hosts.link(1, up=False)
        time.sleep(6.0)
        hosts.link(1, up=True)
        (tmp_path / 'healed').touch()

    out = _ray_job(hosts, tmp_path, 'partition', cut_host_1)
    task, summary = out['task'], out['summary']
    assert list(summary['rejoined'].values()) == [1] and summary['lost'] == {}, summary  # lost in the cut, back after
    assert task['steps'] >= 250 and task['longest_call'] < 20.0 + 1.0, task  # within distributed.timeout
    rows = [r for r in out['rows'] if int(r[0]) == 9]
    assert sorted((int(s), int(j)) for _, s, j in rows) == [(s, 0) for s in range(task['steps'])], (
        'a row lost or stored twice'
    )


def test_apex_job_learns_across_hosts(hosts, tmp_path):
    """`ding-buffer train config/cartpole_apex.py` with its three torch ranks on three hosts (env:// at the first
    host's address, 1 Gbit/s links): the learner learns as on one host (a greedy return far above a random
    policy's), with checkpoints, evaluations and the buffer's priority updates."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'train'))
    from test_train_apex import _config, check_learned
    from train_helpers import ENV, cli_cmd

    for i in range(3):
        hosts.shape(i, '1gbit')
    cfg = _config(tmp_path, 'torch', 'apex.py')
    procs = []
    for r in range(3):
        env = dict(ENV, RANK=str(r), LOCAL_RANK='0', WORLD_SIZE='3', LOCAL_WORLD_SIZE='1', MASTER_ADDR=hosts.addr(0),
                   MASTER_PORT='29500', GLOO_SOCKET_IFNAME=hosts.device)  # fmt: skip
        with open(tmp_path / f'rank{r}.log', 'wb') as log:
            cmd = cli_cmd('train', cfg, '--no-progress', '--env-steps', '4500')
            procs.append(hosts.popen(r, cmd, env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path)))
    deadline = time.monotonic() + 240
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            pass
    logs = '\n'.join((tmp_path / f'rank{r}.log').read_text(errors='replace')[-2000:] for r in range(3))
    assert [p.returncode for p in procs] == [0, 0, 0], logs
    check_learned(tmp_path / 'runs' / 'cartpole_apex_seed0', 'torch')


@pytest.mark.parametrize(
    'options, ok',
    [
        (dict(resources={'replay': 0.01}, num_cpus=0), True),
        (dict(memory=1 << 30, num_gpus=1), True),
        (dict(resources={'replay': -1}), False),
        (dict(placement_group='x'), False),
        (dict(memory=1.5), False),
        ('replay', False),
    ],
)
def test_ray_actor_options_are_checked_by_name(options, ok):
    from ding_buffer.distributed.config import build_distributed_config

    if ok:
        assert build_distributed_config(dict(backend='ray', ray_actor_options=options)).ray_actor_options == options
    else:
        with pytest.raises(ValueError, match="distributed.ray_actor_options"):
            build_distributed_config(dict(backend='ray', ray_actor_options=options))


if __name__ == '__main__':  # (a manual run: python tests/distributed/test_across_hosts.py)
    sys.exit(pytest.main([__file__, '-v', '-p', 'no:cacheprovider', '-n', '0']))

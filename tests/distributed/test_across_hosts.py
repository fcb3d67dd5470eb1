"""The manager and its workers on separate hosts: network namespaces joined by a bridge (``netns_hosts``), each
rank on a host of its own, talking over torch.distributed (gloo over TCP, env:// rendezvous at the first host's
address) -- not loopback. Faults are the network's: a worker host cut off for longer and for shorter than
``distributed.peer_timeout`` and then healed, a host that dies without a word (its link cut, then its processes
killed), links rate-limited with ``tc tbf``. Expected: every call returns or raises within its timeout, pushes
land exactly once (rows counted by content), a healed worker goes on, a dead host is counted lost.

Needs root (namespaces): skipped with the reason elsewhere. Every namespace and process is removed afterwards.
"""

import os
import signal
import sys
import time

import pytest
from dist_helpers import BACKENDS, Launch
from helpers import need_mpi
from netns_hosts import Hosts, available, leftovers

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
@pytest.mark.parametrize('scenario', ['partition_worker', 'partition_short'])
def test_a_partitioned_worker_host_goes_on_after_healing_and_its_pushes_land_once(hosts, tmp_path, scenario, backend):
    """Rank 0's host is cut off while it pushes (6 s: longer than peer_timeout, 3 s; or 1.5 s: shorter), then
    healed. Its calls during the cut raise ManagerUnavailableError within distributed.timeout (10 s), and are
    retried; every row it pushed is stored exactly once; after the heal every call succeeds; the other worker is
    served throughout. The long cut counts the worker lost, then rejoined; the short one loses nobody."""
    if backend == 'mpi':
        need_mpi()
    run = Launch(scenario, backend, tmp_path, hosts=hosts, timeout=150).wait()
    run.require_ok()
    man, w0, w1 = run.rank(2), run.rank(0), run.rank(1)
    s = man['summary']
    assert s['exited'] == ['0', '1'] and s['lost'] == {}, s
    if scenario == 'partition_worker':
        assert s['rejoined'] == {'0': 1}, s
    else:
        assert not s.get('rejoined'), s
    assert sorted(t for t in man['tags'] if t < 10000) == ADV_TAGS(0, range(w0['steps']))  # each row once
    assert len([t for t in man['tags'] if t >= 10000]) % 4 == 0 and any(t >= 10000 for t in man['tags'])
    calls = w0['calls']
    assert max(c['seconds'] for c in calls) < 10.0 + 1.0, calls  # nothing waits past distributed.timeout
    after = [c for c in calls if c['start'] > w1['healed_at'] + 0.05]
    assert after and all(c['ok'] for c in after[1:]), after  # healed: every call succeeds (the first may be in doubt)


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
    assert w1['pushes_after_death'] > 0 and max(w1['seconds_per_call']) < 10.0, w1


if __name__ == '__main__':  # (a manual run: python tests/distributed/test_across_hosts.py)
    sys.exit(pytest.main([__file__, '-v', '-p', 'no:cacheprovider', '-n', '0']))

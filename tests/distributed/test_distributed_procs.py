"""Real multi-process tests of the distributed buffer (torch.distributed gloo and MPI backends).

Each scenario launches three ranks of ``tests/distributed/dist_scripts/rank_main.py`` (ranks 0 and 1 are workers,
rank 2 the manager); every rank writes a JSON report that the tests below read. Normal scenarios run under
``torchrun`` / ``mpirun``; the kill scenarios start the torch ranks as plain env:// processes and use ``mpirun
--enable-recovery`` for MPI (``dist_helpers.Launch``). The torch and MPI launches of one scenario run
concurrently to keep the module's wall time down. Attacks and faults are in ``test_distributed_faults.py``.
"""

import os

import pytest
from dist_helpers import BACKENDS, Launch, launcher

OVERSIZE_TIMEOUT = 6.0  # the oversizing worker's distributed.timeout (rank_main.OVERSIZE_TIMEOUT)
KILL = dict(survive_deaths=True)
# the kill_worker launch records how each rank ended: a rank still running at the deadline fails the test, an mpirun
# that outlives all of its ranks does not (Launch.launcher_stuck); a loaded machine gets a longer deadline
KILL_WORKER = dict(survive_deaths=True, record_exits=True, timeout=150)

pytestmark = pytest.mark.timeout(240)

_LAUNCHES = {}


@pytest.fixture(scope='module')
def launches(tmp_path_factory):
    yield launcher(tmp_path_factory.mktemp('dist_procs'), _LAUNCHES, kill_worker=KILL_WORKER, kill_manager=KILL)
    for launch in list(_LAUNCHES.values()):  # never leave children behind
        launch.wait()
    _LAUNCHES.clear()


# ---------------------------------------------------------------------------------------------- expectations
def adv_tags(rank: int, step: int, n: int = 4):
    return [rank * 10000 + step * 100 + i for i in range(n)]


ROUNDTRIP_TAGS = sorted(t for r in (0, 1) for s in range(5) for t in adv_tags(r, s))
SMALL_TAGS = adv_tags(0, 60, 3)


def gfn_reward(rank: int, step: int, i: int) -> float:
    return float(((rank * 37 + step * 11 + i * 5) % 53) - 20) / 4


def expected_baselines(arrivals, strategy: str, capacity: int, alpha: float):
    """Baseline the manager must send back after each arrival (in its arrival order): the EMA of batch minima,
    or with 'min' and a full buffer (prioritized: the top-`capacity` rewards so far) their minimum."""
    out, ema, seen = [], None, []
    for a in arrivals:
        m = min(a['log_rewards'])
        ema = m if ema is None else alpha * m + (1 - alpha) * ema
        seen.extend(a['log_rewards'])
        if strategy == 'min' and len(seen) >= capacity:
            out.append(sorted(seen)[-capacity])
        else:
            out.append(ema)
    return out


def check_arrivals_match_pushes(launch: Launch, pushes) -> list:
    """The manager's recorded arrivals carry exactly the rows the workers pushed, each once."""
    man = launch.rank(2)
    arrivals = man['arrivals']
    got = sorted((a['sender'], t, r) for a in arrivals for t, r in zip(a['tags'], a['log_rewards']))
    want = sorted(
        (rank, float(rank * 1000 + step * 10 + i), gfn_reward(rank, step, i))
        for rank, steps, n in pushes
        for step in range(steps)
        for i in range(n)
    )
    assert got == want, man
    return arrivals


# ---------------------------------------------------------------------------------------------- 1. round trip
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_roundtrip_rows_reach_manager(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    man = run.rank(2)
    s = man['summary']
    assert s['exited'] == ['0', '1'] and s['lost'] == {}, s
    assert s['counters']['push_requests'] == 11 and s['counters']['pushed_items'] == 43, s  # 2 x 5 pushes + 1 small
    assert sorted(man['tags']) == sorted(ROUNDTRIP_TAGS + SMALL_TAGS), man['tags']
    assert man['count'] == 43 and man['obs_ok'], man
    for r in (0, 1):
        w = run.rank(r)
        assert [e['pushed'] for e in w['events'][:5]] == [4] * 5
        assert all(e['score']['stored'] == 4 for e in w['events'][:5]), w['events']
        assert w['closed'] is True


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_two_sharded_managers_serve_two_workers_as_one_buffer(tmp_path, backend):
    """distributed.num_shards=2 under torchrun / mpirun with 4 ranks: ranks 2 and 3 each own one shard; each
    worker's pushes alternate between them, its samples draw from both and its updates reach the owning shard;
    the minimum-size rule (sample_min_limit_ratio 2) judges the shards' total, as one buffer's would."""
    run = Launch('sharded', backend, tmp_path, nproc=4).wait()
    run.require_ok(ranks=(0, 1, 2, 3))
    all_tags = sorted(t for r in (0, 1) for s in range(5) for t in adv_tags(r, s))
    stored = sorted(run.rank(2)['tags'] + run.rank(3)['tags'])
    assert stored == all_tags  # every row on exactly one shard
    # round-robin per push: each worker sent pushes 0, 2, 4 to shard 0 and 1, 3 to shard 1
    assert sorted(run.rank(2)['tags']) == sorted(t for r in (0, 1) for s in (0, 2, 4) for t in adv_tags(r, s))
    for m in (2, 3):
        assert run.rank(m)['summary']['exited'] == ['0', '1'] and run.rank(m)['obs_ok']
    for r in (0, 1):
        w = run.rank(r)
        assert len(w['sample_tags']) == 16 and set(w['sample_tags']) <= set(all_tags) and w['sample_obs_ok']
        assert set(w['sample_shards']) <= {0, 1} and w['update'] == {'updated': 16, 'stale': 0}
        assert w['shard_counts'] == [24, 16] and w['closed'] is True
    assert run.rank(0)['ratio_refusals'] == ['', 0]


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_chunk_protocol_over_the_wire(launches, backend):
    """MineStudio's protocol served by the manager: a learner's blocking fetch waits for whole chunks from another
    rank, its model-version move reaches the buffer's gate (stale chunks leave, a stale fragment is dropped at its
    queue), and every chunk is used once (max_reuse=1)."""
    run = launches('chunk', backend)
    run.require_ok()
    learner, man = run.rank(0), run.rank(2)
    first = learner['first']
    assert len(first) == 4 and learner['payloads_ok'], learner
    for a, b in (first[:2], first[2:]):  # two whole chunks: consecutive fids of env1, starting even
        assert a[0] == b[0] == 'env1' and a[1] % 2 == 0 and b[1] == a[1] + 1 and a[2] == b[2] == 1
    assert learner['moved']['chunks_dropped'] == 1, learner['moved']  # the third chunk of version 0
    assert learner['second'] == [['env1', 7, 1], ['env1', 8, 1]]
    st = man['chunk_stats']
    assert (
        st['fragments_received'],
        st['fragments_dropped'],
        st['chunks_made'],
        st['chunks_retired'],
        st['chunks_dropped_stale'],
        st['count'],
    ) == (9, 1, 4, 3, 1, 0), st


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_roundtrip_sample_update_stats(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    for r in (0, 1):
        w = run.rank(r)
        assert len(w['sample_tags']) == 4 and set(w['sample_tags']) <= set(ROUNDTRIP_TAGS), w['sample_tags']
        assert w['sample_obs_ok'], w
        assert {'replay_unique_id', 'replay_buffer_idx', 'priority', 'obs', 'tag'} <= set(w['sample_keys'])
        assert w['update'] == {'updated': 4, 'stale': 0}, w['update']
        st = w['stats']
        assert st['manager/errors'] == 0 and st['manager/rejected_stale'] == 0, st
        assert st['manager/sample_requests'] >= 1, st
    # worker 0 reads stats once all 10 round-trip pushes arrived and before its own later pushes
    st0 = run.rank(0)['stats']
    assert st0['manager/push_requests'] == 10 and st0['manager/pushed_items'] == 40 and st0['count'] == 40, st0
    st1 = run.rank(1)['stats']  # worker 0's small push may already be in
    assert (st1['manager/push_requests'], st1['manager/pushed_items']) in ((10, 40), (11, 43)), st1


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_roundtrip_checkpoint_loads(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    path = run.out / 'ckpt.buf'
    assert path.exists(), f'checkpoint_path not written\n{run.logs()}'
    from ding_buffer import create_buffer

    buf = create_buffer(dict(type='advanced', replay_buffer_size=1000, storage=dict(type='tensor')))
    buf.load_data(str(path))
    assert buf.count() == 43
    rows = buf.storage.gather(buf.storage.ring.ordered_slots())
    assert rows['tag'].tolist() == run.rank(2)['tags']  # same rows, same insertion order
    buf.close()


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_roundtrip_results_are_saveable_and_files_stay_in_the_file_root(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    for r in (0, 1):  # torch.save(remote.sample(8)) / torch.save(remote.state_dict()) work and round-trip
        assert run.rank(r)['saved_sample'] is True and run.rank(r)['saved_state_dict'] is True
    fe = run.rank(0)['file_errors']
    assert fe['escape'][0] == 'PermissionError' and 'file_root' in fe['escape'][1], fe
    assert fe['absolute'][0] == 'PermissionError', fe
    assert fe['pickle_flag'][0] == 'ValueError' and 'distributed.allow_pickle' in fe['pickle_flag'][1], fe
    saved = run.rank(1)['saved_to']
    assert saved == str((run.out / 'files' / 'inside-1.buf').resolve()) and os.path.exists(saved)
    assert not (run.out / 'outside.buf').exists()


# ---------------------------------------------------------------------------------------------- 4. oversized push
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_oversized_push_gets_error_reply(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    o = run.rank(0)['oversized']
    assert o['error'] is not None, 'a 2.2 MB push to a manager with max_message_mb=1 succeeded'
    assert 'ValueError' in o['mro'], o
    assert 'max_message_mb' in o['message'], o  # an answer (a ValueError naming the key), not a timeout


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_manager_serves_after_oversized_push(launches, backend):
    run = launches('roundtrip', backend)
    run.require_ok()
    w = run.rank(0)
    assert w['oversized']['error'] is not None, w['oversized']
    assert w['events'][-1] == {'pushed': 3, 'score': {'stored': 3}}, w['events'][-1]
    assert w['count_after_small'] == 43
    man = run.rank(2)
    # the refused rows (tags 5000..84999) were not stored, the small push was
    assert sorted(man['tags']) == sorted(ROUNDTRIP_TAGS + SMALL_TAGS), 'rows of the refused push were stored'
    assert man['summary']['exited'] == ['0', '1']
    assert man['summary']['bytes_received'] > 2 * (1 << 20)  # the big message did travel and was drained


def test_max_message_mb_accepts_fraction():
    from ding_buffer.distributed import build_distributed_config

    assert build_distributed_config({'max_message_mb': 0.5}).max_message_mb == 0.5


# ---------------------------------------------------------------------------------------------- 2. baselines
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_baseline_min_on_full_prioritized_gfn(launches, backend):
    run = launches('gfn_min', backend)
    run.require_ok()
    arrivals = check_arrivals_match_pushes(run, [(0, 6, 3), (1, 6, 3)])
    want = expected_baselines(arrivals, 'min', capacity=8, alpha=0.1)
    full_checked = 0
    for r in (0, 1):
        events = run.rank(r)['events']
        assert len(events) == 6
        for step, e in enumerate(events):
            sc = e['score']
            assert sc['tag'] == r * 1000 + step * 10 and arrivals[sc['seq']]['sender'] == r, (step, sc)
            assert sc['baseline_log_reward'] == pytest.approx(want[sc['seq']], abs=1e-9), (r, step, sc, want)
            full_checked += 3 * (sc['seq'] + 1) >= 8
    assert full_checked >= 9  # most scores were sent once the buffer was full
    everything = sorted(gfn_reward(r, s, i) for r in (0, 1) for s in range(6) for i in range(3))
    man = run.rank(2)
    assert man['count'] == 8 and man['log_rewards'] == pytest.approx(everything[-8:]), man['log_rewards']
    assert want[-1] == min(man['log_rewards'])


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_baseline_ema(launches, backend):
    run = launches('gfn_ema_async', backend)
    run.require_ok()
    arrivals = check_arrivals_match_pushes(run, [(0, 5, 3), (1, 6, 2)])
    want = expected_baselines(arrivals, 'ema', capacity=10**9, alpha=0.3)
    scores = [e['score'] for r in (0, 1) for e in run.rank(r)['events'] if e['score'] is not None]
    scores.append(run.rank(0)['drained'])
    seqs = set()
    for sc in scores:
        assert sc['baseline_log_reward'] == pytest.approx(want[sc['seq']], abs=1e-9), (sc, want)
        seqs.add(sc['seq'])
    assert seqs == set(range(len(arrivals))), seqs  # every push's score was checked


# ---------------------------------------------------------------------------------------------- 3. async / freq
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_async_score_is_one_push_stale(launches, backend):
    run = launches('gfn_ema_async', backend)
    run.require_ok()
    w = run.rank(0)
    events = w['events']
    assert len(events) == 5 and events[0]['score'] is None, events[0]
    for k in range(1, 5):
        assert events[k]['score']['tag'] == (k - 1) * 10, (k, events[k])  # the score of push k-1
        assert events[k]['score']['stored'] == 3
    assert w['drained']['tag'] == 40 and w['drained']['stored'] == 3, w['drained']
    assert w['drained_again'] is None


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_remote_buffer_freq_halves_push_requests(launches, backend):
    run = launches('gfn_ema_async', backend)
    run.require_ok()
    man = run.rank(2)
    c = man['summary']['counters']
    assert c['push_requests'] == 5 + 3 and c['pushed_items'] == 15 + 12, c  # worker 1: 6 pushes -> 3 requests
    mine = [a for a in man['arrivals'] if a['sender'] == 1]
    assert [a['tags'] for a in mine] == [[1000 + 10 * s + i for s in (k, k + 1) for i in range(2)] for k in (0, 2, 4)]
    assert [a['log_rewards'] for a in mine] == [
        [gfn_reward(1, s, i) for s in (k, k + 1) for i in range(2)] for k in (0, 2, 4)
    ]
    events = run.rank(1)['events']
    assert [e['pushed'] for e in events] == [2] * 6
    assert events[0]['score'] is None
    for k in (1, 3, 5):  # a send every second push; the score in between is unchanged
        assert events[k]['score']['tag'] == 1000 + 10 * (k - 1) and events[k]['score']['stored'] == 4
        if k + 1 < 6:
            assert events[k + 1]['score'] == events[k]['score']
    assert man['count'] == 27


# ---------------------------------------------------------------------------------------------- 5. kill a worker
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_killed_worker_is_lost_others_served(launches, backend):
    run = launches('kill_worker', backend)
    run.require_ok(ranks=(1, 2), rc=False)
    assert 'ok' not in run.rank(0) and 'killed_at' in run.rank(0)
    man = run.rank(2)
    s = man['summary']
    assert list(s['lost']) == ['0'] and s['exited'] == ['1'], s
    assert man['run_seconds'] < 40, man['run_seconds']
    w1 = run.rank(1)
    assert w1['closed'] is True and w1['steps'] >= 10, w1['steps']
    assert all(e['score']['stored'] == 4 for e in w1['events'])
    survivor = [t for s_ in range(w1['steps']) for t in adv_tags(1, s_)]
    acknowledged = [t for s_ in range(3) for t in adv_tags(0, s_)]  # worker 0's pushes answered before the kill
    assert sorted(man['tags']) == sorted(acknowledged + survivor)
    assert s['counters']['push_requests'] == 3 + w1['steps']


KILL_EXIT_TIMEOUT = 40.0  # rank_main.KILL_EXIT_TIMEOUT: distributed.timeout of kill_worker_exit


@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_survivors_of_a_killed_worker_exit_0_once_their_work_is_done(tmp_path, backend):
    """Worker 0 is SIGKILLed (env:// ranks, mpirun --enable-recovery); worker 1 and the manager finish their work
    and their processes then end, with status 0: nothing at interpreter exit waits for the dead rank again (under
    MPI the manager cannot tell it from a frozen one, so its goodbye gets one distributed.timeout, inside run()).
    Each rank runs under exit_wrap.sh, which records when its process had ended, MPI_Finalize included."""
    run = Launch('kill_worker_exit', backend, tmp_path, survive_deaths=True, record_exits=True, timeout=180).wait()
    run.require_ok(ranks=(1, 2), rc=False)  # (rank 0's status is the SIGKILL's)
    s = run.rank(2)['summary']
    assert list(s['lost']) == ['0'] and s['exited'] == ['1'], s
    exits = run.exits()
    assert set(exits) >= {1, 2}, f'a surviving rank did not end\n{run.logs()}'
    assert exits[1][0] == 0 and exits[2][0] == 0, f'a surviving rank exited non-zero: {exits}\n{run.logs()}'
    # once the last survivor's work is done, nothing waits for the dead rank again: the old code waited for its
    # goodbye a second time at interpreter exit, a whole distributed.timeout more (about 1 s is measured here; the
    # bound is that one timeout, so a loaded machine has the rest of it as slack)
    done = max(run.rank(r)['ended_at'] for r in (1, 2))
    lag = {r: round(exits[r][1] - done, 1) for r in (1, 2)}
    assert all(v < KILL_EXIT_TIMEOUT for v in lag.values()), f'seconds from the work done to exit: {lag}'


# ---------------------------------------------------------------------------------------------- 6. kill the manager
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_killed_manager_raises_manager_unavailable(launches, backend):
    run = launches('kill_manager', backend)
    assert not run.timed_out, f'workers hung after the manager died\n{run.logs()}'
    assert 'killed_at' in run.rank(2), run.logs()
    for r in (0, 1):
        w = run.rank(r)
        err = w.get('error')
        assert err, f'rank {r} saw no error\n{run.logs()}'
        # a broken connection (torch) or a deadline passing (MPI sees nothing die): ManagerTimeoutError is one
        assert 'ManagerUnavailableError' in err['mro'] and 'RuntimeError' in err['mro'], err
        assert err['elapsed'] < 5.0 + 5.0, err  # distributed.timeout=5 + slack
        assert w['steps'] > 0 and all(e['score']['stored'] == 4 for e in w['events'])
        assert 'traceback' not in w, w['traceback']


_LAYOUT_RANK = '''
import sys, time
t0 = time.monotonic()
from ding_buffer import create_buffer
dist = dict(backend='torch', startup_timeout=3600, timeout=5, **eval(sys.argv[1]))
try:
    create_buffer(dict(type='naive', replay_buffer_size=10, distributed=dist))
except ValueError as e:
    print(f'{time.monotonic() - t0:.2f} {e}', flush=True)
    sys.exit(2)
sys.exit(0)
'''


@pytest.mark.slow
@pytest.mark.parametrize(
    'dist, needles',
    [
        ("dict(manager_rank=3)", ("'distributed.manager_rank' is 3", '2 ranks')),
        ("dict(num_shards=2)", ("'distributed.num_shards' is 2", '2 ranks')),
        ("dict(worker_ranks=[0, 5])", ("'distributed.worker_ranks' [0, 5]",)),
    ],
)
def test_a_rank_layout_that_cannot_fit_the_world_fails_before_any_network_wait(tmp_path, dist, needles):
    """One env:// rank of a 2-rank world, alone (its peer never comes): a layout it can judge from its config and
    WORLD_SIZE fails naming the key instead of waiting startup_timeout (an hour here: a rank that waited would
    outlive the process's own limit) for the other rank."""
    import subprocess
    import sys

    from dist_helpers import child_env, free_port

    script = tmp_path / 'rank.py'
    script.write_text(_LAYOUT_RANK)
    env = dict(child_env(), RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))
    r = subprocess.run(
        [sys.executable, str(script), dist], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=50
    )
    assert r.returncode == 2, r.stdout + r.stderr
    _, message = r.stdout.split(' ', 1)
    for needle in needles:
        assert needle in message, message


@pytest.mark.slow
def test_a_sharded_manager_rank_checks_the_checkpoint_of_its_own_shard(tmp_path):
    """With num_shards > 1 each manager writes checkpoint_path.shard<k>: rank 2 of 3 (shard 1) checked the bare
    path, refusing a prefix that names a directory while its own file was fine, and passing a shard path that is a
    directory until the manager started."""
    import subprocess
    import sys

    from dist_helpers import child_env, free_port

    script = tmp_path / 'rank.py'
    script.write_text(_LAYOUT_RANK.replace('startup_timeout=3600', 'startup_timeout=2'))
    (tmp_path / 'run1').mkdir()
    (tmp_path / 'run2.shard1').mkdir()
    env = dict(child_env(), RANK='2', WORLD_SIZE='3', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))
    for prefix, refused in (('run1', False), ('run2', True)):
        dist = f"dict(num_shards=2, checkpoint_path={str(tmp_path / prefix)!r})"
        r = subprocess.run(
            [sys.executable, str(script), dist], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=50
        )
        if refused:  # before any network wait, naming the shard's file
            assert r.returncode == 2 and f"{tmp_path / 'run2.shard1'}', which is a directory" in r.stdout, r.stdout
        else:  # accepted: it waits for its peers, which never come
            assert r.returncode == 1 and 'TimeoutError' in r.stderr, r.stdout + r.stderr


def _torchrun_two(tmp_path, text):
    """``text`` as a script on 2 torchrun ranks (rank 1 the manager); the finished run, which must exit 0."""
    import subprocess
    import sys

    from dist_helpers import child_env, free_port

    script = tmp_path / 'ranks.py'
    script.write_text(text)
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2', f'--master_port={free_port()}']
    r = subprocess.run(
        [*torchrun, str(script)], env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


_TWO_BUFFERS = '''
import sys, torch
from ding_buffer import create_buffer
from ding_buffer.distributed import ReplayBufferManager
cfg = dict(type='advanced', replay_buffer_size=64, storage=dict(type='tensor'),
           distributed=dict(backend='torch', timeout=10, startup_timeout=60))
b = create_buffer(cfg)
if isinstance(b, ReplayBufferManager):
    b.run()
    sys.exit(0)
try:
    create_buffer(cfg)
    print('second buffer: accepted')
except RuntimeError as e:
    print('second buffer:', e)
b.push({'obs': torch.zeros(2)})
print('first buffer: count', b.count(), 'stats', type(b.stats()).__name__)
b.close()
'''


@pytest.mark.slow
def test_a_second_buffer_to_the_same_manager_in_one_process_is_refused(tmp_path):
    """Two buffers of one worker process on torch shared its replies (matched by request ids numbered from 0 in
    each): calls timed out though the manager answered them, and one buffer's call returned the other's reply. The
    second create_buffer is refused, and the first buffer goes on."""
    r = _torchrun_two(tmp_path, _TWO_BUFFERS)
    assert 'second buffer: this process already has an open connection to rank(s) [1]' in r.stdout, r.stdout
    assert 'first buffer: count 1 stats dict' in r.stdout, r.stdout


_RETRY = '''
import os, sys, torch
from ding_buffer import create_buffer
def cfg(shm):
    return dict(type='gfn', replay_buffer_size=16,
                distributed=dict(backend='torch', timeout=10, startup_timeout=60, shared_memory=shm))
if os.environ['RANK'] == '1':
    create_buffer(cfg(False)).run()
    sys.exit(0)
try:
    create_buffer(cfg(True))  # refused after its transport to the manager started
    print('bad config: accepted')
except ValueError as e:
    print('bad config: refused')
b = create_buffer(cfg(False))
b.push({'state': torch.zeros(2, 2), 'log_reward': torch.zeros(2)})
print('corrected config: count', b.count())
b.close()
'''


@pytest.mark.slow
def test_a_create_buffer_refused_after_its_transport_started_leaves_nothing_open(tmp_path):
    """A worker's create_buffer whose config is refused after its transport to the manager started left that
    transport open, so the corrected retry in the same process was refused as a second buffer."""
    r = _torchrun_two(tmp_path, _RETRY)
    assert 'bad config: refused' in r.stdout and 'corrected config: count 2' in r.stdout, r.stdout


# ---------------------------------------------------------------------------------------------- frames on the wire
@pytest.mark.slow
@pytest.mark.parametrize('backend', BACKENDS)
def test_frames_travel_as_new_frames_and_samples_are_exact(launches, backend):
    """storage.frames over torchrun / mpirun: two workers (async scores; three pushes a send) push their own
    environments' steps; continuing steps travel without obs and with one frame of next_obs, and every sampled
    row (n-step returns included) equals the pushed steps."""
    run = launches('frames', backend)
    for r in (0, 1):
        rep = run.rank(r)
        assert rep['ok'], rep
        assert rep['frames_count'] == 300 and rep['frames_rows'] == 64 and rep['frames_bad'] == [], rep
        wire = rep['wire']
        assert wire['steps'] == 150 and wire['next_as_frame'] == 150 and wire['obs_omitted'] > 100, wire
    assert run.rank(2)['ok'], run.rank(2)

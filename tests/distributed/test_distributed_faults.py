"""The distributed manager under attack and faults, with real processes (torchrun / env:// ranks and mpirun).

Scenarios of ``tests/distributed/dist_scripts/rank_main.py`` (ranks 0 and 1 are workers, rank 2 the manager):
- hostile: rank 0 speaks the transport but lies (crafted headers, a pickle that would run code, paths outside
  the manager's file root, random bytes, lying control blocks, a short frame after long ones, an oversized
  frame) while rank 1 is served; the manager answers every framed request with an error, never runs code,
  stays within its memory and keeps serving both.
- freeze_manager: the manager is SIGSTOPped for longer than the workers' timeout; every call that fails fails
  by its timeout, before the manager is thawed; retried pushes are stored exactly once.
- freeze_worker / freeze_worker_end: a worker frozen past peer_timeout rejoins when thawed, or (the manager
  ending first) gets a clear error; every rank exits 0 either way.
Transport-level scenarios (``transport_main.py``, two ranks): a receiver that posts late gets exactly the bytes
sent by a sender whose deadline passed.
"""

import subprocess
import sys
import time

import pytest
from dist_helpers import BACKENDS, SCRIPTS, Launch, child_env, free_port, launcher
from helpers import need_mpi

# every test launches processes (torchrun / env:// ranks, mpirun, python): slow
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FREEZE_TIMEOUT = 3.0  # rank_main.FREEZE_TIMEOUT
ADV_TAGS = lambda rank, steps: sorted(rank * 10000 + s * 100 + i for s in steps for i in range(4))  # noqa: E731

_LAUNCHES = {}


@pytest.fixture(scope='module')
def launches(tmp_path_factory):
    yield launcher(
        tmp_path_factory.mktemp('dist_faults'),
        _LAUNCHES,
        hostile=dict(timeout=150),
        freeze_manager=dict(timeout=150),
        freeze_worker=dict(timeout=150),
        freeze_worker_end=dict(timeout=150),
    )
    for launch in list(_LAUNCHES.values()):
        launch.wait()
    _LAUNCHES.clear()


# ---------------------------------------------------------------------------------------------- hostile peer
@pytest.mark.parametrize('backend', BACKENDS)
def test_hostile_peer_gets_error_replies_and_never_runs_code(launches, backend):
    run = launches('hostile', backend)
    run.require_ok()
    h = run.rank(0)
    replies = h['replies']
    missing = [k for k, v in replies.items() if v is None]
    assert not missing, f'no error reply for {missing}\n{run.logs()}'
    answered_normally = {'sample huge', 'update garbage'}  # the buffer's own answer (None), not a protocol error
    assert all(v[0] is False for k, v in replies.items() if k not in answered_normally), replies
    assert replies['load_data allow_pickle'][1] == 'TypeError', replies  # the flag cannot travel in a request
    assert replies['load_data absolute'][1] == 'PermissionError' and replies['save_data escape'][1] == 'PermissionError'
    assert 'max_message_mb' in replies['oversized'][2]
    assert 'pickle' in replies['pickled leaf'][2]
    assert h['fuzz_answered'] >= 148  # mutated requests are answered (a mutation may turn one into a ping)
    assert h['raw_answered'] >= h['raw_sent'] - 2, h  # raw garbage too (the 20-byte frame included)
    assert not (run.out / 'pwned').exists(), 'a worker made the manager run code'
    assert not (run.out.parent / 'escaped.buf').exists() and not (run.out / '..' / '..' / 'escaped.buf').exists()


@pytest.mark.parametrize('backend', BACKENDS)
def test_hostile_peer_leaves_the_manager_serving_everyone(launches, backend):
    run = launches('hostile', backend)
    run.require_ok()
    good = run.rank(1)
    h = run.rank(0)
    stored = 41 * 4 + h['fuzz_stored']  # 40 steps + the last push of 4 rows, and mutated pushes that were valid
    assert good['closed'] and good['count_final'] == stored, (good, h['fuzz_stored'])
    assert all(e['score']['stored'] == 4 for e in good['events'])
    assert isinstance(h['served_after'], int) and h['served_after'] > 0, h['served_after']  # the liar is served too
    # a frame that stopped half-way holds up only its sender: the good worker was served meanwhile, and the
    # frame was served once its part arrived
    assert h['rank1_served_first'] and len(good['served_in_stall']) == 5, (h, good['served_in_stall'])
    assert all(isinstance(c, int) for c in good['served_in_stall']), good['served_in_stall']
    assert isinstance(h['stalled_reply'], int) and h['stalled_reply'] > 0, h['stalled_reply']
    man = run.rank(2)
    s = man['summary']
    assert s['exited'] == ['1'] and list(s['lost']) == ['0'], s  # rank 0 left without EXIT
    assert s['protocol_errors'] >= 10, s  # the raw garbage was refused at the framing level
    assert man['count'] == stored
    # declared sizes up to 2**62 never turn into memory: the peak RSS moves by normal serving only (the exact
    # allocation rule, a piece at a time, is checked in test_distributed_unit)
    assert man['rss_mb_end'] - man['rss_mb_start'] < 200, (man['rss_mb_start'], man['rss_mb_end'])


# ---------------------------------------------------------------------------------------------- frozen manager
@pytest.mark.parametrize('backend', BACKENDS)
def test_frozen_manager_every_call_fails_within_the_timeout(launches, backend):
    run = launches('freeze_manager', backend)
    run.require_ok()
    calls = run.rank(0)['calls'] + run.rank(1)['calls']
    failed = [c for c in calls if not c['ok']]
    assert failed, f'the freeze produced no failed call\n{run.logs()}'
    thawed = run.rank(1)['thawed_at']  # the manager was frozen for FREEZE_SECONDS (8 s) > 2 x the timeout (3 s)
    late = [c for c in failed if 'start' in c and c['start'] + c['seconds'] > thawed]
    assert not late, late  # a call that fails was ended by its own timeout, not by the manager's thaw
    slow = [c for c in calls if c['seconds'] > 2 * FREEZE_TIMEOUT]
    assert not slow, slow  # a call fails (or succeeds) within its timeout, with wide slack
    assert all(
        'within' in c['error'] or 'did not' in c['error'] for c in failed if 'error' in c and c['what'] != 'stats'
    )


@pytest.mark.parametrize('backend', BACKENDS)
def test_frozen_manager_retried_pushes_are_stored_once(launches, backend):
    run = launches('freeze_manager', backend)
    run.require_ok()
    man = run.rank(2)
    assert sorted(man['tags']) == ADV_TAGS(0, range(40)), 'a retried push was stored twice or lost'
    assert run.rank(0)['unacknowledged'] == 0
    s = man['summary']
    assert s['counters']['push_requests'] == 40 and s['lost'] == {}, s


# ---------------------------------------------------------------------------------------------- frozen worker
@pytest.mark.parametrize('backend', BACKENDS)
def test_frozen_worker_rejoins_and_every_rank_exits_0(launches, backend):
    run = launches('freeze_worker', backend)
    run.require_ok()
    man = run.rank(2)
    s = man['summary']
    assert s['rejoined'] == {'0': 1} and s['lost'] == {} and s['exited'] == ['0', '1'], s
    w0 = run.rank(0)
    assert sorted(t for t in man['tags'] if t < 10000) == ADV_TAGS(0, range(w0['steps']))
    after = [c for c in w0['calls'] if c['start'] > run.rank(1)['thawed_at'] + 0.05]
    assert after and max(c['seconds'] for c in after) < 2 * 10.0, after  # distributed.timeout=10, wide slack
    assert all(c['ok'] for c in after[1:]), after  # once thawed, every call succeeds (the first may be in doubt)


@pytest.mark.parametrize('backend', BACKENDS)
def test_manager_ending_while_a_worker_is_frozen_exits_0_everywhere(launches, backend):
    run = launches('freeze_worker_end', backend)
    run.require_ok()  # every rank's exit code is 0 (no abort when gloo threads are shut down)
    s = run.rank(2)['summary']
    assert s['exited'] == ['1'] and list(s['lost']) == ['0'], s
    assert s['unanswered_goodbye'] == [], s  # the thawed worker answered the manager's goodbye
    w0 = run.rank(0)
    assert 'shut down' in w0['manager_gone'], w0


# ---------------------------------------------------------------------------------------------- transport level
@pytest.mark.parametrize('backend', BACKENDS)
def test_late_receiver_gets_exactly_the_bytes_of_a_timed_out_send(tmp_path, backend):
    if backend == 'mpi':
        need_mpi()
    run = Launch('late_receiver', backend, tmp_path, script=SCRIPTS / 'transport_main.py', nproc=2, timeout=90)
    run.wait().require_ok(ranks=(0, 1))
    s, r = run.rank(0), run.rank(1)
    assert s['timed_out'] and s['error'] == 'SendTimeout', s
    assert 1.0 <= s['timeout_seconds'] < 30, s  # the send waited for its 1 s deadline, then gave up
    assert r['first_ok'] and r['first_len'] == 256 << 10, r  # all 0xAB: never freed or reused memory
    assert r['second'] == 'after', r


def test_mpi_reader_keeps_each_senders_order_and_drops_a_stranger(tmp_path):
    """Two senders interleave small frames (read on the receiver's dispatcher) and 1 MiB ones (handed to the
    sender's own thread); a third rank that is not a peer sends a raw message (transport_main.py: stranger)."""
    need_mpi()
    run = Launch('stranger', 'mpi', tmp_path, script=SCRIPTS / 'transport_main.py', nproc=4, timeout=120)
    run.wait().require_ok(ranks=(0, 1, 2, 3))
    r = run.rank(3)
    frames = list(range(40))  # transport_main.STRANGER_FRAMES
    assert r['seqs'] == {'0': frames, '1': frames}, r['seqs']  # all of them, in each sender's order
    assert r['whole'], r  # every frame's bytes, from the rank it names
    assert r['protocol_errors'] == 1, r  # the stranger's message, and nothing else
    assert r['stuck'] == [] and run.rank(0)['stuck'] == [] and run.rank(1)['stuck'] == []


def test_mpi_reader_serves_others_while_a_sender_is_frozen_mid_head(tmp_path):
    """A head past MPI's eager size whose sender froze mid-send (transport_main.py: frozen_head) holds up only that
    sender: the other one's 20 frames are read meanwhile, and the frozen one's frame arrives whole once thawed."""
    need_mpi()
    run = Launch('frozen_head', 'mpi', tmp_path, script=SCRIPTS / 'transport_main.py', nproc=3, timeout=120)
    run.wait().require_ok(ranks=(0, 1, 2))
    r = run.rank(2)
    assert r['from1_while_frozen'] == list(range(20)), r
    assert r['from0_whole'] is True and run.rank(0)['sent'], (r, run.rank(0))


# ---------------------------------------------------------------- start-up and config traps
def _run(code: str, env: dict, timeout: float = 60):
    t = time.monotonic()
    p = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t


START = '''
import time
from ding_buffer import create_buffer
t = time.monotonic()
try:
    create_buffer(dict(type='naive', replay_buffer_size=8, distributed=dict(backend={backend!r}, startup_timeout=3)))
    print('NO ERROR')
except Exception as e:
    print('ERR', type(e).__name__, time.monotonic() - t, str(e))
'''


def test_startup_with_an_unreachable_master_fails_within_the_timeout():
    env = child_env()
    env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()), RANK='1', WORLD_SIZE='2')
    p, wall = _run(START.format(backend='torch'), env)
    assert p.stdout.startswith('ERR TimeoutError'), p.stdout + p.stderr
    assert float(p.stdout.split()[2]) < 3 + 3 and 'master' in p.stdout and 'startup_timeout' in p.stdout, p.stdout


def test_startup_with_peers_that_never_start_says_so():
    env = child_env()
    env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()), RANK='0', WORLD_SIZE='3')
    p, wall = _run(START.format(backend='torch'), env)  # the master: nobody joins its store
    assert p.stdout.startswith('ERR TimeoutError'), p.stdout + p.stderr
    assert float(p.stdout.split()[2]) < 3 + 3 and 'ranks [1, 2] of 3 did not join' in p.stdout, p.stdout


def test_startup_barrier_names_the_ranks_that_never_started(tmp_path):
    """Ranks 0 and 1 of a world of 3 start; rank 2 never does: both fail in time naming rank 2."""
    port = str(free_port())
    procs = []
    for r in (0, 1):
        env = child_env()
        env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=port, RANK=str(r), WORLD_SIZE='3')
        procs.append(
            subprocess.Popen(
                [sys.executable, '-c', START.format(backend='torch')],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=60)[0] for p in procs]
    for out in outs:
        assert out.startswith('ERR TimeoutError') and float(out.split()[2]) < 3 + 4, outs
    assert 'ranks [2] of 3 did not join' in outs[0], outs  # rank 1 may see the store's host give up first


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_world_of_one_rank_is_refused(backend):
    env = child_env()
    if backend == 'mpi':
        need_mpi()  # plain `python` under the MPI backend: a singleton world
    else:
        env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()), RANK='0', WORLD_SIZE='1')
    p, _ = _run(START.format(backend=backend), env)
    assert p.stdout.startswith('ERR ValueError') and "distributed.backend" in p.stdout and '1 rank' in p.stdout, (
        p.stdout + p.stderr
    )


BAD_MANAGER = '''
import os, sys, time
t = time.monotonic()
from ding_buffer import create_buffer
dist = dict(backend={backend!r}, startup_timeout=3600, timeout=10, scoring_function='nomodule_xyz:score')

def say(line):  # stdout, and under mpirun a file per rank too: mpirun may interleave two ranks' lines
    print(line, flush=True)
    if os.environ.get('RESULT_DIR'):
        with open(os.path.join(os.environ['RESULT_DIR'], os.environ['OMPI_COMM_WORLD_RANK']), 'w') as f:
            f.write(line)

try:
    create_buffer(dict(type='naive', replay_buffer_size=8, distributed=dist))
    say('NO ERROR')
except Exception as e:
    started = ('mpi4py.MPI' in sys.modules) or ('ray' in sys.modules and sys.modules['ray'].is_initialized())
    say(' '.join(['ERR', type(e).__name__, str(round(time.monotonic() - t, 1)),
                  'network-started' if started else 'no-network', str(e).replace(chr(10), ' ')]))
    sys.exit(2)
'''


def _mpi_bad_manager(tmp_path, *flags) -> dict:
    """BAD_MANAGER under ``mpirun -n 2 FLAGS``: rank -> the line it wrote (none if it wrote nothing)."""
    need_mpi()
    cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', *flags, '-n', '2', '-x', 'RESULT_DIR', sys.executable]
    env = dict(child_env(), RESULT_DIR=str(tmp_path))
    p = subprocess.run(
        cmd + ['-c', BAD_MANAGER.format(backend='mpi')], env=env, capture_output=True, text=True, timeout=120
    )
    lines = {int(f.name): f.read_text() for f in tmp_path.iterdir()}
    assert lines.get(1, '').startswith('ERR '), (lines, p.stdout + p.stderr)  # the manager rank: rank 1 of 2
    return lines


def test_a_managers_unimportable_scoring_function_fails_before_the_startup_wait():
    """The manager rank (rank 1 of 2, env://, its peer never starts) names the bad key at once, instead of
    waiting startup_timeout (an hour here, past the process's own limit) for the master."""
    env = child_env()
    env.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()), RANK='1', WORLD_SIZE='2')
    p, _ = _run(BAD_MANAGER.format(backend='torch'), env, timeout=120)
    assert p.stdout.startswith('ERR ValueError'), p.stdout + p.stderr
    _, _, _, network, message = p.stdout.split(' ', 4)
    assert "'distributed.scoring_function'" in message and "'nomodule_xyz:score'" in message, message


def test_a_managers_unimportable_scoring_function_fails_before_mpi_init(tmp_path):
    """Under mpirun the manager rank (rank 1 of 2) refuses its scoring function before MPI_Init (mpi4py not even
    imported), which would wait for every rank; mpirun then ends the job."""
    _, kind, _, network, message = _mpi_bad_manager(tmp_path)[1].split(' ', 4)
    assert kind == 'ValueError' and network == 'no-network', (kind, network, message)
    assert "'distributed.scoring_function'" in message and "'nomodule_xyz:score'" in message, message


def test_a_managers_config_error_under_enable_recovery_does_not_hold_the_other_ranks(tmp_path):
    """Under mpirun --enable-recovery (the train launcher's) a rank that left before MPI_Init would keep the others
    inside MPI_Init for good: the manager rank joins MPI_Init, then raises its ValueError, and the job ends (its
    worker rank finished: nothing to serve)."""
    lines = _mpi_bad_manager(tmp_path, '--enable-recovery')
    assert lines.get(0) == 'NO ERROR', lines  # the worker rank got through MPI_Init
    _, kind, _, network, message = lines[1].split(' ', 4)
    assert kind == 'ValueError' and "'distributed.scoring_function'" in message, lines[1]


def test_a_ray_managers_unimportable_scoring_function_fails_before_ray_starts():
    pytest.importorskip('ray')
    env = {k: v for k, v in child_env().items() if k != 'RAY_ADDRESS'}
    p, _ = _run(BAD_MANAGER.format(backend='ray'), env, timeout=120)
    assert p.stdout.startswith('ERR ValueError'), p.stdout + p.stderr
    _, _, _, network, message = p.stdout.split(' ', 4)
    assert network == 'no-network' and "'distributed.scoring_function'" in message, p.stdout

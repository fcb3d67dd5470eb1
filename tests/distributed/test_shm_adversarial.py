"""Adversarial probes of the shared-memory push path: hostile headers and layouts, refusals inside one commit,
retries after a lost link, closes and shutdowns. In-process: a ``ManagerCore`` and workers whose requests go
through ``handle`` (``Job`` of test_shm_ring), or a real ``RemoteBuffer`` over an in-process channel (``Net``) whose
link can be cut. Every test is bounded (small timeouts, no unbounded waits)."""

import os
import random
import threading
import time

import numpy as np
import pytest
import torch
from easydict import EasyDict
from test_shm_ring import Job as _Job
from test_shm_ring import ring_fds, step

from ding_buffer.distributed import ManagerCore, RemoteBuffer, build_distributed_config
from ding_buffer.distributed.codec import decode, encode
from ding_buffer.distributed.local import build_manager_buffer
from ding_buffer.distributed.protocol import result_of
from ding_buffer.distributed.shm_ring import HEADER, NOTE, RingPusher
from ding_buffer.errors import ManagerUnavailableError

MAGIC_W, WRITTEN, READ, BEAT, CLOSED, REFUSED, FINAL, TOKEN, ENVSTEP, ATTACHED = range(10)


LIVE = []  # what a test made, closed at teardown even when the test failed (then the next test starts clean)


def _teardown():
    while LIVE:
        obj = LIVE.pop()
        for p in obj.pushers:
            p.close()
        if getattr(obj, 'stop', None) is not None:
            obj.stop.set()
            obj.beats.join(5)
        core = getattr(obj, 'core', None)
        if core is not None and core.rings is not None:
            core.rings.close_all(lambda *a: None)


@pytest.fixture(autouse=True)
def nothing_left():
    shm = set(os.listdir('/dev/shm'))
    yield
    _teardown()
    assert ring_fds() == []
    assert not [f for f in set(os.listdir('/dev/shm')) - shm if 'ding_buffer' in f]


def ring_maps():
    with open('/proc/self/maps') as f:
        return sum('ding_buffer_ring' in line for line in f)


# ---------------------------------------------------------------------------------------------- harnesses
class Job(_Job):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.pushers = [self.pusher]
        LIVE.append(self)


class Multi:
    """A manager core serving several senders, each with its own RingPusher (requests through ``handle``)."""

    def __init__(self, storage='tensor', ring_mb=1.0, timeout=2.0, size=100_000):
        cfg = dict(
            type='advanced',
            replay_buffer_size=size,
            storage=dict(type=storage),
            distributed=dict(backend='torch', shared_memory=True, shm_ring_mb=ring_mb, timeout=timeout),
        )
        self.buffer, dcfg, key = build_manager_buffer(cfg)
        self.core = ManagerCore(self.buffer, dcfg, key)
        self.lock = threading.Lock()
        self.ids = 0
        self.timeout = timeout
        self.pushers = []
        LIVE.append(self)
        self.stop = threading.Event()  # the runner's heartbeat, stamped without the lock (as commit_loop does)
        self.beats = threading.Thread(target=self._beat, daemon=True)
        self.beats.start()

    def _beat(self):
        while not self.stop.wait(0.01):
            self.core.rings.beat()

    def request(self, sender, op, **args):
        with self.lock:
            self.ids += 1
            return result_of(self.core.handle(sender, {'op': op, 'id': self.ids, 'args': args}), op)

    def pusher(self, sender, client='c', timeout=None):
        p = RingPusher(lambda op, **a: self.request(sender, op, **a), f'{client}-{sender}', timeout or self.timeout)
        self.pushers.append(p)
        return p

    def commit(self):
        self.core.rings.beat()  # (a runner's ring thread beats between rounds)
        with self.lock:
            return self.core.commit_rings()


class Net:
    """A RemoteBuffer's channel to an in-process ManagerCore, through the real codec. ``down``: requests are not
    delivered and their replies time out (``ManagerUnavailableError``): a cut link or a frozen manager."""

    where = 'in-process'

    def __init__(self, core, lock, sender=1):
        self.core, self.lock, self.sender = core, lock, sender
        self.down = False
        self.ids = 0
        self.replies = {}

    def submit(self, request, deadline=None):
        self.ids += 1
        if self.down:
            self.replies[self.ids] = None
            return self.ids
        header, parts = encode(dict(request, id=self.ids))
        msg = decode(header, [bytes(p) for p in parts])
        with self.lock:
            reply = self.core.handle(self.sender, msg)
        header, parts = encode(reply)
        self.replies[self.ids] = decode(header, [bytes(p) for p in parts])
        return self.ids

    def result(self, rid, op, deadline=None):
        reply = self.replies.pop(rid)
        if reply is None:
            raise ManagerUnavailableError(f"no reply to {op!r} (link down)")
        return reply

    def close(self, grace=None):
        pass


def remote_job(storage='tensor', timeout=2.0):
    cfg = dict(
        type='advanced',
        replay_buffer_size=10_000,
        storage=dict(type=storage),
        distributed=dict(backend='torch', shared_memory=True, shm_ring_mb=1.0, timeout=timeout),
    )
    buffer, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buffer, dcfg, key)
    lock = threading.Lock()
    net = Net(core, lock)
    local_cfg = EasyDict({k: v for k, v in cfg.items() if k != 'distributed'})
    rb = RemoteBuffer(local_cfg, dcfg, net, log_reward_key=key)
    LIVE.append(EasyDict(core=core, pushers=[rb.rings]))
    return buffer, core, lock, net, rb


def tags(buffer):
    """Every stored row's 'tag', in storage order (tensor storage: the buffer's own table)."""
    n = buffer.count()
    out = []
    for _ in range(60):
        s = buffer.sample(n, 0)
        out += s['tag'].tolist() if isinstance(s, dict) else [int(x['tag']) for x in s]
    return out


def pri(i, p=1.0):
    return {'obs': torch.full((3,), float(i)), 'tag': torch.tensor(i), 'priority': torch.tensor(p)}


# ====================================================================================== refusals, retries, closes
def test_a_good_push_is_not_lost_because_a_later_push_in_the_same_commit_is_refused():
    """Push A (valid) and push B (NaN priority) land in one take: the buffer refuses the take as one push, so the
    manager applies it push by push, as over the wire: A is stored, only B is refused and reported."""
    job = Job('tensor')
    assert job.pusher.push(pri(0, 1.0), False) == 1  # valid: returned without error
    assert job.pusher.push(pri(1, float('nan')), False) == 1  # invalid priority
    job.core.commit_rings()
    with pytest.raises(ValueError, match='priority'):
        job.pusher.push(pri(2, 1.0), False)  # B's refusal is reported here (fine)
    assert job.request('count') == 1, "the valid row of push A was dropped with push B's bad row"
    assert tags(job.buffer) == [0] * 60 and job.core.counters['shm_refused_rows'] == 1
    job.close()


def test_a_valid_item_with_a_0d_tensor_and_a_python_scalar_is_stored():
    """A 0-d tensor next to a python scalar (rows come back one item dict each) is stored, not mistaken for a
    corrupt ring."""
    job = Job('list')
    assert job.pusher.push({'obs': torch.zeros(3), 'tag': torch.tensor(1), 'reward': 1.5}, False) == 1
    assert job.pusher.push({'obs': torch.ones(3), 'tag': torch.tensor(2), 'reward': 2.5}, False) == 1
    job.core.commit_rings()
    assert job.core.counters['shm_corrupt_rings'] == 0
    assert job.buffer.count() == 2
    job.close()


def test_a_worker_whose_ring_was_closed_as_corrupt_can_push_again():
    """After its ring is closed as corrupt the worker's next push raises RuntimeError (its unread rows are lost);
    the pushes after it get a new ring."""
    job = Job('tensor')
    job.pusher.push(step(0), False)
    job.core.commit_rings()
    job.pusher.writer.map.head[WRITTEN] = 1 << 40
    job.core.commit_rings()
    assert job.core.counters['shm_corrupt_rings'] == 1
    with pytest.raises(RuntimeError, match='closed'):
        job.pusher.push(step(1), False)  # the documented one
    outcomes = []
    for i in range(3):
        try:
            outcomes.append(job.pusher.push(step(2 + i), False))
        except RuntimeError as e:
            outcomes.append(type(e).__name__)
    job.close()
    assert 'RuntimeError' not in outcomes, outcomes


def test_close_reports_rows_the_buffer_refused_at_the_final_commit():
    """Rows the buffer refuses at EXIT's commit (no later push can report them) make ``close()`` raise, after it
    closed; the valid row is stored."""
    buffer, core, lock, net, rb = remote_job()
    rb.push(pri(0))
    rb.push(pri(1, float('nan')))  # refused when committed, here by EXIT
    with pytest.raises(ValueError, match='priority'):
        rb.close()
    assert buffer.count() == 1
    core.shutdown()


def test_a_retry_after_manager_unavailable_through_wire_rest_stores_each_row_once():
    """RemoteBuffer's retry contract through a ring: the worker is counted lost (its ring closes); its next push
    finds the ring closed, cannot get a new one (link down) and sends the rest over the wire, which raises
    ManagerUnavailableError (in doubt). The caller's retry of the same push sends the rest once and writes
    nothing into a new ring: every row is stored once."""
    buffer, core, lock, net, rb = remote_job()
    rb.push(step(0))
    with lock:
        core.liveness.lose(1, 'silent')
        core.commit_rings()  # row 0 taken, the ring closed under the writer
    batch = [step(1), step(2)]
    net.down = True
    with pytest.raises(ManagerUnavailableError):
        rb.push(batch)
    net.down = False
    rb.push(batch)  # the caller's retry
    n = rb.count()
    got = sorted(set(tags(buffer)))
    rb.close()
    core.shutdown()
    assert n == 3, f"{n} rows stored for tags {got} (3 pushed)"


def test_a_push_failing_behind_one_in_doubt_says_its_data_was_not_taken_through_rings_too():
    """Push A goes over the wire (the ring closed under the writer) and is kept in doubt; push B finds A owed,
    sends it first, and fails: B took none of its rows, and its error says so (it was the plain error of a kept
    push). Pushed again, every row is stored once."""
    buffer, core, lock, net, rb = remote_job()
    rb.push(step(0))
    with lock:
        core.liveness.lose(1, 'silent')
        core.commit_rings()
    net.down = True
    with pytest.raises(ManagerUnavailableError) as kept:
        rb.push([step(1), step(2)])
    assert 'not taken' not in str(kept.value) and rb.unacknowledged == 1
    with pytest.raises(ManagerUnavailableError, match='was not taken, push it again'):
        rb.push(step(3))
    assert rb.unacknowledged == 1
    net.down = False
    rb.push(step(3))
    rb.flush()
    n = rb.count()
    rb.close()
    core.shutdown()
    assert n == 4


def test_a_ring_size_that_can_never_be_allocated_is_refused_by_name():
    """All rings together hold at most 4 GiB: a larger ``shm_ring_mb`` could never get a ring, so the config
    refuses it by name."""
    with pytest.raises(ValueError, match='shm_ring_mb'):
        build_distributed_config(dict(backend='torch', shared_memory=True, shm_ring_mb=8192))


def test_a_0d_numpy_array_comes_back_as_the_wire_gives_it():
    """As over the wire, a 0-d ``np.ndarray`` field comes back as an ndarray and a numpy scalar as a numpy scalar
    (list storage keeps what was pushed), with and without a python scalar in the item."""
    job = Job('list')
    for extra in ({'r': 1.0}, {}):
        job.pusher.push({'a': np.array(3, dtype=np.int16), 'g': np.float32(2.5), **extra}, False)
    job.core.commit_rings()
    n, items = job.buffer.count(), [x for _ in range(10) for x in job.buffer.sample(2, 0)]
    job.close()
    assert n == 2 and {('r' in item) for item in items} == {True, False}  # both rows, the two layouts
    for item in items:
        assert isinstance(item['a'], np.ndarray) and item['a'].shape == () and item['a'] == 3, item
        assert type(item['g']) is np.float32 and item['g'] == 2.5, item


# ====================================================================================== probes that held up
def test_hostile_header_scribbles_never_crash_or_stall_the_others():
    """A hostile sender scribbles every header word (and the note bytes) with random and edge values between
    pushes and commits; a good sender's rows must all be stored once, in order, and the manager must never raise."""
    rng = random.Random(1234)
    edges = [0, 1, 2, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 62, 1 << 40]
    m = Multi('tensor', ring_mb=32 * 64 / (1 << 20), timeout=2.0)
    good = m.pusher(0, 'good')
    evil = m.pusher(1, 'evil', timeout=0.05)
    pushed = 0
    for rnd in range(400):
        good.push(step(pushed), False)
        pushed += 1
        try:
            evil.push(step(10_000 + rnd), False)
        except (RuntimeError, ValueError, ManagerUnavailableError):
            pass
        w = evil.writer
        if w is not None and w.map.head is not None:
            word = rng.randrange(10)
            near = (int(w.map.head[word]) + rng.randint(-3, 3)) % (1 << 64)
            w.map.head[word] = rng.choice(edges + [rng.getrandbits(64), near])
            if rng.random() < 0.2:
                w.map.mm[NOTE:HEADER] = bytes(rng.getrandbits(8) for _ in range(HEADER - NOTE))
        if rnd % 3 == 0:
            m.commit()
        if rnd % 7 == 0:
            try:
                m.request(1, 'count')
            except Exception:
                pass
        if rnd % 11 == 0 and evil.writer is None and rng.random() < 0.5:
            evil = m.pusher(1, f'evil{rnd}', timeout=0.05)
    assert m.request(0, 'count') >= pushed
    stored = m.core.counters['shm_rows']
    good_rows = [t for t in set(tags(m.buffer)) if t < 10_000]
    assert sorted(good_rows) == list(range(pushed))
    assert m.core.counters['shm_corrupt_rings'] >= 1 and stored >= pushed
    good.close()
    evil.close()
    with m.lock:
        m.core.shutdown()


def test_rows_a_hostile_worker_lies_about_are_data_of_the_announced_layout():
    """Scribbling the row bytes and moving the counter within bounds yields rows of the manager's layout only."""
    m = Multi('tensor')
    good = m.pusher(0)
    good.push(step(0), False)
    evil = m.pusher(1)
    evil.push(step(1), False)
    w = evil.writer
    w.map.mm[HEADER:] = os.urandom(len(w.map.mm) - HEADER)
    w.map.head[WRITTEN] = w.map.rows  # read is 0: within bounds (a full ring of garbage)
    m.commit()
    assert m.core.counters['shm_corrupt_rings'] == 0
    out = m.buffer.sample(m.buffer.count(), 0)
    assert out['obs'].shape[1:] == (3,) and out['obs'].dtype == torch.float32 and out['tag'].dtype == torch.int64
    good.close()
    evil.close()
    with m.lock:
        m.core.shutdown()


def test_descriptors_and_mappings_do_not_leak_over_many_rings():
    job = Job('list', ring_mb=0.01)
    fds0, maps0 = len(os.listdir('/proc/self/fd')), ring_maps()
    for i in range(300):  # a new layout every push: a new ring, the old one closed
        job.pusher.push({'a': torch.zeros(i % 3 + 1)}, False)
        if i % 10 == 0:
            job.core.commit_rings()
    for i in range(100):  # counted lost after every push: a new ring each time
        job.pusher.push({'a': torch.zeros(1)}, False)
        job.core.liveness.lose(0, 'silent')
        job.core.commit_rings()
    assert len(job.core.rings.all) <= 1 and len(ring_fds()) <= 1 and ring_maps() - maps0 <= 2
    job.close()
    assert ring_fds() == [] and ring_maps() == maps0
    assert len(os.listdir('/proc/self/fd')) <= fds0 + 1


def test_exactly_once_in_order_with_a_concurrent_committer_and_lost_closes():
    """A writer pushing 3,000 rows of varied sizes into a small ring while another thread commits (with the lock),
    and counts the worker lost now and then (closing the ring under it): each row stored once, in order per ring."""
    job = Job('tensor', ring_mb=32 * 16 / (1 << 20), timeout=5.0)
    job.buffer_size = 1000
    stop = threading.Event()
    rng = random.Random(7)

    def manager():
        k = 0
        while not stop.is_set():
            with job.lock:
                job.core.rings.beat()
                job.core.commit_rings()
                k += 1
                if k % 50 == 0:
                    job.core.liveness.lose(0, 'silent')
            time.sleep(0.0005)

    seen = []
    orig = job.core._ring_push

    def spy(sender, data, batched, envstep, *tentative):
        seen.extend(data['tag'].tolist() if batched else [int(x['tag']) for x in data])
        return orig(sender, data, batched, envstep, *tentative)

    job.core._ring_push = spy
    t = threading.Thread(target=manager, daemon=True)
    t.start()
    i = 0
    try:
        while i < 3000:
            n = rng.randint(1, 20)
            batch = {
                'obs': torch.arange(i, i + n, dtype=torch.float32)[:, None].repeat(1, 3),
                'tag': torch.arange(i, i + n),
                'done': torch.zeros(n, dtype=torch.bool),
            }
            assert job.pusher.push(batch, True) == n
            i += n
    finally:
        stop.set()
        t.join(10)
    job.request('count')
    assert seen == list(range(i))
    job.core._ring_push = orig
    job.close()


def test_a_worker_frozen_past_peer_timeout_learns_what_was_taken_no_hang():
    job = Job('tensor', ring_mb=32 * 4 / (1 << 20), timeout=0.5)
    for i in range(4):
        job.pusher.push(step(i), False)  # full ring
    job.core.liveness.lose(0, 'silent')
    job.core.commit_rings()  # takes 4 rows, closes
    assert job.pusher.push([step(4), step(5)], False) == 2  # a new ring
    assert job.request('count') == 6
    job.close()


def test_manager_shutdown_under_a_waiting_writer_no_hang():
    """The writer waits for room in a full ring; the manager shuts down (close_all takes everything and sets
    FINAL): the writer learns it within its timeout, the rows it did not write go the wire's way (WireRest)."""
    from ding_buffer.distributed.shm_ring import WireRest

    job = Job('tensor', ring_mb=32 * 4 / (1 << 20), timeout=1.0)
    for i in range(4):
        job.pusher.push(step(i), False)
    head = job.pusher.writer.map.head
    res = {}

    def shut():
        time.sleep(0.1)
        with job.lock:
            job.core.shutdown()
            job.core.rings = job.core.rings  # (nothing after shutdown)

    t = threading.Thread(target=shut)
    t.start()
    job.pusher.request = lambda op, **a: (_ for _ in ()).throw(ManagerUnavailableError('gone'))
    try:
        job.pusher.push([step(4), step(5)], False)
    except WireRest as e:
        res['rest'] = [int(x['tag']) for x in e.rest]
    except Exception as e:  # noqa: BLE001
        res['err'] = type(e).__name__
    t.join()
    assert res == {'rest': [4, 5]} and job.buffer.count() == 4
    head = None  # noqa: F841 - the mapping can close
    job.pusher.close()


@pytest.mark.parametrize(
    'kw',
    [dict(remote_buffer_freq=2), dict(async_score=True), dict(local_buffer=True), dict(scoring_only=True),
     dict(baseline_filtering=True, baseline_strategy='min'), dict(scoring_function=lambda b, **k: {}),
     dict(baseline_strategy='ema'), dict(max_version_lag=0), dict(num_shards=3)],
)  # fmt: skip
def test_every_excluded_key_is_refused_by_name(kw):
    with pytest.raises(ValueError, match='shared_memory'):
        build_distributed_config(dict(backend='torch', shared_memory=True, **kw))


@pytest.mark.parametrize(
    'fields',
    [
        [['x', 't', 'float32', [1 << 24, 1 << 24]]],  # product overflow of int64 shapes
        [['x', 't', 'float32', [2] * 9]],
        [['x', 't', 'float32', [True]]],
        [['x', 'i', 'int64', [1]]],
        [['x' * 201, 't', 'float32', []]],
        [['x', 't', 'float32', []]] * 2,
        [[1, 't', 'float32', []]],
        [['x', 'q', 'float32', []]],
        [['x', 't', 'object', []]],
        [['x', 't', 'float32', [2.0]]],
        [['x', 't', 'float32', [], 'extra']],
        [['x', 't', 'float32', []]] * 257,
    ],
)
def test_hostile_layouts_are_refused_and_nothing_changes(fields):
    job = Job('tensor')
    with pytest.raises((ValueError, TypeError)):
        job.request('shm_open', client='c', host=job.pusher.host, fields=fields)
    assert job.core.counters['shm_rings'] == 0 and ring_fds() == []
    job.close()


@pytest.mark.parametrize('client', ['', 'x' * 65, 5, None, ['c']])
def test_a_bad_client_id_is_refused(client):
    job = Job('tensor')
    with pytest.raises(ValueError, match='client'):
        job.request('shm_open', client=client, host=job.pusher.host, fields=[['x', 't', 'float32', []]])
    job.close()


# ====================================================================================== a real runner (in process)
def _runner(n_workers=2, timeout=5.0):
    from in_process import InProcessNet

    from ding_buffer.distributed import ReplayBufferManager
    from ding_buffer.distributed.channel import PeerChannel

    cfg = dict(
        type='advanced',
        replay_buffer_size=10_000,
        storage=dict(type='tensor'),
        distributed=dict(backend='torch', shared_memory=True, shm_ring_mb=0.01, timeout=timeout),
    )
    buf, dcfg, key = build_manager_buffer(cfg)
    wires = {}
    ranks = list(range(1, n_workers + 1))
    mgr = ReplayBufferManager(buf, InProcessNet(0, ranks, wires, timeout), dcfg, ranks, key)
    local_cfg = EasyDict({k: v for k, v in cfg.items() if k != 'distributed'})
    workers = [
        RemoteBuffer(local_cfg, dcfg, PeerChannel(InProcessNet(r, [0], wires, timeout), 0, timeout, 1.0),
                     log_reward_key=key)
        for r in ranks
    ]  # fmt: skip
    LIVE.append(EasyDict(core=mgr.core, pushers=[w.rings for w in workers]))
    return buf, mgr, workers


def test_a_real_runner_stores_every_row_once_and_leaves_nothing():
    buf, mgr, workers = _runner(2)
    out = {}
    th = threading.Thread(target=lambda: out.update(mgr.run(timeout=60)), daemon=True)
    th.start()

    def work(w, base):
        for i in range(300):
            w.push(step(base + i))
            if i % 100 == 99:
                assert w.count() >= i + 1
        w.close()

    ts = [threading.Thread(target=work, args=(w, 1000 * k)) for k, w in enumerate(workers)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]
    th.join(60)
    assert not th.is_alive()
    assert out['counters']['shm_rows'] == 600 and buf.count() == 600
    assert sorted(set(tags(buf))) == sorted(list(range(300)) + list(range(1000, 1300)))
    assert ring_fds() == []


def test_a_runner_whose_run_times_out_still_closes_its_rings():
    """Promise 1/4/5: ``run(timeout)`` raising TimeoutError skips ``core.shutdown()`` (it follows the finally
    block, rank_manager.py:85), so the rings are never closed: the commit thread is stopped, the manager keeps every
    ring's descriptor/mapping, and a worker's pushes within ``distributed.timeout`` (the heartbeat is still fresh)
    return success into a ring nobody reads -- rows lost without an error (a normal end closes the rings, so such
    a push learns it)."""
    buf, mgr, workers = _runner(1, timeout=5.0)
    w = workers[0]
    err = {}

    def run():
        try:
            mgr.run(timeout=1.0)
        except TimeoutError as e:
            err['e'] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    w.push(step(0))  # a ring (shm_open over the wire)
    assert w.count() == 1
    th.join(30)
    assert 'e' in err  # run() gave up
    with pytest.raises(ManagerUnavailableError):  # its ring was closed: the push learns the manager is gone
        w.push(step(1))
    assert len(mgr.core.rings.all) == 0 and buf.count() == 1


def test_scribbles_from_another_thread_during_background_commits():
    """A hostile worker's thread scribbles its header words continuously while a committer thread runs rounds (as
    commit_loop does) and a good worker pushes: the manager never raises, the good rows are stored once, in order."""
    m = Multi('tensor', ring_mb=32 * 64 / (1 << 20), timeout=2.0)
    good = m.pusher(0, 'good')
    evil = m.pusher(1, 'evil', timeout=0.05)
    evil.push(step(10_000), False)
    head = evil.writer.map.head
    stop = threading.Event()
    errors = []
    seen = []
    orig = m.core._ring_push

    def spy(sender, data, batched, envstep, *tentative):
        if sender == 0:
            seen.extend(data['tag'].tolist() if batched else [int(x['tag']) for x in data])
        return orig(sender, data, batched, envstep, *tentative)

    m.core._ring_push = spy

    def scribble():
        rng = random.Random(99)
        while not stop.is_set():
            word = rng.choice([WRITTEN, READ, CLOSED, REFUSED, FINAL, ENVSTEP, ATTACHED])
            head[word] = rng.getrandbits(64) >> rng.randrange(64)

    def committer():
        while not stop.is_set():
            try:
                m.commit()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
            time.sleep(0.0002)

    ts = [threading.Thread(target=scribble, daemon=True), threading.Thread(target=committer, daemon=True)]
    [t.start() for t in ts]
    try:
        for i in range(1500):
            good.push(step(i), False)
    finally:
        stop.set()
        [t.join(10) for t in ts]
    m.request(0, 'count')
    m.core._ring_push = orig
    assert errors == [] and seen == list(range(1500))
    head = None  # noqa: F841 - the mapping can close

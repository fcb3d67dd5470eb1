"""Shared-memory rings in one process: a ``ManagerCore`` with ``distributed.shared_memory`` and a worker's
``RingPusher`` talking to it through ``handle`` (the requests a worker sends over the wire). Rows round-trip with
their types, wrap around a small ring, wait for room within the timeout, and every impossible counter or layout
is refused; nothing shows in ``/dev/shm`` and no ring descriptor stays open. The multi-process faults are in
test_shm_procs.py."""

import contextlib
import os
import threading
import time

import numpy as np
import pytest
import torch

from ding_buffer.distributed import ManagerCore, build_distributed_config
from ding_buffer.distributed.local import build_manager_buffer
from ding_buffer.distributed.protocol import result_of
from ding_buffer.distributed.shm_ring import RingPusher, WireRest, layout_of
from ding_buffer.errors import ManagerTimeoutError, ManagerUnavailableError


def ring_fds():
    """This process's open descriptors of ring memory files."""
    out = []
    for fd in os.listdir('/proc/self/fd'):
        try:
            out += [fd] if 'ding_buffer_ring' in os.readlink(f'/proc/self/fd/{fd}') else []
        except OSError:
            pass
    return out


class Job:
    """A manager core and a worker's ring pusher in one process (the worker's requests go through ``handle``)."""

    def __init__(self, storage='tensor', ring_mb=64.0, timeout=5.0, type_='advanced', **extra):
        cfg = dict(
            type=type_,
            replay_buffer_size=1000,
            storage=dict(type=storage),
            distributed=dict(backend='torch', shared_memory=True, shm_ring_mb=ring_mb, timeout=timeout),
        )
        cfg.update(extra)
        self.buffer, dcfg, key = build_manager_buffer(cfg)
        self.core = ManagerCore(self.buffer, dcfg, key)
        self.ids = 0
        self.lock = threading.Lock()  # serialises the core, as a manager runner does
        self.pusher = RingPusher(self.request, 'client-0', timeout)

    def request(self, op, **args):
        with self.lock:
            self.ids += 1
            return result_of(self.core.handle(0, {'op': op, 'id': self.ids, 'args': args}), op)

    def close(self):
        self.request('exit')
        self.pusher.close()
        self.core.shutdown()


def step(i):
    return {'obs': torch.full((3,), float(i)), 'tag': torch.tensor(i), 'done': torch.tensor(i % 2 == 0)}


@pytest.fixture(autouse=True)
def nothing_left():
    """Rings are memory files: none shows in /dev/shm, and closing every ring closes every descriptor."""
    shm = set(os.listdir('/dev/shm'))
    yield
    assert ring_fds() == []
    assert not [f for f in set(os.listdir('/dev/shm')) - shm if 'ding_buffer' in f]


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_rows_round_trip_with_their_types_and_order(storage):
    job = Job(storage)
    for i in range(20):
        assert job.pusher.push(step(i), False) == 1
    assert job.pusher.push([step(i) for i in range(20, 25)], False) == 5
    assert job.request('count') == 25  # a request of the worker commits its ring first
    out = job.buffer.sample(25, 0)
    rows = out if storage == 'list' else [{k: out[k][j] for k in ('obs', 'tag', 'done')} for j in range(25)]
    assert all(int(x['tag']) >= 0 and x['obs'].tolist() == [float(x['tag'])] * 3 for x in rows)  # whole rows
    assert all(bool(x['done']) == (int(x['tag']) % 2 == 0) for x in rows)
    assert all(isinstance(x['tag'], torch.Tensor) and x['obs'].dtype == torch.float32 for x in rows)
    seen = set()
    for _ in range(40):  # 25 rows stored, all 25 tags among them: each row once
        out = job.buffer.sample(25, 0)
        seen |= {int(x['tag']) for x in out} if storage == 'list' else set(out['tag'].tolist())
    assert seen == set(range(25))
    assert job.core.counters['shm_rows'] == 25 and job.core.counters['shm_rings'] == 1
    job.close()


def test_python_scalars_come_back_as_python_scalars_on_list_storage():
    job = Job('list')
    job.pusher.push({'obs': np.arange(2, dtype=np.float32), 'reward': 1.5, 'step': 3, 'done': True}, False)
    job.core.commit_rings()
    (item,) = job.buffer.sample(1, 0)
    assert type(item['reward']) is float and item['reward'] == 1.5
    assert type(item['step']) is int and type(item['done']) is bool
    assert isinstance(item['obs'], np.ndarray) and item['obs'].dtype == np.float32
    job.close()


def test_a_batched_push_and_a_new_layout_take_a_new_ring_and_keep_the_order():
    job = Job('tensor')
    job.pusher.push(step(0), False)
    batch = {'obs': torch.arange(12.0).reshape(4, 3), 'tag': torch.arange(1, 5), 'done': torch.zeros(4, dtype=bool)}
    assert job.pusher.push(batch, True) == 4
    assert job.core.counters['shm_rings'] == 1  # the same layout: the same ring
    job.pusher.push({'obs': torch.zeros(3), 'tag': torch.arange(3), 'done': torch.zeros(3, dtype=bool)}, True)
    assert job.core.counters['shm_rings'] == 2  # another layout (3 rows whose obs is a scalar): a new ring
    job.core.commit_rings()
    assert job.buffer.count() == 5  # the buffer refused those rows: obs has another shape
    two = {'obs': torch.zeros(2, 3), 'tag': torch.tensor([7, 8]), 'done': torch.zeros(2, dtype=bool)}
    with pytest.raises(ValueError, match=r"refused 3 rows of earlier pushes.*obs"):
        job.pusher.push(two, True)  # (back to the first layout: the refusal is read from the ring it leaves)
    assert job.core.counters['shm_refused_rows'] == 3
    job.pusher.push(two, True)
    assert job.request('count') == 7  # told once; the rings go on
    job.close()


def test_an_empty_batch_goes_to_the_wire_which_refuses_it():
    """A batch of 0 rows is not stored quietly as 0: the wire's push judges it (ValueError, as a local buffer's)."""
    job = Job('tensor')
    job.pusher.push(step(0), False)
    empty = {'obs': torch.zeros(0, 3), 'tag': torch.zeros(0, dtype=torch.int64), 'done': torch.zeros(0, dtype=bool)}
    assert job.pusher.push(empty, True) is None
    with pytest.raises(ValueError, match='batch of size 0'):
        job.request('push', data=empty, batched=True)
    assert job.pusher.push(step(1), False) == 1 and job.request('count') == 2
    job.close()


def test_rows_wrap_around_a_small_ring_and_a_full_ring_waits_then_times_out():
    job = Job('tensor', ring_mb=32 * 10 / (1 << 20), timeout=0.5)  # room for 10 rows of 32 bytes
    for i in range(35):  # committed every 7: the slots wrap around
        job.pusher.push(step(i), False)
        if i % 7 == 6:
            job.core.commit_rings()
    job.core.commit_rings()
    assert job.buffer.count() == 35
    for i in range(10):
        job.pusher.push(step(100 + i), False)
    head, stop = job.pusher.writer.map.head, threading.Event()

    def alive():  # the manager's heartbeat goes on (it is busy, not frozen), but nothing is committed
        while not stop.wait(0.01):
            head[3] = time.monotonic_ns()

    beats = threading.Thread(target=alive)
    beats.start()
    try:
        with pytest.raises(ManagerTimeoutError, match='this push was not written'):
            job.pusher.push(step(200), False)  # no room within the timeout
    finally:
        stop.set()
        beats.join()
    job.core.commit_rings()
    assert job.buffer.count() == 45  # the refused push wrote nothing
    job.close()


def test_a_manager_that_stopped_tending_its_ring_is_reported_unavailable():
    job = Job('tensor', timeout=0.2)
    job.pusher.push(step(0), False)
    time.sleep(0.3)  # no commit thread here: the manager's heartbeat in the ring is older than the timeout
    with pytest.raises(ManagerUnavailableError, match='frozen or gone'):
        job.pusher.push(step(1), False)
    job.core.commit_rings()
    assert job.buffer.count() == 1
    job.close()


@pytest.mark.parametrize('lie', [-1, 1 << 40])
def test_an_impossible_counter_closes_the_ring_and_the_writer_learns_it(lie):
    job = Job('tensor')
    for i in range(3):
        job.pusher.push(step(i), False)
    job.core.commit_rings()
    head = job.pusher.writer.map.head
    head[1] = int(head[1]) + lie if lie > 0 else 1  # past what the ring holds, or back behind what was read
    job.core.commit_rings()
    assert job.core.counters['shm_corrupt_rings'] == 1 and job.buffer.count() == 3
    with pytest.raises(RuntimeError, match='closed'):
        job.pusher.push(step(9), False)
    assert job.request('count') == 3  # the manager serves on
    job.close()


@pytest.mark.parametrize(
    'fields',
    [
        [['x', 't', 'complex64', [1]]],
        [['x', 't', 'float32', [1 << 40]]],
        [['x', 't', 'float32', [-1]]],
        [['x', 'f', 'float32', []]],
        [['x', 't', 'float32', [2]], ['x', 't', 'float32', [2]]],
        [['', 't', 'float32', []]],
        [],
        'fields',
    ],
)
def test_an_impossible_layout_gets_an_error_naming_it_and_changes_nothing(fields):
    job = Job('tensor')
    with pytest.raises(ValueError, match='ring'):
        job.request('shm_open', client='c', host=job.pusher.host, fields=fields)
    assert job.core.counters['shm_rings'] == 0
    job.close()


def test_a_worker_on_another_host_keeps_the_wire():
    job = Job('tensor')
    assert job.request('shm_open', client='c', host='elsewhere/boot', fields=[['x', 't', 'float32', []]]) is None
    pusher = RingPusher(lambda op, **a: job.request(op, **dict(a, host='elsewhere/boot')), 'c', 5.0)
    assert pusher.push(step(0), False) is None and pusher.remote  # for good: no second request
    job.close()


def test_a_manager_without_shared_memory_refuses_rings():
    cfg = dict(type='naive', replay_buffer_size=10, distributed=dict(backend='torch'))
    buffer, dcfg, key = build_manager_buffer(cfg)
    core = ManagerCore(buffer, dcfg, key)
    reply = core.handle(0, {'op': 'shm_open', 'id': 1, 'args': dict(client='c', host='h', fields=[])})
    with pytest.raises(ValueError, match='shared_memory is False'):
        result_of(reply, 'shm_open')


@pytest.mark.parametrize(
    'data, batched',
    [
        ({'obs': {'nested': torch.zeros(2)}}, False),
        ({'obs': torch.zeros(2, dtype=torch.bfloat16)}, False),
        ({'obs': torch.zeros(2, requires_grad=True)}, False),
        ({'obs': 'text'}, False),
        ({'obs': 2**70}, False),
        ([{'a': torch.zeros(2)}, {'a': torch.zeros(3)}], False),
        ([{'a': torch.zeros(2)}, {'b': torch.zeros(2)}], False),
        ({'a': torch.zeros(3, 2), 'b': torch.zeros(4)}, True),
        ({'a': 1.0}, True),
        ({}, False),
        ({'obs': np.zeros(3, dtype='>f4')}, False),  # byte-swapped: its raw bytes would be stored
        ({'obs': torch.eye(3).to_sparse()}, False),
    ],
)
def test_pushes_a_ring_cannot_carry_go_over_the_wire(data, batched):
    assert layout_of(data, batched) is None


@pytest.mark.parametrize(
    'key, value',
    [('async_score', True), ('remote_buffer_freq', 2), ('local_buffer', True), ('max_version_lag', 1),
     ('baseline_strategy', 'min'), ('num_shards', 2)],
)  # fmt: skip
def test_shared_memory_with_a_feature_that_needs_a_reply_is_refused_by_name(key, value):
    with pytest.raises(ValueError, match=f"shared_memory.*{key}"):
        build_distributed_config(dict(backend='torch', shared_memory=True, **{key: value}))


@pytest.mark.parametrize('value', [0, -1.0, float('nan'), 'big', True])
def test_a_bad_ring_size_is_refused_by_name(value):
    with pytest.raises(ValueError, match='shm_ring_mb'):
        build_distributed_config(dict(backend='torch', shared_memory=True, shm_ring_mb=value))


def test_shared_memory_on_a_type_whose_items_are_not_transitions_is_refused():
    with pytest.raises(ValueError, match="shared_memory.*episode"):
        build_manager_buffer(dict(type='episode', distributed=dict(backend='torch', shared_memory=True)))


def test_a_worker_cannot_resize_its_ring_and_nothing_shows_in_dev_shm():
    job = Job('tensor')
    job.pusher.push(step(0), False)
    reply = job.request('shm_open', client='c2', host=job.pusher.host, fields=[['x', 't', 'float32', [2]]])
    for size in (0, 1 << 30):
        with pytest.raises(OSError):
            os.truncate(reply['path'], size)  # sealed: a hostile worker cannot make the manager fault
    assert not [f for f in os.listdir('/dev/shm') if 'ding_buffer' in f]
    job.core.commit_rings()
    assert job.buffer.count() == 1
    job.close()


def test_a_push_that_times_out_wrote_nothing_and_its_retry_stores_it_once():
    job = Job('tensor', ring_mb=32 * 10 / (1 << 20), timeout=0.3)
    for i in range(8):
        job.pusher.push(step(i), False)
    head, stop = job.pusher.writer.map.head, threading.Event()

    def alive():
        while not stop.wait(0.01):
            head[3] = time.monotonic_ns()

    beats = threading.Thread(target=alive)
    beats.start()
    batch = [step(i) for i in range(8, 13)]  # 5 rows, 2 free slots: it waits for room for all 5
    try:
        with pytest.raises(ManagerTimeoutError, match='this push was not written'):
            job.pusher.push(batch, False)
    finally:
        stop.set()
        beats.join()
    job.core.commit_rings()
    assert job.buffer.count() == 8
    job.pusher.push(batch, False)  # the retry
    assert job.request('count') == 13
    job.close()


def test_rows_a_closed_ring_did_not_take_go_over_the_wire_when_no_new_ring_can_be_made():
    job = Job('tensor')
    job.pusher.push(step(0), False)
    job.core.liveness.lose(0, 'silent')
    job.core.commit_rings()  # the ring is closed under the writer
    asked = []
    job.pusher.request = lambda op, **a: asked.append(op)  # no new ring is handed out (None)
    with pytest.raises(WireRest) as e:
        job.pusher.push([step(1), step(2)], False)
    assert asked == ['shm_open'] and e.value.total == 2 and [int(x['tag']) for x in e.value.rest] == [1, 2]
    assert job.buffer.count() == 1
    job.pusher.request = job.request
    job.close()


def test_a_sender_over_its_ring_limit_keeps_the_wire():
    job = Job('tensor')
    got = [job.request('shm_open', client=f'c{i}', host=job.pusher.host, fields=[['x', 't', 'float32', []]])
           for i in range(5)]  # fmt: skip
    assert all(g is not None for g in got[:4]) and got[4] is None
    job.close()


def test_a_worker_that_cannot_map_its_ring_keeps_the_wire():
    job = Job('tensor')

    def request(op, **args):
        reply = job.request(op, **args)
        return dict(reply, path='/proc/self/fd/0') if reply else reply  # not the manager's file

    pusher = RingPusher(request, 'c9', 5.0)
    assert pusher.push(step(0), False) is None and pusher.remote
    assert pusher.push(step(1), False) is None  # for good: no second request
    assert job.core.rings.all == ()  # and the manager let go of the ring it made
    job.close()


def test_a_hostile_refused_counter_cannot_stall_the_other_rings():
    job = Job('tensor')
    job.pusher.push(step(0), False)  # fixes the buffer's schema
    evil = RingPusher(job.request, 'evil', 5.0)
    evil.push({'obs': torch.zeros(3), 'tag': torch.tensor(1)}, False)  # refused by the buffer (no 'done')
    evil.writer.map.head[5] = (1 << 64) - 1  # and its refused counter at the top
    job.pusher.push(step(1), False)
    for _ in range(3):
        job.core.commit_rings()
    assert job.buffer.count() == 2 and job.core.counters['shm_refused_rows'] == 1
    evil.close()
    job.close()


def test_an_exited_sender_gets_no_ring():
    job = Job('tensor')
    job.request('exit')
    assert job.request('shm_open', client='c', host=job.pusher.host, fields=[['x', 't', 'float32', []]]) is None
    job.core.shutdown()


def test_a_refusal_read_as_the_worker_leaves_a_ring_reaches_its_next_push():
    job = Job('tensor')
    job.pusher.push(step(0), False)  # fixes the buffer's schema: obs, tag, done
    job.pusher.push({'obs': torch.zeros(3), 'tag': torch.tensor(1)}, False)  # another layout: a new ring
    assert job.pusher.push(step(1), False) == 1  # back: the manager takes (and refuses) the last ring first
    with pytest.raises(ValueError, match=r"refused 1 rows of earlier pushes.*done.*not written"):
        job.pusher.push(step(2), False)
    job.pusher.push(step(3), False)
    assert job.request('count') == 3 and job.core.counters['shm_refused_rows'] == 1
    job.close()


def test_a_capacity_rule_judges_every_ring_row_as_over_the_wire():
    """The manager committed a ring's rows in one push; more rows than the capacity kept the newest ones whatever
    the rule, so keep_best never judged them. A take is at most the capacity now: the same rows are stored as when
    the same pushes come one by one."""
    from ding_buffer import create_buffer

    rule = dict(replay_buffer_size=50, removers=[dict(type='keep_best', column='priority')], seed=0)
    job = Job('tensor', **rule)
    local = create_buffer(dict(type='advanced', storage=dict(type='tensor'), **rule))
    prio = np.random.default_rng(0).uniform(0.1, 10.0, 400)
    for u in range(400):
        item = {'obs': torch.full((3,), float(u)), 'uid': torch.tensor(u), 'priority': torch.tensor(prio[u])}
        assert job.pusher.push(item, False) == 1
        local.push(item)
    assert job.request('count') == local.count() == 50

    def kept(buf):  # the best 50 have priorities of 9 to 10: 100 draws of 50 see every one
        return sorted(set().union(*(buf.sample(50)['uid'].tolist() for _ in range(100))))

    assert kept(job.buffer) == kept(local) == sorted(np.argsort(-prio, kind='stable')[:50].tolist())
    assert job.core.counters['shm_declined_rows'] > 0
    job.close()


def test_a_take_the_rate_limit_turns_away_is_counted_once_as_over_the_wire():
    """A commit tries a take of several pushes as one push first; when the rate limiter stored none of it, the
    pushes went one by one and the manager counted the rows twice (and the first try as a request). Each row counts
    once, as over the wire, and a refused push of the take (a NaN priority) counts as a request without items."""
    limit = dict(push_sample_rate_limit=dict(max=2.0, min=0.0), window_seconds=30.0, sample_min_limit_ratio=1.0)
    for bad in (False, True):
        job = Job('tensor', type_='advanced', thruput_controller=limit)
        for i in range(2):
            job.request('push', data={'obs': torch.full((3,), float(i)), 'priority': torch.tensor(1.0)})
        job.request('sample', size=2)
        for i in range(4):
            prio = float('nan') if bad and i == 1 else 1.0
            job.pusher.push({'obs': torch.full((3,), float(10 + i)), 'priority': torch.tensor(prio)}, False)
        st = job.request('stats')
        assert st['manager/pushed_items'] == 6 - bad and st['manager/push_requests'] == 2 + 4, (bad, st)
        assert st['manager/shm_rows'] + st['manager/shm_declined_rows'] == 4 - bad
        assert st['manager/shm_refused_rows'] == bad and job.request('count') == 2 + st['manager/shm_rows']
        with pytest.raises(ValueError, match='priority') if bad else contextlib.nullcontext():
            job.pusher.push({'obs': torch.zeros(3), 'priority': torch.tensor(1.0)}, False)
        job.close()


def test_a_push_larger_than_the_capacity_is_judged_whole_as_over_the_wire():
    """Runs of a take never cut a push: a batch of more rows than the capacity, refused for one bad row, was stored
    in part, and kept its best rows under keep_best where one buffer keeps the newest."""
    from ding_buffer import create_buffer

    rule = dict(replay_buffer_size=10, removers=[dict(type='keep_best', column='priority')], seed=0)
    job = Job('tensor', **rule)
    local = create_buffer(dict(type='advanced', storage=dict(type='tensor'), **rule))
    prio = torch.from_numpy(np.random.default_rng(1).uniform(0.1, 10.0, 30))
    batch = {'obs': torch.arange(30.0).reshape(30, 1), 'uid': torch.arange(30), 'priority': prio}
    assert job.pusher.push(batch, True) == 30
    local.extend(batch)
    assert job.request('count') == local.count() == 10
    assert min(job.buffer.sample(10)['uid'].tolist()) >= 20  # the newest ten (uids 20..29), as one buffer
    bad = dict(batch, priority=prio.clone())
    bad['priority'][25] = float('nan')
    with pytest.raises(ValueError):
        local.extend(bad)
    job.pusher.push(bad, True)
    job.request('count')
    with pytest.raises(ValueError, match='refused 30 rows'):
        job.pusher.push(batch, True)
    assert job.core.counters['shm_refused_rows'] == 30
    job.close()


def test_a_buffer_with_capacity_rules_takes_its_ring_push_by_push():
    """Several single pushes in one buffer call let min_priority free two slots at once: both older items left,
    where the same pushes one by one keep the older of them (the second new item evicts the first)."""
    from ding_buffer import create_buffer

    rule = dict(replay_buffer_size=2, removers=[dict(type='min_priority')], seed=0)
    job = Job('tensor', **rule)
    local = create_buffer(dict(type='advanced', storage=dict(type='tensor'), **rule))
    for batch in ((0, 3.0), (1, 3.0)), ((2, 1.0), (3, 1.0)):
        for u, p in batch:
            item = {'obs': torch.full((2,), float(u)), 'uid': torch.tensor(u), 'priority': torch.tensor(p)}
            job.pusher.push(item, False)
            local.push(item)
        job.core.commit_rings()

    def kept(buf):
        return sorted(set().union(*(buf.sample(2)['uid'].tolist() for _ in range(50))))

    assert kept(job.buffer) == kept(local) == [1, 3]
    job.close()


def test_a_take_never_ends_inside_a_push_it_can_hold():
    """A take stopped at its row limit wherever it fell: a push straddling it was stored in part, although the
    buffer refuses it whole (its last row's priority is NaN)."""
    width = 512  # 2 KiB rows: a take holds 4,096 of them
    job = Job('tensor', ring_mb=5000 * (width * 4 + 64) / (1 << 20), replay_buffer_size=10_000, seed=0)

    def batch(lo, n):
        return {'obs': torch.zeros(n, width), 'uid': torch.arange(lo, lo + n), 'priority': torch.ones(n)}

    assert job.pusher.push(batch(0, 4095), True) == 4095
    bad = batch(4095, 3)
    bad['priority'][2] = float('nan')
    assert job.pusher.push(bad, True) == 3
    job.core.commit_rings()
    assert job.buffer.count() == 4095 and job.core.counters['shm_refused_rows'] == 3
    with pytest.raises(ValueError, match='refused 3 rows'):
        job.pusher.push(batch(5000, 1), True)
    longer = batch(6000, 4500)  # longer than a take, shorter than the ring: taken whole
    longer['priority'][-1] = float('nan')
    assert job.pusher.push(longer, True) == 4500
    job.core.commit_rings()
    assert job.buffer.count() == 4095 and job.core.counters['shm_refused_rows'] == 4503
    job.close()


def test_a_bad_envstep_goes_to_the_wire_which_judges_it():
    job = Job('tensor')
    assert job.pusher.push(step(0), False, envstep=1.5) is None
    assert job.pusher.push(step(0), False, envstep=2**61) is None  # beyond what the buffer takes as a step
    assert job.pusher.push(step(0), False, envstep=7) == 1
    job.close()


def test_a_worker_counted_lost_gets_its_rows_taken_and_a_new_ring_when_it_pushes_again():
    job = Job('tensor')
    for i in range(5):
        job.pusher.push(step(i), False)
    job.core.liveness.lose(0, 'silent (frozen)')  # what the manager does after peer_timeout without a heartbeat
    job.core.commit_rings()  # takes the ring's rows, then closes it
    assert job.buffer.count() == 5 and job.core.counters['shm_rings'] == 1
    for i in range(5, 8):  # it thaws: a new ring, nothing lost, nothing twice
        job.pusher.push(step(i), False)
    assert job.core.counters['shm_rings'] == 2
    assert job.request('count') == 8 and job.core.counters['shm_rows'] == 8
    job.close()


def test_a_ring_of_python_scalar_rows_is_bounded_in_rows_not_only_in_bytes():
    """Rows of python scalars become an item dict each when taken: a one-byte row must not let a ring (and so one
    take, under the manager's lock) hold millions of them; a batched layout keeps its rows by bytes."""
    from ding_buffer.distributed.shm_ring import PER_ROW_RING_ROWS, host_id

    job = Job('tensor', ring_mb=16.0)
    scalars = job.request('shm_open', client='a', host=host_id(), fields=[['d', 'b', 'bool', []]])
    arrays = job.request('shm_open', client='b', host=host_id(), fields=[['x', 't', 'uint8', [1]]])
    assert scalars['rows'] == PER_ROW_RING_ROWS < 16 << 20
    assert arrays['rows'] == 16 << 20
    job.close()


def test_a_worker_that_thaws_long_after_its_ring_closed_gets_a_new_ring():
    """The manager's heartbeat in a ring it closed stops: a worker frozen past the timeout must still see the
    closing (and take a new ring), not a manager it takes for frozen or gone."""
    job = Job('tensor', timeout=0.2)
    job.pusher.push(step(0), False)
    job.core.liveness.lose(0, 'silent (frozen)')
    job.core.commit_rings()
    time.sleep(0.3)  # the closed ring's heartbeat is older than the timeout when the worker thaws
    for i in range(1, 4):
        assert job.pusher.push(step(i), False) == 1
    assert job.core.counters['shm_rings'] == 2
    assert job.request('count') == 4 and job.core.counters['shm_rows'] == 4
    job.close()


def test_a_push_under_which_the_manager_closes_the_ring_finishes_in_a_new_one():
    job = Job('tensor', ring_mb=32 * 4 / (1 << 20))  # 4 rows: a push of 10 waits for room twice
    taken = []

    def written(k):  # the ring's writer counter reached k (a wait for the other thread, bounded)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            rings = job.core.rings.all
            if rings and int(rings[0].map.head[1]) >= k:
                return
            time.sleep(0.001)
        raise AssertionError(f'the writer never wrote {k} rows')

    def manager():  # takes the first 4 rows; once 4 more wait, counts the worker lost (closing its ring)
        written(4)
        with job.lock:
            taken.append(job.core.commit_rings())
        written(8)
        with job.lock:
            job.core.liveness.lose(0, 'silent')
            job.core.commit_rings()

    t = threading.Thread(target=manager)
    t.start()
    batch = {'obs': torch.arange(30.0).reshape(10, 3), 'tag': torch.arange(10), 'done': torch.zeros(10, dtype=bool)}
    assert job.pusher.push(batch, True) == 10  # rows 8 and 9 go into a new ring
    t.join()
    assert taken == [4] and job.core.counters['shm_rings'] == 2
    assert job.request('count') == 10 and job.core.counters['shm_rows'] == 10  # each row once
    job.close()


def test_a_worker_whose_layouts_keep_changing_takes_the_wire_and_every_row_is_stored_once_in_order():
    """A reward that is now an int, now a float changes the ring layout on every push: after three rings that each
    took fewer than 64 pushes the worker keeps the wire (its pusher answers None) instead of opening a ring per
    push; rows already in its ring are committed before its next request, so the order holds."""
    job = Job('list')
    sent, wire = [], []
    for i in range(40):
        item = {'tag': torch.tensor(i), 'reward': i if i % 2 else float(i)}
        sent.append(i)
        if job.pusher.push(item, False) is None:
            wire.append(item)
            job.core.handle(0, {'op': 'push', 'id': 1000 + i, 'args': {'data': item}})  # as RemoteBuffer's wire push
    assert job.core.counters['shm_rings'] == 3 and len(wire) == 40 - 3
    assert job.request('count') == 40
    items = job.buffer.state_dict()['storage']['items']  # in the order stored
    assert [int(x['tag']) for x in items] == sent
    assert all(x['reward'] == t and type(x['reward']) is (int if t % 2 else float) for t, x in zip(sent, items))
    job.close()


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_large_columns_go_to_the_buffer_in_place_and_stored_rows_survive_the_ring_wrapping(storage):
    """A batched take hands its large columns (here obs, 512 bytes a row) to the buffer in the ring's own memory;
    the buffer copies them, so the worker's later writes into the same slots change nothing stored."""
    job = Job(storage, ring_mb=(512 + 8) * 24 / (1 << 20), type_='naive')  # room for 24 rows: pushes of 10 wrap
    pushed = []
    for k in range(12):
        obs = torch.randn(10, 128, generator=torch.Generator().manual_seed(k))
        batch = {'obs': obs, 'tag': torch.arange(10 * k, 10 * k + 10)}
        job.pusher.push(batch, True)
        pushed.append(batch)
        job.core.commit_rings()
    assert job.request('count') == 120
    assert job.core.counters['shm_rows'] == 120
    out = job.buffer.sample(120, 0)  # (without replacement)
    if storage == 'list':
        tags, obs = torch.stack([r['tag'] for r in out]), torch.stack([r['obs'] for r in out])
    else:
        tags, obs = out['tag'], out['obs']
    want = torch.cat([b['obs'] for b in pushed])
    assert sorted(tags.tolist()) == list(range(120))
    assert torch.equal(obs, want[tags])
    job.close()


def test_small_columns_of_a_take_are_copies_the_writer_cannot_change_under_the_buffers_checks():
    """What the buffer validates (priorities, rewards, flags: the small columns) is copied out of the ring before
    ``push`` sees it, so a writer that scribbles on rows it handed over cannot slip a NaN priority past the
    checks; large columns are read in place."""
    from ding_buffer.distributed.shm_ring import WRITTEN, RingReader

    fields, n = layout_of({'obs': torch.zeros(4, 128), 'priority': torch.ones(4)}, True)
    ring = RingReader(fields, 8)
    try:
        ring.map.cols['obs'][:4] = 1.0
        ring.map.cols['priority'][:4] = 2.0
        ring.map.head[WRITTEN] = 4  # the writer's counter: 4 rows written
        block, starts, _ = ring.take(8)
        push = ring.as_push(block)
        ring.map.cols['obs'][:4] = 5.0  # the writer scribbles on the rows it handed over
        ring.map.cols['priority'][:4] = float('nan')
        assert torch.equal(push['priority'], torch.full((4,), 2.0))
        assert torch.equal(push['obs'], torch.full((4, 128), 5.0))  # in place: the buffer copies it at push
        del block, push
    finally:
        ring.close()


def test_a_refused_push_that_wraps_around_the_rings_end_drops_only_itself():
    """Takes end at a push's first row before the ring's end, and a push that wraps around it is taken alone: a NaN
    priority in the wrapping push costs that push only, and every other row is stored once."""
    job = Job('tensor', ring_mb=(12 + 8 + 8) * 24 / (1 << 20))  # room for 24 rows of 5-row pushes: the 5th wraps

    def batch(k):
        prio = torch.full((5,), 1.0 + k, dtype=torch.float64)
        prio[-1] = float('nan') if k == 4 else prio[-1]  # the wrapping push's row after the ring's end
        return {'obs': torch.full((5, 3), float(k)), 'tag': torch.arange(5 * k, 5 * k + 5), 'priority': prio}

    for k in range(3):
        job.pusher.push(batch(k), True)
    job.core.commit_rings()
    for k in range(3, 6):  # rows 15..29: push 4 takes slots 20..23 and 0
        job.pusher.push(batch(k), True)
    while job.core.commit_rings():
        pass
    assert job.core.counters['shm_rows'] == 25 and job.core.counters['shm_refused_rows'] == 5
    with pytest.raises(ValueError, match='refused 5 rows'):
        job.pusher.push(batch(6), True)
    assert job.buffer.count() == 25
    seen = set()
    for _ in range(40):  # prioritized draws: every stored row shows up
        seen |= set(job.buffer.sample(25, 0)['tag'].tolist())
    assert sorted(seen) == [t for t in range(30) if not 20 <= t < 25]
    job.close()

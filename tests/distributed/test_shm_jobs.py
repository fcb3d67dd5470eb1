"""The shared-memory push path as a user's job sees it: a real
``ReplayBufferManager`` runner (its commit thread, its lock) serving RemoteBuffers in one process
(``in_process.in_process_job``), with actors pushing through rings next to a learner and wire pushes.
Every wait is bounded; randomness is seeded."""

import contextlib
import os
import random
import sys
import threading
import time

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from in_process import in_process_job  # noqa: E402
from test_shm_ring import ring_fds  # noqa: E402


def n_fds():
    return len(os.listdir('/proc/self/fd'))


def ring_maps():
    with open('/proc/self/maps') as f:
        return sum('ding_buffer_ring' in line for line in f)


def step(i, p=None):
    d = {'obs': torch.full((3,), float(i)), 'tag': torch.tensor(i)}
    if p is not None:
        d['priority'] = torch.tensor(float(p))
    return d


def cfg_of(shm=True, type_='advanced', storage='tensor', size=10_000, ring_mb=1.0, timeout=10.0, **extra):
    return dict(
        type=type_,
        replay_buffer_size=size,
        storage=dict(type=storage),
        distributed=dict(backend='torch', shared_memory=shm, shm_ring_mb=ring_mb, timeout=timeout),
        **extra,
    )


class Jobs:
    """Every job a test started, ended at teardown (workers closed, run thread joined)."""

    def __init__(self):
        self.live = []

    def start(self, cfg, n=1):
        mgr, out, th, workers = in_process_job(cfg, n)
        self.live.append((mgr, th, workers))
        return mgr, out, th, workers

    def end(self):
        for mgr, th, workers in self.live:
            for w in workers:
                try:
                    w.close(timeout=5)
                except Exception:  # noqa: BLE001
                    pass
            th.join(20)


@pytest.fixture
def jobs():
    j = Jobs()
    yield j
    j.end()
    assert ring_fds() == []


def all_tags(buf):
    """Every stored row's tag (a direct read of the manager's buffer, by sampling everything without replacement)."""
    n = buf.count()
    s = buf.sample(n, replace=False) if 'replace' in buf.sample_kwargs else buf.sample(n)
    return sorted(s['tag'].tolist()) if isinstance(s, dict) else sorted(int(x['tag']) for x in s)


def stored(buf, key='tag'):
    """The stored rows' ``key`` values, oldest first (from the buffer's own state)."""
    sd = buf.state_dict()['storage']
    if sd['kind'] == 'tensor':
        names = [s[0][0] for s in sd['schema']]
        return [x if not hasattr(x, 'tolist') else x for x in sd['fields'][names.index(key)].tolist()]
    return [x[key].item() if hasattr(x[key], 'item') else x[key] for x in sd['items']]


# ====================================================================================== 1. a rate-limited buffer
RATE_LIMITED = dict(thruput_controller=dict(push_sample_rate_limit=dict(max=2.0, min=0.0), window_seconds=30.0))


@pytest.mark.parametrize('shm', [False, True])
def test_a_rate_limited_buffer_stores_from_rings_what_it_stores_from_the_wire(jobs, shm):
    """A push/sample ratio limit (``thruput_controller.push_sample_rate_limit.max``) turns a push away by storing
    none of it (no error). 50 rows stored, 30 sampled: the ratio allows 10 more rows, so of 100 single pushes the
    wire stores 10. Through a ring the 100 pushes are committed together (the commit thread waits for the lock, as
    behind a busy manager); the limiter turns the whole commit away, and the manager then applies it push by push:
    the same 10 are stored, the other 90 rows are counted as declined, and no push raises (as on the wire)."""
    mgr, out, th, (actor, learner) = jobs.start(cfg_of(shm=shm, **RATE_LIMITED), 2)
    for i in range(50):
        actor.push(step(i))
    assert actor.count() == 50
    assert learner.sample(30) is not None
    with mgr._lock if shm else contextlib.nullcontext():
        for i in range(50, 150):
            actor.push(step(i))
    assert actor.count() == 60 and stored(mgr.buffer) == list(range(60))
    actor.push(step(150))  # nothing raised for the rows turned away (this one is turned away too)
    st = actor.stats()
    if shm:
        assert st['manager/shm_rows'] == 60 and st['manager/shm_declined_rows'] == 91, st
        assert st['manager/shm_refused_rows'] == 0
        assert st['refused_push_items'] == 191  # the buffer counts the commit's whole try too: 100 more than the wire
    else:
        assert st['refused_push_items'] == 91


@pytest.mark.parametrize('shm', [False, True])
def test_a_refused_push_moves_no_envstep_through_a_ring_as_over_the_wire(jobs, shm):
    """A commit carried one envstep, the last push's: a refused last push (a NaN priority) set the buffer's envstep
    (the monitors' x-axis) where the wire moves nothing. Each push's own envstep travels with its rows now."""
    mgr, out, th, (actor,) = jobs.start(cfg_of(shm=shm), 1)
    actor.push(step(0, 1.0), cur_collector_envstep=1)
    assert actor.count() == 1  # (the ring is open and committed)
    with mgr._lock if shm else contextlib.nullcontext():  # both pushes in one commit
        actor.push(step(1, 1.0), cur_collector_envstep=5)
        with pytest.raises(ValueError) if not shm else contextlib.nullcontext():  # (a ring tells the next push)
            actor.push(step(2, float('nan')), cur_collector_envstep=10)
    assert actor.count() == 2
    assert mgr.buffer.state_dict()['envstep'] == 5
    if shm:
        with pytest.raises(ValueError, match='priority'):
            actor.push(step(3, 1.0), cur_collector_envstep=12)


def test_rows_a_rate_limited_buffer_declines_from_a_ring_one_push_at_a_time_are_counted(jobs):
    """As above with every ring push committed on its own (``count()`` after each commits the actor's ring
    first): 60 rows stored as on the wire, the 90 turned away counted as declined, never as rows that came in."""
    mgr, out, th, (actor, learner) = jobs.start(cfg_of(**RATE_LIMITED), 2)
    for i in range(50):
        actor.push(step(i))
    assert actor.count() == 50
    assert learner.sample(30) is not None
    for i in range(50, 150):
        actor.push(step(i))
        actor.count()
    st = actor.stats()
    assert actor.count() == 60 and st['refused_push_items'] == 90
    assert (st['manager/shm_rows'], st['manager/shm_declined_rows'], st['manager/shm_refused_rows']) == (60, 90, 0)


# ====================================================================================== 2. the learner's view
@pytest.mark.parametrize('storage', ['tensor', 'list'])
def test_a_learners_priority_updates_land_on_the_sampled_rows_while_actors_push(jobs, storage):
    """Two actors push through rings (with a small ring: wraps, back pressure) while a learner samples, checks
    every sampled row is whole (obs == tag, never half-written), and sets each sampled row's priority to a
    function of its tag. Eviction runs (capacity 300 < 1200 rows). At the end every stored row whose priority was
    updated carries the priority of its own tag."""
    rng = random.Random(7)
    mgr, out, th, (a1, a2, learner) = jobs.start(cfg_of(storage=storage, size=300, ring_mb=0.002), 3)
    errors, bad = [], []

    def act(w, base):
        try:
            for i in range(600):
                w.push(step(base + i, p=1.0))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=act, args=(w, 10_000 * k), daemon=True) for k, w in enumerate((a1, a2))]
    [t.start() for t in ts]
    updated = set()

    def learn():
        s = learner.sample(32, timeout=10)
        tags = s['tag'].tolist() if isinstance(s, dict) else [int(x['tag']) for x in s]
        obs = s['obs'] if isinstance(s, dict) else torch.stack([x['obs'] for x in s])
        if not torch.equal(obs, torch.tensor(tags, dtype=torch.float32)[:, None].expand(-1, 3)):
            bad.append(tags)
        prio = [1.0 + (t % 97) for t in tags]
        ids = s['replay_unique_id'] if isinstance(s, dict) else [x['replay_unique_id'] for x in s]
        idx = s['replay_buffer_idx'] if isinstance(s, dict) else [x['replay_buffer_idx'] for x in s]
        learner.update({'replay_unique_id': ids, 'replay_buffer_idx': idx, 'priority': prio})
        updated.update(tags)
        time.sleep(rng.random() * 0.002)

    end = time.monotonic() + 60
    while any(t.is_alive() for t in ts) and time.monotonic() < end:
        learn()
    [t.join(30) for t in ts]
    assert a1.count() == 300
    for _ in range(30):
        learn()
    assert errors == [] and bad == []
    # every stored row's priority, read by sampling the buffer in this process
    seen = {}
    for _ in range(40):
        s = mgr.buffer.sample(300)
        rows = (
            zip(s['tag'].tolist(), s['priority'].tolist())
            if isinstance(s, dict)
            else ((int(x['tag']), float(x['priority'])) for x in s)
        )
        seen.update(rows)
    wrong = {t: p for t, p in seen.items() if t in updated and abs(p - (1.0 + t % 97)) > 1e-3}
    assert wrong == {} and len([t for t in seen if t in updated]) > 20


# ====================================================================================== 3. mixed jobs, layout changes
def _item(kind, i):
    """Pushes of several layouts: two that travel in a ring, two that cannot (a str field, a nested dict)."""
    if kind == 'a':
        return {'obs': torch.full((3,), float(i)), 'tag': torch.tensor(i)}
    if kind == 'b':
        return {'obs': np.full((2,), i, np.float64), 'tag': i, 'done': bool(i % 2)}
    if kind == 's':
        return {'obs': torch.full((3,), float(i)), 'tag': torch.tensor(i), 'name': f'x{i}'}
    return {'obs': {'x': torch.full((3,), float(i))}, 'tag': torch.tensor(i)}


def _tag(x):
    t = x['tag']
    return int(t.item()) if hasattr(t, 'item') else int(t)


def test_ring_and_wire_pushes_of_one_actor_keep_its_order_and_arrive_once(jobs):
    """Actors pushing a random mix of ring layouts (a, b: each switch opens a new ring) and wire-only layouts (a str
    field, a nested dict), singles, lists and batched extends, next to an actor with shared memory off: every row
    is stored once, and each actor's rows are stored in the order it pushed them (naive FIFO over list storage,
    capacity above the total)."""
    rng = random.Random(3)
    mgr, out, th, workers = jobs.start(cfg_of(type_='naive', storage='list', size=100_000, ring_mb=0.01), 3)
    fd0 = n_fds()
    errors = []
    pushed = {k: [] for k in range(3)}

    def act(k, w):
        try:
            i = k * 100_000
            for _ in range(400):
                kind = rng.choice('aabbsn') if k < 2 else rng.choice('as')
                how = rng.choice(['one', 'list', 'extend']) if kind == 'a' else rng.choice(['one', 'list'])
                n = 1 if how == 'one' else rng.randint(1, 5)
                items = [_item(kind, i + j) for j in range(n)]
                if how == 'one':
                    w.push(items[0])
                elif how == 'list':
                    w.push(items)
                else:
                    w.extend(
                        {'obs': torch.stack([x['obs'] for x in items]), 'tag': torch.stack([x['tag'] for x in items])}
                    )
                pushed[k] += list(range(i, i + n))
                i += n
            w.close()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    workers[2].rings = None  # this actor keeps the wire (as one on another host does)
    ts = [threading.Thread(target=act, args=(k, w), daemon=True) for k, w in enumerate(workers)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    th.join(30)
    assert errors == [] and not th.is_alive()
    got = [_tag(x) for x in mgr.buffer.state_dict()['storage']['items']]
    assert len(got) == len(set(got)) == sum(len(v) for v in pushed.values())
    for k in range(3):
        mine = [t for t in got if k * 100_000 <= t < (k + 1) * 100_000]
        assert mine == pushed[k]
    assert out['counters']['shm_rows'] > 0
    assert ring_fds() == [] and ring_maps() == 0
    assert n_fds() <= fd0 + 2


def _stored_rows(shm, push):
    cfg = cfg_of(shm=shm, type_='naive', storage='list', size=100)
    mgr, out, th, (w,) = in_process_job(cfg, 1)
    try:
        push(w)
        w.count()
        items = mgr.buffer.state_dict()['storage']['items']
        return [
            {
                k: (type(v).__name__, str(getattr(v, 'dtype', '')), np.shape(v), np.asarray(v).tolist())
                for k, v in x.items()
            }
            for x in items
        ]
    finally:
        w.close()
        th.join(20)


def test_a_batched_extend_of_numpy_columns_is_stored_as_over_the_wire():
    """List storage, ``extend`` of numpy columns of shape (B,): each stored row's field is a numpy scalar, through
    a ring as over the wire (a batched (B,) column announces numpy scalars, single items of 0-d arrays announce
    arrays)."""
    batch = lambda w: w.extend({'obs': np.arange(3, dtype=np.float32), 'tag': np.arange(3)})  # noqa: E731
    assert _stored_rows(True, batch) == _stored_rows(False, batch)


# ====================================================================================== 4. buffer types, capacity
def _final_tags(shm, type_, storage, size, pushes, ring_mb=1.0, hold=False):
    mgr, out, th, (w,) = in_process_job(cfg_of(shm=shm, type_=type_, storage=storage, size=size, ring_mb=ring_mb), 1)
    try:
        w.push(step(-1))  # the ring is opened (a request) before the manager is held
        w.count()
        with mgr._lock if hold else contextlib.nullcontext():  # hold: the ring's pushes are committed together
            for kind, lo, hi, env in pushes:
                if kind == 'extend':
                    w.extend(
                        {
                            'obs': torch.arange(lo, hi, dtype=torch.float32)[:, None].expand(-1, 3).clone(),
                            'tag': torch.arange(lo, hi),
                        },
                        env,
                    )
                elif kind == 'list':
                    w.push([step(i) for i in range(lo, hi)], env)
                else:
                    w.push(step(lo), env)
        c = w.count()
        return c, stored(mgr.buffer), mgr.buffer._last_envstep
    finally:
        w.close()
        th.join(20)


PUSHES = [('extend', 0, 50, 3), ('one', 50, 51, 4), ('list', 51, 76, 5), ('one', 76, 77, 6), ('extend', 77, 80, 7)]


@pytest.mark.parametrize('type_', ['naive', 'advanced'])
@pytest.mark.parametrize('storage', ['list', 'tensor'])
@pytest.mark.parametrize('hold', [False, True])
def test_pushes_larger_than_the_capacity_leave_what_the_wire_leaves(type_, storage, hold):
    """Capacity 10; pushes of 50, 1, 25, 1, 3 rows (with envsteps), a ring of 0.002 MiB (a 50-row push goes in
    parts): the stored rows (newest 10), their order and the buffer's last envstep are those of the wire."""
    ring = _final_tags(True, type_, storage, 10, PUSHES, ring_mb=0.002 if not hold else 1.0, hold=hold)
    wire = _final_tags(False, type_, storage, 10, PUSHES)
    assert ring == wire


# ====================================================================================== 5. a busy manager, shutdowns
def _slow_metadata(buffer):
    time.sleep(3.0)  # a long request of the learner's (here a slow metadata_function; a large save_data alike)
    return {}


def test_a_busy_manager_is_not_reported_gone_to_actors_pushing_into_rooms_rings(jobs):
    """A learner's request that holds the manager longer than ``timeout`` (2 s here) does not make an actor's push
    into a ring with room raise ManagerUnavailableError: the ring thread keeps stamping the heartbeat while it
    waits for the manager's lock."""
    cfg = cfg_of(timeout=2.0)
    cfg['distributed']['metadata_function'] = _slow_metadata
    mgr, out, th, (actor, learner) = jobs.start(cfg, 2)
    actor.push(step(0))
    assert actor.count() == 1
    res = {}

    def slow():
        try:
            res['meta'] = learner._request('metadata', timeout=10)
        except Exception as e:  # noqa: BLE001
            res['meta'] = e

    t = threading.Thread(target=slow, daemon=True)
    t.start()
    time.sleep(2.6)  # the learner's request holds the manager's lock for 3 s
    errs = []
    try:
        actor.push(step(1))  # the ring has room for it
    except Exception as e:  # noqa: BLE001
        errs.append(e)
    t.join(15)
    assert errs == []
    assert actor.count() == 2


def test_close_twice_and_a_push_after_close(jobs):
    mgr, out, th, (actor, other) = jobs.start(cfg_of(), 2)
    actor.push(step(0))
    actor.close()
    actor.close()  # idempotent
    with pytest.raises(RuntimeError):
        actor.push(step(1))
    with pytest.raises(RuntimeError):
        actor.extend({'obs': torch.zeros(2, 3), 'tag': torch.arange(2)})
    assert other.count() == 1
    other.close()
    th.join(20)
    assert not th.is_alive() and out['counters']['shm_rows'] == 1 and ring_fds() == []


def test_an_actor_pushing_when_the_manager_ends_learns_it_within_a_bounded_time(jobs):
    """The learner and the manager end (run() times out) while an actor keeps pushing through its ring: the actor's
    push fails within a few timeouts (never hangs, never keeps succeeding into a ring nobody reads), and every row
    a push returned for is stored."""
    cfg = cfg_of(timeout=1.0)
    mgr, out, th, workers = in_process_job(cfg, 2)  # (run() of in_process_job has a 60 s timeout: its own)
    actor, learner = workers
    jobs.live.append((mgr, th, [learner]))
    ok, err = [], []
    stop = threading.Event()

    def act():
        i = 0
        while not stop.is_set():
            try:
                actor.push(step(i))
                ok.append(i)
                i += 1
            except Exception as e:  # noqa: BLE001
                err.append(e)
                return

    t = threading.Thread(target=act, daemon=True)
    t.start()
    time.sleep(0.5)
    learner.close()
    mgr.transport.close(0.1)  # the manager's end of the job (its transport goes; run() then ends)
    t.join(15)
    stop.set()
    th.join(30)
    assert err, 'the actor kept pushing for 15 s after the manager ended'
    assert set(ok) <= set(stored(mgr.buffer)) or len(stored(mgr.buffer)) == mgr.buffer.replay_buffer_size


# ====================================================================================== 6. Ray
@pytest.mark.slow
@pytest.mark.parametrize('shm', [False, True])
def test_ray_task_pushing_through_a_ring_and_returning_without_close(shm):
    """A Ray task on the manager's node pushes 200 rows through its ring and returns without ``close()`` (its
    RemoteBuffer is dropped); then a second such task. Every row is stored once, both tasks are counted as
    exited or lost, and a learner (the driver) sees all of them."""
    import uuid

    import ray
    from helpers import ray_init_local

    from ding_buffer import create_buffer

    ray_init_local(os.path.dirname(os.path.abspath(__file__)))
    try:
        dist = dict(
            backend='ray',
            actor_name=f'rv_{uuid.uuid4().hex[:10]}',
            namespace='ding_buffer_shm_jobs',
            timeout=20,
            startup_timeout=90,
            shared_memory=shm,
            heartbeat_seconds=0.5,
            peer_timeout=3.0,
        )
        cfg = dict(type='naive', replay_buffer_size=10_000, storage=dict(type='tensor'), distributed=dist)
        drv = create_buffer(cfg)

        def push_and_return(cfg, wid, shm):
            import torch as t

            from ding_buffer import create_buffer as cb

            buf = cb(cfg)
            for i in range(200):
                buf.push({'obs': t.full((3,), float(i)), 'tag': t.tensor(wid * 1000 + i)})
            return (buf.rings is not None and buf.rings.writer is not None) == shm

        task = ray.remote(max_retries=0)(push_and_return)
        assert ray.get(task.remote(cfg, 1, shm), timeout=90) is True
        assert ray.get(task.remote(cfg, 2, shm), timeout=90) is True
        deadline = time.monotonic() + 30
        while drv.count() < 400 and time.monotonic() < deadline:
            time.sleep(0.2)
        s = drv.sample(drv.count(), replace=False)
        tags = sorted(s['tag'].tolist())
        assert tags == list(range(1000, 1200)) + list(range(2000, 2200))
        st = drv.stats()
        assert st.get('manager/shm_rows', 400 if shm else 0) == (400 if shm else 0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # both tasks' clients are let go of (lost: no close)
            summ = ray.get(ray.get_actor(dist['actor_name'], namespace=dist['namespace']).summary.remote(), timeout=20)
            if len(summ.get('lost', [])) + len(summ.get('exited', [])) >= 2:
                break
            time.sleep(0.5)
        assert len(summ.get('lost', [])) + len(summ.get('exited', [])) >= 2, summ
        drv.close()
    finally:
        try:
            ray.kill(ray.get_actor(dist['actor_name'], namespace=dist['namespace']))
        except Exception:  # noqa: BLE001
            pass
        ray.shutdown()


def test_a_dropped_remote_buffer_with_shared_memory_is_freed_at_once(jobs):
    """A RemoteBuffer dropped without ``close()`` (a Ray task returning, a worker function's local) is freed by
    reference counting with shared memory too (its ring pusher holds no reference back to it), so its channel's
    heartbeat stops and the manager counts it lost, as without shared memory."""
    import gc
    import weakref

    mgr, out, th, workers = jobs.start(cfg_of(), 1)
    w = workers.pop()
    jobs.live[-1][2].clear()
    w.push(step(0))
    assert w.count() == 1
    ref = weakref.ref(w)
    del w
    alive = ref() is not None
    gc.collect()
    mgr.transport.close(0.1)  # the job ends (run() closes its rings)
    th.join(30)
    assert not alive

"""Ray backend of the distributed buffer: a named manager actor (get-or-create) served to Ray tasks and the driver.

One small local Ray instance for the whole module (2 CPUs); every actor has a unique name and is killed at the
end of its test. Task bodies live in ``ray_helpers`` (importable by the Ray workers through PYTHONPATH).
"""
import os
import re
import sys
import time
import uuid

import pytest
import torch

try:
    import ray
except ImportError:  # pragma: no cover - depends on the environment
    if os.environ.get('CI'):
        raise  # CI must have ray: fail loudly instead of skipping
    pytest.skip('ray is not installed', allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # e.g. --import-mode=importlib
    sys.path.insert(0, HERE)

import ray_helpers  # noqa: E402
from ray_helpers import Tag, rows  # noqa: E402

from ding_buffer import create_buffer  # noqa: E402
from ding_buffer.distributed import ManagerUnavailableError  # noqa: E402

GET = 60  # seconds: upper bound of every ray.get


@pytest.fixture(scope='module', autouse=True)
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    # the Ray processes inherit the environment of the raylet started here: put ray_helpers on their path
    # (cheaper than a runtime_env per worker), then restore the driver's environment
    old = os.environ.get('PYTHONPATH')
    os.environ['PYTHONPATH'] = os.pathsep.join(p for p in (HERE, old) if p)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:
        if old is None:
            os.environ.pop('PYTHONPATH', None)
        else:
            os.environ['PYTHONPATH'] = old
    yield
    ray.shutdown()


@pytest.fixture
def actors():
    """``actors(**distributed)`` -> a distributed section with a unique actor name; kills them all afterwards."""
    made = []

    def make(**kw):
        d = dict(backend='ray', actor_name=f'test_{uuid.uuid4().hex[:12]}', namespace='ding_buffer_test', timeout=20)
        d.update(kw)
        made.append((d['actor_name'], d['namespace']))
        return d

    yield make
    for name, ns in made:
        try:
            ray.kill(ray.get_actor(name, namespace=ns), no_restart=True)
        except ValueError:
            pass


def remote(fn):
    return ray.remote(max_retries=0)(fn)


def row_set(obs):
    return {tuple(r) for r in obs.tolist()}


def actor_gone(name, ns, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=ns)
        except ValueError:
            return True
        time.sleep(0.1)
    return False


def advanced(dist, size=100):
    return dict(type='advanced', replay_buffer_size=size, seed=0, storage=dict(type='tensor'), distributed=dist)


def naive_tensor(dist, size=100):
    return dict(type='naive', replay_buffer_size=size, seed=0, storage=dict(type='tensor'), distributed=dist)


# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_manager_actor_and_two_worker_tasks(actors):
    torch.manual_seed(0)
    cfg = advanced(actors())
    drv = create_buffer(cfg)  # creates the actor (owned by the driver)
    assert type(drv).__name__ == 'RemoteBuffer'
    steps, batch = 3, 4
    task = remote(ray_helpers.worker_push_sample_update)
    out = ray.get([task.remote(cfg, w, steps, batch) for w in range(2)], timeout=GET)

    pushed = set()
    for w in range(2):
        pushed |= row_set(rows(w, 0, batch)['obs']) | row_set(rows(w, 1, batch)['obs']) | row_set(rows(w, 2, batch)['obs'])
    assert len(pushed) == 2 * steps * batch
    for w, o in enumerate(out):
        assert o['kind'] == 'RemoteBuffer'
        assert o['stored'] == [batch] * steps
        assert o['update'] == {'updated': 4, 'stale': 0}
        assert o['sampled_obs'].shape == (4, 3)
        assert row_set(o['sampled_obs']) <= pushed

    assert drv.count() == 2 * steps * batch
    s = drv.sample(16)
    assert s['obs'].shape == (16, 3) and row_set(s['obs']) <= pushed
    # the tags travel with the rows: wid / step columns agree with obs
    assert torch.equal(s['wid'].float(), s['obs'][:, 0]) and torch.equal(s['step'].float(), s['obs'][:, 1])
    st = drv.stats()
    assert st['manager/push_requests'] == 2 * steps
    assert st['manager/pushed_items'] == 2 * steps * batch
    assert st['manager/exited'] == 2
    assert st['manager/sample_requests'] >= 3
    assert st['manager/errors'] == 0
    assert st['updated'] == 8
    assert st['max_priority'] == 3.0  # worker 1 set priority 1 + 2
    drv.close()
    with pytest.raises(RuntimeError, match='closed'):
        drv.count()


@pytest.mark.timeout(60)
def test_get_or_create_same_name_shares_data_other_name_or_namespace_does_not(actors):
    d = actors()
    a = create_buffer(naive_tensor(d))
    b = create_buffer(naive_tensor(d))
    # created before the first call so that the three actors start in parallel
    other_ns = create_buffer(naive_tensor(actors(actor_name=d['actor_name'], namespace='ding_buffer_test_other')))
    other_name = create_buffer(naive_tensor(actors(namespace=d['namespace'])))
    a.push(rows(7, 0, 5), batched=True)
    assert b.count() == 5
    assert row_set(b.sample(5)['obs']) == row_set(rows(7, 0, 5)['obs'])
    b.push(rows(8, 0, 2), batched=True)
    assert a.count() == 7

    assert other_ns.count() == 0 and other_name.count() == 0
    other_ns.push(rows(9, 0, 1), batched=True)
    assert other_ns.count() == 1 and a.count() == 7 and other_name.count() == 0
    h1 = ray.get_actor(d['actor_name'], namespace=d['namespace'])
    h2 = ray.get_actor(d['actor_name'], namespace='ding_buffer_test_other')
    assert h1._actor_id != h2._actor_id
    for buf in (a, b, other_ns, other_name):
        buf.close()


@pytest.mark.timeout(60)
def test_async_score_is_one_push_stale(actors):
    cfg = naive_tensor(actors(async_score=True, scoring_function='ray_helpers:stored_count'))
    buf = create_buffer(cfg)
    assert buf.push(rows(0, 0, 3), batched=True) == 3
    assert buf.last_score is None  # nothing answered yet
    buf.push(rows(0, 1, 3), batched=True)
    assert buf.last_score == {'n_stored': 3, 'stored': 3}  # the score of push 1
    buf.push(rows(0, 2, 3), batched=True)
    assert buf.last_score == {'n_stored': 6, 'stored': 3}  # the score of push 2
    assert buf.drain_pending_score(timeout=10) == {'n_stored': 9, 'stored': 3}
    assert buf.last_score == {'n_stored': 9, 'stored': 3}
    assert buf.drain_pending_score(timeout=10) is None  # nothing outstanding
    assert buf.count() == 9
    buf.close()


@pytest.mark.timeout(60)
def test_baseline_min_on_full_prioritized_gfn_buffer(actors):
    gen = torch.Generator().manual_seed(0)
    cap = 8
    cfg = dict(type='gfn', replay_buffer_size=cap, prioritized_capacity=True, seed=0,
               distributed=actors(baseline_strategy='min'))
    buf = create_buffer(cfg)
    pushed = []
    batches = [torch.randn(5, generator=gen) for _ in range(3)]
    for i, lr in enumerate(batches):
        buf.push({'state': torch.randn(5, 2, generator=gen), 'log_reward': lr})
        pushed.append(lr)
        allr = torch.cat(pushed)
        if i == 0:  # not full yet: the EMA of the incoming minima, whose first value is the minimum
            assert len(allr) < cap
            assert buf.last_score['baseline_log_reward'] == pytest.approx(float(lr.min()), abs=1e-6)
        else:  # full: the minimum of the top-capacity log-rewards
            expected = float(torch.topk(allr, cap).values.min())
            assert buf.last_score['baseline_log_reward'] == pytest.approx(expected, abs=1e-6)
            assert buf.baseline_log_reward == pytest.approx(expected, abs=1e-6)
    assert buf.count() == cap
    assert buf.metadata()['baseline_log_reward'] == pytest.approx(float(torch.topk(allr, cap).values.min()), abs=1e-6)
    buf.close()


@pytest.mark.timeout(60)
def test_exit_counting_checkpoint_and_actor_end(actors, tmp_path):
    path = str(tmp_path / 'manager_ckpt.pt')
    d = actors(num_workers=2, checkpoint_path=path)
    cfg = naive_tensor(d)
    drv = create_buffer(cfg)  # the driver attaches (and owns the actor) but never sends EXIT
    steps, batch = 2, 3
    task = remote(ray_helpers.worker_push_close)
    first = ray.get(task.remote(cfg, 0, steps, batch), timeout=GET)
    assert first == 0
    assert not os.path.exists(path)  # one EXIT of two: still serving
    assert drv.stats()['manager/exited'] == 1
    assert drv.count() == steps * batch
    assert ray.get(task.remote(cfg, 1, steps, batch), timeout=GET) == 1

    assert os.path.exists(path)
    assert actor_gone(d['actor_name'], d['namespace'], within=10)
    local_cfg = {k: v for k, v in cfg.items() if k != 'distributed'}
    local = create_buffer(local_cfg)
    local.load_data(path)
    n = 2 * steps * batch
    assert local.count() == n
    got = local.sample(n)['obs']  # naive samples without replacement: every stored row once
    expected = torch.cat([rows(w, s, batch)['obs'] for w in range(2) for s in range(steps)])
    assert sorted(got.tolist()) == sorted(expected.tolist())
    local.close()
    with pytest.raises(ManagerUnavailableError):
        drv.count()


@pytest.mark.timeout(60)
def test_killed_manager_raises_manager_unavailable(actors):
    d = actors(timeout=5)
    cfg = naive_tensor(d, size=1000)
    drv = create_buffer(cfg)
    ref = remote(ray_helpers.worker_push_until_unavailable).remote(cfg, 3, 30)
    deadline = time.monotonic() + 30
    while drv.count() < 3:
        assert time.monotonic() < deadline, 'the worker task never pushed'
        time.sleep(0.05)
    ray.kill(ray.get_actor(d['actor_name'], namespace=d['namespace']), no_restart=True)
    out = ray.get(ref, timeout=GET)
    assert out['error'] == 'ManagerUnavailableError', out
    assert f"{d['namespace']}/{d['actor_name']}" in out['message']
    assert out['seconds'] < 5 + 5
    assert out['pushes'] >= 3
    t0 = time.monotonic()
    with pytest.raises(ManagerUnavailableError, match=re.escape(f"{d['namespace']}/{d['actor_name']}")):
        drv.push(rows(0, 0, 1), batched=True)
    assert time.monotonic() - t0 < 5 + 5
    with pytest.raises(ManagerUnavailableError):
        drv.close()  # EXIT cannot be delivered; closed locally anyway
    with pytest.raises(RuntimeError, match='closed'):
        drv.count()


@pytest.mark.timeout(60)
def test_dead_worker_does_not_disturb_the_others(actors):
    cfg = naive_tensor(actors())
    drv = create_buffer(cfg)
    with pytest.raises(ray.exceptions.RayError):  # WorkerCrashedError: the process exited mid-task
        ray.get(remote(ray_helpers.worker_push_then_die).remote(cfg, 5, 2, 3), timeout=GET)
    assert drv.count() == 6  # its acknowledged pushes are stored
    assert ray.get(remote(ray_helpers.worker_push_close).remote(cfg, 6, 2, 3), timeout=GET) == 6
    drv.push(rows(7, 0, 2), batched=True)
    assert drv.count() == 14
    got = drv.sample(14)
    expected = torch.cat([rows(5, 0, 3)['obs'], rows(5, 1, 3)['obs'], rows(6, 0, 3)['obs'], rows(6, 1, 3)['obs'],
                          rows(7, 0, 2)['obs']])
    assert sorted(got['obs'].tolist()) == sorted(expected.tolist())
    st = drv.stats()
    assert st['manager/exited'] == 1 and st['manager/push_requests'] == 5 and st['manager/errors'] == 0
    drv.close()


@pytest.mark.timeout(60)
def test_allow_pickle_gates_python_objects(actors):
    items = [{'k': frozenset({1, 2}), 'obj': Tag(3), 'x': torch.tensor([1.0])},
             {'k': frozenset({4}), 'obj': Tag('a'), 'x': torch.tensor([2.0])}]
    plain = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0, distributed=actors()))
    pick = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0, distributed=actors(allow_pickle=True)))
    with pytest.raises(TypeError, match='allow_pickle'):
        plain.push(items)
    assert plain.count() == 0 and plain.stats()['manager/push_requests'] == 0
    plain.push([{'x': torch.tensor([5.0])}])  # still usable for tensors
    assert plain.count() == 1
    plain.close()

    assert pick.push(items) == 2
    assert pick.last_score['stored'] == 2
    got = pick.sample(2)
    assert isinstance(got, list) and len(got) == 2
    got = sorted(got, key=lambda it: float(it['x']))
    for g, want in zip(got, items):
        assert g['k'] == want['k'] and g['obj'] == want['obj'] and isinstance(g['obj'], Tag)
        assert torch.equal(g['x'], want['x'])
    pick.close()


@pytest.mark.timeout(60)
def test_model_version_gating_rejects_stale_pushes(actors):
    cfg = naive_tensor(actors(max_version_lag=1))
    learner = create_buffer(cfg)
    worker = create_buffer(cfg)
    assert learner.update_model_version(5, session_id='s1') == {'model_version': 5, 'session_id': 's1', 'cleared': 0}

    worker.set_model_version(3, session_id='s1')  # lag 2 > 1: refused
    worker.push(rows(1, 0, 4), batched=True)
    assert worker.last_score['rejected_stale'] == 4 and worker.last_score['stored'] == 0
    assert learner.count() == 0

    worker.set_model_version(4, session_id='s1')  # lag 1: accepted
    worker.push(rows(1, 1, 4), batched=True)
    assert worker.last_score['stored'] == 4 and 'rejected_stale' not in worker.last_score
    worker.set_model_version(5, session_id='other')  # another session: refused
    worker.push(rows(1, 2, 2), batched=True)
    assert worker.last_score['rejected_stale'] == 2
    assert learner.count() == 4
    assert row_set(learner.sample(4)['obs']) == row_set(rows(1, 1, 4)['obs'])
    st = learner.stats()
    assert st['manager/rejected_stale'] == 6 and st['manager/model_version'] == 5
    assert learner.metadata()['model_version'] == 5

    # a new session clears the old session's data (MineStudio)
    assert learner.update_model_version(6, session_id='s2') == {'model_version': 6, 'session_id': 's2', 'cleared': 4}
    assert learner.count() == 0
    learner.close()
    worker.close()


@pytest.mark.timeout(60)
def test_state_dict_round_trips_without_pickle(actors):
    cfg = naive_tensor(actors())
    buf = create_buffer(cfg)
    buf.push(rows(2, 0, 4), batched=True)
    state = buf.state_dict()
    local = create_buffer({k: v for k, v in cfg.items() if k != 'distributed'})
    local.load_state_dict(state)
    assert local.count() == 4
    buf.clear()
    buf.load_state_dict(state)
    assert buf.count() == 4
    buf.close()

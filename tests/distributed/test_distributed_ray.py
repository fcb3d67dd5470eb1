"""Ray backend of the distributed buffer: a named manager actor (get-or-create) served to Ray tasks and the driver.

One small local Ray instance for the whole module (2 CPUs); every actor has a unique name and is killed at the
end of its test. Task bodies live in ``ray_helpers`` (importable by the Ray workers through PYTHONPATH).
The hardening tests at the end cover message limits and garbage, lost workers (killed, or returned without
close) and the actor's own end, bounded start-up, torch.save of results, the manager's file and pickle
safety, and retried pushes stored once.
"""

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
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
from helpers import REPO_ROOT, pythonpath, ray_init_local  # noqa: E402
from ray_helpers import Tag, rows  # noqa: E402

from ding_buffer import create_buffer  # noqa: E402
from ding_buffer.distributed import CodecError, ManagerUnavailableError, decode, encode  # noqa: E402
from ding_buffer.errors import ManagerTimeoutError  # noqa: E402

pytestmark = pytest.mark.slow  # every test runs on a local Ray cluster (its processes), started per module
GET = 60  # seconds: upper bound of every ray.get


@pytest.fixture(scope='module', autouse=True)
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray_init_local(HERE)  # ray_helpers (and the checkout's ding_buffer) on its processes' path
    yield
    ray.shutdown()


@pytest.fixture
def actors():
    """``actors(**distributed)`` -> a distributed section with a unique actor name; kills them all afterwards."""
    made = []

    def make(**kw):
        # start-up (a new actor process importing torch) gets its own bound: tests with a short call timeout
        # must not fail while the actor starts on a busy machine
        d = dict(
            backend='ray',
            actor_name=f'test_{uuid.uuid4().hex[:12]}',
            namespace='ding_buffer_test',
            timeout=20,
            startup_timeout=GET,
        )
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
        pushed |= (
            row_set(rows(w, 0, batch)['obs']) | row_set(rows(w, 1, batch)['obs']) | row_set(rows(w, 2, batch)['obs'])
        )
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
    assert buf.pushes.last_score is None  # nothing answered yet
    buf.push(rows(0, 1, 3), batched=True)
    assert buf.pushes.last_score == {'n_stored': 3, 'stored': 3}  # the score of push 1
    buf.push(rows(0, 2, 3), batched=True)
    assert buf.pushes.last_score == {'n_stored': 6, 'stored': 3}  # the score of push 2
    assert buf.drain_pending_score(timeout=10) == {'n_stored': 9, 'stored': 3}
    assert buf.pushes.last_score == {'n_stored': 9, 'stored': 3}
    assert buf.drain_pending_score(timeout=10) is None  # nothing outstanding
    assert buf.count() == 9
    buf.close()


@pytest.mark.timeout(60)
def test_baseline_min_on_full_prioritized_gfn_buffer(actors):
    gen = torch.Generator().manual_seed(0)
    cap = 8
    cfg = dict(
        type='gfn',
        replay_buffer_size=cap,
        prioritized_capacity=True,
        seed=0,
        distributed=actors(baseline_strategy='min'),
    )
    buf = create_buffer(cfg)
    pushed = []
    batches = [torch.randn(5, generator=gen) for _ in range(3)]
    for i, lr in enumerate(batches):
        buf.push({'state': torch.randn(5, 2, generator=gen), 'log_reward': lr})
        pushed.append(lr)
        allr = torch.cat(pushed)
        if i == 0:  # not full yet: the EMA of the incoming minima, whose first value is the minimum
            assert len(allr) < cap
            assert buf.pushes.last_score['baseline_log_reward'] == pytest.approx(float(lr.min()), abs=1e-6)
        else:  # full: the minimum of the top-capacity log-rewards
            expected = float(torch.topk(allr, cap).values.min())
            assert buf.pushes.last_score['baseline_log_reward'] == pytest.approx(expected, abs=1e-6)
            assert buf.pushes.baseline_log_reward == pytest.approx(expected, abs=1e-6)
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
    expected = torch.cat(
        [rows(5, 0, 3)['obs'], rows(5, 1, 3)['obs'], rows(6, 0, 3)['obs'], rows(6, 1, 3)['obs'], rows(7, 0, 2)['obs']]
    )
    assert sorted(got['obs'].tolist()) == sorted(expected.tolist())
    st = drv.stats()
    assert st['manager/exited'] == 1 and st['manager/push_requests'] == 5 and st['manager/errors'] == 0
    drv.close()


@pytest.mark.timeout(60)
def test_allow_pickle_gates_python_objects(actors):
    items = [
        {'k': frozenset({1, 2}), 'obj': Tag(3), 'x': torch.tensor([1.0])},
        {'k': frozenset({4}), 'obj': Tag('a'), 'x': torch.tensor([2.0])},
    ]
    plain = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0, distributed=actors()))
    pick = create_buffer(dict(type='naive', replay_buffer_size=10, seed=0, distributed=actors(allow_pickle=True)))
    with pytest.raises(TypeError, match='allow_pickle'):
        plain.push(items)
    assert plain.count() == 0 and plain.stats()['manager/push_requests'] == 0
    plain.push([{'x': torch.tensor([5.0])}])  # still usable for tensors
    assert plain.count() == 1
    plain.close()

    assert pick.push(items) == 2
    assert pick.pushes.last_score['stored'] == 2
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
    assert worker.pushes.last_score['rejected_stale'] == 4 and worker.pushes.last_score['stored'] == 0
    assert learner.count() == 0

    worker.set_model_version(4, session_id='s1')  # lag 1: accepted
    worker.push(rows(1, 1, 4), batched=True)
    assert worker.pushes.last_score['stored'] == 4 and 'rejected_stale' not in worker.pushes.last_score
    worker.set_model_version(5, session_id='other')  # another session: refused
    worker.push(rows(1, 2, 2), batched=True)
    assert worker.pushes.last_score['rejected_stale'] == 2
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


# ----------------------------------------------------------------------------------------------- hardening
def wire(obj, allow_pickle=False):
    header, parts = encode(obj, allow_pickle)
    return [np.frombuffer(header, dtype=np.uint8)] + list(parts)


def summary_of(d):
    return ray.get(ray.get_actor(d['actor_name'], namespace=d['namespace']).summary.remote(), timeout=GET)


@pytest.mark.timeout(60)
def test_oversized_and_malformed_messages_get_error_replies(actors):
    d = actors(max_message_mb=1)
    buf = create_buffer(naive_tensor(d, size=1000))
    big = {'obs': torch.ones(400, 1000)}  # 1.6 MB of data, the limit is 1 MiB
    with pytest.raises(CodecError, match=re.escape('distributed.max_message_mb')):
        buf.push(big, batched=True)
    assert buf.count() == 0
    st = buf.stats()
    assert st['manager/push_requests'] == 0 and st['manager/pushed_items'] == 0 and st['manager/errors'] == 1

    handle = ray.get_actor(d['actor_name'], namespace=d['namespace'])

    def ask(*msg, client='crafted-client'):
        out = ray.get(handle.call.remote(client, *msg), timeout=GET)
        return decode(bytes(out[0]), out[1:]) if out else None

    oversized = wire({'op': 'push', 'id': 42, 'args': {'data': {'obs': torch.ones(300, 1000)}, 'batched': True}})
    r = ask(*oversized)
    assert r['ok'] is False and r['id'] == 42 and r['error'] == 'CodecError'
    assert 'distributed.max_message_mb' in r['message']
    for msg, error in [
        (wire([1, 2, 3]), 'ValueError'),  # decodable, not a dict
        (wire('push'), 'ValueError'),
        (wire({'id': 9, 'args': {}}), 'ValueError'),  # no op
        (wire({'op': 'count', 'id': 10, 'args': [1]}), 'TypeError'),  # args not a dict
        ([np.frombuffer(b'{not json', dtype=np.uint8)], 'CodecError'),
        (['a str', 5], 'CodecError'),  # not byte arrays at all
        ([], 'CodecError'),  # nothing
        (wire(Tag(1), allow_pickle=True), 'CodecError'),  # a pickle to a manager without allow_pickle
    ]:
        r = ask(*msg)
        assert r['ok'] is False and r['error'] == error, (msg, r)
    assert ask(*wire({'op': 'count', 'id': 3}), client=['not', 'a', 'str'])['error'] == 'CodecError'
    assert ask(*wire({'op': 'ping'})) is None  # a heartbeat has no reply
    assert ask(*wire({'op': 'count', 'id': 11}))['result'] == 0  # still serving

    buf.push({'obs': torch.ones(4, 1000)}, batched=True)
    assert buf.count() == 4
    with pytest.raises(PermissionError, match='file_root'):  # no file_root: workers touch no manager files
        buf.save_data('x.pt')
    buf.close()


@pytest.mark.timeout(90)
def test_killed_and_unclosed_worker_tasks_are_lost_then_manager_checkpoints_and_ends(actors, tmp_path):
    path = str(tmp_path / 'ckpt.pt')
    peer = 3.0
    d = actors(num_workers=2, checkpoint_path=path, heartbeat_seconds=0.25, peer_timeout=peer)
    cfg = naive_tensor(d)
    drv = create_buffer(cfg)  # owns the actor and keeps beating: live, never counted lost
    with pytest.raises(ray.exceptions.RayError):  # the process exits mid-task
        ray.get(remote(ray_helpers.worker_push_then_die).remote(cfg, 5, 2, 3), timeout=GET)
    died = time.monotonic()
    while not summary_of(d)['lost']:
        assert time.monotonic() - died < peer + 20, 'the killed task was never counted lost'
        time.sleep(0.1)
    lost = summary_of(d)['lost']
    why = next(iter(lost.values()))
    assert len(lost) == 1 and ('peer_timeout' in why or 'process died' in why), lost
    assert drv.count() == 6 and not os.path.exists(path)  # one of two workers gone: still serving

    assert ray.get(remote(ray_helpers.worker_push_return).remote(cfg, 6, 2, 3), timeout=GET) == 6
    assert actor_gone(d['actor_name'], d['namespace'], within=peer + 20)  # lost too: checkpoint, then end
    assert os.path.exists(path)
    local = create_buffer({k: v for k, v in cfg.items() if k != 'distributed'})
    local.load_data(path)
    expected = torch.cat([rows(w, s, 3)['obs'] for w in (5, 6) for s in range(2)])
    assert sorted(local.sample(12)['obs'].tolist()) == sorted(expected.tolist())
    local.close()
    with pytest.raises(ManagerUnavailableError) as gone:
        drv.count()
    assert not isinstance(gone.value, ManagerTimeoutError), gone.value  # the actor is gone: no deadline ran out
    with pytest.raises(ManagerUnavailableError):
        drv.close()


@pytest.mark.timeout(90)
def test_a_dead_or_unclosed_worker_is_lost_long_before_peer_timeout(actors, tmp_path):
    """peer_timeout 120 s (the default): a SIGKILLed worker task is counted lost within a few heartbeats (Ray
    reports the owner of its token dead), a task returning without close() at once (its channel says so when it
    is dropped); with both of num_workers=2 gone the manager checkpoints and ends, all within seconds."""
    path = str(tmp_path / 'ckpt.pt')
    d = actors(num_workers=2, checkpoint_path=path, heartbeat_seconds=0.5, peer_timeout=120.0)
    cfg = naive_tensor(d)
    drv = create_buffer(cfg)  # keeps the actor alive and beating
    with pytest.raises(ray.exceptions.RayError):
        ray.get(remote(ray_helpers.worker_push_then_die).remote(cfg, 5, 2, 3), timeout=GET)
    died = time.monotonic()
    while not summary_of(d)['lost']:
        assert time.monotonic() - died < 30, 'the killed task was not counted lost within 30 s (peer_timeout: 120)'
        time.sleep(0.1)
    lost = summary_of(d)['lost']
    assert len(lost) == 1 and 'process died' in next(iter(lost.values())), lost
    assert drv.count() == 6 and not os.path.exists(path)

    assert ray.get(remote(ray_helpers.worker_push_return).remote(cfg, 6, 2, 3), timeout=GET) == 6
    assert actor_gone(d['actor_name'], d['namespace'], within=30)  # (peer_timeout: 120)
    assert os.path.exists(path)
    local = create_buffer({k: v for k, v in cfg.items() if k != 'distributed'})
    local.load_data(path)
    assert local.count() == 12
    local.close()
    with pytest.raises(ManagerUnavailableError):
        drv.close()


@pytest.mark.timeout(120)
def test_a_retried_task_counts_once_in_num_workers(actors, tmp_path):
    """num_workers counts workers: a task whose first attempt died (lost) and whose retry closed is one worker,
    so with num_workers=2 the manager keeps serving until a second task closes, then checkpoints and ends."""
    path = str(tmp_path / 'ckpt.pt')
    d = actors(num_workers=2, checkpoint_path=path, heartbeat_seconds=0.25, peer_timeout=120.0)
    cfg = naive_tensor(d)
    drv = create_buffer(cfg)
    retried = ray.remote(max_retries=1)(ray_helpers.worker_die_then_close_on_retry)
    assert ray.get(retried.remote(cfg, 3, 2, str(tmp_path / 'first_attempt')), timeout=GET) == 3
    t0 = time.monotonic()
    while not summary_of(d)['lost']:  # the first attempt's client
        assert time.monotonic() - t0 < 30, 'the dead first attempt was not counted lost (peer_timeout: 120)'
        time.sleep(0.1)
    summary = summary_of(d)
    assert len(summary['lost']) == 1 and len(summary['exited']) == 1, summary
    time.sleep(1.0)  # watchdog rounds: one worker done of two, nothing ends
    assert drv.count() == 4 and not os.path.exists(path)
    assert ray.get(remote(ray_helpers.worker_push_close).remote(cfg, 4, 1, 2), timeout=GET) == 4
    assert actor_gone(d['actor_name'], d['namespace'], within=10)
    assert os.path.exists(path)
    with pytest.raises(ManagerUnavailableError):
        drv.close()


def test_a_closed_worker_is_exited_not_lost(actors):
    """close() sends EXIT: dropping the closed RemoteBuffer afterwards does not count it lost."""
    import gc

    d = actors(heartbeat_seconds=0.25)
    cfg = naive_tensor(d)
    drv = create_buffer(cfg)
    assert ray.get(remote(ray_helpers.worker_push_close).remote(cfg, 7, 1, 2), timeout=GET) == 7
    gc.collect()
    time.sleep(1.0)  # a few watchdog rounds
    summary = summary_of(d)
    assert summary['lost'] == {} and len(summary['exited']) == 1, summary
    drv.close()


@pytest.mark.timeout(60)
def test_unreachable_ray_address_fails_within_startup_timeout():
    # a fresh interpreter: this process's Ray stays as it is
    code = textwrap.dedent("""
        import json, os, signal, socket, sys, time
        import ray
        from ding_buffer import create_buffer
        listener = socket.socket()
        listener.bind(('127.0.0.1', 0))
        listener.listen(8)  # accepts connections, never speaks Ray
        results = []
        for address in ('127.0.0.1:1', '127.0.0.1:%d' % listener.getsockname()[1]):
            cfg = dict(type='naive', replay_buffer_size=10,
                       distributed=dict(backend='ray', ray_address=address, startup_timeout=2.0, timeout=60))
            t0, handler = time.monotonic(), signal.getsignal(signal.SIGTERM)
            try:
                create_buffer(cfg)
                out = dict(error=None, message='')
            except Exception as e:
                out = dict(error=type(e).__name__, message=str(e))
            out.update(address=address, seconds=time.monotonic() - t0)
            out.update(handler_kept=signal.getsignal(signal.SIGTERM) is handler)
            results.append(out)
        print('RESULT ' + json.dumps(results), flush=True)
        os._exit(0)  # a ray.init thread may still be waiting
    """)
    env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
    env['PYTHONPATH'] = pythonpath()
    proc = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=50, env=env, cwd=str(REPO_ROOT)
    )
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    for out in json.loads(line[0][len('RESULT ') :]):
        assert out['error'] == 'TimeoutError', out
        assert out['address'] in out['message'] and 'distributed.startup_timeout' in out['message'], out
        assert 2.0 <= out['seconds'] < 2.0 + 20, out  # it waited startup_timeout (2 s), then gave up
        assert out['handler_kept'], out  # a failed start leaves the process's SIGTERM handler as it was


@pytest.mark.timeout(60)
def test_an_actor_that_cannot_be_placed_is_removed_so_a_corrected_config_starts(actors):
    """The start-up timeout of an actor asking for more CPUs than the cluster has left that actor pending under its
    name: every later create_buffer with a corrected config attached to it and timed out too."""
    dist = actors(startup_timeout=5.0, ray_actor_options=dict(num_cpus=64))
    with pytest.raises(TimeoutError, match='startup_timeout.*the actor this call created was removed'):
        create_buffer(advanced(dist))
    assert actor_gone(dist['actor_name'], dist['namespace'])
    buf = create_buffer(advanced(dict(dist, startup_timeout=GET, ray_actor_options=None)))
    assert buf.extend({'obs': torch.arange(6.0).reshape(3, 2)}) == 3 and buf.count() == 3
    buf.close()


def test_a_task_is_done_only_once_every_buffer_it_made_has_ended(actors):
    """The first close() in a task ended the job when the task's other buffer was known only from its pings (not
    merged yet): the manager checkpointed and ended while that buffer was open."""
    dist = actors(num_workers=2)
    driver = create_buffer(advanced(dist))
    driver.push({'obs': torch.zeros(2)})
    driver.close()  # worker 1 of 2 is done
    task = remote(ray_helpers.two_buffers_close_one_then_push_the_other)
    assert ray.get(task.remote(advanced(dist)), timeout=GET) == 'ok'
    assert actor_gone(dist['actor_name'], dist['namespace'])  # both workers done: the job ended


def test_results_are_ordinary_tensors_that_torch_save(actors):
    buf = create_buffer(advanced(actors(), size=2000))
    n = 1500  # 1500 x 64 float32: the state travels through the object store (read-only on arrival)
    buf.push({'obs': torch.randn(n, 64), 'i': torch.arange(n)}, batched=True)
    state = buf.state_dict()
    sample = buf.sample(8)
    for obj in (state, sample):
        f = io.BytesIO()
        torch.save(obj, f)
        f.seek(0)
        back = torch.load(f, weights_only=True)
        assert type(back) is type(obj)
    assert torch.equal(back['obs'], sample['obs']) and torch.equal(back['i'], sample['i'])
    sample['obs'].add_(1)  # writable, owns its memory
    local = create_buffer({k: v for k, v in advanced(None, size=2000).items() if k != 'distributed'})
    local.load_state_dict(state)
    assert local.count() == n
    buf.close()


@pytest.mark.timeout(60)
def test_worker_cannot_make_the_manager_unpickle_or_leave_file_root(actors, tmp_path):
    root = tmp_path / 'root'
    root.mkdir()
    marker = tmp_path / 'marker'
    torch.save({'x': ray_helpers.MarkerOnUnpickle(str(marker))}, str(root / 'evil.pt'))
    d = actors(file_root=str(root))  # the manager: allow_pickle=False
    owner = create_buffer(naive_tensor(d))  # creates the actor
    asker = create_buffer(naive_tensor(dict(d, allow_pickle=True)))  # a worker that trusts pickles itself
    with pytest.raises(ValueError, match='allow_pickle'):
        asker.load_data('evil.pt', allow_pickle=True)
    with pytest.raises(ValueError, match='allow_pickle'):
        asker.load_data('evil.pt')
    with pytest.raises(ValueError, match='allow_pickle'):  # refused on the worker: it would run code on the manager
        owner.load_data('evil.pt', allow_pickle=True)
    assert not marker.exists()

    owner.push(rows(1, 0, 4), batched=True)
    (root / 'out').symlink_to(tmp_path)
    for bad in ('../escape.pt', str(tmp_path / 'escape.pt'), 'out/escape.pt', 'a/../../escape.pt'):
        with pytest.raises(PermissionError, match='file_root'):
            owner.save_data(bad)
        with pytest.raises(PermissionError, match='file_root'):
            asker.load_data(bad)
    assert not (tmp_path / 'escape.pt').exists()
    where = owner.save_data('ok.pt')
    assert where == os.path.realpath(str(root / 'ok.pt')) and os.path.exists(where)
    owner.clear()
    asker.load_data('ok.pt')
    assert owner.count() == 4
    owner.close()
    asker.close()
    # the file does run code when unpickled: the refusal above is what kept the marker away
    torch.load(str(root / 'evil.pt'), weights_only=False)
    assert marker.exists()


@pytest.mark.timeout(60)
def test_push_retried_after_timeout_is_stored_once_and_idle_workers_stay_live(actors):
    timeout = 2.0
    assert ray_helpers.SLOW_FIRST_PUSH > timeout
    d = actors(
        timeout=timeout, scoring_function='ray_helpers:slow_first_push', heartbeat_seconds=0.25, peer_timeout=2.5
    )
    cfg = naive_tensor(d)
    buf = create_buffer(cfg)
    idle = create_buffer(cfg)  # a live worker that sends nothing but heartbeats while the manager is busy
    data = rows(4, 0, 5)
    t0 = time.monotonic()
    with pytest.raises(ManagerUnavailableError, match='distributed.timeout'):
        buf.push(data, batched=True)  # stored, then scored for SLOW_FIRST_PUSH > timeout seconds
    # it waited for its deadline (not failing at once; Ray measures the wait on its own clock: no exact bound)
    assert time.monotonic() - t0 > timeout / 2
    assert buf.pushes.unacknowledged == 1
    buf.push(data, batched=True)  # the caller's retry: the push in doubt is resent with its sequence number
    assert buf.pushes.unacknowledged == 0 and buf.pushes.last_score['duplicate'] is True
    buf.push(rows(4, 1, 5), batched=True)
    assert buf.pushes.last_score['stored'] == 5 and 'duplicate' not in buf.pushes.last_score
    assert buf.count() == 10
    expected = torch.cat([rows(4, 0, 5)['obs'], rows(4, 1, 5)['obs']])
    assert sorted(buf.sample(10)['obs'].tolist()) == sorted(expected.tolist())  # naive: without replacement
    st = buf.stats()
    assert st['manager/push_requests'] == 2 and st['manager/duplicate_pushes'] == 1
    summary = summary_of(d)  # the manager was busy longer than peer_timeout, the heartbeats went on:
    assert summary['lost'] == {} and summary['rejoined'] == {}  # nobody was counted lost, not even for a while
    assert idle.count() == 10
    buf.close()
    idle.close()


@pytest.mark.timeout(60)
def test_chunk_protocol_behind_the_ray_actor(actors):
    """MineStudio's protocol served by the Ray actor: whole chunks, the version move reaching the buffer's gate,
    a worker-side blocking fetch that times out, and order errors coming back as ValueError."""
    cfg = dict(type='chunk', fragments_per_chunk=2, max_reuse=1, max_staleness=0, seed=0, distributed=actors())
    learner, worker = create_buffer(cfg), create_buffer(cfg)

    def frag(fid, version):
        return dict(worker='env0', fid=fid, model_version=version, data=dict(obs=torch.full((3,), float(fid))))

    worker.push([frag(f, 0) for f in range(4)])
    got = learner.sample(4, timeout=10)
    assert sorted(x['fid'] for x in got) == [0, 1, 2, 3] and all(x['use'] == 1 for x in got)
    assert all(torch.equal(x['data']['obs'], torch.full((3,), float(x['fid']))) for x in got)
    from ding_buffer.errors import SampleTimeoutError

    with pytest.raises(SampleTimeoutError):
        learner.sample(2, timeout=0.5)  # max_reuse=1 retired both chunks (a poll outliving 0.5 s is a timeout too)
    with pytest.raises(ValueError, match='arrive in order'):
        worker.push(frag(3, 0))
    worker.push([frag(4, 0), frag(5, 0)])
    assert learner.update_model_version(1)['chunks_dropped'] == 1
    assert learner.count() == 0 and learner.stats()['fragments_received'] == 6
    learner.close()
    worker.close()


@pytest.mark.timeout(90)
def test_frames_travel_as_new_frames_to_the_ray_actor(actors):
    """storage.frames behind the Ray actor: two worker tasks push their environments' steps; continuing steps
    travel as one frame, and every row the driver samples equals the pushed step."""
    import numpy as np

    cfg = dict(
        type='naive',
        replay_buffer_size=256,
        seed=0,
        storage=dict(type='tensor', frames=dict(env_key='env_id')),
        distributed=actors(),
    )
    drv = create_buffer(cfg)
    task = remote(ray_helpers.worker_push_frames)
    wire = ray.get([task.remote(cfg, w) for w in range(2)], timeout=GET)
    for w in wire:
        assert w['steps'] == 60 and w['next_as_frame'] == 60 and w['obs_omitted'] > 30, w
    pushed = {t['step']: t for w in range(2) for t in ray_helpers.frame_steps(w)}
    assert drv.count() == 120
    out = drv.sample(120, replace=False)
    assert sorted(out['step'].tolist()) == sorted(pushed)
    for j, s in enumerate(out['step'].tolist()):
        assert np.array_equal(out['obs'][j].numpy(), pushed[s]['obs'])
        assert np.array_equal(out['next_obs'][j].numpy(), pushed[s]['next_obs'])
    drv.close()


@pytest.mark.timeout(300)
def test_a_job_with_a_killed_worker_ends_once_its_work_is_done(tmp_path):
    """A Ray job of its own (``dist_scripts/ray_kill_main.py``: a driver, its local Ray instance, the manager actor
    and two worker tasks): worker 0's process is SIGKILLed, worker 1 closes; the actor counts them done (lost,
    exited) and ends itself, and the driver -- its work done -- exits 0, its Ray instance torn down with it,
    nothing left running in its session. The bounds are outer ones: the driver's process is gone well within a
    minute of its work being done (Ray's own teardown takes a few seconds)."""
    script = os.path.join(HERE, 'dist_scripts', 'ray_kill_main.py')
    env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
    env['PYTHONPATH'] = pythonpath(HERE)  # ray_helpers for the driver and (inherited) its Ray workers
    with open(tmp_path / 'driver.log', 'wb') as log:
        p = subprocess.Popen(
            [sys.executable, script, str(tmp_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(tmp_path),
            start_new_session=True,  # the test can end all of it (Ray's processes included)
        )
    try:
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            rc = None
        exited_at = time.time()
        left = _session_processes(p.pid)
    finally:
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
        p.wait()
    out = (tmp_path / 'driver.log').read_text(errors='replace')[-4000:]
    assert rc == 0, f'the driver did not exit 0 (status {rc})\n{out}'
    rep = json.loads((tmp_path / 'driver.json').read_text())
    assert rep['ok'] and rep['killed_worker'] != 'returned' and rep['survivor'] == 6, rep
    assert rep.get('actor_ended'), f'the manager actor did not end with one worker lost and one exited: {rep}'
    assert exited_at - rep['ended_at'] < 60, f"{exited_at - rep['ended_at']:.1f}s from the work done to exit\n{out}"
    assert not left, f'processes of the job outlived its driver: {left}'


def _session_processes(sid: int) -> list:
    """Command lines of the live (not zombie) processes of session ``sid``."""
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            stat = open(f'/proc/{pid}/stat').read()
            fields = stat[stat.rindex(')') + 2 :].split()  # after "pid (comm) "
            if int(fields[3]) == sid and fields[0] != 'Z':  # state, ppid, pgrp, session
                found.append(open(f'/proc/{pid}/cmdline').read().replace('\0', ' ')[:120])
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.timeout(90)
def test_shared_memory_pushes_of_tasks_on_the_managers_node_next_to_a_task_on_the_wire(actors):
    dist = actors(shared_memory=True)
    cfg = advanced(dist, size=1000)
    drv = create_buffer(cfg)
    wire = advanced(dict(dist, shared_memory=False), size=1000)
    task = remote(ray_helpers.worker_push_items)
    out = ray.get([task.remote(cfg, 0, 150), task.remote(cfg, 1, 150), task.remote(wire, 2, 50)], timeout=GET)
    assert out[0]['count'] >= 150 and out[1]['count'] >= 150  # each saw its own rows committed
    assert drv.count() == 350
    st = drv.stats()
    assert st['manager/shm_rows'] == 300 and st['manager/shm_rings'] == 2 and st['manager/shm_corrupt_rings'] == 0
    s = drv.sample(350)
    got = {(int(w), int(t)) for w, t in zip(s['wid'], s['step'])}
    assert got <= {(w, t) for w in (0, 1) for t in range(150)} | {(2, t) for t in range(50)}
    assert torch.equal(s['wid'].float(), s['obs'][:, 0]) and torch.equal(s['step'].float(), s['obs'][:, 1])
    drv.close()

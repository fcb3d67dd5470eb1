"""The driver of a Ray job across namespaced hosts (launched inside host 0 by tests/distributed/test_across_hosts.py).

Usage: ``python ray_hosts_main.py OUTDIR HEAD_ADDRESS [dead_host|partition]``. The cluster has a node per host,
each with the custom resource ``host<i>``. The manager actor is placed on host 0 (``distributed.ray_actor_options``);
worker tasks on hosts 1 and 2. ``partition``: see ``partition``. ``dead_host``, each step recorded in
``OUTDIR/driver.json``:

1. two worker tasks (hosts 1 and 2) push, sample, update and close;
2. a task on host 2 pushes until the test kills host 2 (link cut, processes killed): the manager must count it lost
   within peer_timeout, and the driver's own calls keep working;
3. the driver and a task on host 1 close: with num_workers=5 reached (four exited, one lost) the manager
   checkpoints and ends; the checkpoint holds every row the live workers pushed.
"""

import os
import sys
import time

import ray_helpers  # (tests/distributed is on the path the test gives)

OUT, ADDRESS = sys.argv[1], sys.argv[2]
SCENARIO = sys.argv[3] if len(sys.argv) > 3 else 'dead_host'  # or 'partition'
PARTITION_STEPS = 250  # one-row pushes every 20 ms or so: longer than the cut
RESULT = {}
PEER_TIMEOUT = 3.0


def write() -> None:
    ray_helpers.write_driver(OUT, RESULT)


def flag(name: str) -> None:
    open(os.path.join(OUT, name), 'w').close()


def wait_flag(name: str, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not os.path.exists(os.path.join(OUT, name)):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def main() -> None:
    import ray

    from ding_buffer import create_buffer

    ray.init(address=ADDRESS, log_to_driver=False, configure_logging=False)
    RESULT['nodes'] = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])
    path = os.path.join(OUT, 'ckpt.pt')
    d = dict(
        backend='ray',
        actor_name=f'hosts_manager_{SCENARIO}',
        namespace='ding_buffer_hosts',
        timeout=20.0,
        startup_timeout=60.0,
        num_workers=5 if SCENARIO == 'dead_host' else None,
        checkpoint_path=path if SCENARIO == 'dead_host' else None,
        file_root=OUT,
        heartbeat_seconds=0.25,
        peer_timeout=PEER_TIMEOUT,
        ray_actor_options=dict(resources={'host0': 0.01}),
    )
    cfg = dict(type='advanced', replay_buffer_size=1000, seed=0, storage=dict(type='tensor'), distributed=d)
    drv = create_buffer(cfg)
    actor = ray.get_actor(d['actor_name'], namespace=d['namespace'])
    RESULT['actor_node'] = ray.get(actor.__ray_call__.remote(lambda self: ray.util.get_node_ip_address()), timeout=30)

    def on(i, fn):
        return ray.remote(max_retries=0, resources={f'host{i}': 0.01})(fn)

    if SCENARIO == 'partition':
        partition(ray, drv, cfg, on, actor)
        return

    def summary():
        return ray.get(actor.summary.remote(), timeout=30)

    # 1. round trips from two hosts
    out = ray.get([on(i, ray_helpers.worker_push_sample_update).remote(cfg, i, 3, 4) for i in (1, 2)], timeout=90)
    RESULT['roundtrip'] = [{'stored': o['stored'], 'update': o['update']} for o in out]
    RESULT['count_after_roundtrip'] = drv.count()
    write()
    # 2. a worker host dies while its task pushes
    on(2, ray_helpers.worker_push_until_unavailable).remote(cfg, 7, 120)
    end = time.monotonic() + 60
    while drv.count() <= RESULT['count_after_roundtrip'] + 5 and time.monotonic() < end:
        time.sleep(0.05)
    flag('pushing')
    assert wait_flag('host2_dead', 60), 'the test did not kill host 2'
    died = time.monotonic()
    while not summary()['lost'] and time.monotonic() - died < 30:
        t = time.monotonic()
        drv.count()  # the driver is served meanwhile
        RESULT.setdefault('driver_call_seconds', []).append(time.monotonic() - t)
        time.sleep(0.1)
    RESULT['lost_after_seconds'] = time.monotonic() - died
    RESULT['lost'] = summary()['lost']
    before = drv.count()
    RESULT['count_after_death'] = before
    write()
    # 3. another worker on host 1 closes: num_workers reached, the manager checkpoints and ends
    drv.close()  # the driver's client exits too (a worker: 2 round trips + driver + host 1 exit, host 2 lost)
    assert ray.get(on(1, ray_helpers.worker_push_close).remote(cfg, 8, 2, 3), timeout=90) == 8
    end = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.1)
    RESULT['checkpoint'] = os.path.exists(path)
    local = create_buffer({k: v for k, v in cfg.items() if k != 'distributed'})
    if RESULT['checkpoint']:
        time.sleep(0.5)  # (written atomically: present means complete)
        local.load_data(path)
        obs = local.storage.gather(local.storage.ring.ordered_slots())['obs']  # every stored row, once
        RESULT['checkpoint_rows'] = sorted(map(tuple, obs.tolist()))
    RESULT['ok'] = True


def partition(ray, drv, cfg, on, actor) -> None:
    """A task on host 1 pushes through a cut of its host's link (the test cuts it, waits, heals it): every row it
    pushed is stored once, and its worker is served again after the heal."""

    from ding_buffer import create_buffer

    job = on(1, ray_helpers.worker_push_through).remote(cfg, 9, PARTITION_STEPS, os.path.join(OUT, 'healed'))
    end = time.monotonic() + 60
    while drv.count() < 20 and time.monotonic() < end:
        time.sleep(0.05)
    flag('pushing')
    assert wait_flag('healed', 90), 'the test did not heal host 1'
    RESULT['task'] = ray.get(job, timeout=120)
    RESULT['summary'] = ray.get(actor.summary.remote(), timeout=30)
    drv.save_data('rows.pt')  # inside the manager's file_root: this job's folder
    local = create_buffer({k: v for k, v in cfg.items() if k != 'distributed'})
    local.load_data(os.path.join(OUT, 'rows.pt'))
    obs = local.storage.gather(local.storage.ring.ordered_slots())['obs']
    RESULT['rows'] = sorted(map(tuple, obs.tolist()))
    drv.close()
    RESULT['ok'] = True


if __name__ == '__main__':
    ray_helpers.run_driver(main, OUT, RESULT)

"""A Ray job of its own (launched by tests/distributed/test_distributed_ray.py): this driver starts a local Ray
instance and the manager actor (``num_workers=2``), then runs two worker tasks: worker 0 pushes and SIGKILLs its
own process, worker 1 pushes and closes. Once the actor has counted one worker lost and one exited and ended
itself, the driver's work is done: it writes ``OUTDIR/driver.json`` (``ended_at``: when) and exits, taking its Ray
instance down with it (``ray.shutdown`` at exit). The test times how long the process takes to end after that.

Usage: ``python ray_kill_main.py OUTDIR``
"""

import os
import sys
import time

import ray_helpers  # (tests/distributed is on the path the test gives)

OUT = sys.argv[1]
RESULT = {}


def main() -> None:
    import ray

    from ding_buffer.distributed.config import build_distributed_config
    from ding_buffer.distributed.ray_backend import get_or_create_actor

    # address='local': a Ray instance of its own, whatever else runs on this machine
    ray.init(address='local', num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    dist = dict(
        backend='ray',
        actor_name='kill_worker_exit',
        namespace=f'ding_buffer_test_{os.getpid()}',
        num_workers=2,
        timeout=20.0,
        startup_timeout=120.0,
        heartbeat_seconds=0.5,
        peer_timeout=120.0,  # the dead worker is lost because Ray reports its process dead, long before this
    )
    cfg = dict(type='naive', replay_buffer_size=100, seed=0, storage=dict(type='tensor'), distributed=dist)
    actor = get_or_create_actor(cfg, build_distributed_config(dist))  # held by this driver for the whole job
    task = lambda fn: ray.remote(max_retries=0)(fn)  # noqa: E731
    dying = task(ray_helpers.worker_push_then_sigkill).remote(cfg, 5, 2, 3)
    try:
        ray.get(dying, timeout=120)
        RESULT['killed_worker'] = 'returned'
    except ray.exceptions.RayError as e:  # its process died mid-task
        RESULT['killed_worker'] = type(e).__name__
    RESULT['survivor'] = ray.get(task(ray_helpers.worker_push_close).remote(cfg, 6, 4, 3), timeout=120)
    end = time.monotonic() + 60
    while time.monotonic() < end:  # the actor ends itself once both workers are done (one exited, one lost)
        try:
            RESULT['summary'] = ray.get(actor.summary.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            RESULT['actor_ended'] = True
            break
        time.sleep(0.2)
    RESULT['ok'] = True


if __name__ == '__main__':
    ray_helpers.run_driver(main, OUT, RESULT, stamp_end=True)  # the work done: interpreter and Ray teardown follow

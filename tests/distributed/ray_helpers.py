"""Importable functions for tests/distributed/test_distributed_ray.py: Ray task bodies (wrapped with ``ray.remote``
there), manager-side scoring functions given as ``'ray_helpers:stored_count'`` / ``'ray_helpers:slow_first_push'``,
a picklable custom class and an object whose unpickling creates a marker file.

The Ray workers and the manager actor import this module by name: the test module puts this directory on
their PYTHONPATH (``runtime_env``)."""

import json
import os
import time
import traceback

import torch


def write_driver(out, result):
    """``OUTDIR/driver.json``, the report of a Ray driver script (``dist_scripts/ray_*_main.py``), written whole."""
    tmp = os.path.join(out, 'driver.json.tmp')
    with open(tmp, 'w') as f:
        json.dump(result, f, default=repr)
    os.replace(tmp, os.path.join(out, 'driver.json'))


def run_driver(main, out, result, stamp_end=False):
    """Run a Ray driver script's ``main``: its report records ``ok`` or the traceback (the error is raised on);
    ``stamp_end`` adds ``ended_at``, when the work was done, before interpreter and Ray teardown."""
    try:
        main()
    except BaseException:
        result['ok'] = False
        result['traceback'] = traceback.format_exc()
        write_driver(out, result)
        raise
    if stamp_end:
        result['ended_at'] = time.time()
    write_driver(out, result)


def rows(wid, step, n):
    """A dict batch of ``n`` rows tagged with the worker id and the step: obs[j] = [wid, step, j]."""
    j = torch.arange(n, dtype=torch.float32)
    obs = torch.stack([torch.full((n,), float(wid)), torch.full((n,), float(step)), j], dim=1)
    return {
        'obs': obs,
        'wid': torch.full((n,), wid, dtype=torch.int64),
        'step': torch.full((n,), step, dtype=torch.int64),
    }


def stored_count(data, sender=None, buffer=None):
    """scoring_function: how many items the manager's buffer holds after the push."""
    return {'n_stored': int(buffer.count())}


SLOW_FIRST_PUSH = 3.0  # seconds the first push to a manager using ``slow_first_push`` takes
_pushes_scored = []


def slow_first_push(data, sender=None, buffer=None):
    """scoring_function: the first push of this manager process takes SLOW_FIRST_PUSH seconds (after storing)."""
    _pushes_scored.append(1)
    if len(_pushes_scored) == 1:
        time.sleep(SLOW_FIRST_PUSH)
    return {'scored': len(_pushes_scored)}


class MarkerOnUnpickle:
    """Unpickling it creates the file ``path`` (stands for any code a pickle can run)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


class Tag:
    """A custom (non-tensor) object, sent only with allow_pickle."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Tag) and other.value == self.value

    def __hash__(self):
        return hash(('Tag', self.value))

    def __repr__(self):
        return f'Tag({self.value!r})'


def worker_push_sample_update(cfg, wid, steps, batch):
    """Attach to the manager, push ``steps`` batches, sample, update priorities, close."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    kind = type(buf).__name__
    stored = []
    for step in range(steps):
        buf.push(rows(wid, step, batch), batched=True)
        stored.append(buf.pushes.last_score['stored'])
    s = buf.sample(4, timeout=10)
    upd = buf.update(
        {
            'replay_unique_id': s['replay_unique_id'],
            'replay_buffer_idx': s['replay_buffer_idx'],
            'priority': torch.full((4,), float(wid + 2)),
        }
    )
    buf.close()
    return {'kind': kind, 'stored': stored, 'sampled_obs': s['obs'], 'update': upd}


def worker_push_close(cfg, wid, steps, batch):
    """Attach, push ``steps`` batches, close (sends EXIT)."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for step in range(steps):
        buf.push(rows(wid, step, batch), batched=True)
    buf.close()
    return wid


def worker_push_then_die(cfg, wid, steps, batch):
    """Attach, push ``steps`` batches (each acknowledged), then the process dies without closing."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for step in range(steps):
        buf.push(rows(wid, step, batch), batched=True)
        assert buf.pushes.last_score['stored'] == batch
    os._exit(1)


def worker_push_then_sigkill(cfg, wid, steps, batch):
    """Attach, push ``steps`` batches (each acknowledged), then SIGKILL this worker process."""
    import signal

    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for step in range(steps):
        buf.push(rows(wid, step, batch), batched=True)
        assert buf.pushes.last_score['stored'] == batch
    os.kill(os.getpid(), signal.SIGKILL)


def worker_push_return(cfg, wid, steps, batch):
    """Attach, push ``steps`` batches (each acknowledged), return without closing (the RemoteBuffer is dropped)."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for step in range(steps):
        buf.push(rows(wid, step, batch), batched=True)
        assert buf.pushes.last_score['stored'] == batch
    return wid


def worker_die_then_close_on_retry(cfg, wid, batch, marker):
    """First attempt (no ``marker`` file yet): push one batch, then the process dies; the retry pushes another batch
    and closes."""
    from ding_buffer import create_buffer

    first = not os.path.exists(marker)
    buf = create_buffer(cfg)
    buf.push(rows(wid, 0 if first else 1, batch), batched=True)
    assert buf.pushes.last_score['stored'] == batch
    if first:
        open(marker, 'w').close()
        os._exit(1)
    buf.close()
    return wid


def worker_push_until_unavailable(cfg, wid, max_seconds):
    """Push one row every 20 ms until a call fails; returns what failed, how, and how long that call took."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    end = time.monotonic() + max_seconds
    step = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            buf.push(rows(wid, step, 1), batched=True)
        except Exception as e:  # noqa: BLE001 - reported back to the test
            return {'pushes': step, 'error': type(e).__name__, 'message': str(e), 'seconds': time.monotonic() - t0}
        step += 1
        time.sleep(0.02)
    return {'pushes': step, 'error': None, 'message': '', 'seconds': 0.0}


def frame_steps(wid, n=60):
    """Worker ``wid``'s frame steps (tests/helpers.FrameEnvs, 2 environments of its own; step ids unique)."""
    from helpers import FrameEnvs

    steps = FrameEnvs(n_envs=2, seed=50 + wid, max_len=10, side=12).steps(n)
    return [dict(t, env_id=10 * wid + t['env_id'], step=1000 * wid + t['step']) for t in steps]


def worker_push_frames(cfg, wid):
    """Ray task: push this worker's frame steps one at a time; the push pipeline's frames_wire counts."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for t in frame_steps(wid):
        buf.push(t)
    stats = dict(buf.pushes.frames.stats)
    buf.close()
    return stats


def worker_push_through(cfg, wid, steps, until=None):
    """Push ``steps`` one-row batches (and on, while the file ``until`` does not exist yet: a fault the test makes
    falls within the pushes however slow the machine), retrying a push that raised ManagerUnavailableError with
    the same data (the pipeline takes it as the retry of the call that raised: stored once); close. Returns what
    happened."""
    from ding_buffer import create_buffer
    from ding_buffer.errors import ManagerUnavailableError

    buf = create_buffer(cfg)
    failures, longest, step = 0, 0.0, 0
    while step < steps or (until is not None and not os.path.exists(until) and step < 100 * steps):
        while True:
            t0 = time.monotonic()
            try:
                buf.push(rows(wid, step, 1), batched=True)
                break
            except ManagerUnavailableError:
                failures += 1
            finally:
                longest = max(longest, time.monotonic() - t0)
        step += 1
        time.sleep(0.02)
    buf.close()
    return {'steps': step, 'failures': failures, 'longest_call': longest}


def worker_push_items(cfg, wid, steps):
    """Attach, push ``steps`` single items (the rows of ``rows(wid, step, 1)``), report stats, close."""
    from ding_buffer import create_buffer

    buf = create_buffer(cfg)
    for step in range(steps):
        buf.push({k: v[0] for k, v in rows(wid, step, 1).items()})
    stats = buf.stats()  # answered after the manager committed this worker's ring
    buf.close()
    return {'shm_rows': stats['manager/shm_rows'], 'count': stats['count']}


def two_buffers_close_one_then_push_the_other(cfg):
    """One task, two RemoteBuffers: the first closed while the second is open; the second then pushes and closes."""
    from ding_buffer import create_buffer

    learner, actor = create_buffer(cfg), create_buffer(cfg)
    actor.push({'obs': torch.zeros(2)})
    actor.close()
    try:
        learner.push({'obs': torch.ones(2)})
        learner.close()
        return 'ok'
    except Exception as e:  # noqa: BLE001 - reported to the driver
        return f'{type(e).__name__}: {e}'

"""Starting the ranks of a distributed training job (``--nproc N``), or finding out which rank this process is
when torchrun / mpirun started it. Used by the Ape-X and the distributed HyperGrid jobs.

torch: N plain ``env://`` processes (not torchrun, which tears every rank down when one dies: a killed actor must
not end the run); MPI: ``mpirun --oversubscribe --enable-recovery -n N`` (the other ranks survive a dead one);
Ray: ``ray_init`` starts a local cluster of N CPUs, or joins ``distributed.ray_address`` / ``RAY_ADDRESS``.

``run_roles`` is what both jobs run: it starts the ranks (``--nproc``), or, in a rank, serves (the manager) or
runs the job's learner / worker function, or drives Ray tasks. A worker whose manager is gone prints
``ding-buffer: error: <role> rank <r>: ...`` and exits with ``EXIT_MANAGER_GONE``.
"""

import argparse
import contextlib
import copy
import os
import signal
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..base import create_buffer
from ..errors import ManagerUnavailableError
from .checkpoint import complete_checkpoints
from .env import LAUNCHED  # set in the ranks this module starts itself
from .signals import interrupting, override_argv, resume_command

EXIT_MANAGER_GONE = 3


def rank_world(backend: str) -> Optional[Tuple[int, int]]:
    """(rank, world size) when a launcher started this process (torchrun / our env:// ranks, mpirun), else None."""
    if backend == 'torch':
        if 'RANK' not in os.environ or 'WORLD_SIZE' not in os.environ:
            return None
        return int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if 'OMPI_COMM_WORLD_RANK' in os.environ or 'PMI_RANK' in os.environ or 'PMIX_RANK' in os.environ:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return None


def child_argv(args: argparse.Namespace) -> List[str]:
    """The command line of a rank this process starts: the same job, without ``--nproc``."""
    argv = [sys.executable, '-m', 'ding_buffer', 'train', os.path.abspath(args.config), '--threads', '1']
    argv += override_argv(args)
    if args.resume is not None:
        argv += ['--resume', os.path.abspath(args.resume)]
    if args.no_progress:
        argv.append('--no-progress')
    return argv


def launch_torch(args: argparse.Namespace, nproc: int) -> int:
    import socket

    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nproc):  # plain env:// ranks (not torchrun): a rank that dies must not take the others down
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(port),
            OMP_NUM_THREADS='1',
            **{LAUNCHED: '1'},
        )
        procs.append(subprocess.Popen(child_argv(args), env=env))
    return wait_all(procs, learner=0)


def launch_mpi(args: argparse.Namespace, nproc: int) -> int:
    import shutil

    if shutil.which('mpirun') is None:
        raise ValueError("distributed.backend='mpi' needs mpirun (Open MPI) on PATH")
    cmd = ['mpirun', '--oversubscribe', '--enable-recovery', '-n', str(nproc)]
    if hasattr(os, 'geteuid') and os.geteuid() == 0:
        cmd.insert(1, '--allow-run-as-root')
    env = dict(os.environ, OMP_NUM_THREADS='1', **{LAUNCHED: '1'})
    return wait_all([subprocess.Popen(cmd + child_argv(args), env=env)], learner=0)


def wait_all(procs: List[subprocess.Popen], learner: int) -> int:
    """Wait for the ranks; SIGINT (Ctrl-C) or SIGTERM stops them all (the same signal, passed on; a rank still
    running 30 s later, or at a second signal, is killed) and the launcher exits 128 + its number. The job's status
    is otherwise the learner's (or the launcher's)."""
    with interrupting() as got:
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            signum = got[0] if got else signal.SIGINT
            try:
                for p in procs:
                    p.send_signal(signum)
                for p in procs:
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
            except KeyboardInterrupt:  # a second signal: no more waiting
                for p in procs:
                    p.kill()
            return 128 + int(signum)
    return codes[learner]


def interrupted(args: argparse.Namespace, run_dir: str, code: int = 130) -> None:
    """After a signal (``code``: 128 + its number) ended every rank of a distributed job: where its newest complete
    checkpoint is and the command that resumes from it (the job checkpoints every ``checkpoint.freq``; the ranks do
    not write one on the way out: the manager holding the buffer got the signal too)."""
    how = 'Ctrl-C' if code == 130 else signal.Signals(code - 128).name
    done = complete_checkpoints(os.path.join(run_dir, 'checkpoints'))
    if done:
        print(
            f"\nstopped by {how}: every rank ended; the newest complete checkpoint is {done[-1][1]}\nresume with: "
            f"{resume_command(args, run_dir)}",
            flush=True,
        )
    else:
        print(
            f"\nstopped by {how} before the first checkpoint (written every checkpoint.freq) in {run_dir}: "
            "nothing to resume",
            flush=True,
        )


def ray_init(dist: Any, nproc: int) -> None:
    """Join the Ray cluster at ``distributed.ray_address`` (or ``RAY_ADDRESS``), bounded by the distributed
    start-up timeout (an address nobody answers raises ``TimeoutError`` naming the key instead of waiting
    forever), else start a local one of ``nproc`` CPUs (the manager actor and one task per other rank)."""
    import time

    import ray

    from ..distributed.config import build_distributed_config, startup_seconds
    from ..distributed.startup import connect_ray

    if ray.is_initialized():
        return
    if dist.get('ray_address') or os.environ.get('RAY_ADDRESS'):
        dcfg = build_distributed_config(dist)
        seconds = startup_seconds(dcfg)
        try:
            connect_ray(ray, dcfg, time.monotonic() + seconds, seconds)
        except TimeoutError as e:  # the config names a cluster that is not there: a one-line error (exit 2)
            raise ValueError(str(e)) from e
    else:
        ray.init(num_cpus=nproc, include_dashboard=False, namespace=dist.get('namespace'), configure_logging=False)


def in_file_root(run_dir: str, path: str) -> str:
    """``path`` relative to ``run_dir``, the manager's ``file_root`` (``job_buffer_cfg``): how a learner names a
    checkpoint's buffer file to the manager."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(run_dir))


def job_buffer_cfg(cfg: Any, run_dir: str, n_workers: int) -> Any:
    """The buffer section every rank builds: the run directory is the manager's ``file_root`` (the learner's
    checkpoints ask the manager to write the buffer there); with Ray the actor ends once every worker left."""
    b = copy.deepcopy(cfg.policy.other.replay_buffer)
    b.distributed.setdefault('file_root', os.path.abspath(run_dir))
    if b.distributed.backend == 'ray':
        b.distributed.setdefault('num_workers', n_workers)
    return b


def with_remote(cfg: Any, run_dir: str, n_workers: int, remote: Any, body: Callable[[Any], Dict[str, Any]]) -> Dict:
    """``body(remote)`` with the job's RemoteBuffer (made here when ``remote`` is None, as in a Ray task), closed
    afterwards -- within 5 s when ``body`` failed, so a dead manager does not hold up the error."""
    if remote is None:
        remote = create_buffer(job_buffer_cfg(cfg, run_dir, n_workers))
    try:
        out = body(remote)
    except BaseException:
        with contextlib.suppress(Exception):
            remote.close(timeout=5.0)
        raise
    remote.close()
    return out


def publish_weights(remote: Any, version: int, payload: Dict[str, Any]) -> None:
    """The learner's ``put_blob('weights', version, payload)``; ``RuntimeError`` when the manager keeps a newer
    version: another client published weights on this manager, and the workers would follow it, not us."""
    got = remote.put_blob('weights', version, payload)
    if not got['stored']:
        raise RuntimeError(
            f"the manager keeps version {got['version']} of 'weights', not older than this learner's "
            f"{version}: another client publishes weights on this manager (two learners, or a stale "
            "run with the same Ray namespace?)"
        )


RoleMain = Callable[..., Dict[str, Any]]  # (cfg, run_dir, role, index, n_workers, resume, progress, remote=None)


def run_roles(
    role_main: RoleMain,
    cfg: Any,
    run_dir: str,
    args: argparse.Namespace,
    job: str,
    worker: str,
    report: Callable[[Dict[str, Any]], None],
) -> int:
    """
    Overview:
        Run a manager / learner / workers job. ``role_main(cfg, run_dir, role, index, n_workers, resume,
        progress, remote=None)`` runs ``'learner'`` or ``worker`` number ``index`` with ``remote`` (a
        RemoteBuffer; built by ``role_main`` itself when None, as in a Ray task) and returns a summary;
        ``report(summary)`` prints the learner's.
    """
    backend = cfg.policy.other.replay_buffer.distributed.backend
    roles = f"a manager, a learner, {'an' if worker[0] in 'aeiou' else 'a'} {worker}"
    if backend == 'ray':
        return _ray_driver(role_main, cfg, run_dir, args, worker, report)
    where = rank_world(backend)
    if where is None:
        if args.nproc is None:
            launcher = (
                'torchrun --nproc_per_node N -m ding_buffer train ...'
                if backend == 'torch'
                else 'mpirun -n N python -m ding_buffer train ...'
            )
            raise ValueError(
                f"{args.config}: the {job} job runs on several processes: give --nproc N (N >= 3) to "
                f"start them here, or launch with {launcher}"
            )
        if args.nproc < 3:
            raise ValueError(f"--nproc {args.nproc}: the {job} job needs at least 3 ({roles})")
        os.makedirs(run_dir, exist_ok=True)
        code = (launch_torch if backend == 'torch' else launch_mpi)(args, args.nproc)
        if code in (130, 143):
            interrupted(args, run_dir, code)
        return code
    if args.nproc is not None and os.environ.get(LAUNCHED) != '1':
        raise ValueError(
            f"--nproc {args.nproc} inside a {'torchrun' if backend == 'torch' else 'mpirun'} job: the "
            f"launcher already started the ranks; drop --nproc"
        )
    rank, world = where
    if world < 3:
        raise ValueError(f"the {job} job needs at least 3 ranks ({roles}), this job has {world}")
    manager = cfg.policy.other.replay_buffer.distributed.get('manager_rank', -1)
    manager = manager if manager >= 0 else world - 1
    others = [r for r in range(world) if r != manager]
    bcfg = job_buffer_cfg(cfg, run_dir, len(others))
    os.makedirs(run_dir, exist_ok=True)  # the manager's file_root; every rank checks it exists
    if rank == manager:
        # no TensorBoard writer here: as in DI-engine only rank 0 writes one; the learner records the buffer's
        # stats() (counters, the sampled window, the manager's counters)
        summary = create_buffer(bcfg, exp_name=cfg.exp_name, instance_name='buffer').run()
        lost = summary.get('lost') if isinstance(summary, dict) else None
        print(f"[manager rank {rank}] served until every worker left" + (f"; lost: {lost}" if lost else ''), flush=True)
        return 0
    role = 'learner' if rank == others[0] else worker
    remote = create_buffer(bcfg)
    try:
        out = role_main(
            cfg,
            run_dir,
            role,
            others.index(rank) - 1,
            len(others),
            args.resume is not None,
            not args.no_progress and role == 'learner',
            remote=remote,
        )
    except ManagerUnavailableError as e:
        print(f"ding-buffer: error: {role} rank {rank}: {e}", file=sys.stderr, flush=True)
        return EXIT_MANAGER_GONE
    if role == 'learner':
        report(out)
    return 0


def _ray_driver(
    role_main: RoleMain,
    cfg: Any,
    run_dir: str,
    args: argparse.Namespace,
    worker: str,
    report: Callable[[Dict[str, Any]], None],
) -> int:
    """Ray: this process drives. It creates the manager actor and holds it for the whole run (a non-detached
    actor dies with the last reference of its owner, which must not be a task that may end first), then runs the
    learner and ``nproc - 2`` workers as tasks. A worker that dies is reported, not fatal."""
    import ray

    from ..distributed.config import build_distributed_config
    from ..distributed.local import check_manager_side
    from ..distributed.ray_backend import get_or_create_actor
    from ..distributed.startup import starts_local_ray

    nproc = args.nproc
    if nproc is None or nproc < 3:
        raise ValueError(
            f"distributed.backend='ray': give --nproc N >= 3 (the manager actor, the learner and N - 2 {worker}s)"
        )
    dist = cfg.policy.other.replay_buffer.distributed
    bcfg = job_buffer_cfg(cfg, run_dir, nproc - 1)
    dcfg = build_distributed_config(bcfg.distributed)
    if not ray.is_initialized() and starts_local_ray(dcfg):
        # the manager actor will run on this host: what it would refuse fails now, before Ray starts (the run
        # directory, its default file_root, is made below)
        own_root = dcfg.file_root == os.path.abspath(run_dir)
        check_manager_side(bcfg, type(dcfg)(dcfg, file_root=None) if own_root else dcfg)
    ray_init(dist, nproc)
    os.makedirs(run_dir, exist_ok=True)
    manager = get_or_create_actor(bcfg, dcfg)  # noqa: F841 (held)
    task = ray.remote(num_cpus=1, max_retries=0)(role_main)
    learner = task.remote(cfg, run_dir, 'learner', 0, nproc - 1, args.resume is not None, not args.no_progress)
    workers = [task.remote(cfg, run_dir, worker, i, nproc - 1, False, False) for i in range(nproc - 2)]
    with interrupting() as got:
        try:
            summary = ray.get(learner)
        except KeyboardInterrupt:
            for ref in [learner] + workers:
                ray.cancel(ref, force=True)
            code = 128 + int(got[0] if got else signal.SIGINT)
            interrupted(args, run_dir, code)
            return code
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, 'cause', None)
            if isinstance(cause, ManagerUnavailableError):
                print(f"ding-buffer: error: learner: {cause}", file=sys.stderr, flush=True)
                return EXIT_MANAGER_GONE
            raise
    for ref in workers:
        try:
            ray.get(ref, timeout=max(float(dist.get('timeout', 60.0)), 30.0))
        except Exception as e:
            print(f"[ray] a {worker} ended with {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    report(summary)
    return 0


__all__ = [
    'EXIT_MANAGER_GONE',
    'rank_world',
    'child_argv',
    'launch_torch',
    'launch_mpi',
    'wait_all',
    'interrupted',
    'ray_init',
    'job_buffer_cfg',
    'run_roles',
    'with_remote',
    'publish_weights',
]

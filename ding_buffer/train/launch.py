"""Starting the ranks of a distributed training job (``--nproc N``), or finding out which rank this process is
when torchrun / mpirun started it. Used by the Ape-X and the distributed HyperGrid jobs.

torch: N plain ``env://`` processes (not torchrun, which tears every rank down when one dies: a killed actor must
not end the run); MPI: ``mpirun --oversubscribe --enable-recovery -n N`` (the other ranks survive a dead one);
Ray: ``ray_init`` starts a local cluster of N CPUs, or joins ``distributed.address`` / ``RAY_ADDRESS``.
"""
import argparse
import os
import signal
import subprocess
import sys
from typing import Any, List, Optional, Tuple

LAUNCHED = 'DING_BUFFER_LAUNCHED'  # set in the ranks this module starts itself


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
    for flag, value in (('--seed', args.seed), ('--env-steps', args.env_steps), ('--device', args.device),
                        ('--iterations', args.iterations)):
        if value is not None:
            argv += [flag, str(value)]
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
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), OMP_NUM_THREADS='1', **{LAUNCHED: '1'})
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
    """Wait for the ranks; Ctrl-C stops them all. The job's status is the learner's (or the launcher's)."""
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        return 130
    return codes[learner]




def ray_init(dist: Any, nproc: int) -> None:
    """Join the Ray cluster at ``distributed.address`` (or ``RAY_ADDRESS``), else start a local one of ``nproc``
    CPUs (the manager actor and one task per other rank)."""
    import ray
    if ray.is_initialized():
        return
    address = dist.get('address') or os.environ.get('RAY_ADDRESS')
    if address:
        ray.init(address=address, namespace=dist.get('namespace'), log_to_driver=True)
    else:
        ray.init(num_cpus=nproc, include_dashboard=False, namespace=dist.get('namespace'), configure_logging=False)


__all__ = ['LAUNCHED', 'rank_world', 'child_argv', 'launch_torch', 'launch_mpi', 'wait_all', 'ray_init']

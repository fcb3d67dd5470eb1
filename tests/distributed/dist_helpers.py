"""Launching real multi-process jobs for the distributed tests: torchrun / env:// ranks for 'torch', mpirun for
'mpi'. Every rank of a scenario script writes ``OUTDIR/rank{r}.json``; ``Launch.wait`` collects them. MPI
launches are skipped when mpirun / mpi4py are missing, except under CI (env ``CI``) where they fail."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import mpi_missing, need_mpi, pythonpath

SCRIPTS = Path(__file__).parent / 'dist_scripts'
SCRIPT = SCRIPTS / 'rank_main.py'
EXIT_WRAP = SCRIPTS / 'exit_wrap.sh'
BACKENDS = ['torch', 'mpi']
LAUNCH_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def child_env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'LOCAL_WORLD_SIZE')
    }
    env['PYTHONPATH'] = pythonpath()  # the checkout's ding_buffer (the ranks run with cwd in a temporary folder)
    env['OMP_NUM_THREADS'] = '1'
    env['PYTHONUNBUFFERED'] = '1'
    return env


class Launch:
    """One scenario on one backend: the processes, their logs and (after ``wait``) the ranks' JSON reports."""

    def __init__(
        self,
        scenario: str,
        backend: str,
        root: Path,
        script: Path = SCRIPT,
        nproc: int = 3,
        survive_deaths: bool = False,
        timeout: float = LAUNCH_TIMEOUT,
        hosts=None,
        record_exits: bool = False,
    ) -> None:
        """``survive_deaths``: torch ranks start as plain env:// processes (as SLURM users do: torchrun would tear
        the job down when a rank dies) and mpirun runs with --enable-recovery. ``hosts`` (a ``netns_hosts.Hosts``):
        rank ``r`` runs on host ``r``: torch ranks as env:// processes rendezvousing at host 0's address, MPI ranks
        started by mpirun (in the test's namespace) through ``netns_rsh.sh``, talking TCP only. ``record_exits``
        (torch env:// ranks or mpirun, not torchrun): every rank runs under ``exit_wrap.sh``, which records its
        process's exit status and end time (``exits()``), MPI_Finalize and interpreter teardown included."""
        self.scenario, self.backend, self.nproc, self.timeout = scenario, backend, nproc, timeout
        self.out = root / f'{scenario}-{backend}'
        self.out.mkdir(parents=True)
        self.procs = []  # (name, Popen, log path)
        self.timed_out = []
        self.launcher_stuck = []  # mpirun outliving all of its ranks (record_exits tells)
        self.record_exits = record_exits
        self.ranks = None
        args = [str(script), scenario, backend, str(self.out)]
        if record_exits:
            assert hosts is None and (backend == 'mpi' or survive_deaths), 'exit_wrap.sh wraps env:// or mpirun ranks'
        python = ['sh', str(EXIT_WRAP), sys.executable] if record_exits else [sys.executable]
        if hosts is not None and backend == 'mpi':
            env = child_env()
            env.update(hosts.test_env(nproc))
            subnet = f'{hosts.net}.0/24'
            cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(nproc), '--wdir', str(self.out)]
            cmd += ['--host', ','.join(hosts.ns(i) for i in range(nproc))]  # rank r on host r
            cmd += ['--mca', 'plm_rsh_agent', str(SCRIPTS / 'netns_rsh.sh'), '--mca', 'plm_rsh_no_tree_spawn', '1']
            cmd += ['--mca', 'oob_tcp_if_include', subnet, '--mca', 'btl_tcp_if_include', subnet]
            cmd += ['--mca', 'btl', 'tcp,self']  # TCP between hosts, never shared memory
            for name in ('PYTHONPATH', 'OMP_NUM_THREADS', 'PYTHONUNBUFFERED') + tuple(hosts.test_env(nproc)):
                cmd += ['-x', name]
            if survive_deaths:
                cmd.append('--enable-recovery')
            self._start('mpirun', cmd + [sys.executable] + args, env)
        elif hosts is not None:
            for r in range(nproc):
                env = child_env()
                env.update(
                    RANK=str(r),
                    LOCAL_RANK='0',
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE='1',
                    MASTER_ADDR=hosts.addr(0),
                    MASTER_PORT='29500',  # (each host has its own ports)
                    GLOO_SOCKET_IFNAME=hosts.device,  # gloo picks the host's link, not its loopback
                    **hosts.test_env(nproc),
                )
                self._start(f'rank{r}', [sys.executable] + args, env, hosts=hosts, host=r)
        elif backend == 'torch' and survive_deaths:
            port = free_port()
            for r in range(nproc):
                env = child_env()
                env.update(
                    RANK=str(r),
                    LOCAL_RANK=str(r),
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc),
                    MASTER_ADDR='127.0.0.1',
                    MASTER_PORT=str(port),
                )
                self._start(f'rank{r}', python + args, env)
        elif backend == 'torch':
            # --standalone: torchrun binds a free port itself (no race with other jobs grabbing a port we picked)
            cmd = [
                sys.executable,
                '-m',
                'torch.distributed.run',
                '--standalone',
                '--nnodes',
                '1',
                '--nproc_per_node',
                str(nproc),
            ] + args
            self._start('torchrun', cmd, child_env())
        else:
            cmd = ['mpirun', '--allow-run-as-root', '--oversubscribe', '-n', str(nproc)]
            if survive_deaths:
                cmd.append('--enable-recovery')  # the other ranks keep running when one dies
            self._start('mpirun', cmd + python + args, child_env())
        self.started = time.monotonic()

    def _start(self, name, cmd, env, hosts=None, host=0) -> None:
        log = self.out / f'{name}.log'
        with open(log, 'wb') as f:
            if hosts is not None:
                p = hosts.popen(host, cmd, env, stdout=f, stderr=subprocess.STDOUT, cwd=str(self.out))
            else:
                p = subprocess.Popen(
                    cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(self.out), start_new_session=True
                )
        self.procs.append((name, p, log))

    def wait(self) -> 'Launch':
        if self.ranks is not None:
            return self
        deadline = self.started + self.timeout
        for name, p, _ in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                # mpirun --enable-recovery now and then stays up after every rank it started has ended (Open MPI
                # 4.1's launcher after a rank was SIGKILLed); with record_exits that is told apart from a rank
                # that hangs: no code of the package is running any more
                ranks_done = name == 'mpirun' and self.record_exits and len(self.exits()) == self.nproc
                (self.launcher_stuck if ranks_done else self.timed_out).append(name)
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the session this test started for it
                except ProcessLookupError:
                    pass
                p.wait()
        self.seconds = time.monotonic() - self.started
        self.ranks = {}
        for r in range(self.nproc):
            f = self.out / f'rank{r}.json'
            if f.exists():
                self.ranks[r] = json.loads(f.read_text())
        return self

    def exits(self) -> dict:
        """``{rank: (exit status, time.time() when its process had ended)}`` of the ranks ``exit_wrap.sh`` saw end
        (``record_exits``)."""
        out = {}
        for r in range(self.nproc):
            f = self.out / f'rank{r}.exit'
            if f.exists():
                rc, when = f.read_text().split()
                out[r] = (int(rc), float(when))
        return out

    @property
    def returncodes(self):
        return {name: p.returncode for name, p, _ in self.procs}

    def logs(self) -> str:
        parts = [
            f'== {self.scenario} / {self.backend}: return codes {self.returncodes}, '
            f'timed out {self.timed_out}, {self.seconds:.1f}s, launcher outliving its ranks: {self.launcher_stuck}, '
            f'rank exits: {self.exits()}'
        ]
        for name, _, log in self.procs:
            text = log.read_text(errors='replace') if log.exists() else ''
            parts.append(f'-- {name} output (last 6000 chars):\n{text[-6000:]}')
        parts.append('-- files written: ' + ', '.join(sorted(f.name for f in self.out.iterdir())))  # flags, reports
        for r, d in sorted((self.ranks or {}).items()):
            if 'traceback' in d:
                parts.append(f'-- rank {r} traceback:\n{d["traceback"]}')
        return '\n'.join(parts)

    def rank(self, r: int) -> dict:
        assert r in self.ranks, f'rank {r} wrote no report\n{self.logs()}'
        return self.ranks[r]

    def require_ok(self, ranks=(0, 1, 2), rc=True) -> None:
        assert not self.timed_out, f'launch timed out after {self.timeout}s\n{self.logs()}'
        for r in ranks:
            d = self.rank(r)
            assert d.get('ok') is True, f'rank {r} did not finish\n{self.logs()}'
        if rc:
            assert all(c == 0 for c in self.returncodes.values()), f'non-zero exit\n{self.logs()}'


def launcher(root: Path, registry: dict, **kinds):
    """A getter ``get(scenario, backend)`` that starts both backends of a scenario at once (the other test picks
    its launch up later) and waits for the one asked. ``kinds``: scenario -> Launch keyword arguments."""

    def get(scenario: str, backend: str) -> Launch:
        if backend == 'mpi':
            need_mpi()
        if (scenario, backend) not in registry:
            for b in BACKENDS:
                if (scenario, b) not in registry and (b == 'torch' or not mpi_missing()):
                    registry[(scenario, b)] = Launch(scenario, b, root, **kinds.get(scenario, {}))
        return registry[(scenario, backend)].wait()

    return get

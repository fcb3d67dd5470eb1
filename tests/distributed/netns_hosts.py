"""Hosts on one machine for the distributed tests: network namespaces joined by veth pairs on a bridge, each with
its own address, so a manager and its workers talk over real (virtual) links that a test can shape, cut and
restore -- and whose processes it can kill as a host dies.

    with Hosts(3) as hosts:                  # namespaces <prefix>h0..h2, addresses 10.<net>.0.1 .. .3
        p = hosts.popen(1, [sys.executable, 'worker.py'], env)   # runs inside host 1
        hosts.link(1, up=False)              # host 1 is cut off (a partition); its processes keep running
        hosts.link(1, up=True)               # healed
        hosts.shape(2, '10gbit')             # tc tbf on host 2's link (both directions)
        hosts.kill(1)                        # every process of host 1, SIGKILL (after cutting its link: no FIN)

Needs root and iproute2 (``available()`` says why not: the tests skip with that reason). Everything made is
removed on exit, on failure too, and names carry this process's id, so concurrent runs do not meet. ``tc netem``
(latency, loss) is used only where the kernel has it (``has_netem()``); ``tbf`` rate limits work everywhere here.
"""

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional

IP = shutil.which('ip') or '/usr/sbin/ip'
TC = shutil.which('tc') or '/usr/sbin/tc'


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=20, check=check)


def available() -> str:
    """'' where namespaces can be made here; otherwise why not (a skip reason)."""
    if os.geteuid() != 0:
        return 'network namespaces need root'
    if not os.path.exists(IP):
        return 'iproute2 (ip) is not installed'
    probe = f'dbprobe{os.getpid() % 100000}'
    try:
        r = _run(IP, 'netns', 'add', probe, check=False)
        if r.returncode:
            return f'cannot create a network namespace: {r.stderr.strip()[:200]}'
    finally:
        _run(IP, 'netns', 'del', probe, check=False)
    return ''


def has_netem() -> bool:
    """Whether the kernel has the netem qdisc (latency and loss); probed on a dummy link of its own."""
    name = f'dbq{os.getpid() % 100000}'
    if _run(IP, 'link', 'add', name, 'type', 'dummy', check=False).returncode:
        return False
    try:
        return _run(TC, 'qdisc', 'add', 'dev', name, 'root', 'netem', 'delay', '1ms', check=False).returncode == 0
    finally:
        _run(IP, 'link', 'del', name, check=False)


class Hosts:
    """
    Overview:
        ``n`` hosts (network namespaces) on one bridge. ``ns(i)`` / ``addr(i)`` name host ``i``; ``popen`` runs a
        command inside it; ``link`` cuts or restores its link; ``shape`` rate-limits it; ``netem`` adds delay /
        loss where the kernel can; ``kill`` ends its processes. ``close`` (also on ``with`` exit) removes it all.
    """

    _made_here = 0  # instances made by this process: each gets names of its own (none reused after a clean-up)

    def __init__(self, n: int, device: str = 'eth0') -> None:
        Hosts._made_here += 1
        tag = (os.getpid() * 7 + Hosts._made_here) % 100000
        self.n, self.device = n, device
        self.prefix = f'db{tag}'
        self.bridge = f'{self.prefix}br'
        self.net = f'10.{100 + tag % 150}.{tag % 250}'
        self.procs: List[subprocess.Popen] = []
        self._made: List[str] = []

    # ------------------------------------------------------------------ names
    def ns(self, i: int) -> str:
        return f'{self.prefix}h{i}'

    def scratch(self, i: int) -> str:
        """Host ``i``'s own temporary folder (``netns_rsh.sh`` puts Open MPI's session directory there)."""
        return os.path.join(os.environ.get('TMPDIR') or '/tmp', self.ns(i))

    def addr(self, i: int) -> str:
        return f'{self.net}.{i + 1}'

    def port(self, i: int) -> str:
        """The bridge side of host ``i``'s veth pair (in the root namespace)."""
        return f'{self.prefix}v{i}'

    # ------------------------------------------------------------------ life
    def __enter__(self) -> 'Hosts':
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        _run(IP, 'link', 'add', self.bridge, 'type', 'bridge')
        self._made.append('bridge')
        _run(IP, 'link', 'set', self.bridge, 'up')
        _run(IP, 'addr', 'add', f'{self.net}.254/24', 'dev', self.bridge)  # this namespace on the network too (mpirun)
        for i in range(self.n):
            ns, port = self.ns(i), self.port(i)
            _run(IP, 'netns', 'add', ns)
            self._made.append(ns)
            _run(IP, 'link', 'add', port, 'type', 'veth', 'peer', 'name', self.device, 'netns', ns)
            _run(IP, 'link', 'set', port, 'master', self.bridge, 'up')
            _run(IP, '-n', ns, 'addr', 'add', f'{self.addr(i)}/24', 'dev', self.device)
            _run(IP, '-n', ns, 'link', 'set', self.device, 'up')
            _run(IP, '-n', ns, 'link', 'set', 'lo', 'up')

    def test_env(self, n: int) -> Dict[str, str]:
        """What a test rank on these hosts reads to cut or heal a host's link itself (``rank_main._host_link``)."""
        return dict(
            DING_TEST_HOST_PORTS=','.join(self.port(i) for i in range(n)),
            DING_TEST_ROOT_NETNS=f'/proc/{os.getpid()}/ns/net',  # where the bridge and its ports are
        )

    def close(self) -> None:
        for i in range(self.n):
            if self.ns(i) in self._made:
                self.kill(i)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for i in range(self.n):
            if self.ns(i) in self._made:
                _run(IP, 'link', 'del', self.port(i), check=False)
                _run(IP, 'netns', 'del', self.ns(i), check=False)
                shutil.rmtree(self.scratch(i), ignore_errors=True)
        if 'bridge' in self._made:
            _run(IP, 'link', 'del', self.bridge, check=False)
        self._made = []

    # ------------------------------------------------------------------ processes
    def popen(self, i: int, cmd: List[str], env: Optional[Dict[str, str]] = None, **kw) -> subprocess.Popen:
        """``cmd`` inside host ``i`` (its own session: ``kill`` and the test's timeouts reach every child)."""
        p = subprocess.Popen([IP, 'netns', 'exec', self.ns(i)] + list(cmd), env=env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def pids(self, i: int) -> List[int]:
        r = _run(IP, 'netns', 'pids', self.ns(i), check=False)
        return [int(x) for x in r.stdout.split()]

    def kill(self, i: int) -> None:
        """SIGKILL every process of host ``i`` (repeated until none is left, children included)."""
        for _ in range(20):
            pids = self.pids(i)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    # ------------------------------------------------------------------ links
    def link(self, i: int, up: bool) -> None:
        """Cut (``up=False``) or restore host ``i``'s link: its packets are dropped meanwhile, its sockets stay."""
        _run(IP, 'link', 'set', self.port(i), 'up' if up else 'down')

    def shape(self, i: int, rate: str, burst: str = '1mb', latency: str = '50ms') -> None:
        """A ``tc tbf`` rate limit on host ``i``'s link, both directions (e.g. ``rate='1gbit'``)."""
        for args in ((self.port(i),), (self.device, self.ns(i))):
            dev, ns = args[0], (args[1] if len(args) > 1 else None)
            pre = [IP, 'netns', 'exec', ns] if ns else []
            _run(*pre, TC, 'qdisc', 'replace', 'dev', dev, 'root', 'tbf', 'rate', rate, 'burst', burst,
                 'latency', latency)  # fmt: skip

    def netem(self, i: int, *spec: str) -> None:
        """``tc netem`` on host ``i``'s link (e.g. ``'loss', '5%'``); raises where the kernel lacks netem."""
        _run(TC, 'qdisc', 'replace', 'dev', self.port(i), 'root', 'netem', *spec)


def leftovers(prefix: str = 'db') -> List[str]:
    """Namespaces this harness made that still exist (for a test that checks the clean-up)."""
    r = _run(IP, 'netns', 'list', check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(prefix)]

"""What the `ding-buffer train` tests (this folder) share: config files that load a shipped config and override a
few keys, running the CLI as a subprocess with the checkout on its path, and watching launched runs (their ranks,
files, exit)."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT, subprocess_env

REPO = REPO_ROOT
CONFIG_DIR = REPO / 'config'
PER_CONFIG = CONFIG_DIR / 'cartpole_dqn_per.py'
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
# Greedy evaluation return of a uniformly random policy on CartPole-v1 is ~22 (std ~11, max ~60 over 200
# episodes); a 10-episode mean above this is far out of a random policy's reach.
LEARNED_RETURN = 100.0

# the environment of CLI subprocesses: the checkout's ding_buffer first on the path, unbuffered output
ENV = subprocess_env(PYTHONUNBUFFERED='1')


def write_config(path: Path, base: Path = PER_CONFIG, *overrides: dict, buffer: dict = None, **more) -> Path:
    """A config file that loads the shipped ``base`` config and deep-merges each of ``overrides`` and then
    ``more`` (plain literals) into its ``main_config``; ``buffer`` replaces the whole replay buffer section."""
    merges = list(overrides) + ([more] if more else [])
    path.write_text(
        "import runpy\n"
        f"main_config = runpy.run_path({str(base)!r})['main_config']\n"
        "def _merge(d, u):\n"
        "    for k, v in u.items():\n"
        "        if isinstance(v, dict) and isinstance(d.get(k), dict):\n"
        "            _merge(d[k], v)\n"
        "        else:\n"
        "            d[k] = v\n"
        + ''.join(f"_merge(main_config, {o!r})\n" for o in merges)
        + (f"main_config['policy']['other']['replay_buffer'] = {buffer!r}\n" if buffer is not None else '')
    )
    return path


def cli_cmd(*args):
    return [sys.executable, '-m', 'ding_buffer', *[str(a) for a in args]]


def cli(*args, cwd, timeout=120):
    return subprocess.run(cli_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=ENV)


def read_csv(path: Path):
    with open(path) as f:
        return list(csv.DictReader(f))


def assert_user_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    assert 'Traceback' not in err, err
    assert err.startswith('ding-buffer: error: '), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def start(cfg: Path, root: Path, *extra) -> subprocess.Popen:
    """`ding-buffer train cfg *extra` in its own session (so a test can kill the whole job)."""
    return subprocess.Popen(
        cli_cmd('train', cfg, '--no-progress', *extra),
        cwd=root,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(p: subprocess.Popen, timeout: float = 240):
    """``(returncode, stdout, stderr)`` of a started run; the test fails (and the job is killed) past ``timeout``."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f'run did not finish within {timeout}s\n{out[-3000:]}\n{err[-3000:]}')
    return p.returncode, out, err


def ranks_of(p: subprocess.Popen, deadline: float = 60.0, count: int = 4) -> dict:
    """{RANK: pid} of the ``count`` env:// ranks the torch launcher started (read from /proc)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = {}
        try:
            children = Path(f'/proc/{p.pid}/task/{p.pid}/children').read_text().split()
        except OSError:
            children = []
        for pid in children:
            try:
                env = Path(f'/proc/{pid}/environ').read_bytes().split(b'\0')
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b'RANK='):
                    found[int(kv[5:])] = int(pid)
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError(f'ranks of {p.pid} not found')


def wait_for(path: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f'{path} did not appear within {timeout}s')
        time.sleep(0.2)

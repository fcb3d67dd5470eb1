"""The venv with DI-engine that test_dingengine_pipelines.py runs its pipelines in, built in the background.

The suite's own venv has no DI-engine dependencies (``ding`` imports, ``ding.utils`` does not), so the pipeline tests
build a venv of their own: torch first (``torch==2.13.0``: on a CPU machine the CPU wheel, which every later step is
then constrained to keep), DI-engine without its dependencies (its metadata pins versions that do not install
together), then the dependencies its serial and task pipelines import, pinned to versions that work together. The
checkout's ``ding_buffer`` reaches it through ``PYTHONPATH``, so its runtime dependencies are in the list too.

The ~1-2 minutes of pip run while the rest of the suite runs: when collection has selected any test of that module
(not under ``-m "not slow"``, not with ``--collect-only``), ``pytest_collection_finish`` starts the build in a
daemon thread, and the session fixture ``dingengine_python`` waits for it with a deadline. Under pytest-xdist every
worker collects every test, and which worker runs the module is decided later: the first worker to create the build
folder in the run's shared base temp folder builds there, and the worker that runs the module waits for the build's
status file. Every subprocess has a timeout; the worker that used the venv deletes it (about 1.5 GB) at its end, and
the builder's end waits for (or stops, past the deadline) a build still running.

``DINGENGINE_PYTHON=/path/to/venv/bin/python`` runs the tests in an existing venv instead (a developer's shortcut:
no build then).
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

# the driver runs inside the DI-engine venv only: never imported by collection (e.g. --doctest-modules)
collect_ignore = ['dingengine_driver.py']

MODULE = 'test_dingengine_pipelines.py'
TORCH = 'torch==2.13.0'
DINGENGINE = 'di-engine==0.5.3'
# What DI-engine's serial and task pipelines import (ding.entry, ding.framework, dizoo's CartPole), plus
# ding_buffer's runtime dependencies (easydict, tensorboard; numpy and torch come with the others).
DEPENDENCIES = [
    'numpy<2',
    'gym==0.25.1',
    'gymnasium==1.4.0',
    'yapf==0.29.0',
    'DI-toolkit==0.3.0',
    'DI-treetensor==0.5.0',
    'tensorboardX==2.6.5',
    'tensorboard==2.21.0',
    'easydict==1.14',
    'pyyaml==6.0.4',
    'requests==2.34.2',
    'flask==3.1.3',
    'URLObject==3.0.0',
    'tabulate==0.10.0',
    'hickle==5.0.3',
    'mpire==2.10.2',
    'redis==8.1.0',
    'pynng==0.9.0',
    'einops==0.8.2',
    'wandb==0.31.0',
]
# a small package from the index, downloaded only when torch's download failed: tells "no index" from a bad pin
PROBE = 'easydict==1.14'
PIP_FLAGS = ['-q', '--disable-pip-version-check', '--no-input']
# seconds: the whole build, and each step
BUILD_TIMEOUT = 1200
STEP_TIMEOUTS = {'venv': 180, 'download': 600, 'install': 600, 'check': 120}
BUILD_KEY = pytest.StashKey['VenvBuild']()
USED_KEY = pytest.StashKey[Path]()


class BuildFailed(Exception):
    pass


class VenvBuild:
    """Builds the venv under ``root`` in a daemon thread; the outcome goes to ``root/status.json`` (``state``: ok,
    skip or error; ``message``; ``times``: seconds per step), which any process of the run can wait for."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.times = {}
        self._done = threading.Event()
        self._stop = threading.Event()
        self._proc = None
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name='dingengine-venv-build', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop a build still running (kill its subprocess) and wait a little for the thread."""
        self._stop.set()
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
        self._thread.join(30)

    def finish(self) -> None:
        """The builder's session end: a worker without the module's tests waits for the build that another worker
        may be waiting for (stopped past the deadline)."""
        if not self._done.wait(max(BUILD_TIMEOUT - (time.monotonic() - self._started), 0)):
            self.stop()

    # ------------------------------------------------------------------ the build
    def _step(self, name: str, argv: list, timeout: float) -> str:
        with self._lock:
            if self._stop.is_set():
                raise BuildFailed(f'{name}: the session ended before the build finished')
            self._proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=self.root, env=_pip_env()
            )
        t0 = time.monotonic()
        try:
            output, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            output, _ = self._proc.communicate()
            raise BuildFailed(f'{name}: timed out after {timeout} s\n$ {" ".join(argv)}\n{output[-6000:]}') from None
        self.times[name] = round(time.monotonic() - t0, 1)
        if self._proc.returncode != 0:
            raise BuildFailed(f'{name}: exit status {self._proc.returncode}\n$ {" ".join(argv)}\n{output[-6000:]}')
        return output

    def _run(self) -> None:
        venv = self.root / 'venv'
        state, message = 'error', ''
        try:
            skip = self._build(venv)
            state, message = ('skip', skip) if skip else ('ok', str(venv / 'bin' / 'python'))
        except BuildFailed as e:
            message = f'building the DI-engine venv in {venv} failed at {e}'
        except Exception:  # noqa: BLE001 - reported by the fixture, not lost in a thread
            message = f'building the DI-engine venv in {venv} crashed:\n{traceback.format_exc()}'
        finally:
            self.times['total'] = round(time.monotonic() - self._started, 1)
            status = {'state': state, 'message': message, 'times': self.times}
            tmp = self.root / 'status.json.tmp'
            tmp.write_text(json.dumps(status))
            tmp.replace(self.root / 'status.json')
            self._done.set()

    def _build(self, venv: Path) -> str:
        """Build; returns why it skipped (no index), '' when built."""
        self._step('venv', [sys.executable, '-m', 'venv', str(venv)], STEP_TIMEOUTS['venv'])
        python = str(venv / 'bin' / 'python')
        pip = [python, '-m', 'pip']
        wheels = self.root / 'wheels'
        # the first package on its own: its download failing (and a small one's too) means there is no index
        try:
            self._step(
                'download torch',
                pip + ['download', *PIP_FLAGS, '--no-deps', '-d', str(wheels), TORCH],
                STEP_TIMEOUTS['download'],
            )
        except BuildFailed as e:
            try:
                self._step(
                    'probe the index',
                    pip + ['download', *PIP_FLAGS, '--no-deps', '-d', str(self.root / 'probe'), PROBE],
                    STEP_TIMEOUTS['download'],
                )
            except BuildFailed as probe:
                return (
                    f'no package index reachable to build the DI-engine venv: pip download of {TORCH} failed, and '
                    f'so did {PROBE}:\n{e}\n{probe}'
                )
            raise
        wheel = sorted(wheels.glob('torch-*.whl'))
        if len(wheel) != 1:
            raise BuildFailed(f'download torch: expected one torch wheel in {wheels}, found {wheel}')
        # --no-compile: no .pyc for the thousands of modules never imported (those imported compile on import)
        install = pip + ['install', *PIP_FLAGS, '--no-compile']
        self._step('install torch', install + [str(wheel[0])], STEP_TIMEOUTS['install'])
        shutil.rmtree(wheels, ignore_errors=True)
        show = [python, '-c', "import importlib.metadata as m; print(m.version('torch'))"]
        version = self._step('check torch', show, STEP_TIMEOUTS['check']).split()[-1]
        constraints = self.root / 'constraints.txt'
        constraints.write_text(f'torch=={version}\n')  # nothing may pull another torch
        self._step('install DI-engine', install + ['--no-deps', DINGENGINE], STEP_TIMEOUTS['install'])
        self._step('install dependencies', install + ['-c', str(constraints), *DEPENDENCIES], STEP_TIMEOUTS['install'])
        after = self._step('check torch again', show, STEP_TIMEOUTS['check']).split()[-1]
        if after != version:
            raise BuildFailed(f'check torch again: the dependencies replaced torch {version} by {after}')
        return ''


def _pip_env() -> dict:
    env = dict(os.environ)
    for name in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV', 'PIP_REQUIRE_VIRTUALENV', 'PIP_USER'):
        env.pop(name, None)
    return env


def _build_root(config) -> Path:
    """The build's folder, the same for every process of the run: in the run's base temp folder (pytest-xdist gives
    each worker a folder inside the controller's)."""
    base = config._tmp_path_factory.getbasetemp()  # tmp_path_factory's, before any fixture runs
    if os.environ.get('PYTEST_XDIST_WORKER'):
        base = base.parent
    return base / 'dingengine_venv'


def _claim(config) -> None:
    """Start the build unless another process of the run has (the folder's creation is the claim)."""
    root = _build_root(config)
    try:
        root.mkdir()
    except FileExistsError:
        return
    (root / 'started').write_text(str(time.time()))
    config.stash[BUILD_KEY] = VenvBuild(root)


def pytest_collection_finish(session):
    """Start the build as soon as the selected tests are known, so that pip overlaps the rest of the suite."""
    config = session.config
    if config.option.collectonly or os.environ.get('DINGENGINE_PYTHON'):
        return
    if any(item.path.name == MODULE for item in session.items):
        _claim(config)


def pytest_sessionfinish(session):
    config = session.config
    build = config.stash.get(BUILD_KEY, None)
    if build is not None:
        build.finish()
    used = config.stash.get(USED_KEY, None)
    if used is not None:
        shutil.rmtree(used / 'venv', ignore_errors=True)


def pytest_terminal_summary(terminalreporter, config):
    if os.environ.get('PYTEST_XDIST_WORKER'):
        return
    status_file = _build_root(config) / 'status.json'
    if status_file.exists():
        status = json.loads(status_file.read_text())
        times = ', '.join(f'{k} {v} s' for k, v in status['times'].items())
        terminalreporter.write_line(f"DI-engine venv build (background): {status['state']}; {times}")


@pytest.fixture(scope='session')
def dingengine_python(request) -> Path:
    """The python of a venv with DI-engine 0.5.3 and its pipelines' dependencies (``ding_buffer`` not installed:
    put the checkout on ``PYTHONPATH``)."""
    given = os.environ.get('DINGENGINE_PYTHON')
    if given:
        return Path(given)
    config = request.config
    root = _build_root(config)
    if not root.exists():  # not claimed at collection (the module reached some other way): build now
        _claim(config)
    config.stash[USED_KEY] = root
    status_file = root / 'status.json'
    while not status_file.exists():
        try:
            started = float((root / 'started').read_text())
        except (OSError, ValueError):
            started = time.time()
        if time.time() - started > BUILD_TIMEOUT + 60:
            build = config.stash.get(BUILD_KEY, None)
            if build is not None:
                build.stop()
            pytest.fail(f'the DI-engine venv in {root} was not built within {BUILD_TIMEOUT} s (no status.json)')
        time.sleep(0.5)
    status = json.loads(status_file.read_text())
    times = ', '.join(f'{k} {v} s' for k, v in status['times'].items())
    print(f'DI-engine venv build (background): {times}')
    if status['state'] == 'skip':
        pytest.skip(status['message'])
    if status['state'] != 'ok':
        pytest.fail(status['message'], pytrace=False)
    return Path(status['message'])

"""The package as a user installs it: a wheel with the ready configs, py.typed and the licence; installed into a
fresh venv outside the checkout it lists and resolves its configs; the declared minimum Python is honoured."""

import email
import os
import re
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYENV = Path(os.environ.get('PYENV_ROOT', '/root/.pyenv')) / 'versions'


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp('wheel')
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', '-w', str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob('ding_buffer-*.whl')
    return path


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
        return email.message_from_bytes(z.read(name))


def test_wheel_holds_every_ready_config_py_typed_and_the_licence(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    shipped = {p.name for p in (REPO / 'config').glob('*.py')}
    assert shipped and {f'ding_buffer/configs/{n}' for n in shipped} <= names
    assert 'ding_buffer/py.typed' in names
    assert any(n.endswith('.dist-info/licenses/LICENSE') for n in names)
    assert not any(n.startswith(('tests/', 'benchmarks/', 'config/')) for n in names)


def test_wheel_metadata_names_licence_author_python_and_entry_point(wheel):
    meta = _metadata(wheel)
    assert meta['Name'] == 'ding-buffer'
    assert meta['License-Expression'] == 'Apache-2.0' or meta['License'] == 'Apache-2.0'
    assert meta['Author']
    assert meta['Requires-Python'] == '>=3.10'
    requires = meta.get_all('Requires-Dist')
    assert any(r.startswith('torch') for r in requires) and any(r.startswith('numpy') for r in requires)
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/entry_points.txt'))
        entry = z.read(name).decode()
    assert re.search(r'^ding-buffer\s*=\s*ding_buffer\.cli:console_main$', entry, re.M), entry
    assert (REPO / 'LICENSE').read_text().lstrip().startswith('Apache License')


def _venv_seeing_this_interpreters_packages(venv: Path) -> Path:
    """A fresh venv (no ``--system-site-packages``: from inside a venv that would expose the *base* interpreter's
    packages, not the running one's) whose ``sys.path`` ends with the running interpreter's site-packages, so torch,
    numpy and gymnasium need no second install; its own site-packages come first, so what is installed into it
    wins. The added folders are plain path entries: their ``.pth`` files (an editable install of this checkout
    among them) are not processed."""
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True, timeout=120)
    py = venv / 'bin' / 'python'
    own = subprocess.run(
        [str(py), '-c', 'import site; print(site.getsitepackages()[0])'], capture_output=True, text=True, timeout=60
    )
    assert own.returncode == 0, own.stderr
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(own.stdout.strip()) / '_outer_site_packages.pth').write_text(''.join(f'{p}\n' for p in outer))
    return py


def test_wheel_installed_in_a_fresh_venv_runs_its_configs_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / 'venv'
    py = _venv_seeing_this_interpreters_packages(venv)
    proc = subprocess.run(
        [str(py), '-m', 'pip', 'install', '-q', '--no-deps', str(wheel)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / 'elsewhere'
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['PATH'] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    def run(*argv, timeout=120):
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=work, env=env)

    where = run(
        str(py), '-c', 'import ding_buffer, ding_buffer.configs as c; print(ding_buffer.__file__); print(c.__file__)'
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert Path(line).is_relative_to(venv) and not Path(line).is_relative_to(REPO), where.stdout
    listed = run(str(venv / 'bin' / 'ding-buffer'), 'configs')
    assert listed.returncode == 0, listed.stderr
    assert {p.stem for p in (REPO / 'config').glob('*.py') if not p.stem.startswith('_')} <= {
        line.split()[0] for line in listed.stdout.splitlines() if line.strip()
    }
    trained = run(
        str(venv / 'bin' / 'ding-buffer'),
        'train',
        'cartpole_dqn_per',
        '--env-steps',
        '300',
        '--no-progress',
        timeout=180,
    )
    assert trained.returncode == 0, trained.stderr
    assert str(venv) in trained.stdout.splitlines()[0]  # the packaged config file ran
    assert (work / 'cartpole_dqn_per_seed0' / 'summary.json').is_file()


# ------------------------------------------------------------------------------------------ python_requires
def _minimum_python() -> tuple:
    text = (REPO / 'setup.py').read_text()
    m = re.search(r"python_requires='>=(\d+)\.(\d+)'", text)
    assert m, 'setup.py declares no python_requires'
    return int(m.group(1)), int(m.group(2))


def _sources():
    return sorted(REPO.glob('ding_buffer/**/*.py')) + sorted(REPO.glob('config/*.py'))


def _interpreters(minimum: tuple):
    found = {}
    for exe in sorted(PYENV.glob('3.*/bin/python3')) + [Path(p) for p in ('/usr/bin/python3',)]:
        try:
            out = subprocess.run(
                [str(exe), '-c', 'import sys; print(*sys.version_info[:2])'], capture_output=True, text=True, timeout=30
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2 and tuple(map(int, out)) >= minimum:
            found.setdefault(tuple(map(int, out)), exe)
    return found


def test_every_source_compiles_on_every_supported_python_found_here():
    """The syntax of every module and config, checked by each interpreter >= python_requires on this machine
    (pyenv's 3.10-3.13 here; the full suite runs on one of them)."""
    minimum = _minimum_python()
    found = _interpreters(minimum)
    if minimum not in found:
        pytest.skip(f'no Python {minimum[0]}.{minimum[1]} on this machine')
    code = (
        "import sys\nbad = []\nfor f in sys.argv[1:]:\n    try:\n        compile(open(f).read(), f, 'exec')\n"
        "    except SyntaxError as e:\n        bad.append(f'{f}:{e.lineno}: {e.msg}')\nprint('\\n'.join(bad))"
    )
    for version, exe in sorted(found.items()):
        proc = subprocess.run(
            [str(exe), '-c', code, *map(str, _sources())], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0 and not proc.stdout.strip(), f'Python {version}: {proc.stdout}{proc.stderr}'

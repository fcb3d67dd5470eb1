"""Shared pytest setup of the test suite.

The folders mirror the package (buffers/, control/, monitor/, storage/, distributed/, train/); end-to-end and
cross-cutting tests stay here. There is no ``__init__.py``: in pytest's default (prepend) import mode this file's
folder goes on ``sys.path``, so a test module in any folder imports the shared code as ``import helpers``
(tests/helpers.py); a folder's own helper module (distributed/dist_helpers.py, train/train_helpers.py) is
imported only by the modules of that folder. Test module basenames are unique across folders.

The ``slow`` marker: tests that start processes (torchrun, mpirun, Ray, python subprocesses, multiprocessing),
run a training job, or take more than about 5 s. ``pytest -m "not slow" tests`` is the quick set.
"""

import pytest

# the rank scripts are programs the distributed tests start (they read their rank from the environment at import):
# never imported by collection (e.g. --doctest-modules)
collect_ignore_glob = ['distributed/dist_scripts/*']

# test_packaging.py goes with the packaging files (setup.py, .ci/) and is edited with them: its tests that start
# processes (pip wheel, fresh venvs, other interpreters) are marked slow here
SLOW_ELSEWHERE = {
    'test_packaging.py': {
        'test_wheel_holds_every_ready_config_py_typed_and_the_licence',
        'test_wheel_metadata_names_licence_author_python_and_entry_point',
        'test_wheel_installed_in_a_fresh_venv_runs_its_configs_outside_the_checkout',
        'test_every_source_compiles_on_every_supported_python_found_here',
    }
}


def pytest_configure(config):
    config.addinivalue_line(
        'markers',
        'slow: starts processes (torchrun, mpirun, Ray, python subprocesses, multiprocessing), runs a training '
        'job, or takes more than about 5 s (deselect with -m "not slow")',
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item, 'originalname', None) in SLOW_ELSEWHERE.get(item.path.name, ()):  # doctests have none
            item.add_marker(pytest.mark.slow)

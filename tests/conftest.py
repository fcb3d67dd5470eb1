"""Shared pytest setup of the test suite.

The folders mirror the package (buffers/, control/, monitor/, storage/, distributed/, train/); end-to-end and
cross-cutting tests stay here. There is no ``__init__.py``: in pytest's default (prepend) import mode this file's
folder goes on ``sys.path``, so a test module in any folder imports the shared code as ``import helpers``
(tests/helpers.py); a folder's own helper module (distributed/dist_helpers.py, train/train_helpers.py) is
imported only by the modules of that folder. Test module basenames are unique across folders.

The ``slow`` marker: tests that start processes (torchrun, mpirun, Ray, python subprocesses, multiprocessing),
run a training job, or take more than about 5 s. ``pytest -m "not slow" tests`` is the quick set.
"""


def pytest_configure(config):
    config.addinivalue_line(
        'markers',
        'slow: starts processes (torchrun, mpirun, Ray, python subprocesses, multiprocessing), runs a training '
        'job, or takes more than about 5 s (deselect with -m "not slow")',
    )


# the rank scripts are programs the distributed tests start (they read their rank from the environment at import):
# never imported by collection (e.g. --doctest-modules)
collect_ignore_glob = ['distributed/dist_scripts/*']

"""Collection rules for the whole checkout (``--doctest-modules`` imports every module it is pointed at)."""

# the command-line entry runs the CLI when imported; the rank scripts are started as programs by the tests
collect_ignore = ['ding_buffer/__main__.py', 'setup.py']
collect_ignore_glob = ['tests/distributed/dist_scripts/*', 'benchmarks/*', 'config/*']

try:  # the DI-engine integration imports DI-engine with its pipeline dependencies, which the test extra has not
    import ding.data.buffer  # noqa: F401
except Exception:
    collect_ignore.append('ding_buffer/integrations/dingengine.py')

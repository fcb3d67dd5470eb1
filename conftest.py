"""Collection rules for the whole checkout (``--doctest-modules`` imports every module it is pointed at)."""

# the command-line entry runs the CLI when imported; the rank scripts are started as programs by the tests
collect_ignore = ['ding_buffer/__main__.py', 'setup.py']
collect_ignore_glob = ['tests/dist_scripts/*', 'benchmarks/*', 'config/*']

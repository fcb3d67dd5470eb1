"""Environment variables of the training jobs: what a launcher sets in the processes it starts, and the CLI reads.

Nothing heavy here (the CLI imports it before torch loads).
"""

# set in the ranks ``launch.py`` starts itself (--nproc): they print no first line and no "interrupted" line of
# their own (the launcher does)
LAUNCHED = 'DING_BUFFER_LAUNCHED'

__all__ = ['LAUNCHED']

"""``njit`` from numba when it is installed (and not disabled), else a no-op decorator.

``DING_BUFFER_NO_NUMBA=1`` forces the pure-Python/numpy fallbacks (the tests run both backends).
"""
import os

try:
    if os.environ.get('DING_BUFFER_NO_NUMBA', '') not in ('', '0'):
        raise ImportError('disabled by DING_BUFFER_NO_NUMBA')
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised by the no-numba test run
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        return lambda f: f


__all__ = ['njit', 'HAVE_NUMBA']

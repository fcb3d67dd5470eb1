"""``njit`` from numba when it is installed (and not disabled), else a no-op decorator -- loaded lazily.

``import ding_buffer`` does not import numba: a decorated function is a stand-in until the first call of any
kernel. That call imports numba once, makes every pending function a numba dispatcher (``cache=True`` reuses
the compiled code of earlier runs) and puts the dispatchers where the stand-ins were -- in every
``ding_buffer`` module that holds one -- so kernels calling kernels see dispatchers when numba compiles them,
and later calls skip the stand-in. A numba that is installed but fails to import leaves the plain Python
functions (correct, slow).

``DING_BUFFER_NO_NUMBA=1`` forces the pure-Python/numpy fallbacks (the tests run both backends).
"""
import importlib.util
import os
import sys
import threading
from typing import Any, Callable, List

_DISABLED = os.environ.get('DING_BUFFER_NO_NUMBA', '') not in ('', '0')
HAVE_NUMBA = not _DISABLED and importlib.util.find_spec('numba') is not None

_LOCK = threading.Lock()
_PENDING: List['_Kernel'] = []
_numba: Any = None  # the numba module once loaded


class _Kernel:
    """A function to compile with ``numba.njit(**options)`` on first use."""

    def __init__(self, func: Callable, options: dict) -> None:
        self.py_func, self.options, self.compiled = func, options, None
        self.__name__, self.__qualname__, self.__doc__ = func.__name__, func.__qualname__, func.__doc__
        self.__module__ = func.__module__

    def __call__(self, *args: Any) -> Any:
        compiled = self.compiled
        if compiled is None:
            load()
            compiled = self.compiled
        return compiled(*args)

    def __repr__(self) -> str:
        return f'<kernel {self.__module__}.{self.__qualname__} ({"loaded" if self.compiled else "not loaded"})>'


def load() -> None:
    """Import numba and turn every pending function into a dispatcher (once; later calls return at once)."""
    global _numba
    with _LOCK:
        if not _PENDING:
            return
        if _numba is None:
            try:
                import numba
                _numba = numba
            except Exception:  # an installed but broken numba: the plain functions still give the right answers
                _numba = False
        pending = list(_PENDING)
        swap = {id(k): _numba.njit(**k.options)(k.py_func) if _numba else k.py_func for k in pending}
        for name, module in list(sys.modules.items()):
            if module is None or not (name == 'ding_buffer' or name.startswith('ding_buffer.')):
                continue
            space = getattr(module, '__dict__', {})
            for attr, value in list(space.items()):
                if id(value) in swap and isinstance(value, _Kernel):
                    space[attr] = swap[id(value)]
        # only now, with every module holding dispatchers, may another thread call one: numba compiles a kernel
        # on its first call and must find its callees' dispatchers, not stand-ins
        for kernel in pending:
            kernel.compiled = swap[id(kernel)]
        _PENDING.clear()


def njit(*args: Any, **options: Any) -> Any:
    """``@njit`` / ``@njit(cache=True, ...)``: numba's, compiled on first use; the function itself without numba."""
    def decorate(func: Callable) -> Any:
        if not HAVE_NUMBA:
            return func
        if _numba:  # already loaded: compile as numba would
            return _numba.njit(**options)(func)
        kernel = _Kernel(func, options)
        with _LOCK:
            _PENDING.append(kernel)
        return kernel

    if len(args) == 1 and callable(args[0]) and not options:
        return decorate(args[0])
    return decorate


__all__ = ['njit', 'HAVE_NUMBA', 'load']

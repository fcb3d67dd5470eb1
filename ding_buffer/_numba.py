"""``njit`` from numba when it is installed (and not disabled), else a no-op decorator -- loaded lazily, in the
background.

``import ding_buffer`` does not import numba: a decorated function is a stand-in (``_Kernel``) until the kernels
are loaded. Loading costs about a second in a fresh process even when numba's on-disk cache holds every kernel
(importing numba and initialising its compiler target dominate), so it runs in a daemon thread, started by the
first call of any kernel (or by ``ready()`` / ``start()``):

* a kernel registered with a ``fallback`` (a numpy or plain-Python function giving identical results, as the
  tree kernels' numpy versions do) calls the fallback until the kernels are ready -- the first pushes, samples
  and updates of a process never wait for the compiler;
* a kernel without one waits for the load to finish (``load()``);
* call sites that choose between a fused compiled path and a checking numpy path ask ``ready()``.

The thread compiles every pending function against a private copy of its module's globals in which the other
stand-ins are already dispatchers (numba resolves a kernel's callees when it compiles it), runs the warm-up
functions modules registered with ``warmer`` (tiny calls that load each signature's cached machine code), and
only then puts the dispatchers where the stand-ins were -- in every ``ding_buffer`` module -- so later calls skip
the stand-in and no caller ever meets a dispatcher that still has to be loaded. ``cache=True`` reuses the
compiled code of earlier runs. A numba that is installed but fails to import leaves the plain functions
(correct, slow). A fork waits for a load in progress (the child never inherits a half-held compiler lock).

``DING_BUFFER_NO_NUMBA=1`` forces the pure-Python/numpy fallbacks (the tests run both backends).
"""

import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Any, Callable, Dict, List, Optional

from . import forks

_DISABLED = os.environ.get('DING_BUFFER_NO_NUMBA', '') not in ('', '0')
HAVE_NUMBA = not _DISABLED and importlib.util.find_spec('numba') is not None

_LOCK = threading.RLock()  # held for a whole load; a fork waits for it
_READY = threading.Event()
_PENDING: List['_Kernel'] = []
_WARMERS: List[Callable[[], None]] = []
_TLS = threading.local()  # ``warming``: the loading thread calls the new dispatchers through the stand-ins
_thread: Optional[threading.Thread] = None
_numba: Any = None  # the numba module once imported (False: installed but broken)
_log = logging.getLogger(__name__)


class _Kernel:
    """A function to compile with ``numba.njit(**options)``; until then ``fallback`` or a wait for the load."""

    def __init__(self, func: Callable, options: dict, fallback: Optional[Callable]) -> None:
        self.py_func, self.options, self.fallback = func, options, fallback
        self.compiled: Any = None  # the dispatcher, once loaded and warmed
        self.dispatcher: Any = None  # the dispatcher while the loading thread warms it
        self.__name__, self.__qualname__, self.__doc__ = func.__name__, func.__qualname__, func.__doc__
        self.__module__ = func.__module__

    def __call__(self, *args: Any) -> Any:
        compiled = self.compiled
        if compiled is not None:
            return compiled(*args)
        if self.dispatcher is not None and getattr(_TLS, 'warming', False):
            return self.dispatcher(*args)
        if self.fallback is not None:
            start()
            return self.fallback(*args)
        load()
        return self.compiled(*args)

    def __repr__(self) -> str:
        return f'<kernel {self.__module__}.{self.__qualname__} ({"loaded" if self.compiled else "not loaded"})>'


def ready() -> bool:
    """Whether the compiled kernels are loaded and warm (starts loading them if not). False without numba.
    True inside the loading thread's warm-up, so warm-up calls reach the fused compiled paths."""
    if _READY.is_set():
        return bool(_numba)
    if getattr(_TLS, 'warming', False):
        return True
    if HAVE_NUMBA:
        start()
    return False


def start() -> None:
    """Load the pending kernels in a daemon thread (a no-op while one runs or when nothing is pending)."""
    global _thread
    if not _PENDING or (_thread is not None and _thread.is_alive()):
        return
    with _LOCK:
        if _PENDING and (_thread is None or not _thread.is_alive()):
            thread = threading.Thread(target=load, name='ding_buffer-numba-load', daemon=True)
            if forks.started(thread):  # (else the fallbacks go on; the next call tries again)
                _thread = thread


LOAD_TIMEOUT_S = 600.0  # a load takes about a second from the cache, a minute when everything compiles


def load() -> None:
    """Import numba, compile (or load from the cache) and warm every pending function, then swap the dispatchers
    in. Blocks until done -- also when the loading thread is at it; returns at once when nothing is pending.
    Raises ``TimeoutError`` when another thread's load holds it up longer than ``LOAD_TIMEOUT_S``."""
    if not _PENDING:
        return
    if not _LOCK.acquire(timeout=LOAD_TIMEOUT_S):
        raise TimeoutError(
            f"ding_buffer's numba kernels did not finish loading within {LOAD_TIMEOUT_S:.0f} s "
            f"(set DING_BUFFER_NO_NUMBA=1 to run without them)"
        )
    try:
        _load_locked()
    finally:
        _LOCK.release()


def _load_locked() -> None:
    """``load`` with ``_LOCK`` held."""
    global _numba
    if not _PENDING:
        return
    if _numba is None:
        try:
            import numba

            _numba = numba
        except Exception:  # an installed but broken numba: the plain functions still give the right answers
            _numba = False
    pending = list(_PENDING)
    swap = None
    if _numba:
        try:
            swap = _compile(pending)
            _warm(pending, swap)
        except Exception as e:  # never retried: the plain functions serve from now on
            _log.warning(
                'ding_buffer: compiling the numba kernels failed (%r); using the numpy / Python '
                'versions (correct, slower)',
                e,
            )
            _numba = False
            for kernel in pending:
                kernel.dispatcher = None
    if not _numba:
        swap = {id(k): k.fallback or k.py_func for k in pending}
    # copies taken in one step (``dict.copy`` runs no Python code): another thread's import -- or a finalizer the
    # garbage collector runs while ``list(...)`` allocates -- may change these dicts while they are walked
    for name, module in sys.modules.copy().items():
        if module is None or not (name == 'ding_buffer' or name.startswith('ding_buffer.')):
            continue
        space = getattr(module, '__dict__', {})
        for attr, value in space.copy().items():
            if isinstance(value, _Kernel) and id(value) in swap:
                space[attr] = swap[id(value)]
    for kernel in pending:
        kernel.compiled = swap[id(kernel)]
    _PENDING.clear()
    _READY.set()


def _compile(pending: List[_Kernel]) -> Dict[int, Any]:
    """A dispatcher per stand-in, each over a copy of its function whose globals hold dispatchers (not stand-ins)
    for every kernel -- what numba must find when it compiles a kernel that calls another one."""
    spaces: Dict[str, Dict[str, Any]] = {}
    for kernel in pending:
        if kernel.__module__ not in spaces:
            spaces[kernel.__module__] = dict(kernel.py_func.__globals__)
    swap: Dict[int, Any] = {}
    for kernel in pending:
        f = kernel.py_func
        twin = types.FunctionType(f.__code__, spaces[kernel.__module__], f.__name__, f.__defaults__, f.__closure__)
        twin.__qualname__, twin.__doc__, twin.__kwdefaults__ = f.__qualname__, f.__doc__, f.__kwdefaults__
        try:
            swap[id(kernel)] = _numba.njit(**kernel.options)(twin)
        except RuntimeError as e:  # no place for numba's on-disk cache (a read-only install and home): compile
            if not kernel.options.get('cache'):  # in memory, each process anew
                raise
            _log.info('ding_buffer: numba cannot cache %s (%s); compiling it in memory', f.__name__, e)
            swap[id(kernel)] = _numba.njit(**{**kernel.options, 'cache': False})(twin)
    for space in spaces.values():
        for attr, value in list(space.items()):
            if isinstance(value, _Kernel):
                space[attr] = swap.get(id(value)) or value.compiled or value.py_func
    return swap


def _warm(pending: List[_Kernel], swap: Dict[int, Any]) -> None:
    """Run the registered warm-up calls against the new dispatchers (a failure only costs the first real call)."""
    for kernel in pending:
        kernel.dispatcher = swap[id(kernel)]
    _TLS.warming = True
    try:
        for warm in list(_WARMERS):
            try:
                warm()
            except Exception as e:  # pragma: no cover - a warm-up is an optimisation, never a reason to fail
                _log.debug('numba warm-up %s failed: %r', getattr(warm, '__qualname__', warm), e)
    finally:
        _TLS.warming = False


def warmer(func: Callable[[], None]) -> Callable[[], None]:
    """Register ``func`` (no arguments) to call kernels on tiny inputs of the dtypes the hot paths use, so the
    loading thread loads those signatures' machine code before the stand-ins hand over."""
    _WARMERS.append(func)
    return func


def set_fallback(kernel: Any, fallback: Any) -> None:
    """Give a stand-in its ``fallback`` after the fact (a function defined below the kernel, or ``'python'``: the
    kernel's own function run as plain Python). A no-op for anything that is not a stand-in."""
    if isinstance(kernel, _Kernel):
        kernel.fallback = kernel.py_func if fallback == 'python' else fallback


def njit(*args: Any, fallback: Optional[Callable] = None, **options: Any) -> Any:
    """``@njit`` / ``@njit(cache=True, ..., fallback=f)``: numba's, compiled in the background; ``fallback`` (same
    results) serves calls until then. Without numba: ``fallback`` when given, else the function itself."""

    def decorate(func: Callable) -> Any:
        if not HAVE_NUMBA:
            return fallback or func
        if _numba:  # already loaded: compile as numba would
            return _numba.njit(**options)(func)
        kernel = _Kernel(func, options, fallback)
        with _LOCK:
            _PENDING.append(kernel)
            _READY.clear()
        return kernel

    if len(args) == 1 and callable(args[0]) and not options and fallback is None:
        return decorate(args[0])
    return decorate


_FORK_WAIT_S = 120.0  # how long a fork waits for a load in progress (a load takes about a second)
_fork_held = threading.local()


def _before_fork() -> None:
    _fork_held.value = _LOCK.acquire(timeout=_FORK_WAIT_S)


def _after_fork_parent() -> None:
    if getattr(_fork_held, 'value', False):
        _fork_held.value = False
        _LOCK.release()


def _after_fork_child() -> None:
    global _LOCK, _thread
    _LOCK = threading.RLock()
    if not _READY.is_set():
        _thread = None  # a loading thread does not survive the fork: the child starts its own


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)

__all__ = ['njit', 'HAVE_NUMBA', 'load', 'ready', 'set_fallback', 'start', 'warmer']

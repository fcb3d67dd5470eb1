"""The public contract: ``IBuffer``, ``BUFFER_REGISTRY``, ``create_buffer`` and ``get_buffer_cls``.

A DI-engine pipeline builds its buffer with ``create_buffer(cfg.policy.other.replay_buffer, tb_logger=...,
exp_name=...)`` and only talks to it through the methods of ``IBuffer``; every preset here keeps that surface.
"""

import copy
import functools
import importlib
import logging
import os
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Type

from easydict import EasyDict

from . import forks
from .config import check_str_keys, closest_key


def _ensured(method: Callable) -> Callable:
    """``dict``'s ``method`` for a ``Registry``: its presets are loaded first (``Registry._ensure``)."""

    @functools.wraps(method)
    def reader(self: 'Registry', *args: Any) -> Any:
        self._ensure()
        return method(self, *args)

    return reader


class Registry(dict):
    """
    Overview:
        Name -> class mapping with a ``register(name)`` decorator that refuses duplicates.
    Interfaces:
        ``register``, ``get``, ``build``
    """

    def __init__(self, what: str = 'buffer type', key: str = 'type', presets: bool = False) -> None:
        super().__init__()
        self.what, self.key = what, key  # for messages: what is registered, and the config key naming it
        # the buffer registry: ``import ding_buffer`` registers the built-in presets on first use (a fast CLI
        # start), so every read and ``register`` loads them first -- a user's type can never take a built-in name
        self._presets = presets

    def _ensure(self) -> None:
        if self._presets:
            _load_presets()

    def register(self, name: str, replace: bool = False) -> Callable[[type], type]:
        """Register a class under ``name``. A name already taken is refused, unless the new class is a new
        definition of the same class (same module and qualified name: a notebook cell or a module run again) or
        ``replace=True`` -- never over one of ding_buffer's own classes."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"registry name must be a non-empty str, got {name!r}")

        def decorator(cls: type) -> type:
            self._ensure()
            if dict.__contains__(self, name):
                old = dict.__getitem__(self, name)
                same = (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
                builtin = old.__module__.startswith('ding_buffer.') and old is not cls
                if builtin or not (same or replace):
                    how = "" if builtin else "; pass replace=True to replace it"
                    raise ValueError(f"{self.what} '{name}' is already registered (by {old.__qualname__}){how}")
            self[name] = cls
            return cls

        return decorator

    # dict's readers, each after ``_ensure`` (``get`` and ``build`` go through them)
    __contains__ = _ensured(dict.__contains__)
    __getitem__ = _ensured(dict.__getitem__)
    __iter__ = _ensured(dict.__iter__)
    __len__ = _ensured(dict.__len__)
    keys = _ensured(dict.keys)
    values = _ensured(dict.values)
    items = _ensured(dict.items)

    def get(self, name: str, key: Optional[str] = None) -> type:  # type: ignore[override]
        """The class registered under ``name``; an unknown name is a ``ValueError`` naming the config ``key`` (default:
        the registry's own) and the registered names."""
        try:
            known_name = name in self
        except TypeError:  # unhashable (a list, a dict): no registered name
            known_name = False
        if not known_name:
            known = ', '.join(sorted(self)) or '(none)'
            near = closest_key(name, self.keys()) if isinstance(name, str) else ''
            hint = f"did you mean {near!r}? " if near else ''
            raise ValueError(
                f"unknown {self.what} {name!r} (config key '{key or self.key}'); {hint}registered: {known} (a module "
                f"of your own registering it goes in 'import_names')"
            )
        return self[name]

    def build(self, name: str, *args, **kwargs) -> Any:
        return self.get(name)(*args, **kwargs)


BUFFER_REGISTRY = Registry(presets=True)
_LOG = logging.getLogger('ding_buffer')


class IBuffer(ABC):
    """
    Overview:
        The replay-buffer contract shared by every preset (DI-engine's ``IBuffer`` plus explicit lifecycle).
        Constructor signature of every buffer: ``(cfg, tb_logger=None, exp_name='default_experiment',
        instance_name='buffer')``.
    Interfaces:
        ``push``, ``extend``, ``sample``, ``update``, ``clear``, ``count``, ``stats``, ``state_dict``,
        ``load_state_dict``, ``save_data``, ``load_data``, ``start``, ``close``, ``default_config``; ``len(buffer)`` and
        ``with buffer: ...`` (which calls ``close`` on exit). ``iter(buffer)`` is a ``TypeError`` (sample instead).
    """

    config: Dict[str, Any] = {}
    # Why a distributed manager cannot serve this type (None: it can); create_buffer refuses 'distributed' then.
    not_distributable: Optional[str] = None

    # ---- declared capabilities: what callers (the manager, the training jobs) read instead of probing classes
    # what one stored item is: 'transition', 'sequence' (sample(batch, sequence)), 'episode', 'trajectory'
    # (torchgfn trajectories), 'state' (terminating states) or 'chunk' (a worker's consecutive fragments)
    item_kind: str = 'transition'
    # the keyword arguments ``sample`` takes besides its size(s) and ``timeout``
    sample_kwargs: Tuple[str, ...] = ('cur_learner_iter',)
    # ``log_rewards()``: the stored items' log-rewards (what a manager's baseline reads)
    has_log_rewards: bool = False
    # ``update_model_version(version, session_id)``: the buffer gates pushes by model version itself
    version_gate: bool = False

    @classmethod
    def default_config(cls) -> EasyDict:
        """Return a deep copy of the class's default config with ``cfg_type = ClassName + 'Dict'``."""
        cfg = EasyDict(copy.deepcopy(cls.config))
        cfg.cfg_type = cls.__name__ + 'Dict'
        return cfg

    @abstractmethod
    def push(self, data: Any, cur_collector_envstep: int = -1) -> int:
        """Store one item or a list of items; return how many were stored."""

    @abstractmethod
    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        """Store a batch -- a dict whose leaves share a leading dimension (vectorised collectors) or a TensorDict
        of batch size ``[B]`` -- as its ``B`` items; return how many were stored."""

    @abstractmethod
    def sample(self, size: int, cur_learner_iter: int = -1, **kwargs) -> Optional[Any]:
        """Return a batch of ``size`` items, or ``None`` when sampling is not possible yet."""

    @abstractmethod
    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """Apply information (e.g. new priorities) about previously sampled items."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every stored item."""

    @abstractmethod
    def count(self) -> int:
        """Number of items currently stored."""

    @abstractmethod
    def stats(self) -> Dict[str, Any]:
        """A flat dict of numbers (``count`` and the counters), cheap to read: what monitors and TensorBoard poll."""

    @abstractmethod
    def state_dict(self) -> Dict[str, Any]:
        """A copy of the full state (data, counters, ids)."""

    @abstractmethod
    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """Restore ``state`` (all or nothing); ``deepcopy``: from a deep copy of it."""

    @abstractmethod
    def save_data(self, path: str) -> None:
        """Atomically write the buffer to ``path``."""

    @abstractmethod
    def load_data(self, path: str, allow_pickle: bool = False) -> None:
        """Restore the buffer from ``path`` written by ``save_data``."""

    def start(self) -> None:
        """Start background helpers (if any). Safe to call more than once."""

    def close(self) -> None:
        """Stop and join background helpers. Idempotent."""

    def __len__(self) -> int:
        return self.count()

    def __iter__(self) -> Any:
        """Buffers are not iterable: ``TypeError`` saying what to do instead (TorchRL's ``for batch in rb`` yields
        sampled batches; here a loop calls ``sample``)."""
        raise TypeError(
            f"{type(self).__name__} is not iterable: a replay buffer is sampled, not traversed. Draw batches with "
            f"`batch = buffer.sample(batch_size)` in a loop (TorchRL's `for batch in rb` yields such sampled "
            f"batches); `len(buffer)` counts the items and `buffer.state_dict()` copies them all."
        )

    _reseed_due = False  # (a forked child of a buffer built without a seed: its next draw takes a new seed first)

    def _after_fork(self) -> None:
        """In a forked child (``forks.tell_children``, buffers built without a seed): the next draw first takes a new
        seed from numpy's global RNG, as the first one did (a ``DataLoader`` seeds it in each of its workers)."""
        self._reseed_due = True

    def _reseed(self) -> None:
        self._reseed_due = False
        forks.new_seed(self._rng)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Buffers are not copied or pickled (``copy.copy`` would share the storage, files and lock; threads and
        sockets do not travel): ``TypeError`` saying how to move the contents instead."""
        raise TypeError(
            f"{type(self).__name__} cannot be copied or pickled (copy.copy, copy.deepcopy, pickle, torch.save, a "
            f"'spawn' process's arguments): move its contents with `state = buffer.state_dict()` and "
            f"`create_buffer(cfg).load_state_dict(state)`, or save_data() / load_data()"
        )

    @classmethod
    def distributed_profile(cls, cfg: Any) -> Dict[str, Any]:
        """
        Overview:
            What a distributed manager and its workers need to know about this buffer type, for its (local)
            config ``cfg``: ``dict_is_batch`` (a pushed dict is a batch of items, not one item),
            ``log_reward_key`` (the field holding log-rewards; None: ``distributed.log_reward_key``) and
            ``scoring_keys`` (the fields a manager needs to score a push, for ``scoring_only``; None: all).
        """
        return {'dict_is_batch': False, 'log_reward_key': None, 'scoring_keys': None, **cls.capabilities()}

    @classmethod
    def capabilities(cls) -> Dict[str, Any]:
        """
        Overview:
            The type's declared capabilities: ``item_kind``, ``sample_kwargs``, ``has_log_rewards`` and
            ``version_gate`` (the class attributes of the same names). Callers decide what a type can do from
            these, never from its class hierarchy.
        Examples:
            >>> from ding_buffer import BUFFER_REGISTRY
            >>> BUFFER_REGISTRY.get('episode').capabilities()['sample_kwargs']
            ('cur_learner_iter', 'sample_range', 'replace', 'unroll_len', 'pad')
        """
        return {
            'item_kind': cls.item_kind,
            'sample_kwargs': tuple(cls.sample_kwargs),
            'has_log_rewards': cls.has_log_rewards,
            'version_gate': cls.version_gate,
        }

    def __enter__(self) -> 'IBuffer':
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _import_modules(cfg: Any) -> None:
    """Import ``cfg.import_names``. DI-engine's own modules (``ding`` / ``ding.*``, e.g. the
    ``ding.data.buffer.deque_buffer_wrapper`` of its DQN configs) are skipped with one INFO line: they register
    DI-engine's buffers in DI-engine's registry, never here, and DI-engine is not a dependency."""
    names = cfg.get('import_names', []) if hasattr(cfg, 'get') else []
    if isinstance(names, str):
        names = [names]
    if names is None:
        names = []
    if not isinstance(names, (list, tuple)):
        raise TypeError(
            f"config key 'import_names' must be a list of module names, got {type(names).__name__} {names!r:.60}"
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"config key 'import_names' holds {name!r:.60}; expected module names (str)")
        if name == 'ding' or name.startswith('ding.'):
            _LOG.info(
                "import_names: skipped DI-engine module %r (ding_buffer provides type %r itself; DI-engine's "
                "modules register into DI-engine's registry)",
                name,
                cfg.get('type'),
            )
            continue
        importlib.import_module(name)


# Set by the package (``ding_buffer/__init__.py``): imports the modules that register the built-in presets and the
# distributed wrapper. The package loads them on first use, not at import; base.py imports nothing above it.
_PRESET_LOADER: Optional[Callable[[], None]] = None
_PRESETS = 'not loaded'  # -> 'loading' -> 'loaded'


def set_preset_loader(loader: Callable[[], None]) -> None:
    global _PRESET_LOADER
    _PRESET_LOADER = loader


_PRESET_LOCK = forks.lock()  # another thread's first use waits for the load; the loading thread re-enters


def _after_fork_child() -> None:
    """A load another thread was making when the process forked does not go on in the child: the child loads anew
    (it found half the types registered, for good)."""
    global _PRESETS
    if _PRESETS == 'loading' and not _PRESET_LOCK._is_owned():
        _PRESETS = 'not loaded'


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_child)


def _load_presets() -> None:
    """Run the package's preset loader once (the presets' own ``register`` calls during it do not re-enter); a
    first use in another thread meanwhile waits for it (it found an empty registry: 'unknown buffer type')."""
    global _PRESETS
    if _PRESETS == 'loaded' or _PRESET_LOADER is None:
        return
    if not _PRESET_LOCK.acquire(timeout=600):
        raise TimeoutError("ding_buffer's buffer types did not finish loading in another thread within 600 s")
    try:
        if _PRESETS != 'not loaded':  # loaded meanwhile, or being loaded by this thread (a nested call)
            return
        _PRESETS = 'loading'
        try:
            _PRESET_LOADER()
            _PRESETS = 'loaded'
        except BaseException:
            _PRESETS = 'not loaded'  # e.g. an ImportError: the next use tries again and raises it again
            raise
    finally:
        _PRESET_LOCK.release()


def _buffer_type(cfg: Any) -> str:
    _load_presets()
    if not hasattr(cfg, 'get'):
        raise TypeError(f"buffer config must be a dict/EasyDict, got {type(cfg).__name__}")
    name = cfg.get('type')
    if name is None:
        raise ValueError("buffer config has no 'type' key; expected one of: " + ', '.join(sorted(BUFFER_REGISTRY)))
    return name


def get_buffer_cls(cfg: Any) -> Type[IBuffer]:
    """Import ``cfg.import_names`` and return the class registered under ``cfg.type``."""
    _import_modules(cfg)
    return BUFFER_REGISTRY.get(_buffer_type(cfg))


def create_buffer(cfg: Any, *args, **kwargs) -> IBuffer:
    """
    Overview:
        Build the buffer registered under ``cfg.type`` after importing ``cfg.import_names``.
        Extra arguments go to the constructor (``tb_logger``, ``exp_name``, ``instance_name``). With
        ``cfg.distributed.backend`` set it returns a ``RemoteBuffer`` on workers and a ``ReplayBufferManager``
        (serve with ``run()``) on the manager rank (see ``ding_buffer.distributed``).
    Returns:
        - buffer (:obj:`IBuffer`)
    """
    cls = get_buffer_cls(cfg)
    if isinstance(cfg, Mapping):
        check_str_keys(cfg)
    cfg = EasyDict(cfg) if not isinstance(cfg, EasyDict) else cfg
    if 'dataset' in cfg:
        if _DATASET is None:
            raise RuntimeError("config key 'dataset' needs ding_buffer.datasets; import it (or ding_buffer)")
        return _DATASET(cls, cfg, *args, **kwargs)  # the buffer built without the section, then filled from it
    if cfg.get('distributed') is not None:
        if _DISTRIBUTED is None:
            raise RuntimeError("config key 'distributed' needs ding_buffer.distributed; import it (or ding_buffer)")
        buffer = _DISTRIBUTED(cls, cfg, *args, **kwargs)  # ReplayBufferManager or RemoteBuffer; None: no backend
        if buffer is not None:
            return buffer
    return cls(cfg, *args, **kwargs)


# The distributed wrapper registers itself here (``ding_buffer.distributed``): the contract imports nothing above it.
_DISTRIBUTED: Optional[Callable[..., Optional[IBuffer]]] = None


def register_distributed(factory: Callable[..., Optional[IBuffer]]) -> None:
    """Install ``factory(cls, cfg, *args, **kwargs) -> buffer or None`` for configs with a ``distributed`` section."""
    global _DISTRIBUTED
    _DISTRIBUTED = factory


# The dataset loader registers itself here too (``ding_buffer.datasets.config``).
_DATASET: Optional[Callable[..., IBuffer]] = None


def register_dataset(factory: Callable[..., IBuffer]) -> None:
    """Install ``factory(cls, cfg, *args, **kwargs) -> buffer`` for configs with a ``dataset`` section: it builds the
    buffer from ``cfg`` without the section and fills it from the dataset."""
    global _DATASET
    _DATASET = factory


__all__: List[str] = ['IBuffer', 'Registry', 'BUFFER_REGISTRY', 'create_buffer', 'get_buffer_cls']

"""``BufferCore``: the glue every preset shares -- validated config, the one lock, logger, RNG, used-data
remover, lifecycle, state/persistence envelope and the checks on ``push``/``sample`` arguments.

Presets subclass it once and implement ``_push_items``, ``_push_batch``, ``_sample``, ``_state``, ``_restore``
and ``_clear``; they never copy this logic. Public methods take ``self._lock`` (an ``RLock``), so push /
sample / update / clear / state_dict are mutually exclusive; the parts below assume single-threaded calls.
"""

import copy
import itertools
import logging
import operator
import threading
from typing import Any, Dict, List, Mapping, Optional

import numpy as np
from easydict import EasyDict

from ..base import IBuffer
from ..config import build_config
from ..monitor.used_data_remover import UsedDataRemover, check_trackable
from ..persistence import load_state, save_state
from ..storage.tensordict_io import check_batched, is_tensordict


class BufferCore(IBuffer):
    checks: Dict[str, Any] = {}
    ignored_keys: Dict[
        str, str
    ] = {}  # key -> why it has no effect: accepted with a warning (config.dingengine_ignored)
    key_aliases: Dict[str, str] = {}  # another library's key name -> ours (config.resolve_aliases)
    # push(td) of a TensorDict with batch_size [B, ...] is a batch of B items (False: one element, e.g. an episode)
    tensordict_batch_is_items = True

    def __init__(
        self,
        cfg: Optional[Mapping] = None,
        tb_logger: Any = None,
        exp_name: str = 'default_experiment',
        instance_name: str = 'buffer',
    ) -> None:
        self._cfg: EasyDict = build_config(
            self.config, cfg, self.checks, ignored=self.ignored_keys, aliases=self.key_aliases
        )
        if not isinstance(instance_name, str) or not instance_name:
            raise ValueError(f"instance_name must be a non-empty str, got {instance_name!r}")
        self._exp_name = exp_name
        self._instance_name = instance_name
        self._tb_logger = tb_logger  # borrowed: never closed here
        self._logger = logging.getLogger(f'ding_buffer.{instance_name}')
        self._lock = threading.RLock()
        seed = self._cfg.get('seed')
        # seed=None draws the seed from numpy's global RNG, so np.random.seed(...) still reproduces runs.
        self._rng = np.random.default_rng(np.random.randint(0, 2**63 - 1) if seed is None else seed)
        self._remover: Optional[UsedDataRemover] = None
        if self._cfg.get('enable_track_used_data', False):
            if self._cfg.storage.type != 'list':
                raise ValueError(
                    "config key 'enable_track_used_data' needs storage.type='list' (items carry 'data_id')"
                )
            self._remover = UsedDataRemover(self._logger)
        self._closed = False
        self._last_envstep = -1
        self._deepcopy = bool(self._cfg.get('deepcopy', False))  # read on every push and sample
        self._build()

    # ------------------------------------------------------------------ preset hooks
    def _build(self) -> None:
        raise NotImplementedError

    def _push_items(self, items: List[Any]) -> int:
        raise NotImplementedError

    def _check_pushed(self, items: List[Any]) -> None:
        """Refuse what no pushed list may hold (``None``), before anything changes; a preset that checks fields
        of the items at push does it here too, in the same pass (a single item is checked by ``_push_items``)."""
        if _has_none(items):
            raise TypeError(f"cannot push None (item {next(i for i, x in enumerate(items) if x is None)})")

    def _push_batch(self, batch: Any) -> int:
        raise NotImplementedError

    def _state(self) -> Dict[str, Any]:
        raise NotImplementedError

    def _restore(self, state: Dict[str, Any]) -> None:
        """Validate ``state`` fully, then swap it in (all or nothing)."""
        raise NotImplementedError

    def _clear(self) -> List[Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ properties
    @property
    def cfg(self) -> EasyDict:
        return self._cfg

    @property
    def instance_name(self) -> str:
        return self._instance_name

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    @property
    def replay_buffer_size(self) -> int:
        """Capacity (items; episodes for the episode buffer)."""
        return self._cfg.replay_buffer_size

    # ------------------------------------------------------------------ push
    def push(self, data: Any, cur_collector_envstep: int = -1, batched: bool = False) -> int:
        """
        Overview:
            Store one item, a list of items, or (``batched=True``) one dict whose leaves share a leading batch
            dimension. A list longer than the capacity keeps its newest items. All or nothing: an invalid item
            raises ``TypeError``/``ValueError`` and nothing is stored. An empty list is a no-op.
            A TensorDict with ``batch_size=[]`` is one item; with ``batch_size=[B, ...]`` it is a batch of ``B``
            items (as ``extend``) -- except for the episode buffer, where it is one episode of ``B`` steps
            (``storage.tensordict_io``).
        Arguments:
            - data (:obj:`Any`): the item(s).
            - cur_collector_envstep (:obj:`int`): collector env step, recorded for monitors.
            - batched (:obj:`bool`): ``data`` is a batch dict (see ``extend``).
        Returns:
            - pushed (:obj:`int`): number of items pushed.
        """
        self._check_open()
        if type(cur_collector_envstep) is not int or not -STEP_LIMIT < cur_collector_envstep < STEP_LIMIT:
            cur_collector_envstep = check_step(cur_collector_envstep, 'cur_collector_envstep')
        if type(data) is not dict and type(data) is not list and is_tensordict(data):
            if batched:
                check_batched(data)
            elif self.tensordict_batch_is_items and data.batch_size:
                batched = True  # its batch_size declares the items: TorchRL's extend
        if batched:
            with self._lock:
                n = self._push_batch(data)
                self._last_envstep = cur_collector_envstep
            return n
        items = data if isinstance(data, list) else [data]
        if not items:
            return 0
        if len(items) == 1:
            if items[0] is None:
                raise TypeError("cannot push None (item 0)")
        else:
            self._check_pushed(items)
        if self._remover is not None:
            for i, item in enumerate(items):
                check_trackable(item, i)
        if self._deepcopy:
            items = copy.deepcopy(items)
        with self._lock:
            n = self._push_items(items)
            self._last_envstep = cur_collector_envstep
        return n

    def extend(self, batch: Any, cur_collector_envstep: int = -1) -> int:
        """Push a whole batch: a dict whose leaves share a leading dimension (``push(batch, batched=True)``)."""
        return self.push(batch, cur_collector_envstep, batched=True)

    def _evicted(self, items: List[Any]) -> None:
        """Hand items that left the buffer to the used-data remover."""
        if self._remover is not None and items:
            self._remover.start()
            self._remover.add(items)

    # ------------------------------------------------------------------ sample helpers
    @staticmethod
    def _check_size(size: Any) -> None:
        """``size`` is a positive int (``TypeError`` / ``ValueError`` naming it)."""
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
            raise TypeError(f"sample size must be an int, got {type(size).__name__} {size!r}")
        if size <= 0:
            raise ValueError(f"sample size must be > 0, got {size}")

    def _refuse(self, reason: str) -> None:
        self._logger.info("[%s] refuse to sample: %s", self._instance_name, reason)
        return None

    @staticmethod
    def _check_range(sample_range: Any) -> None:
        """``sample_range`` is None or a slice of ints (checked before a sample changes anything)."""
        if sample_range is None:
            return
        if not isinstance(sample_range, slice):
            raise TypeError(f"sample_range must be a slice, got {type(sample_range).__name__} {sample_range!r:.40}")
        try:
            range(0)[sample_range]
        except (TypeError, ValueError) as e:
            raise type(e)(
                f"sample_range {sample_range!r:.60} is not a slice of ints with a non-zero step: {e}"
            ) from None

    @staticmethod
    def _range_positions(n: int, sample_range: Optional[slice]) -> range:
        """Insertion positions (0 = oldest) selected by ``sample_range``."""
        if sample_range is None:
            return range(n)
        if not isinstance(sample_range, slice):
            raise TypeError(f"sample_range must be a slice, got {type(sample_range).__name__}")
        return range(n)[sample_range]

    def _copy_out(self, out: Any) -> Any:
        return copy.deepcopy(out) if self._deepcopy else out

    # ------------------------------------------------------------------ update / clear / count
    def update(self, info: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """Uniform buffers keep no per-item priorities: a no-op returning ``{'updated': 0, 'stale': 0}``."""
        return {'updated': 0, 'stale': 0}

    def clear(self) -> None:
        """Remove every item (files of tracked items are deleted). Ids keep counting."""
        with self._lock:
            removed = self._clear()
        self._evicted(removed)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """A deep copy of the full state (data, counters, ids, RNG); never live references."""
        with self._lock:
            return {
                'type': self.__class__.__name__,
                **self._state(),
                'rng': copy.deepcopy(self._rng.bit_generator.state),
            }

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """
        Overview:
            Restore a ``state_dict()`` (all or nothing: invalid states raise ``ValueError`` and change nothing).
            ``{'data': [...]}`` alone pushes the items, as DI-engine does. ``deepcopy=True`` (DI-engine's
            argument) restores from a deep copy, so the buffer shares no object with ``state``.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if type(deepcopy) is not bool:
            raise TypeError(f"deepcopy must be a bool, got {type(deepcopy).__name__} {deepcopy!r:.40}")
        if deepcopy:
            state = copy.deepcopy(dict(state))
        if set(state.keys()) == {'data'}:
            self.push(list(state['data']))
            return
        if state.get('type') != self.__class__.__name__:
            raise ValueError(f"state was made by {state.get('type')!r}, this buffer is {self.__class__.__name__}")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = copy.deepcopy(dict(state['rng']))
        except Exception as e:
            raise ValueError(f"state has an invalid 'rng' entry: {e}") from e
        with self._lock:
            try:
                self._restore(dict(state))
            except (KeyError, TypeError, IndexError, AttributeError, OverflowError) as e:
                # a malformed state (missing entry, wrong type) is bad input, reported like the others
                raise ValueError(f"invalid {self.__class__.__name__} state: {type(e).__name__}: {e}") from e
            self._rng = rng

    def save_data(self, path: str) -> None:
        """Atomically write the whole buffer (data, counters, ids) to ``path`` (temporary file + rename)."""
        state = self.state_dict()
        save_state(path, self.__class__.__name__, state)

    def load_data(self, path: str, allow_pickle: bool = False) -> None:
        """
        Overview:
            Restore a file written by ``save_data``. Tensor storage loads with ``weights_only=True``; list
            storage holding arbitrary objects needs ``allow_pickle=True`` (it can execute code: trust the file).
            A corrupt, truncated or foreign file raises ``ValueError`` and leaves the buffer unchanged.
        """
        state = load_state(path, self.__class__.__name__, allow_pickle=allow_pickle)
        self.load_state_dict(state)

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"buffer '{self._instance_name}' is closed")

    def start(self) -> None:
        self._check_open()
        if self._remover is not None:
            self._remover.start()

    def close(self) -> None:
        """Stop and join the helper threads (tracked files still queued are deleted). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._remover is not None:
            self._remover.close()

    def __del__(self) -> None:
        try:
            if not getattr(self, '_closed', True) and self._remover is not None:
                self._remover.close(timeout=1.0)
        except Exception:
            pass


STEP_LIMIT = 2**60  # learner iterations / env steps beyond this are not counters (and overflow int64 math)


def check_step(value: Any, name: str) -> int:
    """A learner iteration or env step argument as an int, or ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        value = int(value)
        if -STEP_LIMIT < value < STEP_LIMIT:
            return value
        raise ValueError(f"{name} must be within +-2**60, got {value}")
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.40}")


def check_wait_timeout(timeout: Any) -> Optional[float]:
    """A ``sample(timeout=...)`` argument: None, or a number of seconds in [0, ``threading.TIMEOUT_MAX``]
    (NaN and inf would wait forever); ``ValueError`` otherwise."""
    if timeout is not None and (
        isinstance(timeout, (bool, np.bool_))
        or not isinstance(timeout, (int, float))
        or not 0 <= timeout <= threading.TIMEOUT_MAX
    ):
        raise ValueError(
            f"timeout must be None or a number of seconds in [0, {threading.TIMEOUT_MAX:g}], got {timeout!r:.40}"
        )
    return timeout


def _has_none(items: List[Any]) -> bool:
    """Whether ``items`` holds ``None``, by identity (items may be arrays, which ``None in items`` would compare
    element-wise), in C: ``map`` over ``operator.is_``."""
    return any(map(operator.is_, items, itertools.repeat(None)))

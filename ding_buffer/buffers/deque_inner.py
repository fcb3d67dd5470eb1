"""``deque.inner``: the ``naive`` / ``advanced`` buffer a deque is configured as, as an alias of the deque itself.

A deque runs on the engine with a slot table; code written when a deque wrapped a separate buffer reads
``buffer.inner`` for that buffer's own verbs -- ``sample`` with ``sample_range``, ``update`` by ids, ``beta`` --
and its translated config. The alias is an instance of ``NaiveReplayBuffer`` / ``AdvancedReplayBuffer`` whose table
is the deque's slot table; every other attribute, read or written, is the deque's own (one lock, one set of counters,
one RNG), so what is done through the alias is done to the deque.
"""

import weakref
from typing import Any, Dict, Mapping

from .advanced import AdvancedReplayBuffer
from .naive import NaiveReplayBuffer


class _Alias:
    """An engine seen with another preset's verbs over ``table`` (which the engine holds)."""

    def __init__(self, engine: Any, table: Any) -> None:
        object.__setattr__(self, '_engine', engine)  # (held: ``create_buffer(...).inner`` outlives the expression)
        object.__setattr__(self, '_t', table)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):  # the preset's own settable verbs (beta)
            object.__setattr__(self, name, value)
        else:
            setattr(self._engine, name, value)

    def __del__(self) -> None:
        """The deque owns the helpers: an alias going away closes nothing."""

    def state_dict(self) -> Dict[str, Any]:
        """The state of the buffer the deque is configured as: the deque's ``'inner'`` entry and its RNG."""
        state = self._engine.state_dict()
        return {**state['inner'], 'rng': state['rng']}

    def load_state_dict(self, state: Dict[str, Any], deepcopy: bool = False) -> None:
        """A ``state_dict()`` of that buffer, restored into the deque (whose own entries stay as they are)."""
        if isinstance(state, Mapping) and state.get('type') == type(self).__name__:
            with self._lock:  # (re-entrant) the wrapper's entries cannot change in between
                inner = {k: v for k, v in state.items() if k != 'rng'}
                wrapped = {'type': self._engine.__class__.__name__, 'inner': inner, **self._t.wrapper_state()}
                if 'rng' in state:  # (a state without one is refused naming 'rng')
                    wrapped['rng'] = state['rng']
                self._engine.load_state_dict(wrapped, deepcopy)
        else:  # 'data' only, or refused naming the type
            super().load_state_dict(state, deepcopy)


class _NaiveAlias(_Alias, NaiveReplayBuffer):
    pass


class _AdvancedAlias(_Alias, AdvancedReplayBuffer):
    pass


# an alias reports the name of the buffer it stands for (its repr, its state_dict's 'type')
_NaiveAlias.__name__ = _NaiveAlias.__qualname__ = NaiveReplayBuffer.__name__
_AdvancedAlias.__name__ = _AdvancedAlias.__qualname__ = AdvancedReplayBuffer.__name__
_ALIASES: Dict[bool, type] = {False: _NaiveAlias, True: _AdvancedAlias}


def inner_of(deque: Any) -> Any:
    """The alias of ``deque`` (one at a time: the deque refers to it weakly, the alias to the deque strongly, so
    neither keeps the other in a cycle)."""
    ref = deque.__dict__.get('_inner_alias')
    alias = None if ref is None else ref()
    if alias is None:
        alias = _ALIASES[bool(deque.cfg.priority)](deque, deque._t)
        deque.__dict__['_inner_alias'] = weakref.ref(alias)
    return alias


__all__ = ['inner_of']

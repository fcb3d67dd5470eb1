"""How a ``RewardTable`` saves and restores itself (contents in insertion order, settings, counters, the engine's
counters and limiter, use counts), all or nothing: every part is rebuilt and validated before anything is swapped
in. Functions of the table ``t``."""

import copy
from typing import Any, Dict, Optional

import numpy as np
import torch

from ..config import build_config
from ..control.diversity import row_hashes
from ..control.limits import USE_MAX, UseCounts
from ..persistence import refuse_unknown
from ..sampling import sorted_unique
from .common import ENGINE_KEYS, saved_count
from .gfn_data import ColumnStore, ContainerStoreBase, check_log_reward, rebuild_container
from .gfn_parts import check_slot_memory, make_store, physical_slots
from .gfn_ring import container_store
from .table import Restored

# Version of the saved slot layout: 2 keeps each item's slot and the free-slot stack (stores that reuse slots: dict
# batches, torchgfn containers; files of layout 1 hold items at slots 0..n-1).
LAYOUT = 2
# Keys that describe what is stored; they travel with a save and are restored by ``load_data``.
SETTINGS = (
    'replay_buffer_size',
    'prioritized_capacity',
    'prioritized_sampling',
    'sample_replacement',
    'lazy_sort',
    'state_key',
    'log_reward_key',
    'condition_key',
    'cutoff_distance',
    'p_norm_distance',
)


def state(t, engine: Dict[str, Any]) -> Dict[str, Any]:
    settings = {k: copy.deepcopy(t.cfg[k]) for k in SETTINGS if k in t.cfg}
    engine = dict(engine)
    engine.pop('use', None)  # full-size; saved below in slot order with the items
    if t.index is None:
        return {
            'settings': settings,
            'store': None,
            'counters': dict(t.tally),
            'logged': dict(t.last_logged),
            'engine': engine,
        }
    index = t.index
    # Items in slot order (what sampling walks), with their slots and the free-slot stack where slots are
    # reused: a restored buffer then places and samples exactly as this one would.
    order = index.live_slots()
    out = {
        'settings': settings,
        'store': t._store.state_dict(order),
        'index': index.state_dict(order),
        'track_states': t.states.enabled,
        'counters': dict(t.tally),
        'logged': dict(t.last_logged),  # the counters at the last TensorBoard write: the interval's rates
        'engine': engine,
    }
    if t.parts.uses is not None:
        out['use'] = torch.from_numpy(t.parts.uses[order].copy())
    if t._store.reuses_slots:
        out['layout'] = LAYOUT  # files from before it kept items at slots 0..n-1
        out['slots'] = torch.from_numpy(order.copy())
        out['free'] = torch.from_numpy(index.free_state())
    return out


def restore(t, state: Dict[str, Any]) -> Restored:
    user = {k: v for k, v in dict(t.cfg).items() if k not in SETTINGS}
    user.update(state['settings'])
    cfg = build_config(t.defaults, user, t.checks)
    counters = _counts(state['counters'], 'counters', t.tally)
    # the counters at the last TensorBoard write (files from before they were kept: the interval restarts here)
    logged = counters if state.get('logged') is None else _counts(state['logged'], 'logged', t.tally)
    above = sorted(k for k, v in logged.items() if v > counters[k])
    if above:
        raise ValueError(f"saved 'logged' counts must be at most the saved counters; {above} are above")
    engine = state.get('engine') or {}
    if not isinstance(engine, dict):
        raise ValueError(f"saved 'engine' must be a dict, got {type(engine).__name__}")
    refuse_unknown(engine, ENGINE_KEYS, "saved 'engine'")
    old_cfg, t.cfg = t.cfg, cfg  # the parts below read the (saved) settings
    try:
        if state['store'] is None:
            if state.get('index') is not None:
                raise ValueError("state has an 'index' but no 'store': the items are missing")
            store = index = states = None
        else:
            store, index, states = restored_parts(t, state)
        uses = restored_uses(t, state, index)
    finally:
        t.cfg = old_cfg  # swapped in with the rest, once the engine's part is valid too

    def swap() -> None:
        t.cfg = cfg
        t._store, t.index, t.states = store, index, states
        t.tally = counters
        t.last_logged = dict(logged)

    return Restored(swap, {k: v for k, v in engine.items() if k != 'use'}, uses=uses)


def _counts(saved: Any, what: str, keys: Any) -> Dict[str, int]:
    """The saved counts of ``keys`` (ints >= 0)."""
    if not isinstance(saved, dict):
        raise ValueError(f"saved '{what}' must be a dict of counts, got {type(saved).__name__}")
    missing = [k for k in keys if k not in saved]
    if missing:
        raise ValueError(f"saved '{what}' lacks {missing}")
    refuse_unknown(saved, keys, f"saved '{what}'")
    return {k: saved_count(saved[k], f"saved '{what}' count '{k}'") for k in keys}


def restored_uses(t, state: Dict[str, Any], index: Any) -> Optional[UseCounts]:
    """Use counts of restored items (at their slots, in the saved order); zeros for files saved without them."""
    if t.parts.uses is None:
        return None
    physical, n = (0, 0) if index is None else (index.physical, index.count)
    if state.get('use') is None:
        return UseCounts(physical)
    saved = np.asarray(state['use'])
    if saved.shape != (n,) or (n and (saved.dtype.kind not in 'iu' or saved.min() < 0 or saved.max() > USE_MAX)):
        raise ValueError(f"saved 'use' must be {n} ints in [0, 2**62], got shape {saved.shape}")
    return UseCounts.placed(physical, restored_slots(state, n), saved)


def restored_slots(state: Dict[str, Any], n: int) -> np.ndarray:
    slots = state.get('slots')
    return np.arange(n, dtype=np.int64) if slots is None else np.asarray(slots).astype(np.int64)


def restored_parts(t, state: Dict[str, Any]):
    """The ``(store, index, states)`` rebuilt from a saved ``state`` that holds a store, every part validated. ``t``
    (its ``cfg`` already the saved settings) is only read: the caller swaps the parts in."""
    saved = state['index']
    r, seq = _saved_index_arrays(t, saved)
    n = len(r)
    _check_saved_layout(state)
    _check_room(t.cfg, state, n)
    kind = state['store'].get('kind')
    store, container = _empty_store(t, state, kind, n)
    index, states = t.parts_for(store)  # swapped in by the caller only when everything succeeded
    # validates the saved layout before any data is written
    index, slots = index.restored(
        r,
        seq,
        int(saved['next_seq']),
        state.get('slots') if store.reuses_slots else None,
        state.get('free') if store.reuses_slots else None,
    )
    if kind == ColumnStore.kind:
        store = store.restored(state['store'], n, slots, r)
    elif container is not None:
        store.place(container, slots)
    _fill_state_set(t, state, store, states, slots, n)
    return store, index, states


def _saved_index_arrays(t, saved: Dict[str, Any]):
    """The saved index's log-rewards (float64) and sequence numbers (int64), checked: as many of each, within the
    capacity, ids unique and below ``next_seq``, rewards valid."""
    r = np.asarray(saved['log_reward'], dtype=np.float64)
    seq = np.asarray(saved['seq'], dtype=np.int64)
    n = len(r)
    if len(seq) != n or n > (2 if t.cfg.lazy_sort else 1) * t.capacity():
        raise ValueError(f"saved index holds {n} items for capacity {t.capacity()}")
    if not 0 <= int(saved['next_seq']) < 2**62:
        raise ValueError(f"saved next_seq {saved['next_seq']!r:.30} is not an id counter (0 <= next_seq < 2**62)")
    if len(sorted_unique(seq)) != n or (n and (seq.min() < 0 or seq.max() >= int(saved['next_seq']))):
        raise ValueError("saved sequence numbers are not unique ids below next_seq")
    check_log_reward(r if t.needs_rewards() else r[~np.isnan(r)], 'saved log_reward')  # NaN: none (see validate)
    return r, seq


def _check_saved_layout(state: Dict[str, Any]) -> None:
    """The saved slot layout is one this version reads, with the entries it needs, and ``track_states`` is there."""
    layout = state.get('layout', 1)
    if layout not in (1, LAYOUT) or isinstance(layout, bool):
        raise ValueError(f"saved 'layout' is {layout!r}; this version reads 1 and {LAYOUT}")
    if layout == LAYOUT and any(state.get(k) is None for k in ('slots', 'free')):
        raise ValueError(f"state of layout {LAYOUT} needs 'slots' and 'free' entries")
    if 'track_states' not in state:
        raise ValueError("state has no 'track_states' entry")


def _check_room(cfg: Any, state: Dict[str, Any], n: int) -> None:
    """Before anything is allocated for the saved capacity (a few-KB file may declare any): a saved free list
    names every slot no item holds, and the slots' index fits in this machine's memory."""
    free = state.get('free')
    physical = physical_slots(cfg, free is not None)
    if free is not None and len(free) != physical - n:
        raise ValueError(
            f"saved free slots must be exactly the slots no item holds: {physical - n} for the saved "
            f"replay_buffer_size {cfg['replay_buffer_size']} and {n} items, got {len(free)}"
        )
    check_slot_memory(cfg, physical, 'saved replay_buffer_size')


def _empty_store(t, state: Dict[str, Any], kind: Any, n: int):
    """A new, empty store of the saved ``kind`` and, for containers, the rebuilt container of the ``n`` saved items
    (None for a column store) to place in it."""
    container = None
    if kind == ColumnStore.kind:
        store = make_store(t.cfg, {})
    elif kind == ContainerStoreBase.kind:
        env = t.load_env if t.load_env is not None else getattr(t._store, 'env', None)
        container = rebuild_container(state['store'], n, env)
        store = container_store(container, physical_slots(t.cfg, True))
    else:
        raise ValueError(f"unknown saved store kind {kind!r}")
    return store, container


def _fill_state_set(t, state: Dict[str, Any], store: Any, states: Any, slots: np.ndarray, n: int) -> None:
    """Set the new state set ``states`` as saved: off, on and empty, or counting the ``n`` restored items' states
    (recomputed from ``store`` at ``slots``)."""
    track = state.get('track_states')
    if track is not None and type(track) is not bool:  # (np.False_ == False, but the branches below test identity)
        raise ValueError(f"saved 'track_states' must be None or a bool, got {track!r}")
    if track is None and n:
        raise ValueError("saved 'track_states' is None, but a buffer holding items has counted states or not")
    if track is False:
        states.disable()
    elif track and not n:
        states.enable()  # an emptied buffer keeps counting
    elif track:
        rows = store.rows_at(slots)  # (recomputed from the stored data)
        if rows is None:
            raise ValueError("saved buffer counted unique states but its items have no single terminating state")
        if t.diverse and not np.isfinite(rows).all():  # its push refuses them
            raise ValueError("saved terminating states of gfn_diverse hold nan or inf values")
        states.add(slots, rows, row_hashes(rows))


__all__ = ['state', 'restore', 'SETTINGS', 'LAYOUT']

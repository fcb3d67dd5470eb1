"""How a GFlowNet buffer builds its parts from its config and the first push: the item store (``ColumnStore`` for
dict batches / item lists, ``ContainerRing`` for torchgfn's tensor containers, ``ContainerStore`` for other
Container objects), the ``RewardIndex`` (capacity and sampling by log-reward) and the ``StateSet`` (unique
terminating states; the diversity filter's rows)."""

from typing import Any, Mapping, Tuple

from ..config import check_fits_memory
from ..control.diversity import StateSet
from ..control.keep_best import RewardIndex
from .gfn_data import ColumnStore, ContainerStoreBase, is_container
from .gfn_ring import container_store


def physical_slots(cfg: Mapping, reuses_slots: bool) -> int:
    """Slots to allocate: 2x capacity while truncation is lazy, or as the first size of an append-only store
    (``ContainerStore``; its index grows by doubling)."""
    cap = cfg['replay_buffer_size']
    return 2 * cap if cfg['lazy_sort'] or not reuses_slots else cap


# what the slots' index takes per slot at its peak (reward index, insertion order, state set; a restore), measured
SLOT_BYTES = 80


def check_slot_memory(cfg: Mapping, physical: int, what: str) -> None:
    """``physical`` slots of ``cfg``'s buffer fit in this machine's memory (``ValueError`` naming ``what`` -- the
    config key, or the saved one -- before anything is allocated: the slots are allocated at the first push)."""
    check_fits_memory(what, cfg['replay_buffer_size'], physical * SLOT_BYTES)


def make_store(cfg: Mapping, data: Any) -> Any:
    """The store for the kind of ``data`` (the first push decides), or ``TypeError`` naming what is accepted."""
    if is_container(data):
        return container_store(data, physical_slots(cfg, True))
    if isinstance(data, (dict, list)):
        return ColumnStore(
            physical_slots(cfg, ColumnStore.reuses_slots),
            cfg['device'],
            cfg['state_key'],
            cfg['log_reward_key'],
            cfg['condition_key'],
        )
    raise TypeError(
        f"a GFlowNet buffer takes a dict of batched tensors, a list of item dicts or a Container "
        f"(__len__, __getitem__, extend, log_rewards, terminating_states); got {type(data).__name__}"
    )


def check_kind(store: Any, data: Any) -> None:
    """A buffer keeps the kind of its first push: dict batches, or containers of one class."""
    if not isinstance(store, ContainerStoreBase) and is_container(data):
        raise TypeError(f"this buffer holds dict batches, got a {type(data).__name__} container")
    if isinstance(store, ContainerStoreBase) and not is_container(data):
        raise TypeError(
            f"this buffer holds {store.cls.__name__ if store.cls else 'container'} containers, "
            f"got {type(data).__name__}"
        )


def make_parts(cfg: Mapping, store: Any, prioritized: bool, diverse: bool) -> Tuple[RewardIndex, StateSet]:
    """A fresh ``(RewardIndex, StateSet)`` sized for ``store`` (nothing is swapped in)."""
    physical = physical_slots(cfg, store.reuses_slots)
    index = RewardIndex(cfg['replay_buffer_size'], physical, prioritized, bool(cfg['lazy_sort']), store.reuses_slots)
    return index, StateSet(physical, keep_rows=diverse, p=float(cfg.get('p_norm_distance', 1.0)))

"""A user's module of buffer parts, loaded by config (``import_names=['composition_plugins']``): registering
by name is all it takes for a config to use them."""

import numpy as np

from ding_buffer.control.limits import REMOVER_REGISTRY, Remover
from ding_buffer.control.samplers import SAMPLER_REGISTRY


@SAMPLER_REGISTRY.register('plugin_oldest_first')
class OldestFirst:
    """The ``size`` oldest candidates, oldest first (needs no replacement)."""

    def draw(self, rng, m, size, replace):
        return np.arange(size, dtype=np.int64)


@REMOVER_REGISTRY.register('plugin_drop_flagged')
class DropFlagged(Remover):
    """Before each sample, the oldest items whose ``collect_iter`` equals ``flag`` leave."""

    name = 'flagged'

    def __init__(self, flag: int) -> None:
        self.flag = flag

    def before_sample(self, table, cur_learner_iter):
        slots = table.oldest(1 << 20)
        return slots[table.collect_iter(slots) == self.flag]

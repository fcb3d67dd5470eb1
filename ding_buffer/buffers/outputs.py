"""How sampled elements leave a list-storage buffer: new dicts (the stored ones are never mutated) carrying the
DI-engine keys ``replay_unique_id`` (``f"{instance_name}_{id}"``) and ``replay_buffer_idx`` plus per-item extras
(``priority``, ``IS``, ``staleness``, ``use``, ...)."""
import copy
from typing import Any, Dict, List

import numpy as np


def prioritized_items(items: List[Any], instance_name: str, ids: np.ndarray, slots: np.ndarray,
                      extras: Dict[str, np.ndarray], deep: bool) -> List[Dict[str, Any]]:
    """One new dict per drawn item (a deep copy when ``deep``); ``extras`` arrays become Python numbers."""
    ids_l, slots_l = ids.tolist(), np.asarray(slots).tolist()
    cols = {k: v.tolist() for k, v in extras.items()}
    out = []
    for k, item in enumerate(items):
        d = copy.deepcopy(item) if deep else dict(item)
        d['replay_unique_id'] = f'{instance_name}_{ids_l[k]}'
        d['replay_buffer_idx'] = int(slots_l[k])
        for key, col in cols.items():
            d[key] = col[k]
        out.append(d)
    return out

"""``PrioritizedWindows``: the episode buffer's prioritized sequence replay -- draw, output and ``update`` -- on
top of ``control.windows.WindowPriorities`` and the flat transition store (``FlatEpisodes``).

Output of a draw: the window batch of ``FlatEpisodes.windows`` (``[B, T, ...]`` fields, ``mask`` [B, T],
``episode_id`` / ``episode_idx`` / ``start`` [B], ``replay_buffer_idx`` / ``replay_unique_id`` [B, T], -1 on
padding) plus ``priority`` [B] (the window priority) and ``IS`` [B] (``(p_w / p_min) ** (-alpha * beta)``).

``update(info)`` takes back ``replay_unique_id`` / ``replay_buffer_idx`` as returned ([B, T]; or [B], the
first steps) with either

* ``priority`` [B] -- one priority per window: every valid step of the window gets it, so the window's
  priority becomes exactly that value (R2D2 computes it from the TD errors with the same eta mix); or
* ``priority`` [B, T] -- one per step (padding entries, ``replay_buffer_idx == -1``, are skipped).

An entry applies only where its transition still holds that id (the identity check of ``advanced``); the
others are counted as stale -- per window in the first form, per step in the second. All or nothing.
"""

from typing import Any, Dict, Mapping, Optional

import numpy as np
import torch

from ..control.priority import BetaSchedule, as_numpy, as_priorities, has_priorities, parse_update, real_numbers
from ..control.samplers import PrioritizedSpec
from ..control.windows import WindowPriorities


class PrioritizedWindows:
    OUTPUT_KEYS = ('priority', 'IS')  # added to each window batch

    def __init__(self, spec: PrioritizedSpec, store: Any, pad: bool, instance_name: str) -> None:
        if spec.unroll_len is None:
            raise ValueError(
                "config key 'sampler.unroll_len' must be set for sampler.type='prioritized' on the "
                "episode buffer (the window length priorities are kept for)"
            )
        self.spec = spec
        self.unroll_len = spec.unroll_len
        self.beta = BetaSchedule(spec.beta, spec.anneal_step)
        self.instance_name = instance_name
        self.windows = WindowPriorities(store.max_transitions, spec.unroll_len, spec.alpha, spec.eta, spec.eps, pad)
        self.store = store

    # ------------------------------------------------------------------ sample
    def shortfall(self) -> str:
        """'' when a window can be drawn, else why not."""
        if not self.store.transitions:
            return 'buffer is empty'
        if not self.windows.index.tree.total() > 0:
            return (
                f'no window of {self.unroll_len} steps has a priority > 0 (shorter episodes give none unless '
                f"'pad_short_episodes')"
            )
        return ''

    def draw(self, rng: np.random.Generator, size: int) -> Optional[Dict[str, Any]]:
        """``size`` windows by priority (with replacement), or ``None`` when no window has priority."""
        starts = self.windows.sample(rng, size)
        if starts is None:
            return None
        store = self.store
        episodes = self.windows.owner[starts]
        offsets = self.windows.locate(starts, store.start)
        out = store.windows(episodes, offsets, self.unroll_len, self.windows.pad)
        dev = store.storage.device
        out['priority'] = torch.from_numpy(self.windows.window_priorities(starts).astype(np.float32)).to(dev)
        out['IS'] = torch.from_numpy(self.windows.is_weights(starts, self.beta.draw()).astype(np.float32)).to(dev)
        return out

    def check_args(self, sample_range: Any, replace: Any, unroll_len: Any, pad: Any) -> None:
        """``sample`` arguments prioritized windows cannot honour are refused (``ValueError``)."""
        t = self.unroll_len
        for name, value, ok in (
            ('sample_range', sample_range, sample_range is None),
            ('replace', replace, replace in (None, True)),
            ('unroll_len', unroll_len, unroll_len in (None, t)),
            ('pad', pad, pad is None),
        ):
            if not ok:
                raise ValueError(
                    f"{name}={value!r} is not supported by prioritized windows (sampler.unroll_len={t}, "
                    f"drawn with replacement; pad comes from 'pad_short_episodes')"
                )

    # ------------------------------------------------------------------ update
    def update(self, info: Mapping) -> Optional[Dict[str, Any]]:
        """Validate ``info`` fully and return what to apply (nothing changes here); ``None`` without priority."""
        if not has_priorities(info):
            return None
        prio = real_numbers(info['priority'])  # entry by entry (a bool in a list of lists is no priority)
        if prio.ndim <= 1:
            as_priorities(prio)  # finite in float32 and >= 0, before any use
        idx = np.asarray(as_numpy(info['replay_buffer_idx']))
        ids = as_numpy(info['replay_unique_id'])
        ids_arr = np.asarray(ids)
        if idx.shape != ids_arr.shape:
            raise ValueError(f"'replay_buffer_idx' has shape {idx.shape}, 'replay_unique_id' {ids_arr.shape}")
        per_window = prio.ndim <= 1
        if per_window and idx.ndim == 2:  # windows as returned: each is named by its first step
            idx, ids_arr = idx[:, 0], ids_arr[:, 0]
        elif not per_window:
            if prio.shape != idx.shape:
                raise ValueError(f"per-step 'priority' has shape {prio.shape}, 'replay_buffer_idx' {idx.shape}")
            keep = idx.reshape(-1) != -1  # padding: its priorities are skipped, whatever they hold
            as_priorities(np.where(keep, prio.reshape(-1), 0) if prio.dtype.kind in 'biuf' else prio.reshape(-1))
            prio, idx, ids_arr = prio.reshape(-1)[keep], idx.reshape(-1)[keep], ids_arr.reshape(-1)[keep]
        parsed = parse_update(
            {'priority': prio, 'replay_buffer_idx': idx, 'replay_unique_id': ids_arr},
            self.instance_name,
            self.store.max_transitions,
        )
        return {'parsed': parsed, 'per_window': per_window}

    def apply(self, plan: Dict[str, Any]) -> Dict[str, int]:
        """Apply a validated ``update`` plan under the buffer's lock; returns ``{'updated', 'stale'}``."""
        priorities, ids, slots, mine = plan['parsed']
        match = self.store.storage.ring.holds(slots, ids, mine)
        n = int(np.count_nonzero(match))
        slots, priorities = slots[match], priorities[match]
        if plan['per_window'] and n:
            episodes = self.windows.owner[slots]
            offsets = (slots - self.store.start[episodes]) % self.windows.n_slots
            steps = offsets[:, None] + np.arange(self.unroll_len)[None, :]
            inside = steps < self.store.length[episodes][:, None]
            step_slots = (self.store.start[episodes][:, None] + steps) % self.windows.n_slots
            # a later window of the batch wins where two overlap (numpy keeps the last write)
            slots, priorities = step_slots[inside], np.broadcast_to(priorities[:, None], steps.shape)[inside]
        self.windows.update(slots, priorities, self.store.start, self.store.length)
        return {'updated': n, 'stale': len(match) - n}

    def clear(self) -> None:
        """Every window gone and the running max priority back to 1.0 (``clear``; beta keeps its schedule)."""
        self.windows.clear()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        return {**self.windows.state_dict(), 'beta': self.beta.value}

    def restored(self, state: Mapping, store: Any) -> 'PrioritizedWindows':
        new = PrioritizedWindows(self.spec, store, self.windows.pad, self.instance_name)
        new.beta.set(BetaSchedule.checked(state['beta'], 'saved beta'))
        slots = store.ring.ordered_slots().tolist()
        new.windows = self.windows.restored(state, [(s, int(store.start[s]), int(store.length[s])) for s in slots])
        return new

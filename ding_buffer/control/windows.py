"""``WindowPriorities``: prioritized sequence replay (R2D2, Kapturowski et al. 2019; TorchRL's
``PrioritizedSliceSampler``) over episodes whose transitions live in flat slots (``FlatEpisodes``).

Per transition slot: a step priority (float64, 0 where empty) and the episode slot that owns it. A *window* is
``unroll_len`` consecutive steps of one episode, identified by the slot of its first step; an episode of length
``L`` offers the starts ``0 .. L - unroll_len`` (with ``pad``, an episode shorter than ``unroll_len`` offers
one window at 0, over its valid steps only). The window's priority is

    p_w = eta * max(step priorities) + (1 - eta) * mean(step priorities)

and a ``PriorityIndex`` over window starts holds ``p_w ** alpha`` (0 where no window starts), so a draw is one
stratified descent of the sum tree for the whole batch and the importance weights are
``(leaf_w / min leaf) ** -beta`` (equal priorities give 1.0). Updating the steps of a window recomputes the
windows that overlap them (at most ``2 * unroll_len - 1`` per window, vectorised).

New steps get the largest step priority ever set (1.0 at first, and again after ``clear``), as DI-engine's and
TorchRL's samplers do.
Not thread-safe: the buffer's lock serialises every call.
"""

from typing import Any, Dict, Optional

import numpy as np
import torch

from .priority import MAX_PRIORITY, PriorityIndex


class WindowPriorities:
    """
    Overview:
        The window priorities of the module docstring over ``n_slots`` transition slots: ``episode_added`` /
        ``episode_removed`` keep the windows of each episode, ``sample`` draws window starts, ``update`` sets
        step priorities and refreshes the windows that cover them.
    Examples:
        >>> wp = WindowPriorities(n_slots=8, unroll_len=3, alpha=1.0, eta=0.9, eps=0.0, pad=False)
        >>> wp.episode_added(episode=0, first=0, length=5)  # 5 steps: windows start at slots 0, 1 and 2
        >>> wp.sample(np.random.default_rng(0), 6).tolist()  # stratified: equal windows get equal shares
        [0, 0, 1, 1, 2, 2]
        >>> wp.update(np.array([4]), np.array([3.0]), first_of=np.array([0]), length_of=np.array([5]))
        >>> wp.window_priorities(np.arange(3)).round(3).tolist()  # only window 2 covers step 4: 0.9 * 3 + 0.1 * 5 / 3
        [1.0, 1.0, 2.867]
    """

    def __init__(self, n_slots: int, unroll_len: int, alpha: float, eta: float, eps: float, pad: bool) -> None:
        self.n_slots = n_slots
        self.unroll_len = int(unroll_len)
        self.eta, self.eps, self.pad = float(eta), float(eps), bool(pad)
        self.index = PriorityIndex(n_slots, alpha, 0.0)
        self.step = np.zeros(n_slots, dtype=np.float64)
        self.owner = np.full(n_slots, -1, dtype=np.int64)

    @property
    def max_priority(self) -> float:
        return self.index.max_priority

    # ------------------------------------------------------------------ episodes
    def episode_added(self, episode: int, first: int, length: int) -> None:
        """A new episode at transition slots ``first .. first + length - 1`` (mod ``n_slots``)."""
        slots = (first + np.arange(length)) % self.n_slots
        self.step[slots] = self.index.max_priority
        self.owner[slots] = episode
        self._refresh(episode, first, length, np.arange(self._n_starts(length)))

    def episode_removed(self, episode: int, first: int, length: int) -> None:
        slots = (first + np.arange(length)) % self.n_slots
        self.step[slots] = 0.0
        self.owner[slots] = -1
        self.index.clear_slots(slots)

    def clear(self) -> None:
        """Every slot empty and the running max priority back to 1.0."""
        self.step[:] = 0.0
        self.owner[:] = -1
        self.index.reset()

    def _n_starts(self, length: int) -> int:
        if length >= self.unroll_len:
            return length - self.unroll_len + 1
        return 1 if self.pad else 0

    def _refresh(self, episode: int, first: int, length: int, offsets: np.ndarray) -> None:
        """Recompute the window priorities of ``offsets`` (valid starts of one episode)."""
        if not len(offsets):
            return
        t = min(self.unroll_len, length)  # (a longer window's steps past the episode are padding: the same priority)
        steps = offsets[:, None] + np.arange(t)[None, :]
        valid = steps < length
        p = np.where(valid, self.step[(first + np.minimum(steps, length - 1)) % self.n_slots], 0.0)
        n = valid.sum(axis=1)
        w = self.eta * p.max(axis=1) + (1.0 - self.eta) * p.sum(axis=1) / n
        self.index.set_new((first + offsets) % self.n_slots, w)

    # ------------------------------------------------------------------ sampling
    def sample(self, rng: np.random.Generator, size: int) -> Optional[np.ndarray]:
        """``size`` window-start slots, stratified by priority (with replacement); ``None`` when no window."""
        return self.index.sample(rng, size)

    def window_priorities(self, starts: np.ndarray) -> np.ndarray:
        return self.index.priorities(starts)

    def is_weights(self, starts: np.ndarray, beta: float) -> np.ndarray:
        return self.index.is_weights(starts, beta)

    def locate(self, starts: np.ndarray, first_of: np.ndarray) -> np.ndarray:
        """Offsets of window-start slots inside their episodes (``first_of``: each episode's first slot)."""
        return (starts - first_of[self.owner[starts]]) % self.n_slots

    # ------------------------------------------------------------------ update
    def update(self, steps: np.ndarray, priorities: np.ndarray, first_of: np.ndarray, length_of: np.ndarray) -> None:
        """Set ``priority + eps`` at transition slots ``steps`` (validated, owned) and refresh every window that
        overlaps them; raises the running max like ``PriorityIndex.update``."""
        if not len(steps):
            return
        self.step[steps] = priorities + self.eps
        self.index.raise_max(float(priorities.max()))
        t = self.unroll_len
        episodes = self.owner[steps]
        offsets = (steps - first_of[episodes]) % self.n_slots
        for ep in np.unique(episodes).tolist():
            mine = offsets[episodes == ep]
            length = int(length_of[ep])
            lo, hi = max(int(mine.min()) - t + 1, 0), min(int(mine.max()), self._n_starts(length) - 1)
            cand = np.arange(lo, hi + 1)
            if len(cand):  # keep only starts whose window covers an updated step
                mine = np.sort(mine)
                near = np.searchsorted(mine, cand)
                covers = near < len(mine)
                covers[covers] = mine[near[covers]] < cand[covers] + t
                cand = cand[covers]
            self._refresh(ep, int(first_of[ep]), length, cand)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        return {'step': torch.from_numpy(self.step.astype(np.float64)), 'max_priority': self.index.max_priority}

    def restored(self, state: Any, episodes: Any) -> 'WindowPriorities':
        """A new part like this one with the saved step priorities (validated) of ``episodes``: (episode slot,
        first slot, length) triples; the window tree is rebuilt from them. Nothing changes here."""
        step = np.asarray(state['step'], dtype=np.float64)
        max_p = float(state['max_priority'])
        if step.shape != (self.n_slots,) or not (step <= MAX_PRIORITY).all() or (step < 0).any():
            raise ValueError(f"saved step priorities must be {self.n_slots} finite numbers >= 0 (in float32)")
        if not 0 < max_p <= MAX_PRIORITY:
            raise ValueError(f"saved max_priority must be finite and > 0, got {max_p} (finite in float32)")
        new = WindowPriorities(self.n_slots, self.unroll_len, self.index.alpha, self.eta, self.eps, self.pad)
        owned = np.zeros(self.n_slots, dtype=bool)
        for episode, first, length in episodes:
            slots = (first + np.arange(length)) % self.n_slots
            owned[slots] = True
            new.owner[slots] = episode
        if (step[~owned] != 0).any():  # owned steps may be 0 (a priority of 0 updated with eps=0)
            raise ValueError("saved step priorities do not match the stored transitions")
        new.step[:] = step
        new.index.load_max(max_p)
        for episode, first, length in episodes:
            new._refresh(episode, first, length, np.arange(new._n_starts(length)))
        return new

"""Exact metrics of a HyperGrid run: the true reward distribution, L1 distance, modes found, ``eval.csv`` and the
learning-curve PNG of the ``hypergrid`` job.

HyperGrid's ``'original'`` reward (Bengio et al. 2021) on ``{0..H-1}^D`` is, with ``a_d = |s_d / (H-1) - 0.5|``,

    R(s) = R0 + R1 * prod_d 1[0.25 < a_d] + R2 * prod_d 1[0.3 < a_d < 0.4]

The ``R2`` band (``0.3 < a_d < 0.4``) lies inside the ``R1`` ring (``a_d > 0.25``), so a state has reward exactly
``R0 + R1 + R2`` (a *mode state*) or at most ``R0 + R1``. Mode states sit in the ``2^D`` corners of the grid, one
cluster per corner; a *mode* is a corner, so ``modes_found`` counts the corners in which at least one mode state has
been sampled (out of ``2^D``), and ``mode_states_found`` the distinct mode states. The threshold used is
``R0 + R1 + R2 / 2`` (any value in ``(R0 + R1, R0 + R1 + R2]`` selects the same states as torchgfn's
``reward >= R0 + R1 + R2``, without depending on float rounding).

>>> truth = GridTruth(ndim=2, height=8, R0=0.1, R1=0.5, R2=2.0)
>>> truth.n_states, truth.n_modes, truth.n_mode_states
(64, 4, 4)
>>> truth.l1(torch.arange(64)) > 0   # uniform samples are far from the reward distribution
True
"""

import math
from collections.abc import Iterable

import torch

from . import evals
from .plot import _save_figure


def grid_coords(indices: torch.Tensor, ndim: int, height: int) -> torch.Tensor:
    """States ``[n, ndim]`` of canonical indices (base-``height`` digits, most significant first: torchgfn's
    ``HyperGrid.get_states_indices`` order)."""
    base = height ** torch.arange(ndim - 1, -1, -1, device=indices.device)
    return (indices.unsqueeze(-1) // base) % height


def original_reward(coords: torch.Tensor, height: int, R0: float, R1: float, R2: float) -> torch.Tensor:
    """HyperGrid's 'original' reward (float64; the same states score the same as torchgfn's ``OriginalReward``)."""
    a = (coords.double() / (height - 1) - 0.5).abs()
    eps = 1e-12  # torchgfn's margin on the interval ends
    ring = (a > 0.25 + eps).all(-1).double()
    band = ((a > 0.3 + eps) & (a < 0.4 - eps)).all(-1).double()
    return R0 + R1 * ring + R2 * band


class GridTruth:
    """
    Overview:
        Everything exact about one HyperGrid, by enumerating its ``height ** ndim`` terminating states once:
        the true distribution ``R(x) / Z``, ``log Z``, which states are mode states and their corners.
        Complexity: O(height ** ndim) memory and time at construction; ``l1`` O(n + height ** ndim).
    """

    def __init__(self, ndim: int, height: int, R0: float, R1: float, R2: float) -> None:
        self.ndim, self.height = ndim, height
        self.n_states = height**ndim
        coords = grid_coords(torch.arange(self.n_states), ndim, height)
        reward = original_reward(coords, height, R0, R1, R2)
        self.log_z = math.log(float(reward.sum()))
        self.true_dist = reward / reward.sum()
        self.mode_threshold = R0 + R1 + R2 / 2
        self.is_mode = reward > self.mode_threshold
        # corner of each state: bit d set when coordinate d is in the upper half
        corner_bits = (coords * 2 > height - 1).long() << torch.arange(ndim)
        self.corner = corner_bits.sum(-1)
        self.n_modes = 2**ndim
        self.n_mode_states = int(self.is_mode.sum())

    def indices(self, states: torch.Tensor) -> torch.Tensor:
        """Canonical indices of states ``[n, ndim]`` (on the CPU)."""
        base = self.height ** torch.arange(self.ndim - 1, -1, -1, device=states.device)
        return (states.long() * base).sum(-1).cpu()

    def l1(self, indices: torch.Tensor) -> float:
        """``sum_x |p_hat(x) - R(x)/Z|`` of the empirical distribution of ``indices`` (torchgfn's ``l1_dist``)."""
        if len(indices) == 0:
            return float('nan')
        counts = torch.bincount(indices.long(), minlength=self.n_states).double()
        return float((counts / counts.sum() - self.true_dist).abs().sum())

    def l1_floor(self, n: int) -> float:
        """Expected L1 of ``n`` exact samples from ``R(x)/Z`` (normal approximation of each binomial count:
        ``sum_x sqrt(2 p (1 - p) / (pi n))``): the L1 a perfect sampler shows when evaluated on ``n`` samples."""
        p = self.true_dist
        return float((2 * p * (1 - p) / (math.pi * n)).sqrt().sum())

    def mode_states_in(self, indices: torch.Tensor) -> set[int]:
        """The distinct mode states among ``indices``."""
        idx = indices.long()
        return set(idx[self.is_mode[idx]].unique().tolist())

    def modes_of(self, mode_states: Iterable[int]) -> set[int]:
        """The corners (modes) the given mode states belong to."""
        states = list(mode_states)
        return set(self.corner[torch.as_tensor(states, dtype=torch.long)].tolist()) if states else set()


EVAL_FIELDS = (
    'iteration',
    'trajectories',
    'l1_dist',
    'modes_found',
    'mode_states_found',
    'loss',
    'logZ',
    'logZ_true',
    'wall_time',
)


def write_eval_csv(run_dir: str, rows: Iterable[dict[str, float]]) -> None:
    """``eval.csv`` of a HyperGrid run (one row per evaluation, the columns ``EVAL_FIELDS``), written atomically."""
    evals.write_eval_csv(run_dir, rows, EVAL_FIELDS)


def plot_curve(rows: list[dict[str, float]], out: str, title: str, n_modes: int, l1_floor: float) -> str:
    """L1 distance (left axis, log scale; dashed: ``l1_floor``, what exact samples would show) and modes found
    (right axis) over training iterations, one PNG written atomically."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=110, layout='constrained')
    x = [r['iteration'] for r in rows]
    ax.plot(x, [r['l1_dist'] for r in rows], color='tab:blue', lw=1.5, marker='o', ms=3, label='L1 distance')
    ax.axhline(l1_floor, color='tab:blue', ls='--', lw=1, alpha=0.6, label='L1 of exact samples')
    ax.set_yscale('log')
    ax.set_xlabel('training iterations')
    ax.set_ylabel('L1(empirical, R/Z)', color='tab:blue')
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    modes = [r['modes_found'] for r in rows]
    ax2.step(x, modes, where='post', color='tab:red', lw=1.5, marker='s', ms=3, label='modes found')
    ax2.set_ylim(0, n_modes + 0.5)
    ax2.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_ylabel(f'modes found (of {n_modes})', color='tab:red')
    ax.set_title(title)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc='outside lower center', ncol=3, fontsize=8, frameon=False)  # below the data
    try:
        return _save_figure(fig, out)
    finally:
        plt.close(fig)


__all__ = ['EVAL_FIELDS', 'GridTruth', 'grid_coords', 'original_reward', 'plot_curve', 'write_eval_csv']

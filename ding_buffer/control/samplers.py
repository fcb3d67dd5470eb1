"""Samplers chosen by a buffer's ``sampler`` config section, and the registry users add their own to.

``sampler=dict(type=NAME, **arguments)``; an empty section (the default) keeps the preset's own sampler.

* ``uniform`` -- ``UniformSampler``: positions drawn uniformly (with / without replacement, O(batch)).
* ``python_random`` -- ``PythonRandomSampler``: uniform positions from Python's global ``random``, as DI-engine's
  ``DequeBuffer`` draws them (the same batches under the same ``random.seed``).
* ``prioritized`` -- ``PrioritizedSpec``: prioritized draws. Only presets whose elements carry priorities take
  it: the episode buffer (prioritized windows, R2D2's ``eta * max + (1 - eta) * mean``); on ``naive`` it is
  refused naming the keys (``type='advanced'`` is prioritized replay of single transitions).
* your own: ``@SAMPLER_REGISTRY.register('name')`` on a class built with the section's other keys as keyword
  arguments and offering ``draw(rng, m, size, replace) -> positions`` (int64 array of ``size`` insertion
  positions in ``[0, m)``, 0 = the oldest candidate; or ``None`` to refuse); list its module in
  ``import_names``. Such samplers pick among a preset's candidates; they keep no per-element state.
"""

import random
from typing import Any, Mapping, Optional, Tuple

import numpy as np

from ..base import Registry
from ..config import STEP_CHECK, apply_checks, capacity_int, finite_number
from ..sampling import uniform_indices

SAMPLER_REGISTRY = Registry(what='sampler type', key='sampler.type')


@SAMPLER_REGISTRY.register('uniform')
class UniformSampler:
    """Every candidate equally likely; without replacement a uniformly random ordered subset.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> pos = UniformSampler().draw(rng, m=5, size=5, replace=False)  # all 5 candidates: a permutation
        >>> sorted(pos.tolist()), pos.dtype
        ([0, 1, 2, 3, 4], dtype('int64'))
        >>> UniformSampler().draw(rng, m=3, size=4, replace=True).shape  # more than m needs replace
        (4,)
    """

    needs_priority = False

    def draw(self, rng: np.random.Generator, m: int, size: int, replace: bool) -> np.ndarray:
        return uniform_indices(rng, m, size, replace)


@SAMPLER_REGISTRY.register('python_random')
class PythonRandomSampler:
    """Positions drawn by Python's global ``random`` module, exactly as DI-engine's ``DequeBuffer`` draws its
    items (``random.sample`` without replacement, ``random.choices`` with): a pipeline seeded by ``random.seed``
    (DI-engine's ``set_pkg_seed``) draws the same batches, in the same order, as DI-engine's deque buffer. The
    buffer's own RNG is not used. The ``deque`` preset samples with it when it has no ``seed``.

    Examples:
        >>> import random
        >>> random.seed(0)
        >>> PythonRandomSampler().draw(None, m=10, size=3, replace=False).tolist()
        [6, 9, 0]
        >>> random.seed(0)
        >>> random.sample(range(10), 3)  # what DI-engine's DequeBuffer picks from 10 items
        [6, 9, 0]
    """

    needs_priority = False

    def draw(self, rng: Any, m: int, size: int, replace: bool) -> np.ndarray:
        picked = random.choices(range(m), k=size) if replace else random.sample(range(m), size)
        return np.fromiter(picked, dtype=np.int64, count=size)


@SAMPLER_REGISTRY.register('prioritized')
class PrioritizedSpec:
    """Arguments of a prioritized sampler; the preset builds the sampler that realises them.

    Examples:
        >>> spec = PrioritizedSpec(unroll_len=8)  # the other arguments take the defaults
        >>> spec.alpha, spec.beta, spec.eta, spec.eps, spec.anneal_step, spec.unroll_len
        (0.6, 0.4, 0.9, 1e-05, 0, 8)
        >>> PrioritizedSpec(alpah=0.5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: unknown config key(s) 'sampler.alpah' for sampler.type='prioritized'; known: ['alpha', ...]
    """

    needs_priority = True
    defaults = dict(alpha=0.6, beta=0.4, anneal_step=0, eps=1e-5, eta=0.9, unroll_len=None)
    # ``not v < 0 and v == int(v)``: a NaN / inf step raises int()'s own error, as it always did
    checks = {
        **{key: (lambda v: _number(v) and 0 <= v <= 1, 'a number in [0, 1]') for key in ('alpha', 'beta', 'eta')},
        'eps': (
            lambda v: finite_number(v) and 0 <= v <= 1,
            'a number in [0, 1] (added to every priority, kept in float32)',
        ),
        'anneal_step': STEP_CHECK,
        'unroll_len': (lambda t: t is None or capacity_int(t), 'None or an int in [1, 2**40]'),
    }

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"unknown config key(s) 'sampler.{unknown[0]}' for sampler.type='prioritized'; "
                f"known: {sorted(self.defaults)}"
            )
        args = {**self.defaults, **kwargs}
        apply_checks(args, self.checks, prefix='sampler.')
        self.unroll_len = args['unroll_len']
        self.alpha, self.beta, self.eta = float(args['alpha']), float(args['beta']), float(args['eta'])
        self.eps, self.anneal_step = float(args['eps']), int(args['anneal_step'])


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def build_sampler(section: Optional[Mapping], default: str, allowed_priority: Tuple[bool, str]) -> Any:
    """
    Overview:
        The sampler of a config section (empty: ``default``). ``allowed_priority`` is (whether this preset's
        elements carry priorities, the advice when they do not); a prioritized sampler on a preset without
        priorities is refused at construction with a message naming the keys.
    """
    section = dict(section or {})
    name = section.pop('type', default)
    if not isinstance(name, str):
        raise ValueError(f"config key 'sampler.type' must be a str, got {name!r}")
    cls = SAMPLER_REGISTRY.get(name)
    if getattr(cls, 'needs_priority', False) and not allowed_priority[0]:
        raise ValueError(f"config key 'sampler.type' is {name!r}, but {allowed_priority[1]}")
    try:
        return cls(**section)
    except TypeError as e:
        raise ValueError(f"config section 'sampler' ({name!r}) has bad arguments {section}: {e}") from e


def check_positions(positions: Any, m: int, size: int, name: str) -> np.ndarray:
    """A user sampler's answer, validated: ``size`` int positions in ``[0, m)`` (the sampler decides whether they
    repeat: its own ``replace`` rule, as the documented examples show)."""
    try:
        arr = np.asarray(positions)
    except (ValueError, TypeError) as e:  # ragged or otherwise not an array
        raise RuntimeError(
            f"sampler {name!r} returned {type(positions).__name__} {positions!r:.60}; expected {size} int positions "
            f"in [0, {m}) ({e})"
        ) from None
    if arr.shape != (size,) or arr.dtype.kind not in 'iu' or (size and (arr.min() < 0 or arr.max() >= m)):
        raise RuntimeError(
            f"sampler {name!r} returned {arr.dtype} shape {arr.shape}; expected {size} int positions in [0, {m})"
        )
    return arr.astype(np.int64, copy=False)

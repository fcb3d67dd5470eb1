"""Config helpers: ``deep_merge_dicts`` and validation of a user config against a buffer's defaults.

Validation rules (applied recursively to nested sections such as ``storage``):

* every key of the user config must exist in the defaults; otherwise ``ValueError`` names the key and, when
  one is close (``difflib``), the valid key it probably means -- no suggestion is better than a wrong one;
* a preset may name keys it accepts and ignores (``ignored``: DI-engine's buffer keys another type reads, and
  keys DI-engine's configs carry that no buffer reads): each logs one WARNING saying it has no effect and is
  dropped before validation, so it never reaches behaviour;
* a value must have the type of the default (``int`` is accepted where a ``float`` is expected; a default of
  ``None`` accepts anything; ``float('inf')`` defaults accept ints and floats);
* per-key constraints (``checks``: key -> (predicate, 'what was expected')) are then applied to the merged
  config, so a wrong value names the key, the value and the expectation.
"""

import copy
import difflib
import logging
import math
import numbers
import os
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from easydict import EasyDict

# Keys that every buffer config may carry without being listed in its defaults.
ALWAYS_ALLOWED = ('type', 'import_names', 'cfg_type', 'distributed')  # 'distributed': validated by .distributed

Check = Tuple[Callable[[Any], bool], str]


def deep_merge_dicts(original: Mapping, new_dict: Optional[Mapping]) -> EasyDict:
    """
    Overview:
        Deep-copy ``original`` and recursively update it with ``new_dict`` (new keys allowed).
        Neither argument is modified.
    Returns:
        - merged (:obj:`EasyDict`): the merged config.
    """
    merged = EasyDict(copy.deepcopy(dict(original), _shared_callables(original)))
    if new_dict is None:
        return merged
    _deep_update(merged, copy.deepcopy(dict(new_dict), _shared_callables(new_dict)))
    return EasyDict(merged)


def _shared_callables(cfg: Mapping) -> Dict[int, Any]:
    """A deepcopy memo that keeps top-level callables (e.g. ``set_buffer_size``, often a bound method of a
    world model) shared: copying one would copy the object it belongs to."""
    return {id(v): v for v in cfg.values() if callable(v) and not isinstance(v, type)}


def _deep_update(original: dict, new: Mapping) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(original.get(k), Mapping):
            sub = dict(original[k])
            _deep_update(sub, v)
            original[k] = sub
        else:
            original[k] = v


# Keys of DI-engine's replay-buffer configs (its six registered types), with the type that reads each one. A
# DI-engine preset here that does not read such a key accepts it with a warning, as DI-engine's own buffers
# do (they read only their own keys): a compiled DI-engine config carries the keys of its class defaults.
DI_ENGINE_KEYS = {
    'replay_buffer_size': 'naive',
    'deepcopy': 'naive',
    'enable_track_used_data': 'naive',
    'periodic_thruput_seconds': 'naive',
    'set_buffer_size': 'elastic',
    'max_use': 'advanced',
    'max_staleness': 'advanced',
    'alpha': 'advanced',
    'beta': 'advanced',
    'anneal_step': 'advanced',
    'thruput_controller': 'advanced',
    'monitor': 'advanced',
    'train_iter_per_log': 'deque',
    'priority': 'deque',
    'priority_IS_weight': 'deque',
    'priority_power_factor': 'deque',
    'IS_weight_power_factor': 'deque',
    'IS_weight_anneal_train_iter': 'deque',
    'priority_max_limit': 'deque',
}
# Keys that DI-engine's policy defaults and dizoo configs put in a buffer section and no DI-engine buffer reads.
DI_ENGINE_IGNORED = {
    'max_reuse': "set by DI-engine's collaq / madqn / qtran / wqmix policy defaults; no DI-engine buffer reads it "
    "(the manager's reuse limit is distributed.max_reuse)",
    'min_sample_ratio': 'no DI-engine buffer reads it (the minimum is thruput_controller.sample_min_limit_ratio)',
    'sliced': "DequeBuffer's constructor argument; DequeBufferWrapper never passes it from the config",
    'multi_buffer': "compile_config's switch for a section of several named buffers; a buffer does not read it",
    'name': "the sub-buffer name compile_config writes into each buffer of a multi_buffer section",
}
CONFIG_LOG = logging.getLogger('ding_buffer.config')


def dingengine_ignored(defaults: Mapping, buffer_type: str, why: Optional[str] = None) -> Dict[str, str]:
    """The keys a DI-engine preset with ``defaults`` accepts and ignores, each with why it has no effect (``why``:
    for a type DI-engine does not have, in place of "DI-engine's <type> ignores it too")."""
    out = {k: note for k, note in DI_ENGINE_IGNORED.items() if k not in defaults}
    tail = why or f"DI-engine's {buffer_type!r} ignores it too"
    for key, owner in DI_ENGINE_KEYS.items():
        if key not in defaults:
            out[key] = f"a key of DI-engine's {owner!r} buffer, which type {buffer_type!r} does not read ({tail})"
    return out


def closest_key(key: str, valid) -> str:
    """Return the valid key closest to ``key``, or '' when none is close enough to be the key meant."""
    valid = sorted(str(v) for v in valid)
    match = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.7)
    return match[0] if match else ''


# default's type -> the value types it accepts, first match wins (bool before int; ints where floats are expected;
# bools are never numbers in a config). A default of any other type (or None) accepts anything.
_ACCEPTS = (
    (bool, bool),
    (float, (int, float)),
    (int, int),
    (str, str),
    (Mapping, Mapping),
    ((list, tuple), (list, tuple)),
)


def _type_ok(default: Any, value: Any) -> bool:
    for kind, accepted in _ACCEPTS:
        if isinstance(default, kind):
            return isinstance(value, accepted) and (kind is bool or not isinstance(value, bool))
    return True


def check_str_keys(cfg: Mapping, prefix: str = '') -> None:
    """Every key of ``cfg`` and of the dicts in it is a string (a YAML ``1:`` is an int): else ``ValueError`` naming
    the key, before anything converts the config (``EasyDict`` fails on such a key with a ``TypeError``)."""
    for key, value in cfg.items():
        if not isinstance(key, str):
            raise ValueError(f"config key '{prefix}{key!r}' is of type {type(key).__name__}; config keys are strings")
        if isinstance(value, Mapping):
            check_str_keys(value, f"{prefix}{key}.")
        elif isinstance(value, (list, tuple)):  # (e.g. removers: a list of sections)
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    check_str_keys(item, f"{prefix}{key}[{i}].")


def check_keys_and_types(defaults: Mapping, user: Mapping, prefix: str = '', nullable: frozenset = frozenset()) -> None:
    """Raise ``ValueError`` for an unknown key or a value whose type differs from the default's (``None`` is
    accepted for the dotted keys in ``nullable``)."""
    for key, value in user.items():
        name = prefix + str(key)
        if key not in defaults:
            if not prefix and key in ALWAYS_ALLOWED:
                continue
            near = closest_key(key, defaults)
            hint = f"did you mean '{prefix}{near}'?" if near else 'valid keys: ' + ', '.join(sorted(map(str, defaults)))
            raise ValueError(f"unknown config key '{name}' (value {value!r:.60}); {hint}")
        default = defaults[key]
        if not (value is None and name in nullable) and not _type_ok(default, value):
            raise ValueError(
                f"config key '{name}' has value {value!r} of type {type(value).__name__}; "
                f"expected {type(default).__name__} (default {default!r})"
            )
        if isinstance(default, Mapping) and default:
            check_keys_and_types(default, value, prefix=name + '.', nullable=nullable)


def apply_checks(cfg: Mapping, checks: Dict[str, Check], prefix: str = '') -> None:
    """Apply value constraints; keys may be dotted (``'storage.type'``). Missing keys are skipped."""
    for dotted, (predicate, expected) in checks.items():
        node, found = cfg, True
        for part in dotted.split('.'):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                found = False
                break
        if found and not predicate(node):
            raise ValueError(f"config key '{prefix}{dotted}' has invalid value {node!r:.80}; expected {expected}")


def build_config(
    defaults: Mapping,
    user: Optional[Mapping],
    checks: Optional[Dict[str, Check]] = None,
    prefix: str = '',
    ignored: Optional[Mapping[str, str]] = None,
    warn: bool = True,
    aliases: Optional[Mapping[str, str]] = None,
) -> EasyDict:
    """
    Overview:
        Validate ``user`` against ``defaults`` (keys and types), merge it over the defaults and apply the
        value ``checks`` to the result. ``prefix`` (e.g. ``'policy.other.replay_buffer.'``) is put before key
        names in error messages, for sections nested in a larger config. Top-level keys in ``ignored`` (key ->
        why it has no effect) are dropped with one WARNING each (none with ``warn=False``: a check before the build).
        Top-level keys in ``aliases`` (another library's name -> ours, e.g. torchgfn's ``capacity``) are read as
        the key they name; giving both with different values is a ``ValueError``.
    Returns:
        - cfg (:obj:`EasyDict`): the complete, validated config.
    """
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        raise TypeError(f"buffer config must be a dict/EasyDict, got {type(user).__name__}")
    check_str_keys(user, prefix)
    user = raw = plain_numbers(user)  # (first: an alias and its key holding the same number agree in any form)
    if aliases:
        user = resolve_aliases(user, aliases, prefix)
    if ignored:
        dropped = [k for k in user if k in ignored and k not in defaults]
        if dropped:
            for key in dropped if warn else ():
                CONFIG_LOG.warning("config key '%s%s' = %.60r has no effect: %s", prefix, key, user[key], ignored[key])
            user = {k: v for k, v in user.items() if k not in dropped}
    nullable = frozenset(prefix + k for k in _nullable(checks or {}))
    try:
        check_keys_and_types(defaults, user, prefix=prefix, nullable=nullable)
        cfg = deep_merge_dicts(defaults, user)
        apply_checks(cfg, checks or {}, prefix=prefix)
    except (TypeError, ValueError) as e:  # a value given under an alias: the message names the key the user wrote
        given = [a for a in aliases or () if a in raw and str(e).startswith(f"config key '{prefix}{aliases[a]}'")]
        if not given:
            raise
        key = f"'{prefix}{aliases[given[0]]}'"
        text = str(e).replace(key, f"{key} (given as '{prefix}{given[0]}')", 1)
        raise (TypeError if isinstance(e, TypeError) else ValueError)(text) from e
    return cfg


def plain_numbers(value: Any) -> Any:
    """``value`` with numpy scalars (``np.int64(8)``, ``np.float32(.5)``, ``np.True_``) as the Python numbers they
    hold, through dicts, lists and tuples (new ones where something changed; the user's are left alone): a numpy
    number is accepted wherever its Python number is, and states and files that carry config values hold no numpy
    object (they load without pickle)."""
    np = sys.modules.get('numpy')  # not imported: no numpy scalar can be here (the CLI starts without numpy)
    if np is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        items = {k: plain_numbers(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items  # (merged into an EasyDict)
    if isinstance(value, list) or type(value) is tuple:  # (a tuple stands for a list in a config)
        out = [plain_numbers(v) for v in value]
        return value if all(a is b for a, b in zip(out, value)) else out if isinstance(value, list) else tuple(out)
    return value


def check_section(cls: Any, section: Mapping, prefix: str = '') -> EasyDict:
    """The config a buffer class ``cls`` builds from ``section`` -- its keys, checks, ignored keys and key aliases
    -- without building the buffer (no warnings: a check before the build). ``import_names``, ``cfg_type``,
    ``distributed`` and ``dataset`` (checked when the buffer is built) are not the class's own keys and are left
    out. The one place a job or the distributed wrapper validates a buffer section."""
    own = {k: v for k, v in section.items() if k not in ('import_names', 'cfg_type', 'distributed', 'dataset')}
    if hasattr(cls, 'check_config'):  # a type whose config holds whole buffer sections (the mixture's members)
        try:
            return cls.check_config(own)
        except ValueError as e:
            text = str(e).replace("config key '", f"config key '{prefix}")
            raise ValueError(text.replace("did you mean '", f"did you mean '{prefix}")) from e
    return build_config(
        cls.config,
        own,
        getattr(cls, 'checks', None),
        prefix=prefix,
        ignored=getattr(cls, 'ignored_keys', None),
        warn=False,
        aliases=getattr(cls, 'key_aliases', None),
    )


def resolve_aliases(user: Mapping, aliases: Mapping[str, str], prefix: str = '') -> Mapping:
    """``user`` with each alias key renamed to the key it stands for (a new dict when one is present)."""
    present = [k for k in aliases if k in user]
    if not present:
        return user
    out = dict(user)
    for alias in present:
        key = aliases[alias]
        value = out.pop(alias)
        if key in out and not _same_value(out[key], value):
            raise ValueError(
                f"config keys '{prefix}{alias}' = {value!r:.60} and '{prefix}{key}' = {out[key]!r:.60} "
                f"disagree: '{alias}' is another name for '{key}'; give one of them"
            )
        out[key] = value
    return out


def _same_value(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # e.g. arrays: ambiguous truth value
        return False


def _nullable(checks: Dict[str, Check]) -> frozenset:
    """Keys whose check accepts ``None`` (e.g. ``optional_positive_int``) may be set to ``None``."""
    out = set()
    for key, (predicate, _) in checks.items():
        try:
            if predicate(None):
                out.add(key)
        except Exception:
            pass
    return frozenset(out)


# "no limit" in a config (max_use, max_staleness, the rate limiter's bounds)
INF = float('inf')


def positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


# The most items a buffer may be sized for: beyond it the per-slot arrays alone (a flag, an id, a priority per
# slot) need terabytes, so a larger value is a typo, refused naming its key instead of failing as a MemoryError.
MAX_CAPACITY = 1 << 40


def check_fits_memory(what: str, value: Any, need: float) -> None:
    """``ValueError`` naming ``what`` (a config key, or a saved one) and its ``value`` when the ``need`` bytes of
    per-slot arrays it sizes exceed this machine's memory: checked before they are allocated (a system that
    overcommits memory grants the allocation and kills the process as it is written)."""
    if need > machine_memory():
        raise ValueError(
            f"{what} {value} needs {need / 2**30:.1f} GiB for its slots, more than this machine's "
            f"{machine_memory() / 2**30:.1f} GiB"
        )


def machine_memory() -> int:
    """Bytes of physical memory (no limit where the system cannot tell): what an allocation a file or a config
    declares is checked against before it is tried (a system that overcommits memory would grant it, and the
    process would be killed when it is written)."""
    try:
        return os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def capacity_int(x: Any) -> bool:
    return positive_int(x) and x <= MAX_CAPACITY


CAPACITY_CHECK = (capacity_int, 'a positive int at most 2**40')


def seed_ok(x: Any) -> bool:
    """A config ``seed``: None (drawn at random) or an int (a numpy int too) in [0, 2**63); a bool is not a seed."""
    return x is None or (isinstance(x, numbers.Integral) and not isinstance(x, bool) and 0 <= int(x) < 1 << 63)


SEED_CHECK = (seed_ok, 'None or an int in [0, 2**63)')


def as_float(x: Any) -> float:
    """A numeric config value as a float for a range check: NaN for an int beyond the float range (10**400), so
    the check fails and names the key instead of an OverflowError surfacing later."""
    try:
        return float(x)
    except OverflowError:
        return float('nan')


def finite_number(x: Any) -> bool:
    """An int or float (not a bool) that a float holds finitely: NaN, inf and ints beyond the float range (10**400)
    are not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(as_float(x))


def seconds(x: Any) -> bool:
    """A positive number of seconds of at most 1e7 (115 days): every wait, timer and deadline it feeds can hold it
    (1e10 overflowed a platform ``time_t`` at the first wait; inf killed a timer thread)."""
    return finite_number(x) and 0 < x <= 1e7


SECONDS_CHECK = (seconds, 'a positive number of seconds, at most 1e7')


STEP_LIMIT = 2**60  # learner iterations / env steps beyond this are not counters (and overflow int64 math)


def step_int(x: Any) -> bool:
    """A whole number of steps in [0, 2**60] (an annealing length; larger ones are typos that overflow float math)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= STEP_LIMIT and x == int(x)


STEP_CHECK = (step_int, 'an int in [0, 2**60]')
# a number of steps to run (a training job's env steps or iterations)
STEPS_CHECK = (lambda x: positive_int(x) and x <= STEP_LIMIT, 'a positive int at most 2**60')


def optional_positive_int(x: Any) -> bool:
    return x is None or positive_int(x)

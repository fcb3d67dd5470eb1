"""Config helpers: ``deep_merge_dicts`` and validation of a user config against a buffer's defaults.

Validation rules (applied recursively to nested sections such as ``storage``):

* every key of the user config must exist in the defaults; otherwise ``ValueError`` names the key and the
  closest valid key (``difflib``);
* a value must have the type of the default (``int`` is accepted where a ``float`` is expected; a default of
  ``None`` accepts anything; ``float('inf')`` defaults accept ints and floats);
* per-key constraints (``checks``: key -> (predicate, 'what was expected')) are then applied to the merged
  config, so a wrong value names the key, the value and the expectation.
"""
import copy
import difflib
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from easydict import EasyDict

# Keys that every buffer config may carry without being listed in its defaults.
ALWAYS_ALLOWED = ('type', 'import_names', 'cfg_type', 'distributed')  # 'distributed': validated by ding_buffer.distributed

Check = Tuple[Callable[[Any], bool], str]


def deep_merge_dicts(original: Mapping, new_dict: Optional[Mapping]) -> EasyDict:
    """
    Overview:
        Deep-copy ``original`` and recursively update it with ``new_dict`` (new keys allowed).
        Neither argument is modified.
    Returns:
        - merged (:obj:`EasyDict`): the merged config.
    """
    merged = EasyDict(copy.deepcopy(dict(original)))
    if new_dict is None:
        return merged
    _deep_update(merged, copy.deepcopy(dict(new_dict)))
    return EasyDict(merged)


def _deep_update(original: dict, new: Mapping) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(original.get(k), Mapping):
            sub = dict(original[k])
            _deep_update(sub, v)
            original[k] = sub
        else:
            original[k] = v


def closest_key(key: str, valid) -> str:
    """Return the valid key closest to ``key`` (or the first valid key if nothing is close)."""
    valid = sorted(str(v) for v in valid)
    match = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.0)
    return match[0] if match else (valid[0] if valid else '')


def _type_ok(default: Any, value: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):
        # ints where floats are expected are fine; bools are never numbers in a config.
        if isinstance(value, bool):
            return False
        if isinstance(default, float):
            return isinstance(value, (int, float))
        return isinstance(value, int)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return True


def check_keys_and_types(defaults: Mapping, user: Mapping, prefix: str = '', nullable: frozenset = frozenset()) -> None:
    """Raise ``ValueError`` for an unknown key or a value whose type differs from the default's (``None`` is
    accepted for the dotted keys in ``nullable``)."""
    for key, value in user.items():
        name = prefix + str(key)
        if key not in defaults:
            if not prefix and key in ALWAYS_ALLOWED:
                continue
            raise ValueError(
                f"unknown config key '{name}' (value {value!r}); did you mean "
                f"'{prefix}{closest_key(key, defaults.keys())}'?"
            )
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
            raise ValueError(f"config key '{prefix}{dotted}' has invalid value {node!r}; expected {expected}")


def build_config(
        defaults: Mapping,
        user: Optional[Mapping],
        checks: Optional[Dict[str, Check]] = None,
        prefix: str = '',
) -> EasyDict:
    """
    Overview:
        Validate ``user`` against ``defaults`` (keys and types), merge it over the defaults and apply the
        value ``checks`` to the result. ``prefix`` (e.g. ``'policy.other.replay_buffer.'``) is put before key
        names in error messages, for sections nested in a larger config.
    Returns:
        - cfg (:obj:`EasyDict`): the complete, validated config.
    """
    if user is None:
        user = {}
    if not isinstance(user, Mapping):
        raise TypeError(f"buffer config must be a dict/EasyDict, got {type(user).__name__}")
    nullable = frozenset(prefix + k for k in _nullable(checks or {}))
    check_keys_and_types(defaults, user, prefix=prefix, nullable=nullable)
    cfg = deep_merge_dicts(defaults, user)
    apply_checks(cfg, checks or {}, prefix=prefix)
    return cfg


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


def positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def optional_positive_int(x: Any) -> bool:
    return x is None or positive_int(x)

"""The ready configs shipped with the package: find one by name, list them (``ding-buffer configs``).

They live in ``config/`` in a checkout and install as the package ``ding_buffer.configs``, so ``ding-buffer train
cartpole_dqn_per`` works from a wheel as well as from a checkout. This module imports nothing heavy (no torch): the
command resolves its config before the first line it prints. Files are read, not executed, to list them.
"""

import ast
import difflib
import importlib.util
import os
from typing import List, NamedTuple, Optional


class ReadyConfig(NamedTuple):
    name: str  # the file name without .py: what ``ding-buffer train NAME`` takes
    path: str
    job: str  # main_config['job'] ('dqn' when a training config names none); '-' for a buffer-section example
    summary: str  # the first paragraph of the file's docstring, on one line


def config_dir() -> Optional[str]:
    """The directory holding the ready configs: the installed ``ding_buffer.configs`` or, in a checkout that is not
    installed, ``config/`` beside the package; ``None`` when neither exists."""
    try:
        spec = importlib.util.find_spec('ding_buffer.configs')
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if os.path.isdir(location):
                return location
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'config')
    return beside if os.path.isfile(os.path.join(beside, '__init__.py')) else None


def list_configs() -> List[ReadyConfig]:
    """Every ready config, sorted by name."""
    root = config_dir()
    if root is None:
        return []
    out = []
    for fname in sorted(os.listdir(root)):
        if fname.endswith('.py') and not fname.startswith('_'):
            path = os.path.join(root, fname)
            job, summary = _describe(path)
            out.append(ReadyConfig(fname[:-3], path, job, summary))
    return out


def resolve_config(arg: str) -> str:
    """
    Overview:
        The config file ``arg`` names: an existing file path as given; otherwise a ready config by name
        (``cartpole_dqn_per``, ``cartpole_dqn_per.py`` or ``config/cartpole_dqn_per.py``, the README's form, which
        then works outside a checkout too). ``FileNotFoundError`` naming the argument and the known names otherwise.
    """
    if os.path.isfile(arg):
        return arg
    head, tail = os.path.split(arg)
    name = tail[:-3] if tail.endswith('.py') else tail
    ready = list_configs()
    if head in ('', 'config') and name:
        for cfg in ready:
            if cfg.name == name:
                return cfg.path
    close = difflib.get_close_matches(name, [c.name for c in ready], n=1, cutoff=0.6) if name else []
    hint = f"did you mean '{close[0]}'? " if close else ''
    names = ', '.join(c.name for c in ready if c.job != '-') or '(none found)'
    what = 'is a directory, not a config file,' if os.path.isdir(arg) else 'does not exist'
    raise FileNotFoundError(
        f"config file '{arg}' {what} and is not the name of a ready config; {hint}"
        f"(training configs: {names}; `ding-buffer configs` lists all)"
    )


def _describe(path: str) -> tuple:
    """(job, first docstring paragraph) of a config file, read with ``ast`` (the file is not executed)."""
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return '?', '(unreadable)'
    doc = (ast.get_docstring(tree) or '').strip().split('\n\n')[0].split()  # the first paragraph, whole
    keys = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == 'main_config' for t in node.targets
        ):
            if isinstance(node.value, ast.Call):
                keys = {k.arg: k.value for k in node.value.keywords if k.arg}
    if 'job' in keys and isinstance(keys['job'], ast.Constant):
        job = str(keys['job'].value)
    else:
        job = 'dqn' if 'env' in keys else '-'
    return job, ' '.join(doc)


__all__ = ['ReadyConfig', 'config_dir', 'list_configs', 'resolve_config']

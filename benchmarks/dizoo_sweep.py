"""Build every replay-buffer section of DI-engine's ``dizoo`` configs with ``ding_buffer.create_buffer``.

Each section is compiled the way DI-engine's ``compile_config(..., auto=True, create_cfg=...)`` compiles it:

1. ``create_cfg.replay_buffer`` defaults to ``{'type': 'advanced'}`` (and the buffer class is then
   ``AdvancedReplayBuffer``; otherwise the class registered under the policy section's ``type``);
2. the policy's default config (``Policy.config``, over DI-engine's policy template) is shallow-updated with
   ``create_cfg.policy``, and its ``other.replay_buffer`` with ``create_cfg.replay_buffer``;
3. ``deep_merge_dicts(buffer class defaults, policy section)``, then ``deep_merge_dicts(that, user section)``; with
   ``multi_buffer`` every named sub-buffer is compiled that way and gets ``name``.

DI-engine is read as source (``pip install --no-deps di-engine==0.5.3`` brings ``ding/`` and ``dizoo/``): class
configs and registrations are evaluated from the syntax tree with a few builtins, and a config module's top-level
assignments are executed without its imports -- nothing of DI-engine is imported, so its dependencies are not
needed. Every config pair (``main_config`` / ``create_config``, or ``X_config`` / ``X_create_config``) of every
module under ``dizoo/`` is compiled: a compiled config always has ``policy.other.replay_buffer``.

Run:  python benchmarks/dizoo_sweep.py [--verbose]
"""

import argparse
import ast
import collections
import copy
import importlib.util
import logging
import math
import os
import re
import sys
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

from easydict import EasyDict

from ding_buffer.config import deep_merge_dicts

# The policy template of compile_config: every compiled policy config has these sections.
POLICY_TEMPLATE = dict(
    model=dict(),
    learn=dict(learner=dict()),
    collect=dict(collector=dict()),
    eval=dict(evaluator=dict()),
    other=dict(replay_buffer=dict()),
)
SAFE = {
    'dict': dict,
    'list': list,
    'tuple': tuple,
    'int': int,
    'float': float,
    'str': str,
    'bool': bool,
    'EasyDict': EasyDict,
    'edict': EasyDict,
    'inf': math.inf,
    'math': math,
    'deepcopy': copy.deepcopy,
    'copy': copy,
    'True': True,
    'False': False,
    'None': None,
    'range': range,
    'len': len,
    'abs': abs,
    'min': min,
    'max': max,
    'round': round,
    'sum': sum,
    'zip': zip,
    'enumerate': enumerate,
    'os': os,
}


def source_root(package: str) -> Optional[str]:
    """Directory of an installed top-level package, found without importing it (None: not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


# ---------------------------------------------------------------------------------------------------- registries
class ClassInfo:
    def __init__(self, name: str, bases: List[str], config: Any, registered: List[Tuple[str, str]], path: str):
        self.name, self.bases, self.config, self.registered, self.path = name, bases, config, registered, path


def _evaluate(node: ast.AST, env: Dict[str, Any]) -> Any:
    code = compile(ast.Expression(body=node), '<config>', 'eval')
    return eval(code, {'__builtins__': {}}, {**SAFE, **env})  # DI-engine's own source, installed from PyPI


def scan_classes(root: str) -> List[ClassInfo]:
    """Every class under ``root`` with its bases, ``config`` (evaluated; a ``ClassRef`` when it copies another
    class's config, None when absent or not evaluable) and ``*_REGISTRY.register(name)`` decorators."""
    out = []
    for dirpath, _, files in os.walk(root):
        for fname in sorted(files):
            if not fname.endswith('.py'):
                continue
            path = os.path.join(dirpath, fname)
            try:
                with open(path, encoding='utf-8') as f, warnings.catch_warnings():
                    warnings.simplefilter('ignore')  # DI-engine's sources have invalid escape sequences
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            env = None
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    if env is None:  # module constants a class config may use
                        env = module_env(tree, path)
                    out.append(_class_info(node, path, env))
    return out


def _class_info(node: ast.ClassDef, path: str, env: Dict[str, Any]) -> ClassInfo:
    bases = [b.id if isinstance(b, ast.Name) else getattr(b, 'attr', '') for b in node.bases]
    registered = []
    for dec in node.decorator_list:
        if (
            isinstance(dec, ast.Call)
            and isinstance(dec.func, ast.Attribute)
            and dec.func.attr == 'register'
            and isinstance(dec.func.value, ast.Name)
            and dec.args
            and isinstance(dec.args[0], ast.Constant)
        ):
            registered.append((dec.func.value.id, dec.args[0].value))
    config: Any = None
    env = dict(env)  # class-level constants (e.g. ACER's unroll_len) are visible to its config
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        try:
            value = _evaluate(stmt.value, env)
        except Exception:
            value = 'unevaluable'
        if name == 'config':
            config = value
        elif value != 'unevaluable':
            env[name] = value
    return ClassInfo(node.name, bases, config, registered, path)


def registry(classes: List[ClassInfo], registry_name: str) -> Dict[str, ClassInfo]:
    return {name: c for c in classes for reg, name in c.registered if reg == registry_name}


def default_config(cls: ClassInfo, by_name: Dict[str, List[ClassInfo]]) -> Optional[EasyDict]:
    """``cls.default_config()``: its own ``config`` or the nearest base's (by class name), with ``cfg_type``."""
    seen, todo = set(), [cls]
    while todo:
        c = todo.pop(0)
        if id(c) in seen:
            continue
        seen.add(id(c))
        if isinstance(c.config, dict):
            cfg = EasyDict(copy.deepcopy(c.config))
            cfg.cfg_type = cls.name + 'Dict'
            return cfg
        if c.config == 'unevaluable':
            return None
        for base in c.bases:
            candidates = by_name.get(base, [])
            same_file = [b for b in candidates if b.path == c.path]
            todo.extend(same_file or candidates[:1])
    return EasyDict(cfg_type=cls.name + 'Dict')


# ---------------------------------------------------------------------------------------------------- config files
def load_config_module(path: str) -> Dict[str, Any]:
    """The top-level assignments of a dizoo config module, executed one by one without its imports."""
    with open(path, encoding='utf-8') as f, warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return module_env(ast.parse(f.read()), path)


def module_env(tree: ast.Module, path: str) -> Dict[str, Any]:
    """Execute a module's top-level assignments (and calls such as ``x.update(...)``) one by one, skipping its
    imports and whatever fails."""
    env: Dict[str, Any] = {}
    for stmt in tree.body:
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)):
            continue
        if isinstance(stmt, ast.Expr) and not isinstance(stmt.value, ast.Call):
            continue
        try:
            exec(compile(ast.Module(body=[stmt], type_ignores=[]), path, 'exec'), {'__builtins__': {}, **SAFE}, env)
        except Exception:
            continue
    return env


def config_pairs(env: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(name, main config, create config) pairs of a config module: ``main_config`` / ``create_config`` or
    ``X_config`` / ``X_create_config``."""
    pairs = []
    if isinstance(env.get('main_config'), dict) and isinstance(env.get('create_config'), dict):
        pairs.append(('main_config', env['main_config'], env['create_config']))
    else:
        for name, value in env.items():
            m = re.fullmatch(r'(.+)_create_config', name)
            if m and isinstance(value, dict) and isinstance(env.get(m.group(1) + '_config'), dict):
                pairs.append((m.group(1) + '_config', env[m.group(1) + '_config'], value))
    return [p for p in pairs if isinstance(p[1].get('policy'), dict) and isinstance(p[2].get('policy'), dict)]


# ---------------------------------------------------------------------------------------------------- compile
class Sweep:
    def __init__(self, ding_root: str, dizoo_root: str) -> None:
        self.ding_root, self.dizoo_root = ding_root, dizoo_root
        classes = scan_classes(ding_root) + scan_classes(dizoo_root)
        self.by_name: Dict[str, List[ClassInfo]] = collections.defaultdict(list)
        for c in classes:
            self.by_name[c.name].append(c)
        self.policies = registry(classes, 'POLICY_REGISTRY')
        self.buffers = registry(classes, 'BUFFER_REGISTRY')

    def buffer_defaults(self, buffer_type: str) -> EasyDict:
        if buffer_type not in self.buffers:
            raise KeyError(f'DI-engine registers no buffer type {buffer_type!r}')
        return default_config(self.buffers[buffer_type], self.by_name)

    def compile(self, main: Any, create: Any) -> List[EasyDict]:
        """The compiled buffer section(s) of one config pair (several with ``multi_buffer``)."""
        main, create = EasyDict(copy.deepcopy(main)), EasyDict(copy.deepcopy(create))
        buffer_type = None
        if 'replay_buffer' not in create:
            create.replay_buffer = EasyDict(type='advanced')
            buffer_type = 'advanced'
        policy_type = create.policy.get('type')
        if policy_type not in self.policies:
            raise KeyError(f'DI-engine registers no policy type {policy_type!r}')
        policy_default = default_config(self.policies[policy_type], self.by_name)
        if policy_default is None:
            raise KeyError(f'policy {policy_type!r}: default config not evaluable from source')
        policy_cfg = deep_merge_dicts(POLICY_TEMPLATE, policy_default)
        policy_cfg.update(create.policy)
        policy_cfg.other.replay_buffer.update(create.replay_buffer)
        user = main.policy.get('other', {}).get('replay_buffer', {})
        if not policy_cfg.other.replay_buffer.get('multi_buffer', False):
            return [self._section(policy_cfg.other.replay_buffer, user, buffer_type)]
        out = []
        for name, section in policy_cfg.other.replay_buffer.items():
            if name == 'multi_buffer':
                continue
            if not isinstance(section, dict):  # e.g. the 'type' that create_cfg's default adds: not a buffer
                continue
            # DI-engine looks the user's sub-section up under the literal key 'buffer_name' (its own slip).
            cfg = self._section(section, user.get('buffer_name', {}), buffer_type)
            cfg.name = name
            out.append(cfg)
        return out

    def _section(self, policy_section: Any, user_section: Any, buffer_type: Optional[str]) -> EasyDict:
        if buffer_type is None:
            if 'type' not in policy_section:
                raise KeyError('no buffer type in create_cfg or the policy config')
            buffer_type = policy_section.type
        cfg = deep_merge_dicts(self.buffer_defaults(buffer_type), policy_section)
        return deep_merge_dicts(cfg, user_section)

    def config_files(self) -> List[str]:
        out = []
        for dirpath, _, files in os.walk(self.dizoo_root):
            for fname in sorted(files):
                if fname.endswith('.py'):
                    out.append(os.path.join(dirpath, fname))
        return sorted(out)

    def sections(self):
        """Yield (file:pair, compiled sections or the exception compiling them) for every config pair."""
        for path in self.config_files():
            try:
                env = load_config_module(path)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for name, main, create in config_pairs(env):
                where = f'{os.path.relpath(path, os.path.dirname(self.dizoo_root))}:{name}'
                try:
                    yield where, self.compile(main, create)
                except KeyError as e:
                    yield where, e


def reason(exc: BaseException) -> str:
    """A short, groupable reason: the exception type and its message with numbers and reprs masked."""
    msg = str(exc).split('\n')[0]
    msg = re.sub(r"\(value [^)]*\)", '(value ...)', msg)
    msg = re.sub(r'(?<![A-Za-z_])\d+(\.\d+)?(e[-+]?\d+)?', 'N', msg)
    return f'{type(exc).__name__}: {msg[:160]}'


def run_sweep(verbose: bool = False) -> Optional[Dict[str, Any]]:
    """Build every compiled section; None when DI-engine's source is not installed. Returns counts, the
    refusals by reason (with examples), the sections that could not be compiled, and the warnings logged."""
    ding_root, dizoo_root = source_root('ding'), source_root('dizoo')
    if ding_root is None or dizoo_root is None:
        return None
    import ding_buffer

    sweep = Sweep(ding_root, dizoo_root)
    built, failed, uncompiled = 0, collections.defaultdict(list), collections.defaultdict(list)
    warned: Dict[str, int] = collections.Counter()
    types: Dict[str, int] = collections.Counter()
    served: Dict[str, int] = collections.Counter()
    handler = _Collect()
    log = logging.getLogger('ding_buffer')
    log.addHandler(handler)
    old_cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # buffers may write ./<exp_name>/log
        try:
            for where, sections in sweep.sections():
                if isinstance(sections, Exception):
                    uncompiled[reason(sections)].append(where)
                    continue
                for cfg in sections:
                    handler.records.clear()
                    try:
                        buf = ding_buffer.create_buffer(cfg, exp_name='sweep', instance_name='buffer')
                        try:
                            served[exercise(buf, cfg.get('type'))] += 1
                        finally:
                            buf.close()
                        built += 1
                        types[cfg.get('type', '?')] += 1
                    except Exception as e:  # noqa: BLE001 -- every refusal is what the sweep reports
                        failed[reason(e)].append(where)
                        if verbose:
                            print(f'{where}: {reason(e)}', file=sys.stderr)
                    for rec in handler.records:
                        if rec.levelno >= logging.WARNING:
                            key = re.match(r"config key '([^']*)'", rec.getMessage())
                            warned[key.group(1) if key else rec.getMessage()[:80]] += 1
        finally:
            os.chdir(old_cwd)
            log.removeHandler(handler)
    total = built + sum(len(v) for v in failed.values())
    return dict(
        total=total,
        built=built,
        failed=dict(failed),
        uncompiled=dict(uncompiled),
        warned=dict(warned),
        types=dict(types),
        served=dict(served),
    )


def exercise(buf: Any, buffer_type: str) -> str:
    """A serial-pipeline round on a built buffer: push 8 transitions with ``cur_collector_envstep``, sample 4 with
    the learner's iteration, and ``update`` with the ``priority_info`` a DI-engine ``BaseLearner`` builds from that
    batch. Returns 'served' (a batch came back and the update was taken), 'held back' (the config's own limits
    refuse this early sample, e.g. a throughput controller) or 'skipped' (episode buffers store episodes)."""
    if buffer_type == 'episode':
        return 'skipped'
    buf.push(
        [{'obs': float(i), 'action': i % 2, 'reward': 1.0, 'done': False, 'collect_iter': 0} for i in range(8)],
        cur_collector_envstep=8,
    )
    batch = buf.sample(2, 2, 1) if buffer_type == 'sequence' else buf.sample(4, 1)
    if batch is None:
        return 'held back'
    if buffer_type == 'sequence':
        assert len(batch) == 2 and all(len(run) == 2 for run in batch), batch
        return 'served'
    assert isinstance(batch, list) and len(batch) == 4, batch
    info = {
        'priority': [0.5 + i for i in range(4)],
        'replay_buffer_idx': [d.get('replay_buffer_idx') for d in batch],
        'replay_unique_id': [d.get('replay_unique_id') for d in batch],
    }
    buf.update(info)
    return 'served'


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--verbose', action='store_true', help='print every refusal')
    args = parser.parse_args()
    result = run_sweep(args.verbose)
    if result is None:
        print('DI-engine is not installed: pip install --no-deps di-engine==0.5.3 (source only, for this sweep)')
        return 2
    total, built = result['total'], result['built']
    print(f'built {built} of {total} compiled dizoo buffer sections ({100.0 * built / max(total, 1):.1f}%)')
    print('by type: ' + ', '.join(f'{k} {v}' for k, v in sorted(result['types'].items())))
    print('push / sample / update round: ' + ', '.join(f'{k} {v}' for k, v in sorted(result['served'].items())))
    for why, where in sorted(result['failed'].items(), key=lambda kv: -len(kv[1])):
        print(f'  refused {len(where):4d}  {why}   e.g. {where[0]}')
    for why, where in sorted(result['uncompiled'].items(), key=lambda kv: -len(kv[1])):
        print(f'  not compiled {len(where):4d}  {why}   e.g. {where[0]}')
    for msg, n in sorted(result['warned'].items(), key=lambda kv: -kv[1]):
        print(f'  accepted with a no-effect warning {n:4d}  {msg}')
    return 0 if built == total else 1


if __name__ == '__main__':
    sys.exit(main())

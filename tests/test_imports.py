"""The import graph of ding_buffer, read from the source with ``ast`` (nothing is imported): no cycles, ``base.py``
imports nothing above it, the worker side of ``distributed/`` never imports the manager, ``train/`` is reached only
by the CLI, and ``distributed/``, ``train/`` and the CLI import every public exception from ``errors.py`` and keep
no re-export shims.

An edge ``a -> b``: module ``a`` has ``import b`` / ``from b import x`` (``from pkg import sub`` is an edge to the
submodule ``pkg.sub``; ``from pkg import name`` one to ``pkg``'s ``__init__``). The parent packages Python runs on
the way to a submodule are not edges. An import inside a function (or a lambda) is *deferred*: the cycle check of
the whole package ignores it (a deferred import is how an optional or heavy dependency is loaded late); the cycle
check of ``distributed/``, ``train/`` and the CLI, and every other check, count it (it is a dependency all the same).
"""

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PKG = 'ding_buffer'
ROOT = Path(__file__).resolve().parents[1] / PKG

# distributed/'s manager side: the modules that are or import the manager (ManagerCore, the rank loop, the Ray
# actor and its get-or-create, the factory that builds either end, the package that registers the factory and
# exports ManagerCore). Every other module of distributed/ is the worker side or shared by both sides (protocol,
# codec, transport, channel, ray_channel, remote, push_pipeline, sharded, ...) and imports none of these.
MANAGER_SIDE = {'', 'factory', 'manager', 'rank_manager', 'ray_backend'}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


MODULES: Dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob('*.py'))}


def _imports(name: str) -> List[Tuple[str, bool, int]]:
    """``(target module, deferred, line)`` of every import of a ding_buffer module in module ``name``."""
    path = MODULES[name]
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    out: List[Tuple[str, bool, int]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner, child.lineno) for a in child.names if a.name in MODULES)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split('.')[: len(package.split('.')) - (child.level - 1)]
                    source = '.'.join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ''
                for a in child.names:
                    if f'{source}.{a.name}' in MODULES:
                        out.append((f'{source}.{a.name}', inner, child.lineno))
                    elif source in MODULES:
                        out.append((source, inner, child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


IMPORTS = {name: _imports(name) for name in MODULES}


def _under(name: str, sub: str) -> bool:
    return name == f'{PKG}.{sub}' or name.startswith(f'{PKG}.{sub}.')


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def _edges(deferred: bool) -> Dict[str, Set[str]]:
    return {m: {t for t, d, _ in IMPORTS[m] if t != m and (deferred or not d)} for m in MODULES}


def test_the_graph_sees_the_package():
    # the parser finds the modules and their imports (a guard against a check that passes on an empty graph)
    assert {f'{PKG}.base', f'{PKG}.errors', f'{PKG}.distributed', f'{PKG}.train.launch'} <= set(MODULES)
    assert (f'{PKG}.config', False) in {(t, d) for t, d, _ in IMPORTS[f'{PKG}.base']}
    assert any(t == f'{PKG}.distributed.codec' for t, _, _ in IMPORTS[f'{PKG}.distributed.transport'])
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]  # the cycle finder finds
    for m in MANAGER_SIDE:  # the manager side named below exists
        assert f'{PKG}.distributed' + (f'.{m}' if m else '') in MODULES, m


def test_no_import_cycle_among_the_modules():
    assert _cycles(_edges(deferred=False)) == []


@pytest.mark.parametrize('area', ['distributed', 'train', 'cli'])
def test_no_cycle_through_distributed_train_or_the_cli_even_through_deferred_imports(area):
    # a deferred import hides a cycle from Python, not from the design: these layers import strictly downwards
    touching = [c for c in _cycles(_edges(deferred=True)) if any(_under(m, area) for m in c)]
    assert touching == []


def test_base_imports_nothing_above_it_but_config_and_errors():
    targets = {t for t, _, _ in IMPORTS[f'{PKG}.base']}
    assert targets <= {f'{PKG}.config', f'{PKG}.errors', f'{PKG}.forks'}, sorted(targets)  # (forks: stdlib + numpy)


def test_the_worker_side_of_distributed_never_imports_the_manager():
    manager_side = {f'{PKG}.distributed' + (f'.{m}' if m else '') for m in MANAGER_SIDE}
    bad = sorted(
        {
            f'{m}:{line} imports {t}'
            for m in MODULES
            if _under(m, 'distributed') and m not in manager_side
            for t, _, line in IMPORTS[m]
            if t in manager_side
        }
    )
    assert bad == [], '\n'.join(bad)


def test_train_is_imported_only_by_the_cli():
    allowed = {f'{PKG}.cli', PKG}  # the package's lazy exports are by name, not by import
    bad = sorted(
        {
            f'{m}:{line} imports {t}'
            for m in MODULES
            if not _under(m, 'train') and m not in allowed
            for t, _, line in IMPORTS[m]
            if _under(t, 'train')
        }
    )
    assert bad == [], '\n'.join(bad)


def test_train_never_imports_the_cli():
    # the CLI imports train, never the reverse (what both need lives in train/)
    bad = sorted(
        {
            f'{m}:{line} imports {t}'
            for m in MODULES
            if _under(m, 'train')
            for t, _, line in IMPORTS[m]
            if t in (f'{PKG}.cli', f'{PKG}.__main__')
        }
    )
    assert bad == [], '\n'.join(bad)


def _own(name: str) -> bool:
    return _under(name, 'distributed') or _under(name, 'train') or name == f'{PKG}.cli'


def test_public_exceptions_are_imported_from_errors():
    errors = ast.parse(MODULES[f'{PKG}.errors'].read_text())
    public = {n.name for n in errors.body if isinstance(n, ast.ClassDef)}
    assert {'CodecError', 'ManagerUnavailableError', 'SampleTimeoutError'} <= public
    bad = []
    for m in MODULES:
        if not (_own(m) or m == PKG):
            continue
        for node in ast.walk(ast.parse(MODULES[m].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != 'errors' and node.module != f'{PKG}.errors':
                bad += [
                    f'{m}:{node.lineno} imports {a.name} from {node.module}' for a in node.names if a.name in public
                ]
    assert bad == [], '\n'.join(bad)


def test_distributed_train_and_the_cli_keep_no_reexport_shims():
    # a name is imported where it is used; old import paths are not kept alive (a package __init__ may export)
    bad = [
        f'{m}:{i + 1}'
        for m, path in MODULES.items()
        if _own(m) and path.name != '__init__.py'
        for i, line in enumerate(path.read_text().splitlines())
        if 'noqa: F401' in line
    ]
    assert bad == [], '\n'.join(bad)
    assert f'{PKG}.distributed.delegate' not in MODULES  # properties forwarding to a helper under old names

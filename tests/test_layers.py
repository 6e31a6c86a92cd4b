"""Every import inside agenttx follows the layer map at the top of agenttx/__init__.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agenttx

PACKAGE = Path(agenttx.__file__).parent


def _layers() -> dict[str, int]:
    """Unit name (top-level module or package) -> layer, read from the package docstring."""
    layers: dict[str, int] = {}
    for match in re.finditer(r"^\s*layer (\d): (.+)$", agenttx.__doc__ or "", re.MULTILINE):
        for unit in match.group(2).split():
            layers[unit] = int(match.group(1))
    return layers


def _unit_of(parts: tuple[str, ...]) -> str:
    """The layer-map unit of a module given by its path parts under agenttx/."""
    return parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[tuple[str, ...], list[str], int]]:
    """(target module parts under agenttx, imported names, line) for each agenttx import."""
    here = path.relative_to(PACKAGE).parts[:-1]
    found: list[tuple[tuple[str, ...], list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = base + (tuple(node.module.split(".")) if node.module else ())
            elif node.module and node.module.split(".")[0] == "agenttx":
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            names = [alias.name for alias in node.names]
            if not target:  # `from . import x`: each name is a module
                found.extend(((name,), [], node.lineno) for name in names)
            else:
                found.append((target, names, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "agenttx" and len(parts) > 1:
                    found.append((tuple(parts[1:]), [], node.lineno))
    return found


def _violations() -> list[str]:
    layers = _layers()
    problems: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if parts == ("__init__.py",):
            continue  # the public surface re-exports from every layer
        source = _unit_of(parts)
        where = "/".join(parts)
        if source not in layers:
            problems.append(f"{where}: unit {source} is not in the layer map")
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            if source != "_graph" and any(m.split(".")[0] == "rustworkx" for m in modules):
                problems.append(f"{where}:{node.lineno}: imports rustworkx (only _graph may)")
        for target, names, line in _imports(path):
            unit = _unit_of(target)
            if unit == source:
                continue
            if unit not in layers:
                problems.append(f"{where}:{line}: imports {unit}, not in the layer map")
                continue
            if layers[unit] > layers[source]:
                problems.append(
                    f"{where}:{line}: layer {layers[source]} imports {'.'.join(target)} "
                    f"(layer {layers[unit]})"
                )
            # A private package's modules, and a public package's private ones (`stores._sqlite`),
            # are reached only through the package.
            if len(target) > 1 and (unit.startswith("_") or target[1].startswith("_")):
                problems.append(f"{where}:{line}: reaches into {'.'.join(target)}")
            private = [n for n in names if n.startswith("_") and not n.endswith("__")]
            if private:
                problems.append(f"{where}:{line}: imports private {private} from {unit}")
    return problems


def test_layer_map_lists_every_unit():
    """Each top-level module and package of agenttx has a layer in the map."""
    units = {
        path.name.removesuffix(".py")
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert units - set(_layers()) == set()


def test_every_import_follows_the_layer_map():
    """No module imports upward, into another package's private modules, or a private name."""
    assert _violations() == []


def test_checker_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker is not vacuous: an upward import in a layer-0 module is reported."""
    fake = tmp_path / "agenttx"
    fake.mkdir()
    (fake / "_errors.py").write_text("from ._transaction import Transaction\n")
    (fake / "_json.py").write_text("from ._saga._ledger import SagaLedger\n")
    (fake / "_limits.py").write_text("from ._graph import _Link\n")
    (fake / "_refs.py").write_text("import rustworkx\n")
    (fake / "_render.py").write_text("from .stores._durable import is_durable\n")
    (fake / "stores").mkdir()
    (fake / "stores" / "__init__.py").write_text("")
    (fake / "stores" / "_sqlite.py").write_text(
        "from . import _durable\nif True:\n    from .._engine import Engine\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    problems = _violations()
    assert any("_errors.py:1: layer 0 imports _transaction" in p for p in problems)
    assert any("reaches into _saga._ledger" in p for p in problems)
    assert any("imports private ['_Link']" in p for p in problems)
    assert any("_refs.py:1: imports rustworkx" in p for p in problems)
    assert any("_render.py:1: reaches into stores._durable" in p for p in problems)
    assert any("stores/_sqlite.py:3: layer 1 imports _engine" in p for p in problems)
    assert not any("stores/_sqlite.py:1" in p for p in problems)  # within its own package


def test_transaction_and_plans_sit_one_layer_above_the_step_core():
    """The transaction package and the plans package, the step core's two hosts, sit side by
    side one layer above it."""
    layers = _layers()
    assert layers["_transaction"] == layers["_plans"] == layers["_step"] + 1


# ---------------------------------------------------------------------- import circles


def _module_name(path: Path) -> str:
    """`agenttx._plans._model` for agenttx/_plans/_model.py (a package is its `__init__`)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(*, deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the agenttx modules it imports at module level or under `TYPE_CHECKING`, and
    with `deferred`, inside functions too."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        pending: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
        while pending:
            node = pending.pop()
            for child in ast.iter_child_nodes(node):
                if not deferred and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                pending.append(child)
                targets: list[str] = []
                if isinstance(child, ast.ImportFrom):
                    base = package.split(".")
                    if child.level:
                        base = base[: len(base) - (child.level - 1)]
                        module = ".".join([*base, *([child.module] if child.module else [])])
                    else:
                        module = child.module or ""
                    targets = [
                        f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module
                        for alias in child.names
                    ]
                elif isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                for imported in targets:
                    target = imported
                    while target not in paths and "." in target:
                        target = target.rpartition(".")[0]
                    if target in paths and target != name:
                        graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's, iteratively), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def test_no_import_circle():
    """No agenttx modules import each other in a circle, `TYPE_CHECKING` imports included."""
    assert _circles(_import_graph()) == []


def test_no_import_circle_hides_in_a_function():
    """No circle is closed by an import inside a function either (such an import defers the
    circle to run time; it does not remove it)."""
    assert _circles(_import_graph(deferred=True)) == []


def test_circle_check_catches_a_planted_circle(tmp_path, monkeypatch):
    """The circle check is not vacuous: a circle closed under `TYPE_CHECKING` is reported, and
    one closed inside a function is when deferred imports are asked for."""
    fake = tmp_path / "agenttx"
    (fake / "_plans").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "_plans" / "__init__.py").write_text("")
    (fake / "_history.py").write_text("from ._results import StepAttempt\n")
    (fake / "_results.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._timeline import Voided\n"
    )
    (fake / "_timeline.py").write_text("from . import _history\n")
    (fake / "_plans" / "_model.py").write_text("def f():\n    from ._validate import g\n")
    (fake / "_plans" / "_validate.py").write_text("from ._model import f\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert _circles(_import_graph()) == [
        ["agenttx._history", "agenttx._results", "agenttx._timeline"]
    ]
    assert _circles(_import_graph(deferred=True)) == [
        ["agenttx._history", "agenttx._results", "agenttx._timeline"],
        ["agenttx._plans._model", "agenttx._plans._validate"],
    ]


# ---------------------------------------------------------------------- module size

#: The longest a module may be (conventions: a module past it splits by sub-concept).
MAX_MODULE_LINES = 800


def _too_long() -> list[str]:
    """The modules under agenttx/ longer than `MAX_MODULE_LINES`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines")
    return found


def test_no_module_is_too_long():
    """No module of agenttx passes 800 lines."""
    assert _too_long() == []


def test_length_check_catches_a_long_module(tmp_path, monkeypatch):
    """The length check is not vacuous: 801 lines are reported, 800 are not, in a package
    one level down too."""
    fake = tmp_path / "agenttx"
    (fake / "stores").mkdir(parents=True)
    (fake / "_plans").mkdir()
    (fake / "stores" / "_long.py").write_text("x = 1\n" * 801)
    (fake / "_short.py").write_text("x = 1\n" * 800)
    (fake / "_plans" / "_execution.py").write_text("x = 1\n" * 900)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert _too_long() == ["_plans/_execution.py: 900 lines", "stores/_long.py: 801 lines"]

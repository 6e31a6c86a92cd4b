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


def test_plans_package_is_layer_three():
    """The plans package sits beside the transaction, in layer 3 (its lines may continue)."""
    layers = _layers()
    assert layers["_plans"] == 3
    assert layers["_transaction"] == 3

"""The layout holds: small modules, private names kept private, the kernel free of torch, and
only ``nbdist.worker.api`` functions shipped to engines. Read from the source, not by convention."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbdist"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)
MAX_LINES = 400

#: Modules that run in the kernel or the Jupyter server (or are shared with them): no torch at
#: import time. Engine-side modules (``worker/``) and the fork server may import it.
KERNEL_SIDE = ("notebook", "server", "telemetry")
SHARED = ("protocol.py", "wire.py", "config.py", "errors.py", "__init__.py")


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_modules_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines (at most {MAX_LINES})"


#: Underscore names that are public API: named tuples' own methods.
_PUBLIC_UNDERSCORE = {"_fields", "_asdict", "_replace", "_make"}


def _private_uses(path: Path) -> list[str]:
    """``from nbdist.x import _y`` and ``x._y`` where ``x`` is an imported nbdist module."""
    tree = _tree(path)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            internal = node.level > 0 or (node.module or "").startswith("nbdist")
            for alias in node.names:
                if internal and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                if internal:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nbdist"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in _PUBLIC_UNDERSCORE
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_another_modules_private_names():
    crossings = {_name(p): u for p in MODULES if (u := _private_uses(p))}
    assert crossings == {}


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in _tree(path).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_kernel_side_modules_do_not_import_torch():
    kernel = [
        p
        for p in MODULES
        if p.relative_to(PACKAGE).parts[0] in KERNEL_SIDE
        or p.name in SHARED
        and p.parent == PACKAGE
    ]
    assert kernel, "no kernel-side modules found"
    heavy = {_name(p): sorted(_top_level_imports(p) & {"torch"}) for p in kernel}
    assert {k: v for k, v in heavy.items() if v} == {}


def _shipped(path: Path) -> list[tuple[int, str]]:
    """The function argument of every apply_async/apply_sync/submit call in ``path``."""
    out = []
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        args = node.args
        if name in ("apply_async", "apply_sync") and args:
            fn = args[0]
        elif name in ("submit", "call") and len(args) >= 3 and _is(node.func.value, "fanout"):
            fn = args[2]
        elif name == "submit_each" and len(args) >= 2 and _is(node.func.value, "fanout"):
            fn = args[1]
        else:
            continue
        out.append((node.lineno, ast.unparse(fn)))
    return out


def _is(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def test_only_worker_api_functions_are_shipped_to_engines():
    shipped = {
        _name(p): calls
        for p in MODULES
        if p.relative_to(PACKAGE).parts[0] in ("notebook", "server")
        and p.name != "fanout.py"  # the helper itself passes its caller's function on
        and (calls := _shipped(p))
    }
    assert shipped, "found no calls to engines at all: is the check still looking?"
    foreign = {
        mod: [f"line {line}: {fn}" for line, fn in calls if not fn.startswith("api.")]
        for mod, calls in shipped.items()
    }
    assert {k: v for k, v in foreign.items() if v} == {}

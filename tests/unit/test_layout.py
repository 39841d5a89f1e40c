"""The layout holds: small modules, private names kept private, the kernel free of torch, and
only ``nbdist.worker.api`` functions shipped to engines. Read from the source, not by convention."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbdist"
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)
MAX_LINES = 400
#: Modules that are one concept longer than the cap, each saying why in its docstring: a split
#: would leave two halves of one idea (the catalogue of every setting, in one place).
LONGER = {"nbdist.config": 480}

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
    most = LONGER.get(_name(path), MAX_LINES)
    assert lines <= most, f"{_name(path)} has {lines} lines (at most {most})"
    if _name(path) in LONGER:
        assert "one place" in (ast.get_docstring(_tree(path)) or ""), "say why it is longer"


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
        elif (
            name in ("submit_each", "on_ranks")
            and len(args) >= 2
            and _is(node.func.value, "fanout")
        ):
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


# -- the house: no circles, engine code apart, rooms that import downward only --------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module_name(p): p for p in MODULES}


def _imports(path: Path) -> set[str]:
    """Every nbdist module ``path`` imports, wherever the import stands (in a function, under
    ``TYPE_CHECKING``): ``from a import b`` counts as ``a.b`` when that is a module, else ``a``."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for a in node.names:
                found.add(f"{module}.{a.name}" if f"{module}.{a.name}" in NAMES else module)
    return {m for m in found if m in NAMES and m != here}


GRAPH = {name: _imports(path) for name, path in NAMES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_reader_sees_what_is_there():
    assert "nbdist.notebook.run.supervisor" in GRAPH["nbdist.notebook.run.controller"]
    assert "nbdist.notebook.cluster.ranks" in GRAPH["nbdist.notebook.session"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other_even_in_a_circle():
    assert _circles(GRAPH) == []


#: A relative import or re-export in TypeScript: ``import … from './x'``, ``export … from '../y'``,
#: ``import './z'``.
_TS_IMPORT = re.compile(
    r"""^\s*(?:import|export)\b(?:[^'";]*?\bfrom)?\s*['"](\.{1,2}/[^'"]+)['"]""", re.M
)
_TS_SOURCE = PACKAGE.parent / "extension" / "src"


def _ts_graph(src: Path) -> dict[str, set[str]]:
    """Every TypeScript module under ``src`` (by its path there, without the suffix) and the
    modules it imports, relative imports resolved across folders (``./x``, ``../x``, a folder's
    ``index``)."""
    files = {
        p.relative_to(src).with_suffix("").as_posix(): p
        for p in src.rglob("*")
        if p.suffix in (".ts", ".tsx") and not p.name.endswith(".d.ts")
    }

    def resolve(importer: Path, spec: str) -> str | None:
        target = (importer.parent / spec).resolve()
        for name in (target, target / "index"):
            if name.is_relative_to(src) and name.relative_to(src).as_posix() in files:
                return name.relative_to(src).as_posix()
        return None

    return {
        name: {m for spec in _TS_IMPORT.findall(p.read_text()) if (m := resolve(p, spec))}
        for name, p in files.items()
    }


def test_no_circle_in_the_sidebar():
    graph = _ts_graph(_TS_SOURCE)
    assert graph["panel"], "found no imports in the sidebar: is the check still looking?"
    assert graph["boards/dashboard/view"], "found no imports in the boards"
    assert _circles(graph) == []


#: The floor: what both sides stand on. It imports neither side.
FLOOR = ("protocol", "wire", "errors", "config", "remote_config", "validate", "paths", "datadir",
         "telemetry", "frames", "records")  # fmt: skip


def test_engine_code_never_imports_kernel_code_and_the_floor_neither_side():
    engine = [m for m in GRAPH if m.startswith(("nbdist.worker", "nbdist.launch"))]
    floor = [m for m in GRAPH if m.split(".")[1:2] and m.split(".")[1] in FLOOR]
    assert engine and floor
    kernel = ("nbdist.notebook", "nbdist.server")
    crossing = {m: sorted(i for i in GRAPH[m] if i.startswith(kernel)) for m in engine}
    assert {m: v for m, v in crossing.items() if v} == {}
    sides = (*kernel, "nbdist.worker")
    crossing = {m: sorted(i for i in GRAPH[m] if i.startswith(sides)) for m in floor}
    assert {m: v for m, v in crossing.items() if v} == {}


#: The kernel, the Jupyter server and the cluster host: which of the others each may import
#: (all of them the floor). The host holds a cluster as a kernel does, so it stands on the
#: kernel; the server reads clusters from the floor's ``records`` and starts a host by its
#: module's name. Nothing imports the host.
PROCESSES = {"notebook": (), "server": (), "host": ("notebook",)}


def _top(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_kernel_server_and_host_import_only_what_they_stand_on():
    assert "nbdist.notebook.session" in GRAPH["nbdist.host.__main__"]
    assert "nbdist.records.registry" in GRAPH["nbdist.server.clusters"]
    crossing = {}
    for m, imported in GRAPH.items():
        if (top := _top(m)) in PROCESSES:
            others = set(PROCESSES) - {top, *PROCESSES[top]}
            if bad := sorted(i for i in imported if _top(i) in others):
                crossing[m] = bad
    assert crossing == {}
    into_host = [f"{m} -> {i}" for m in GRAPH if _top(m) != "host" for i in GRAPH[m]]
    assert [c for c in into_host if _top(c.rpartition(" ")[2]) == "host"] == []


def test_the_floor_and_the_host_import_no_torch_at_import_time():
    """The host writes its record before its cluster brings torch in; the floor never does."""
    light = [p for p in MODULES if p.relative_to(PACKAGE).parts[0].removesuffix(".py") in
             (*FLOOR, "host")]  # fmt: skip
    assert any(p.parent.name == "records" for p in light)
    heavy = {_name(p): sorted(_top_level_imports(p) & {"torch"}) for p in light}
    assert {k: v for k, v in heavy.items() if v} == {}


#: Each side's rooms and their floors: a room imports only rooms on a lower floor (or itself).
#: The kernel: the magics over what a person calls (data, sweeps, housekeeping), over the
#: session, over a cell's run, over the cluster and the boards. The engines: the door (``api``,
#: ``runner``) over the job folders, over the mesh they lay models on and the collectives DDP
#: goes through, over the engine's own ground (its state, rank context...).
ROOMS = {
    "notebook": {"magics": 6, "data": 5, "sweeps": 5, "housekeeping": 5, "session": 4, "run": 3,
                 "debug": 2, "cluster": 1, "board": 1, "trackers": 0, "arguments": 0},
    "worker": {"api": 5, "runner": 4, "checkpoint": 3, "continuity": 3, "train": 2, "pipeline": 2,
               "integrations": 2, "debug": 2, "mesh": 1, "collectives": 1, "ground": 0},
}  # fmt: skip


def _room(module: str) -> tuple[str, str] | None:
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in ROOMS:
        return None
    side, room = parts[1], parts[2]
    return side, room if room in ROOMS[side] else "ground"


def test_rooms_import_downward_only():
    every = {_room(m) for m in GRAPH} - {None}
    assert every == {(side, r) for side, rooms in ROOMS.items() for r in rooms}, "a new room?"
    upward = []
    for m, imported in GRAPH.items():
        here = _room(m)
        for i in imported:
            there = _room(i)
            if here and there and here != there and here[0] == there[0]:  # the same side
                if ROOMS[here[0]][here[1]] <= ROOMS[there[0]][there[1]]:
                    upward.append(f"{m} -> {i}")
    assert upward == []


def test_folders_hold_about_a_dozen_modules_and_say_what_they_do():
    folders = {p.parent for p in MODULES}
    crowded = {}
    for folder in folders:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > 12:
            crowded[str(folder.relative_to(PACKAGE.parent))] = len(modules)
        init = folder / "__init__.py"
        assert init.exists(), f"{folder} is no package"
        assert len(ast.get_docstring(_tree(init)) or "") > 80, f"{init}: say what it holds"
    assert crowded == {}

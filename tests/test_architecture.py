"""The shape of the house, read from the code's imports: rooms on floors, imports only downwards, no circles.

Every ``import`` of a ``strom`` module counts, wherever it stands (module level, inside a function, under
``if TYPE_CHECKING:``): a late import that dodges a circle is still a circle. docs/architecture.md draws
the same floors.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "strom"

BASE = "<base>"
"""The top-level modules (errors, ids, config, clock, fsync) that every floor shares."""

FLOORS: list[set[str]] = [
    {BASE},
    {"records", "remote"},
    {"rpc", "log", "metadata"},
    {"kv", "lake", "security", "membership"},
    {"zk"},
    {"coordinator", "tablet", "client"},
    {"server", "spark", "tiering", "gateway"},
    {"cli"},
]
"""Lowest first. A room imports its own modules and rooms on lower floors; rooms on one floor are
independent of each other."""

FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.name.endswith("_pb2.py")
    }


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The strom module an imported name lives in (``strom.a.b.Name`` → ``strom.a.b``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The strom modules one import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor[: len(anchor) - node.level + (1 if MODULES[module].name == "__init__.py" else 0)]
            base = ".".join([*anchor, node.module] if node.module else anchor)
        names = [f"{base}.{alias.name}" for alias in node.names]
    for name in names:
        if name == "strom" or name.startswith("strom."):
            target = _resolve(name)
            if target is not None and target != module:
                yield target


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported strom module, line) of every import statement in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from ((target, node.lineno) for target in _targets(module, node))


def _imports_at_load(module: str) -> Iterator[str]:
    """What importing ``module`` imports: statements outside functions and ``if TYPE_CHECKING:``."""

    def walk(nodes: list[ast.stmt]) -> Iterator[str]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield from _targets(module, node)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, [])
                    yield from walk([c for child in children for c in (child.body if isinstance(child, ast.ExceptHandler) else [child])])

    yield from walk(ast.parse(MODULES[module].read_text()).body)


GRAPH: dict[str, dict[str, int]] = {
    module: {target: line for target, line in _imports(module, path)} for module, path in MODULES.items()
}


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 2 and MODULES[module].name != "__init__.py":
        return BASE
    return parts[1] if len(parts) > 1 else BASE


def test_every_room_has_a_floor() -> None:
    rooms = {room_of(module) for module in MODULES}
    assert rooms - FLOOR_OF.keys() == set(), "give the new room a floor in FLOORS (and docs/architecture.md)"


def test_imports_only_go_down_a_floor() -> None:
    upward = []
    for module, targets in GRAPH.items():
        here = room_of(module)
        for target, line in targets.items():
            there = room_of(target)
            if there != here and FLOOR_OF[there] >= FLOOR_OF[here]:
                upward.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} {module} -> {target}")
    assert upward == [], "imports that do not go down a floor:\n" + "\n".join(upward)


def _circles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    return found


def test_no_import_circles() -> None:
    assert _circles() == []


def test_the_circle_check_sees_a_late_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a circle closed by an import inside a function is found."""
    monkeypatch.setitem(GRAPH, "strom.errors", {**GRAPH["strom.errors"], "strom.rpc.server": 1})
    assert any("strom.errors" in circle for circle in _circles())


def _loaded_at_import(module: str) -> set[str]:
    """Every strom module that importing ``module`` loads (imports inside functions run later, if ever)."""
    seen: set[str] = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if current not in seen:
            seen.add(current)
            pending += list(_imports_at_load(current))
            parent = current.rpartition(".")[0]
            if parent in MODULES:  # a module's package loads first
                pending.append(parent)
    return seen


def test_the_load_check_follows_module_level_imports() -> None:
    """The checker itself: the local cluster's module loads ZooKeeper's throw-away server at import."""
    assert "strom.zk.zookeeper_server" in _loaded_at_import("strom.server.local_cluster")


@pytest.mark.parametrize("entry", ["strom.server.node", "strom.server.cluster_node", "strom.client",
                                   "strom.tiering.driver", "strom.spark.source"])
def test_the_embedded_server_and_clients_load_nothing_of_zookeeper(entry: str) -> None:
    """kazoo is an optional extra: ``strom server`` (embedded store) and the clients must start without it."""
    assert sorted(m for m in _loaded_at_import(entry) if m.startswith("strom.zk")) == []


def test_package_inits_only_hand_names_on() -> None:
    busy = []
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text()).body:
            is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            is_all = isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
            if not (is_docstring or is_all or isinstance(node, (ast.Import, ast.ImportFrom))):
                busy.append(f"{module}:{node.lineno}")
    assert busy == []


TABLE_OPTION_NAMES = "strom.table_properties"
"""The one module that spells a table option (``table.*``); every other reads the names from it."""


def _string_literals(path: Path) -> Iterator[tuple[str, int]]:
    """Every string constant of a module but its docstrings (f-string parts included)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value, node.lineno


def test_table_options_are_spelled_in_one_module() -> None:
    """A ``"table.…"`` literal outside :data:`TABLE_OPTION_NAMES` is a table option read around its typed
    accessors (``TableInfo.options``) or a key name a second time."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {text!r}"
        for module, path in MODULES.items() if module != TABLE_OPTION_NAMES
        for text, line in _string_literals(path) if text.startswith("table.")
    ]
    assert found == [], "table option names outside strom/table_properties.py:\n" + "\n".join(found)


def test_no_asyncio_wait_for() -> None:
    """Before Python 3.12 ``asyncio.wait_for`` returns the inner result instead of raising when its caller is
    cancelled just as the inner await completes: a loop around it outlives the ``stop()`` that cancelled it
    (a coordinator hung that way). ``async with asyncio.timeout(...)`` has no such window."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "wait_for"
        and isinstance(node.value, ast.Name) and node.value.id == "asyncio"
    ]
    assert found == [], "asyncio.wait_for in:\n" + "\n".join(found)

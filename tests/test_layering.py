"""The house as drawn in docs/ARCHITECTURE.md: which package may import which, no import cycle
between modules, and stages and flows that reach the warehouse only through the store stage.

Every import counts, at the top of a module or inside a function (a lazy import is still a
dependency), read from the source with ``ast``: nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.quick

#: Each package of keynes and the packages it may import (drawn in docs/ARCHITECTURE.md).
LAYERS = {
    "core": set(),
    "prompts": {"core"},
    "engines": {"core", "prompts"},
    "populations": {"core", "prompts", "engines"},
    "warehouse": {"core"},
    "reports": {"core", "warehouse"},
    "design": {"core", "prompts", "engines", "populations"},
    "tasks": {"core", "prompts", "engines", "populations", "design", "warehouse", "reports"},
    "flows": {"core", "prompts", "engines", "populations", "design", "warehouse", "reports", "tasks"},
    "cli": {"core", "prompts", "engines", "populations", "design", "warehouse", "reports", "tasks", "flows"},
    "keynes": {"warehouse"},
}


def modules() -> dict[str, Path]:
    """Every module of the packages in LAYERS, by dotted name (a package by its own name)."""
    found = {}
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = modules()


def imported(path: Path) -> set[str]:
    """The keynes modules a file imports (``from engines import x`` is ``engines.x`` when that
    is a module, else ``engines``)."""
    def owner(name: str) -> str | None:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {owner(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {owner(f"{node.module}.{a.name}") or owner(node.module) for a in node.names}
    return {m for m in out if m}


GRAPH = {name: imported(path) - {name} for name, path in MODULES.items()}


def test_each_package_imports_only_the_layers_below_it():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items() for target in targets
        if (top := target.split(".")[0]) != module.split(".")[0] and top not in LAYERS[module.split(".")[0]]
    )
    assert not wrong, "imports against docs/ARCHITECTURE.md's layers:\n" + "\n".join(wrong)


def test_the_core_imports_nothing_of_keynes():
    assert {t for m, ts in GRAPH.items() if m.startswith("core") for t in ts if not t.startswith("core")} == set()


def test_no_module_imports_itself_through_others():
    """No cycle in the module graph (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
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
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


#: The store rule, for every module of ``tasks/`` and ``flows/``: only ``tasks.store`` imports a
#: ``warehouse`` module or touches the warehouse handle's members. The others may hold the handle,
#: typed ``tasks.store.Warehouse``, and pass it on: to a function of ``tasks.store``, or to a
#: stage that does the same.
STORE = "tasks.store"
#: The one exception: the retry rule names the warehouse's two errors, and ``tasks.store``
#: declares its tasks with that rule, so importing them from ``tasks.store`` would be a cycle.
WAREHOUSE_NAMES_ALLOWED = {"tasks.retries": {"warehouse.files": {"WarehouseError", "DiskFullError"}}}
#: What a handle is called where it is not annotated (``warehouse = store.open_warehouse(...)``).
HANDLE_NAMES = {"warehouse", "wh"}


def stage_modules() -> list[str]:
    """Every module of ``tasks/`` and ``flows/`` but the store stage."""
    return sorted(m for m in MODULES if m.split(".")[0] in {"tasks", "flows"} and m != STORE)


def warehouse_imports(name: str, source: str) -> list[str]:
    """``module:line imports X`` for each import of a warehouse module (lazy ones included), less the allowed names."""
    allowed = WAREHOUSE_NAMES_ALLOWED.get(name, {})
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name.split(".")[0] == "warehouse"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "warehouse":
            found += [f"{name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                      if a.name not in allowed.get(node.module, set())]
    return found


def handles(tree: ast.AST) -> set[str]:
    """The names that hold a warehouse handle in a module: ``HANDLE_NAMES``, and every argument or
    variable annotated with a type named ``Warehouse`` (``Warehouse``, ``store.Warehouse``)."""
    def is_warehouse(annotation: ast.AST | None) -> bool:
        return annotation is not None and any(
            (isinstance(n, ast.Name) and n.id == "Warehouse") or (isinstance(n, ast.Attribute) and n.attr == "Warehouse")
            or (isinstance(n, ast.Constant) and isinstance(n.value, str) and "Warehouse" in n.value)
            for n in ast.walk(annotation))

    names = set(HANDLE_NAMES)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and is_warehouse(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and is_warehouse(node.annotation):
            names.add(node.target.id)
    return names


def warehouse_uses(name: str, source: str) -> list[str]:
    """``module:line uses X.member``: each member of a warehouse handle read or called, and each
    ``Warehouse(...)`` made, outside the store stage."""
    tree = ast.parse(source)
    held = handles(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in held:
            found.append(f"{name}:{node.lineno} uses {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id in {"Warehouse", "WarehouseFile"})
            or (isinstance(node.func, ast.Attribute) and node.func.attr in {"Warehouse", "WarehouseFile"})
        ):
            found.append(f"{name}:{node.lineno} makes a Warehouse (tasks.store.open_warehouse does)")
    return found


def test_only_the_store_stage_imports_the_warehouse():
    """No module of tasks/ or flows/ but tasks/store.py imports a warehouse module, lazily or not."""
    found = [line for module in stage_modules() for line in warehouse_imports(module, MODULES[module].read_text())]
    assert not found, "warehouse imported outside tasks/store.py:\n" + "\n".join(found)


def test_only_the_store_stage_touches_the_warehouse_handle():
    """The handle is passed around, never opened up: no module of tasks/ or flows/ but tasks/store.py
    reads or calls a member of it, or makes one."""
    found = [line for module in stage_modules() for line in warehouse_uses(module, MODULES[module].read_text())]
    assert not found, "the warehouse used outside tasks/store.py:\n" + "\n".join(found)


def test_the_store_rule_sees_each_kind_of_violation():
    """The two checks above on a stage that breaks the rule every way they know."""
    source = (
        "from warehouse.store import Warehouse\n"
        "from warehouse.files import WarehouseError\n"
        "def stage(db, w: 'Warehouse', wh: store.Warehouse):\n"
        "    import warehouse.analyses\n"
        "    w.write_personas('x', None)\n"
        "    print(wh.path)\n"
        "    warehouse = store.open_warehouse(db)\n"
        "    warehouse.round_summary('x')\n"
        "    return Warehouse(db)\n"
    )
    assert warehouse_imports("tasks.stage", source) == [
        "tasks.stage:1 imports warehouse.store.Warehouse", "tasks.stage:2 imports warehouse.files.WarehouseError",
        "tasks.stage:4 imports warehouse.analyses",
    ]
    assert warehouse_imports("tasks.retries", source) == [
        "tasks.retries:1 imports warehouse.store.Warehouse", "tasks.retries:4 imports warehouse.analyses",
    ]
    assert sorted(warehouse_uses("tasks.stage", source)) == [
        "tasks.stage:5 uses w.write_personas", "tasks.stage:6 uses wh.path", "tasks.stage:8 uses warehouse.round_summary",
        "tasks.stage:9 makes a Warehouse (tasks.store.open_warehouse does)",
    ]


def test_the_ray_actor_imports_neither_prefect_nor_the_warehouse():
    """Ray imports tasks/actor.py in every worker process: it starts in about a second."""
    def reaches(module: str, seen: set[str]) -> set[str]:
        for target in GRAPH[module] - seen:
            seen.add(target)
            reaches(target, seen)
        return seen

    closure = reaches("tasks.actor", set())
    assert not {m for m in closure if m.startswith(("warehouse", "flows", "cli", "reports"))}, closure
    third_party = {alias.name.split(".")[0] for m in closure | {"tasks.actor"}
                   for node in ast.walk(ast.parse(MODULES[m].read_text())) if isinstance(node, ast.Import)
                   for alias in node.names}
    third_party |= {node.module.split(".")[0] for m in closure | {"tasks.actor"}
                    for node in ast.walk(ast.parse(MODULES[m].read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert "prefect" not in third_party


def test_sql_lives_in_the_warehouse():
    """Every query keynes runs is written in ``warehouse/`` (a user's SQL passes through ``keynes sql``)."""
    import re

    query = re.compile(r"^\s*(SELECT\s[\s\S]*\bFROM\b|WITH\s+\w+\s+AS\s*\(|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s"
                       r"|CREATE\s+(OR\s+REPLACE\s+)?(TABLE|VIEW)\s)", re.IGNORECASE)
    found = sorted(
        f"{name}:{node.lineno}"
        for name, path in MODULES.items() if not name.startswith("warehouse")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and query.match(node.value)
    )
    assert not found, f"SQL outside warehouse/: {found}"


def _third_party(modules: set[str]) -> set[str]:
    """The top-level names of what these modules import from outside keynes."""
    names = set()
    for module in modules:
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names - set(LAYERS)


def _closure(module: str, seen: set[str] | None = None) -> set[str]:
    """``module`` and every keynes module it imports, directly or not."""
    seen = {module} if seen is None else seen
    for target in GRAPH[module] - seen:
        seen.add(target)
        _closure(target, seen)
    return seen


def test_the_design_imports_neither_prefect_nor_ray():
    """What an experiment is can be read, checked and planned without the orchestration."""
    design = {m for m in MODULES if m.split(".")[0] == "design"}
    reached = set().union(*(_closure(m) for m in design))
    assert not {m for m in reached if m.split(".")[0] in {"tasks", "flows", "cli", "warehouse"}}, reached
    assert not _third_party(reached) & {"prefect", "ray", "duckdb"}


@pytest.mark.parametrize("package", ["engines.llamacpp", "engines.vllm"])
def test_a_package_keeps_its_modules_to_itself(package: str):
    """Outside a package, only its ``__init__`` is imported: its modules are its own business."""
    inside = [m for m in GRAPH if m == package or m.startswith(package + ".")]
    outside = sorted(f"{m} imports {t}" for m, ts in GRAPH.items() if m not in inside for t in ts if t.startswith(package + "."))
    assert not outside, outside

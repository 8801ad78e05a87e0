"""The package's rooms and arrows: no import cycles (lazy imports count), each room imports only
the rooms below it, and no module outside `models/` names a model family's modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import raytrain_vla

PACKAGE = Path(raytrain_vla.__file__).parent
# Room -> the rooms it may import. Entry points (the CLIs) may import anything.
BOTTOM = {"errors", "common"}
ALLOWED = {
    "errors": set(),  # the NotRetriable base every room's errors derive from
    "progress": set(),  # progress bars of long commands
    "common": {"errors"},  # what data and models share: spec, normaliser, names, file access
    "config": BOTTOM,
    "sim": BOTTOM | {"config", "progress"},
    "data": BOTTOM | {"config", "sim", "progress"},
    "models": BOTTOM | {"config"},
    "policy": BOTTOM | {"config", "data", "models"},
    "train": BOTTOM | {"config", "data", "models", "policy", "sim", "progress"},
    "tuning": BOTTOM | {"config", "data", "models", "train"},
}
# `data.__main__` only starts `data_cli` (checked below), so `python -m raytrain_vla.data` works.
ENTRY_POINTS = {
    "cli", "run", "tune", "export", "eval", "report", "plan_memory", "data_cli", "data.__main__"
}  # fmt: skip


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        out[name.removesuffix(".__init__").removesuffix("__init__") or "__init__"] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every raytrain_vla module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("raytrain_vla."):
                rel = name.removeprefix("raytrain_vla.")
                if rel in MODULES:
                    found.add(rel)
    return found


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _room(module: str) -> str:
    return module.split(".")[0]


def test_no_import_cycles_even_through_lazy_imports():
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(GRAPH[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_each_room_imports_only_the_rooms_below_it():
    wrong = []
    for module, deps in GRAPH.items():
        if module in ENTRY_POINTS or _room(module) not in ALLOWED:
            continue
        for dep in deps:
            room = _room(dep)
            if room != _room(module) and room not in ALLOWED[_room(module)]:
                wrong.append(f"{module} -> {dep}")
    assert not wrong, wrong


def test_models_never_import_data_and_data_never_imports_train():
    """The two arrows that made the model side and the data side one knot."""
    for room, banned in (("models", {"data", "train"}), ("data", {"models", "train"})):
        hits = [
            f"{m} -> {d}"
            for m in GRAPH
            if _room(m) == room and m != "data.__main__"
            for d in GRAPH[m]
            if _room(d) in banned
        ]
        assert not hits, hits
    assert GRAPH["data.__main__"] == {"data_cli"}


def test_known_rooms_and_entry_points_cover_every_module():
    rooms = set(ALLOWED) | {"__init__"}
    assert all(_room(m) in rooms or m in ENTRY_POINTS for m in MODULES), sorted(MODULES)


# Families the roadmap adds (issue 28): generic code must not name them before they exist either.
FAMILIES_TO_COME = ("pi0", "pi05")


def _lines_outside_models(pattern: re.Pattern) -> list[str]:
    """`file:line: text` of every package line (code and packaged YAML) outside `models/` that
    `pattern` matches."""
    return [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.yaml")]
        if "models" not in path.relative_to(PACKAGE).parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_module_outside_models_names_a_family_s_modules():
    pattern = re.compile(r"action_expert\.|\bmodel\.vision\b|transformer_blocks|flow_vla\.model\b")
    assert not _lines_outside_models(pattern)


def test_no_module_outside_models_names_a_family():
    """Generic code asks the family contract; only `models/` (and its registry lines) names a
    family, so a new family is one package plus one registration line."""
    from raytrain_vla.models.registry import family_names

    names = "|".join(map(re.escape, [*family_names(), *FAMILIES_TO_COME]))
    pattern = re.compile(rf"(?i)(?<![A-Za-z0-9_])({names})(?![A-Za-z0-9_])")
    hits = _lines_outside_models(pattern)
    assert not hits, hits

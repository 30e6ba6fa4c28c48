"""shared/'s rooms, held to what each room's `__init__.py` says: its docstring's "May import:"
line is the single statement of the rule. Every import of every module (at any depth, a
function's own too) may name its own room and the rooms its line names, nothing else; the rooms'
rules, and the imports themselves, run one way (no circle between rooms); only `dispatch.py`
stands beside the rooms; and a room's `__init__.py` imports nothing, so loading one module of a
room loads no other (the cold starts: tests/unit/test_cold_imports.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SHARED = Path(__file__).parent.parent.parent / "shared"
TOP = {"__init__.py", "dispatch.py"}


def rooms() -> dict[str, str]:
    """Each room (a package directly in shared/) and its docstring."""
    found: dict[str, str] = {}
    for init in sorted(SHARED.glob("*/__init__.py")):
        found[init.parent.name] = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    return found


def rule(doc: str) -> set[str]:
    """The rooms a docstring's "May import:" line names (`shared.x`), or an error when it has none."""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    assert len(lines) == 1, 'a room\'s docstring says once, on a line of its own, "May import: ..."'
    return set(re.findall(r"\bshared\.(\w+)", lines[0]))


def module_name(path: Path) -> str:
    parts = path.relative_to(SHARED.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module of shared that the file names in an import, at any depth, resolved to its
    dotted name (`from shared import x` names shared.x; a relative import is resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] == "shared" and "." in n}


def room_of(name: str, known: set[str]) -> str | None:
    """The room a dotted name lies in; None for shared/ itself (and names of no room)."""
    part = name.split(".")[1]
    return part if part in known else None


def modules() -> list[Path]:
    return sorted(SHARED.rglob("*.py"))


def test_every_module_but_the_service_layer_lives_in_a_room() -> None:
    loose = sorted(p.name for p in SHARED.glob("*.py") if p.name not in TOP)
    assert not loose, f"put each in the room of its concern (shared/<room>/): {loose}"


@pytest.mark.parametrize("room", sorted(rooms()))
def test_a_room_states_its_rule_and_imports_nothing_on_load(room: str) -> None:
    doc = rooms()[room]
    assert rule(doc) <= set(rooms()), f"{room}: its rule names no room: {rule(doc) - set(rooms())}"
    assert room not in rule(doc)
    init = ast.parse((SHARED / room / "__init__.py").read_text(encoding="utf-8"))
    assert [type(n).__name__ for n in init.body] == ["Expr"], f"{room}/__init__.py: its docstring alone"


def test_every_import_keeps_its_rooms_rule() -> None:
    known = set(rooms())
    rules = {room: rule(doc) for room, doc in rooms().items()}
    broken = []
    for path in modules():
        src = room_of(module_name(path), known) if path.parent != SHARED else None
        if src is None:
            continue  # shared/__init__.py and dispatch.py: above every room
        for name in sorted(imported(path)):
            dst = room_of(name, known)
            if dst is None:
                broken.append(f"{path.relative_to(SHARED.parent)} imports {name} (above every room)")
            elif dst != src and dst not in rules[src]:
                broken.append(f"{path.relative_to(SHARED.parent)} imports {name}: {src} may not import {dst}")
    assert not broken, "\n".join(broken)


def circle(edges: dict[str, set[str]]) -> list[str]:
    """A circle of the graph (its rooms in order), or [] when it has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, set())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_rules_and_the_imports_run_one_way() -> None:
    known = set(rooms())
    assert not circle({room: rule(doc) for room, doc in rooms().items()}), "the rules"
    edges: dict[str, set[str]] = {room: set() for room in known}
    for path in modules():
        src = room_of(module_name(path), known) if path.parent != SHARED else None
        for name in imported(path):
            dst = room_of(name, known)
            if src and dst and dst != src:
                edges[src].add(dst)
    assert not circle(edges), " -> ".join(circle(edges))


def test_the_check_sees_a_broken_rule_and_a_circle() -> None:
    # (the checks above would pass vacuously on a reader that found no import)
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert not circle({"a": {"b"}, "b": set()})
    assert rule("x\n\nMay import: shared.plumbing, shared.wire.") == {"plumbing", "wire"}
    edges = {n for p in modules() for n in imported(p)}
    assert {"shared.plumbing.db", "shared.delivery.queue"} <= edges

"""Handlers call the service only: every module of `functions/` imports, of the service (`shared`),
`shared.dispatch` and the wire types (`shared.wire`), nothing else, wherever the import is (at the
top, inside a function, for the type checker). `functions/runtime.py` too: the pool, the settings
and the embedded database it wires are re-exported by `shared.dispatch`. Read from the source,
without importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shared.dispatch

ROOT = Path(__file__).parent.parent.parent
HANDLERS = sorted((ROOT / "functions").glob("*.py"))
ALLOWED = ("shared.dispatch", "shared.wire")


def service_imports(path: Path) -> list[str]:
    """Every module of `shared` a file imports (`from shared import x` counts as `shared.x`), with
    `importlib.import_module("shared...")` calls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "shared":
                found += [f"shared.{a.name}" for a in node.names]
            else:
                found.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(node.args[0].value)
    return [m for m in found if m == "shared" or m.startswith("shared.")]


def allowed(module: str) -> bool:
    return any(module == a or module.startswith(f"{a}.") for a in ALLOWED)


def test_the_reader_sees_every_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "handler.py"
    source.write_text(
        "import shared.delivery.queue\nfrom shared.fleet import people; from shared import dispatch\nfrom shared.wire.messages import X\n"
        "def f():\n    from shared.operators.status import snapshot\n    importlib.import_module('shared.operators.sessions')\n",
        encoding="utf-8",
    )
    assert service_imports(source) == [
        "shared.delivery.queue",
        "shared.fleet",
        "shared.dispatch",
        "shared.wire.messages",
        "shared.operators.status",
        "shared.operators.sessions",
    ]


@pytest.mark.parametrize("path", HANDLERS, ids=lambda p: p.name)
def test_a_handler_imports_of_the_service_only_the_service_layer_and_the_wire(path: Path) -> None:
    wrong = [m for m in service_imports(path) if not allowed(m)]
    assert not wrong, f"functions/{path.name} imports {wrong}: import it from shared.dispatch"


def test_what_the_service_layer_re_exports_is_there() -> None:
    # (each name loaded as a handler loads it: a name listed and not found fails here, not in a route)
    for name in shared.dispatch.__all__:
        assert getattr(shared.dispatch, name) is not None, name

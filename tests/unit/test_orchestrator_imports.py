"""The orchestrator is a client of the contract and nothing more: every module of it loads, of the
service, only the wire (`shared.wire`), so it runs on a machine that has none of the service's
settings, database drivers or Linear clients, and no change on the service's side reaches it but
through the contract."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.fresh_python import run_json

WIRE = {"shared", "shared.wire", "shared.wire.messages", "shared.wire.agent_tokens"}


def test_every_orchestrator_module_loads_nothing_of_the_service_but_the_wire() -> None:
    code = (
        "import sys, json, importlib, pkgutil, orchestrator; "
        "names = [m.name for m in pkgutil.walk_packages(orchestrator.__path__, 'orchestrator.') "
        "if not m.name.endswith('__main__')]; "
        "[importlib.import_module(n) for n in names]; "
        "print(json.dumps([names, sorted(sys.modules)]))"
    )
    names, loaded = run_json(code)
    assert {"orchestrator.cli", "orchestrator.loop", "orchestrator.runners.claude"} <= set(names)
    service = {m for m in loaded if m.split(".")[0] in ("shared", "functions", "devpilot", "infra")}
    assert service <= WIRE, sorted(service - WIRE)


def test_no_orchestrator_source_imports_the_service_but_the_wire() -> None:
    # (the check above sees what loads on import; this one also sees an import inside a function,
    # which loads only when it runs)
    root = Path(__file__).parent.parent.parent
    wrong = []
    for path in sorted((root / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [
                    f"{node.module}.{a.name}" if node.module == "shared" else node.module for a in node.names
                ]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ("functions", "devpilot", "infra") or (
                    top == "shared" and name != "shared.wire" and not name.startswith("shared.wire.")
                ):
                    wrong.append(f"{path.relative_to(root)}: {name}")
    assert not wrong, wrong

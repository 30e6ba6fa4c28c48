"""The one route table, read by every entry point: checked without a database."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import yaml

from functions.app import _url_map
from functions.routes import ROUTES

ROOT = Path(__file__).parent.parent.parent


def _table() -> set[tuple[str, str]]:
    out = set()
    for r in ROUTES:
        for e in r.endpoints:
            path = (
                (r.path + e.rule)
                .replace("<uuid:orchestrator_id>", "{orchestratorId}")
                .replace("<org_id>", "{orgId}")
                .replace("<uuid:session_id>", "{sessionId}")
            )
            out |= {(path, m.lower()) for m in e.methods if m != "HEAD"}
    return out


def test_openapi_describes_exactly_the_route_table() -> None:
    spec = yaml.safe_load((ROOT / "infra" / "openapi.yaml").read_text())
    described = {(p, m) for p, ops in spec["paths"].items() for m in ops}
    assert described == _table()


def test_api_reference_names_every_route() -> None:
    doc = (ROOT / "docs" / "API.md").read_text()
    for path, method in _table():
        assert f"{method.upper()} {path}" in doc, (method, path)


def test_every_view_named_in_the_table_exists() -> None:
    for r in ROUTES:
        module = importlib.import_module(r.module)
        for e in r.endpoints:
            assert callable(getattr(module, e.view)), (r.name, e.view)


def test_each_target_answers_at_its_root_and_under_its_path() -> None:
    adapter, endpoints = _url_map([r for r in ROUTES if r.name == "orchestrators"], at_root=True)
    oid = "6f1c2b1e-8a4e-4a53-9d55-2f1f3e4c5d6a"
    for path in (f"/{oid}/revoke", f"/orchestrators/{oid}/revoke"):
        key, args = adapter.match(path, method="POST")
        assert endpoints[key][1].view == "revoke" and str(args["orchestrator_id"]) == oid
    for path in ("/", "/orchestrators"):
        assert endpoints[adapter.match(path, method="GET")[0]][1].view == "list_orchestrators"
        assert endpoints[adapter.match(path, method="POST")[0]][1].view == "register"


def test_deploy_reads_the_deployed_rows() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "functions.routes", "--deployed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    lines = [line.split() for line in out if line]
    assert [name for name, _ in lines] == [r.name for r in ROUTES if r.deployed]
    assert dict(lines)["sweep"] == "scheduler"
    assert {exposure for name, exposure in lines if name != "sweep"} == {"public"}


def test_functions_framework_finds_every_target_in_main() -> None:
    """functions-framework looks a target up with hasattr/getattr on functions/main.py; each target
    loads only its own route's module."""
    code = (
        "import sys, types; sys.argv=['x'];"
        "import importlib.util as u; s=u.spec_from_file_location('main','functions/main.py');"
        "m=u.module_from_spec(s); s.loader.exec_module(m);"
        "names=[r.name for r in __import__('functions.routes',fromlist=['ROUTES']).ROUTES]+['api'];"
        "assert all(isinstance(getattr(m,n), types.FunctionType) for n in names);"
        "print('functions.dashboard' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

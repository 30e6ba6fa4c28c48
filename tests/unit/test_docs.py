"""The README is a user's guide that stays short and true: checked against the code, without a
database. (Its "Try it by hand" blocks run in tests/test_readme.py.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from functions.routes import ROUTES
from shared.plumbing.settings import Settings
from tests.helpers.linear import schema_errors

ROOT = Path(__file__).parent.parent.parent
README = ROOT / "README.md"
# A user's guide: benchmark history goes to bench/README.md, the design's reasons to docs/design.md.
MAX_LINES = (
    435  # (420 until the agents' runner: `--agent claude` and its mapping lead "Running the orchestrator")
)
# The documentation that the README links to, and that links back: every relative link must hold.
DOCS = [
    README,
    ROOT / "SECURITY.md",
    ROOT / "bench" / "README.md",
    ROOT / "infra" / "DEPLOY.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
PRODUCT = ("shared", "functions", "devpilot", "orchestrator")


def section(heading: str) -> str:
    """The README's text under a heading (`## X` or `### X`), up to the next heading of that level
    or above."""
    text = README.read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    assert f"\n{heading}\n" in text, f"README.md has no heading {heading!r}"
    body = text.split(f"\n{heading}\n", 1)[1]
    stop = re.search(rf"^#{{1,{len(level)}}} ", body, flags=re.M)
    return body[: stop.start()] if stop else body


def outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", outside_code(doc.read_text(encoding="utf-8")), flags=re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def test_the_readme_stays_a_short_users_guide() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, (
        f"README.md has {lines} lines (at most {MAX_LINES}): move narratives to bench/README.md, "
        "reasons to docs/design.md, and keep the README a user's guide"
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_something_that_exists(doc: Path) -> None:
    text = outside_code(doc.read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, broken


def test_the_configuration_table_names_every_setting_with_its_default() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    documented: dict[str, str] = {}
    for row in rows:
        names, default = (cell.strip() for cell in row.strip("|").split(" | ")[:2])
        # A row may group variables: "`A`, `B`" with "1, 2", or groups split by "; " with their defaults.
        for group, value in zip(names.split("; "), default.split("; "), strict=True):
            found = re.findall(r"`([A-Z][A-Z0-9_]+)`", group)
            values = value.split(", ")
            for i, name in enumerate(found):
                documented[name] = values[i] if len(values) == len(found) else value
    defaults = Settings.defaults()
    missing = sorted(set(defaults) - set(documented))
    assert not missing, f"settings missing from docs/configuration.md's table: {missing}"
    code = "\n".join(p.read_text(encoding="utf-8") for d in PRODUCT for p in (ROOT / d).rglob("*.py"))
    unknown = sorted(n for n in documented if f'"{n}"' not in code)
    assert not unknown, f"docs/configuration.md documents variables no code reads: {unknown}"
    for name, value in documented.items():
        if name not in defaults:
            continue
        in_code = defaults[name]
        if value == "off":
            assert in_code is False, (name, in_code)
        elif re.fullmatch(r"\d+(\.\d+)?", value):
            assert float(value) == in_code, f"README says {name} defaults to {value}; the code: {in_code}"


def _orchestrator_sets() -> set[str]:
    """The DEVPILOT_* variables the orchestrator puts in COMMAND's environment (dict keys and
    item assignments in orchestrator/)."""
    names: set[str] = set()
    for path in (ROOT / "orchestrator").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            keys: list[ast.expr | None] = []
            if isinstance(node, ast.Dict):
                keys = list(node.keys)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                keys = [node.slice]
            names |= {
                k.value
                for k in keys
                if isinstance(k, ast.Constant)
                and isinstance(k.value, str)
                and k.value.startswith("DEVPILOT_")
            }
    return names


def test_what_command_receives_lists_exactly_what_the_orchestrator_sets() -> None:
    told = set(re.findall(r"`(DEVPILOT_[A-Z_]+)`", section("### What the agent COMMAND receives")))
    given = _orchestrator_sets()
    assert not given - told, f"COMMAND gets variables the README does not list: {sorted(given - told)}"
    assert not told - given, f"the README lists variables COMMAND does not get: {sorted(told - given)}"


def test_the_readme_names_every_route_and_no_other() -> None:
    """The README's Routes section names each route of the table by its path (its endpoints are in
    docs/API.md, which tests/unit/test_routes.py holds to the table)."""
    text = section("## Routes")
    known = {r.path for r in ROUTES}
    named = set(re.findall(r"`(/[a-z_-]+)`", text))
    assert named <= known, f"the README names routes the route table lacks: {sorted(named - known)}"
    assert known <= named, f"routes missing from the README's Routes section: {sorted(known - named)}"


def test_the_graphql_the_docs_show_is_valid_for_linear() -> None:
    """Any GraphQL a reader may copy from the documentation is valid by Linear's schema."""
    queries = [q for doc in DOCS for q in re.findall(r'"query":"([^"]+)"', doc.read_text(encoding="utf-8"))]
    for q in queries:
        assert schema_errors({"query": q}) == [], q

"""Each table has one owner (docs/design.md, "Each table has one owner"): every statement under
shared/queries/ that writes a table (INSERT, UPDATE, DELETE, TRUNCATE, also inside a CTE) lives in
the file of the table's owner, or in a file the design names as writing it with its own rows in
one statement. Checked on the statements' text, without a database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).parent.parent.parent
QUERIES = ROOT / "shared" / "queries"
DESIGN = ROOT / "docs" / "design.md"
MIGRATIONS = ROOT / "infra" / "migrations"

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.M)
_ROW = re.compile(r"^\| `(\w+)` \| `([\w/]+\.py)` \| `(\w+)\.sql` \|(.*)\|\s*$", re.M)
# A write and the table it writes. `UPDATE` is a write unless it is a row lock (FOR UPDATE, FOR NO
# KEY UPDATE) or an upsert's action (ON CONFLICT ... DO UPDATE SET), neither of which names a table.
_WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|(?<!FOR\s)(?<!KEY\s)(?<!DO\s)UPDATE)"
    r"\s+(?:ONLY\s+)?(\w+)",
    re.I,
)
_NOT_A_TABLE = {"set", "of", "skip", "nowait"}


class Owner(NamedTuple):
    module: str  # shared/delivery/queue.py
    file: str  # queue (its statements' file, queue.sql)
    also: frozenset[str]  # files whose statements may write it with their own rows


def owners() -> dict[str, Owner]:
    """The design's table: table -> its owner."""
    found = {
        table: Owner(module, file, frozenset(re.findall(r"`(\w+)\.sql`", rest)))
        for table, module, file, rest in _ROW.findall(DESIGN.read_text(encoding="utf-8"))
    }
    assert found, "docs/design.md has no table of owners"
    return found


def written(statement: str) -> set[str]:
    """The tables a statement writes, comments and string literals left out."""
    sql = "\n".join(line.split("--", 1)[0] for line in statement.splitlines())
    sql = re.sub(r"'(?:[^']|'')*'", "''", sql)
    return {m.group(1).lower() for m in _WRITE.finditer(sql)} - _NOT_A_TABLE


def statements() -> list[tuple[str, str, str]]:
    """(file, name, text) of every named block, as written (a fragment is checked in its own file)."""
    found = []
    for path in sorted(QUERIES.glob("*.sql")):
        parts = _HEADER.split(path.read_text(encoding="utf-8"))
        found += [(path.stem, name, body) for name, body in zip(parts[1::2], parts[2::2], strict=True)]
    return found


def test_the_parser_sees_every_kind_of_write_and_no_lock() -> None:
    # (the check below is only as good as this: a write it cannot see it cannot refuse)
    sql = """
    WITH a AS (DELETE FROM t1 WHERE x RETURNING id),
         b AS (UPDATE t2 q SET y = 1 FROM a WHERE q.id = a.id RETURNING q.id),
         c AS (SELECT id FROM t3 ORDER BY seq FOR UPDATE SKIP LOCKED),
         d AS (SELECT id FROM t4 FOR NO KEY UPDATE OF t4),
         e AS (SELECT id FROM t5 FOR UPDATE
         ), f AS (
            insert into t6 (k) VALUES ('UPDATE t7 SET') ON CONFLICT (k) DO UPDATE SET k = EXCLUDED.k
         ) -- UPDATE t8 SET z = 1
    TRUNCATE TABLE t9
    """
    assert written(sql) == {"t1", "t2", "t6", "t9"}


def test_every_table_has_one_owner_named_in_the_design() -> None:
    table = owners()
    created = set()
    for path in MIGRATIONS.glob("*.sql"):
        text = path.read_text(encoding="utf-8")
        created |= {t.lower() for t in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", text, flags=re.I)}
    created.add("devpilot_migrations")  # (the ledger, created by shared/plumbing/migrate.py)
    assert created == set(table), (
        f"tables without an owner in docs/design.md: {sorted(created - set(table))}; "
        f"owners of no table: {sorted(set(table) - created)}"
    )
    for name, owner in table.items():
        assert (ROOT / owner.module).is_file(), f"{name}: no module {owner.module}"
        assert (QUERIES / f"{owner.file}.sql").is_file(), f"{name}: no file {owner.file}.sql"


def test_each_statement_writes_only_the_tables_its_file_owns() -> None:
    table = owners()
    wrong = []
    for file, name, body in statements():
        for t in sorted(written(body)):
            owner = table.get(t)
            if owner is None:
                wrong.append(f"{file}.sql {name}: writes {t}, which has no owner in docs/design.md")
            elif owner.file != file and file not in owner.also:
                wrong.append(
                    f"{file}.sql {name}: writes {t}, whose owner is {owner.module} ({owner.file}.sql)"
                )
    assert not wrong, "\n".join(wrong)


def test_only_the_queue_writes_the_queue() -> None:
    # The delivery guarantee is the queue: no other file writes it, even with its own rows.
    queue = owners()["dispatch_queue"]
    assert (queue.module, queue.file, queue.also) == ("shared/delivery/queue.py", "queue", frozenset())
    writers = {file for file, _, body in statements() if "dispatch_queue" in written(body)}
    assert writers == {"queue"}

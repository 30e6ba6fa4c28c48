"""Operators' view: `devpilot status`, /metrics and /dashboard on a seeded database."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from devpilot.status_view import render
from shared.operators.status import snapshot
from shared.plumbing.db import Pool, transaction
from shared.plumbing.sql import query
from tests.helpers.api import ADMIN, Api, issue_event
from tests.helpers.chromium import headless_chromium
from tests.helpers.data import MakeOrch, bulk, enqueue_one
from tests.helpers.plans import explain, nodes

ROOT = Path(__file__).parent.parent


def seed(api: Api) -> dict[str, Any]:
    """Two machines: one with 3 queued + 1 claimed, one with a delivered and a dead-lettered session."""
    a_id, a = api.register(user="alice", name="alice-laptop")
    b_id, b = api.register(user="bob", name="bob-desktop")
    for i in range(4):
        api.webhook(issue_event(issue_id=f"a{i}", assignee="alice"))
    api.post_as(a, "/claim", {"max": 1})
    api.webhook(issue_event(issue_id="b-ok", assignee="bob"))
    [m] = api.post_as(b, "/claim").json()["messages"]
    api.post_as(b, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    api.webhook(issue_event(issue_id="b-dead", assignee="bob"))
    [d] = api.post_as(b, "/claim").json()["messages"]
    with api.pool.connection() as conn:  # make this its last attempt, then give it back
        conn.execute("UPDATE dispatch_queue SET attempts = 5 WHERE id = %s", (d["queueId"],))
    api.post_as(
        b, "/release", {"queueId": d["queueId"], "claimToken": d["claimToken"], "reason": "disk full"}
    )
    api.http.post("/sweep", headers=api.admin())
    return {"a": a_id, "b": b_id}


def status_json(database_url: str) -> subprocess.CompletedProcess[str]:
    """`devpilot status --json` on that database, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "devpilot", "status", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": database_url},
    )


def test_status_json_and_terminal(api: Api, db_url: str) -> None:
    ids = seed(api)
    r = status_json(db_url)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by_id = {o["orchestratorId"]: o for o in out["orchestrators"]}
    assert (by_id[ids["a"]]["queued"], by_id[ids["a"]]["claimed"], by_id[ids["a"]]["attempts"]) == (3, 1, 1)
    assert by_id[ids["a"]]["oldestDueSeconds"] >= 0 and by_id[ids["a"]]["lastSeenAt"]
    assert (by_id[ids["b"]]["queued"], by_id[ids["b"]]["claimed"]) == (0, 0)
    assert out["totals"] == {"queued": 4, "delivered": 1, "failed": 1}
    [failed] = out["recentFailed"]
    assert "disk full" in failed["reason"] and failed["issue"] == "ENG-42"
    assert out["lastSweep"] is not None and len(out["history"]) == 60
    console = Console(record=True, width=160)
    render(snapshot(api.pool), console)
    text = console.export_text()
    assert "alice-laptop" in text and "bob-desktop" in text and "disk full" in text and "last sweep:" in text


def on_terminal(args: list[str], columns: int, env: dict[str, str]) -> str:
    """What `args` print on a terminal `columns` wide (a pseudo-terminal of that size), escapes removed."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        args, stdin=follower, stdout=follower, stderr=follower, cwd=ROOT, env={**base, "TERM": "xterm", **env}
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # (EIO: the process closed the terminal)
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0, out
    os.close(leader)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode()).replace("\r\n", "\n")


def test_status_on_a_terminal_fits_80_columns_and_says_more_on_a_wider_one(api: Api, db_url: str) -> None:
    ids = seed(api)
    api.register(user="carol", name="carol-macbook-pro-2024-eu-1")  # never seen
    env = {"PYTHONPATH": str(ROOT), "DATABASE_URL": db_url}
    narrow = on_terminal([sys.executable, "-m", "devpilot", "status"], 80, env)
    lines = narrow.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    rows = {
        line.split()[0]: line
        for line in lines
        if line.split()[:1] in (["alice-laptop"], ["bob-desktop"], ["carol-macbook-pro-2024-eu-1"])
    }
    assert set(rows) == {"alice-laptop", "bob-desktop", "carol-macbook-pro-2024-eu-1"}  # each name whole
    assert rows["alice-laptop"].rstrip().endswith(" ago") and rows[
        "carol-macbook-pro-2024-eu-1"
    ].rstrip().endswith(" never")
    assert "disk full" in narrow and "last sweep: " in narrow and ids["a"] not in narrow
    wide = on_terminal([sys.executable, "-m", "devpilot", "status"], 200, env)
    assert all(len(line) <= 200 for line in wide.splitlines())
    [alice] = [line for line in wide.splitlines() if line.startswith("alice-laptop")]
    assert "org-a" in alice and "alice" in alice.split()[1:3] and alice.rstrip().endswith(" ago")


def test_status_on_a_database_nobody_migrated_says_to_migrate(pg_server: Any) -> None:
    name = f"devpilot_empty_{os.getpid()}"
    pg_server._create(name, template=None)
    try:
        r = status_json(pg_server.url_for(name))
    finally:
        pg_server.drop(name)
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith(
        "has no devpilot schema yet: run `devpilot migrate` (`devpilot serve` migrates too)"
    )


def test_metrics(api: Api) -> None:
    assert api.http.get("/metrics", headers=api.admin()).status_code == 404  # off by default
    api.settings.__dict__["metrics_enabled"] = True
    ids = seed(api)
    assert api.http.get("/metrics").status_code == 401
    r = api.http.get("/metrics", headers=api.admin())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert (
        f'devpilot_queue_depth{{orchestrator="alice-laptop",orchestrator_id="{ids["a"]}",state="queued"}} 3.0'
        in text
    )
    assert (
        f'devpilot_queue_depth{{orchestrator="alice-laptop",orchestrator_id="{ids["a"]}",state="claimed"}} 1.0'
        in text
    )
    for name in (
        "devpilot_claimed_messages_total",
        "devpilot_acked_messages_total",
        "devpilot_released_messages_total",
        "devpilot_dead_lettered_messages_total",
        "devpilot_webhook_seconds_bucket",
        "devpilot_claim_seconds_count",
        "devpilot_sweep_seconds_count",
    ):
        assert name in text, name


def test_a_scrape_reads_no_session(api: Api, db_url: str) -> None:
    """Sessions are kept and grow for ever. What /metrics shows (queue depth by machine, the oldest
    due, Linear connections) reads none of them, so a scrape costs the same after a year (their
    totals counted every session: 0.27 s at 2,000,000): it answers while another transaction holds
    the sessions locked."""
    from shared.plumbing.db import connect

    api.settings.__dict__["metrics_enabled"] = True
    seed(api)
    with connect(db_url) as holder, holder.transaction():
        holder.execute("LOCK TABLE dispatch_sessions IN ACCESS EXCLUSIVE MODE")
        r = api.http.get("/metrics", headers=api.admin())
    assert r.status_code == 200 and "devpilot_queue_depth" in r.text, r.text


def test_dashboard_auth_and_figures(api: Api) -> None:
    seed(api)
    r = api.http.get("/dashboard")
    assert r.status_code == 401 and "<form" in r.text and 'name="token"' in r.text
    r = api.http.get("/dashboard", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = api.http.post(
        "/dashboard/login",
        content="token=wrong",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 401 and "wrong token" in r.text
    r = api.http.post(
        "/dashboard/login",
        content=f"token={ADMIN}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    cookie = r.headers["set-cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie and ADMIN not in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    page = api.http.get("/dashboard", headers={"Cookie": f"devpilot_dashboard={value}"})
    assert page.status_code == 200 and "alice-laptop" in page.text and 'http-equiv="refresh"' in page.text
    assert api.http.get("/dashboard", headers=api.admin()).status_code == 200
    assert "<svg" in page.text and "disk full" in page.text
    assert page.text.count('class="axis-depth"') == 3 and "−60 min" in page.text  # the chart has a scale


def login(api: Api, token: str) -> Any:
    return api.http.post(
        "/dashboard/login",
        content=f"token={token}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )


def test_dashboard_sessions_are_per_login_end_on_logout_and_limit_guessing(api: Api) -> None:
    first, second = login(api, ADMIN), login(api, ADMIN)
    a = first.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    b = second.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    assert a != b  # a new random session at every login, not a function of the admin token
    cookie = {"Cookie": f"devpilot_dashboard={a}"}
    assert api.http.get("/dashboard", headers=cookie).status_code == 200
    assert api.http.get("/dashboard/logout", headers=cookie).status_code == 405  # a GET ends nothing
    assert api.http.get("/dashboard", headers=cookie).status_code == 200
    assert api.http.post("/dashboard/logout", headers=cookie).status_code == 303
    assert api.http.get("/dashboard", headers=cookie).status_code == 401  # ended on the server
    assert api.http.get("/dashboard", headers={"Cookie": f"devpilot_dashboard={b}"}).status_code == 200
    for path in ("/dashboard", "/dashboard/login"):
        r = api.http.get(path)
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
    assert (
        "frame-ancestors 'none'"
        in api.http.get("/dashboard", headers={"Authorization": "Bearer x"}).headers[
            "content-security-policy"
        ]
    )
    for _ in range(5):
        assert login(api, "guess").status_code == 401
    blocked = login(api, ADMIN)  # even the right token, from this client, for a while
    assert blocked.status_code == 429 and "set-cookie" not in blocked.headers


def test_dashboard_in_headless_chromium(api: Api, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    seed(api)
    driver = headless_chromium(tmp_path / "profile", "1100,900")
    try:
        driver.get(api.url + "/dashboard")
        driver.find_element(By.ID, "token").send_keys(ADMIN)
        driver.find_element(By.ID, "signin").click()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "alice-laptop" not in driver.page_source:
            time.sleep(0.2)
        rows = driver.find_elements(By.CSS_SELECTOR, "#orchestrators tr[data-orchestrator]")
        cells = {r.find_element(By.CSS_SELECTOR, "td").text: r for r in rows}
        assert set(cells) == {"alice-laptop", "bob-desktop"}
        assert cells["alice-laptop"].find_element(By.CSS_SELECTOR, ".queued").text == "3"
        assert cells["alice-laptop"].find_element(By.CSS_SELECTOR, ".claimed").text == "1"
        assert "disk full" in driver.find_element(By.ID, "failed").text
        assert driver.find_element(By.ID, "total-queued").text == "queued: 4"
        assert driver.find_element(By.ID, "chart").is_displayed()
        shot = tmp_path / "dashboard.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        keep = os.environ.get("DEVPILOT_SCREENSHOT_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(keep) / "dashboard.png")
        print(f"dashboard screenshot: {shot}")
    finally:
        driver.quit()


def test_history_is_each_minutes_count_of_undelivered_sessions(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """The one-pass history (shared/queries/status.sql) against its definition: at the end of each
    minute, the sessions created before then and not finished by then (queued, or delivered, failed
    or cancelled after it); and the mean webhook-to-ack time of those acked in the minute. A
    delivered session may be changed again later (Linear opening a plain assignment's agent
    session): it finished when it was delivered."""
    o = make_orchestrator()
    for n in range(3):
        enqueue_one(pool, o, n)
    rng = random.Random(4)
    with transaction(pool) as tx:
        tx.execute("UPDATE dispatch_sessions SET created_at = now() - interval '75 minutes'")
        for _ in range(300):  # minutes from now, some on a minute's boundary
            created = rng.choice([rng.uniform(-120, 0), float(rng.randint(-120, 0))])
            changed = created + rng.choice([0.0, rng.uniform(0, 40), float(rng.randint(0, 40))])
            status = rng.choice(["delivered", "failed", "cancelled"])
            later = rng.choice([0.0, 0.0, rng.uniform(0, 30)]) if status == "delivered" else 0.0
            tx.execute(
                "INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, created_at, updated_at,"
                " delivered_at) VALUES (%(org)s, %(o)s, %(status)s, now() + %(c)s * interval '1 minute',"
                " now() + %(u)s * interval '1 minute',"
                " CASE WHEN %(status)s = 'delivered' THEN now() + %(d)s * interval '1 minute' END)",
                {
                    "org": o.org_id,
                    "o": o.id,
                    "status": status,
                    "c": created,
                    "d": min(changed, 0.0),
                    "u": min(changed + later, 0.0),
                },
            )
    with pool.connection() as conn, conn.transaction():  # (one now() for both reads)
        history = conn.execute(query("status_history")).fetchall()
        sessions = conn.execute(
            "SELECT status, created_at, updated_at, delivered_at FROM dispatch_sessions"
        ).fetchall()
    assert len(history) == 60
    for h in history:
        end = h["minute"] + timedelta(minutes=1)
        undelivered = [
            s
            for s in sessions
            if s["created_at"] < end
            and (s["status"] == "queued" or (s["delivered_at"] or s["updated_at"]) >= end)
        ]
        assert h["depth"] == len(undelivered), h["minute"]
        acked = [s for s in sessions if s["delivered_at"] and h["minute"] <= s["delivered_at"] < end]
        if acked:
            mean = sum((s["delivered_at"] - s["created_at"]).total_seconds() for s in acked) / len(acked)
            assert h["latency_s"] == pytest.approx(mean)
        else:
            assert h["latency_s"] is None
    assert any(h["depth"] > 3 for h in history) and any(h["latency_s"] for h in history)


def test_the_history_reads_the_last_hour_not_every_session(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """Sessions are kept: a busy workspace has millions after a year. The history (the dashboard's
    chart, `devpilot status --json`) reads the queued ones and those changed in the last hour, by
    index, never every session: read whole, 2,000,000 sessions took 0.6-0.9 s on a 2-core machine,
    about a third of the statement timeout (bench/README.md)."""
    o = make_orchestrator()
    enqueue_one(pool, o, 0)
    bulk(
        pool,
        "INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, created_at, updated_at, delivered_at)"
        " SELECT %(org)s, %(o)s, CASE WHEN g <= 50 THEN 'failed' ELSE 'delivered' END,"
        "        now() - make_interval(secs => g * 10), now() - make_interval(secs => g * 10 - 5),"
        "        CASE WHEN g > 50 THEN now() - make_interval(secs => g * 10 - 5) END"
        " FROM generate_series(1, 100000) g",
        {"org": o.org_id, "o": o.id},
    )
    with pool.connection() as conn:
        conn.execute("ANALYZE dispatch_sessions")
        with conn.transaction():
            plan = explain(conn, query("status_history"), {}, mode="force_generic_plan")
    top = plan["QUERY PLAN"][0]
    text = json.dumps(plan)
    scans = [n for n in nodes(top["Plan"]) if n.get("Relation Name") == "dispatch_sessions"]
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), text
    assert top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0) < 500, text

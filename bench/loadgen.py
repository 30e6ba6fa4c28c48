"""A load generator in its own process: signed webhooks of one kind (or a blend), or claim+ack
cycles, for a duration.

python -m bench.loadgen webhook URL SECRET THREADS SECONDS [KIND [TAG]]
python -m bench.loadgen cycle URL TOKEN THREADS SECONDS
Prints one JSON line: {"rate": ..., "count": ..., "p50_ms": ..., "p99_ms": ..., "cpu_s": ...}, and
for the blend "kinds": each kind's count and latency.

KIND is one of KINDS or "blend" (default "created"). The kinds that need earlier state
(re-assigned, unassigned, prompted, stop) find it prepared before the load generator starts
(`bench.http.prepare`), under TAG: the ids of that state are `pool_id(TAG, KIND, pool, i)` for
`i < prepared(KIND, THREADS, SECONDS)[pool]`, and thread t takes the indices t, t + THREADS, ...
"""

from __future__ import annotations

import itertools
import json
import math
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

from shared.linear.webhooks import sign

# The Linear users of the bench's two machines: every dispatch goes to A's machine, except a
# re-assignment, which moves the issue's work between A's and B's.
USER_A, USER_B = "u", "v"
ORG = "bench"

# Every kind of webhook the bench sends, in the order the figures are shown.
KINDS = ("created", "existing", "reassigned", "unassigned", "agent_created", "prompted", "stop", "edit")
# The blend, per 100 webhooks (bench/README.md says why): for every ten issues of a workspace, about
# a hundred edits of them (state moves, labels, priority, estimates, titles, descriptions; and an
# issue created without an assignee is answered as an edit is), five issues created with an
# assignee and five assigned later, one or two re-assigned and one in two unassigned, and, where
# the agent is used on one issue in five, two agent sessions with about two follow-ups each. A stop
# (pressed in perhaps one agent session in ten) is under one in a hundred: not in it.
BLEND: dict[str, int] = {
    "edit": 84,
    "created": 4,
    "existing": 4,
    "reassigned": 2,
    "unassigned": 1,
    "agent_created": 2,
    "prompted": 3,
}
# The most webhooks a second of one kind the prepared state is sized for (well above any kind's
# rate on a small machine: the service's fastest, an issue created assigned, about 2,000): an
# unassignment consumes its issue, and one that finds nothing to cancel is a bench error.
MAX_RATE = 3000
# Agent sessions are not consumed (a conversation takes many follow-ups; stopped again, a session
# has its last stop cancelled and a new one queued), nor are re-assigned issues (each goes back and
# forth between the two machines): pools of this many at most.
MAX_REUSED = {"prompted": 1024, "stop": 1024, "reassigned": 2048}
# Each kind's answer from the service: its status, and a field it must carry or lack.
EXPECTED: dict[str, tuple[str, str | None, bool]] = {
    "created": ("dispatched", "cancelledSessionId", False),
    "existing": ("dispatched", "cancelledSessionId", False),  # (nothing earlier to cancel)
    "reassigned": ("dispatched", "cancelledSessionId", True),
    "unassigned": ("cancelled", None, False),
    "agent_created": ("dispatched", None, False),
    "prompted": ("dispatched", None, False),
    "stop": ("stopped", "stopSessionId", True),  # (and not null: the machine that had it is told)
    "edit": ("ignored", None, False),
}
AGENT_KIND = {"agent_created": "start", "prompted": "prompt"}  # the answer's `kind`
PREPARED = ("reassigned", "unassigned", "prompted", "stop")  # the kinds that need state made beforehand
HELD = ("prompted", "stop")  # of those, the agent sessions a machine holds (the rest: issues)


def shares(kind: str) -> dict[str, float]:
    """What fraction of `kind`'s webhooks is each kind: itself, or the blend's parts."""
    if kind == "blend":
        return {k: w / sum(BLEND.values()) for k, w in BLEND.items()}
    if kind not in KINDS:
        raise ValueError(f"no such kind: {kind} (one of {', '.join(KINDS)}, blend)")
    return {kind: 1.0}


def prepared(kind: str, threads: int, seconds: float) -> dict[str, int]:
    """How many issues (re-assigned, unassigned) or agent sessions (prompted) each pool of `kind`
    needs for `threads` senders over `seconds`: a multiple of `threads`, so each thread has its
    own share."""
    out: dict[str, int] = {}
    for pool, share in shares(kind).items():
        if pool not in PREPARED:
            continue
        n = math.ceil(MAX_RATE * seconds * share)
        n = min(n, MAX_REUSED.get(pool, n))
        out[pool] = max(1, math.ceil(n / threads)) * threads
    return out


def pool_id(tag: str, kind: str, pool: str, i: int) -> str:
    """The id of the i-th prepared issue (or agent session) of `pool` for a run of `kind`."""
    return f"{tag}-{kind}-{pool}-{i}"


_changes = itertools.count()


def _updated_at() -> str:
    """A distinct `updatedAt` per change, each later than the one before, as Linear's are (the content
    half of a delivery's identity, so an issue re-assigned twice is two deliveries; and the order of
    one issue's assignment events)."""
    ms = next(_changes)
    return f"2026-12-07T{ms // 3_600_000 % 24:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}Z"


def assignment(issue_id: str, identifier: str, assignee: str) -> dict[str, object]:
    """A Linear "issue created and assigned" webhook body, as the bench sends it."""
    return {
        "type": "Issue",
        "action": "create",
        "organizationId": ORG,
        "webhookTimestamp": int(time.time() * 1000),
        "data": {
            "id": issue_id,
            "identifier": identifier,
            "title": "bench",
            "assigneeId": assignee,
            "updatedAt": _updated_at(),
        },
    }


def update(issue_id: str, assignee: str | None, updated_from: dict[str, object]) -> dict[str, object]:
    """A Linear "issue updated" webhook body: the issue as it is now, and in `updatedFrom` the
    fields that changed, with their values before."""
    return {
        "type": "Issue",
        "action": "update",
        "organizationId": ORG,
        "webhookTimestamp": int(time.time() * 1000),
        "data": {
            "id": issue_id,
            "identifier": "B-1",
            "title": "bench",
            "assigneeId": assignee,
            "updatedAt": _updated_at(),
        },
        "updatedFrom": updated_from,
    }


def edit(issue_id: str, assignee: str) -> dict[str, object]:
    """A Linear "issue updated" webhook body whose assignee did not change (most of the webhooks a
    workspace sends): recorded, and nothing else."""
    return update(issue_id, assignee, {"title": "before"})


def existing_assigned(issue_id: str, assignee: str) -> dict[str, object]:
    """An existing issue, unassigned until now, assigned: a start, with nothing earlier to cancel."""
    return update(issue_id, assignee, {"assigneeId": None})


def reassigned(issue_id: str, before: str, after: str) -> dict[str, object]:
    """An issue moved from one person to another: the work queued for `before`'s machine is
    cancelled and a start queued for `after`'s."""
    return update(issue_id, after, {"assigneeId": before})


def unassigned(issue_id: str, before: str) -> dict[str, object]:
    """An issue's assignee removed: the work queued for their machine is cancelled."""
    return update(issue_id, None, {"assigneeId": before})


def _agent_event(action: str, session_id: str, issue_id: str, creator: str) -> dict[str, object]:
    """An AgentSessionEvent shaped as Linear's AgentSessionEventWebhookPayload (the fields the
    service reads, and those around them Linear sends; checked in tests/unit/test_bench_kinds.py)."""
    return {
        "type": "AgentSessionEvent",
        "action": action,
        "organizationId": ORG,
        "webhookTimestamp": int(time.time() * 1000),
        "createdAt": "2026-12-07T00:00:00.000Z",
        "appUserId": "app-user",
        "oauthClientId": "oauth-client",
        "agentSession": {
            "id": session_id,
            "appUserId": "app-user",
            "creatorId": creator,
            "organizationId": ORG,
            "status": "pending",
            "type": "commentThread",
            "createdAt": "2026-12-07T00:00:00.000Z",
            "updatedAt": _updated_at(),
            "issueId": issue_id,
            "issue": {"id": issue_id, "identifier": "B-1", "title": "bench", "teamId": "team-bench"},
            "commentId": f"c-{session_id}",
            "comment": {"id": f"c-{session_id}", "body": "@agent fix the flaky test", "issueId": issue_id},
            "sourceCommentId": f"c-{session_id}",
        },
    }


def agent_created(session_id: str, issue_id: str, creator: str) -> dict[str, object]:
    """An agent session started by `creator` (a mention in a comment): a start for their machine,
    with Linear's context."""
    event = _agent_event("created", session_id, issue_id, creator)
    event["promptContext"] = '<issue identifier="B-1"><title>bench</title></issue>\n<comment>fix it</comment>'
    event["guidance"] = [{"body": "Run the tests before you answer.", "origin": {"type": "Workspace"}}]
    event["previousComments"] = []
    return event


def prompted(session_id: str, issue_id: str, creator: str) -> dict[str, object]:
    """A follow-up in an agent session a machine holds: a prompt for that machine."""
    event = _agent_event("prompted", session_id, issue_id, creator)
    event["agentActivity"] = {
        "id": uuid.uuid4().hex,
        "agentSessionId": session_id,
        "content": {"type": "prompt", "body": "also the docs"},
        "userId": creator,
        "createdAt": "2026-12-07T00:00:01.000Z",
        "updatedAt": "2026-12-07T00:00:01.000Z",
    }
    return event


def stopped(session_id: str, issue_id: str, creator: str) -> dict[str, object]:
    """Stop pressed in an agent session a machine holds: what no machine has yet is cancelled, and a
    `stop` queued for the machine that has the conversation."""
    event = _agent_event("prompted", session_id, issue_id, creator)
    event["agentActivity"] = {
        "id": uuid.uuid4().hex,
        "agentSessionId": session_id,
        "content": {"type": "prompt", "body": "Stop"},
        "signal": "stop",
        "userId": creator,
        "createdAt": "2026-12-07T00:00:01.000Z",
        "updatedAt": "2026-12-07T00:00:01.000Z",
    }
    return event


def schedule(kind: str, seed: int = 48) -> list[str]:
    """The order of kinds a sender goes through, over and over: `kind` alone, or the blend's 100
    in a fixed shuffle (each thread starts at its own place in it)."""
    if kind != "blend":
        shares(kind)  # (refuses an unknown kind)
        return [kind]
    order = [k for k, w in BLEND.items() for _ in range(w)]
    random.Random(seed).shuffle(order)  # nosec B311 (an order of requests, not a secret)
    return order


def bodies(kind: str, tag: str, thread: int, threads: int, seconds: float) -> Callable[[], tuple[str, bytes]]:
    """A function that gives this sender's next webhook: its kind and its body. Prepared state is
    taken from this thread's share of each pool; a re-assignment, once its share is used, goes
    round it again the other way (B to A, then A to B); an unassignment has no second round."""
    order = schedule(kind)
    sizes = prepared(kind, threads, seconds)
    used = dict.fromkeys(sizes, 0)
    position = itertools.count(thread * 7)

    def take(pool: str) -> tuple[int, int]:
        j = used[pool]
        used[pool] += 1
        per = sizes[pool] // threads
        return thread + threads * (j % per), j // per

    def nxt() -> tuple[str, bytes]:
        k = order[next(position) % len(order)]
        if k == "created":
            event = assignment(uuid.uuid4().hex, "B-1", USER_A)
        elif k == "existing":
            event = existing_assigned(uuid.uuid4().hex, USER_A)
        elif k == "edit":
            event = edit(uuid.uuid4().hex, USER_A)
        elif k == "agent_created":
            event = agent_created(uuid.uuid4().hex, uuid.uuid4().hex, USER_A)
        elif k == "reassigned":
            i, lap = take(k)
            before, after = (USER_A, USER_B) if lap % 2 == 0 else (USER_B, USER_A)
            event = reassigned(pool_id(tag, kind, k, i), before, after)
        elif k == "unassigned":
            i, lap = take(k)
            if lap:
                raise RuntimeError("the prepared issues to unassign ran out: raise MAX_RATE")
            event = unassigned(pool_id(tag, kind, k, i), USER_A)
        else:  # prompted, stop
            i, _ = take(k)
            sid = pool_id(tag, kind, k, i)
            event = (prompted if k == "prompted" else stopped)(sid, f"issue-{sid}", USER_A)
        return k, json.dumps(event).encode()

    return nxt


def check(kind: str, status: int, answer: bytes) -> None:
    """The service's answer is the one `kind` must get; anything else is an error of the bench."""
    got = json.loads(answer) if status == 200 else {}
    want, field, present = EXPECTED[kind]
    ok = got.get("status") == want
    if field is not None:
        ok = ok and (field in got) == present
    if kind == "stop":
        ok = ok and got.get("stopSessionId") is not None
    if kind in AGENT_KIND:
        ok = ok and got.get("kind") == AGENT_KIND[kind]
    if not ok:
        raise AssertionError(f"{kind}: {status} {answer[:300]!r}")


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs and reads answers with a Content-Length (as
    `devpilot serve` gives them; anything else is an error of the bench, raised)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head}\r\n".encode()
            + body
        )
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        status_line, *lines = self.buf[:end].decode("latin-1").split("\r\n")
        fields = dict(line.split(":", 1) for line in lines)
        length = next((int(v) for k, v in fields.items() if k.lower() == "content-length"), None)
        if length is None:
            raise RuntimeError(f"an answer without Content-Length: {status_line} {fields}")
        start = end + 4
        while len(self.buf) < start + length:
            self._more()
        answer, self.buf = self.buf[start : start + length], self.buf[start + length :]
        return int(status_line.split(" ", 2)[1]), answer

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    mode, url, secret, threads, seconds = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        float(sys.argv[5]),
    )
    kind = sys.argv[6] if len(sys.argv) > 6 else "created"
    tag = sys.argv[7] if len(sys.argv) > 7 else "bench"
    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    errors: list[BaseException] = []

    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80

    # The client is kept lean so that on a small machine, where it shares the cores with the server
    # and Postgres, the figure is the server's and not the load generator's: one keep-alive
    # connection per thread, each request framed by hand (`Connection`). With http.client it took
    # twice the CPU per webhook (0.46 against 0.23 ms on a 2-core host, body and signature included).
    def webhook(t: int) -> None:
        conn = Connection(host, port)
        nxt = bodies(kind, tag, t, threads, seconds)
        mine: dict[str, list[float]] = {k: [] for k in KINDS}
        try:
            while time.monotonic() < stop:
                k, body = nxt()
                headers = {"Linear-Signature": sign(secret, body), "Linear-Delivery": uuid.uuid4().hex}
                t0 = time.perf_counter()
                status, answer = conn.post("/webhook", body, headers)
                dt = time.perf_counter() - t0
                check(k, status, answer)
                mine[k].append(dt)
        except BaseException as exc:  # (reported by the main thread: a bench error, not a figure)
            errors.append(exc)
        finally:
            conn.close()
            with lock:
                for k, xs in mine.items():
                    lat[k].extend(xs)

    def cycle(t: int) -> None:
        conn = Connection(host, port)
        auth = {"Authorization": f"Bearer {secret}"}
        mine: list[float] = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            status, answer = conn.post("/claim", b'{"max": 1}', auth)
            ms = json.loads(answer)["messages"]
            if not ms:
                continue
            m = ms[0]
            ack = json.dumps({"queueId": m["queueId"], "claimToken": m["claimToken"]}).encode()
            status, answer = conn.post("/ack", ack, auth)
            assert status == 200, answer
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            lat["created"].extend(mine)  # (the cycles' figures, under any key)

    target = webhook if mode == "webhook" else cycle
    ts = [threading.Thread(target=target, args=(t,)) for t in range(threads)]
    t0, cpu0 = time.monotonic(), time.process_time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed, cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    if errors:
        raise errors[0]
    every = sorted(x for xs in lat.values() for x in xs)
    out: dict[str, object] = {
        "rate": len(every) / elapsed,
        "count": len(every),
        **percentiles(every),
        "cpu_s": cpu_s,  # this process's CPU while it sent (its start-up not included)
    }
    if kind == "blend":
        out["kinds"] = {k: {"count": len(xs), **percentiles(sorted(xs))} for k, xs in lat.items() if xs}
    print(json.dumps(out))


def percentiles(xs: list[float]) -> dict[str, float | None]:
    """The median and 99th percentile of sorted latencies (s), in ms."""

    def pick(q: float) -> float | None:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 2) if xs else None

    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99)}


if __name__ == "__main__":
    main()

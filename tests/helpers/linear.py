"""A stand-in for Linear's GraphQL endpoint that checks what it is sent against Linear's published
schema (tests/linear/schema.graphql): every document must validate and its variables coerce, or the
call is answered 400 and recorded as invalid."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode

from graphql import (
    GraphQLInputObjectType,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    build_schema,
    parse,
    validate,
)
from graphql.execution.values import get_variable_values
from graphql.language import DocumentNode, FieldNode, OperationDefinitionNode
from graphql.utilities import value_from_ast_untyped
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

SCHEMA_FILE = Path(__file__).parent.parent / "linear" / "schema.graphql"


@cache
def schema() -> GraphQLSchema:
    return build_schema(SCHEMA_FILE.read_text(encoding="utf-8"))


def schema_errors(body: dict[str, Any]) -> list[str]:
    """What is wrong with a GraphQL request by Linear's schema (empty: nothing)."""
    doc, errors = _document(body["query"])
    if errors:
        return list(errors)
    [op] = [d for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    coerced = get_variable_values(schema(), op.variable_definitions or [], body.get("variables") or {})
    return [e.message for e in coerced] if isinstance(coerced, list) else []


@cache
def _document(query: str) -> tuple[DocumentNode, tuple[str, ...]]:
    """A document and what is wrong with it by the schema, once per document text (the service
    sends the same few documents, each with its own variables, which are checked every time)."""
    doc = parse(query)
    return doc, tuple(e.message for e in validate(schema(), doc))


def payload_errors(type_name: str, value: Any, path: str = "") -> list[str]:
    """The fields of a webhook payload (or any value) that Linear's schema type does not have: the
    tests' own webhooks are checked against what Linear really sends, as Linear's payload types
    describe it (an agent session's issue has no `assigneeId`, for one)."""
    gql_type: Any = schema().get_type(type_name)
    return _shape_errors(gql_type, value, path or type_name)


def _shape_errors(gql_type: Any, value: Any, path: str) -> list[str]:
    while isinstance(gql_type, GraphQLNonNull):
        gql_type = gql_type.of_type
    if value is None:
        return []
    if isinstance(gql_type, GraphQLList):
        return [e for i, v in enumerate(value) for e in _shape_errors(gql_type.of_type, v, f"{path}[{i}]")]
    if isinstance(gql_type, GraphQLObjectType | GraphQLInputObjectType):
        if not isinstance(value, dict):
            return [f"{path}: an object expected"]
        errors = [f"{path}.{k}: no such field in {gql_type.name}" for k in value if k not in gql_type.fields]
        for k, v in value.items():
            if k in gql_type.fields:
                errors += _shape_errors(gql_type.fields[k].type, v, f"{path}.{k}")
        return errors
    return []


def root_field(body: dict[str, Any]) -> str:
    """The first field the operation asks for (`agentActivityCreate`, `issue`, ...)."""
    return _root(body).name.value


def root_arguments(body: dict[str, Any]) -> dict[str, Any]:
    """The first field's arguments, as the operation gives them (its variables resolved)."""
    variables = body.get("variables") or {}
    return {a.name.value: value_from_ast_untyped(a.value, variables) for a in _root(body).arguments or []}


def _root(body: dict[str, Any]) -> FieldNode:
    [op] = [d for d in _document(body["query"])[0].definitions if isinstance(d, OperationDefinitionNode)]
    first = op.selection_set.selections[0]
    assert isinstance(first, FieldNode)
    return first


def person(
    user_id: str,
    name: str,
    org: dict[str, str],
    *,
    active: bool = True,
    guest: bool = False,
    app: bool = False,
) -> dict[str, Any]:
    """A user of a workspace, as the stand-in's directory and `viewer` know them."""
    return {"id": user_id, "name": name, "active": active, "guest": guest, "app": app, "organization": org}


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


# A team's workflow, as Linear gives every new team: the first `started` state is the one of
# lowest position among the started ones, not the first listed.
STATES = [
    {"id": "st-backlog", "name": "Backlog", "type": "backlog", "position": 0.0},
    {"id": "st-todo", "name": "Todo", "type": "unstarted", "position": 1.0},
    {"id": "st-review", "name": "In Review", "type": "started", "position": 3.0},
    {"id": "st-progress", "name": "In Progress", "type": "started", "position": 2.0},
    {"id": "st-done", "name": "Done", "type": "completed", "position": 4.0},
    {"id": "st-canceled", "name": "Canceled", "type": "canceled", "position": 5.0},
]
PLAN_STATUSES = ("pending", "inProgress", "completed", "canceled")  # Linear's plan step statuses


class Linear:
    """Records every valid GraphQL call; fails the first `fail` calls with HTTP 500. Answers the
    mutations the service sends, and `issue(id)` from `issues` (what a test says of each issue:
    its assignee, delegate and state; an issue not in it has none, and is in Todo) and `labels`
    (its label names), and keeps what the mutations change (`issues`, `sessions`).
    `issueRepositorySuggestions` answers from `suggestions` (per issue id, `{"owner/name" or
    "host/owner/name": confidence}`), restricted to the candidates asked about, as Linear does.
    `refuse[field] = message` makes Linear refuse every call of that root field with that error
    (`refusals` counts them), as Linear answers a mutation it will not do: HTTP 200, `errors`, no
    data.

    Its directory of users (`people`, id -> `person(...)`) answers the `users` lookup the service
    makes when an operator registers a machine (recorded in `lookups`, not `calls`); None (the
    default) knows every id asked for as a user. A token whose workspace is known (`token_orgs`)
    finds only that workspace's users, as a real workspace token does.

    Linear's rate limit (docs/linear-rate-limits.md): `rate_limit(token, seconds)` refuses every
    call with that token (its `Authorization`, less `Bearer `) until `seconds` from now on the
    stand-in's clock, as Linear refuses one: HTTP 400, a GraphQL error whose `extensions.code` is
    `RATELIMITED`, and the budget's headers (`X-RateLimit-Requests-Remaining: 0`,
    `X-RateLimit-Requests-Reset`: the refill, UTC epoch milliseconds). `reset_every`: the reset a
    refusal names is at most that far ahead (a leaky bucket refills little by little: a client that
    comes back at that reset may be refused again). The refused calls are in `limited`; every
    answer carries the headers, as Linear's do. `advance(seconds)` moves the stand-in's clock (the
    tests move the database's due times with it)."""

    def __init__(self, server: HTTPServer, fail: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lookups: list[dict[str, Any]] = []
        self.invalid: list[tuple[dict[str, Any], list[str]]] = []
        self.auth: list[str] = []
        self.fail = fail
        self.issues: dict[str, dict[str, Any]] = {}
        self.people: dict[str, dict[str, Any]] | None = None
        self.token_orgs: dict[str, str] = {}
        self.sessions: dict[str, dict[str, Any]] = {}  # agent sessions: externalUrls, plan, issueId
        self.refuse: dict[str, str] = {}
        self.refusals: dict[str, int] = {}
        self.labels: dict[str, list[str]] = {}
        self.suggestions: dict[str, dict[str, float]] = {}
        self.limits: dict[str, tuple[float, float | None]] = {}  # token -> (until, reset_every), ms
        self.limited: list[dict[str, Any]] = []
        self.clock_ms = 0.0  # added to the real time: the stand-in's clock, moved by `advance`
        self._lock = threading.Lock()
        schema()  # built before the first request, not inside its time budget
        server.expect_request("/graphql", method="POST").respond_with_handler(self.handle)

    def now_ms(self) -> float:
        return time.time() * 1000 + self.clock_ms

    def rate_limit(self, token: str, seconds: float, reset_every: float | None = None) -> None:
        with self._lock:
            self.limits[token] = (
                self.now_ms() + seconds * 1000,
                None if reset_every is None else reset_every * 1000,
            )

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.clock_ms += seconds * 1000

    def _budget(self, token: str) -> tuple[bool, dict[str, str]]:
        """Whether the token is over its budget now, and the headers Linear answers with."""
        until, every = self.limits.get(token, (0.0, None))
        now = self.now_ms()
        over = now < until
        wait = (min(until, now + every) if every is not None else until) - now if over else 0.0
        real = time.time() * 1000  # (the time passed on the stand-in's clock is a wait from now)
        headers = {
            "X-RateLimit-Requests-Limit": "5000",
            "X-RateLimit-Requests-Remaining": "0" if over else "4999",
            "X-RateLimit-Requests-Reset": str(int(real + wait)),
            "X-RateLimit-Complexity-Limit": "2000000",
            "X-RateLimit-Complexity-Remaining": "1999000",
            "X-RateLimit-Complexity-Reset": str(int(real)),
        }
        return over, headers

    def issue(self, issue_id: str) -> dict[str, Any]:
        """What Linear knows of an issue (made on first use: no assignee, no delegate, in Todo)."""
        return self.issues.setdefault(issue_id, {"assignee": None})

    def answer(self, field: str, variables: dict[str, Any], n: int) -> dict[str, Any]:
        """The `data` for a valid call, the n-th one recorded."""
        if field == "agentActivityCreate":
            return {field: {"success": True, "agentActivity": {"id": f"act-{n}"}}}
        if field == "commentCreate":
            return {field: {"success": True, "comment": {"id": f"com-{n}"}}}
        if field == "issue":
            issue_id = variables["id"]
            known = self.issue(issue_id)
            state = next(s for s in STATES if s["id"] == known.get("stateId", "st-todo"))
            started = [s for s in STATES if s["type"] == "started"]
            sessions = [
                {"id": sid, "externalLinks": s.get("externalUrls") or []}
                for sid, s in self.sessions.items()
                if s.get("issueId") == issue_id
            ]
            return {
                field: {
                    "id": issue_id,
                    "assignee": known.get("assignee"),
                    "delegate": {"id": known["delegateId"]} if known.get("delegateId") else None,
                    "state": {"id": state["id"], "type": state["type"]},
                    "team": {"id": "team-1", "states": {"nodes": started}},
                    "agentSessions": {"nodes": sessions},
                    "labels": {"nodes": [{"name": name} for name in self.labels.get(issue_id, [])]},
                }
            }
        if field == "issueUpdate":
            changes = variables["input"]
            assert set(changes) <= {"stateId", "delegateId"}, changes
            if "stateId" in changes:
                assert any(s["id"] == changes["stateId"] for s in STATES), changes
            self.issue(variables["id"]).update(changes)
            return {field: {"success": True}}
        if field == "agentSessionUpdate":
            changes = variables["input"]
            for step in changes.get("plan") or []:  # the shape Linear documents for a plan
                assert set(step) == {"content", "status"} and step["status"] in PLAN_STATUSES, step
            self.sessions.setdefault(variables["id"], {}).update(changes)
            return {field: {"success": True}}
        if field == "agentSessionCreateOnIssue":
            sid = f"as-opened-{n}"
            self.sessions[sid] = dict(variables["input"])
            return {field: {"success": True, "agentSession": {"id": sid}}}
        if field == "issueRepositorySuggestions":
            return {field: {"suggestions": self._suggest(variables)}}
        raise AssertionError(f"the stand-in Linear does not answer {field}")

    def _suggest(self, variables: dict[str, Any]) -> list[dict[str, Any]]:
        table = self.suggestions.get(variables["issueId"], {})
        out = []
        for c in variables["candidateRepositories"]:
            host, name = c["hostname"], c["repositoryFullName"]
            confidence = table.get(f"{host}/{name}", table.get(name) if host == "github.com" else None)
            if confidence is not None:
                out.append({"repositoryFullName": name, "hostname": host, "confidence": confidence})
        return sorted(out, key=lambda s: -s["confidence"])

    def checked(self, body: dict[str, Any]) -> Response | None:
        """The 400 Linear would answer to a document its schema refuses (and it is recorded)."""
        errors = schema_errors(body)
        if not errors:
            return None
        self.invalid.append((body, errors))
        return Response(json.dumps({"errors": [{"message": m} for m in errors]}), status=400)

    def _members(self, token: str, body: dict[str, Any]) -> Response:
        """`users(filter: {id: {eq: $id}})`: the directory's answer, within the token's workspace."""
        self.lookups.append(body)
        wanted = ((body.get("variables") or {}).get("id")) or ""
        org = self.token_orgs.get(token)
        if self.people is None:
            found = [{"id": wanted}] if wanted else []
        else:
            p = self.people.get(wanted)
            found = [{"id": wanted}] if p and (org is None or p["organization"]["id"] == org) else []
        return _json({"data": {"users": {"nodes": found}}})

    def handle(self, request: Request) -> Response:
        body = json.loads(request.get_data())
        header = request.headers.get("Authorization", "")
        with self._lock:
            refused = self.checked(body)
            if refused is not None:
                self.auth.append(header)
                return refused
            if (
                "users(" in body["query"]
            ):  # (a read, kept apart: never in `auth`, nor one of the `fail` posts)
                return self._members(header.removeprefix("Bearer "), body)
            self.auth.append(header)
            over, budget = self._budget(header.removeprefix("Bearer "))
            if over:  # as Linear refuses a call over the token's budget
                self.limited.append(body)
                refusal = {
                    "errors": [
                        {
                            "message": "Rate limit exceeded",
                            "extensions": {
                                "code": "RATELIMITED",
                                "type": "ratelimited",
                                "userPresentableMessage": "Rate limit exceeded. Please try again later.",
                            },
                        }
                    ]
                }
                return Response(
                    json.dumps(refusal), status=400, headers=budget, content_type="application/json"
                )
            if self.fail > 0:
                self.fail -= 1
                return Response("upstream trouble", status=500)
            field = root_field(body)
            if field in self.refuse:
                self.refusals[field] = self.refusals.get(field, 0) + 1
                refused_body = {"errors": [{"message": self.refuse[field]}], "data": None}
                return Response(json.dumps(refused_body), content_type="application/json", headers=budget)
            self.calls.append(body)
            n = len(self.calls)
            data = self.answer(field, {**(body.get("variables") or {}), **root_arguments(body)}, n)
        return Response(json.dumps({"data": data}), content_type="application/json", headers=budget)

    def called(self, field: str) -> list[dict[str, Any]]:
        """The variables of each accepted call of a root field, in order."""
        return [c.get("variables") or {} for c in self.calls if root_field(c) == field]

    def wait(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.calls) < n and not self.invalid:
            time.sleep(0.02)
        assert not self.invalid, self.invalid
        assert len(self.calls) >= n, self.calls

    def activities(self) -> list[dict[str, Any]]:
        return [c["variables"]["input"] for c in self.calls if root_field(c) == "agentActivityCreate"]

    def said(self, agent_session: str) -> list[tuple[str, str]]:
        """What the agent session shows, in order: each activity's type and body ("" for none)."""
        return [
            (a["content"]["type"], a["content"].get("body", ""))
            for a in self.activities()
            if a["agentSessionId"] == agent_session
        ]

    def asked(self, field: str) -> list[dict[str, Any]]:
        """The arguments of each call that asked for `field`, as Linear reads them."""
        return [root_arguments(c) for c in self.calls if root_field(c) == field]


class LinearOAuth(Linear):
    """Linear with OAuth: a token endpoint whose refresh tokens rotate on use (a reused one is
    refused, as Linear does), access tokens that can be expired at will (then GraphQL answers 401),
    and the `organization` query (with `viewer`, the app user). Counts refreshes and refused refreshes."""

    ORG: ClassVar[dict[str, str]] = {"id": "org-oauth", "name": "Acme Robotics", "urlKey": "acme"}
    APP_USER = "app-user-oauth"  # the app user the installed token acts as (`viewer`)

    def __init__(self, server: HTTPServer, refresh_delay: float = 0.0) -> None:
        self.valid: set[str] = set()
        self.refresh_token = ""
        self.refreshes = 0
        self.refused: list[str] = []
        self.exchanges: list[dict[str, str]] = []
        self.refuse_refresh = False
        self.refresh_delay = refresh_delay
        self._n = 0
        super().__init__(server)
        self._signin_init(server)
        server.expect_request("/oauth/token", method="POST").respond_with_handler(self.token)

    def _issue(self) -> dict[str, Any]:
        self._n += 1
        access, self.refresh_token = f"acc-{self._n}", f"ref-{self._n}"
        self.valid.add(access)
        self.token_orgs[access] = self.ORG["id"]
        return {
            "access_token": access,
            "refresh_token": self.refresh_token,
            "expires_in": 86_400,
            "token_type": "Bearer",
        }

    def expire_all(self) -> None:
        with self._lock:
            self.valid.clear()

    def token(self, request: Request) -> Response:
        form = request.form
        if self.clients.get(form.get("client_id", "")) != form.get("client_secret"):
            return Response(json.dumps({"error": "invalid_client"}), status=401)
        if form.get("grant_type") == "authorization_code" and form.get("code", "").startswith("usr-code-"):
            return self._user_token(form)
        if form.get("grant_type") == "authorization_code":
            with self._lock:
                self.exchanges.append(dict(form))
                if form.get("code") != "good-code":
                    return Response(json.dumps({"error": "invalid_grant"}), status=400)
                return Response(json.dumps(self._issue()), content_type="application/json")
        if form.get("grant_type") == "refresh_token":
            time.sleep(self.refresh_delay)  # a slow Linear: lets two refreshers overlap
            with self._lock:
                if self.refuse_refresh or form.get("refresh_token") != self.refresh_token:
                    self.refused.append(form.get("refresh_token", ""))
                    return Response(json.dumps({"error": "invalid_grant"}), status=400)
                self.refreshes += 1
                return Response(json.dumps(self._issue()), content_type="application/json")
        return Response(json.dumps({"error": "unsupported_grant_type"}), status=400)

    def handle(self, request: Request) -> Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token in self.user_tokens:
            return self._as_person(token, json.loads(request.get_data()))
        if token not in self.valid:
            self.auth.append(f"Bearer {token}")
            return Response(json.dumps({"errors": [{"message": "authentication required"}]}), status=401)
        body = json.loads(request.get_data())
        if "organization" in body["query"] and "Create" not in body["query"]:
            errors = schema_errors(body)
            if errors:
                self.invalid.append((body, errors))
                return Response(json.dumps({"errors": errors}), status=400)
            data = {"organization": self.ORG, "viewer": {"id": self.APP_USER}}
            return Response(json.dumps({"data": data}), content_type="application/json")
        return super().handle(request)

    # --- people signing in (actor=user) -------------------------------------------------------
    SIGNIN_CLIENT = ("signin-client-id", "signin-client-secret")

    def _signin_init(self, server: HTTPServer) -> None:
        self.clients = {"client-id": "client-secret", self.SIGNIN_CLIENT[0]: self.SIGNIN_CLIENT[1]}
        self.signed_in = ""  # the person the browser is signed in to Linear as
        self.refuse_with = ""  # set: the authorize page answers with this `error` instead
        self.authorized: list[dict[str, str]] = []  # each authorize request's parameters
        self.user_codes: dict[str, dict[str, str]] = {}
        self.user_tokens: dict[str, str] = {}  # a person's access token -> their id
        self.revoked: list[str] = []
        self.viewers: list[str] = []  # the tokens `viewer` was asked with
        self.refused_exchanges: list[str] = []
        server.expect_request("/oauth/authorize", method="GET").respond_with_handler(self.authorize)
        server.expect_request("/oauth/revoke", method="POST").respond_with_handler(self.revoke)

    def authorize(self, request: Request) -> Response:
        """Linear's authorize page, as a browser already signed in to Linear (as `signed_in`) sees
        it after pressing Authorize: straight back to `redirect_uri` with a code, or an `error`."""
        q = {k: request.args[k] for k in request.args}
        with self._lock:
            self.authorized.append(q)
            wrong = [
                k
                for k, ok in (
                    ("client_id", q.get("client_id") in self.clients),
                    ("response_type", q.get("response_type") == "code"),
                    ("actor", q.get("actor", "user") == "user"),
                    ("scope", q.get("scope") == "read"),
                    ("code_challenge_method", q.get("code_challenge_method") == "S256"),
                    ("code_challenge", len(q.get("code_challenge", "")) == 43),
                    ("redirect_uri", q.get("redirect_uri", "").startswith("http")),
                )
                if not ok
            ]
            if wrong:
                return Response(f"bad authorize request: {wrong}", status=400)
            back = q["redirect_uri"] + "?"
            if self.refuse_with:
                return Response(
                    status=302,
                    headers={
                        "Location": back + urlencode({"error": self.refuse_with, "state": q.get("state", "")})
                    },
                )
            code = f"usr-code-{len(self.user_codes) + 1}"
            self.user_codes[code] = {**q, "person": self.signed_in}
        return Response(
            status=302, headers={"Location": back + urlencode({"code": code, "state": q.get("state", "")})}
        )

    def _user_token(self, form: Any) -> Response:
        """A person's code: single use, for the client and redirect it was issued to, and only
        with the verifier whose S256 challenge the authorize request carried (RFC 7636)."""
        with self._lock:
            grant = self.user_codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            challenge = (
                base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            )
            if (
                grant is None
                or grant["client_id"] != form.get("client_id")
                or grant["redirect_uri"] != form.get("redirect_uri")
                or grant["code_challenge"] != challenge
            ):
                self.refused_exchanges.append(form.get("code", ""))
                return _json({"error": "invalid_grant"}, 400)
            token = f"usr-{len(self.user_tokens) + 1}-{grant['person']}"
            self.user_tokens[token] = grant["person"]
        return _json({"access_token": token, "token_type": "Bearer", "expires_in": 86_400, "scope": "read"})

    def revoke(self, request: Request) -> Response:
        """`/oauth/revoke`: a token in `Authorization: Bearer`, or the form's access_token."""
        token = request.headers.get("Authorization", "").removeprefix("Bearer ") or request.form.get(
            "access_token", ""
        )
        with self._lock:
            if self.user_tokens.pop(token, None) is None and token not in self.valid:
                return _json({"error": "invalid_token"}, 401)
            self.valid.discard(token)
            self.revoked.append(token)
        return Response(status=200)

    def _as_person(self, token: str, body: dict[str, Any]) -> Response:
        """A person's read-scope token: `viewer` only."""
        with self._lock:
            refused = self.checked(body)
            if refused is not None:
                return refused
            if "viewer" not in body["query"]:
                return _json({"errors": [{"message": "the stand-in answers only viewer to a person"}]}, 400)
            self.viewers.append(token)
            who = dict(self.people[self.user_tokens[token]]) if self.people else {}
        return _json({"data": {"viewer": who}})


def linear_settings(httpserver: HTTPServer, **more: object) -> dict[str, object]:
    """The service's settings (`api_overrides`) for a test against the stand-in Linear on
    `httpserver`: its API there, a failed post tried again after a second rather than the
    production backoff, and `more`."""
    return {
        "LINEAR_API_URL": httpserver.url_for("/graphql"),
        "DEVPILOT_BACKOFF_BASE_SECONDS": 1,
        "DEVPILOT_BACKOFF_CAP_SECONDS": 1,
        **more,
    }

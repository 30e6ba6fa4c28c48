"""A stand-in for Linear's GraphQL endpoint that checks what it is sent against Linear's published
schema (tests/linear/schema.graphql): every document must validate and its variables coerce, or the
call is answered 400 and recorded as invalid."""

from __future__ import annotations

import json
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

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


class Linear:
    """Records every valid GraphQL call; fails the first `fail` calls with HTTP 500. Answers the
    mutations the service sends, `issue(id)` from `issues` (what a test says each issue's assignee
    is; an issue not in it has none) and `labels` (its label names), and
    `issueRepositorySuggestions` from `suggestions` (per issue id, `{"owner/name" or
    "host/owner/name": confidence}`), restricted to the candidates asked about, as Linear does."""

    def __init__(self, server: HTTPServer, fail: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.invalid: list[tuple[dict[str, Any], list[str]]] = []
        self.auth: list[str] = []
        self.fail = fail
        self.issues: dict[str, dict[str, Any]] = {}
        self.labels: dict[str, list[str]] = {}
        self.suggestions: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        schema()  # built before the first request, not inside its time budget
        server.expect_request("/graphql", method="POST").respond_with_handler(self.handle)

    def answer(self, field: str, variables: dict[str, Any], n: int) -> dict[str, Any]:
        """The `data` for a valid call, the n-th one recorded."""
        if field == "agentActivityCreate":
            return {field: {"success": True, "agentActivity": {"id": f"act-{n}"}}}
        if field == "commentCreate":
            return {field: {"success": True, "comment": {"id": f"com-{n}"}}}
        if field == "issue":
            issue_id = variables["id"]
            labels = {"nodes": [{"name": name} for name in self.labels.get(issue_id, [])]}
            return {
                field: {"id": issue_id, "labels": labels, **self.issues.get(issue_id, {"assignee": None})}
            }
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

    def handle(self, request: Request) -> Response:
        body = json.loads(request.get_data())
        with self._lock:
            self.auth.append(request.headers.get("Authorization", ""))
            errors = schema_errors(body)
            if errors:
                self.invalid.append((body, errors))
                return Response(json.dumps({"errors": [{"message": m} for m in errors]}), status=400)
            if self.fail > 0:
                self.fail -= 1
                return Response("upstream trouble", status=500)
            self.calls.append(body)
            n = len(self.calls)
        data = self.answer(root_field(body), {**(body.get("variables") or {}), **root_arguments(body)}, n)
        return Response(json.dumps({"data": data}), content_type="application/json")

    def wait(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.calls) < n and not self.invalid:
            time.sleep(0.02)
        assert not self.invalid, self.invalid
        assert len(self.calls) >= n, self.calls

    def activities(self) -> list[dict[str, Any]]:
        return [c["variables"]["input"] for c in self.calls if root_field(c) == "agentActivityCreate"]

    def reads(self, field: str) -> list[dict[str, Any]]:
        """The variables of each call that asked for `field` (a read such as `issue`)."""
        return [c.get("variables") or {} for c in self.calls if root_field(c) == field]

    def asked(self, field: str) -> list[dict[str, Any]]:
        """The arguments of each call that asked for `field`, as Linear reads them."""
        return [root_arguments(c) for c in self.calls if root_field(c) == field]


class LinearOAuth(Linear):
    """Linear with OAuth: a token endpoint whose refresh tokens rotate on use (a reused one is
    refused, as Linear does), access tokens that can be expired at will (then GraphQL answers 401),
    and the `organization` query. Counts refreshes and refused refreshes."""

    ORG: ClassVar[dict[str, str]] = {"id": "org-oauth", "name": "Acme Robotics", "urlKey": "acme"}

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
        server.expect_request("/oauth/token", method="POST").respond_with_handler(self.token)

    def _issue(self) -> dict[str, Any]:
        self._n += 1
        access, self.refresh_token = f"acc-{self._n}", f"ref-{self._n}"
        self.valid.add(access)
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
        if form.get("client_id") != "client-id" or form.get("client_secret") != "client-secret":
            return Response(json.dumps({"error": "invalid_client"}), status=401)
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
        if token not in self.valid:
            self.auth.append(f"Bearer {token}")
            return Response(json.dumps({"errors": [{"message": "authentication required"}]}), status=401)
        body = json.loads(request.get_data())
        if "organization" in body["query"] and "Create" not in body["query"]:
            errors = schema_errors(body)
            if errors:
                self.invalid.append((body, errors))
                return Response(json.dumps({"errors": errors}), status=400)
            return Response(json.dumps({"data": {"organization": self.ORG}}), content_type="application/json")
        return super().handle(request)

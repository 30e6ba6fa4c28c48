"""The one route table. Every entry point reads it: the functions-framework targets
(`functions/main.py`), `devpilot serve` and the `api` target (every route by path on one URL), the
Lambda handlers (`functions/aws.py`), `deploy.sh` (`python -m functions.routes`), and the OpenAPI
and deploy tests.

Adding a route = one handler module `functions/<name>.py` with its view functions + one row below.

A row: the target name (functions-framework `--target`, Lambda handler `functions.aws.<name>`,
Cloud Run service `devpilot-<name>`), the path it is mounted at on the one-URL app, its endpoints
(a Werkzeug rule under that path, methods, who may call, the view function), and whether the
deploy script deploys it. On a cloud, each target is its own URL and serves its endpoints at that
URL's root as well as under its path.
"""

from __future__ import annotations

import sys
from typing import Literal, NamedTuple

# Who may call: anyone (the view may still check a signature), the operators' bearer token, a
# registered machine's bearer token, a machine or its agent COMMAND (a token scoped to one agent
# session), the scheduler (admin bearer, or the platform's own check on a scheduler-only service),
# or the operators' dashboard session. "poll": a machine's bearer token, checked by the view in the
# same statement as its work (the poll route: an idle machine's poll is one round trip; the ack).
# "person": a person signed in with Linear (the /me session) or one of their machines' bearer
# token, checked by the view.
Auth = Literal["public", "admin", "orchestrator", "poll", "agent", "scheduler", "dashboard", "person"]


class Endpoint(NamedTuple):
    rule: str  # Werkzeug rule under the route's path; "" is the path itself
    methods: tuple[str, ...]
    auth: Auth
    view: str  # a function of the route's module


class Route(NamedTuple):
    name: str
    path: str
    endpoints: tuple[Endpoint, ...]
    deployed: bool = True

    @property
    def module(self) -> str:
        return f"functions.{self.name}"

    @property
    def scheduler_only(self) -> bool:
        """Deployed without public access: only the platform's scheduler may invoke it."""
        return all(e.auth == "scheduler" for e in self.endpoints)


def one(name: str, path: str, methods: tuple[str, ...], auth: Auth, *, deployed: bool = True) -> Route:
    """A route with a single endpoint whose view is named like the route."""
    return Route(name, path, (Endpoint("", methods, auth, name),), deployed)


ROUTES: tuple[Route, ...] = (
    one("webhook", "/webhook", ("POST",), "public"),  # Linear's signature is checked by the view
    one("claim", "/claim", ("POST",), "poll"),
    one("ack", "/ack", ("POST",), "poll"),
    one("release", "/release", ("POST",), "orchestrator"),
    one("sweep", "/sweep", ("POST",), "scheduler"),
    Route(
        "orchestrators",
        "/orchestrators",
        (
            Endpoint("", ("GET",), "admin", "list_orchestrators"),
            Endpoint("", ("POST",), "admin", "register"),
            Endpoint("/<uuid:orchestrator_id>/revoke", ("POST",), "admin", "revoke"),
        ),
    ),
    one("realtime_token", "/realtime-token", ("POST",), "orchestrator"),
    one("machine", "/machine", ("POST",), "orchestrator"),
    Route(
        "activities",
        "/activities",
        (
            Endpoint("", ("POST",), "agent", "activities"),
            Endpoint("", ("GET",), "agent", "list_activities"),
        ),
    ),
    Route(
        "oauth",
        "/oauth",
        (
            Endpoint("/install", ("GET",), "public", "install"),
            Endpoint("/callback", ("GET",), "public", "callback"),
        ),
    ),
    one("healthz", "/healthz", ("GET", "HEAD"), "public"),
    one("metrics", "/metrics", ("GET",), "admin"),
    Route(
        "dashboard",
        "/dashboard",
        (
            Endpoint("", ("GET", "HEAD"), "dashboard", "dashboard"),
            Endpoint("/login", ("GET",), "public", "login_form"),
            Endpoint("/login", ("POST",), "public", "login"),
            Endpoint("/logout", ("POST",), "public", "logout"),
        ),
    ),
    one("plan", "/plan", ("POST",), "agent"),
    Route(
        "sessions",
        "/sessions",
        (
            Endpoint("", ("GET",), "dashboard", "search"),
            Endpoint("/<uuid:session_id>", ("GET",), "dashboard", "show"),
            Endpoint("/<uuid:session_id>/retry", ("POST",), "dashboard", "retry"),
            Endpoint("/<uuid:session_id>/cancel", ("POST",), "dashboard", "cancel"),
            Endpoint("/<uuid:session_id>/move", ("POST",), "dashboard", "move"),
        ),
    ),
    Route(
        "enroll",
        "/enroll",
        (
            Endpoint("", ("GET",), "public", "code_form"),
            Endpoint("", ("POST",), "public", "enter_code"),
            Endpoint("/sessions", ("POST",), "public", "create"),  # rate-limited per client
            Endpoint("/start", ("GET",), "public", "start"),
            Endpoint("/callback", ("GET",), "public", "callback"),
            Endpoint("/confirm", ("POST",), "public", "confirm"),
            Endpoint("/token", ("POST",), "public", "token"),  # the machine's PKCE verifier is its proof
        ),
    ),
    Route(
        "me",
        "/me",
        (
            Endpoint("", ("GET",), "person", "me"),
            Endpoint("/signin", ("GET",), "public", "signin"),
            Endpoint("/orchestrators/<uuid:orchestrator_id>/revoke", ("POST",), "person", "revoke"),
            Endpoint("/logout", ("POST",), "person", "logout"),
        ),
    ),
    Route(
        "linear_credentials",
        "/linear-credentials",
        (
            Endpoint("", ("GET",), "admin", "list_credentials"),
            Endpoint("", ("POST",), "admin", "store"),
            Endpoint("/<org_id>", ("DELETE",), "admin", "forget"),
        ),
    ),
)
BY_NAME = {r.name: r for r in ROUTES}


def deployed_targets(shape: str = "routes") -> list[tuple[str, str]]:
    """What a deploy creates, as (target, exposure): each deployed route its own function
    ("routes"), or the `api` target serving every route by path on one URL plus the scheduler-only
    routes on their own ("api", for those who want one URL)."""
    if shape == "api":
        return [("api", "public")] + [
            (r.name, "scheduler") for r in ROUTES if r.deployed and r.scheduler_only
        ]
    return [(r.name, "scheduler" if r.scheduler_only else "public") for r in ROUTES if r.deployed]


def main(argv: list[str]) -> int:
    """`python -m functions.routes [--deployed] [--shape routes|api]`: one line per target,
    `<name> <public|scheduler>` (what deploy.sh reads)."""
    shape = argv[argv.index("--shape") + 1] if "--shape" in argv else "routes"
    if "--deployed" in argv or shape == "api":
        lines = deployed_targets(shape)
    else:
        lines = [(r.name, "scheduler" if r.scheduler_only else "public") for r in ROUTES]
    for name, exposure in lines:
        print(name, exposure)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

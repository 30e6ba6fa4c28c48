"""What Linear asks of an agent beyond its activities (its agent-best-practices page), as outbox
posts: each row of `linear_notices` of these kinds is one step, decided when it is posted.

- `issue_started`: the issue moves to its team's first `started` state (lowest position), unless
  its state type is `started`, `completed` or `canceled` already (read first).
- `delegate`: the app sets itself as the issue's delegate when the issue has none (read first).
- `external_urls`: the agent session links to its page here (`agentSessionUpdate`).
- `plan`: the agent's plan (`agentSessionUpdate`): the whole list of steps, each `{content,
  status}` with status `pending`, `inProgress`, `completed` or `canceled`, replacing the last one.
- `session_create`: a plain assignment gets an agent session of its own
  (`agentSessionCreateOnIssue`, with the link). Linear takes no id of ours for it, so a retry first
  looks for the session an earlier attempt may have opened (by its link) before opening another.

Each step is idempotent as Linear sees it (a read before a write, or a write of the same value)
and says what it did; Linear's refusal raises `Refused`, which the outbox retries and gives up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.linear import api as linear_api

Post = Callable[[str, dict[str, Any]], dict[str, Any]]  # GraphQL document, variables -> `data`

KINDS = ("issue_started", "delegate", "external_urls", "plan", "session_create")
ALIAS_PREFIX = "devpilot:"  # a plain assignment's conversation, until Linear names its agent session
NOT_MOVED = ("started", "completed", "canceled")

ISSUE_STATE = """query DevpilotIssueState($id: String!) {
  issue(id: $id) {
    id
    state { id type }
    team { id states(filter: { type: { eq: "started" } }) { nodes { id name position } } }
  }
}"""
ISSUE_DELEGATE = """query DevpilotIssueDelegate($id: String!) {
  issue(id: $id) { id delegate { id } }
}"""
ISSUE_UPDATE = """mutation DevpilotIssueUpdate($id: String!, $input: IssueUpdateInput!) {
  issueUpdate(id: $id, input: $input) { success }
}"""
SESSION_UPDATE = """mutation DevpilotAgentSessionUpdate($id: String!, $input: AgentSessionUpdateInput!) {
  agentSessionUpdate(id: $id, input: $input) { success }
}"""
SESSION_CREATE = """mutation DevpilotAgentSessionCreateOnIssue($input: AgentSessionCreateOnIssue!) {
  agentSessionCreateOnIssue(input: $input) { success agentSession { id } }
}"""
ISSUE_SESSIONS = """query DevpilotIssueAgentSessions($id: String!) {
  issue(id: $id) { id agentSessions(first: 50) { nodes { id externalLinks { url } } } }
}"""


# Linear refused the step (its answer is the message): retried, then given up.
Refused = linear_api.Refused


def is_alias(agent_session_id: str | None) -> bool:
    return bool(agent_session_id) and str(agent_session_id).startswith(ALIAS_PREFIX)


def _ok(data: dict[str, Any], field: str) -> dict[str, Any]:
    result = data.get(field)
    if not isinstance(result, dict) or not result.get("success"):
        raise Refused(f"Linear did not confirm {field}: {str(result)[:200]}")
    return result


def perform(row: dict[str, Any], post: Post) -> str:
    """Do one step; returns what to record as Linear's answer (an id, or what was decided)."""
    kind, content = row["kind"], row.get("content") or {}
    agent_session_id = row.get("agent_session_id")
    if kind in ("external_urls", "plan") and is_alias(agent_session_id):
        raise Refused("no agent session in Linear to update yet")
    if kind == "issue_started":
        return _move_to_started(row["issue_id"], post)
    if kind == "delegate":
        return _delegate(row["issue_id"], str(content["delegateId"]), post)
    if kind == "external_urls":
        _ok(
            post(
                SESSION_UPDATE, {"id": agent_session_id, "input": {"externalUrls": content["externalUrls"]}}
            ),
            "agentSessionUpdate",
        )
        return "linked"
    if kind == "plan":
        _ok(
            post(SESSION_UPDATE, {"id": agent_session_id, "input": {"plan": content["plan"]}}),
            "agentSessionUpdate",
        )
        return "planned"
    if kind == "session_create":
        return _open_session(row, post)
    raise ValueError(f"not a step: {kind}")


def _move_to_started(issue_id: str, post: Post) -> str:
    issue = post(ISSUE_STATE, {"id": issue_id}).get("issue")
    if not isinstance(issue, dict):
        raise Refused("Linear does not know this issue")
    if (issue.get("state") or {}).get("type") in NOT_MOVED:
        return "unchanged"
    states = (((issue.get("team") or {}).get("states") or {}).get("nodes")) or []
    started = [s for s in states if isinstance(s, dict) and s.get("id")]
    if not started:
        return "no started state"
    first = min(started, key=lambda s: float(s.get("position") or 0))
    _ok(post(ISSUE_UPDATE, {"id": issue_id, "input": {"stateId": first["id"]}}), "issueUpdate")
    return f"state {first['id']}"


def _delegate(issue_id: str, app_user_id: str, post: Post) -> str:
    issue = post(ISSUE_DELEGATE, {"id": issue_id}).get("issue")
    if not isinstance(issue, dict):
        raise Refused("Linear does not know this issue")
    if issue.get("delegate"):
        return "unchanged"
    _ok(post(ISSUE_UPDATE, {"id": issue_id, "input": {"delegateId": app_user_id}}), "issueUpdate")
    return f"delegate {app_user_id}"


def _open_session(row: dict[str, Any], post: Post) -> str:
    urls = (row.get("content") or {}).get("externalUrls") or []
    if row.get("attempts", 1) > 1 and urls:
        found = _opened_before(row["issue_id"], urls[0]["url"], post)
        if found is not None:
            return found
    payload: dict[str, Any] = {"issueId": row["issue_id"]}
    if urls:
        payload["externalUrls"] = urls
    created = _ok(post(SESSION_CREATE, {"input": payload}), "agentSessionCreateOnIssue")
    sid = (created.get("agentSession") or {}).get("id")
    if not isinstance(sid, str) or not sid:
        raise Refused("Linear opened no agent session")
    return sid


def _opened_before(issue_id: str, url: str, post: Post) -> str | None:
    """The agent session an earlier attempt opened (its answer lost), found by its link to us. A
    refusal to say (the field is Linear's internal one) is no answer: a new one is opened."""
    try:
        issue = post(ISSUE_SESSIONS, {"id": issue_id}).get("issue") or {}
    except linear_api.RateLimited:
        raise  # (a wait, not an answer: the create waits with it)
    except Refused:
        return None
    for node in ((issue.get("agentSessions") or {}).get("nodes")) or []:
        if any((link or {}).get("url") == url for link in node.get("externalLinks") or []):
            return str(node["id"])
    return None

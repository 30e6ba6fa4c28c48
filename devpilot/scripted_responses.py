"""A scripted stand-in for the OpenAI Responses API on 127.0.0.1, so the real `codex` CLI runs
offline (a model provider of its own, `codex_config`): in `devpilot demo --agent codex` and in the
tests.

`POST /v1/responses` answers each request from a script, streamed as server-sent events the way
the API documents them and codex reads them: `response.created`, then per output item
`response.output_item.added` (with `response.output_text.delta` for a message) and
`response.output_item.done` (the item codex acts on: it runs a tool call at once), then
`response.completed` with the response's id. A reply may hold its stream open before completing
(a turn in flight: codex sends its next request at once when it has the person's words to add,
`turn/steer`), answer with an HTTP error instead, or break off before completing. A request with
another API key than the expected one gets a 401 `invalid_api_key`, as the API answers a bad key.
Every request is recorded (each carries the whole conversation: codex keeps no state on the API),
so a test can see what codex sent.

A script is a function of the request to its `Reply`. Not part of the service: nothing under
`functions/` or `shared/` imports it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from devpilot.scripted_model import Recorded, ScriptedServer, send_events, send_json

KEY = "sk-devpilot-scripted"  # the key the stand-in accepts (not a secret)
KEY_ENV = "DEVPILOT_SCRIPTED_API_KEY"  # where codex's model provider reads it from
PROVIDER = "scripted"  # the provider's id: a thread resumes only with the provider it began with
# A model codex knows (its bundled catalog) with the classic tools: exec_command, apply_patch.
MODEL = "gpt-5.5"
TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")
# What codex adds to the conversation as user messages of its own.
CONTEXT = ("<environment_context>", "<turn_aborted>", "<user_instructions>", "# AGENTS.md")


@dataclass(frozen=True)
class Message:
    text: str


@dataclass(frozen=True)
class Reasoning:
    summary: str


@dataclass(frozen=True)
class Call:
    """A function call codex runs: `exec_command` ({"cmd": …}), `update_plan` ({"plan": […]})."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Patch:
    """An `apply_patch` call (codex's freeform tool): the patch's text."""

    patch: str


Item = Message | Reasoning | Call | Patch


@dataclass(frozen=True)
class Reply:
    items: list[Item] = field(default_factory=list)
    hold: float = 0.0  # seconds the stream stays open before it completes (ends early if codex leaves)
    status: int = 200  # else: an HTTP error with `error` as its message
    error: str = ""
    drop: bool = False  # the stream ends before response.completed


Script = Callable[[dict[str, Any]], Reply]


def codex_config(url: str, env_key: str | None = KEY_ENV) -> str:
    """A CODEX_HOME's config.toml that makes codex talk to the stand-in at `url` (its model provider,
    keyed from `env_key`), give up on a failing request at once, and keep its startup offline."""
    key = f'env_key = "{env_key}"\n' if env_key else ""
    return (
        f'model = "{MODEL}"\nmodel_provider = "{PROVIDER}"\n\n'
        f'[model_providers.{PROVIDER}]\nname = "Scripted stand-in"\nbase_url = "{url}/v1"\n'
        f'wire_api = "responses"\n{key}request_max_retries = 0\nstream_max_retries = 0\n\n'
        "[features]\nplugins = false\nremote_plugin = false\napps = false\n\n[analytics]\nenabled = false\n"
    )


def conversation(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's input items: the whole thread so far."""
    return [i for i in request.get("input") or [] if isinstance(i, dict)]


def texts(request: dict[str, Any]) -> str:
    """Every text a request carries (instructions, messages, tool outputs), as one string: what tests
    search for a follow-up or the earlier turns."""
    return json.dumps(conversation(request))


def said_by(item: dict[str, Any], role: str) -> str:
    if item.get("type", "message") != "message" or item.get("role") != role:
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(str(c.get("text") or "") for c in content or [] if isinstance(c, dict))


def personal(item: dict[str, Any]) -> str:
    """A user message's text, unless it is codex's own context (`<environment_context>`, …)."""
    text = said_by(item, "user")
    return "" if text.lstrip().startswith(CONTEXT) else text


def last_user_text(request: dict[str, Any]) -> str:
    """The newest words of the person."""
    return next((t for i in reversed(conversation(request)) if (t := personal(i))), "")


def outputs(request: dict[str, Any]) -> list[str]:
    """The outputs of the tool calls, in order (what codex told the model its tools did)."""
    out = []
    for item in conversation(request):
        if item.get("type") in TOOL_OUTPUTS:
            given = item.get("output")
            out.append(given if isinstance(given, str) else json.dumps(given))
    return out


def step(request: dict[str, Any]) -> int:
    """How far the turn is: the tool results codex sent back since the person's last words."""
    items = conversation(request)
    last = max((n for n, i in enumerate(items) if personal(i)), default=-1)
    return sum(1 for i in items[last + 1 :] if i.get("type") in TOOL_OUTPUTS)


class ScriptedResponses(ScriptedServer[Script]):
    def __init__(self, script: Script, key: str = KEY) -> None:
        super().__init__(script, key)

    def post(self, handler: BaseHTTPRequestHandler, path: str, seen: Recorded, size: int) -> None:
        body = seen.body
        if not path.endswith("/responses") or not isinstance(body, dict):
            return send_json(handler, 404, {"error": {"type": "not_found", "message": path}})
        if handler.headers.get("Authorization") != f"Bearer {self.key}":
            shown = (handler.headers.get("Authorization") or "").removeprefix("Bearer ")[:8]
            error = {
                "message": f"Incorrect API key provided: {shown}…",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
            return send_json(handler, 401, {"error": error})
        reply = self.script(body)
        if reply.status != 200:
            return send_json(
                handler, reply.status, {"error": {"message": reply.error, "type": "server_error"}}
            )
        response = f"resp_{next(self._ids)}"
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "response": {"id": response}})
        ]
        for n, given in enumerate(reply.items):
            item = self._item(given)
            events.append(
                (
                    "response.output_item.added",
                    {"type": "response.output_item.added", "output_index": n, "item": item},
                )
            )
            if isinstance(given, Message):
                delta = {"type": "response.output_text.delta", "output_index": n, "content_index": 0}
                events.append(
                    ("response.output_text.delta", {**delta, "item_id": item["id"], "delta": given.text})
                )
            events.append(
                (
                    "response.output_item.done",
                    {"type": "response.output_item.done", "output_index": n, "item": item},
                )
            )
        send_events(handler, events)
        if reply.drop:
            return
        try:
            until = time.monotonic() + reply.hold
            while time.monotonic() < until:  # (a comment every 0.1 s: writing fails once codex left)
                handler.wfile.write(b": held\n\n")
                handler.wfile.flush()
                time.sleep(0.1)
            usage = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
            done = {"type": "response.completed", "response": {"id": response, "usage": usage}}
            handler.wfile.write(f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode())
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _item(self, given: Item) -> dict[str, Any]:
        n = next(self._ids)
        if isinstance(given, Message):
            content = [{"type": "output_text", "text": given.text, "annotations": []}]
            return {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{n}",
                "status": "completed",
                "content": content,
            }
        if isinstance(given, Reasoning):
            return {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [{"type": "summary_text", "text": given.summary}],
            }
        if isinstance(given, Call):
            arguments = json.dumps(given.arguments)
            return {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": given.name,
                "arguments": arguments,
                "status": "completed",
            }
        return {
            "type": "custom_tool_call",
            "id": f"ctc_{n}",
            "call_id": f"call_{n}",
            "name": "apply_patch",
            "input": given.patch,
            "status": "completed",
        }

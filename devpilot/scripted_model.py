"""A scripted stand-in for Anthropic's Messages API on 127.0.0.1, so the real `claude` CLI runs
offline (`ANTHROPIC_BASE_URL`): in `devpilot demo --agent claude` and in the tests.

`POST /v1/messages` answers the agent's requests (those that offer it tools) from a script, one
reply per request, streamed as server-sent events exactly as the API documents them:
`message_start`, then per content block `content_block_start` / `content_block_delta`
(`text_delta`, or `input_json_delta` for a tool call's input) / `content_block_stop`, then
`message_delta` (the `stop_reason`: `tool_use` or `end_turn`) and `message_stop`. A request
without tools (a title, a summary) gets a short text; `/v1/messages/count_tokens` a count; a
request with another API key than the expected one a 401 `authentication_error`, as the API
answers a bad key. Every request is recorded, so a test can see what the CLI sent.

A script is a function of the request (the messages so far) to the reply's blocks, or a list of
replies taken in order. Not part of the service: nothing under `functions/` or `shared/` imports it.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, TypeVar

KEY = "sk-ant-devpilot-scripted"  # the key the stand-in accepts (not a secret)


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = ""


Block = Text | ToolUse
Script = Callable[[dict[str, Any]], list[Block]]


def in_order(replies: list[list[Block]], then: list[Block] | None = None) -> Script:
    """A script that answers the agent's requests with `replies` in turn, then with `then` (a
    short text by default)."""
    taken = itertools.count()
    lock = threading.Lock()

    def script(request: dict[str, Any]) -> list[Block]:
        with lock:
            n = next(taken)
        return replies[n] if n < len(replies) else (then or [Text("(the script has no more replies)")])

    return script


def texts(request: dict[str, Any]) -> str:
    """Every text a request carries (messages, tool results, the system prompt), as one string:
    what tests search for the follow-up or the earlier turns."""
    return json.dumps(request.get("messages") or [])


def last_user_text(request: dict[str, Any]) -> str:
    """The text of the newest user message (its text blocks and tool results)."""
    for message in reversed(request.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        parts = []
        for block in content or []:
            if block.get("type") == "text":
                parts.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                parts.append(inner if isinstance(inner, str) else json.dumps(inner))
        return "\n".join(parts)
    return ""


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def agent(self) -> bool:
        """A request of the agent's loop (it offers tools), not a side call."""
        return isinstance(self.body, dict) and bool(self.body.get("tools"))


S = TypeVar("S")  # a stand-in's script


class ScriptedServer(Generic[S]):
    """What the stand-ins of the models' APIs share: an HTTP server on 127.0.0.1 in a thread of its
    own, each request recorded, then answered by `post` from the script (JSON or server-sent
    events); GET is 404. `key`: the API key it accepts."""

    def __init__(self, script: S, key: str) -> None:
        self.script = script
        self.key = key
        self.requests: list[Recorded] = []
        self._ids = itertools.count(1)
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                stand_in._record(self, None)
                send_json(self, 404, {"error": {"type": "not_found_error", "message": self.path}})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                path = self.path.split("?", 1)[0]
                stand_in.post(self, path, stand_in._record(self, body), len(raw))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def post(self, handler: BaseHTTPRequestHandler, path: str, seen: Recorded, size: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def agent_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in list(self.requests) if r.agent]

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> Recorded:
        seen = Recorded(handler.command, handler.path, dict(handler.headers.items()), body)
        self.requests.append(seen)
        return seen


def send_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_events(handler: BaseHTTPRequestHandler, events: list[tuple[str, dict[str, Any]]]) -> None:
    """Server-sent events on a stream the server closes after them."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    for event, data in events:
        handler.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
    handler.wfile.flush()


class ScriptedModel(ScriptedServer[Script]):
    def __init__(self, script: Script, key: str = KEY) -> None:
        super().__init__(script, key)

    def post(self, handler: BaseHTTPRequestHandler, path: str, seen: Recorded, size: int) -> None:
        body = seen.body
        if handler.headers.get("x-api-key") != self.key:
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return send_json(handler, 401, {"type": "error", "error": error, "request_id": "req_standin"})
        if path == "/v1/messages/count_tokens":
            return send_json(handler, 200, {"input_tokens": size // 4})
        if path != "/v1/messages" or not isinstance(body, dict):
            return send_json(
                handler, 404, {"type": "error", "error": {"type": "not_found_error", "message": path}}
            )
        blocks: list[Block] = self.script(body) if seen.agent else [Text("Scripted reply.")]
        if body.get("stream"):
            send_events(handler, self._events(body, blocks))
        else:
            send_json(handler, 200, self._message(body, blocks))

    def _usage(self) -> dict[str, int]:
        return {"input_tokens": 10, "output_tokens": 10}

    def _message(self, request: dict[str, Any], blocks: list[Block]) -> dict[str, Any]:
        content = [self._block(b, n) for n, b in enumerate(blocks)]
        return {
            "id": f"msg_standin_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": content,
            "stop_reason": "tool_use" if any(isinstance(b, ToolUse) for b in blocks) else "end_turn",
            "stop_sequence": None,
            "usage": self._usage(),
        }

    def _block(self, block: Block, n: int) -> dict[str, Any]:
        if isinstance(block, Text):
            return {"type": "text", "text": block.text}
        return {
            "type": "tool_use",
            "id": block.id or f"toolu_standin_{n}_{next(self._ids)}",
            "name": block.name,
            "input": block.input,
        }

    def _events(self, request: dict[str, Any], blocks: list[Block]) -> list[tuple[str, dict[str, Any]]]:
        message = self._message(request, blocks)
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
            )
        ]
        for n, block in enumerate(message["content"]):
            start: dict[str, Any]
            delta: dict[str, Any]
            if block["type"] == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            else:
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [
                ("content_block_start", {"type": "content_block_start", "index": n, "content_block": start}),
                ("content_block_delta", {"type": "content_block_delta", "index": n, "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": n}),
            ]
        stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
        events += [
            ("message_delta", {"type": "message_delta", "delta": stop, "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        return events

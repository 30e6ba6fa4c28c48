"""Structured logs: JSON objects off a terminal, `key=value` text on one (every entry point)."""

from __future__ import annotations

import json
import logging
import sys
import time


class Fields(dict[str, object]):
    """A structured log line: `log.info("%s", Fields(...))`. Our formatter takes the fields as they
    are (one JSON encoding per line, not an encode here and a decode-and-encode in the handler);
    any other handler sees the JSON text, made only if it asks."""

    def __str__(self) -> str:
        return json.dumps(self, separators=(",", ":"), default=str)


class StructuredFormatter(logging.Formatter):
    """Every line structured: JSON objects when not on a terminal (request lines are already JSON;
    other records are wrapped), `key=value` text on a terminal."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: object = record.args  # (logging unwraps a lone mapping argument)
        if not isinstance(fields, Fields):
            msg = record.getMessage()
            try:
                fields = json.loads(msg) if msg.startswith("{") else None
            except json.JSONDecodeError:
                fields = None
        if not isinstance(fields, dict):
            fields = {"msg": record.getMessage()}
        fields = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            **fields,
        }
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.as_json:
            return json.dumps(fields, separators=(",", ":"), default=str)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("ts", "level", "logger", "msg"))
        return f"{stamp} {fields['level']:<7} {fields.get('msg', '')} {rest}".rstrip()


def setup_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger("devpilot")
    if not root.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(StructuredFormatter(as_json=not sys.stderr.isatty()))
        root.addHandler(h)
        root.setLevel(level)
        root.propagate = False

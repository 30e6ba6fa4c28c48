"""Human log lines by default (`claimed ENG-123 (attempt 2)`), JSON lines with --json-logs."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class Log:
    def __init__(self, json_lines: bool = False) -> None:
        self.json_lines = json_lines

    def __call__(self, event: str, text: str, **fields: Any) -> None:
        if self.json_lines:
            line = json.dumps(
                {"ts": round(time.time(), 3), "event": event, "msg": text, **fields},
                separators=(",", ":"),
                default=str,
            )
        else:
            line = f"{time.strftime('%H:%M:%S')} {text}"
        print(line, file=sys.stderr, flush=True)

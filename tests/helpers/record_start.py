"""The COMMAND of orchestrator tests: appends what it was started with to a file, one JSON line."""

from __future__ import annotations

import json
import os
import sys

message = json.load(sys.stdin)
line = json.dumps(
    {
        "messageId": message["messageId"],
        "env": {k: v for k, v in os.environ.items() if k.startswith("DEVPILOT_")},
        "identifier": message["issue"]["identifier"],
        "prompt": message.get("prompt"),
    }
)
with open(sys.argv[1], "a", encoding="utf-8") as f:
    f.write(line + "\n")
    f.flush()
    os.fsync(f.fileno())

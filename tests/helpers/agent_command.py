"""The COMMAND of conversation tests: records how it was started (one JSON line in argv[1]), then
acts on the prompt: "talk" posts a thought through `devpilot-orchestrator activity` and exits 0;
"fail" writes to stderr and exits 3; "sleep" runs until it is stopped; anything else exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

message = json.load(sys.stdin)
record = {
    "messageId": message["messageId"],
    "kind": message["kind"],
    "pid": os.getpid(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("DEVPILOT_")},
    "allEnv": dict(os.environ),
}
with open(sys.argv[1], "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")
    f.flush()
    os.fsync(f.fileno())
prompt = os.environ.get("DEVPILOT_PROMPT", "")
if "talk" in prompt:
    subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "activity", "--type", "thought", f"working on: {prompt}"],
        check=True,
    )
elif "fail" in prompt:
    print("boom: the build is broken", file=sys.stderr, flush=True)
    sys.exit(3)
elif "sleep" in prompt:
    time.sleep(120)

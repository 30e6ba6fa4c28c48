"""The COMMAND of conversation tests: records how it was started (one JSON line in argv[1]: its pid,
message, environment, working directory, and the transcript and inbox it found), then acts on what
it was asked (DEVPILOT_PROMPT):
- "[talk]": posts a thought through `devpilot-orchestrator activity` and exits 0;
- "[ask]": asks with Linear's select signal (`activity --select`) and exits 0;
- "[listen]" (or "[listen:N]"): once N files (1) are in its inbox (DEVPILOT_INBOX), reads it for up
  to 30 s, recording each follow-up it takes (one JSON line each, then the file removed), until one
  says "[done]"; then answers and exits 0;
- "[fail]": writes to stderr and exits 3; "[sleep]": runs until it is stopped; "[detach]": the same,
  having started `sleep` in a session of its own (as codex runs a shell command); anything else
  exits 0;
- "[hold]" (before any of the above): waits (up to 60 s) for `<argv[1]>.release` to exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

out = sys.argv[1]


def record(entry: dict[str, object]) -> None:
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def activity(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "activity", *args], check=True)


message = json.load(sys.stdin)
transcript = os.environ.get("DEVPILOT_TRANSCRIPT", "")
inbox = os.environ.get("DEVPILOT_INBOX", "")
record(
    {
        "messageId": message["messageId"],
        "kind": message["kind"],
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith("DEVPILOT_")},
        "allEnv": dict(os.environ),
        "transcript": [json.loads(line) for line in Path(transcript).read_text().splitlines()]
        if transcript and Path(transcript).exists()
        else [],
        "inbox": sorted(p.name for p in Path(inbox).iterdir()) if inbox else [],
    }
)
prompt = os.environ.get("DEVPILOT_PROMPT", "")
if "[hold]" in prompt:
    held = time.monotonic() + 60
    while not Path(f"{out}.release").exists() and time.monotonic() < held:
        time.sleep(0.05)
if "[talk]" in prompt:
    activity("--type", "thought", f"working on: {prompt}")
elif "[ask]" in prompt:
    activity("--select", "Postgres", "--select", "SQLite", "Which database?")
elif "[listen" in prompt:
    first = int(prompt.split("[listen:", 1)[1].split("]", 1)[0]) if "[listen:" in prompt else 1
    deadline, done, seen = time.monotonic() + 30, False, 0
    while len(list(Path(inbox).glob("*.json"))) < first and time.monotonic() < deadline:
        time.sleep(0.05)  # (the follow-ups wait for the test to have sent them all)
    while not done and time.monotonic() < deadline:
        for path in sorted(Path(inbox).glob("*.json")):
            follow_up = json.loads(path.read_text())
            body = (follow_up.get("prompt") or {}).get("body") or ""
            record({"pid": os.getpid(), "read": follow_up["messageId"], "body": body, "file": path.name})
            path.unlink()
            seen += 1
            done = done or "[done]" in body
        time.sleep(0.05)
    activity("--type", "response", f"read {seen} follow-up(s)")
elif "[fail]" in prompt:
    print("boom: the build is broken", file=sys.stderr, flush=True)
    sys.exit(3)
elif "[sleep]" in prompt:
    time.sleep(120)
elif "[detach]" in prompt:
    subprocess.Popen(["sleep", "120"], start_new_session=True)
    time.sleep(120)

"""A stand-in for the `gcloud` commands deploy.sh runs, keeping what they create in a JSON file.

It answers the way gcloud does where deploy.sh depends on it: `create` of a service account or a
scheduler job that exists fails ("already exists"), `update` of a job that does not exist fails,
`describe` fails for what does not exist, and `run deploy` creates a service or adds a revision to
it. Every call is appended to the state's log. State file: $GCLOUD_STANDIN_STATE.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def main(args: list[str]) -> int:
    path = Path(os.environ["GCLOUD_STANDIN_STATE"])
    state: dict[str, Any] = (
        json.loads(path.read_text())
        if path.exists()
        else {"accounts": [], "services": {}, "jobs": {}, "calls": []}
    )
    state["calls"].append(args)
    code = _apply(state, args)
    path.write_text(json.dumps(state))
    return code


def _fail(message: str) -> int:
    print(f"ERROR: (gcloud) {message}", file=sys.stderr)
    return 1


def _apply(state: dict[str, Any], args: list[str]) -> int:
    project = _flag(args, "--project") or ""
    match args[:3]:
        case ["services", "enable", *_]:
            return 0
        case ["iam", "service-accounts", "describe"]:
            return 0 if args[3] in state["accounts"] else _fail(f"NOT_FOUND: {args[3]}")
        case ["iam", "service-accounts", "create"]:
            email = f"{args[3]}@{project}.iam.gserviceaccount.com"
            if email in state["accounts"]:
                return _fail(f"ALREADY_EXISTS: Service account {args[3]} already exists within project")
            state["accounts"].append(email)
            return 0
        case ["secrets", "add-iam-policy-binding", *_]:
            return 0
        case ["run", "deploy", name]:  # creates the service, or deploys a new revision of it
            service = state["services"].setdefault(name, {"revisions": 0, "function": None})
            service["revisions"] += 1
            service["function"] = _flag(args, "--function")
            return 0
        case ["run", "services", "add-iam-policy-binding"]:
            return 0 if args[3] in state["services"] else _fail(f"NOT_FOUND: service {args[3]}")
        case ["run", "services", "describe"]:
            if args[3] not in state["services"]:
                return _fail(f"NOT_FOUND: service {args[3]}")
            print(f"https://{args[3]}-abc123.a.run.app")
            return 0
        case ["scheduler", "jobs", "describe"]:
            return 0 if args[3] in state["jobs"] else _fail(f"NOT_FOUND: job {args[3]}")
        case ["scheduler", "jobs", "create"]:
            if args[4] in state["jobs"]:
                return _fail(f"ALREADY_EXISTS: job {args[4]}")
            state["jobs"][args[4]] = {"uri": _flag(args, "--uri"), "updates": 0}
            return 0
        case ["scheduler", "jobs", "update"]:
            if args[4] not in state["jobs"]:
                return _fail(f"NOT_FOUND: job {args[4]}")
            state["jobs"][args[4]].update(
                uri=_flag(args, "--uri"), updates=state["jobs"][args[4]]["updates"] + 1
            )
            return 0
    return _fail(f"the stand-in does not know: gcloud {' '.join(args)}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A child process that enqueues one dispatch and waits to be SIGKILLed at a chosen point.

Usage: python -m tests.helpers.enqueue_child URL ORG ORCHESTRATOR_ID before-commit|after-commit
Prints "READY <session id>" when it has reached the point, then sleeps until killed.
"""

from __future__ import annotations

import sys
import time
from uuid import UUID

from shared.delivery.models import DispatchPayload
from shared.delivery.queue import enqueue_dispatch
from shared.plumbing.db import connect, transaction
from shared.wire.messages import IssueRef


def main() -> None:
    url, org, orch, point = sys.argv[1], sys.argv[2], UUID(sys.argv[3]), sys.argv[4]
    iss = IssueRef(id="issue-crash", identifier="ENG-1", title="crash")
    with connect(url) as conn:
        with transaction(conn) as tx:
            sid = enqueue_dispatch(
                tx, org_id=org, orchestrator_id=orch, linear_user_id=None, message=DispatchPayload(issue=iss)
            ).session_id
            if point == "before-commit":
                print(f"READY {sid}", flush=True)
                time.sleep(600)
        print(f"READY {sid}", flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()

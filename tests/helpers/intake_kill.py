"""Runs one webhook intake and SIGKILLs itself right after the K-th statement of its transaction
(run by the server: one sent in a pipeline is waited for first).

Test-only instrumentation from outside: it wraps `Tx.execute` in this child process alone; the
product has no hook that could be switched on in production.
Usage: python -m tests.helpers.intake_kill URL DELIVERY_KEY K BODY_JSON
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from shared.delivery.intake import receive
from shared.linear.webhooks import parse
from shared.plumbing import db
from shared.plumbing.settings import Settings


def main() -> None:
    url, key, k, body = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    original = db.Tx.execute
    count = [0]

    def counting(self: db.Tx, query: Any, params: Any = None) -> Any:
        result = original(self, query, params)
        count[0] += 1
        if count[0] == k:
            # In a pipeline (`shared.plumbing.db.together`) the statement is only queued: have the server run
            # it (and every one before it) first, so the kill lands inside the open transaction.
            # (A statement that is its own transaction has ended, and committed, by now.)
            pipeline = None if self._single else self.conn._pipeline
            if pipeline is not None:
                pipeline.sync()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    db.Tx.execute = counting  # type: ignore[method-assign]
    pool = db.open_pool(url, Settings(), max_size=1)
    answer = receive(pool, parse(body.encode()), key).answer
    print(json.dumps({"statements": count[0], "answer": answer}), flush=True)


if __name__ == "__main__":
    main()

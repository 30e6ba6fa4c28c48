"""A claiming process for contention tests: claims until the queue is empty, prints what it got."""

from __future__ import annotations

import json
import random
import sys
from uuid import UUID

from shared.delivery.queue import claim
from shared.plumbing.db import open_pool
from shared.plumbing.settings import Settings


def main() -> None:
    url, orch, seed = sys.argv[1], UUID(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    pool = open_pool(url, Settings(), min_size=1, max_size=1)
    got: list[list[str]] = []
    empties = 0
    print("GO", flush=True)
    sys.stdin.readline()  # start together
    while empties < 3:
        batch = claim(pool, orch, max=rng.choice([1, 5, 10, 50]), lease_seconds=3600)
        if not batch:
            empties += 1
            continue
        empties = 0
        got.extend([str(m.queue_id), str(m.claim_token)] for m in batch)
    pool.close()
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()

"""devpilot-dispatch: the service's library, which the functions, the command line and the
sweep share. The delivery guarantee is the `dispatch_queue` table (`shared.delivery.queue`).

`dispatch.py` is the service layer every entry point calls; below it, one folder per concern, each
a room whose `__init__.py` says what it owns and what it may import (tests/unit/test_rooms.py
holds the code to those lines). From the ground up:

- `plumbing/`: settings, connections and the `Tx` handle, named SQL, deadlines, migrations;
- `linear/`: everything that speaks with Linear (webhooks, OAuth, API reads, the outbox, its pace);
- `fleet/`: the machines that take work, and the people they belong to;
- `delivery/`: the queue and every write to it, the webhook's intake, routing;
- `operators/`: what the service's operators see and do (status, session pages, retention).

`wire/` is what the service and the machines both read; every room above `plumbing/` may import
it, and it imports nothing else. Every SQL statement lives in `queries/*.sql`.
"""

"""The delivery guarantee: the `dispatch_queue` table and every write to it (`queue`), the
webhook's one transaction that records a delivery with all it causes (`intake`), the routing
that must ask Linear first (`routing`, `repository_choice`), the queue's records of a message
(`models`), the LISTEN wake-ups of long-polling claims (`wakeups`) and the Realtime tokens that
show a machine its own rows (`realtime`). Start reading at `queue`.

May import: shared.plumbing, shared.linear, shared.fleet, shared.wire.
"""

"""The plumbing every other room stands on: settings from the environment, the connection pool
and the `Tx` handle (`db`), the named SQL statements of `shared/queries/` (`sql`), each request's
database deadline and the watchdog that enforces it, migrations, the embedded Postgres and a
developer's generated secrets, `/healthz`'s own connection, encryption of stored secrets, JSON
input that never ends in a 500, and the group commit and arrival order of concurrent requests
(`batching`, `in_order`). It knows nothing of queues, Linear or machines: a module belongs here
when it would serve any Postgres-backed service unchanged.

May import: nothing else of `shared`.
"""

"""Everything that speaks with Linear: its webhooks (signature, freshness, what an event asks,
`webhooks`), an org's OAuth install and token refresh (`auth`), reads from its GraphQL API
(`api`), the outbox of posts to it (`notices`, the `linear_notices` table: written in the
transaction that causes a post, sent after the commit) with the steps beyond activities
(`actions`), and each workspace's wait for its rate limit (`pace`). Nothing here knows the queue
or the machines: a room above asks Linear through these modules.

May import: shared.plumbing, shared.wire.
"""

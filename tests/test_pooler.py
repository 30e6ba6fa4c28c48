"""With DEVPILOT_TEST_POOLER=pgbouncer (CI runs the HTTP contract, the long-poll and the SIGKILL
tests that way too), the app really talks through PgBouncer in transaction mode."""

from __future__ import annotations

import pytest

from tests.helpers import bouncer
from tests.helpers.api import Api


@pytest.mark.skipif(
    not bouncer.POOLER, reason="set DEVPILOT_TEST_POOLER=pgbouncer (CI does) to run through PgBouncer"
)
def test_the_app_pool_goes_through_pgbouncer(api: Api) -> None:
    with api.pool.connection() as conn:
        assert conn.info.port == bouncer.shared("").port
        assert conn.prepare_threshold is None  # no server-side prepared statements behind the pooler
    _, token = api.register()
    assert api.post_as(token, "/claim", {"waitSeconds": 1}).json() == {"messages": []}

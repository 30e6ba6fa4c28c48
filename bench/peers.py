"""The peers, with their documented APIs, on fresh databases of the same server: enqueue N no-op
jobs one by one (one commit each, like our enqueue), then drain them with the library's worker."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from bench.db import as_url


def pgqueuer_rates(url: str, n: int, batch: int = 10) -> dict[str, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    async def run() -> dict[str, Any]:
        conn = await asyncpg.connect(as_url(url))
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        t0 = time.perf_counter()
        for _ in range(n):
            await queries.enqueue("noop", None)
        enqueue = n / (time.perf_counter() - t0)
        qm = QueueManager(queries)
        done = [0]

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            done[0] += 1

        t0 = time.perf_counter()
        await qm.run(mode=QueueExecutionMode.drain, batch_size=batch, dequeue_timeout=timedelta(seconds=0.1))
        drain = done[0] / (time.perf_counter() - t0)
        await conn.close()
        return {
            "enqueue_per_s": round(enqueue),
            "drain_per_s": round(drain),
            "drained": done[0],
            "batch": batch,
        }

    return asyncio.run(run())


def procrastinate_rates(url: str, n: int, concurrency: int = 10) -> dict[str, Any]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    done = [0]

    @app.task(name="noop")
    def noop() -> None:
        done[0] += 1

    async def run() -> dict[str, Any]:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            t0 = time.perf_counter()
            for _ in range(n):
                await noop.defer_async()
            enqueue = n / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            await app.run_worker_async(
                wait=False, concurrency=concurrency, listen_notify=False, delete_jobs="always"
            )
            drain = done[0] / (time.perf_counter() - t0)
        return {
            "enqueue_per_s": round(enqueue),
            "drain_per_s": round(drain),
            "drained": done[0],
            "concurrency": concurrency,
        }

    return asyncio.run(run())

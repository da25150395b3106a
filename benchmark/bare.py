"""A bare Litestar + asyncpg endpoint, the ingest benchmark's reference point.

`POST /jobs` takes `{"taskType", "payload"}` (decoded strictly by msgspec, as jobq's services
do), runs one INSERT into its own table and answers `202 {"jobId"}`: the least a submit over
HTTP into PostgreSQL can cost with the same framework, server and driver, and no queue logic
(no idempotency, no notification, no second hop). The same k6 steps measure it and jobq.

    python -m benchmark.bare --port 8090 --database-url postgresql://…/jobq_bench_bare
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec
from litestar import Litestar, get, post
from litestar.datastructures import State
from litestar.params import JSONBody

from common.web.serving import ServerLimits, serve

_CREATE = """
CREATE TABLE IF NOT EXISTS bare_job (
    id uuid PRIMARY KEY,
    task_type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
_INSERT = "INSERT INTO bare_job (id, task_type, payload) VALUES ($1, $2, $3::jsonb)"


class Submit(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """The request body: a task type and a JSON object."""

    task_type: str
    payload: dict[str, Any]


def create_app(database_url: str, pool_size: int = 10) -> Litestar:
    """The app; its lifespan opens an asyncpg pool of `pool_size` connections and creates the
    table if needed."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(database_url, min_size=pool_size, max_size=pool_size)
        await pool.execute(_CREATE)
        app.state.pool = pool
        try:
            yield
        finally:
            await pool.close()

    @post("/jobs", status_code=202)
    async def submit(data: JSONBody[Submit], state: State) -> dict[str, str]:
        job_id = uuid.uuid4()
        await state.pool.execute(
            _INSERT, job_id, data.task_type, msgspec.json.encode(data.payload).decode()
        )
        return {"jobId": str(job_id)}

    @get("/health/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar([submit, ready], lifespan=[lifespan])


def main() -> None:
    """Serve the bare endpoint on 127.0.0.1 until SIGTERM/SIGINT, with the default HTTP limits
    jobq's services use (`common.web.serving.ServerLimits`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    args = parser.parse_args()
    serve(create_app(args.database_url), "127.0.0.1", args.port, 5, ServerLimits())


if __name__ == "__main__":
    main()

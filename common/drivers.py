"""The enqueue's `Executor` (`common.enqueue`) over one driver connection: asyncpg or
SQLAlchemy's asyncio layer, whichever the caller uses (docs/architecture.md#client-library).

Neither driver is required, and this module imports neither: a connection object can only
exist once its driver is loaded, so `executor_for` looks the driver's classes up in
`sys.modules` and picks the adapter by `isinstance`. `import jobq` therefore never loads a
driver (the import-linter contracts in `pyproject.toml` and tests/unit/test_packaging.py check
it). Each adapter runs the statements on the connection as given, inside whatever transaction
it has open; neither commits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from common.contracts import JobStatus
from common.enqueue import (
    ENQUEUE_ASYNCPG,
    ENQUEUE_NAMED,
    FIND_EXISTING_ASYNCPG,
    FIND_EXISTING_NAMED,
    RELEASE_KEY_ASYNCPG,
    RELEASE_KEY_NAMED,
    Executor,
    Existing,
    Inserted,
    JobRow,
    encode_rows,
)


def _inserted(found: Any) -> list[Inserted]:
    return [Inserted(r["id"], r["queue"], r["task_type"], JobStatus(r["status"])) for r in found]


def _existing(found: Any) -> Existing | None:
    if found is None:
        return None
    return Existing(found["id"], JobStatus(found["status"]), found["request_hash"], found["tenant"])


class AsyncpgExecutor:
    """The enqueue over an `asyncpg.Connection` (or a pool's connection proxy)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def insert_many(self, rows: Sequence[JobRow]) -> list[Inserted]:
        """One enqueue statement; the jobs it created."""
        return _inserted(await self._connection.fetch(ENQUEUE_ASYNCPG, encode_rows(rows)))

    async def find_existing(self, row: JobRow) -> Existing | None:
        """The job `row` collided with, or None."""
        found = await self._connection.fetchrow(
            FIND_EXISTING_ASYNCPG, row.id, row.idempotency_key, row.tenant
        )
        return _existing(found)

    async def release_key(self, row: JobRow) -> bool:
        """Delete `row`'s idempotency key if its job is gone; whether it did."""
        released = await self._connection.fetchval(
            RELEASE_KEY_ASYNCPG, row.idempotency_key, row.tenant
        )
        return released is not None


class SQLAlchemyExecutor:
    """The enqueue over a SQLAlchemy `AsyncConnection` (or `AsyncSession`), any async driver."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._text = sys.modules["sqlalchemy"].text

    async def insert_many(self, rows: Sequence[JobRow]) -> list[Inserted]:
        """One enqueue statement; the jobs it created."""
        result = await self._connection.execute(
            self._text(ENQUEUE_NAMED), {"rows": encode_rows(rows)}
        )
        return _inserted(result.mappings().all())

    async def find_existing(self, row: JobRow) -> Existing | None:
        """The job `row` collided with, or None."""
        result = await self._connection.execute(
            self._text(FIND_EXISTING_NAMED),
            {"id": row.id, "key": row.idempotency_key, "tenant": row.tenant},
        )
        return _existing(result.mappings().first())

    async def release_key(self, row: JobRow) -> bool:
        """Delete `row`'s idempotency key if its job is gone; whether it did."""
        result = await self._connection.execute(
            self._text(RELEASE_KEY_NAMED), {"key": row.idempotency_key, "tenant": row.tenant}
        )
        return result.first() is not None


def _loaded(module: str, *names: str) -> tuple[type, ...]:
    """The classes `names` of `module` if it is loaded, else none."""
    found = sys.modules.get(module)
    return tuple(getattr(found, name) for name in names) if found is not None else ()


def executor_for(connection: Any) -> Executor:
    """The adapter for `connection`: an `asyncpg.Connection` or pool connection proxy, or a
    SQLAlchemy `AsyncConnection`/`AsyncSession`. Raises TypeError for anything else."""
    asyncpg = _loaded("asyncpg.connection", "Connection") + _loaded(
        "asyncpg.pool", "PoolConnectionProxy"
    )
    if asyncpg and isinstance(connection, asyncpg):
        return AsyncpgExecutor(connection)
    sqlalchemy = _loaded("sqlalchemy.ext.asyncio", "AsyncConnection", "AsyncSession")
    if sqlalchemy and isinstance(connection, sqlalchemy):
        return SQLAlchemyExecutor(connection)
    raise TypeError(
        "enqueue needs an asyncpg Connection or a SQLAlchemy AsyncConnection/AsyncSession, "
        f"not {type(connection).__name__}"
    )

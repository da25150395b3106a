"""A pooled connection the driver refuses to use ("cannot switch to state 12; another operation
(2) is in progress", MagicStack/asyncpg#784 and #1069, seen here under load) is closed and the
statement runs once more on a fresh connection: nothing reached the server, so a submit batch
is neither lost nor doubled, and callers get their answer instead of a 503."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from common.errors import ServiceUnavailable
from services.queue.repository import JobRepository
from tests.helpers import new_job

STUCK = "cannot switch to state 12; another operation (2) is in progress"


def refuse(monkeypatch: pytest.MonkeyPatch, times: int, message: str = STUCK) -> list[int]:
    """Make the next `times` `Connection.fetch` calls fail as a stuck connection does, before
    anything is sent; returns the list of server pids they were refused on."""
    original = asyncpg.connection.Connection.fetch
    refused: list[int] = []

    async def fetch(self: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        if len(refused) < times:
            refused.append(self.get_server_pid())
            raise asyncpg.exceptions._base.InternalClientError(message)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.connection.Connection, "fetch", fetch)
    return refused


async def test_a_stuck_connection_is_closed_and_the_insert_runs_once_on_another(
    repository: JobRepository, monkeypatch: pytest.MonkeyPatch, clean_database: str
) -> None:
    refused = refuse(monkeypatch, 1)
    jobs = [new_job() for _ in range(5)]

    inserted = await repository.insert_many(jobs)

    assert len(refused) == 1
    assert sorted(i.id for i in inserted) == sorted(j.id for j in jobs)
    check = await asyncpg.connect(clean_database)
    try:
        assert await check.fetchval("SELECT count(*) FROM job_all") == 5
        live = await check.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", refused[0]
        )
    finally:
        await check.close()
    assert live == 0, "the stuck connection went back to the pool"


async def test_a_connection_stuck_twice_in_a_row_is_a_503(
    repository: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse(monkeypatch, 2)
    with pytest.raises(ServiceUnavailable):
        await repository.insert_many([new_job()])


async def test_other_driver_faults_are_not_retried(
    repository: JobRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mid-operation faults may come after the statement ran: never run it twice.
    refused = refuse(monkeypatch, 1, "unknown error in protocol implementation")
    with pytest.raises(ServiceUnavailable):
        await repository.insert_many([new_job()])
    assert len(refused) == 1

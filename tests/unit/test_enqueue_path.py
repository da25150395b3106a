"""The one enqueue path (`common.enqueue.insert_jobs`) over a fake executor: replays,
conflicts, keys repeated in a batch, and collisions with a job that vanished; and the choice
of driver adapter (`common.drivers.executor_for`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from common.contracts import JobStatus
from common.drivers import executor_for
from common.enqueue import Existing, Inserted, JobRow, Submitted, insert_jobs
from common.errors import IdempotencyConflict, InvalidInput, ServiceUnavailable
from jobq import enqueue
from tests.helpers import new_job


class FakeExecutor:
    """A table of rows keyed by id and by (tenant, key); `vanish` rows collide but are
    gone when read, that many times."""

    def __init__(self, vanish: int = 0) -> None:
        self.rows: dict[object, JobRow] = {}
        self.vanish = vanish
        self.statements = 0

    async def insert_many(self, rows: Sequence[JobRow]) -> list[Inserted]:
        self.statements += 1
        created = []
        for row in rows:
            key = (row.tenant, row.idempotency_key) if row.idempotency_key else None
            if row.id in self.rows or (key is not None and key in self.rows) or self.vanish:
                continue
            self.rows[row.id] = row
            if key is not None:
                self.rows[key] = row
            created.append(Inserted(row.id, row.queue, row.task_type, JobStatus.PENDING))
        return created

    async def find_existing(self, row: JobRow) -> Existing | None:
        self.statements += 1
        if self.vanish:
            self.vanish -= 1
            return None
        found = self.rows.get(row.id) or self.rows.get((row.tenant, row.idempotency_key))
        if found is None:
            return None
        return Existing(found.id, JobStatus.PENDING, found.request_hash, found.tenant)

    async def release_key(self, row: JobRow) -> bool:
        self.statements += 1
        return False


def keyed(key: str, n: int = 1, tenant: str = "default") -> JobRow:
    row = new_job(payload={"n": n})
    return dataclasses.replace(row, idempotency_key=key, tenant=tenant)


async def test_new_rows_take_one_statement_and_a_replay_reads_the_existing_job() -> None:
    executor = FakeExecutor()
    first = keyed("k")
    [created, plain] = await insert_jobs(executor, [first, new_job()])
    assert isinstance(created, Submitted) and created.created
    assert isinstance(plain, Submitted) and plain.created
    assert executor.statements == 1
    [replay] = await insert_jobs(executor, [keyed("k")])
    assert replay == Submitted(created.response, False)


async def test_a_key_repeated_in_a_batch_replays_or_conflicts_with_its_first_use() -> None:
    executor = FakeExecutor()
    outcomes = await insert_jobs(executor, [keyed("k"), keyed("k"), keyed("k", n=2)])
    first, again, other = outcomes
    assert isinstance(first, Submitted) and first.created
    assert again == Submitted(first.response, False)
    assert isinstance(other, IdempotencyConflict)
    assert executor.statements == 1


async def test_another_request_or_tenant_on_the_same_id_is_a_conflict() -> None:
    executor = FakeExecutor()
    row = keyed("k")
    await insert_jobs(executor, [row])
    [changed] = await insert_jobs(executor, [keyed("k", n=2)])
    assert isinstance(changed, IdempotencyConflict)
    assert "idempotency key 'k'" in str(changed)
    [elsewhere] = await insert_jobs(executor, [dataclasses.replace(row, tenant="acme")])
    assert isinstance(elsewhere, IdempotencyConflict)
    assert f"job id {row.id}" in str(elsewhere)
    [own] = await insert_jobs(executor, [keyed("k", tenant="acme")])
    assert isinstance(own, Submitted) and own.created


async def test_a_collision_that_keeps_vanishing_is_unavailable_after_three_tries() -> None:
    executor = FakeExecutor(vanish=3)
    [outcome] = await insert_jobs(executor, [new_job()])
    assert isinstance(outcome, ServiceUnavailable)
    assert executor.statements == 6
    recovered = FakeExecutor(vanish=1)
    [outcome] = await insert_jobs(recovered, [new_job()])
    assert isinstance(outcome, Submitted) and outcome.created


def test_executor_for_refuses_what_is_not_a_driver_connection() -> None:
    with pytest.raises(TypeError, match="asyncpg Connection or a SQLAlchemy"):
        executor_for(object())


@pytest.mark.parametrize("attempts", [-5, 0, 101, 10**9])
async def test_enqueue_refuses_a_default_max_attempts_out_of_bounds(attempts: int) -> None:
    # Checked before any statement: the connection is never used.
    with pytest.raises(InvalidInput) as refused:
        await enqueue(object(), "noop", {}, default_max_attempts=attempts)
    assert refused.value.errors[0]["pointer"] == "default_max_attempts"

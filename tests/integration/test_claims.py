"""The claim against real PostgreSQL: SKIP LOCKED under concurrency, ordering, the plan."""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from common.enqueue import (
    ENQUEUE_ASYNCPG,
    FIND_EXISTING_ASYNCPG,
    RELEASE_KEY_ASYNCPG,
    encode_rows,
)
from services.queue import bulk
from services.queue.repository import (
    _CONFIRM_CANCELLED,
    _GET_MANY,
    _LEASES,
    _MARK_AWAITED,
    ACK_AND_CLAIM_FAIR_STATEMENT,
    ACK_AND_CLAIM_STATEMENT,
    ACK_STATEMENT,
    CANCEL_STATEMENT,
    CLAIM_FAIR_STATEMENT,
    CLAIM_LIMITED_STATEMENT,
    CLAIM_STATEMENT,
    FAIL_STATEMENT,
    FORGET_KEYS_STATEMENT,
    GET_STATEMENT,
    HEARTBEAT_STATEMENT,
    LIMIT_READINGS_STATEMENT,
    PROMOTE_STATEMENT,
    REAP_STATEMENT,
    REDRIVE_STATEMENT,
    RETRY_STATEMENT,
    SWEEP_STATEMENT,
    JobRepository,
)
from services.queue.sqs_store import _MOVE_DEAD, _MOVE_LIVE
from tests.conftest import own_database
from tests.helpers import new_job
from tests.integration.plans import fill_history, fill_keys, generic_plan, literals


async def test_eight_concurrent_claimers_share_200_jobs_without_duplicates(
    repository: JobRepository,
) -> None:
    created = {(await repository.insert(new_job())).id for _ in range(200)}  # type: ignore[union-attr]
    start = asyncio.Event()

    async def claimer(name: str) -> list[uuid.UUID]:
        received: list[uuid.UUID] = []
        await start.wait()
        while True:
            jobs = await repository.claim(["default"], name, 3, 30)
            if not jobs:
                return received
            received.extend(job.id for job in jobs)

    tasks = [asyncio.create_task(claimer(f"claimer-{i}")) for i in range(8)]
    start.set()
    results = await asyncio.gather(*tasks)
    everything = [job_id for received in results for job_id in received]

    assert len(everything) == len(set(everything)), "a job was handed to two claimers"
    assert set(everything) == created
    assert sum(1 for received in results if received) > 1, "claims did not run concurrently"


async def test_claim_orders_by_priority_then_submission(repository: JobRepository) -> None:
    low_first = await repository.insert(new_job(priority=0))
    high = await repository.insert(new_job(priority=10))
    low_second = await repository.insert(new_job(priority=0))
    other_queue = await repository.insert(new_job(queue="other", priority=100))
    assert low_first and high and low_second and other_queue

    jobs = await repository.claim(["default"], "w", 10, 30)

    assert [job.id for job in jobs] == [high.id, low_first.id, low_second.id]
    assert all(job.attempts == 1 for job in jobs)
    assert len({job.receipt_handle for job in jobs}) == 3


async def test_delayed_job_is_not_claimable_until_promoted(repository: JobRepository) -> None:
    job = await repository.insert(new_job(delay=3600))
    assert job is not None and job.status == "SCHEDULED"

    assert await repository.claim(["default"], "w", 10, 30) == []
    assert await repository.promote_due() == {}


async def _fill(connection: asyncpg.Connection, tenants: int = 1) -> None:
    """A table shaped like a busy queue's: backlogs of 10,000 ready and 10,000 scheduled jobs
    (and small ones in two other queues), jobs in flight, dead letters and finished jobs, of
    `tenants` tenants; statistics fresh."""
    for queue in ("a", "b"):
        rows = [new_job(queue=queue) for _ in range(50)]
        await connection.fetch(ENQUEUE_ASYNCPG, encode_rows(rows))
    await connection.execute(
        "INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts,"
        " visible_at, finished_at, lease_id) SELECT gen_random_uuid(), 't' || (i % $1),"
        " 'default', 'noop', '{}', s, 5, now(), now(), gen_random_uuid()"
        " FROM generate_series(1, 40000) AS i,"
        " LATERAL (SELECT CASE WHEN i % 4 = 0 THEN 'PENDING' WHEN i % 4 = 1 THEN 'SCHEDULED'"
        " WHEN i % 100 = 2 THEN 'PROCESSING' WHEN i % 100 = 6 THEN 'DEAD_LETTER'"
        " ELSE 'COMPLETED' END AS s) AS pick",
        tenants,
    )
    await connection.execute("ANALYZE job")


_TABLE_READ = re.compile(
    r"(?:Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan)(?: using \S+)? on (\S+)"
)


def _hashed_tables(plan: str) -> set[str]:
    """The tables a Hash Join of `plan` reads (below it). A hash join of two CTEs of a few
    rows (the claim's ranks) is cheap; one that hashes a table reads all of it, as a join
    planned for an unknown LIMIT would."""
    lines = plan.splitlines()
    tables: set[str] = set()
    for i, line in enumerate(lines):
        if "Hash Join" not in line:
            continue
        depth = len(line) - len(line.lstrip())
        for below in lines[i + 1 :]:
            if len(below) - len(below.lstrip()) <= depth:
                break
            tables.update(_TABLE_READ.findall(below))
    return tables


def test_a_hash_join_is_refused_only_when_it_reads_a_table() -> None:
    ctes = """Hash Join  (cost=0.33..1.23 rows=10 width=602)
  Hash Cond: (picked_1.id = leased.id)
  ->  CTE Scan on picked picked_1  (cost=0.00..0.68 rows=34 width=24)
  ->  Hash  (cost=0.20..0.20 rows=10 width=586)
        ->  CTE Scan on leased  (cost=0.00..0.20 rows=10 width=586)
->  Index Scan using pk_job on job job_1  (cost=0.29..70.28 rows=10 width=132)"""
    table = """->  Hash Join  (cost=1.0..900.0 rows=10 width=8)
      ->  Seq Scan on job  (cost=0.00..800.00 rows=20000 width=8)
      ->  Hash  (cost=0.20..0.20 rows=10 width=16)
            ->  CTE Scan on picked  (cost=0.00..0.20 rows=10 width=16)"""
    assert _hashed_tables(ctes) == set()
    assert _hashed_tables(table) == {"job"}


CLAIM_ARGS = "'{{{queues}}}', 16, 'w', 30"
SETTLE_ARRAYS = "ARRAY[gen_random_uuid()], ARRAY[gen_random_uuid()]"


@pytest.mark.parametrize("queues", ["default", "default,a,b"])
async def test_the_claim_is_an_ordered_index_walk_for_one_queue_and_for_several(
    clean_database: str, queues: str
) -> None:
    connection = await asyncpg.connect(clean_database)
    try:
        await _fill(connection)
        claim = await generic_plan(connection, CLAIM_STATEMENT, CLAIM_ARGS.format(queues=queues))
        with_acks = await generic_plan(
            connection,
            ACK_AND_CLAIM_STATEMENT,
            CLAIM_ARGS.format(queues=queues) + f", {SETTLE_ARRAYS}, ARRAY[NULL::text]",
        )
    finally:
        await connection.close()
    for plan in (claim, with_acks):
        assert "Index Scan using ix_job_claim on" in plan, plan
        # Each queue's walk is cut by its own LIMIT right above the index scan (no sort of
        # the backlog), and no row is found by scanning the table.
        walk = plan[plan.index("LockRows") :]
        assert "Sort" not in walk.split("Index Scan using ix_job_claim")[0], plan
        # Whether another tenant has ready jobs: descents of the per-tenant index.
        assert "Index Only Scan using ix_job_claim_tenant" in plan, plan
        # No job row is found by scanning the table. queue_control has a row per queue ever
        # paused (a handful), which the planner may read whole for the pause filter.
        assert "Seq Scan on job" not in plan, plan
        assert not _hashed_tables(plan), plan
        assert "queue_control" in plan, "a paused queue is filtered in the claim itself"


@pytest.mark.parametrize(
    ("queues", "tenants", "cursor"),
    [("default", 2, "NULL"), ("default,a,b", 2, "NULL"), ("default", 200, "'t7'")],
)
async def test_the_fair_claim_is_an_ordered_index_walk_per_flow_for_any_number_of_tenants(
    clean_database: str, queues: str, tenants: int, cursor: str
) -> None:
    connection = await asyncpg.connect(clean_database)
    cursors = "ARRAY[" + ", ".join([cursor] * len(queues.split(","))) + "]::text[]"
    try:
        await _fill(connection, tenants)
        claim = await generic_plan(
            connection, CLAIM_FAIR_STATEMENT, CLAIM_ARGS.format(queues=queues) + f", {cursors}"
        )
        with_acks = await generic_plan(
            connection,
            ACK_AND_CLAIM_FAIR_STATEMENT,
            CLAIM_ARGS.format(queues=queues) + f", {SETTLE_ARRAYS}, ARRAY[NULL::text], {cursors}",
        )
    finally:
        await connection.close()
    for plan in (claim, with_acks):
        lines = plan.splitlines()
        # The tenants with ready work are found by descents of the per-tenant index (a loose
        # index scan), never by reading every ready job.
        assert "Recursive Union" in plan, plan
        assert "Index Only Scan using ix_job_claim_tenant" in plan, plan
        # Each flow's walk and the top-up walk lock rows as an index scan hands them over, cut
        # by their LIMITs right above it (no sort of a backlog).
        locks = [i for i, line in enumerate(lines) if "LockRows" in line]
        assert len(locks) == 3, plan  # a flow's first priority, the ones below, the top-up
        for i in locks:
            assert "Index Scan using ix_job_claim" in lines[i + 1], plan
        assert any("using ix_job_claim_tenant" in lines[i + 1] for i in locks), plan
        assert any("using ix_job_claim on" in lines[i + 1] for i in locks), plan
        assert "Seq Scan on job" not in plan, plan
        assert not _hashed_tables(plan), plan
        assert "queue_control" in plan, "a paused queue is filtered in the claim itself"


async def test_the_limited_claim_walks_the_pairs_own_index(clean_database: str) -> None:
    connection = await asyncpg.connect(clean_database)
    try:
        # Every job is a noop: the generic plan estimates any task type at all of them.
        await _fill(connection)
        plan = await generic_plan(
            connection, CLAIM_LIMITED_STATEMENT, "'default', 'webhook', 16, 'w', 30"
        )
        await connection.execute(
            "INSERT INTO queue_control (queue, limits, changed_at, changed_by, change)"
            """ VALUES ('default', '{"webhook": {"concurrency": 3}}', now(), 't', 'limits')"""
        )
        readings = await generic_plan(connection, LIMIT_READINGS_STATEMENT, "1000")
    finally:
        await connection.close()
    # Its walk, and the look for jobs it left waiting, descend the pair's index: a limited
    # type with no ready jobs costs a descent, not a read of the queue's whole backlog of
    # other types (ix_job_claim filtered on the task type did).
    assert "using ix_job_claim_type" in plan, plan
    assert "using ix_job_claim on" not in plan, plan
    # So does the depth refresh's count of the pair's waiting jobs.
    assert "using ix_job_claim_type" in readings, readings
    assert "using ix_job_claim on" not in readings, readings


UUIDS = "ARRAY[gen_random_uuid(), gen_random_uuid()]"


@pytest.fixture(scope="module")
async def busy_database(postgres_base: str, template_database: str) -> AsyncIterator[str]:
    """A database of its own (for this module) shaped like a busy system's during a
    rollout: `_fill`'s live table (with finished rows a release before the history left in
    it), a history of 40,000 finished jobs and 20,000 idempotency keys; statistics fresh.
    Plans are only EXPLAINed, never run, so one fill serves every case."""
    async with own_database(postgres_base, template_database, f"jobq_plans_{os.getpid()}") as url:
        connection = await asyncpg.connect(url)
        try:
            await _fill(connection)
            await fill_history(connection)
            await fill_keys(connection)
            assert await connection.fetchval("SELECT count(*) FROM job_history") == 40_000
        finally:
            await connection.close()
        yield url


async def _plan_of(url: str, statement: str, args: str) -> tuple[str, set[str]]:
    """The generic plan of `statement` on the database at `url`, and the tables there that
    hold no row (PostgreSQL may scan an empty partition: it has no page to read)."""
    connection = await asyncpg.connect(url)
    try:
        plan = await generic_plan(connection, statement, args)
        empty = {
            row["relname"]
            for row in await connection.fetch(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND reltuples <= 0"
            )
        }
    finally:
        await connection.close()
    return plan, empty


def _assert_rows_found_by_index(
    name: str, plan: str, empty: set[str], may_hash: frozenset[str] = frozenset()
) -> None:
    """Rows are reached through an index, never by scanning or hashing a whole table or index
    (a join planned for an unknown LIMIT would); an empty table may be scanned, and the
    relations of `may_hash` hashed (read by an index condition the caller checks)."""
    scanned = set(re.findall(r"Seq Scan on (\S+)", plan)) - empty
    assert not scanned, f"{name} scans {scanned}:\n{plan}"
    assert not _hashed_tables(plan) - may_hash, f"{name}:\n{plan}"


@pytest.mark.parametrize(
    ("name", "statement", "args"),
    [
        ("ack", ACK_STATEMENT, f"{SETTLE_ARRAYS}, ARRAY[NULL::text]"),
        (
            "fail",
            FAIL_STATEMENT,
            f"{SETTLE_ARRAYS}, ARRAY['e'], ARRAY[true], ARRAY[NULL::float8], ARRAY[1.0], 300, 5, 2",
        ),
        (
            "heartbeat",
            HEARTBEAT_STATEMENT,
            f"{SETTLE_ARRAYS}, ARRAY[30], ARRAY['requested'], ARRAY[NULL::float8], "
            "ARRAY[NULL::text]",
        ),
        ("reaper", REAP_STATEMENT, "500"),
        ("scheduler", PROMOTE_STATEMENT, "500"),
        ("redrive", REDRIVE_STATEMENT, "NULL, NULL, 500, NULL"),
        ("redrive of one tenant", REDRIVE_STATEMENT, "NULL, NULL, 500, 'acme'"),
        ("sweep", SWEEP_STATEMENT, "500"),
        ("cancel", CANCEL_STATEMENT, "gen_random_uuid(), NULL"),
        ("confirm cancelled", _CONFIRM_CANCELLED, "gen_random_uuid(), gen_random_uuid()"),
        ("retry", RETRY_STATEMENT, "gen_random_uuid(), NULL"),
        ("limited claim", CLAIM_LIMITED_STATEMENT, "'default', 'noop', 16, 'w', 30"),
        # Reads of jobs by id wherever they are (a replayed settle's leases, the batch view,
        # a waiter's flag) probe each table's primary key.
        ("get", GET_STATEMENT, "gen_random_uuid(), NULL"),
        ("get many", _GET_MANY, UUIDS),
        ("leases", _LEASES, UUIDS),
        ("mark awaited", _MARK_AWAITED, "gen_random_uuid(), NULL"),
        # The submit's look for an existing job (id, then key) and a dead key's release.
        ("find existing", FIND_EXISTING_ASYNCPG, "gen_random_uuid(), 'key-7', 'default'"),
        ("release key", RELEASE_KEY_ASYNCPG, "'key-7', 'default'"),
        # Retention of idempotency keys (services/queue/history.py, step 5).
        ("forget keys", FORGET_KEYS_STATEMENT, ""),
        # The SQS moves: dead letters out of the history into another queue, waiting
        # messages between queues (services/queue/sqs_store.py).
        ("sqs move of dead letters", _MOVE_DEAD, "'default', 'dlq', 'DEAD_LETTER', 5, 500"),
        ("sqs move of waiting messages", _MOVE_LIVE, "'dlq', 'default', 'PENDING', 5, 500"),
    ],
)
async def test_every_transition_finds_its_rows_by_index(
    busy_database: str, name: str, statement: str, args: str
) -> None:
    """Every statement that moves, changes or looks up jobs by id reaches its rows through an
    index, with a history of 40,000 rows beside the live table: a plan that scanned
    `job_history` (or `job`) would read every finished job on each call."""
    plan, empty = await _plan_of(busy_database, statement, args)
    if statement is FORGET_KEYS_STATEMENT:
        # With a backlog of 10,000 expired keys PostgreSQL hashes the expired keys (found by
        # ix_idempotency_key_expires_at) rather than probe the primary key 500 times: each
        # batch reads the expired keys, never the keys still held. (From some 100,000 expired
        # keys on it joins by primary key, as the statement's comment says.)
        assert "Index Cond: (expires_at <= statement_timestamp())" in plan, plan
        assert "Seq Scan on idempotency_key" not in plan, plan
        expired = frozenset({"idempotency_key", "ix_idempotency_key_expires_at"})
        _assert_rows_found_by_index(name, plan, empty, may_hash=expired)
        return
    _assert_rows_found_by_index(name, plan, empty)


class _Recording:
    """Stands in for the repository of `services.queue.bulk`: keeps each statement it is given
    (and answers that nothing changed), so a test plans the very text the service builds."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def fetch(self, statement: str, *args: Any) -> list[dict[str, int]]:
        self.statements.append((statement, args))
        return [{"changed": 0, "n": 0}]


@pytest.mark.parametrize(
    ("action", "filters"),
    [
        ("retry", {}),
        ("retry", {"queue": "default"}),
        ("cancel", {}),
        ("cancel", {"queue": "default", "tenant": "t0"}),
        ("delete", {}),
        ("delete", {"queue": "default"}),
        ("delete", {"ids": [uuid.uuid4()]}),  # a single delete (operator.delete)
        ("purge", {"queue": "a"}),
        ("purge", {"queue": "default", "tenant": "t0"}),
    ],
)
async def test_every_bulk_change_finds_its_rows_by_index(
    busy_database: str, action: str, filters: dict[str, Any]
) -> None:
    """A bulk change's chunk statement (services/queue/bulk.py), built by `bulk.apply` as the
    operator API runs it, reaches its rows through an index: each chunk picks 500 rows, and a
    scan would read the whole live table or history once per chunk."""
    recording = _Recording()
    where = bulk.Filter(bulk.narrowed(action, None), **filters)
    await bulk.apply(recording, action, where, 1000)  # type: ignore[arg-type]
    [(statement, args)] = recording.statements
    plan, empty = await _plan_of(busy_database, statement, literals(*args))
    _assert_rows_found_by_index(f"bulk {action} {filters}", plan, empty)

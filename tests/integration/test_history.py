"""Finished jobs move to `job_history` in the statement that finishes them; reads see one job
wherever it is; retention drops partitions; partition steps leave nothing behind on a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from common.contracts import JobStatus
from common.enqueue import ENQUEUE_ASYNCPG, encode_rows, insert_jobs
from common.errors import IdempotencyConflict, ServiceUnavailable
from services.queue import history as history_module
from services.queue.history import History, partition_name
from services.queue.repository import (
    GET_STATEMENT,
    REDRIVE_STATEMENT,
    RETRY_STATEMENT,
    FailEntry,
    JobRepository,
    depth_statement,
    listing_statement,
)
from services.queue.retry import Backoff
from tests.helpers import new_job

_PREPARED = itertools.count()


async def _counts(url: str) -> tuple[int, int]:
    connection = await asyncpg.connect(url)
    try:
        live = await connection.fetchval("SELECT count(*) FROM job")
        finished = await connection.fetchval("SELECT count(*) FROM job_history")
        return int(live), int(finished)
    finally:
        await connection.close()


async def _claimed(repository: JobRepository, n: int, **fields: object) -> list[uuid.UUID]:
    rows = [new_job(**fields) for _ in range(n)]  # type: ignore[arg-type]
    await repository.insert_many(rows)
    jobs = await repository.claim(["default"], "w", n, 30)
    assert len(jobs) == n
    return [job.id for job in jobs]


async def test_every_finishing_settle_moves_the_job_and_reads_still_find_it(
    repository: JobRepository, clean_database: str
) -> None:
    rows = [new_job(max_attempts=1) for _ in range(4)]
    await repository.insert_many(rows)
    jobs = await repository.claim(["default"], "w", 3, 30)
    acked, failed, released = jobs
    assert await repository.ack_many([(acked.id, acked.receipt_handle, {"ok": True})])
    [dead] = await repository.fail_many(
        [FailEntry(failed.id, failed.receipt_handle, "boom", True, None, 1.0)], Backoff(1, 2, 1)
    )
    assert dead.status is JobStatus.DEAD_LETTER
    assert await repository.cancel(released.id) is not None  # asked to stop
    assert await repository.confirm_cancelled(released.id, released.receipt_handle)
    waiting = next(r.id for r in rows if r.id not in {j.id for j in jobs})
    cancelled = await repository.cancel(waiting)
    assert cancelled is not None and cancelled.status is JobStatus.CANCELLED

    assert await _counts(clean_database) == (0, 4)
    views = {view.id: view for view in await repository.get_many([r.id for r in rows])}
    assert views[acked.id].status is JobStatus.COMPLETED
    assert views[acked.id].finished_at is not None
    assert views[failed.id].last_error == "boom"
    assert views[released.id].status is JobStatus.CANCELLED
    got = await repository.get(acked.id)
    assert got is not None and got[0].status is JobStatus.COMPLETED
    # A replayed ack finds the job in the history: the same handle, already settled.
    leases = await repository.leases([acked.id])
    assert leases[acked.id] == (acked.receipt_handle, JobStatus.COMPLETED)
    listed, _ = await repository.list_jobs(
        status=None, queue=None, task_type=None, before=None, limit=10, max_bytes=1 << 20
    )
    assert sorted(job.id for job in listed) == sorted(r.id for r in rows)


async def test_retry_and_redrive_bring_a_historic_job_back_as_live_work(
    repository: JobRepository, clean_database: str
) -> None:
    ids = await _claimed(repository, 3, max_attempts=1)
    handles = {j: h for j, h, _ in [(i, (await repository.get(i)), None) for i in ids]}
    entries = [
        FailEntry(i, handles[i][1], "boom", False, None, 1.0)  # type: ignore[index,arg-type]
        for i in ids
    ]
    await repository.fail_many(entries, Backoff(1, 2, 1))
    assert await _counts(clean_database) == (0, 3)

    retried = await repository.retry(ids[0])
    assert retried is not None and retried.status is JobStatus.PENDING
    assert retried.attempts == 0
    assert await repository.retry(ids[0]) is None, "a live job has no second copy"
    assert await repository.redrive(None, None, 10) == 2
    assert await _counts(clean_database) == (3, 0)
    again = await repository.claim(["default"], "w", 3, 30)
    assert sorted(j.id for j in again) == sorted(ids)


async def test_a_revived_job_whose_key_is_held_again_comes_back_without_it(
    repository: JobRepository,
) -> None:
    """Past its window a key may be taken by a new job: retrying the finished one (or two
    finished ones of one key at once) revives it without the key instead of failing on the
    live table's unique key index."""
    rows = [
        dataclasses.replace(new_job(), idempotency_key="k-again", request_hash=f"h{n}",
                            idempotency_window=0.001)
        for n in range(3)
    ]  # fmt: skip
    finished = []
    for row in rows[:2]:
        [taken] = await insert_jobs(repository, [row])
        assert not isinstance(taken, Exception) and taken.created
        [job] = await repository.claim(["default"], "w", 1, 30)
        await repository.fail_many(
            [FailEntry(job.id, job.receipt_handle, "boom", False, None, 1.0)], Backoff(1, 2, 1)
        )
        finished.append(job.id)
        await asyncio.sleep(0.01)  # the key's window is over
    [live] = await insert_jobs(repository, [rows[2]])
    assert not isinstance(live, Exception) and live.created

    assert await repository.redrive(None, None, 10) == 2
    revived = [await repository.get(i) for i in finished]
    assert all(v is not None and v[0].status is JobStatus.PENDING for v in revived)
    assert all(v is not None and v[0].idempotency_key is None for v in revived)
    holder = await repository.get(rows[2].id)
    assert holder is not None and holder[0].idempotency_key == "k-again"


async def test_a_forward_retried_after_the_job_finished_is_a_replay(
    repository: JobRepository,
) -> None:
    row = dataclasses.replace(new_job(), idempotency_key="k-history", request_hash="h1")
    [first] = await insert_jobs(repository, [row])
    [job] = await repository.claim(["default"], "w", 1, 30)
    await repository.ack_many([(job.id, job.receipt_handle, None)])

    [again] = await insert_jobs(repository, [row])  # the same id: a retried forward
    other_id = dataclasses.replace(row, id=uuid.uuid4())
    [keyed] = await insert_jobs(repository, [other_id])  # the same key and request
    conflicting = dataclasses.replace(other_id, request_hash="h2")
    [conflict] = await insert_jobs(repository, [conflicting])

    assert not isinstance(first, Exception) and first.created
    for replay in (again, keyed):
        assert not isinstance(replay, Exception)
        assert not replay.created and replay.response.job_id == row.id
        assert replay.response.status is JobStatus.COMPLETED
    assert isinstance(conflict, IdempotencyConflict)


async def test_a_job_is_never_seen_twice_or_not_at_all_while_it_moves(
    repository: JobRepository, clean_database: str
) -> None:
    ids = await _claimed(repository, 400)
    stop = asyncio.Event()
    seen: list[int] = []

    async def read() -> None:
        connection = await asyncpg.connect(clean_database)
        try:
            while not stop.is_set():
                # By id (each job, both tables) and as a listing (every job at once).
                found = await connection.fetch(
                    "SELECT id FROM job_all WHERE id = ANY($1::uuid[])", ids
                )
                seen.append(len(found))
                one = await connection.fetch(GET_STATEMENT, ids[len(seen) % len(ids)], None)
                seen.append(len(one) * len(ids))
        finally:
            await connection.close()

    readers = [asyncio.create_task(read()) for _ in range(3)]
    views = await repository.get_many(ids)
    handles = {view.id: view for view in views}
    leases = await repository.leases(ids)
    for start in range(0, len(ids), 20):
        batch = ids[start : start + 20]
        await repository.ack_many([(i, leases[i][0], None) for i in batch])  # type: ignore[misc]
        await asyncio.sleep(0)
    stop.set()
    await asyncio.gather(*readers)
    assert handles and seen
    assert set(seen) == {len(ids)}, "a read saw a job twice or not at all"
    assert await _counts(clean_database) == (0, len(ids))


async def _generic_plan(connection: asyncpg.Connection, statement: str, args: str) -> str:
    name = f"history_plan_{next(_PREPARED)}"
    await connection.execute("SET plan_cache_mode = force_generic_plan")
    await connection.execute(f"PREPARE {name} AS {statement}")
    rows = await connection.fetch(f"EXPLAIN EXECUTE {name}({args})")
    return "\n".join(row[0] for row in rows)


async def _fill_history(connection: asyncpg.Connection, analyze: bool = True) -> None:
    """A live table of 10,100 jobs and a history of 40,000 (half dead letters) finished in
    the last minute; statistics taken unless not `analyze` (a server without autovacuum, or
    partitions filled since its last pass)."""
    await connection.fetch(ENQUEUE_ASYNCPG, encode_rows([new_job() for _ in range(100)]))
    await connection.execute(
        "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at)"
        " SELECT gen_random_uuid(), 'default', 'noop', '{}', 'PENDING', 5, now()"
        " FROM generate_series(1, 10000)"
    )
    await connection.execute(
        "INSERT INTO job_history (id, tenant, queue, task_type, payload, status, priority,"
        " attempts, releases, max_attempts, visible_at, ready_at, cancel_requested, awaited,"
        " errors, created_at, updated_at, finished_at)"
        " SELECT gen_random_uuid(), 'default', 'default', 'noop', '{}',"
        " CASE WHEN i % 2 = 0 THEN 'DEAD_LETTER' ELSE 'COMPLETED' END, 0, 1, 0, 5, now(),"
        " now(), false, false, '[]', now(), now(), now() - make_interval(secs => i % 60)"
        " FROM generate_series(1, 40000) AS i"
    )
    if analyze:
        await connection.execute("ANALYZE job")
        await connection.execute("ANALYZE job_history")


async def test_reads_across_live_and_history_walk_indexes_and_prune_partitions(
    clean_database: str,
) -> None:
    connection = await asyncpg.connect(clean_database)
    try:
        await _fill_history(connection)
        by_id = await _generic_plan(connection, GET_STATEMENT, "gen_random_uuid(), NULL")
        retry = await _generic_plan(connection, RETRY_STATEMENT, "gen_random_uuid(), NULL")
        redrive = await _generic_plan(connection, REDRIVE_STATEMENT, "NULL, NULL, 500, NULL")
        now = datetime.now(UTC)
        start = now.replace(minute=0, second=0, microsecond=0)
        window = await connection.fetch(
            "EXPLAIN SELECT count(*) FROM job_history WHERE status = 'COMPLETED'"
            " AND finished_at >= $1 AND finished_at < $2",
            start,
            start + timedelta(hours=1),
        )
        empty = {
            row["relname"]
            for row in await connection.fetch(
                "SELECT relname FROM pg_class WHERE relname LIKE 'job_history_%'"
                " AND relkind = 'r' AND reltuples <= 0"
            )
        }
    finally:
        await connection.close()
    for name, plan in (("get", by_id), ("retry", retry), ("redrive", redrive)):
        # Every table holding rows is reached by an index (an empty partition is scanned:
        # it has no page to read).
        for line in plan.splitlines():
            if "Seq Scan on " in line:
                table = line.split("Seq Scan on ", 1)[1].split()[0]
                assert table in empty, f"{name}:\n{plan}"
        assert "Hash Join" not in plan, f"{name}:\n{plan}"
    # A read by id probes the live table's primary key and each partition's.
    assert "pk_job" in by_id and "job_history_done_" in by_id, by_id
    # The redrive reads the dead letters' partitions only, in id order.
    assert "job_history_done" not in redrive, redrive
    assert "job_history_dead_" in redrive, redrive
    # A window of finished_at reads only the partitions that may hold it.
    plan = "\n".join(row[0] for row in window)
    assert "job_history_dead" not in plan, plan
    assert "job_history_done_default" not in plan, plan
    assert plan.count("job_history_done_") == 1, plan


async def test_listings_walk_indexes_and_leased_jobs_stay_out_of_the_listing_indexes(
    repository: JobRepository, clean_database: str
) -> None:
    # A claim's UPDATE adds no entry to the listing indexes (they leave PROCESSING rows out),
    # and every listing still reaches the table by an index: the leased rows by the reaper's.
    connection = await asyncpg.connect(clean_database)
    try:
        await _fill_history(connection)
        leased = await _claimed(repository, 50)
        await connection.execute("ANALYZE job")
        definitions = dict(
            await connection.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'"
                " AND indexname LIKE 'ix_job_unleased_%'"
            )
        )
        leased_only, pending = JobStatus.PROCESSING, JobStatus.PENDING
        cases = {
            "all": ([], "NULL", None),
            "status": (["status = $1"], "'PROCESSING'", leased_only),
            "queue": (["queue = $1", "id < $2"], "'default', gen_random_uuid()", None),
            "tenant+status": (["tenant = $1", "status = $2"], "'default', 'PENDING'", pending),
        }
        plans = {}
        for name, (conditions, args, status) in cases.items():
            at = len(conditions) + 1
            statement = listing_statement(conditions, False, at, at + 1, status)
            plans[name] = await _generic_plan(
                connection, statement, f"{args + ', ' if conditions else ''}50, 1000000"
            )
        counts = await _generic_plan(connection, depth_statement("$1"), "'default'")
    finally:
        await connection.close()
    assert len(definitions) == 3, definitions
    for definition in definitions.values():
        assert "WHERE ((status)::text <> 'PROCESSING'::text)" in definition, definition
    for name, plan in plans.items():
        assert "Seq Scan on job " not in plan, f"{name}:\n{plan}"
    for name in ("all", "status", "queue"):
        assert "ix_job_reaper" in plans[name], f"{name}:\n{plans[name]}"
    assert "ix_job_unleased_queue_id" in plans["queue"], plans["queue"]
    # A walk that cannot hold the asked status is left out: leased jobs are never walked for
    # through the others (a generic plan would walk the primary key through all of them),
    # waiting ones are never looked for in the history or among the leased.
    assert "pk_job " not in plans["status"] and "ix_job_unleased" not in plans["status"]
    assert "job_history" not in plans["status"], plans["status"]
    assert "ix_job_reaper" not in plans["tenant+status"], plans["tenant+status"]
    assert "job_history" not in plans["tenant+status"], plans["tenant+status"]
    # A tenant's queue counts find its leased jobs by the reaper's index (its waiting ones, all
    # of this table here, are counted by a scan of it).
    assert "ix_job_reaper" in counts, counts
    # The leased jobs are listed with the others, newest first, across pages.
    listed: list[uuid.UUID] = []
    before = None
    while True:
        page, _ = await repository.list_jobs(
            status=None, queue="default", task_type=None, before=before, limit=500,
            max_bytes=10_000_000,
        )  # fmt: skip
        if not page:
            break
        listed += [job.id for job in page]
        before = page[-1].id
    assert listed == sorted(listed, reverse=True)
    assert len(listed) == len(set(listed)) == 10_150 + 40_000
    assert set(leased) <= set(listed)
    processing, _ = await repository.list_jobs(
        status=JobStatus.PROCESSING, queue=None, task_type=None, before=None, limit=500,
        max_bytes=10_000_000,
    )  # fmt: skip
    assert sorted(job.id for job in processing) == sorted(leased)


async def test_the_enqueue_probes_the_history_by_index_whatever_its_statistics(
    clean_database: str,
) -> None:
    # Without statistics PostgreSQL hashed the whole history for the id probe (a 30-minute
    # soak on a server without autovacuum: 0.5 s per 100-job insert by minute 30).
    connection = await asyncpg.connect(clean_database)
    try:
        await _fill_history(connection, analyze=False)
        rows = encode_rows([new_job() for _ in range(100)])
        plan = await _generic_plan(connection, ENQUEUE_ASYNCPG, f"'{rows}'")
    finally:
        await connection.close()
    assert "Anti Join" not in plan and "Hash Join" not in plan, plan
    for line in plan.splitlines():
        assert not ("Seq Scan on job_history" in line and "_default" not in line), plan
    assert "job_history_done_" in plan and "_pkey" in plan, plan


async def test_partitions_are_made_ahead_and_dropped_past_retention(
    repository: JobRepository, clean_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = History(repository, 60.0, 180.0, 600.0)
    assert (await keeper.maintain()).failed == []
    [job_id] = await _claimed(repository, 1)
    leases = await repository.leases([job_id])
    await repository.ack_many([(job_id, leases[job_id][0], None)])  # type: ignore[list-item]
    assert await _counts(clean_database) == (0, 1)

    later = datetime.now(UTC) + timedelta(days=4)
    swept = await keeper.maintain(later)
    assert swept.dropped, "slots past retention are dropped"
    assert await _counts(clean_database) == (0, 0), "the finished job went with its partition"
    horizon = later - timedelta(seconds=180)
    assert all(end > horizon for _, end in (await keeper.partitions("done")).values())

    future = datetime(2030, 6, 1, 12, 0, 30, tzinfo=UTC)
    with caplog.at_level(logging.INFO, logger="services.queue.history"):
        first = await keeper.maintain(future)
    # Logged at INFO (services run at INFO in compose): its extra fields must not clash with
    # LogRecord's own attributes ("created" did, and the retention loop crashed on it).
    [logged] = [r for r in caplog.records if getattr(r, "event", None) == "history_maintained"]
    assert logged.partitions_created == first.created  # type: ignore[attr-defined]
    # Every minute from `future` - retention to AHEAD minutes after it, for each tree.
    assert first.failed == []
    made = {name: slot for name, slot in (await keeper.partitions("done")).items()
            if slot[0].year == 2030}  # fmt: skip
    assert len(made) == 3 + 1 + history_module.AHEAD, made
    dead = [n for n in first.created if n.startswith("job_history_dead_")]
    assert len(dead) == 10 + 1 + history_module.AHEAD, dead
    assert (await keeper.maintain(future)).created == [], "a second pass makes nothing"
    await keeper.maintain(datetime(2030, 6, 2, tzinfo=UTC))  # drops the 2030 slots again


async def test_a_crash_between_the_partition_steps_leaves_nothing_behind(
    repository: JobRepository, clean_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slot in the far future, whose rows the DEFAULT partition caught.
    start = datetime(2031, 1, 1, tzinfo=UTC)
    end = start + timedelta(minutes=1)
    name = partition_name("done", start, end)
    holder = await asyncpg.connect(clean_database)
    monkeypatch.setattr(history_module, "LOCK_TIMEOUT", "30s")
    keeper = History(repository, 60.0, 180.0, 600.0)
    try:
        await holder.execute(
            "INSERT INTO job_history (id, tenant, queue, task_type, payload, status, priority,"
            " attempts, releases, max_attempts, visible_at, ready_at, cancel_requested,"
            " awaited, errors, created_at, updated_at, finished_at)"
            " VALUES (gen_random_uuid(), 'default', 'default', 'noop', '{}', 'COMPLETED', 0,"
            " 1, 0, 5, now(), now(), false, false, '[]', now(), now(), $1)",
            start + timedelta(seconds=5),
        )
        # Hold the DEFAULT partition, so the step after CREATE TABLE waits; then kill the
        # session doing it, as a crash would.
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE job_history_done_default IN ACCESS EXCLUSIVE MODE")
        creating = asyncio.create_task(keeper.create("done", start, end))
        killer = await asyncpg.connect(clean_database)
        try:
            for _ in range(200):
                killed = await killer.fetchval(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%job_history_done_default%'"
                    " AND pid <> $1",
                    holder.get_server_pid(),
                )
                if killed:
                    break
                await asyncio.sleep(0.05)
            assert killed, "the partition step never waited"
        finally:
            await killer.close()
        with pytest.raises((asyncpg.PostgresError, ServiceUnavailable)):
            await creating
        await transaction.rollback()
        assert await holder.fetchval("SELECT to_regclass($1)", name) is None
        assert await holder.fetchval("SELECT count(*) FROM job_history_done_default") == 1
        # The next pass makes it, with the caught row moved in.
        await keeper.create("done", start, end)
        assert await holder.fetchval(f"SELECT count(*) FROM {name}") == 1
        assert await holder.fetchval("SELECT count(*) FROM job_history_done_default") == 0
    finally:
        await holder.execute(f"DROP TABLE IF EXISTS {name}")
        await holder.close()

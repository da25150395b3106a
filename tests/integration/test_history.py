"""Finished jobs move to `job_history` in the statement that finishes them; reads see one job
wherever it is; retention drops partitions; partition steps leave nothing behind on a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from common.contracts import AckEntry, HeartbeatEntry, JobStatus, JobView
from common.contracts import FailEntry as WireFailEntry
from common.enqueue import ENQUEUE_ASYNCPG, encode_rows, insert_jobs
from common.errors import (
    IdempotencyConflict,
    InvalidState,
    ServiceUnavailable,
    StaleReceiptHandle,
)
from services.queue import history as history_module
from services.queue.history import History, partition_name
from services.queue.metrics import QueueMetrics
from services.queue.models import AUTOVACUUM_SETTINGS
from services.queue.repository import (
    _GET_MANY,
    _LEASES,
    GET_STATEMENT,
    REDRIVE_STATEMENT,
    RETRY_STATEMENT,
    SWEEP_STATEMENT,
    FailEntry,
    JobRepository,
    depth_statement,
    listing_statement,
)
from services.queue.retry import Backoff
from services.queue.service import QueueService
from services.queue.settings import QueueSettings
from services.queue.wakeup import WakeupHub
from tests.helpers import new_job
from tests.integration.plans import fill_history, generic_plan, literals


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
    jobs = await repository.claim([str(fields.get("queue", "default"))], "w", n, 30)
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


MOVING = 400
"""Jobs each move test moves."""

MOVE_BATCH = 20
"""Jobs per moving statement (for single-job moves, between two pauses): many small moves,
with readings between them."""

Pause = Callable[[], Awaitable[None]]


def _batches(ids: list[uuid.UUID]) -> list[list[uuid.UUID]]:
    return [ids[start : start + MOVE_BATCH] for start in range(0, len(ids), MOVE_BATCH)]


async def _dead_letters(
    repository: JobRepository, n: int, queue: str = "default"
) -> dict[uuid.UUID, uuid.UUID]:
    """`n` jobs of `queue` dead-lettered (a non-retryable failure of their only attempt), now
    in the history: {id: the receipt handle of the dead attempt}."""
    ids = await _claimed(repository, n, max_attempts=1, queue=queue)
    handles = {job_id: lease for job_id, (lease, _) in (await repository.leases(ids)).items()}
    entries = [FailEntry(i, handles[i], "boom", False, None, 1.0) for i in ids]  # type: ignore[arg-type]
    dead = await repository.fail_many(entries, Backoff(1, 2, 1))
    assert {job.status for job in dead} == {JobStatus.DEAD_LETTER} and len(dead) == n
    return handles  # type: ignore[return-value]


async def _leased(repository: JobRepository, url: str) -> list[uuid.UUID]:
    return await _claimed(repository, MOVING)


async def _expired(repository: JobRepository, url: str) -> list[uuid.UUID]:
    ids = await _claimed(repository, MOVING, max_attempts=1)
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE job SET visible_at = now() - interval '1 second' WHERE id = ANY($1)", ids
        )
    finally:
        await connection.close()
    return ids


async def _waiting(repository: JobRepository, url: str) -> list[uuid.UUID]:
    rows = [new_job() for _ in range(MOVING)]
    await repository.insert_many(rows)
    return [row.id for row in rows]


async def _left_finished(repository: JobRepository, url: str) -> list[uuid.UUID]:
    """Finished rows in `job`, as a release before the history leaves them (in place)."""
    ids = await _waiting(repository, url)
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE job SET status = (ARRAY['COMPLETED', 'CANCELLED', 'DEAD_LETTER'])"
            "[1 + abs(hashtext(id::text)) % 3], finished_at = now(), updated_at = now()"
            " WHERE id = ANY($1)",
            ids,
        )
    finally:
        await connection.close()
    return ids


async def _in_history(repository: JobRepository, url: str) -> list[uuid.UUID]:
    return list(await _dead_letters(repository, MOVING))


async def _ack(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    leases = await repository.leases(ids)
    for batch in _batches(ids):
        acked = await repository.ack_many([(i, leases[i][0], None) for i in batch])  # type: ignore[misc]
        assert len(acked) == len(batch)
        await pause()


async def _fail(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    leases = await repository.leases(ids)
    for batch in _batches(ids):
        entries = [FailEntry(i, leases[i][0], "boom", False, None, 1.0) for i in batch]  # type: ignore[arg-type]
        failed = await repository.fail_many(entries, Backoff(1, 2, 1))
        assert [job.status for job in failed] == [JobStatus.DEAD_LETTER] * len(batch)
        await pause()


async def _reap(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    while reaped := await repository.reap_expired(MOVE_BATCH):
        assert {job.status for job in reaped} == {JobStatus.DEAD_LETTER}
        await pause()


async def _cancel(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    for batch in _batches(ids):
        for job_id in batch:
            view = await repository.cancel(job_id)
            assert view is not None and view.status is JobStatus.CANCELLED
        await pause()


async def _sweep(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    # The statement History.sweep runs, with a smaller batch.
    while (await repository.fetch(SWEEP_STATEMENT, MOVE_BATCH))[0]["moved"]:
        await pause()


async def _retry(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    for batch in _batches(ids):
        for job_id in batch:
            view = await repository.retry(job_id)
            assert view is not None and view.status is JobStatus.PENDING
        await pause()


async def _redrive(repository: JobRepository, ids: list[uuid.UUID], pause: Pause) -> None:
    while await repository.redrive(None, None, MOVE_BATCH):
        await pause()


_WHERE = (
    "SELECT (SELECT count(*) FROM job WHERE id = ANY($1::uuid[])) AS live,"
    " (SELECT count(*) FROM job_history WHERE id = ANY($1::uuid[])) AS finished"
)
_FIRST_PAGE = listing_statement([], False, 1, 2)
_NEXT_PAGE = listing_statement(["id < $1"], False, 2, 3)
"""The listing's statements as `list_jobs` builds them without filters (keyset cursor)."""


@dataclasses.dataclass
class _Reader:
    """One reader's count of readings, and of those taken while both tables held some of
    the moving jobs (in the reading's own snapshot)."""

    taken: int = 0
    overlapping: int = 0


async def _reading(
    connection: asyncpg.Connection,
    ids: list[uuid.UUID],
    reader: _Reader,
    *reads: tuple[str, tuple[object, ...]],
) -> list[list[asyncpg.Record]]:
    """Run the statements `reads` in one snapshot (the first one's, as a statement of the
    service takes it), and count in that snapshot where the moving jobs are: each exactly
    once, and in both tables at once for an overlapping reading."""
    async with connection.transaction(isolation="repeatable_read", readonly=True):
        results = [await connection.fetch(statement, *args) for statement, args in reads]
        live, finished = await connection.fetchrow(_WHERE, ids)
    assert live + finished == len(ids), (live, finished)
    reader.taken += 1
    reader.overlapping += bool(live and finished)
    return results


async def _read_by_id(url: str, ids: list[uuid.UUID], reader: _Reader, stop: asyncio.Event) -> None:
    """Read every moving job by id (the batch view's and the replays' statements) and one
    of them alone (GET /jobs/{id}), over and over: each is found exactly once."""
    connection = await asyncpg.connect(
        url, server_settings={"plan_cache_mode": "force_generic_plan"}
    )
    try:
        while not stop.is_set():
            one = ids[reader.taken % len(ids)]
            many, single, leases = await _reading(
                connection,
                ids,
                reader,
                (_GET_MANY, (ids,)),
                (GET_STATEMENT, (one, None)),
                (_LEASES, (ids,)),
            )
            assert sorted(row["id"] for row in many) == sorted(ids), (
                "a job seen twice or not at all"
            )
            assert [row["id"] for row in single] == [one]
            assert sorted(row["id"] for row in leases) == sorted(ids)
    finally:
        await connection.close()


async def _page_through(
    url: str, ids: list[uuid.UUID], reader: _Reader, stop: asyncio.Event
) -> None:
    """List every job, newest first, in pages of 40 (the listing's keyset cursor), over and
    over: across one pass's pages every job appears exactly once, wherever it was when its
    page was read."""
    connection = await asyncpg.connect(
        url, server_settings={"plan_cache_mode": "force_generic_plan"}
    )
    try:
        while not stop.is_set():
            listed: list[uuid.UUID] = []
            before = None
            while True:
                read = (
                    (_FIRST_PAGE, (40, 10_000_000))
                    if before is None
                    else (_NEXT_PAGE, (before, 40, 10_000_000))
                )
                [page] = await _reading(connection, ids, reader, read)
                if not page:
                    break
                listed += [row["id"] for row in page]
                before = page[-1]["id"]
            assert len(listed) == len(set(listed)), "a job listed twice across the pages"
            assert sorted(listed) == sorted(ids), "a job missing from the pages"
    finally:
        await connection.close()


Prepare = Callable[[JobRepository, str], Awaitable[list[uuid.UUID]]]
Move = Callable[[JobRepository, list[uuid.UUID], Pause], Awaitable[None]]


@pytest.mark.parametrize(
    ("prepare", "move", "back", "outcome"),
    [
        pytest.param(_leased, _ack, False, {JobStatus.COMPLETED}, id="ack"),
        pytest.param(_leased, _fail, False, {JobStatus.DEAD_LETTER}, id="fail to dead letter"),
        pytest.param(_expired, _reap, False, {JobStatus.DEAD_LETTER}, id="reaper dead letters"),
        pytest.param(_waiting, _cancel, False, {JobStatus.CANCELLED}, id="cancel"),
        pytest.param(
            _left_finished,
            _sweep,
            False,
            {JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.DEAD_LETTER},
            id="sweep",
        ),
        pytest.param(_in_history, _retry, True, {JobStatus.PENDING}, id="retry"),
        pytest.param(_in_history, _redrive, True, {JobStatus.PENDING}, id="redrive"),
    ],
)
async def test_a_job_is_never_seen_twice_or_not_at_all_while_it_moves(
    repository: JobRepository,
    clean_database: str,
    prepare: Prepare,
    move: Move,
    back: bool,
    outcome: set[JobStatus],
) -> None:
    """Each move between `job` and `job_history` (into the history: ack, fail, the reaper,
    cancel, the sweep; back out of it: retry, redrive) is made in batches of 20 while two
    readers by id and a pager of the listing read in a loop, each reading at least once
    between two batches: every reading, taken while both tables held some of the jobs,
    sees each job exactly once."""
    ids = await prepare(repository, clean_database)
    assert await _counts(clean_database) == ((0, MOVING) if back else (MOVING, 0))
    stop = asyncio.Event()
    readers = [_Reader(), _Reader(), _Reader()]
    tasks = [
        asyncio.create_task(_read_by_id(clean_database, ids, readers[0], stop)),
        asyncio.create_task(_read_by_id(clean_database, ids, readers[1], stop)),
        asyncio.create_task(_page_through(clean_database, ids, readers[2], stop)),
    ]

    async def pause() -> None:
        """Wait until every reader finished a reading since the last batch committed."""
        marks = [reader.taken for reader in readers]
        deadline = asyncio.get_running_loop().time() + 30
        while any(reader.taken <= mark for reader, mark in zip(readers, marks, strict=True)):
            if any(task.done() for task in tasks):
                return  # a reader failed: its error is raised below
            assert asyncio.get_running_loop().time() < deadline, "the readers stopped reading"
            await asyncio.sleep(0.001)

    try:
        await pause()
        await move(repository, ids, pause)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert await _counts(clean_database) == ((MOVING, 0) if back else (0, MOVING))
    assert {view.status for view in await repository.get_many(ids)} == outcome
    # Every reader read while the jobs were split between the two tables.
    assert all(reader.overlapping > 0 for reader in readers), readers


def _service(repository: JobRepository) -> QueueService:
    return QueueService(
        repository,
        WakeupHub(),
        QueueSettings(database_url="postgresql://unused"),
        QueueMetrics(CollectorRegistry()),
        asyncio.Event(),
    )


async def _refused(service: QueueService, job_id: uuid.UUID, handle: uuid.UUID) -> None:
    """Every settle with `handle` is refused as stale (409), and changes nothing."""
    before = await service.get(job_id)
    with pytest.raises(StaleReceiptHandle):
        await service.ack(job_id, handle, {"late": True})
    failure = WireFailEntry(id=job_id, receipt_handle=handle, error="late", retryable=False)
    with pytest.raises(StaleReceiptHandle):
        await service.fail(job_id, failure)
    for visibility in (30, 0):  # an extension, a release
        entry = HeartbeatEntry(id=job_id, receipt_handle=handle, visibility_timeout=visibility)
        with pytest.raises(StaleReceiptHandle):
            await service.heartbeat(entry)
    with pytest.raises(StaleReceiptHandle):
        await service.confirm_cancelled(job_id, handle)
    assert await service.get(job_id) == before, "a refused settle changed the job"


@pytest.mark.parametrize("revive", ["retry", "redrive"])
async def test_a_revived_dead_letters_old_receipt_handle_is_refused(
    repository: JobRepository, clean_database: str, revive: str
) -> None:
    """A dead letter brought back from the history (by retry or by redrive) is fenced as
    today: its dead attempt's receipt handle, which still answers a replay while the job is
    dead, is refused (stale, 409) for ack, fail, heartbeat, release and cancel confirmation
    once it is live again, before and after its next claim, and the job is untouched; the
    new claim's handle settles it."""
    service = _service(repository)
    [(job_id, old)] = (await _dead_letters(repository, 1)).items()
    replay = await service.ack_many([AckEntry(id=job_id, receipt_handle=old)])
    assert replay.results[0].status == 200, "while dead, its own handle is a replay"
    if revive == "retry":
        assert (await service.retry(job_id)).status is JobStatus.PENDING
    else:
        assert await service.redrive(None, None, None) == 1
    assert await _counts(clean_database) == (1, 0)

    await _refused(service, job_id, old)
    [job] = await repository.claim(["default"], "w", 1, 30)
    assert job.id == job_id and job.receipt_handle != old and job.attempts == 1
    await _refused(service, job_id, old)
    assert (await service.get(job_id)).status is JobStatus.PROCESSING
    done = await service.ack(job_id, job.receipt_handle, {"ok": True})
    assert done.status is JobStatus.COMPLETED and done.result == {"ok": True}
    assert await _counts(clean_database) == (0, 1)


async def _copies(url: str, job_id: uuid.UUID) -> tuple[int, int]:
    """How many rows of `job_id` `job` and `job_history` hold."""
    connection = await asyncpg.connect(url)
    try:
        row = await connection.fetchrow(
            "SELECT (SELECT count(*) FROM job WHERE id = $1) AS live,"
            " (SELECT count(*) FROM job_history WHERE id = $1) AS finished",
            job_id,
        )
        return int(row["live"]), int(row["finished"])
    finally:
        await connection.close()


async def _waiting_for_a_lock(connection: asyncpg.Connection) -> None:
    """Return once a session of the queue service's pool waits for a row lock."""
    for _ in range(400):
        waiting = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'jobq-queue' AND wait_event_type = 'Lock'"
        )
        if waiting:
            return
        await asyncio.sleep(0.025)
    raise AssertionError("the retry never waited for the redrive's lock")


async def test_a_retry_racing_a_redrive_of_one_dead_letter_revives_it_once(
    repository: JobRepository, clean_database: str
) -> None:
    """A retry and a redrive of the same dead letter at once revive it once: one live row,
    none left in the history. Redrive first: the retry waits for its lock, then finds the
    job live and is refused as today (InvalidState, 409). Retry first: the redrive skips the
    locked row and moves nothing (0). Then both at once, freely, twenty times: exactly one
    of the two revives the job each time."""
    service = _service(repository)
    holder = await asyncpg.connect(clean_database)
    try:
        [first] = await _dead_letters(repository, 1, "first")
        async with holder.transaction():
            moved = await holder.fetchrow(REDRIVE_STATEMENT, None, None, 500, None)
            assert moved["moved"] == 1
            retrying = asyncio.create_task(service.retry(first))
            await _waiting_for_a_lock(holder)
        with pytest.raises(InvalidState):
            await retrying
        assert await _copies(clean_database, first) == (1, 0)

        [second] = await _dead_letters(repository, 1, "second")
        async with holder.transaction():
            assert len(await holder.fetch(RETRY_STATEMENT, second, None)) == 1
            assert await asyncio.wait_for(service.redrive(None, None, None), 10) == 0
        assert await _copies(clean_database, second) == (1, 0)
    finally:
        await holder.close()

    for round_ in range(20):
        [job_id] = await _dead_letters(repository, 1, f"race-{round_}")
        retried, redriven = await asyncio.gather(
            service.retry(job_id), service.redrive(None, None, None), return_exceptions=True
        )
        if isinstance(retried, InvalidState):
            assert redriven == 1, (retried, redriven)
        else:
            assert isinstance(retried, JobView) and retried.status is JobStatus.PENDING, retried
            assert redriven == 0, (retried, redriven)
        assert await _copies(clean_database, job_id) == (1, 0)


async def test_the_hot_table_keeps_the_autovacuum_settings_the_migrations_chose(
    clean_database: str,
) -> None:
    """`job`, migrated by alembic, carries the storage parameters docs/architecture.md
    ("Autovacuum of `job`") describes and `models.AUTOVACUUM_SETTINGS` declares: room on
    each page for the claim's and the heartbeat's new row versions, vacuum and statistics
    after 2 % of the rows changed, an unthrottled vacuum."""
    connection = await asyncpg.connect(clean_database)
    try:
        options = await connection.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = 'job'::regclass"
        )
    finally:
        await connection.close()
    assert sorted(options or []) == [
        "autovacuum_analyze_scale_factor=0.02",
        "autovacuum_vacuum_cost_delay=0",
        "autovacuum_vacuum_scale_factor=0.02",
        "fillfactor=80",
    ]
    declared = AUTOVACUUM_SETTINGS["postgresql_with"]
    assert dict(option.split("=", 1) for option in options) == declared


async def test_reads_across_live_and_history_walk_indexes_and_prune_partitions(
    repository: JobRepository, clean_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads by id, retry and redrive reach the history through each partition's index; the
    statements the service runs with a status read only that status's tree of partitions
    (the listing's history walk, the depth's dead letters, the redrive); retention's row
    deletes read the DEFAULT partition they name, never a slot (a slot past retention is
    dropped whole, no statement of the service reads the history by a range of
    `finished_at`)."""
    # Retention's statements as History runs them (recorded, then planned below).
    ran: list[tuple[str, tuple[object, ...]]] = []
    fetch = repository.fetch

    async def recording(statement: str, *args: object) -> list[asyncpg.Record]:
        ran.append((statement, args))
        return await fetch(statement, *args)

    monkeypatch.setattr(repository, "fetch", recording)
    await History(repository, 86_400.0, 3 * 86_400.0, 3 * 86_400.0).maintain()
    purges = {statement: args for statement, args in ran if "finished_at < $1" in statement}
    assert len(purges) == 2, ran  # one per tree
    connection = await asyncpg.connect(clean_database)
    try:
        await fill_history(connection)
        by_id = await generic_plan(connection, GET_STATEMENT, "gen_random_uuid(), NULL")
        retry = await generic_plan(connection, RETRY_STATEMENT, "gen_random_uuid(), NULL")
        redrive = await generic_plan(connection, REDRIVE_STATEMENT, "NULL, NULL, 500, NULL")
        completed = listing_statement(["status = $1"], False, 2, 3, JobStatus.COMPLETED)
        listing = await generic_plan(connection, completed, "'COMPLETED', 50, 1000000")
        depth = await generic_plan(connection, depth_statement(), "")
        purged = {
            statement: await generic_plan(connection, statement, literals(*args))
            for statement, args in purges.items()
        }
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
    # A listing of completed jobs walks the history's `done` tree only (the status is a
    # parameter: the dead tree is pruned when the plan starts), and no leased row.
    assert "Subplans Removed: 1" in listing, listing
    assert "job_history_dead" not in listing, listing
    assert "job_history_done_" in listing, listing
    # The depth counts dead letters in the dead tree only.
    assert "job_history_done" not in depth, depth
    assert "job_history_dead_" in depth, depth
    # Retention's deletes of rows the DEFAULT partitions caught read just those partitions.
    for statement, plan in purged.items():
        tree = "done" if "job_history_done_default" in statement else "dead"
        read = set(re.findall(r"on (job_history_\w+)", plan))
        assert read == {f"job_history_{tree}_default"}, plan


async def test_listings_walk_indexes_and_leased_jobs_stay_out_of_the_listing_indexes(
    repository: JobRepository, clean_database: str
) -> None:
    # A claim's UPDATE adds no entry to the listing indexes (they leave PROCESSING rows out),
    # and every listing still reaches the table by an index: the leased rows by the reaper's.
    connection = await asyncpg.connect(clean_database)
    try:
        await fill_history(connection)
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
            plans[name] = await generic_plan(
                connection, statement, f"{args + ', ' if conditions else ''}50, 1000000"
            )
        counts = await generic_plan(connection, depth_statement("$1"), "'default'")
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
        await fill_history(connection, analyze=False)
        rows = encode_rows([new_job() for _ in range(100)])
        plan = await generic_plan(connection, ENQUEUE_ASYNCPG, f"'{rows}'")
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

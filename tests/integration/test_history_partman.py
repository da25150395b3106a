"""The history's partitions managed by pg_partman (`QUEUE_PARTITION_MANAGER`): registration
of both trees, slots ahead, settles landing in pg_partman's slots, retention by pg_partman,
`auto` choosing by the extension, a live switch from jobq's loop, concurrent replicas.

Each test owns a database copied from the migrated template, with the extension created in it
(`CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman`) where the test says so.
The `pg_partman` fixture makes the extension available on the server first (Debian's package,
through `infra.tools.ensure_pg_partman`) and fails, never skips, when it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import pydantic
import pytest

from services.queue.history import (
    AHEAD,
    History,
    PartitionManagerUnavailable,
    partition_name,
)
from services.queue.repository import JobRepository, create_pool
from services.queue.settings import QueueSettings
from tests.conftest import own_database
from tests.helpers import new_job

WIDTH, RETENTION, DEAD_RETENTION = 60.0, 180.0, 600.0

_INSERT_FINISHED = """
INSERT INTO job_history (id, tenant, queue, task_type, payload, status, priority, attempts,
                         releases, max_attempts, visible_at, ready_at, cancel_requested,
                         awaited, errors, created_at, updated_at, finished_at)
VALUES ($1, 'default', 'default', 'noop', '{}', $2, 0, 1, 0, 5, now(), now(), false, false,
        '[]', now(), now(), $3)
"""


@contextlib.asynccontextmanager
async def _database(
    postgres_base: str, template: str, name: str, *, partman: bool
) -> AsyncIterator[tuple[asyncpg.Connection, JobRepository]]:
    """A migrated database of the test's own: a connection (UTC) and the queue's repository.
    Without the migration's daily slots, so the short slots of the tests start from a tree
    holding only its DEFAULT partition; `partman`: with the extension created."""
    async with own_database(postgres_base, template, name) as url:
        connection = await asyncpg.connect(url)
        await connection.execute("SET TimeZone = 'UTC'")
        pool = await create_pool(url, size=10)
        try:
            for tree in ("done", "dead"):
                for row in await connection.fetch(
                    "SELECT inhrelid::regclass::text AS name FROM pg_inherits"
                    " WHERE inhparent = $1::regclass",
                    f"job_history_{tree}",
                ):
                    if not row["name"].endswith("_default"):
                        await connection.execute(f"DROP TABLE {row['name']}")
            if partman:
                await _create_extension(connection)
            yield connection, JobRepository(pool)
        finally:
            await pool.close()
            await connection.close()


async def _create_extension(connection: asyncpg.Connection) -> None:
    await connection.execute("CREATE SCHEMA partman")
    await connection.execute("CREATE EXTENSION pg_partman SCHEMA partman")


async def _settled(repository: JobRepository, n: int = 1) -> list[uuid.UUID]:
    """`n` jobs submitted, claimed and acknowledged (moved to the history); their ids."""
    await repository.insert_many([new_job() for _ in range(n)])
    jobs = await repository.claim(["default"], "w", n, 30)
    assert len(jobs) == n
    await repository.ack_many([(job.id, job.receipt_handle, None) for job in jobs])
    return [job.id for job in jobs]


async def _home(connection: asyncpg.Connection, job_id: uuid.UUID) -> str:
    """The partition holding the finished job `job_id`."""
    home: str = await connection.fetchval(
        "SELECT tableoid::regclass::text FROM job_history WHERE id = $1", job_id
    )
    return home


def _assert_no_overlap(children: dict[str, tuple[datetime, datetime]]) -> None:
    ranges = sorted(children.values())
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start, f"overlapping partitions: {sorted(children.items(), key=str)}"


async def _readable_once(connection: asyncpg.Connection, ids: list[uuid.UUID]) -> None:
    rows = await connection.fetch(
        "SELECT id, count(*) AS n FROM job_all WHERE id = ANY($1::uuid[]) GROUP BY id", ids
    )
    counts = {row["id"]: row["n"] for row in rows}
    assert counts == dict.fromkeys(ids, 1), counts


def _partman(name: str) -> bool:
    return "_p2" in name


async def test_a_pass_registers_both_trees_makes_slots_ahead_and_settles_land_in_them(
    postgres_base: str, template_database: str, fresh_database_name: str, pg_partman: str
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=True) as (
        connection,
        repository,
    ):
        keeper = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "pg_partman")
        assert await keeper.start() == "pg_partman"
        first = await keeper.maintain()
        assert first.failed == [] and first.manager == "pg_partman"
        assert sorted(first.registered) == ["job_history_dead", "job_history_done"]
        config = {
            row["parent_table"]: row
            for row in await connection.fetch("SELECT * FROM partman.part_config")
        }
        assert set(config) == {"public.job_history_done", "public.job_history_dead"}
        done, dead = config["public.job_history_done"], config["public.job_history_dead"]
        assert (done["retention"], dead["retention"]) == ("180 seconds", "600 seconds")
        for row in (done, dead):
            assert row["partition_type"] == "native" and row["premake"] == AHEAD
            assert not row["retention_keep_table"] and row["infinite_time_partitions"]
            assert not row["jobmon"]
            assert await connection.fetchval(
                "SELECT $1::text::interval", row["partition_interval"]
            ) == (timedelta(seconds=WIDTH))
        now = await connection.fetchval("SELECT now()")
        for tree in ("done", "dead"):
            children = await keeper.children(tree)
            assert children and all(_partman(name) for name in children), children
            _assert_no_overlap(children)
            newest = max(end for _, end in children.values())
            assert newest >= now + timedelta(seconds=WIDTH * (AHEAD - 1)), (now, children)
            assert any(s <= now < e for s, e in children.values()), "the current slot exists"
        # A settle lands in one of pg_partman's slots, not in DEFAULT.
        [job_id] = await _settled(repository)
        home = await _home(connection, job_id)
        assert _partman(home) and not home.endswith("_default"), home
        # A second pass registers nothing and fails nowhere.
        again = await keeper.maintain()
        assert again.failed == [] and again.registered == []


async def test_pg_partman_drops_partitions_past_retention_and_follows_the_settings(
    postgres_base: str, template_database: str, fresh_database_name: str, pg_partman: str
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=True) as (
        connection,
        repository,
    ):
        keeper = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "pg_partman")
        assert (await keeper.maintain()).failed == []
        # Old slots, made by pg_partman itself, each holding a finished job.
        now = await connection.fetchval("SELECT now()")
        old = {}
        for tree, status, age in (("done", "COMPLETED", 3600), ("dead", "DEAD_LETTER", 7200)):
            start = datetime.fromtimestamp((now.timestamp() - age) // WIDTH * WIDTH, now.tzinfo)
            await connection.execute(
                "SELECT partman.create_partition_time($1, ARRAY[$2::timestamptz], false)",
                f"public.job_history_{tree}",
                start,
            )
            job_id = uuid.uuid4()
            await connection.execute(_INSERT_FINISHED, job_id, status, start + timedelta(seconds=1))
            old[tree] = (job_id, await _home(connection, job_id))
            assert _partman(old[tree][1]), old
        swept = await keeper.maintain()
        assert swept.failed == []
        for tree, (job_id, name) in old.items():
            assert name in swept.dropped, swept
            assert await connection.fetchval("SELECT to_regclass($1)", name) is None
            assert (
                await connection.fetchval("SELECT count(*) FROM job_history WHERE id = $1", job_id)
                == 0
            )
            # Retained slots stay.
            assert await keeper.children(tree)
        # The retention in part_config follows the settings at every pass.
        longer = History(repository, WIDTH, 7200.0, 14 * 86400.0, "pg_partman")
        assert (await longer.maintain()).failed == []
        retention = dict(
            await connection.fetch("SELECT parent_table, retention FROM partman.part_config")
        )
        assert retention == {
            "public.job_history_done": "7200 seconds",
            "public.job_history_dead": "1209600 seconds",
        }


async def test_rows_in_default_for_a_slot_pg_partman_makes_move_into_it(
    postgres_base: str, template_database: str, fresh_database_name: str, pg_partman: str
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=True) as (
        connection,
        repository,
    ):
        keeper = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "pg_partman")
        assert (await keeper.maintain()).failed == []
        # The two newest slots gone (the loop stopped, say), and a settle in the older one's
        # range caught by DEFAULT: the slot pg_partman makes next would fail to attach.
        children = sorted((await keeper.children("done")).items(), key=lambda item: item[1])
        (gone, (start, _)), (newest, _) = children[-2], children[-1]
        await connection.execute(f"DROP TABLE {newest}")
        await connection.execute(f"DROP TABLE {gone}")
        job_id = uuid.uuid4()
        await connection.execute(
            _INSERT_FINISHED, job_id, "COMPLETED", start + timedelta(seconds=1)
        )
        assert (await _home(connection, job_id)).endswith("_default")

        moved = await keeper.maintain()
        assert moved.failed == [], moved
        assert moved.default_moved == 1
        assert await _home(connection, job_id) == gone
        assert gone in moved.created
        _assert_no_overlap(await keeper.children("done"))
        await _readable_once(connection, [job_id])


async def test_auto_picks_pg_partman_when_the_extension_exists_and_jobq_when_not(
    postgres_base: str,
    template_database: str,
    fresh_database_name: str,
    pg_partman: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=False) as (
        connection,
        repository,
    ):
        auto = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "auto")
        with caplog.at_level(logging.INFO, logger="services.queue.history"):
            assert await auto.start() == "jobq"
            without = await auto.maintain()
        assert without.manager == "jobq" and without.failed == []
        assert without.created and not any(_partman(name) for name in without.created)
        assert any("managed by jobq's loop" in r.getMessage() for r in caplog.records)

        required = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "pg_partman")
        with pytest.raises(PartitionManagerUnavailable, match="CREATE EXTENSION pg_partman"):
            await required.start()
        refused = await required.maintain()
        assert refused.manager is None and refused.failed == ["pg_partman"]
        assert refused.created == []

        await _create_extension(connection)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="services.queue.history"):
            switched = await auto.maintain()
        assert switched.manager == "pg_partman" and switched.failed == [], switched
        assert sorted(switched.registered) == ["job_history_dead", "job_history_done"]
        assert any("managed by pg_partman" in r.getMessage() for r in caplog.records)
        assert await History(repository, WIDTH, RETENTION, DEAD_RETENTION, "jobq").start() == (
            "jobq"
        )


async def test_a_live_switch_from_jobqs_loop_keeps_every_job_readable_once(
    postgres_base: str, template_database: str, fresh_database_name: str, pg_partman: str
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=False) as (
        connection,
        repository,
    ):
        jobq = History(repository, WIDTH, RETENTION, DEAD_RETENTION, "auto")
        assert (await jobq.maintain()).manager == "jobq"
        now = await connection.fetchval("SELECT now()")
        # An old slot of jobq's, past retention once switched, holding a job.
        old_start = datetime.fromtimestamp((now.timestamp() - 3600) // WIDTH * WIDTH, now.tzinfo)
        await jobq.create("done", old_start, old_start + timedelta(seconds=WIDTH))
        expired = uuid.uuid4()
        await connection.execute(_INSERT_FINISHED, expired, "COMPLETED", old_start)
        settled = await _settled(repository, 5)
        legacy = await jobq.partitions("done")
        newest_end = max(end for _, end in legacy.values())
        # Caught by DEFAULT: one in the first range pg_partman makes, one far ahead.
        soon, far, dead = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await connection.execute(
            _INSERT_FINISHED, soon, "COMPLETED", newest_end + timedelta(seconds=30)
        )
        await connection.execute(_INSERT_FINISHED, far, "COMPLETED", now + timedelta(days=10))
        await connection.execute(_INSERT_FINISHED, dead, "DEAD_LETTER", now)
        everyone = [*settled, soon, far, dead]
        for job_id in (soon, far):
            assert (await _home(connection, job_id)).endswith("_default")

        await _create_extension(connection)
        switched = await jobq.maintain()
        assert switched.manager == "pg_partman" and switched.failed == [], switched
        assert sorted(switched.registered) == ["job_history_dead", "job_history_done"]

        await _readable_once(connection, everyone)
        for tree in ("done", "dead"):
            _assert_no_overlap(await jobq.children(tree))
        # pg_partman's slots start where jobq's newest ended; jobq's retained slots stay.
        children = await jobq.children("done")
        ours = {name: slot for name, slot in children.items() if _partman(name)}
        assert min(start for start, _ in ours.values()) == newest_end
        horizon = await connection.fetchval("SELECT now()") - timedelta(seconds=RETENTION)
        assert {name for name, (_, end) in legacy.items() if end > horizon} <= set(children)
        # jobq's expired slot went (by jobq's own step), with its job.
        old_name = partition_name("done", old_start, old_start + timedelta(seconds=WIDTH))
        assert old_name in switched.dropped
        assert await connection.fetchval("SELECT to_regclass($1)", old_name) is None
        # The row DEFAULT held for pg_partman's first range is in it; the far one still waits.
        assert _partman(await _home(connection, soon))
        assert (await _home(connection, far)).endswith("_default")
        # Settles keep landing in a slot (jobq's current one), and the next pass is quiet.
        [later] = await _settled(repository)
        assert not (await _home(connection, later)).endswith("_default")
        quiet = await jobq.maintain()
        assert quiet.failed == [] and quiet.registered == []
        await _readable_once(connection, [*everyone, later])


async def test_two_replicas_passing_at_once_do_not_fail(
    postgres_base: str, template_database: str, fresh_database_name: str, pg_partman: str
) -> None:
    async with _database(postgres_base, template_database, fresh_database_name, partman=True) as (
        connection,
        repository,
    ):
        url = f"{postgres_base}/{fresh_database_name}"
        pool = await create_pool(url, size=10)
        try:
            replicas = [
                History(repository, WIDTH, RETENTION, DEAD_RETENTION, "pg_partman"),
                History(JobRepository(pool), WIDTH, RETENTION, DEAD_RETENTION, "auto"),
            ]
            for _ in range(3):
                passes = await asyncio.gather(*(keeper.maintain() for keeper in replicas))
                assert [p.failed for p in passes] == [[], []], passes
            registered = [name for p in passes for name in p.registered]
            assert registered == []
            assert await connection.fetchval("SELECT count(*) FROM partman.part_config") == 2
            for tree in ("done", "dead"):
                _assert_no_overlap(await replicas[0].children(tree))
            [job_id] = await _settled(repository)
            assert _partman(await _home(connection, job_id))
        finally:
            await pool.close()


def test_the_setting_is_validated_at_the_boundary() -> None:
    assert QueueSettings().queue_partition_manager == "auto"
    assert QueueSettings(queue_partition_manager="pg_partman").queue_partition_manager == (
        "pg_partman"
    )
    with pytest.raises(pydantic.ValidationError, match="queue_partition_manager"):
        QueueSettings(queue_partition_manager="partman")  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="1s or more"):
        QueueSettings(queue_partition_manager="pg_partman", queue_history_partition=0.5)


async def test_the_service_refuses_to_start_when_required_pg_partman_is_missing(
    postgres_base: str,
    template_database: str,
    fresh_database_name: str,
    redis_url: str,
    pg_partman: str,
) -> None:
    from services.queue.app import create_app

    async with _database(postgres_base, template_database, fresh_database_name, partman=False):
        url = f"{postgres_base}/{fresh_database_name}"
        required = QueueSettings(
            database_url=url, redis_url=redis_url, queue_partition_manager="pg_partman"
        )
        with pytest.raises(BaseExceptionGroup) as refused:
            async with create_app(required).lifespan():
                pass
        assert refused.group_contains(PartitionManagerUnavailable, match="no pg_partman extension")
        # The default (`auto`) starts, with jobq's loop.
        async with create_app(QueueSettings(database_url=url, redis_url=redis_url)).lifespan():
            pass

"""The partitions of `job_history`: made ahead, dropped past retention, and the sweep of
finished rows left in `job` (docs/architecture.md#retention).

`job_history` is partitioned by LIST (status) into two trees, `job_history_done` (COMPLETED,
CANCELLED: kept `QUEUE_RETENTION`) and `job_history_dead` (DEAD_LETTER: kept
`QUEUE_DEAD_LETTER_RETENTION`), each partitioned by RANGE (finished_at) into slots of
`QUEUE_HISTORY_PARTITION` seconds aligned on the Unix epoch, plus a DEFAULT partition that
catches a settle whose slot does not exist (so a settle never fails for want of a partition).
Every replica's background loop, every `QUEUE_RETENTION_INTERVAL`:

1. creates the missing slots from the oldest still retained to `AHEAD` slots after now,
   each in one transaction of three statements (a table made LIKE the tree, the rows of its
   range the DEFAULT partition caught moved into it, ATTACH PARTITION), so a crash or an
   error between the steps leaves nothing behind: PostgreSQL's DDL is transactional;
2. drops the slots whose end is older than the retention (`DROP TABLE`), the whole of
   retention's cost: no row is deleted one by one;
3. deletes, in batches of 500, rows past retention that the DEFAULT partition holds (empty
   unless the loop stopped for longer than `AHEAD` slots);
4. moves finished rows still in `job` (left by a release before this one during a rollout)
   into the history, 500 per statement (the sweep), after the slots are made;
5. deletes idempotency keys whose window is over, 500 per statement (`idempotency_key`,
   docs/architecture.md#idempotency).

DDL waits at most `LOCK_TIMEOUT` for its locks: a DROP locks its tree (`job_history_done` or
`_dead`) exclusively for an instant, and settles inserting into the tree queue behind a DROP
that waits, so it must not wait long (a long transaction that read the history holds its
lock); a step that times out is tried again at the next tick. ATTACH takes a weaker lock on
the tree that settles do not conflict with (and an exclusive one on its DEFAULT partition).
Replicas doing the same step at once collide on the catalog (a name
already taken, a table already gone) and the loser's transaction rolls back; both are
harmless. The slot bounds are in the partitions' names (`job_history_done_<from>_<to>`,
UTC `YYYYmmddtHHMMSS`), so a changed width takes effect for new slots and never overlaps
existing ones.

The partitioning follows PostgreSQL's manual (5.11, "Table Partitioning": dropping a
partition instead of a bulk DELETE, and creating it ahead with a DEFAULT partition as a
safety net); pg_partman automates the same steps but is not needed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from common.errors import JobqError
from services.queue.repository import FORGET_KEYS_STATEMENT, SWEEP_STATEMENT, JobRepository

logger = logging.getLogger(__name__)

AHEAD = 3
"""Slots made ahead of the current one: the loop may stop this many widths before settles
start landing in the DEFAULT partition."""

LOCK_TIMEOUT = "200ms"
"""How long partition DDL waits for its lock before giving up until the next tick."""

BATCH = 500

TREES = ("done", "dead")
"""The two range-partitioned trees of `job_history` (see the module's docstring)."""

_NAME = re.compile(r"^job_history_(done|dead)_(\d{8}t\d{6})_(\d{8}t\d{6})$")
_STAMP = "%Y%m%dt%H%M%S"

_PARTITIONS = """
SELECT child.relname AS name
FROM pg_inherits
JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid
WHERE parent.relname = $1
"""

_STATUSES = {"done": "'COMPLETED', 'CANCELLED'", "dead": "'DEAD_LETTER'"}


def stamp(moment: datetime) -> str:
    """`moment` (UTC) as a partition name spells it."""
    return moment.astimezone(UTC).strftime(_STAMP)


def partition_name(tree: str, start: datetime, end: datetime) -> str:
    """The name of `tree`'s partition for [`start`, `end`)."""
    return f"job_history_{tree}_{stamp(start)}_{stamp(end)}"


def parse_name(name: str) -> tuple[str, datetime, datetime] | None:
    """(tree, start, end) of a slot partition's name; None for any other name (DEFAULT)."""
    match = _NAME.match(name)
    if match is None:
        return None
    start, end = (datetime.strptime(part, _STAMP).replace(tzinfo=UTC) for part in match.group(2, 3))
    return match.group(1), start, end


def slots(now: datetime, width: float, retention: float, ahead: int = AHEAD) -> list[datetime]:
    """Starts of the slots of `width` seconds (aligned on the epoch) from the one holding
    `now - retention` to `ahead` slots after the one holding `now`."""
    first = int((now.timestamp() - retention) // width)
    last = int(now.timestamp() // width) + ahead
    return [datetime.fromtimestamp(n * width, UTC) for n in range(first, last + 1)]


@dataclass
class Maintenance:
    """What one pass did: partitions created and dropped, rows deleted from the DEFAULT
    partitions, rows swept from `job`, and steps that failed (retried next tick)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    default_deleted: int = 0
    swept: int = 0
    keys_forgotten: int = 0
    failed: list[str] = field(default_factory=list)


class History:
    """Partition maintenance and the sweep (see the module's docstring). `width`,
    `retention` and `dead_letter_retention` are seconds."""

    def __init__(
        self,
        repository: JobRepository,
        width: float,
        retention: float,
        dead_letter_retention: float,
    ) -> None:
        self._repository = repository
        self.width = width
        self._retention = {"done": retention, "dead": dead_letter_retention}

    async def maintain(self, now: datetime | None = None) -> Maintenance:
        """One pass of steps 1 to 5; `now` (for the slots) defaults to the database's clock."""
        done = Maintenance()
        now = now or await self._repository.now()
        for tree in TREES:
            await self._tree(tree, now, done)
        # After the slots exist, so swept rows land in them rather than in DEFAULT.
        done.swept = await self.sweep()
        done.keys_forgotten = await self.forget_keys()
        if done.created or done.dropped or done.default_deleted or done.swept:
            logger.info(
                "history: created %d, dropped %d partition(s); %d row(s) deleted from the "
                "default partitions, %d swept from job",
                len(done.created),
                len(done.dropped),
                done.default_deleted,
                done.swept,
                extra={"event": "history_maintained", "partitions_created": done.created,
                       "partitions_dropped": done.dropped},
            )  # fmt: skip
        return done

    async def _tree(self, tree: str, now: datetime, done: Maintenance) -> None:
        retention = self._retention[tree]
        existing = await self.partitions(tree)
        for start in slots(now, self.width, retention):
            end = start + timedelta(seconds=self.width)
            if end.timestamp() <= now.timestamp() - retention:
                continue
            if any(s < end and start < e for s, e in existing.values()):
                continue
            name = partition_name(tree, start, end)
            try:
                await self.create(tree, start, end)
            except (asyncpg.PostgresError, JobqError, OSError) as exc:
                done.failed.append(name)
                logger.warning("history: could not create %s: %s", name, exc)
            else:
                done.created.append(name)
                existing[name] = (start, end)
        horizon = now - timedelta(seconds=retention)
        for name, (_, end) in sorted(existing.items(), key=lambda item: item[1]):
            if end > horizon:
                continue
            try:
                await self.drop(name)
            except (asyncpg.PostgresError, JobqError, OSError) as exc:
                done.failed.append(name)
                logger.warning("history: could not drop %s: %s", name, exc)
            else:
                done.dropped.append(name)
        done.default_deleted += await self._purge_default(tree, horizon)

    async def partitions(self, tree: str) -> dict[str, tuple[datetime, datetime]]:
        """`tree`'s slot partitions: name → (start, end)."""
        rows = await self._repository.fetch(_PARTITIONS, f"job_history_{tree}")
        found: dict[str, tuple[datetime, datetime]] = {}
        for row in rows:
            parsed = parse_name(row["name"])
            if parsed is not None:
                found[row["name"]] = (parsed[1], parsed[2])
        return found

    async def create(self, tree: str, start: datetime, end: datetime) -> None:
        """Make `tree`'s partition for [`start`, `end`) in one transaction: the table, the
        rows of its range out of the DEFAULT partition into it, the ATTACH (which checks the
        DEFAULT partition holds no more rows of the range)."""
        name = partition_name(tree, start, end)
        async with self._repository.connection() as connection, connection.transaction():
            await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            await connection.execute(
                f"CREATE TABLE {name} (LIKE job_history_{tree} INCLUDING DEFAULTS"
                " INCLUDING CONSTRAINTS)"
            )
            await connection.execute(
                f"WITH caught AS (DELETE FROM job_history_{tree}_default"
                " WHERE finished_at >= $1 AND finished_at < $2 RETURNING *)"
                f" INSERT INTO {name} SELECT * FROM caught",
                start,
                end,
            )
            await connection.execute(
                f"ALTER TABLE job_history_{tree} ATTACH PARTITION {name}"
                f" FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )

    async def drop(self, name: str) -> None:
        """Drop the partition `name` (retention)."""
        if _NAME.match(name) is None:
            raise ValueError(f"not a slot partition of job_history: {name!r}")
        async with self._repository.connection() as connection, connection.transaction():
            await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            await connection.execute(f"DROP TABLE {name}")

    async def _purge_default(self, tree: str, horizon: datetime) -> int:
        # Rows finished before `horizon` that the DEFAULT partition caught: a few short
        # DELETEs (never any when the loop runs, since settles then land in the slots).
        statement = (
            f"DELETE FROM job_history_{tree}_default WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM job_history_{tree}_default WHERE finished_at < $1 LIMIT $2))"
            " RETURNING 1"
        )
        total = 0
        while True:
            rows = await self._repository.fetch(statement, horizon, BATCH)
            total += len(rows)
            if len(rows) < BATCH:
                return total

    async def forget_keys(self) -> int:
        """Delete idempotency keys whose window is over, 500 per statement; how many."""
        total = 0
        while True:
            rows = await self._repository.fetch(FORGET_KEYS_STATEMENT)
            forgotten = int(rows[0]["forgotten"])
            total += forgotten
            if forgotten < BATCH:
                return total

    async def sweep(self) -> int:
        """Move finished rows left in `job` into the history, `BATCH` per statement; how many."""
        total = 0
        while True:
            rows = await self._repository.fetch(SWEEP_STATEMENT, BATCH)
            moved = int(rows[0]["moved"])
            total += moved
            if moved < BATCH:
                return total

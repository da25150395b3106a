"""The partitions of `job_history`: made ahead, dropped past retention, and the sweep of
finished rows left in `job` (docs/architecture.md#retention).

`job_history` is partitioned by LIST (status) into two trees, `job_history_done` (COMPLETED,
CANCELLED: kept `QUEUE_RETENTION`) and `job_history_dead` (DEAD_LETTER: kept
`QUEUE_DEAD_LETTER_RETENTION`), each partitioned by RANGE (finished_at) into slots of
`QUEUE_HISTORY_PARTITION` seconds aligned on the Unix epoch, plus a DEFAULT partition
(`job_history_<tree>_default`) that catches a settle whose slot does not exist (so a settle
never fails for want of a partition).

Who makes and drops the slots is `QUEUE_PARTITION_MANAGER`: `jobq` (this module's own steps 1
and 2 below), `pg_partman` (the extension, steps 1p and 2p), or `auto` (the default:
pg_partman when the extension is installed in the database, i.e. listed in `pg_extension`,
else jobq), decided again at every pass and logged at startup and whenever it changes
(`History.start`, `History.manager_in_use`). jobq never runs CREATE EXTENSION: the operator does
(`CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman;`), and the schema is read
from `pg_extension`. Every replica's background loop, every `QUEUE_RETENTION_INTERVAL`:

1. (jobq) creates the missing slots from the oldest still retained to `AHEAD` slots after now,
   each in one transaction of three statements (a table made LIKE the tree, the rows of its
   range the DEFAULT partition caught moved into it, ATTACH PARTITION), so a crash or an
   error between the steps leaves nothing behind: PostgreSQL's DDL is transactional. A slot
   overlapping any existing partition of the tree (by its bounds in the catalog, whoever made
   it) is skipped;
2. (jobq) drops the partitions whose end is older than the retention (`DROP TABLE`), the whole
   of retention's cost: no row is deleted one by one;

   1p. (pg_partman) registers each tree with `create_parent` (native, interval
   `QUEUE_HISTORY_PARTITION` seconds, premake `AHEAD`) unless `part_config` lists it, in one
   transaction that also swaps the DEFAULT partition (create_parent makes its own, named like
   jobq's: the old one is detached, create_parent runs, its rows are inserted back through
   the tree and it is dropped). The first pg_partman slot starts where the newest existing
   partition ends (jobq's slots of a live system: ranges never overlap) or at the slot
   holding now - retention on a tree without any. Every pass sets `retention` (seconds),
   `retention_keep_table = false`, `infinite_time_partitions = true`, `premake`, `jobmon =
   false` and `ignore_default_data = true` in `part_config`, so the configuration follows the
   settings;
   2p. (pg_partman) drops jobq's own slots past retention (step 2 for jobq-named slots: the
   slots jobq made before the switch age out as before), then calls `run_maintenance` for the
   tree (`p_jobmon := false`), which makes slots ahead and drops those past retention, and,
   when the caller passed `now`, `drop_partition_time` at `now`. When a slot to be made has
   rows in the DEFAULT partition (ATTACH refuses), `partition_data_time` moves the oldest
   slot's worth of them into a new slot and maintenance is tried again (a few times per pass,
   only for rows finished before `AHEAD + 2` slots after now);
3. deletes, in batches of 500, rows past retention that the DEFAULT partition holds (empty
   unless the loop stopped for longer than `AHEAD` slots); with pg_partman before step 2p;
4. moves finished rows still in `job` (left by a release before this one during a rollout)
   into the history, 500 per statement (the sweep), after the slots are made;
5. deletes idempotency keys whose window is over, 500 per statement (`idempotency_key`,
   docs/architecture.md#idempotency).

DDL waits at most `LOCK_TIMEOUT` for its locks: a DROP locks its tree (`job_history_done` or
`_dead`) exclusively for an instant, and settles inserting into the tree queue behind a DROP
that waits, so it must not wait long (a long transaction that read the history holds its
lock); a step that times out is tried again at the next tick. ATTACH takes a weaker lock on
the tree that settles do not conflict with (and an exclusive one on its DEFAULT partition).
Replicas doing the same step at once collide on the catalog (a name already taken, a table
already gone) and the loser's transaction rolls back; both are harmless. The pg_partman steps
are serialised by a transaction advisory lock (`PARTMAN_LOCK_KEY`, tried, never waited for: a
replica that does not get it skips the step for this pass), and pg_partman's run_maintenance
takes its own. jobq's slot bounds are in the partitions' names
(`job_history_done_<from>_<to>`, UTC `YYYYmmddtHHMMSS`), pg_partman's start in theirs
(`job_history_done_p<YYYY_MM_DD[_HH24MISS]>`), so a changed width takes effect for new slots
and never overlaps existing ones (pg_partman's interval is fixed at registration: a change is
logged, not applied).

The partitioning follows PostgreSQL's manual (5.11, "Table Partitioning": dropping a
partition instead of a bulk DELETE, and creating it ahead with a DEFAULT partition as a
safety net); pg_partman (https://github.com/pgpartman/pg_partman, 4.7: `create_parent`,
`run_maintenance`, `partition_data_time`, `part_config`) automates the same steps where it is
installed, and jobq's loop does them where it is not.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import asyncpg

from common.errors import JobqError
from services.queue.repository import FORGET_KEYS_STATEMENT, SWEEP_STATEMENT, JobRepository

logger = logging.getLogger(__name__)

AHEAD = 3
"""Slots made ahead of the current one: the loop may stop this many widths before settles
start landing in the DEFAULT partition (pg_partman's `premake`)."""

LOCK_TIMEOUT = "200ms"
"""How long partition DDL waits for its lock before giving up until the next tick."""

BATCH = 500

TREES = ("done", "dead")
"""The two range-partitioned trees of `job_history` (see the module's docstring)."""

PARTMAN = "pg_partman"
"""The extension's name in `pg_extension`."""

PARTMAN_LOCK_KEY = 0x6A6F6271_00000003
"""The transaction advisory lock a replica holds while it registers or maintains a tree with
pg_partman (the migrations hold …01, the index rebuild …02)."""

MOVE_TRIES = AHEAD + 2
"""How many times one pass moves rows out of the DEFAULT partition for pg_partman and tries
its maintenance again."""

Manager = Literal["auto", "jobq", "pg_partman"]
"""`QUEUE_PARTITION_MANAGER`: who makes and drops the slots."""

_NAME = re.compile(r"^job_history_(done|dead)_(\d{8}t\d{6})_(\d{8}t\d{6})$")
_PARTMAN_NAME = re.compile(r"^job_history_(done|dead)_p\d{4}(_\d{2}){2}(_\d{6})?$")
_STAMP = "%Y%m%dt%H%M%S"

_PARTITIONS = """
SELECT child.relname AS name
FROM pg_inherits
JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid
WHERE parent.relname = $1
"""

_CHILDREN = r"""
SELECT child.relname AS name, bounds[1]::timestamptz AS start, bounds[2]::timestamptz AS end
FROM pg_inherits
JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent
JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid,
LATERAL regexp_match(pg_get_expr(child.relpartbound, child.oid),
                     'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS bounds
WHERE parent.relname = $1 AND bounds IS NOT NULL
"""
"""Every RANGE partition of a tree (not the DEFAULT one) with its bounds from the catalog."""

_PARTMAN_SCHEMA = """
SELECT pg_namespace.nspname AS schema FROM pg_extension
JOIN pg_namespace ON pg_namespace.oid = pg_extension.extnamespace
WHERE pg_extension.extname = $1
"""

_TREE_SCHEMA = """
SELECT pg_namespace.nspname FROM pg_class
JOIN pg_namespace ON pg_namespace.oid = pg_class.relnamespace WHERE pg_class.oid = $1::regclass
"""

_STATUSES = {"done": "'COMPLETED', 'CANCELLED'", "dead": "'DEAD_LETTER'"}


class PartitionManagerUnavailable(RuntimeError):
    """`QUEUE_PARTITION_MANAGER=pg_partman` but the database has no pg_partman extension (or
    the partition width is under pg_partman's 1 s): the message says what to do."""


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


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _seconds(value: float) -> str:
    """`value` seconds as a PostgreSQL interval literal (`'86400 seconds'`, `'1.5 seconds'`)."""
    return f"{int(value) if value == int(value) else value!r} seconds"


@dataclass
class Maintenance:
    """What one pass did: which manager made and dropped the slots (`jobq` or `pg_partman`,
    None when none could run), partitions created and dropped, rows deleted from the DEFAULT
    partitions, rows moved out of them into new pg_partman slots, rows swept from `job`,
    trees registered with pg_partman, and steps that failed (retried next tick)."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    default_deleted: int = 0
    swept: int = 0
    keys_forgotten: int = 0
    failed: list[str] = field(default_factory=list)
    manager: str | None = None
    registered: list[str] = field(default_factory=list)
    default_moved: int = 0


class History:
    """Partition maintenance and the sweep (see the module's docstring). `width`,
    `retention` and `dead_letter_retention` are seconds; `manager` is
    `QUEUE_PARTITION_MANAGER` (`auto`, `jobq` or `pg_partman`)."""

    def __init__(
        self,
        repository: JobRepository,
        width: float,
        retention: float,
        dead_letter_retention: float,
        manager: Manager = "jobq",
    ) -> None:
        if manager not in ("auto", "jobq", "pg_partman"):
            raise ValueError(f"a partition manager is auto, jobq or pg_partman, not {manager!r}")
        self._repository = repository
        self.width = width
        self.manager = manager
        self._retention = {"done": retention, "dead": dead_letter_retention}
        self._in_use: str | None = None

    async def start(self) -> str:
        """Decide and log (INFO) which manager runs the partitions: `jobq` or `pg_partman`.
        Raises PartitionManagerUnavailable when `pg_partman` is asked for and the database
        lacks it (the service refuses to start), ServiceUnavailable/OSError when the database
        cannot be reached."""
        return await self.manager_in_use()

    async def partman_schema(self) -> str | None:
        """The schema the pg_partman extension is installed in (`pg_extension`), or None."""
        rows = await self._repository.fetch(_PARTMAN_SCHEMA, PARTMAN)
        return str(rows[0]["schema"]) if rows else None

    async def manager_in_use(self) -> str:
        """`pg_partman` or `jobq`: the setting, with `auto` resolved by whether the database has
        the extension (and the width is at least pg_partman's 1 s). Logs the decision when it
        is the first or a change. Raises PartitionManagerUnavailable (see `start`)."""
        schema = None if self.manager == "jobq" else await self.partman_schema()
        if self.manager == "pg_partman" and (schema is None or self.width < 1):
            self._in_use = None
            raise PartitionManagerUnavailable(
                "QUEUE_PARTITION_MANAGER=pg_partman but "
                + (
                    "the database has no pg_partman extension: install it (Debian:"
                    " postgresql-<major>-partman) and run `CREATE SCHEMA partman; CREATE"
                    " EXTENSION pg_partman SCHEMA partman;`, or set QUEUE_PARTITION_MANAGER"
                    " to auto or jobq"
                    if schema is None
                    else f"QUEUE_HISTORY_PARTITION={self.width:g}s is under pg_partman's 1 s"
                )
            )
        chosen = "pg_partman" if schema is not None and self.width >= 1 else "jobq"
        if chosen != self._in_use:
            if chosen == "pg_partman":
                reason = f"extension {PARTMAN} in schema {schema}"
            elif self.manager == "jobq":
                reason = "QUEUE_PARTITION_MANAGER=jobq"
            elif schema is None:
                reason = f"QUEUE_PARTITION_MANAGER=auto and no {PARTMAN} extension"
            else:
                reason = f"QUEUE_PARTITION_MANAGER=auto and a width under 1 s ({self.width:g})"
            logger.info(
                "history: partitions managed by %s (%s)",
                "pg_partman" if chosen == "pg_partman" else "jobq's loop",
                reason,
                extra={"event": "history_partition_manager", "partition_manager": chosen},
            )
            self._in_use = chosen
        return chosen

    async def maintain(self, now: datetime | None = None) -> Maintenance:
        """One pass of steps 1 to 5; `now` (for jobq's slots, the purge and, with pg_partman,
        an extra `drop_partition_time`) defaults to the database's clock. pg_partman makes
        slots ahead of the server's own clock whatever `now` is."""
        done = Maintenance()
        explicit = now is not None
        now = now or await self._repository.now()
        try:
            done.manager = await self.manager_in_use()
        except PartitionManagerUnavailable as exc:
            done.failed.append(PARTMAN)
            logger.error("history: no partitions made or dropped: %s", exc)
        if done.manager == "pg_partman":
            schema = await self.partman_schema()
            for tree in TREES:
                await self._partman_tree(tree, schema or PARTMAN, now, explicit, done)
        elif done.manager == "jobq":
            for tree in TREES:
                await self._tree(tree, now, done)
        else:
            for tree in TREES:
                done.default_deleted += await self._purge_default(tree, self._horizon(tree, now))
        # After the slots exist, so swept rows land in them rather than in DEFAULT.
        done.swept = await self.sweep()
        done.keys_forgotten = await self.forget_keys()
        if done.created or done.dropped or done.default_deleted or done.swept:
            logger.info(
                "history: created %d, dropped %d partition(s) (%s); %d row(s) deleted from the "
                "default partitions, %d swept from job",
                len(done.created),
                len(done.dropped),
                done.manager,
                done.default_deleted,
                done.swept,
                extra={"event": "history_maintained", "partitions_created": done.created,
                       "partitions_dropped": done.dropped, "partition_manager": done.manager},
            )  # fmt: skip
        return done

    def _horizon(self, tree: str, now: datetime) -> datetime:
        return now - timedelta(seconds=self._retention[tree])

    async def _tree(self, tree: str, now: datetime, done: Maintenance) -> None:
        retention = self._retention[tree]
        existing = await self.children(tree)
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
        horizon = self._horizon(tree, now)
        await self._drop_expired(existing, horizon, done)
        done.default_deleted += await self._purge_default(tree, horizon)

    async def _drop_expired(
        self, partitions: dict[str, tuple[datetime, datetime]], horizon: datetime, done: Maintenance
    ) -> None:
        for name, (_, end) in sorted(partitions.items(), key=lambda item: item[1]):
            if end > horizon:
                continue
            try:
                await self.drop(name)
            except (asyncpg.PostgresError, JobqError, OSError) as exc:
                done.failed.append(name)
                logger.warning("history: could not drop %s: %s", name, exc)
            else:
                done.dropped.append(name)

    async def partitions(self, tree: str) -> dict[str, tuple[datetime, datetime]]:
        """`tree`'s slot partitions made by jobq (by their names): name → (start, end)."""
        rows = await self._repository.fetch(_PARTITIONS, f"job_history_{tree}")
        found: dict[str, tuple[datetime, datetime]] = {}
        for row in rows:
            parsed = parse_name(row["name"])
            if parsed is not None:
                found[row["name"]] = (parsed[1], parsed[2])
        return found

    async def children(self, tree: str) -> dict[str, tuple[datetime, datetime]]:
        """Every RANGE partition of `tree`, jobq's or pg_partman's, with its bounds as the
        catalog holds them: name → (start, end). The DEFAULT partition is left out."""
        rows = await self._repository.fetch(_CHILDREN, f"job_history_{tree}")
        return {row["name"]: (row["start"], row["end"]) for row in rows}

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
        """Drop the partition `name` (retention): one of jobq's slots or, after a switch back
        from pg_partman, one of pg_partman's. ValueError for any other name."""
        if _NAME.match(name) is None and _PARTMAN_NAME.match(name) is None:
            raise ValueError(f"not a slot partition of job_history: {name!r}")
        async with self._repository.connection() as connection, connection.transaction():
            await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            await connection.execute(f"DROP TABLE {name}")

    # ----------------------------------------------------------------------------------------
    # pg_partman

    async def _partman_tree(
        self, tree: str, schema: str, now: datetime, explicit: bool, done: Maintenance
    ) -> None:
        parent = f"job_history_{tree}"
        before = set(await self.children(tree))
        try:
            if await self.register(tree, schema):
                done.registered.append(parent)
        except (asyncpg.PostgresError, JobqError, OSError) as exc:
            done.failed.append(parent)
            logger.warning("history: could not register %s with pg_partman: %s", parent, exc)
            return
        horizon = self._horizon(tree, now)
        # Before the maintenance, so rows it finds in DEFAULT are retained ones.
        done.default_deleted += await self._purge_default(tree, horizon)
        for _ in range(MOVE_TRIES):
            try:
                await self._run_maintenance(tree, schema, horizon, now if explicit else None)
                break
            except (asyncpg.PostgresError, JobqError, OSError) as exc:
                moved = 0
                if "default partition" in str(exc):
                    try:
                        moved = await self._move_default(tree, schema, now)
                    except (asyncpg.PostgresError, JobqError, OSError) as again:
                        exc = again
                    done.default_moved += moved
                if not moved:
                    done.failed.append(parent)
                    logger.warning("history: pg_partman maintenance of %s failed: %s", parent, exc)
                    break
        after = set(await self.children(tree))
        done.created += sorted(after - before)
        done.dropped += sorted(before - after)

    async def register(self, tree: str, schema: str) -> bool:
        """Register `tree` with pg_partman (`create_parent`, in schema `schema`) unless
        `part_config` lists it, then set its retention and options from the settings (every
        call); True when this call registered it. One transaction, holding
        `PARTMAN_LOCK_KEY` (tried: False without doing anything when another replica holds
        it). Raises asyncpg errors (a lock not had within `LOCK_TIMEOUT`)."""
        parent = f"job_history_{tree}"
        default = f"{parent}_default"
        registered = False
        async with self._repository.connection() as connection, connection.transaction():
            if not await self._partman_session(connection):
                return False
            qualified = f"{await connection.fetchval(_TREE_SCHEMA, parent)}.{parent}"
            config = await connection.fetchrow(
                f"SELECT partition_interval::interval AS width FROM {_quoted(schema)}.part_config"
                " WHERE parent_table = $1",
                qualified,
            )
            if config is None:
                now = await connection.fetchval("SELECT now()")
                horizon = now.timestamp() - self._retention[tree]
                first = datetime.fromtimestamp(horizon // self.width * self.width, UTC)
                ends = [row["end"] for row in await connection.fetch(_CHILDREN, parent)]
                start = max([first, *ends])
                caught = f"{parent}_default_jobq"
                is_default = await connection.fetchval(
                    "SELECT pg_get_expr(relpartbound, oid) = 'DEFAULT' FROM pg_class"
                    " WHERE oid = to_regclass($1)",
                    default,
                )
                if is_default:
                    # create_parent makes a DEFAULT partition of this very name.
                    await connection.execute(f"ALTER TABLE {parent} DETACH PARTITION {default}")
                    await connection.execute(f"ALTER TABLE {default} RENAME TO {caught}")
                await connection.execute(
                    f"SELECT {_quoted(schema)}.create_parent($1, 'finished_at', 'native', $2,"
                    " p_premake := $3, p_start_partition := $4, p_jobmon := false,"
                    " p_date_trunc_interval := 'second')",
                    qualified,
                    _seconds(self.width),
                    AHEAD,
                    start.isoformat(),
                )
                if is_default:
                    await connection.execute(f"INSERT INTO {parent} SELECT * FROM {caught}")
                    await connection.execute(f"DROP TABLE {caught}")
                registered = True
                logger.info(
                    "history: registered %s with pg_partman, slots of %gs from %s",
                    parent,
                    self.width,
                    start.isoformat(),
                    extra={"event": "history_partman_registered"},
                )
            elif config["width"] != timedelta(seconds=self.width):
                logger.warning(
                    "history: %s is registered with pg_partman in slots of %s, not"
                    " QUEUE_HISTORY_PARTITION=%gs: pg_partman's interval is kept",
                    parent,
                    config["width"],
                    self.width,
                )
            await connection.execute(
                f"UPDATE {_quoted(schema)}.part_config SET retention = $2,"
                " retention_keep_table = false, infinite_time_partitions = true, premake = $3,"
                " jobmon = false, ignore_default_data = true"
                " WHERE parent_table = $1 AND (retention IS DISTINCT FROM $2"
                " OR retention_keep_table OR NOT infinite_time_partitions OR premake <> $3"
                " OR jobmon OR NOT ignore_default_data)",
                qualified,
                _seconds(self._retention[tree]),
                AHEAD,
            )
        return registered

    async def _partman_session(self, connection: asyncpg.Connection) -> bool:
        """Within a transaction: the lock timeout, UTC (pg_partman truncates and names slots in
        the session's time zone), and `PARTMAN_LOCK_KEY` if free (True)."""
        await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await connection.execute("SET LOCAL TimeZone = 'UTC'")
        return bool(
            await connection.fetchval("SELECT pg_try_advisory_xact_lock($1)", PARTMAN_LOCK_KEY)
        )

    async def _run_maintenance(
        self, tree: str, schema: str, horizon: datetime, now: datetime | None
    ) -> None:
        """One transaction holding `PARTMAN_LOCK_KEY` (skipped when another replica holds it):
        jobq's own slots whose end is at or before `horizon` dropped (made before the switch),
        pg_partman's `run_maintenance` for `tree`, and `drop_partition_time` at `now` when
        given. Raises asyncpg errors (a lock not had within `LOCK_TIMEOUT`, a slot to make
        whose range has rows in DEFAULT)."""
        parent = f"job_history_{tree}"
        async with self._repository.connection() as connection, connection.transaction():
            if not await self._partman_session(connection):
                return
            for row in await connection.fetch(_CHILDREN, parent):
                if _NAME.match(row["name"]) and row["end"] <= horizon:
                    await connection.execute(f"DROP TABLE {row['name']}")
            qualified = f"{await connection.fetchval(_TREE_SCHEMA, parent)}.{parent}"
            await connection.execute(
                f"SELECT {_quoted(schema)}.run_maintenance($1, p_analyze := false,"
                " p_jobmon := false)",
                qualified,
            )
            if now is not None:
                await connection.execute(
                    f"SELECT {_quoted(schema)}.drop_partition_time($1,"
                    " p_reference_timestamp := $2)",
                    qualified,
                    now,
                )

    async def _move_default(self, tree: str, schema: str, now: datetime) -> int:
        """Rows of the oldest slot's worth in `tree`'s DEFAULT partition moved into a new
        pg_partman slot (`partition_data_time`, one batch), when they finished before `AHEAD
        + 2` slots after `now`; how many (0: nothing to move)."""
        parent = f"job_history_{tree}"
        limit = now + timedelta(seconds=self.width * (AHEAD + 2))
        async with self._repository.connection() as connection, connection.transaction():
            if not await self._partman_session(connection):
                return 0
            oldest = await connection.fetchval(f"SELECT min(finished_at) FROM {parent}_default")
            if oldest is None or oldest >= limit:
                return 0
            qualified = f"{await connection.fetchval(_TREE_SCHEMA, parent)}.{parent}"
            moved = await connection.fetchval(
                f"SELECT {_quoted(schema)}.partition_data_time($1, p_batch_count := 1,"
                " p_analyze := false)",
                qualified,
            )
            logger.info(
                "history: moved %d row(s) out of %s_default into a pg_partman slot",
                moved,
                parent,
                extra={"event": "history_default_moved"},
            )
            return int(moved or 0)

    # ----------------------------------------------------------------------------------------
    # Steps 3 to 5

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

"""What every benchmark phase shares: the servers, a directory for logs, the progress line,
and helpers to make databases and stacks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from benchmark import database
from benchmark.processes import ProcessMeter, postmaster_pid
from benchmark.progress import Progress
from infra.stack import LocalStack


@dataclass
class Context:
    """`base_url` is `postgresql://user@host:port` (no database); `redis_url` a Redis URL with
    its database number; `logs` where each stack writes its process logs."""

    base_url: str
    redis_url: str
    logs: Path
    progress: Progress
    postmaster: int = 0
    created: set[str] = field(default_factory=set)

    async def setup(self) -> None:
        """Migrate the template database once and find the server's process."""
        await database.make_template(self.base_url)
        connection = await asyncpg.connect(f"{self.base_url}/postgres")
        try:
            self.postmaster = await postmaster_pid(connection)
        finally:
            await connection.close()

    async def database(self, name: str, migrated: bool = True, root: Path | None = None) -> str:
        """A fresh database `jobq_bench_<name>` (see `database.fresh_database`), or one
        migrated by the checkout at `root` (`database.migrated_database`: an earlier
        revision's services need its own schema); its URL."""
        self.created.add(f"jobq_bench_{name}")
        if root is not None:
            return await database.migrated_database(self.base_url, f"jobq_bench_{name}", root)
        return await database.fresh_database(self.base_url, f"jobq_bench_{name}", migrated)

    async def cleanup(self) -> None:
        """Drop every database this run made (the 1M-row one is large), and the template."""
        for name in sorted(self.created | {database.TEMPLATE}):
            await database.drop_database(self.base_url, name)
        self.created.clear()

    def stack(
        self,
        name: str,
        database_url: str,
        workers: int = 0,
        environment: Mapping[str, str] | None = None,
        producer: bool = False,
    ) -> LocalStack:
        """A LocalStack (not started) without the SMTP sink, logging to `logs/<name>`."""
        return LocalStack(
            database_url,
            self.redis_url,
            self.logs / name,
            workers=workers,
            environment=dict(environment or {}),
            producer_enabled=producer,
            smtp_enabled=False,
        )

    def meter(
        self,
        processes: Mapping[str, list[int]],
        database_url: str,
        exclude: frozenset[int] = frozenset(),
    ) -> ProcessMeter:
        """A ProcessMeter (not started) over `processes` plus the PostgreSQL processes of the
        database at `database_url`, leaving out the backends `exclude`."""
        name = database_url.rsplit("/", 1)[-1]
        return ProcessMeter(processes, self.postmaster, name, exclude)


def stack_pids(stack: LocalStack, *names: str) -> dict[str, list[int]]:
    """Process classes of a running stack: `queue`, `producer`, `workers` (every running
    `worker<n>`), limited to `names` when given."""
    classes: dict[str, list[int]] = {}
    for name, process in stack.processes.items():
        if process.poll() is not None:
            continue
        klass = "workers" if name.startswith("worker") else name
        if not names or klass in names:
            classes.setdefault(klass, []).append(process.pid)
    return classes

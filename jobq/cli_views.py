"""`jobq queues`, `workers`, `schedules`, `top`, and `retry`/`cancel --filter`: the operator
views of the command line, on `Client` (README, "Command line"). Registered on `jobq.cli.cli`
when that module loads."""

from __future__ import annotations

import contextlib
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from datetime import UTC, datetime

import click
from rich.console import Group
from rich.live import Live
from rich.table import Column, Table

from common.contracts import JobStatus, QueuesResponse
from common.errors import Forbidden
from common.operations import BulkAction, ThroughputResponse, WorkersResponse
from jobq.cli import EXIT_USAGE, Settings, _settings, cli
from jobq.client import Client

_FILTER_KEYS = {"status", "queue", "task-type"}


def _queues_table(reply: QueuesResponse, rates: dict[str, tuple[int, int]] | None = None) -> Table:
    table = Table(Column("queue", no_wrap=True), "pending", "scheduled", "processing")
    table.add_column("dead letter")
    table.add_column("oldest pending")
    if rates is not None:
        table.add_column("done/min")
        table.add_column("failed/min")
    table.add_column("state")
    for q in reply.queues:
        row = [q.queue, str(q.pending), str(q.scheduled), str(q.processing), str(q.dead_letter)]
        row.append(f"{q.oldest_pending_age_seconds:.1f} s")
        if rates is not None:
            done, failed = rates.get(q.queue, (0, 0))
            row += [str(done), str(failed)]
        row.append("paused" if q.paused else "running")
        table.add_row(*row)
    return table


def _workers_table(reply: WorkersResponse) -> Table:
    table = Table(Column("worker", no_wrap=True), "queues", "slots", "claimed/min", "last seen")
    now = datetime.now(UTC)
    for w in reply.workers:
        total = "?" if w.slots_total is None else str(w.slots_total)
        ago = max((now - w.last_seen).total_seconds(), 0.0)
        table.add_row(
            w.name,
            ",".join(w.queues),
            f"{w.slots_in_use}/{total}",
            str(w.claimed_last_minute),
            f"{ago:.0f} s ago",
        )
    return table


@cli.command()
def queues() -> None:
    """Counts per queue: the key's tenant's jobs (an admin of * sees every job's)."""
    settings = _settings()
    with settings.client() as client:
        reply = client.queues()
    if settings.as_json:
        settings.emit(reply)
    else:
        settings.out.print(_queues_table(reply))


@cli.command()
def workers() -> None:
    """Every live worker: its queues, slots in use, claims in the last minute (an admin key)."""
    settings = _settings()
    with settings.client() as client:
        reply = client.workers()
    if settings.as_json:
        settings.emit(reply)
    else:
        settings.out.print(_workers_table(reply))


@cli.command()
def schedules() -> None:
    """Every recurring schedule: cron, last fired bucket and job, next fire (an admin key)."""
    settings = _settings()
    with settings.client() as client:
        reply = client.schedules()
    if settings.as_json:
        settings.emit(reply)
        return
    table = Table(Column("schedule", no_wrap=True), "cron", "queue", "task type", "last bucket")
    table.add_column("last job")
    table.add_column("next")
    for s in reply.schedules:
        table.add_row(
            s.name,
            s.cron,
            s.queue,
            s.task_type,
            str(s.last_bucket or "—"),
            str(s.last_job_id or "—"),
            str(s.next_fire_at),
        )
    settings.out.print(table)


def _last_minute(reply: ThroughputResponse) -> dict[str, tuple[int, int]]:
    """Per queue, the counts of the newest minute the reply has."""
    newest = max((p.minute for p in reply.points), default=None)
    return {p.queue: (p.completed, p.failed) for p in reply.points if p.minute == newest}


def _frame(client: Client, admin: bool) -> Group:
    rates = _last_minute(client.throughput(2))
    parts: list[Table] = [_queues_table(client.queues(), rates)]
    if admin:
        parts.append(_workers_table(client.workers()))
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    parts[0].title = f"jobq top — {stamp} UTC (q to leave)"
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[bool]:
    """Standard input in cbreak mode while it is a terminal (True), restored afterwards."""
    if not sys.stdin.isatty():
        yield False
        return
    saved = termios.tcgetattr(sys.stdin)
    try:
        tty.setcbreak(sys.stdin.fileno())
        yield True
    finally:
        termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)


def _quit_pressed(wait: float) -> bool:
    """Wait up to `wait` seconds for a key on the terminal; True when it was q."""
    ready, _, _ = select.select([sys.stdin], [], [], wait)
    return bool(ready) and sys.stdin.read(1).lower() == "q"


@cli.command()
@click.option("--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True)
@click.option("--frames", type=click.IntRange(1), help="Stop after this many refreshes.")
def top(interval: float, frames: int | None) -> None:
    """A live view of queues (with the last minute's completions and failures) and workers,
    refreshed every second; q (or Ctrl-C) to leave."""
    settings = _settings()
    with settings.client() as client:
        admin = _workers_or_none(client) is not None
        if settings.as_json:
            for _ in range(frames or 1):
                settings.emit({"queues": client.queues(), "workers": _workers_or_none(client)})
                time.sleep(interval if frames and frames > 1 else 0)
            return
        if not settings.out.is_terminal:
            # Piped or captured: one frame after another, as a log of the drain.
            for shown in range(frames or 2**31):
                if shown:
                    time.sleep(interval)
                settings.out.print(_frame(client, admin))
            return
        shown = 0
        with (
            _keys() as interactive,
            Live(_frame(client, admin), console=settings.out, auto_refresh=False) as live,
            contextlib.suppress(KeyboardInterrupt),
        ):
            while frames is None or shown < frames - 1:
                if interactive and _quit_pressed(interval):
                    break
                if not interactive:
                    time.sleep(interval)
                live.update(_frame(client, admin), refresh=True)
                shown += 1


def _workers_or_none(client: Client) -> WorkersResponse | None:
    """The workers, or None for a key that may not read them (not an admin)."""
    try:
        return client.workers()
    except Forbidden:
        return None


def parse_filter(values: tuple[str, ...]) -> dict[str, str]:
    """`--filter status=DEAD_LETTER --filter queue=q` as a dict; raises click.BadParameter
    for another key or a value without `=`."""
    found: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or key not in _FILTER_KEYS or not value:
            raise click.BadParameter(
                f"{text!r}: use status=STATUS, queue=NAME or task-type=NAME", param_hint="--filter"
            )
        found[key] = value
    if "status" in found:
        try:
            found["status"] = JobStatus(found["status"].upper()).value
        except ValueError:
            raise click.BadParameter(
                f"{found['status']!r} is not a status", param_hint="--filter"
            ) from None
    return found


def bulk_by_filter(
    settings: Settings,
    action: BulkAction,
    filters: dict[str, str],
    limit: int | None,
    dry_run: bool,
    yes: bool,
) -> None:
    """Count the jobs `filters` match, then (unless `dry_run`) ask for confirmation stating
    the count (not with `yes`) and change them; prints what matched and changed."""
    if not filters:
        click.get_current_context().fail("give job ids or at least one --filter")
    kwargs = {
        "status": JobStatus(filters["status"]) if "status" in filters else None,
        "queue": filters.get("queue"),
        "task_type": filters.get("task-type"),
        "limit": limit,
    }
    with settings.client() as client:
        counted = client.bulk(action, dry_run=True, **kwargs)  # type: ignore[arg-type]
        if dry_run or counted.matched == 0:
            reply = counted
        else:
            if not yes and not click.confirm(f"{action} {counted.matched} jobs?", err=True):
                click.get_current_context().exit(EXIT_USAGE)
            reply = client.bulk(action, **kwargs)  # type: ignore[arg-type]
    if settings.as_json:
        settings.emit(reply)
    elif reply.dry_run:
        settings.out.print(f"would {action} {reply.matched} jobs", highlight=False)
    else:
        settings.out.print(f"{action}: {reply.changed} of {reply.matched} jobs", highlight=False)

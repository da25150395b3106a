"""`jobq`: the command line of jobq, on the client library (`Client`) and nothing else.

    jobq submit send-email --payload '{"to": "a@example.com"}'
    jobq submit --batch jobs.jsonl
    jobq ls --status DEAD_LETTER --queue default
    jobq redrive --queue default --dry-run

Where it connects (the first that is set wins): `--url` / `--api-key`, the profile named by
`--profile` or `JOBQ_PROFILE` in the profile file (`JOBQ_CONFIG`, default
`$XDG_CONFIG_HOME/jobq/config.toml`, TOML tables `[profiles.NAME]` with `url` and
`api_key`), `JOBQ_URL` / `JOBQ_API_KEY`, then http://127.0.0.1:8080 without a key.

Tables for people on standard output; `--json` prints JSON instead (one document per
command, one line per job for `ls`); errors go to standard error (as problem-details JSON with
`--json`). Exit codes (EXIT_*): 0 done, 1 refused by the server (or, for a batch or several
ids, any entry refused), 2 usage (a bad flag, file or profile), 3 jobq unreachable or the
outcome unknown. Shell completion is Click's: `eval "$(_JOBQ_COMPLETE=bash_source jobq)"`
(`zsh_source`, `fish_source`). Built on Click and Rich (README, "Command line").
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

import click
import httpx
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from common.contracts import (
    BATCH_MAX,
    LIST_LIMIT_MAX,
    BatchEntryResult,
    JobStatus,
    ListedJob,
    QueueState,
    SubmitJobRequest,
)
from common.errors import JobqError, OutcomeUnknown, RateLimited
from common.validation import check_payload, msgspec_error
from jobq.client import Client, minted_key

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
"""The exit codes: done; refused by the server; a usage error; jobq unreachable (or a
submit's outcome unknown)."""

DEFAULT_URL = "http://127.0.0.1:8080"
"""The producer `make run` starts, used when nothing else names one."""

_PROFILE_KEYS = frozenset({"url", "api_key"})
_RATE_LIMIT_ROUNDS = 5
"""How many times `submit --batch` sends again what the producer's rate limit refused."""
_RATE_LIMIT_PAUSE = 1.0
"""Seconds `submit --batch` waits before sending rate-limited entries again, when the reply
gave no `Retry-After`."""
_CELL = 60
"""Characters of a table cell (a last error) before it is cut."""


@dataclass
class Settings:
    """What every command connects with: the producer's `url`, the `api_key` (None: none),
    the HTTP `timeout` in seconds, and whether to print JSON (`as_json`)."""

    url: str
    api_key: str | None
    timeout: float
    as_json: bool
    out: Console = field(default_factory=lambda: Console(soft_wrap=True))
    err: Console = field(default_factory=lambda: Console(stderr=True, soft_wrap=True))

    def client(self) -> Client:
        """A `Client` for the producer."""
        return Client(self.url, api_key=self.api_key, timeout=self.timeout)

    def emit(self, value: Any) -> None:
        """Print `value` (a msgspec struct or plain data) as one line of JSON."""
        click.echo(msgspec.json.encode(value).decode())


def _profile(name: str) -> dict[str, str]:
    """The `[profiles.NAME]` table of the profile file. Raises click.UsageError when the
    file is missing or not TOML, the profile is absent, or a key is unknown or not text."""
    default = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = Path(os.environ.get("JOBQ_CONFIG") or default / "jobq" / "config.toml")
    try:
        profiles = tomllib.loads(path.read_text()).get("profiles", {})
    except OSError as exc:
        raise click.UsageError(f"profile {name!r}: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.UsageError(f"profile {name!r}: {path} is not TOML: {exc}") from None
    table = profiles.get(name) if isinstance(profiles, dict) else None
    if not isinstance(table, dict):
        raise click.UsageError(f"no profile {name!r} in {path} (a [profiles.{name}] table)")
    unknown = sorted(set(table) - _PROFILE_KEYS)
    if unknown:
        raise click.UsageError(f"profile {name!r} in {path}: unknown key {unknown[0]!r}")
    if not all(isinstance(value, str) for value in table.values()):
        raise click.UsageError(f"profile {name!r} in {path}: url and api_key must be strings")
    return table


def _exit_code(exc: JobqError) -> int:
    """EXIT_UNREACHABLE when no answer came (the client's transport failed, or a submit's
    outcome stayed unknown), else EXIT_REFUSED."""
    if isinstance(exc, OutcomeUnknown) or isinstance(exc.__cause__, httpx.TransportError):
        return EXIT_UNREACHABLE
    return EXIT_REFUSED


def _problem_lines(exc: JobqError, url: str) -> list[str]:
    """The error as people read it: title and status, detail, then each JSON pointer; when
    no answer came, what failed and the `url` asked."""
    if _exit_code(exc) == EXIT_UNREACHABLE and not isinstance(exc, OutcomeUnknown):
        return [f"error: {exc.detail} ({url})"]
    lines = [f"error: {exc.title} ({exc.status}): {exc.detail}"]
    lines += [f"  {entry.get('pointer') or '/'}: {entry.get('detail')}" for entry in exc.errors]
    if isinstance(exc, OutcomeUnknown) and exc.idempotency_key:
        lines.append(f"  send it again with --idempotency-key {exc.idempotency_key}")
    return lines


class _Group(click.Group):
    """The `jobq` group: a JobqError a command lets through is printed (problem details)
    and ends the command with its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobqError as exc:
            settings = ctx.find_object(Settings)
            if settings is not None and settings.as_json:
                problem = exc.to_problem()
                if isinstance(exc, OutcomeUnknown) and exc.idempotency_key:
                    problem["idempotencyKey"] = exc.idempotency_key
                click.echo(json.dumps(problem), err=True)
            else:
                for line in _problem_lines(exc, settings.url if settings else "?"):
                    click.echo(line, err=True)
            ctx.exit(_exit_code(exc))


@click.group(name="jobq", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", metavar="URL", help="The producer's base URL [JOBQ_URL].")
@click.option("--api-key", metavar="KEY", help="An API key [JOBQ_API_KEY].")
@click.option("--profile", metavar="NAME", help="A profile of the profile file [JOBQ_PROFILE].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
@click.option(
    "--request-timeout",
    type=click.FloatRange(0.1, 300),
    default=10.0,
    show_default=True,
    help="Seconds to wait for each answer.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    url: str | None,
    api_key: str | None,
    profile: str | None,
    as_json: bool,
    request_timeout: float,
) -> None:
    """The jobq command line: submit, inspect, retry, cancel and redrive jobs, and pause
    and limit queues, through the producer's API."""
    name = profile or os.environ.get("JOBQ_PROFILE")
    chosen = _profile(name) if name else {}
    resolved = url or chosen.get("url") or os.environ.get("JOBQ_URL") or DEFAULT_URL
    if not resolved.startswith(("http://", "https://")):
        raise click.BadParameter(f"{resolved!r} is not an http(s) URL", param_hint="--url")
    key = api_key or chosen.get("api_key") or os.environ.get("JOBQ_API_KEY") or None
    ctx.obj = Settings(resolved.rstrip("/"), key, request_timeout, as_json)


def _settings() -> Settings:
    """The group's Settings, for the command running now."""
    settings = click.get_current_context().find_object(Settings)
    assert settings is not None, "commands run inside the jobq group"
    return settings


# --- submit ----------------------------------------------------------------------------------


def _payload(text: str) -> dict[str, Any]:
    """A payload from `--payload`: JSON text, `@path` for a file's, `-` for standard input's.
    Raises click.BadParameter when it cannot be read or is not a JSON object."""
    try:
        if text == "-":
            text = sys.stdin.read()
        elif text.startswith("@"):
            text = Path(text[1:]).read_text()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {text[1:]}: {exc.strerror}", param_hint="--payload"
        ) from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    if not isinstance(value, dict):
        raise click.BadParameter("the payload must be a JSON object", param_hint="--payload")
    return value


@cli.command()
@click.argument("task_type", required=False)
@click.option("--payload", default="{}", metavar="JSON|@FILE|-", help="The job's payload.")
@click.option("--queue", default="default", show_default=True)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", type=float, default=0, help="Seconds before the job may run.")
@click.option("--max-attempts", type=int, help="Attempts before dead-lettering.")
@click.option("--timeout", type=int, help="Seconds a run may take.")
@click.option("--idempotency-key", metavar="KEY", help="Submitting it again returns the job.")
@click.option(
    "--idempotency-window",
    type=int,
    metavar="SECONDS",
    help="Seconds the key is held, 1..2592000 [the queue service's QUEUE_IDEMPOTENCY_WINDOW].",
)
@click.option(
    "--batch",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A JSON-lines file of submit bodies (as POST /jobs takes them), sent 500 at a time.",
)
@click.option(
    "--refused",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where --batch writes the lines it could not submit [BATCH.refused.jsonl].",
)
def submit(
    task_type: str | None,
    payload: str,
    queue: str,
    priority: int,
    delay: float,
    max_attempts: int | None,
    timeout: int | None,
    idempotency_key: str | None,
    idempotency_window: int | None,
    batch: Path | None,
    refused: Path | None,
) -> None:
    """Submit a job of TASK_TYPE, or every line of --batch."""
    settings = _settings()
    if batch is not None:
        if task_type is not None:
            raise click.UsageError("give TASK_TYPE or --batch, not both")
        _submit_batch(settings, batch, refused or batch.with_name(batch.name + ".refused.jsonl"))
        return
    if task_type is None:
        raise click.UsageError("missing TASK_TYPE (or --batch FILE)")
    with settings.client() as client:
        reply = client.submit(
            task_type,
            _payload(payload),
            queue=queue,
            priority=priority,
            delay_seconds=delay,
            max_attempts=max_attempts,
            timeout_seconds=timeout,
            idempotency_key=idempotency_key,
            idempotency_window_seconds=idempotency_window,
        )
    if settings.as_json:
        settings.emit(reply)
    else:
        settings.out.print(f"{reply.job_id} {reply.status}", highlight=False)


@dataclass
class BatchTally:
    """What `submit --batch` did: entries `accepted` (created), `replayed` (an idempotency
    key seen before), and `refused` by reason (problem title and detail), with the refused
    lines kept to write out."""

    accepted: int = 0
    replayed: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    lines: list[str] = field(default_factory=list)

    def refuse(self, reason: str, line: str) -> None:
        """Count one entry refused for `reason`, keeping its `line`."""
        self.refused[reason] += 1
        self.lines.append(line)


def _read_batch(path: Path, tally: BatchTally) -> list[tuple[str, SubmitJobRequest]]:
    """The valid lines of `path` (blank lines skipped) as (line, request), each request with
    an idempotency key (minted when the line has none, so a resend replays); a line that is
    not a valid submit body is refused into `tally`, as the producer would refuse it."""
    entries: list[tuple[str, SubmitJobRequest]] = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--batch") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = msgspec.json.decode(line, type=SubmitJobRequest)
            check_payload(request.payload)
        except msgspec.ValidationError as exc:
            tally.refuse(f"line {number}: {msgspec_error(str(exc)).detail}", line)
            continue
        except msgspec.DecodeError as exc:
            tally.refuse(f"line {number}: not JSON ({exc})", line)
            continue
        except JobqError as exc:
            tally.refuse(f"line {number}: {exc.detail}", line)
            continue
        if request.idempotency_key is None:
            request = msgspec.structs.replace(request, idempotency_key=minted_key())
        entries.append((line, request))
    return entries


def _keyed_line(request: SubmitJobRequest) -> str:
    """The line to resend `request` with: its body with the idempotency key it was sent with."""
    return msgspec.json.encode(request).decode()


def _send_chunk(
    client: Client, chunk: list[tuple[str, SubmitJobRequest]], tally: BatchTally
) -> list[tuple[str, SubmitJobRequest]]:
    """Submit one chunk; count each entry into `tally`; return the entries the producer's
    rate limit refused, to send again. A chunk whose outcome stayed unknown is refused whole,
    its lines written with their idempotency keys, so sending them again replays."""
    try:
        reply = client.submit_batch([request for _, request in chunk])
    except RateLimited:
        return chunk
    except OutcomeUnknown as exc:
        for _, request in chunk:
            tally.refuse(f"outcome unknown: {exc.detail}", _keyed_line(request))
        return []
    again: list[tuple[str, SubmitJobRequest]] = []
    for result in reply.results:
        line, request = chunk[result.index]
        if result.status == 202:
            tally.accepted += 1
        elif result.status == 200:
            tally.replayed += 1
        elif result.status == 429:
            again.append((line, request))
        else:
            tally.refuse(_entry_reason(result), line)
    return again


def _entry_reason(result: BatchEntryResult) -> str:
    """A refused entry's reason: its problem's title, then its detail."""
    error = result.error or {}
    return f"{error.get('title', result.status)}: {error.get('detail', '')}".rstrip(": ")


def _chunks(
    entries: list[tuple[str, SubmitJobRequest]],
) -> Iterator[list[tuple[str, SubmitJobRequest]]]:
    for start in range(0, len(entries), BATCH_MAX):
        yield entries[start : start + BATCH_MAX]


def _submit_batch(settings: Settings, path: Path, refused_path: Path) -> None:
    """`submit --batch`: every valid line of `path`, BATCH_MAX per request, with a progress
    bar on standard error; entries the rate limit refused are sent again up to
    _RATE_LIMIT_ROUNDS times; a summary at the end, the refused lines in `refused_path`.
    Exits EXIT_REFUSED when any line was refused."""
    tally = BatchTally()
    entries = _read_batch(path, tally)
    progress = Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=settings.err,
        disable=settings.as_json,
    )
    with settings.client() as client, progress:
        bar = progress.add_task("submit", total=len(entries))
        pending = entries
        for round_ in range(_RATE_LIMIT_ROUNDS + 1):
            again: list[tuple[str, SubmitJobRequest]] = []
            for chunk in _chunks(pending):
                left = _send_chunk(client, chunk, tally)
                again += left
                progress.advance(bar, len(chunk) - len(left))
            if not again:
                break
            if round_ == _RATE_LIMIT_ROUNDS:
                for line, _ in again:
                    tally.refuse("rate limited: sent again and still refused", line)
                progress.advance(bar, len(again))
                break
            time.sleep(_RATE_LIMIT_PAUSE)
            pending = again
    if tally.lines:
        refused_path.write_text("".join(line + "\n" for line in tally.lines))
    _batch_summary(settings, tally, refused_path)
    if tally.refused:
        click.get_current_context().exit(EXIT_REFUSED)


def _batch_summary(settings: Settings, tally: BatchTally, refused_path: Path) -> None:
    refused = sum(tally.refused.values())
    if settings.as_json:
        reasons = [{"reason": reason, "count": n} for reason, n in tally.refused.most_common()]
        settings.emit(
            {
                "accepted": tally.accepted,
                "replayed": tally.replayed,
                "refused": refused,
                "reasons": reasons,
                "refusedFile": str(refused_path) if refused else None,
            }
        )
        return
    settings.out.print(
        f"accepted {tally.accepted}, replayed {tally.replayed}, refused {refused}",
        highlight=False,
    )
    for reason, count in tally.refused.most_common(20):
        settings.out.print(f"  {count}x {reason}", highlight=False, markup=False)
    if refused:
        settings.out.print(f"refused lines written to {refused_path}", highlight=False)


# --- reading ---------------------------------------------------------------------------------


def _job_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a job id (a UUID)", param_hint="ID") from None


@cli.command()
@click.argument("job_id")
@click.option(
    "--wait",
    type=click.FloatRange(0),
    default=0,
    metavar="SECONDS",
    help="Wait up to this long for the job to finish (COMPLETED, DEAD_LETTER, CANCELLED).",
)
def get(job_id: str, wait: float) -> None:
    """Show one job: its fields, progress, payload, result and error history."""
    settings = _settings()
    with settings.client() as client:
        view = client.wait(_job_id(job_id), timeout=wait) if wait else client.get(_job_id(job_id))
    if settings.as_json:
        settings.emit(view)
        return
    table = Table(show_header=False, box=None)
    for name, value in msgspec.structs.asdict(view).items():
        if name in {"payload", "result", "errors", "progress"}:
            continue
        table.add_row(name, "" if value is None else str(value))
    if view.progress is not None:
        done = view.progress
        message = f" {done.message}" if done.message else ""
        shown = f"{done.fraction:.0%}{message} (attempt {done.attempt}, {done.at})"
        table.add_row("progress", Text(shown))  # the processor's text, not rich markup
    settings.out.print(table)
    settings.out.print("payload", style="bold")
    settings.out.print_json(data=view.payload)
    if view.result is not None:
        settings.out.print("result", style="bold")
        settings.out.print_json(data=view.result)
    for entry in view.errors:
        settings.out.print(f"attempt {entry.attempt} at {entry.at}: {entry.error}", markup=False)


_STATUSES = click.Choice([status.value for status in JobStatus], case_sensitive=False)


@cli.command(name="ls")
@click.option("--status", type=_STATUSES)
@click.option("--queue")
@click.option("--task-type")
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="Jobs to show."
)
@click.option("--all", "every", is_flag=True, help="Every matching job, page after page.")
def list_jobs(
    status: str | None, queue: str | None, task_type: str | None, limit: int, every: bool
) -> None:
    """List jobs, newest first (an admin key)."""
    settings = _settings()
    columns = ("id", "queue", "task type", "status", "attempts", "tenant", "created (UTC)", "error")
    table = Table(*columns)
    shown = 0
    with settings.client() as client:
        for job in _listed(client, status, queue, task_type, None if every else limit):
            shown += 1
            if settings.as_json:
                settings.emit(job)
                continue
            error = (job.last_error or "")[:_CELL]
            created = job.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
            cells = (job.queue, job.task_type, job.status, str(job.attempts), job.tenant)
            table.add_row(str(job.id), *cells, created, error)
    if not settings.as_json:
        settings.out.print(table)
        settings.out.print(f"{shown} jobs", highlight=False)


def _listed(
    client: Client, status: str | None, queue: str | None, task_type: str | None, most: int | None
) -> Iterator[ListedJob]:
    """The matching jobs page after page (keyset cursor), at most `most` (None: all)."""
    cursor: str | None = None
    left = most
    while left is None or left > 0:
        size = LIST_LIMIT_MAX if left is None else min(left, LIST_LIMIT_MAX)
        page = client.list(
            status=JobStatus(status.upper()) if status else None,
            queue=queue,
            task_type=task_type,
            limit=size,
            cursor=cursor,
        )
        yield from page.items[: left if left is not None else None]
        if left is not None:
            left -= len(page.items)
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


# --- acting on jobs --------------------------------------------------------------------------


def _each(action: str, job_ids: Sequence[str]) -> None:
    """`retry` or `cancel` every id; print each outcome; exit EXIT_REFUSED (EXIT_UNREACHABLE
    when no answer came) if any failed, after trying them all."""
    settings = _settings()
    ids = [_job_id(value) for value in job_ids]
    worst = EXIT_OK
    with settings.client() as client:
        call = client.retry if action == "retry" else client.cancel
        for job_id in ids:
            try:
                view = call(job_id)
            except JobqError as exc:
                worst = max(worst, _exit_code(exc))
                if settings.as_json:
                    settings.emit({"id": str(job_id), "error": exc.to_problem()})
                else:
                    settings.err.print(f"{job_id}: {exc.title}: {exc.detail}", markup=False)
                continue
            if settings.as_json:
                settings.emit(view)
            else:
                settings.out.print(f"{view.id} {view.status}", highlight=False)
    if worst:
        click.get_current_context().exit(worst)


def _by_filter(options: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `retry`/`cancel` that act on every job matching a filter."""
    for option in reversed(
        [
            click.option(
                "--filter",
                "filters",
                multiple=True,
                metavar="KEY=VALUE",
                help="Every matching job instead of ids: status=, queue=, task-type=.",
            ),
            click.option("--limit", type=click.IntRange(1), help="Change at most this many."),
            click.option("--dry-run", is_flag=True, help="Count the matching jobs; change none."),
            click.option("--yes", is_flag=True, help="Do not ask to confirm the count."),
        ]
    ):
        options = option(options)
    return options


def _ids_or_filter(
    action: str,
    job_ids: tuple[str, ...],
    filters: tuple[str, ...],
    limit: int | None,
    dry_run: bool,
    yes: bool,
) -> None:
    from jobq.cli_views import bulk_by_filter, parse_filter  # registered after this module

    if job_ids and filters:
        click.get_current_context().fail("give job ids or --filter, not both")
    if job_ids:
        _each(action, job_ids)
        return
    bulk_by_filter(
        _settings(),
        "retry" if action == "retry" else "cancel",
        parse_filter(filters),
        limit,
        dry_run,
        yes,
    )


def _ids_or_filter_command(action: str, help_text: str) -> None:
    """Register `jobq ACTION [ID…] [--filter …]` (retry or cancel)."""

    @cli.command(name=action, help=help_text)
    @click.argument("job_ids", nargs=-1)
    @_by_filter
    def command(
        job_ids: tuple[str, ...],
        filters: tuple[str, ...],
        limit: int | None,
        dry_run: bool,
        yes: bool,
    ) -> None:
        _ids_or_filter(action, job_ids, filters, limit, dry_run, yes)


_ids_or_filter_command(
    "retry",
    "Run dead-lettered or cancelled jobs again: by id, or every job matching --filter after "
    "confirming their count (an admin key).",
)
_ids_or_filter_command(
    "cancel",
    "Cancel jobs (a running one is stopped by its worker): by id, or every job matching "
    "--filter after confirming their count (an admin key).",
)


@cli.command()
@click.option("--queue")
@click.option("--task-type")
@click.option("--limit", type=click.IntRange(1), help="Move at most this many.")
@click.option("--dry-run", is_flag=True, help="Count what would move; move nothing.")
def redrive(queue: str | None, task_type: str | None, limit: int | None, dry_run: bool) -> None:
    """Move dead-lettered jobs back to PENDING (an admin key)."""
    settings = _settings()
    with settings.client() as client:
        if dry_run:
            count = sum(1 for _ in _listed(client, "DEAD_LETTER", queue, task_type, limit))
        else:
            count = client.redrive(queue=queue, task_type=task_type, limit=limit)
    if settings.as_json:
        settings.emit({"dryRun": dry_run, "count": count})
    else:
        verb = "would move" if dry_run else "moved"
        settings.out.print(f"{verb} {count} dead-lettered jobs", highlight=False)


# --- queues ----------------------------------------------------------------------------------


def _show_state(settings: Settings, state: QueueState) -> None:
    if settings.as_json:
        settings.emit(state)
        return
    paused = f"paused since {state.paused_at}" if state.paused else "running"
    change = state.last_change
    settings.out.print(f"{state.queue}: {paused}", highlight=False)
    settings.out.print(f"  last change: {change.what} by {change.by} at {change.at}")
    for limit in state.limits:
        bounds = {k: v for k, v in msgspec.structs.asdict(limit).items() if v is not None}
        task_type = bounds.pop("task_type")
        text = ", ".join(f"{k} {v}" for k, v in bounds.items())
        settings.out.print(f"  limit {task_type}: {text}", highlight=False)
    for weight in state.weights:
        settings.out.print(f"  weight {weight.tenant}: {weight.weight}", highlight=False)


def _change_state(change: Callable[[Client], QueueState]) -> None:
    """Make one queue-state change through a client; print the state it answered with."""
    settings = _settings()
    with settings.client() as client:
        state = change(client)
    _show_state(settings, state)


@cli.command()
@click.argument("queue")
def pause(queue: str) -> None:
    """Pause QUEUE: it takes submits but hands out nothing (an admin key of tenant *)."""
    _change_state(lambda client: client.pause(queue))


@cli.command()
@click.argument("queue")
def resume(queue: str) -> None:
    """Resume a paused QUEUE (an admin key of tenant *)."""
    _change_state(lambda client: client.resume(queue))


def _json_object(text: str, hint: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=hint) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=hint)
    return value


@cli.command()
@click.argument("queue")
@click.argument("limits", metavar="JSON")
def limits(queue: str, limits: str) -> None:
    """Replace QUEUE's limits by task type, e.g.
    '{"webhook": {"concurrency": 20, "tenant_concurrency": 3, "rate": 50, "burst": 10}}'
    ('{}' removes them; an admin key of tenant *)."""
    by_type = _json_object(limits, "JSON")
    if not all(isinstance(bounds, dict) for bounds in by_type.values()):
        raise click.BadParameter("each task type's limits must be a JSON object", param_hint="JSON")
    _change_state(lambda client: client.set_limits(queue, by_type))


def _weight(text: str) -> tuple[str, float]:
    tenant, sep, number = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return tenant, float(number)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not TENANT=WEIGHT", param_hint="WEIGHTS") from None


@cli.command()
@click.argument("queue")
@click.argument("weights", nargs=-1, metavar="TENANT=WEIGHT...")
def weights(queue: str, weights: tuple[str, ...]) -> None:
    """Replace QUEUE's tenant weights in the fair share, e.g. `acme=3` (none: every tenant
    weighs 1; an admin key of tenant *)."""
    parsed = dict(_weight(text) for text in weights)
    _change_state(lambda client: client.set_weights(queue, parsed))


def main(argv: Sequence[str] | None = None) -> None:
    """The `jobq` console script; exits with an EXIT_* code (Click's usage errors: 2)."""
    cli.main(args=argv, prog_name="jobq")


# The operator views' commands register themselves on `cli`.
from jobq import cli_views  # noqa: E402, F401

"""Queue service settings (docs/architecture.md#configuration)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from common.contracts import (
    DEFAULT_IDEMPOTENCY_WINDOW,
    DEFAULT_MAX_ATTEMPTS,
    IDEMPOTENCY_WINDOW_MAX,
    MAX_ATTEMPTS_MAX,
    MAX_ATTEMPTS_MIN,
    VISIBILITY_TIMEOUT_MAX,
)
from common.web.settings import Duration, HttpServiceSettings, Port, Token
from services.queue.schedules import parse_schedules

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/jobq"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


_SCHEMES = ("postgresql+asyncpg://", "postgresql://", "postgres://")


def _rest(url: str) -> str:
    for prefix in _SCHEMES:
        if url.startswith(prefix):
            return url[len(prefix) :]
    raise ValueError(f"DATABASE_URL must start with postgresql://, got {url.split(':', 1)[0]!r}")


def async_database_url(url: str) -> str:
    """Return `url` with the asyncpg driver SQLAlchemy needs (`postgresql+asyncpg://…`), for
    alembic. Raises ValueError for a URL that is not PostgreSQL's."""
    return "postgresql+asyncpg://" + _rest(url)


def plain_database_url(url: str) -> str:
    """Return `url` as libpq and asyncpg spell it (`postgresql://…`). Raises ValueError for a
    URL that is not PostgreSQL's."""
    return "postgresql://" + _rest(url)


class QueueSettings(HttpServiceSettings):
    """Everything the queue service reads from its environment.

    Durations are seconds (accepting `500ms`, `5m`, `14d`); `redis_url` may be empty to run
    without the depth cache.
    """

    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    queue_host: str = "127.0.0.1"
    queue_port: Port = 8081
    queue_db_pool_size: int = Field(default=10, ge=1, le=200)
    queue_max_attempts: int = Field(
        default=DEFAULT_MAX_ATTEMPTS, ge=MAX_ATTEMPTS_MIN, le=MAX_ATTEMPTS_MAX
    )
    queue_visibility_timeout: int = Field(default=30, ge=1, le=VISIBILITY_TIMEOUT_MAX)
    queue_retry_base_delay: Duration = 5.0
    queue_retry_multiplier: float = Field(default=2.0, ge=1.0, le=100.0)
    queue_retry_max_delay: Duration = 300.0
    queue_reaper_interval: Duration = 5.0
    queue_scheduler_interval: Duration = 0.1
    queue_depth_interval: Duration = 2.0
    queue_poll_interval: Duration = 0.25
    queue_shutdown_grace: Duration = 10.0
    queue_migrate_wait: Duration = 60.0
    """How long `alembic upgrade head` waits for the database to accept connections."""
    queue_retention: Duration = 7 * 86400.0
    queue_dead_letter_retention: Duration = 14 * 86400.0
    queue_retention_interval: Duration = 60.0
    queue_vacuum_interval: Duration = 5.0
    """How often a replica counts the live table's dead rows (services/queue/background.py,
    HotVacuum)."""
    queue_vacuum_dead_rows: int = Field(default=10_000, ge=0, le=1_000_000_000)
    """Dead rows in `job` from which a replica vacuums it; 0 leaves it to autovacuum."""
    queue_idempotency_window: Duration = DEFAULT_IDEMPOTENCY_WINDOW
    """How long an idempotency key is held when the submit names no window (seconds)."""
    queue_history_partition: Duration = 86400.0
    """Width of a `job_history` partition (a slot of `finished_at`); retention drops whole
    partitions, so a finished job is kept between its retention and retention + this."""
    queue_partition_manager: Literal["auto", "jobq", "pg_partman"] = "auto"
    """Who makes and drops the `job_history` partitions (services/queue/history.py): `jobq`'s
    background loop, the `pg_partman` extension (the service refuses to start without it), or
    `auto`: pg_partman when the extension is installed in the database, else jobq's loop."""
    queue_internal_token: Token | None = None
    queue_schedules: str = "[]"
    queue_schedule_interval: Duration = 1.0
    queue_listen_probe_interval: Duration = 5.0
    queue_listen_probe_timeout: Duration = 2.0
    queue_db_statement_timeout: Duration = 15.0
    queue_db_idle_in_transaction_timeout: Duration = 10.0
    queue_activity_interval: Duration = 2.0
    """How often a replica writes the workers and per-minute counts it saw (one batch)."""
    queue_throughput_retention: Duration = 86400.0
    """How long per-minute counts and silent workers' rows are kept."""
    queue_worker_live: Duration = 60.0
    """A worker is listed while it claimed or touched a lease within this many seconds."""

    @model_validator(mode="after")
    def _partman_width(self) -> QueueSettings:
        if self.queue_partition_manager == "pg_partman" and self.queue_history_partition < 1:
            raise ValueError("pg_partman makes partitions of 1s or more: QUEUE_HISTORY_PARTITION")
        return self

    @field_validator("queue_schedules")
    @classmethod
    def _schedules(cls, value: str) -> str:
        parse_schedules(value)
        return value

    @field_validator("queue_db_statement_timeout", "queue_db_idle_in_transaction_timeout")
    @classmethod
    def _server_limit(cls, value: float) -> float:
        if value < 0:
            raise ValueError("a limit must be 0 (off) or a positive duration")
        return value

    def session_limits(self) -> dict[str, str]:
        """PostgreSQL settings for the service's own sessions, in milliseconds (0 turns a
        limit off): `statement_timeout` and `idle_in_transaction_session_timeout`."""

        def milliseconds(seconds: float) -> str:
            return str(max(1, round(seconds * 1000)) if seconds > 0 else 0)

        return {
            "statement_timeout": milliseconds(self.queue_db_statement_timeout),
            "idle_in_transaction_session_timeout": milliseconds(
                self.queue_db_idle_in_transaction_timeout
            ),
        }

    @field_validator("queue_idempotency_window")
    @classmethod
    def _window(cls, value: float) -> float:
        if not 1 <= value <= IDEMPOTENCY_WINDOW_MAX:
            raise ValueError(f"an idempotency window is 1s..{IDEMPOTENCY_WINDOW_MAX // 86400}d")
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: str) -> str:
        async_database_url(value)
        return value

    @field_validator(
        "queue_reaper_interval",
        "queue_scheduler_interval",
        "queue_depth_interval",
        "queue_poll_interval",
        "queue_retention_interval",
        "queue_vacuum_interval",
        "queue_history_partition",
        "queue_schedule_interval",
        "queue_listen_probe_interval",
        "queue_listen_probe_timeout",
        "queue_activity_interval",
        "queue_throughput_retention",
        "queue_worker_live",
    )
    @classmethod
    def _positive_interval(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("an interval must be greater than zero")
        return value

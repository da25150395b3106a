"""Worker settings (docs/architecture.md#configuration)."""

from __future__ import annotations

import os
import re
import socket
from typing import Annotated

from pydantic import BeforeValidator, Field, field_validator
from pydantic_settings import NoDecode

from common.contracts import (
    CLAIM_MAX,
    NAME_PATTERN,
    VISIBILITY_TIMEOUT_MAX,
    WAIT_SECONDS_MAX,
    WORKER_NAME_MAX,
)
from common.web.settings import (
    CommaList,
    Duration,
    EmailPolicySettings,
    Port,
    Token,
    parse_duration,
)


def _default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"[:200]


DEFAULT_CONCURRENCY = 64
"""Jobs a worker runs at once by default. Processors are coroutines, so I/O-bound jobs overlap;
and a claim asks for every free slot at once, so more slots mean fewer, larger claims (with 4
slots a worker spends most of its time on round trips: docs/architecture.md#performance). 64,
not 32: a claim costs every process together about 1 ms of CPU however many jobs it takes, so
at 32 it was a third of each noop job's CPU; 2 workers of 64 drained 1.13-1.29x pgqueuer batch
100 where 2 of 32 drained 0.79-0.96x (benchmark/README.md, "a claim's cost and a job's")."""


def split_queues(value: object) -> object:
    """`email|webhook` or `email, webhook` → ["email", "webhook"]; anything but a string passes
    unchanged. `|` as well as `,`: the `|` form is also the regular expression a worker group's
    KEDA queries select those queues with, so one value configures both (infra/k8s/worker-group);
    neither can be part of a queue name (NAME_PATTERN)."""
    if isinstance(value, str):
        return [part.strip() for part in re.split(r"[,|]", value) if part.strip()]
    return value


QueueList = Annotated[list[str], NoDecode, BeforeValidator(split_queues)]
"""The queues a worker serves, separated by `,` or `|` (`split_queues`)."""


class WorkerSettings(EmailPolicySettings):
    """Everything a worker replica reads from its environment.

    List settings are comma-separated (`WORKER_QUEUES=default,email`); WORKER_QUEUES also
    takes `|` (`email|webhook`, as a worker group's kustomization writes it).
    """

    queue_service_url: str = "http://127.0.0.1:8081"
    queue_internal_token: Token | None = None
    worker_name: str = Field(
        default_factory=_default_worker_name,
        min_length=1,
        max_length=WORKER_NAME_MAX,
        pattern=r"^[\x21-\x7e]+$",
    )
    worker_queues: QueueList = ["default"]
    worker_concurrency: int = Field(default=DEFAULT_CONCURRENCY, ge=1, le=CLAIM_MAX)
    worker_wait_seconds: float = Field(default=20, ge=0, le=WAIT_SECONDS_MAX)
    worker_visibility_timeout: int | None = Field(default=None, ge=1, le=VISIBILITY_TIMEOUT_MAX)
    worker_shutdown_grace: Duration = 25.0
    worker_job_timeout: Duration = 900.0
    worker_metrics_host: str = "0.0.0.0"
    worker_metrics_port: Port = 9100
    worker_processor_modules: CommaList = []
    smtp_host: str = "127.0.0.1"
    smtp_port: Port = 2525
    smtp_sender: str = "jobq@localhost"
    smtp_timeout: Duration = 10.0
    webhook_allowed_hosts: CommaList = []
    webhook_timeout: Duration = 10.0
    worker_timeout_caps: CommaList = []

    @field_validator("worker_queues")
    @classmethod
    def _queue_names(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("WORKER_QUEUES needs at least one queue")
        bad = [q for q in value if not re.match(NAME_PATTERN, q)]
        if bad:
            raise ValueError(f"not queue names: {bad} (pattern {NAME_PATTERN})")
        return value

    @field_validator("webhook_allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: list[str]) -> list[str]:
        from services.worker.processors.webhook import AllowedHost

        for entry in value:
            AllowedHost.parse(entry)
        return value

    @field_validator("worker_timeout_caps")
    @classmethod
    def _caps(cls, value: list[str]) -> list[str]:
        _parse_caps(value)
        return value

    def timeout_caps(self) -> dict[str, float]:
        """{task type: most seconds a job of it may ask for} from `WORKER_TIMEOUT_CAPS`."""
        return _parse_caps(self.worker_timeout_caps)

    @field_validator("worker_job_timeout")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("WORKER_JOB_TIMEOUT must be greater than zero")
        return value


def _parse_caps(entries: list[str]) -> dict[str, float]:
    """`task-type:duration` entries (`webhook:60s`) into {task type: seconds}; raises
    ValueError for a bad name, duration or a task type listed twice."""
    caps: dict[str, float] = {}
    for entry in entries:
        task_type, sep, duration = entry.partition(":")
        task_type = task_type.strip()
        if not sep or not re.match(NAME_PATTERN, task_type):
            raise ValueError(f"{entry!r}: expected task-type:duration, e.g. webhook:60s")
        seconds = parse_duration(duration.strip())
        if seconds <= 0 or task_type in caps:
            raise ValueError(f"{entry!r}: a positive duration, once per task type")
        caps[task_type] = seconds
    return caps

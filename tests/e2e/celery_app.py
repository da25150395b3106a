"""A Celery app on kombu's SQS transport pointed at jobq's SQS endpoint, for
tests/e2e/test_sqs_clients.py. Its tasks count their runs in Redis, the result backend too.

Configured by the environment the test gives the worker: JOBQ_SQS_BROKER (the broker URL,
`sqs://<access key id>:<secret>@127.0.0.1:<port>`), JOBQ_SQS_REGION, JOBQ_CELERY_REDIS.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery, Task

QUEUE = "celery-jobs"

app = Celery(
    "jobq_celery",
    broker=os.environ.get("JOBQ_SQS_BROKER", "sqs://"),
    backend=os.environ.get("JOBQ_CELERY_REDIS", "redis://127.0.0.1:6379/0"),
)
app.conf.update(
    broker_transport_options={
        "region": os.environ.get("JOBQ_SQS_REGION", "jobq-local-1"),
        "is_secure": False,
        # A killed worker's message comes back this many seconds after it was received.
        "visibility_timeout": 3,
        "wait_time_seconds": 2,
        "polling_interval": 0.1,
    },
    task_default_queue=QUEUE,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


def _runs(key: str) -> int:
    """Count one more run of `key`; the count so far."""
    client = redis.Redis.from_url(os.environ.get("JOBQ_CELERY_REDIS", "redis://127.0.0.1:6379/0"))
    return int(client.incr(f"jobq-celery-test:{key}"))


@app.task
def add(x: int, y: int) -> int:
    """Succeeds at once."""
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self: Task[Any, Any], key: str) -> str:
    """Fails its first run and is retried by Celery (a new message), then succeeds."""
    runs = _runs(key)
    if runs == 1:
        raise self.retry(exc=RuntimeError("first run fails"), countdown=1)
    return f"ok after {runs} runs"


@app.task
def dies_once(key: str) -> str:
    """Kills its worker process on its first run: the message, never acknowledged, comes back
    after the visibility timeout to the next worker."""
    runs = _runs(key)
    if runs == 1:
        os._exit(1)
    return f"survived on run {runs}"

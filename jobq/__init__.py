"""The jobq client library: everything an application needs, from one root.

- `Client`: an httpx client for the producer API (submit, status, list, cancel, retry,
  redrive), raising the services' own error classes (`jobq.errors`).
- `enqueue(connection, …)`: create a job through your own asyncpg or SQLAlchemy connection, in
  your own transaction, so it commits or rolls back with your writes (the transactional outbox
  without the outbox table).
- The processor SDK (`jobq.processors`): `JobContext`, `Retry`, `NonRetryable`, `Processor`
  and `ProcessorRegistry`, for the modules a worker loads through `WORKER_PROCESSOR_MODULES`.

Installed on its own (the `jobq` client distribution, clients/python), it needs httpx and
msgspec only, plus the database driver you pass to `enqueue`; importing it loads no web
framework and no driver.
"""

from jobq.client import Client
from jobq.enqueue import enqueue
from jobq.processors import JobContext, NonRetryable, Processor, ProcessorRegistry, Retry

__all__ = [
    "Client",
    "JobContext",
    "NonRetryable",
    "Processor",
    "ProcessorRegistry",
    "Retry",
    "enqueue",
]

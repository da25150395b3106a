"""The jobq client library: everything an application needs, from one root.

- `Client` and `AsyncClient`: httpx clients for the producer API (submit, status, list,
  cancel, retry, redrive, queue control), synchronous and for asyncio, with the same methods,
  errors (`jobq.errors`, the services' own classes) and retries.
- `enqueue(connection, …)`: create a job through your own asyncpg or SQLAlchemy connection, in
  your own transaction, so it commits or rolls back with your writes (the transactional outbox
  without the outbox table).
- The processor SDK (`jobq.processors`): `JobContext`, `Retry`, `NonRetryable`, `Processor`
  and `ProcessorRegistry`, for the modules a worker loads through `WORKER_PROCESSOR_MODULES`.

Installed on its own (the `jobq` client distribution, clients/python), it needs httpx and
msgspec only, plus the database driver you pass to `enqueue`; importing it loads no web
framework and no driver.
"""

from jobq.client import AsyncClient, Client
from jobq.enqueue import enqueue
from jobq.processors import JobContext, NonRetryable, Processor, ProcessorRegistry, Retry

__all__ = [
    "AsyncClient",
    "Client",
    "JobContext",
    "NonRetryable",
    "Processor",
    "ProcessorRegistry",
    "Retry",
    "enqueue",
]

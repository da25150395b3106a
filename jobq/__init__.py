"""The jobq client library.

- `Client`: an httpx client for the producer API (submit, status, list, cancel, retry,
  redrive), raising the same `common.errors` classes the services use.
- `enqueue(connection, …)`: create a job through your own asyncpg or SQLAlchemy connection, in
  your own transaction, so it commits or rolls back with your writes (the transactional outbox
  without the outbox table).
"""

from jobq.client import Client
from jobq.enqueue import enqueue

__all__ = ["Client", "enqueue"]

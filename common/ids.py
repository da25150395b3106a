"""Job ids: UUIDv7 (RFC 9562), minted once and carried through every hop.

The producer (or the client library) mints the id before forwarding, so a retried forward to the
queue service is a replay of the same job rather than a duplicate.
"""

from __future__ import annotations

import uuid

import uuid6


def new_job_id() -> uuid.UUID:
    """Return a fresh UUIDv7 job id.

    Ids from one process are strictly increasing, also within one millisecond: `uuid6.uuid7`
    advances its millisecond field when called twice in the same millisecond (RFC 9562 §6.2,
    method 3). Ordering by id is therefore submission order, which the claim uses for FIFO.
    """
    return uuid.UUID(bytes=uuid6.uuid7().bytes)

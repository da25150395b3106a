"""Job ids: UUIDv7 (RFC 9562), minted once and carried through every hop.

The producer (or the client library) mints the id before forwarding, so a retried forward to the
queue service is a replay of the same job rather than a duplicate.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0


def new_job_id() -> uuid.UUID:
    """Return a fresh UUIDv7 job id: 48 bits of Unix time in milliseconds, then the version,
    the variant and 74 random bits.

    Ids from one process are strictly increasing, also within one millisecond: a second id in
    the same (or an earlier) millisecond takes the next millisecond instead (RFC 9562 §6.2,
    method 3, as `uuid6.uuid7` does). Ordering by id is therefore submission order, which the
    claim uses for FIFO.
    """
    global _last_ms
    with _lock:
        ms = max(time.time_ns() // 1_000_000, _last_ms + 1)
        _last_ms = ms
    random = secrets.randbits(74)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (random >> 62) << 64
    return uuid.UUID(int=value | 0b10 << 62 | random & (1 << 62) - 1)

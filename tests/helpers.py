"""Small helpers shared by the test tiers: job factories and polling with deadlines."""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from common.contracts import SubmitJobRequest
from common.enqueue import JobRow, job_row
from common.ids import new_job_id
from services.queue.repository import JobRepository

T = TypeVar("T")


def new_job(
    task_type: str = "noop",
    queue: str = "default",
    *,
    priority: int = 0,
    delay: float = 0,
    max_attempts: int = 5,
    payload: dict[str, object] | None = None,
    tenant: str = "default",
) -> JobRow:
    """A valid job row with a fresh id, owned by `tenant`."""
    request = SubmitJobRequest(
        task_type=task_type,
        payload=payload if payload is not None else {"n": 1},
        queue=queue,
        priority=priority,
        delay_seconds=delay,
        max_attempts=max_attempts,
    )
    return job_row(request, new_job_id(), max_attempts, tenant)


async def eventually(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], bool],
    *,
    within: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll `probe` until `accept(value)`; fail with the last value after `within` seconds."""
    deadline = time.monotonic() + within
    value = await probe()
    while not accept(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s; last value: {value!r}")
        await asyncio.sleep(interval)
        value = await probe()
    return value


async def wait_past(repository: JobRepository, moment: str, within: float = 15.0) -> None:
    """Wait until the database clock is past `moment` (an RFC 3339 timestamp)."""
    target = datetime.fromisoformat(moment)
    await eventually(
        repository.now, lambda now: now > target, within=within, what=f"database time {moment}"
    )


async def trickle_until_closed(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    byte: bytes = b"x",
    *,
    every: float = 0.2,
    within: float = 15.0,
) -> bytes:
    """Send `byte` every `every` seconds, as a slow client would, until the server closes the
    connection; return everything the server sent. Fails if it is still open after `within`
    seconds."""
    received = bytearray()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=every)
        except TimeoutError:
            try:
                writer.write(byte)
                await writer.drain()
            except (ConnectionError, OSError):
                break
            continue
        except (ConnectionError, OSError):
            break
        if not chunk:
            break
        received.extend(chunk)
    else:
        raise AssertionError(f"the server kept the connection open for {within}s: {received!r}")
    writer.close()
    return bytes(received)


def md5_of_message_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's MD5OfMessageAttributes of boto3-shaped attributes (binary values as bytes),
    written from the SQS Developer Guide independently of services.sqs.digests."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        for text in (name, value["DataType"]):
            digest.update(struct.pack(">I", len(text.encode())) + text.encode())
        if "BinaryValue" in value:
            data = bytes(value["BinaryValue"])
            digest.update(b"\x02" + struct.pack(">I", len(data)) + data)
        else:
            data = value["StringValue"].encode()
            digest.update(b"\x01" + struct.pack(">I", len(data)) + data)
    return digest.hexdigest()

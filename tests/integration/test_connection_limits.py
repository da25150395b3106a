"""Authentication before the body, and connection, time and size limits
(docs/architecture.md#connection-limits), with real sockets that talk slowly on purpose."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from common.web.serving import ServerLimits
from tests.conftest import guarded_services
from tests.helpers import eventually, trickle_until_closed

KEY = "submit:acme:acme-submit-key-0123456789"
BEARER = {"Authorization": "Bearer acme-submit-key-0123456789"}

TIGHT = ServerLimits(
    max_connections=8, header_timeout=1.0, body_timeout=1.0, max_header_bytes=8 * 1024
)
"""Short deadlines, so a slow client is cut off within the tests' patience."""


@pytest.fixture
async def producer(clean_database: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with guarded_services(clean_database, redis_url, KEY, limits=TIGHT) as (client, _):
        yield client


async def connect(client: httpx.AsyncClient) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    url = client.base_url
    assert url.port is not None
    return await asyncio.open_connection(url.host, url.port)


def problem(received: bytes, status: int) -> dict[str, object]:
    """The problem document of a raw HTTP response with `status`, checked for its type."""
    header, _, body = received.partition(b"\r\n\r\n")
    assert header.startswith(b"HTTP/1.1 %d " % status), received
    assert b"content-type: application/problem+json" in header.lower(), header
    document: dict[str, object] = json.loads(body)
    assert document["status"] == status and str(document["type"]).startswith("urn:jobq:problem:")
    return document


def head(path: str, length: int, *extra: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: jobq",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_credentials_and_content_type_come_before_the_body(
    producer: httpx.AsyncClient,
) -> None:
    def problem(reply: httpx.Response) -> tuple[int, str]:
        return reply.status_code, reply.json()["type"].rsplit(":", 1)[-1]

    json_type = {"Content-Type": "application/json"}
    # Without a key, nothing about the body (malformed, wrong shape, wrong type) is looked at.
    for body, headers in (
        (b"{bad", json_type),
        (b'{"taskType":5}', json_type),
        (b"plain words", {"Content-Type": "text/plain"}),
    ):
        reply = await producer.post("/jobs", content=body, headers=headers)
        assert problem(reply) == (401, "unauthorized"), body
        assert "taskType" not in reply.text
    # With one, the content type is checked next, then the body, decoded once and strictly.
    plain = await producer.post(
        "/jobs", content=b"plain words", headers={**BEARER, "Content-Type": "text/plain"}
    )
    assert problem(plain) == (415, "unsupported-media-type")
    malformed = await producer.post("/jobs", content=b"{bad", headers={**BEARER, **json_type})
    assert problem(malformed) == (400, "malformed-request")
    lenient = await producer.post(
        "/jobs", json={"taskType": "noop", "payload": {}, "priority": "5"}, headers=BEARER
    )
    assert problem(lenient) == (422, "invalid-input"), "a string is no integer"


async def test_a_reply_sent_before_the_body_arrived_closes_the_connection(
    producer: httpx.AsyncClient,
) -> None:
    reader, writer = await connect(producer)
    writer.write(head("/jobs", 8 * 1024 * 1024) + b'{"taskType":')
    await writer.drain()
    # The client goes on sending its 8 MiB, slowly; the server answered 401 and reads no more.
    received = await trickle_until_closed(reader, writer, b" ", every=0.05)
    assert received.startswith(b"HTTP/1.1 401 "), received


async def response_head(reader: asyncio.StreamReader) -> bytes:
    """The status line and headers of the response `reader` receives, lower-cased."""
    return (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)).lower()


async def test_a_reply_that_ends_the_connection_says_connection_close(
    producer: httpx.AsyncClient,
) -> None:
    """Issue 16 item 11: without the header a keep-alive client reuses the closing connection
    and its next request fails with "server disconnected"."""
    # 401 before the body arrived.
    reader, writer = await connect(producer)
    writer.write(head("/jobs", 8 * 1024 * 1024) + b'{"taskType":')
    await writer.drain()
    answer = await response_head(reader)
    assert answer.startswith(b"http/1.1 401 ") and b"\r\nconnection: close\r\n" in answer, answer
    await trickle_until_closed(reader, writer, b" ", every=0.05)

    # 413 on a chunked body that grows past the cap.
    reader, writer = await connect(producer)
    chunked = (
        "POST /jobs HTTP/1.1\r\nHost: jobq\r\nContent-Type: application/json\r\n"
        f"Authorization: {BEARER['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    writer.write(chunked)
    chunk = b"%x\r\n%s\r\n" % (256 * 1024, b" " * 256 * 1024)
    reading = asyncio.ensure_future(response_head(reader))
    for _ in range(64):  # 16 MiB at most; the cap is 8 MiB
        if reading.done():
            break
        writer.write(chunk)
        await writer.drain()
    answer = await reading
    assert answer.startswith(b"http/1.1 413 ") and b"\r\nconnection: close\r\n" in answer, answer
    writer.close()

    # A keep-alive client: the refusal closes its connection, the next request opens a new one.
    connects: list[str] = []

    async def trace(event: str, info: dict[str, object]) -> None:
        if event == "connection.connect_tcp.complete":
            connects.append(event)

    async with httpx.AsyncClient(base_url=producer.base_url) as client:
        refused = await client.post(
            "/jobs",
            content=b" " * (1024 * 1024),
            headers={"Content-Type": "application/json"},
            extensions={"trace": trace},
        )
        assert refused.status_code == 401 and refused.headers["connection"] == "close"
        for _ in range(2):
            following = await client.get("/health/live", extensions={"trace": trace})
            assert following.status_code == 200
            assert "connection" not in following.headers  # a normal reply keeps it open
    assert len(connects) == 2, "the refused connection was reused, or the next one was not"


async def test_an_idle_connection_is_closed_after_the_header_deadline(
    producer: httpx.AsyncClient,
) -> None:
    reader, writer = await connect(producer)
    assert await trickle_until_closed(reader, writer, b"", every=0.2) == b""


async def test_headers_sent_one_byte_at_a_time_are_cut_off(
    producer: httpx.AsyncClient,
) -> None:
    reader, writer = await connect(producer)
    writer.write(
        b"GET /jobs/00000000-0000-0000-0000-000000000000 HTTP/1.1\r\nHost: jobq\r\nX-Slow: "
    )
    received = await trickle_until_closed(reader, writer, b"a", every=0.1)
    assert problem(received, 408)["detail"] == "request headers took too long"


async def test_a_body_sent_one_byte_at_a_time_is_cut_off(producer: httpx.AsyncClient) -> None:
    reader, writer = await connect(producer)
    writer.write(head("/jobs", 1000, f"Authorization: {BEARER['Authorization']}") + b"{")
    received = await trickle_until_closed(reader, writer, b" ", every=0.1)
    assert problem(received, 408)["detail"] == "request body took too long"
    # Meanwhile, and after, everyone else is served.
    reply = await producer.post("/jobs", json={"taskType": "noop", "payload": {}}, headers=BEARER)
    assert reply.status_code == 202


async def test_oversized_headers_are_refused(producer: httpx.AsyncClient) -> None:
    reader, writer = await connect(producer)
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: jobq\r\nX-Big: " + b"a" * 16384 + b"\r\n\r\n")
    received = await trickle_until_closed(reader, writer, b"", every=0.2)
    assert problem(received, 431)["type"] == "urn:jobq:problem:headers-too-large"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /health/live HTTP/1.1\r\nHost: jobq\r\nX-Bad: a\x01b\r\n\r\n",
        b"POST /jobs HTTP/1.1\r\nHost: jobq\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n{}",
    ],
    ids=["control-byte-in-a-header", "length-and-chunked"],
)
async def test_unparseable_requests_get_a_problem_document(
    producer: httpx.AsyncClient, request_bytes: bytes
) -> None:
    reader, writer = await connect(producer)
    writer.write(request_bytes)
    received = await trickle_until_closed(reader, writer, b"", every=0.2)
    assert problem(received, 400)["type"] == "urn:jobq:problem:malformed-request"


async def test_connections_beyond_the_cap_are_turned_away(producer: httpx.AsyncClient) -> None:
    idle = [await connect(producer) for _ in range(TIGHT.max_connections)]

    async def live() -> int:
        async with httpx.AsyncClient(base_url=producer.base_url) as fresh:
            return (await fresh.get("/health/live")).status_code

    assert await live() == 503
    for _, writer in idle:
        writer.close()
    await eventually(live, lambda status: status == 200, what="a free connection slot")

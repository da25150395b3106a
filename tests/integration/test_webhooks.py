"""Webhooks connect only where they were checked, within one deadline per attempt
(docs/architecture.md#webhooks), against local fakes: a DNS that rebinds, a public host that
is really a loopback server (plain and TLS), and a server that answers one byte a second."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpcore
import pytest
import trustme

from infra.stack import free_port
from jobq.processors import JobContext, NonRetryable, Retry
from services.worker.processors.webhook import WebhookProcessor, webhook_client

PUBLIC_IP = "93.184.216.34"
"""A globally routable address; the fake network below leads it to a loopback server."""


def job(payload: dict[str, Any]) -> JobContext:
    return JobContext(uuid.uuid4(), "webhook", payload, 1, 5, None)


@dataclass
class Server:
    """A loopback HTTP server that records each request's Host header (and TLS SNI)."""

    port: int = 0
    hosts: list[str] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)


@contextlib.asynccontextmanager
async def http_server(tls: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    record = Server()
    if tls is not None:

        def sni(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
            record.server_names.append(name)

        tls.sni_callback = sni  # type: ignore[assignment]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")[1:]
        headers = {
            name.lower(): value
            for name, _, value in (line.partition(": ") for line in lines)
            if value
        }
        record.hosts.append(headers.get("host", ""))
        await reader.readexactly(int(headers.get("content-length", "0")))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    record.port = server.sockets[0].getsockname()[1]
    async with server:
        yield record


class RebindingDns:
    """Answers a public address first and loopback afterwards, as a rebinding attack does."""

    def __init__(self) -> None:
        self.questions: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.questions.append(host)
        return [PUBLIC_IP] if len(self.questions) == 1 else ["127.0.0.1"]


class FakeNetwork(httpcore.AsyncNetworkBackend):
    """The network under the webhook client: `PUBLIC_IP` leads to `public_port` on loopback,
    and a name is looked up in `dns` again, as the system resolver would."""

    def __init__(self, dns: RebindingDns, public_port: int) -> None:
        self._dns = dns
        self._public_port = public_port
        self._real = httpcore.AnyIOBackend()
        self.connects: list[tuple[str, int]] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects.append((host, port))
        try:
            ipaddress.ip_address(host)
        except ValueError:
            host = (await self._dns(host, port))[0]
        if host == PUBLIC_IP:
            host, port = "127.0.0.1", self._public_port
        return await self._real.connect_tcp(host, port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._real.sleep(seconds)


async def test_a_rebinding_dns_cannot_turn_the_post_to_loopback() -> None:
    async with http_server() as internal, http_server() as public:
        dns = RebindingDns()
        network = FakeNetwork(dns, public.port)
        async with webhook_client(5.0, network=network) as http:
            processor = WebhookProcessor(http, [], 5.0, resolver=dns)
            url = f"http://rebind.example:{internal.port}/hook"
            assert await processor(job({"url": url})) == {"status": 200}
    assert internal.hosts == [], "the POST reached loopback"
    assert public.hosts == [f"rebind.example:{internal.port}"]
    assert dns.questions == ["rebind.example"], "the name was resolved more than once"
    assert network.connects == [(PUBLIC_IP, internal.port)]


async def test_tls_to_the_checked_address_verifies_and_names_the_original_host() -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("rebind.example")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    authority.configure_trust(client_tls)
    async with http_server(server_tls) as public:
        dns = RebindingDns()
        network = FakeNetwork(dns, public.port)
        async with webhook_client(5.0, network=network, verify=client_tls) as http:
            processor = WebhookProcessor(http, [], 5.0, resolver=dns)
            url = f"https://rebind.example:{public.port}/hook"
            assert await processor(job({"url": url})) == {"status": 200}
    assert public.server_names == ["rebind.example"], "SNI must carry the name, not the IP"
    assert public.hosts == [f"rebind.example:{public.port}"]
    assert network.connects == [(PUBLIC_IP, public.port)]


@contextlib.asynccontextmanager
async def one_byte_a_second() -> AsyncIterator[list[int]]:
    """A server that sends its 38-byte reply one byte a second; yields [port, bytes sent]."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert len(reply) == 38
    state = [0, 0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            for byte in reply:
                writer.write(bytes([byte]))
                await writer.drain()
                state[1] += 1
                await asyncio.sleep(1)
        except (ConnectionError, OSError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state[0] = server.sockets[0].getsockname()[1]
    async with server:
        yield state


async def test_a_reply_trickling_in_is_cut_off_at_the_attempts_deadline() -> None:
    async with one_byte_a_second() as state, webhook_client(10.0) as http:
        processor = WebhookProcessor(http, ["127.0.0.1"], 10.0)
        url = f"http://127.0.0.1:{state[0]}/hook"
        with pytest.raises(Retry, match=r"within 2s") as caught:
            await processor(job({"url": url, "timeoutSeconds": 2}))
    assert state[1] < 38, "the whole reply was waited for"
    assert "127.0.0.1" in str(caught.value), "the host as the submitter wrote it is fine"


async def test_refusals_do_not_echo_resolved_private_addresses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def internal_dns(host: str, port: int) -> list[str]:
        return [PUBLIC_IP, "10.20.30.40"]

    async with webhook_client(5.0) as http:
        processor = WebhookProcessor(http, [], 5.0, resolver=internal_dns)
        with (
            caplog.at_level(logging.WARNING, logger="services.worker.processors.webhook"),
            pytest.raises(NonRetryable) as caught,
        ):
            await processor(job({"url": "https://hooks.example.com/in"}))
    message = str(caught.value)
    assert "hooks.example.com" in message and "private" in message
    assert "10.20.30.40" not in message, "lastError must not map the internal network"
    assert any("10.20.30.40" in record.getMessage() for record in caplog.records)


async def test_allowed_hosts_may_name_one_port() -> None:
    async with http_server() as allowed, http_server() as other, webhook_client(5.0) as http:
        processor = WebhookProcessor(http, [f"127.0.0.1:{allowed.port}"], 5.0)
        ok = await processor(job({"url": f"http://127.0.0.1:{allowed.port}/"}))
        assert ok == {"status": 200}
        with pytest.raises(NonRetryable, match="loopback"):
            await processor(job({"url": f"http://127.0.0.1:{other.port}/"}))
    assert other.hosts == []


async def test_a_receiver_that_is_down_is_one_warning_not_one_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    async with webhook_client(5.0) as http:
        processor = WebhookProcessor(http, ["127.0.0.1"], 5.0)
        with caplog.at_level(logging.WARNING, logger="services.worker.processors.webhook"):
            for _ in range(20):
                with pytest.raises(Retry, match="ConnectError"):
                    await processor(job({"url": url}))
    failed = [r for r in caplog.records if getattr(r, "event", "") == "webhook_failed"]
    assert len(failed) == 1

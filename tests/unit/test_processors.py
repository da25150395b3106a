"""Built-in processors and registry loading; no network beyond loopback."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiosmtpd.controller import Controller

from common.mail import EmailPolicy
from jobq.processors import JobContext, NonRetryable, ProcessorRegistry, Retry
from services.worker.processors import build_registry
from services.worker.processors.basic import noop, sleep
from services.worker.processors.email import EmailProcessor
from services.worker.processors.webhook import (
    AllowedHost,
    WebhookProcessor,
    check_destination,
    non_public_reason,
)
from services.worker.settings import WorkerSettings

PUBLIC_IP = "93.184.216.34"
HOOK_URL = "https://hooks.example.com/in"


def job(payload: dict[str, Any], task_type: str = "webhook") -> JobContext:
    return JobContext(uuid.uuid4(), task_type, payload, 1, 5, None)


# --- SSRF guard ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("::ffff:127.0.0.1", "IPv4-mapped 127.0.0.1 is loopback"),
        ("::ffff:10.0.0.1", "IPv4-mapped 10.0.0.1 is private"),
        ("2002:7f00:1::", "6to4 127.0.0.1 is loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "private"),
        ("fec0::1", "site-local"),
        ("100.100.100.200", "not globally routable"),
        ("not-an-ip", "not an IP address"),
    ],
)
def test_check_destination_refuses_non_public(address: str, reason: str) -> None:
    with pytest.raises(NonRetryable) as caught:
        check_destination("hooks.example.com", [address])
    message = str(caught.value)
    assert "'hooks.example.com'" in message
    found = non_public_reason(address)
    assert found is not None and found[1] == reason
    assert f"({found[0]})" in message
    if address != "not-an-ip":
        assert address not in message, "a resolved address must not reach lastError"


def test_check_destination_refuses_if_any_address_is_internal() -> None:
    with pytest.raises(NonRetryable, match="private"):
        check_destination("mixed.example.com", [PUBLIC_IP, "10.0.0.1"])


def test_check_destination_refuses_empty_resolution() -> None:
    with pytest.raises(NonRetryable, match="no addresses"):
        check_destination("hooks.example.com", [])


@pytest.mark.parametrize("address", [PUBLIC_IP, "::ffff:93.184.216.34", "2606:2800:220:1::1"])
def test_check_destination_allows_public(address: str) -> None:
    check_destination("example.com", [address])


@pytest.mark.parametrize(
    ("host", "port", "entry"),
    [
        ("localhost", 80, "localhost"),
        ("LocalHost", 80, "localhost"),
        ("localhost", 9000, " LOCALHOST "),
        ("localhost", 9000, "localhost:9000"),
        ("127.0.0.1", 443, "127.0.0.1"),
        ("127.0.0.1", 8080, "127.0.0.1:8080"),
        ("::1", 80, "[::1]"),
        ("::1", 80, "::1"),
        ("[::1]", 8443, "[::1]:8443"),
    ],
)
def test_allowed_hosts_match_host_and_port(host: str, port: int, entry: str) -> None:
    assert AllowedHost.parse(entry).admits(host, port)


@pytest.mark.parametrize(
    ("host", "port", "entry"),
    [
        ("evil.localhost", 80, "localhost"),
        ("localhost", 9001, "localhost:9000"),
        ("::1", 80, "[::1]:8443"),
    ],
)
def test_allowed_hosts_are_exact(host: str, port: int, entry: str) -> None:
    assert not AllowedHost.parse(entry).admits(host, port)


@pytest.mark.parametrize("entry", ["", "host:", "host:0", "host:70000", "[::1]x", ":80"])
def test_bad_allowed_host_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        AllowedHost.parse(entry)


# --- webhook ------------------------------------------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


async def public_resolver(host: str, port: int) -> list[str]:
    return [PUBLIC_IP]


def webhook(handler: Handler, allowed: list[str] | None = None) -> WebhookProcessor:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return WebhookProcessor(http, allowed or [], 5.0, resolver=public_resolver)


async def test_webhook_posts_body_with_idempotency_key() -> None:
    seen: list[httpx.Request] = []
    body = {"order": 42, "items": ["a", "ü"], "nested": {"ok": True, "n": None}}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201)

    context = job({"url": HOOK_URL, "body": body, "headers": {"X-Signature": "abc"}})
    assert await webhook(handler)(context) == {"status": 201}
    (request,) = seen
    assert request.method == "POST"
    assert str(request.url) == HOOK_URL
    assert request.headers["Idempotency-Key"] == str(context.id)
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-Signature"] == "abc"
    assert json.loads(request.content) == body


async def test_webhook_default_body_is_json_null() -> None:
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        return httpx.Response(204)

    assert await webhook(handler)(job({"url": HOOK_URL})) == {"status": 204}
    assert seen == [b"null"]


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422, 301, 302])
async def test_webhook_client_errors_and_redirects_are_final(status: int) -> None:
    headers = {"Location": "http://127.0.0.1/"} if status < 400 else {}
    processor = webhook(lambda _: httpx.Response(status, headers=headers, text="nope"))
    with pytest.raises(NonRetryable, match=f"webhook answered {status}"):
        await processor(job({"url": HOOK_URL}))


@pytest.mark.parametrize(
    ("status", "headers", "after"),
    [
        (500, {}, None),
        (502, {"Retry-After": "30"}, None),  # only 429 and 503 carry a meaningful Retry-After
        (503, {"Retry-After": "12"}, 12.0),
        (503, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        (408, {}, None),
        (429, {"Retry-After": "7"}, 7.0),
        (429, {"Retry-After": "999999"}, 3600.0),
        (429, {"Retry-After": "-5"}, None),
    ],
)
async def test_webhook_transient_statuses_retry(
    status: int, headers: dict[str, str], after: float | None
) -> None:
    processor = webhook(lambda _: httpx.Response(status, headers=headers))
    with pytest.raises(Retry, match=str(status)) as caught:
        await processor(job({"url": HOOK_URL}))
    assert caught.value.after == after


async def test_webhook_error_message_includes_body_snippet() -> None:
    processor = webhook(lambda _: httpx.Response(400, json={"error": "bad signature"}))
    with pytest.raises(NonRetryable, match="bad signature"):
        await processor(job({"url": HOOK_URL}))


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("x")],
)
async def test_webhook_network_errors_retry(error: Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with pytest.raises(Retry, match=r"hooks\.example\.com"):
        await webhook(handler)(job({"url": HOOK_URL}))


async def test_webhook_does_not_follow_redirects() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(307, headers={"Location": "http://169.254.169.254/"})

    with pytest.raises(NonRetryable, match="307"):
        await webhook(handler)(job({"url": HOOK_URL}))
    assert calls == [HOOK_URL]


async def test_webhook_timeout_from_payload_else_default() -> None:
    timeouts: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"]["read"])
        return httpx.Response(200)

    processor = webhook(handler)
    await processor(job({"url": HOOK_URL, "timeoutSeconds": 2.5}))
    await processor(job({"url": HOOK_URL}))
    assert timeouts == [2.5, 5.0]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "needs `url`"),
        ({"url": 5}, "needs `url`"),
        ({"url": "ftp://example.com/x"}, "http or https"),
        ({"url": "file:///etc/passwd"}, "http or https"),
        ({"url": "example.com/hook"}, "http or https"),
        ({"url": "http:///hook"}, "no host"),
        ({"url": HOOK_URL, "headers": ["X: y"]}, "`headers` must be an object"),
        ({"url": HOOK_URL, "headers": {"X-N": 1}}, "printable-ASCII"),
        ({"url": HOOK_URL, "headers": {"X-N": "a\r\nInjected: 1"}}, "printable-ASCII"),
        ({"url": HOOK_URL, "headers": {"Bad Name": "v"}}, "not a valid HTTP token"),
        ({"url": HOOK_URL, "headers": {"idempotency-key": "mine"}}, "cannot be overridden"),
        ({"url": HOOK_URL, "headers": {"Content-Type": "text/plain"}}, "cannot be overridden"),
        ({"url": HOOK_URL, "headers": {"HOST": "internal"}}, "cannot be overridden"),
        ({"url": HOOK_URL, "timeoutSeconds": 0}, "timeoutSeconds"),
        ({"url": HOOK_URL, "timeoutSeconds": 301}, "timeoutSeconds"),
        ({"url": HOOK_URL, "timeoutSeconds": "10"}, "timeoutSeconds"),
        ({"url": HOOK_URL, "timeoutSeconds": True}, "timeoutSeconds"),
        ({"url": HOOK_URL, "timeoutSeconds": float("nan")}, "timeoutSeconds"),
        ({"url": HOOK_URL, "timeout": 3}, "unknown keys \\['timeout'\\]"),
    ],
)
async def test_webhook_bad_payload_is_final(payload: dict[str, Any], message: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("a bad payload must not be sent")

    with pytest.raises(NonRetryable, match=message):
        await webhook(handler)(job(payload))


async def test_webhook_refuses_loopback_via_real_resolution() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("must not be sent")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    processor = WebhookProcessor(http, [], 5.0)
    for url in ("http://127.0.0.1:8080/x", "http://[::1]/x", "http://2130706433/x"):
        with pytest.raises(NonRetryable, match="loopback"):
            await processor(job({"url": url}))


async def test_webhook_allowlisted_host_skips_guard() -> None:
    async def loopback(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    processor = WebhookProcessor(http, ["LOCALHOST"], 5.0, resolver=loopback)
    assert await processor(job({"url": "http://localhost:9000/hook"})) == {"status": 200}


async def test_webhook_resolution_failure_retries() -> None:
    async def failing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    processor = WebhookProcessor(http, [], 5.0, resolver=failing)
    with pytest.raises(Retry, match="cannot resolve"):
        await processor(job({"url": HOOK_URL}))


# --- email --------------------------------------------------------------------------------------


class Collector:
    """aiosmtpd handler keeping each message; `rcpt_reply` / `data_reply` force an SMTP reply."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], Message]] = []
        self.rcpt_reply: str | None = None
        self.data_reply: str | None = None

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:
        if self.rcpt_reply:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.data_reply:
            return self.data_reply
        message = message_from_bytes(envelope.content)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 Message accepted"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def smtp() -> Iterator[tuple[Collector, int]]:
    collector = Collector()
    port = free_port()
    controller = Controller(collector, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield collector, port
    finally:
        controller.stop()


async def test_email_is_delivered_with_stable_message_id(smtp: tuple[Collector, int]) -> None:
    collector, port = smtp
    processor = EmailProcessor("127.0.0.1", port, "jobq@localhost", 5.0)
    payload = {"to": ["a@example.com", "b@example.com"], "subject": "Hello", "body": "Hi there"}
    context = job(payload, "email")

    result = await processor(context)

    assert result == {
        "messageId": f"<{context.id}@jobq>",
        "recipients": ["a@example.com", "b@example.com"],
    }
    ((mail_from, rcpt_tos, message),) = collector.messages
    assert mail_from == "jobq@localhost"
    assert rcpt_tos == ["a@example.com", "b@example.com"]
    assert message["Subject"] == "Hello"
    assert message["Message-ID"] == f"<{context.id}@jobq>"
    assert message["From"] == "jobq@localhost"
    assert str(message.get_payload()).strip() == "Hi there"


async def test_email_from_an_allowed_sender_keeps_the_envelope_sender(
    smtp: tuple[Collector, int],
) -> None:
    collector, port = smtp
    policy = EmailPolicy.of(["team@example.com"], [])
    processor = EmailProcessor("127.0.0.1", port, "jobq@localhost", 5.0, policy)
    payload = {
        "to": "c@example.com",
        "subject": "S",
        "from": "team@example.com",
        "replyTo": "me@elsewhere.example",
    }
    result = await processor(job(payload, "email"))
    assert result["recipients"] == ["c@example.com"]
    ((mail_from, _, message),) = collector.messages
    assert mail_from == "jobq@localhost", "the envelope sender is always the operator's"
    assert message["From"] == "team@example.com"
    assert message["Reply-To"] == "me@elsewhere.example"


async def test_email_is_no_open_relay(smtp: tuple[Collector, int]) -> None:
    collector, port = smtp
    processor = EmailProcessor(
        "127.0.0.1", port, "jobq@localhost", 5.0, EmailPolicy.of([], ["example.com"])
    )
    spoof = {"to": "victim@example.com", "from": "security@bank.example", "subject": "Reset"}
    with pytest.raises(NonRetryable, match="/from"):
        await processor(job(spoof, "email"))
    outside = {"to": ["a@example.com", "victim@example.net"], "subject": "S"}
    with pytest.raises(NonRetryable, match="/to/1"):
        await processor(job(outside, "email"))
    assert collector.messages == []


@pytest.mark.parametrize(
    ("reply_field", "reply", "outcome"),
    [
        ("rcpt_reply", "550 No such user", NonRetryable),
        ("rcpt_reply", "450 Mailbox busy", Retry),
        ("data_reply", "554 Rejected", NonRetryable),
        ("data_reply", "451 Try again later", Retry),
    ],
)
async def test_email_smtp_replies(
    smtp: tuple[Collector, int], reply_field: str, reply: str, outcome: type[Exception]
) -> None:
    collector, port = smtp
    setattr(collector, reply_field, reply)
    processor = EmailProcessor("127.0.0.1", port, "jobq@localhost", 5.0)
    with pytest.raises(outcome, match=reply.split()[0]):
        await processor(job({"to": "a@example.com", "subject": "S"}, "email"))


async def test_email_connection_refused_retries() -> None:
    processor = EmailProcessor("127.0.0.1", free_port(), "jobq@localhost", 2.0)
    with pytest.raises(Retry, match=r"SMTP 127\.0\.0\.1"):
        await processor(job({"to": "a@example.com", "subject": "S"}, "email"))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"subject": "S"}, "need `to`"),
        ({"to": [], "subject": "S"}, "need `to`"),
        ({"to": "nobody", "subject": "S"}, "not an address"),
        ({"to": "a@b@c", "subject": "S"}, "not an address"),
        ({"to": "a@example.com, evil@example.com", "subject": "S"}, "not an address"),
        ({"to": ["a@example.com", 5], "subject": "S"}, "is a string"),
        ({"to": "a@example.com"}, "need `subject`"),
        ({"to": "a@example.com", "subject": "a\r\nBcc: x@y"}, "single line"),
        ({"to": "a@example.com", "subject": "S", "body": 3}, "body must be a string"),
        ({"to": "a@example.com", "subject": "S", "from": "x"}, "/from"),
        ({"to": "a@example.com", "subject": "S", "replyTo": "x"}, "/replyTo"),
        ({"to": "a@example.com", "subject": "S", "cc": "b@example.com"}, "/cc: unknown key"),
        ({"to": [f"u{i}@example.com" for i in range(101)], "subject": "S"}, "at most 100"),
    ],
)
async def test_email_bad_payload_is_final(payload: dict[str, Any], message: str) -> None:
    processor = EmailProcessor("127.0.0.1", 9, "jobq@localhost", 1.0)
    with pytest.raises(NonRetryable, match=message):
        await processor(job(payload, "email"))


# --- basic --------------------------------------------------------------------------------------


async def test_noop_ignores_payload() -> None:
    await noop(job({"anything": 1}, "noop"))


async def test_sleep_sleeps_for_ms() -> None:
    started = time.monotonic()
    assert await sleep(job({"ms": 50}, "sleep")) == {"sleptMs": 50}
    assert time.monotonic() - started >= 0.045


async def test_sleep_defaults_to_zero() -> None:
    assert await sleep(job({}, "sleep")) == {"sleptMs": 0}


@pytest.mark.parametrize("ms", [-1, 3_600_001, "10", True, None, float("inf"), [5]])
async def test_sleep_rejects_bad_ms(ms: object) -> None:
    with pytest.raises(NonRetryable, match="`ms`"):
        await sleep(job({"ms": ms}, "sleep"))


# --- registry -----------------------------------------------------------------------------------


def settings(*modules: str) -> WorkerSettings:
    return WorkerSettings(worker_processor_modules=list(modules))


def registry_for(*modules: str) -> ProcessorRegistry:
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    return build_registry(settings(*modules), http)


def test_registry_has_builtins() -> None:
    assert registry_for().task_types() == ["email", "noop", "sleep", "webhook"]


async def test_registry_loads_user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobq_test_user_procs.py").write_text(
        "async def resize(job):\n"
        "    return {'resized': job.payload['w']}\n"
        "\n"
        "def register(registry):\n"
        "    registry.register('resize-image', resize, timeout_seconds=60)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    registration = registry_for("jobq_test_user_procs").get("resize-image")

    assert registration is not None
    assert registration.timeout_seconds == 60
    assert await registration.processor(job({"w": 3}, "resize-image")) == {"resized": 3}


def test_registry_missing_module_names_it() -> None:
    with pytest.raises(RuntimeError, match="'jobq_no_such_module_xyz'"):
        registry_for("jobq_no_such_module_xyz")


def test_registry_module_without_register(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobq_test_no_register.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="'jobq_test_no_register' has no register"):
        registry_for("jobq_test_no_register")


def test_registry_module_that_fails_on_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jobq_test_broken.py").write_text("raise ValueError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match=r"'jobq_test_broken'.*boom"):
        registry_for("jobq_test_broken")


# --- timeouts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("own", "ceiling", "requested", "expected"),
    [
        (None, None, None, 900.0),  # the worker's default
        (60.0, None, None, 60.0),  # the processor's default
        (None, None, 43_200.0, 900.0),  # a submitter cannot go above WORKER_JOB_TIMEOUT
        (None, None, 30.0, 30.0),  # … but may ask for less
        (3600.0, None, 43_200.0, 3600.0),  # a processor's longer default is the ceiling
        (None, 120.0, 43_200.0, 120.0),  # an operator's cap
        (None, 7200.0, 5000.0, 5000.0),  # a cap above the worker's default, on purpose
    ],
)
def test_a_jobs_timeout_is_capped(
    own: float | None, ceiling: float | None, requested: float | None, expected: float
) -> None:
    registration = ProcessorRegistry()
    registration.register("t", noop, timeout_seconds=own, max_timeout_seconds=ceiling)
    found = registration.get("t")
    assert found is not None and found.timeout(requested, 900.0) == expected


def test_operators_cap_timeouts_per_task_type() -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    registry = build_registry(WorkerSettings(worker_timeout_caps="webhook:1m, sleep:2h"), http)  # type: ignore[arg-type]
    webhook, slow = registry.get("webhook"), registry.get("sleep")
    assert webhook is not None and webhook.timeout(43_200, 900) == 60
    assert slow is not None and slow.timeout(43_200, 900) == 7200
    for bad in ("webhook", "webhook:0", "Bad Name:5s", "webhook:5s,webhook:6s", "webhook:soon"):
        with pytest.raises(ValueError):
            WorkerSettings(worker_timeout_caps=bad)  # type: ignore[arg-type]

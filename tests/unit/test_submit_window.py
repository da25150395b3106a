"""The client library and the CLI set a submit's idempotency window
(`idempotencyWindowSeconds`, 1..2,592,000 s; docs/architecture.md#idempotency)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from common.contracts import IDEMPOTENCY_WINDOW_MAX
from common.errors import InvalidInput
from jobq import cli
from jobq.client import MINTED_KEY_WINDOW, AsyncClient, Client
from jobq.request import build_request

JOB_ID = uuid.UUID("01939f3c-0000-7000-8000-000000000001")


def _recording(sent: list[dict[str, Any]]) -> httpx.MockTransport:
    """A producer that records each submit body in `sent` and answers 202."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(202, json={"jobId": str(JOB_ID), "status": "PENDING"})

    return httpx.MockTransport(answer)


def test_build_request_carries_the_window_under_its_wire_name() -> None:
    request = build_request("noop", {}, idempotency_key="k", idempotency_window_seconds=300)
    assert request.idempotency_window_seconds == 300
    assert build_request("noop", {}).idempotency_window_seconds is None
    for window in (1, IDEMPOTENCY_WINDOW_MAX):
        assert build_request("noop", {}, idempotency_window_seconds=window)


@pytest.mark.parametrize("window", [0, -1, IDEMPOTENCY_WINDOW_MAX + 1, 1.5, "60"])
def test_a_window_out_of_bounds_is_refused_before_sending(window: Any) -> None:
    with pytest.raises(InvalidInput) as refused:
        build_request("noop", {}, idempotency_window_seconds=window)
    assert refused.value.errors[0]["pointer"] == "/idempotencyWindowSeconds"


def test_client_submit_sends_the_window() -> None:
    sent: list[dict[str, Any]] = []
    with Client("http://producer", transport=_recording(sent)) as client:
        reply = client.submit("noop", {}, idempotency_key="k", idempotency_window_seconds=300)
        client.submit("noop", {})
    assert reply.job_id == JOB_ID
    assert sent[0]["idempotencyKey"] == "k" and sent[0]["idempotencyWindowSeconds"] == 300
    # Without a key or a window the client mints a key held for MINTED_KEY_WINDOW (an hour).
    assert sent[1]["idempotencyKey"].startswith("jobq-client-")
    assert sent[1]["idempotencyWindowSeconds"] == MINTED_KEY_WINDOW == 3600


def test_a_callers_own_key_gets_the_queue_services_default_window() -> None:
    sent: list[dict[str, Any]] = []
    with Client("http://producer", transport=_recording(sent)) as client:
        client.submit("noop", {}, idempotency_key="mine")
    assert sent[0]["idempotencyKey"] == "mine"
    assert sent[0].get("idempotencyWindowSeconds") is None


def test_batch_entries_with_minted_keys_get_the_minted_window() -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.extend(json.loads(request.content)["jobs"])
        results = [
            {"index": i, "status": 202, "jobId": str(JOB_ID), "jobStatus": "PENDING"}
            for i in range(len(sent))
        ]
        return httpx.Response(200, json={"results": results})

    with Client("http://producer", transport=httpx.MockTransport(answer)) as client:
        client.submit_batch(
            [
                build_request("noop", {}),
                build_request("noop", {}, idempotency_window_seconds=60),
                build_request("noop", {}, idempotency_key="mine"),
            ]
        )
    assert [entry.get("idempotencyWindowSeconds") for entry in sent] == [3600, 60, None]
    assert [entry["idempotencyKey"].startswith("jobq-client-") for entry in sent] == [
        True,
        True,
        False,
    ]


async def test_async_client_submit_sends_the_window() -> None:
    sent: list[dict[str, Any]] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(202, json={"jobId": str(JOB_ID), "status": "PENDING"})

    async with AsyncClient("http://producer", transport=httpx.MockTransport(answer)) as client:
        await client.submit("noop", {}, idempotency_window_seconds=60)
    assert sent[0]["idempotencyWindowSeconds"] == 60
    assert sent[0]["idempotencyKey"].startswith("jobq-client-")


def test_cli_submit_idempotency_window(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(
        cli.Settings, "client", lambda self: Client(self.url, transport=_recording(sent))
    )
    runner = CliRunner()
    args = ["--json", "submit", "noop", "--idempotency-key", "k", "--idempotency-window", "300"]
    result = runner.invoke(cli.cli, args)
    assert result.exit_code == cli.EXIT_OK, result.output
    assert json.loads(result.stdout)["jobId"] == str(JOB_ID)
    assert sent == [
        {
            "taskType": "noop",
            "payload": {},
            "queue": "default",
            "priority": 0,
            "delaySeconds": 0.0,
            "maxAttempts": None,
            "timeoutSeconds": None,
            "idempotencyKey": "k",
            "idempotencyWindowSeconds": 300,
        }
    ]

    refused = runner.invoke(cli.cli, ["submit", "noop", "--idempotency-window", "0"])
    assert refused.exit_code == cli.EXIT_REFUSED, refused.output
    assert "/idempotencyWindowSeconds" in refused.stderr
    not_a_number = runner.invoke(cli.cli, ["submit", "noop", "--idempotency-window", "5m"])
    assert not_a_number.exit_code == cli.EXIT_USAGE
    assert len(sent) == 1, "nothing is sent for a refused window"
    assert "--idempotency-window" in runner.invoke(cli.cli, ["submit", "--help"]).output

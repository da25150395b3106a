"""Failing closed (docs/architecture.md#access): a service without credentials runs only on a
loopback address, unless the operator says otherwise on purpose; a WARNING either way."""

from __future__ import annotations

import logging

import pytest

from common.web.access import is_loopback, refuse_open_access


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("jobq.internal", False),
    ],
)
def test_loopback_binds(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_access_on_a_public_bind_refuses_to_start(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        refuse_open_access(
            "queue service", "0.0.0.0", ["QUEUE_INTERNAL_TOKEN"], insecure_allowed=False
        )
    assert stopped.value.code == 2
    assert "QUEUE_INTERNAL_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize(("host", "insecure"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_open_access_where_allowed_still_warns(
    host: str, insecure: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="common.web.access"):
        refuse_open_access("producer", host, ["JOBQ_API_KEYS"], insecure_allowed=insecure)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "JOBQ_API_KEYS" in record.getMessage()


def test_configured_credentials_start_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="common.web.access"):
        refuse_open_access("producer", "0.0.0.0", [], insecure_allowed=False)
    assert caplog.records == []

"""The shared problem-details mapping: an unexpected error never leaks internals."""

from __future__ import annotations

import logging

import pytest
from litestar import Litestar, get
from litestar.testing import TestClient

from common.web.app import exception_handlers


@get("/boom", sync_to_thread=False)
def boom() -> None:
    raise RuntimeError("password=hunter2 at /var/lib/secret")


def test_unexpected_errors_are_generic_problems_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Litestar([boom], exception_handlers=exception_handlers(), logging_config=None)
    with caplog.at_level(logging.ERROR), TestClient(app) as client:
        reply = client.get("/boom")

    assert reply.status_code == 500
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert reply.json()["type"] == "urn:jobq:problem:internal-error"
    assert "hunter2" not in reply.text and "secret" not in reply.text
    assert any("unhandled error" in record.getMessage() for record in caplog.records)

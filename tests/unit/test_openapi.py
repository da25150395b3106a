"""The committed OpenAPI documents match the code (run `make openapi` after changing an API)."""

from __future__ import annotations

import pytest

from infra.openapi import DOCS, generate, render


@pytest.mark.parametrize("name", ["producer.json", "queue.json"])
def test_committed_openapi_matches_the_code(name: str) -> None:
    committed = (DOCS / name).read_text()
    assert committed == render(generate()[name]), f"openapi/{name} is stale: run `make openapi`"


def test_every_bound_reaches_the_documents() -> None:
    schemas = generate()["producer.json"]["components"]["schemas"]
    submit = schemas["SubmitJobRequest"]["properties"]
    assert submit["priority"]["minimum"] == -1000 and submit["priority"]["maximum"] == 1000
    assert submit["maxAttempts"]["maximum"] == 100
    assert submit["timeoutSeconds"]["maximum"] == 43_200
    assert submit["taskType"]["pattern"].startswith("^[a-z0-9]")
    assert submit["idempotencyKey"]["maxLength"] == 255


@pytest.mark.parametrize("name", ["producer.json", "queue.json"])
def test_documents_declare_the_bearer_scheme(name: str) -> None:
    document = generate()[name]
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    assert document["security"] == [{"bearer": []}]

"""Every bad input gets a precise problem-details 4xx from both public doors (the producer and
the queue service), and nothing is written."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.queue.repository import JobRepository


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"d": value}
    return value


async def no_jobs(repository: JobRepository) -> bool:
    return sum(row.count for row in await repository.depth()) == 0


def assert_problem(reply: httpx.Response, status: int, pointer: str | None = None) -> None:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    problem = reply.json()
    assert problem["status"] == status
    assert {"type", "title", "detail"} <= problem.keys()
    assert "Traceback" not in reply.text and "sqlalchemy" not in reply.text.lower()
    if pointer is not None:
        assert pointer in [error["pointer"] for error in problem["errors"]], problem


BASE = {"taskType": "noop", "payload": {}}


@pytest.mark.parametrize(
    ("body", "status", "pointer"),
    [
        ({"taskType": "x", "payload": [1]}, 422, "/payload"),
        ({"taskType": "x", "payload": "text"}, 422, "/payload"),
        ({"taskType": "x"}, 422, "/payload"),
        ({**BASE, "delay_seconds": 1}, 422, "/delay_seconds"),
        ({**BASE, "priority": 5000}, 422, "/priority"),
        ({**BASE, "priority": -1001}, 422, "/priority"),
        ({**BASE, "priority": "high"}, 422, "/priority"),
        ({**BASE, "priority": 1.5}, 422, "/priority"),
        ({**BASE, "priority": "5"}, 422, "/priority"),
        ({**BASE, "delaySeconds": "10"}, 422, "/delaySeconds"),
        ({**BASE, "maxAttempts": True}, 422, "/maxAttempts"),
        ({**BASE, "delaySeconds": -1}, 422, "/delaySeconds"),
        ({**BASE, "delaySeconds": 1_209_601}, 422, "/delaySeconds"),
        ({**BASE, "maxAttempts": 0}, 422, "/maxAttempts"),
        ({**BASE, "maxAttempts": 101}, 422, "/maxAttempts"),
        ({**BASE, "timeoutSeconds": 0}, 422, "/timeoutSeconds"),
        ({**BASE, "timeoutSeconds": 43_201}, 422, "/timeoutSeconds"),
        ({"taskType": "Bad Name", "payload": {}}, 422, "/taskType"),
        ({"taskType": "a" * 65, "payload": {}}, 422, "/taskType"),
        ({"taskType": "", "payload": {}}, 422, "/taskType"),
        ({"taskType": "noop\n", "payload": {}}, 422, "/taskType"),
        ({**BASE, "queue": "Default"}, 422, "/queue"),
        ({**BASE, "queue": "default\n"}, 422, "/queue"),
        ({**BASE, "idempotencyKey": ""}, 422, "/idempotencyKey"),
        ({**BASE, "idempotencyKey": "k" * 256}, 422, "/idempotencyKey"),
        ({**BASE, "idempotencyKey": "k\u0001"}, 422, "/idempotencyKey"),
        ({**BASE, "idempotencyKey": "k\udc00"}, 422, "/idempotencyKey"),
        ({"taskType": "x", "payload": {"a": {"b": "nul\u0000"}}}, 422, "/payload/a/b"),
        ({"taskType": "x", "payload": {"a": [{"k\u0000": 1}]}}, 422, "/payload/a/0/k\u0000"),
        ({"taskType": "x", "payload": {"a": ["ok", "lone \ud800"]}}, 422, "/payload/a/1"),
        ({"taskType": "x", "payload": nested(33)}, 422, None),
        ({"taskType": "x", "payload": {"big": "x" * 300_000}}, 413, "/payload"),
    ],
)
async def test_bad_job_is_refused_precisely(
    door: httpx.AsyncClient,
    repository: JobRepository,
    body: dict[str, Any],
    status: int,
    pointer: str | None,
) -> None:
    # json.dumps escapes lone surrogates (httpx's own encoder would refuse them).
    reply = await door.post(
        "/jobs", content=json.dumps(body), headers={"content-type": "application/json"}
    )

    assert_problem(reply, status, pointer)
    assert await no_jobs(repository)


async def test_bad_framing_is_refused_precisely(
    door: httpx.AsyncClient, repository: JobRepository
) -> None:
    json_type = {"content-type": "application/json"}
    assert_problem(await door.post("/jobs", content=b'{"taskType": "x",', headers=json_type), 400)
    not_json = b'{"taskType": "noop", "payload": {}, "delaySeconds": NaN}'
    assert_problem(await door.post("/jobs", content=not_json, headers=json_type), 400)
    assert_problem(await door.post("/jobs"), 400)
    text = json.dumps(BASE).encode()
    for content_type in ("text/plain", "", "application/x-www-form-urlencoded"):
        plain = await door.post("/jobs", content=text, headers={"content-type": content_type})
        assert_problem(plain, 415)
    for field in ("priority", "delaySeconds", "maxAttempts"):
        # A number no float or int can hold: 422 at the field, saying why.
        too_large = f'{{"taskType":"noop","payload":{{}},"{field}":1e400}}'.encode()
        reply = await door.post("/jobs", content=too_large, headers=json_type)
        assert_problem(reply, 422, f"/{field}")
        assert "out of range" in reply.json()["detail"]
    huge = b'{"taskType":"x","payload":{"s":"' + b"x" * (9 * 1024 * 1024) + b'"}}'
    assert_problem(await door.post("/jobs", content=huge, headers=json_type), 413)
    assert_problem(await door.get("/nowhere"), 404)
    assert_problem(await door.delete("/jobs"), 405)
    assert_problem(await door.get("/jobs/not-a-uuid"), 404)
    assert await no_jobs(repository)


async def test_a_batch_just_under_the_body_limit_is_accepted(
    door: httpx.AsyncClient, repository: JobRepository
) -> None:
    entry = {"taskType": "noop", "payload": {"p": "y" * 16_600}}
    body = json.dumps({"jobs": [entry] * 500}).encode()
    assert len(body) < 8 * 1024 * 1024

    reply = await door.post(
        "/jobs/batch", content=body, headers={"content-type": "application/json"}
    )

    assert reply.status_code == 200, reply.text[:300]
    assert {r["status"] for r in reply.json()["results"]} == {202}
    assert sum(row.count for row in await repository.depth()) == 500

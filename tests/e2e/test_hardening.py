"""Defence in depth against the real processes: an unauthenticated flood costs the producer no
memory, services refuse to start open on a public address, and a producer holding a wrong
internal token says "upstream misconfigured" instead of passing the queue's 401 on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest

from infra.stack import ROOT, LocalStack, free_port
from tests.e2e.conftest import wait_for_status
from tests.helpers import eventually

KEY = "submit-key-0123456789abcdef"
KEYS = f"submit:acme:{KEY}"
BEARER = {"Authorization": f"Bearer {KEY}"}
FLOOD_CLIENTS = 16
FLOOD_BODY_BYTES = 8 * 1024 * 1024
RSS_CEILING_BYTES = 150 * 1024 * 1024


@pytest.fixture(scope="module")
async def guarded(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalStack]:
    """Queue service and producer (with API keys), and a worker whose jobs may run 1 s."""
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("guarded"),
        workers=1,
        environment={"JOBQ_API_KEYS": KEYS, "WORKER_JOB_TIMEOUT": "1s"},
    )
    await stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def unauthenticated_upload(port: int) -> bytes:
    """POST an 8 MiB body without a key, as fast as the server takes it; returns whatever
    the server answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /jobs HTTP/1.1\r\nHost: jobq\r\nContent-Type: application/json\r\n"
        f"Content-Length: {FLOOD_BODY_BYTES}\r\n\r\n"
    ).encode()
    chunk = b"[" * (256 * 1024)

    async def upload() -> None:
        writer.write(head)
        for _ in range(FLOOD_BODY_BYTES // len(chunk)):
            writer.write(chunk)
            await writer.drain()

    sending = asyncio.create_task(upload())
    answer = bytearray()
    try:
        while data := await reader.read(65536):
            answer.extend(data)
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            await sending
        writer.close()
    return bytes(answer)


async def test_sixteen_unauthenticated_8_mib_bodies_leave_the_producer_small(
    guarded: LocalStack,
) -> None:
    producer = psutil.Process(guarded.processes["producer"].pid)
    async with httpx.AsyncClient(base_url=guarded.producer, timeout=30) as client:
        created = await client.post(
            "/jobs", json={"taskType": "noop", "payload": {}}, headers=BEARER
        )
        job_id = created.json()["jobId"]
        before = producer.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.005):
                peak[0] = max(peak[0], producer.memory_info().rss)

        sampler = asyncio.create_task(asyncio.to_thread(sample))
        port = int(guarded.producer.rsplit(":", 1)[1])
        flood = asyncio.gather(*(unauthenticated_upload(port) for _ in range(FLOOD_CLIENTS)))
        # An authenticated read in the middle of the flood is served.
        during = await client.get(f"/jobs/{job_id}", headers=BEARER)
        answers = await flood
        stop.set()
        await sampler

    print(
        f"\nproducer RSS: {before / 2**20:.1f} MiB before, peak {peak[0] / 2**20:.1f} MiB during "
        f"{FLOOD_CLIENTS} unauthenticated uploads of {FLOOD_BODY_BYTES // 2**20} MiB; "
        f"{sum(bool(a) for a in answers)} answered 401"
    )
    assert during.status_code == 200 and during.json()["id"] == job_id
    assert peak[0] < RSS_CEILING_BYTES, f"peak RSS {peak[0] / 2**20:.0f} MiB"
    # The answer comes before the body; a client that keeps pushing its body at loopback
    # speed past the linger allowance may find the connection reset before it read it.
    answered = [answer for answer in answers if answer]
    assert answered, "no upload got an answer"
    assert all(answer.startswith(b"HTTP/1.1 401 ") for answer in answered), answered


async def test_a_submitter_cannot_outlast_the_workers_job_timeout(guarded: LocalStack) -> None:
    long = {
        "taskType": "sleep",
        "payload": {"ms": 3000},
        "timeoutSeconds": 43_200,
        "maxAttempts": 1,
    }
    async with httpx.AsyncClient(base_url=guarded.producer, timeout=30) as client:
        created = await client.post("/jobs", json=long, headers=BEARER)
        view = await wait_for_status(
            client, created.json()["jobId"], {"DEAD_LETTER", "COMPLETED"}, headers=BEARER
        )
    assert view["status"] == "DEAD_LETTER", view
    assert view["lastError"] == "timed out after 1s (timeoutSeconds)"


@pytest.mark.parametrize(
    ("module", "environment"),
    [
        ("services.queue", {"QUEUE_HOST": "0.0.0.0"}),
        ("services.producer", {"PRODUCER_HOST": "0.0.0.0"}),
    ],
)
def test_a_service_without_credentials_refuses_a_public_address(
    module: str, environment: dict[str, str]
) -> None:
    inherited = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QUEUE_INTERNAL_TOKEN", "JOBQ_API_KEYS", "JOBQ_API_KEYS_FILE")
        and not k.startswith(("QUEUE_", "PRODUCER_", "JOBQ_"))
    }
    started = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={**inherited, **environment, "QUEUE_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stderr
    assert "JOBQ_INSECURE_OPEN_ACCESS=1" in started.stderr


async def test_the_insecure_switch_starts_a_public_producer_with_a_warning(
    tmp_path: Path,
) -> None:
    port = free_port()
    log = tmp_path / "producer.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PRODUCER_", "JOBQ_"))},
        "PRODUCER_HOST": "0.0.0.0",
        "PRODUCER_PORT": str(port),
        "JOBQ_INSECURE_OPEN_ACCESS": "1",
        "LOG_FORMAT": "json",
    }
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.producer",
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )

    async def live() -> int:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"http://127.0.0.1:{port}/health/live")).status_code
        except httpx.HTTPError:
            return 0

    try:
        await eventually(live, lambda status: status == 200, within=30, what="producer live")
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 15)
    assert '"event": "open_access"' in log.read_text()

"""Start the real services as processes on free ports: queue, producer, worker, SMTP sink."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port


@dataclass
class Stack:
    """URLs of a running stack and what its processes wrote."""

    producer: str
    queue: str
    mailbox: Path
    logs: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every process's log, for assertion messages."""
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)


def _start(name: str, module: str, env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    log = (logs / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", module], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> int:
    """SIGTERM, then SIGKILL after `grace` seconds; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


async def wait_ready(
    url: str, processes: dict[str, subprocess.Popen[bytes]], within: float = 30
) -> None:
    """Poll `url` until it answers 200; fail early if a process died."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            dead = {n: p.returncode for n, p in processes.items() if p.poll() is not None}
            if dead:
                raise AssertionError(f"process exited early: {dead}")
            try:
                if (await client.get(url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} not ready within {within}s")
            await asyncio.sleep(0.1)


def stack_environment(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment every process of a test stack shares."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("QUEUE_", "WORKER_"))},
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "LOG_FORMAT": "json",
        "LOG_LEVEL": "INFO",
        "QUEUE_RETRY_BASE_DELAY": "50ms",
        "QUEUE_RETRY_MAX_DELAY": "200ms",
        "QUEUE_REAPER_INTERVAL": "200ms",
        "WORKER_WAIT_SECONDS": "2",
        "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1,localhost",
        **extra,
    }


@pytest.fixture(scope="module")
async def stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """Queue service, producer, one worker and the SMTP sink, as real processes."""
    logs = tmp_path_factory.mktemp("stack")
    queue_port, producer_port, smtp_port, metrics_port = (free_port() for _ in range(4))
    env = stack_environment(
        database_url,
        redis_url,
        QUEUE_PORT=str(queue_port),
        PRODUCER_PORT=str(producer_port),
        QUEUE_SERVICE_URL=f"http://127.0.0.1:{queue_port}",
        SMTP_HOST="127.0.0.1",
        SMTP_PORT=str(smtp_port),
        WORKER_METRICS_PORT=str(metrics_port),
    )
    mailbox = logs / "mailbox.jsonl"
    stack = Stack(
        producer=f"http://127.0.0.1:{producer_port}",
        queue=f"http://127.0.0.1:{queue_port}",
        mailbox=mailbox,
        logs=logs,
    )
    procs = stack.processes
    procs["smtp"] = subprocess.Popen(
        [sys.executable, "-m", "infra.smtp_sink", "--mailbox", str(mailbox)],
        cwd=ROOT,
        env=env,
        stdout=(logs / "smtp.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    procs["queue"] = _start("queue", "services.queue", env, logs)
    procs["producer"] = _start("producer", "services.producer", env, logs)
    procs["worker"] = _start("worker", "services.worker", env, logs)
    try:
        await wait_ready(f"{stack.queue}/health/ready", procs)
        await wait_ready(f"{stack.producer}/health/ready", procs)
        await wait_ready(f"http://127.0.0.1:{metrics_port}/health/ready", procs)
        yield stack
    finally:
        for process in procs.values():
            stop(process)


@pytest.fixture
def receiver_port() -> Iterator[int]:
    yield free_port()


async def wait_for_status(
    client: httpx.AsyncClient, job_id: str, statuses: set[str], within: float = 30
) -> dict[str, Any]:
    """Poll `GET /jobs/{id}` until the job is in one of `statuses`; returns its view."""
    deadline = time.monotonic() + within
    while True:
        view: dict[str, Any] = (await client.get(f"/jobs/{job_id}")).json()
        if view.get("status") in statuses:
            return view
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not in {statuses} within {within}s: {view}")
        await asyncio.sleep(0.05)

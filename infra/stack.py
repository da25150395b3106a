"""Run a whole jobq stack as real processes on free loopback ports.

Used by the end-to-end tests and the benchmarks, so both exercise exactly the processes
`make run` starts (`python -m services.queue`, `…producer`, `…worker`, `infra.smtp_sink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on right now. Every socket
    stays bound until all are taken: one at a time, the kernel may hand out the port it just
    gave back (a stack's queue service and producer were once given the same one)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


@dataclass
class LocalStack:
    """A queue service, a producer, `workers` worker replicas, an SMTP sink and (with
    `sqs_enabled`) the SQS endpoint.

    `start()` launches them with `environment` plus per-process ports and waits until every
    `/health/ready` answers 200 (raising RuntimeError with the logs if one dies or times out);
    `stop()` sends SIGTERM and escalates to SIGKILL after `grace` seconds. Logs go to
    `logs/<name>.log`; mail the sink receives is appended to `logs/mailbox.jsonl`.

    `producer_enabled=False` and `smtp_enabled=False` leave those processes out (a benchmark
    that drives the queue service alone); `root` is the checkout whose code the processes run
    (default this one; `benchmark.compare` runs an earlier revision's beside it);
    `start(workers=k)` starts only the first k replicas, and `start_workers()` the rest later
    (ports for all `workers` are reserved up front).
    """

    database_url: str
    redis_url: str
    logs: Path
    workers: int = 1
    environment: dict[str, str] = field(default_factory=dict)
    grace: float = 15.0
    producer_enabled: bool = True
    smtp_enabled: bool = True
    sqs_enabled: bool = False
    root: Path = ROOT
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        ports = free_ports(4 + self.workers)
        self.queue_port, self.producer_port, self.smtp_port, self.sqs_port = ports[:4]
        # Every stack guards its queue service like production does.
        self.internal_token = secrets.token_urlsafe(24)
        self.metrics_ports = ports[4:]
        self.logs.mkdir(parents=True, exist_ok=True)

    @property
    def producer(self) -> str:
        """Base URL of the producer."""
        return f"http://127.0.0.1:{self.producer_port}"

    @property
    def queue(self) -> str:
        """Base URL of the queue service."""
        return f"http://127.0.0.1:{self.queue_port}"

    @property
    def sqs(self) -> str:
        """Base URL of the SQS endpoint (the `endpoint_url` of an SQS client)."""
        return f"http://127.0.0.1:{self.sqs_port}"

    @property
    def mailbox(self) -> Path:
        """JSON lines of every mail the SMTP sink received."""
        return self.logs / "mailbox.jsonl"

    def _env(self) -> dict[str, str]:
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("QUEUE_", "WORKER_", "PRODUCER_", "SQS_"))
        }
        return {
            **inherited,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "LOG_FORMAT": "json",
            "QUEUE_PORT": str(self.queue_port),
            "PRODUCER_PORT": str(self.producer_port),
            "SQS_PORT": str(self.sqs_port),
            "QUEUE_SERVICE_URL": self.queue,
            "SMTP_HOST": "127.0.0.1",
            "SMTP_PORT": str(self.smtp_port),
            "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "QUEUE_INTERNAL_TOKEN": self.internal_token,
            **self.environment,
        }

    def _launch(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        self.stopped.discard(name)
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=self.root,
            # This checkout's code first, whatever the caller's environment puts on the path.
            env={
                **env,
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(self.root), env.get("PYTHONPATH")])
                ),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start_worker(self, index: int, **extra: str) -> str:
        """Start worker replica `index` (0-based); returns its process name."""
        name = f"worker{index + 1}"
        env = {
            **self._env(),
            "WORKER_NAME": name,
            "WORKER_METRICS_PORT": str(self.metrics_ports[index]),
            **extra,
        }
        self._launch(name, ["services.worker"], env)
        return name

    async def start(self, workers: int | None = None) -> None:
        """Launch every process (or the first `workers` replicas) and wait until all are ready."""
        env = self._env()
        if self.smtp_enabled:
            self._launch("smtp", ["infra.smtp_sink", "--mailbox", str(self.mailbox)], env)
        self._launch("queue", ["services.queue"], env)
        if self.producer_enabled:
            self._launch("producer", ["services.producer"], env)
        if self.sqs_enabled:
            self._launch("sqs", ["services.sqs"], env)
        try:
            await self.wait_ready(f"{self.queue}/health/ready")
            if self.producer_enabled:
                await self.wait_ready(f"{self.producer}/health/ready")
            if self.sqs_enabled:
                await self.wait_ready(f"{self.sqs}/health/ready")
            await self.start_workers(range(self.workers if workers is None else workers))
        except RuntimeError:
            self.stop()
            raise

    async def start_workers(self, indexes: Iterable[int], **extra: str) -> list[str]:
        """Start the worker replicas `indexes` (0-based) at once and wait until each is ready;
        returns their process names. RuntimeError as for `start()`."""
        names = [self.start_worker(index, **extra) for index in indexes]
        for name in names:
            port = self.metrics_ports[int(name.removeprefix("worker")) - 1]
            await self.wait_ready(f"http://127.0.0.1:{port}/health/ready")
        return names

    async def wait_ready(self, url: str, within: float = 30.0) -> None:
        """Poll `url` until it answers 200; RuntimeError if a process died or time ran out."""
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                dead = {
                    n: p.returncode
                    for n, p in self.processes.items()
                    if n not in self.stopped and p.poll() is not None
                }
                if dead:
                    raise RuntimeError(f"process exited early: {dead}\n{self.log_tail()}")
                try:
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} not ready within {within}s\n{self.log_tail()}")
                await asyncio.sleep(0.1)

    def stop_process(self, name: str, sig: int = signal.SIGTERM) -> int:
        """Send `sig` to one process and wait for it (SIGKILL after `grace`); its exit code.
        A process stopped this way no longer counts as "died early" for `wait_ready`."""
        process = self.processes[name]
        self.stopped.add(name)
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(self.grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        return process.returncode

    def stop(self) -> None:
        """Stop every process (workers first, so they can still settle with the queue)."""
        for name in sorted(self.processes, key=lambda n: not n.startswith("worker")):
            self.stop_process(name)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of every process's log, for error messages."""
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

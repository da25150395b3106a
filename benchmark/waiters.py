"""Waiting for outcomes: how soon `GET /jobs/{id}?waitSeconds=20` answers after its job
settles, what hundreds of waiters cost the queue service while they wait, and what the settle
trigger costs the settle statements when nobody waits (docs/adr/008-waiting-for-outcomes.md).

`python -m benchmark.waiters [--waiters 500] [--settles 20000] [--rounds 6] [--client raw]
[--profile FILE]` writes
`benchmark/results/waiters-<UTC time>.json`:

- `latency`: a queue service process (real HTTP, its own database) holds `--waiters` waiters
  on as many jobs; the jobs are claimed, then acked 100 per request (`acks_of_100`: 100
  answers leave together) or one per request (`acks_of_1`), one request at a time. Each
  waiter's latency is the time its answer's head arrived on its socket minus the time its
  job completed: `commit_to_answer` from the moment the job's settle notification reached a
  LISTEN connection of a process of its own (just after the ack's commit; a listener in the
  measuring process would stamp it late while that process reads answers), and
  `settle_to_answer` from the job's `finished_at` (the ack statement's start, so it also
  holds the statement's own run and commit); one host clock throughout. Waiters are bare
  sockets, not an HTTP client library, so the measuring process adds little of its own per
  answer (`--client aiohttp`: the earlier measurement, taken after aiohttp read and decoded
  each answer in the process that also sends the acks). With acks of 100, `per_ack` gives
  each ack's first and last answer by both measures and the ack request's own time, sent to
  answered (`--profile FILE`: py-spy's summary of the queue service meanwhile). `idle_cpu`:
  the queue service's CPU (percent of one core) over 5 s while the waiters wait (their jobs
  stay PENDING), beside 5 s with none.
- `settle_cost`: claim + ack of `--settles` jobs, 100 per statement, through the repository,
  with the trigger enabled and disabled, alternating rounds; jobs per second of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import msgspec
import psutil

from benchmark import database
from benchmark.profile import _spy, summarise
from benchmark.stats import latency_summary
from common.enqueue import SETTLED_CHANNEL
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack
from services.queue.repository import JobRepository, create_pool

RESULTS = ROOT / "benchmark" / "results"
TRIGGER = "job_settled_awaited"


async def _until_awaited(connection: asyncpg.Connection, count: int) -> None:
    """Until `count` jobs are flagged: every waiter is waiting (RuntimeError after 60 s)."""
    for _ in range(1200):
        if await connection.fetchval("SELECT count(*) FROM job WHERE awaited") >= count:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"not all {count} waiters started")


def _cpu_percent(pid: int, seconds: float) -> float:
    """The process's CPU over the next `seconds`, percent of one core."""
    process = psutil.Process(pid)
    before = sum(process.cpu_times()[:2])
    time.sleep(seconds)
    return round((sum(process.cpu_times()[:2]) - before) / seconds * 100, 2)


async def _listen(url: str, count: int) -> bool:
    """The body of `--listen COUNT` (the database URL in `JOBQ_LISTEN_URL`), run as its own
    process: LISTEN on `jobq_settled`, say `ready`, and once `count` notifications came (or
    after 120 s) print one line `<job id> <epoch seconds received>` for each that came.
    Returns whether all `count` came."""
    received: list[tuple[str, float]] = []
    done = asyncio.Event()

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        received.append((payload, time.time()))
        if len(received) >= count:
            done.set()

    connection = await asyncpg.connect(url)
    await connection.add_listener(SETTLED_CHANNEL, on_notify)
    print("ready", flush=True)
    try:
        if count > 0:
            await asyncio.wait_for(done.wait(), timeout=120)
    except TimeoutError:
        pass
    finally:
        await connection.close()
    print("\n".join(f"{job_id} {at}" for job_id, at in received), flush=True)
    return len(received) >= count


class _Listener:
    """A `--listen` process, as a context manager: when each job's settle notification
    reached a LISTEN connection of its own, just after the settle's commit, in a process that
    does nothing else (the benchmark's own process is busy reading the answers then, and would
    stamp it late). Leaving the block stops the process if it still runs."""

    def __init__(self, url: str, count: int) -> None:
        self._command = [sys.executable, "-m", "benchmark.waiters", "--listen", str(count)]
        self._environment = {**os.environ, "JOBQ_LISTEN_URL": url}  # not in `ps`
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> _Listener:
        self._process = subprocess.Popen(
            self._command, stdout=subprocess.PIPE, text=True, env=self._environment
        )
        assert self._process.stdout is not None
        if self._process.stdout.readline().strip() != "ready":  # "" when it ended
            self._stop()
            raise RuntimeError("the settle listener did not start (see its error above)")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def received(self, ids: list[str]) -> dict[str, float]:
        """Job id → epoch seconds its notification arrived, for each of `ids` (waits for the
        process to end; RuntimeError naming the jobs it did not hear of)."""
        assert self._process is not None
        out, _ = self._process.communicate(timeout=150)
        lines = (line.split() for line in out.splitlines() if line)
        heard = {job_id: float(at) for job_id, at in lines}
        missing = [job_id for job_id in ids if job_id not in heard]
        if missing:
            raise RuntimeError(
                f"the settle listener (exit code {self._process.returncode}) heard of"
                f" {len(ids) - len(missing)} of {len(ids)} jobs; not of {missing[:3]} …"
            )
        return heard


async def _raw_waiter(
    address: tuple[str, int], token: str, job_id: str
) -> tuple[asyncio.StreamWriter, asyncio.Task[tuple[float, str]]]:
    """Open a connection, send `GET /jobs/{id}?waitSeconds=20` on it, and return it with a task
    ending with (the time the answer's head arrived, the job's status in its body). A bare
    socket rather than an HTTP client library: the time is taken as the head arrives, before
    any parsing, so it holds none of the measuring process's own work per answer."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(
        f"GET /jobs/{job_id}?waitSeconds=20 HTTP/1.1\r\nHost: {address[0]}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )

    async def answer() -> tuple[float, str]:
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.time()
        found = re.search(rb"(?i)content-length: *(\d+)", head)
        assert found is not None, head
        body = await reader.readexactly(int(found.group(1)))
        return arrived, str(msgspec.json.decode(body)["status"])

    return writer, asyncio.create_task(answer())


async def _aiohttp_waiter(http: aiohttp.ClientSession, job_id: str) -> tuple[float, str]:
    """The measurement before bare sockets (`--client aiohttp`): the time taken after aiohttp
    read and decoded the whole answer, in the process that also sends the acks."""
    async with http.get(f"/jobs/{job_id}?waitSeconds=20") as reply:
        body = await reply.json()
    return time.time(), str(body["status"])


class _Round(NamedTuple):
    """One round's answers: each one's delay (ms) after its job's `finished_at` (the settle
    statement's start) and after its job's settle notification reached an independent
    listener (just after the commit), how many answered COMPLETED, and per ack request its
    burst: the first and last answer after `finished_at` and after the commit, and the ack
    request's own time (sent → answered, ms)."""

    after_start: list[float]
    after_commit: list[float]
    completed: int
    bursts: list[dict[str, float]]


async def _wait_and_ack(
    http: aiohttp.ClientSession,
    connection: asyncpg.Connection,
    address: tuple[str, int],
    token: str,
    waiters: int,
    per_ack: int,
    client: str,
) -> tuple[list[str], list[dict[str, Any]], list[tuple[float, str]], list[float]]:
    """`waiters` waiters on as many new jobs, then the jobs claimed and acked `per_ack` per
    request (one request at a time). Returns the job ids, the claimed jobs in ack order, each
    waiter's (time its answer arrived, status), and each ack request's time (ms)."""
    batch = [{"taskType": "noop", "payload": {"i": i}} for i in range(waiters)]
    async with http.post("/jobs/batch", json={"jobs": batch}) as reply:
        ids = [entry["jobId"] for entry in (await reply.json())["results"]]
    if client == "raw":
        opened = [await _raw_waiter(address, token, job_id) for job_id in ids]
        tasks = [task for _, task in opened]
    else:
        opened = []
        tasks = [asyncio.create_task(_aiohttp_waiter(http, job_id)) for job_id in ids]
    await _until_awaited(connection, waiters)
    claimed: list[dict[str, Any]] = []
    while len(claimed) < waiters:
        claim = {"worker": "bench", "queues": ["default"], "max": 100}
        async with http.post("/jobs/next", json=claim) as reply:
            claimed.extend((await reply.json())["jobs"])
    ack_ms: list[float] = []
    for start in range(0, waiters, per_ack):
        entries = [
            {"id": job["id"], "receiptHandle": job["receiptHandle"]}
            for job in claimed[start : start + per_ack]
        ]
        sent = time.perf_counter()
        async with http.post("/jobs/ack", json={"entries": entries}) as reply:
            assert reply.status == 200, await reply.text()
        ack_ms.append((time.perf_counter() - sent) * 1000)
    results = await asyncio.gather(*tasks)
    for writer, _ in opened:
        writer.close()
    return ids, claimed, results, ack_ms


async def _round(
    http: aiohttp.ClientSession,
    connection: asyncpg.Connection,
    url: str,
    address: tuple[str, int],
    token: str,
    waiters: int,
    per_ack: int,
    client: str = "raw",
) -> _Round:
    """`waiters` waiters on as many jobs, then the jobs acked `per_ack` per request (one
    request at a time), with a `_Listener` taking each settle's commit time."""
    await database.reset_jobs(connection)
    with _Listener(url, waiters) as listener:
        ids, claimed, results, ack_ms = await _wait_and_ack(
            http, connection, address, token, waiters, per_ack, client
        )
        committed = await asyncio.to_thread(listener.received, ids)
    answered = dict(zip(ids, results, strict=True))
    finished = {
        str(row["id"]): row["f"]
        for row in await connection.fetch(
            "SELECT id, EXTRACT(EPOCH FROM finished_at)::float8 AS f"
            f" FROM {await database.jobs_relation(connection)}"
        )
    }
    completed = sum(status == "COMPLETED" for _, status in answered.values())
    after_start = {i: (at - finished[i]) * 1000 for i, (at, _) in answered.items()}
    after_commit = {i: (at - committed[i]) * 1000 for i, (at, _) in answered.items()}
    order = [str(job["id"]) for job in claimed]
    bursts = []
    for number, took in enumerate(ack_ms):
        burst = order[number * per_ack : (number + 1) * per_ack]
        bursts.append(
            {
                "first_ms": round(min(after_start[i] for i in burst), 2),
                "last_ms": round(max(after_start[i] for i in burst), 2),
                "first_after_commit_ms": round(min(after_commit[i] for i in burst), 2),
                "last_after_commit_ms": round(max(after_commit[i] for i in burst), 2),
                "ack_request_ms": round(took, 2),
            }
        )
    return _Round(list(after_start.values()), list(after_commit.values()), completed, bursts)


async def _latency(
    base: str, redis: str, waiters: int, profile: Path | None = None, client: str = "raw"
) -> dict[str, Any]:
    """The `latency` and `idle_cpu` parts; with `profile` (a file for py-spy's raw output),
    the queue service's frames while the acks of 100 are answered."""
    url = await database.migrated_database(base, "jobq_bench_waiters")
    stack = LocalStack(
        url,
        redis,
        Path(tempfile.mkdtemp(prefix="jobq-bench-waiters-")),
        workers=0,
        producer_enabled=False,
        smtp_enabled=False,
    )
    await stack.start()
    pid = stack.processes["queue"].pid
    connection = await asyncpg.connect(url)
    headers = {"Authorization": f"Bearer {stack.internal_token}"}
    connector = aiohttp.TCPConnector(limit=waiters + 10)
    parsed = urlsplit(stack.queue)
    result: dict[str, Any] = {"waiters": waiters, "client": client}
    try:
        async with aiohttp.ClientSession(stack.queue, headers=headers, connector=connector) as http:
            quiet = await asyncio.to_thread(_cpu_percent, pid, 5.0)
            # The CPU while `waiters` wait: a round whose acks begin after the measurement.
            batch = [{"taskType": "noop", "payload": {}} for _ in range(waiters)]
            async with http.post("/jobs/batch", json={"jobs": batch}) as reply:
                ids = [entry["jobId"] for entry in (await reply.json())["results"]]
            holders = [
                asyncio.create_task(http.get(f"/jobs/{job_id}?waitSeconds=20")) for job_id in ids
            ]
            await _until_awaited(connection, waiters)
            waiting = await asyncio.to_thread(_cpu_percent, pid, 5.0)
            for holder in holders:
                (await holder).release()
            result["idle_cpu"] = {
                "no_waiters_percent": quiet,
                "waiters_percent": waiting,
                "seconds": 5.0,
            }
            address = (parsed.hostname or "127.0.0.1", parsed.port or 80)
            for name, per_ack in (("acks_of_100", 100), ("acks_of_1", 1)):
                spy = None
                if profile is not None and per_ack > 1:
                    spy = _spy(pid, 250, 8, profile)
                answers = await _round(
                    http, connection, url, address, stack.internal_token, waiters, per_ack, client
                )
                if spy is not None:
                    await asyncio.to_thread(spy.wait)
                    result["profile_acks_of_100"] = summarise(profile)  # type: ignore[arg-type]
                result[name] = {
                    "answered_completed": answers.completed,
                    "commit_to_answer": latency_summary(answers.after_commit),
                    "settle_to_answer": latency_summary(answers.after_start),
                }
                if per_ack > 1:
                    result[name]["per_ack"] = answers.bursts
    finally:
        await connection.close()
        stack.stop()
    return result


async def _settle_round(repository: JobRepository, jobs: int) -> float:
    """Claim and ack `jobs` pre-inserted jobs 100 per statement; jobs per second."""
    began = time.perf_counter()
    done = 0
    while done < jobs:
        claimed = await repository.claim(["default"], "bench", 100, 30)
        settled = await repository.ack_many([(job.id, job.receipt_handle, None) for job in claimed])
        done += len(settled)
    return jobs / (time.perf_counter() - began)


async def _settle_cost(base: str, settles: int, rounds: int) -> dict[str, Any]:
    url = await database.migrated_database(base, "jobq_bench_waiters_settle")
    pool = await create_pool(url, size=2)
    repository = JobRepository(pool)
    rates: dict[str, list[float]] = {"trigger": [], "no_trigger": []}
    try:
        for round_ in range(rounds):
            # ABBA order, so a drift of the shared machine's load weighs on both alike.
            kinds = ("trigger", "no_trigger") if round_ % 2 == 0 else ("no_trigger", "trigger")
            for kind in kinds:
                action = "ENABLE" if kind == "trigger" else "DISABLE"
                async with pool.acquire() as connection:
                    await database.reset_jobs(connection)
                    await connection.execute(f"ALTER TABLE job {action} TRIGGER {TRIGGER}")
                    await database.insert_jobs(connection, settles)
                rates[kind].append(await _settle_round(repository, settles))
    finally:
        await pool.close()
    with_trigger, without = (statistics.median(rates[k]) for k in ("trigger", "no_trigger"))
    # Also per round pair: the machine's load changes between rounds more than within one.
    pairs = [t / n for t, n in zip(rates["trigger"], rates["no_trigger"], strict=True)]
    return {
        "jobs_per_round": settles,
        "rounds": rounds,
        "jobs_per_s": {k: [round(r) for r in v] for k, v in rates.items()},
        "median_trigger_vs_none": round(with_trigger / without, 3),
        "median_of_round_ratios": round(statistics.median(pairs), 3),
    }


async def main(arguments: argparse.Namespace) -> Path:
    base, redis = ensure_postgres(), ensure_redis()
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine_cores": psutil.cpu_count(),
        "latency": await _latency(
            base, f"{redis}/0", arguments.waiters, arguments.profile, arguments.client
        ),
    }
    if arguments.rounds > 0:
        result["settle_cost"] = await _settle_cost(base, arguments.settles, arguments.rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"waiters-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    if sys.argv[1:2] == ["--listen"]:  # the settle listener's process (_Listener)
        sys.exit(0 if asyncio.run(_listen(os.environ["JOBQ_LISTEN_URL"], int(sys.argv[2]))) else 1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", type=int, default=500)
    parser.add_argument("--settles", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6, help="settle-cost rounds (0: none)")
    parser.add_argument(
        "--client",
        choices=("raw", "aiohttp"),
        default="raw",
        help="waiters on bare sockets (default) or aiohttp (the earlier measurement)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the queue service during the acks of 100 (raw file)"
    )
    asyncio.run(main(parser.parse_args()))

"""The SQS endpoint against jobq's own protocol, side by side in one run (issue 21).

The same work through each door, in alternating rounds on one stack (queue service, producer,
SQS endpoint; PostgreSQL and Redis as found), `--threads` client threads per side:

- **SQS**: boto3 `SendMessageBatch` (10 messages a call) until `--messages` are sent, then
  `ReceiveMessage` (10, no wait) + `DeleteMessageBatch` loops until every one is deleted;
  every request SigV4-signed and verified.
- **jobq**: the producer's `POST /jobs/batch` (10 jobs a call, bearer key), then the worker
  protocol on the queue service, `POST /jobs/next` (max 10, no wait) + `POST /jobs/ack`, with
  httpx: the calls jobq's own clients make.

Per side and phase: messages/s, per-call latency (p50/p95/p99), and CPU µs per message by
process class; the summary gives the medians over rounds and the SQS/jobq ratios. Writes
`benchmark/results/sqs-<timestamp>.json` and a PNG beside it. `python -m benchmark.sqs --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from benchmark.context import Context, stack_pids
from benchmark.machine import load_average
from benchmark.processes import cpu_per_job_us
from benchmark.progress import Progress
from benchmark.stats import latency_summary, median
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import LocalStack

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 10
REGION = "jobq-local-1"
BODY = "x" * 100


class _Calls:
    """Latencies of one kind of call, from every thread (milliseconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ms: list[float] = []

    def timed(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)`, timed."""
        started = time.perf_counter()
        result = call(*args, **kwargs)
        elapsed = (time.perf_counter() - started) * 1000
        with self._lock:
            self.ms.append(elapsed)
        return result


class _Drained:
    """How many messages every drain thread settled together."""

    def __init__(self, target: int) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.target = target

    def add(self, settled: int) -> bool:
        """Count `settled`; whether the target is reached."""
        with self._lock:
            self.count += settled
            return self.count >= self.target

    @property
    def done(self) -> bool:
        with self._lock:
            return self.count >= self.target


def _threads(threads: int, work: Callable[[int], None]) -> float:
    """Run `work(i)` on `threads` threads; the wall-clock seconds."""
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(work, i) for i in range(threads)]:
            future.result()
    return time.perf_counter() - started


def _sqs_side(
    stack: LocalStack, key: str, queue: str, messages: int, threads: int
) -> dict[str, Any]:
    key_id = hashlib.sha256(key.encode()).hexdigest()[:12]

    def client() -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=stack.sqs,
            region_name=REGION,
            aws_access_key_id=key_id,
            aws_secret_access_key=key,
        )

    url = client().create_queue(QueueName=queue)["QueueUrl"]
    clients = [client() for _ in range(threads)]
    send, receive, delete = _Calls(), _Calls(), _Calls()
    batches = messages // BATCH

    def sender(index: int) -> None:
        entries = [{"Id": str(i), "MessageBody": BODY} for i in range(BATCH)]
        for _ in range(index, batches, threads):
            reply = send.timed(clients[index].send_message_batch, QueueUrl=url, Entries=entries)
            assert not reply.get("Failed"), reply["Failed"]

    drained = _Drained(batches * BATCH)

    def drainer(index: int) -> None:
        sqs = clients[index]
        while not drained.done:
            reply = receive.timed(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=BATCH)
            got = reply.get("Messages", [])
            if not got:
                continue
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ]
            reply = delete.timed(sqs.delete_message_batch, QueueUrl=url, Entries=entries)
            assert not reply.get("Failed"), reply["Failed"]
            drained.add(len(got))

    return _phases(stack, threads, sender, drainer, batches * BATCH, (send, receive, delete))


def _jobq_side(
    stack: LocalStack, key: str, queue: str, messages: int, threads: int
) -> dict[str, Any]:
    producers = [
        httpx.Client(base_url=stack.producer, headers={"Authorization": f"Bearer {key}"})
        for _ in range(threads)
    ]
    workers = [
        httpx.Client(
            base_url=stack.queue, headers={"Authorization": f"Bearer {stack.internal_token}"}
        )
        for _ in range(threads)
    ]
    send, receive, delete = _Calls(), _Calls(), _Calls()
    batches = messages // BATCH
    body = {"jobs": [{"taskType": "sqs", "queue": queue, "payload": {"body": BODY}}] * BATCH}

    def sender(index: int) -> None:
        for _ in range(index, batches, threads):
            reply = send.timed(producers[index].post, "/jobs/batch", json=body)
            reply.raise_for_status()
            assert all(r["status"] == 202 for r in reply.json()["results"])

    drained = _Drained(batches * BATCH)
    claim = {"worker": "bench", "queues": [queue], "max": BATCH, "waitSeconds": 0}

    def drainer(index: int) -> None:
        http = workers[index]
        while not drained.done:
            reply = receive.timed(http.post, "/jobs/next", json=claim)
            if reply.status_code == 204:
                continue
            jobs = reply.json()["jobs"]
            entries = [{"id": j["id"], "receiptHandle": j["receiptHandle"]} for j in jobs]
            acked = delete.timed(http.post, "/jobs/ack", json={"entries": entries})
            assert all(r["status"] == 200 for r in acked.json()["results"])
            drained.add(len(jobs))

    try:
        return _phases(stack, threads, sender, drainer, batches * BATCH, (send, receive, delete))
    finally:
        for client in producers + workers:
            client.close()


def _phases(
    stack: LocalStack,
    threads: int,
    sender: Callable[[int], None],
    drainer: Callable[[int], None],
    messages: int,
    calls: tuple[_Calls, _Calls, _Calls],
) -> dict[str, Any]:
    """Send, then drain, each measured: messages/s, CPU µs per message by process class."""
    ctx: Context = _CONTEXT[0]
    classes = {**stack_pids(stack, "queue", "producer", "sqs"), "client": [os.getpid()]}
    result: dict[str, Any] = {"messages": messages}
    for phase, work in (("send", sender), ("drain", drainer)):
        meter = ctx.meter(classes, stack.database_url).start()
        seconds = _threads(threads, work)
        usage = meter.stop()
        result[phase] = {
            "seconds": round(seconds, 3),
            "messages_per_s": round(messages / seconds, 1),
            "cpu_us_per_message": cpu_per_job_us(usage, messages),
            # Per process class, for sizing (infra/k8s/base/sqs.yaml's requests and limits).
            "cpu_percent": {
                k: round(v["cpu_seconds"] / seconds * 100, 1) for k, v in usage.items()
            },
            "rss_peak_mb": {k: v["rss_peak_mb"] for k, v in usage.items()},
        }
    send, receive, delete = calls
    result["send"]["latency"] = latency_summary(send.ms)
    result["drain"]["receive_latency"] = latency_summary(receive.ms)
    result["drain"]["delete_latency"] = latency_summary(delete.ms)
    total = result["send"]["seconds"] + result["drain"]["seconds"]
    result["round_trip_messages_per_s"] = round(messages / total, 1)
    return result


_CONTEXT: list[Context] = []


def summary(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds per side, and the SQS/jobq ratios of the medians (throughput: < 1
    means the SQS door is slower; CPU: > 1 means it costs more)."""
    sides: dict[str, dict[str, float]] = {}
    for side in ("sqs", "jobq"):
        entries = [entry[side] for entry in rounds]
        sides[side] = {
            "send_messages_per_s": median([e["send"]["messages_per_s"] for e in entries]),
            "drain_messages_per_s": median([e["drain"]["messages_per_s"] for e in entries]),
            "round_trip_messages_per_s": median([e["round_trip_messages_per_s"] for e in entries]),
            "send_p95_ms": median([e["send"]["latency"]["p95_ms"] for e in entries]),
            "receive_p95_ms": median([e["drain"]["receive_latency"]["p95_ms"] for e in entries]),
            "delete_p95_ms": median([e["drain"]["delete_latency"]["p95_ms"] for e in entries]),
            "cpu_us_per_message": median(
                [
                    e["send"]["cpu_us_per_message"].get("total", 0.0)
                    + e["drain"]["cpu_us_per_message"].get("total", 0.0)
                    for e in entries
                ]
            ),
        }
    ratio = {
        key: round(sides["sqs"][key] / sides["jobq"][key], 3) if sides["jobq"][key] else None
        for key in sides["sqs"]
    }
    phases = [entry["sqs"][phase] for entry in rounds for phase in ("send", "drain")]
    # The SQS endpoint process's own highest RSS and CPU over every round's phases (sizing).
    endpoint = {
        "rss_peak_mb": max(p.get("rss_peak_mb", {}).get("sqs", 0.0) for p in phases),
        "cpu_percent": max(p.get("cpu_percent", {}).get("sqs", 0.0) for p in phases),
    }
    return {**sides, "ratio_sqs_to_jobq": ratio, "sqs_endpoint": endpoint}


def plot(document: dict[str, Any], path: Path) -> None:
    """Messages/s per phase and side, and p95 latency per call, as a PNG."""
    result = document["summary"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    phases = ["send_messages_per_s", "drain_messages_per_s", "round_trip_messages_per_s"]
    labels = ["send", "receive + delete", "send, then drain"]
    width = 0.38
    for offset, side, colour in ((-width / 2, "sqs", "#ff9900"), (width / 2, "jobq", "#4a7ebb")):
        left.bar(
            [i + offset for i in range(3)],
            [result[side][p] for p in phases],
            width,
            label="SQS endpoint (boto3)" if side == "sqs" else "jobq protocol (httpx)",
            color=colour,
        )
        right.bar(
            [i + offset for i in range(3)],
            [result[side][k] for k in ("send_p95_ms", "receive_p95_ms", "delete_p95_ms")],
            width,
            color=colour,
        )
    left.set_xticks(range(3), labels)
    left.set_ylabel("messages/s (median of rounds)")
    left.legend()
    left.set_title(
        f"{document['settings']['messages']} messages, batches of 10, "
        f"{document['settings']['threads']} threads a side"
    )
    right.set_xticks(
        range(3),
        [
            "SendMessageBatch /\nPOST /jobs/batch",
            "ReceiveMessage /\nPOST /jobs/next",
            "DeleteMessageBatch /\nPOST /jobs/ack",
        ],
    )
    right.set_ylabel("p95 ms per call")
    right.set_title("Latency per call")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


async def run(messages: int, threads: int, rounds: int) -> dict[str, Any]:
    """The rounds, alternating which side goes first; the result document."""
    progress = Progress(total=rounds * 2)
    ctx = Context(
        ensure_postgres(),
        ensure_redis().rstrip("/") + "/13",
        Path(tempfile.mkdtemp(prefix="jobq-bench-sqs-")),
        progress,
    )
    _CONTEXT[:] = [ctx]
    await ctx.setup()
    key = secrets.token_urlsafe(24)
    started, load_start = datetime.now(UTC), load_average()
    results: list[dict[str, dict[str, Any]]] = []
    try:
        url = await ctx.database("sqs")
        stack = LocalStack(
            url,
            ctx.redis_url,
            ctx.logs / "stack",
            workers=0,
            smtp_enabled=False,
            sqs_enabled=True,
            environment={"JOBQ_API_KEYS": f"admin:bench:{key}"},
        )
        await stack.start()
        try:
            for index in range(rounds):
                order = ("sqs", "jobq") if index % 2 == 0 else ("jobq", "sqs")
                entry: dict[str, dict[str, Any]] = {}
                for side in order:
                    progress.phase(f"round {index + 1}/{rounds}: {side}")
                    work = _sqs_side if side == "sqs" else _jobq_side
                    entry[side] = await asyncio.to_thread(
                        work, stack, key, f"bench-{side}-{index}", messages, threads
                    )
                results.append(entry)
        finally:
            stack.stop()
    finally:
        await ctx.cleanup()
    return {
        "name": "sqs",
        "started": started.isoformat(timespec="seconds"),
        "load_average": {"start": load_start, "end": load_average()},
        "settings": {"messages": messages, "threads": threads, "rounds": rounds, "batch": BATCH},
        "rounds": results,
        "summary": summary(results),
    }


def main() -> None:
    """Parse the options, run, write JSON and PNG, print the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.sqs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=5000, help="messages per side and round")
    parser.add_argument("--threads", type=int, default=4, help="client threads per side")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="directory for JSON and PNG")
    args = parser.parse_args()
    document = asyncio.run(run(args.messages, args.threads, args.rounds))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"sqs-{stamp}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    plot(document, path.with_suffix(".png"))
    print(json.dumps(document["summary"], indent=2))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()

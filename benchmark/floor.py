"""The HTTP stack's share of a submit: CPU per request of apps with no queue behind them.

The same k6 step as the ingest benchmark (`benchmark/k6/ingest.js`: `POST /jobs` of a `noop`
job at a constant arrival rate) against three apps served as jobq's services are
(`common.web.serving.serve`: uvicorn with httptools and uvloop, the same connection limits),
each decoding the body strictly with msgspec and answering `202` with a fixed job id:

- `raw`: a bare ASGI callable, the server's own cost;
- `asgi`: the same callable as a Litestar `@asgi` route, Litestar's router and middleware
  stack in front of it;
- `handler`: a Litestar `@post` route handler taking `data: Submit`, as every jobq route is
  (signature model, body extraction, response building).

The kinds alternate within each round; the result is the server process's CPU per request
(µs) and the step's p95, per round and as medians. What jobq's producer costs above
`handler` is its own work (authentication, validation, the forward to the queue service):
compare with `make k6`'s CPU per submit at the same rate.

    python -m benchmark.floor [--rate 800] [--seconds 15] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psutil
from litestar import Litestar, asgi, post
from litestar.params import JSONBody
from litestar.types import Receive, Scope, Send

from benchmark import RESULTS
from benchmark.bare import Submit
from benchmark.ingest import SCRIPT, k6_binary, open_loop
from common.web.serving import ServerLimits, serve
from infra.stack import free_port

KINDS = ("raw", "asgi", "handler")
_JOB_ID = "0192e4a0-0000-7000-8000-000000000000"
_BODY = msgspec.json.encode({"jobId": _JOB_ID, "status": "PENDING"})
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_BODY))]


# The bare app's ASGI callables are typed loosely: Litestar's own ASGI types admit only the
# messages Litestar sends.
async def _lifespan(receive: Any, send: Any) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def raw_app(scope: Any, receive: Any, send: Any) -> None:
    """The bare ASGI app: reads the body, decodes it as a `Submit` (400 when it is not one),
    answers 202 with a fixed job."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    try:
        msgspec.json.decode(body, type=Submit)
    except msgspec.DecodeError:
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 202, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


@asgi("/jobs", copy_scope=False)
async def submit_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """`raw_app` behind Litestar's router."""
    await raw_app(scope, receive, send)


@post("/jobs", status_code=202)
async def submit_handler(data: JSONBody[Submit]) -> dict[str, str]:
    """A Litestar route handler doing what `raw_app` does."""
    return {"jobId": _JOB_ID, "status": "PENDING"}


def _app(kind: str) -> Any:
    if kind == "raw":
        return raw_app
    return Litestar([submit_asgi if kind == "asgi" else submit_handler])


def _wait_for(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited {server.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listened on port {port} within 20 s")


def _step(kind: str, rate: int, seconds: int, workdir: Path) -> dict[str, Any]:
    """One k6 step against a fresh server of `kind`: the step's summary with the server's
    `cpu_us_per_request` (per accepted request)."""
    port = free_port()
    command = [sys.executable, "-m", "benchmark.floor", "--serve", kind, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(port, server)
        summary = workdir / f"{kind}.json"
        env = {
            **os.environ,
            "URL": f"http://127.0.0.1:{port}/jobs",
            "DURATION": str(seconds),
            "SUMMARY": str(summary),
            "K6_NO_USAGE_REPORT": "true",
            **open_loop(rate),
        }
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        k6 = subprocess.run(
            [k6_binary(), "run", "--quiet", "--no-color", str(SCRIPT)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
        )  # fmt: skip
        after = process.cpu_times()
        if k6.returncode != 0 or not summary.exists():
            raise RuntimeError(f"k6 exited {k6.returncode}: {k6.stderr.decode()[-2000:]}")
        step: dict[str, Any] = json.loads(summary.read_text())
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    cpu = (after.user - before.user) + (after.system - before.system)
    accepted = step["requests"] - step["failed"]
    step["cpu_us_per_request"] = round(cpu / max(accepted, 1) * 1e6, 1)
    return step


def run(rate: int, seconds: int, rounds: int) -> dict[str, Any]:
    """`rounds` rounds of one step per kind, alternating; the document written to results."""
    steps: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(1, rounds + 1):
            for kind in KINDS:
                step = _step(kind, rate, seconds, Path(scratch))
                steps[kind].append(step)
                print(
                    f"round {number}/{rounds} {kind:8} {step['cpu_us_per_request']:7.1f} µs CPU"
                    f" per request, p95 {step['p95_ms']:.2f} ms, {step['failed']} failed,"
                    f" {step['dropped']} dropped",
                    flush=True,
                )
    medians = {
        kind: {
            "cpu_us_per_request": statistics.median(s["cpu_us_per_request"] for s in runs),
            "p95_ms": round(statistics.median(s["p95_ms"] for s in runs), 2),
        }
        for kind, runs in steps.items()
    }
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine_cores": psutil.cpu_count(),
        "load_average": list(os.getloadavg()),
        "settings": {"rate": rate, "seconds": seconds, "rounds": rounds},
        "steps": steps,
        "medians": medians,
    }


def main() -> None:
    """Serve one app (`--serve KIND --port N`, the runner's child) or run the measurement."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=800, help="requests per second")
    parser.add_argument("--seconds", type=int, default=15, help="per step")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.serve:
        serve(_app(arguments.serve), "127.0.0.1", arguments.port, 5, ServerLimits())
        return
    document = run(arguments.rate, arguments.seconds, arguments.rounds)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"floor-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document["medians"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""The console's cost: its overview of 100 queues and a jobs page of 100 rows, rendered by the
producer (through the queue service, as in production) with 1,000,000 finished jobs in the
table. Target (issue 19): p95 < 100 ms for each.

Cases, each `--requests` sequential GETs after 10 warm-up requests, by a signed-in session:

- `overview_all_tenants`: `/console/` for an admin of `*` (counts from the depth cache);
- `overview_one_tenant`: `/console/` for a tenant's admin (its counts counted in PostgreSQL);
- `jobs_page`: `/console/jobs` (the newest 100 jobs);
- `jobs_page_filtered`: `/console/jobs?status=COMPLETED&queue=q-7` (100 rows of one queue);
- `dead_letters`: `/console/dead-letters` (200 dead letters grouped).

    python -m benchmark.console [--completed 1000000] [--queues 100] [--requests 200]

Writes `benchmark/results/console-<timestamp>.json`. Run under the heavy lock on a shared
machine (`flock /tmp/jobq-heavy.lock …`); latencies move with the neighbours' load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from benchmark import database
from benchmark.stats import latency_summary
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import LocalStack

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN = "bench-console-admin-0123456789"
TENANT = "bench-console-tenant-0123456789"

_FILL = """
INSERT INTO job (id, tenant, queue, task_type, payload, status, attempts, max_attempts,
                 visible_at, claimed_at, ready_at, request_hash, result, created_at,
                 updated_at, finished_at, last_error)
SELECT gen_random_uuid(), CASE WHEN g % 10 = 0 THEN 'acme' ELSE 'default' END,
       'q-' || (g % $2), 'noop', '{"n": 1}', $3::text, 1, 1, t, t, t, $4, '{}', t, t, t,
       CASE WHEN $3::text = 'DEAD_LETTER' THEN 'timeout after ' || g || ' ms' END
FROM (SELECT g, now() - interval '1 day' + g * interval '10 ms' AS t
      FROM generate_series(1, $1) AS g) AS times
"""

_WAITING = """
INSERT INTO job (id, tenant, queue, task_type, payload, status, max_attempts, visible_at,
                 ready_at, request_hash)
SELECT gen_random_uuid(), 'acme', 'q-' || (g % $2), 'noop', '{}', 'PENDING', 5, now(), now(), $3
FROM generate_series(1, $1) AS g
"""


async def _fill(url: str, completed: int, queues: int) -> None:
    digest = database.job_rows(1)[0].request_hash
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(_FILL, completed, queues, "COMPLETED", digest)
        await connection.execute(_FILL, 200, queues, "DEAD_LETTER", digest)
        await connection.execute(_WAITING, queues * 10, queues, digest)
        await connection.execute("VACUUM ANALYZE job")
    finally:
        await connection.close()


async def _signed_in(base: str, key: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=30)
    form = await client.get("/console/login")
    token = re.search(r'name="login_token" value="([^"]+)"', form.text)
    assert token is not None, form.text
    reply = await client.post("/console/login", data={"api_key": key, "login_token": token[1]})
    assert reply.status_code == 303, reply.text
    return client


async def _time(client: httpx.AsyncClient, path: str, requests: int) -> dict[str, Any]:
    for _ in range(10):
        assert (await client.get(path)).status_code == 200
    samples = []
    for _ in range(requests):
        began = time.perf_counter()
        reply = await client.get(path)
        samples.append((time.perf_counter() - began) * 1000)
        assert reply.status_code == 200, reply.text[:300]
    rows = len(re.findall(r"<tr data-queue=|<td><a href=\"/console/jobs/", reply.text))
    return {"path": path, "rows": rows, "bytes": len(reply.content), **latency_summary(samples)}


async def run(completed: int, queues: int, requests: int) -> dict[str, Any]:
    """Fill a fresh database, start the queue service and producer, time every case."""
    base = ensure_postgres()
    # Its own migrated database, not a copy of the suite's template (which a concurrent run
    # of the suite may be using).
    url = await database.migrated_database(base, "jobq_bench_console")
    await _fill(url, completed, queues)
    logs = Path(tempfile.mkdtemp(prefix="jobq-bench-console-"))
    stack = LocalStack(
        url,
        ensure_redis().rstrip("/") + "/14",
        logs,
        workers=0,
        smtp_enabled=False,
        environment={"JOBQ_API_KEYS": f"admin:*:{ADMIN},admin:acme:{TENANT}"},
    )
    await stack.start()
    cases: dict[str, Any] = {}
    try:
        admin = await _signed_in(stack.producer, ADMIN)
        tenant = await _signed_in(stack.producer, TENANT)
        cases["overview_all_tenants"] = await _time(admin, "/console/", requests)
        cases["overview_one_tenant"] = await _time(tenant, "/console/", requests)
        cases["jobs_page"] = await _time(admin, "/console/jobs", requests)
        filtered = "/console/jobs?status=COMPLETED&queue=q-7"
        cases["jobs_page_filtered"] = await _time(admin, filtered, requests)
        cases["dead_letters"] = await _time(admin, "/console/dead-letters", requests)
        await admin.aclose()
        await tenant.aclose()
    finally:
        stack.stop()
        await database.drop_database(base, "jobq_bench_console")
    return {
        "benchmark": "console",
        "at": datetime.now(UTC).isoformat(),
        "completed_rows": completed,
        "queues": queues,
        "requests": requests,
        "load_average": os.getloadavg(),
        "target_p95_ms": 100,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print and write the result."""
    parser = argparse.ArgumentParser(prog="python -m benchmark.console", description=__doc__)
    parser.add_argument("--completed", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    document = asyncio.run(run(args.completed, args.queues, args.requests))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"console-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    for name, case in document["cases"].items():
        print(f"{name:24} rows {case['rows']:4}  p50 {case['p50_ms']:7.1f} ms  "
              f"p95 {case['p95_ms']:7.1f} ms")  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()

"""The KEDA PostgreSQL trigger of `overlays/production-postgresql` reads a bounded count: on a
table of 50,000 jobs with a backlog of 10,000, EXPLAIN ANALYZE shows index scans of the
partial PENDING/PROCESSING indexes that stop at the query's LIMIT, never a scan of the table."""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg

from infra.kubernetes import keda_triggers, render
from services.worker.settings import DEFAULT_CONCURRENCY

PENDING, PROCESSING_HERE, PROCESSING_ELSEWHERE, FINISHED = 10_000, 400, 300, 39_300
LIMIT = 20 * DEFAULT_CONCURRENCY
"""maxReplicaCount x the default WORKER_CONCURRENCY: more cannot change what the HPA asks for."""
BOUNDED_INDEXES = {
    "ix_job_claim",
    "ix_job_claim_next",
    "ix_job_claim_previous",
    "ix_job_claim_tenant",
    "ix_job_claim_type",
    "ix_job_reaper",
    "ix_job_unleased_status_id",
}
"""Indexes whose entries are PENDING or PROCESSING rows only, or lead with the status."""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def _fill(connection: asyncpg.Connection) -> None:
    """`PENDING` ready jobs and `PROCESSING_HERE` leased ones in `default`, others leased in
    queue `other`, and `FINISHED` completed history; statistics fresh."""
    await connection.execute(
        "INSERT INTO job (id, queue, task_type, payload, status, max_attempts, visible_at,"
        " finished_at, lease_id)"
        " SELECT gen_random_uuid(), q, 'noop', '{}', s, 5, now(), now(), gen_random_uuid()"
        " FROM (VALUES ('default', 'PENDING', $1::int), ('default', 'PROCESSING', $2),"
        "              ('other', 'PROCESSING', $3), ('default', 'COMPLETED', $4)) AS v(q, s, n),"
        " LATERAL generate_series(1, n)",
        PENDING,
        PROCESSING_HERE,
        PROCESSING_ELSEWHERE,
        FINISHED,
    )
    await connection.execute("ANALYZE job")


async def test_the_postgresql_trigger_counts_within_its_limit(clean_database: str) -> None:
    trigger = keda_triggers(render("production-postgresql"))[("jobq-worker", "demand")]
    assert trigger.type == "postgresql"
    limits = [int(n) for n in re.findall(r"LIMIT (\d+)", trigger.query)]
    assert limits == [LIMIT, LIMIT], "20 replicas x the default slots"
    connection = await asyncpg.connect(clean_database)
    try:
        await _fill(connection)
        value = await connection.fetchval(trigger.query)
        explained = await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {trigger.query}")
    finally:
        await connection.close()
    # The backlog is counted up to the limit; what runs is counted whole.
    assert value == LIMIT + PROCESSING_HERE
    plan = json.loads(explained)[0]["Plan"]
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == "job"]
    assert scans, "the query reads job"
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan"), scan
    indexes = {n["Index Name"] for n in _nodes(plan) if "Index Name" in n}
    assert indexes and indexes <= BOUNDED_INDEXES, indexes
    examined = sum(
        (n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)) * n.get("Actual Loops", 1)
        for n in scans
    )
    # Never the table (50,000 rows) nor the whole backlog (10,000): at most the two limits plus
    # other queues' leased jobs passed over on the way.
    assert examined <= 2 * LIMIT + PROCESSING_ELSEWHERE, (examined, json.dumps(plan)[:3000])

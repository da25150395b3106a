"""`make bench-quick` as a smoke test: the benchmark suite runs end to end at its smallest size
and writes a well-formed result in which every job completed. No timing is asserted: speed is
what the suite reports, not what a test checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.stack import ROOT
from services.worker.settings import DEFAULT_CONCURRENCY

PNG = b"\x89PNG\r\n\x1a\n"


def _verified(entry: dict[str, Any], where: str) -> None:
    verified = entry["verified"]
    assert verified["ok"], f"{where}: {verified}"
    assert verified["completed"] == verified["expected"] > 0, where


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """The quick suite's JSON document and the directory it was written to."""
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run(
        [sys.executable, "-m", "benchmark", "--preset", "quick", "--results", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-5000:]
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.parent == out and path.name.startswith("quick-")
    document: dict[str, Any] = json.loads(path.read_text())
    return document, out


@pytest.mark.timeout(300)
def test_quick_suite_writes_a_well_formed_result(result: tuple[dict[str, Any], Path]) -> None:
    document, out = result
    assert document["name"] == "quick"
    assert document["machine"]["cpus"] >= 1 and document["machine"]["postgres"]
    assert len(document["load_average"]["start"]) == len(document["load_average"]["end"]) == 3
    assert document["settings"]["default_shape"] == f"2x{DEFAULT_CONCURRENCY}"
    for row in document["summary"]:
        assert set(row) == {"figure", "value", "unit", "target", "met", "x_pgqueuer_b100",
                            "x_bare"}  # fmt: skip
    assert len(document["plots"]) == 3
    for name in document["plots"]:
        assert (out / name).read_bytes().startswith(PNG)
    ingest = document["results"]["ingest"]
    assert set(ingest) == {"producer", "queue"}
    for entry in ingest.values():
        closed = entry["rounds"][0]["closed"]
        for step in [*entry["rounds"][0]["steps"], closed]:
            assert step["requests"] > 0 and step["failed"] >= 0 and step["dropped"] >= 0
            assert step["p50_ms"] <= step["p95_ms"] <= step["p99_ms"] <= step["max_ms"]
        # The closed loop: 32 connections, as many requests as they could send.
        assert closed["vus"] == 32 and closed["achieved_per_s"] > 0
        assert entry["closed_per_s"] > 0
    series = document["results"]["claims"]["rr_hold"]["series"]
    assert series and all(len(row) == 4 for row in series)


@pytest.mark.timeout(300)
def test_quick_suite_completes_every_job(result: tuple[dict[str, Any], Path]) -> None:
    results = result[0]["results"]
    for run in results["burn_rounds"]["jobq"]["rounds"]:
        _verified(run, "burn-down")
        assert run["cpu_us_per_job"]["total"] > 0
    for run in results["raw"]:
        _verified(run, "raw client")
    _verified(results["pgbench"], "pgbench")
    _verified(results["pickup"], "pickup")
    _verified(results["resources"]["load"], "resources under load")
    latency = results["latency_under_load"]
    assert [step["fraction"] for step in latency["steps"]] == [0.5]
    for step in latency["steps"]:
        _verified(step, f"latency under load @ {step['rate']}/s")
        assert len(step["rounds"]) == 2, step  # the quick preset's latency_rounds
        for each in step["rounds"]:
            _verified(each, f"latency under load @ {step['rate']}/s, one round")
        assert step["verified"]["completed"] == sum(
            each["verified"]["completed"] for each in step["rounds"]
        )
        done = step["submit_to_completed"]
        assert done["count"] == step["verified"]["completed"], done
        assert 0 < done["p50_ms"] <= done["p95_ms"] <= done["p99_ms"] <= done["max_ms"], done
    kill = results["kill"]
    _verified(kill, "kill -9")
    assert kill["by_status"] == {"COMPLETED": kill["jobs"]}
    assert set(kill["by_attempts"]) <= {"1", "2"}

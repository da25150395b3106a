"""Pure logic of the benchmark suite: percentiles, the completion check, the ingest pass rule,
the pgbench script built from the repository's statements, the README table's markers."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import pytest

from benchmark import compare, floor, report, resources, statements
from benchmark.dashboard_snapshot import OUTPUT, describe_workers
from benchmark.database import verify
from benchmark.ingest import passes
from benchmark.load import accepted_requests, unfinished
from benchmark.pgbench import script
from benchmark.processes import cpu_per_request
from benchmark.stats import latency_summary, percentile


def test_percentile_interpolates_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.9) == pytest.approx(4.6)
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)
    assert latency_summary([])["count"] == 0


def test_verify_counts_lost_unfinished_and_repeated_jobs() -> None:
    done = {"total": 10, "by_status": {"COMPLETED": 10}, "by_attempts": {"1": 8, "2": 2}}
    assert not verify(done, 10)["ok"]  # two ran twice
    assert verify(done, 10, max_attempts=2)["ok"]
    lost = {"total": 9, "by_status": {"COMPLETED": 8, "PROCESSING": 1}, "by_attempts": {"1": 8}}
    checked = verify(lost, 10)
    assert not checked["ok"] and checked["lost"] == 1 and checked["not_completed"] == 1


def test_a_step_passes_only_fast_and_clean() -> None:
    step = {"failed": 0, "dropped": 0, "p95_ms": 49.9}
    assert passes(step)
    assert not passes({**step, "p95_ms": 50.0})
    assert not passes({**step, "failed": 1})
    assert not passes({**step, "dropped": 1})


def test_pgbench_script_runs_the_repository_claim_then_ack() -> None:
    text = script(25)
    claim, ack = text.strip().split("\n")
    assert claim.startswith("WITH") and claim.endswith("FROM claimed \\gset")
    assert "LIMIT 25" in claim and "UPDATE job SET status = 'PROCESSING'" in claim
    assert "$" not in text  # every parameter became a literal or a pgbench variable
    assert "--" not in text  # a comment would swallow the rest of its one-line command
    assert ":ids::uuid[]" in ack and ":leases::uuid[]" in ack and "'COMPLETED'" in ack


def test_readme_table_is_replaced_between_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\nold\n{report.END}\noutro\n")
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "table", lambda document, path: "new table")
    report.update_readme({}, tmp_path / "full-x.json")
    assert readme.read_text() == f"intro\n{report.BEGIN}\nnew table\n{report.END}\noutro\n"
    readme.write_text("no markers\n")
    with pytest.raises(RuntimeError):
        report.update_readme({}, tmp_path / "full-x.json")


def test_snapshot_title_says_the_workers_that_ran() -> None:
    assert describe_workers([32, 32]) == "2 workers of 32 slots"
    assert describe_workers([4, 32, 32]) == "3 workers of 4+32+32 slots"
    assert describe_workers([8]) == "1 worker of 8 slots"


def test_snapshot_leaves_the_committed_picture_alone_by_default() -> None:
    root = Path(__file__).resolve().parents[2]
    assert OUTPUT.relative_to(root).parts[0] == ".jobq"  # git-ignored


def test_compare_reports_medians_and_after_to_before_ratios() -> None:
    from benchmark.compare import _summary, _table

    def side(jobs_per_s: float, cpu: float, p95: float) -> dict[str, Any]:
        step = {"p50_ms": p95 / 2, "p95_ms": p95, "failed": 0, "dropped": 1,
                "cpu_us_per_request": {"server_total": cpu * 2}}  # fmt: skip
        burn = {"jobs_per_s": jobs_per_s, "cpu_us_per_job": {"total": cpu},
                "wal_bytes_per_job": cpu * 10}  # fmt: skip
        return {"burn": burn, "ingest": [step]}

    rounds = [
        {"before": side(1000, 200, 20), "after": side(1100, 150, 10)},
        {"before": side(3000, 100, 40), "after": side(900, 250, 30)},
        {"before": side(2000, 300, 30), "after": side(1200, 100, 20)},
    ]
    summary = _summary(rounds, [800])
    assert summary["before"]["burn_jobs_per_s"] == 2000
    assert summary["after"]["burn_jobs_per_s"] == 1100
    assert summary["ratio_after_to_before"]["burn_jobs_per_s"] == 0.55
    assert summary["ratio_after_to_before"]["ingest_800_p95_ms"] == round(20 / 30, 3)
    assert summary["before"]["ingest_800"]["dropped"] == 3
    # Within each round: 1.1, 0.3, 0.6; their median, not the ratio of the medians.
    assert summary["ratio_after_to_before"]["burn_jobs_per_s_per_round"] == [1.1, 0.3, 0.6]
    assert summary["ratio_after_to_before"]["burn_jobs_per_s_paired_median"] == 0.6
    table = _table(summary, [800])
    assert "| submits 800/s: p95 ms (failed+dropped) | 30 (3) | 20 (3) |" in table
    assert "| 1.1 / 0.3 / 0.6 (median 0.6) |" in table
    # WAL per job: medians 2,000 and 1,500 bytes.
    assert "| WAL per job, bytes | 2,000 | 1,500 | 0.75 |" in table


def test_cpu_per_accepted_request_leaves_the_load_generator_out_of_the_server_total() -> None:
    summary = {"metrics": {"http_reqs": {"count": 1_010}, "http_req_failed": {"passes": 10}}}
    accepted = accepted_requests(summary)
    usage = {
        "producer": {"cpu_seconds": 0.5},
        "postgres": {"cpu_seconds": 0.25},
        "client": {"cpu_seconds": 0.4},
    }
    per = cpu_per_request(usage, accepted)
    assert accepted == 1_000
    assert per == {"producer": 500.0, "postgres": 250.0, "client": 400.0, "server_total": 750.0}
    assert cpu_per_request(usage, accepted_requests({})) == {}


def test_a_k6_run_counts_as_done_only_when_every_accepted_job_completed() -> None:
    def completion(drained: bool = True, **by_status: int) -> dict[str, object]:
        return {
            "drained": drained,
            "jobs_by_status": by_status,
            "completed": by_status.get("COMPLETED", 0),
        }

    assert unfinished("submit", 100, completion(COMPLETED=100)) == []
    # A submit answered 504 may still have created its job: more COMPLETED than accepted is done.
    assert unfinished("submit", 99, completion(COMPLETED=100)) == []
    assert unfinished("submit", 100, completion(COMPLETED=98)) == [
        "100 submits accepted, 98 COMPLETED"
    ]
    assert unfinished("submit", 100, completion(False, COMPLETED=99, PENDING=1)) == [
        "the queue did not drain within the drain timeout",
        "jobs not COMPLETED: {'PENDING': 1}",
        "100 submits accepted, 99 COMPLETED",
    ]
    # mixed.js reads statuses and submits batches: its requests are not its jobs.
    assert unfinished("mixed", 100, completion(COMPLETED=160)) == []
    assert unfinished("mixed", 100, completion(COMPLETED=159, DEAD_LETTER=1)) == [
        "jobs not COMPLETED: {'DEAD_LETTER': 1}"
    ]


def test_latency_under_load_gets_a_table_and_the_half_knee_p99_a_target() -> None:
    latest = sorted((report.README.parent / "results").glob("full-*.json"))[-1]
    document = json.loads(latest.read_text())
    done = {"count": 600, "p50_ms": 8.0, "p95_ms": 20.0, "p99_ms": 30.0, "max_ms": 50.0}
    step = {"fraction": 0.5, "rate": 600, "submit_p50_ms": 5.0, "submit_p95_ms": 12.0,
            "dropped": 0, "failed": 0, "verified": {"ok": True},
            "submit_to_completed": done}  # fmt: skip
    document["results"]["latency_under_load"] = {"knee_per_s": 1200, "steps": [step]}
    assert "| 600/s | 50% | 12 | 8 | 20 | 30 | 50 | yes |" in report.table(document, latest)
    [row] = [r for r in report.summary(document) if "50 % of the knee" in r["figure"]]
    assert (row["value"], row["target"], row["met"]) == (30.0, "< 25 ms", False)


def test_latency_steps_over_rounds_take_medians_and_keep_each_round() -> None:
    def step(p99: float, top: float, ok: bool) -> dict[str, object]:
        done = {"count": 600, "p50_ms": 8.0, "p95_ms": 14.0, "p99_ms": p99, "max_ms": top}
        verified = {"ok": ok, "expected": 600, "completed": 600 if ok else 599, "lost": 0,
                    "not_completed": 0 if ok else 1, "over_attempts": 0}  # fmt: skip
        return {"fraction": 0.5, "rate": 600, "submit_p50_ms": 5.0, "submit_p95_ms": p99 / 2,
                "dropped": 1, "failed": 0, "submit_to_completed": done,
                "verified": verified}  # fmt: skip

    rounds = [step(15.0, 30.0, True), step(29.6, 110.0, True), step(16.0, 25.0, True)]
    entry = resources._by_rate(rounds)
    assert entry["submit_to_completed"] == {
        "count": 1_800, "p50_ms": 8.0, "p95_ms": 14.0, "p99_ms": 16.0, "max_ms": 110.0
    }  # fmt: skip
    assert (entry["submit_p95_ms"], entry["dropped"], entry["rounds"]) == (8.0, 3, rounds)
    assert entry["verified"] == {"ok": True, "expected": 1_800, "completed": 1_800, "lost": 0,
                                 "not_completed": 0, "over_attempts": 0}  # fmt: skip
    assert resources._by_rate([*rounds[:2], step(16.0, 25.0, False)])["verified"]["ok"] is False

    latest = sorted((report.README.parent / "results").glob("full-*.json"))[-1]
    document = json.loads(latest.read_text())
    document["results"]["latency_under_load"] = {"knee_per_s": 1200, "steps": [entry]}
    table = report.table(document, latest)
    assert "medians of 3 rounds" in table
    assert "| 600/s | 50% | 8 | 8 | 14 | 16 (15 / 29.60 / 16) | 110 | yes |" in table
    [row] = [r for r in report.summary(document) if "50 % of the knee" in r["figure"]]
    assert row["figure"].endswith("p99, median of 3 rounds")
    assert (row["value"], row["met"]) == (16.0, True)


def test_closed_loop_rows_give_the_producer_a_target_against_the_bare_endpoint() -> None:
    latest = sorted((report.README.parent / "results").glob("full-*.json"))[-1]
    document = json.loads(latest.read_text())
    ingest = document["results"]["ingest"]
    for name, per_s in (("producer", 1_300.0), ("queue", 1_500.0), ("bare", 1_600.0)):
        ingest[name]["closed_per_s"] = per_s
        ingest[name]["rounds"][0]["closed"] = {"vus": 32, "achieved_per_s": per_s}
    rows = {r["figure"]: r for r in report.summary(document) if "Closed loop" in r["figure"]}
    producer = rows["Closed loop, 32 connections, producer (two hops)"]
    assert (producer["value"], producer["x_bare"], producer["met"]) == (1_300.0, 0.81, False)
    queue = rows["Closed loop, 32 connections, queue service (one hop)"]
    assert (queue["x_bare"], queue["target"], queue["met"]) == (0.94, "", None)
    ingest["producer"]["closed_per_s"] = 1_400.0
    [producer] = [r for r in report.summary(document) if r["figure"].endswith("producer (two hops)")
                  and "Closed" in r["figure"]]  # fmt: skip
    assert producer["met"] is True


def test_the_producers_knee_is_held_to_the_same_share_of_the_bare_endpoints() -> None:
    latest = sorted((report.README.parent / "results").glob("full-*.json"))[-1]
    document = json.loads(latest.read_text())
    ingest = document["results"]["ingest"]
    ingest["bare"]["knee_per_s"] = 2_000
    knee = "Ingest knee, single submits, producer (two hops)"
    for per_s, met in ((1_600, False), (1_700, True)):
        ingest["producer"]["knee_per_s"] = per_s
        [row] = [r for r in report.summary(document) if r["figure"] == knee]
        assert row["target"] == ">= 0.85x the bare endpoint, p95 < 50 ms, no errors"
        assert (row["x_bare"], row["met"]) == (per_s / 2_000, met)
    del ingest["bare"]
    [row] = [r for r in report.summary(document) if r["figure"] == knee]
    assert (row["target"], row["met"]) == ("", None)


def test_sqs_benchmark_summary_takes_medians_and_ratios() -> None:
    from benchmark.sqs import summary

    def side(send: float, drain: float, cpu: float) -> dict[str, Any]:
        latency = {"p95_ms": 10.0}
        return {
            "send": {
                "messages_per_s": send,
                "latency": latency,
                "cpu_us_per_message": {"total": cpu},
            },
            "drain": {
                "messages_per_s": drain,
                "receive_latency": latency,
                "delete_latency": {"p95_ms": 20.0},
                "cpu_us_per_message": {"total": cpu},
            },
            "round_trip_messages_per_s": send * drain / (send + drain),
        }

    rounds = [
        {"sqs": side(500, 400, 300), "jobq": side(1000, 800, 100)},
        {"sqs": side(700, 100, 500), "jobq": side(1000, 1000, 200)},
        {"sqs": side(600, 300, 400), "jobq": side(1000, 900, 150)},
    ]
    result = summary(rounds)
    assert result["sqs"]["send_messages_per_s"] == 600
    assert result["jobq"]["drain_messages_per_s"] == 900
    assert result["ratio_sqs_to_jobq"]["send_messages_per_s"] == 0.6
    assert result["ratio_sqs_to_jobq"]["drain_messages_per_s"] == round(300 / 900, 3)
    assert result["ratio_sqs_to_jobq"]["cpu_us_per_message"] == round(800 / 300, 3)


def test_sqs_benchmark_summary_keeps_the_endpoints_highest_rss_and_cpu() -> None:
    """Sizing reads the SQS endpoint process's peak over every round and phase."""
    from benchmark.sqs import summary

    def side(rss: float, cpu: float) -> dict[str, Any]:
        latency = {"p95_ms": 10.0}
        phase = {
            "messages_per_s": 100.0,
            "cpu_us_per_message": {"total": 1.0},
            "rss_peak_mb": {"sqs": rss, "queue": 500.0},
            "cpu_percent": {"sqs": cpu, "queue": 90.0},
        }
        return {
            "send": {**phase, "latency": latency},
            "drain": {**phase, "receive_latency": latency, "delete_latency": latency},
            "round_trip_messages_per_s": 50.0,
        }

    rounds = [{"sqs": side(60, 20), "jobq": side(0, 0)}, {"sqs": side(70, 15), "jobq": side(0, 0)}]
    assert summary(rounds)["sqs_endpoint"] == {"rss_peak_mb": 70, "cpu_percent": 20}


@pytest.mark.parametrize("kind", floor.KINDS)
async def test_the_floor_apps_do_the_same_work(kind: str) -> None:
    # Each kind decodes the body strictly and answers the same 202, so their CPU per request
    # differs only by the HTTP stack in front of the decode.
    transport = httpx.ASGITransport(app=floor._app(kind))
    async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
        good = await client.post("/jobs", json={"taskType": "noop", "payload": {"n": 1}})
        assert good.status_code == 202
        assert good.json() == {"jobId": floor._JOB_ID, "status": "PENDING"}
        bad = await client.post("/jobs", json={"taskType": "noop", "payload": {}, "x": 1})
        assert bad.status_code == 400


def test_the_statement_comparison_reads_its_ratios_within_each_burn() -> None:
    def burn(plain_before: float, plain_after: float, fair_before: float, fair_after: float):
        walls = {"plain before": plain_before, "plain after": plain_after,
                 "fair before": fair_before, "fair after": fair_after}  # fmt: skip
        return {name: {"wall_us_per_job": wall, "postgres_cpu_us_per_job": wall / 2}
                for name, wall in walls.items()}  # fmt: skip

    # The machine is twice as slow in the second burn: within each burn the ratios hold.
    summary = statements.summary([burn(100, 90, 110, 99), burn(200, 180, 220, 198)])
    assert summary["plain before"]["x_plain_before"] == 1.0
    assert summary["plain before"]["x_before"] is None
    assert summary["plain after"]["x_before"] == 0.9
    assert (summary["fair after"]["x_before"], summary["fair after"]["x_plain_before"]) == (
        0.9,
        0.99,
    )
    assert summary["fair before"]["wall_us_per_job"] == 165.0
    assert summary["fair after"]["postgres_cpu_us_per_job"] == 74.25


def test_the_statement_comparison_refuses_a_revision_with_other_migrations(
    tmp_path: Path,
) -> None:
    with pytest.raises(SystemExit, match=r"^old has other migrations.*only here: "):
        statements.statements_of(tmp_path, "old")


def test_a_comparison_refuses_a_revision_that_names_no_commit() -> None:
    with pytest.raises(SystemExit, match="'nosuchrev' names no commit"):
        compare.checkout("nosuchrev")


def test_burn_rows_put_wal_per_job_beside_pgqueuers() -> None:
    from benchmark.report import _burn_rows

    def rounds(jobs_per_s: float, wals: list[int | None]) -> dict[str, Any]:
        each = [{"cpu_us_per_job": {"total": 100}, "wal_bytes_per_job": w} for w in wals]
        return {"jobs_per_s": jobs_per_s, "rounds": each}

    results = {
        "burn_rounds": {
            "jobq": rounds(9_000, [1_200, 1_210, 1_190]),
            "pgqueuer_b100": rounds(10_000, [600, None, 605]),
        },
        "matrix": [],
    }
    rows = {r["figure"]: r for r in _burn_rows(results, "2x32")}
    assert rows["WAL per job, defaults, median"]["value"] == 1_200
    assert rows["WAL per job, pgqueuer b100, median"]["value"] == 605
    assert rows["WAL per job, defaults, median"]["x_pgqueuer_b100"] == round(1_200 / 605, 2)
    # A run from before the figure existed has no WAL row.
    del results["burn_rounds"]["pgqueuer_b100"]
    for each in results["burn_rounds"]["jobq"]["rounds"]:
        del each["wal_bytes_per_job"]
    assert not [f for f in (r["figure"] for r in _burn_rows(results, "2x32")) if "WAL" in f]


def test_claim_cycle_splits_a_workers_cycle_by_the_queue_services_own_timings() -> None:
    from benchmark.profile import claim_cycle

    # 2 workers, 1,000 claims in 2.5 s: each worker claimed every 5 ms; the queue service
    # held a claim 1.5 ms on average, its statement 1.2 ms.
    timings = {"requests": 1_000, "request_seconds": 1.5, "statements": 1_000,
               "statement_seconds": 1.2}  # fmt: skip
    assert claim_cycle(timings, 2.5, 2) == {
        "claims": 1_000,
        "cycle_ms": 5.0,
        "in_queue_service_ms": 1.5,
        "statement_ms": 1.2,
        "outside_ms": 3.5,
    }
    assert claim_cycle({**timings, "requests": 0}, 2.5, 2) == {}


def test_profile_report_names_the_flush_the_stack_ran_with() -> None:
    from benchmark.profile import report

    cycle = {"claims": 10, "cycle_ms": 5.0, "in_queue_service_ms": 3.0, "statement_ms": 2.5,
             "outside_ms": 2.0}  # fmt: skip
    document = {"jobs_per_s": 1.0, "cpu_us_per_job": {"total": 1}, "claim_cycle": cycle,
                "settings": {"synchronous_commit": True}, "processes": {},
                "server": {"fsync": "on", "synchronous_commit": "on"}}  # fmt: skip
    text = report(document)
    assert "fsync on, synchronous_commit on" in text and "costs nothing" not in text
    assert "2.00 ms outside the queue service" in text
    document["server"] = {"fsync": "off", "synchronous_commit": "off"}
    assert "this server runs without fsync" in report(document)


def test_sample_total_sums_one_samples_name_over_the_labels_asked_for() -> None:
    from benchmark.scrape import sample_total

    text = "\n".join([
        "# TYPE h histogram",
        'h_bucket{path="/a",le="+Inf"} 3.0',
        'h_count{path="/a"} 3.0',
        'h_sum{path="/a"} 0.5',
        'h_bucket{path="/b",le="+Inf"} 4.0',
        'h_count{path="/b"} 4.0',
        'h_sum{path="/b"} 1.0',
        "# TYPE c_total counter",
        'c_total{outcome="success"} 7.0',
        "",
    ])  # fmt: skip
    assert sample_total(text, "h", "h_count") == 7.0
    assert sample_total(text, "h", "h_sum", path="/a") == 0.5
    assert sample_total(text, "c", "c_total", outcome="success") == 7.0
    assert sample_total(text, "c", "c_total", outcome="failure") == 0.0


def _burn(rates: list[float], cpus: list[float]) -> dict[str, Any]:
    """A burn-down's entry in a result: its rounds' rates and total CPU µs per job."""
    each = [
        {"jobs_per_s": rate, "cpu_us_per_job": {"total": cpu, "queue": cpu / 2}}
        for rate, cpu in zip(rates, cpus, strict=True)
    ]
    return {"jobs_per_s": median(rates), "rounds": each}


def test_burn_down_and_cpu_rows_are_held_to_issue_17s_targets() -> None:
    from benchmark.report import _burn_rows

    results: dict[str, Any] = {
        "burn_rounds": {
            "jobq": _burn([900.0, 1_300.0, 1_000.0], [130.0, 121.0, 100.0]),
            "pgqueuer_b100": _burn([1_000.0, 1_000.0, 1_250.0], [60.0, 70.0, 65.0]),
            "procrastinate_c10": _burn([50.0, 40.0, 60.0], [2_000.0, 2_000.0, 2_000.0]),
        },
        "matrix": [],
    }
    rows = {r["figure"]: r for r in _burn_rows(results, "2x32")}
    burn = rows["Burn-down, project worker, default settings (2x32), median"]
    assert (burn["value"], burn["x_pgqueuer_b100"]) == (1_000.0, 1.0)
    assert (burn["target"], burn["met"]) == (">= 1.0x pgqueuer b100", True)
    # Each round's own pair, in the order they ran (not sorted), and their median.
    by_round = rows["Burn-down, jobq / pgqueuer b100, round by round"]["value"]
    assert by_round == "0.90 / 1.30 / 0.80 (median 0.90)"
    procrastinate = rows["Burn-down, jobq defaults / procrastinate"]
    assert (procrastinate["value"], procrastinate["met"]) == (20.0, True)
    # CPU per job: the median over rounds, not the last round's (100) nor the first's (130).
    cpu = rows["CPU per job, defaults (all classes, median of rounds)"]
    assert (cpu["value"], cpu["target"], cpu["met"]) == (121.0, "<= 120 µs", False)
    theirs = rows["CPU per job, pgqueuer b100 (its process and PostgreSQL, median of rounds)"]
    assert theirs["value"] == 65.0
    # Met from the rates themselves: 1,000 against 1,001 rounds to 1.0 but misses.
    results["burn_rounds"]["pgqueuer_b100"]["jobs_per_s"] = 1_001.0
    rows = {r["figure"]: r for r in _burn_rows(results, "2x32")}
    burn = rows["Burn-down, project worker, default settings (2x32), median"]
    assert (burn["x_pgqueuer_b100"], burn["met"]) == (1.0, False)
    # Rounds that cannot be paired give no round-by-round row.
    results["burn_rounds"]["pgqueuer_b100"]["rounds"].pop()
    assert not [f for f in (r["figure"] for r in _burn_rows(results, "2x32")) if "by round" in f]
    # No pgqueuer in the run: no ratio, so no verdict.
    del results["burn_rounds"]["pgqueuer_b100"]
    rows = {r["figure"]: r for r in _burn_rows(results, "2x32")}
    assert rows["Burn-down, project worker, default settings (2x32), median"]["met"] is None


def test_the_plot_and_the_table_read_the_same_round_of_cpu() -> None:
    from benchmark.report import median_cpu_round

    rounds = _burn([1.0, 1.0, 1.0, 1.0], [142.0, 90.0, 101.0, 125.0])["rounds"]
    assert median_cpu_round(rounds) == {"total": 125.0, "queue": 62.5}
    assert median_cpu_round([{"cpu_us_per_job": {}}]) == {}


def test_cpu_per_submit_at_800_is_the_median_over_rounds_and_the_producers_has_a_target() -> None:
    from benchmark.report import _cpu_per_submit_rows

    def step(rate: int, producer: float) -> dict[str, Any]:
        cpu = {"producer": producer, "queue": producer - 100, "postgres": 200.0}
        return {"rate": rate, "cpu_us_per_request": cpu}

    producer = {
        "rounds": [
            {"steps": [step(500, 900.0), step(800, 450.0)]},
            {"steps": [step(800, 390.0), step(1_200, 100.0)]},
            {"steps": [step(800, 380.0)]},
        ]
    }
    rows = {r["figure"]: r for r in _cpu_per_submit_rows(producer)}
    mine = rows["CPU per submit at 800/s through the producer, producer"]
    # The median of 450, 390 and 380 (not the first round's, nor another rate's).
    assert (mine["value"], mine["target"], mine["met"]) == (390.0, "<= 400 µs", True)
    queue = rows["CPU per submit at 800/s through the producer, queue service"]
    assert (queue["value"], queue["target"], queue["met"]) == (290.0, "", None)
    producer["rounds"][1]["steps"][0] = step(800, 460.0)
    [mine] = [r for r in _cpu_per_submit_rows(producer) if r["figure"].endswith("producer")]
    assert (mine["value"], mine["met"]) == (450.0, False)
    assert mine["x_bare"] is None
    assert _cpu_per_submit_rows({}) == []


def test_cpu_per_submit_at_800_stands_beside_the_bare_endpoints() -> None:
    from benchmark.report import _cpu_per_submit_rows

    def steps(rate: int, name: str, cpu: float) -> dict[str, Any]:
        return {"steps": [{"rate": rate, "cpu_us_per_request": {name: cpu}}]}

    producer = {"rounds": [steps(800, "producer", 450.0), steps(800, "producer", 480.0)]}
    bare = {"rounds": [steps(800, "bare", 300.0), steps(500, "bare", 100.0)]}
    rows = {r["figure"]: r for r in _cpu_per_submit_rows(producer, bare)}
    mine = rows["CPU per submit at 800/s through the producer, producer"]
    # median_high(450, 480) over the bare endpoint's 800/s step alone (not its 500/s one).
    assert (mine["value"], mine["x_bare"]) == (480.0, 1.6)
    reference = rows["CPU per request at 800/s, bare Litestar + asyncpg endpoint"]
    assert (reference["value"], reference["x_bare"], reference["met"]) == (300.0, 1.0, None)
    # Without the producer's figures there is nothing to stand beside.
    assert _cpu_per_submit_rows({}, bare) == []


def test_claim_split_fits_cpu_per_claim_and_per_job_from_the_matrix() -> None:
    # CPU per job = per claim / slots + per job, exactly: the fit gives both back.
    def shape(slots: int, replicas: int = 1) -> dict[str, Any]:
        cpu = {"queue": 400 / slots + 10, "workers": 256 / slots + 8, "postgres": 320 / slots + 20}
        cpu["total"] = sum(cpu.values())
        return {"shape": f"{replicas}x{slots}", "replicas": replicas, "slots": slots,
                "jobs_per_s": 1_000.0, "cpu_us_per_job": cpu}  # fmt: skip

    matrix = [shape(4), shape(16), shape(64), shape(16, 2)]
    split = report.claim_split(matrix)
    assert {k: (round(a, 6), round(b, 6)) for k, (a, b) in split.items()} == {
        "queue": (400, 10),
        "workers": (256, 8),
        "postgres": (320, 20),
        "total": (976, 38),
    }
    latest = sorted((report.README.parent / "results").glob("full-*.json"))[-1]
    document = json.loads(latest.read_text())
    document["results"]["matrix"] = matrix
    document["settings"]["default_shape"] = "2x64"
    # The last column is a claim's part of each job at the run's default slots (976 / 64).
    assert "| total | 976 | 38 | 15.20 |" in report.table(document, latest)
    # One slot count (or none) fits no line: no table rather than a made-up split.
    assert report.claim_split([shape(32), shape(32, 2)]) == {}
    document["results"]["matrix"] = [shape(32)]
    assert "per claim" not in report.table(document, latest)

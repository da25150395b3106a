"""The jobq Grafana dashboard as code (Grafana's `grafana-foundation-sdk`).

`build()` describes every panel; `python -m infra.grafana.dashboard` (`make dashboards`) writes
the JSON Grafana provisions, `infra/grafana/dashboards/jobq.json`, and a test fails when the
committed file drifts from this code. Queries use only metrics the services export
(`services/*/metrics.py`, `common/web/http_metrics.py`, `common/web/pools.py`) or
postgres_exporter does (with `infra/postgres-exporter/queries.yml`), plus Prometheus's own
`up`; the scrape test checks each one against a real Prometheus scraping a real stack.

Template variables: `queue` and `task_type` (multi-select, All = `.*`) filter the jobq panels,
`database` (postgres_exporter's `datname` label) the PostgreSQL row; each variable's own query
is evaluated against the real Prometheus by the scrape test. Rates use Grafana's
`$__rate_interval`. Every stat panel colours its value by thresholds (green is healthy, red is
what an alert in `infra/prometheus/rules/jobq.yml` fires on; a unit test holds them equal).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    FieldColorModeId,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

GRAFANA_DIR = Path(__file__).resolve().parent
DASHBOARD_JSON = GRAFANA_DIR / "dashboards" / "jobq.json"
DASHBOARD_UID = "jobq-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="prometheus")
"""The datasource `infra/grafana/provisioning/datasources/prometheus.yml` provisions."""

JOBS = 'queue=~"$queue", task_type=~"$task_type"'
QUEUE = 'queue=~"$queue"'
DB = 'datname=~"$database"'
PRODUCER = 'app_name="producer"'
RATE = "[$__rate_interval]"


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and how its series are named in the legend."""

    expr: str
    legend: str


def _quantiles(bucket: str, selector: str, by: str = "") -> list[Query]:
    """p50, p95 and p99 of a histogram, each `by` the extra labels given (comma-separated)."""
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [
        Query(
            f"histogram_quantile({q}, sum by ({group}) (rate({bucket}{{{selector}}}{RATE})))",
            f"p{round(q * 100)}{suffix}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


def _targets(queries: list[Query]) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend)
        .ref_id(chr(ord("A") + index))
        .datasource(DATASOURCE)
        for index, query in enumerate(queries)
    ]


def graph(
    title: str, unit: str, queries: list[Query], description: str, width: int = 8
) -> timeseries.Panel:
    """A time-series panel of `queries` in `unit` (a Grafana unit id such as `s` or `ops`)."""
    return (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .min(0)
        .datasource(DATASOURCE)
        .targets(_targets(queries))  # type: ignore[arg-type]
        .span(width)
        .height(8)
        .fill_opacity(10)
    )


def single(
    title: str, unit: str, query: Query, description: str, steps: Mapping[float | None, str]
) -> stat.Panel:
    """A single-value panel (latest value of `query`), its value coloured by `steps`:
    `{None: base colour, from value: colour, …}` in ascending order (Grafana's absolute
    thresholds: a value takes the colour of the highest step it reaches)."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(_targets([query]))  # type: ignore[arg-type]
        .span(4)
        .height(4)
        # The stat's own options stay Grafana's defaults (value coloured, last non-null value);
        # setting one here would write all of them, with an empty list of reducers.
        .color_scheme(dashboard.FieldColor().mode(FieldColorModeId.THRESHOLDS))
        .thresholds(
            dashboard.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=value, color=colour) for value, colour in steps.items()])
        )
    )


def threshold_colour(panel: Mapping[str, Any], value: float) -> str:
    """The colour name Grafana gives `value` in `panel` (dashboard JSON) by its absolute
    thresholds: the last step whose value `value` reaches (the first step, value null, is the
    base). KeyError when the panel has no thresholds."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    colour: str = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return colour


def _variable(name: str, label: str, source: str, label_name: str) -> dashboard.QueryVariable:
    """A multi-select variable over the values of label `label_name` in the series of metric
    `source` (All = `.*`)."""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .query(f"label_values({source}, {label_name})")
        .datasource(DATASOURCE)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text="All", value="$__all"))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def _overview(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Overview"))
    board.with_panel(
        single(
            "Dead letters",
            "short",
            Query(f'sum(max by (queue) (jobq_jobs{{status="DEAD_LETTER", {QUEUE}}}))', "dead"),
            "Jobs in the dead-letter queue (out of attempts or failed non-retryably).",
            # Any dead letter is a job that will not run again until someone redrives it.
            {None: "green", 1: "red"},
        )
    )
    board.with_panel(
        single(
            "Live workers",
            "short",
            Query('sum(up{job="worker"})', "workers"),
            "Worker replicas answering scrapes.",
            # No worker: nothing runs (JobqNoLiveWorker fires when jobs are pending too).
            {None: "red", 1: "green"},
        )
    )
    board.with_panel(
        single(
            "Oldest pending",
            "s",
            Query(f"max(jobq_oldest_pending_age_seconds{{{QUEUE}}})", "age"),
            "Age of the oldest PENDING job across the selected queues.",
            {None: "green", 60: "orange", 300: "red"},  # red: JobqOldestPendingTooOld
        )
    )
    board.with_panel(
        single(
            "Paused queues",
            "short",
            # `or vector(0)`: no queue paused reads 0, not "No data".
            Query(
                f"count(max by (queue) (jobq_queue_paused{{{QUEUE}}}) == 1) or vector(0)", "paused"
            ),
            "Queues an operator paused (POST /queues/{queue}/pause): they take submits and hand "
            "out nothing. GET /queues says since when and who.",
            {None: "green", 1: "orange"},
        )
    )
    board.with_panel(
        single(
            "Depth data age",
            "s",
            Query("time() - max(jobq_depth_refresh_timestamp_seconds)", "age"),
            "Seconds since a queue-service replica last read depth from PostgreSQL.",
            {None: "green", 10: "orange", 30: "red"},  # red: JobqDepthGaugesStale
        )
    )
    board.with_panel(
        single(
            "Depth cache age",
            "s",
            Query("time() - max(jobq_depth_cache_write_timestamp_seconds)", "age"),
            "Seconds since the Redis depth cache was last written (exported with REDIS_URL).",
            {None: "green", 10: "orange", 30: "red"},  # red: JobqDepthCacheStale
        )
    )
    board.with_panel(
        single(
            "Producer 5xx ratio",
            "percentunit",
            # `or vector(0)`: no 5xx yet reads 0 %, not "No data".
            Query(
                f'(sum(rate(jobq_http_requests_total{{{PRODUCER}, status_code=~"5.."}}{RATE}))'
                f" or vector(0)) / sum(rate(jobq_http_requests_total{{{PRODUCER}}}{RATE}))",
                "5xx",
            ),
            "Share of producer responses that are server errors.",
            {None: "green", 0.001: "orange", 0.01: "red"},  # red: JobqProducer5xx
        )
    )


def _throughput(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Throughput and depth"))
    board.with_panel(
        graph(
            "Submitted and completed",
            "ops",
            [
                Query(f"sum(rate(jobq_enqueued_total{{{JOBS}}}{RATE}))", "submitted"),
                Query(
                    f'sum(rate(jobq_processed_total{{{JOBS}, outcome="success"}}{RATE}))',
                    "completed",
                ),
            ],
            "Jobs created and jobs completed per second.",
        )
    )
    board.with_panel(
        graph(
            "Queue depth",
            "short",
            [
                Query(
                    f"max by (queue, status) (jobq_jobs{{{QUEUE},"
                    ' status=~"PENDING|SCHEDULED|PROCESSING|DEAD_LETTER"})',
                    "{{queue}} {{status}}",
                )
            ],
            "Jobs per queue and status, read from PostgreSQL every QUEUE_DEPTH_INTERVAL.",
        )
    )
    board.with_panel(
        graph(
            "Oldest pending job",
            "s",
            [Query(f"max by (queue) (jobq_oldest_pending_age_seconds{{{QUEUE}}})", "{{queue}}")],
            "How long the oldest PENDING job of each queue has waited.",
        )
    )
    board.with_panel(
        graph(
            "Failures, retries, dead letters",
            "ops",
            [
                Query(
                    f'sum by (outcome) (rate(jobq_processed_total{{{JOBS}, outcome!="success"}}'
                    f"{RATE}))",
                    "{{outcome}}",
                )
            ],
            "Settled attempts that did not succeed, per second, by outcome.",
        )
    )
    board.with_panel(
        graph(
            "Failure ratio",
            "percentunit",
            [
                Query(
                    f'sum(rate(jobq_processed_total{{{JOBS}, outcome=~"retry|dead_letter"}}'
                    f"{RATE})) / sum(rate(jobq_processed_total{{{JOBS}}}{RATE}))",
                    "failed",
                )
            ],
            "Share of settled attempts that failed (retried or dead-lettered).",
        )
    )
    board.with_panel(
        graph(
            "Dead-letter queue",
            "short",
            [Query(f'max by (queue) (jobq_jobs{{{QUEUE}, status="DEAD_LETTER"}})', "{{queue}}")],
            "Jobs waiting in the dead-letter queue, per queue.",
        )
    )


def _latency(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Latency"))
    board.with_panel(
        graph(
            "Job duration",
            "s",
            _quantiles(
                "jobq_worker_job_duration_seconds_bucket", 'task_type=~"$task_type"', "task_type"
            ),
            "Processor run time on the workers, by task type.",
        )
    )
    board.with_panel(
        graph(
            "End to end (submit to COMPLETED)",
            "s",
            _quantiles("jobq_end_to_end_seconds_bucket", JOBS),
            "From creation to COMPLETED, including waiting, retries and backoff.",
        )
    )
    board.with_panel(
        graph(
            "Claim statement",
            "s",
            _quantiles("jobq_claim_duration_seconds_bucket", ""),
            "Time of one claim statement on the queue service (long-poll waits excluded).",
        )
    )
    board.with_panel(
        graph(
            "Producer accept latency",
            "s",
            _quantiles(
                "jobq_http_request_duration_seconds_bucket", f'{PRODUCER}, method="POST"', "path"
            ),
            "Producer response time of POST routes (submit, batch, admin actions).",
            width=12,
        )
    )
    board.with_panel(
        graph(
            "Producer 4xx and 5xx by route",
            "reqps",
            [
                Query(
                    f"sum by (path, status_code) (rate(jobq_http_requests_total{{{PRODUCER},"
                    f' status_code=~"4..|5.."}}{RATE}))',
                    "{{status_code}} {{path}}",
                )
            ],
            "Client and server errors the producer answered, per second.",
            width=12,
        )
    )


def _workers(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("Workers and leases"))
    board.with_panel(
        graph(
            "Worker slots",
            "short",
            [
                Query("sum(jobq_worker_active_jobs)", "active"),
                Query("sum(jobq_worker_slots) - sum(jobq_worker_active_jobs)", "idle"),
            ],
            "Jobs running now and free slots, over every worker replica.",
        )
    )
    board.with_panel(
        graph(
            "Lease expiries and releases",
            "short",
            [
                Query(
                    f"sum by (queue) (increase(jobq_lease_expired_total{{{QUEUE}}}{RATE}))",
                    "expired {{queue}}",
                ),
                Query(
                    f"sum by (reason) (increase(jobq_released_total{{{QUEUE}}}{RATE}))",
                    "released ({{reason}})",
                ),
                Query(f"sum(increase(jobq_worker_lost_leases_total{RATE}))", "lost by a worker"),
            ],
            "Leases the reaper found expired, jobs released before they finished (by reason),"
            " and results a worker discarded because its lease was gone.",
        )
    )
    board.with_panel(
        graph(
            "Claims",
            "ops",
            [
                Query(f"sum(rate(jobq_claim_batch_size_count{RATE}))", "non-empty"),
                Query(f"sum(rate(jobq_empty_claims_total{RATE}))", "empty"),
                Query(
                    f"sum(rate(jobq_claim_batch_size_sum{RATE}))"
                    f" / sum(rate(jobq_claim_batch_size_count{RATE}))",
                    "jobs per claim",
                ),
            ],
            "Claims per second that handed out jobs or came back empty, and the mean batch.",
        )
    )
    board.with_panel(
        graph(
            "Concurrency limits",
            "short",
            [
                Query(
                    f"max by (queue, task_type) (jobq_concurrency_in_use{{{QUEUE}}})",
                    "in use {{queue}}/{{task_type}}",
                ),
                Query(
                    f"max by (queue, task_type) (jobq_concurrency_limit{{{QUEUE}}})",
                    "limit {{queue}}/{{task_type}}",
                ),
                Query(
                    f"max by (queue, task_type) (jobq_concurrency_waiting{{{QUEUE}}})",
                    "waiting {{queue}}/{{task_type}}",
                ),
            ],
            "Jobs running of each limited (queue, task type) beside its limit (PUT"
            " /queues/{queue}/limits), and its jobs waiting (at most 1,000 counted); in use at"
            " the limit for long with jobs waiting fires JobqConcurrencyLimitHoldsJobsBack.",
        )
    )
    board.with_panel(
        graph(
            "Jobs handed out by tenant",
            "ops",
            [
                Query(
                    f"sum by (tenant) (rate(jobq_claimed_total{{{QUEUE}}}{RATE}))",
                    "{{tenant}}",
                )
            ],
            "Jobs per second handed out to workers, by the tenant that owns them: each"
            " tenant's share of the claims (PUT /queues/{queue}/weights sets the proportions).",
        )
    )
    board.with_panel(
        graph(
            "Rate limits and claims held back",
            "short",
            [
                Query(
                    f"max by (queue, task_type) (jobq_rate_limit_tokens{{{QUEUE}}})",
                    "tokens {{queue}}/{{task_type}}",
                ),
                Query(
                    "sum by (queue, task_type, reason)"
                    f" (rate(jobq_claims_held_back_total{{{QUEUE}}}{RATE}))",
                    "held back/s {{queue}}/{{task_type}} by {{reason}}",
                ),
            ],
            "Tokens in each rate-limited (queue, task type)'s bucket (jobs it may hand out at"
            " once), and claims per second that a limit held back, by the bound: concurrency,"
            " rate, tenant or lock.",
        )
    )


def _postgres(board: dashboard.Dashboard) -> None:
    board.with_row(dashboard.Row("PostgreSQL"))
    board.with_panel(
        graph(
            "Connections",
            "short",
            [Query(f"sum by (state) (pg_stat_activity_count{{{DB}}})", "{{state}}")],
            "Backends connected to the database, by state.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Oldest open transaction",
            "s",
            [Query(f"max by (state) (pg_stat_activity_max_tx_duration{{{DB}}})", "{{state}}")],
            "Age of the longest-open transaction; a long one holds back vacuum server-wide.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Rows of the job table",
            "short",
            [
                Query(f'sum(pg_stat_user_tables_n_dead_tup{{{DB}, relname="job"}})', "dead"),
                Query(f'sum(pg_stat_user_tables_n_live_tup{{{DB}, relname="job"}})', "live"),
            ],
            "Dead tuples (left by claims, settles and the moves of finished jobs to the history;"
            " reclaimed by vacuum) and live rows of the hot table.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Autovacuum age of job",
            "short",
            [
                Query(f'max(pg_stat_user_tables_xid_age{{{DB}, relname="job"}})', "xid age"),
                Query("max(pg_settings_autovacuum_freeze_max_age)", "freeze max age"),
            ],
            "Transactions since job was last frozen; autovacuum must freeze it before the"
            " age reaches autovacuum_freeze_max_age.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Database size",
            "bytes",
            [Query(f"sum(pg_database_size_bytes{{{DB}}})", "size")],
            "Disk used by the database.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Hot table and history",
            "bytes",
            [
                Query(f'sum(jobq_tables_bytes{{{DB}, relname="job"}})', "job (live work)"),
                Query(
                    f'sum(jobq_tables_bytes{{{DB}, relname="job_history"}})',
                    "job_history (finished)",
                ),
            ],
            "Bytes of the hot table (live work only: it should stay flat at a steady load) and"
            " of the history of finished jobs (grows until retention drops its oldest"
            " partition), each with its indexes.",
            width=6,
        )
    )
    board.with_panel(
        graph(
            "Vacuums of job",
            "short",
            [
                Query(
                    f'sum(increase(pg_stat_user_tables_autovacuum_count{{{DB}, relname="job"}}'
                    f"{RATE}))",
                    "autovacuum",
                ),
                Query(
                    f'sum(increase(pg_stat_user_tables_vacuum_count{{{DB}, relname="job"}}{RATE}))',
                    "queue service (QUEUE_VACUUM_DEAD_ROWS)",
                ),
            ],
            "How often autovacuum processed the job table, and how often the queue service"
            " vacuumed it itself once it held QUEUE_VACUUM_DEAD_ROWS dead rows.",
            width=12,
        )
    )


def build() -> dashboard.Dashboard:
    """The jobq dashboard builder."""
    board = (
        dashboard.Dashboard("jobq")
        .uid(DASHBOARD_UID)
        .description("Throughput, depth, failures, latency, workers and PostgreSQL of jobq.")
        .tags(["jobq"])
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .with_variable(_variable("queue", "Queue", "jobq_jobs", "queue"))
        .with_variable(_variable("task_type", "Task type", "jobq_enqueued_total", "task_type"))
        # postgres_exporter names the database `datname` (PostgreSQL's pg_database column).
        .with_variable(_variable("database", "Database", "pg_database_size_bytes", "datname"))
    )
    for section in (_overview, _throughput, _latency, _workers, _postgres):
        section(board)
    return board


def render() -> str:
    """The dashboard JSON as Grafana provisions it (stable key order, trailing newline)."""
    model = build().build()
    # Grafana keys panel state (links, edits) by id: give each a stable, distinct one.
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    """Rewrite `infra/grafana/dashboards/jobq.json`."""
    DASHBOARD_JSON.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_JSON.write_text(render())
    print(f"wrote {DASHBOARD_JSON}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real Prometheus scrapes the real stack and a real postgres_exporter; every dashboard query
and every alert rule is evaluated against what they export.

The stack (queue, producer, two workers) runs as processes on loopback; Prometheus uses the
local rendering of the one configuration template and the committed alert rules; the dashboard
is the committed JSON Grafana provisions. `infra.observe.exercise` drives successes, retries,
dead letters, 4xx, a lease expiry and a release before the checks run. Template variables are
not filled in by hand: each one's own query is asked of Prometheus as Grafana asks it, and the
panels are expanded with what it offers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from benchmark.dashboard_snapshot import describe_workers, worker_slots
from infra import tools
from infra.observe import (
    Observer,
    alert_rules,
    dashboard_queries,
    dashboard_variables,
    exercise,
    expand,
    finite_samples,
    metric_names,
)
from infra.stack import LocalStack
from services.worker.settings import DEFAULT_CONCURRENCY
from tests.e2e.conftest import E2E_SETTINGS

# The rate window spans the whole test, so every rate sees the load.
RATE_WINDOW = "2m"


@pytest.fixture(scope="module")
async def observed(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Observer]:
    """The stack with two workers, watched by postgres_exporter and Prometheus, after a load."""
    try:
        tools.ensure("prometheus")
        tools.ensure("postgres_exporter")
    except tools.ToolUnavailable as exc:
        pytest.fail(f"the scrape test needs Prometheus and postgres_exporter: {exc}")
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("observed"),
        workers=2,
        environment={**E2E_SETTINGS, "QUEUE_DEPTH_INTERVAL": "500ms"},
    )
    await stack.start()
    observer = Observer(stack, database_url, tmp_path_factory.mktemp("prometheus"))
    try:
        await observer.start()
        await observer.wait_for_targets()
        await exercise(stack)
        yield observer
    finally:
        observer.stop()
        stack.stop()


async def _offered(observed: Observer) -> dict[str, list[str]]:
    """What each template variable's own query offers in its dropdown, polled until every one
    offers something (a series appears a scrape after the load made it); fails after 60 s."""
    variables = dashboard_variables()
    deadline = time.monotonic() + 60
    while True:
        offered = {v.name: await observed.label_values(v) for v in variables}
        if all(offered.values()):
            return offered
        if time.monotonic() > deadline:
            pytest.fail(
                f"variables offering only All: {[v for v in variables if not offered[v.name]]}"
            )
        await asyncio.sleep(0.5)


async def _variables(observed: Observer, database_url: str) -> dict[str, str]:
    """The selection a user makes: All (`.*`) for queue and task type, and the stack's own
    database picked from what the `database` variable offers."""
    database = database_url.rsplit("/", 1)[1]
    offered = await _offered(observed)
    assert database in offered["database"], offered["database"]
    return {"queue": ".*", "task_type": ".*", "database": database}


async def test_every_variable_offers_the_stacks_values(
    observed: Observer, database_url: str
) -> None:
    """Each variable's query, evaluated as Grafana does, offers real values: the load's queue
    and task types, and the stack's database (not just "All", as a label the exporter does
    not export would)."""
    offered = await _offered(observed)
    assert set(offered) == {"queue", "task_type", "database"}
    assert "default" in offered["queue"], offered
    assert "noop" in offered["task_type"], offered
    assert database_url.rsplit("/", 1)[1] in offered["database"], offered


async def test_snapshot_names_the_workers_as_they_report_themselves(observed: Observer) -> None:
    """`make dashboard-snapshot`'s title comes from the replicas' own `jobq_worker_slots`."""
    deadline = time.monotonic() + 30
    while True:
        slots = await worker_slots(observed)
        if len(slots) >= 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert slots == [DEFAULT_CONCURRENCY, DEFAULT_CONCURRENCY]
    assert describe_workers(slots) == f"2 workers of {DEFAULT_CONCURRENCY} slots"


async def test_every_target_is_scraped(observed: Observer) -> None:
    up = await observed.query("up")
    by_job: dict[str, list[str]] = {}
    for series in up:
        assert series["value"][1] == "1", series
        by_job.setdefault(series["metric"]["job"], []).append(series["metric"]["instance"])
    assert {job: len(instances) for job, instances in by_job.items()} == {
        "queue": 1,
        "producer": 1,
        "worker": 2,
        "postgres": 1,
    }


async def _wait_for_every_panel(observed: Observer, database_url: str) -> None:
    """Poll until each panel target, expanded as Grafana would with All selected, returns at
    least one finite sample; fail with the stragglers after 90 s (a loaded machine scrapes
    late; rate panels need two scrapes)."""
    variables = await _variables(observed, database_url)
    queries = {expand(q.expr, variables, RATE_WINDOW): q for q in dashboard_queries()}
    assert len(queries) >= 30, "every panel target is read"
    waiting = dict(queries)
    deadline = time.monotonic() + 90
    while waiting:
        for expr in list(waiting):
            if finite_samples(await observed.query(expr)):
                del waiting[expr]
        if not waiting:
            break
        if time.monotonic() > deadline:
            report = {
                f"{q.panel}: {expr}": await observed.query(expr) for expr, q in waiting.items()
            }
            pytest.fail(f"no data within 90 s for {report}")
        await asyncio.sleep(0.5)


async def test_every_dashboard_query_returns_data(observed: Observer, database_url: str) -> None:
    await _wait_for_every_panel(observed, database_url)


async def test_dashboard_and_alerts_use_only_exported_metrics(
    observed: Observer, database_url: str
) -> None:
    """Every metric a panel or an alert selects is one the stack or the exporter exports (or
    Prometheus's own `up`), by the names Prometheus has actually scraped."""
    await _wait_for_every_panel(observed, database_url)  # the load has been scraped
    scraped = set(await observed.api("label/__name__/values"))
    used = {name for q in dashboard_queries() for name in metric_names(q.expr)}
    used |= {name for expr in alert_rules().values() for name in metric_names(expr)}
    assert "jobq_worker_job_duration_seconds_bucket" in used, "the parser finds metrics"
    assert "pg_stat_user_tables_n_dead_tup" in used
    assert used - scraped == set(), "referenced but exported by nothing"


async def test_every_alert_rule_evaluates_without_error(observed: Observer) -> None:
    """Prometheus has evaluated every rule of the committed files, each without error, and
    every alert expression is a valid query against the live data."""
    expected = set(alert_rules())
    deadline = time.monotonic() + 20
    while True:
        groups = (await observed.api("rules"))["groups"]
        rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
        evaluated = {
            name
            for name, rule in rules.items()
            if rule["health"] == "ok" and not rule["lastEvaluation"].startswith("0001")
        }
        if set(rules) == expected and evaluated == expected:
            break
        if time.monotonic() > deadline:
            broken = {n: (r["health"], r.get("lastError")) for n, r in rules.items()}
            pytest.fail(f"rules not all evaluated cleanly: {broken}; expected {expected}")
        await asyncio.sleep(0.5)
    for name, expr in alert_rules().items():
        await observed.query(expr)  # raises PromQLError on a bad expression
        assert name in rules


async def test_no_alert_fires_on_a_healthy_stack(observed: Observer) -> None:
    """The load fails jobs on purpose (retries, dead letters), so only the alerts about failed
    jobs may be active; no other (no worker, stale depth, service down, …) may even be pending
    on a healthy stack, so an expression that is true when it should not be shows here before
    its `for` runs out."""
    alerts = (await observed.api("alerts"))["alerts"]
    active = {a["labels"]["alertname"] for a in alerts if a["state"] in ("pending", "firing")}
    assert active <= {"JobqDeadLettersGrowing", "JobqHighErrorRatio"}, alerts

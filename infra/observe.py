"""A real Prometheus and postgres_exporter watching a `LocalStack`, on loopback.

Used by the scrape test and `make dashboard-snapshot`, so both read the stack through exactly
the rule files, the dashboard and the exporter queries that compose ships:

- `Observer` starts `postgres_exporter` (with `infra/postgres-exporter/queries.yml`) against
  the stack's database and Prometheus with the local rendering of the one configuration
  template (`infra.prometheus_config.local`, static targets, the committed alert rules), and
  answers PromQL over Prometheus's HTTP API.
- `dashboard_queries()` reads the committed dashboard JSON's panel targets and
  `dashboard_variables()` its template variables (evaluated with `Observer.label_values`, as
  Grafana asks Prometheus for them); `expand()` fills in the variables the way Grafana would;
  `metric_names()` lists the metrics a PromQL expression selects.

The binaries come from `infra.tools` (Debian's packages, fetched when missing).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from infra import prometheus_config, tools
from infra.grafana.dashboard import DASHBOARD_JSON
from infra.stack import ROOT, LocalStack, free_port, free_ports

EXPORTER_QUERIES = ROOT / "infra" / "postgres-exporter" / "queries.yml"
RULES = sorted(prometheus_config.RULES_DIR.glob("*.yml"))


class PromQLError(RuntimeError):
    """Prometheus refused or failed a query; the message is Prometheus's own."""


@dataclass(frozen=True)
class PanelQuery:
    """One target of a dashboard panel: its panel title, PromQL (with template variables),
    legend format and the panel's unit."""

    panel: str
    expr: str
    legend: str
    unit: str


def dashboard_queries(path: Path = DASHBOARD_JSON) -> list[PanelQuery]:
    """Every PromQL target of every panel of the dashboard JSON at `path`, in panel order."""
    model = json.loads(path.read_text())
    found = []
    for panel in model["panels"]:
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for target in panel.get("targets", []):
            found.append(
                PanelQuery(panel["title"], target["expr"], target.get("legendFormat", ""), unit)
            )
    return found


@dataclass(frozen=True)
class VariableQuery:
    """A template variable of the dashboard: its name and its query, Grafana's
    `label_values(metric, label)` (the values of `label` over the series of `metric`)."""

    name: str
    metric: str
    label: str


_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*([a-zA-Z_]\w*)\s*\)")


def dashboard_variables(path: Path = DASHBOARD_JSON) -> list[VariableQuery]:
    """Every template variable of the dashboard JSON at `path`, in order. ValueError for a
    variable whose query is not `label_values(metric, label)` (the only form this reads)."""
    found = []
    for variable in json.loads(path.read_text())["templating"]["list"]:
        query = variable["query"]
        text = query if isinstance(query, str) else query.get("query", "")
        match = _LABEL_VALUES.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"variable {variable['name']}: not label_values(metric, label): {text}"
            )
        found.append(VariableQuery(variable["name"], match.group(1), match.group(2)))
    return found


def alert_rules(paths: list[Path] = RULES) -> dict[str, str]:
    """`alert name → expr` for every alerting rule in the rule files."""
    rules = {}
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule["expr"]
    return rules


def expand(expr: str, variables: Mapping[str, str], rate_interval: str) -> str:
    """`expr` with `$__rate_interval` and each `$name` of `variables` replaced, as Grafana
    does before sending a query (a multi-value "All" becomes its all-value, `.*`)."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(f"${name}", variables[name])
    return expr


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2", "group_left", "group_right"}
)


def metric_names(expr: str) -> set[str]:
    """Names of the metrics `expr` selects (identifiers that are not functions, aggregations,
    keywords, label names or durations)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def finite_samples(result: list[dict[str, Any]]) -> int:
    """How many samples of an instant-query result are numbers (not NaN or ±Inf)."""
    return sum(1 for series in result if math.isfinite(float(series["value"][1])))


@dataclass
class Observer:
    """postgres_exporter and Prometheus watching `stack` (whose database is `database_url`).

    `start()` launches both on free loopback ports and waits until Prometheus is ready;
    `stop()` ends them. Logs and Prometheus's data go under `workdir`. `interval` is the scrape
    and rule-evaluation interval.
    """

    stack: LocalStack
    database_url: str
    workdir: Path
    interval: str = "1s"
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.exporter_port, self.prometheus_port = free_ports(2)
        self.workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """Base URL of Prometheus."""
        return f"http://127.0.0.1:{self.prometheus_port}"

    def targets(self) -> dict[str, list[str]]:
        """`host:port` per scrape job, as the local configuration lists them."""
        return {
            "queue": [f"127.0.0.1:{self.stack.queue_port}"],
            "producer": [f"127.0.0.1:{self.stack.producer_port}"],
            "worker": [f"127.0.0.1:{port}" for port in self.stack.metrics_ports],
            "postgres": [f"127.0.0.1:{self.exporter_port}"],
        }

    def _launch(self, name: str, command: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            command, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT
        )

    async def start(self) -> None:
        """Launch the exporter and Prometheus; RuntimeError (with their logs) if either dies
        or Prometheus is not ready within 30 s. Raises tools.ToolUnavailable without them."""
        exporter, prometheus = tools.ensure("postgres_exporter"), tools.ensure("prometheus")
        config = self.workdir / "prometheus.yml"
        config.write_text(
            prometheus_config.dump(prometheus_config.local(self.targets(), self.interval))
        )
        dsn = self.database_url + ("&" if "?" in self.database_url else "?") + "sslmode=disable"
        self._launch(
            "postgres_exporter",
            [
                str(exporter),
                f"--web.listen-address=127.0.0.1:{self.exporter_port}",
                f"--extend.query-path={EXPORTER_QUERIES}",
            ],
            env={"DATA_SOURCE_NAME": dsn, "PATH": "/usr/bin:/bin"},
        )
        self._launch(
            "prometheus",
            [
                str(prometheus),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
            ],
        )
        try:
            await self.stack.wait_ready(f"{self.url}/-/ready")
            await self.stack.wait_ready(f"http://127.0.0.1:{self.exporter_port}/metrics")
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc

    def stop(self) -> None:
        """Stop Prometheus and the exporter (SIGKILL after 10 s)."""
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the exporter's and Prometheus's logs."""
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    async def api(self, path: str, **params: str) -> Any:
        """GET `/api/v1/<path>` and return its `data`; PromQLError when Prometheus says error."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            reply = await client.get(f"/api/v1/{path}", params=params)
        body = reply.json()
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector result of `expr` now (a scalar comes back as one unlabelled sample)."""
        data = await self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    async def label_values(self, variable: VariableQuery) -> list[str]:
        """The values Grafana offers for `variable`: what its `label_values(metric, label)`
        asks Prometheus (`/api/v1/label/<label>/values?match[]=<metric>`), sorted."""
        values: list[str] = await self.api(
            f"label/{variable.label}/values", **{"match[]": variable.metric}
        )
        return sorted(values)

    async def query_range(
        self, expr: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        """Range-query matrix of `expr` between Unix times `start` and `end`, every `step` s."""
        data = await self.api(
            "query_range", query=expr, start=str(start), end=str(end), step=str(step)
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    async def wait_for_targets(self, within: float = 30.0) -> None:
        """Poll until every configured target is up; RuntimeError naming the others."""
        expected = sum(len(v) for v in self.targets().values())
        deadline = time.monotonic() + within
        while True:
            active = (await self.api("targets"))["activeTargets"]
            down = [t["scrapeUrl"] for t in active if t["health"] != "up"]
            if len(active) == expected and not down:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"targets not up within {within}s: {down}\n{self.log_tail()}")
            await asyncio.sleep(0.2)


SERIES_SETTLE_SECONDS = 3.0
"""Pause between the two waves of `exercise`: a few scrape intervals of the test Prometheus."""


async def _wave(producer: httpx.AsyncClient, jobs: int, closed: int) -> None:
    """`jobs` noop submits, a batch, sleep jobs, failing webhooks, a 422 and a 404."""
    replies = [
        await producer.post("/jobs", json={"taskType": "noop", "payload": {"i": i}})
        for i in range(jobs)
    ]
    batch = [{"taskType": "noop", "payload": {"batch": i}} for i in range(5)]
    replies.append(await producer.post("/jobs/batch", json={"jobs": batch}))
    for _ in range(4):
        sleep = {"taskType": "sleep", "payload": {"ms": 300}}
        replies.append(await producer.post("/jobs", json=sleep))
    for _ in range(3):
        webhook = {
            "taskType": "webhook",
            "maxAttempts": 2,
            "payload": {"url": f"http://127.0.0.1:{closed}/hook"},
        }
        replies.append(await producer.post("/jobs", json=webhook))
    for reply in replies:
        reply.raise_for_status()
    invalid = await producer.post("/jobs", json={"taskType": "noop"})
    missing = await producer.get("/jobs/00000000-0000-0000-0000-000000000000")
    if (invalid.status_code, missing.status_code) != (422, 404):
        raise RuntimeError(f"expected 422 and 404, got {invalid} and {missing}")


async def exercise(stack: LocalStack, jobs: int = 40) -> None:
    """Drive every path the dashboard and the alerts read, through the real services:

    `jobs` noop submits and a batch (successes, end-to-end and claim latency), sleep jobs
    (busy worker slots), webhooks to a port nothing listens on with `maxAttempts` 2 (retries,
    then dead letters), a 422 and a 404 (producer 4xx), and by hand on the queue service, on a
    queue no worker serves, one lease left to expire (the reaper's expiry), one released
    with a heartbeat of 0 and a concurrency limit set, and on another a rate limit that holds
    back the second of two claims. Raises httpx.HTTPStatusError when a
    service answers unexpectedly.
    """
    closed = free_port()
    async with httpx.AsyncClient(base_url=stack.producer, timeout=10) as producer:
        # A first small wave creates every series, the second one moves them: a rate needs a
        # counter seen before and after an increase, and the stack settles a wave faster than
        # Prometheus scrapes.
        await _wave(producer, 2, closed)
        await asyncio.sleep(SERIES_SETTLE_SECONDS)
        await _wave(producer, jobs, closed)
    headers = {"Authorization": f"Bearer {stack.internal_token}"}
    async with httpx.AsyncClient(base_url=stack.queue, headers=headers, timeout=10) as queue:
        for _ in range(2):
            created = await queue.post(
                "/jobs", json={"taskType": "noop", "queue": "manual", "payload": {}}
            )
            created.raise_for_status()
        claims = []
        for visibility in (1, 30):
            claim = await queue.post(
                "/jobs/next",
                json={
                    "worker": "observer",
                    "queues": ["manual"],
                    "max": 1,
                    "waitSeconds": 0,
                    "visibilityTimeout": visibility,
                },
            )
            claim.raise_for_status()
            claims.append(claim.json()["jobs"][0])
        # The first lease is left to expire; the second is given back at once.
        released = claims[1]
        reply = await queue.post(
            f"/jobs/{released['id']}/heartbeat",
            json={"receiptHandle": released["receiptHandle"], "visibilityTimeout": 0},
        )
        reply.raise_for_status()
        # A concurrency limit, so its gauges (limit, slots in use) have series.
        limited = await queue.put(
            "/queues/manual/limits",
            json={"limits": [{"taskType": "noop", "concurrency": 5, "tenantConcurrency": 2}]},
        )
        limited.raise_for_status()
        # A rate limit that holds its second job back, so the tokens gauge and the held-back
        # counter have series (a queue no worker serves: its jobs wait for these claims).
        throttled = await queue.put(
            "/queues/throttled/limits",
            json={"limits": [{"taskType": "noop", "rate": 0.01, "burst": 1}]},
        )
        if throttled.status_code == 404:  # the queue has no job yet
            for _ in range(2):
                created = await queue.post(
                    "/jobs", json={"taskType": "noop", "queue": "throttled", "payload": {}}
                )
                created.raise_for_status()
            throttled = await queue.put(
                "/queues/throttled/limits",
                json={"limits": [{"taskType": "noop", "rate": 0.01, "burst": 1}]},
            )
        throttled.raise_for_status()
        for _ in range(2):
            claim = await queue.post(
                "/jobs/next",
                json={"worker": "observer", "queues": ["throttled"], "max": 1, "waitSeconds": 0},
            )
            claim.raise_for_status()

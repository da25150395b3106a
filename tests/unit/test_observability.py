"""Dashboards, Prometheus configuration and compose agree with the code that generates them
and with each other (no I/O beyond reading the repository's files)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from infra import prometheus_config
from infra.grafana import dashboard
from infra.observe import (
    alert_rules,
    dashboard_queries,
    dashboard_variables,
    expand,
    metric_names,
)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())


def test_committed_dashboard_is_what_the_code_generates() -> None:
    assert dashboard.DASHBOARD_JSON.read_text() == dashboard.render(), "run `make dashboards`"


def test_committed_prometheus_config_is_the_compose_rendering() -> None:
    committed = prometheus_config.COMPOSE_CONFIG.read_text()
    assert committed == prometheus_config.compose_text(), "run `make prometheus-config`"


def test_both_renderings_differ_only_in_how_targets_are_found() -> None:
    targets = {job: ["127.0.0.1:1"] for job in prometheus_config.JOBS}
    compose, local = prometheus_config.compose(), prometheus_config.local(targets, "5s")
    assert [s["job_name"] for s in compose["scrape_configs"]] == list(prometheus_config.JOBS)
    assert [s["job_name"] for s in local["scrape_configs"]] == list(prometheus_config.JOBS)
    assert compose["global"] == local["global"]
    assert all("dns_sd_configs" in s for s in compose["scrape_configs"])
    assert all("static_configs" in s for s in local["scrape_configs"])
    assert [Path(p).name for p in compose["rule_files"]] == ["*.yml"]
    assert local["rule_files"] == [str(prometheus_config.RULES_DIR / "*.yml")]


def test_metric_names_finds_selectors_only() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, path) (rate("
        'jobq_http_request_duration_seconds_bucket{app_name="producer", path=~"a|b"}'
        "[$__rate_interval])))"
        ' / ignoring (path) group_left sum(up{job="worker"} offset 10m) unless on () time()'
        " - max by (queue) (jobq_jobs) > bool 0 and vector(1)"
    )
    assert metric_names(expr) == {"jobq_http_request_duration_seconds_bucket", "up", "jobq_jobs"}


def test_expand_fills_in_variables_as_grafana_does() -> None:
    expr = 'rate(x{queue=~"$queue", task_type=~"$task_type"}[$__rate_interval])'
    assert (
        expand(expr, {"queue": ".*", "task_type": "email"}, "1m")
        == 'rate(x{queue=~".*", task_type=~"email"}[1m])'
    )


def test_dashboard_has_the_variables_and_rows_operators_need() -> None:
    model = json.loads(dashboard.DASHBOARD_JSON.read_text())
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert set(variables) == {"queue", "task_type", "database"}
    assert all(v["includeAll"] and v["allValue"] == ".*" for v in variables.values())
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Throughput and depth",
        "Latency",
        "Workers and leases",
        "PostgreSQL",
    ]
    ids = [p["id"] for p in model["panels"]]
    assert len(set(ids)) == len(ids)
    datasources = {
        json.dumps(t["datasource"]) for p in model["panels"] for t in p.get("targets", [])
    }
    assert datasources == {json.dumps({"type": "prometheus", "uid": "prometheus"})}


def test_panels_filter_by_the_template_variables() -> None:
    """A jobq metric with a queue label is filtered by $queue wherever a panel selects it."""
    for query in dashboard_queries():
        for selector in re.findall(
            r"(jobq_(?:jobs|enqueued_total|processed_total|oldest_pending_age_seconds|lease_expired_total|released_total|end_to_end_seconds_bucket))\{([^}]*)\}",
            query.expr,
        ):
            assert "$queue" in selector[1], query
        for selector in re.findall(r"pg_\w+\{([^}]*)\}", query.expr):
            assert "$database" in selector, query


def test_each_variable_reads_the_label_its_panels_filter_on() -> None:
    """A variable's values must come from the label the panels match it against (`datname` for
    `$database`: postgres_exporter has no `database` label), on a metric carrying that label."""
    variables = {v.name: v for v in dashboard_variables()}
    assert set(variables) == {"queue", "task_type", "database"}
    matched: dict[str, set[str]] = {}
    for query in dashboard_queries():
        for label, name in re.findall(r'(\w+)=~"\$(\w+)"', query.expr):
            matched.setdefault(name, set()).add(label)
    assert set(matched) == set(variables)
    for name, variable in variables.items():
        assert matched[name] == {variable.label}, name
    assert variables["database"].label == "datname"


def _stat_panels() -> dict[str, dict[str, Any]]:
    model = json.loads(dashboard.DASHBOARD_JSON.read_text())
    return {p["title"]: p for p in model["panels"] if p["type"] == "stat"}


def test_every_stat_panel_colours_its_value_by_thresholds() -> None:
    """Without thresholds Grafana draws every stat in its default green ("Live workers 0"
    looked healthy): each has absolute steps, a base colour and ascending values, and says
    both healthy (green) and broken (red)."""
    panels = _stat_panels()
    assert len(panels) == 7
    # A paused queue is an operator's decision, not a fault: orange, never red.
    decisions = {"Paused queues"}
    for title, panel in panels.items():
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["color"] == {"mode": "thresholds"}, title
        thresholds = defaults["thresholds"]
        assert thresholds["mode"] == "absolute", title
        steps = thresholds["steps"]
        assert len(steps) >= 2 and steps[0]["value"] is None, title
        values = [step["value"] for step in steps[1:]]
        assert values == sorted(values) and len(set(values)) == len(values), title
        colours = [step["color"] for step in steps]
        if title in decisions:
            assert colours == ["green", "orange"], title
            continue
        assert {"green", "red"} <= set(colours) <= {"green", "orange", "red"}, title


def test_stat_colours_read_as_an_operator_would() -> None:
    panels = _stat_panels()
    colour = dashboard.threshold_colour
    assert colour(panels["Live workers"], 0) == "red"
    assert colour(panels["Live workers"], 2) == "green"
    assert colour(panels["Dead letters"], 0) == "green"
    assert colour(panels["Dead letters"], 3) == "red"
    assert colour(panels["Paused queues"], 0) == "green"
    assert colour(panels["Paused queues"], 1) == "orange"
    assert colour(panels["Producer 5xx ratio"], 0) == "green"
    assert colour(panels["Oldest pending"], 90) == "orange"


def test_stat_panels_turn_red_where_their_alerts_fire() -> None:
    """A stat that has an alert on the same quantity turns red at the alert's threshold."""
    paired = {
        "Oldest pending": "JobqOldestPendingTooOld",
        "Depth data age": "JobqDepthGaugesStale",
        "Depth cache age": "JobqDepthCacheStale",
        "Producer 5xx ratio": "JobqProducer5xx",
    }
    rules = alert_rules()
    for title, alert in paired.items():
        match = re.search(r">\s*([0-9.]+)\s*$", rules[alert])
        assert match, alert
        steps = _stat_panels()[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        [red] = [step["value"] for step in steps if step["color"] == "red"]
        assert red == float(match.group(1)), title


def test_grafana_provisioning_matches_compose() -> None:
    grafana = COMPOSE["services"]["grafana"]
    mounts = dict(
        v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"] if v.startswith("./")
    )
    provider = yaml.safe_load(
        (ROOT / "infra" / "grafana" / "provisioning" / "dashboards" / "jobq.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == mounts["./grafana/dashboards"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    datasource = yaml.safe_load(
        (ROOT / "infra" / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["uid"] == dashboard.DATASOURCE.uid
    assert datasource["url"] == "http://prometheus:9090"
    scrape_interval = prometheus_config.compose()["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape_interval, "$__rate_interval base"
    assert "GRAFANA_ADMIN_PASSWORD" in grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]


def test_compose_publishes_only_producer_sqs_prometheus_grafana_on_loopback() -> None:
    published = {
        name: service["ports"]
        for name, service in COMPOSE["services"].items()
        if "ports" in service
    }
    assert set(published) == {"producer", "sqs", "prometheus", "grafana"}
    for ports in published.values():
        for port in ports:
            assert port.startswith("${JOBQ_PUBLISH_ADDRESS:-127.0.0.1}:"), port


def test_compose_images_are_pinned() -> None:
    for name, service in COMPOSE["services"].items():
        image = service.get("image", "")
        if "/" in image or name in ("postgres", "redis"):
            assert re.search(r":v?\d+(\.\d+)*$", image), f"{name}: pin {image}"


def test_compose_prometheus_loads_the_rules_and_the_exporter_its_queries() -> None:
    services = COMPOSE["services"]
    assert services["prometheus"]["volumes"][0] == "./prometheus:/etc/prometheus:ro"
    exporter = services["postgres-exporter"]
    mount = exporter["volumes"][0].split(":")
    assert (ROOT / "infra" / mount[0]).is_file()
    assert exporter["environment"]["PG_EXPORTER_EXTEND_QUERY_PATH"] == mount[1]


def test_readme_says_what_to_do_for_every_alert() -> None:
    readme = (ROOT / "README.md").read_text()
    observe = readme.split("## Observe", 1)[1].split("\n## ", 1)[0]
    for alert in alert_rules():
        assert f"`{alert}`" in observe, f"README Observe: add {alert}"


# Where each image compose runs keeps its data (the image's VOLUME): compose would make an
# anonymous volume for any of these not mounted, left behind by every `down` + `up`.
IMAGE_VOLUMES = {
    "postgres": "/var/lib/postgresql/data",
    "redis": "/data",
    "prometheus": "/prometheus",
    "grafana": "/var/lib/grafana",
}


def test_compose_data_lives_in_named_volumes() -> None:
    """Issue 25 item 5."""
    services = COMPOSE["services"]
    for name, path in IMAGE_VOLUMES.items():
        named = {
            v.split(":")[1]: v.split(":")[0]
            for v in services[name].get("volumes", [])
            if not v.startswith(("./", "/"))
        }
        assert path in named, f"{name}: {path} is not a named volume"
        assert named[path] in COMPOSE["volumes"]


def test_compose_needs_v2_and_says_so() -> None:
    """Issue 25 item 3: the top-level name needs Compose v2."""
    assert COMPOSE["name"] == "jobq"
    text = (ROOT / "infra" / "compose.yml").read_text()
    assert "Docker Compose v2" in text
    readme = (ROOT / "README.md").read_text()
    assert "Compose v2" in readme and "make compose-test" in readme


def test_compose_probes_postgres_over_tcp_as_the_services_connect() -> None:
    """Issue 25 item 1: a socket probe passes during the image's socket-only first start."""
    test = " ".join(COMPOSE["services"]["postgres"]["healthcheck"]["test"])
    assert re.search(r"pg_isready .*-h 127\.0\.0\.1", test), test


def test_compose_services_depend_on_what_they_connect_to() -> None:
    """Issue 25 item 4: `down` stops services in reverse dependency order, so each service
    must declare what it uses, or PostgreSQL stops under the queue service."""
    services = COMPOSE["services"]
    uses = {
        "queue": {"postgres", "redis", "migrate"},
        "producer": {"queue"},
        "sqs": {"queue"},
        "worker": {"queue", "smtp"},
        "migrate": {"postgres"},
        "postgres-exporter": {"postgres"},
    }
    for name, needed in uses.items():
        declared = set(services[name].get("depends_on", {}))
        assert needed <= declared, f"{name} depends on {needed - declared} undeclared"
    assert services["queue"]["depends_on"]["postgres"] == {"condition": "service_healthy"}

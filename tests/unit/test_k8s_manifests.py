"""infra/k8s renders with kubectl's kustomize, validates offline against the Kubernetes schemas
and the CRDs' (KEDA, Prometheus Operator), and keeps the policies README "Kubernetes" states:
restricted security context, probes, resources, drains, PDBs, spread and NetworkPolicies on
every workload; no secret in a manifest; compose and the manifests agree on image and settings.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule, ServiceMonitor
from pydantic import BaseModel

from infra import kubernetes
from infra.kubernetes import OVERLAYS, Trigger, hpa_desired, keda_triggers, render
from services.producer.settings import ProducerSettings
from services.queue.settings import QueueSettings
from services.sqs.settings import SqsSettings
from services.worker.settings import DEFAULT_CONCURRENCY, WorkerSettings, split_queues

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())
KUBERNETES_VERSION = "1.37.0"
CUSTOM: dict[tuple[str, str], type[BaseModel]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TriggerAuthentication,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
}
SECRET_KEYS = {"DATABASE_URL", "REDIS_URL", "QUEUE_INTERNAL_TOKEN", "JOBQ_API_KEYS"}
# The drain budget each long-running container gets on SIGTERM (the settings' defaults).
DRAIN = {
    "queue": QueueSettings.model_fields["queue_shutdown_grace"].default,
    "producer": ProducerSettings.model_fields["producer_shutdown_grace"].default,
    "worker": WorkerSettings.model_fields["worker_shutdown_grace"].default,
    "sqs": SqsSettings.model_fields["sqs_shutdown_grace"].default,
}
PUBLIC = {"producer": 8080, "sqs": 9324}
"""The components reachable from outside, and their ports."""


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every overlay, rendered once by `kubectl kustomize`."""
    return {overlay: render(overlay) for overlay in OVERLAYS}


def _of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in objects if item["kind"] == kind]


def _workloads(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """`(component, pod spec)` of every Deployment and Job."""
    for item in objects:
        if item["kind"] in ("Deployment", "Job"):
            template = item["spec"]["template"]
            yield template["metadata"]["labels"]["app.kubernetes.io/component"], template


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    return all(labels.get(key) == value for key, value in wanted.items())


def test_every_overlay_renders(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, objects in rendered.items():
        kinds = {item["kind"] for item in objects}
        assert {"Deployment", "Service", "Job", "NetworkPolicy"} <= kinds, overlay
        names = {item["metadata"]["name"] for item in _of(objects, "Deployment")}
        groups = {"jobq-worker-emails"} if overlay == "example-worker-groups" else set()
        assert names == {"jobq-queue", "jobq-producer", "jobq-sqs", "jobq-worker"} | groups, overlay
        namespaced = [i for i in objects if i["kind"] != "Namespace"]
        assert {i["metadata"].get("namespace") for i in namespaced} == {
            "jobq-dev" if overlay == "dev" else "jobq"
        }, overlay


def test_core_objects_validate_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """kubernetes-validate, strict (unknown fields are errors), against 1.37's schemas."""
    checked = 0
    for objects in rendered.values():
        for item in objects:
            if (item["apiVersion"], item["kind"]) in CUSTOM:
                continue
            kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)
            checked += 1
    assert checked > 50


def test_custom_objects_validate_against_their_crds(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """KEDA's and the Prometheus Operator's objects parse as their CRDs' models, and nothing is
    dropped on the way (a misspelt field would be)."""
    seen = set()
    for objects in rendered.values():
        for item in objects:
            model = CUSTOM.get((item["apiVersion"], item["kind"]))
            if model is None:
                continue
            parsed = model.model_validate(item)
            assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) == item
            seen.add(item["kind"])
    assert seen == {kind for _, kind in CUSTOM}


def test_the_crd_check_catches_a_misspelt_field() -> None:
    bad = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": {"name": "x"}, "minReplicaCont": 0, "triggers": []},
    }
    parsed = ScaledObject.model_validate(bad)
    assert parsed.model_dump(mode="json", by_alias=True, exclude_unset=True) != bad


def test_every_pod_runs_restricted(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Non-root, read-only root filesystem, no privilege escalation, every capability dropped,
    seccomp RuntimeDefault, no service account token: for every container, init ones too."""
    for overlay, objects in rendered.items():
        for component, template in _workloads(objects):
            spec = template["spec"]
            where = f"{overlay}/{component}"
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, where
            assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert spec["automountServiceAccountToken"] is False, where
            for container in spec["containers"] + spec.get("initContainers", []):
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, where
                assert context["allowPrivilegeEscalation"] is False, where
                assert context.get("privileged", False) is False, where
                assert context["capabilities"] == {"drop": ["ALL"]}, where
                resources = container["resources"]
                for kind in ("requests", "limits"):
                    assert set(resources[kind]) == {"cpu", "memory"}, (where, kind)


def test_every_service_is_probed_on_its_health_routes_and_drains_in_time(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objects in rendered.items():
        for component, template in _workloads(objects):
            if component == "migrate":
                continue
            spec = template["spec"]
            (container,) = spec["containers"]
            port = container["ports"][0]["name"]
            for probe, path in (
                ("startupProbe", "/health/live"),
                ("livenessProbe", "/health/live"),
                ("readinessProbe", "/health/ready"),
            ):
                assert container[probe]["httpGet"] == {"path": path, "port": port}, component
            pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
            budget = DRAIN[component] + pause.get("seconds", 0)
            assert spec["terminationGracePeriodSeconds"] > budget, (overlay, component)
            keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
            assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}


def _mebibytes(quantity: str) -> float:
    match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert match, quantity
    return float(match[1]) * (1024 if match[2] == "Gi" else 1)


def _cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_resources_come_from_the_benchmark_figures(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Each long-running manifest names the benchmark run its numbers come from, and its
    requests cover what that run measured per process under load (RSS, CPU at 300 submits/s),
    with its memory limit at least twice the measured RSS."""
    run = "full-20261203T185856Z"
    measured = json.loads((ROOT / "benchmark" / "results" / f"{run}.json").read_text())
    classes = measured["results"]["resources"]["load"]["classes"]
    per_process = {
        "queue": classes["queue"],
        "producer": classes["producer"],
        # Summed over the two workers of the run.
        "worker": {k: v / 2 for k, v in classes["workers"].items()},
    }
    for component, figures in per_process.items():
        source = (
            "worker-group/deployment.yaml" if component == "worker" else f"base/{component}.yaml"
        )
        text = (kubernetes.K8S_DIR / source).read_text()
        assert "benchmark/README.md" in text and run in text, component
        (deployment,) = [
            d
            for d in _of(rendered["production"], "Deployment")
            if d["metadata"]["name"] == f"jobq-{component}"
        ]
        resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert _mebibytes(resources["requests"]["memory"]) >= figures["rss_mb"], component
        assert _mebibytes(resources["limits"]["memory"]) >= 2 * figures["rss_mb"], component
        assert _cores(resources["requests"]["cpu"]) >= figures["cpu_percent"] / 100, component


def test_the_sqs_endpoint_is_sized_from_its_benchmark() -> None:
    """The SQS endpoint's requests cover the highest RSS and CPU its own process reached in
    `make bench-sqs` (sending, receiving and deleting), its memory limit twice that RSS."""
    run = "sqs-20261204T190031Z"
    measured = json.loads((ROOT / "benchmark" / "results" / f"{run}.json").read_text())
    figures = measured["summary"]["sqs_endpoint"]
    assert figures["rss_peak_mb"] > 0 and figures["cpu_percent"] > 0
    text = (kubernetes.K8S_DIR / "base" / "sqs.yaml").read_text()
    assert "benchmark/README.md" in text and run in text
    (deployment,) = yaml.safe_load_all(text)
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert _mebibytes(resources["requests"]["memory"]) >= figures["rss_peak_mb"]
    assert _mebibytes(resources["limits"]["memory"]) >= 2 * figures["rss_peak_mb"]
    assert _cores(resources["requests"]["cpu"]) >= figures["cpu_percent"] / 100


def test_every_deployment_has_a_disruption_budget(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objects in rendered.items():
        budgets = _of(objects, "PodDisruptionBudget")
        for component, template in _workloads(objects):
            if component == "migrate":
                continue
            labels = template["metadata"]["labels"]
            matching = [b for b in budgets if _selects(b["spec"]["selector"], labels)]
            assert len(matching) == 1, (overlay, component)
            assert matching[0]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def _policies_for(objects: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in _of(objects, "NetworkPolicy") if _selects(p["spec"]["podSelector"], labels)]


def test_every_pod_is_fenced_by_network_policies(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """A default deny for the namespace, and a policy of its own for every workload."""
    for overlay, objects in rendered.items():
        deny = [p for p in _of(objects, "NetworkPolicy") if p["spec"]["podSelector"] == {}]
        assert any(
            set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
            and "ingress" not in p["spec"]
            and "egress" not in p["spec"]
            for p in deny
        ), overlay
        for component, template in _workloads(objects):
            own = [
                p
                for p in _policies_for(objects, template["metadata"]["labels"])
                if p["spec"]["podSelector"]
            ]
            assert len(own) == 1, (overlay, component)


def _rules_reaching(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    return [
        rule
        for rule in policy["spec"].get("egress", [])
        if any(p["port"] == port for p in rule.get("ports", []))
    ]


def _ingress_open_to_all(policy: dict[str, Any]) -> bool:
    return any("from" not in rule for rule in policy["spec"].get("ingress", []))


def test_only_the_producer_is_reachable_and_only_the_queue_reaches_postgresql(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    private = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
    for overlay, objects in rendered.items():
        open_to_all, to_postgres, to_redis = set(), set(), set()
        for policy in _of(objects, "NetworkPolicy"):
            component = (
                policy["spec"]["podSelector"]
                .get("matchLabels", {})
                .get("app.kubernetes.io/component", "*")
            )
            if _ingress_open_to_all(policy):
                open_to_all.add(component)
            if _rules_reaching(policy, 5432):
                to_postgres.add(component)
            if _rules_reaching(policy, 6379):
                to_redis.add(component)
            for rule in policy["spec"].get("egress", []):
                blocks = [peer["ipBlock"] for peer in rule.get("to", []) if "ipBlock" in peer]
                for block in blocks:
                    # Public addresses only: a private PostgreSQL or Redis stays unreachable.
                    excluded = [ipaddress.ip_network(n) for n in block.get("except", [])]
                    if ipaddress.ip_network(block["cidr"]).version == 4:
                        assert all(net in excluded for net in private), (overlay, component)
        assert open_to_all == set(PUBLIC), overlay
        assert to_postgres == {"queue", "migrate"}, overlay
        assert to_redis == {"queue", "producer"}, overlay
        services = _of(objects, "Service")
        assert {s["spec"]["type"] for s in services} == {"ClusterIP"}, overlay
        for ingress in _of(objects, "Ingress"):
            for rule in ingress["spec"]["rules"]:
                backends = {p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
                assert backends <= {f"jobq-{c}" for c in PUBLIC}, overlay
                assert len(backends) == 1, overlay
        _assert_internal_paths_are_fenced(_of(objects, "Ingress"), overlay)


FENCE = "nginx.ingress.kubernetes.io/whitelist-source-range"


def _assert_internal_paths_are_fenced(ingresses: list[dict[str, Any]], overlay: str) -> None:
    """A host routing every path (`/`, Prefix) also routes /metrics and /health through an
    Ingress that only the loopback address may use; no other Ingress routes those paths."""
    for ingress in ingresses:
        fenced = ingress["metadata"].get("annotations", {}).get(FENCE) == "127.0.0.1/32"
        for rule in ingress["spec"]["rules"]:
            paths = {p["path"] for p in rule["http"]["paths"]}
            if fenced:
                assert paths == {"/metrics", "/health"}, overlay
                continue
            assert not paths & {"/metrics", "/health"}, overlay
            if "/" in paths:
                fences = [
                    other
                    for other in ingresses
                    if other["metadata"].get("annotations", {}).get(FENCE) == "127.0.0.1/32"
                    and any(r["host"] == rule["host"] for r in other["spec"]["rules"])
                ]
                assert len(fences) == 1, (overlay, rule["host"])


def test_the_sqs_endpoint_is_public_and_reaches_only_the_queue_service(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Ingress from anywhere on its port, egress to the queue service's port only (besides
    DNS); the queue service admits it; a Service and, in production, an Ingress route to it."""
    labels = {"app.kubernetes.io/name": "jobq", "app.kubernetes.io/component": "sqs"}
    queue = {"app.kubernetes.io/name": "jobq", "app.kubernetes.io/component": "queue"}
    for overlay, objects in rendered.items():
        (own,) = [p for p in _policies_for(objects, labels) if p["spec"]["podSelector"]]
        assert own["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9324}]}]
        (egress,) = own["spec"]["egress"]
        assert egress == {
            "to": [{"podSelector": {"matchLabels": queue}}],
            "ports": [{"protocol": "TCP", "port": 8081}],
        }, overlay
        (queue_policy,) = [p for p in _policies_for(objects, queue) if p["spec"]["podSelector"]]
        sources = [
            peer.get("podSelector", {}).get("matchLabels")
            for peer in queue_policy["spec"]["ingress"][0]["from"]
        ]
        assert labels in sources, overlay
        (service,) = [s for s in _of(objects, "Service") if s["metadata"]["name"] == "jobq-sqs"]
        assert service["spec"]["ports"] == [{"name": "http", "port": 9324, "targetPort": "http"}]
        if overlay != "dev":
            routed = {
                p["backend"]["service"]["name"]
                for i in _of(objects, "Ingress")
                for r in i["spec"]["rules"]
                for p in r["http"]["paths"]
            }
            assert routed == {"jobq-producer", "jobq-sqs"}, overlay


def _env_names(objects: list[dict[str, Any]]) -> set[str]:
    """Every environment variable a jobq container gets: its `env` and the keys of the
    ConfigMaps it reads with `envFrom`."""
    configmaps = {c["metadata"]["name"]: c.get("data", {}) for c in _of(objects, "ConfigMap")}
    names = set()
    for _, template in _workloads(objects):
        spec = template["spec"]
        for container in spec["containers"] + spec.get("initContainers", []):
            names |= {e["name"] for e in container.get("env", [])}
            for source in container.get("envFrom", []):
                names |= set(configmaps[source["configMapRef"]["name"]])
    return names


def test_secrets_come_from_the_secret_never_from_a_manifest(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objects in rendered.items():
        assert _of(objects, "Secret") == [], overlay
        for configmap in _of(objects, "ConfigMap"):
            assert not SECRET_KEYS & set(configmap.get("data", {})), overlay
        for _, template in _workloads(objects):
            spec = template["spec"]
            for container in spec["containers"] + spec.get("initContainers", []):
                for entry in container.get("env", []):
                    if entry["name"] in SECRET_KEYS:
                        ref = entry["valueFrom"]["secretKeyRef"]
                        assert (ref["name"], ref["key"]) == ("jobq", entry["name"])
                        assert "value" not in entry


def test_compose_and_the_manifests_use_one_image_and_the_same_settings(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """A setting compose gives a jobq process and the manifests do not (or the reverse) fails
    here; so does a name `.env.example` does not list."""
    jobq = {n: s for n, s in COMPOSE["services"].items() if s.get("image") == "jobq:local"}
    assert set(jobq) == {"migrate", "queue", "producer", "sqs", "worker"}
    compose_names = {name for service in jobq.values() for name in service["environment"]}
    example = (ROOT / ".env.example").read_text()
    listed = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", example, re.MULTILINE))
    for overlay, objects in rendered.items():
        assert _env_names(objects) == compose_names, overlay
        assert compose_names <= listed
        images = {
            c["image"]
            for _, t in _workloads(objects)
            for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])
        }
        assert len(images) == 1, overlay
        repository = images.pop().rsplit(":", 1)[0].rsplit("/", 1)[-1]
        assert repository == "jobq", overlay
    dev_images = {
        c["image"] for _, t in _workloads(rendered["dev"]) for c in t["spec"]["containers"]
    }
    assert dev_images == {"jobq:local"}, "dev runs the image compose builds"


def test_the_migration_job_runs_alembic_upgrade_head_only(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for overlay, objects in rendered.items():
        (job,) = _of(objects, "Job")
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["alembic", "upgrade", "head"], overlay
        (queue,) = [d for d in _of(objects, "Deployment") if d["metadata"]["name"] == "jobq-queue"]
        (gate,) = queue["spec"]["template"]["spec"]["initContainers"]
        assert gate["command"] == ["alembic", "check"], overlay
        text = yaml.safe_dump(objects)
        assert "downgrade" not in text, overlay


def test_generated_files_are_what_the_code_generates() -> None:
    for path, text in kubernetes.generated().items():
        assert path.read_text() == text, f"{path.name} drifted: run `make k8s-generated`"


def test_the_prometheus_rule_holds_every_compose_alert() -> None:
    rule = yaml.safe_load(kubernetes.RULE_FILE.read_text())
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    composed = set()
    for path in (ROOT / "infra" / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            composed |= {r["alert"] for r in group["rules"] if "alert" in r}
    assert alerts == composed and len(alerts) >= 10


def test_scrape_jobs_are_named_as_the_rules_and_dashboard_expect(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["production"]
    (monitor,) = _of(objects, "ServiceMonitor")
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/component"
    components = {
        s["metadata"]["labels"]["app.kubernetes.io/component"] for s in _of(objects, "Service")
    }
    assert components == {"queue", "producer", "sqs"}
    (pods,) = _of(objects, "PodMonitor")
    (endpoint,) = pods["spec"]["podMetricsEndpoints"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "worker"} in endpoint[
        "relabelings"
    ]


def test_worker_triggers_match_the_worker_settings(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The demand trigger divides by the slots of one replica and reads the queues the
    workers serve; it activates at one job; workers may scale to zero."""
    queues = WorkerSettings.model_fields["worker_queues"].default
    for overlay in ("production", "production-postgresql"):
        objects = rendered[overlay]
        triggers = keda_triggers(objects)
        demand = triggers[("jobq-worker", "demand")]
        assert demand.threshold == DEFAULT_CONCURRENCY and demand.activation == 0
        assert demand.metric_type == "AverageValue"
        for trigger in triggers.values():
            if trigger.scaled_object == "jobq-worker":
                served = "|".join(queues) if isinstance(queues, list) else str(queues)
                assert f"'{served}'" in trigger.query or f'"{served}"' in trigger.query
        (worker,) = [
            s for s in _of(objects, "ScaledObject") if s["metadata"]["name"] == "jobq-worker"
        ]
        assert worker["spec"]["minReplicaCount"] == 0
        targets = {s["spec"]["scaleTargetRef"]["name"] for s in _of(objects, "ScaledObject")}
        assert targets == {d["metadata"]["name"] for d in _of(objects, "Deployment")}
    age = keda_triggers(rendered["production"])[("jobq-worker", "oldest-pending-age")]
    assert age.metric_type == "Value"
    for trigger in keda_triggers(rendered["production"]).values():
        assert trigger.query.endswith("or vector(0)"), "never empty on an idle queue"


def _trigger(metric_type: str, threshold: float) -> Trigger:
    return Trigger("w", "prometheus", "t", metric_type, "q", threshold, 0)


def test_hpa_desired_follows_the_documented_rule() -> None:
    demand = _trigger("AverageValue", 32)
    # 5,000 jobs on 2 x 32 slots: ceil(5000 / 32) = 157, capped at the maximum.
    assert hpa_desired(demand, 5000, 2, 0, 200) == 157
    assert hpa_desired(demand, 5000, 2, 0, 20) == 20
    assert hpa_desired(demand, 64, 2, 0, 20) == 2  # within tolerance
    assert hpa_desired(demand, 0, 3, 0, 20) == 1  # the HPA keeps one; KEDA goes to zero
    age = _trigger("Value", 30)
    assert hpa_desired(age, 90, 2, 0, 20) == 6
    assert hpa_desired(age, 31, 2, 0, 20) == 2
    with pytest.raises(ValueError):
        hpa_desired(age, 1, 0, 0, 20)


def _worker_queues(objects: list[dict[str, Any]], deployment: dict[str, Any]) -> set[str]:
    """The queues a worker Deployment serves: its WORKER_QUEUES, read from the ConfigMap its
    env entry names, as the worker parses it."""
    configmaps = {c["metadata"]["name"]: c.get("data", {}) for c in _of(objects, "ConfigMap")}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (entry,) = [e for e in container["env"] if e["name"] == "WORKER_QUEUES"]
    ref = entry["valueFrom"]["configMapKeyRef"]
    queues = split_queues(configmaps[ref["name"]][ref["key"]])
    assert isinstance(queues, list)
    return set(queues)


def test_worker_groups_select_only_their_own_pods_and_scale_on_their_own_queues(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """Every Deployment's and budget's selector matches its own pods and no other
    Deployment's (so two worker groups never adopt, count or spread each other's pods), and
    every worker ScaledObject's queries select exactly the queues of the group it scales."""
    for overlay, objects in rendered.items():
        deployments = _of(objects, "Deployment")
        for owner in deployments:
            for other in deployments:
                matches = _selects(
                    owner["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"]
                )
                assert matches == (owner is other), (
                    overlay,
                    owner["metadata"]["name"],
                    other["metadata"]["name"],
                )
        for budget in _of(objects, "PodDisruptionBudget"):
            covered = [
                d
                for d in deployments
                if _selects(budget["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
            ]
            assert len(covered) == 1, (overlay, budget["metadata"]["name"])
        workers = {
            d["metadata"]["name"]: d
            for d in deployments
            if d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            == "worker"
        }
        for scaled in _of(objects, "ScaledObject"):
            target = scaled["spec"]["scaleTargetRef"]["name"]
            if target not in workers:
                continue
            served = _worker_queues(objects, workers[target])
            for trigger in scaled["spec"]["triggers"]:
                query = trigger["metadata"]["query"]
                named = re.findall(r"queue=~\"([^\"]*)\"|queue = '([^']*)'", query)
                assert named, (overlay, target, trigger["name"])
                for regex, literal in named:
                    assert set((regex or literal).split("|")) == served, (overlay, target, query)
    example = rendered["example-worker-groups"]
    (emails,) = [
        d for d in _of(example, "Deployment") if d["metadata"]["name"] == "jobq-worker-emails"
    ]
    assert _worker_queues(example, emails) == {"email", "webhook"}
    scaled = {s["spec"]["scaleTargetRef"]["name"] for s in _of(example, "ScaledObject")}
    assert {"jobq-worker", "jobq-worker-emails"} <= scaled

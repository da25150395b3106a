"""`make compose-test`: infra/compose.yml on a real Docker engine, as a user runs it (README
"Compose test"). Standard library only, so it needs no virtualenv.

Steps (a progress line each, a timing table at the end; the first failure stops the run, and
the stack is always taken down):

 1. engine      Docker and Compose v2 installed and a daemon answering (infra/docker-engine.sh)
 2. versions    Compose v2 accepts the file, Compose 1.x refuses it (the top-level `name:`)
 3. stand-ins   the images compose would pull, built from Debian packages (tests/compose/standins)
 4. build       jobq's images from infra/Dockerfile (`docker compose build`)
 5. up          fresh volumes, `up --scale worker=3 --wait`: every service healthy or running,
                every volume a named one; the producer and the SQS endpoint ready on loopback
 6. jobs        500 jobs (noop, sleep, email to the compose mail sink) complete, on >= 2 workers
 7. targets     Prometheus has every service up and 3 workers
 8. scale       --scale worker=5, then 2: Prometheus follows
 9. kill        a worker killed while it holds jobs: none lost, and the lease-expiry burst
                fires JobqLeaseExpiriesSpiking the first time (its series existed at 0 before)
10. postgres    PostgreSQL restarted under load: none lost or doubled, no jobq container
                restarts, clients see 503 with Retry-After (or 504 outcome-unknown with the job
                id, retried with the same idempotency key) and never a 500
11. down        `stop` + `down -v` within 10 s, nothing SIGKILLed, no traceback in the queue
                service's log; no container, network or volume left
12. slow start  a fresh volume whose first start is slow (the temporary socket-only server up
                for 8 s): `up` still succeeds, also with a socket healthcheck (the migration
                waits for the database)
13. vanish      PostgreSQL stopped before the queue service (its container and address gone):
                the queue service still stops within its grace, without SIGKILL or traceback
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
COMPOSE_FILE = ROOT / "infra" / "compose.yml"
PROJECT = "jobq"
PRODUCER = "http://127.0.0.1:8080"
SQS = "http://127.0.0.1:9324"
PROMETHEUS = "http://127.0.0.1:9090"
STEPS = 13


class Failed(Exception):
    """A step's check did not hold; the message says what was seen."""


timings: list[tuple[str, float, str]] = []
env = dict(os.environ)
state: dict[str, Any] = {"engine": False}
created: set[str] = set()
"""Ids of every job the test created; each must end COMPLETED."""
EXPECTED = {("queue", "up"): 1, ("producer", "up"): 1, ("postgres", "up"): 1}
"""Prometheus targets besides the workers."""


@contextmanager
def step(number: int, name: str, what: str) -> Iterator[None]:
    """Print a progress line before and after the body and record its time."""
    print(f"compose-test: [{number:2d}/{STEPS}] {name}: {what} …", flush=True)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        timings.append((name, time.monotonic() - started, "FAILED"))
        raise
    took = time.monotonic() - started
    timings.append((name, took, "ok"))
    print(f"compose-test: [{number:2d}/{STEPS}] {name}: ok ({took:.1f} s)", flush=True)


def run(
    *args: str, check: bool = True, quiet: bool = True, timeout: float = 900, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run a command in the test's environment; its output is shown only when it fails."""
    done = subprocess.run(
        args, cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout, **kw
    )
    if not quiet:
        sys.stdout.write(done.stdout)
    if check and done.returncode != 0:
        raise Failed(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def compose(
    *args: str, files: tuple[Path, ...] = (), **kw: Any
) -> subprocess.CompletedProcess[str]:
    chosen = ("-f", str(COMPOSE_FILE), *(x for f in files for x in ("-f", str(f))))
    return run("docker", "compose", *chosen, *args, **kw)


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            raw = reply.read()
            return reply.status, dict(reply.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return exc.code, dict(exc.headers), parsed


def until(probe: Callable[[], Any], accept: Callable[[Any], bool], within: float, what: str) -> Any:
    """Poll `probe` every second until `accept(value)`; Failed with the last value after
    `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            value = probe()
        except (OSError, ValueError) as exc:
            value = exc
        if not isinstance(value, Exception) and accept(value):
            return value
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {within:.0f} s; last: {value!r}")
        time.sleep(1)


def promql(query: str) -> list[dict[str, Any]]:
    url = f"{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    status, _, body = http("GET", url)
    if status != 200:
        raise ValueError(f"{status} {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def targets() -> Counter[tuple[str, str]]:
    """Active Prometheus targets by (job, health)."""
    _, _, body = http("GET", f"{PROMETHEUS}/api/v1/targets?state=active")
    return Counter((t["labels"]["job"], t["health"]) for t in body["data"]["activeTargets"])


def psql(sql: str) -> str:
    return compose(
        "exec", "-T", "postgres", "psql", "-U", "jobq", "-d", "jobq", "-tAc", sql
    ).stdout.strip()


def job_counts() -> dict[str, int]:
    rows = psql("SELECT status, count(*) FROM job_all GROUP BY status")
    return {s: int(n) for s, n in (line.split("|") for line in rows.splitlines() if line)}


def submit(body: dict[str, Any], statuses: Counter[int] | None = None) -> str:
    """POST /jobs with an idempotency key, retried with the same key until created: after a
    503 (not created) and after a 504 `outcome-unknown` (the queue service did not answer in
    time, so the job may exist: the same key makes the retry a replay, never a second job)."""
    body = {**body, "idempotencyKey": body.get("idempotencyKey") or uuid.uuid4().hex}
    headers = {"Authorization": f"Bearer {env['JOBQ_KEY']}"}
    deadline = time.monotonic() + 120
    while True:
        try:
            status, reply_headers, reply = http("POST", f"{PRODUCER}/jobs", body, headers)
        except OSError:
            status, reply_headers, reply = 0, {}, None  # the connection itself failed
        if statuses is not None:
            statuses[status] += 1
        if status in (200, 202):
            created.add(str(reply["jobId"]))
            return str(reply["jobId"])
        if status == 503:
            if not any(k.lower() == "retry-after" for k in reply_headers):
                raise Failed(f"503 without Retry-After: {reply}")
        elif status == 504:
            problem = reply if isinstance(reply, dict) else {}
            if not str(problem.get("type", "")).endswith("outcome-unknown") or not problem.get(
                "jobId"
            ):
                raise Failed(f"504 that is not outcome-unknown with the job id: {reply}")
        elif status != 0:
            raise Failed(f"POST /jobs answered {status}: {reply}")
        if time.monotonic() > deadline:
            raise Failed(f"POST /jobs never succeeded; last {status} {reply}")
        time.sleep(0.2)


def submit_many(bodies: list[dict[str, Any]], statuses: Counter[int] | None = None) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda b: submit(b, statuses), bodies))


def all_completed(within: float) -> None:
    total = len(created)
    until(
        job_counts,
        lambda c: c.get("COMPLETED", 0) == total and sum(c.values()) == total,
        within,
        f"all {total} jobs COMPLETED (none lost, none dead-lettered)",
    )


def restart_counts() -> dict[str, int]:
    ids = compose("ps", "-q").stdout.split()
    if not ids:
        return {}
    inspected = json.loads(run("docker", "inspect", *ids).stdout)
    return {c["Name"].lstrip("/"): int(c["RestartCount"]) for c in inspected}


def project_leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {
        "containers": run("docker", "ps", "-aq", "--filter", label).stdout.split(),
        "networks": run("docker", "network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": run("docker", "volume", "ls", "-q").stdout.split(),
    }


def step_engine() -> None:
    """Docker engine and Compose v2."""
    exports = run(str(ROOT / "infra" / "docker-engine.sh"), "start").stdout
    for word in exports.split():
        if "=" in word:
            key, value = word.split("=", 1)
            env[key] = value
    state["engine"] = True
    env["DOCKER_BUILDKIT"] = "0"  # see README: no BuildKit frontend image to pull
    for line in run(sys.executable, "-m", "infra.devkeys").stdout.splitlines():
        if line.startswith("export "):
            key, value = line.removeprefix("export ").split("=", 1)
            env[key] = value.strip("'\"")
    env.pop("COMPOSE_FILE", None)
    env.pop("COMPOSE_PROJECT_NAME", None)


def step_versions() -> None:
    """Compose v2 accepts the file, Compose 1.x refuses it."""
    version = run("docker", "compose", "version", "--short").stdout.strip()
    if not version.lstrip("v").startswith("2."):
        raise Failed(f"docker compose is {version}, not v2")
    compose("config", "--quiet")
    old = run("docker-compose", "-f", str(COMPOSE_FILE), "config", check=False)
    old_version = run("docker-compose", "version", "--short", check=False).stdout.strip()
    if old.returncode == 0 or "name" not in old.stdout + old.stderr:
        raise Failed(f"Compose {old_version} did not refuse the file: {old.stderr}")
    print(f"    compose v{version.lstrip('v')}: ok; compose {old_version}: refused")


def step_stand_ins() -> None:
    """images compose would pull, from Debian packages."""
    run(str(HERE / "standins" / "build.sh"))


def step_build() -> None:
    """jobq's images from infra/Dockerfile."""
    # One service per image (migrate, queue, producer and worker share jobq:local): compose's
    # classic builder would otherwise build the same image four times at once.
    compose("build", "migrate", "smtp")


def step_up() -> None:
    """fresh volumes, up --scale worker=3 --wait."""
    compose("down", "-v", "--remove-orphans", "--timeout", "5")
    created.clear()
    compose("up", "-d", "--scale", "worker=3", "--wait", "--wait-timeout", "180")
    volumes = set(run("docker", "volume", "ls", "-q").stdout.split())
    named = {f"{PROJECT}_{v}" for v in ("pgdata", "redis", "prometheus", "grafana")}
    if volumes != named:
        raise Failed(f"volumes {sorted(volumes)}, expected only {sorted(named)}")
    for name, base in (("producer", PRODUCER), ("SQS endpoint", SQS)):
        status, _, body = http("GET", f"{base}/health/ready")
        if status != 200:
            raise Failed(f"{name} not ready: {status} {body}")


def step_jobs() -> None:
    """500 jobs (noop, sleep, email) complete on >= 2 workers."""
    bodies: list[dict[str, Any]] = []
    for i in range(500):
        if i % 5 == 0:
            payload = {"to": f"user{i}@example.com", "subject": f"compose test {i}"}
            bodies.append({"taskType": "email", "payload": payload})
        elif i % 5 in (1, 2):
            bodies.append({"taskType": "sleep", "payload": {"ms": 50 + i % 150}})
        else:
            bodies.append({"taskType": "noop", "payload": {"i": i}})
    submit_many(bodies)
    all_completed(180)
    busy = until(
        lambda: promql("sum by (instance) (jobq_worker_job_duration_seconds_count) > 0"),
        lambda r: len(r) >= 2,
        60,
        "jobs ran on at least 2 workers (Prometheus)",
    )
    print(f"    jobs ran on {len(busy)} workers")


def step_targets() -> None:
    """Prometheus: every service up, 3 workers."""
    until(
        targets,
        lambda t: t == Counter({**EXPECTED, ("worker", "up"): 3}),
        90,
        "targets",
    )


def step_scale() -> None:
    """--scale worker=5, then 2; Prometheus follows."""
    for n in (5, 2):
        compose("up", "-d", "--scale", f"worker={n}", "--no-recreate", "--wait")
        wanted = Counter({**EXPECTED, ("worker", "up"): n})
        until(targets, wanted.__eq__, 120, f"Prometheus finds {n} workers")


def step_kill() -> None:
    """kill -9 a busy worker: none lost, the lease alert fires."""
    # Before the burst: the series the alert reads (at 0 when the queue service seeds it).
    before = [float(x["value"][1]) for x in promql('jobq_lease_expired_total{queue="default"}')]
    submit_many([{"taskType": "sleep", "payload": {"ms": 20000}} for _ in range(60)])
    until(
        lambda: promql("jobq_worker_active_jobs > 5"),
        lambda r: len(r) >= 1,
        60,
        "a worker holding more than 5 jobs",
    )
    victim = promql("topk(1, jobq_worker_active_jobs)")[0]["metric"]["instance"]
    ip = victim.split(":")[0]
    for cid in compose("ps", "-q", "worker").stdout.split():
        inspected = json.loads(run("docker", "inspect", cid).stdout)[0]
        addresses = [n["IPAddress"] for n in inspected["NetworkSettings"]["Networks"].values()]
        if ip in addresses:
            run("docker", "kill", "--signal", "KILL", cid)
            print(f"    killed {inspected['Name'].lstrip('/')} ({victim})")
            break
    else:
        raise Failed(f"no worker container has {ip}")
    all_completed(180)
    until(
        lambda: promql('ALERTS{alertname="JobqLeaseExpiriesSpiking", alertstate="firing"}'),
        lambda r: len(r) >= 1,
        90,
        f"JobqLeaseExpiriesSpiking firing on the first burst (the series before it: {before})",
    )
    compose("up", "-d", "--scale", "worker=2", "--no-recreate", "--wait")


def step_postgres() -> None:
    """PostgreSQL restarted under load: 503s (or 504 outcome unknown), nothing lost or doubled."""
    restarts = restart_counts()
    statuses: Counter[int] = Counter()
    done = threading.Event()

    def load(client: int) -> None:
        n = 0
        while not done.is_set():
            submit({"taskType": "noop", "payload": {"client": client, "n": n}}, statuses)
            n += 1

    with concurrent.futures.ThreadPoolExecutor(8) as background:
        clients = [background.submit(load, c) for c in range(8)]
        time.sleep(1.0)
        compose("restart", "postgres")
        time.sleep(3.0)
        done.set()
        for client in clients:
            client.result(timeout=300)
    all_completed(180)
    after = restart_counts()
    if after != restarts:
        raise Failed(f"containers restarted: {restarts} -> {after}")
    # 0 would be a refused or dropped connection. A 504 (outcome unknown: sent, no answer in
    # time) is what a submit caught by the restart mid-insert gets; its retry with the same
    # idempotency key is a replay, and all_completed counts that no job was made twice.
    if set(statuses) - {200, 202, 503, 504}:
        raise Failed(f"answers during the restart: {dict(statuses)}")
    if not statuses[503]:
        raise Failed(f"no 503 seen during the restart: {dict(statuses)}")
    print(f"    answers during the restart: {dict(sorted(statuses.items()))}")


def step_down() -> None:
    """down -v within 10 s, nothing SIGKILLed, nothing left."""
    began = time.monotonic()
    ids = compose("ps", "-q").stdout.split()  # running now (not an earlier step's victim)
    compose("stop")
    killed = [
        c["Name"].lstrip("/")
        for c in json.loads(run("docker", "inspect", *ids).stdout)
        if c["State"]["ExitCode"] == 137
    ]
    queue_log = compose("logs", "queue").stdout
    compose("down", "-v", "--remove-orphans")
    took = time.monotonic() - began
    if killed:
        raise Failed(f"stopped by SIGKILL (over their grace): {killed}")
    for bad in ("Traceback", "never retrieved"):
        if bad in queue_log:
            at = queue_log.index(bad)
            line = queue_log.rfind("\n", 0, at) + 1
            raise Failed(f"queue service log at shutdown has {bad!r}:\n{queue_log[line:][:3000]}")
    left = project_leftovers()
    if any(left.values()):
        raise Failed(f"left behind: {left}")
    if took >= 10:
        raise Failed(f"stop + down -v took {took:.1f} s")
    print(f"    stop + down -v took {took:.1f} s")


def step_slow_start() -> None:
    """A slow first database start; up succeeds (the last stack stays up)."""
    slow = HERE / "slow-first-start.yml"
    socket_probe = HERE / "socket-healthcheck.yml"
    for files in ((slow,), (slow, socket_probe)):
        compose("up", "-d", "--scale", "worker=1", "--wait", "--wait-timeout", "180",
                files=files)  # fmt: skip
        logs = compose("logs", "postgres", "migrate", files=files).stdout
        if "temporary server on the unix socket only" not in logs:
            raise Failed("the stand-in's first start did not run its temporary server")
        waited = "waiting for the database" in logs
        names = "+".join(f.stem for f in files)
        print(f"    {names}: up ok; migrate waited for the database: {waited}")
        if files != (slow, socket_probe):  # the last stack stays up for the next step
            compose("down", "-v", "--remove-orphans", files=files)


def step_vanish() -> None:
    """PostgreSQL stopped first: the queue service still stops within its grace, cleanly."""
    # The stack of the step before, or a fresh one (its own compose file only).
    compose("up", "-d", "--scale", "worker=1", "--wait", "--wait-timeout", "180")
    time.sleep(2.0)
    compose("stop", "postgres")
    time.sleep(2.0)  # the workers and the producer keep calling the queue service
    began = time.monotonic()
    compose("stop", "queue")
    took = time.monotonic() - began
    ids = compose("ps", "-aq", "queue").stdout.split()
    [queue] = json.loads(run("docker", "inspect", *ids).stdout)
    log = compose("logs", "queue").stdout
    compose("down", "-v", "--remove-orphans")
    if queue["State"]["ExitCode"] == 137 or took >= 15:
        raise Failed(f"the queue service was SIGKILLed after {took:.1f} s (over its 15 s grace)")
    for bad in ("Traceback", "never retrieved"):
        if bad in log:
            raise Failed(f"queue service log has {bad!r} after {took:.1f} s:\n{log[-3000:]}")
    print(f"    the queue service stopped in {took:.1f} s (stop_grace_period 15 s)")


STEP_LIST = [
    ("engine", "Docker engine and Compose v2", step_engine),
    ("versions", "Compose v2 accepts the file, Compose 1.x refuses it", step_versions),
    ("stand-ins", "images compose would pull, from Debian packages", step_stand_ins),
    ("build", "jobq's images from infra/Dockerfile", step_build),
    ("up", "fresh volumes, up --scale worker=3 --wait", step_up),
    ("jobs", "500 jobs (noop, sleep, email) complete on >= 2 workers", step_jobs),
    ("targets", "Prometheus: every service up, 3 workers", step_targets),
    ("scale", "--scale worker=5, then 2; Prometheus follows", step_scale),
    ("kill", "kill -9 a busy worker: none lost, the lease alert fires", step_kill),
    ("postgres", "PostgreSQL restarted under load: 503s, nothing lost", step_postgres),
    ("down", "down -v within 10 s, nothing SIGKILLed, nothing left", step_down),
    ("slow start", "a slow first database start; up succeeds", step_slow_start),
    ("vanish", "PostgreSQL gone first: the queue service stops in its grace", step_vanish),
]


def main() -> int:
    """Run every step (or up to the first failure); always take the stack down."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keep-engine", action="store_true", help="leave the daemon running")
    parser.add_argument(
        "--keep-going", action="store_true", help="run the later steps after a failure"
    )
    args = parser.parse_args()
    started = time.monotonic()
    failures = []
    try:
        for number, (name, what, function) in enumerate(STEP_LIST, 1):
            try:
                with step(number, name, what):
                    function()
            except Failed as failure:
                print(f"compose-test: [{number:2d}/{STEPS}] {name}: FAILED: {failure}", flush=True)
                failures.append(name)
                if not args.keep_going or not state["engine"]:
                    break
    finally:
        if state["engine"]:
            if failures:
                print(compose("logs", "--tail", "30", check=False).stdout[-6000:])
            compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)
            if not args.keep_engine:
                run(str(ROOT / "infra" / "docker-engine.sh"), "stop", check=False)
        print("\ncompose-test: timings")
        print(f"  {'step':<12} {'seconds':>8}  result")
        for name, took, result in timings:
            print(f"  {name:<12} {took:>8.1f}  {result}")
        print(f"  {'total':<12} {time.monotonic() - started:>8.1f}")
    if failures:
        print(f"compose-test: FAILED: {', '.join(failures)}")
        return 1
    print("compose-test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Deployment files run the same commands as `make run` and the tests; `make run` reads no
env file it is not given, and env files stay out of git."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from infra.stack import LocalStack, free_ports

ROOT = Path(__file__).resolve().parents[2]


def procfile_commands() -> dict[str, list[str]]:
    commands = {}
    for line in (ROOT / "infra" / "Procfile").read_text().splitlines():
        name, _, command = line.partition(":")
        words = [w for w in command.split() if w != "env" and "=" not in w]
        commands[name.strip().rstrip("0123456789")] = words
    return commands


def test_compose_runs_the_procfile_commands() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())
    procfile = procfile_commands()
    for service in ("queue", "producer", "sqs", "worker"):
        assert compose["services"][service]["command"] == procfile[service], service
    assert compose["services"]["smtp"]["command"][:3] == procfile["smtp"]


def test_worker_stop_grace_covers_its_drain_budget() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())
    worker = compose["services"]["worker"]
    assert "ports" not in worker, "host ports would break --scale"
    grace = int(worker["stop_grace_period"].rstrip("s"))
    assert grace > 25, "must exceed WORKER_SHUTDOWN_GRACE (25 s) plus releasing jobs"


def test_every_jobq_image_command_is_one_the_tests_start() -> None:
    """Each compose service built from infra/Dockerfile runs a Procfile command (the e2e stack
    starts those) or the migration the test fixtures run (`alembic upgrade head`)."""
    compose = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())
    started = [*procfile_commands().values(), ["alembic", "upgrade", "head"]]
    on_our_image = {
        name: service["command"]
        for name, service in compose["services"].items()
        if "build" in service
    }
    assert set(on_our_image) == {"migrate", "queue", "producer", "sqs", "worker", "smtp"}
    for name, command in on_our_image.items():
        assert any(command[: len(s)] == s for s in started), f"{name}: {command}"


def test_dev_keys_gain_a_grafana_password_without_losing_the_others(tmp_path: Path) -> None:
    from infra.devkeys import load_or_create

    path = tmp_path / "dev.env"
    path.write_text("JOBQ_API_KEYS=admin:a,submit:s\nQUEUE_INTERNAL_TOKEN=t\nJOBQ_KEY=a\n")
    values = load_or_create(path)
    assert values["JOBQ_API_KEYS"] == "admin:a,submit:s" and values["QUEUE_INTERNAL_TOKEN"] == "t"
    assert len(values["GRAFANA_ADMIN_PASSWORD"]) >= 16
    assert load_or_create(path) == values, "kept in the file"


def test_compose_builds_the_runtime_image_and_the_sink_apart() -> None:
    compose = yaml.safe_load((ROOT / "infra" / "compose.yml").read_text())
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    targets = {
        name: service["build"]["target"]
        for name, service in compose["services"].items()
        if "build" in service
    }
    assert targets == {
        "migrate": "runtime",
        "queue": "runtime",
        "producer": "runtime",
        "sqs": "runtime",
        "worker": "runtime",
        "smtp": "smtp-sink",
    }
    for target in set(targets.values()):
        assert f" AS {target}\n" in dockerfile, f"infra/Dockerfile has no stage {target}"


def _make_run_honcho(*overrides: str) -> str:
    """The shell command `make run` starts its processes with (`env … honcho … start`), as
    `make -n` prints it with this interpreter's virtualenv."""
    venv = Path(sys.executable).parent.parent
    printed = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "run", f"VENV={venv}", *overrides],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    [command] = re.findall(r"^\s*(env .*?/honcho .*? start);", printed, flags=re.M)
    return command


def _run_probe(command: str, app: Path) -> str:
    """Run `command` in `app`, whose Procfile's one process prints what it was given."""
    (app / "infra").mkdir(parents=True)
    (app / "infra" / "Procfile").write_text(
        'probe: echo "SMTP_PORT=$SMTP_PORT LOG_FORMAT=$LOG_FORMAT PROBE=${JOBQ_PROBE:-unset}"\n'
    )
    result = subprocess.run(
        ["bash", "-c", command], cwd=app, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_make_run_reads_no_dotenv(tmp_path: Path) -> None:
    """honcho reads `.env` by default and its values win over what `make run` sets; the
    command `make run` uses reads no env file unless one is named."""
    (tmp_path / ".env").write_text("SMTP_PORT=1\nLOG_FORMAT=json\nJOBQ_PROBE=dotenv\n")
    output = _run_probe(_make_run_honcho(), tmp_path)
    assert "SMTP_PORT=2525 LOG_FORMAT=text PROBE=unset" in output, output


def test_make_run_reads_the_env_file_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "local.env").write_text("SMTP_PORT=2626\nJOBQ_PROBE=local\n")
    output = _run_probe(_make_run_honcho("RUN_ENV_FILE=local.env"), tmp_path)
    assert "SMTP_PORT=2626 LOG_FORMAT=text PROBE=local" in output, output


def test_env_files_are_git_ignored_and_the_example_is_not() -> None:
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", ".env", "infra/.env",
         "clients/python/.env", ".env.example"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    assert ignored == [".env", "infra/.env", "clients/python/.env"]


def test_make_keys_prints_the_keys_without_installing_anything() -> None:
    """`eval "$(make -s keys)"` is the README's first step after `make run`: it must not
    build the development environment to print three values (it did: `keys: install`)."""
    planned = subprocess.run(
        ["make", "-n", "-B", "keys"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "pip" not in planned and ".venv" not in planned, planned
    assert "infra.devkeys" in planned


def test_dev_keys_export_aws_variables_naming_the_admin_key() -> None:
    """`make -s keys` points boto3 and the AWS CLI at `make run`'s SQS endpoint: the access
    key id is the id jobq gives the admin key, the secret the key, the region the endpoint's."""
    from common.web.access import parse_api_keys
    from infra.devkeys import aws_variables
    from services.sqs.settings import SqsSettings

    key = "an-admin-key-0123456789"
    [caller] = parse_api_keys(f"admin:*:{key}").values()
    settings = SqsSettings()
    assert aws_variables(key) == {
        "AWS_ACCESS_KEY_ID": caller.key_id,
        "AWS_SECRET_ACCESS_KEY": key,
        "AWS_DEFAULT_REGION": settings.sqs_region,
        "AWS_ENDPOINT_URL_SQS": f"http://127.0.0.1:{settings.sqs_port}",
    }


def test_a_stack_gets_distinct_ports_nothing_listens_on(tmp_path: Path) -> None:
    """Each stack's ports come from one call that holds every socket until all are taken (a
    queue service and a producer were once handed the same port, one call at a time)."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    stack = LocalStack("postgresql://unused", "redis://unused", tmp_path, workers=8)
    taken = [stack.queue_port, stack.producer_port, stack.smtp_port, stack.sqs_port]
    assert len(set(taken + stack.metrics_ports)) == 12

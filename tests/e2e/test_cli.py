"""The `jobq` command line (jobq/cli.py) against a real stack, in process through Click's
runner, and once as the installed console script: submits one by one and in batches with
bad lines, reading, retry, cancel, redrive with its dry run, queue control, and the exit codes
and messages of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from infra.stack import LocalStack
from jobq.cli import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, cli


def jobq(stack: LocalStack, *args: str, code: int = 0, stdin: str | None = None) -> Result:
    """Run `jobq --url <producer> ARGS` in process; assert its exit code."""
    result = CliRunner().invoke(cli, ["--url", stack.producer, *args], input=stdin)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result


def lines(result: Result) -> list[Any]:
    """The JSON documents of a `--json` run's standard output, one a line."""
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def submitted(stack: LocalStack, *args: str, stdin: str | None = None) -> str:
    """`jobq --json submit ARGS`: the new job's id."""
    [reply] = lines(jobq(stack, "--json", "submit", *args, stdin=stdin))
    return str(reply["jobId"])


def wait_status(stack: LocalStack, job_id: str, status: str, within: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        [view] = lines(jobq(stack, "--json", "get", job_id))
        if view["status"] == status:
            return view
        assert time.monotonic() < deadline, f"{job_id} stayed {view['status']}, wanted {status}"
        time.sleep(0.05)


def test_submit_then_get_shows_the_job_completed(stack: LocalStack) -> None:
    key = f"cli-{uuid.uuid4()}"
    args = ["--json", "submit", "noop", "--payload", '{"n": 1}', "--idempotency-key", key]
    [created] = lines(jobq(stack, *args))
    assert created["status"] == "PENDING"
    # --wait answers once the job finished, without polling.
    [view] = lines(jobq(stack, "--json", "get", "--wait", "20", created["jobId"]))
    assert view["status"] == "COMPLETED"
    assert view["payload"] == {"n": 1} and view["idempotencyKey"] == key
    # The same key and request again: the same job, not a second one.
    [replayed] = lines(jobq(stack, *args))
    assert replayed["jobId"] == created["jobId"]
    shown = jobq(stack, "get", created["jobId"]).stdout
    assert "COMPLETED" in shown and '"n": 1' in shown


def test_payload_from_a_file_and_from_standard_input(stack: LocalStack, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"from": "file"}')
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    one = submitted(stack, "noop", "--queue", queue, "--payload", f"@{path}")
    two = submitted(stack, "noop", "--queue", queue, "--payload", "-", stdin='{"a": 2}')
    views = {job["id"]: job for job in lines(jobq(stack, "--json", "ls", "--queue", queue))}
    assert set(views) == {one, two}
    payloads = [lines(jobq(stack, "--json", "get", job_id))[0]["payload"] for job_id in views]
    assert sorted(payloads, key=str) == sorted([{"from": "file"}, {"a": 2}], key=str)


def test_a_batch_of_ten_thousand_lines_with_bad_ones(stack: LocalStack, tmp_path: Path) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"  # no worker serves it: the jobs stay PENDING
    good = [{"taskType": "noop", "queue": queue, "payload": {"i": i}} for i in range(9_995)]
    replay = {"taskType": "noop", "queue": queue, "payload": {"r": 1}, "idempotencyKey": "k-r"}
    bad = [
        "{not json",
        json.dumps({"taskType": "noop", "queue": queue, "payload": {}, "priority": 10**6}),
        json.dumps({"taskType": "", "queue": queue, "payload": {}}),
        json.dumps({"taskType": "noop", "queue": queue, "payload": [1]}),
    ]
    batch = tmp_path / "jobs.jsonl"
    rows = [json.dumps(job) for job in good[:5_000]] + bad[:2] + [json.dumps(replay)] * 2
    rows += ["", *bad[2:]] + [json.dumps(job) for job in good[5_000:]]
    batch.write_text("\n".join(rows) + "\n")

    result = jobq(stack, "--json", "submit", "--batch", str(batch), code=EXIT_REFUSED)
    [summary] = lines(result)
    assert summary["accepted"] == 9_996 and summary["replayed"] == 1
    assert summary["refused"] == 4
    refused_file = Path(summary["refusedFile"])
    assert refused_file == tmp_path / "jobs.jsonl.refused.jsonl"
    assert sorted(refused_file.read_text().splitlines()) == sorted(bad)
    reasons = " ".join(entry["reason"] for entry in summary["reasons"])
    assert "line 5001: not JSON" in reasons and "/priority" in reasons and "/payload" in reasons

    pending = lines(jobq(stack, "--json", "ls", "--queue", queue, "--status", "PENDING", "--all"))
    assert len(pending) == 9_996 and len({job["id"] for job in pending}) == 9_996


def test_a_batch_summary_for_people(stack: LocalStack, tmp_path: Path) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    batch = tmp_path / "few.jsonl"
    job = {"taskType": "noop", "queue": queue, "payload": {}, "idempotencyKey": "k-few"}
    batch.write_text(f"{json.dumps(job)}\n{json.dumps(job)}\n{{}}\n")
    refused = tmp_path / "out" / "fix-me.jsonl"
    refused.parent.mkdir()
    args = ["submit", "--batch", str(batch), "--refused", str(refused)]
    people = jobq(stack, *args, code=EXIT_REFUSED).stdout
    assert "accepted 1, replayed 1, refused 1" in people
    assert "1x line 3: /taskType: Object missing required field" in people.replace("`", "")
    assert f"refused lines written to {refused}" in people
    assert refused.read_text() == "{}\n"
    batch.write_text(json.dumps(job) + "\n")  # only good lines: exit 0, nothing written
    refused.unlink()
    assert "accepted 0, replayed 1, refused 0" in jobq(stack, *args).stdout
    assert not refused.exists()


def test_cancel_retry_and_listing(stack: LocalStack) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    ids = [submitted(stack, "noop", "--queue", queue, "--delay", "3600") for _ in range(3)]
    cancelled = lines(jobq(stack, "--json", "cancel", *ids))
    assert [view["status"] for view in cancelled] == ["CANCELLED"] * 3
    listed = lines(jobq(stack, "--json", "ls", "--queue", queue, "--status", "cancelled"))
    assert sorted(job["id"] for job in listed) == sorted(ids)
    assert len(lines(jobq(stack, "--json", "ls", "--queue", queue, "--limit", "2"))) == 2

    unknown = str(uuid.uuid4())
    result = jobq(stack, "retry", ids[0], unknown, code=EXIT_REFUSED)
    assert f"{ids[0]} PENDING" in result.stdout and f"{unknown}: Job not found" in result.stderr
    assert lines(jobq(stack, "--json", "get", ids[0]))[0]["status"] == "PENDING"
    table = jobq(stack, "ls", "--queue", queue).stdout
    assert "3 jobs" in table


def test_redrive_counts_first_then_moves(stack: LocalStack) -> None:
    task = f"nobody-runs-{uuid.uuid4().hex[:6]}"  # no processor: fails, one attempt
    ids = [submitted(stack, task, "--max-attempts", "1") for _ in range(3)]
    for job_id in ids:
        wait_status(stack, job_id, "DEAD_LETTER")
    dry = lines(jobq(stack, "--json", "redrive", "--task-type", task, "--dry-run"))
    assert dry == [{"dryRun": True, "count": 3}]
    assert all(lines(jobq(stack, "--json", "get", i))[0]["status"] == "DEAD_LETTER" for i in ids)
    assert (
        "would move 2"
        in jobq(stack, "redrive", "--task-type", task, "--dry-run", "--limit", "2").stdout
    )
    moved = lines(jobq(stack, "--json", "redrive", "--task-type", task, "--queue", "default"))
    assert moved == [{"dryRun": False, "count": 3}]


def test_pause_limits_weights_resume(stack: LocalStack) -> None:
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    jobq(stack, "submit", "noop", "--queue", queue, "--delay", "3600")
    [paused] = lines(jobq(stack, "--json", "pause", queue))
    assert paused["paused"] is True and paused["lastChange"]["what"] == "pause"
    limits = '{"webhook": {"concurrency": 20, "tenant_concurrency": 3, "rate": 50}}'
    [limited] = lines(jobq(stack, "--json", "limits", queue, limits))
    assert limited["limits"][0]["concurrency"] == 20 and limited["limits"][0]["rate"] == 50
    [weighted] = lines(jobq(stack, "--json", "weights", queue, "acme=3", "beta=0.5"))
    assert {w["tenant"]: w["weight"] for w in weighted["weights"]} == {"acme": 3, "beta": 0.5}
    shown = jobq(stack, "resume", queue).stdout
    assert f"{queue}: running" in shown and "limit webhook: concurrency 20" in shown
    assert "weight acme: 3.0" in shown

    refused = jobq(stack, "limits", queue, '{"webhook": {"concurrency": -1}}', code=EXIT_REFUSED)
    assert "Invalid input (422)" in refused.stderr and "/limits/0/concurrency" in refused.stderr
    missing = jobq(stack, "--json", "pause", f"never-{uuid.uuid4().hex[:8]}", code=EXIT_REFUSED)
    assert json.loads(missing.stderr)["type"] == "urn:jobq:problem:queue-not-found"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["get", "not-a-uuid"], "is not a job id"),
        (["submit", "noop", "--payload", "[1]"], "must be a JSON object"),
        (["submit", "noop", "--payload", "{"], "not JSON"),
        (["submit", "noop", "--payload", "@/nonexistent/payload.json"], "cannot read"),
        (["submit"], "missing TASK_TYPE"),
        (["submit", "noop", "--batch", "/nonexistent.jsonl"], "does not exist"),
        (["ls", "--status", "DONE"], "'DONE' is not one of"),
        (["ls", "--limit", "0"], "0 is not in the range"),
        (["weights", "q", "acme"], "is not TENANT=WEIGHT"),
        (["limits", "q", "[]"], "must be a JSON object"),
        (["--request-timeout", "0", "ls"], "not in the range"),
    ],
)
def test_bad_flags_are_usage_errors(stack: LocalStack, args: list[str], message: str) -> None:
    result = jobq(stack, *args, code=EXIT_USAGE)
    assert message in result.stderr and "Traceback" not in result.output


def test_the_server_refusing_and_the_server_missing(stack: LocalStack) -> None:
    refused = jobq(stack, "submit", "noop", "--priority", "1000000", code=EXIT_REFUSED)
    assert "error: Invalid input (422)" in refused.stderr and "/priority" in refused.stderr
    missing = jobq(stack, "--json", "get", str(uuid.uuid4()), code=EXIT_REFUSED)
    assert json.loads(missing.stderr)["status"] == 404
    gone = CliRunner().invoke(cli, ["--url", "http://127.0.0.1:9", "ls"])
    assert gone.exit_code == EXIT_UNREACHABLE and "unreachable" in gone.stderr
    bad_url = CliRunner().invoke(cli, ["--url", "ftp://x", "ls"])
    assert bad_url.exit_code == EXIT_USAGE and "not an http(s) URL" in bad_url.stderr


def test_profiles_and_environment(
    stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[profiles.local]\nurl = "{stack.producer}"\n[profiles.bad]\nurl = 1\n')
    monkeypatch.setenv("JOBQ_CONFIG", str(config))
    monkeypatch.setenv("JOBQ_URL", "http://127.0.0.1:9")  # the profile wins over it
    runner = CliRunner()
    assert runner.invoke(cli, ["--profile", "local", "--json", "ls", "--limit", "1"]).exit_code == 0
    assert runner.invoke(cli, ["ls"]).exit_code == EXIT_UNREACHABLE  # JOBQ_URL alone
    monkeypatch.setenv("JOBQ_URL", stack.producer)
    assert runner.invoke(cli, ["ls", "--limit", "1"]).exit_code == 0
    for name, message in [("bad", "must be strings"), ("none", "no profile 'none'")]:
        result = runner.invoke(cli, ["--profile", name, "ls"])
        assert result.exit_code == EXIT_USAGE and message in result.stderr
    config.write_text("[profiles.local\n")
    result = runner.invoke(cli, ["--profile", "local", "ls"])
    assert result.exit_code == EXIT_USAGE and "is not TOML" in result.stderr


def test_the_installed_console_script(stack: LocalStack) -> None:
    script = Path(sys.executable).parent / "jobq"
    done = subprocess.run(
        [str(script), "--url", stack.producer, "--json", "submit", "noop"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "PENDING"
    usage = subprocess.run([str(script), "nope"], capture_output=True, text=True, check=False)
    assert usage.returncode == EXIT_USAGE and "No such command 'nope'" in usage.stderr

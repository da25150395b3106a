"""The README's examples, executed in the order they are written, against the processes
`make run` starts, as a newcomer following the README would run them.

Every fenced block of README.md is marked with how it is checked (`<!-- readme-test: HOW -->`):
`run` blocks are executed (shell blocks command by command, in one shell state; Python blocks
as programs); `settings` blocks are parsed as the service parses them; `define` blocks are
executed as module code; the `register` block is loaded by a real worker through
`WORKER_PROCESSOR_MODULES`; `skip` blocks say why they cannot run here.

Shell commands run as written, with two substitutions a reader makes by hand: `<id>` and
`<handle>` become the job id and receipt handle of the latest reply that carried one, and
`localhost:8080`/`:8081` become the test stack's ports. Each `# → NNN` comment under a command is
checked: the status code, and any `"status":"…"` or `"moved":N` it names (a read is repeated
for up to 30 s until the job gets there, as a reader would look again).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from benchmark.database import admin_execute
from infra import devkeys
from infra.stack import ROOT, LocalStack
from services.queue.schedules import parse_schedules
from tests.conftest import template_copy

README = ROOT / "README.md"
MARKED = re.compile(
    r"<!-- readme-test: (?P<how>[a-z]+)(?::(?P<why>[^>]*))? -->\n"
    r"```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
FENCE = re.compile(r"^```\w*\n.*?^```", re.DOTALL | re.MULTILINE)
HOWS = {"run", "settings", "define", "register", "skip"}


@dataclass(frozen=True)
class Example:
    how: str
    why: str
    lang: str
    code: str
    line: int


def examples() -> list[Example]:
    """Every marked block of the README, in order."""
    text = README.read_text()
    return [
        Example(
            m["how"],
            (m["why"] or "").strip(),
            m["lang"],
            m["code"],
            text.count("\n", 0, m.start()) + 2,
        )
        for m in MARKED.finditer(text)
    ]


def test_every_readme_block_says_how_it_is_checked() -> None:
    text = README.read_text()
    marked = examples()
    assert len(FENCE.findall(text)) == len(marked), "a code block without a readme-test mark"
    assert {example.how for example in marked} <= HOWS
    assert all(e.why for e in marked if e.how != "run"), "say why a block is not run"
    assert sum(e.how == "register" for e in marked) == 1


@dataclass
class Command:
    text: str
    expected: str | None = None
    """The `# → …` comment under it, if any."""


def commands(code: str) -> list[Command]:
    """A shell block's commands: continuation lines (a trailing backslash, an open quote)
    joined, comments dropped except the `# →` line that says what a command answers."""
    found: list[Command] = []
    pending = ""
    for line in code.splitlines():
        if pending:
            pending += "\n" + line
        elif line.lstrip().startswith("#"):
            comment = line.lstrip().removeprefix("#").strip()
            if comment.startswith("→") and found and found[-1].expected is None:
                found[-1].expected = comment.removeprefix("→").strip()
            continue
        elif line.strip():
            pending = line
        if pending and not pending.endswith("\\") and pending.count("'") % 2 == 0:
            found.append(Command(re.sub(r"\s{2,}#[^'\"]*$", "", pending)))  # a trailing comment
            pending = ""
    assert not pending, f"an unfinished command: {pending!r}"
    return found


class Reader:
    """One reader's shell session: the state-setting lines run so far, the ids seen last."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.prelude: list[str] = ["set -euo pipefail"]
        self.last_id: str | None = None
        self.last_handle: str | None = None

    def _local(self, command: str) -> str:
        """The command with the README's ports replaced by the test stack's."""
        text = command.replace("localhost:8080", f"127.0.0.1:{self.stack.producer_port}")
        return text.replace("localhost:8081", f"127.0.0.1:{self.stack.queue_port}")

    def _script(self, command: str) -> str:
        text = self._local(command)
        if "<id>" in text:
            assert self.last_id, f"no job id seen before {command!r}"
            text = text.replace("<id>", self.last_id)
        if "<handle>" in text:
            assert self.last_handle, f"no receipt handle seen before {command!r}"
            text = text.replace("<handle>", self.last_handle)
        return "\n".join([*self.prelude, text])

    def _bash(self, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", script],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "MAKEFLAGS": ""},
        )

    def run(self, command: Command) -> None:
        word = command.text.split(None, 1)[0]
        if word == "curl":
            self._request(command)
            return
        done = self._bash(self._script(command.text), timeout=90)
        assert done.returncode == 0, f"{command.text!r} failed: {done.stderr}"
        if word in {"eval", "export"} or re.match(r"^[A-Z_]+=\(", command.text):
            self.prelude.append(self._local(command.text))  # e.g. JOBQ_URL=http://localhost:8080

    def _request(self, command: Command) -> None:
        deadline = time.monotonic() + 30
        while True:
            script = self._script(command.text) + " -w '\\n%{http_code}'"
            done = self._bash(script, timeout=60)
            assert done.returncode == 0, f"{command.text!r} failed: {done.stderr}"
            body, _, status = done.stdout.rpartition("\n")
            reply = json.loads(body) if body.strip() else None
            problem = _unmet(command.expected, int(status), reply)
            if problem is None or not command.text.startswith("curl -s localhost"):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a read: look again, as a reader would
        assert problem is None, f"{command.text!r}: {problem}; got {status} {body[:500]}"
        self._remember(reply)

    def _remember(self, reply: Any) -> None:
        if not isinstance(reply, dict):
            return
        if isinstance(reply.get("jobId"), str):
            self.last_id = reply["jobId"]
        jobs = reply.get("jobs")
        if isinstance(jobs, list) and jobs and isinstance(jobs[0], dict):
            self.last_id = jobs[0].get("id", self.last_id)
            self.last_handle = jobs[0].get("receiptHandle", self.last_handle)


def _unmet(expected: str | None, status: int, reply: Any) -> str | None:
    """What of the `# →` expectation the reply does not meet (None: all of it)."""
    if expected is None:
        return None if status < 400 else f"status {status} where the README expects success"
    code = re.match(r"(\d{3})\b", expected)
    if code and int(code[1]) != status:
        return f"status {status}, the README says {code[1]}"
    said = expected.split("(", 1)[0]  # what follows in parentheses is commentary
    top = reply if isinstance(reply, dict) else {}
    for word in re.findall(r'(?<![\w])"status":"(\w+)"', said):
        if top.get("status") != word:
            return f"status field {top.get('status')!r}, the README says {word!r}"
    for count in re.findall(r'"moved":(\d+)', said):
        if top.get("moved") != int(count):
            return f"moved {top.get('moved')!r}, the README says {count}"
    return None


@pytest.fixture(scope="module")
async def readme_database(postgres_base: str, template_database: str) -> AsyncIterator[str]:
    """A database of its own, migrated and empty, as a newcomer's first `make run` has: the
    examples count what they made (`"moved":1`), so nothing another test left may be there."""
    name = f"jobq_readme_{os.getpid()}"
    url = await template_copy(postgres_base, template_database, name)
    try:
        yield url
    finally:
        await admin_execute(postgres_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
async def readme_stack(
    readme_database: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalStack]:
    """The processes `make run` starts, with its settings and development keys, and the
    README's processor module on the worker's PYTHONPATH (as the README says to put it)."""
    [register] = [e for e in examples() if e.how == "register"]
    module = re.match(r"# (\S+\.py)\s+WORKER_PROCESSOR_MODULES=(\S+)", register.code)
    assert module, "the processor example names its file and WORKER_PROCESSOR_MODULES"
    app = tmp_path_factory.mktemp("app")
    (app / module[1]).parent.mkdir(parents=True, exist_ok=True)
    (app / module[1]).write_text(register.code)
    keys = devkeys.load_or_create()
    stack = LocalStack(
        readme_database,
        redis_url,
        tmp_path_factory.mktemp("readme"),
        environment={
            "JOBQ_API_KEYS": keys["JOBQ_API_KEYS"],
            "QUEUE_INTERNAL_TOKEN": keys["QUEUE_INTERNAL_TOKEN"],
            "WEBHOOK_ALLOWED_HOSTS": "localhost,127.0.0.1,::1",
            "WORKER_PROCESSOR_MODULES": module[2],
            "PYTHONPATH": f"{app}{os.pathsep}{ROOT}",
        },
    )
    stack.internal_token = keys["QUEUE_INTERNAL_TOKEN"]
    await stack.start()
    try:
        yield stack
    finally:
        stack.stop()


async def test_the_readme_examples_work_in_the_order_written(readme_stack: LocalStack) -> None:
    reader = Reader(readme_stack)
    keys = devkeys.load_or_create()
    ran = []
    for example in examples():
        where = f"README.md:{example.line}"
        if example.how == "run" and example.lang == "sh":
            for command in commands(example.code):
                reader.run(command)
        elif example.how == "run" and example.lang == "python":
            program = example.code.replace("http://127.0.0.1:8080", readme_stack.producer)
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", program],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                env={
                    **os.environ,
                    "JOBQ_KEY": keys["JOBQ_KEY"],
                    "DATABASE_URL": readme_stack.database_url,
                },
            )
            assert done.returncode == 0, f"{where}: {done.stderr}"
        elif example.how == "settings":
            [line] = [c.text for c in commands(example.code)]
            name, _, value = shlex.split(line)[0].partition("=")
            assert name == "QUEUE_SCHEDULES" and len(parse_schedules(value)) >= 1, where
        elif example.how == "define":
            namespace: dict[str, Any] = {}
            exec(compile(example.code, where, "exec"), namespace)
            defined = re.findall(r"^(?:async )?def (\w+)", example.code, re.MULTILINE)
            assert defined and all(callable(namespace.get(name)) for name in defined), where
        elif example.how == "register":
            await _processor_runs(readme_stack, keys["JOBQ_KEY"], example.code)
        ran.append(example.how)
    assert ran.count("run") >= 4


async def _processor_runs(stack: LocalStack, key: str, code: str) -> None:
    """The README's processor, loaded by the worker, runs its task type: a job with the
    payload it needs completes with its result, one without is dead-lettered at once."""
    task_type = re.search(r'registry\.register\("([^"]+)"', code)
    assert task_type, "the processor example registers a task type"
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack.producer, headers=headers) as client:
        good = await client.post("/jobs", json={"taskType": task_type[1], "payload": {"image": 1}})
        bad = await client.post("/jobs", json={"taskType": task_type[1], "payload": {}})
        assert good.status_code == bad.status_code == 202
        views = {}
        for reply, status in ((good, "COMPLETED"), (bad, "DEAD_LETTER")):
            deadline = time.monotonic() + 30
            while (view := (await client.get(f"/jobs/{reply.json()['jobId']}")).json())[
                "status"
            ] != status:
                assert time.monotonic() < deadline, view
                await asyncio.sleep(0.1)
            views[status] = view
    assert views["COMPLETED"]["result"] == {"width": 640}
    assert "image" in views["DEAD_LETTER"]["lastError"]

"""`infra.servers`: environment URL, then the machine's servers, then throwaway servers from the
distribution's tools, then a message saying how to get one.

The machine's own servers are never stopped here. The default ports are pointed at closed
ports to reach the later steps; postgresql-common's tools are replaced by stubs on a fake PATH
(they log their arguments and "start" the cluster on the real server's port), and one test
runs the real `pg_createcluster` on a private cluster of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import redis

from infra import servers
from infra.servers import ServerUnavailable, ensure_database, ensure_postgres, ensure_redis
from infra.stack import free_port, free_ports
from tests.conftest import _admin


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No URL in the environment, nothing on the default ports, an empty PATH; returns a
    state directory."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    pg_port, redis_port = free_ports(2)
    monkeypatch.setattr(servers, "DEFAULT_PG_PORT", pg_port)
    monkeypatch.setattr(servers, "DEFAULT_REDIS_PORT", redis_port)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    state = tmp_path / "state"
    state.mkdir()
    return state


STUB = """#!{python}
# A stand-in for postgresql-common's tools: logs each call, keeps the cluster list in JSON.
import json, os, sys
from pathlib import Path

here = Path({here!r})
name = Path(sys.argv[0]).name
call = {{"argv": [name, *sys.argv[1:]], "conf_root": os.environ.get("PG_CLUSTER_CONF_ROOT")}}
with (here / "calls.jsonl").open("a") as log:
    log.write(json.dumps(call) + "\\n")
listing = here / "clusters.json"
clusters = json.loads(listing.read_text()) if listing.exists() else []
if name == "pg_lsclusters":
    print(json.dumps(clusters))
elif name == "pg_createcluster":
    clusters.append({{"version": int(sys.argv[1]), "cluster": sys.argv[2], "port": {port!r},
                     "running": 1, "logfile": str(here / "postgres.log")}})
elif name == "pg_ctlcluster":
    for cluster in clusters:
        cluster["running"] = int(sys.argv[3] == "start")
listing.write_text(json.dumps(clusters))
"""


class Stubs:
    """postgresql-common stubs on PATH whose cluster 'runs' on `port` (a real server)."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        directory.mkdir()
        script = STUB.format(python=sys.executable, here=str(directory), port=str(port))
        for tool in ("pg_lsclusters", "pg_createcluster", "pg_ctlcluster"):
            path = directory / tool
            path.write_text(script)
            path.chmod(0o755)

    def calls(self) -> list[dict[str, Any]]:
        log = self.directory / "calls.jsonl"
        lines = log.read_text().splitlines() if log.exists() else []
        return [json.loads(line) for line in lines]

    def commands(self) -> list[list[str]]:
        """The calls that change something (every call but the listings)."""
        return [c["argv"] for c in self.calls() if c["argv"][0] != "pg_lsclusters"]

    def set_clusters(self, clusters: list[dict[str, Any]]) -> None:
        (self.directory / "clusters.json").write_text(json.dumps(clusters))


@pytest.fixture
def stubs(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, postgres_base: str
) -> Stubs:
    """Stubs first on PATH, and a fake /usr/lib/postgresql holding versions 9.6, 15 and 16."""
    port = urlsplit(postgres_base).port or 5432
    stubs = Stubs(tmp_path / "bin", port)
    monkeypatch.setenv("PATH", str(stubs.directory))
    versions = tmp_path / "lib-postgresql"
    for version in ("9.6", "15", "16"):
        (versions / version / "bin").mkdir(parents=True)
        (versions / version / "bin" / "postgres").touch()
    monkeypatch.setattr(servers, "PG_VERSIONS_DIR", versions)
    return stubs


# --------------------------------------------------------------------------------------------
# PostgreSQL


def test_database_url_is_used_without_its_database(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, postgres_base: str
) -> None:
    monkeypatch.setenv("DATABASE_URL", f"{postgres_base}/no_such_database?application_name=x")
    assert ensure_postgres(isolated) == postgres_base


def test_database_url_that_does_not_answer_is_named_without_its_password(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"postgresql://jobq:s3cret@127.0.0.1:{free_port()}/jobq"
    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(ServerUnavailable) as raised:
        ensure_postgres(isolated)
    message = str(raised.value)
    assert "DATABASE_URL=postgresql://jobq:***@127.0.0.1:" in message
    assert "s3cret" not in message


def test_database_url_of_another_kind_is_refused(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "mysql://root@127.0.0.1/jobq")
    with pytest.raises(ServerUnavailable, match="must start with postgresql://"):
        ensure_postgres(isolated)


def test_the_machines_server_comes_before_any_throwaway_one(
    stubs: Stubs, monkeypatch: pytest.MonkeyPatch, postgres_base: str
) -> None:
    port = urlsplit(postgres_base).port
    monkeypatch.setattr(servers, "DEFAULT_PG_PORT", port)
    assert ensure_postgres(stubs.directory) == f"postgresql://postgres@127.0.0.1:{port}"
    assert stubs.calls() == []


def test_nothing_found_says_how_to_get_postgresql(isolated: Path) -> None:
    with pytest.raises(ServerUnavailable) as raised:
        ensure_postgres(isolated)
    message = str(raised.value)
    assert "no pg_createcluster" in message
    assert "apt-get install postgresql" in message
    assert "DATABASE_URL" in message
    assert "docker compose -f infra/compose.yml up" in message


def test_a_throwaway_cluster_is_created_with_postgresql_common(
    stubs: Stubs, isolated: Path, postgres_base: str
) -> None:
    assert (
        ensure_postgres(isolated)
        == f"postgresql://postgres@127.0.0.1:{urlsplit(postgres_base).port}"
    )
    [create] = stubs.commands()
    assert create[:3] == ["pg_createcluster", "16", servers.CLUSTER_NAME]  # the newest version
    for flag in ("--start-conf=manual", "--encoding=UTF8", "--start", "--auth=trust"):
        assert flag in create
    for setting in ("fsync=off", "synchronous_commit=off", "full_page_writes=off"):
        assert create[create.index(setting) - 1] == "-o"
    assert create[create.index("--datadir") + 1] == str(isolated / "postgresql" / "16")
    # Root hands the cluster to the postgres OS user; anyone else owns it, socket included.
    if os.geteuid() == 0:
        assert create[create.index("--user") + 1] == "postgres"
    else:
        assert create[create.index("--socketdir") + 1] == str(isolated)
    # Every tool saw the state directory's own cluster list, never the machine's.
    assert {call["conf_root"] for call in stubs.calls()} == {str(isolated / "clusters")}


def test_a_throwaway_cluster_is_reused_and_restarted(stubs: Stubs, isolated: Path) -> None:
    ensure_postgres(isolated)
    ensure_postgres(isolated)
    assert [c[0] for c in stubs.commands()] == ["pg_createcluster"]  # reused, not recreated

    assert servers.stop_throwaway(isolated) == ["postgres"]
    assert stubs.commands()[-1] == ["pg_ctlcluster", "16", servers.CLUSTER_NAME, "stop"]
    assert servers.stop_throwaway(isolated) == []  # already stopped: nothing to do

    ensure_postgres(isolated)
    assert stubs.commands()[-1] == ["pg_ctlcluster", "16", servers.CLUSTER_NAME, "start"]


def test_a_failing_cluster_tool_is_reported_with_its_output(stubs: Stubs, isolated: Path) -> None:
    failing = stubs.directory / "pg_createcluster"
    failing.write_text(
        "#!/bin/sh\necho 'Error: cluster configuration already exists' >&2\nexit 1\n"
    )
    with pytest.raises(ServerUnavailable) as raised:
        ensure_postgres(isolated)
    assert "exited 1: Error: cluster configuration already exists" in str(raised.value)


def test_a_real_throwaway_cluster_starts_answers_stops_and_is_discarded(
    private_cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ensure_postgres(private_cluster)
    url = ensure_database(base, "jobq")

    async def settings() -> tuple[str, str]:
        connection = await asyncpg.connect(url)
        try:
            return (
                await connection.fetchval("SHOW fsync"),
                await connection.fetchval("SHOW server_encoding"),
            )
        finally:
            await connection.close()

    assert servers._run_async(settings) == ("off", "UTF8")
    assert ensure_postgres(private_cluster) == base  # found again, not created twice
    # Where no server of the machine's own held the default port, the throwaway took it: the
    # next start finds it by probing that port, and must not call it the machine's server.
    monkeypatch.setattr(servers, "DEFAULT_PG_PORT", urlsplit(base).port)
    capsys.readouterr()
    assert ensure_postgres(private_cluster) == base
    assert "using jobq's throwaway server on" in capsys.readouterr().err
    assert servers.stop_throwaway(private_cluster) == ["postgres"]
    assert servers._pg_probe(base) is not None  # stopped
    assert private_cluster.is_dir()  # data kept for a quick start
    assert servers.discard_throwaway(private_cluster) > 10 * 2**20
    assert not private_cluster.exists()


def test_ensure_database_creates_once(postgres_base: str) -> None:
    name = f"jobq_servers_test_{os.getpid()}"
    try:
        assert ensure_database(postgres_base, name) == f"{postgres_base}/{name}"
        assert ensure_database(postgres_base, name) == f"{postgres_base}/{name}"  # exists: fine
        assert servers._pg_probe(postgres_base, name) is None
    finally:
        servers._run_async(lambda: _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}"'))


@pytest.mark.parametrize("name", ["", "x" * 64])
def test_ensure_database_refuses_impossible_names(postgres_base: str, name: str) -> None:
    with pytest.raises(ValueError, match=r"1\.\.63 bytes"):
        ensure_database(postgres_base, name)


# --------------------------------------------------------------------------------------------
# Redis


def test_redis_url_is_used_without_its_database(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert ensure_redis(isolated) == redis_url.rsplit("/", 1)[0]


def test_redis_url_that_does_not_answer_is_an_error(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", f"redis://:pw@127.0.0.1:{free_port()}/0")
    with pytest.raises(ServerUnavailable, match=r"REDIS_URL=redis://:\*\*\*@127\.0\.0\.1"):
        ensure_redis(isolated)


def test_nothing_found_says_how_to_get_redis(isolated: Path) -> None:
    with pytest.raises(ServerUnavailable) as raised:
        ensure_redis(isolated)
    assert "no redis-server on PATH" in str(raised.value)
    assert "apt-get install redis-server" in str(raised.value)


def test_a_real_throwaway_redis_is_started_found_again_and_stopped(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = shutil.which("redis-server", path=os.defpath + ":/usr/local/bin:/usr/bin:/usr/sbin")
    assert real, "these tests need redis-server (apt-get install redis-server)"
    monkeypatch.setenv("PATH", str(Path(real).parent))
    first = free_port()
    monkeypatch.setattr(servers, "THROWAWAY_REDIS_PORTS", range(first, first + 3))
    url = ensure_redis(isolated)
    try:
        assert ensure_redis(isolated) == url  # found again by its working directory
        with redis.Redis.from_url(url) as client:
            assert client.config_get("save") == {"save": ""}  # keeps nothing on disk
    finally:
        stopped = servers.stop_throwaway(isolated)
    assert stopped == ["redis"]
    assert servers._redis_probe(url) is not None


# --------------------------------------------------------------------------------------------
# Command line


def test_env_prints_urls_for_the_shell(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    postgres_base: str,
    redis_url: str,
) -> None:
    name = f"jobq_servers_cli_{os.getpid()}"
    monkeypatch.setenv("DATABASE_URL", f"{postgres_base}/ignored")
    monkeypatch.setenv("REDIS_URL", redis_url)
    try:
        assert servers.main(["env", "--database", name]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines == [f"DATABASE_URL={postgres_base}/{name}", f"REDIS_URL={redis_url}"]
        assert servers._pg_probe(postgres_base, name) is None
    finally:
        servers._run_async(lambda: _admin(postgres_base, f'DROP DATABASE IF EXISTS "{name}"'))


def test_env_without_servers_exits_2_with_the_hint(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert servers.main(["--state-dir", str(isolated), "env"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error: PostgreSQL not found" in captured.err
    assert "apt-get install postgresql" in captured.err


def test_stop_leaves_the_machines_servers_alone(
    isolated: Path, capsys: pytest.CaptureFixture[str], redis_url: str
) -> None:
    assert servers.main(["--state-dir", str(isolated), "stop"]) == 0
    assert "no throwaway server running" in capsys.readouterr().err
    assert servers._redis_probe(redis_url) is None

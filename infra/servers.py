"""Find or start the PostgreSQL and Redis servers jobq needs (`make run`, the tests, benchmarks).

`ensure_postgres()` and `ensure_redis()` return the base URL of a server that answers, trying:

1. the environment variable (`DATABASE_URL` / `REDIS_URL`) when set: it must answer, else
   `ServerUnavailable` names the URL (password hidden);
2. the machine's own server on 127.0.0.1:5432 / 127.0.0.1:6379 (PostgreSQL as `postgres`,
   then as the current OS user);
3. a throwaway server kept in a state directory (default `/var/tmp/jobq-servers`), started on
   first use and reused by every later call, from any process, until `stop`:
   - PostgreSQL as a cluster of Debian's postgresql-common (`pg_createcluster`,
     `pg_ctlcluster`, `pg_lsclusters`), whose configuration lives in the state directory
     (`PG_CLUSTER_CONF_ROOT`), so the machine's own clusters are never listed or touched;
   - Redis as `redis-server`, daemonized without persistence, found again on its port by the
     working directory it reports;
4. otherwise `ServerUnavailable`, whose message says how to get a server.

Nothing here starts containers: with Docker, `docker compose -f infra/compose.yml up` brings
its own PostgreSQL and Redis. One progress line per step goes to stderr; passwords never do.

Command line (progress on stderr, results on stdout)::

    python -m infra.servers env [--database NAME]   # DATABASE_URL=… and REDIS_URL=… lines
    python -m infra.servers stop                    # stop the throwaway servers (data kept)

`env` prints `NAME=value` lines (values shell-quoted when needed), for
`eval "$(python -m infra.servers env)"`. Both exit with status 2 and the message of
`ServerUnavailable` when a server cannot be found, started or stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import getpass
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped, unused-ignore]
import redis

__all__ = [
    "DEFAULT_STATE_DIR",
    "ServerUnavailable",
    "ensure_database",
    "ensure_postgres",
    "ensure_redis",
    "main",
    "stop_throwaway",
]

DEFAULT_STATE_DIR = Path("/var/tmp/jobq-servers")
"""Where throwaway servers keep their configuration, data and logs."""

LOCAL_HOST = "127.0.0.1"
DEFAULT_PG_PORT = 5432
DEFAULT_REDIS_PORT = 6379
PG_SUPERUSER = "postgres"

CLUSTER_NAME = "jobq-throwaway"
"""Name of the throwaway PostgreSQL cluster (in the state directory's own cluster list)."""
PG_VERSIONS_DIR = Path("/usr/lib/postgresql")
"""Where Debian installs each PostgreSQL major version (`<version>/bin/postgres`)."""
THROWAWAY_REDIS_PORTS = range(56379, 56389)
"""Ports a throwaway Redis may take; the first free one is used, a running one is found here."""

CONNECT_TIMEOUT_S = 3.0
"""Seconds one connection attempt (probe) may take."""
START_TIMEOUT_S = 30.0
"""Seconds a freshly started server has to accept connections."""

PG_INSTALL_HINT = (
    "install PostgreSQL (Debian/Ubuntu: `sudo apt-get install postgresql`, which also runs a "
    "server on 5432; macOS: `brew install postgresql@15 && brew services start postgresql@15`), "
    "set DATABASE_URL to a server you run, or use Docker: "
    "`docker compose -f infra/compose.yml up`"
)
REDIS_INSTALL_HINT = (
    "install Redis (Debian/Ubuntu: `sudo apt-get install redis-server`; macOS: "
    "`brew install redis && brew services start redis`), set REDIS_URL to a server you run, "
    "or use Docker: `docker compose -f infra/compose.yml up`"
)

_T = TypeVar("_T")


class ServerUnavailable(RuntimeError):
    """No usable server: the message says what was tried and what to install or set."""


class _StartFailed(Exception):
    """A throwaway server could not be started (internal; becomes ServerUnavailable)."""


# --------------------------------------------------------------------------------------------
# Small helpers


def _progress(message: str) -> None:
    """Print one progress line to stderr."""
    print(message, file=sys.stderr, flush=True)


def _redact(url: str) -> str:
    """Return `url` with any password replaced by `***`, safe to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{netloc}"))


def _run_async(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run the coroutine made by `factory` to completion, even from inside a running loop
    (an async test fixture): then it runs on a fresh loop in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run a command and return its stdout; raise `_StartFailed` with its output on failure."""
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, env=env, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _StartFailed(f"`{shlex.join(argv)}` failed: {exc}") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise _StartFailed(f"`{shlex.join(argv)}` exited {result.returncode}: {output}")
    return result.stdout


def _state_dir(state_dir: Path | None) -> Path:
    """The absolute state directory, created traversable (0755) so a server's OS user can
    reach the data inside it."""
    path = (state_dir or DEFAULT_STATE_DIR).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        path.chmod(0o755)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`, so concurrent processes start one server, not two."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _throwaway(
    start: Callable[[Path], str], state_dir: Path | None, what: str, port: int, hint: str
) -> str:
    """`start(state_dir)`; when it fails, ServerUnavailable naming what was tried and `hint`."""
    try:
        return start(_state_dir(state_dir))
    except (_StartFailed, OSError) as exc:
        raise ServerUnavailable(
            f"{what} not found: nothing usable on {LOCAL_HOST}:{port} and no throwaway server "
            f"({exc}); {hint}"
        ) from exc


def _wait(probe: Callable[[], str | None], what: str, log: str) -> None:
    """Poll `probe` (None = answers) until it answers or `START_TIMEOUT_S` pass."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (reason := probe()) is not None:
        if time.monotonic() > deadline:
            raise _StartFailed(
                f"{what} not answering after {START_TIMEOUT_S:.0f} s ({reason}); see {log}"
            )
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# PostgreSQL


def _pg_split(url: str) -> tuple[str, str]:
    """Split a PostgreSQL URL into (base URL without database or query, database name or '').

    Accepts `postgresql://`, `postgres://` and `postgresql+asyncpg://`; the base always uses
    `postgresql://`. Raises ServerUnavailable for another scheme.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ServerUnavailable(f"DATABASE_URL must start with postgresql://, got {_redact(url)!r}")
    return urlunsplit(("postgresql", parts.netloc, "", "", "")), parts.path.strip("/")


async def _pg_check(base_url: str, database: str) -> None:
    conn = await asyncpg.connect(base_url, database=database, timeout=CONNECT_TIMEOUT_S)
    await conn.close(timeout=CONNECT_TIMEOUT_S)


def _pg_probe(base_url: str, database: str = "postgres") -> str | None:
    """None when PostgreSQL at `base_url` accepts a connection, else the reason.

    A missing `database` still counts as answering: the server authenticated us.
    """
    try:
        _run_async(lambda: _pg_check(base_url, database))
    except asyncpg.InvalidCatalogNameError:
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


def _cluster_env(state_dir: Path) -> dict[str, str]:
    """The environment that points postgresql-common's tools at the state directory's clusters
    (and keeps `pg_ctlcluster` from handing the cluster to systemd)."""
    return {**os.environ, "PG_CLUSTER_CONF_ROOT": str(state_dir / "clusters")}


def _throwaway_cluster(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The throwaway cluster as `pg_lsclusters --json` describes it, or None."""
    clusters = json.loads(_run(["pg_lsclusters", "--json"], env) or "[]")
    return next((c for c in clusters if c.get("cluster") == CLUSTER_NAME), None)


def _own_port(state_dir: Path | None) -> bool:
    """Whether the throwaway cluster of `state_dir` is the one running on `DEFAULT_PG_PORT`
    (then the server found there is jobq's own, not the machine's)."""
    path = (state_dir or DEFAULT_STATE_DIR).expanduser()
    if not (path / "clusters").is_dir() or shutil.which("pg_lsclusters") is None:
        return False
    try:
        cluster = _throwaway_cluster(_cluster_env(path.resolve()))
    except (_StartFailed, OSError, ValueError):
        return False
    if not cluster or not cluster.get("running"):
        return False
    return int(cluster.get("port", 0)) == DEFAULT_PG_PORT


def _newest_pg_version() -> str:
    """The newest PostgreSQL major version installed under `PG_VERSIONS_DIR`, e.g. '15'."""
    versions = [path.parent.parent.name for path in PG_VERSIONS_DIR.glob("*/bin/postgres")]
    if not versions:
        raise _StartFailed(f"no PostgreSQL server in {PG_VERSIONS_DIR}/<version>/bin")
    return max(versions, key=lambda v: tuple(int(n) for n in re.findall(r"\d+", v)))


def _start_throwaway_postgres(state_dir: Path) -> str:
    """Start (or find) the throwaway cluster with postgresql-common; return its base URL.

    The cluster `CLUSTER_NAME` is created on first use with trust authentication for the
    superuser `postgres`, UTF-8, manual start and durability off (`fsync`,
    `synchronous_commit`, `full_page_writes`), so a machine crash may lose it: keep nothing
    there you care about. Its data is `<state_dir>/postgresql/<version>`, its log
    `<state_dir>/postgres.log`; `pg_createcluster` picks the first free port from 5432 on. As
    root the cluster belongs to the `postgres` OS user (postgresql-common runs it as that user);
    otherwise to you, with its socket in the state directory. Raises `_StartFailed`.
    """
    if shutil.which("pg_createcluster") is None:
        raise _StartFailed("no pg_createcluster (Debian/Ubuntu's postgresql-common) on PATH")
    env = _cluster_env(state_dir)
    log = state_dir / "postgres.log"
    with _locked(state_dir / "postgres.lock"):
        cluster = _throwaway_cluster(env)
        if cluster is None:
            version = _newest_pg_version()
            _progress(
                f"postgres: creating throwaway cluster {version}/{CLUSTER_NAME} in {state_dir}"
            )
            owner = (
                ["--user", PG_SUPERUSER] if os.geteuid() == 0 else ["--socketdir", str(state_dir)]
            )
            _run(
                ["pg_createcluster", version, CLUSTER_NAME, *owner,
                 "--datadir", str(state_dir / "postgresql" / version), "--logfile", str(log),
                 "--start-conf=manual", "--encoding=UTF8", "--locale=C",
                 "-o", "fsync=off", "-o", "synchronous_commit=off", "-o", "full_page_writes=off",
                 "--start", "--", "--auth=trust", f"--username={PG_SUPERUSER}"],
                env,
            )  # fmt: skip
            cluster = _throwaway_cluster(env)
            if cluster is None:
                raise _StartFailed(f"pg_createcluster left no cluster {CLUSTER_NAME}")
        elif not cluster.get("running"):
            _progress(f"postgres: starting throwaway cluster {cluster['version']}/{CLUSTER_NAME}")
            _run(["pg_ctlcluster", str(cluster["version"]), CLUSTER_NAME, "start"], env)
        else:
            _progress(f"postgres: reusing throwaway cluster on {LOCAL_HOST}:{cluster['port']}")
    base_url = f"postgresql://{PG_SUPERUSER}@{LOCAL_HOST}:{int(cluster['port'])}"
    _wait(
        lambda: _pg_probe(base_url), "the throwaway PostgreSQL", cluster.get("logfile") or str(log)
    )
    return base_url


def ensure_postgres(state_dir: Path | None = None) -> str:
    """Return the base URL of a PostgreSQL server that answers, starting one if needed.

    The URL names no database, e.g. `postgresql://postgres@127.0.0.1:5432`; append `/<name>`
    or call `ensure_database`. Order: `DATABASE_URL` (its database and query dropped), a server
    on 127.0.0.1:5432 (as `postgres`, then as the current OS user), the throwaway cluster in
    `state_dir` (default `DEFAULT_STATE_DIR`). A probe waits at most `CONNECT_TIMEOUT_S`
    seconds, a fresh server `START_TIMEOUT_S`.

    Raises ServerUnavailable when `DATABASE_URL` is set but does not answer, or when no server
    can be found or started (the message says how to get one).
    """
    env_url = os.environ.get("DATABASE_URL", "").strip()
    if env_url:
        base, database = _pg_split(env_url)
        reason = _pg_probe(base, database or "postgres")
        if reason is not None:
            raise ServerUnavailable(
                f"PostgreSQL at DATABASE_URL={_redact(env_url)} does not answer ({reason}): "
                "start that server, fix the URL, or unset DATABASE_URL to find or start one"
            )
        _progress(f"postgres: using the DATABASE_URL server {_redact(base)}")
        return base

    users, reasons = [PG_SUPERUSER], []
    with contextlib.suppress(Exception):  # getpass fails for a uid without a name
        users += [getpass.getuser()] if getpass.getuser() != PG_SUPERUSER else []
    for user in users:
        base = f"postgresql://{user}@{LOCAL_HOST}:{DEFAULT_PG_PORT}"
        reason = _pg_probe(base)
        if reason is None:
            whose = "jobq's throwaway server" if _own_port(state_dir) else "the server"
            _progress(f"postgres: using {whose} on {LOCAL_HOST}:{DEFAULT_PG_PORT} as {user}")
            return base
        reasons.append(f"as {user}: {reason}")
    _progress(f"postgres: none on {LOCAL_HOST}:{DEFAULT_PG_PORT} ({'; '.join(reasons)})")
    return _throwaway(
        _start_throwaway_postgres, state_dir, "PostgreSQL", DEFAULT_PG_PORT, PG_INSTALL_HINT
    )


async def _create_database(base_url: str, name: str) -> bool:
    """Create database `name` unless it exists; True when it was created."""
    conn = await asyncpg.connect(base_url, database="postgres", timeout=CONNECT_TIMEOUT_S)
    try:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        quoted = '"' + name.replace('"', '""') + '"'
        try:
            await conn.execute(f"CREATE DATABASE {quoted}")
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            return False  # created concurrently by another process
        return True
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


def ensure_database(base_url: str, name: str) -> str:
    """Create database `name` on the server at `base_url` if missing; return `base_url/name`.

    `base_url` is what `ensure_postgres` returns (no database). Connects to the `postgres`
    maintenance database (at most `CONNECT_TIMEOUT_S` seconds). Raises ValueError for an empty
    name or one longer than 63 bytes, ServerUnavailable when the server cannot be reached or
    the user may not create databases.
    """
    if not name or len(name.encode()) > 63:
        raise ValueError(f"database name must be 1..63 bytes, got {name!r}")
    base, _ = _pg_split(base_url)
    try:
        created = _run_async(lambda: _create_database(base, name))
    except asyncpg.InsufficientPrivilegeError as exc:
        raise ServerUnavailable(
            f"cannot create database {name!r} on {_redact(base)}: {exc}; create it yourself "
            f"(`createdb {shlex.quote(name)}`) or grant the user CREATEDB"
        ) from exc
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise ServerUnavailable(f"cannot reach PostgreSQL at {_redact(base)}: {exc}") from exc
    if created:
        _progress(f"postgres: created database {name}")
    return base_url.rstrip("/") + "/" + name


# --------------------------------------------------------------------------------------------
# Redis


def _redis_client(url: str) -> redis.Redis:
    """A Redis client for `url` with short timeouts."""
    return redis.Redis.from_url(
        url, socket_timeout=CONNECT_TIMEOUT_S, socket_connect_timeout=CONNECT_TIMEOUT_S
    )


def _redis_probe(url: str) -> str | None:
    """None when Redis at `url` answers PING, else the reason."""
    try:
        with _redis_client(url) as client:
            client.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _redis_base(url: str) -> str:
    """`url` without its database path or query: `redis://[user:pw@]host:port`."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ServerUnavailable(f"REDIS_URL must start with redis://, got {_redact(url)!r}")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _redis_dir(port: int) -> Path | None:
    """The working directory of the Redis on 127.0.0.1:`port`, or None when none answers."""
    try:
        with _redis_client(f"redis://{LOCAL_HOST}:{port}") as client:
            served = client.config_get("dir").get("dir")
    except Exception:
        return None
    return Path(served.decode() if isinstance(served, bytes) else str(served)).resolve()


def _port_free(port: int) -> bool:
    """True when a listener could bind 127.0.0.1:`port` now."""
    with socket.socket() as sock:
        try:
            sock.bind((LOCAL_HOST, port))
        except OSError:
            return False
    return True


def _start_throwaway_redis(state_dir: Path) -> str:
    """Start (or find) the throwaway `redis-server`; return its URL (no database).

    It runs daemonized on the first free port of `THROWAWAY_REDIS_PORTS`, bound to 127.0.0.1,
    without persistence, with `state_dir` as its working directory and `<state_dir>/redis.log`
    as its log; a later call finds it by that directory. Raises `_StartFailed`.
    """
    server = shutil.which("redis-server")
    if server is None:
        raise _StartFailed("no redis-server on PATH")
    log = state_dir / "redis.log"
    with _locked(state_dir / "redis.lock"):
        for port in THROWAWAY_REDIS_PORTS:
            if _redis_dir(port) == state_dir:
                _progress(f"redis: reusing throwaway server on {LOCAL_HOST}:{port}")
                return f"redis://{LOCAL_HOST}:{port}"
        port = next((p for p in THROWAWAY_REDIS_PORTS if _port_free(p)), 0)
        if not port:
            raise _StartFailed(f"no free port in {THROWAWAY_REDIS_PORTS}")
        _progress(f"redis: starting throwaway server on {LOCAL_HOST}:{port} (log {log})")
        _run(
            [server, "--port", str(port), "--bind", LOCAL_HOST, "--daemonize", "yes",
             "--save", "", "--appendonly", "no", "--dir", str(state_dir),
             "--logfile", str(log), "--pidfile", str(state_dir / "redis.pid")]
        )  # fmt: skip
    url = f"redis://{LOCAL_HOST}:{port}"
    _wait(lambda: _redis_probe(url), "the throwaway Redis", str(log))
    return url


def ensure_redis(state_dir: Path | None = None) -> str:
    """Return the URL of a Redis server that answers, e.g. `redis://127.0.0.1:6379`.

    The URL names no database number; append `/0` for a client. Order: `REDIS_URL` (its
    database path dropped), a server on 127.0.0.1:6379, the throwaway `redis-server` of
    `state_dir` (default `DEFAULT_STATE_DIR`). A probe waits at most `CONNECT_TIMEOUT_S` s.

    Raises ServerUnavailable when `REDIS_URL` is set but does not answer, or when no server can
    be found or started (the message says how to get one).
    """
    env_url = os.environ.get("REDIS_URL", "").strip()
    if env_url:
        base = _redis_base(env_url)
        reason = _redis_probe(env_url)
        if reason is not None:
            raise ServerUnavailable(
                f"Redis at REDIS_URL={_redact(env_url)} does not answer ({reason}): "
                "start that server, fix the URL, or unset REDIS_URL to find or start one"
            )
        _progress(f"redis: using the REDIS_URL server {_redact(base)}")
        return base

    default = f"redis://{LOCAL_HOST}:{DEFAULT_REDIS_PORT}"
    reason = _redis_probe(default)
    if reason is None:
        _progress(f"redis: using the server on {LOCAL_HOST}:{DEFAULT_REDIS_PORT}")
        return default
    _progress(f"redis: none on {LOCAL_HOST}:{DEFAULT_REDIS_PORT} ({reason})")
    return _throwaway(
        _start_throwaway_redis, state_dir, "Redis", DEFAULT_REDIS_PORT, REDIS_INSTALL_HINT
    )


# --------------------------------------------------------------------------------------------
# Stopping


def stop_throwaway(state_dir: Path | None = None) -> list[str]:
    """Stop the throwaway servers of `state_dir`; return what was stopped (`postgres`, `redis`).

    Only servers started there are touched: the cluster in the state directory's own cluster
    list, a Redis whose working directory it is; never the machine's own. Data is kept, so the
    next start is quick (`pg_dropcluster` with `PG_CLUSTER_CONF_ROOT=<state_dir>/clusters`
    discards the cluster). Raises ServerUnavailable when a stop command fails.
    """
    path = (state_dir or DEFAULT_STATE_DIR).expanduser().resolve()
    stopped: list[str] = []
    if not path.is_dir():
        return stopped
    try:
        if shutil.which("pg_lsclusters"):
            env = _cluster_env(path)
            cluster = _throwaway_cluster(env)
            if cluster is not None and cluster.get("running"):
                _run(["pg_ctlcluster", str(cluster["version"]), CLUSTER_NAME, "stop"], env)
                stopped.append("postgres")
        for port in THROWAWAY_REDIS_PORTS:
            if _redis_dir(port) == path:
                client = _redis_client(f"redis://{LOCAL_HOST}:{port}")
                with client, contextlib.suppress(redis.ConnectionError):  # it closes as it goes
                    client.shutdown(nosave=True)
                stopped.append("redis")
    except (_StartFailed, OSError, ValueError) as exc:
        raise ServerUnavailable(f"could not stop the throwaway servers in {path}: {exc}") from exc
    return stopped


def discard_throwaway(state_dir: Path | None = None) -> int:
    """Stop the throwaway servers of `state_dir` and delete it with their data; return the
    bytes freed. The machine's own servers are never touched. Raises ServerUnavailable."""
    path = (state_dir or DEFAULT_STATE_DIR).expanduser().resolve()
    stop_throwaway(path)
    if not path.is_dir():
        return 0
    freed = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    try:
        if shutil.which("pg_lsclusters"):
            env = _cluster_env(path)
            cluster = _throwaway_cluster(env)
            if cluster is not None:
                _run(["pg_dropcluster", str(cluster["version"]), CLUSTER_NAME], env)
        shutil.rmtree(path)
    except (_StartFailed, OSError, ValueError) as exc:
        raise ServerUnavailable(f"could not delete the throwaway servers in {path}: {exc}") from exc
    return freed


# --------------------------------------------------------------------------------------------
# Command line


def _env_lines(database: str | None, state_dir: Path | None) -> list[str]:
    """The `DATABASE_URL=…` and `REDIS_URL=…` lines for `env` (the database created)."""
    env_db_url = os.environ.get("DATABASE_URL", "").strip()
    env_redis_url = os.environ.get("REDIS_URL", "").strip()
    name = database or (_pg_split(env_db_url)[1] if env_db_url else "") or "jobq"
    database_url = ensure_database(ensure_postgres(state_dir), name)
    redis_db = urlsplit(env_redis_url).path.strip("/") if env_redis_url else ""
    redis_url = f"{ensure_redis(state_dir)}/{redis_db or '0'}"
    return [f"DATABASE_URL={shlex.quote(database_url)}", f"REDIS_URL={shlex.quote(redis_url)}"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (2 when a server is unavailable)."""
    parser = argparse.ArgumentParser(
        prog="python -m infra.servers", description="Find or start PostgreSQL and Redis for jobq."
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=f"where throwaway servers live (default {DEFAULT_STATE_DIR})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print DATABASE_URL=… and REDIS_URL=… lines")
    env.add_argument(
        "--database",
        default=None,
        help="database to create and name in DATABASE_URL "
        "(default: the one in DATABASE_URL, else jobq)",
    )
    sub.add_parser("stop", help="stop the throwaway servers of the state dir (data kept)")
    sub.add_parser("discard", help="stop them and delete the state dir with their data")
    args = parser.parse_args(argv)
    try:
        if args.command == "env":
            print("\n".join(_env_lines(args.database, args.state_dir)), flush=True)
        elif args.command == "discard":
            freed = discard_throwaway(args.state_dir)
            _progress(f"deleted the throwaway servers' data: {freed / 2**20:.0f} MiB freed")
        else:
            stopped = stop_throwaway(args.state_dir)
            _progress(
                f"stopped: {', '.join(stopped)}" if stopped else "no throwaway server running"
            )
    except ServerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

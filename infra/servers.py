"""Find or start the PostgreSQL and Redis servers jobq needs (for `make run` and the tests).

`ensure_postgres()` and `ensure_redis()` return a base URL for a server that answers, trying in
order:

1. the environment variable (`DATABASE_URL` / `REDIS_URL`) when set: it must answer, else
   `ServerUnavailable` names the URL;
2. a server already answering on 127.0.0.1:5432 / 127.0.0.1:6379;
3. a throwaway server started from local binaries (`initdb`/`pg_ctl`, `redis-server`), kept
   running in a state directory (default `/var/tmp/jobq-servers`) and reused by later calls;
4. a testcontainers container, only when a Docker daemon answers;
5. otherwise `ServerUnavailable`, whose message says what to install.

One progress line per step goes to stderr. Passwords are never printed.

Command line (progress on stderr, results on stdout)::

    python -m infra.servers env [--database NAME]   # DATABASE_URL=… and REDIS_URL=… lines
    python -m infra.servers stop                    # stop the throwaway servers started here

`env` prints plain `NAME=value` lines (values shell-quoted when needed); use them with
`set -a; eval "$(python -m infra.servers env)"; set +a`. It exits with status 2 and the
message of `ServerUnavailable` when a server cannot be found or started.
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
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit, urlunsplit

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
"""Where throwaway servers keep their data, logs and port files."""

LOCAL_HOST = "127.0.0.1"
DEFAULT_PG_PORT = 5432
DEFAULT_REDIS_PORT = 6379
THROWAWAY_PG_PORT = 55432
"""First port tried for a throwaway PostgreSQL; the next free one is used."""
THROWAWAY_REDIS_PORT = 56379
"""First port tried for a throwaway Redis; the next free one is used."""

CONNECT_TIMEOUT_S = 3.0
"""Seconds one connection attempt (probe) may take."""
START_TIMEOUT_S = 30.0
"""Seconds a freshly started server has to accept connections."""
PORT_SEARCH_SPAN = 100
"""How many consecutive ports are tried when looking for a free one."""

PG_SUPERUSER = "postgres"
PG_OS_USER = "postgres"
"""The OS account that runs a throwaway PostgreSQL when this process is root."""

PG_INSTALL_HINT = (
    "install it (Debian/Ubuntu: `apt-get install postgresql`; "
    "macOS: `brew install postgresql@15`) or set DATABASE_URL to a server you run"
)
REDIS_INSTALL_HINT = (
    "install it (Debian/Ubuntu: `apt-get install redis-server`; "
    "macOS: `brew install redis`) or set REDIS_URL to a server you run"
)

_T = TypeVar("_T")
_CONTAINERS: list[Any] = []
"""testcontainers containers started by this process, kept referenced for its lifetime."""


class ServerUnavailable(RuntimeError):
    """No usable server: the message says what was tried and what to install or set."""


class _StartFailed(Exception):
    """A throwaway server could not be started (internal; the next step is tried)."""


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
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _host_port(url: str) -> str:
    """Return `host:port` of `url` for progress messages."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def _run_async(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run the coroutine made by `factory` to completion, even from inside a running loop.

    From synchronous code this is `asyncio.run`; when an event loop already runs in this thread
    (an async test fixture), the coroutine runs on a fresh loop in a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:`port` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers themselves, ignore TIME_WAIT leftovers of a previous run.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOCAL_HOST, port))
        except OSError:
            return False
    return True


def _free_port(start: int) -> int:
    """Return the first free TCP port on 127.0.0.1 from `start` on; raises `_StartFailed`."""
    for port in range(start, start + PORT_SEARCH_SPAN):
        if _port_is_free(port):
            return port
    raise _StartFailed(f"no free port in {start}..{start + PORT_SEARCH_SPAN - 1}")


def _prepare_state_dir(state_dir: Path) -> Path:
    """Create `state_dir` (world-traversable, mode 0755) and return its absolute path."""
    state_dir = state_dir.expanduser().resolve()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        if state_dir.stat().st_uid == os.geteuid():
            state_dir.chmod(0o755)
    except OSError as exc:
        raise _StartFailed(f"cannot use state dir {state_dir}: {exc}") from exc
    return state_dir


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) so processes start one server."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_state(path: Path) -> dict[str, Any]:
    """Read a JSON state file; an absent or unreadable one is `{}`."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON state file atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log file, indented, or '' when there is none."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join("    " + line for line in text)


def _run(
    cmd: Sequence[str], *, cwd: Path, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `cmd`, capturing output; raise `_StartFailed` (with its output) when it fails."""
    try:
        result = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _StartFailed(f"`{shlex.join(cmd)}` failed: {exc}") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise _StartFailed(f"`{shlex.join(cmd)}` exited {result.returncode}: {output}")
    return result


def _docker_answers() -> bool:
    """True when a Docker daemon answers a ping within ~2 s (the CLI alone is not enough).

    Without DOCKER_HOST the default socket is tried first: when nothing listens there the SDK
    is not called at all (its failed version check leaks a socket, a ResourceWarning).
    """
    docker_host = os.environ.get("DOCKER_HOST", "")
    if not docker_host or docker_host.startswith("unix://"):
        path = docker_host.removeprefix("unix://") or "/var/run/docker.sock"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2)
                sock.connect(path)
        except OSError:
            return False
    try:
        import docker  # type: ignore[import-untyped, unused-ignore]

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


# --------------------------------------------------------------------------------------------
# PostgreSQL


def _pg_base(parts: SplitResult) -> str:
    """Rebuild a `postgresql://` base URL (no database, no query) from split URL parts."""
    return urlunsplit(("postgresql", parts.netloc, "", "", ""))


def _pg_split(url: str) -> tuple[str, str]:
    """Split a PostgreSQL URL into (base URL, database name or '').

    Accepts `postgresql://`, `postgres://` and `postgresql+asyncpg://`; the base always uses
    `postgresql://`. Raises ServerUnavailable for another scheme.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ServerUnavailable(f"DATABASE_URL must start with postgresql://, got {_redact(url)!r}")
    return _pg_base(parts), parts.path.strip("/")


async def _pg_check(base_url: str, database: str) -> None:
    """Connect to `database` on `base_url` and run `SELECT 1`; raise what asyncpg raises."""
    conn = await asyncpg.connect(base_url, database=database, timeout=CONNECT_TIMEOUT_S)
    try:
        await conn.fetchval("SELECT 1", timeout=CONNECT_TIMEOUT_S)
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


def _pg_probe(base_url: str, database: str = "postgres") -> str | None:
    """Return None when PostgreSQL at `base_url` accepts a connection, else the reason.

    A missing `database` still counts as answering: the server authenticated us.
    """
    try:
        _run_async(lambda: _pg_check(base_url, database))
    except asyncpg.InvalidCatalogNameError:
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


async def _pg_data_directory(base_url: str) -> str:
    """Return the server's `data_directory` setting."""
    conn = await asyncpg.connect(base_url, database="postgres", timeout=CONNECT_TIMEOUT_S)
    try:
        return str(await conn.fetchval("SHOW data_directory"))
    finally:
        await conn.close(timeout=CONNECT_TIMEOUT_S)


def _pg_serves(base_url: str, datadir: Path) -> bool:
    """True when the server at `base_url` answers and runs from `datadir` (so it is ours)."""
    try:
        served = _run_async(lambda: _pg_data_directory(base_url))
    except Exception:
        return False
    return os.path.realpath(served) == os.path.realpath(datadir)


def _pg_bindir() -> Path:
    """Find the directory holding `initdb` and `pg_ctl`; raise `_StartFailed` if none.

    Tries `pg_config --bindir` (which may name a directory without the server on Debian),
    then the newest `/usr/lib/postgresql/<version>/bin`, then `initdb`/`pg_ctl` on PATH.
    """

    def usable(bindir: Path) -> bool:
        return (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file()

    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out and usable(Path(out)):
                return Path(out)

    def version_key(path: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path.parent.name))

    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version_key, reverse=True)
    for bindir in debian:
        if usable(bindir):
            return bindir
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(os.path.realpath(pg_ctl)).parent
    raise _StartFailed("no PostgreSQL server binaries (initdb, pg_ctl) found")


def _pg_major(bindir: Path) -> str:
    """The major version of the binaries in `bindir`, e.g. '15' (from `pg_ctl --version`)."""
    out = _run([str(bindir / "pg_ctl"), "--version"], cwd=Path("/")).stdout
    match = re.search(r"(\d+)(?:\.(\d+))?", out)
    if not match:
        raise _StartFailed(f"cannot read the PostgreSQL version from {out!r}")
    major = int(match.group(1))
    return str(major) if major >= 10 else f"{major}.{match.group(2)}"


class _PgRunner:
    """Runs PostgreSQL commands as the right OS user: `postgres` via runuser when root."""

    def __init__(self, bindir: Path, cwd: Path) -> None:
        self.bindir = bindir
        self.cwd = cwd
        self.as_root = os.geteuid() == 0
        if self.as_root:
            try:
                entry = pwd.getpwnam(PG_OS_USER)
            except KeyError as exc:
                raise _StartFailed(
                    f"running as root needs a `{PG_OS_USER}` OS user to run PostgreSQL "
                    "(the postgresql package creates it), or run as a normal user"
                ) from exc
            if shutil.which("runuser") is None:
                raise _StartFailed("running as root needs `runuser` (util-linux) to run initdb")
            self.uid, self.gid = entry.pw_uid, entry.pw_gid
        else:
            self.uid, self.gid = os.geteuid(), os.getegid()

    def cmd(self, tool: str, *args: str) -> list[str]:
        """The argv running `tool` from the bindir with `args` as the server's OS user."""
        argv = [str(self.bindir / tool), *args]
        return ["runuser", "-u", PG_OS_USER, "--", *argv] if self.as_root else argv

    def run(self, tool: str, *args: str, timeout: float = 60.0) -> None:
        """Run `tool`; raise `_StartFailed` when it fails."""
        _run(self.cmd(tool, *args), cwd=self.cwd, timeout=timeout)

    def running(self, datadir: Path) -> bool:
        """True when `pg_ctl status` reports a postmaster for `datadir`."""
        result = subprocess.run(
            self.cmd("pg_ctl", "status", "-D", str(datadir)),
            cwd=self.cwd,
            capture_output=True,
            timeout=30,
            check=False,
        )
        return result.returncode == 0

    def own(self, path: Path) -> None:
        """Give `path` to the server's OS user (only needed, and only done, as root)."""
        if self.as_root:
            os.chown(path, self.uid, self.gid)


def _pg_prepare_datadir(runner: _PgRunner, datadir: Path, major: str) -> None:
    """Run initdb unless `datadir` already holds a cluster of version `major` we can use."""
    if datadir.exists():
        try:
            version = (datadir / "PG_VERSION").read_text().strip()
        except OSError:
            version = ""
        if version == major and datadir.stat().st_uid == runner.uid:
            return
        if datadir.stat().st_uid != os.geteuid() and not runner.as_root:
            raise _StartFailed(f"{datadir} belongs to another user: remove it or use another dir")
        _progress(f"postgres: discarding unusable throwaway data dir {datadir}")
        shutil.rmtree(datadir)
    datadir.mkdir(mode=0o700)
    runner.own(datadir)
    runner.run(
        "initdb",
        "-D",
        str(datadir),
        f"--username={PG_SUPERUSER}",
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
        timeout=120,
    )


def _pg_wait(base_url: str, deadline: float, log: Path) -> None:
    """Wait until `base_url` accepts connections or `deadline` (monotonic s) passes."""
    reason: str | None = "not tried"
    while time.monotonic() < deadline:
        reason = _pg_probe(base_url)
        if reason is None:
            return
        time.sleep(0.2)
    raise _StartFailed(
        f"not accepting connections after {START_TIMEOUT_S:.0f} s: {reason}\n"
        f"  last lines of {log}:\n{_log_tail(log)}"
    )


def _start_throwaway_postgres(state_dir: Path) -> str:
    """Start (or reuse) a throwaway PostgreSQL from local binaries; return its base URL.

    The cluster lives in `<state_dir>/postgres` (trust auth, superuser `postgres`, listening on
    127.0.0.1 only, unix socket in the data dir) and logs to `<state_dir>/postgres.log`; its
    port (from 55432 on) is recorded in `<state_dir>/postgres.json` so later calls, from any
    process, reuse the running server. It is throwaway: durability is switched off
    (`fsync=off`, `synchronous_commit=off`, `full_page_writes=off`), so a machine crash may
    corrupt it — never keep data you care about there. As root, initdb and the server run as
    the `postgres` OS user (via `runuser`), which owns the data dir.

    Raises `_StartFailed` with the reason (and the log tail) when it cannot start one.
    """
    state_dir = _prepare_state_dir(state_dir)
    datadir = state_dir / "postgres"
    log = state_dir / "postgres.log"
    state_file = state_dir / "postgres.json"
    with _locked(state_dir / "postgres.lock"):
        port = _read_state(state_file).get("port")
        if isinstance(port, int):
            base_url = f"postgresql://{PG_SUPERUSER}@{LOCAL_HOST}:{port}"
            if _pg_serves(base_url, datadir):
                _progress(f"postgres: reusing throwaway server on {LOCAL_HOST}:{port}")
                return base_url
        bindir = _pg_bindir()
        runner = _PgRunner(bindir, cwd=state_dir)
        if datadir.exists() and runner.running(datadir):
            # Ours but not answering where recorded (hung, or the port file was lost).
            with contextlib.suppress(_StartFailed):
                runner.run("pg_ctl", "stop", "-D", str(datadir), "-m", "immediate", "-w")
        _pg_prepare_datadir(runner, datadir, _pg_major(bindir))
        port = _free_port(THROWAWAY_PG_PORT)
        _progress(
            f"postgres: starting throwaway server from {bindir} on {LOCAL_HOST}:{port} "
            f"(data in {datadir}, log {log})"
        )
        log.touch()
        runner.own(log)
        options = [
            f"-p {port}",
            "-c listen_addresses=127.0.0.1",
            f"-k {shlex.quote(str(datadir))}",
            "-c fsync=off",
            "-c synchronous_commit=off",
            "-c full_page_writes=off",
        ]
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            runner.run(
                "pg_ctl", "start", "-D", str(datadir), "-l", str(log), "-w",
                "-t", str(int(START_TIMEOUT_S)), "-o", " ".join(options),
                timeout=START_TIMEOUT_S + 10,
            )  # fmt: skip
        except _StartFailed as exc:
            raise _StartFailed(f"{exc}\n  last lines of {log}:\n{_log_tail(log)}") from exc
        base_url = f"postgresql://{PG_SUPERUSER}@{LOCAL_HOST}:{port}"
        _pg_wait(base_url, deadline, log)
        _write_state(
            state_file,
            {"port": port, "datadir": str(datadir), "bindir": str(bindir), "log": str(log)},
        )
        return base_url


def _start_postgres_container() -> str:
    """Start a PostgreSQL 15 container (kept for this process's lifetime); return its base URL."""
    from testcontainers.community.postgres import PostgresContainer

    password = "postgres"
    container = PostgresContainer(
        "postgres:15-alpine", username=PG_SUPERUSER, password=password, dbname="postgres"
    )
    container.start()
    _CONTAINERS.append(container)
    host = container.get_container_host_ip()
    port = container.get_exposed_port(5432)
    return f"postgresql://{PG_SUPERUSER}:{password}@{host}:{port}"


def ensure_postgres(state_dir: Path | None = None) -> str:
    """Return the base URL of a PostgreSQL server that answers, starting one if needed.

    The URL names no database, e.g. `postgresql://postgres@127.0.0.1:5432`; append `/<name>`
    (or call `ensure_database`). Resolution order: `DATABASE_URL` (its database and query are
    dropped from the base), a server on 127.0.0.1:5432 (as `postgres`, then as the current OS
    user), a throwaway server from local binaries kept in `state_dir` (default
    `/var/tmp/jobq-servers`), then a testcontainers container if a Docker daemon answers.
    Each probe waits at most `CONNECT_TIMEOUT_S` seconds; a fresh server `START_TIMEOUT_S`.

    Raises ServerUnavailable when `DATABASE_URL` is set but does not answer, or when no
    server can be found or started (the message says what to install).
    """
    env_url = os.environ.get("DATABASE_URL", "").strip()
    if env_url:
        base, database = _pg_split(env_url)
        if urlsplit(env_url).query:
            _progress("postgres: note: the query string of DATABASE_URL is not kept in the base")
        reason = _pg_probe(base, database or "postgres")
        if reason is not None:
            raise ServerUnavailable(
                f"PostgreSQL at DATABASE_URL={_redact(env_url)} does not answer ({reason}): "
                "start that server, fix the URL, or unset DATABASE_URL to find or start one"
            )
        _progress(f"postgres: using DATABASE_URL server on {_host_port(base)}")
        return base

    users = [PG_SUPERUSER]
    with contextlib.suppress(Exception):
        if getpass.getuser() not in users:
            users.append(getpass.getuser())
    reasons: list[str] = []
    for user in users:
        base = f"postgresql://{user}@{LOCAL_HOST}:{DEFAULT_PG_PORT}"
        reason = _pg_probe(base)
        if reason is None:
            _progress(f"postgres: using server on {LOCAL_HOST}:{DEFAULT_PG_PORT} as {user}")
            return base
        reasons.append(f"as {user}: {reason}")
    _progress(
        f"postgres: no usable server on {LOCAL_HOST}:{DEFAULT_PG_PORT} ({'; '.join(reasons)})"
    )

    try:
        return _start_throwaway_postgres(state_dir or DEFAULT_STATE_DIR)
    except _StartFailed as exc:
        local_failure = str(exc)
        _progress(f"postgres: no throwaway server: {local_failure}")

    if _docker_answers():
        _progress("postgres: starting a testcontainers container (postgres:15-alpine)")
        try:
            return _start_postgres_container()
        except Exception as exc:
            raise ServerUnavailable(f"PostgreSQL container failed to start: {exc}") from exc
    _progress("postgres: no Docker daemon answers, skipping testcontainers")
    raise ServerUnavailable(f"PostgreSQL not found ({local_failure}): {PG_INSTALL_HINT}")


def _quote_ident(name: str) -> str:
    """Quote an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


async def _create_database(base_url: str, name: str) -> bool:
    """Create database `name` unless it exists; True when it was created."""
    conn = await asyncpg.connect(base_url, database="postgres", timeout=CONNECT_TIMEOUT_S)
    try:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        try:
            await conn.execute(f"CREATE DATABASE {_quote_ident(name)}")
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
    """Return None when Redis at `url` answers PING, else the reason."""
    try:
        client = _redis_client(url)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _redis_ping_raw(host: str, port: int) -> bool:
    """True when a server at host:port answers an inline `PING` with `+PONG`."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_base(url: str) -> str:
    """`url` without its database path or query: `redis://[user:pw@]host:port`."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ServerUnavailable(f"REDIS_URL must start with redis://, got {_redact(url)!r}")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _redis_serves(port: int, state_dir: Path) -> bool:
    """True when the Redis on 127.0.0.1:`port` answers and runs in `state_dir` (so it is ours)."""
    try:
        client = _redis_client(f"redis://{LOCAL_HOST}:{port}")
        try:
            config: dict[str, str] = client.config_get("dir")  # type: ignore[assignment]
        finally:
            client.close()
    except Exception:
        return False
    served = config.get("dir", b"")
    served = served.decode() if isinstance(served, bytes) else str(served)
    return os.path.realpath(served) == os.path.realpath(state_dir)


def _start_throwaway_redis(state_dir: Path) -> str:
    """Start (or reuse) a throwaway `redis-server` on 127.0.0.1; return its URL (no database).

    Runs daemonized without persistence (`--save "" --appendonly no`) with its working dir in
    `state_dir`, logging to `<state_dir>/redis.log`; the port (from 56379 on) is recorded in
    `<state_dir>/redis.json` so later calls reuse it. Raises `_StartFailed` on failure.
    """
    server = shutil.which("redis-server")
    if server is None:
        raise _StartFailed("no redis-server on PATH")
    state_dir = _prepare_state_dir(state_dir)
    log = state_dir / "redis.log"
    state_file = state_dir / "redis.json"
    with _locked(state_dir / "redis.lock"):
        port = _read_state(state_file).get("port")
        if isinstance(port, int) and _redis_serves(port, state_dir):
            _progress(f"redis: reusing throwaway server on {LOCAL_HOST}:{port}")
            return f"redis://{LOCAL_HOST}:{port}"
        port = _free_port(THROWAWAY_REDIS_PORT)
        _progress(f"redis: starting throwaway server {server} on {LOCAL_HOST}:{port} (log {log})")
        pidfile = state_dir / "redis.pid"
        _run(
            [
                server, "--port", str(port), "--bind", LOCAL_HOST, "--daemonize", "yes",
                "--save", "", "--appendonly", "no", "--dir", str(state_dir),
                "--logfile", str(log), "--pidfile", str(pidfile),
            ],
            cwd=state_dir,
            timeout=START_TIMEOUT_S,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _redis_ping_raw(LOCAL_HOST, port):
            if time.monotonic() > deadline:
                raise _StartFailed(
                    f"redis-server not answering after {START_TIMEOUT_S:.0f} s\n"
                    f"  last lines of {log}:\n{_log_tail(log)}"
                )
            time.sleep(0.1)
        _write_state(state_file, {"port": port, "log": str(log), "pidfile": str(pidfile)})
        return f"redis://{LOCAL_HOST}:{port}"


def _start_redis_container() -> str:
    """Start a Redis 7 container (kept for this process's lifetime); return its URL."""
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer("redis:7-alpine")
    container.start()
    _CONTAINERS.append(container)
    host = container.get_container_host_ip()
    port = container.get_exposed_port(6379)
    return f"redis://{host}:{port}"


def ensure_redis(state_dir: Path | None = None) -> str:
    """Return the URL of a Redis server that answers, e.g. `redis://127.0.0.1:6379`.

    The URL names no database number; append `/0` for a client. Resolution order: `REDIS_URL`
    (its database path dropped), a server on 127.0.0.1:6379, a throwaway `redis-server` kept
    in `state_dir` (default `/var/tmp/jobq-servers`), then a testcontainers container if a
    Docker daemon answers. Each probe waits at most `CONNECT_TIMEOUT_S` seconds.

    Raises ServerUnavailable when `REDIS_URL` is set but does not answer, or when no server can
    be found or started (the message says what to install).
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
        _progress(f"redis: using REDIS_URL server on {_host_port(base)}")
        return base

    if _redis_ping_raw(LOCAL_HOST, DEFAULT_REDIS_PORT):
        _progress(f"redis: using server on {LOCAL_HOST}:{DEFAULT_REDIS_PORT}")
        return f"redis://{LOCAL_HOST}:{DEFAULT_REDIS_PORT}"
    _progress(f"redis: no server answering PING on {LOCAL_HOST}:{DEFAULT_REDIS_PORT}")

    try:
        return _start_throwaway_redis(state_dir or DEFAULT_STATE_DIR)
    except _StartFailed as exc:
        local_failure = str(exc)
        _progress(f"redis: no throwaway server: {local_failure}")

    if _docker_answers():
        _progress("redis: starting a testcontainers container (redis:7-alpine)")
        try:
            return _start_redis_container()
        except Exception as exc:
            raise ServerUnavailable(f"Redis container failed to start: {exc}") from exc
    _progress("redis: no Docker daemon answers, skipping testcontainers")
    raise ServerUnavailable(f"Redis not found ({local_failure}): {REDIS_INSTALL_HINT}")


# --------------------------------------------------------------------------------------------
# Stopping


def _stop_throwaway_postgres(state_dir: Path) -> bool:
    """Stop the throwaway PostgreSQL of `state_dir` if it runs; True when one was stopped."""
    datadir = state_dir / "postgres"
    state_file = state_dir / "postgres.json"
    if not (datadir / "PG_VERSION").exists():
        return False
    state = _read_state(state_file)
    bindir = Path(state["bindir"]) if "bindir" in state else _pg_bindir()
    runner = _PgRunner(bindir, cwd=state_dir)
    stopped = False
    if runner.running(datadir):
        runner.run("pg_ctl", "stop", "-D", str(datadir), "-m", "fast", "-w", timeout=60)
        stopped = True
    state_file.unlink(missing_ok=True)
    return stopped


def _stop_throwaway_redis(state_dir: Path) -> bool:
    """Stop the throwaway Redis of `state_dir` if it runs; True when one was stopped."""
    state_file = state_dir / "redis.json"
    port = _read_state(state_file).get("port")
    stopped = False
    if isinstance(port, int) and _redis_serves(port, state_dir):
        cli = shutil.which("redis-cli")
        if cli:
            _run([cli, "-h", LOCAL_HOST, "-p", str(port), "shutdown", "nosave"], cwd=state_dir)
        else:
            client = _redis_client(f"redis://{LOCAL_HOST}:{port}")
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(nosave=True)
            client.close()
        stopped = True
    state_file.unlink(missing_ok=True)
    return stopped


def stop_throwaway(state_dir: Path | None = None) -> list[str]:
    """Stop the throwaway servers that were started in `state_dir`; return what was stopped.

    Only servers this module started there are touched (a Redis is stopped only when it runs
    in `state_dir`, a PostgreSQL only through its own data dir), never the machine's own.
    Data dirs are kept, so the next start is quick. Raises ServerUnavailable when a stop
    command fails.
    """
    state_dir = (state_dir or DEFAULT_STATE_DIR).expanduser().resolve()
    stopped: list[str] = []
    if not state_dir.is_dir():
        return stopped
    try:
        with _locked(state_dir / "postgres.lock"):
            if _stop_throwaway_postgres(state_dir):
                stopped.append("postgres")
        with _locked(state_dir / "redis.lock"):
            if _stop_throwaway_redis(state_dir):
                stopped.append("redis")
    except (_StartFailed, OSError) as exc:
        raise ServerUnavailable(f"could not stop throwaway servers in {state_dir}: {exc}") from exc
    return stopped


# --------------------------------------------------------------------------------------------
# Command line


def _env_lines(database: str | None, state_dir: Path | None) -> list[str]:
    """The `DATABASE_URL=…` and `REDIS_URL=…` lines for `env` (database created)."""
    env_db_url = os.environ.get("DATABASE_URL", "").strip()
    env_redis_url = os.environ.get("REDIS_URL", "").strip()
    pg_base = ensure_postgres(state_dir)
    name = database or (_pg_split(env_db_url)[1] if env_db_url else "") or "jobq"
    database_url = ensure_database(pg_base, name)
    redis_base = ensure_redis(state_dir)
    redis_db = urlsplit(env_redis_url).path.strip("/") if env_redis_url else ""
    redis_url = f"{redis_base}/{redis_db or '0'}"
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
    sub.add_parser("stop", help="stop the throwaway servers started in the state dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "env":
            print("\n".join(_env_lines(args.database, args.state_dir)), flush=True)
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

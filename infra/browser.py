"""Find or install the browser the console's tests drive: Debian's Chromium.

`ensure_browser()` returns `/usr/bin/chromium` (or `JOBQ_CHROMIUM`, or a `chromium` on PATH),
installing Debian's `chromium` package with `apt-get install` when it is missing and we are
root (`apt-get update` first when the package lists do not know it). Unlike the observability
tools (`infra.tools`, unpacked), Chromium needs its many shared libraries installed, so it is
a real install. Playwright itself never downloads a browser here: the tests launch this
executable (`PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1`, set by `make tools` and the tests).

Command line::

    python -m infra.browser        # install if missing; print the path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEBIAN_PATH = Path("/usr/bin/chromium")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""What the tests launch Chromium with: no sandbox (root in CI), and no network of its own."""


class BrowserUnavailable(RuntimeError):
    """Chromium is not installed and cannot be installed here; the message says how."""


def _found() -> Path | None:
    override = os.environ.get("JOBQ_CHROMIUM")
    if override:
        return Path(override) if Path(override).is_file() else None
    if DEBIAN_PATH.is_file():
        return DEBIAN_PATH
    on_path = shutil.which("chromium")
    return Path(on_path) if on_path else None


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, check=False, env=env)


def ensure_browser() -> Path:
    """The Chromium executable, installed from Debian's `chromium` package if missing.
    Raises BrowserUnavailable when it is missing and this is not root with apt-get."""
    found = _found()
    if found is not None:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise BrowserUnavailable(
            "Chromium is missing: install Debian's `chromium` package (as root: "
            "apt-get install chromium), or set JOBQ_CHROMIUM to a Chromium executable"
        )
    print("jobq browser: apt-get install chromium", file=sys.stderr)
    installed = _apt("install", "-y", "--no-install-recommends", "chromium")
    if installed.returncode != 0:
        _apt("update")
        installed = _apt("install", "-y", "--no-install-recommends", "chromium")
    found = _found()
    if installed.returncode != 0 or found is None:
        raise BrowserUnavailable(
            f"`apt-get install chromium` failed: {installed.stderr.strip()[-400:]}"
        )
    return found


def main() -> int:
    """Install Chromium if missing; print its path (exit 2 with the reason on failure)."""
    try:
        print(ensure_browser())
    except BrowserUnavailable as exc:
        print(f"jobq browser: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

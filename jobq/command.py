"""The `jobq` console script's entry point: it runs `jobq.cli`, or, where the client
distribution was installed without its `cli` extra (Click and Rich), says how to get it."""

from __future__ import annotations

import sys

MISSING_EXTRA_EXIT = 2
"""The exit code when the command line's libraries are not installed (a usage error)."""


def main() -> None:
    """Run the command line (`jobq.cli.main`); exit MISSING_EXTRA_EXIT with a message naming
    the extra when Click or Rich cannot be imported."""
    try:
        from jobq.cli import main as run
    except ModuleNotFoundError as exc:
        if exc.name not in {"click", "rich"}:
            raise
        print(
            f"jobq: the command line needs {exc.name}, which the client distribution installs "
            "with its cli extra: pip install 'jobq[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(MISSING_EXTRA_EXIT) from None
    run()

"""The suite's progress line on stderr: one line per phase, and a periodic line while a phase
waits (a burn-down, an ingest step). On a terminal the periodic line rewrites itself."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """Counts phases (`phase()`) and reports waiting (`tick()`), at most every `every` seconds.

    `total` is the number of phases the suite plans; the elapsed time is shown on each line.
    """

    total: int
    every: float = 2.0
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    _last_tick: float = 0.0
    _open_line: bool = False

    def _prefix(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        return f"[bench {elapsed // 60:02d}:{elapsed % 60:02d} {self.done}/{self.total}]"

    def _write(self, text: str, rewrite: bool) -> None:
        tty = sys.stderr.isatty()
        if self._open_line and not (rewrite and tty):
            sys.stderr.write("\n" if tty else "")
        if rewrite and tty:
            sys.stderr.write(f"\r\033[K{text}")
            self._open_line = True
        else:
            sys.stderr.write(text + "\n")
            self._open_line = False
        sys.stderr.flush()

    def phase(self, label: str) -> None:
        """A new phase begins (counts towards `total`)."""
        self.done += 1
        self._write(f"{self._prefix()} {label}", rewrite=False)

    def tick(self, label: str, force: bool = False) -> None:
        """Report the state of a waiting phase, unless one was reported under `every` s ago."""
        now = time.monotonic()
        if force or now - self._last_tick >= self.every:
            self._last_tick = now
            self._write(f"{self._prefix()}   {label}", rewrite=True)

    def note(self, text: str) -> None:
        """A one-off line (a result worth seeing while the suite runs)."""
        self._write(f"{self._prefix()}   {text}", rewrite=False)


QUIET = Progress(total=0, every=float("inf"))
"""A progress reporter for callers that run one benchmark alone; reports phases only."""

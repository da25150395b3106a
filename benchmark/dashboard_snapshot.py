"""Render the jobq dashboard as one PNG from a real Prometheus after a real k6 run.

Starts a stack (two workers) on a fresh `jobq_snapshot` database, watched by postgres_exporter
and Prometheus exactly as in the scrape test (`infra.observe`), drives it with k6's `mixed.js`
plus `infra.observe.exercise` (retries, dead letters, a lease expiry, a release, 4xx), then asks
Prometheus for every panel's `query_range` over the run and draws the panels where the
dashboard JSON places them (Grafana's 24-column grid), in Grafana's dark colours. No Grafana is
involved: the picture shows the same queries over the same data, stat values coloured by the
dashboard's thresholds as Grafana colours them. The title names the load and the workers as
they reported themselves to Prometheus (`jobq_worker_slots`), not as this file assumes.

    python -m benchmark.dashboard_snapshot    # `make dashboard-snapshot` → .jobq/dashboard.png
    python -m benchmark.dashboard_snapshot --output docs/dashboard.png    # the README's picture
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from benchmark.database import migrated_database
from benchmark.load import run_k6
from infra.grafana.dashboard import DASHBOARD_JSON, threshold_colour
from infra.observe import Observer, exercise, expand
from infra.servers import ensure_postgres, ensure_redis
from infra.stack import ROOT, LocalStack

OUTPUT = ROOT / ".jobq" / "dashboard.png"
"""Git-ignored: a run does not rewrite the committed `docs/dashboard.png` unless asked to."""
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLOURS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff"]
NAMED = {"green": "#73bf69", "yellow": "#fade2a", "orange": "#ff9830", "red": "#f2495c"}
"""Grafana's dark-theme values of the colour names the thresholds use."""
SETTINGS = {
    "QUEUE_RETRY_BASE_DELAY": "50ms",
    "QUEUE_RETRY_MAX_DELAY": "200ms",
    "QUEUE_REAPER_INTERVAL": "200ms",
    "QUEUE_DEPTH_INTERVAL": "1s",
    "WORKER_WAIT_SECONDS": "2",
    "LOG_LEVEL": "WARNING",
}


def _scaled(value: float, unit: str) -> str:
    """A tick label for `value` in Grafana unit `unit`."""
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "s":
        return f"{value * 1000:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit == "bytes":
        return f"{value / 2**20:.1f} MiB"
    if unit in ("ops", "reqps"):
        return f"{value:g}/s"
    return f"{value:g}"


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def _style(ax: Axes, title: str, unit: str) -> None:
    ax.set_facecolor(PANEL)
    ax.set_title(title, color=TEXT, fontsize=9, loc="left")
    ax.tick_params(colors=TEXT, labelsize=7)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(color=GRID, linewidth=0.5)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _scaled(v, unit)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v) // 60}:{int(v) % 60:02d}"))


def _draw_panel(
    ax: Axes, panel: dict[str, Any], series: list[tuple[str, list[Any]]], origin: float
) -> None:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    _style(ax, panel["title"], unit)
    if panel["type"] == "stat":
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        latest = [float(values[-1][1]) for _, values in series if values]
        text = _scaled(latest[0], unit) if latest else "No data"
        colour = NAMED[threshold_colour(panel, latest[0])] if latest else TEXT
        ax.text(0.5, 0.4, text, color=colour, fontsize=18, ha="center", va="center")
        return
    for index, (label, values) in enumerate(series):
        elapsed = [float(t) - origin for t, _ in values]
        ax.plot(
            elapsed, [float(v) for _, v in values], color=COLOURS[index % 7], lw=1.2, label=label
        )
    if series:
        ax.legend(fontsize=6, facecolor=PANEL, edgecolor=GRID, labelcolor=TEXT, loc="upper left")
    else:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", transform=ax.transAxes)


def render(
    panels: list[dict[str, Any]],
    data: dict[int, list[tuple[str, list[Any]]]],
    origin: float,
    path: Path,
    title: str = "jobq",
) -> None:
    """Draw `panels` (dashboard JSON panels, with gridPos) with `data` (panel id → labelled
    series of `[Unix time, value]` pairs; the x axis shows minutes:seconds since `origin`)
    into a PNG at `path`."""
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_h = 0.42  # inches per grid row
    header = 0.8  # inches above the grid, for the title
    figure = Figure(figsize=(18, bottom * unit_h + header), facecolor=BACKGROUND)
    figure.suptitle(title, color=TEXT, x=0.005, y=0.998, ha="left", va="top", fontsize=13)
    top_margin = header / (bottom * unit_h + header)
    usable = 1 - top_margin
    for panel in panels:
        grid = panel["gridPos"]
        left, width = grid["x"] / 24, grid["w"] / 24
        height = grid["h"] / bottom * usable
        y = 1 - top_margin - (grid["y"] + grid["h"]) / bottom * usable
        if panel["type"] == "row":
            figure.text(0.005, y + height / 2, panel["title"], color=TEXT, fontsize=11, va="center")
            continue
        # Room on the left for tick labels, above for the title.
        pad_left, pad_right, pad_y = 0.04, 0.008, 0.6 / (bottom * unit_h)
        box = (left + pad_left, y + pad_y * 0.45, width - pad_left - pad_right, height - pad_y)
        ax = figure.add_axes(box)
        _draw_panel(ax, panel, data.get(panel["id"], []), origin)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, facecolor=BACKGROUND)


def describe_workers(slots: list[int]) -> str:
    """`2 workers of 32 slots` for the slot counts the replicas reported (`3 workers of
    32+32+4 slots` when they differ)."""
    if not slots:
        return "no worker"
    noun = "worker" if len(slots) == 1 else "workers"
    each = str(slots[0]) if len(set(slots)) == 1 else "+".join(str(n) for n in sorted(slots))
    return f"{len(slots)} {noun} of {each} slots"


async def worker_slots(observer: Observer) -> list[int]:
    """Slots of each worker replica Prometheus scraped (`jobq_worker_slots`, the replica's
    WORKER_CONCURRENCY), sorted."""
    return sorted(int(float(s["value"][1])) for s in await observer.query("jobq_worker_slots"))


async def snapshot(rate: int, duration: str, path: Path) -> None:
    """Run the stack, the load and Prometheus; write the PNG to `path`."""
    database_url = await migrated_database(ensure_postgres(), "jobq_snapshot")
    scratch = Path(tempfile.mkdtemp(prefix="jobq-snapshot-"))
    stack = LocalStack(
        database_url, ensure_redis() + "/12", scratch / "stack", workers=2, environment=SETTINGS
    )
    await stack.start()
    observer = Observer(stack, database_url, scratch / "prometheus")
    try:
        await observer.start()
        await observer.wait_for_targets()
        started = time.time()
        await exercise(stack, jobs=10)
        env = {"BASE_URL": stack.producer, "RATE": str(rate), "DURATION": duration}
        k6 = asyncio.create_task(asyncio.to_thread(run_k6, "mixed", env, scratch / "k6.json"))
        await asyncio.sleep(5)
        await exercise(stack, jobs=10)  # a second wave of failures mid-run
        print(f"k6 exited {await k6}", file=sys.stderr)
        await asyncio.sleep(8)  # let the queue drain and the last scrapes land
        ended = time.time()
        model = json.loads(DASHBOARD_JSON.read_text())
        variables = {"queue": ".*", "task_type": ".*", "database": database_url.rsplit("/")[-1]}
        data: dict[int, list[tuple[str, list[Any]]]] = {}
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                expr = expand(target["expr"], variables, "10s")
                for series in await observer.query_range(expr, started, ended, 2):
                    label = _legend(target.get("legendFormat", ""), series["metric"])
                    data.setdefault(panel["id"], []).append((label, series["values"]))
        workers = describe_workers(await worker_slots(observer))
    finally:
        observer.stop()
        stack.stop()
    title = f"jobq: k6 mixed.js at {rate}/s for {duration}, {workers}, from Prometheus"
    render(model["panels"], data, started, path, title)
    print(f"wrote {path}", file=sys.stderr)


def main() -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=40, help="k6 mixed.js iterations per second")
    parser.add_argument("--duration", default="40s", help="k6 duration (default 40s)")
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help=f"PNG to write (default {OUTPUT})"
    )
    args = parser.parse_args()
    asyncio.run(snapshot(args.rate, args.duration, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())

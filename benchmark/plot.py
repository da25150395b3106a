"""A dependency-free SVG histogram of latencies, written next to a benchmark's JSON result."""

from __future__ import annotations

import statistics
from pathlib import Path

_WIDTH, _HEIGHT, _MARGIN = 640, 320, 48


def latency_histogram(values_ms: list[float], title: str, path: Path, bins: int = 30) -> None:
    """Write an SVG histogram of `values_ms` (milliseconds) with the median and p95 marked."""
    ordered = sorted(values_ms)
    low, high = 0.0, max(ordered[round(0.99 * (len(ordered) - 1))], 1.0)
    step = (high - low) / bins
    counts = [0] * bins
    for value in ordered:
        counts[min(bins - 1, int((min(value, high) - low) / step))] += 1
    plot_w, plot_h = _WIDTH - 2 * _MARGIN, _HEIGHT - 2 * _MARGIN
    tallest = max(counts) or 1
    bar_w = plot_w / bins
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{_WIDTH}" height="{_HEIGHT}" fill="white"/>',
        f'<text x="{_MARGIN}" y="24" font-size="14">{title}</text>',
    ]
    for index, count in enumerate(counts):
        height = plot_h * count / tallest
        x = _MARGIN + index * bar_w
        y = _MARGIN + plot_h - height
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 1:.1f}" height="{height:.1f}" '
            'fill="#4a7ebb"/>'
        )
    median = statistics.median(ordered)
    p95 = ordered[round(0.95 * (len(ordered) - 1))]
    for label, value, colour in (("median", median, "#d62728"), ("p95", p95, "#ff7f0e")):
        x = _MARGIN + plot_w * min(value, high) / high
        parts.append(
            f'<line x1="{x:.1f}" y1="{_MARGIN}" x2="{x:.1f}" y2="{_MARGIN + plot_h}" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text x="{x + 4:.1f}" y="{_MARGIN + 12}" fill="{colour}">'
            f"{label} {value:.1f} ms</text>"
        )
    axis_y = _MARGIN + plot_h
    parts.append(
        f'<line x1="{_MARGIN}" y1="{axis_y}" x2="{_MARGIN + plot_w}" y2="{axis_y}" stroke="black"/>'
        f'<text x="{_MARGIN}" y="{axis_y + 18}">0 ms</text>'
        f'<text x="{_MARGIN + plot_w - 60}" y="{axis_y + 18}">{high:.0f} ms (p99)</text>'
        f'<text x="{_MARGIN}" y="{_HEIGHT - 8}">jobs per bin (n = {len(ordered)}); '
        "values above p99 fall in the last bin</text>"
    )
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")

"""What the machine was doing: cores, platform, versions, load averages."""

from __future__ import annotations

import os
import platform
from typing import Any

import asyncpg
import psutil


def steal_seconds() -> float:
    """CPU seconds the hypervisor gave other guests while this one wanted them (`steal` of
    /proc/stat, summed over the cores; 0 where the platform does not report it). A run that
    saw more steal ran on a slower machine than its neighbour."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


async def describe(base_url: str, k6: str) -> dict[str, Any]:
    """`{cpus, platform, python, postgres, k6}` of this machine and the database server."""
    connection = await asyncpg.connect(f"{base_url}/postgres")
    try:
        version = await connection.fetchval("SHOW server_version")
    finally:
        await connection.close()
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": str(version),
        "k6": k6,
    }

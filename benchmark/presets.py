"""The suite's two sizes: `full` (what `make bench` runs and the README table comes from) and
`quick` (`make bench-quick`, the CI smoke test: small, one round, no peers, no 1M rows)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmark.burndown import Shape
from benchmark.claims import HistorySizes
from services.worker.settings import DEFAULT_CONCURRENCY

DEFAULT_SHAPE = Shape(2, DEFAULT_CONCURRENCY)
"""What `make run` starts: two worker replicas with the default WORKER_CONCURRENCY."""


@dataclass(frozen=True)
class Preset:
    """Every size the suite uses. Jobs are counts; seconds are durations; rates are per second.

    `rounds` alternate jobq's default burn-down with each peer (the figures are medians over
    rounds); `ingest_rounds` and `claim_rounds` likewise alternate their targets or cases.
    """

    name: str
    rounds: int
    burn_jobs: int
    matrix: tuple[Shape, ...]
    matrix_jobs: int
    kill_jobs: int
    raw_loops: tuple[int, ...]
    raw_jobs: int
    ingest_targets: tuple[str, ...]
    ingest_rates: tuple[int, ...]
    ingest_seconds: int
    ingest_rounds: int
    pickup_jobs: int
    pickup_rate: float
    idle_seconds: float
    load_rate: int
    load_seconds: int
    latency_fractions: tuple[float, ...]
    """Fractions of the producer's ingest knee the latency under load is measured at."""
    latency_seconds: int
    latency_rounds: int
    """Rounds of the latency steps (each round every fraction once, in order); medians taken."""
    claims: int
    claim_rounds: int
    history: HistorySizes
    rr_lead: float
    rr_hold: float
    rr_tail: float
    pgbench: tuple[int, int, int]
    """clients, transactions per client, batch."""
    peers: tuple[str, ...]
    peer_jobs: dict[str, int]


FULL = Preset(
    name="full",
    rounds=5,
    burn_jobs=20_000,
    matrix=tuple(Shape(r, s) for r in (1, 2, 4) for s in (4, 16, 64)),
    matrix_jobs=10_000,
    kill_jobs=3_000,
    raw_loops=(1, 4, 8),
    raw_jobs=20_000,
    ingest_targets=("producer", "queue", "bare"),
    ingest_rates=(100, 250, 500, 800, 1200, 1600, 2000, 2500, 3000, 4000),
    ingest_seconds=6,
    ingest_rounds=3,
    pickup_jobs=300,
    pickup_rate=20.0,
    idle_seconds=5.0,
    load_rate=300,
    load_seconds=10,
    latency_fractions=(0.25, 0.5, 0.9),
    latency_seconds=20,
    latency_rounds=3,
    claims=1_000,
    claim_rounds=3,
    history=HistorySizes(completed=1_000_000, scheduled=100_000),
    rr_lead=5.0,
    rr_hold=60.0,
    rr_tail=10.0,
    pgbench=(4, 50, 100),
    peers=("pgqueuer_b100", "pgqueuer_b10", "procrastinate_c10"),
    peer_jobs={"pgqueuer_b100": 20_000, "pgqueuer_b10": 20_000, "procrastinate_c10": 3_000},
)

QUICK = Preset(
    name="quick",
    rounds=1,
    burn_jobs=500,
    matrix=(),
    matrix_jobs=0,
    kill_jobs=300,
    raw_loops=(4,),
    raw_jobs=500,
    ingest_targets=("producer", "queue"),
    ingest_rates=(50,),
    ingest_seconds=2,
    ingest_rounds=1,
    pickup_jobs=10,
    pickup_rate=20.0,
    idle_seconds=1.0,
    load_rate=50,
    load_seconds=2,
    latency_fractions=(0.5,),
    latency_seconds=2,
    latency_rounds=2,
    claims=30,
    claim_rounds=1,
    history=HistorySizes(completed=0, scheduled=1_000),
    rr_lead=0.5,
    rr_hold=1.5,
    rr_tail=1.0,
    pgbench=(2, 10, 10),
    peers=(),
    peer_jobs={},
)

PRESETS = {p.name: p for p in (FULL, QUICK)}

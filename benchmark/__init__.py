"""jobq's benchmarks: the suite (`python -m benchmark`, see benchmark/README.md) and the k6 load
runs (`benchmark.load`). Imports nothing but the standard library, so the peer drivers in
`benchmark.peer_drivers` also run in the peers' own environment."""

from pathlib import Path

RESULTS = Path(__file__).parent / "results"
"""Where results (JSON, PNG) are written and committed."""

"""Startup's objects frozen out of the garbage collector's scans (`common.heap`)."""

from __future__ import annotations

import gc

from common.heap import freeze_startup_heap


def test_freezing_moves_the_live_objects_out_of_every_generation() -> None:
    kept = [[index] for index in range(1_000)]  # tracked containers alive now
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() >= len(kept)
        assert all(not any(item is entry for item in gc.get_objects()) for entry in kept[:3])
        assert gc.get_count()[0] < 700, "the collection before the freeze did not run"
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
    assert any(item is kept[0] for item in gc.get_objects())

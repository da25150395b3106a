"""Startup's objects frozen out of the garbage collector's scans (`common.heap`)."""

from __future__ import annotations

import gc
import weakref

from common.heap import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A reference cycle nothing else holds (only the cyclic collector frees it); a weak
    reference to one of its nodes."""
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return weakref.ref(first)


def test_garbage_is_collected_first_and_live_objects_are_frozen() -> None:
    kept = [[index] for index in range(1_000)]  # tracked containers alive now
    gc.disable()
    try:
        garbage = _cycle()
        assert garbage() is not None
        frozen = freeze_startup_heap()
        assert garbage() is None, "the collection before the freeze did not run"
        assert frozen == gc.get_freeze_count() >= len(kept)
        assert not any(item is kept[0] for item in gc.get_objects()), "kept out of the freeze"
        later = _cycle()
        gc.collect()
        assert later() is None, "objects made after the freeze are no longer collected"
    finally:
        gc.unfreeze()
        gc.enable()
    assert any(item is kept[0] for item in gc.get_objects())

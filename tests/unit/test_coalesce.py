"""Group commit (`common.coalesce.Coalescer`): batches form from what arrives while a flush is
in flight, every caller gets its own answer, and nothing is answered before its flush ends."""

from __future__ import annotations

import asyncio

import pytest

from common.coalesce import Coalescer


class Recorder:
    """A flush that records its batches and returns each item doubled; `gate` holds it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        await self.gate.wait()
        return [ValueError(f"no {i}") if i < 0 else i * 2 for i in items]


async def test_a_lone_item_goes_at_once_and_later_ones_wait_for_the_next_flush() -> None:
    flush = Recorder()
    flush.gate.clear()
    coalescer = Coalescer(flush, max_batch=10)

    first = asyncio.create_task(coalescer.submit(1))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(coalescer.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    assert flush.batches == [[1]]
    assert not first.done(), "answered before its flush returned"
    flush.gate.set()

    assert await first == 2
    assert await asyncio.gather(*waiting) == [4, 6, 8]
    assert flush.batches == [[1], [2, 3, 4]]


async def test_with_gather_items_of_one_turn_leave_together_and_later_ones_next() -> None:
    flush = Recorder()
    flush.gate.clear()
    coalescer = Coalescer(flush, max_batch=3, max_in_flight=2, gather=True)

    async def woken(i: int) -> int:  # callers woken together, each submitting on its own
        return await coalescer.submit(i)

    together = [asyncio.create_task(woken(i)) for i in (1, 2, 3, 4, 5)]
    for _ in range(3):  # the callers submit in one turn, the batches form in the next
        await asyncio.sleep(0)
    assert flush.batches == [[1, 2, 3], [4, 5]], "the first caller left alone"
    later = asyncio.create_task(coalescer.submit(6))
    for _ in range(3):
        await asyncio.sleep(0)
    assert flush.batches == [[1, 2, 3], [4, 5]], "a third flush started beyond max_in_flight"
    assert not any(task.done() for task in together), "answered before its flush returned"
    flush.gate.set()
    assert await asyncio.gather(*together) == [2, 4, 6, 8, 10]
    assert await later == 12
    assert flush.batches == [[1, 2, 3], [4, 5], [6]]


async def test_with_gather_a_caller_cancelled_before_its_batch_forms_is_left_out() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_batch=10, gather=True)
    gone = asyncio.create_task(coalescer.submit(1))
    kept = asyncio.create_task(coalescer.submit(2))
    await asyncio.sleep(0)  # both submitted; the batch forms in the next turn
    gone.cancel()
    assert await kept == 4
    assert flush.batches == [[2]]


async def test_with_gather_aclose_waits_for_a_batch_not_yet_formed() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_batch=10, gather=True)
    submitted = asyncio.create_task(coalescer.submit(1))
    await asyncio.sleep(0)  # submitted; no flush exists yet, one is about to form
    await coalescer.aclose()
    assert flush.batches == [[1]], "aclose returned before the pending batch was flushed"
    assert await submitted == 2


async def test_batches_respect_count_weight_and_in_flight_limits() -> None:
    flush = Recorder()
    flush.gate.clear()
    coalescer = Coalescer(flush, max_batch=3, max_in_flight=2, weight=lambda i: i, max_weight=5)
    tasks = [asyncio.create_task(coalescer.submit(i)) for i in (9, 1, 1, 1, 1, 2, 2)]
    await asyncio.sleep(0)
    flush.gate.set()
    assert await asyncio.gather(*tasks) == [18, 2, 2, 2, 2, 4, 4]
    # Two flushes start at once with what has arrived; a heavier-than-allowed item still goes,
    # alone; the rest waits and leaves at most 3 items or 5 units at a time.
    assert flush.batches == [[9], [1], [1, 1, 1], [2, 2]]


async def test_each_caller_gets_its_own_outcome_and_its_own_error() -> None:
    flush = Recorder()
    coalescer = Coalescer(flush, max_batch=10)
    results = await asyncio.gather(
        coalescer.submit(1), coalescer.submit(-1), coalescer.submit(2), return_exceptions=True
    )
    assert results[0] == 2 and results[2] == 4
    assert isinstance(results[1], ValueError) and str(results[1]) == "no -1"


async def test_a_failed_flush_fails_its_callers_each_with_a_copy() -> None:
    async def broken(items: list[int]) -> list[int]:
        raise ConnectionError("down")

    coalescer: Coalescer[int, int] = Coalescer(broken, max_batch=10)
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) and str(r) == "down" for r in results)
    assert len({id(r) for r in results}) == 3, "callers share one exception instance"


async def test_a_caller_cancelled_before_its_flush_is_left_out() -> None:
    flush = Recorder()
    flush.gate.clear()
    coalescer = Coalescer(flush, max_batch=10)
    first = asyncio.create_task(coalescer.submit(1))
    await asyncio.sleep(0)
    gone = asyncio.create_task(coalescer.submit(2))
    kept = asyncio.create_task(coalescer.submit(3))
    await asyncio.sleep(0)
    gone.cancel()
    flush.gate.set()
    assert await first == 2 and await kept == 6
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert flush.batches == [[1], [3]]


async def test_aclose_waits_for_the_flushes_under_way() -> None:
    flush = Recorder()
    flush.gate.clear()
    coalescer = Coalescer(flush, max_batch=10)
    task = asyncio.create_task(coalescer.submit(5))
    await asyncio.sleep(0)
    closing = asyncio.create_task(coalescer.aclose())
    await asyncio.sleep(0)
    assert not closing.done()
    flush.gate.set()
    await closing
    assert await task == 10


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        Coalescer(Recorder(), max_batch=0)

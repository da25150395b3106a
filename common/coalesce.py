"""Group commit for concurrent callers: many single operations, few round trips.

A `Coalescer` collects items that callers submit one at a time and hands them to a flush
function in batches. It uses *natural batching*: a lone item is flushed at once (no added
latency when idle; with `gather`, one event-loop turn later), and items that arrive while a
flush is in flight wait and leave together in the next one, so batches grow exactly as fast
as load does. This is PostgreSQL's own group
commit applied one level up, and what River's batch completer, graphile-worker's
`completeJobBatchDelay` and pgqueuer's buffered acks do for job completions; see
docs/architecture.md#batching.

Every caller gets its own result (or its own exception) only after the flush that carried its
item returned, so an acknowledgement never precedes the commit it reports.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]
"""Takes a batch of items, returns one result per item, in order; a result may be an
exception meant for that item's caller alone. Raising fails the whole batch."""


def _own_copy(exc: Exception) -> Exception:
    """A copy of `exc` for one caller to raise: one instance raised by hundreds of callers
    would collect every one's frames in a single traceback. `exc` itself when it cannot be
    copied."""
    try:
        own = copy.copy(exc)
    except Exception:
        return exc
    own.__cause__ = exc.__cause__
    return own


class Coalescer(Generic[T, R]):
    """Batches concurrent `submit(item)` calls into `flush(items)` calls.

    At most `max_in_flight` flushes run at once, each with at most `max_batch` items whose
    `weight(item)` (for example their size in bytes) adds up to at most `max_weight` (a single
    heavier item still goes, alone; `weight` must not raise). With `gather`, a batch forms one
    turn of the event loop after a flush may start (after the first item's submit, or after a
    flush in flight ended), so items submitted in the same turn (callers woken together by one
    event) leave in one flush instead of the first alone.
    Flushes run as tasks the coalescer owns; `aclose()` waits for them. A caller cancelled
    before its item left is dropped from the batch; one cancelled later still has its item
    flushed (the operation is idempotent or harmless for every use in jobq), it just gets no
    answer.
    """

    def __init__(
        self,
        flush: Flush[T, R],
        *,
        max_batch: int,
        max_in_flight: int = 1,
        weight: Callable[[T], int] | None = None,
        max_weight: int = 0,
        gather: bool = False,
    ) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("max_batch and max_in_flight must be at least 1")
        self._flush = flush
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._weight = weight
        self._max_weight = max_weight
        self._gather = gather
        self._forming = False  # with `gather`: batches will form in the next turn
        self._waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._flushing: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Items submitted and not yet handed to a flush."""
        return len(self._waiting)

    async def submit(self, item: T) -> R:
        """Flush `item` with whatever else is waiting; returns its result, or raises its
        exception (or the whole flush's)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._start_flushes()
        return await future

    def _start_flushes(self) -> None:
        if not self._gather:
            self._form_batches()
        elif self._waiting and not self._forming and len(self._flushing) < self._max_in_flight:
            self._forming = True
            asyncio.get_running_loop().call_soon(self._form_batches)

    def _form_batches(self) -> None:
        """Start flushes of the waiting items, as many as may be in flight."""
        self._forming = False
        while self._waiting and len(self._flushing) < self._max_in_flight:
            batch = self._take()
            if not batch:
                return
            task = asyncio.create_task(self._run(batch))
            self._flushing.add(task)
            task.add_done_callback(self._finished)

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        """The next batch off the waiting items (callers cancelled meanwhile left out)."""
        batch: list[tuple[T, asyncio.Future[R]]] = []
        total = 0
        while self._waiting and len(batch) < self._max_batch:
            item, future = self._waiting[0]
            if self._weight is not None:
                total += self._weight(item)
                if batch and total > self._max_weight:
                    break
            self._waiting.popleft()
            if not future.done():
                batch.append((item, future))
        return batch

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._flushing.discard(task)
        self._start_flushes()

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"flush returned {len(results)} results for {len(batch)} items")
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(_own_copy(exc))
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def aclose(self) -> None:
        """Wait for the flushes under way (and those they start) to finish."""
        while self._flushing or self._forming:
            if self._flushing:
                await asyncio.gather(*self._flushing, return_exceptions=True)
            else:
                await asyncio.sleep(0)  # a `gather` batch forms in this turn

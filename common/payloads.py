"""Per-task-type payload checks at the boundary (docs/architecture.md#bounds): a payload a
built-in processor would refuse is refused when it is submitted (422 with a JSON pointer),
instead of being stored and dead-lettered later. Task types without a check take any JSON
object (their processor may live in a module the producer never sees)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from common.errors import InvalidInput

PayloadCheck = Callable[[Mapping[str, Any]], object]
"""Validates one payload; raises PayloadProblem (its return value is ignored)."""


class PayloadProblem(ValueError):
    """What is wrong with a payload: `pointer` (a JSON pointer into the payload, `/to/1`)
    and `detail`."""

    def __init__(self, pointer: str, detail: str) -> None:
        super().__init__(f"{pointer}: {detail}")
        self.pointer = pointer
        self.detail = detail


def check_task_payload(
    checks: Mapping[str, PayloadCheck],
    task_type: str,
    payload: Mapping[str, Any],
    pointer: str = "/payload",
) -> None:
    """Run the check `checks` holds for `task_type`, if any. Raises InvalidInput pointing
    under `pointer` (where the payload sits in the request)."""
    check = checks.get(task_type)
    if check is None:
        return
    try:
        check(payload)
    except PayloadProblem as problem:
        where = pointer + problem.pointer
        raise InvalidInput(
            f"{where}: {problem.detail}", errors=[{"pointer": where, "detail": problem.detail}]
        ) from None

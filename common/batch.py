"""Per-entry decoding of batch submits: every entry is validated on its own, so one bad entry
is a 413 or 422 for that entry, never for the whole batch. Entries arrive as spans of the body
(`msgspec.Raw`), and each payload's span is checked before it is decoded."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from common.contracts import BatchEntryResult, SubmitJobRequest, SubmitJobResponse
from common.errors import JobqError
from common.validation import check_payload, decode_submit, msgspec_error

T = TypeVar("T", bound=msgspec.Struct)
S = TypeVar("S", bound=SubmitJobRequest)


def decode_entries(entries: list[msgspec.Raw], type_: type[S]) -> list[S | JobqError]:
    """Decode each entry's JSON as `type_` (its payload's byte span checked first) and check
    its payload; a failing entry becomes the `JobqError` describing it, with JSON pointers
    rooted at `/jobs/<index>`."""
    decoded: list[S | JobqError] = []
    for index, entry in enumerate(entries):
        root = f"/jobs/{index}"
        try:
            value = decode_submit(entry, type_, root)
            check_payload(value.payload, pointer=f"{root}/payload")
        except msgspec.ValidationError as exc:
            decoded.append(msgspec_error(str(exc), root))
            continue
        except JobqError as exc:
            decoded.append(exc)
            continue
        decoded.append(value)
    return decoded


def entry_result(
    index: int, outcome: tuple[SubmitJobResponse, bool] | JobqError
) -> BatchEntryResult:
    """The batch reply entry for one outcome: (response, created) or an error."""
    if isinstance(outcome, JobqError):
        return BatchEntryResult(index=index, status=outcome.status, error=outcome.to_problem())
    response, created = outcome
    return BatchEntryResult(
        index=index,
        status=202 if created else 200,
        job_id=response.job_id,
        job_status=response.status,
    )


def split_valid(decoded: list[T | JobqError]) -> tuple[list[int], list[T]]:
    """Indexes and values of the entries that decoded."""
    indexes = [i for i, d in enumerate(decoded) if not isinstance(d, JobqError)]
    return indexes, [d for d in decoded if not isinstance(d, JobqError)]

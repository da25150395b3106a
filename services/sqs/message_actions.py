"""The SQS message actions over jobq's job protocol: SendMessage(Batch) -> `POST /jobs/batch`,
ReceiveMessage -> the long-polling claim `POST /jobs/next`, DeleteMessage(Batch) -> the
fenced ack `POST /jobs/ack`, ChangeMessageVisibility(Batch) -> `POST /jobs/heartbeat`
(0 releases the message). A message received over SQS and a job claimed by a jobq worker
are the same fenced lease, so they never overlap.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from common.contracts import AckEntry, ClaimRequest, EnqueueRequest, HeartbeatEntry
from common.ids import new_job_id
from services.sqs import attributes, messages, names
from services.sqs.context import SQS_TASK_TYPE, Context
from services.sqs.errors import (
    BATCH_IDS_NOT_DISTINCT,
    BATCH_REQUEST_TOO_LONG,
    EMPTY_BATCH,
    INVALID_BATCH_ENTRY_ID,
    MESSAGE_NOT_INFLIGHT,
    RECEIPT_HANDLE_IS_INVALID,
    TOO_MANY_ENTRIES,
    SqsError,
    invalid,
)
from services.sqs.queue_actions import take_dead_letters
from services.sqs.wire import (
    BATCH_MAX,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    DeleteEntry,
    DeleteMessage,
    DeleteMessageBatch,
    ReceiveMessage,
    SendEntry,
    SendMessage,
    SendMessageBatch,
    VisibilityEntry,
)

_ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
E = TypeVar("E")
H = TypeVar("H", DeleteEntry, VisibilityEntry)


def check_entries(entries: Sequence[E], entry_id: Callable[[E], str]) -> None:
    """SQS's batch rules: 1..10 entries (EmptyBatchRequest, TooManyEntriesInBatchRequest),
    ids of letters, digits, `-` and `_` up to 80 (InvalidBatchEntryId), all distinct
    (BatchEntryIdsNotDistinct)."""
    if not entries:
        raise SqsError(EMPTY_BATCH, "There should be at least one entry in the request.")
    if len(entries) > BATCH_MAX:
        raise SqsError(TOO_MANY_ENTRIES, f"Maximum number of entries per request are {BATCH_MAX}.")
    ids = [entry_id(entry) for entry in entries]
    for value in ids:
        if not _ENTRY_ID.fullmatch(value):
            raise SqsError(INVALID_BATCH_ENTRY_ID, f"A batch entry id is invalid: {value[:80]}")
    if len(set(ids)) != len(ids):
        raise SqsError(BATCH_IDS_NOT_DISTINCT, "Two or more batch entries have the same Id.")


def _failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.kind.fault == "Sender",
        "Code": error.kind.code,
        "Message": error.message,
    }


async def _send(
    ctx: Context, url: str, entries: Sequence[SendEntry | SendMessage]
) -> list[dict[str, Any] | SqsError]:
    """Send messages as jobs in one `POST /jobs/batch`; per entry its reply or its error."""
    queue = await ctx.queue(url)
    config = attributes.config(queue.attributes)
    outcomes: list[dict[str, Any] | SqsError] = []
    requests: list[tuple[int, EnqueueRequest, dict[str, Any]]] = []
    for index, entry in enumerate(entries):
        try:
            body = messages.check_body(entry.message_body)
            checked = messages.check_attributes(entry.message_attributes)
            if messages.size_of(body, checked) > config.maximum_message_size:
                raise invalid(
                    "One or more parameters are invalid. Reason: Message must be shorter than "
                    f"{config.maximum_message_size} bytes."
                )
        except SqsError as exc:
            outcomes.append(exc)
            continue
        job_id = new_job_id()
        job = EnqueueRequest(
            task_type=SQS_TASK_TYPE,
            payload=messages.payload_of(body, checked),
            queue=queue.queue,
            delay_seconds=(
                config.delay_seconds if entry.delay_seconds is None else entry.delay_seconds
            ),
            max_attempts=config.max_receive_count,
            job_id=job_id,
            tenant=queue.tenant,
        )
        outcomes.append(messages.sent_reply(job_id, body, checked))
        requests.append((index, job, checked))
    if requests:
        reply = await ctx.client.submit_batch([job for _, job, _ in requests])
        for (index, _, _), result in zip(requests, reply.results, strict=True):
            if result.status not in (200, 202):
                detail = (result.error or {}).get("detail", "the message was refused")
                outcomes[index] = invalid(f"One or more parameters are invalid: {detail}")
    return outcomes


async def send_message(ctx: Context, request: SendMessage) -> dict[str, Any]:
    """SendMessage: one message; its MessageId and digests."""
    [outcome] = await _send(ctx, request.queue_url, [request])
    if isinstance(outcome, SqsError):
        raise outcome
    return outcome


async def send_message_batch(ctx: Context, request: SendMessageBatch) -> dict[str, Any]:
    """SendMessageBatch: up to 10 messages of at most 256 KiB in all (BatchRequestTooLong);
    bad entries fail alone (`Failed`), the others are sent in one insert."""
    check_entries(request.entries, lambda entry: entry.id)
    total = sum(len(entry.message_body.encode()) for entry in request.entries)
    if total > attributes.PAYLOAD_LIMIT:
        raise SqsError(
            BATCH_REQUEST_TOO_LONG,
            f"Batch requests cannot be longer than {attributes.PAYLOAD_LIMIT} bytes.",
        )
    outcomes = await _send(ctx, request.queue_url, request.entries)
    successful, failed = [], []
    for entry, outcome in zip(request.entries, outcomes, strict=True):
        if isinstance(outcome, SqsError):
            failed.append(_failed(entry.id, outcome))
        else:
            successful.append({"Id": entry.id, **outcome})
    return {"Successful": successful, "Failed": failed}


async def receive_message(ctx: Context, request: ReceiveMessage) -> dict[str, Any]:
    """ReceiveMessage: up to 10 messages, long-polling up to WaitTimeSeconds (default the
    queue's ReceiveMessageWaitTimeSeconds) with jobq's claim; each leased for
    VisibilityTimeout (default the queue's; 0 is taken as 1 s, jobq's shortest lease)."""
    queue = await ctx.queue(request.queue_url)
    config = attributes.config(queue.attributes)
    await take_dead_letters(ctx, queue)
    wait = config.wait_seconds if request.wait_time_seconds is None else request.wait_time_seconds
    visibility = (
        config.visibility_timeout
        if request.visibility_timeout is None
        else request.visibility_timeout
    )
    claim = ClaimRequest(
        worker=f"sqs:{ctx.caller.tenant}:{ctx.caller.key_id or 'open'}",
        queues=[queue.queue],
        max=request.max_number_of_messages,
        wait_seconds=wait,
        visibility_timeout=max(visibility, 1),
    )
    reply = await ctx.client.claim(claim)
    system_names = [*request.attribute_names, *request.message_system_attribute_names]
    found = [
        messages.received(job, queue.tenant, system_names, request.message_attribute_names)
        for job in reply.jobs
    ]
    return {"Messages": found} if found else {}


async def delete_message(ctx: Context, request: DeleteMessage) -> dict[str, Any]:
    """DeleteMessage: the job completes, fenced by the receipt handle. As on SQS, a handle
    that is no longer current (the message was received again, or already deleted)
    succeeds and deletes nothing."""
    await ctx.queue(request.queue_url)
    job_id, lease = names.parse_receipt_handle(request.receipt_handle)
    await ctx.client.ack_many([AckEntry(id=job_id, receipt_handle=lease)])
    return {}


def _handles(
    entries: Sequence[H],
) -> tuple[list[tuple[H, uuid.UUID, uuid.UUID]], list[dict[str, Any]]]:
    """Each batch entry with its receipt handle's (job id, lease), and the `Failed` entries of
    malformed handles (ReceiptHandleIsInvalid)."""
    parsed, failed = [], []
    for entry in entries:
        try:
            job_id, lease = names.parse_receipt_handle(entry.receipt_handle)
        except SqsError as exc:
            failed.append(_failed(entry.id, exc))
            continue
        parsed.append((entry, job_id, lease))
    return parsed, failed


async def delete_message_batch(ctx: Context, request: DeleteMessageBatch) -> dict[str, Any]:
    """DeleteMessageBatch: up to 10 deletes in one fenced ack; a malformed handle fails its
    entry (ReceiptHandleIsInvalid), a stale one succeeds as DeleteMessage does."""
    check_entries(request.entries, lambda entry: entry.id)
    await ctx.queue(request.queue_url)
    parsed, failed = _handles(request.entries)
    acks = [
        (entry.id, AckEntry(id=job_id, receipt_handle=lease)) for entry, job_id, lease in parsed
    ]
    for members in _rounds([ack.id for _, ack in acks]):
        await ctx.client.ack_many([acks[index][1] for index in members])
    return {"Successful": [{"Id": entry_id} for entry_id, _ in acks], "Failed": failed}


def _rounds(ids: Sequence[uuid.UUID]) -> list[list[int]]:
    """Indexes of `ids` in rounds where each job appears once: jobq settles a job once per
    statement, and a batch may name one message by two receipt handles (one stale)."""
    rounds: list[list[int]] = []
    seen: list[set[uuid.UUID]] = []
    for index, job_id in enumerate(ids):
        for taken, members in zip(seen, rounds, strict=True):
            if job_id not in taken:
                taken.add(job_id)
                members.append(index)
                break
        else:
            seen.append({job_id})
            rounds.append([index])
    return rounds


def _visibility_error(status: int, handle: str) -> SqsError:
    if status == 404:
        return SqsError(RECEIPT_HANDLE_IS_INVALID, f'The receipt handle "{handle}" is not valid.')
    return SqsError(
        MESSAGE_NOT_INFLIGHT,
        "Value for parameter ReceiptHandle is invalid. Reason: Message does not exist or is "
        "not available for visibility timeout change.",
    )


async def change_message_visibility(
    ctx: Context, request: ChangeMessageVisibility
) -> dict[str, Any]:
    """ChangeMessageVisibility: the lease now ends VisibilityTimeout seconds from now (12 h
    from the receive at most); 0 releases the message. MessageNotInflight when the handle is
    no longer current, ReceiptHandleIsInvalid for an unknown message."""
    await ctx.queue(request.queue_url)
    job_id, lease = names.parse_receipt_handle(request.receipt_handle)
    entry = HeartbeatEntry(
        id=job_id, receipt_handle=lease, visibility_timeout=request.visibility_timeout
    )
    [result] = await ctx.client.heartbeat_many([entry])
    if result.status != 200:
        raise _visibility_error(result.status, request.receipt_handle)
    return {}


async def change_message_visibility_batch(
    ctx: Context, request: ChangeMessageVisibilityBatch
) -> dict[str, Any]:
    """ChangeMessageVisibilityBatch: up to 10 lease changes in one statement; each entry
    succeeds or fails alone."""
    check_entries(request.entries, lambda entry: entry.id)
    await ctx.queue(request.queue_url)
    parsed, failed = _handles(request.entries)
    pending = [
        (
            item.id,
            item.receipt_handle,
            HeartbeatEntry(
                id=job_id,
                receipt_handle=lease,
                visibility_timeout=item.visibility_timeout,
            ),
        )
        for item, job_id, lease in parsed
    ]
    successful = []
    for members in _rounds([entry.id for _, _, entry in pending]):
        results = await ctx.client.heartbeat_many([pending[index][2] for index in members])
        for index, result in zip(members, results, strict=True):
            entry_id, handle, _ = pending[index]
            if result.status == 200:
                successful.append({"Id": entry_id})
            else:
                failed.append(_failed(entry_id, _visibility_error(result.status, handle)))
    return {"Successful": successful, "Failed": failed}

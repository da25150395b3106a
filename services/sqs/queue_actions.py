"""The SQS queue actions over the queue service's SQS registry and depth: CreateQueue,
GetQueueUrl, ListQueues, DeleteQueue, Get/SetQueueAttributes, PurgeQueue, and the dead-letter
queue actions (ListDeadLetterSourceQueues, Start/List/CancelMessageMoveTask).

SQS dead-letter queues are separate queues; jobq dead-letters a job in its own queue
(status DEAD_LETTER). The two meet here: before a dead-letter queue is read (received from,
its attributes asked for), the dead letters of the queues whose RedrivePolicy names it are
moved into it, PENDING with their receive count reset (`take_dead_letters`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from common.errors import QueueExists
from common.sqs_registry import SqsMoveRequest, SqsQueue
from services.sqs import attributes, names
from services.sqs.context import Context
from services.sqs.errors import (
    INVALID_ATTRIBUTE_NAME,
    QUEUE_DOES_NOT_EXIST,
    QUEUE_NAME_EXISTS,
    RESOURCE_NOT_FOUND,
    SqsError,
    invalid,
)
from services.sqs.wire import (
    CancelMessageMoveTask,
    CreateQueue,
    GetQueueAttributes,
    GetQueueUrl,
    ListDeadLetterSourceQueues,
    ListMessageMoveTasks,
    ListQueues,
    QueueRequest,
    SetQueueAttributes,
    StartMessageMoveTask,
)

MOVE_TASKS = f"{attributes.INTERNAL_PREFIX}MoveTasks"
"""The dead-letter queue's bookkeeping key listing its last message move tasks."""
MOVE_TASKS_KEPT = 10


async def _check_redrive(ctx: Context, account: str, checked: dict[str, str]) -> None:
    """A RedrivePolicy's target must be a queue of the same account (jobq moves dead
    letters within a tenant)."""
    policy = checked.get("RedrivePolicy")
    if not policy:
        return
    target = attributes.parse_redrive_policy(policy).deadLetterTargetArn
    target_account, target_name = names.parse_arn(target)
    if target_account != account:
        raise invalid(
            "Value for parameter RedrivePolicy is invalid. Reason: the dead letter "
            "target must be in the queue's own account."
        )
    try:
        await ctx.named(account, target_name, fresh=True)
    except SqsError:
        raise invalid(
            f"Value {policy} for parameter RedrivePolicy is invalid. Reason: Dead letter "
            "target does not exist."
        ) from None


async def create_queue(ctx: Context, request: CreateQueue) -> dict[str, Any]:
    """CreateQueue: declare the queue in the caller's account (idempotent with the same
    attributes; QueueNameExists with others, or when the jobq queue it maps to belongs to
    another SQS queue)."""
    name = names.check_sqs_name(request.queue_name)
    checked = attributes.check(request.attributes)
    account = ctx.account()
    await _check_redrive(ctx, account, checked)
    try:
        queue, created = await ctx.client.declare(account, name, names.jobq_queue(name), checked)
    except QueueExists as exc:
        raise SqsError(
            QUEUE_NAME_EXISTS, f"A queue already exists with the same name: {exc}"
        ) from None
    if not created and attributes.visible(queue.attributes) != attributes.visible(checked):
        raise SqsError(
            QUEUE_NAME_EXISTS, f"A queue named {name} already exists with other attributes."
        )
    return {"QueueUrl": ctx.url(queue)}


async def get_queue_url(ctx: Context, request: GetQueueUrl) -> dict[str, Any]:
    """GetQueueUrl: the URL of a queue of the caller's account (or QueueOwnerAWSAccountId)."""
    account = request.queue_owner_aws_account_id
    if not names.is_account(account or ctx.caller.owner) or not names.is_sqs_name(
        request.queue_name
    ):
        raise SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")
    queue = await ctx.named(ctx.account(account), request.queue_name)
    return {"QueueUrl": ctx.url(queue)}


async def list_queues(ctx: Context, request: ListQueues) -> dict[str, Any]:
    """ListQueues: the caller's queues (an admin key of `*`: every tenant's) named
    QueueNamePrefix…, by name; pages of MaxResults with NextToken (without MaxResults, the
    first 1000, as SQS)."""
    limit = request.max_results or 1000
    after = request.next_token
    if after is not None and not names.is_sqs_name(after):
        raise invalid("Invalid NextToken value.")
    if request.queue_name_prefix and not names.is_sqs_name(request.queue_name_prefix):
        raise invalid("QueueNamePrefix can only include alphanumeric characters, - and _.")
    page = await ctx.client.list_queues(ctx.caller.scope, request.queue_name_prefix, after, limit)
    reply: dict[str, Any] = {}
    if page.items:
        reply["QueueUrls"] = [ctx.url(queue) for queue in page.items]
    if page.next_name is not None and request.max_results is not None:
        reply["NextToken"] = page.next_name
    return reply


async def delete_queue(ctx: Context, request: QueueRequest) -> dict[str, Any]:
    """DeleteQueue (admin keys): forget the queue and delete its unfinished messages."""
    ctx.require_admin("DeleteQueue")
    queue = await ctx.queue(request.queue_url)
    await ctx.client.delete(queue.tenant, queue.name)
    return {}


async def purge_queue(ctx: Context, request: QueueRequest) -> dict[str, Any]:
    """PurgeQueue (admin keys): delete every message of the queue, in flight ones too."""
    ctx.require_admin("PurgeQueue")
    queue = await ctx.queue(request.queue_url)
    await ctx.client.purge(queue.tenant, queue.name)
    return {}


async def dead_letter_sources(ctx: Context, queue: SqsQueue) -> list[SqsQueue]:
    """The queues whose RedrivePolicy names `queue` as their dead-letter queue."""
    arn = ctx.arn(queue)
    sources = []
    for candidate in await ctx.client.all_queues(queue.tenant):
        policy = candidate.attributes.get("RedrivePolicy")
        if policy and attributes.parse_redrive_policy(policy).deadLetterTargetArn == arn:
            sources.append(candidate)
    return sources


async def take_dead_letters(ctx: Context, queue: SqsQueue) -> int:
    """Move the dead letters of `queue`'s source queues into it; how many moved."""
    moved = 0
    receive_count = attributes.config(queue.attributes).max_receive_count
    for source in await dead_letter_sources(ctx, queue):
        moved += await ctx.client.move(
            SqsMoveRequest(
                source=source.queue,
                destination=queue.queue,
                status="DEAD_LETTER",
                max_attempts=receive_count,
            )
        )
    return moved


async def get_queue_attributes(ctx: Context, request: GetQueueAttributes) -> dict[str, Any]:
    """GetQueueAttributes: `All` or the names asked for (InvalidAttributeName for unknown
    ones); the Approximate* counts are jobq's depth (PENDING, PROCESSING, SCHEDULED)."""
    queue = await ctx.queue(request.queue_url)
    wanted = set(request.attribute_names)
    unknown = wanted - attributes.ALL_NAMES - {"All"}
    if unknown:
        raise SqsError(INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {sorted(unknown)[0]}.")
    everything = "All" in wanted
    found = attributes.visible(queue.attributes)
    found["QueueArn"] = ctx.arn(queue)
    found["CreatedTimestamp"] = str(int(queue.created_at.timestamp()))
    found["LastModifiedTimestamp"] = str(int(queue.updated_at.timestamp()))
    if everything or any(name.startswith("Approximate") for name in wanted):
        await take_dead_letters(ctx, queue)
        depth = {entry.queue: entry for entry in (await ctx.client.depth()).queues}
        entry = depth.get(queue.queue)
        found["ApproximateNumberOfMessages"] = str(entry.pending if entry else 0)
        found["ApproximateNumberOfMessagesNotVisible"] = str(entry.processing if entry else 0)
        found["ApproximateNumberOfMessagesDelayed"] = str(entry.scheduled if entry else 0)
    shown = {k: v for k, v in found.items() if everything or k in wanted}
    return {"Attributes": shown} if shown else {}


async def set_queue_attributes(ctx: Context, request: SetQueueAttributes) -> dict[str, Any]:
    """SetQueueAttributes: set the given attributes (an empty RedrivePolicy removes it).
    Messages already sent keep the maxReceiveCount they were sent with."""
    queue = await ctx.queue(request.queue_url)
    checked = attributes.check(request.attributes)
    await _check_redrive(ctx, queue.tenant, checked)
    await ctx.client.set_attributes(queue.tenant, queue.name, checked)
    return {}


async def list_dead_letter_source_queues(
    ctx: Context, request: ListDeadLetterSourceQueues
) -> dict[str, Any]:
    """ListDeadLetterSourceQueues: the URLs of the queues that dead-letter into this one."""
    queue = await ctx.queue(request.queue_url)
    sources = await dead_letter_sources(ctx, queue)
    return {"queueUrls": [ctx.url(source) for source in sources]}


class _MoveTask(msgspec.Struct, rename="pascal", omit_defaults=True):
    task_handle: str
    status: str
    source_arn: str
    destination_arn: str
    approximate_number_of_messages_moved: int
    started_timestamp: int


async def start_message_move_task(ctx: Context, request: StartMessageMoveTask) -> dict[str, Any]:
    """StartMessageMoveTask (admin keys): move the messages waiting in a dead-letter queue to
    DestinationArn, or to its one source queue. The move runs at once, in statements of 500
    messages, so the task is COMPLETED when this answers."""
    ctx.require_admin("StartMessageMoveTask")
    account, name = names.parse_arn(request.source_arn)
    dead_letters = await ctx.named(ctx.account(account), name)
    sources = await dead_letter_sources(ctx, dead_letters)
    if not sources:
        raise invalid("Source queue must be configured as a Dead Letter Queue.")
    if request.destination_arn is not None:
        to_account, to_name = names.parse_arn(request.destination_arn)
        destination = await ctx.named(ctx.account(to_account), to_name)
    elif len(sources) == 1:
        destination = sources[0]
    else:
        raise invalid("DestinationArn is required: the dead-letter queue has several sources.")
    await take_dead_letters(ctx, dead_letters)
    moved = await ctx.client.move(
        SqsMoveRequest(
            source=dead_letters.queue,
            destination=destination.queue,
            status="PENDING",
            max_attempts=attributes.config(destination.attributes).max_receive_count,
        )
    )
    task = _MoveTask(
        task_handle=uuid.uuid4().hex,
        status="COMPLETED",
        source_arn=ctx.arn(dead_letters),
        destination_arn=ctx.arn(destination),
        approximate_number_of_messages_moved=moved,
        started_timestamp=int(time.time() * 1000),
    )
    kept = [*_tasks(dead_letters)[-(MOVE_TASKS_KEPT - 1) :], task]
    record = msgspec.json.encode(kept).decode()
    await ctx.client.set_attributes(dead_letters.tenant, dead_letters.name, {MOVE_TASKS: record})
    return {"TaskHandle": task.task_handle}


def _tasks(queue: SqsQueue) -> list[_MoveTask]:
    return msgspec.json.decode(queue.attributes.get(MOVE_TASKS) or "[]", type=list[_MoveTask])


async def list_message_move_tasks(ctx: Context, request: ListMessageMoveTasks) -> dict[str, Any]:
    """ListMessageMoveTasks: the dead-letter queue's latest move tasks, newest first."""
    account, name = names.parse_arn(request.source_arn)
    queue = await ctx.named(ctx.account(account), name, fresh=True)
    tasks = list(reversed(_tasks(queue)))[: request.max_results or 1]
    return {"Results": [msgspec.to_builtins(task) for task in tasks]}


async def cancel_message_move_task(ctx: Context, request: CancelMessageMoveTask) -> dict[str, Any]:
    """CancelMessageMoveTask: jobq's move tasks finish before StartMessageMoveTask answers,
    so there is never one to cancel (ResourceNotFoundException)."""
    raise SqsError(RESOURCE_NOT_FOUND, f"No running message move task {request.task_handle}.")

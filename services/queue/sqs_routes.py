"""Internal routes of the SQS queue registry (`/sqs/...`), used by the SQS endpoint only
(services.sqs; docs/architecture.md#sqs-compatibility): declare, read, list, change and delete
the SQS queues of a tenant, purge one, and move jobs between queues (SQS dead-letter queues).
"""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Response, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody, Parameter, QueryParameter

from common.contracts import NAME_PATTERN
from common.sqs_registry import (
    SQS_LIST_MAX,
    SQS_NAME_PATTERN,
    SqsAttributesRequest,
    SqsCountReply,
    SqsMoveRequest,
    SqsQueue,
    SqsQueueList,
    SqsQueueReply,
    SqsQueueRequest,
)
from common.web.app import problems
from common.web.bodies import StrictJSON
from services.queue.sqs_store import SqsStore

TenantPath = Annotated[str, Parameter(pattern=NAME_PATTERN)]
NamePath = Annotated[str, Parameter(pattern=SQS_NAME_PATTERN)]


class SqsController(Controller):
    """The SQS endpoint's queue registry and job moves (internal)."""

    path = "/sqs"
    tags = ["sqs"]

    @post(
        "/queues",
        status_code=201,
        dto=StrictJSON[SqsQueueRequest],
        summary="Declare an SQS queue (or find the one declared)",
        responses={
            200: ResponseSpec(SqsQueueReply, description="Declared before: the queue as it is"),
            **problems(409, 413, 415),
        },
    )
    async def declare(
        self, data: JSONBody[SqsQueueRequest], sqs_store: NamedDependency[SqsStore]
    ) -> Response[SqsQueueReply]:
        """201 created, 200 when it exists (with the attributes it has), 409 when the jobq
        queue belongs to another SQS queue."""
        queue, created = await sqs_store.declare(
            data.tenant, data.name, data.queue, data.attributes
        )
        return Response(
            SqsQueueReply(created=created, queue=queue), status_code=201 if created else 200
        )

    @get("/queues", summary="List SQS queues", responses=problems())
    async def list_queues(
        self,
        sqs_store: NamedDependency[SqsStore],
        tenant: Annotated[str | None, QueryParameter(pattern=NAME_PATTERN)] = None,
        prefix: Annotated[str, QueryParameter(pattern=r"^[A-Za-z0-9_-]{0,80}$")] = "",
        after: Annotated[str | None, QueryParameter(pattern=SQS_NAME_PATTERN)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=SQS_LIST_MAX)] = SQS_LIST_MAX,
    ) -> SqsQueueList:
        """The queues of `tenant` (every tenant's without it) named `prefix…`, by name."""
        items, next_name = await sqs_store.list(tenant, prefix, after, limit)
        return SqsQueueList(items=items, next_name=next_name)

    @get("/queues/{tenant:str}/{name:str}", summary="Read an SQS queue", responses=problems(404))
    async def read(
        self, tenant: TenantPath, name: NamePath, sqs_store: NamedDependency[SqsStore]
    ) -> SqsQueue:
        """The queue with its attributes; 404 when not declared."""
        return await sqs_store.get(tenant, name)

    @patch(
        "/queues/{tenant:str}/{name:str}",
        dto=StrictJSON[SqsAttributesRequest],
        summary="Set an SQS queue's attributes",
        responses=problems(404, 413, 415),
    )
    async def set_attributes(
        self,
        tenant: TenantPath,
        name: NamePath,
        data: JSONBody[SqsAttributesRequest],
        sqs_store: NamedDependency[SqsStore],
    ) -> SqsQueue:
        """Set the given attributes (an empty value removes one); the queue after."""
        return await sqs_store.set_attributes(tenant, name, data.attributes)

    @delete(
        "/queues/{tenant:str}/{name:str}",
        status_code=200,
        summary="Delete an SQS queue and its unfinished jobs",
        responses=problems(404),
    )
    async def delete_queue(
        self, tenant: TenantPath, name: NamePath, sqs_store: NamedDependency[SqsStore]
    ) -> SqsCountReply:
        """Forget the queue; its PENDING, SCHEDULED and PROCESSING jobs are deleted."""
        return SqsCountReply(count=await sqs_store.delete(tenant, name))

    @post(
        "/queues/{tenant:str}/{name:str}/purge",
        status_code=200,
        summary="Delete an SQS queue's unfinished jobs",
        responses=problems(404),
    )
    async def purge(
        self, tenant: TenantPath, name: NamePath, sqs_store: NamedDependency[SqsStore]
    ) -> SqsCountReply:
        """SQS PurgeQueue: its PENDING, SCHEDULED and PROCESSING jobs are deleted."""
        return SqsCountReply(count=await sqs_store.purge(tenant, name))

    @post(
        "/move",
        status_code=200,
        dto=StrictJSON[SqsMoveRequest],
        summary="Move jobs to another queue",
        responses=problems(413, 415),
    )
    async def move(
        self, data: JSONBody[SqsMoveRequest], sqs_store: NamedDependency[SqsStore]
    ) -> SqsCountReply:
        """Dead letters into an SQS dead-letter queue, or messages back out of it."""
        moved = await sqs_store.move(
            data.source, data.destination, data.status, data.max_attempts, data.limit
        )
        return SqsCountReply(count=moved)

"""The SQS endpoint's one route: `POST /` with `X-Amz-Target: AmazonSQS.<Action>` and an
`application/x-amz-json-1.0` body (the AWS JSON 1.0 protocol botocore, the AWS CLI and
kombu use), authenticated by its SigV4 signature, dispatched to the action, answered in
SQS's shapes: the action's JSON, or an SQS error (services.sqs.errors).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from common.errors import (
    InvalidInput,
    JobqError,
    MalformedRequest,
    QueueExists,
    QueueNotFound,
    ServiceUnavailable,
)
from common.web.access import OPEN_ACCESS
from services.sqs import message_actions as m
from services.sqs import queue_actions as q
from services.sqs import wire
from services.sqs.context import Context
from services.sqs.errors import (
    INTERNAL_ERROR,
    INVALID_ACTION,
    INVALID_PARAMETER_VALUE,
    JSON_CONTENT_TYPE,
    QUEUE_DOES_NOT_EXIST,
    QUEUE_NAME_EXISTS,
    SERVICE_UNAVAILABLE,
    UNSUPPORTED_OPERATION,
    SqsError,
)

logger = logging.getLogger(__name__)

TARGET_PREFIX = "AmazonSQS."
Handler = Callable[[Context, Any], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, tuple[type[Any], Handler]] = {
    "CreateQueue": (wire.CreateQueue, q.create_queue),
    "GetQueueUrl": (wire.GetQueueUrl, q.get_queue_url),
    "ListQueues": (wire.ListQueues, q.list_queues),
    "DeleteQueue": (wire.QueueRequest, q.delete_queue),
    "PurgeQueue": (wire.QueueRequest, q.purge_queue),
    "GetQueueAttributes": (wire.GetQueueAttributes, q.get_queue_attributes),
    "SetQueueAttributes": (wire.SetQueueAttributes, q.set_queue_attributes),
    "ListDeadLetterSourceQueues": (
        wire.ListDeadLetterSourceQueues,
        q.list_dead_letter_source_queues,
    ),
    "StartMessageMoveTask": (wire.StartMessageMoveTask, q.start_message_move_task),
    "ListMessageMoveTasks": (wire.ListMessageMoveTasks, q.list_message_move_tasks),
    "CancelMessageMoveTask": (wire.CancelMessageMoveTask, q.cancel_message_move_task),
    "SendMessage": (wire.SendMessage, m.send_message),
    "SendMessageBatch": (wire.SendMessageBatch, m.send_message_batch),
    "ReceiveMessage": (wire.ReceiveMessage, m.receive_message),
    "DeleteMessage": (wire.DeleteMessage, m.delete_message),
    "DeleteMessageBatch": (wire.DeleteMessageBatch, m.delete_message_batch),
    "ChangeMessageVisibility": (wire.ChangeMessageVisibility, m.change_message_visibility),
    "ChangeMessageVisibilityBatch": (
        wire.ChangeMessageVisibilityBatch,
        m.change_message_visibility_batch,
    ),
}
UNSUPPORTED = frozenset(
    {"TagQueue", "UntagQueue", "ListQueueTags", "AddPermission", "RemovePermission"}
)
"""SQS actions jobq does not offer: UnsupportedOperation."""

_HOST = re.compile(r"[A-Za-z0-9.-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def _base_url(request: Request[Any, Any, State]) -> str:
    configured: str | None = request.app.state.public_url
    if configured:
        return configured
    host = request.headers.get("host", "")
    if not _HOST.fullmatch(host):
        host = request.app.state.own_address
    return f"{request.url.scheme}://{host}"


def _jobq_to_sqs(exc: JobqError) -> SqsError:
    if isinstance(exc, InvalidInput | MalformedRequest):
        # The endpoint validates at its boundary; this is a safety net, not a path.
        return SqsError(INVALID_PARAMETER_VALUE, exc.detail)
    if isinstance(exc, QueueNotFound):
        return SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")
    if isinstance(exc, QueueExists):
        return SqsError(QUEUE_NAME_EXISTS, exc.detail)
    if isinstance(exc, ServiceUnavailable):
        return SqsError(SERVICE_UNAVAILABLE, "The service is unavailable; retry.")
    logger.error(
        "queue service answered %s: %s",
        exc.status,
        exc.detail,
        extra={"event": "sqs_upstream_error"},
    )
    return SqsError(INTERNAL_ERROR, "The service could not complete the request.")


async def _dispatch(request: Request[Any, Any, State], action: str, body: bytes) -> bytes:
    state = request.app.state
    headers = {name.lower(): value for name, value in request.headers.items()}
    if state.verifier is None:
        caller = OPEN_ACCESS
    else:
        caller = state.verifier.verify(
            request.method,
            request.scope.get("raw_path", b"/").decode("latin-1"),
            request.scope.get("query_string", b"").decode("latin-1"),
            headers,
            body,
        )
    if action in UNSUPPORTED:
        raise SqsError(UNSUPPORTED_OPERATION, f"{action} is not supported by jobq.")
    if action not in ACTIONS:
        raise SqsError(INVALID_ACTION, f"The action {action or '(none)'} is not valid.")
    shape, handler = ACTIONS[action]
    ctx = Context(caller, state.client, state.region, _base_url(request))
    try:
        result = await handler(ctx, wire.decode_request(body, shape))
    except JobqError as exc:
        raise _jobq_to_sqs(exc) from exc
    return msgspec.json.encode(result)


@post(["/", "/{path:path}"], include_in_schema=False, status_code=200)
async def sqs_action(request: Request[Any, Any, State]) -> Response[bytes]:
    """Answer one SQS action (AWS JSON 1.0). Clients post to the endpoint's root (botocore)
    or to the queue's URL (kombu's asynchronous client): the body names the queue either way.
    Any failure is answered as an SQS error; an unexpected one as InternalError (500), which
    SDKs retry."""
    target = request.headers.get("x-amz-target", "")
    action = target.removeprefix(TARGET_PREFIX) if target.startswith(TARGET_PREFIX) else ""
    request_id = str(uuid.uuid4())
    label = action if action in ACTIONS or action in UNSUPPORTED else "unknown"
    metrics = request.app.state.metrics
    try:
        content = await _dispatch(request, action, await request.body())
    except SqsError as exc:
        error = exc
    except Exception:
        logger.exception("SQS action %s failed", label, extra={"event": "sqs_action_failed"})
        error = SqsError(INTERNAL_ERROR, "The service could not complete the request.")
    else:
        metrics.count(label, "ok")
        return Response(
            content, media_type=JSON_CONTENT_TYPE, headers={"x-amzn-RequestId": request_id}
        )
    metrics.count(label, error.kind.code)
    return Response(
        error.body(),
        status_code=error.kind.status,
        headers={**error.headers(), "x-amzn-RequestId": request_id},
    )

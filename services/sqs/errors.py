"""SQS's errors as the AWS JSON 1.0 protocol answers them.

A reply is `{"__type": "com.amazonaws.sqs#<Code>", "message": "..."}` with status 400 (403 for
authentication, 5xx for our own failures) and the header `x-amzn-query-error:
<legacy code>;<Sender|Receiver>`: botocore then raises the modelled exception named by
`__type` (`client.exceptions.QueueDoesNotExist`) whose `Error.Code` is the legacy query code
(`AWS.SimpleQueueService.NonExistentQueue`), exactly as against AWS (botocore's
`awsQueryCompatible` handling). Codes and status from the SQS API reference, "Common Errors".
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """One SQS error: its modelled code (`__type`), legacy query code, HTTP status and who is
    at fault (`Sender`: the client, `Receiver`: the service)."""

    code: str
    query_code: str
    status: int = 400
    fault: str = "Sender"
    namespace: str = "com.amazonaws.sqs"


def _kind(code: str, query_code: str | None = None, status: int = 400) -> ErrorKind:
    return ErrorKind(code, query_code or code, status, "Sender" if status < 500 else "Receiver")


def _coral(code: str, status: int) -> ErrorKind:
    # Errors raised before an operation is known (authentication, routing) come from the
    # service framework's namespace on AWS.
    return ErrorKind(code, code, status, "Sender", "com.amazon.coral.service")


QUEUE_DOES_NOT_EXIST = _kind("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
QUEUE_NAME_EXISTS = _kind("QueueNameExists", "QueueAlreadyExists")
RECEIPT_HANDLE_IS_INVALID = _kind("ReceiptHandleIsInvalid")
MESSAGE_NOT_INFLIGHT = _kind("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight")
BATCH_IDS_NOT_DISTINCT = _kind(
    "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
)
TOO_MANY_ENTRIES = _kind(
    "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
)
EMPTY_BATCH = _kind("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest")
INVALID_BATCH_ENTRY_ID = _kind("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId")
BATCH_REQUEST_TOO_LONG = _kind("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong")
INVALID_ATTRIBUTE_NAME = _kind("InvalidAttributeName")
INVALID_ATTRIBUTE_VALUE = _kind("InvalidAttributeValue")
UNSUPPORTED_OPERATION = _kind("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation")
RESOURCE_NOT_FOUND = _kind("ResourceNotFoundException")
INVALID_PARAMETER_VALUE = _kind("InvalidParameterValue")
MISSING_PARAMETER = _kind("MissingParameter")
INVALID_ADDRESS = _kind("InvalidAddress")
INVALID_ACTION = _coral("InvalidAction", 400)
ACCESS_DENIED = _coral("AccessDenied", 403)
MISSING_AUTHENTICATION = _coral("MissingAuthenticationToken", 403)
INCOMPLETE_SIGNATURE = _coral("IncompleteSignature", 403)
INVALID_CLIENT_TOKEN = _coral("InvalidClientTokenId", 403)
SIGNATURE_DOES_NOT_MATCH = _coral("SignatureDoesNotMatch", 403)
REQUEST_EXPIRED = _coral("RequestExpired", 400)
SERVICE_UNAVAILABLE = ErrorKind("ServiceUnavailable", "ServiceUnavailable", 503, "Receiver")
INTERNAL_ERROR = ErrorKind("InternalError", "InternalError", 500, "Receiver")


class SqsError(Exception):
    """An SQS error to answer: `kind` and a human `message`."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def body(self) -> bytes:
        """The JSON 1.0 error body."""
        return msgspec.json.encode(
            {"__type": f"{self.kind.namespace}#{self.kind.code}", "message": self.message}
        )

    def headers(self) -> dict[str, str]:
        """The headers of the error reply, `x-amzn-query-error` included."""
        return {
            "x-amzn-query-error": f"{self.kind.query_code};{self.kind.fault}",
            "content-type": JSON_CONTENT_TYPE,
        }


def invalid(message: str) -> SqsError:
    """InvalidParameterValue with `message`."""
    return SqsError(INVALID_PARAMETER_VALUE, message)

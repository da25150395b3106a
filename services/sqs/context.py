"""What every SQS action needs: who called, the queue service, and how to name queues."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import QueueNotFound
from common.sqs_registry import SqsQueue
from common.web.access import Caller, Role
from services.sqs import names
from services.sqs.client import QueueServiceClient
from services.sqs.errors import ACCESS_DENIED, QUEUE_DOES_NOT_EXIST, SqsError

SQS_TASK_TYPE = "sqs"
"""The task type of jobs made from SQS messages."""


@dataclass(frozen=True, slots=True)
class Context:
    """One request's caller (from its SigV4 signature), the queue service client, the region
    ARNs name and the base of the queue URLs handed out (`http://host:9324`)."""

    caller: Caller
    client: QueueServiceClient
    region: str
    base_url: str

    def account(self, account: str | None = None) -> str:
        """The tenant an action works in: `account` (a queue URL's, an ARN's, or
        QueueOwnerAWSAccountId) when the caller may reach it, else the caller's own. Raises
        AccessDenied for another tenant's account (an admin key of `*` reaches every one)."""
        if account is None:
            return self.caller.owner
        if self.caller.scope is not None and account != self.caller.scope:
            raise SqsError(ACCESS_DENIED, f"Access to the account {account} is denied.")
        return account

    def require_admin(self, action: str) -> None:
        """Raise AccessDenied unless the caller's key is an admin key."""
        if self.caller.role is not Role.ADMIN:
            raise SqsError(ACCESS_DENIED, f"{action} needs an admin key.")

    async def queue(self, url: str) -> SqsQueue:
        """The queue a queue URL names, if the caller may reach it; raises
        QueueDoesNotExist or AccessDenied."""
        account, name = names.parse_queue_url(url)
        return await self.named(self.account(account), name)

    async def named(self, account: str, name: str, *, fresh: bool = False) -> SqsQueue:
        """The queue `name` of `account`; raises QueueDoesNotExist."""
        try:
            return await self.client.get(account, name, fresh=fresh)
        except QueueNotFound:
            raise SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.") from None

    def url(self, queue: SqsQueue) -> str:
        """The queue's URL."""
        return names.queue_url(self.base_url, queue.tenant, queue.name)

    def arn(self, queue: SqsQueue) -> str:
        """The queue's ARN."""
        return names.queue_arn(self.region, queue.tenant, queue.name)

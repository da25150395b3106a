"""What a submit must pass before the producer forwards it, beyond the bounds of the wire
types: the tenant's job rate (`PRODUCER_RATE_LIMIT`, docs/architecture.md#rate-limits), the
payload check of its task type (`common.payloads`; for `email`, the sending policy of
`common.mail`) and, for email, the tenant's send rate (docs/architecture.md#email)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.contracts import SubmitJobRequest
from common.errors import RateLimited
from common.mail import EmailPolicy, parse_email
from common.payloads import PayloadCheck, check_task_payload
from common.web.access import Caller
from services.producer.limits import TenantWindow
from services.producer.metrics import ProducerMetrics


def payload_checks(email: EmailPolicy) -> dict[str, PayloadCheck]:
    """The checks of the built-in task types whose payloads the producer understands."""

    def check_email(payload: Mapping[str, Any]) -> object:
        return parse_email(payload, email)

    return {"email": check_email}


class Admission:
    """Admits submits: at most `job_rate`'s jobs per tenant and window, `checks` by task
    type, and at most `email_rate`'s email jobs per tenant and window (None: no limit),
    refusals counted in `metrics`."""

    def __init__(
        self,
        checks: Mapping[str, PayloadCheck],
        email_rate: TenantWindow | None,
        metrics: ProducerMetrics,
        job_rate: TenantWindow | None = None,
    ) -> None:
        self._checks = checks
        self._email_rate = email_rate
        self._metrics = metrics
        self._job_rate = job_rate

    async def admit_jobs(self, caller: Caller, count: int) -> None:
        """Count `count` jobs (a submit's one, a batch's entries) against the tenant's job
        rate, all or none; raise RateLimited (with the seconds to wait) when they do not fit
        in what is left of the window."""
        if self._job_rate is None:
            return
        wait = await self._job_rate.take(caller.owner, count)
        if wait is not None:
            self._metrics.count_rate_limited(caller.owner, "jobs")
            raise RateLimited(
                f"this tenant's job rate (PRODUCER_RATE_LIMIT) has less than {count} "
                "job(s) left in this window; retry after Retry-After seconds",
                retry_after=wait,
            )

    async def admit(
        self, caller: Caller, request: SubmitJobRequest, pointer: str = "/payload"
    ) -> None:
        """Raise InvalidInput (a pointer under `pointer`) for a payload its processor would
        refuse, RateLimited (with the seconds to wait) for an email over the tenant's rate."""
        check_task_payload(self._checks, request.task_type, request.payload, pointer)
        if request.task_type != "email" or self._email_rate is None:
            return
        wait = await self._email_rate.take(caller.owner)
        if wait is not None:
            self._metrics.count_rate_limited(caller.owner, "email")
            raise RateLimited(
                "this tenant's email rate (SMTP_TENANT_RATE) is used up; retry after "
                "Retry-After seconds",
                retry_after=wait,
            )

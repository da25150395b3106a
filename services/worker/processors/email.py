"""The `email` processor: send one plain-text message through the configured SMTP relay.

The payload and the sending policy are those of `common.mail` (docs/architecture.md#email),
checked when the job was submitted and again here, by the same function (`parse_email`, which
builds the message with `build_message`, as this processor then does): the envelope sender is
always `SMTP_SENDER`, the `From` header is `SMTP_SENDER` or a chosen sender allowed by
`SMTP_ALLOWED_SENDERS`, and `replyTo` becomes `Reply-To`.

Delivery is at-least-once, so the `Message-ID` is derived from the job id (`<job-id@jobq>`): a
retry of the same job produces the same id, which receivers and relays can deduplicate on (RFC 5322
§3.6.4). Outcomes: `{"messageId": ..., "recipients": [accepted...]}`, plus `"refused"` when the
relay accepted only some recipients (not retried: the others already have the message). Permanent
SMTP replies (5xx, RFC 5321 §4.2.1) and bad payloads → `NonRetryable`; transient replies (4xx),
connection errors and timeouts → `Retry`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any

import aiosmtplib

from common.mail import EmailPolicy, EmailRequest, build_message, parse_email
from common.payloads import PayloadProblem
from jobq.processors import JobContext, NonRetryable, Retry
from services.worker.processors.spans import smtp_span


class EmailProcessor:
    """Sends the payload as a plain-text message via SMTP at `host:port` (no TLS), `timeout` in
    seconds per SMTP operation, with `sender` as the envelope sender always and as `From`
    unless the payload names a sender `policy` allows."""

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        timeout: float,
        policy: EmailPolicy | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._sender = sender
        self._timeout = timeout
        self._policy = policy or EmailPolicy()

    def prepare(self, job: JobContext) -> tuple[EmailRequest, EmailMessage]:
        """What is sent for `job`, before any network: the checked request and its message.
        Raises NonRetryable for a payload it cannot send (what `parse_email` refuses)."""
        request = parse_email_payload(job.payload, self._policy)
        return request, build_email(job.id, request, request.sender or self._sender)

    async def __call__(self, job: JobContext) -> dict[str, Any]:
        """Send one attempt; returns the Message-ID and accepted recipients."""
        request, message = self.prepare(job)
        try:
            with smtp_span(self._host, self._port, len(request.recipients)):
                refused, _ = await aiosmtplib.send(
                    message,
                    sender=self._sender,
                    recipients=request.recipients,
                    hostname=self._host,
                    port=self._port,
                    timeout=self._timeout,
                    start_tls=False,
                    use_tls=False,
                )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise _recipients_refused(exc) from exc
        except aiosmtplib.SMTPResponseException as exc:
            raise _smtp_reply(exc.code, exc.message) from exc
        except aiosmtplib.SMTPNotSupported as exc:
            raise NonRetryable(f"SMTP server cannot send this message: {exc.message}") from exc
        except (aiosmtplib.SMTPException, OSError) as exc:  # OSError covers TimeoutError
            raise Retry(f"SMTP {self._host}:{self._port} failed: {exc!r}") from exc
        result: dict[str, Any] = {
            "messageId": str(message["Message-ID"]),
            "recipients": [r for r in request.recipients if r not in refused],
        }
        if refused:
            result["refused"] = {r: f"{reply.code} {reply.message}" for r, reply in refused.items()}
        return result


def parse_email_payload(
    payload: Mapping[str, Any], policy: EmailPolicy | None = None
) -> EmailRequest:
    """Validate the payload against its shape and `policy` (no chosen sender, any recipient
    by default); raises NonRetryable naming the field when bad."""
    try:
        return parse_email(payload, policy or EmailPolicy())
    except PayloadProblem as problem:
        raise NonRetryable(f"email payload {problem.pointer}: {problem.detail}") from None


def build_email(job_id: uuid.UUID, request: EmailRequest, sender: str) -> EmailMessage:
    """The message for `request` from `sender` (the `From` header), with
    `Message-ID: <job_id@jobq>` stable across attempts (`common.mail.build_message`); raises
    NonRetryable when it cannot be built."""
    try:
        return build_message(request, sender, f"<{job_id}@jobq>")
    except PayloadProblem as problem:
        raise NonRetryable(f"cannot build the email message: {problem}") from None


def _smtp_reply(code: int, text: str) -> Exception:
    if 500 <= code < 600:
        return NonRetryable(f"SMTP server refused the message permanently: {code} {text}")
    return Retry(f"SMTP server deferred the message: {code} {text}")


def _recipients_refused(exc: aiosmtplib.SMTPRecipientsRefused) -> Exception:
    # Every recipient was refused; retrying helps only if every refusal was transient (4xx).
    details = "; ".join(f"{r.recipient}: {r.code} {r.message}" for r in exc.recipients)
    if exc.recipients and all(400 <= r.code < 500 for r in exc.recipients):
        return Retry(f"SMTP server deferred all recipients: {details}")
    return NonRetryable(f"SMTP server refused all recipients: {details}")

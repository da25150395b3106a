"""The `email` processor: send one plain-text message through the configured SMTP relay.

Payload (a JSON object; other keys are refused):

    {"to": "a@example.com" | ["a@example.com", ...],   # required, 1..100 addresses
     "subject": "Hello",                                 # required, one line
     "body": "text",                                     # optional, default ""
     "from": "team@example.com"}                         # optional, default SMTP_SENDER

Delivery is at-least-once, so the `Message-ID` is derived from the job id (`<job-id@jobq>`): a
retry of the same job produces the same id, which receivers and relays can deduplicate on (RFC 5322
§3.6.4). Outcomes: `{"messageId": ..., "recipients": [accepted...]}`, plus `"refused"` when the
relay accepted only some recipients (not retried: the others already have the message). Permanent
SMTP replies (5xx, RFC 5321 §4.2.1) and bad payloads → `NonRetryable`; transient replies (4xx),
connection errors and timeouts → `Retry`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from email.errors import MessageError
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any, Final

import aiosmtplib

from services.worker.processors.base import JobContext, NonRetryable, Retry

MAX_RECIPIENTS: Final = 100  # RFC 5321 §4.5.3.1.8: relays must accept at least 100
_PAYLOAD_KEYS: Final = frozenset({"to", "subject", "body", "from"})
# Deliberately loose (one '@', something either side) but rejecting characters that would let an
# "address" smuggle extra header syntax or recipients.
_ADDRESS: Final = re.compile(
    r"[^@\s<>()\[\]\\,;:\"\x00-\x1f\x7f]+@[^@\s<>()\[\]\\,;:\"\x00-\x1f\x7f]+"
)
_MAX_ADDRESS_LENGTH: Final = 254


@dataclass(frozen=True, slots=True)
class EmailRequest:
    """A validated payload: recipients (deduplicated, in order), subject, body, sender or None."""

    recipients: list[str]
    subject: str
    body: str
    sender: str | None


class EmailProcessor:
    """Sends the payload as a plain-text message via SMTP at `host:port` (no TLS), `timeout` in
    seconds per SMTP operation, from `sender` unless the payload names one."""

    def __init__(self, host: str, port: int, sender: str, timeout: float) -> None:
        self._host = host
        self._port = port
        self._sender = sender
        self._timeout = timeout

    async def __call__(self, job: JobContext) -> dict[str, Any]:
        """Send one attempt; returns the Message-ID and accepted recipients."""
        request = parse_email_payload(job.payload)
        sender = request.sender or self._sender
        message = build_message(job.id, request, sender)
        try:
            refused, _ = await aiosmtplib.send(
                message,
                sender=sender,
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


def parse_email_payload(payload: Mapping[str, Any]) -> EmailRequest:
    """Validate the payload (shape in the module docstring); raises NonRetryable when bad."""
    unknown = sorted(set(payload) - _PAYLOAD_KEYS)
    if unknown:
        raise NonRetryable(
            f"email payload has unknown keys {unknown}; allowed: to, subject, body, from"
        )
    subject = payload.get("subject")
    if not isinstance(subject, str):
        raise NonRetryable("email payload needs `subject`, a string")
    if "\r" in subject or "\n" in subject:
        raise NonRetryable("email `subject` must be a single line")
    body = payload.get("body")
    if body is None:
        body = ""
    if not isinstance(body, str):
        raise NonRetryable("email `body` must be a string")
    sender = payload.get("from")
    if sender is not None:
        sender = _check_address(sender, "from")
    return EmailRequest(_parse_recipients(payload.get("to")), subject, body, sender)


def _parse_recipients(value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise NonRetryable("email payload needs `to`: an address or a non-empty list of them")
    recipients = list(dict.fromkeys(_check_address(item, "to") for item in items))
    if len(recipients) > MAX_RECIPIENTS:
        raise NonRetryable(f"email `to` has {len(recipients)} addresses; at most {MAX_RECIPIENTS}")
    return recipients


def _check_address(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise NonRetryable(f"email `{field}` entries must be strings, not {type(value).__name__}")
    if len(value) > _MAX_ADDRESS_LENGTH or not _ADDRESS.fullmatch(value):
        raise NonRetryable(f"email `{field}` has {value!r}, which is not an address like a@b")
    return value


def build_message(job_id: uuid.UUID, request: EmailRequest, sender: str) -> EmailMessage:
    """The message for `request`, with `Message-ID: <job_id@jobq>` stable across attempts."""
    message = EmailMessage()
    try:
        message["From"] = sender
        message["To"] = ", ".join(request.recipients)
        message["Subject"] = request.subject
        message["Date"] = formatdate(usegmt=True)
        message["Message-ID"] = f"<{job_id}@jobq>"
        message.set_content(request.body)
    except (MessageError, ValueError) as exc:
        raise NonRetryable(f"cannot build the email message: {exc}") from exc
    return message


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

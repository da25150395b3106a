"""The `email` payload and the sending policy (docs/architecture.md#email), shared by the
producer, which refuses a bad email job when it is submitted (422), and the worker's email
processor, which checks again before sending (a job can also arrive by `jobq.enqueue` or the
queue service's internal API).

Payload (a JSON object; other keys are refused):

    {"to": "a@example.com" | ["a@example.com", ...],   # required, 1..100 addresses
     "subject": "Hello",                                 # required, one line, no controls
     "body": "text",                                     # optional, default ""
     "from": "alerts@acme.example",                      # optional, only an allowed sender
     "replyTo": "me@anywhere.example"}                   # optional, any address

One function decides whether a payload can be sent, at submit and on the worker alike:
`parse_email`, which also builds (and serialises) the message the worker would send, with the
email library the worker sends it with (`build_message`). So any payload the worker would
refuse is refused at submit too (a subject with U+2028, which the email library splits lines
on, was accepted and then dead-lettered).

The envelope sender (SMTP `MAIL FROM`) is always the operator's `SMTP_SENDER`, so bounces and
SPF/DMARC alignment stay with the operator. A submitter chooses the `From` header only among
`SMTP_ALLOWED_SENDERS` (none by default); to have replies reach them, they set `replyTo`.
`SMTP_ALLOWED_RECIPIENT_DOMAINS`, when set, limits where mail may go. Without these checks the
processor was an authenticated open relay: any key could send as any bank to anyone.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.errors import MessageError
from email.generator import BytesGenerator
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import formatdate
from typing import Any, Final

from common.payloads import PayloadProblem

MAX_RECIPIENTS: Final = 100  # RFC 5321 §4.5.3.1.8: relays must accept at least 100
_KEYS: Final = frozenset({"to", "subject", "body", "from", "replyTo"})
# Deliberately loose (one '@', something either side) but rejecting characters that would let an
# "address" smuggle extra header syntax or recipients.
_ADDRESS: Final = re.compile(
    r"[^@\s<>()\[\]\\,;:\"\x00-\x1f\x7f]+@[^@\s<>()\[\]\\,;:\"\x00-\x1f\x7f]+"
)
_MAX_ADDRESS_LENGTH: Final = 254
# What may not be in a one-line subject: every line boundary str.splitlines() knows (the email
# library refuses a header holding any: LF, CR, VT, FF, FS, GS, RS, NEL, U+2028, U+2029), and
# the other C0/C1 controls and DEL, which have no business in a subject either. Tab may stay.
_NOT_IN_SUBJECT: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_CHECK_SENDER: Final = "jobq-check@localhost"
"""The `From` a payload without a chosen sender is checked with (the worker's is `SMTP_SENDER`)."""


@dataclass(frozen=True, slots=True)
class EmailPolicy:
    """Who may be named as sender and who may receive.

    `allowed_senders` are addresses (`alerts@acme.example`) or whole domains
    (`@news.acme.example`); empty allows no chosen sender. `recipient_domains` are domains
    recipients must be at exactly; empty allows any. Comparisons ignore case.
    """

    allowed_senders: tuple[str, ...] = ()
    recipient_domains: tuple[str, ...] = ()

    @classmethod
    def of(cls, senders: Iterable[str], domains: Iterable[str]) -> EmailPolicy:
        """A policy from setting entries; raises ValueError for an entry that is neither an
        address nor `@domain` (senders) or not a bare domain (recipient domains)."""
        allowed = tuple(entry.strip().lower() for entry in senders if entry.strip())
        for entry in allowed:
            if not (entry.startswith("@") and "@" not in entry[1:]) and not _ADDRESS.fullmatch(
                entry
            ):
                raise ValueError(f"{entry!r} is neither an address nor @domain")
        recipients = tuple(entry.strip().lower().lstrip("@") for entry in domains if entry.strip())
        for entry in recipients:
            if not entry or "@" in entry or not _ADDRESS.fullmatch(f"x@{entry}"):
                raise ValueError(f"{entry!r} is not a domain")
        return cls(allowed, recipients)

    def sender_allowed(self, address: str) -> bool:
        """Whether `address` may appear as the `From` of a mail."""
        address = address.lower()
        domain = "@" + address.rpartition("@")[2]
        return address in self.allowed_senders or domain in self.allowed_senders

    def recipient_allowed(self, address: str) -> bool:
        """Whether mail may go to `address`."""
        if not self.recipient_domains:
            return True
        return address.rpartition("@")[2].lower() in self.recipient_domains


@dataclass(frozen=True, slots=True)
class EmailRequest:
    """A valid payload: recipients (deduplicated, in order), subject, body, the chosen sender
    (None: the operator's) and the Reply-To address (None: none)."""

    recipients: list[str]
    subject: str
    body: str
    sender: str | None
    reply_to: str | None


def parse_email(payload: Mapping[str, Any], policy: EmailPolicy) -> EmailRequest:
    """Validate an email payload against its shape and `policy`.

    Raises PayloadProblem with a pointer into the payload (`/from`, `/to/1`) and what is
    wrong.
    """
    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise PayloadProblem(
            f"/{unknown[0]}", f"unknown key; email payloads have {', '.join(sorted(_KEYS))}"
        )
    subject = payload.get("subject")
    if not isinstance(subject, str):
        raise PayloadProblem("/subject", "email payloads need `subject`, a string")
    bad = _NOT_IN_SUBJECT.search(subject)
    if bad is not None:
        raise PayloadProblem(
            "/subject",
            f"the subject must be a single line of text (U+{ord(bad.group()):04X} is a line "
            "break or a control character)",
        )
    body = payload.get("body")
    if body is None:
        body = ""
    if not isinstance(body, str):
        raise PayloadProblem("/body", "the body must be a string")
    sender = payload.get("from")
    if sender is not None:
        sender = _address(sender, "/from")
        if not policy.sender_allowed(sender):
            raise PayloadProblem(
                "/from",
                f"{sender!r} is not an allowed sender (SMTP_ALLOWED_SENDERS); "
                "use replyTo to receive the replies",
            )
    reply_to = payload.get("replyTo")
    if reply_to is not None:
        reply_to = _address(reply_to, "/replyTo")
    request = EmailRequest(_recipients(payload.get("to"), policy), subject, body, sender, reply_to)
    # What the worker will do with it, so nothing it would refuse is accepted here.
    build_message(request, sender or _CHECK_SENDER, "<check@jobq>")
    return request


def build_message(request: EmailRequest, sender: str, message_id: str) -> EmailMessage:
    """The plain-text message for `request` with `sender` as `From` and `message_id` as
    `Message-ID`, serialised once as SMTP will send it (`email.policy.SMTP`, as aiosmtplib
    flattens it) so that whatever the email library refuses is refused here. Raises
    PayloadProblem pointing at the field it refused (`/subject`, `/body`, ...)."""
    message = EmailMessage()
    headers = [
        ("From", sender, "/from"),
        ("To", ", ".join(request.recipients), "/to"),
        ("Subject", request.subject, "/subject"),
        ("Date", formatdate(usegmt=True), ""),
        ("Message-ID", message_id, ""),
    ]
    if request.reply_to is not None:
        headers.append(("Reply-To", request.reply_to, "/replyTo"))
    for name, value, pointer in headers:
        try:
            message[name] = value
        except (MessageError, ValueError) as exc:
            raise PayloadProblem(pointer, f"cannot be a {name} header: {exc}") from None
    try:
        message.set_content(request.body)
    except (MessageError, ValueError) as exc:
        raise PayloadProblem("/body", f"cannot be a message body: {exc}") from None
    try:
        BytesGenerator(io.BytesIO(), policy=SMTP).flatten(message)
    except (MessageError, ValueError) as exc:  # UnicodeError is a ValueError
        raise PayloadProblem("", f"cannot be sent as a message: {exc}") from None
    return message


def _recipients(value: object, policy: EmailPolicy) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise PayloadProblem("/to", "email payloads need `to`: an address or a list of them")
    pointers = ["/to"] if isinstance(value, str) else [f"/to/{i}" for i in range(len(items))]
    recipients: list[str] = []
    for item, pointer in zip(items, pointers, strict=True):
        address = _address(item, pointer)
        if not policy.recipient_allowed(address):
            raise PayloadProblem(
                pointer, f"mail to {address!r} is not allowed (SMTP_ALLOWED_RECIPIENT_DOMAINS)"
            )
        if address not in recipients:
            recipients.append(address)
    if len(recipients) > MAX_RECIPIENTS:
        raise PayloadProblem("/to", f"{len(recipients)} addresses; at most {MAX_RECIPIENTS}")
    return recipients


def _address(value: object, pointer: str) -> str:
    if not isinstance(value, str):
        raise PayloadProblem(pointer, f"an address is a string, not {type(value).__name__}")
    if len(value) > _MAX_ADDRESS_LENGTH or not _ADDRESS.fullmatch(value):
        raise PayloadProblem(pointer, f"{value!r} is not an address like a@b")
    return value

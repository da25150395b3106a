"""A local SMTP sink for development and tests: accepts every message and keeps none of it.

Each message received is logged as one line (`event=mail_received`, with sender, recipients,
subject and size in bytes) and, with `--mailbox PATH`, appended to that file as one JSON object
per line::

    {"from": "...", "to": ["..."], "subject": "...", "body": "...", "receivedAt": "..."}

`body` is the message's text (the text/plain part, else text/html, else the raw message) and
`receivedAt` an ISO 8601 UTC timestamp. Nothing is relayed; no authentication or TLS.

Usage::

    python -m infra.smtp_sink [--host 127.0.0.1] [--port 2525] [--mailbox PATH]
                              [--log-level INFO] [--log-format text|json]

Defaults come from SMTP_HOST, SMTP_PORT, LOG_LEVEL and LOG_FORMAT (text), else 127.0.0.1:2525.
`--port 0` picks a free port (logged at start). SIGTERM and SIGINT stop it cleanly (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email
import email.policy
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from common.logging import configure_logging

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "MailSink", "main", "serve", "start_server"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 2525
DATA_SIZE_LIMIT = 32 * 1024 * 1024
"""Largest message accepted, in bytes (the aiosmtpd default)."""

logger = logging.getLogger(__name__ if __name__ != "__main__" else "infra.smtp_sink")


def _one_line(text: str) -> str:
    """`text` with line breaks replaced by spaces, so a log line stays one line."""
    return " ".join(text.splitlines()).strip()


def _body_text(raw: bytes) -> tuple[str, str]:
    """Return (subject, body text) of a raw RFC 5322 message; never raises.

    The body is the text/plain part, else text/html, else the whole message decoded as UTF-8
    (invalid bytes replaced); line endings are `\n`.
    """
    try:
        message = email.message_from_bytes(raw, policy=email.policy.default)
        subject = _one_line(str(message.get("subject", "")))
        body = ""
        if isinstance(message, EmailMessage):
            part = message.get_body(preferencelist=("plain", "html"))
            if part is not None and isinstance(part, EmailMessage):
                body = str(part.get_content())
        if not body:
            payload = message.get_payload(decode=True)
            body = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    except Exception:
        body, subject = raw.decode("utf-8", "replace"), ""
    return subject, body.replace("\r\n", "\n")


class MailSink:
    """aiosmtpd handler: accepts every message, logs it and appends it to `mailbox` if given."""

    def __init__(self, mailbox: Path | None = None) -> None:
        self.mailbox = mailbox
        self.received = 0

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        """Record one message; always answers `250`."""
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "replace")
        mail_from = envelope.mail_from or ""
        rcpt_to = list(envelope.rcpt_tos)
        subject, body = _body_text(raw)
        self.received += 1
        logger.info(
            "mail received",
            extra={
                "event": "mail_received",
                "mail_from": mail_from,
                "mail_to": rcpt_to,
                "subject": subject,
                "size_bytes": len(raw),
            },
        )
        if self.mailbox is not None:
            entry: dict[str, Any] = {
                "from": mail_from,
                "to": rcpt_to,
                "subject": subject,
                "body": body,
                "receivedAt": datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
            try:
                with self.mailbox.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
                    handle.flush()
            except OSError:
                logger.exception(
                    "cannot write to the mailbox file",
                    extra={"event": "mailbox_write_failed", "mailbox": str(self.mailbox)},
                )
                return "451 Requested action aborted: cannot store the message"
        return "250 Message accepted for delivery"


async def start_server(
    host: str, port: int, mailbox: Path | None = None
) -> tuple[asyncio.Server, MailSink]:
    """Start listening on host:`port` (0 picks a free port); return the server and its handler.

    The caller closes the server. Raises OSError when the address cannot be bound.
    """
    loop = asyncio.get_running_loop()
    if mailbox is not None:
        mailbox.parent.mkdir(parents=True, exist_ok=True)
    handler = MailSink(mailbox)
    server = await loop.create_server(
        lambda: SMTP(
            handler,
            hostname="jobq-smtp-sink",
            ident="jobq SMTP sink",
            data_size_limit=DATA_SIZE_LIMIT,
            enable_SMTPUTF8=True,
            loop=loop,
        ),
        host=host,
        port=port,
    )
    return server, handler


async def serve(host: str, port: int, mailbox: Path | None, stop: asyncio.Event) -> None:
    """Run the sink until `stop` is set, then close the listener."""
    server, handler = await start_server(host, port, mailbox)
    bound = server.sockets[0].getsockname()
    logger.info(
        "smtp sink listening on %s:%s",
        bound[0],
        bound[1],
        extra={
            "event": "smtp_sink_started",
            "host": bound[0],
            "port": bound[1],
            "mailbox": str(mailbox) if mailbox else None,
        },
    )
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()
        logger.info(
            "smtp sink stopped",
            extra={"event": "smtp_sink_stopped", "messages": handler.received},
        )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line, taking defaults from the environment."""
    parser = argparse.ArgumentParser(
        prog="python -m infra.smtp_sink",
        description="Local SMTP sink: accepts any message, logs it, optionally appends it "
        "to a JSON-lines mailbox file.",
    )
    parser.add_argument("--host", default=os.environ.get("SMTP_HOST") or DEFAULT_HOST)
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("SMTP_PORT") or DEFAULT_PORT)
    )
    parser.add_argument("--mailbox", type=Path, default=None, help="append messages here")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL") or "INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    parser.add_argument(
        "--log-format", default=os.environ.get("LOG_FORMAT") or "text", choices=["json", "text"]
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sink until SIGTERM/SIGINT; return the exit status (1 when it cannot bind)."""
    try:
        args = _parse_args(argv)
    except ValueError as exc:  # SMTP_PORT not a number
        print(f"error: SMTP_PORT: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, args.log_format)
    if args.log_level != "DEBUG":
        logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd's per-command chatter

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(args.host, args.port, args.mailbox, stop)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    try:
        asyncio.run(run())
    except OSError as exc:
        logger.error(
            "cannot listen on %s:%s: %s",
            args.host,
            args.port,
            exc,
            extra={"event": "smtp_sink_failed"},
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

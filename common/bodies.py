"""ASGI middleware for JSON bodies holding escapes of unpaired surrogates (`"\ud800"`).

Such escapes are valid JSON but not valid Unicode, so the decoder rejects the whole body with
an unhelpful message. Workers' reports get them replaced (DESIGN.md §5: a report is always
recordable); submits get them marked, so validation can name the exact field (422 with a JSON
pointer) instead of failing the whole body.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from common.contracts import REQUEST_BODY_MAX_BYTES
from common.text import repair_lone_surrogate_escapes

LONE_SURROGATE_MARK_ESCAPE = "\\udbff\\udffe"
"""The JSON escape of `common.text.LONE_SURROGATE_MARK`."""


def repair_report_bodies(app: ASGIApp) -> ASGIApp:
    """Replace lone-surrogate escapes with U+FFFD (for workers' reports)."""
    return _rewriting(app, "\\ufffd")


def mark_lone_surrogates(app: ASGIApp) -> ASGIApp:
    """Replace lone-surrogate escapes with `LONE_SURROGATE_MARK`, which validation reports as
    an unpaired surrogate at its JSON pointer (for submits)."""
    return _rewriting(app, LONE_SURROGATE_MARK_ESCAPE)


def _rewriting(app: ASGIApp, replacement: str) -> ASGIApp:
    """Buffer the request body (up to the 8 MiB body bound), rewrite lone-surrogate escapes
    to `replacement`, then hand the body on. Larger bodies pass through untouched, so the
    framework still answers 413 for them."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await app(
                    scope, _replay([*_as_messages(chunks, more=True), message], receive), send
                )
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > REQUEST_BODY_MAX_BYTES and message.get("more_body", False):
                await app(scope, _replay(_as_messages(chunks, more=True), receive), send)
                return
            if not message.get("more_body", False):
                break
        body = repair_lone_surrogate_escapes(b"".join(chunks), replacement.encode())
        await app(scope, _replay(_as_messages([body], more=False), receive), send)

    return middleware


def _as_messages(chunks: list[bytes], *, more: bool) -> list[ReceiveMessage]:
    messages: list[ReceiveMessage] = []
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        messages.append({"type": "http.request", "body": chunk, "more_body": more or not last})
    return messages


def _replay(messages: list[ReceiveMessage], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> ReceiveMessage:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay

"""ASGI middleware that keeps workers' reports decodable (DESIGN.md §5: reports are always
recordable). Applied to the ack, fail and cancelled routes only; submits are validated strictly.
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from common.contracts import REQUEST_BODY_MAX_BYTES
from common.text import repair_lone_surrogate_escapes


def repair_report_bodies(app: ASGIApp) -> ASGIApp:
    """Buffer the request body (up to the 8 MiB body bound), repair lone-surrogate escapes,
    then hand the repaired body to the route. Larger bodies pass through untouched, so the
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
        body = repair_lone_surrogate_escapes(b"".join(chunks))
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

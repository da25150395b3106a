"""Handler middleware for JSON request bodies: strict decoding and unpaired surrogates.

- **Strict types.** Litestar converts bodies leniently (`"5"` becomes `5`); jobq's contract is
  that a wrong type is an error, so every body is first decoded strictly against its Struct and
  a mismatch is a 422 with a JSON pointer.
- **Unpaired surrogates.** Escapes like `"\\ud800"` are valid JSON but not valid Unicode, so the
  decoder would reject the whole body with an unhelpful message. Workers' reports get them
  replaced (docs/architecture.md#bounds: a report is always recordable); submits get them marked, so
  validation names the exact field.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from common.contracts import REQUEST_BODY_MAX_BYTES
from common.errors import MalformedRequest
from common.text import LONE_SURROGATE_MARK_ESCAPE, repair_lone_surrogate_escapes
from common.web import msgspec_error

_THREAD_ABOVE = 64 * 1024
"""Bodies larger than this are scanned for surrogates off the event loop."""


def strict_json(
    struct: type[msgspec.Struct], *, surrogates: Literal["mark", "replace"] = "mark"
) -> Callable[[ASGIApp], ASGIApp]:
    """Middleware factory: buffer the body (up to the 8 MiB bound), rewrite unpaired-surrogate
    escapes (`mark` for submits, `replace` with U+FFFD for reports), decode it strictly as
    `struct` (InvalidInput on a type or bound error), then hand the body to the route.

    Larger bodies pass through untouched, so the framework still answers 413; malformed JSON
    is a 400 (MalformedRequest), an empty body is left to the route (also 400).
    """
    replacement = (LONE_SURROGATE_MARK_ESCAPE if surrogates == "mark" else "\\ufffd").encode()

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    replay = [*_as_messages(chunks, more=True), message]
                    await app(scope, _replay(replay, receive), send)
                    return
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                if size > REQUEST_BODY_MAX_BYTES and message.get("more_body", False):
                    await app(scope, _replay(_as_messages(chunks, more=True), receive), send)
                    return
                if not message.get("more_body", False):
                    break
            body = await _repaired(b"".join(chunks), replacement)
            if body.strip():
                try:
                    msgspec.json.decode(body, type=struct)
                except msgspec.ValidationError as exc:
                    raise msgspec_error(str(exc)) from None
                except msgspec.DecodeError as exc:
                    raise MalformedRequest(f"the request body is not valid JSON: {exc}") from None
            await app(scope, _replay(_as_messages([body], more=False), receive), send)

        return middleware

    return factory


async def _repaired(body: bytes, replacement: bytes) -> bytes:
    if b"\\u" not in body and b"\\U" not in body:
        return body
    if len(body) > _THREAD_ABOVE:
        return await asyncio.to_thread(repair_lone_surrogate_escapes, body, replacement)
    return repair_lone_surrogate_escapes(body, replacement)


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

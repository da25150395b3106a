"""Validation errors with JSON pointers, and the boundary checks msgspec's type constraints
cannot express (docs/architecture.md#bounds).

`msgspec_error` turns a msgspec validation message into InvalidInput pointing at the field;
`check_payload` refuses payloads PostgreSQL could not store. Used by the producer before
forwarding, by the queue service before inserting and by the client library before sending,
so bad input never reaches PostgreSQL as an error. Every JSON pointer (RFC 6901) is escaped by
`pointer_token`.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from common.contracts import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH
from common.errors import InvalidInput, PayloadTooLarge
from common.text import LONE_SURROGATE_MARK

_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_PATH_TOKEN = re.compile(r"\.([A-Za-z0-9_]+)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]")
_NAMED_FIELD = re.compile(r"(?:unknown|required) field `(?P<name>[^`]+)`")


def pointer_token(key: object) -> str:
    """One JSON pointer reference token: `~` and `/` escaped as `~0` and `~1` (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def json_pointer(msgspec_path: str) -> str:
    """Turn msgspec's `$.jobs[0].payload` (without the `$`) into `/jobs/0/payload`."""
    tokens = (attr or index or key for attr, index, key in _PATH_TOKEN.findall(msgspec_path))
    return "".join("/" + pointer_token(token) for token in tokens)


def msgspec_problem(message: str, root: str = "", fallback_path: str = "") -> tuple[str, str]:
    """(pointer, detail) for a msgspec validation message such as
    "Expected `int`, got `str` - at `$.priority`": the pointer under `root` (from
    `fallback_path` when the message names no path), ending in the field an unknown or
    required field message names; the detail without the path."""
    match = _MSGSPEC_PATH.search(message)
    pointer = root + json_pointer(match.group("path") if match else fallback_path)
    named = _NAMED_FIELD.search(message)
    if named:
        pointer = f"{pointer}/{named.group('name')}"
    return pointer, _MSGSPEC_PATH.sub("", message) or "invalid value"


def msgspec_error(message: str, root: str = "") -> InvalidInput:
    """InvalidInput (422) for a msgspec validation message, with its JSON pointer under
    `root` (see `msgspec_problem`)."""
    pointer, detail = msgspec_problem(message, root)
    return InvalidInput(
        f"{pointer or '/'}: {detail}", errors=[{"pointer": pointer, "detail": detail}]
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unstorable_text(text: str, pointer: str, what: str) -> tuple[str, str] | None:
    if "\x00" in text:
        return pointer, f"{what} contains a NUL character (\\u0000), which cannot be stored"
    if LONE_SURROGATE_MARK in text or _SURROGATE.search(text):
        return pointer, f"{what} contains an unpaired surrogate (\\ud800-\\udfff): not Unicode"
    return None


def _first_unstorable(value: Any, pointer: str, depth: int) -> tuple[str, str] | None:
    """Walk `value`; return (pointer, problem) for the first unstorable or too-deep spot."""
    if isinstance(value, dict | list) and depth > PAYLOAD_MAX_DEPTH:
        return pointer, f"nesting deeper than {PAYLOAD_MAX_DEPTH} levels"
    if isinstance(value, str):
        return _unstorable_text(value, pointer, "text")
    if isinstance(value, float) and not math.isfinite(value):
        return pointer, "NaN and Infinity are not JSON numbers"
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{pointer}/{pointer_token(key)}"
            found = _unstorable_text(str(key), child, "a key")
            if found:
                return found
            found = _first_unstorable(item, child, depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_unstorable(item, f"{pointer}/{index}", depth + 1)
            if found:
                return found
    return None


def check_payload(payload: dict[str, Any], pointer: str = "/payload") -> int:
    """Raise unless `payload` can be stored exactly as given; returns its JSON size in bytes.

    Raises PayloadTooLarge (413) when its JSON exceeds PAYLOAD_MAX_BYTES, and InvalidInput
    (422) when it nests deeper than PAYLOAD_MAX_DEPTH or holds a NUL character, an unpaired
    surrogate or a non-finite number; both carry a
    JSON pointer to the offending spot.
    """
    # Unstorable text first: it also makes the size measurement (JSON encoding) possible.
    found = _first_unstorable(payload, pointer, 1)
    if found:
        where, problem = found
        raise InvalidInput(problem, errors=[{"pointer": where, "detail": problem}])
    size = len(msgspec.json.encode(payload))
    if size > PAYLOAD_MAX_BYTES:
        raise PayloadTooLarge(
            f"payload is {size} bytes; the limit is {PAYLOAD_MAX_BYTES}",
            errors=[{"pointer": pointer, "detail": f"at most {PAYLOAD_MAX_BYTES} bytes"}],
        )
    return size

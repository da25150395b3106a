"""Boundary checks msgspec's type constraints cannot express (docs/architecture.md#bounds).

Used by the producer before forwarding and by the queue service before inserting, so bad input
never reaches PostgreSQL as an error.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from common.contracts import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH
from common.errors import InvalidInput, PayloadTooLarge
from common.text import LONE_SURROGATE_MARK


def _pointer_token(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


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
            child = f"{pointer}/{_pointer_token(key)}"
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

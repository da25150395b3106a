"""Make worker reports always recordable in PostgreSQL (docs/architecture.md#bounds).

PostgreSQL's `text` and `jsonb` cannot hold NUL characters, and UTF-8 cannot encode lone
surrogates. A report that contains either, or megabytes of text, must still be stored, or the job
would be stranded in `PROCESSING` by its own error message.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import msgspec

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def sanitize_text(text: str, max_bytes: int) -> str:
    """Replace NUL and lone surrogates with U+FFFD and cut to at most `max_bytes` UTF-8 bytes.

    The cut never splits a character; a truncated text ends with "…[truncated]".
    """
    clean = _UNSTORABLE.sub(REPLACEMENT, text)
    encoded = clean.encode("utf-8")
    if len(encoded) <= max_bytes:
        return clean
    marker = "…[truncated]"
    room = max(0, max_bytes - len(marker.encode("utf-8")))
    return encoded[:room].decode("utf-8", errors="ignore") + marker


RESULT_MAX_DEPTH = 64
"""Results nested deeper than this are stored as a stub (deep JSON costs recursion to handle)."""


def stored_number_growth(value: float) -> int:
    """Bytes PostgreSQL's `jsonb` adds to `value` over its JSON form (msgspec's shortest
    round-trip text): `numeric` keeps every digit and prints no exponent, so `1e308` is stored
    and served as 309 digits and `5e-324` as 326 characters. 0 for numbers written without an
    exponent, which `numeric` prints as they are (integers are never written with one)."""
    magnitude = abs(value)
    # msgspec writes an exponent from 1e16 up and below 1e-5; Python's repr below 1e-4.
    if magnitude < 1e16 and (magnitude >= 1e-4 or magnitude == 0):
        return 0
    text = msgspec.json.encode(value).decode()
    return max(0, len(format(Decimal(text), "f")) - len(text))


class _TooDeep(Exception):
    pass


def _sanitize_value(value: Any, depth: int, growth: list[int]) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub(REPLACEMENT, value)
    if isinstance(value, float):
        growth[0] += stored_number_growth(value)
        return value
    if isinstance(value, dict | list) and depth >= RESULT_MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        return {
            _UNSTORABLE.sub(REPLACEMENT, str(k)): _sanitize_value(v, depth + 1, growth)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_sanitize_value(v, depth + 1, growth) for v in value]
    return value


def sanitize_result(result: Any, max_bytes: int) -> Any:
    """Return `result` with every string sanitised; if it exceeds `max_bytes` as stored (its
    JSON with numbers written out in full, as `jsonb` keeps them: `stored_number_growth`), a
    stub of at most `max_bytes` (for `max_bytes` of 256 or more).

    The stub is `{"truncated": true, "bytes": N, "preview": "<first bytes of the JSON>"}` (N
    the size as stored), or `{"truncated": true, "reason": …}` for a result nested deeper than
    RESULT_MAX_DEPTH.
    """
    if result is None:
        return None  # most acks carry no result: nothing to clean or measure
    growth = [0]
    try:
        clean = _sanitize_value(result, 0, growth)
    except _TooDeep:
        return {"truncated": True, "reason": f"nested deeper than {RESULT_MAX_DEPTH} levels"}
    encoded = msgspec.json.encode(clean)
    stored = len(encoded) + growth[0]
    if stored <= max_bytes:
        return clean
    # Escaping can double the preview's bytes in the stub (a quote becomes two characters).
    room = max(0, max_bytes // 2 - 64)
    preview = sanitize_text(encoded.decode("utf-8", errors="replace"), room)
    return {"truncated": True, "bytes": stored, "preview": preview}


# JSON escapes: an escaped backslash (kept, so `\\ud800` stays literal text), a valid surrogate
# pair (kept), or a lone surrogate (replaced). Alternation order makes backslash parity right.
_JSON_SURROGATE_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)


LONE_SURROGATE_MARK = "\ufdd0"
"""A noncharacter that stands in for an unpaired surrogate found in a submitted body; its
escape has the same length as a surrogate's, so marking never grows a body."""

LONE_SURROGATE_MARK_ESCAPE = "\\ufdd0"
"""The JSON escape of LONE_SURROGATE_MARK."""


def repair_lone_surrogate_escapes(body: bytes, replacement: bytes = b"\\ufffd") -> bytes:
    """Replace JSON `\\uD800`-style escapes of unpaired surrogates with `\\uFFFD`.

    A worker's error text may hold them (a decoded byte soup, a truncated emoji); they are valid
    JSON escapes but not valid Unicode, so decoders reject the whole body. Repairing them keeps
    the report recordable instead of stranding the job in PROCESSING.
    """

    def replace(match: re.Match[bytes]) -> bytes:
        text = match.group()
        return text if text == b"\\\\" or len(text) == 12 else replacement

    return _JSON_SURROGATE_ESCAPES.sub(replace, body)

"""Validation errors with JSON pointers, and the boundary checks msgspec's type constraints
cannot express (docs/architecture.md#bounds).

`msgspec_error` turns a msgspec validation message into InvalidInput pointing at the field;
`decode_submit` decodes a submit with its payload's byte span checked before the payload is
decoded; `check_payload` refuses payloads PostgreSQL could not store, or would store larger
than the bound. Used by the producer before forwarding, by the queue service before inserting
and by the client library before sending, so bad input never reaches PostgreSQL as an error.
Every JSON pointer (RFC 6901) is escaped by `pointer_token`.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

import msgspec

from common.contracts import PAYLOAD_MAX_BYTES, PAYLOAD_MAX_DEPTH, SubmitJobRequest
from common.errors import InvalidInput, PayloadTooLarge
from common.text import LONE_SURROGATE_MARK, stored_number_growth

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


def _first_unstorable(
    value: Any, pointer: str, depth: int, growth: list[int]
) -> tuple[str, str] | None:
    """Walk `value`; return (pointer, problem) for the first unstorable or too-deep spot, and
    add to `growth[0]` the bytes its numbers grow by when stored (`stored_number_growth`)."""
    if isinstance(value, dict | list) and depth > PAYLOAD_MAX_DEPTH:
        return pointer, f"nesting deeper than {PAYLOAD_MAX_DEPTH} levels"
    if isinstance(value, str):
        return _unstorable_text(value, pointer, "text")
    if isinstance(value, float):
        if not math.isfinite(value):
            return pointer, "NaN and Infinity are not JSON numbers"
        growth[0] += stored_number_growth(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            child = f"{pointer}/{pointer_token(key)}"
            found = _unstorable_text(str(key), child, "a key")
            if found:
                return found
            found = _first_unstorable(item, child, depth + 1, growth)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_unstorable(item, f"{pointer}/{index}", depth + 1, growth)
            if found:
                return found
    return None


def check_payload(payload: dict[str, Any], pointer: str = "/payload") -> int:
    """Raise unless `payload` can be stored exactly as given, within its bound; returns its
    size as stored in bytes (its JSON with numbers written out in full, as `jsonb` keeps them).

    Raises PayloadTooLarge (413) when its JSON exceeds PAYLOAD_MAX_BYTES, or would once stored:
    `jsonb` writes numbers out in full (`stored_number_growth`), so 222 KB of `1e308` would be
    stored and served as 11 MB. Raises InvalidInput (422) when it nests deeper than
    PAYLOAD_MAX_DEPTH or holds a NUL character, an unpaired surrogate or a non-finite number.
    Both carry a JSON pointer to the offending spot.
    """
    # Unstorable text first: it also makes the size measurement (JSON encoding) possible.
    growth = [0]
    found = _first_unstorable(payload, pointer, 1, growth)
    if found:
        where, problem = found
        raise InvalidInput(problem, errors=[{"pointer": where, "detail": problem}])
    size = len(msgspec.json.encode(payload))
    if size > PAYLOAD_MAX_BYTES:
        raise PayloadTooLarge(
            f"payload is {size} bytes; the limit is {PAYLOAD_MAX_BYTES}",
            errors=[{"pointer": pointer, "detail": f"at most {PAYLOAD_MAX_BYTES} bytes"}],
        )
    stored = size + growth[0]
    if stored > PAYLOAD_MAX_BYTES:
        detail = (
            f"at most {PAYLOAD_MAX_BYTES} bytes as stored; PostgreSQL writes numbers out in "
            "full (1e308 is 309 digits)"
        )
        raise PayloadTooLarge(
            f"payload is {size} bytes but {stored} bytes as stored; the limit is "
            f"{PAYLOAD_MAX_BYTES}",
            errors=[{"pointer": pointer, "detail": detail}],
        )
    return stored


S = TypeVar("S", bound=SubmitJobRequest)

_PAYLOAD = msgspec.json.Decoder(dict[str, Any])
_SPANNED: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_WHOLE: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _spanned(type_: type[SubmitJobRequest]) -> msgspec.json.Decoder[Any]:
    """A decoder of `type_` with its payload as `msgspec.Raw`: the same fields, bounds and
    names, but the payload is only skimmed to find where it ends, never turned into Python
    objects. Built once per type (a decoder made per call would cost more than the decode)."""
    decoder = _SPANNED.get(type_)
    if decoder is None:
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
        for field in msgspec.structs.fields(type_):
            kind = msgspec.Raw if field.name == "payload" else field.type
            if field.required:
                fields.append((field.name, kind))
            elif field.default_factory is not msgspec.NODEFAULT:
                factory = msgspec.field(default_factory=field.default_factory)
                fields.append((field.name, kind, factory))
            else:
                fields.append((field.name, kind, field.default))
        twin = msgspec.defstruct(
            f"{type_.__name__}Span",
            fields,
            kw_only=True,
            rename="camel",
            forbid_unknown_fields=True,
        )
        decoder = _SPANNED[type_] = msgspec.json.Decoder(twin)
    return decoder


def decode_submit(body: bytes | msgspec.Raw, type_: type[S], root: str = "") -> S:
    """Decode one submit (`type_`: SubmitJobRequest or a subclass) from its JSON, checking the
    payload's byte span before the payload is decoded: an 8 MiB payload of small integers is
    refused after one skim, not after decoding four million of them. A body no larger than
    PAYLOAD_MAX_BYTES cannot hold a payload over it, and is decoded in one pass.

    Raises msgspec.ValidationError for the fields around the payload (its path relative to
    the body), PayloadTooLarge (413) for a payload span over PAYLOAD_MAX_BYTES and
    InvalidInput (422) for a payload that is not a JSON object, both pointing at
    `<root>/payload`. The payload's other checks are `check_payload`'s.
    """
    if len(body) <= PAYLOAD_MAX_BYTES:
        # A payload is part of its body, so a body within the bound holds no payload beyond
        # it: decode it whole, as fast as before (the common case, on the hot path).
        whole = _WHOLE.get(type_)
        if whole is None:
            whole = _WHOLE[type_] = msgspec.json.Decoder(type_)
        decoded: S = whole.decode(body)
        return decoded
    spanned = _spanned(type_).decode(body)
    raw: msgspec.Raw = spanned.payload
    pointer = f"{root}/payload"
    if len(raw) > PAYLOAD_MAX_BYTES:
        raise PayloadTooLarge(
            f"payload is {len(raw)} bytes; the limit is {PAYLOAD_MAX_BYTES}",
            errors=[{"pointer": pointer, "detail": f"at most {PAYLOAD_MAX_BYTES} bytes"}],
        )
    try:
        payload = _PAYLOAD.decode(raw)
    except msgspec.ValidationError as exc:
        raise msgspec_error(str(exc), pointer) from None
    fields = msgspec.structs.asdict(spanned)
    fields["payload"] = payload
    # The fields were validated by the spanned decode; constructing does not validate again.
    return type_(**fields)

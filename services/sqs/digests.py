"""The MD5 digests SQS returns with messages, computed exactly as SQS does, so SDKs that
check them (the Java, .NET and Go SDKs, kombu) accept our replies.

- `MD5OfMessageBody`: the hex MD5 of the body's UTF-8 bytes.
- `MD5OfMessageAttributes`: the hex MD5 of, for each attribute in name order, the name,
  the data type (`String`, `Number`, `Binary`, or one with a custom `.suffix`), one byte of
  transport type (1 for String and Number values, 2 for Binary) and the value, each of the
  three strings and the value preceded by its length as a 4-byte big-endian integer.
  Source: Amazon SQS Developer Guide, "Calculating the MD5 message digest for message
  attributes".
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping
from typing import Any

STRING_TRANSPORT, BINARY_TRANSPORT = 1, 2


def md5_of_body(body: str) -> str:
    """Hex MD5 of the body's UTF-8 bytes."""
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def _prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Hex MD5 of message attributes in SQS's wire shape (`{"name": {"DataType": ...,
    "StringValue": ... | "BinaryValue": <base64 text>}}`); None when there are none (SQS then
    leaves the field out). Raises ValueError for a Binary value that is not base64."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        data_type = str(value["DataType"])
        digest.update(_prefixed(name.encode()))
        digest.update(_prefixed(data_type.encode()))
        if data_type.split(".", 1)[0] == "Binary":
            digest.update(bytes([BINARY_TRANSPORT]))
            digest.update(_prefixed(base64.b64decode(value["BinaryValue"], validate=True)))
        else:
            digest.update(bytes([STRING_TRANSPORT]))
            digest.update(_prefixed(str(value["StringValue"]).encode()))
    return digest.hexdigest()

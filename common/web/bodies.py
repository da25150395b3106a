"""JSON request bodies, decoded once, strictly, after the caller was authenticated.

`StrictJSON[T]` is a Litestar DTO that turns a request body into the msgspec Struct `T` with
one `msgspec.json.decode(body, type=T)` call:

- **Strict types.** Litestar's own conversion is lenient (`"5"` becomes `5`); jobq's contract
  is that a wrong type is an error, a 422 with a JSON pointer.
- **Once, and late.** Litestar runs the `before_request` hook (authentication, then the
  content-type check, 415) before it extracts `data`, so an unauthenticated request costs no
  more than reading its headers, and a body is never decoded twice.
- **Payload spans first.** `SubmitJSON[T]` (submits) checks the payload's byte span before
  decoding it (`common.validation.decode_submit`), so an oversized payload costs a skim, not
  a decode; batch entries are spans (`msgspec.Raw`) checked the same way, one by one.
- **Unpaired surrogates.** Escapes like `"\\ud800"` are valid JSON but not valid Unicode, so the
  decoder would reject the whole body with an unhelpful message. `StrictJSON` marks them, so
  validation names the exact field of a submit; `ReportJSON` replaces them with U+FFFD, so a
  worker's report is always recordable (docs/architecture.md#bounds).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, ClassVar, TypeVar

import msgspec
from litestar.dto import AbstractDTO
from litestar.dto.data_structures import DTOFieldDefinition
from litestar.openapi.spec import Reference, Schema
from litestar.typing import FieldDefinition

from common.errors import MalformedRequest
from common.text import LONE_SURROGATE_MARK_ESCAPE, repair_lone_surrogate_escapes
from common.validation import decode_submit, msgspec_error

T = TypeVar("T")


def decode_strict(
    body: bytes,
    type_: type[T],
    surrogate_replacement: bytes,
    decode: Callable[[bytes], T] | None = None,
) -> T:
    """Decode `body` as `type_` with msgspec's strict rules (or with `decode`, which raises
    msgspec's errors or a JobqError).

    Raises MalformedRequest (400) for an empty body or invalid JSON, InvalidInput (422, with a
    JSON pointer) for a value of the wrong type or out of bounds.
    """
    if not body.strip():
        raise MalformedRequest("the request body is empty; send a JSON object")
    if b"\\u" in body or b"\\U" in body:
        body = repair_lone_surrogate_escapes(body, surrogate_replacement)
    try:
        if decode is not None:
            return decode(body)
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise msgspec_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise MalformedRequest(f"the request body is not valid JSON: {exc}") from None


class StrictJSON(AbstractDTO[T]):
    """`data_dto=StrictJSON[Struct]`: the body decoded strictly into `Struct`, unpaired
    surrogates marked so validation can point at them. The OpenAPI request body is `Struct`'s
    schema."""

    surrogate_replacement: ClassVar[bytes] = LONE_SURROGATE_MARK_ESCAPE.encode()

    @classmethod
    def create_for_field_definition(
        cls, field_definition: FieldDefinition, handler_id: str, backend_cls: Any = None
    ) -> None:
        """No transfer model is built: decoding is one msgspec call."""

    @classmethod
    def generate_field_definitions(
        cls, model_type: type[Any]
    ) -> Generator[DTOFieldDefinition, None, None]:
        """Unused: this DTO never builds a transfer model."""
        yield from ()

    @classmethod
    def detect_nested_field(cls, field_definition: FieldDefinition) -> bool:
        """Unused: this DTO never builds a transfer model."""
        return False

    @classmethod
    def is_supported_model_type_field(cls, field_definition: FieldDefinition) -> bool:
        """Never used for responses: replies are encoded as they are."""
        return False

    def decode_bytes(self, value: bytes) -> T:
        """The request body as the model type; raises MalformedRequest or InvalidInput."""
        return decode_strict(value, self.model_type, self.surrogate_replacement)

    def decode_builtins(self, value: dict[str, Any]) -> T:
        """Form bodies are refused by the content-type check before they get here."""
        raise MalformedRequest("send the body as application/json")

    @classmethod
    def create_openapi_schema(
        cls, field_definition: FieldDefinition, handler_id: str, schema_creator: Any
    ) -> Reference | Schema:
        """The model type's own schema (a component reference)."""
        schema: Reference | Schema = schema_creator.for_field_definition(
            FieldDefinition.from_annotation(cls.model_type)
        )
        return schema


class ReportJSON(StrictJSON[T]):
    """Like `StrictJSON`, for workers' reports: unpaired surrogates become U+FFFD, so a report
    is always recordable."""

    surrogate_replacement: ClassVar[bytes] = b"\\ufffd"


class SubmitJSON(StrictJSON[T]):
    """`data_dto=SubmitJSON[SubmitJobRequest]` (or `EnqueueRequest`): like `StrictJSON`, with
    the payload's byte span checked before the payload is decoded (413 for one over
    PAYLOAD_MAX_BYTES, however it would decode)."""

    def decode_bytes(self, value: bytes) -> T:
        """The submit as the model type; raises MalformedRequest, InvalidInput or
        PayloadTooLarge."""
        model: Any = self.model_type
        return decode_strict(
            value,
            self.model_type,
            self.surrogate_replacement,
            lambda body: decode_submit(body, model),
        )

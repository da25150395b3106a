"""Pure logic in `common`: durations, sizes, sanitising, hashing, ids, labels, problems."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common import validation
from common.contracts import PAYLOAD_MAX_BYTES, EnqueueRequest, SubmitJobRequest
from common.errors import (
    InvalidInput,
    JobqError,
    OutcomeUnknown,
    PayloadTooLarge,
    ServiceUnavailable,
    StaleReceiptHandle,
    from_problem,
)
from common.hashing import request_hash
from common.ids import new_job_id
from common.metrics import OTHER, BoundedLabel
from common.text import sanitize_result, sanitize_text
from common.validation import check_payload, decode_submit, json_pointer
from common.web.settings import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("12h", 43200.0),
        ("14d", 1_209_600.0),
        (7, 7.0),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["-1", "1y", "", "nan", "inf", float("nan"), -3, True, "5 minutes"])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@given(st.text())
def test_sanitized_text_is_storable_and_bounded(text: str) -> None:
    clean = sanitize_text(text, 64)
    assert "\x00" not in clean
    encoded = clean.encode("utf-8")  # raises on a lone surrogate
    assert len(encoded) <= 64


def test_sanitize_replaces_nul_and_surrogates_and_truncates() -> None:
    assert sanitize_text("a\x00b\ud800c", 100) == "a\ufffdb\ufffdc"
    long = sanitize_text("é" * 10_000, 100)
    assert long.endswith("…[truncated]") and len(long.encode()) <= 100


def test_sanitize_result_keeps_small_results_and_stubs_large_ones() -> None:
    assert sanitize_result({"k": "v\x00"}, 1000) == {"k": "v\ufffd"}
    stub = sanitize_result({"k": "x" * 5000}, 1000)
    assert stub["truncated"] is True and stub["bytes"] > 1000
    assert len(msgspec.json.encode(stub)) <= 1000


def test_request_hash_ignores_key_order_and_equals_explicit_defaults() -> None:
    a = SubmitJobRequest(task_type="t", payload={"a": 1, "b": {"c": 2, "d": 3}})
    b = msgspec.json.decode(
        b'{"payload":{"b":{"d":3,"c":2},"a":1},"taskType":"t","queue":"default","priority":0,'
        b'"delaySeconds":0}',
        type=SubmitJobRequest,
    )
    assert request_hash(a) == request_hash(b)
    assert request_hash(a) != request_hash(SubmitJobRequest(task_type="t", payload={"a": 2}))
    assert request_hash(a) != request_hash(
        SubmitJobRequest(task_type="t", payload={"a": 1, "b": {"c": 2, "d": 3}}, max_attempts=5)
    )


def test_job_ids_are_uuid7_and_increasing() -> None:
    ids = [new_job_id() for _ in range(10_000)]
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_bounded_label_caps_distinct_values() -> None:
    label = BoundedLabel(limit=2)
    assert [label("a"), label("b"), label("c"), label("a"), label("Bad Name")] == [
        "a",
        "b",
        OTHER,
        "a",
        OTHER,
    ]


def test_check_payload_points_at_the_problem() -> None:
    with pytest.raises(InvalidInput) as nul:
        check_payload({"a": [1, {"b/c": "x\x00"}]})
    assert nul.value.errors[0]["pointer"] == "/payload/a/1/b~1c"

    deep: dict[str, object] = {}
    cursor = deep
    for _ in range(40):
        cursor["d"] = {}
        cursor = cursor["d"]  # type: ignore[assignment]
    with pytest.raises(InvalidInput, match="nesting"):
        check_payload(deep)

    with pytest.raises(PayloadTooLarge):
        check_payload({"x": "y" * 300_000})
    check_payload({"ok": [1, 2.5, None, True, {"nested": "text"}]})


def test_problem_details_round_trip() -> None:
    error = StaleReceiptHandle("handle h is not the latest")
    rebuilt = from_problem(error.to_problem("/jobs/1/ack"), 409)
    assert type(rebuilt) is StaleReceiptHandle and rebuilt.detail == error.detail
    unknown = from_problem({"type": "about:blank", "title": "Teapot"}, 418)
    assert type(unknown) is JobqError and "418" in str(unknown)
    assert type(from_problem("not json", 502)) is ServiceUnavailable
    assert type(from_problem({"type": "about:blank"}, 413)) is PayloadTooLarge


def test_an_unknown_outcome_keeps_its_job_id_across_the_wire() -> None:
    error = OutcomeUnknown("no answer", job_id="01a2", idempotency_key="order-7")
    problem = error.to_problem("/jobs")
    assert problem["type"] == "urn:jobq:problem:outcome-unknown" and problem["status"] == 504
    rebuilt = from_problem(problem, 504)
    assert isinstance(rebuilt, OutcomeUnknown) and isinstance(rebuilt, ServiceUnavailable)
    assert (rebuilt.job_id, rebuilt.idempotency_key) == ("01a2", "order-7")
    batch = OutcomeUnknown("no answer", jobs=[{"index": 0, "jobId": "01a2"}])
    assert from_problem(batch.to_problem(), 504).jobs == [{"index": 0, "jobId": "01a2"}]  # type: ignore[attr-defined]
    # A gateway's bare 504: the request may have been applied behind it.
    assert type(from_problem(None, 504)) is OutcomeUnknown


def test_msgspec_paths_become_json_pointers() -> None:
    assert json_pointer("$.jobs[0].payload") == "/jobs/0/payload"
    assert json_pointer(".priority") == "/priority"
    assert json_pointer("") == ""


def test_deep_results_become_a_stub_instead_of_crashing() -> None:
    deep: object = 1
    for _ in range(700):
        deep = {"a": deep}
    stub = sanitize_result(deep, 10_000)
    assert stub == {"truncated": True, "reason": "nested deeper than 64 levels"}


def test_worker_makes_any_result_storable() -> None:
    from services.worker.runner import storable

    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    assert storable(deep)["truncated"] is True
    assert storable({"when": {1, 2}, "text": "a\x00"}) == {"when": [1, 2], "text": "a\ufffd"}


def test_names_refuse_a_trailing_newline() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"taskType": "noop\n", "payload": {}}, SubmitJobRequest)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"taskType": "x", "payload": {}, "queue": "default\n"}, SubmitJobRequest)


def test_payload_depth_counts_containers() -> None:
    exactly: dict[str, object] = {}
    cursor = exactly
    for _ in range(31):
        cursor["d"] = {}
        cursor = cursor["d"]  # type: ignore[assignment]
    cursor["leaf"] = "scalar"
    check_payload(exactly)  # 32 nested objects with a scalar leaf are allowed


def test_client_side_validation_matches_the_producer() -> None:
    from jobq.request import build_request

    for payload, pointer in (({"a": "x\ud800"}, "/payload/a"), ({"n": float("nan")}, "/payload/n")):
        with pytest.raises(InvalidInput) as refused:
            build_request("noop", payload)
        assert refused.value.errors[0]["pointer"] == pointer
    with pytest.raises(InvalidInput) as wrong_type:
        build_request("noop", {}, priority="5")  # type: ignore[arg-type]
    assert wrong_type.value.errors[0]["pointer"] == "/priority"


def test_decode_submit_refuses_an_oversized_payload_without_decoding_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded_as: list[Any] = []

    class Spy:
        def __init__(self, decoder: msgspec.json.Decoder[Any]) -> None:
            self.decoder = decoder

        def decode(self, data: Any) -> Any:
            decoded_as.append(self.decoder.type)
            return self.decoder.decode(data)

    monkeypatch.setattr(validation, "_PAYLOAD", Spy(validation._PAYLOAD))
    spanned = validation._spanned(SubmitJobRequest)
    spies: dict[type[Any], Any] = {SubmitJobRequest: Spy(spanned)}
    monkeypatch.setattr(validation, "_SPANNED", spies)
    small_ints = b'{"a":[' + b"1," * (PAYLOAD_MAX_BYTES // 2) + b"1]}"
    body = b'{"taskType":"noop","payload":' + small_ints + b',"priority":3}'

    with pytest.raises(PayloadTooLarge) as refused:
        decode_submit(body, SubmitJobRequest, "/jobs/7")

    assert refused.value.errors == [
        {"pointer": "/jobs/7/payload", "detail": f"at most {PAYLOAD_MAX_BYTES} bytes"}
    ]
    assert decoded_as == [spanned.type], "only the body, with its payload as a span"
    twin: Any = spanned.type
    assert msgspec.structs.fields(twin)[1].type is msgspec.Raw


def test_decode_submit_keeps_every_field_and_its_bounds() -> None:
    # Whitespace makes a body larger than any payload may be: the payload is then a span.
    pad = b" " * PAYLOAD_MAX_BYTES
    body = b'{"taskType":"x","payload":{"k":[1,2]},"queue":"q","jobId":null,"tenant":"acme"}'
    expected = EnqueueRequest(task_type="x", payload={"k": [1, 2]}, queue="q", tenant="acme")
    assert decode_submit(body, EnqueueRequest) == expected
    assert decode_submit(body[:1] + pad + body[1:], EnqueueRequest) == expected
    for prefix in (b"", pad):
        with pytest.raises(msgspec.ValidationError, match=r"\$\.priority"):
            decode_submit(
                prefix + b'{"taskType":"x","payload":{},"priority":5000}', SubmitJobRequest
            )
    with pytest.raises(msgspec.ValidationError, match=r"\$\.payload"):
        decode_submit(b'{"taskType":"x","payload":[1]}', SubmitJobRequest)
    with pytest.raises(InvalidInput) as not_an_object:
        decode_submit(pad + b'{"taskType":"x","payload":[1]}', SubmitJobRequest, "/jobs/0")
    assert not_an_object.value.errors[0]["pointer"] == "/jobs/0/payload"


def test_sanitize_result_bounds_the_stored_form() -> None:
    grows = [1e308] * 1000  # 6 KB of JSON, 310 KB as jsonb stores it
    stub = sanitize_result(grows, 100_000)
    assert stub["truncated"] is True and stub["bytes"] > 300_000
    quotes = ['"' * 10_000]  # the preview's escaping doubles it
    assert len(msgspec.json.encode(sanitize_result(quotes, 1000))) <= 1000
    with pytest.raises(PayloadTooLarge, match="as stored"):
        check_payload({"n": grows * 10})

"""The SQS endpoint's pure logic: digests against published vectors, the queue-name mapping,
attribute bounds, request decoding and SigV4 verification with botocore's own signer."""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st

from common.contracts import NAME_PATTERN
from common.web.access import parse_api_keys
from services.sqs import attributes, digests, names, wire
from services.sqs.errors import SqsError
from services.sqs.sigv4 import SigV4Verifier
from tests.helpers import md5_of_message_attributes


def test_attribute_digests_match_published_vectors() -> None:
    # sqslite's Go test (computed with aws-sdk-go-v2's types) and the JavaScript SDK's
    # message-attributes checksum test.
    two = {
        "ordinal": {"DataType": "Number", "StringValue": "1"},
        "category": {"DataType": "String", "StringValue": "test"},
    }
    assert digests.md5_of_attributes(two) == "d21ae90c49061e927f57df5f5d72be1f"
    one = {"SellerName": {"DataType": "String", "StringValue": "Example Store"}}
    assert digests.md5_of_attributes(one) == "cd28f3b68aeee4b2eac9c66f2f694b58"
    assert digests.md5_of_attributes({}) is None
    assert digests.md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"


def test_binary_attribute_digest_matches_the_independent_one() -> None:
    raw = b"\x00\xffbinary"
    wire_shape = {"Blob": {"DataType": "Binary.gz", "BinaryValue": base64.b64encode(raw).decode()}}
    boto_shape = {"Blob": {"DataType": "Binary.gz", "BinaryValue": raw}}
    assert digests.md5_of_attributes(wire_shape) == md5_of_message_attributes(boto_shape)


@given(st.from_regex(r"[A-Za-z0-9_-]{1,80}", fullmatch=True))
def test_every_sqs_name_maps_to_a_jobq_name(name: str) -> None:
    mapped = names.jobq_queue(name)
    assert re.fullmatch(NAME_PATTERN, mapped)
    assert mapped == name or "." in mapped  # identity, or the hashed kind (never collide)


def test_name_mapping_examples() -> None:
    assert names.jobq_queue("orders") == "orders"
    assert names.jobq_queue("MyQueue") == "myqueue.7c903cad"
    assert names.jobq_queue("Orders") != names.jobq_queue("orders")
    assert names.jobq_queue("_x").startswith("x.")
    with pytest.raises(SqsError):
        names.check_sqs_name("jobs.fifo")
    with pytest.raises(SqsError):
        names.check_sqs_name("has space")


def test_queue_urls_and_receipt_handles() -> None:
    assert names.parse_queue_url("http://h:9324/acme/Orders") == ("acme", "Orders")
    for bad in ("http://h/acme", "http://h/acme/a/b", "http://h/ACME/a"):
        with pytest.raises(SqsError) as refused:
            names.parse_queue_url(bad)
        assert refused.value.kind.code == "QueueDoesNotExist"
    job, lease = uuid.uuid4(), uuid.uuid4()
    assert names.parse_receipt_handle(names.receipt_handle(job, lease)) == (job, lease)
    with pytest.raises(SqsError) as invalid:
        names.parse_receipt_handle("nope")
    assert invalid.value.kind.code == "ReceiptHandleIsInvalid"


def test_attribute_bounds() -> None:
    assert attributes.check({"VisibilityTimeout": "0", "DelaySeconds": "900"}) == {
        "VisibilityTimeout": "0",
        "DelaySeconds": "900",
    }
    for bad, code in (
        ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
        ({"DelaySeconds": "-1"}, "InvalidAttributeValue"),
        ({"QueueArn": "x"}, "InvalidAttributeName"),
        ({"FifoQueue": "true"}, "UnsupportedOperation"),
        ({"RedrivePolicy": '{"maxReceiveCount": 5}'}, "InvalidAttributeValue"),
        (
            {"RedrivePolicy": '{"deadLetterTargetArn": "a", "maxReceiveCount": 101}'},
            "InvalidAttributeValue",
        ),
    ):
        with pytest.raises(SqsError) as refused:
            attributes.check(bad)
        assert refused.value.kind.code == code, bad
    config = attributes.config(
        {"RedrivePolicy": '{"deadLetterTargetArn": "arn:aws:sqs:r:a:q", "maxReceiveCount": "4"}'}
    )
    assert (config.max_receive_count, config.visibility_timeout) == (4, 30)
    assert attributes.config({}).max_receive_count == 100


def test_request_decoding_errors_are_sqs_errors() -> None:
    with pytest.raises(SqsError) as missing:
        wire.decode_request(b"{}", wire.SendMessage)
    assert missing.value.kind.code == "MissingParameter"
    with pytest.raises(SqsError) as wrong:
        wire.decode_request(b'{"QueueUrl": "u", "MaxNumberOfMessages": 11}', wire.ReceiveMessage)
    assert wrong.value.kind.code == "InvalidParameterValue"


KEYS = parse_api_keys("admin:acme:abcdefghijklmnopqrstuvwx")
KEY, CALLER = next(iter(KEYS.items()))


def _signed(secret: str = KEY, when: datetime | None = None, region: str = "r-1") -> dict[str, str]:
    request = AWSRequest(
        method="POST",
        url="http://127.0.0.1:9324/",
        data=b'{"QueueName": "q"}',
        headers={"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": "application/json"},
    )
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    request.headers["X-Amz-Date"] = stamp
    request.context["timestamp"] = stamp
    signer = SigV4Auth(Credentials(CALLER.key_id, secret), "sqs", region)
    signature = signer.signature(
        signer.string_to_sign(request, signer.canonical_request(request)), request
    )
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = "127.0.0.1:9324"
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={signer.scope(request)}, "
        f"SignedHeaders={signer.signed_headers(signer.headers_to_sign(request))}, "
        f"Signature={signature}"
    )
    return headers


BODY = b'{"QueueName": "q"}'


def test_sigv4_accepts_botocores_signature_and_refuses_the_rest() -> None:
    verifier = SigV4Verifier(KEYS, "r-1")
    assert verifier.verify("POST", "/", "", _signed(), BODY) == CALLER
    cases = {
        "SignatureDoesNotMatch": [
            ("POST", "/", "", _signed("another-secret-0123"), BODY),
            ("POST", "/", "", _signed(), b'{"QueueName": "other"}'),
            ("POST", "/", "", _signed(region="r-2"), BODY),
            ("POST", "/", "", {**_signed(), "x-amz-target": "AmazonSQS.DeleteQueue"}, BODY),
        ],
        "RequestExpired": [
            ("POST", "/", "", _signed(when=datetime.now(UTC) - timedelta(minutes=16)), BODY)
        ],
        "MissingAuthenticationToken": [("POST", "/", "", {"host": "h"}, BODY)],
        "IncompleteSignature": [
            ("POST", "/", "", {"authorization": "Bearer x", "host": "h"}, BODY)
        ],
    }
    for code, calls in cases.items():
        for call in calls:
            with pytest.raises(SqsError) as refused:
                verifier.verify(*call)
            assert refused.value.kind.code == code
    unknown = SigV4Verifier(parse_api_keys("admin:acme:zyxwvutsrqponmlkjihgfedc"), "r-1")
    with pytest.raises(SqsError) as no_key:
        unknown.verify("POST", "/", "", _signed(), BODY)
    assert no_key.value.kind.code == "InvalidClientTokenId"

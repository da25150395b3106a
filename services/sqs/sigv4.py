"""AWS Signature Version 4 verification of incoming requests, with botocore's signer doing the
canonicalisation (the same code that signed the request in boto3 and the AWS CLI).

The access key id names a jobq API key (the first 12 hex digits of its SHA-256, the `key-…`
id jobq's records show) and the key itself is the secret. A request is accepted when its
`Authorization` header is `AWS4-HMAC-SHA256 Credential=<id>/<yyyymmdd>/<region>/sqs/
aws4_request, SignedHeaders=…, Signature=…`, the signed headers include `host`,
`x-amz-date` and `x-amz-target`, `X-Amz-Date` is within 15 minutes of our clock (AWS's
bound), the scope's date, region and service match, and the signature recomputed over the
signed headers and the body's SHA-256 equals the one sent (constant-time comparison).
Source: AWS General Reference, "Signature Version 4 signing process".
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from common.web.access import Caller
from services.sqs.errors import (
    INCOMPLETE_SIGNATURE,
    INVALID_CLIENT_TOKEN,
    MISSING_AUTHENTICATION,
    REQUEST_EXPIRED,
    SIGNATURE_DOES_NOT_MATCH,
    SqsError,
)

MAX_SKEW_SECONDS = 15 * 60
"""How far `X-Amz-Date` may be from our clock (AWS: 15 minutes)."""
REQUIRED_SIGNED = frozenset({"host", "x-amz-date", "x-amz-target"})
"""Headers a signature must cover: where it goes, when, and which action."""
SERVICE = "sqs"

_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/"
    r"(?P<service>[^/,\s]+)/aws4_request,\s*SignedHeaders=(?P<signed>[a-z0-9;_.-]+),\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})"
)


class SigV4Verifier:
    """Verifies SigV4 signatures against `keys` ({API key: Caller}) for `region`."""

    def __init__(self, keys: Mapping[str, Caller], region: str) -> None:
        self._by_id = {caller.key_id: (key, caller) for key, caller in keys.items()}
        self._region = region

    def verify(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        now: datetime | None = None,
    ) -> Caller:
        """The caller whose key signed this request (`path` and `query` as sent, `headers`
        with lower-case names). Raises SqsError: MissingAuthenticationToken without an
        `Authorization` header, IncompleteSignature for a malformed one or one that leaves a
        required header unsigned, InvalidClientTokenId for an unknown access key id,
        RequestExpired past the allowed skew, SignatureDoesNotMatch otherwise."""
        authorization = headers.get("authorization")
        if not authorization:
            raise SqsError(MISSING_AUTHENTICATION, "Request is missing Authentication Token")
        found = _AUTHORIZATION.fullmatch(authorization.strip())
        if found is None:
            raise SqsError(INCOMPLETE_SIGNATURE, "Authorization header is not AWS4-HMAC-SHA256")
        signed = found["signed"].split(";")
        missing = REQUIRED_SIGNED - set(signed)
        if missing:
            raise SqsError(
                INCOMPLETE_SIGNATURE, f"SignedHeaders must include {', '.join(sorted(missing))}"
            )
        entry = self._by_id.get(found["key"])
        if entry is None:
            raise SqsError(
                INVALID_CLIENT_TOKEN, "The security token included in the request is invalid."
            )
        key, caller = entry
        stamp = headers.get("x-amz-date", "")
        self._check_time(stamp, found["date"], now or datetime.now(UTC))
        if found["region"] != self._region or found["service"] != SERVICE:
            raise SqsError(
                SIGNATURE_DOES_NOT_MATCH,
                f"Credential should be scoped to region {self._region!r} and service 'sqs'.",
            )
        expected = self._signature(key, found["key"], method, path, query, headers, signed, body)
        if not hmac.compare_digest(expected.encode(), found["signature"].encode()):
            raise SqsError(
                SIGNATURE_DOES_NOT_MATCH,
                "The request signature we calculated does not match the signature you "
                "provided. Check your AWS Secret Access Key and signing method.",
            )
        return caller

    @staticmethod
    def _check_time(stamp: str, scope_date: str, now: datetime) -> None:
        try:
            sent = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        except ValueError:
            raise SqsError(
                INCOMPLETE_SIGNATURE, "X-Amz-Date must be a basic ISO 8601 time (yyyymmddThhmmssZ)"
            ) from None
        if abs((now - sent).total_seconds()) > MAX_SKEW_SECONDS:
            raise SqsError(
                REQUEST_EXPIRED,
                f"Request has expired: X-Amz-Date {stamp} is more than 15 minutes from "
                f"{now:%Y%m%dT%H%M%SZ}.",
            )
        if stamp[:8] != scope_date:
            raise SqsError(SIGNATURE_DOES_NOT_MATCH, "Credential date does not match X-Amz-Date")

    def _signature(
        self,
        key: str,
        key_id: str,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        signed: list[str],
        body: bytes,
    ) -> str:
        # Only the headers the client signed take part, each as received.
        request = AWSRequest(
            method=method,
            url=f"http://{headers.get('host', '')}{path}" + (f"?{query}" if query else ""),
            headers={name: headers.get(name, "") for name in signed},
            data=body,
        )
        request.context["timestamp"] = headers["x-amz-date"]
        sent_hash = headers.get("x-amz-content-sha256")
        if sent_hash is not None and sent_hash != hashlib.sha256(body).hexdigest():
            raise SqsError(SIGNATURE_DOES_NOT_MATCH, "X-Amz-Content-SHA256 does not match body")
        signer = SigV4Auth(Credentials(key_id, key), SERVICE, self._region)
        canonical = signer.canonical_request(request)
        return str(signer.signature(signer.string_to_sign(request, canonical), request))

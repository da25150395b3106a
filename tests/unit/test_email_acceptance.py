"""An email payload is accepted at submit exactly when the worker can send it (issue 16 item 13;
README: "422 … also an email payload the processor would refuse"): the producer's admission
check and the email processor's preparation are compared over generated payloads."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiosmtplib.email import flatten_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import InvalidInput
from common.mail import EmailPolicy
from common.payloads import check_task_payload
from jobq.processors import JobContext, NonRetryable
from services.producer.admission import payload_checks
from services.worker.processors.email import EmailProcessor

POLICY = EmailPolicy.of(["alerts@acme.example"], [])
SPECIAL = "\t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x07\x7f\x85\x9f\u2028\u2029\ufeff\u00e9\u65e5 :;,<>@\"'="
"""Line boundaries, controls, separators and header syntax, mixed into ordinary text."""

# What survives the producer's generic payload bounds (no NUL, no unpaired surrogate).
stored_text = st.text(
    st.sampled_from(SPECIAL) | st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    max_size=40,
)
addresses = st.sampled_from(["a@acme.example", "b@x.example", "j\u00fcrg@x.example"]) | stored_text


def submit_accepts(payload: dict[str, Any]) -> bool:
    """What the producer answers: 202 (True) or a 422 for the payload (False)."""
    try:
        check_task_payload(payload_checks(POLICY), "email", payload)
    except InvalidInput:
        return False
    return True


def worker_accepts(payload: dict[str, Any]) -> bool:
    """Whether the email processor gets as far as the SMTP conversation: the payload checked,
    the message built and flattened as aiosmtplib will flatten it; False for a dead letter."""
    processor = EmailProcessor("127.0.0.1", 9, "jobq@localhost", 1.0, POLICY)
    try:
        _, message = processor.prepare(JobContext(uuid.uuid4(), "email", payload, 1, 5, None))
    except NonRetryable:
        return False
    flatten_message(message)
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    subject=stored_text,
    body=stored_text,
    to=addresses,
    sender=st.none() | st.just("alerts@acme.example") | addresses,
    reply_to=st.none() | addresses,
)
def test_submit_accepts_exactly_what_the_worker_can_send(
    subject: str, body: str, to: str, sender: str | None, reply_to: str | None
) -> None:
    payload: dict[str, Any] = {"to": to, "subject": subject, "body": body}
    if sender is not None:
        payload["from"] = sender
    if reply_to is not None:
        payload["replyTo"] = reply_to
    assert submit_accepts(payload) == worker_accepts(payload), payload


@pytest.mark.parametrize(
    "character", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1e", "\x07", "\x7f"]
)
def test_line_breaks_and_controls_in_a_subject_are_refused_by_both(character: str) -> None:
    payload = {"to": "a@acme.example", "subject": f"Invoice{character}Bcc: x@evil.example"}
    with pytest.raises(InvalidInput) as refused:
        check_task_payload(payload_checks(POLICY), "email", payload)
    assert refused.value.errors == [
        {"pointer": "/payload/subject", "detail": refused.value.errors[0]["detail"]}
    ]
    assert "single line" in refused.value.errors[0]["detail"]
    assert not worker_accepts(payload)


def test_a_tab_and_non_ascii_text_stay_allowed() -> None:
    payload = {"to": "a@acme.example", "subject": "R\u00e9sum\u00e9\tQ3 \u65e5\u672c", "body": "x"}
    assert submit_accepts(payload) and worker_accepts(payload)

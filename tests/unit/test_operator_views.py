"""Pure logic of the operator views: error normalisation and grouping, the SVG chart's points,
JSON cutting, bulk filters, and the command line's --filter parsing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import click
import pytest

from common.contracts import JobStatus, ListedJob
from common.errors import InvalidInput
from common.operations import MinuteCount
from jobq.cli_views import parse_filter
from services.producer.console import render
from services.queue import bulk

NOW = datetime(2026, 12, 4, 18, 30, 15, tzinfo=UTC)


def listed(task_type: str, error: str | None, queue: str = "q") -> ListedJob:
    fields = dict.fromkeys(ListedJob.__struct_fields__)
    fields |= {
        "id": uuid.uuid4(), "tenant": "acme", "queue": queue, "task_type": task_type,
        "status": JobStatus.DEAD_LETTER, "priority": 0, "attempts": 1, "releases": 0,
        "max_attempts": 1, "last_error": error, "created_at": NOW, "updated_at": NOW,
        "visible_at": NOW, "cancel_requested": False,
    }  # fmt: skip
    return ListedJob(**{k: v for k, v in fields.items() if v is not None or k in _NULLABLE})


_NULLABLE = {"timeout_seconds", "last_error", "idempotency_key", "locked_by", "claimed_at",
             "finished_at"}  # fmt: skip


def test_ids_numbers_and_quoted_values_do_not_split_error_groups() -> None:
    one = render.normalised(f"timeout after 30 s calling 'https://a/1' for job {uuid.uuid4()}")
    two = render.normalised(f"timeout after 31.5 s calling 'https://b/2' for job {uuid.uuid4()}")
    assert one == two == "timeout after <n> s calling <id> for job <id>"
    assert render.normalised(None) == "(no error recorded)"
    assert len(render.normalised("x" * 1000)) == 200


def test_dead_letters_group_by_queue_task_type_then_error() -> None:
    jobs = [listed("webhook", f"HTTP 500 from host {i}") for i in range(3)]
    jobs += [listed("webhook", "refused"), listed("email", "bounced", queue="mail")]
    groups = render.dead_groups(jobs)
    assert [(g.queue, g.task_type, g.count) for g in groups] == [
        ("q", "webhook", 4),
        ("mail", "email", 1),
    ]
    [(commonest, ids), (other, _)] = groups[0].errors()
    assert commonest == "HTTP <n> from host <n>" and len(ids) == 3 and other == "refused"


def test_chart_points_span_the_hour_scaled_to_the_peak() -> None:
    minute = NOW.replace(second=0, microsecond=0)
    points = [
        MinuteCount(queue="q", minute=minute, completed=10, failed=5),
        MinuteCount(queue="q", minute=minute - timedelta(minutes=59), completed=0, failed=1),
        MinuteCount(queue="q", minute=minute - timedelta(minutes=90), completed=99, failed=0),
    ]
    chart = render.charts(points, NOW)["q"]
    assert (chart.top, chart.total_completed, chart.total_failed) == (10, 10, 6)
    completed = chart.completed.split()
    assert len(completed) == 60 and completed[-1] == "240.0,2.0" and completed[0] == "0.0,40.0"


def test_json_over_64_kib_is_cut_unless_all_is_asked_for() -> None:
    big = {"blob": "x" * (render.JSON_SHOWN_BYTES + 10)}
    text, cut = render.pretty(big, show_all=False)
    assert cut and len(text.encode()) <= render.JSON_SHOWN_BYTES + 4
    assert render.pretty(big, show_all=True) == (render.pretty(big, True)[0], False)


def test_bulk_filters_match_only_what_the_action_applies_to() -> None:
    assert bulk.narrowed("retry", None) == (JobStatus.DEAD_LETTER, JobStatus.CANCELLED)
    assert bulk.narrowed("cancel", JobStatus.SCHEDULED) == (JobStatus.SCHEDULED,)
    with pytest.raises(InvalidInput) as refused:
        bulk.narrowed("delete", JobStatus.PENDING)
    assert refused.value.errors[0]["pointer"] == "/status"
    where, args = bulk.Filter(bulk.ALLOWED["cancel"], queue="q", tenant="acme").where()
    assert where.startswith("status IN ('PENDING', 'SCHEDULED', 'PROCESSING') AND queue = $1")
    assert "tenant = $2" in where and "cancel_requested" in where and args == ["q", "acme"]


def test_cli_filters_are_checked_before_anything_is_sent() -> None:
    assert parse_filter(("status=dead_letter", "queue=q", "task-type=t")) == {
        "status": "DEAD_LETTER",
        "queue": "q",
        "task-type": "t",
    }
    for bad in ("colour=red", "status=", "queue", "status=SLEEPING"):
        with pytest.raises(click.BadParameter):
            parse_filter((bad,))

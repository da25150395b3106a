"""When a replica's long polls wake for a rate-limit token (issue 18): the soonest due time
the replica knows, never one that has passed."""

from __future__ import annotations

from services.queue.service import soonest_token
from services.queue.wakeup import WakeupHub


def test_the_first_due_time_is_kept() -> None:
    assert soonest_token(None, 12.0, now=10.0) == 12.0


def test_the_sooner_of_two_pending_due_times_wins() -> None:
    assert soonest_token(11.0, 12.0, now=10.0) == 11.0
    assert soonest_token(13.0, 12.0, now=10.0) == 12.0


def test_a_due_time_that_has_passed_is_replaced_not_kept_as_the_soonest() -> None:
    # The claim that reported the new due time ran after 9.0: that token is spent, and
    # keeping 9.0 would wake the long polls at once for nothing.
    assert soonest_token(9.0, 12.0, now=10.0) == 12.0
    assert soonest_token(10.0, 12.0, now=10.0) == 12.0


def test_a_queue_mark_changes_with_each_notification_and_on_a_reconnect() -> None:
    hub = WakeupHub()
    before = hub.heard("hooks")
    hub.handle_notification("other:3")
    assert hub.heard("hooks") == before
    hub.handle_notification("hooks:1")
    after = hub.heard("hooks")
    assert after != before
    hub.handle_notification("not a payload")
    assert hub.heard("hooks") == after
    hub.wake_all()  # the listener reconnected: notifications may have been missed
    assert hub.heard("hooks") != after

"""The queue service's database spans are named by the statement that ran
(`services/queue/statements.py`): each statement constant by its variable's name, a statement
built at run time where it is built, anything else by its first SQL word only."""

from __future__ import annotations

import services.queue.app  # noqa: F401  (imports every module that registers statements)
from common.enqueue import ENQUEUE_ASYNCPG, FIND_EXISTING_ASYNCPG
from services.queue import activity, repository, sqs_store, statements


def test_statement_constants_are_named_by_their_variables() -> None:
    assert statements.name_of(repository._CLAIM) == "claim"
    assert statements.name_of(repository._CLAIM_FAIR) == "claim_fair"
    assert statements.name_of(repository._ACK_AND_CLAIM) == "ack_and_claim"
    assert statements.name_of(repository._ACK) == "ack"
    assert statements.name_of(repository._FAIL) == "fail"
    assert statements.name_of(repository._HEARTBEAT) == "heartbeat"
    assert statements.name_of(repository._MARK_AWAITED) == "mark_awaited"
    assert statements.name_of(ENQUEUE_ASYNCPG) == "enqueue"
    assert statements.name_of(FIND_EXISTING_ASYNCPG) == "find_existing"
    assert statements.name_of(activity._UPSERT_WORKERS) == "upsert_workers"
    # Another module's `_GET` is told apart by its prefix.
    assert statements.name_of(sqs_store._GET) == "sqs_get"
    assert statements.name_of(repository._GET) == "get"


def test_every_statement_constant_of_the_repository_has_a_name() -> None:
    unnamed = [
        variable
        for variable, value in vars(repository).items()
        if isinstance(value, str)
        and variable.isupper()
        and statements._STATEMENT.match(value)
        and statements._NAMES.get(value) is None
    ]
    assert unnamed == []


def test_statements_built_at_run_time_are_named_where_they_are_built() -> None:
    built = "SELECT id FROM job WHERE queue = $1 -- a shape built at run time"
    assert statements.named("list_jobs", built) is built
    assert statements.name_of(built) == "list_jobs"


def test_anything_else_is_named_by_its_first_word_only() -> None:
    assert statements.name_of("BEGIN ISOLATION LEVEL READ COMMITTED;") == "BEGIN"
    assert statements.name_of("  select 'secret-value' AS x") == "SELECT"
    assert statements.name_of("") == "statement"

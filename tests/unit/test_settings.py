"""Environment variables are validated at start-up, with the variable named."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.queue.settings import QueueSettings, async_database_url
from services.worker.settings import WorkerSettings


def test_durations_and_lists_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_REAPER_INTERVAL", "500ms")
    monkeypatch.setenv("QUEUE_RETRY_MAX_DELAY", "5m")
    monkeypatch.setenv("WORKER_QUEUES", "default, email")
    monkeypatch.setenv("WEBHOOK_ALLOWED_HOSTS", "localhost,127.0.0.1")

    assert QueueSettings().queue_reaper_interval == 0.5
    assert QueueSettings().queue_retry_max_delay == 300
    worker = WorkerSettings()
    assert worker.worker_queues == ["default", "email"]
    assert worker.webhook_allowed_hosts == ["localhost", "127.0.0.1"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QUEUE_REAPER_INTERVAL", "soon"),
        ("QUEUE_SCHEDULER_INTERVAL", "0"),
        ("QUEUE_VISIBILITY_TIMEOUT", "0"),
        ("DATABASE_URL", "mysql://x"),
        ("QUEUE_DB_STATEMENT_TIMEOUT", "-1s"),
        ("QUEUE_LISTEN_PROBE_INTERVAL", "0"),
    ],
)
def test_bad_queue_settings_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable.lower()):
        QueueSettings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("WORKER_QUEUES", "Bad Queue"), ("WORKER_CONCURRENCY", "0"), ("WORKER_METRICS_PORT", "70000")],
)
def test_bad_worker_settings_fail(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable.lower()):
        WorkerSettings()


def test_session_limits_are_milliseconds_and_0_turns_one_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QUEUE_DB_STATEMENT_TIMEOUT", "1.5s")
    monkeypatch.setenv("QUEUE_DB_IDLE_IN_TRANSACTION_TIMEOUT", "0")
    assert QueueSettings().session_limits() == {
        "statement_timeout": "1500",
        "idle_in_transaction_session_timeout": "0",
    }
    monkeypatch.setenv("QUEUE_DB_STATEMENT_TIMEOUT", "0.0001")
    assert QueueSettings().session_limits()["statement_timeout"] == "1", "never rounded to off"


def test_database_url_gets_the_asyncpg_driver() -> None:
    assert async_database_url("postgresql://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert async_database_url("postgres://u@h/db") == "postgresql+asyncpg://u@h/db"


def test_load_settings_names_the_variable_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from common.settings import load_settings

    monkeypatch.setenv("QUEUE_REAPER_INTERVAL", "5x")
    with pytest.raises(SystemExit) as exited:
        load_settings(QueueSettings)
    assert exited.value.code == 2
    assert "QUEUE_REAPER_INTERVAL: '5x' is not a duration" in capsys.readouterr().err


@pytest.mark.parametrize("blank", ["", " ", ","])
def test_api_keys_set_but_empty_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    from services.producer.settings import ProducerSettings

    monkeypatch.setenv("JOBQ_API_KEYS", blank)
    with pytest.raises(ValidationError, match="jobq_api_keys"):
        ProducerSettings()

"""Environment variables are validated at start-up, with the variable named."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from common.web.access import Caller, Role
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


def test_worker_queues_take_the_bar_form_of_a_worker_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`email|webhook` is a list for the worker and the regex of its group's KEDA queries."""
    monkeypatch.setenv("WORKER_QUEUES", "email|webhook")
    assert WorkerSettings().worker_queues == ["email", "webhook"]


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
    from common.web.settings import load_settings

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


def test_security_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.producer.settings import ProducerSettings

    keys = tmp_path / "keys"
    keys.write_text(
        "# tenants\nsubmit:acme:acme-key-0123456789ab\n\nadmin:*:root-key-0123456789ab\n"
    )
    monkeypatch.setenv("JOBQ_API_KEYS", "submit:globex:globex-key-0123456789")
    monkeypatch.setenv("JOBQ_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("PRODUCER_RATE_LIMIT", "2000/second")
    monkeypatch.setenv("SMTP_TENANT_RATE", "off")
    monkeypatch.setenv("SMTP_ALLOWED_SENDERS", "alerts@acme.example, @news.acme.example")
    monkeypatch.setenv("HTTP_HEADER_TIMEOUT", "2s")
    monkeypatch.setenv("HTTP_MAX_HEADER_BYTES", "16KiB")
    monkeypatch.setenv("HTTP_MAX_CONNECTIONS", "100")
    monkeypatch.setenv("HTTP_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7,::1")
    monkeypatch.setenv("JOBQ_INSECURE_OPEN_ACCESS", "1")

    settings = ProducerSettings()
    api_keys = settings.api_keys()
    assert len(api_keys) == 3 and api_keys.tenants() == {"acme", "globex", "*"}
    resolved = api_keys.resolve("acme-key-0123456789ab")
    assert resolved is not None and resolved.tenant == "acme"
    assert settings.producer_rate_limit == ("second", 2000)
    assert settings.smtp_tenant_rate is None
    assert settings.email_policy().sender_allowed("x@news.acme.example")
    limits = settings.server_limits()
    assert (limits.header_timeout, limits.max_header_bytes, limits.max_connections) == (
        2.0,
        16384,
        100,
    )
    assert limits.trusted_proxies == ("10.0.0.0/8", "192.168.1.7/32", "::1/128")
    assert settings.jobq_insecure_open_access is True
    default = ProducerSettings(_env_file=None)  # type: ignore[call-arg]
    assert default.http_body_timeout == 30.0
    monkeypatch.delenv("HTTP_TRUSTED_PROXIES")
    assert ProducerSettings().server_limits().trusted_proxies == ()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PRODUCER_RATE_LIMIT", "fast"),
        ("PRODUCER_RATE_LIMIT", "0/second"),
        ("SMTP_TENANT_RATE", "10 per minute"),
        ("SMTP_ALLOWED_SENDERS", "not-an-address"),
        ("SMTP_ALLOWED_RECIPIENT_DOMAINS", "a@b.example"),
        ("HTTP_HEADER_TIMEOUT", "0"),
        ("HTTP_MAX_HEADER_BYTES", "10"),
        ("HTTP_TRUSTED_PROXIES", "10.0.0.1/8"),
        ("HTTP_TRUSTED_PROXIES", "*"),
        ("HTTP_TRUSTED_PROXIES", "proxy.internal"),
        ("JOBQ_API_KEYS_FILE", "/nonexistent/keys"),
        ("JOBQ_API_KEYS", "submit:*:submit-key-0123456789"),
    ],
)
def test_bad_security_settings_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    from services.producer.settings import ProducerSettings

    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError):
        ProducerSettings()


@pytest.mark.parametrize(
    ("entries", "where"),
    [
        # A second field that is no tenant name once made an admin of `default` whose key was
        # `ACME:<key>` (issue 16 item 14).
        ("admin:ACME:acme-admin-key-0123456789", "JOBQ_API_KEYS: entry 1"),
        (
            "submit:acme:acme-key-0123456789ab, admin::root-key-0123456789ab",
            "JOBQ_API_KEYS: entry 2",
        ),
        ("submit:acme:acme-key-0123456789ab\nsubmit:a b:x-key-0123456789ab", "KEYS: entry 2"),
        ("submit:Acme.Corp:acme-key-0123456789ab", "JOBQ_API_KEYS: entry 1"),
    ],
)
def test_an_entry_whose_tenant_is_no_name_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], entries: str, where: str
) -> None:
    from common.web.settings import load_settings
    from services.producer.settings import ProducerSettings

    monkeypatch.setenv("JOBQ_API_KEYS", entries)
    with pytest.raises(SystemExit) as exit_:
        load_settings(ProducerSettings)
    assert exit_.value.code == 2
    printed = capsys.readouterr().err
    assert f"{where}: the tenant" in printed and "role:default:<key>" in printed, printed
    assert "key-0123456789" not in printed, "a key (or part of one) must never be printed"


def test_a_keys_file_entry_whose_tenant_is_no_name_is_named_by_its_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from common.web.settings import load_settings
    from services.producer.settings import ProducerSettings

    keys = tmp_path / "keys"
    keys.write_text(
        "# tenants, one a line\n\nsubmit:acme:acme-key-0123456789ab\n"
        "admin:ACME:acme-admin-key-0123456789\n"
    )
    monkeypatch.setenv("JOBQ_API_KEYS_FILE", str(keys))
    with pytest.raises(SystemExit):
        load_settings(ProducerSettings)
    printed = capsys.readouterr().err
    assert f"JOBQ_API_KEYS_FILE: {keys} line 4: the tenant" in printed, printed
    assert "admin-key" not in printed

    # The legacy two-field form still means tenant `default`; a key with ':' takes three.
    keys.write_text("admin:legacy-key-0123456789ab\nsubmit:default:ACME:key-0123456789ab\n")
    api_keys = load_settings(ProducerSettings).api_keys()
    assert api_keys.resolve("legacy-key-0123456789ab") == Caller(Role.ADMIN, "default")
    assert api_keys.resolve("ACME:key-0123456789ab") == Caller(Role.SUBMIT, "default")


def test_a_key_in_both_the_variable_and_the_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.producer.settings import ProducerSettings

    keys = tmp_path / "keys"
    keys.write_text("submit:acme:shared-key-0123456789\n")
    monkeypatch.setenv("JOBQ_API_KEYS", "admin:*:shared-key-0123456789")
    monkeypatch.setenv("JOBQ_API_KEYS_FILE", str(keys))
    with pytest.raises(ValidationError, match="listed in JOBQ_API_KEYS and the keys file") as error:
        ProducerSettings()
    assert "shared-key" not in str(error.value), "a key must never appear in an error"


@pytest.mark.parametrize("value", ["localhost:0", "[::1", "a:b:c:d:e:x]:1"])
def test_bad_webhook_allowed_hosts_refuse_to_start(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("WEBHOOK_ALLOWED_HOSTS", value)
    with pytest.raises(ValidationError, match="webhook_allowed_hosts"):
        WorkerSettings()

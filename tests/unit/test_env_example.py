""".env.example names every setting the services read, so it cannot silently fall behind."""

from __future__ import annotations

import re
from pathlib import Path

from common.web.tracing import STANDARD_VARIABLES
from services.producer.settings import ProducerSettings
from services.queue.settings import QueueSettings
from services.sqs.settings import SqsSettings
from services.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def test_env_example_lists_every_setting() -> None:
    text = (ROOT / ".env.example").read_text()
    listed = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, flags=re.MULTILINE))
    fields = {
        name.upper()
        for settings in (QueueSettings, ProducerSettings, WorkerSettings, SqsSettings)
        for name in settings.model_fields
    }
    assert fields - listed == set(), "add these to .env.example"
    # The standard OpenTelemetry variables are read by the SDK, not by a settings class.
    assert set(STANDARD_VARIABLES) - listed == set(), "add these to .env.example"
    assert listed - fields - set(STANDARD_VARIABLES) == set(), "these are not settings"

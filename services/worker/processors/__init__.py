"""Processors: the code a worker runs for each `taskType`.

Built in: `webhook` (POST JSON to a URL), `email` (send via SMTP), `noop` and `sleep`.

To add your own, write a module that defines async processors and a `register(registry)`
function (the SDK is `jobq.processors`, re-exported by `jobq`), make it importable on the
worker's `PYTHONPATH`, and list its dotted path in `WORKER_PROCESSOR_MODULES`
(comma-separated):

    # myapp/jobs.py, listed as WORKER_PROCESSOR_MODULES=myapp.jobs
    from jobq import JobContext, ProcessorRegistry

    async def resize(job: JobContext) -> dict[str, int]:
        ...  # must be idempotent: the same job may run more than once

    def register(registry: ProcessorRegistry) -> None:
        registry.register("resize-image", resize)

`register` may pass `timeout_seconds=` to give a task type its own default job timeout and
`max_timeout_seconds=` to bound what a job may ask for with its `timeoutSeconds` (by default, no
more than the larger of that default and `WORKER_JOB_TIMEOUT`; operators override it with
`WORKER_TIMEOUT_CAPS`); a name registered later replaces a built-in of the same name. Raise
`Retry` for transient failures and `NonRetryable` when retrying cannot help (see
`jobq.processors`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from jobq.processors import ProcessorRegistry
from services.worker.processors.basic import noop, sleep
from services.worker.processors.email import EmailProcessor
from services.worker.processors.webhook import WebhookProcessor

if TYPE_CHECKING:
    import httpx

    from services.worker.settings import WorkerSettings

__all__ = ["build_registry", "load_processor_module"]


def build_registry(settings: WorkerSettings, http: httpx.AsyncClient) -> ProcessorRegistry:
    """The built-in processors, then those of each `WORKER_PROCESSOR_MODULES` entry, in order.

    `http` is used by `webhook` and stays owned by the caller. Raises RuntimeError naming the
    module when a user module cannot be imported, has no `register`, or its `register` fails.
    """
    registry = ProcessorRegistry()
    registry.register(
        "webhook",
        WebhookProcessor(http, settings.webhook_allowed_hosts, settings.webhook_timeout),
    )
    registry.register(
        "email",
        EmailProcessor(
            settings.smtp_host,
            settings.smtp_port,
            settings.smtp_sender,
            settings.smtp_timeout,
            settings.email_policy(),
        ),
    )
    registry.register("noop", noop)
    registry.register("sleep", sleep)
    for module_path in settings.worker_processor_modules:
        load_processor_module(registry, module_path)
    registry.cap_timeouts(settings.timeout_caps())
    return registry


def load_processor_module(registry: ProcessorRegistry, module_path: str) -> None:
    """Import `module_path` and call its `register(registry)`; RuntimeError names the module."""
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:  # any error while importing user code, not only ImportError
        raise RuntimeError(
            f"WORKER_PROCESSOR_MODULES: cannot import {module_path!r}: {exc!r}"
        ) from exc
    register = getattr(module, "register", None)
    if not callable(register):
        raise RuntimeError(
            f"WORKER_PROCESSOR_MODULES: module {module_path!r} has no register(registry) function"
        )
    try:
        register(registry)
    except Exception as exc:
        raise RuntimeError(
            f"WORKER_PROCESSOR_MODULES: {module_path}.register(registry) failed: {exc!r}"
        ) from exc

"""Alembic environment: async engine, URL from QueueSettings, serialised by an advisory lock.

Replicas or CI jobs that migrate at the same time queue up on the lock; the later ones find
the schema at head and do nothing. A database that refuses connections or is still starting is
waited for, up to QUEUE_MIGRATE_WAIT (60 s).
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from services.queue.models import HISTORY_PARTITION_PREFIX, Base
from services.queue.repository import wait_for_database
from services.queue.settings import QueueSettings, async_database_url, plain_database_url

# An arbitrary constant, distinct from any lock the queue itself takes.
MIGRATION_LOCK_KEY = 0x6A6F6271_00000001

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Leave the partitions of `job_history` out of `alembic check`: the queue service makes
    and drops them at run time (services/queue/history.py), so no migration names them."""
    if type_ == "table" and reflected and compare_to is None and name is not None:
        return not name.startswith(HISTORY_PARTITION_PREFIX)
    return True


def _run(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.commit()
    try:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            include_object=_include_object,
            transaction_per_migration=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
        connection.commit()


async def _run_async() -> None:
    settings = QueueSettings()
    url = config.attributes.get("database_url") or settings.database_url
    # The database may still be starting (compose starts both at once): wait for it to accept
    # connections for up to QUEUE_MIGRATE_WAIT instead of failing on the first refusal.
    await wait_for_database(plain_database_url(url), settings.queue_migrate_wait)
    engine = create_async_engine(async_database_url(url), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
asyncio.run(_run_async())

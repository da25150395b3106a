"""The queue service's SQL statements by name, and their database spans when tracing is on
(docs/architecture.md#tracing).

Every statement the queue service runs is a module constant (`_CLAIM`, `_ACK_AND_CLAIM`,
`ENQUEUE_ASYNCPG` …) or is built from a bounded set of shapes (a listing's filters, a bulk
action); each module registers its constants here (`register`, `named`), and the name is the
constant's, lower-cased without its underscores at the ends (`claim`, `ack_and_claim`,
`enqueue`), so a span names the very constant a reader looks up in the code. With tracing on,
the pool's connections are `TracedConnection`s: each statement is a CLIENT span of that name,
a child of whatever span is current (a request's, a settle's), carrying `db.system.name`,
`db.namespace` and `db.operation.name` and never the statement's text or its parameters, so
no value a job holds leaves in a span. With tracing off the pool uses asyncpg's own
connections and nothing here runs per statement.

OpenTelemetry's asyncpg instrumentation, used before, names a span by the statement's first
SQL word (`WITH`, `SELECT`), which says nothing of which of the thirty-odd statements ran.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any

import asyncpg
from opentelemetry.trace import SpanKind

from common.enqueue import ENQUEUE_ASYNCPG, FIND_EXISTING_ASYNCPG, RELEASE_KEY_ASYNCPG
from common.web import tracing

_NAMES: dict[str, str] = {}
_NAMES_MAX = 4096
"""Statement texts named at most (the built shapes are bounded far below: a listing's filter
combinations, a bulk action's statuses); past it a new text is named by its first word."""

_CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
_STATEMENT = re.compile(r"^\s*(WITH|SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
_FIRST_WORD = re.compile(r"^\s*([A-Za-z]+)")


def named(name: str, statement: str) -> str:
    """Name `statement` (SQL text) `name` for its spans; returns `statement`, so a statement
    built at run time is named where it is built."""
    if statement not in _NAMES and len(_NAMES) < _NAMES_MAX:
        _NAMES[statement] = name
    return statement


def register(namespace: Mapping[str, Any], prefix: str = "") -> None:
    """Name every statement constant of a module (`globals()`): each upper-case variable
    holding SQL text that begins with WITH, SELECT, INSERT, UPDATE or DELETE (fragments of
    statements do not) is named `prefix` + the variable's name, lower-cased, without its
    leading and trailing underscores (`_ACK_AND_CLAIM` → `ack_and_claim`)."""
    for variable, value in namespace.items():
        if isinstance(value, str) and _CONSTANT.match(variable) and _STATEMENT.match(value):
            named(prefix + variable.strip("_").lower(), value)


named("enqueue", ENQUEUE_ASYNCPG)
named("find_existing", FIND_EXISTING_ASYNCPG)
named("release_key", RELEASE_KEY_ASYNCPG)


def name_of(statement: str) -> str:
    """The name of `statement`: its registered name, else its first SQL word in upper case
    (`BEGIN`, `COMMIT` of a transaction), never anything from its text after that."""
    found = _NAMES.get(statement)
    if found is not None:
        return found
    word = _FIRST_WORD.match(statement)
    return word.group(1).upper() if word else "statement"


class TracedConnection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection whose statements are spans named by `name_of` (see the module);
    the pool's `connection_class` when tracing is on."""

    def _span(self, statement: str) -> contextlib.AbstractContextManager[Any]:
        tracer = tracing.tracer
        if tracer is None:
            return contextlib.nullcontext()
        name = name_of(statement)
        attributes = {
            "db.system.name": "postgresql",
            "db.system": "postgresql",
            "db.operation.name": name,
            "db.namespace": self._params.database or "",
        }
        return tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    # Each override takes asyncpg's own keyword options (`timeout`, `record_class`, `column`)
    # as they come, and passes them on.
    async def execute(self, query: str, *args: Any, **options: Any) -> Any:
        with self._span(query):
            return await super().execute(query, *args, **options)

    async def executemany(self, command: str, args: Any, **options: Any) -> Any:
        with self._span(command):
            return await super().executemany(command, args, **options)

    async def fetch(self, query: str, *args: Any, **options: Any) -> Any:
        with self._span(query):
            return await super().fetch(query, *args, **options)

    async def fetchrow(self, query: str, *args: Any, **options: Any) -> Any:
        with self._span(query):
            return await super().fetchrow(query, *args, **options)

    async def fetchval(self, query: str, *args: Any, **options: Any) -> Any:
        with self._span(query):
            return await super().fetchval(query, *args, **options)

"""Unknown query parameters are refused, on every route of the API (docs/architecture.md#bounds).

A parameter a route does not read is a caller's mistake (`task_type` for `taskType`,
`colour=blue` on `GET /jobs/{id}`), and ignoring it silently answers a different question
than the one asked. The parameters a route knows are the query parameters of its handler's
signature (and its dependencies'), exactly as Litestar parses them: its `KwargsModel`, built
when the app is, so no route keeps a list of its own and the check cannot drift from what the
route reads. A parameter outside them is a `422` naming it (`query:<name>`), like any other
bad query parameter.

Routes left out of the API description (`include_in_schema=False`: `/health/live`,
`/health/ready`, `/metrics`, Litestar's `/schema`) are not checked: they are read by probes and
scrapers, which some set-ups give parameters of their own (a load balancer's cache-buster, a
Prometheus job's `params`), and a refused probe takes a healthy replica out of service.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request
from litestar.routes import HTTPRoute

from common.errors import InvalidInput


def unknown_parameters_error(unknown: list[str]) -> InvalidInput:
    """The 422 for query parameters `unknown` (sorted names): one `query:<name>` pointer each."""
    return InvalidInput(
        f"unknown query parameter(s): {', '.join(unknown)}",
        errors=[{"pointer": f"query:{name}", "detail": "unknown parameter"} for name in unknown],
    )


def known_parameters(app: Litestar) -> dict[int, frozenset[str] | None]:
    """For each HTTP route handler of `app` (by `id`), the query parameter names it reads
    (aliases, as sent), or None for a route that is not checked (not in the API description)."""
    known: dict[int, frozenset[str] | None] = {}
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler, kwargs_model in route.route_handler_map.values():
            names = frozenset(p.field_alias for p in kwargs_model.expected_query_params)
            known[id(handler)] = names if handler.resolve_include_in_schema() else None
    return known


class QueryParameterCheck:
    """A `before_request` step raising InvalidInput for a query parameter the route's handler
    does not read. The table of `known_parameters` is built on the first request (the app's
    routes are complete by then) and kept."""

    def __init__(self) -> None:
        self._known: dict[int, frozenset[str] | None] | None = None

    def __call__(self, request: Request[Any, Any, Any]) -> None:
        """Raise InvalidInput naming every unknown query parameter of `request`."""
        if not request.scope.get("query_string"):
            return
        if self._known is None:
            self._known = known_parameters(request.app)
        known = self._known.get(id(request.route_handler))
        if known is None:
            return
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            raise unknown_parameters_error(unknown)

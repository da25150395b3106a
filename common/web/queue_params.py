"""Parameters of the queue routes (`/queues/{queue}/pause|resume`), shared by both services so
validation and OpenAPI agree."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from litestar import Request
from litestar.params import HeaderParameter, Parameter

from common.contracts import ACTOR_MAX, NAME_PATTERN
from common.errors import InvalidInput

ACTOR_HEADER = "X-Jobq-Actor"
"""Who asks for a queue's change, as the producer identified its caller; recorded with it."""

QueuePath = Annotated[
    str,
    Parameter(pattern=NAME_PATTERN, description="The queue's name (as jobs name it)."),
]
QueueAction = Annotated[
    Literal["pause", "resume"],
    Parameter(
        description="`pause`: the queue takes submits and hands out nothing; `resume`: it "
        "hands out jobs again, its long polls woken at once."
    ),
]
_ACTOR = re.compile(rf"[\x21-\x7e][\x20-\x7e]{{0,{ACTOR_MAX - 1}}}")

Actor = Annotated[
    str | None,
    HeaderParameter(
        name=ACTOR_HEADER,
        description="Who asks (printable ASCII, not starting with a space, at most 200 "
        "characters), recorded as the change's `by`; the producer sends its caller's role, "
        "tenant and key id. Omitted: `queue-service`.",
    ),
]
"""`X-Jobq-Actor`, checked by `actor_of` at the boundary."""


def check_queue_path(request: Request[Any, Any, Any], queue: str, action: str) -> None:
    """Raise InvalidInput (pointer `path:queue`) unless the request's path, as sent, is
    exactly `/queues/<queue>/<action>`. The router decodes `%2F` and collapses empty segments
    before matching, so `/queues/%2Fdefault/pause` or `//queues//default//pause` would
    otherwise reach the queue `default` under a name that is not a queue name."""
    sent = request.scope.get("raw_path") or request.scope["path"].encode()
    if sent != f"/queues/{queue}/{action}".encode():
        raise InvalidInput(
            "the queue must be one path segment matching the queue-name pattern",
            errors=[{"pointer": "path:queue", "detail": "not a queue name as sent"}],
        )


def actor_of(value: str | None) -> str:
    """The recorded actor of a change: `X-Jobq-Actor`'s value, `queue-service` when absent.
    Raises InvalidInput (pointer `header:X-Jobq-Actor`) unless it is 1-200 printable ASCII
    characters not starting with a space."""
    if value is None:
        return "queue-service"
    if not _ACTOR.fullmatch(value):
        raise InvalidInput(
            f"{ACTOR_HEADER} must be 1-{ACTOR_MAX} printable ASCII characters",
            errors=[{"pointer": f"header:{ACTOR_HEADER}", "detail": "not a recordable actor"}],
        )
    return value

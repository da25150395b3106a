"""Parameters of the queue routes (`/queues/{queue}/pause|resume`), shared by both services so
validation and OpenAPI agree."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar.params import HeaderParameter, Parameter

from common.contracts import ACTOR_MAX, NAME_PATTERN

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
Actor = Annotated[
    str | None,
    HeaderParameter(
        name=ACTOR_HEADER,
        pattern=rf"^[\x21-\x7e][\x20-\x7e]{{0,{ACTOR_MAX - 1}}}$",
        description="Who asks (printable ASCII, at most 200 characters), recorded as the "
        "change's `by`; the producer sends its caller's role, tenant and key id. Omitted: "
        "`queue-service`.",
    ),
]
"""`X-Jobq-Actor`; a direct caller of the queue service that sends none is `queue-service`."""

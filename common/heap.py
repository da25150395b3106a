"""The garbage collector in a long-running service: startup's objects frozen out of its scans.

CPython's cyclic collector walks every tracked object of the generations it collects. A jobq
service holds about 125,000 of them once its modules are imported and its app is built (routes,
schemas, the OpenTelemetry and Prometheus machinery), none of which ever becomes garbage; a full
(generation 2) collection walks them all with the event loop stopped: 25 to 33 ms for the queue
service's app alone on this project's 2-core test machine, and 47 and 64 ms for the two the
queue service made during one `make bench-waiters` run, each a burst of late answers
(benchmark/README.md#waiting-for-outcomes; both timed by a collector callback added for those
measurements only).

`gc.freeze()` (CPython 3.7+, bpo-31558; the `gc` module's documentation) moves every object
alive now into a permanent generation that collections ignore, so later ones walk only what
the process made since. The price: a frozen object that later ends up in an unreachable
reference cycle is never collected, so freeze once, when what exists is what the process
keeps.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now into the collector's permanent
    generation. Call it once the process is set up (modules imported, app built, pools open)
    and before it starts serving. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

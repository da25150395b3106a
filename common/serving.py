"""Serve a Litestar app with uvicorn, telling the app the moment a shutdown begins."""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn
from litestar import Litestar


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Litestar) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin: Any = self._app.state.get("begin_shutdown")
        if begin is not None:
            begin()
        super().handle_exit(sig, frame)


def serve(app: Litestar, host: str, port: int, grace_seconds: float) -> None:
    """Serve `app` until SIGTERM/SIGINT, then drain in-flight requests for up to
    `grace_seconds` before the lifespan shutdown runs.

    `app.state.begin_shutdown()`, when present, is called as soon as the signal arrives, so a
    long poll answers at once instead of holding the drain for its full wait.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=max(1, int(grace_seconds)),
        lifespan="on",
    )
    _Server(config, app).run()

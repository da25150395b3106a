"""The pure core every jobq part agrees on: wire contracts and bounds, errors as problem
details, ids, the idempotency hash, validation, and the one enqueue path. It needs msgspec
and the standard library only (the client distribution ships it); the server kit the services
share (Litestar, uvicorn, prometheus_client, aiohttp, pydantic-settings) is `common.web`.

Import-linter contracts in pyproject.toml check both: nothing here imports a service, and
nothing outside `common.web` imports a framework or a database driver.
"""

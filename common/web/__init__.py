"""The server kit the jobq services share (Litestar, uvicorn, prometheus_client, aiohttp,
pydantic-settings): problem-detail handlers and OpenAPI (`app`), strict bodies, access
checks, list-query parameters, serving, HTTP metrics, pool metrics, the service-to-service
HTTP client and settings types. The client library never imports it (pyproject.toml's
import-linter contracts).
"""

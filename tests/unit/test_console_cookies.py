"""The console's cookies in-process (Litestar's test client, memory store, no queue service
needed for signing in): `Secure` exactly when the request came over TLS, and the sign-in's
own CSRF cookie checked."""

from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient

from services.producer.app import create_app
from services.producer.settings import ProducerSettings

KEY = "admin-cookie-test-0123456789"


@pytest.mark.parametrize(("scheme", "secure"), [("https", True), ("http", False)])
def test_session_cookie_is_secure_over_tls_only(scheme: str, secure: bool) -> None:
    settings = ProducerSettings(jobq_api_keys=f"admin:*:{KEY}", redis_url="")
    with TestClient(create_app(settings), base_url=f"{scheme}://console.test") as client:
        form = client.get("/console/login")
        assert ("Secure" in form.headers["set-cookie"]) is secure
        token = re.search(r'name="login_token" value="([^"]+)"', form.text)
        assert token is not None
        signed = client.post(
            "/console/login",
            data={"api_key": KEY, "login_token": token[1]},
            follow_redirects=False,
        )
        assert signed.status_code == 303
        [session] = [c for c in signed.headers.get_list("set-cookie") if "jobq_console=" in c]
        assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/console" in session
        assert ("Secure" in session) is secure
        assert KEY not in session


def test_sign_in_without_its_form_token_is_refused() -> None:
    settings = ProducerSettings(jobq_api_keys=f"admin:*:{KEY}", redis_url="")
    with TestClient(create_app(settings)) as client:
        refused = client.post("/console/login", data={"api_key": KEY, "login_token": "x" * 64})
        assert refused.status_code == 403 and "sign-in form" in refused.text
        assert "jobq_console=" not in refused.headers.get("set-cookie", "")

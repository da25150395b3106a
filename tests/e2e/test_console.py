"""The console in a real browser: Playwright driving Debian's Chromium (installed by
`make tools`, `infra.browser`; Playwright never downloads one) against a real stack. Signs in,
watches counts fall as jobs complete (the live refresh, no reload), sees a worker come and go,
retries a dead letter and sees it complete, redrives a group after its dry-run count,
bulk-cancels all matching scheduled jobs, signs out and is refused; checks the cookie's flags,
the CSP header, a forged form's refusal, and that a submit key cannot act. Saves a screenshot
of every page under docs/console/ (shown in the README, "Console")."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"

from playwright.async_api import Browser, Page, async_playwright, expect

from infra.browser import FLAGS, ensure_browser
from infra.stack import LocalStack
from tests.e2e.conftest import E2E_SETTINGS, wait_for_status

ADMIN = "console-admin-0123456789abcdef"
SUBMIT = "console-submit-0123456789abcdef"
KEYS = f"admin:*:{ADMIN},submit:acme:{SUBMIT}"
QUEUE = "console-e2e"
"""The queue the stack's worker serves (no other test module's jobs land in it)."""
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT_MS = 30_000
SCHEDULES = '[{"name":"nightly-report","cron":"0 3 * * *","taskType":"noop","queue":"reports"}]'


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LocalStack]:
    """Queue service and producer with an admin of * and a submit key; the worker is started
    by the tests, so they can watch jobs wait first."""
    stack = LocalStack(
        database_url,
        redis_url,
        tmp_path_factory.mktemp("console"),
        environment={
            **E2E_SETTINGS,
            "JOBQ_API_KEYS": KEYS,
            "QUEUE_ACTIVITY_INTERVAL": "200ms",
            "QUEUE_DEPTH_INTERVAL": "500ms",
            "QUEUE_WORKER_LIVE": "3s",
            "QUEUE_SCHEDULES": SCHEDULES,
            "WORKER_QUEUES": QUEUE,
            "WORKER_CONCURRENCY": "4",
        },
    )
    await stack.start(workers=0)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless."""
    executable = ensure_browser()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(executable), args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


async def signed_in(
    browser: Browser, stack: LocalStack, key: str = ADMIN, shot: bool = False
) -> Page:
    """A new browser context signed in with `key`."""
    context = await browser.new_context(
        base_url=stack.producer, viewport={"width": 1280, "height": 800}
    )
    page = await context.new_page()
    await page.goto("/console/login")
    await page.get_by_label("API key").fill(key)
    if shot:
        await screenshot(page, "login")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    return page


async def screenshot(page: Page, name: str, full_page: bool = True) -> None:
    """Save the page as docs/console/NAME.png (the viewport only when not `full_page`: a
    page of 100 jobs would be a tall, heavy image)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


async def submit(stack: LocalStack, jobs: list[dict[str, Any]]) -> list[str]:
    async with httpx.AsyncClient(base_url=stack.producer) as client:
        reply = await client.post("/jobs/batch", json={"jobs": jobs}, headers=auth(ADMIN))
        assert reply.status_code == 200, reply.text
        return [r["jobId"] for r in reply.json()["results"]]


async def until(check: Callable[[], Awaitable[bool]], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.2)


def cell(page: Page, queue: str, count: str) -> Any:
    return page.locator(f'tr[data-queue="{queue}"] td[data-count="{count}"]')


async def test_counts_fall_live_as_jobs_complete_and_a_worker_comes_and_goes(
    stack: LocalStack, browser: Browser
) -> None:
    await submit(
        stack, [{"taskType": "noop", "queue": QUEUE, "payload": {"i": i}} for i in range(200)]
    )
    page = await signed_in(browser, stack, shot=True)
    await expect(cell(page, QUEUE, "pending")).to_have_text("200", timeout=WAIT_MS)
    await stack.start_workers([0])
    # No reload: htmx swaps the table in every 2 s while the worker drains the queue.
    await expect(cell(page, QUEUE, "pending")).to_have_text("0", timeout=WAIT_MS)
    await page.reload()
    await expect(page.locator("svg.chart polyline.completed").first).to_be_attached()
    await screenshot(page, "overview")
    await page.get_by_role("link", name="Workers").click()

    async def listed() -> bool:
        await page.goto("/console/workers")
        return await page.locator('tr[data-worker="worker1"]').count() == 1

    await until(listed)
    await expect(page.locator('tr[data-worker="worker1"]')).to_contain_text("/ 4")
    await screenshot(page, "workers")
    await page.get_by_role("link", name="Schedules").click()
    await expect(page.locator("#schedules")).to_contain_text("nightly-report")
    await screenshot(page, "schedules")
    stack.stop_process("worker1")

    async def gone() -> bool:
        await page.goto("/console/workers")
        return await page.locator('tr[data-worker="worker1"]').count() == 0

    await until(gone)
    await stack.start_workers([0])


class _Hook(BaseHTTPRequestHandler):
    """A webhook receiver that fails until told to succeed."""

    succeed = False

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200 if _Hook.succeed else 500)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook"
    finally:
        server.shutdown()


async def test_retry_a_dead_letter_and_see_it_complete(
    stack: LocalStack, browser: Browser, receiver: str
) -> None:
    _Hook.succeed = False
    payload = {"url": receiver, "body": {"order": 42}}
    [job] = await submit(
        stack, [{"taskType": "webhook", "queue": QUEUE, "payload": payload, "maxAttempts": 1}]
    )
    async with httpx.AsyncClient(base_url=stack.producer) as client:
        await wait_for_status(client, job, {"DEAD_LETTER"}, headers=auth(ADMIN))
    page = await signed_in(browser, stack)
    await page.goto("/console/dead-letters")
    group = page.locator(f'section[data-queue="{QUEUE}"][data-task-type="webhook"]')
    await expect(group).to_contain_text("webhook")
    await screenshot(page, "dead-letters")
    await group.get_by_role("link").first.click()
    await expect(page.locator("#job-status")).to_have_text("DEAD_LETTER")
    await expect(page.locator(".timeline")).to_contain_text("attempt 1")
    await screenshot(page, "job")
    _Hook.succeed = True
    # The form posts, then the 303 brings the job page back: wait for that navigation to end
    # before reloading, or the reload races it ("Not attached to an active page").
    async with page.expect_navigation():
        await page.get_by_role("button", name="Retry").click()

    async def completed() -> bool:
        await page.reload()
        return await page.locator("#job-status").inner_text() == "COMPLETED"

    await until(completed)


async def test_redrive_a_group_after_its_dry_run_count(stack: LocalStack, browser: Browser) -> None:
    task = f"missing-{uuid.uuid4().hex[:6]}"  # no processor: each job dead-letters
    ids = await submit(
        stack, [{"taskType": task, "queue": QUEUE, "payload": {}, "maxAttempts": 1}] * 5
    )
    async with httpx.AsyncClient(base_url=stack.producer) as client:
        for job in ids:
            await wait_for_status(client, job, {"DEAD_LETTER"}, headers=auth(ADMIN))
    page = await signed_in(browser, stack)
    await page.goto(f"/console/dead-letters?queue={QUEUE}")
    group = page.locator(f'section[data-task-type="{task}"]')
    await expect(group.locator(".count")).to_have_text("5")
    await expect(group).to_contain_text("no processor for task type <id> on this worker")
    await group.get_by_role("button", name=re.compile("Redrive")).click()
    await expect(page.locator("#count")).to_have_attribute("data-count", "5")
    await screenshot(page, "redrive-confirm")
    await page.get_by_role("button", name="Redrive 5 jobs").click()
    await expect(page.locator("#done")).to_have_text("Moved 5 dead-lettered jobs back to PENDING")


async def test_bulk_cancel_all_matching_scheduled_jobs(stack: LocalStack, browser: Browser) -> None:
    later = f"later-{uuid.uuid4().hex[:6]}"
    await submit(
        stack,
        [
            {"taskType": "noop", "queue": later, "payload": {"i": i}, "delaySeconds": 3600}
            for i in range(120)
        ],
    )
    page = await signed_in(browser, stack)
    await page.goto(f"/console/jobs?status=SCHEDULED&queue={later}")
    await expect(page.locator("#jobs tbody tr")).to_have_count(100)  # one page of 100
    await expect(page.get_by_role("link", name="Older jobs →")).to_be_visible()
    await screenshot(page, "jobs", full_page=False)
    # Two selected rows first: the confirmation counts the selection.
    boxes = page.locator('#jobs input[name="ids"]')
    await boxes.nth(0).check()
    await boxes.nth(1).check()
    await page.get_by_label("Cancel", exact=True).check()
    await page.get_by_role("button", name="Continue…").click()
    await expect(page.get_by_role("heading")).to_have_text("Cancel 2 jobs?")
    await page.get_by_role("button", name="Cancel 2 jobs").click()
    await expect(page.locator("#done")).to_have_text("Cancel: 2 of 2 jobs changed")
    # Then all matching the filter, beyond the page shown.
    await page.goto(f"/console/jobs?status=SCHEDULED&queue={later}")
    await page.get_by_label("Cancel", exact=True).check()
    await page.get_by_label(re.compile("All matching")).check()
    await page.get_by_role("button", name="Continue…").click()
    await expect(page.get_by_role("heading")).to_have_text("Cancel 118 jobs?")
    await screenshot(page, "bulk-confirm")
    await page.get_by_role("button", name="Cancel 118 jobs").click()
    await expect(page.locator("#done")).to_have_text("Cancel: 118 of 118 jobs changed")
    await page.goto(f"/console/jobs?status=SCHEDULED&queue={later}")
    await expect(page.locator("#jobs tbody")).to_contain_text("No job matches.")


async def test_session_cookie_csp_forged_form_and_sign_out(
    stack: LocalStack, browser: Browser
) -> None:
    page = await signed_in(browser, stack)
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "jobq_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert ADMIN not in str(await page.context.cookies())  # the key is not in the browser
    reply = await page.goto("/console/jobs")
    assert reply is not None
    csp = reply.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    # A form with the session's cookie but not its CSRF token (a forged cross-site post).
    forged = await page.request.post(
        "/console/jobs/bulk", form={"csrf": "0" * 64, "action": "delete", "all": "1"}
    )
    assert forged.status == 403 and "CSRF" in await forged.text()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("API key")).to_be_visible()
    # The old session id is refused by the server, not just forgotten by the browser.
    async with httpx.AsyncClient(base_url=stack.producer) as client:
        old = await client.get("/console/", headers={"Cookie": f"jobq_console={cookie['value']}"})
        assert old.status_code == 303 and old.headers["location"] == "/console/login"
    wrong = await page.context.new_page()
    await wrong.goto("/console/login")
    await wrong.get_by_label("API key").fill("not-a-key-at-all-000000")
    await wrong.get_by_role("button", name="Sign in").click()
    await expect(wrong.get_by_role("alert")).to_have_text("unknown API key")


async def test_a_submit_key_reads_and_cannot_act(stack: LocalStack, browser: Browser) -> None:
    async with httpx.AsyncClient(base_url=stack.producer) as client:
        reply = await client.post(
            "/jobs",
            json={
                "taskType": "noop",
                "queue": "acme-only",
                "payload": {},
                "idempotencyKey": "acme-order-7",
            },
            headers=auth(SUBMIT),
        )
        job = reply.json()["jobId"]
    page = await signed_in(browser, stack, key=SUBMIT)
    await page.goto("/console/jobs")
    await page.get_by_label("Idempotency key").fill("acme-order-7")
    await page.get_by_role("button", name="Find").click()
    await expect(page.locator("#jobs tbody tr")).to_have_count(1)
    await expect(page.locator("#jobs tbody")).to_contain_text(job)
    await page.goto("/console/")
    await expect(page.locator('tr[data-queue="acme-only"]')).to_be_visible()
    await page.goto(f"/console/jobs/{job}")
    await expect(page.locator("#job-status")).to_be_visible()
    assert await page.get_by_role("button", name="Cancel").count() == 0
    csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
    refused = await page.request.post(f"/console/jobs/{job}/cancel", form={"csrf": csrf or ""})
    assert refused.status == 403 and "admin key" in await refused.text()
    workers = await page.goto("/console/workers")
    assert workers is not None and workers.status == 403

"""The dashboard in a real headless Chromium, against a real uvicorn.

The app serves a real test database on loopback; Chromium loads /dashboard,
runs its script (virtual time, so the 2 s refresh does not slow the test)
and dumps the DOM it built. The DOM must show what the database holds: the
queue counts and the jobs the test made, one per state.

Needs Debian's ``chromium`` package (/usr/bin/chromium). Without it the
tests fail; they do not skip.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from pgqueue import JobState, Queue, Settings
from pgqueue.api import create_app
from tests.browser import DevTools, chromium
from tests.support import LiveServer

TOKEN = "dashboard-test-admin-token"

# Clicks a job's row, then a button of its detail panel, answers its
# confirmation (ANSWER: confirm-ok or confirm-cancel), and returns what the
# panel's message says once the API has answered. Waits up to 30 s for each
# step: on a machine busy with other work the first refreshes can take
# several of their 2 s turns.
CLICK = """(async () => {
  const until = async (f) => {
    for (let i = 0; i < 1200; i++) {
      const v = f(); if (v) return v; await new Promise(r => setTimeout(r, 25));
    }
    throw new Error("timed out waiting in the page");
  };
  (await until(() => document.querySelector('#jobs-body tr[data-job-id="JOB"]'))).click();
  await until(() => document.getElementById("detail-id").textContent === "#JOB"
    && !document.getElementById("detail-actions").hidden);
  const message = document.getElementById("detail-message");
  message.className = "message";
  const button = document.getElementById("job-BUTTON");
  if (button.disabled) return {kind: "disabled", text: "", state:
    document.querySelector('#detail-fields dd[data-field="state"]').textContent};
  button.click();
  const dialog = await until(() => document.getElementById("confirm").open
    && document.getElementById("confirm"));
  const question = document.getElementById("confirm-text").textContent;
  document.getElementById("ANSWER").click();
  return await until(() => !dialog.open && /\\b(ok|error)\\b|Nothing done/.test(
      message.className + " " + message.textContent)
    && {kind: message.className.replace("message", "").trim() || "none", text: message.textContent,
        state: document.querySelector('#detail-fields dd[data-field="state"]').textContent,
        question});
})()"""


def click_button(
    page: DevTools, job: int, button: str, answer: str = "confirm-ok"
) -> dict[str, str]:
    script = CLICK.replace("JOB", str(job)).replace("BUTTON", button).replace("ANSWER", answer)
    result: dict[str, str] = page.run(script)  # type: ignore[assignment]
    result.pop("question", None)
    return result


# -- reading the dumped DOM ------------------------------------------------------------------


@dataclass
class Row:
    attrs: dict[str, str]
    cells: list[tuple[dict[str, str], str]] = field(default_factory=list)

    def col(self, name: str) -> str:
        return next(text for attrs, text in self.cells if attrs.get("data-col") == name)


class Dom(HTMLParser):
    """Rows of each tbody (by id), and which elements carry ``hidden``."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[Row]] = {}
        self.hidden: set[str] = set()
        self.ids: set[str] = set()
        self._tbody: str | None = None
        self._cell: tuple[dict[str, str], list[str]] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
            if "hidden" in a:
                self.hidden.add(a["id"])
        if tag == "tbody" and "id" in a:
            self._tbody = a["id"]
            self.tables[a["id"]] = []
        elif tag == "tr" and self._tbody:
            self.tables[self._tbody].append(Row(a))
        elif tag == "td" and self._tbody:
            self._cell = (a, [])

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[1].append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._tbody:
            self.tables[self._tbody][-1].cells.append((self._cell[0], "".join(self._cell[1])))
            self._cell = None
        elif tag == "tbody":
            self._tbody = None

    def rows(self, tbody: str, key: str) -> dict[str, Row]:
        return {r.attrs[key]: r for r in self.tables[tbody] if key in r.attrs}


def element_text(dom: str, element_id: str) -> str:
    match = re.search(rf'<pre id="{element_id}">(.*?)</pre>', dom, flags=re.DOTALL)
    assert match, f"no #{element_id} in the DOM"
    return html.unescape(match.group(1))


# -- the data ------------------------------------------------------------------------------

INJECTION = '<b id="injected">bold</b><img src=x onerror="document.title=1">'


def make_jobs(queue: Queue) -> dict[str, int]:
    """One job per state, ids by state. Claims pick the oldest first, so the
    jobs that must run are enqueued (and finished) before the one that waits."""
    ok = queue.enqueue("send_email", {"to": "a@example.com"})
    [claimed] = queue.claim(worker="test")
    assert claimed.id == ok.id
    assert queue.ack(claimed, {"message_id": "m-42", "sent": True}) is JobState.SUCCEEDED

    dead = queue.enqueue("charge_card", {"amount": 12}, max_attempts=1)
    [claimed] = queue.claim(worker="test")
    assert claimed.id == dead.id
    assert queue.fail(claimed, "card declined: insufficient funds") is JobState.DEAD

    waiting = queue.enqueue("resize_image", {"path": "a.png", "note": INJECTION}, queue="images")
    return {"succeeded": ok.id, "dead": dead.id, "queued": waiting.id}


EXPECTED_QUEUES = {  # what make_jobs did, per queue
    "default": {"queued": 0, "running": 0, "succeeded": 1, "failed_attempts": 1, "dead": 1},
    "images": {"queued": 1, "running": 0, "succeeded": 0, "failed_attempts": 0, "dead": 0},
}


# -- tests -----------------------------------------------------------------------------------


@pytest.fixture
def browser_profile(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "chromium-profile"


def test_dashboard_shows_queues_jobs_and_a_job_in_a_real_browser(
    settings: Settings, queue: Queue, browser_profile: Path
) -> None:
    ids = make_jobs(queue)
    in_db = {j.id: j for j in queue.list_jobs(limit=100)}
    assert {in_db[i].state for i in ids.values()} == {JobState(s) for s in ids}

    with LiveServer(create_app(settings)) as server:
        page = httpx.get(f"{server.url}/dashboard", timeout=5)
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        # The successful job's detail, opened by a link: #job=<id>.
        dom_text = chromium(f"{server.url}/dashboard#job={ids['succeeded']}", browser_profile)

    dom = Dom(dom_text)
    assert "token-prompt" in dom.hidden and "app" not in dom.hidden

    queues = dom.rows("queues-body", "data-queue")
    assert set(queues) == set(EXPECTED_QUEUES)
    for name, counts in EXPECTED_QUEUES.items():
        for col, value in counts.items():
            assert queues[name].col(col) == str(value), (name, col)

    jobs = dom.rows("jobs-body", "data-job-id")
    assert set(jobs) == {str(i) for i in in_db}
    for job_id, job in in_db.items():
        row = jobs[str(job_id)]
        texts = [text for _, text in row.cells]
        assert texts[1:5] == [str(job.id), job.queue, job.task, str(job.state)]
        assert row.attrs["data-state"] == str(job.state)
    order = [int(r.attrs["data-job-id"]) for r in dom.tables["jobs-body"]]
    assert order == sorted(in_db, reverse=True), "newest first"
    assert "jobs-more" in dom.hidden, "one page: no next_cursor, no More button"

    # Detail panel: payload and result as JSON, no error.
    ok = in_db[ids["succeeded"]]
    assert "detail-body" not in dom.hidden
    assert json.loads(element_text(dom_text, "detail-payload")) == ok.payload
    assert json.loads(element_text(dom_text, "detail-result")) == ok.result
    assert element_text(dom_text, "detail-error") == "—"


def test_dashboard_shows_the_error_and_escapes_job_data(
    settings: Settings, queue: Queue, browser_profile: Path
) -> None:
    ids = make_jobs(queue)
    with LiveServer(create_app(settings)) as server:
        dead_dom = chromium(f"{server.url}/dashboard#job={ids['dead']}", browser_profile)
        queued_dom = chromium(f"{server.url}/dashboard#job={ids['queued']}", browser_profile)

    dead = queue.get(ids["dead"])
    assert element_text(dead_dom, "detail-error") == dead.last_error
    assert element_text(dead_dom, "detail-result") == "—"

    # Job data is text: the markup in the payload is shown, never parsed.
    assert "injected" not in Dom(queued_dom).ids
    assert "<img" not in queued_dom.replace(INJECTION, "")
    assert json.loads(element_text(queued_dom, "detail-payload"))["note"] == INJECTION


def test_more_button_appears_when_there_is_a_next_page(
    settings: Settings, queue: Queue, browser_profile: Path
) -> None:
    queue.enqueue_many([{"task": "bulk", "payload": {"n": n}} for n in range(51)])
    newest_first = [j.id for j in queue.list_jobs(limit=100)]
    with LiveServer(create_app(settings)) as server:
        dom = Dom(chromium(f"{server.url}/dashboard", browser_profile))
    shown = [int(r.attrs["data-job-id"]) for r in dom.tables["jobs-body"]]
    assert shown == newest_first[:50]
    assert "jobs-more" not in dom.hidden


def test_with_a_token_the_page_loads_and_asks_for_it(
    settings: Settings, queue: Queue, tmp_path: Path
) -> None:
    ids = make_jobs(queue)
    with LiveServer(create_app(settings.replace(api_tokens=(TOKEN,)))) as server:
        # The page itself is public (it holds no data); the data is not.
        assert httpx.get(f"{server.url}/dashboard", timeout=5).status_code == 200
        assert httpx.get(f"{server.url}/queues", timeout=5).status_code == 401
        assert httpx.get(f"{server.url}/dashboard/", timeout=5).status_code == 401

        without = chromium(f"{server.url}/dashboard", tmp_path / "p1")
        wrong = chromium(f"{server.url}/dashboard#token=not-the-token", tmp_path / "p2")
        # The token in the fragment goes to sessionStorage, and leaves the DOM.
        right = chromium(
            f"{server.url}/dashboard#token={TOKEN}&job={ids['succeeded']}", tmp_path / "p3"
        )

    dom = Dom(without)
    assert "token-prompt" not in dom.hidden and "app" in dom.hidden
    assert not dom.rows("queues-body", "data-queue") and not dom.rows("jobs-body", "data-job-id")
    assert "This API needs a token" in without

    dom = Dom(wrong)
    assert "token-prompt" not in dom.hidden and "app" in dom.hidden
    assert "refused this token (unknown token)" in wrong

    dom = Dom(right)
    assert "token-prompt" in dom.hidden and "app" not in dom.hidden
    assert set(dom.rows("queues-body", "data-queue")) == set(EXPECTED_QUEUES)
    assert set(dom.rows("jobs-body", "data-job-id")) == {str(i) for i in ids.values()}
    assert json.loads(element_text(right, "detail-result")) == queue.get(ids["succeeded"]).result
    assert TOKEN not in right


def test_cancel_and_retry_buttons_call_the_api_and_show_its_409_message(
    settings: Settings, queue: Queue, browser_profile: Path
) -> None:
    ids = make_jobs(queue)
    # A dead job whose key another job took meanwhile: the API refuses its retry.
    first = queue.enqueue("report", idempotency_key="daily", unique_scope="active", max_attempts=1)
    [claimed] = queue.claim(worker="test")
    assert queue.fail(claimed, "timeout") is JobState.DEAD
    queue.enqueue("report", idempotency_key="daily", unique_scope="active")
    with LiveServer(create_app(settings.replace(api_tokens=(TOKEN,)))) as server:
        # What the API itself says when that job is retried.
        refused = httpx.post(
            f"{server.url}/jobs/{first.id}/retry",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
        )
        assert refused.status_code == 409
        with DevTools(f"{server.url}/dashboard#token={TOKEN}", browser_profile) as page:
            # The fragment's token moved to sessionStorage and left the address bar.
            assert page.run("location.href") == f"{server.url}/dashboard"
            assert page.run('sessionStorage.getItem("pgqueue.dashboard.token")') == TOKEN

            def click(job: int, button: str, answer: str = "confirm-ok") -> dict[str, str]:
                return click_button(page, job, button, answer)

            assert click(first.id, "retry") == {
                "kind": "error",
                "text": refused.json()["message"],
                "state": "dead",
            }
            assert queue.get(first.id).state is JobState.DEAD
            # A state the action does not apply to: the button is disabled.
            assert click(ids["succeeded"], "retry") == {
                "kind": "disabled",
                "text": "",
                "state": "succeeded",
            }
            assert queue.get(ids["succeeded"]).state is JobState.SUCCEEDED

            assert click(ids["queued"], "cancel") == {
                "kind": "ok",
                "text": "Cancelled.",
                "state": "cancelled",
            }
            assert queue.get(ids["queued"]).state is JobState.CANCELLED

            assert click(ids["queued"], "retry")["state"] == "queued"
            assert queue.get(ids["queued"]).state is JobState.QUEUED

            assert click(ids["dead"], "cancel")["kind"] == "disabled"
            assert queue.get(ids["dead"]).state is JobState.DEAD

            # Dismissed: nothing is sent, nothing changes.
            assert click(ids["queued"], "cancel", "confirm-cancel") == {
                "kind": "none",
                "text": "Nothing done.",
                "state": "queued",
            }
            assert queue.get(ids["queued"]).state is JobState.QUEUED


def test_without_a_token_the_page_still_changes_jobs_and_lists_them_light(
    settings: Settings, queue: Queue, browser_profile: Path
) -> None:
    # No token: the API takes writes only from its own pages (same origin,
    # JSON), which the dashboard is.
    ids = make_jobs(queue)
    with (
        LiveServer(create_app(settings)) as server,
        DevTools(f"{server.url}/dashboard", browser_profile) as page,
    ):
        assert click_button(page, ids["queued"], "cancel") == {
            "kind": "ok",
            "text": "Cancelled.",
            "state": "cancelled",
        }
        assert queue.get(ids["queued"]).state is JobState.CANCELLED
        assert click_button(page, ids["queued"], "retry")["state"] == "queued"
        assert queue.get(ids["queued"]).state is JobState.QUEUED

        requested: list[str] = page.run(  # type: ignore[assignment]
            'performance.getEntriesByType("resource").map((e) => e.name)'
        )
    listings = [url for url in requested if "/jobs?" in url]
    assert listings and all("fields=summary" in url for url in listings), requested
    # The panel fetched the one job it shows, whole.
    assert f"{server.url}/jobs/{ids['queued']}" in requested

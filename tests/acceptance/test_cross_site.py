"""Attacks from other pages, in a real headless Chromium, on an API that
has no token (the `make run` default).

* Cross-site request forgery: a page served from another local origin (a
  second server, on another port) tries every way a page can send a POST
  without the API's consent: fetch in no-cors mode, a JSON fetch (which
  needs a CORS preflight), and form posts. The job must stay queued and no
  job may be added; the server must have seen the attempts and refused them.
* DNS rebinding: a name that resolves to 127.0.0.1 (Chromium's
  --host-resolver-rules stands in for the attacker's DNS) must not reach
  the API's data, so the rebound page cannot read jobs.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgqueue import JobState, Queue, Settings
from pgqueue.api import create_app
from tests.browser import chromium
from tests.support import LiveServer

ATTACK = """<!doctype html>
<html><body>
<pre id="log"></pre>
<iframe name="sink" hidden></iframe>
<form id="cancel-form" method="POST" action="API/jobs/JOB/cancel" target="sink"></form>
<form id="enqueue-form" method="POST" action="API/jobs" enctype="text/plain" target="sink">
  <input name='{"task": "forged", "x": "' value='"}'>
</form>
<script>
const log = (line) => { document.getElementById("log").textContent += line + "\\n"; };
const attempts = [
  ["no-cors cancel", () => fetch("API/jobs/JOB/cancel", {method: "POST", mode: "no-cors"})],
  ["no-cors enqueue", () => fetch("API/jobs", {method: "POST", mode: "no-cors",
     headers: {"Content-Type": "text/plain"}, body: JSON.stringify({task: "forged"})})],
  ["json cancel", () => fetch("API/jobs/JOB/cancel", {method: "POST",
     headers: {"Content-Type": "application/json"}, body: "{}"})],
];
(async () => {
  for (const [name, attempt] of attempts) {
    try { await attempt(); log(name + ": sent"); } catch (e) { log(name + ": blocked"); }
  }
  const sink = document.querySelector("iframe");
  for (const form of ["cancel-form", "enqueue-form"]) {
    await new Promise((done) => { sink.onload = done; document.getElementById(form).submit(); });
    log(form + ": submitted");
  }
  log("finished");
})();
</script>
</body></html>"""


class Recorder:
    """Notes the method, path and status of every request the API answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def note(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, note if scope["type"] == "http" else send)


def attacker_site(api_url: str, job_id: int) -> Starlette:
    page = ATTACK.replace("API", api_url).replace("JOB", str(job_id))

    async def index(request: object) -> HTMLResponse:
        return HTMLResponse(page)

    return Starlette(routes=[Route("/", index)])


def test_a_page_on_another_origin_cannot_change_jobs(
    settings: Settings, queue: Queue, tmp_path: Path
) -> None:
    job = queue.enqueue("victim")
    api = Recorder(create_app(settings))
    with LiveServer(api) as server, LiveServer(attacker_site(server.url, job.id)) as attacker:
        assert attacker.url != server.url  # same host, another port: another origin
        dom = chromium(attacker.url + "/", tmp_path / "profile")

    assert "finished" in dom, dom  # every attempt ran to its end
    assert queue.get(job.id).state is JobState.QUEUED
    assert [j.task for j in queue.list_jobs()] == ["victim"]
    cancel, enqueue = f"/jobs/{job.id}/cancel", "/jobs"
    # The browser did send the simple requests (no-cors fetches, forms):
    # the API refused them. The JSON one it never sent, as its preflight failed.
    assert {("POST", cancel, 403), ("POST", enqueue, 403)} <= set(api.seen), api.seen
    assert ("OPTIONS", cancel, 405) in api.seen
    assert not [s for s in api.seen if s[0] == "POST" and s[2] < 400], api.seen


def test_a_rebound_name_cannot_read_jobs(settings: Settings, queue: Queue, tmp_path: Path) -> None:
    queue.enqueue("secret_task", {"card": "4111"})
    with LiveServer(create_app(settings)) as server:
        rebound = server.url.replace("127.0.0.1", "rebind.attacker.test")
        resolve = "--host-resolver-rules=MAP rebind.attacker.test 127.0.0.1"
        for path in ("/jobs", "/dashboard"):
            dom = chromium(rebound + path, tmp_path / "profile", resolve, "--dump-dom")
            assert "host_not_allowed" in dom, dom
            assert "secret_task" not in dom and "4111" not in dom
        # The same browser, by the server's address, is answered.
        assert "secret_task" in chromium(server.url + "/jobs", tmp_path / "profile")

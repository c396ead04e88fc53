"""Screenshots of every dashboard view, on a laptop and on a phone, for the docs:
docs/img/dashboard/<view>-desktop.png (1440x900) and <view>-phone.png (390x844).

    python -m bench.plots.screenshots [--out docs/img/dashboard]

Starts a throwaway embedded PostgreSQL, fills it as a small shop would look
after an hour (the dashboard tests' jobs in every state, three workers and a
paused queue; an hour of history for the charts; schedules; workflows that
succeeded, died and still run), serves the API with uvicorn on loopback and
opens each view in a real headless Chromium (tests/browser.py). What is
shown is the page as it draws itself from the API, never drawn by hand.
Needs Debian's chromium and the [embedded] extra. The pictures are committed;
tests/unit/test_dashboard_screenshots.py checks that every view has both and
that docs/api.md shows them (CI does not make them again).
"""

from __future__ import annotations

import argparse
import base64
import importlib
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import Queue, Settings, chain, group
from pgqueue.api import create_app
from pgqueue.core import history
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.db.migrate import migrate
from tests.browser import DevTools
from tests.support import LiveServer

# The dashboard tests' stack (jobs in every state, three workers, a paused
# queue) and their wait for the page: a test module, outside mypy's files.
_views_test: Any = importlib.import_module("tests.acceptance.test_dashboard_views")
populate, until = _views_test.populate, _views_test.until

VIEWS = ("overview", "jobs", "dead", "workers", "schedules", "workflows")
SIZES = {"desktop": (1440, 900, False), "phone": (390, 844, True)}


def fill(queue: Queue, url: str) -> dict[str, str]:
    """The demo; returns the fragments that open a job and a workflow."""
    with psycopg.connect(url, autocommit=True) as sql:
        ids = populate(queue, sql)
    # An hour of history: jobs done minute after minute, a snapshot each.
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for minute in range(60, 0, -1):
        for name, count in (("emails", 4 + minute % 7), ("payments", 1 + minute % 3)):
            queue.enqueue_many([{"task": "send_email", "queue": name} for _ in range(count)])
            for job in queue.claim(count, worker="w-ok", queues=[name]):
                if (job.id + minute) % 9:
                    queue.ack(job, {"ok": True})
                else:
                    queue.fail(job, "timeout talking to the provider", retryable=False)
        queue.run(history.snapshot(now - timedelta(minutes=minute)))
    queue.create_schedule("cleanup", "purge", every=3600)
    queue.create_schedule("weekly-digest", "digest", cron="0 8 * * 1")
    queue.create_schedule("old-report", "report", cron="0 3 * * *", enabled=False)
    done = queue.enqueue_workflow(chain({"task": "fetch"}, {"task": "store"}))
    for _ in range(2):
        for job in queue.claim(2, queues=["default"]):
            queue.ack(job, {"done": job.task})
    queue.enqueue_workflow(chain({"task": "parse", "max_attempts": 1}, {"task": "load"}))
    [parse] = queue.claim(1, queues=["default"])
    queue.fail(parse, "parse error: line 3\nTraceback: ...", retryable=False)
    running = queue.enqueue_workflow(
        chain(
            {"task": "extract"},
            group({"task": "resize"}, {"task": "thumbnail"}),
            {"task": "publish"},
        )
    )
    [first] = queue.claim(1, queues=["default"])
    queue.ack(first, {"files": 12})
    queue.claim(1, queues=["default"])
    assert done.id != running.id
    return {"jobs": f"#job={ids['dead']}", "workflows": f"#workflow={running.id}"}


def shoot(page: DevTools, path: Path) -> int:
    """The visible part of the page, as a PNG; its size in bytes."""
    shot = page.call("Page.captureScreenshot", {"format": "png"})
    data = base64.b64decode(str(shot["data"]))
    path.write_bytes(data)
    return len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/dashboard"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pgqueue-shots-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "db")
        url = server.ensure_running()
        try:
            migrate(url)
            settings = Settings(database_url=url)
            with Queue(url, settings=settings) as queue:
                opened = fill(queue, url)
            with (
                LiveServer(create_app(settings, url=url)) as api,
                DevTools("about:blank", Path(tmp) / "chromium") as page,
            ):
                page.color_scheme("light")
                for size, (width, height, mobile) in SIZES.items():
                    page.viewport(width, height, mobile=mobile)
                    for view in VIEWS:
                        fragment = opened.get(view, f"#view={view}")
                        page.goto(f"{api.url}/dashboard{fragment}")
                        until(page, 'document.getElementById("status").textContent'
                                    '.startsWith("Updated")')  # fmt: skip
                        if view == "overview":
                            until(page, 'document.querySelector("#chart-throughput svg")')
                        time.sleep(0.5)  # the charts' and graph's last layout
                        path = args.out / f"{view}-{size}.png"
                        print(f"wrote {path} ({shoot(page, path) // 1024} KiB)")
                page.goto("about:blank")
        finally:
            server.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The OpenAPI document generates a working client: openapi-python-client
(PyPI) generates one from the live app's /openapi.json, and a program that
imports it enqueues and reads jobs through it against a real running API.

The generator pins httpx and typer below the dev venv's versions, so it and
the generated client run in a venv of their own, ``.venv-openapi`` (the
Makefile makes it: openapi-python-client and python-dateutil, which the
generated client reads times with)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pgqueue import JobState, Queue, Settings
from pgqueue.api import create_app
from tests.support import LiveServer

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ROOT / ".venv-openapi" / "bin"
TOKEN = "generated-client-token"
PACKAGE = "pgqueue_generated_client"

# Run with the generated package beside it; prints what it saw as JSON.
PROGRAM = f"""
import json, os, sys
from datetime import UTC, datetime

from {PACKAGE} import AuthenticatedClient
from {PACKAGE}.api.jobs import enqueue_batch_jobs_batch_post as batch
from {PACKAGE}.api.jobs import enqueue_jobs_post as enqueue
from {PACKAGE}.api.jobs import get_job_jobs_job_id_get as get_job
from {PACKAGE}.models import BatchEnqueueRequest, EnqueueRequest, EnqueueRequestPayloadType0

later = datetime(2030, 1, 1, 9, tzinfo=UTC)
seen = {{}}
with AuthenticatedClient(base_url=os.environ["API_URL"], token=os.environ["API_TOKEN"]) as client:
    # run_at: the generated model sends every default the document shows, and
    # a delay_seconds sent with it would be refused (api/models.field_schema).
    made = enqueue.sync_detailed(client=client, body=EnqueueRequest(
        task="send_email",
        payload=EnqueueRequestPayloadType0.from_dict({{"to": "ada@example.com"}}),
        queue="emails", priority=3, run_at=later))
    seen["status"] = made.status_code
    job = get_job.sync(client=client, job_id=made.parsed.id)
    seen["job"] = [job.id, job.task, job.queue, job.priority, job.state.value,
                   job.payload, job.run_at == later]
    jobs = [EnqueueRequest(task="a"), EnqueueRequest(task="b", delay=5)]
    answer = batch.sync_detailed(client=client, body=BatchEnqueueRequest(jobs=jobs))
    seen["batch"] = [answer.status_code, [j.id for j in answer.parsed.jobs]]
    refused = enqueue.sync_detailed(client=client, body=EnqueueRequest(task="t", priority=40000))
    seen["refused"] = [refused.status_code, refused.parsed.field]
print(json.dumps(seen))
"""


def run(tool: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    # Made by `make test` (the Makefile's target .venv-openapi/bin/openapi-python-client).
    assert (TOOLS / tool).exists(), f"no {TOOLS / tool}: run make test first"
    done = subprocess.run(
        [str(TOOLS / tool), *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The generator skips what it cannot read with a warning, not an error.
    assert done.returncode == 0 and "Warning" not in done.stdout + done.stderr, (
        done.stdout + done.stderr
    )
    return done.stdout


@pytest.fixture
def api(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(create_app(settings.replace(api_tokens=(TOKEN,)))) as server:
        yield server


def test_a_client_generated_from_the_document_enqueues_and_reads_jobs(
    api: LiveServer, queue: Queue, tmp_path: Path
) -> None:
    document = httpx.get(
        f"{api.url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert document.status_code == 200
    (tmp_path / "openapi.json").write_bytes(document.content)
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")  # no formatter to run
    generate = ["generate", "--path", "openapi.json", "--config", "config.yaml"]
    run(
        "openapi-python-client", *generate, "--meta", "none", "--output-path", PACKAGE, cwd=tmp_path
    )
    (tmp_path / "program.py").write_text(PROGRAM)
    out = run("python", "program.py", cwd=tmp_path, env={"API_URL": api.url, "API_TOKEN": TOKEN})
    seen: dict[str, Any] = json.loads(out)
    assert seen["status"] == 201
    job_id, *job = seen["job"]
    assert job == ["send_email", "emails", 3, "queued", {"to": "ada@example.com"}, True]
    status, ids = seen["batch"]
    assert status == 201 and [queue.get(i).task for i in ids] == ["a", "b"]
    assert seen["refused"] == [422, "priority"]
    assert queue.get(job_id).state is JobState.QUEUED

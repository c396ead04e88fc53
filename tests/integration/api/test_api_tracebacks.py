"""Errors' tracebacks name the server's files and code: the API shows them
to admin tokens (and without tokens), and only each error's first line to
read tokens, unless api_read_tracebacks says otherwise; the command line,
which reads the database itself, shows them whole."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, Settings
from pgqueue.cli import app
from pgqueue.core.redaction import TRACEBACK_HIDDEN
from pgqueue.testing import drain_async
from tests.support import api_client

ADMIN, READ = "admin-token-0123456789", "read-token-0123456789"


def refuse(job: Job) -> None:
    raise ValueError("card declined for order 42")


async def _failed_job(aqueue: AsyncQueue) -> int:
    job = await aqueue.enqueue("charge", max_attempts=2)
    await drain_async(aqueue, {"charge": refuse})
    return job.id


@pytest.mark.parametrize("read_tracebacks", [False, True])
async def test_read_tokens_see_the_first_line_admin_tokens_the_traceback(
    settings: Settings, aqueue: AsyncQueue, read_tracebacks: bool
) -> None:
    job_id = await _failed_job(aqueue)
    guarded = settings.replace(
        api_tokens=(ADMIN,), api_read_tokens=(READ,), api_read_tracebacks=read_tracebacks
    )
    async with api_client(guarded) as client:
        shown = {}
        for token in (ADMIN, READ):
            headers = {"Authorization": f"Bearer {token}"}
            shown[token] = (await client.get(f"/jobs/{job_id}", headers=headers)).json()
    admin, read = shown[ADMIN], shown[READ]
    assert "Traceback" in admin["last_error"] and __file__ in admin["last_error"]
    assert "Traceback" in admin["errors"][0]["error"]
    first_line = "ValueError: card declined for order 42"
    if read_tracebacks:
        assert (read["last_error"], read["errors"]) == (admin["last_error"], admin["errors"])
    else:
        assert read["last_error"] == f"{first_line}\n{TRACEBACK_HIDDEN}"
        assert read["errors"][0]["error"] == f"{first_line}\n{TRACEBACK_HIDDEN}"
        assert __file__ not in str(read)


async def test_without_tokens_and_on_the_command_line_the_traceback_is_shown(
    settings: Settings, aqueue: AsyncQueue
) -> None:
    job_id = await _failed_job(aqueue)
    async with api_client(settings) as client:
        shown = (await client.get(f"/jobs/{job_id}")).json()
    assert __file__ in shown["last_error"]
    result = CliRunner().invoke(
        app, ["--database-url", settings.database_url, "jobs", "show", str(job_id), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert "Traceback" in result.output

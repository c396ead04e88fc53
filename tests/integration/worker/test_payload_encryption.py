"""Payloads encrypted at rest (Settings.encryption_keys, encrypted_tasks):
every way a producer writes a job stores only the sealed envelope, the
worker opens it for the handler, a worker without the key fails the
attempt without running the handler, and a rotation reseals every stored
payload with the new key."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgqueue import AsyncQueue, Job, JobState, PayloadNotOpened, Queue, Settings, chain
from pgqueue.cli import app
from pgqueue.core.sealing import SEALED, generate_key
from pgqueue.worker import AsyncWorker
from tests.support import api_client, running

OLD, NEW = generate_key("old"), generate_key("new")
SECRET = {"card": "4242424242424242", "cvc": "123"}


@pytest.fixture
def sealing(settings: Settings) -> Settings:
    return settings.replace(encryption_keys=(OLD,), encrypted_tasks=("charge",))


def _stored(sql: psycopg.Connection[Any], job_id: int) -> Any:
    [[payload]] = sql.execute("SELECT payload FROM pgqueue_jobs WHERE id = %s", (job_id,))
    return payload


def _assert_sealed(sql: psycopg.Connection[Any], job_id: int, key: str = "old") -> None:
    stored = _stored(sql, job_id)
    assert set(stored) == {SEALED, "key", "token"} and stored["key"] == key, stored
    assert "4242" not in json.dumps(stored)


async def test_every_producer_path_stores_a_sealed_tasks_payload_sealed_and_others_plain(
    sealing: Settings, sql: psycopg.Connection[Any]
) -> None:
    with Queue(settings=sealing) as q:
        single = q.enqueue("charge", SECRET)
        many = q.enqueue_many([{"task": "charge", "payload": SECRET}, {"task": "refund"}])
        flow = q.enqueue_workflow(chain({"task": "charge", "payload": SECRET}, {"task": "t"}))
        with psycopg.connect(sealing.database_url) as conn:  # the caller's transaction
            own = q.enqueue("charge", SECRET, connection=conn)
    async with AsyncQueue(settings=sealing, group_commit=True) as aq:
        grouped = await aq.enqueue("charge", SECRET)
    async with api_client(sealing) as client:
        posted = (await client.post("/jobs", json={"task": "charge", "payload": SECRET})).json()
        # Read back through the API: the envelope, never a 5xx.
        shown = (await client.get(f"/jobs/{posted['id']}")).json()
    assert shown["payload"]["key"] == "old" and "4242" not in json.dumps(shown)
    for job_id in (single.id, many[0].id, flow.jobs[0].id, own.id, grouped.id, posted["id"]):
        _assert_sealed(sql, job_id)
    assert _stored(sql, many[1].id) == {}  # refund: not an encrypted task


async def test_the_worker_opens_the_payload_for_the_handler(
    sealing: Settings, aqueue: AsyncQueue
) -> None:
    seen: list[Any] = []

    def charge(job: Job) -> str:
        seen.append(job.payload)
        return "charged"

    async with AsyncQueue(settings=sealing) as producer:
        job = await producer.enqueue("charge", SECRET)
    async with running(AsyncWorker({"charge": charge}, settings=sealing)):
        done = await aqueue.wait(job.id, 30)
    assert (done.state, done.result, seen) == (JobState.SUCCEEDED, "charged", [SECRET])
    assert done.payload["key"] == "old"  # what the library reads is what is stored


async def test_a_worker_without_the_key_fails_the_attempt_and_runs_no_handler(
    sealing: Settings, aqueue: AsyncQueue
) -> None:
    ran: list[Job] = []
    async with AsyncQueue(settings=sealing) as producer:
        job = await producer.enqueue("charge", SECRET, max_attempts=1)
    keyless = sealing.replace(encryption_keys=(NEW,), encrypted_tasks=())
    async with running(AsyncWorker({"charge": ran.append}, settings=keyless)):
        done = await aqueue.wait(job.id, 30)
    assert done.state is JobState.DEAD and ran == []
    assert "could not be decrypted" in (done.last_error or "")
    assert "'old'" in (done.last_error or "") and "'new'" in (done.last_error or "")


async def test_a_rotation_reseals_every_stored_payload_with_the_new_key(
    sealing: Settings, sql: psycopg.Connection[Any], aqueue: AsyncQueue
) -> None:
    with Queue(settings=sealing) as q:
        ids = [j.id for j in q.enqueue_many([{"task": "charge", "payload": SECRET}] * 1200)]
        q.ack(q.claim(1, worker="w")[0], "done")  # a finished job's payload is at rest too
    rotated = sealing.replace(encryption_keys=(NEW, OLD))
    with Queue(settings=rotated) as q:
        assert q.reseal_payloads() == 1200
        assert q.reseal_payloads() == 0  # nothing left under the old key
    [[keys]] = sql.execute("SELECT array_agg(DISTINCT payload->>'key') FROM pgqueue_jobs")
    assert keys == ["new"]
    seen: list[Any] = []
    only_new = sealing.replace(encryption_keys=(NEW,))
    async with running(
        AsyncWorker({"charge": lambda j: seen.append(j.payload)}, settings=only_new)
    ):
        done = await aqueue.wait(ids[-1], 60)
    assert done.state is JobState.SUCCEEDED
    assert seen and all(payload == SECRET for payload in seen)


def test_a_rotation_without_the_old_key_names_the_job_and_writes_nothing(
    sealing: Settings, sql: psycopg.Connection[Any]
) -> None:
    with Queue(settings=sealing) as q:
        job = q.enqueue("charge", SECRET)
    with (
        Queue(settings=sealing.replace(encryption_keys=(NEW,))) as q,
        pytest.raises(PayloadNotOpened, match=f"job {job.id}"),
    ):
        q.reseal_payloads()
    _assert_sealed(sql, job.id, "old")


def test_the_cli_generates_a_key_and_rotates(
    sealing: Settings, sql: psycopg.Connection[Any]
) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["keys", "generate", "2027-01"])
    assert made.exit_code == 0, made.output
    entry = made.output.strip()
    assert entry.startswith("2027-01:")
    with Queue(settings=sealing) as q:
        job = q.enqueue("charge", SECRET)
    env = {"PGQUEUE_ENCRYPTION_KEYS": f"{entry},{OLD}"}
    url = sealing.database_url
    rotated = runner.invoke(app, ["--database-url", url, "keys", "rotate", "--json"], env=env)
    assert rotated.exit_code == 0, rotated.output
    assert json.loads(rotated.output) == {"resealed": 1, "key": "2027-01"}
    _assert_sealed(sql, job.id, "2027-01")
    bad = runner.invoke(app, ["keys", "generate", "no spaces"])
    assert bad.exit_code != 0 and "key id" in bad.output


async def test_settings_from_the_environment_seal_with_the_first_key(
    sealing: Settings, sql: psycopg.Connection[Any]
) -> None:
    loaded = Settings.load(
        environ={
            "PGQUEUE_DATABASE_URL": sealing.database_url,
            "PGQUEUE_ENCRYPTION_KEYS": f"{NEW},{OLD}",
            "PGQUEUE_ENCRYPTED_TASKS": "*",
        }
    )
    async with AsyncQueue(settings=loaded) as q:
        job = await q.enqueue("anything", SECRET)
    _assert_sealed(sql, job.id, "new")

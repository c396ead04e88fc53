"""Durable steps (``job.step()``) and checkpoints (``job.checkpoint()``):
the rules a step's name and what it stores pass, and the flows that read
and store them (docs/howto/durable-steps.md).

A step's result is stored in ``pgqueue_job_steps`` (migrations/0025) once
its function returned, fenced by the attempt's token; every later attempt
of the job reads the stored steps once, at its first step, and returns
their results instead of running them again. A checkpoint is one value on
the job's row (``last_checkpoint``), overwritten, fenced the same way, and
claimed with the job.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidJob, StaleAttempt
from .flows import Flow, Statement
from .json_text import dump_json

__all__ = [
    "MAX_CHECKPOINT_BYTES",
    "MAX_STEP_NAME",
    "MAX_STEP_RESULT_BYTES",
    "NOTHING_STORED",
    "PGQUEUE_STEP_PREFIX",
    "checked_step_name",
    "checkpoint_json",
    "recall_steps",
    "record_step",
    "step_result_json",
    "write_checkpoint",
]

MAX_STEP_NAME = 200
# A step's result is read back by every later attempt of its job: a value
# to carry on with (ids, a total, a small document), not a data set.
MAX_STEP_RESULT_BYTES = 1024 * 1024
# A checkpoint sits on the job's row, which every claim and read of the job
# returns: a cursor (an offset, a key, a page token), not a data set.
MAX_CHECKPOINT_BYTES = 64 * 1024
# The steps of this prefix are pgqueue's own (a durable sleep or wait:
# core/sleeps.py); a handler's steps may not take it.
PGQUEUE_STEP_PREFIX = "pgqueue:"
# What came of a step or checkpoint of a stale attempt (StaleAttempt's message).
NOTHING_STORED = "nothing was stored"


def checked_step_name(name: Any) -> str:
    """A step's name: text of 1 to MAX_STEP_NAME printable characters;
    InvalidJob otherwise."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_STEP_NAME or not name.isprintable():
        raise InvalidJob(
            "step",
            f"a step's name is text of 1 to {MAX_STEP_NAME} printable characters, got {name!r}",
        )
    if name.startswith(PGQUEUE_STEP_PREFIX):
        raise InvalidJob(
            "step",
            f"{name!r}: step names starting with {PGQUEUE_STEP_PREFIX!r} are pgqueue's own "
            "(its durable sleeps and waits)",
        )
    return name


def step_result_json(name: str, result: Any) -> str:
    """What a step returned as storable JSON; InvalidJob if it is not JSON
    PostgreSQL can store, or larger than MAX_STEP_RESULT_BYTES."""
    return dump_json(result, f"step {name!r} result", max_bytes=MAX_STEP_RESULT_BYTES)


def checkpoint_json(value: Any) -> str:
    """A checkpoint as storable JSON; InvalidJob as ``step_result_json``."""
    return dump_json(value, "checkpoint", max_bytes=MAX_CHECKPOINT_BYTES)


def recall_steps(job_id: int) -> Flow[dict[str, Any]]:
    """The results of the steps the job's attempts completed, by name."""
    rows = yield Statement("job_steps", {"id": job_id})
    return {row["name"]: row["result"] for row in rows}


def record_step(job_id: int, token: int, name: str, result_json: str) -> Flow[None]:
    """Store a completed step's result; StaleAttempt (nothing stored) unless
    the job is still running with ``token``."""
    rows = yield Statement(
        "job_step_record", {"id": job_id, "token": token, "name": name, "result": result_json}
    )
    if not rows:
        raise StaleAttempt(job_id, token, NOTHING_STORED)


def write_checkpoint(job_id: int, token: int, value_json: str) -> Flow[None]:
    """Overwrite the job's checkpoint; StaleAttempt as ``record_step``."""
    rows = yield Statement("job_checkpoint", {"id": job_id, "token": token, "value": value_json})
    if not rows:
        raise StaleAttempt(job_id, token, NOTHING_STORED)

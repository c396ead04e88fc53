"""How pgqueue's processes write their logs: plain text for a terminal, or
one JSON object per line for a log pipeline (``--log-format json``).

A JSON line carries the record's time (UTC, ISO 8601), level, logger,
message and process id, then every structured field the record was given:
the worker's ``action`` and ``worker_id`` on each of its records, and
``job_id``, ``queue``, ``task`` and ``attempt`` on each record about a job
(worker/supervision.py ``EventLog``). A traceback goes into ``traceback``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, get_args

__all__ = ["ENV_LOG_FORMAT", "LOG_FORMATS", "JsonFormatter", "LogFormat", "stderr_handler"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

# The format a process logs in, inherited by the processes it starts.
ENV_LOG_FORMAT = "PGQUEUE_LOG_FORMAT"

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"

# What every LogRecord has: the rest of its __dict__ came from ``extra``
# (but uvicorn's terminal colours stay out of JSON).
_LEFT_OUT = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON: time (UTC), level, logger, message, pid, the
        record's ``extra`` fields, and its traceback if it has one."""
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _LEFT_OUT and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["traceback"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


def stderr_handler(log_format: str) -> logging.Handler:
    """A handler writing to stderr in ``log_format`` (``text`` or ``json``)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    return handler

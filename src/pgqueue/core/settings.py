"""One settings object, and the one way every entry point loads it.

``Settings.load(**flags)`` layers, highest first: the flags given (None means
not given), ``PGQUEUE_<FIELD>`` environment variables (and DATABASE_URL), the
``[tool.pgqueue]`` table of ./pyproject.toml (the command line's: of its
project folder, ``root``), the defaults below. The library
(``Queue()``, ``AsyncQueue()``), the worker, the API (``create_app()``) and the
command line all call it when given no Settings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from .errors import InvalidSettings
from .redaction import Redaction
from .sealing import Sealing

__all__ = ["Settings"]

ENV_PREFIX = "PGQUEUE_"
PYPROJECT = "pyproject.toml"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything tunable, validated at construction.

    ``database_url`` empty means the embedded server in ``data_dir``.
    """

    database_url: str = ""
    data_dir: str = ".pgqueue"
    # database_url goes through a transaction-mode pooler (PgBouncer): no
    # prepared statements, and LISTEN only over direct_url (without one,
    # workers and wait() poll every poll_interval_seconds).
    transaction_pooler: bool = False
    # The same database without the pooler, for LISTEN.
    direct_url: str = ""
    # Queues over several PostgreSQL clusters (clusters.py, docs/scaling.md):
    # queue name (or "*", every other queue) -> URL. Empty: database_url
    # holds every queue. In the environment, PGQUEUE_CLUSTERS is a JSON object.
    clusters: Mapping[str, str] = field(default_factory=dict)
    # Claiming and leases.
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    # Retries: base * 2^(attempt-1), capped, half fixed and half random.
    backoff_base_seconds: float = 1.0
    backoff_cap_seconds: float = 3600.0
    default_max_attempts: int = 5
    # Snoozes one job may take before it is dead (a task may set its own).
    max_snoozes: int = 100
    # Maintenance.
    reap_interval_seconds: float = 5.0
    # Each worker records its heartbeat connection's PostgreSQL session, and
    # every death_check_interval_seconds looks for workers whose session has
    # ended (SIGKILL, crash) to take their jobs back without waiting for the
    # leases. Off behind a transaction-mode pooler (transaction_pooler: the
    # session is not the worker's own; see detects_dead_sessions): then only
    # leases find dead workers.
    session_death_detection: bool = True
    death_check_interval_seconds: float = 1.0
    reap_batch: int = 1000
    retention_seconds: float = 7 * 24 * 3600.0
    prune_interval_seconds: float = 60.0
    prune_batch: int = 5000
    # The archive (docs/howto/retention.md): a succeeded job outside
    # workflows and batches, with no dependents and holding no unique key,
    # moves from the hot table to pgqueue_jobs_archive (partitioned by day,
    # dropped a day at a time after retention_seconds) this long after it
    # finished, archive_batch rows a statement, every prune_interval_seconds.
    # Reads find it there all the same. At least enqueue_retry_seconds (a
    # producer's retried call finds its own jobs in the hot table); 0: never
    # archive (every finished job stays in the hot table until pruned).
    archive_after_seconds: float = 300.0
    archive_batch: int = 5000
    # Priority aging: a runnable queued job of negative priority gains one
    # priority level each priority_aging_seconds it waits, up to 0, so that
    # default-priority work never starves it (docs/howto/limits.md). 0: off,
    # the default (priorities mean what they were given as; opt in).
    priority_aging_seconds: float = 0.0
    priority_aging_batch: int = 1000
    # A killed worker's row in the workers registry stays this long after it
    # stopped heartbeating, listed as gone, before maintenance deletes it.
    worker_retention_seconds: float = 3600.0
    # Per-queue per-minute history (history.py) is kept this long.
    history_retention_seconds: float = 7 * 24 * 3600.0
    # Connections.
    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout_seconds: float = 5.0
    # A producer's call (enqueue, enqueue_many; POST /jobs, /jobs/batch)
    # retries across lost connections for this long in all, the waits for a
    # pooled connection included; then DatabaseUnavailable.
    enqueue_retry_seconds: float = 5.0
    # Every other call of a queue (reads, cancel, retry, pause, bulk actions,
    # workflows; so every other API route and CLI command) gets no answer
    # from a statement for at most this long: then the statement is
    # cancelled and the call raises DatabaseUnavailable, or OutcomeUnknown
    # when a write may have landed. Per statement: a bulk action over many
    # batches takes as long as it needs.
    call_timeout_seconds: float = 30.0
    # Group commit (group_commit.py): single enqueues arriving within this long
    # of the first, up to this many, go out as one statement and one commit,
    # this many groups at once (fewer: larger groups, but a group that waits
    # for a key another transaction holds holds up more of the others).
    # POST /jobs uses it unless api_group_commit is off; an AsyncQueue when
    # made with group_commit=True.
    group_commit_window_seconds: float = 0.001
    group_commit_max_jobs: int = 100
    group_commit_groups: int = 2
    api_group_commit: bool = True
    notify_finished: bool = True
    # Worker.
    concurrency: int = 100
    # At most this many jobs a worker claims ahead of its free slots, to
    # start as slots free up while the next claim is out (0: none); held
    # with leases, given back at shutdown (docs/worker.md, "Pipelining").
    # A bound, not a target: the worker claims ahead what starts during two
    # claims' round trips, a job or so for long jobs. Short jobs can start by
    # the hundreds in that time, so the bound is set above what they ask for:
    # a bound they reach leaves slots waiting for the next claim.
    prefetch: int = 1000
    # Child processes for isolated sync handlers (0: one per CPU).
    handler_processes: int = 0
    poll_interval_seconds: float = 1.0
    shutdown_timeout_seconds: float = 30.0
    # HTTP API. Tokens: admin tokens may do everything, read tokens only GETs.
    # With none configured the API binds to 127.0.0.1 unless told otherwise.
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    api_tokens: tuple[str, ...] = ()
    api_read_tokens: tuple[str, ...] = ()
    api_max_body_bytes: int = 1_048_576
    api_max_batch: int = 1000
    # Without tokens, Host names the API answers to besides IP addresses,
    # localhost and api_host (a page on any other name is DNS rebinding).
    api_allowed_hosts: tuple[str, ...] = ()
    # Payload fields the dashboard, the API and the command line show as
    # "[redacted]": "key", "key.inner" or "task:key" (core/redaction.py).
    redacted_fields: tuple[str, ...] = ()
    # Whether read tokens see errors' tracebacks (server paths, code); admin
    # tokens always do, read tokens see each error's first line otherwise.
    api_read_tracebacks: bool = False
    # Payloads encrypted at rest (core/sealing.py, docs/howto/encryption.md):
    # "ID:KEY" Fernet keys, the first sealing, all opening; and the tasks
    # whose payloads are sealed ("*": every task). Keys stay out of repr.
    encryption_keys: tuple[str, ...] = field(default=(), repr=False)
    encrypted_tasks: tuple[str, ...] = ()
    # OpenTelemetry spans (enqueue, claim, each attempt) and the enqueuer's
    # trace context carried in each job's metadata, when opentelemetry-api
    # is installed (pgqueue[otel]); they record nothing until the
    # application installs an SDK. Off: none even then (docs/tracing.md).
    tracing: bool = True
    # Upper bounds of the enqueue-to-start histogram, in seconds.
    latency_buckets: tuple[float, ...] = field(
        default=(
            0.001,
            0.0025,
            0.005,
            0.01,
            0.025,
            0.05,
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
            5.0,
            10.0,
            30.0,
            60.0,
            300.0,
        )
    )

    def __post_init__(self) -> None:
        for name in (
            "lease_seconds",
            "heartbeat_seconds",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "reap_interval_seconds",
            "death_check_interval_seconds",
            "retention_seconds",
            "prune_interval_seconds",
            "worker_retention_seconds",
            "history_retention_seconds",
            "pool_timeout_seconds",
            "enqueue_retry_seconds",
            "call_timeout_seconds",
            "poll_interval_seconds",
        ):
            if not getattr(self, name) > 0:
                raise InvalidSettings(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "reap_batch",
            "prune_batch",
            "archive_batch",
            "priority_aging_batch",
            "pool_max_size",
            "concurrency",
            "default_max_attempts",
            "api_max_body_bytes",
            "api_max_batch",
            "group_commit_max_jobs",
            "group_commit_groups",
        ):
            if getattr(self, name) < 1:
                raise InvalidSettings(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("handler_processes", "max_snoozes", "prefetch"):
            if getattr(self, name) < 0:
                raise InvalidSettings(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.priority_aging_seconds < float("inf"):
            raise InvalidSettings(
                "priority_aging_seconds must be >= 0 (0: no aging), "
                f"got {self.priority_aging_seconds!r}"
            )
        if not (
            self.archive_after_seconds == 0
            or self.enqueue_retry_seconds <= self.archive_after_seconds < float("inf")
        ):
            raise InvalidSettings(
                "archive_after_seconds must be 0 (no archive) or at least enqueue_retry_seconds "
                f"({self.enqueue_retry_seconds}), got {self.archive_after_seconds!r}"
            )
        if not 0 <= self.group_commit_window_seconds <= 1:
            raise InvalidSettings(
                "group_commit_window_seconds must be between 0 and 1, "
                f"got {self.group_commit_window_seconds!r}"
            )
        if self.pool_min_size < 0 or self.pool_min_size > self.pool_max_size:
            raise InvalidSettings("pool_min_size must be between 0 and pool_max_size")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise InvalidSettings(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be shorter than "
                f"lease_seconds ({self.lease_seconds}), or leases expire between heartbeats"
            )
        if list(self.latency_buckets) != sorted(set(self.latency_buckets)):
            raise InvalidSettings("latency_buckets must be strictly increasing")
        Redaction.of(self.redacted_fields)  # refused here, not at the first job shown
        _sealing(self.encryption_keys, self.encrypted_tasks)  # and a bad key here
        if not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in self.clusters.items()
        ):
            raise InvalidSettings("clusters must map queue names (or '*') to database URLs")

    @classmethod
    def load(
        cls, *, environ: Mapping[str, str] | None = None, root: Path | None = None, **flags: Any
    ) -> Self:
        """Flags > environment (default: os.environ) > ./pyproject.toml >
        defaults. A flag that is None counts as not given.

        ``root`` (the command line's project folder, pgqueue.cli.project):
        its pyproject.toml is read instead of ./pyproject.toml, and a relative
        ``data_dir`` from that file or the default is taken from ``root``, so
        that every folder of the project reaches one embedded server; one from
        a flag or the environment stays relative to the current folder."""
        values = _read_pyproject((Path.cwd() if root is None else root) / PYPROJECT)
        if root is not None:
            values["data_dir"] = str(root / values.get("data_dir", cls.data_dir))
        values.update(_read_environment(os.environ if environ is None else environ))
        values.update({name: value for name, value in flags.items() if value is not None})
        return cls(**values)

    @property
    def redaction(self) -> Redaction:
        """What of a payload the dashboard, the API and the command line show."""
        return Redaction.of(self.redacted_fields)

    @property
    def sealing(self) -> Sealing:
        """What of the payloads producers encrypt, and the keys workers open them with."""
        return _sealing(self.encryption_keys, self.encrypted_tasks)

    @property
    def detects_dead_sessions(self) -> bool:
        """Whether workers find dead peers by their sessions: asked for, and
        not behind a transaction-mode pooler."""
        return self.session_death_detection and not self.transaction_pooler

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


@functools.cache
def _sealing(keys: tuple[str, ...], tasks: tuple[str, ...]) -> Sealing:
    """Settings.sealing, made once per set of keys (each makes a cipher)."""
    return Sealing.of(keys, tasks)


@functools.cache
def _kinds() -> dict[str, Any]:
    """Each field's type (the annotations are strings until resolved)."""
    return typing.get_type_hints(Settings)


def _read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if env.get("DATABASE_URL"):
        values["database_url"] = env["DATABASE_URL"]
    for name, kind in _kinds().items():
        variable = ENV_PREFIX + name.upper()
        if variable in env:
            values[name] = _check(variable, kind, _from_text(kind, env[variable]))
    return values


def _read_pyproject(path: Path) -> dict[str, Any]:
    """The ``[tool.pgqueue]`` table; keys may use - or _."""
    if not path.is_file():
        return {}
    import tomllib  # here: a worker given its settings never reads a file

    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidSettings(f"{path}: cannot read it: {exc}") from None
    table = document.get("tool", {}).get("pgqueue", {})
    if not isinstance(table, dict):
        raise InvalidSettings(f"{path}: [tool.pgqueue] must be a table")
    kinds = _kinds()
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in kinds:
            raise InvalidSettings(
                f"{path}: [tool.pgqueue] has an unknown setting {key!r} "
                f"(known: {', '.join(sorted(kinds))})"
            )
        values[name] = _check(f"{path}: [tool.pgqueue] {key}", kinds[name], value)
    return values


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _from_text(kind: Any, raw: str) -> Any:
    """An environment variable's text as the TOML value it stands for; text
    that does not parse stays text, for ``_check`` to refuse by name."""
    try:
        if kind is bool and raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        if kind == tuple[float, ...]:
            return [float(part) for part in raw.split(",")]
        if typing.get_origin(kind) is Mapping:
            return json.loads(raw)
    except ValueError:
        pass
    return raw


def _check(where: str, kind: Any, value: Any) -> Any:
    """A value as its field's type, with no silent conversion between types
    (an int may be a float; a comma-separated string is a tuple of strings)."""
    if typing.get_origin(kind) is Mapping:
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return dict(value)
        # Not shown: the URLs may hold passwords.
        raise InvalidSettings(f"{where}: expected a table of queue name = database URL")
    item = typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else None
    if item is str and isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if item is not None and isinstance(value, list) and all(_fits(item, v) for v in value):
        return tuple(item(v) for v in value)
    if item is None and _fits(kind, value):
        return kind(value)
    name = getattr(kind, "__name__", None) if item is None else None
    raise InvalidSettings(f"{where}: expected {name or kind}, got {type(value).__name__} {value!r}")


def _fits(kind: type, value: Any) -> bool:
    """Whether a TOML value is of a scalar type (a bool is not a number)."""
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)

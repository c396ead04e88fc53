"""The one record every benchmark writes: ``results/NAME.json``.

    record = ResultRecord(
        name="core",                           # the file: results/core.json
        command=command_line(__spec__, argv),  # how to run it again
        server=server_info(url),               # PostgreSQL version, durability
        parameters={"jobs": 1000},             # what the run was asked to do
        results={"enqueue_many": {...}},       # what it measured
    )
    write_result(record, args.out)             # args.out None: results/core.json

``machine``, ``git_commit`` and ``created_at`` fill themselves in. The file
holds one JSON object with the keys of FILE_KEYS, in that order.

``read_result`` reads these files, and also the ones written before the
record existed (a flat object with a ``benchmark`` key; see ``_from_flat``),
so that the committed results stay readable by bench.plots.plot.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import psycopg

__all__ = [
    "RESULTS",
    "ResultRecord",
    "command_line",
    "machine",
    "read_result",
    "server_info",
    "write_result",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
FILE_KEYS = (
    "name",
    "created_at",
    "git_commit",
    "command",
    "machine",
    "server",
    "parameters",
    "results",
)


def machine() -> dict[str, Any]:
    """The machine and software a figure was measured on."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_kib() / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "psycopg": metadata.version("psycopg"),
        "pgqueue": metadata.version("pgqueue"),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        return ""


def _memory_kib() -> int:
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1])
    except OSError:
        return 0


def git_commit() -> str:
    """The checkout's commit (short), or "unknown" outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def server_info(url: str) -> dict[str, Any]:
    """PostgreSQL's version and the settings that decide commit cost."""
    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
    with psycopg.connect(url) as conn:
        return {n: conn.execute(f"SHOW {n}").fetchone()[0] for n in names}  # type: ignore[index]


def command_line(spec: ModuleSpec | None, argv: Sequence[str] | None) -> str:
    """``python -m MODULE ARGS``: the script's own module (its ``__spec__``,
    which names it even when it runs as __main__) and its arguments."""
    module = spec.name if spec is not None else "?"
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join(["python", "-m", module, *args])


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ResultRecord:
    """One run of one benchmark: what ran, where, and what it measured."""

    name: str  # the result file: results/<name>.json
    command: str  # the command line that produced it
    server: Mapping[str, Any]  # PostgreSQL version and durability settings
    parameters: Mapping[str, Any]  # the options and fixed settings of the run
    results: Mapping[str, Any]  # the figures
    machine: Mapping[str, Any] = field(default_factory=machine)
    git_commit: str = field(default_factory=git_commit)
    created_at: str = field(default_factory=_now)  # ISO 8601, UTC

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: data[key] for key in FILE_KEYS}

    @classmethod
    def from_report(
        cls, name: str, command: str, server: Mapping[str, Any], report: Mapping[str, Any]
    ) -> ResultRecord:
        """The record of a run whose report holds its own "parameters" (the
        fault runs: the tests read the same report); the rest are results."""
        results = dict(report)
        parameters = results.pop("parameters")
        return cls(name, command, server, parameters, results)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResultRecord:
        if "benchmark" in data:
            return _from_flat(data)
        return cls(**{key: data[key] for key in FILE_KEYS})


def _from_flat(data: Mapping[str, Any]) -> ResultRecord:
    """A file from before the record: one flat object named by ``benchmark``.
    Its options were under "settings", "setup" or "parameters" (or, in
    worker_throughput.json, at the top), its server under "server" or
    "database", its commit in the machine description; every other key was
    a figure. (compare.json's table was "results"; the record says "systems".)"""
    rest = dict(data)
    name = rest.pop("benchmark")
    created_at = rest.pop("created_at")
    machine_ = dict(rest.pop("machine"))
    commit = machine_.pop("pgqueue_commit", "unknown")
    server = rest.pop("server", None) or rest.pop("database", {})
    parameters: dict[str, Any] = {}
    for key in ("settings", "setup", "parameters"):
        parameters |= rest.pop(key, {})
    if not parameters:
        parameters = {k: rest.pop(k) for k in ("jobs", "repeats", "concurrency") if k in rest}
    command = rest.pop("command", "")
    if name == "compare":
        rest["systems"] = rest.pop("results")
    return ResultRecord(
        name=name,
        command=command,
        server=server,
        parameters=parameters,
        results=rest,
        machine=machine_,
        git_commit=commit,
        created_at=created_at,
    )


def write_result(record: ResultRecord, path: str | Path | None = None) -> Path:
    """Write the record to ``path``, by default results/<name>.json."""
    target = Path(path) if path else RESULTS / f"{record.name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record.to_json(), indent=2) + "\n")
    return target


def read_result(path: str | Path) -> ResultRecord:
    """The record in ``path``, written by write_result or before it existed."""
    return ResultRecord.from_json(json.loads(Path(path).read_text()))

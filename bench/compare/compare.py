"""pgqueue vs procrastinate vs PgQueuer: the same drain, one worker process each.

    python -m bench.compare.compare [--jobs 5000] [--repeats 3]
                                    [--systems pgqueue,procrastinate,pgqueuer] [--out PATH]

One PostgreSQL server on disk (fsync and synchronous_commit on), one database
per system on it. Each round, for each system in turn: JOBS no-op jobs are
pre-loaded with the system's own bulk enqueue, then ONE worker process with
the system's best documented throughput settings drains them. Rate = JOBS /
(last completion - first start), from each system's own database timestamps
(pgqueue: started_at/finished_at; procrastinate: its procrastinate_events
log; PgQueuer: its pgqueuer_log table); wall-clock drain rates are recorded
too. Ratios to pgqueue are taken within each round, so that drift on the
shared machine hits the systems alike.

The competitors run from their own virtualenvs under --venv-dir (default
.bench-venvs/ at the repository root), created on first use with pip from
PyPI: procrastinate 3.x and PgQueuer 1.6.x. A system that cannot be installed
or fails is reported and skipped; the others still run. --systems pgqueue
runs pgqueue alone (the smoke test does that).

Settings (one row per value of the list options; docs/results.md says why):
  * pgqueue (--pgqueue-concurrency, default 100,1000; the first is the
    baseline of every ratio): AsyncWorker with that concurrency (100 is the
    default; it is also the most jobs one claim takes), LISTEN on;
    Queue.enqueue_many (COPY).
  * procrastinate (--procrastinate-concurrency, default 20,100):
    run_worker_async(wait=False, concurrency=C, listen_notify=True), its
    psycopg pool sized C + 2; Task.batch_defer_async.
  * PgQueuer (--pgqueuer CxB,..., default 5x10,1x100,1x1000): its own
    benchmark's shape (tools/benchmark.py, drain strategy: asyncpg driver,
    uvloop, C QueueManagers in one process, run(batch_size=B, mode=drain));
    5x10 are that benchmark's defaults. List-form Queries.enqueue.
Writes results/compare.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench.common import bench_database, summary
from bench.record import ResultRecord, command_line, server_info, write_result
from bench.workers import drain
from pgqueue import Settings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SYSTEMS = ("pgqueue", "procrastinate", "pgqueuer")
# What pip installs into each competitor's virtualenv.
REQUIREMENTS = {
    "procrastinate": ["procrastinate>=3,<4", "psycopg[binary]"],
    "pgqueuer": ["pgqueuer>=1.6,<1.7", "asyncpg", "uvloop"],
}
DISTRIBUTION = {"procrastinate": "procrastinate", "pgqueuer": "pgqueuer"}
RUN_TIMEOUT = 1800


# -- competitors' virtualenvs ----------------------------------------------------------


def venv_python(venv_dir: Path, system: str) -> Path:
    return venv_dir / system / "bin" / "python"


def installed_version(python: Path, system: str) -> str | None:
    if not python.exists():
        return None
    done = subprocess.run(
        [
            str(python),
            "-c",
            f"from importlib.metadata import version; print(version({DISTRIBUTION[system]!r}))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_venv(venv_dir: Path, system: str) -> tuple[Path | None, str]:
    """The competitor's interpreter and version, installing it if needed;
    (None, reason) if it cannot be installed."""
    python = venv_python(venv_dir, system)
    version = installed_version(python, system)
    if version:
        return python, version
    print(f"installing {system} into {venv_dir / system} ...", flush=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv_dir / system)],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *REQUIREMENTS[system]],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, f"cannot install {system}: {detail.strip()[-500:]}"
    version = installed_version(python, system)
    if not version:
        return None, f"{system} installed but not importable"
    return python, version


# -- databases ---------------------------------------------------------------------------


def database_url(url: str, name: str) -> str:
    """A database called ``name`` on the same server (created if missing);
    the given database itself if databases cannot be created there."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        print(f"  (cannot create database {name}: {exc}; using the benchmark database)")
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


# -- one drain per system -------------------------------------------------------------


def run_helper(python: Path, script: str, args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [str(python), str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
        cwd="/",  # not the repository: its bench/ and src/ must not shadow anything
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in text.split(","):
        consumers, _, batch = item.strip().partition("x")
        pairs.append((int(consumers), int(batch)))
    return pairs


def variants(args: argparse.Namespace, systems: list[str]) -> list[dict[str, Any]]:
    """One row per system and setting: label, system, helper arguments, description."""
    rows: list[dict[str, Any]] = []
    for system in systems:
        if system == "pgqueue":
            for c in args.pgqueue_concurrency:
                default = " (the default)" if c == Settings().concurrency else ""
                rows.append(
                    {
                        "label": f"pgqueue c={c}",
                        "system": system,
                        "concurrency": c,
                        "worker": f"AsyncWorker, concurrency {c}{default}, LISTEN on, 1 process",
                        "enqueue": "Queue.enqueue_many (COPY)",
                    }
                )
        elif system == "procrastinate":
            for c in args.procrastinate_concurrency:
                rows.append(
                    {
                        "label": f"procrastinate c={c}",
                        "system": system,
                        "cli": [str(args.jobs), str(c)],
                        "worker": f"App.run_worker_async(wait=False, concurrency={c}, "
                        "listen_notify=True, delete_jobs='never'), PsycopgConnector pool "
                        f"max_size {c + 2}, 1 process",
                        "enqueue": "Task.batch_defer_async (one statement)",
                    }
                )
        else:
            for consumers, b in args.pgqueuer:
                rows.append(
                    {
                        "label": f"pgqueuer {consumers}x{b}",
                        "system": system,
                        "cli": [str(args.jobs), str(consumers), str(b)],
                        "worker": f"{consumers} PgQueuer QueueManager(s) in 1 process, "
                        f"asyncpg driver, uvloop, run(batch_size={b}, mode=drain), "
                        "durability 'durable' (the default)",
                        "enqueue": "Queries.enqueue with lists (one statement)",
                    }
                )
    return rows


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the systems to run (pgqueue first: the baseline)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--venv-dir", default=str(ROOT / ".bench-venvs"))
    parser.add_argument(
        "--pgqueue-concurrency",
        type=_ints,
        default=[100, 1000],
        help="one row per value; the first row is the baseline of the ratios",
    )
    parser.add_argument(
        "--procrastinate-concurrency", type=_ints, default=[20, 100], help="one row per value"
    )
    parser.add_argument(
        "--pgqueuer",
        type=_pairs,
        default=[(5, 10), (1, 100), (1, 1000)],
        help="CONSUMERSxBATCH_SIZE,...: one row per pair (5x10 is PgQueuer's own benchmark)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"unknown system {s!r}")
    if "pgqueue" not in systems:
        parser.error("pgqueue is the baseline: it must be in --systems")
    return args, [s for s in SYSTEMS if s in systems]


def _interpreters(
    systems: list[str], venv_dir: Path
) -> tuple[dict[str, Path], dict[str, str], dict[str, str]]:
    """Each competitor's interpreter and every system's version; the
    competitors that could not be installed, with why."""
    pythons: dict[str, Path] = {}
    versions: dict[str, str] = {"pgqueue": metadata.version("pgqueue")}
    skipped: dict[str, str] = {}
    for system in systems:
        if system == "pgqueue":
            continue
        python, detail = ensure_venv(venv_dir, system)
        if python is None:
            print(f"SKIPPED {system}: {detail}", flush=True)
            skipped[system] = detail
        else:
            pythons[system] = python
            versions[system] = detail
    return pythons, versions, skipped


def _drain_pgqueue(url: str, jobs: int, concurrency: int) -> tuple[float, float, float]:
    """One AsyncWorker process: (database-clock rate, wall rate, enqueue rate)."""
    timings: dict[str, float] = {}
    began = time.perf_counter()
    rate = drain(url, jobs, concurrency=concurrency, timings=timings)
    seconds = time.perf_counter() - began - timings["enqueue_seconds"]
    return rate, jobs / seconds, jobs / timings["enqueue_seconds"]


def _drain_competitor(
    python: Path, url: str, row: dict[str, Any], install: bool
) -> tuple[float, float, float]:
    """The competitor's runner in its virtualenv: the same three rates."""
    out = run_helper(
        python, f"_{row['system']}.py", [url, *row["cli"], *(["--install"] if install else [])]
    )
    return out["rate_db"], out["rate_wall"], out["enqueue_per_second"]


def _summary_table(
    rows: list[dict[str, Any]], versions: dict[str, str], runs: dict[str, dict[str, list[float]]]
) -> dict[str, Any]:
    """label -> the row's description and the summaries of its runs."""
    return {
        r["label"]: {
            "system": r["system"],
            "version": versions.get(r["system"]),
            "worker": r["worker"],
            "enqueue": r["enqueue"],
            "drain_jobs_per_second": summary(runs["rate"][r["label"]])
            | {"runs": runs["rate"][r["label"]]},
            "drain_wall_jobs_per_second": summary(runs["wall"][r["label"]]),
            "bulk_enqueue_jobs_per_second": summary(runs["enqueue"][r["label"]]),
            "ratio_to_pgqueue": summary(runs["ratio"][r["label"]]),
        }
        for r in rows
        if runs["rate"][r["label"]]
    }


def _print_table(table: dict[str, Any], skipped: dict[str, str], jobs: int, repeats: int) -> None:
    print(
        f"\n{jobs} jobs, 1 worker process; median of {repeats} (min-max); "
        "ratio to pgqueue within each round"
    )
    print(f"{'':>20} {'version':>8}  {'drain jobs/s':>24}  {'ratio':>5}")
    for label, r in table.items():
        d = r["drain_jobs_per_second"]
        print(
            f"{label:>20} {r['version'] or '':>8}  "
            f"{d['median']:>8,.0f} ({d['min']:,.0f}-{d['max']:,.0f})  "
            f"{r['ratio_to_pgqueue']['median']:>5.2f}"
        )
    for label, why in skipped.items():
        print(f"{label:>20}: skipped ({why.splitlines()[0][:120] if why else ''})")


def main(argv: list[str] | None = None) -> ResultRecord:
    args, systems = _arguments(argv)
    pythons, versions, skipped = _interpreters(systems, Path(args.venv_dir))
    rows = [r for r in variants(args, systems) if r["system"] not in skipped]
    baseline = rows[0]["label"]  # pgqueue with the first --pgqueue-concurrency
    runs: dict[str, dict[str, list[float]]] = {
        kind: {r["label"]: [] for r in rows} for kind in ("rate", "wall", "enqueue", "ratio")
    }
    started = time.monotonic()
    with bench_database("compare") as url:
        info = server_info(url)
        urls = {s: database_url(url, f"compare_{s}") for s in pythons} | {"pgqueue": url}
        installed: set[str] = set()
        for repeat in range(args.repeats):
            round_rates: dict[str, float] = {}
            for row in rows:
                label, system = row["label"], row["system"]
                if label in skipped:
                    continue
                try:
                    if system == "pgqueue":
                        rate, wall, enqueue = _drain_pgqueue(url, args.jobs, row["concurrency"])
                    else:
                        rate, wall, enqueue = _drain_competitor(
                            pythons[system], urls[system], row, system not in installed
                        )
                        installed.add(system)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    print(f"SKIPPED {label}: {exc}", flush=True)
                    skipped[label] = str(exc)[-2000:]
                    continue
                round_rates[label] = rate
                for kind, value in (("rate", rate), ("wall", wall), ("enqueue", enqueue)):
                    runs[kind][label].append(value)
                print(
                    f"round {repeat + 1}/{args.repeats} {label:>20}: {rate:>9,.0f} jobs/s "
                    f"(wall {wall:,.0f}; bulk enqueue {enqueue:,.0f}/s) "
                    f"[{time.monotonic() - started:,.0f} s]",
                    flush=True,
                )
            if baseline in round_rates:
                for label, rate in round_rates.items():
                    runs["ratio"][label].append(rate / round_rates[baseline])
    elapsed = time.monotonic() - started
    table = _summary_table(rows, versions, runs)
    record = ResultRecord(
        name="compare",
        command=command_line(__spec__, argv),
        server=info,
        parameters={
            "jobs": args.jobs,
            "repeats": args.repeats,
            "systems": systems,
            "worker_processes": 1,
            "rate": "jobs / (last completion - first start), each system's own database timestamps",
            "ratio": f"row / {baseline}, within each round; median (min-max) over rounds",
        },
        results={"elapsed_seconds": elapsed, "systems": table, "skipped": skipped},
    )
    path = write_result(record, args.out)
    _print_table(table, skipped, args.jobs, args.repeats)
    print(f"\n{elapsed:,.0f} s; written to {path}")
    return record


if __name__ == "__main__":
    main()

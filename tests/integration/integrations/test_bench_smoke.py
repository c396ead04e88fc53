"""Every benchmark script, end to end with tiny numbers, so that none can rot.

The scripts run in-process through their ``main(argv)`` against one test
database (DATABASE_URL, which ``bench_database`` then uses instead of
starting a server of its own; bench.faults.restart starts its own, as it
must restart it), each writing its record to a temporary folder via --out;
the plot script then draws all of them, and the committed results/ too. The
competitors of bench.compare.compare are left out by its --systems flag (no
virtualenv, no PyPI).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from bench.record import RESULTS, ResultRecord, read_result
from pgqueue.db.embedded import EmbeddedPostgres
from pgqueue.sql import QUERIES

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bench_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """One migrated database for the module, as DATABASE_URL."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE pgqueue_template")
    url = pg_server.url.rsplit("/", 1)[0] + "/" + name
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DATABASE_URL", url)
        yield url
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-results")


def _read(path: Path, name: str, module: str) -> ResultRecord:
    """The file holds one whole ResultRecord, named and described."""
    record = read_result(path)
    assert record.name == name
    assert record.command.startswith(f"python -m {module} ")
    assert datetime.fromisoformat(record.created_at).tzinfo is not None
    assert record.git_commit
    assert record.machine["cores"] >= 1
    assert record.server["fsync"] in ("on", "off")
    assert record.parameters
    assert record.results
    return record


def test_benchmark_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import benchmark

    out = out_dir / "benchmark.json"
    benchmark.main(["--jobs", "50", "--workers", "1,2", "--repeats", "1", "--out", str(out)])
    table = _read(out, "benchmark", "bench.perf.benchmark").results["results_jobs_per_second"]
    assert set(table) == {"single", "batched"}
    for model in table.values():
        assert set(model) == {"1", "2"}
        for cell in model.values():
            assert cell["skip_locked"]["median"] > 0
            assert cell["for_update"]["median"] > 0
            assert cell["ratio_skip_locked_to_for_update"]["median"] > 0


def test_the_benchmarks_for_update_claim_is_the_products_claim_without_skip_locked() -> None:
    from bench.perf.benchmark import CLAIM_FOR_UPDATE

    assert QUERIES["job_claim"].count("FOR UPDATE SKIP LOCKED") == 1
    assert "SKIP LOCKED" not in CLAIM_FOR_UPDATE and CLAIM_FOR_UPDATE.count("FOR UPDATE") == 1


def test_limits_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import limits

    out = out_dir / "limits.json"
    sizes = ["--jobs", "300", "--flood", "300", "--rate-jobs", "100", "--trickle", "3"]
    limits.main([*sizes, "--repeats", "1", "--out", str(out)])
    results = _read(out, "limits", "bench.perf.limits").results
    assert set(results["claim_cost"]) == set(limits.CLAIM_COST)
    assert all(row["claim_us_per_job"]["median"] > 0 for row in results["claim_cost"].values())
    assert set(results["drain"]) == set(limits.DRAIN)
    for row in results["fairness"].values():
        assert (
            0
            <= row["trickle_start_ms"]["p50"]["median"]
            <= row["trickle_start_ms"]["max"]["median"]
        )


def test_latency_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import latency

    out = out_dir / "latency.json"
    latency.main(["--jobs", "20", "--rate", "200", "--workers", "1", "--out", str(out)])
    table = _read(out, "latency", "bench.perf.latency").results["results_ms"]
    for mode in ("notify", "poll"):
        row = table[mode]["1"]
        assert 0 <= row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"]


@pytest.mark.parametrize("keys", [False, True], ids=["queues", "keys"])
def test_objectives_smoke(bench_url: str, out_dir: Path, keys: bool) -> None:
    from bench.perf import objectives

    name = "key_objectives" if keys else "objectives"
    out = out_dir / f"{name}.json"
    rates = ["--tight-rate", "40", "--bulk-rate", "40", "--seconds", "0.5"]
    objectives.main([*rates, *(["--keys"] if keys else []), "--out", str(out)])
    scenarios = _read(out, name, "bench.perf.objectives").results["scenarios"]
    assert set(scenarios) == {"without", "with"}
    for scenario in scenarios.values():
        assert scenario["tight"]["jobs"] == scenario["bulk"]["jobs"] == 20
    assert scenarios["with"]["tight"]["over_objective"] >= 0


def test_fair_claim_cost_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import fair_claim_cost

    out = out_dir / "fair_claim_cost.json"
    args = ["--jobs", "200", "--keys", "10", "--calls", "2", "--declared", "25,0,3"]
    fair_claim_cost.main([*args, "--out", str(out)])
    results = _read(out, "fair_claim_cost", "bench.perf.fair_claim_cost").results
    # Each count of declared objectives measured, in order; setups: the first's.
    assert list(results["declared"]) == ["0", "3", "25"]
    assert results["setups"] == results["declared"]["0"]
    for setups in results["declared"].values():
        assert set(setups) == set(fair_claim_cost.SETUPS)
        assert all(
            row["today"]["median_ms"] > 0 < row["earlier"]["median_ms"] for row in setups.values()
        )
    # Keys with queued jobs and keys with none; past KEYS, none.
    declared = fair_claim_cost.declared_keys(25, 10)
    assert declared[:4] == ["k0", "absent0", "k1", "absent1"] and len(set(declared)) == 25
    assert sum(key.startswith("k") for key in declared) == 10
    assert fair_claim_cost.declared_keys(3, 10) == declared[:3]


def test_cancel_latency_smoke(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.perf import cancel_latency

    monkeypatch.delenv("DATABASE_URL", raising=False)  # track_commit_timestamp is on
    out = out_dir / "cancel_latency.json"
    cancel_latency.main(["--jobs", "5", "--pause", "0", "--out", str(out)])
    row = _read(out, "cancel_latency", "bench.perf.cancel_latency").results["latency_ms"]
    assert 0 < row["min_ms"] <= row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]


def test_steps_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import steps

    out = out_dir / "steps.json"
    sizes = ["--jobs", "20", "--work-jobs", "8", "--concurrency", "4", "--repeats", "1"]
    steps.main([*sizes, "--out", str(out)])
    results = _read(out, "steps", "bench.perf.steps").results["results"]
    assert set(results) == set(steps.PAIRS)
    for row in results.values():
        assert row["plain_jobs_per_second"]["median"] > 0
        assert row["steps_jobs_per_second"]["median"] > 0
        assert row["ratio_steps_to_plain"] > 0


def test_latency_load_counts_the_claims_work_on_a_server_of_its_own(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.perf import latency_load

    monkeypatch.delenv("DATABASE_URL", raising=False)  # pg_stat_statements is preloaded
    out = out_dir / "latency_load_statements.json"
    small = ["--seconds", "1", "--repeats", "1", "--capacity-jobs", "200", "--rates", "300"]
    latency_load.main([*small, "--configs", "noop", "--statements", "--out", str(out)])
    record = _read(out, "latency_load", "bench.perf.latency_load")
    (run,) = record.results["levels"]["noop"]["300.0"]["runs"]
    assert run["claim_buffers_per_claim"] > 0
    assert run["claim_ms_per_claim"] > 0
    assert record.parameters["wal_segments_warmed"] > 0, "its own server's WAL was warmed"


def test_latency_load_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import latency_load

    out = out_dir / "latency_load.json"
    # --cold-wal: the test server is shared, so no check-point and no GB of WAL.
    small = ["--seconds", "1", "--repeats", "1", "--capacity-jobs", "200", "--cold-wal"]
    # The I/O handler, the no-op one, the ANALYZE thread of a diagnosis and
    # another's server setting.
    configs = ["io_10ms", "noop_analyzed", "noop_naptime_2s"]
    latency_load.main([*small, "--configs", ",".join(configs), "--out", str(out)])
    record = _read(out, "latency_load", "bench.perf.latency_load")
    levels = record.results["levels"]
    assert list(levels) == configs
    for per in levels.values():
        assert set(per) == {"0.25", "0.5", "0.8"}, "every load level"
        for cell in per.values():
            assert 0 < cell["p50_ms"] <= cell["p95_ms"] <= cell["p99_ms"] <= cell["max_ms"], cell
            assert cell["completion_per_second"] > 0
            assert isinstance(cell["producer_kept_up"], bool)
            (run,) = cell["runs"]
            assert run["jobs"] > 0
            assert 1 <= run["seconds"] <= 3  # seconds of enqueue, for a level of 1 s
            assert 0 <= run["seconds_median_over_25_ms"] <= run["seconds"]
            assert run["autovacuums"] >= 0 and run["autovacuum_seconds"] >= 0
            assert 1 <= run["jobs_per_claim"] <= run["jobs"]
            assert run["target_per_second"] == pytest.approx(
                run["load"] * run["capacity_per_second"], rel=0.01
            )
    for capacity in record.results["capacity_jobs_per_second"].values():
        assert capacity["median"] > 0
    assert "goal" not in record.results  # it is the noop configuration's, not run here
    assert record.parameters["wal_segments_warmed"] == 0
    with psycopg.connect(bench_url, autocommit=True) as conn:
        naptime = conn.execute("SHOW autovacuum_naptime").fetchone()
    assert naptime == ("1min",), "the diagnosis gave the server its own setting back"


WAL_SEGMENT_FILES = "SELECT count(*) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$'"


def test_warm_wal_leaves_a_fresh_server_the_segments_of_max_wal_size_to_recycle() -> None:
    from bench.common import bench_server, warm_wal

    with (
        bench_server("warm-wal") as server,
        psycopg.connect(server.url, autocommit=True) as conn,
    ):
        (before,) = conn.execute(WAL_SEGMENT_FILES).fetchone() or (0,)
        segments = warm_wal(server.url)
        (after,) = conn.execute(WAL_SEGMENT_FILES).fetchone() or (0,)
        (max_wal_size,) = conn.execute(
            "SELECT pg_size_bytes(current_setting('max_wal_size'))"
        ).fetchone() or (0,)
    assert before <= 2, "a fresh server has its first segment or two"
    assert segments * 16 * 1024 * 1024 == max_wal_size
    assert after >= segments - 2, "made, then kept for reuse by the check-point"


def test_the_latency_goal_is_the_median_p99_of_the_noop_configuration_at_half_load() -> None:
    from bench.perf.latency_load import MEDIANS, tables

    def run(p99: float) -> dict[str, object]:
        cells = dict.fromkeys(("p50_ms", "p95_ms", "max_ms", *MEDIANS), 1.0)
        return cells | {"p99_ms": p99, "producer_kept_up": True}

    runs = {"noop": {"0.25": [run(5.0)], "0.5": [run(20.0), run(24.0), run(900.0)]}}
    goal = tables({"noop": [1000.0]}, runs)["goal"]
    assert goal["p99_ms_noop_at_50_percent"] == 24.0
    assert goal["met"] is True
    assert goal["met_in_rounds"] == 2
    runs["noop"]["0.5"][1] = run(25.0)
    assert tables({"noop": [1000.0]}, runs)["goal"]["met"] is False


def test_the_open_loop_schedule_offers_exactly_the_rate() -> None:
    from bench.producer import _sizes

    sizes = _sizes(1234.5, 0.01, 1000)  # ten seconds of 10 ms batches
    assert sum(sizes) == round(1234.5 * 10)
    assert set(sizes) <= {12, 13}


def test_enqueue_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import enqueue

    out = out_dir / "enqueue.json"
    enqueue.main(["--jobs", "20", "--many-jobs", "2000", "--repeats", "1", "--out", str(out)])
    rates = _read(out, "enqueue", "bench.perf.enqueue").results["results_jobs_per_second"]
    assert set(rates) == set(enqueue.ROWS)
    assert all(r["median"] > 0 for r in rates.values())


def test_api_enqueue_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import api_enqueue

    out = out_dir / "api_enqueue.json"
    small = ["--requests", "40", "--clients", "2", "--concurrency", "2", "--batch-jobs", "1000"]
    api_enqueue.main([*small, "--repeats", "1", "--out", str(out)])
    rates = _read(out, "api_enqueue", "bench.perf.api_enqueue").results["jobs_per_second"]
    assert set(rates) == {"single", "batch_100", "batch_1000"}
    assert all(r["median"] > 0 for r in rates.values())


def test_core_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import core

    out = out_dir / "core.json"
    core.main(["--jobs", "300", "--single-jobs", "40", "--repeats", "1", "--out", str(out)])
    results = _read(out, "core", "bench.perf.core").results
    assert results["results_jobs_per_second"]["claim_ack_batch_100"]["median"] > 0
    assert results["notify_cost_ratio"] > 0


def test_history_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import history

    out = out_dir / "history.json"
    history.main(
        ["--sizes", "0,300", "--jobs", "50", "--repeats", "1", "--scrapes", "5", "--out", str(out)]
    )
    results = _read(out, "history", "bench.perf.history").results
    assert [r["finished_jobs"] for r in results["sizes"]] == [0, 300]
    assert set(results["ratio_largest_to_empty"]) == {
        "claim_ack_batch_100",
        "claim_ack_batch_100_vs_control",
        "worker_1_process",
        "worker_1_process_vs_control",
        "metrics_scrape_ms",
        "history_scrape_ms",
        "history_scrape_vs_healthz",
        "snapshot_new_minute_ms",
        "snapshot_taken_minute_ms",
    }
    for row in results["sizes"]:
        assert row["claim_ack_batch_100_vs_control"]["median"] > 0
        assert row["history_scrape_ms"]["median"] > 0 < row["snapshot_new_minute_ms"]["median"]


def test_archive_history_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import archive_history

    out = out_dir / "archive_history.json"
    archive_history.main(
        ["--rows", "3000", "--jobs", "50", "--repeats", "1", "--reads", "3", "--out", str(out)]
    )
    results = _read(out, "archive_history", "bench.perf.archive_history").results
    assert results["generated"]["rows"] == 3000
    assert results["generated"]["partitions"] >= archive_history.DAYS
    assert results["with_history"]["get_job_ms"]["archived"]["median"] > 0
    assert set(results["with_history"]["reads_ms"]) == set(archive_history.READS)
    assert results["retention_drop"]["partitions"]  # the oldest day went
    assert results["ratio_with_history_to_empty"]["claim_ack_batch_100"] > 0


def test_metrics_history_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import metrics_history

    out = out_dir / "metrics_history.json"
    metrics_history.main(["--sizes", "0,500", "--scrapes", "5", "--out", str(out)])
    results = _read(out, "metrics_history", "bench.perf.metrics_history").results
    assert [r["finished_jobs"] for r in results["sizes"]] == [0, 500]
    assert all(r["scrape_ms"]["median"] > 0 for r in results["sizes"])


def test_compare_smoke_pgqueue_only(bench_url: str, out_dir: Path) -> None:
    from bench.compare import compare

    out = out_dir / "compare.json"
    compare.main(["--systems", "pgqueue", "--jobs", "50", "--repeats", "1", "--out", str(out)])
    results = _read(out, "compare", "bench.compare.compare").results
    assert list(results["systems"]) == ["pgqueue c=100", "pgqueue c=1000"]
    assert results["systems"]["pgqueue c=100"]["ratio_to_pgqueue"]["median"] == 1.0
    assert results["skipped"] == {}


def test_maintenance_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import maintenance

    out = out_dir / "maintenance.json"
    maintenance.main(
        [
            "--running",
            "20",
            "--finished",
            "200",
            "--calls",
            "20",
            "--backends",
            "2",
            "--out",
            str(out),
        ]
    )
    results = _read(out, "maintenance", "bench.perf.maintenance").results
    assert set(results["statement_ms"]) == {
        "reap_ms",
        "prune_ms",
        "try_lock_not_leader_ms",
        "death_check_ms",
    }
    assert results["per_reap_interval_for_workers"]["every_worker_ms"] > 0
    assert results["death_check_finding_one"]["held_jobs"] == 4  # a fifth of 20


def test_scheduled_smoke(out_dir: Path) -> None:
    from bench.perf import scheduled

    out = out_dir / "scheduled.json"
    scheduled.main(
        ["--scheduled", "2000", "--jobs", "200", "--rounds", "1", "--calls", "5", "--out", str(out)]
    )
    results = _read(out, "scheduled", "bench.perf.scheduled").results
    for database in ("plain", "scheduled"):
        assert results["idle_poll_ms"][database]["job_next_run_at_ms"] > 0
        assert results["drain_jobs_per_second"][database]["median"] > 0


def test_bulk_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import bulk

    out = out_dir / "bulk.json"
    bulk.main(
        [
            "--flood",
            "300",
            "--other",
            "100",
            "--history",
            "100",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    results = _read(out, "bulk", "bench.perf.bulk").results
    assert set(results["seconds"]) == {"dry_run", "cancel", "retry", "cancel_by_task", "delete"}
    assert all(r["median"] > 0 for r in results["jobs_per_second"].values())


def test_fillfactor_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import fillfactor

    out = out_dir / "fillfactor.json"
    fillfactor.main(["--history", "300", "--jobs", "200", "--repeats", "1", "--out", str(out)])
    cells = _read(out, "fillfactor", "bench.perf.fillfactor").results["cells"]
    assert len(cells) == 6
    assert all(cell["wal_bytes_per_job"]["median"] > 0 for cell in cells.values())


def test_finish_statement_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import finish_statement

    out = out_dir / "finish_statement.json"
    finish_statement.main(["--jobs", "400", "--size", "50", "--rounds", "1", "--out", str(out)])
    results = _read(out, "finish_statement", "bench.perf.finish_statement").results
    assert set(results["ack_ms"]) == {"as_shipped", "without_batch_step"}
    assert results["as_shipped_over_without_batch_step"]["median"] > 0


def test_the_finish_statement_without_its_batch_step_still_finishes_and_counts() -> None:
    from bench.perf.finish_statement import without_batch_step

    cut = without_batch_step(QUERIES["job_finish"])
    assert "batched" not in cut and "pgqueue_batch_moved" not in cut
    assert "pgqueue_counters" in cut and "pgqueue_release" in cut


def test_archive_move_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import archive_move

    out = out_dir / "archive_move.json"
    archive_move.main(["--rows", "300", "--repeats", "1", "--out", str(out)])
    results = _read(out, "archive_move", "bench.perf.archive_move").results
    assert set(results["rows_per_second"]) == {"with_index", "without_index"}
    assert results["with_over_without"]["median"] > 0
    # The run leaves the schema as the migrations made it: the index is back.
    with psycopg.connect(bench_url) as conn:
        found = conn.execute("SELECT to_regclass('pgqueue_jobs_archive_queue')").fetchone()
    assert found is not None and found[0] is not None


def test_worker_startup_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import worker_startup

    out = out_dir / "worker_startup.json"
    worker_startup.main(["--jobs", "200", "--repeats", "1", "--out", str(out)])
    cells = _read(out, "worker_startup", "bench.perf.worker_startup").results["cells"]
    assert set(cells) == {"1_process", "2_processes"}
    for cell in cells.values():
        assert cell["startup_seconds"]["median"] > 0 and cell["drain_seconds"]["median"] > 0
        assert (
            cell["draining_jobs_per_second"]["median"] > cell["clocked_jobs_per_second"]["median"]
        )
        # The server runs on this host: its CPU, and the workers', are read.
        startup_cpu = cell["workers_startup_cpu_seconds"]["median"]
        assert 0 < startup_cpu <= cell["workers_cpu_seconds"]["median"]
        assert cell["server_cpu_seconds"]["median"] > 0


def test_cli_start_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import cli_start

    out = out_dir / "cli_start.json"
    cli_start.main(["--repeats", "1", "--out", str(out)])
    record = _read(out, "cli_start", "bench.perf.cli_start")
    assert set(record.results["commands"]) == set(cli_start.COMMANDS)
    for cell in record.results["commands"].values():
        assert cell["wall_seconds"]["median"] > 0 and cell["cpu_seconds"]["median"] > 0
    assert record.parameters["parsing_imports_pydantic"] is False


def test_row_reading_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import row_reading

    out = out_dir / "row_reading.json"
    row_reading.main(["--rows", "50", "--repeats", "1", "--out", str(out)])
    cells = _read(out, "row_reading", "bench.perf.row_reading").results["payloads"]
    assert set(cells) == set(row_reading.PAYLOADS)
    assert all(cell["client_us_per_row"]["median"] > 0 for cell in cells.values())


def test_small_batches_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import small_batches
    from pgqueue.core import enqueue

    out = out_dir / "small_batches.json"
    bound = enqueue.ONE_STATEMENT_JOBS
    small_batches.main(["--sizes", "1,3", "--calls", "3", "--repeats", "1", "--out", str(out)])
    cells = _read(out, "small_batches", "bench.perf.small_batches").results["sizes"]
    assert set(cells) == {"1", "3"}
    for cell in cells.values():
        assert all(cell[way]["p50_ms"]["median"] > 0 for way in small_batches.WAYS)
    assert bound == enqueue.ONE_STATEMENT_JOBS  # the bench put it back


def test_worker_throughput_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import worker_throughput

    out = out_dir / "worker_throughput_smoke.json"
    worker_throughput.main(
        ["--jobs", "200", "--repeats", "1", "--latency-jobs", "20", "--out", str(out)]
    )
    results = _read(out, "worker_throughput", "bench.perf.worker_throughput").results
    assert all(r["median"] > 0 for r in results["rates_jobs_per_second"].values())
    assert results["latency_idle_100_per_second"]["p50_ms"] > 0


def test_outside_harness_smoke_analyzes_the_loaded_table_before_each_drain(
    bench_url: str, out_dir: Path
) -> None:
    """pgqueue alone, both sides this checkout: every drain starts on a table
    that ANALYZE saw full of queued jobs."""
    from bench.perf import worker_throughput

    def analyzes() -> int:
        with psycopg.connect(bench_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'"
            ).fetchone()
        assert row is not None
        return int(row[0])

    out = out_dir / "outside_harness.json"
    repo = Path(__file__).resolve().parents[3]
    before = analyzes()
    args = ["--outside-harness", "--jobs", "200", "--repeats", "1", "--no-pgqueuer"]
    worker_throughput.main([*args, "--before", str(repo), "--out", str(out)])
    results = _read(out, "outside_harness", "bench.perf.outside_harness").results
    rates = results["rates_jobs_per_second"]
    assert len(rates) == 8 and all(r["median"] > 0 for r in rates.values())
    assert results["ratios"]["after_over_before_cli_2"]["median"] > 0
    assert results["ratios"]["after_over_before_2"]["median"] > 0
    # Each drain: the empty table's ANALYZE, then the loaded one's.
    assert analyzes() - before >= 2 * len(rates)


def test_outside_harness_on_a_serializable_server_smoke(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--serializable: its own server defaults to SERIALIZABLE, recorded."""
    from bench.perf import outside_harness

    monkeypatch.delenv("DATABASE_URL", raising=False)  # a server option
    out = out_dir / "outside_harness_serializable.json"
    args = ["--jobs", "200", "--repeats", "1", "--no-pgqueuer", "--serializable"]
    outside_harness.main([*args, "--out", str(out)])
    record = _read(out, "outside_harness", "bench.perf.outside_harness")
    assert record.parameters["server_options"] == {"default_transaction_isolation": "serializable"}
    assert all(r["median"] > 0 for r in record.results["rates_jobs_per_second"].values())


def test_long_transaction_smoke_holds_back_vacuum_only_while_its_snapshot_is_open(
    bench_url: str, out_dir: Path
) -> None:
    """pgqueue alone: the held drains run while a snapshot keeps every dead
    row version of the later drains; the free ones see them vacuumed."""
    from bench.perf import long_transaction

    out = out_dir / "long_transaction.json"
    long_transaction.main(["--jobs", "200", "--rounds", "2", "--no-pgqueuer", "--out", str(out)])
    results = _read(out, "long_transaction", "bench.perf.long_transaction").results["pgqueue"]
    free, held = (
        results["free"]["dead_versions_after_drain"],
        results["held"]["dead_versions_after_drain"],
    )
    # Each drain leaves its own jobs' dead versions (claim and ack); only
    # under the snapshot do the earlier drains' stay too.
    assert held[1] - held[0] >= 200 > free[1] - free[0]
    assert results["held"]["snapshot_xmin"]
    assert results["held"]["after"] > 0 and len(results["ratios"]["held_over_free_by_round"]) == 2


def test_bench_database_refuses_server_options_its_database_url_lacks(bench_url: str) -> None:
    """With DATABASE_URL, a benchmark that needs a server setting says so
    instead of measuring without it."""
    from bench.common import bench_database

    with psycopg.connect(bench_url) as conn:
        has = conn.execute("SHOW random_page_cost").fetchone()[0]  # type: ignore[index]
    with bench_database("x", {"random_page_cost": has}) as url:
        assert url == bench_url
    wanted = "7" if has != "7" else "8"
    refused = pytest.raises(SystemExit, match=f"random_page_cost = {wanted} \\(has: {has}\\)")
    with refused, bench_database("x", {"random_page_cost": wanted}):
        pass


def test_before_after_smoke(bench_url: str, out_dir: Path) -> None:
    """Both sides this checkout (its .venv): the script's rounds and pairing."""
    from bench.compare import before_after

    out = out_dir / "before_after.json"
    repo = Path(__file__).resolve().parents[3]
    args = ["--before", str(repo), "--rounds", "1", "--only", "async1", "--jobs", "200"]
    before_after.main([*args, "--out", str(out)])
    record = _read(out, "before_after", "bench.compare.before_after")
    paired = record.results["summary"]["async1"]
    assert paired["before_median_jobs_per_second"] > 0 < paired["after_median_jobs_per_second"]
    assert len(paired["paired_rate_ratios"]) == 1
    assert [(r["side"], r["round"]) for r in record.results["runs"]] == [
        ("before", 1),
        ("after", 1),
    ]


def test_cost_per_job_smoke(out_dir: Path) -> None:
    """Both sides this checkout, one round: each side drains on a server of
    its own with pg_stat_statements, and the work per job is paired."""
    from bench.compare import cost_per_job

    out = out_dir / "cost_per_job.json"
    repo = Path(__file__).resolve().parents[3]
    cost_per_job.main(["--before", str(repo), "--rounds", "1", "--jobs", "300", "--out", str(out)])
    record = _read(out, "cost_per_job", "bench.compare.cost_per_job")
    summary = record.results["summary"]
    for name in ("claim.wal_bytes", "finish.shared_blks_hit", "jobs_per_second"):
        assert summary[name]["before"] > 0 < summary[name]["after"]
    assert summary["worker_cpu_us_per_job"]["after"] >= 0  # whole clock ticks: may be 0
    assert [r["side"] for r in record.results["runs"]] == ["before", "after"]


def test_crash_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.faults import crash

    out = out_dir / "crash.json"
    code = crash.main(["--jobs", "30", "--workers", "2", "--kill-every", "0.5", "--out", str(out)])
    results = _read(out, "crash", "bench.faults.crash").results
    assert code == 0, results
    assert results["jobs_succeeded"] == 30
    assert results["invariants"]["ok"], results["invariants"]["violations"]


def test_recovery_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.faults import recovery

    out = out_dir / "recovery.json"
    recovery.main(["--runs", "1", "--jobs", "2", "--out", str(out)])
    results = _read(out, "recovery", "bench.faults.recovery").results
    [seconds] = results["recovery_seconds"]["runs"]
    assert 0 < seconds == results["recovery_seconds"]["max"]


def test_restart_smoke(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.faults import restart

    # Its own server (it restarts it), on tmpfs as the session's is.
    root = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
    monkeypatch.setenv("BENCH_DIR", str(root))
    before = set(root.glob("pgqueue-restart-*"))
    out = out_dir / "restart.json"
    code = restart.main(["--jobs", "40", "--workers", "2", "--out", str(out)])
    record = _read(out, "restart", "bench.faults.restart")
    assert code == 0, record.results
    assert record.parameters["restart"].startswith("pg_ctl stop -m fast")
    assert record.results["committed_before_restart_changed"] == []
    assert set(root.glob("pgqueue-restart-*")) == before, "the server's folder was left behind"


def test_soak_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.faults import soak

    out = out_dir / "soak.json"
    small = ["--minutes", "0.1", "--workers", "1", "--concurrency", "4", "--capacity-jobs", "100"]
    code = soak.main([*small, "--row-seconds", "2", "--out", str(out)])
    record = _read(out, "soak", "bench.faults.soak")
    results = record.results
    assert code == 0, results
    assert results["capacity_jobs_per_second"] > 0
    assert record.parameters["rate_per_second"] == pytest.approx(
        0.5 * results["capacity_jobs_per_second"], rel=0.01
    )
    assert results["jobs_enqueued"] > 100
    assert results["jobs_lost"] == 0
    assert len(results["per_minute"]) >= 2
    assert set(results["flatness"]["series"]) == set(soak.FLAT)


PLOTTED = ["benchmark", "latency", "enqueue", "history", "compare", "latency_load", "soak"]
TABLE_HEADINGS = (
    "model single",
    "model batched",
    "latency.json",
    "enqueue.json",
    "history.json",
    "compare.json",
    "latency_load.json",
    "soak.json",
)


def _draws_every_chart(results: Path, out: Path) -> None:
    from bench.plots import plot

    charts = plot.main(["--results", str(results), "--out-dir", str(out)])
    assert sorted(p.name for p in charts) == sorted(f"{n}.png" for n in PLOTTED)
    for chart in charts:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = plot.markdown(results)
    for heading in TABLE_HEADINGS:
        assert heading in tables


def test_plot_smoke(out_dir: Path) -> None:
    missing = [n for n in PLOTTED if not (out_dir / f"{n}.json").exists()]
    if missing:  # run alone (-k plot): nothing to draw yet
        pytest.fail(f"run the whole module: no JSON for {missing}")
    _draws_every_chart(out_dir, out_dir)


def test_plot_draws_the_committed_results_written_before_the_record(tmp_path: Path) -> None:
    _draws_every_chart(RESULTS, tmp_path)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_committed_result_reads_as_a_record(path: Path) -> None:
    record = read_result(path)
    assert path.stem.startswith(record.name)
    assert record.machine["cores"] >= 1
    assert record.server["server_version"]
    assert record.parameters
    assert record.results


def test_workflows_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import workflows

    out = out_dir / "workflows.json"
    workflows.main(["--children", "200", "--rounds", "1", "--out", str(out)])
    results = _read(out, "workflows", "bench.perf.workflows").results
    for case in workflows.CASES:
        assert results["rates_jobs_per_second"][case]["median"] > 0
    assert results["fan_in_start_seconds"]["median"] >= 0


def test_capacity_smoke(bench_url: str, out_dir: Path) -> None:
    """On the session's server (no pg_stat_statements there): the /proc and
    statistics views of each phase."""
    from bench.perf import capacity

    out = out_dir / "capacity.json"
    capacity.main(
        [
            "--jobs",
            "400",
            "--batch",
            "200",
            "--single-jobs",
            "20",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    results = _read(out, "capacity", "bench.perf.capacity").results
    phases = {"enqueue_batch", "drain_worker", "drain_pgbench", "enqueue_single"}
    assert set(results["per_job"]) == phases
    for phase in phases:
        cost = results["per_job"][phase]
        assert cost["wal_bytes"]["median"] > 0 and cost["commits"]["median"] > 0
    # A commit (and its WAL flush) per single enqueue at least.
    assert results["per_job"]["enqueue_single"]["commits"]["median"] >= 1
    assert results["per_job"]["drain_worker"]["table_bytes_finished"]["median"] > 0
    assert results["model"]["jobs_per_second_per_core[enqueue_batch+drain_worker]"] > 0


def test_capacity_standby_smoke(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own server (a standby needs pg_basebackup of it), on tmpfs: both
    standby modes measured, the standby's CPU counted, no folder left."""
    from bench.perf import capacity

    root = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
    monkeypatch.setenv("BENCH_DIR", str(root))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    before = set(root.glob("pgqueue-capacity-*"))
    out = out_dir / "capacity_standby.json"
    args = ["--jobs", "200", "--batch", "100", "--single-jobs", "20", "--repeats", "1"]
    capacity.main([*args, "--standby", "--out", str(out)])
    results = _read(out, "capacity", "bench.perf.capacity").results
    standby = results["per_job_with_standby"]
    for mode in ("async", "sync"):
        assert standby[f"enqueue_single_{mode}_standby"]["wal_bytes"]["median"] > 0
        assert standby[f"drain_worker_{mode}_standby"]["standby_cpu_us"]["median"] >= 0
    assert results["per_job"]["enqueue_batch"]["statement_exec_us"]
    assert set(root.glob("pgqueue-capacity-*")) == before, "the server's folder was left behind"


def test_api_group_commit_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import api_group_commit

    out = out_dir / "api_group_commit.json"
    small = ["--requests", "40", "--clients", "2", "--concurrency", "4", "--rounds", "1"]
    api_group_commit.main([*small, "--out", str(out)])
    results = _read(out, "api_group_commit", "bench.perf.api_group_commit").results
    assert set(results["jobs_per_second"]) == {"noop", "group_commit", "single_commits"}
    assert all(r["median"] > 0 for r in results["jobs_per_second"].values())
    assert results["ratio_medians"]["jobs_over_noop"] > 0


def test_fairness_smoke(bench_url: str, out_dir: Path) -> None:
    from bench.perf import fairness

    out = out_dir / "fairness.json"
    sizes = ["--big", "2000", "--small", "3", "--rounds", "2", "--plain-rounds", "2"]
    fairness.main([*sizes, "--pause", "0.05", "--out", str(out)])
    results = _read(out, "fairness", "bench.perf.fairness").results
    assert set(results["scenarios"]) == {"empty", "busy", "shared_worker", "fair", "plain"}
    for name in ("empty", "busy", "shared_worker", "fair"):
        scenario = results["scenarios"][name]
        assert scenario["small_started"] == scenario["small_jobs"] == 6, name
    assert results["scenarios"]["busy"]["big_jobs_started_meanwhile"] > 0
    ratios = (
        "fair_p99_over_busy_p99",
        "fair_p99_over_empty_p99",
        "shared_worker_p99_over_fair_p99",
    )
    assert all(results[ratio] > 0 for ratio in ratios)
    # Each small job's handler began after its enqueue (the handler's wall clock).
    assert results["scenarios"]["empty"]["handler_start_ms"]["p50_ms"] > 0


def test_fairness_smoke_runs_only_the_scenarios_named(bench_url: str, out_dir: Path) -> None:
    from bench.perf import fairness

    out = out_dir / "fairness_only.json"
    sizes = ["--big", "500", "--small", "2", "--rounds", "2", "--pause", "0.05"]
    fairness.main([*sizes, "--only", "shared_worker", "--out", str(out)])
    results = _read(out, "fairness", "bench.perf.fairness").results
    assert set(results["scenarios"]) == {"shared_worker"}
    assert results["fair_p99_over_empty_p99"] is None

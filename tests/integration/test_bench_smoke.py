"""Every benchmark script, end to end with tiny numbers, so that none can rot.

The scripts run in-process through their ``main(argv)`` against one test
database (DATABASE_URL, which ``bench_database`` then uses instead of
starting a server of its own), each writing its JSON to a temporary folder
via --out; the plot script then draws all of them. The competitors of
bench.compare are left out by its --systems flag (no virtualenv, no PyPI).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue.embedded import EmbeddedPostgres

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


def _read(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert data["machine"]["cores"] >= 1
    assert data["server"]["fsync"] in ("on", "off")
    return dict(data)


def test_benchmark_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import benchmark

    out = out_dir / "benchmark.json"
    benchmark.main(["--jobs", "50", "--workers", "1,2", "--repeats", "1", "--out", str(out)])
    data = _read(out)
    table = data["results_jobs_per_second"]
    assert set(table) == {"single", "batched"}
    for model in table.values():
        assert set(model) == {"1", "2"}
        for cell in model.values():
            assert cell["skip_locked"]["median"] > 0
            assert cell["for_update"]["median"] > 0
            assert cell["ratio_skip_locked_to_for_update"]["median"] > 0


def test_latency_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import latency

    out = out_dir / "latency.json"
    latency.main(["--jobs", "20", "--rate", "200", "--workers", "1", "--out", str(out)])
    table = _read(out)["results_ms"]
    for mode in ("notify", "poll"):
        row = table[mode]["1"]
        assert 0 <= row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= row["max_ms"]


def test_enqueue_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import enqueue

    out = out_dir / "enqueue.json"
    enqueue.main(["--jobs", "20", "--many-jobs", "2000", "--repeats", "1", "--out", str(out)])
    rates = _read(out)["results_jobs_per_second"]
    assert set(rates) == set(enqueue.ROWS)
    assert all(r["median"] > 0 for r in rates.values())


def test_history_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import history

    out = out_dir / "history.json"
    history.main(
        ["--sizes", "0,300", "--jobs", "50", "--repeats", "1", "--scrapes", "5", "--out", str(out)]
    )
    data = _read(out)
    assert [r["finished_jobs"] for r in data["sizes"]] == [0, 300]
    assert set(data["ratio_largest_to_empty"]) == {
        "claim_ack_batch_100",
        "claim_ack_batch_100_vs_control",
        "worker_1_process",
        "worker_1_process_vs_control",
        "metrics_scrape_ms",
    }
    for row in data["sizes"]:
        assert row["claim_ack_batch_100_vs_control"]["median"] > 0


def test_compare_smoke_pgqueue_only(bench_url: str, out_dir: Path) -> None:
    from bench import compare

    out = out_dir / "compare.json"
    compare.main(["--systems", "pgqueue", "--jobs", "50", "--repeats", "1", "--out", str(out)])
    data = _read(out)
    assert list(data["results"]) == ["pgqueue c=100", "pgqueue c=1000"]
    assert data["results"]["pgqueue c=100"]["ratio_to_pgqueue"]["median"] == 1.0
    assert data["skipped"] == {}


def test_maintenance_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import maintenance

    out = out_dir / "maintenance.json"
    maintenance.main(["--running", "20", "--finished", "200", "--calls", "20", "--out", str(out)])
    data = json.loads(out.read_text())
    assert set(data["statement_ms"]) == {"reap_ms", "prune_ms", "try_lock_not_leader_ms"}
    assert data["per_reap_interval_for_workers"]["every_worker_ms"] > 0


def test_fillfactor_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import fillfactor

    out = out_dir / "fillfactor.json"
    fillfactor.main(["--history", "300", "--jobs", "200", "--repeats", "1", "--out", str(out)])
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 6
    assert all(cell["wal_bytes_per_job"]["median"] > 0 for cell in cells.values())


def test_worker_throughput_smoke(bench_url: str, out_dir: Path) -> None:
    from bench import worker_throughput

    out = out_dir / "worker_throughput_smoke.json"
    worker_throughput.main(
        ["--jobs", "200", "--repeats", "1", "--latency-jobs", "20", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert all(r["median"] > 0 for r in data["rates_jobs_per_second"].values())
    assert data["latency_idle_100_per_second"]["p50_ms"] > 0


def test_plot_smoke(out_dir: Path) -> None:
    from bench import plot

    names = ["benchmark", "latency", "enqueue", "history", "compare"]
    missing = [n for n in names if not (out_dir / f"{n}.json").exists()]
    if missing:  # run alone (-k plot): nothing to draw yet
        pytest.fail(f"run the whole module: no JSON for {missing}")
    charts = plot.main(["--results", str(out_dir)])
    assert sorted(p.name for p in charts) == sorted(f"{n}.png" for n in names)
    for chart in charts:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = plot.markdown(out_dir)
    for heading in (
        "model single",
        "model batched",
        "latency.json",
        "enqueue.json",
        "history.json",
        "compare.json",
    ):
        assert heading in tables

import pgqueue


def test_all_is_sorted_and_complete() -> None:
    assert pgqueue.__all__ == sorted(pgqueue.__all__)
    for name in pgqueue.__all__:
        assert hasattr(pgqueue, name), name
    public = {n for n in dir(pgqueue) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(pgqueue.__all__)


def test_each_public_name_is_loaded_from_its_home_on_first_use() -> None:
    import importlib

    homes = pgqueue._HOMES  # type: ignore[attr-defined]
    assert sorted(homes) == pgqueue.__all__
    for name, home in homes.items():
        module = importlib.import_module(home, "pgqueue")
        assert getattr(pgqueue, name) is getattr(module, name), name


# What a worker process never uses, and so does not import at its start (each
# module's import is part of every worker's start-up): the queue faces, the
# producers' pools and retries, the enqueue side, the embedded server.
NOT_IN_A_WORKER = (
    "pgqueue.queue",
    "pgqueue.db.pools",
    "pgqueue.db.retrying",
    "pgqueue.db.embedded",
    "pgqueue.core.enqueue",
    "pgqueue.core.workflows",
    "psycopg_pool",
)


def test_a_worker_process_does_not_import_the_queue_faces_nor_the_producers_side() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; from pgqueue import Settings; from pgqueue.worker import Worker;"
        " print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    imported = out.stdout.split()
    assert "pgqueue.worker.runtime" in imported
    assert [m for m in imported if m.startswith(NOT_IN_A_WORKER)] == []


def test_the_version_is_the_installed_distributions_and_the_command_lines() -> None:
    import importlib.metadata
    import subprocess
    import sys

    assert importlib.metadata.version("pgqueue") == pgqueue.__version__
    shown = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"pgqueue {pgqueue.__version__}"

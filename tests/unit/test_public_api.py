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


def test_a_worker_process_does_not_import_the_queue_faces() -> None:
    import subprocess
    import sys

    probe = (
        "import sys; from pgqueue import Settings; from pgqueue.worker import Worker;"
        " print(sorted(m for m in sys.modules if m.startswith('pgqueue.queue')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_version_is_the_installed_distributions_and_the_command_lines() -> None:
    import importlib.metadata
    import subprocess
    import sys

    assert importlib.metadata.version("pgqueue") == pgqueue.__version__
    shown = subprocess.run(
        [sys.executable, "-m", "pgqueue", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"pgqueue {pgqueue.__version__}"

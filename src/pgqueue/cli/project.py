"""Which project a command runs in, and which database it may use.

The project is the nearest folder, from the current one up to the root (as
git finds ``.git``), that holds the embedded server's data folder
(``.pgqueue/``) or a ``pyproject.toml`` with a ``[tool.pgqueue]`` table. Its
pyproject.toml is the one ``Settings.load`` reads, and a relative
``data_dir`` (or the default) is taken from it, so every folder of a project
reaches the same embedded server.

The commands that run the stack (``up``, ``worker``, ``api``, ``migrate``,
``db start``) start that server if it is stopped, and create it if there is
none: in the project's folder, or in the current one outside any project.
Every other command only uses a database that is there: the one a URL names,
or the project's embedded server while it runs. It never starts or creates
one (a read run in the wrong folder would leave a server running there, on an
empty database); it says what it looked for and how to name a database.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import PgQueueError
from ..core.settings import PYPROJECT, Settings
from ..db.embedded import EmbeddedPostgres

__all__ = ["NoDatabase", "Project", "existing_database"]

DATA_FOLDER = Settings.data_dir  # the default data_dir, ".pgqueue"

_NAME_ONE = "name a database with DATABASE_URL=postgresql://... or --database-url URL"


class NoDatabase(PgQueueError):
    """No database named, and no running embedded server of the project."""


@dataclass(frozen=True)
class Project:
    """Where the walk started (the current folder) and the project it found."""

    start: Path = field(default_factory=Path.cwd)
    root: Path | None = None

    @classmethod
    def find(cls, start: Path | None = None) -> Project:
        start = (start or Path.cwd()).absolute()
        return cls(start, next((f for f in (start, *start.parents) if _is_project(f)), None))

    @property
    def folder(self) -> Path:
        """Where its settings are read and its embedded server lives (or would)."""
        return self.root or self.start


def _is_project(folder: Path) -> bool:
    # A server's data (its pgdata), not any folder of that name: an attempt
    # that failed before creating the server leaves nothing to find.
    server = folder / DATA_FOLDER / "pgdata"
    return server.is_dir() or _configures_pgqueue(folder / PYPROJECT)


def _configures_pgqueue(path: Path) -> bool:
    """Whether ``path`` is a pyproject.toml with a [tool.pgqueue] table. One
    that cannot be read does not make a project: it may be anyone's."""
    try:
        with open(path, "rb") as handle:
            tool = tomllib.load(handle).get("tool")
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return isinstance(tool, dict) and "pgqueue" in tool


def existing_database(settings: Settings, project: Project) -> str:
    """The database a command that only acts on one uses: the URL given, or
    the running embedded server of the project; else NoDatabase, saying
    what was looked for. Starts nothing, creates nothing."""
    if settings.database_url:
        return settings.database_url
    server = EmbeddedPostgres(settings.data_dir)
    if (server.pgdata / "PG_VERSION").exists():
        if server.is_running():
            return server.url
        raise NoDatabase(
            f"no database: the embedded server of the project in {project.folder} is "
            f"stopped (data in {server.data_dir}): start it with `pgqueue db start` (or "
            f"`pgqueue up`), or {_NAME_ONE}"
        )
    if project.root is None and server.data_dir == project.start / DATA_FOLDER:
        raise NoDatabase(
            f"no database: DATABASE_URL is not set, and there is no pgqueue project in "
            f"{project.start} or any folder above it (a folder holding {DATA_FOLDER}/, "
            f"the embedded server's data, or a {PYPROJECT} with [tool.pgqueue]): "
            f"{_NAME_ONE}, run this inside your project, or make one here with "
            f"`pgqueue up` or `pgqueue db start`"
        )
    raise NoDatabase(
        f"no database: DATABASE_URL is not set, and there is no embedded server in "
        f"{server.data_dir} (project {project.folder}): create it with `pgqueue db start` "
        f"or `pgqueue up`, or {_NAME_ONE}"
    )

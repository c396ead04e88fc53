"""migrate refuses a PostgreSQL older than the oldest supported release,
naming both versions, before it writes anything."""

from __future__ import annotations

import pytest

from pgqueue import PgQueueError, UnsupportedServer
from pgqueue.db.migrate import require_supported


@pytest.mark.parametrize(("version_num", "shown"), [(140013, "14.13"), (90624, "90624")])
def test_an_older_server_is_refused_by_its_version(version_num: int, shown: str) -> None:
    with pytest.raises(UnsupportedServer) as refused:
        require_supported(version_num)
    assert isinstance(refused.value, PgQueueError)
    assert refused.value.version == shown
    assert str(refused.value) == (
        f"pgqueue needs PostgreSQL 15 or newer; this server is {shown}; nothing was written"
    )


@pytest.mark.parametrize("version_num", [150000, 150020, 160002, 180006])
def test_supported_servers_pass(version_num: int) -> None:
    require_supported(version_num)

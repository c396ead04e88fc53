"""The queue -> cluster map: where each queue lives, what each cluster's
workers take, and the setting's forms (no database: ClusterMap does no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgqueue import InvalidSettings, JobSpec, Settings
from pgqueue.clusters import ClusterMap, ClusterNotMapped, cluster_settings, worker_groups

A = "postgresql://a/app"
B = "postgresql://b/app"


def test_a_named_queue_goes_to_its_cluster_and_every_other_to_star() -> None:
    routes = ClusterMap({"emails": B, "*": A})
    assert (routes.url_for("emails"), routes.url_for("reports")) == (B, A)
    assert routes.urls == [B, A]


def test_without_star_an_unnamed_queue_is_in_no_cluster() -> None:
    with pytest.raises(ClusterNotMapped, match="'reports' is in no cluster"):
        ClusterMap({"emails": B}).url_for("reports")


@pytest.mark.parametrize("routes", [{}, {"bad name!": A}, {"": A}])
def test_a_bad_map_is_refused(routes: dict[str, str]) -> None:
    with pytest.raises(InvalidSettings, match="clusters"):
        ClusterMap(routes)


def test_split_keeps_each_jobs_position_per_cluster() -> None:
    specs = [JobSpec.from_fields({"task": "t", "queue": q}) for q in ("emails", "x", "emails")]
    assert ClusterMap({"emails": B, "*": A}).split(specs) == {B: [0, 2], A: [1]}


def test_each_clusters_workers_take_its_queues() -> None:
    routes = ClusterMap({"emails": B, "sms": B, "*": A, "reports": A})
    assert routes.queues_at(B) == ["emails", "sms"]
    assert routes.queues_at(A) is None  # "*": every queue of that database
    assert routes.queues_at(B, ["emails", "reports"]) == ["emails"]
    assert routes.queues_at(A, ["emails"]) == []


def test_worker_groups_leave_out_a_cluster_none_of_the_queues_lives_in() -> None:
    settings = Settings(
        database_url=A, direct_url="postgresql://a-direct/app", clusters={"emails": B, "*": A}
    )
    groups = worker_groups(settings, ["emails"])
    assert [(s.database_url, queues) for s, queues in groups] == [(B, ["emails"])]
    # A cluster's settings: its URL, no map; the direct URL only for database_url's.
    assert groups[0][0].clusters == {} and groups[0][0].direct_url == ""
    assert cluster_settings(settings, A).direct_url == "postgresql://a-direct/app"
    with pytest.raises(ClusterNotMapped):
        worker_groups(Settings(clusters={"emails": B}), ["reports"])


def test_the_setting_reads_a_json_object_from_the_environment() -> None:
    loaded = Settings.load(environ={"PGQUEUE_CLUSTERS": f'{{"emails": "{B}", "*": "{A}"}}'})
    assert loaded.clusters == {"emails": B, "*": A}


@pytest.mark.parametrize("text", ["emails=x", "[1]", '{"emails": 1}', '{"emails": ""}'])
def test_a_bad_environment_value_is_refused_without_echoing_it(text: str) -> None:
    with pytest.raises(InvalidSettings, match=r"(?i)clusters") as caught:
        Settings.load(environ={"PGQUEUE_CLUSTERS": text})
    assert text not in str(caught.value)


def test_the_setting_reads_a_table_from_pyproject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.pgqueue]\nclusters = {{ emails = "{B}", "*" = "{A}" }}\n'
    )
    assert Settings.load(environ={}).clusters == {"emails": B, "*": A}
    (tmp_path / "pyproject.toml").write_text('[tool.pgqueue]\nclusters = "nope"\n')
    with pytest.raises(InvalidSettings, match="clusters: expected a table"):
        Settings.load(environ={})

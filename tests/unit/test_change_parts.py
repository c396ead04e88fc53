"""What GET /events says, from pgqueue's notifications and the fingerprint's
differences (core/changes.py): no database."""

from __future__ import annotations

from pgqueue.core.changes import Change, Fingerprint, Mailbox, between, from_notification


def fingerprint(queues: dict[str, int], last_job: int = 1, workers: int = 0) -> Fingerprint:
    return Fingerprint(queues, last_job, workers, "0@")


def test_each_channel_names_what_it_knows() -> None:
    assert from_notification("pgqueue_jobs", "mail") == Change(queues=frozenset({"mail"}))
    assert from_notification("pgqueue_finished", "3,4") == Change(jobs=frozenset({3, 4}))
    assert from_notification("pgqueue_progress", "5") == Change(jobs=frozenset({5}))
    assert from_notification("pgqueue_cancelled", "7:91,8:92") == Change(jobs=frozenset({7, 8}))
    assert from_notification("pgqueue_finished", "") == Change(everything=True)
    assert from_notification("elsewhere", "x") == Change(everything=True)


def test_the_fingerprint_says_which_queues_changed_and_nothing_when_none_did() -> None:
    before = fingerprint({"mail": 3, "pay": 1})
    assert not between(before, before)
    assert between(before, fingerprint({"mail": 4, "pay": 1})) == Change(queues=frozenset({"mail"}))
    assert between(before, fingerprint({"mail": 3, "pay": 1, "new": 1})).queues == {"new"}
    assert between(before, fingerprint({"mail": 3, "pay": 1}, last_job=2)).everything
    assert between(before, fingerprint({"mail": 3, "pay": 1}, workers=1)).workers


def test_a_mailbox_merges_until_taken_and_the_database_state_rides_along() -> None:
    box = Mailbox()
    box.add(Change(queues=frozenset({"a"})))
    box.add(Change(queues=frozenset({"b"}), jobs=frozenset({1})))
    box.database(False, "refused")
    pending = box.take()
    assert pending.change == Change(queues=frozenset({"a", "b"}), jobs=frozenset({1}))
    assert pending.database == (False, "refused") and pending.resync is None
    assert not box and box.take().change == Change()

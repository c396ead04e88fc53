from pgqueue import JobState, Queue


def test_enqueue_claim_ack_round_trip(queue: Queue) -> None:
    job = queue.enqueue("hello", {"n": 1})
    [claimed] = queue.claim(5, worker="w1")
    assert claimed.id == job.id and claimed.attempts == 1
    assert queue.ack(claimed, {"ok": True}) is JobState.SUCCEEDED
    assert queue.get(job.id).result == {"ok": True}

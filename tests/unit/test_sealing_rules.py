"""core/sealing.py without a database: which entries the settings accept,
what sealing does to a spec, and what opening refuses."""

from __future__ import annotations

import json

import pytest

from pgqueue import InvalidJob, InvalidSettings, JobSpec, PayloadNotOpened, Settings
from pgqueue.core.sealing import SEALED, Sealing, generate_key, is_sealed

KEY = generate_key("k1")


@pytest.mark.parametrize(
    ("keys", "tasks", "problem"),
    [
        (("nokey",), (), "ID:KEY"),
        ((":abc",), (), "ID:KEY"),
        (("has space:abc",), (), "ID:KEY"),
        (("k1:not-a-fernet-key",), (), "not a Fernet key"),
        ((KEY, KEY), (), "given twice"),
        ((), ("charge",), "needs encryption_keys"),
    ],
)
def test_bad_settings_are_refused_naming_the_problem(
    keys: tuple[str, ...], tasks: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(InvalidSettings, match=problem):
        Settings(encryption_keys=keys, encrypted_tasks=tasks)


def test_keys_stay_out_of_the_settings_repr() -> None:
    settings = Settings(encryption_keys=(KEY,), encrypted_tasks=("charge",))
    assert KEY.split(":")[1] not in repr(settings)


def test_only_the_named_tasks_are_sealed_and_sealing_twice_changes_nothing() -> None:
    sealing = Sealing.of([KEY], ["charge"])
    charge, other = JobSpec.build("charge", {"n": 1}), JobSpec.build("refund", {"n": 1})
    sealed, plain = sealing.seal_specs([charge, other])
    assert plain is other
    envelope = json.loads(sealed.payload_json)
    assert is_sealed(envelope) and envelope["key"] == "k1"
    assert sealing.seal_specs([sealed]) == [sealed]
    assert sealing.open(7, envelope) == {"n": 1}
    assert Sealing.of([KEY], ["*"]).applies("anything")
    assert not Sealing().applies("charge") and Sealing().seal_specs([charge]) == [charge]


def test_opening_refuses_an_unknown_key_and_an_altered_token() -> None:
    envelope = json.loads(
        Sealing.of([KEY], ["*"]).seal_specs([JobSpec.build("t", {"n": 1})])[0].payload_json
    )
    other = Sealing.of([generate_key("k2")], [])
    with pytest.raises(PayloadNotOpened, match=r"sealed with the key 'k1'.*'k2'"):
        other.open(3, envelope)
    same_id_other_key = Sealing.of([generate_key("k1")], [])
    with pytest.raises(PayloadNotOpened, match="does not open it"):
        same_id_other_key.open(3, envelope)
    altered = {**envelope, "token": envelope["token"][:-4] + "AAAA"}
    with pytest.raises(PayloadNotOpened, match="job 3"):
        Sealing.of([KEY], []).open(3, altered)
    with pytest.raises(InvalidJob, match="reserved"):
        JobSpec.build("t", {SEALED: 1})  # a payload may not pass for an envelope
    assert not is_sealed({"card": 1}) and not is_sealed([SEALED]) and not is_sealed(None)

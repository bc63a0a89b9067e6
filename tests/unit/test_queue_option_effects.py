"""What configure says about the options it was sent (no silent option): every
known option has a stated effect, an unknown name is ignored with a did-you-mean, a value
asking for what this broker does not do is ignored, and a value saying what it does anyway
is not."""
from __future__ import annotations

import pytest

from broker.core.errors import BadRequest
from broker.http.wire.queues import (
    OPTION_EFFECTS,
    configure_answer,
    ignored_options,
    parse_configure,
    supported_options,
)
from broker.store.sql import QUEUE_OPTIONS

QUEUE_OPTIONS_DEFAULTS = [(name, default) for name, _col, _typ, default in QUEUE_OPTIONS]
ROW = {"id": "q", "default_partition_id": "p", "name": "orders", "namespace": "", "task": "",
       **{col: default for _name, col, _typ, default in QUEUE_OPTIONS}}


def ignored(options: dict, key: bool = True, **row) -> dict[str, str]:
    req = parse_configure({"queue": "orders", "options": options})
    return ignored_options(req, {**ROW, **row}, encryption_key=key)


def test_every_option_has_an_effect_and_the_form_gets_it():
    assert set(OPTION_EFFECTS) == {name for name, *_ in QUEUE_OPTIONS}
    assert {e for e, _note in OPTION_EFFECTS.values()} <= {"applied", "stored", "fixed"}
    form = {o["name"]: o for o in supported_options()}
    assert form["maxSize"]["effect"] == form["retryDelay"]["effect"] == "applied"
    assert form["ttl"]["effect"] == "stored" and form["deadLetterQueue"]["effect"] == "fixed"
    assert form["retryDelay"]["default"] == 0


def test_the_official_clients_defaults_are_all_applied():
    defaults = {"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0,
                "windowBuffer": 0, "maxSize": 0, "retentionSeconds": 0,
                "completedRetentionSeconds": 0, "encryptionEnabled": False}
    assert ignored(defaults, key=False) == {}


def test_an_unknown_name_is_ignored_with_the_nearest_known_one():
    out = ignored({"leaseTim": 60, "zzz": None})
    assert list(out) == ["leaseTim", "zzz"]
    assert "did you mean leaseTime?" in out["leaseTim"]
    assert "did you mean" not in out["zzz"]


@pytest.mark.parametrize(("options", "row", "expected"), [
    ({"priority": 5}, {}, ["priority"]),
    ({"priority": 0}, {}, []),
    ({"ttl": 60}, {}, ["ttl"]),
    ({"deadLetterQueue": False, "dlqAfterMaxRetries": True}, {}, ["deadLetterQueue"]),
    ({"retentionSeconds": 60}, {}, ["retentionSeconds"]),
    ({"retentionSeconds": 60}, {"retention_enabled": True}, []),
    ({"completedRetentionSeconds": 0}, {}, []),
    ({"maxSize": 5, "retryDelay": 100, "priority": None}, {}, []),
])
def test_values_this_broker_does_not_act_on(options, row, expected):
    assert list(ignored(options, **row)) == expected


def test_false_for_the_always_on_dead_lettering_is_not_stored():
    req = parse_configure({"queue": "orders", "options": {
        "deadLetterQueue": False, "dlqAfterMaxRetries": True}})
    assert req.options == {"dlqAfterMaxRetries": True}
    assert dict(QUEUE_OPTIONS_DEFAULTS)["deadLetterQueue"] is True


def test_encryption_needs_the_key():
    assert list(ignored({"encryptionEnabled": True}, key=False)) == ["encryptionEnabled"]
    assert ignored({"encryptionEnabled": True}, key=True) == {}


def test_the_answer_says_what_was_applied_and_what_was_ignored():
    req = parse_configure({"queue": "orders", "options": {"leaseTime": 30, "ttl": 5, "x": 1}})
    out = ignored_options(req, ROW, encryption_key=True)
    answer = configure_answer(ROW, req, out)
    assert answer["applied"] == ["leaseTime"]
    assert answer["ignored"] == ["ttl", "x"]
    assert [w.split(":")[0] for w in answer["warnings"]] == ["ttl", "x"]
    assert configure_answer(ROW)["ignored"] == []


def test_wrong_types_are_still_a_400_naming_the_option():
    with pytest.raises(BadRequest, match="maxSize"):
        parse_configure({"queue": "q", "options": {"maxSize": "10"}})
    with pytest.raises(BadRequest, match="retryDelay"):
        parse_configure({"queue": "q", "options": {"retryDelay": -5}})

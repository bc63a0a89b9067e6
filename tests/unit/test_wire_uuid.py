"""wire.is_uuid: its fast path for the canonical spelling judges exactly as uuid.UUID does."""
from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from broker.core.ids import is_uuid


def by_uuid_module(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


HEX = "0123456789abcdefABCDEF"
canonical_like = st.lists(st.sampled_from(HEX + "-gG{}:urn \n"), min_size=30, max_size=40).map(
    "".join)


@given(st.uuids().map(str))
def test_every_canonical_uuid_is_one(value):
    assert is_uuid(value) and is_uuid(value.upper())


@given(st.one_of(st.text(), canonical_like, st.uuids().map(lambda u: u.hex),
                 st.uuids().map(lambda u: "{" + str(u) + "}"),
                 st.uuids().map(lambda u: "urn:uuid:" + str(u))))
def test_agrees_with_uuid_module(value):
    assert is_uuid(value) == by_uuid_module(value)


def test_non_strings_are_not_uuids():
    assert not is_uuid(None) and not is_uuid(123) and not is_uuid(uuid.uuid4())

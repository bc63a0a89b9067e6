"""Ids: the uuid7s this broker mints, and the check of a caller's uuid."""
from __future__ import annotations

import re
import uuid
from typing import Any

import uuid_utils


def new_uuid7() -> str:
    return str(uuid_utils.uuid7())


# The canonical spelling, which nearly every client sends: checked without building a
# uuid.UUID (two per acknowledged item); any other spelling is left to uuid.UUID to judge.
_CANONICAL_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                             r"[0-9a-fA-F]{12}")


def is_uuid(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    if _CANONICAL_UUID.fullmatch(value):
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True

"""Ephemeral queues stay unsupported on purpose (issue 17): the whole
/api/v1/ephemeral/* family answers the 404 the official client reads as
``ephemeral_unsupported`` (never ``ephemeral_queue_not_found``, the data 404)."""
from __future__ import annotations

import pytest
from queen.errors import EphemeralError, EphemeralQueueNotFoundError


async def test_client_sees_ephemeral_unsupported(client, queue_name):
    for call in (lambda e: e.push(queue_name, [{"a": 1}]),
                 lambda e: e.pop(queue_name),
                 lambda e: e.depth(queue_name),
                 lambda e: e.queues()):
        with pytest.raises(EphemeralError) as err:
            await call(client.ephemeral)
        assert err.value.code == "ephemeral_unsupported"
        assert not isinstance(err.value, EphemeralQueueNotFoundError)


def test_every_method_answers_404_with_the_code(http):
    for method in ("GET", "POST", "PUT", "DELETE"):
        r = http.request(method, "/api/v1/ephemeral/anything/at/all")
        assert r.status_code == 404 and r.json()["error"] == "ephemeral_unsupported"

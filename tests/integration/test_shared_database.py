"""A broker that boots on a database another broker already uses says so, once, when it
has no mesh peers or no settle time after a database restart (FILE_BUFFER_SETTLE_MS), and
what to set; a broker alone on its database, or one with both, says nothing of the kind.
Real broker processes on a database of the test's own."""
from __future__ import annotations

import pytest

from tests.conftest import free_port, start_broker, stop_brokers

pytestmark = pytest.mark.timeout(120)

SHARED = "config: other brokers use this database"


def shared_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if SHARED in line]


def test_a_second_broker_without_mesh_or_settle_time_says_what_to_set(fresh_database, tmp_path):
    first = start_broker(fresh_database, tmp_path, QUEEN_SERVER_ID="broker-one")
    brokers = [first]
    try:
        assert shared_lines(first.log()) == []  # alone on its database
        second = start_broker(fresh_database, tmp_path, QUEEN_SERVER_ID="broker-two")
        brokers.append(second)
        [line] = shared_lines(second.log())
        assert " WARNING " in line
        assert "(broker-one (127.0.0.1, " in line, line
        assert "this one has no mesh peers and no settle time (FILE_BUFFER_SETTLE_MS=0)" in line
        assert "set FILE_BUFFER_SETTLE_MS (e.g. 2300, DB_CONNECTION_TIMEOUT + 3 x " \
            "FILE_BUFFER_FLUSH_MS) on every broker of this database" in line, line
        assert "set QUEEN_MESH_PEERS to the other brokers' mesh addresses" in line, line

        # A settle time alone: only the mesh is left to set.
        third = start_broker(fresh_database, tmp_path, QUEEN_SERVER_ID="broker-three",
                             FILE_BUFFER_SETTLE_MS="2300")
        brokers.append(third)
        [line] = shared_lines(third.log())
        assert "broker-one (" in line and "broker-two (" in line, line
        assert "this one has no mesh peers:" in line, line
        assert "FILE_BUFFER_SETTLE_MS" not in line, line
    finally:
        stop_brokers(brokers)


def test_a_broker_with_mesh_peers_and_settle_time_says_nothing(fresh_database, tmp_path):
    first = start_broker(fresh_database, tmp_path, QUEEN_SERVER_ID="broker-one")
    try:
        # Peers named (nobody answers there: the mesh's own lines say so), settle time auto.
        second = start_broker(fresh_database, tmp_path, QUEEN_SERVER_ID="broker-two",
                              QUEEN_MESH_PEERS="127.0.0.1:9",
                              QUEEN_MESH_PORT=str(free_port()))
        try:
            assert shared_lines(second.log()) == [], second.log()
        finally:
            second.stop()
    finally:
        first.stop()

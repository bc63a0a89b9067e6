"""A loopback TCP relay between broker processes and PostgreSQL that reads the wire
protocol's framing as it forwards it (nothing is changed or held back), so a test can see
the round trips a broker makes: per connection, every batch of messages the client sent up
to a Sync (extended protocol) or a Query (simple protocol), the statements it executed, and
PostgreSQL's transaction status (ReadyForQuery: I idle, T in a transaction, E failed) before
and after it. A batch whose status is I before and after ran as its own transaction.

Plain TCP only: a connection that negotiates TLS is forwarded but not read.
"""
from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

SSL_REQUEST, GSS_REQUEST = 80877103, 80877104


@dataclass
class RoundTrip:
    executed: list[str]          # SQL text of each statement executed (Execute or Query)
    status_before: str
    status_after: str | None = None


@dataclass
class _Conn:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statements: dict[str, str] = field(default_factory=dict)  # prepared name -> SQL
    portals: dict[str, str] = field(default_factory=dict)     # portal -> SQL
    batch: list[str] = field(default_factory=list)
    pending: list[RoundTrip] = field(default_factory=list)    # sent, not answered yet
    status: str = "I"
    started: bool = False       # client: StartupMessage seen
    one_byte_answers: int = 0   # server: answers to SSL/GSS requests to skip
    opaque: bool = False        # TLS: not read


def _cstr(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(b"\0", at)
    return data[at:end].decode("utf-8", "replace"), end + 1


def _typed(buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The first typed message of ``buf`` (kind, body, the rest), or None while incomplete."""
    if len(buf) < 5:
        return None
    (length,) = struct.unpack("!I", buf[1:5])
    if len(buf) < 1 + length:
        return None
    return buf[:1], buf[5:1 + length], buf[1 + length:]


class PgWireRelay:
    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.trips: list[RoundTrip] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def answered(self) -> list[RoundTrip]:
        with self._lock:
            return [t for t in self.trips if t.status_after is not None]

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            conn = _Conn()
            threading.Thread(target=self._pump, args=(client, server, conn, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, conn, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: _Conn, from_client: bool):
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                buf += data
                buf = self._client(conn, buf) if from_client else self._server(conn, buf)
                dst.sendall(data)  # after reading: the answer cannot overtake the request
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _client(self, conn: _Conn, buf: bytes) -> bytes:
        while not conn.opaque:
            if not conn.started:  # untyped: length, then code
                if len(buf) < 8:
                    return buf
                (length, code) = struct.unpack("!II", buf[:8])
                if len(buf) < length:
                    return buf
                if code in (SSL_REQUEST, GSS_REQUEST):
                    with conn.lock:
                        conn.one_byte_answers += 1
                else:
                    conn.started = True
                buf = buf[length:]
                continue
            message = _typed(buf)
            if message is None:
                return buf
            kind, body, buf = message
            self._client_message(conn, kind, body)
        return b""

    def _client_message(self, conn: _Conn, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, at = _cstr(body, 0)
            sql, _ = _cstr(body, at)
            conn.statements[name] = sql
        elif kind == b"B":
            portal, at = _cstr(body, 0)
            name, _ = _cstr(body, at)
            conn.portals[portal] = conn.statements.get(name, "?")
        elif kind == b"E":
            portal, _ = _cstr(body, 0)
            conn.batch.append(conn.portals.get(portal, "?"))
        elif kind in (b"S", b"Q"):
            if kind == b"Q":
                conn.batch.append(_cstr(body, 0)[0])
            with conn.lock:
                trip = RoundTrip(conn.batch, conn.status)
                conn.pending.append(trip)
            conn.batch = []
            with self._lock:
                self.trips.append(trip)

    def _server(self, conn: _Conn, buf: bytes) -> bytes:
        while not conn.opaque:
            with conn.lock:
                skip = conn.one_byte_answers
            if skip:
                if not buf:
                    return buf
                with conn.lock:
                    conn.one_byte_answers -= 1
                if buf[:1] == b"S":
                    conn.opaque = True  # TLS from here on
                buf = buf[1:]
                continue
            message = _typed(buf)
            if message is None:
                return buf
            kind, body, buf = message
            if kind == b"Z":
                status = body[:1].decode()
                with conn.lock:
                    trip = conn.pending.pop(0) if conn.pending else None  # None: startup
                    conn.status = status
                if trip is not None:
                    with self._lock:
                        trip.status_after = status
        return b""

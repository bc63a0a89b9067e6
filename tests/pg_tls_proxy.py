"""A TLS front for a PostgreSQL built without SSL (the embedded one), for TLS tests.

It speaks the start of PostgreSQL's protocol: a client's SSLRequest is answered ``S`` and the
connection upgraded with the given certificate (server side), a GSSENCRequest is answered
``N``; then bytes are piped, in clear, to the real server. So a client sees a PostgreSQL that
offers TLS with that certificate, and its verification is what is tested. Loopback only; runs
on its own event loop in a thread; counts the TLS sessions it completed and the plain
connections it was offered.
"""
from __future__ import annotations

import asyncio
import ssl
import struct
import threading

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class TLSProxy:
    def __init__(self, upstream_port: int, cert: str, key: str):
        self.upstream_port = upstream_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.tls_sessions = 0
        self.plain_connections = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TLSProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            first = await reader.readexactly(8)
            length, code = struct.unpack("!ii", first)
            if length == 8 and code == GSSENC_REQUEST:
                writer.write(b"N")
                await writer.drain()
                first = await reader.readexactly(8)
                length, code = struct.unpack("!ii", first)
            if length == 8 and code == SSL_REQUEST:
                writer.write(b"S")
                await writer.drain()
                await writer.start_tls(self.context)
                self.tls_sessions += 1
                first = b""
            else:
                self.plain_connections += 1
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # a client that gave up, or refused our certificate
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()

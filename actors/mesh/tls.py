"""Optional mutual TLS for the mesh (QUEEN_MESH_TLS_CERT / _KEY / _CA).

Both ends present a certificate and verify the other's against the mesh CA:
the CA is the mesh's own, so any certificate it signed is a mesh member. Host
names are not checked (peers are often dialled by IP or a compose service
name that the certificate need not list). TLS 1.3 only. The framing inside
TLS is unchanged: HELLO, then sealed frames under the HELLO's key, so the
secret still authenticates the peer and TLS adds confidentiality plus a
second, certificate-based gate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MeshTLS"]


@dataclass(frozen=True)
class MeshTLS:
    cert: Path
    key: Path
    ca: Path

    def _context(self, purpose: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(self.cert, self.key)
        ctx.load_verify_locations(cafile=self.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def server_context(self) -> ssl.SSLContext:
        """For accepted connections: a client certificate signed by the CA is required."""
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    def client_context(self) -> ssl.SSLContext:
        """For dialled connections: the listener's certificate must be signed by the CA."""
        ctx = self._context(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False  # the chain is still verified (CERT_REQUIRED)
        return ctx

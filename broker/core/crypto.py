"""The AES-256-GCM payload envelope (docs/behaviour.md §9).

A payload of an encrypted queue is stored as
``{"encrypted": b64(ciphertext), "iv": b64(iv), "authTag": b64(tag)}``:
a fresh random 16-byte IV per message, a 16-byte tag, no associated data, and
the JSON serialisation of the payload as plaintext. The key is 32 bytes
(QUEEN_ENCRYPTION_KEY, 64 hex characters).
"""
from __future__ import annotations

import base64
import os
from typing import Any

import ujson
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

IV_BYTES = 16
TAG_BYTES = 16
ENVELOPE_KEYS = frozenset(("encrypted", "iv", "authTag"))


class PayloadCipher:
    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ValueError("AES-256 needs a 32-byte key")
        self._aead = AESGCM(key)

    def encrypt(self, payload: Any) -> dict[str, str]:
        iv = os.urandom(IV_BYTES)
        plaintext = ujson.dumps(payload, escape_forward_slashes=False).encode()
        sealed = self._aead.encrypt(iv, plaintext, None)  # ciphertext || tag
        return {
            "encrypted": base64.b64encode(sealed[:-TAG_BYTES]).decode(),
            "iv": base64.b64encode(iv).decode(),
            "authTag": base64.b64encode(sealed[-TAG_BYTES:]).decode(),
        }

    def decrypt(self, stored: Any) -> Any:
        """Return the original payload, or ``stored`` untouched when it is not an
        envelope or does not open with this key (docs/behaviour.md §9: a failure leaves
        it as stored)."""
        if not (isinstance(stored, dict) and ENVELOPE_KEYS <= stored.keys()):
            return stored
        try:
            iv = base64.b64decode(stored["iv"])
            sealed = base64.b64decode(stored["encrypted"]) + base64.b64decode(stored["authTag"])
            return ujson.loads(self._aead.decrypt(iv, sealed, None))
        except Exception:  # wrong key, corrupt envelope: leave it as stored
            return stored

"""JWT authentication and role checks (docs/wire-contract.md §2). Off by default.

``Authenticator.authorize(request)`` runs as the first ``on_request`` hook. It returns None
when the request may proceed (and sets ``request.ctx.producer_sub`` to the token's ``sub``)
or a JSON error response that ends the request:

* ``401 {"error": "Authentication required"}``: no token;
* ``401`` with a descriptive error: malformed token, bad signature, expired / not yet valid,
  wrong issuer or audience, an algorithm that is not configured, unknown ``kid``;
* ``403 {"error": "Insufficient permissions"}``: a valid token whose roles are below the
  level the route requires (``ROUTE_LEVELS``);
* ``500``: the JWKS endpoint cannot be fetched (or serves no usable key).

Never checked: CORS preflight (``OPTIONS``), ``/health``, ``/health/live``,
``/health/ready``, ``/metrics``, ``/metrics/prometheus``, and ``JWT_SKIP_PATHS`` (exact entries; entries ending in ``/`` are
prefixes, except the bare ``/`` which only matches itself).

Signature and claim checks are PyJWT's; this module only chooses the key and the allowed
algorithms:

* ``HS256``: ``JWT_SECRET``, HS256 tokens only;
* ``RS256``: RS256/RS384/RS512 tokens, RSA key from ``JWT_PUBLIC_KEY`` (PEM) or the JWKS;
* ``EdDSA``: EdDSA tokens, Ed25519 key from ``JWT_PUBLIC_KEY`` (PEM) or the JWKS;
* ``auto``: the token header's ``alg`` picks among whichever of the above is configured
  (HS256 only if ``JWT_SECRET`` is set, so a public key is never used as an HMAC secret).

A token with a ``kid`` is verified with the JWKS key of that id when ``JWT_JWKS_URL`` is set
(falling back to ``JWT_PUBLIC_KEY`` when the id is unknown and a PEM key of the right type
is configured); a token without ``kid`` uses the PEM key, or the JWKS's only key of the
right type. The JWKS is fetched lazily through ``jwt.PyJWKClient`` in a worker thread
(never on the event loop), cached for ``JWT_JWKS_REFRESH_INTERVAL`` seconds, and re-fetched when a token names
an unknown ``kid`` (key rotation) -- at most once per ``JWKS_REFRESH_COOLDOWN_S`` so that
tokens with made-up ids cannot hammer the identity provider. A failed periodic refresh
keeps serving the previous keys.
"""
from __future__ import annotations

import asyncio
import re
import time
import warnings
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed448, ed25519, rsa
from loguru import logger

from broker.core.config import ConfigError
from broker.http.responses import error

if TYPE_CHECKING:
    from sanic import Request
    from sanic.response import HTTPResponse

    from broker.core.config import Settings

# -- required levels ------------------------------------------------------------------------

PUBLIC, READ_ONLY, READ_WRITE, ADMIN = 0, 1, 2, 3
LEVEL_NAMES = {PUBLIC: "public", READ_ONLY: "READ_ONLY", READ_WRITE: "READ_WRITE", ADMIN: "ADMIN"}

_ANY = None  # any method
_SEG = r"[^/]+"  # one path segment

# (methods or None for any, path regex matched in full, level). First match wins, so the
# specific rules come before the broad ones. ``HEAD`` is checked as ``GET``. Paths are
# matched without a trailing slash and with runs of ``/`` collapsed.
ROUTE_LEVELS: list[tuple[frozenset[str] | None, str, int]] = [
    # public
    (frozenset({"GET"}), r"/health(/live|/ready)?", PUBLIC),
    (frozenset({"GET"}), r"/metrics(/prometheus)?", PUBLIC),
    (frozenset({"GET"}), r"/(openapi\.json|docs)", PUBLIC),  # the API reference
    # the dashboard's static files hold no data; the page asks for a token for the API
    (frozenset({"GET"}), r"/|/dashboard(/.*)?", PUBLIC),
    # answers "who is this token" itself, also without one (the page asks before it has one)
    (frozenset({"GET"}), r"/api/v1/auth/session", PUBLIC),
    # the identity the reference web dashboard boots from (answers 401 itself with auth on)
    (frozenset({"GET"}), r"/auth/(me|login)", PUBLIC),
    (frozenset({"POST"}), r"/auth/logout", PUBLIC),
    # ADMIN
    (_ANY, r"/api/v1/system(/.*)?", ADMIN),
    (_ANY, r"/internal(/.*)?", ADMIN),
    (_ANY, r"/api/v1/migration(/.*)?", ADMIN),
    (frozenset({"DELETE"}), rf"/api/v1/resources/queues/{_SEG}", ADMIN),
    (frozenset({"DELETE"}), rf"/api/v1/consumer-groups/{_SEG}(/queues/{_SEG})?", ADMIN),
    (frozenset({"POST"}), r"/api/v1/stats/refresh", ADMIN),
    # READ_WRITE: the data path and the state-changing operator routes
    (frozenset({"POST"}), r"/api/v1/push", READ_WRITE),
    (frozenset({"GET"}), r"/api/v1/pop(/.*)?", READ_WRITE),
    (frozenset({"GET"}), r"/api/v1/ephemeral/pop", READ_WRITE),  # a GET that takes messages
    (frozenset({"POST"}), r"/api/v1/ack(/batch)?", READ_WRITE),
    (frozenset({"POST"}), r"/api/v1/transaction", READ_WRITE),
    (frozenset({"POST"}), r"/streams/v1/state/get", READ_ONLY),
    (frozenset({"POST"}), r"/streams/v1/(queries|cycle)", READ_WRITE),
    (frozenset({"DELETE"}), rf"/streams/v1/queries/{_SEG}", READ_WRITE),
    (frozenset({"POST"}), rf"/api/v1/lease/{_SEG}/extend", READ_WRITE),
    (frozenset({"POST"}), r"/api/v1/configure", READ_WRITE),
    (frozenset({"POST"}), rf"/api/v1/consumer-groups/{_SEG}/subscription", READ_WRITE),
    (frozenset({"POST"}),
     rf"/api/v1/consumer-groups/{_SEG}/queues/{_SEG}(/partitions/{_SEG})?/seek", READ_WRITE),
    (frozenset({"POST"}), r"/api/v1/traces", READ_WRITE),
    (frozenset({"DELETE"}), rf"/api/v1/messages/{_SEG}/{_SEG}", READ_WRITE),
    (frozenset({"POST"}), rf"/api/v1/messages/{_SEG}/{_SEG}/(retry|dlq)", READ_WRITE),
    # the state surfaces: a batch that writes is held to READ_WRITE by its route
    # (``writes_allowed``), since one POST carries reads and writes alike
    (frozenset({"POST"}), r"/api/v1/(fetch|partitions/changed|kv|locks)", READ_ONLY),
    (frozenset({"GET"}), r"/api/v1/(kv|timers)/.*", READ_ONLY),
    (frozenset({"PUT", "DELETE"}), r"/api/v1/kv/.*", READ_WRITE),
    (frozenset({"POST"}), r"/api/v1/timers", READ_WRITE),
    (frozenset({"DELETE"}), r"/api/v1/timers/.*", READ_WRITE),
    # READ_ONLY: reads of the operator API (the key listing is a POST: its cursor is a key)
    (frozenset({"POST"}), r"/api/v1/resources/kv/list", READ_ONLY),
    (frozenset({"GET"}), r"/api/v1/(resources|analytics|traces)/.*", READ_ONLY),
    (frozenset({"GET"}), r"/api/v1/(status|messages|consumer-groups)(/.*)?", READ_ONLY),
    (frozenset({"GET"}), r"/api/v1/dlq", READ_ONLY),
    (frozenset({"GET"}), r"/streams/v1/queries", READ_ONLY),
    (frozenset({"GET"}), r"/api/v1/(live|browse)/.*", READ_ONLY),
]
# Paths in no rule (unknown or future routes; they mostly answer 404 after the check):
# reads need READ_ONLY, anything else READ_WRITE. A valid token is always required there.
UNKNOWN_READ_LEVEL = READ_ONLY
UNKNOWN_WRITE_LEVEL = READ_WRITE

_COMPILED = [(methods, re.compile(pattern), level) for methods, pattern, level in ROUTE_LEVELS]

ALWAYS_PUBLIC = frozenset({"/health", "/health/live", "/health/ready", "/metrics",
                           "/metrics/prometheus"})


def _normalise(path: str) -> str:
    path = re.sub(r"/{2,}", "/", path)
    return path.rstrip("/") or "/"


def _level_of(method: str, path: str) -> int:
    for methods, pattern, level in _COMPILED:
        if (methods is None or method in methods) and pattern.fullmatch(path):
            return level
    return UNKNOWN_READ_LEVEL if method == "GET" else UNKNOWN_WRITE_LEVEL


def required_level(method: str, path: str) -> int:
    """The level ``method path`` needs. The raw and the percent-decoded path are both
    classified and the stricter answer wins, so an encoded path cannot dodge a rule."""
    method = "GET" if method.upper() == "HEAD" else method.upper()
    raw = _normalise(path)
    decoded = _normalise(unquote(path))
    return max(_level_of(method, raw), _level_of(method, decoded))


# -- token verification ---------------------------------------------------------------------

RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512"})
EDDSA_ALGORITHMS = frozenset({"EdDSA"})
HMAC_ALGORITHMS = frozenset({"HS256"})

JWKS_REFRESH_COOLDOWN_S = 1.0  # least time between two JWKS fetches

_CLAIM_ERRORS: list[tuple[type[Exception], str]] = [
    (jwt.ExpiredSignatureError, "Token expired"),
    (jwt.ImmatureSignatureError, "Token not yet valid"),
    (jwt.InvalidSignatureError, "Invalid token signature"),
    (jwt.InvalidIssuerError, "Invalid token issuer"),
    (jwt.InvalidAudienceError, "Invalid token audience"),
]


class AuthFailure(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _family(alg: str) -> str:
    return "RSA" if alg in RSA_ALGORITHMS else "OKP"


def _key_family(key: Any) -> str | None:
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        return "RSA"
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey,
                        ed448.Ed448PublicKey, ed448.Ed448PrivateKey)):
        return "OKP"
    return None


def _public(key: Any) -> Any:
    """A private key (a JWK with ``d``) verifies through its public half."""
    return key.public_key() if hasattr(key, "public_key") else key


def load_public_key(pem: str) -> Any:
    """An RSA or Ed25519 public key from PEM (a public key or a certificate). Literal
    ``\\n`` sequences, common when the PEM comes through an environment variable, are
    accepted. Raises ConfigError without echoing the value."""
    data = pem.strip().replace("\\n", "\n").encode()
    key: Any
    try:
        if b"BEGIN CERTIFICATE" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"JWT_PUBLIC_KEY is not a PEM public key or certificate ({exc})") \
            from None
    if _key_family(key) is None:
        raise ConfigError(f"JWT_PUBLIC_KEY must be an RSA or Ed25519 key, got "
                          f"{type(key).__name__}")
    return key


class _Jwks:
    """The JWKS endpoint's signing keys by ``kid``; fetched off the event loop."""

    def __init__(self, url: str, lifespan_s: float, timeout_s: float):
        # PyJWKClient does the HTTP and the JWK parsing; the caching is ours so that a
        # cache hit never leaves the event loop.
        self.lifespan_s = lifespan_s  # JWT_JWKS_REFRESH_INTERVAL
        try:
            self.client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=timeout_s)
        except jwt.PyJWTError as exc:
            raise ConfigError(f"JWT_JWKS_URL {url!r} is not usable: {exc}") from None
        self.url = url
        self.keys: dict[str, jwt.PyJWK] = {}
        self.unnamed: list[jwt.PyJWK] = []
        self.fetched_at: float | None = None  # monotonic time of the last successful fetch
        self.attempted_at: float | None = None
        self.last_error = ""
        self.lock = asyncio.Lock()

    def _fresh(self) -> bool:
        return self.fetched_at is not None and time.monotonic() - self.fetched_at < self.lifespan_s

    def _cooling_down(self) -> bool:
        return (self.attempted_at is not None
                and time.monotonic() - self.attempted_at < JWKS_REFRESH_COOLDOWN_S)

    async def _fetch(self) -> None:
        self.attempted_at = time.monotonic()
        try:
            jwk_set = await asyncio.to_thread(self.client.get_jwk_set, True)
        except jwt.PyJWTError as exc:
            self.last_error = f"JWKS fetch failed: {exc}"
            raise AuthFailure(500, self.last_error) from None
        keys, unnamed = {}, []
        for key in jwk_set.keys:
            if key.public_key_use not in (None, "sig"):
                continue
            if key.key_id:
                keys[key.key_id] = key
            else:
                unnamed.append(key)
        self.keys, self.unnamed = keys, unnamed
        self.fetched_at = time.monotonic()
        logger.info("JWKS: {} signing key(s) from {}", len(keys) + len(unnamed), self.url)

    async def _ensure(self) -> None:
        """Fetch when never fetched or past the lifespan; a failed periodic refresh keeps
        the previous keys (and is retried after the cooldown)."""
        if self._fresh():
            return
        async with self.lock:
            if self._fresh():
                return
            if self.fetched_at is None:
                if self._cooling_down() and self.last_error:
                    raise AuthFailure(500, self.last_error)  # do not retry on every request
                await self._fetch()
            elif not self._cooling_down():
                try:
                    await self._fetch()
                except AuthFailure as exc:
                    logger.warning("{}; keeping the previous keys", exc.message)

    async def find(self, kid: str | None, family: str) -> jwt.PyJWK | None:
        """The key for ``kid`` (re-fetching once on an unknown id), or for a token without
        ``kid`` the only key of ``family``; None when there is none."""
        await self._ensure()
        if kid is None:
            matching = [k for k in [*self.keys.values(), *self.unnamed]
                        if _key_family(k.key) == family]
            return matching[0] if len(matching) == 1 else None
        if kid in self.keys:
            return self.keys[kid]
        async with self.lock:  # unknown kid: the keys may have been rotated
            if kid not in self.keys and not self._cooling_down():
                await self._fetch()
        return self.keys.get(kid)


class Authenticator:
    """``authorize(request)`` returns None when the request may proceed, or an
    HTTP response (401/403/500) that ends it. Sets ``request.ctx.producer_sub``."""

    def __init__(self, settings: Settings):
        self.enabled = settings.jwt_enabled
        if not self.enabled:
            return
        self.algorithm = settings.jwt_algorithm
        self.secret = settings.jwt_secret or ""
        self.issuer = settings.jwt_issuer or None
        self.audience = settings.jwt_audience or None
        self.leeway = settings.jwt_clock_skew
        self.roles_claim = settings.jwt_roles_claim
        self.roles_array_claim = settings.jwt_roles_array_claim
        self.role_levels = {
            settings.jwt_role_read_only: READ_ONLY,
            settings.jwt_role_read_write: READ_WRITE,
            settings.jwt_role_admin: ADMIN,  # last: wins if an operator reuses a name
        }
        self.skip_exact = set(ALWAYS_PUBLIC)
        self.skip_prefixes: list[str] = []
        for entry in settings.jwt_skip_paths:
            if entry.endswith("/") and entry != "/":
                self.skip_prefixes.append(entry)
            else:
                self.skip_exact.add(entry)

        self.pem_keys: dict[str, Any] = {}  # family -> public key
        if settings.jwt_public_key and self.algorithm != "HS256":
            key = load_public_key(settings.jwt_public_key)
            family = _key_family(key)
            wanted = {"RS256": "RSA", "EdDSA": "OKP"}.get(self.algorithm)
            if wanted is not None and family != wanted:
                raise ConfigError(f"JWT_ALGORITHM={self.algorithm} needs "
                                  f"{'an RSA' if wanted == 'RSA' else 'an Ed25519'} "
                                  f"JWT_PUBLIC_KEY")
            if family is None:
                raise ConfigError("JWT_PUBLIC_KEY must be an RSA or Ed25519 public key")
            self.pem_keys[family] = key
        self.jwks = (_Jwks(settings.jwt_jwks_url, settings.jwt_jwks_refresh_interval,
                           settings.jwt_jwks_timeout_ms / 1000)
                     if settings.jwt_jwks_url and self.algorithm != "HS256" else None)

        allowed: set[str] = set()
        if self.algorithm in ("HS256", "auto") and self.secret:
            allowed |= HMAC_ALGORITHMS
        if self.algorithm in ("RS256", "auto") and (self.jwks or "RSA" in self.pem_keys):
            allowed |= RSA_ALGORITHMS
        if self.algorithm in ("EdDSA", "auto") and (self.jwks or "OKP" in self.pem_keys):
            allowed |= EDDSA_ALGORITHMS
        self.allowed = frozenset(allowed)

        if HMAC_ALGORITHMS & self.allowed and len(self.secret.encode()) < 32:
            logger.warning("JWT_SECRET is shorter than 32 bytes; use a longer HS256 secret")
        # PyJWT would otherwise warn on every verification with a short secret.
        warnings.filterwarnings("ignore", category=jwt.InsecureKeyLengthWarning)
        logger.info("JWT auth on: algorithm={} accepts {}", self.algorithm,
                    ",".join(sorted(self.allowed)) or "nothing")

    # -- request hook --------------------------------------------------------------------

    def skipped(self, path: str) -> bool:
        return path in self.skip_exact or any(path.startswith(p) for p in self.skip_prefixes)

    async def authorize(self, request: Request[Any, Any]) -> HTTPResponse | None:
        request.ctx.producer_sub = None
        request.ctx.auth_level = ADMIN  # auth off (or a skipped path): anything goes
        if not self.enabled or request.method == "OPTIONS" or self.skipped(request.path):
            return None
        level = required_level(request.method, request.path)
        if level == PUBLIC:
            return None
        try:
            token = self.token_of(request.headers.get("authorization"))
            claims = await self.verify(token)
        except AuthFailure as failure:
            if failure.status >= 500:
                logger.error("auth: {} {}: {}", request.method, request.path, failure.message)
            else:
                logger.debug("auth: {} {}: {}", request.method, request.path, failure.message)
            return error(failure.message, failure.status)
        # The token is valid: its claims are known (the access log's subject), whatever
        # its role turns out to allow.
        request.ctx.jwt_claims = claims
        request.ctx.auth_level = self.level_of(claims)
        if request.ctx.auth_level < level:
            logger.debug("auth: {} {} needs {}", request.method, request.path,
                         LEVEL_NAMES[level])
            return error("Insufficient permissions", 403)
        sub = claims.get("sub")
        request.ctx.producer_sub = None if sub is None else str(sub)
        return None

    @staticmethod
    def token_of(header: str | None) -> str:
        token = (header or "").strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        elif token.lower() == "bearer":
            token = ""
        if not token:
            raise AuthFailure(401, "Authentication required")
        return token

    async def verify(self, token: str) -> dict:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise AuthFailure(401, f"Malformed token: {exc}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.allowed:
            raise AuthFailure(401, f"Token algorithm {alg!r} is not accepted "
                                   f"(JWT_ALGORITHM={self.algorithm})")
        key = self.secret if alg in HMAC_ALGORITHMS else await self.public_key(alg, header)
        try:
            claims = jwt.decode(
                token, key, algorithms=[alg], leeway=self.leeway,
                issuer=self.issuer, audience=self.audience,
                options={"verify_aud": self.audience is not None},
            )
        except jwt.PyJWTError as exc:
            for kind, message in _CLAIM_ERRORS:
                if isinstance(exc, kind):
                    raise AuthFailure(401, message) from None
            raise AuthFailure(401, f"Invalid token: {exc}") from None
        if not isinstance(claims, dict):
            raise AuthFailure(401, "Invalid token: claims are not a JSON object")
        return claims

    async def public_key(self, alg: str, header: dict) -> Any:
        family = _family(alg)
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthFailure(401, "Invalid token: kid must be a string")
        pem = self.pem_keys.get(family)
        if self.jwks is not None and (kid is not None or pem is None):
            jwk = await self.jwks.find(kid, family)
            if jwk is not None:
                declared = getattr(jwk, "_jwk_data", {}).get("alg")
                if declared and declared != alg:
                    raise AuthFailure(401, f"Token algorithm {alg} does not match key "
                                           f"{kid!r} ({declared})")
                if _key_family(jwk.key) != family:
                    raise AuthFailure(401, f"Key {kid!r} cannot verify {alg} tokens")
                return _public(jwk.key)
            if pem is None:
                if kid is None:
                    raise AuthFailure(401, "Token has no kid and the JWKS has no single "
                                           f"key for {alg}")
                raise AuthFailure(401, f"Unknown token key id (kid) {kid!r}")
        if pem is None:
            raise AuthFailure(401, f"No key configured for {alg} tokens")
        return pem

    # -- roles ---------------------------------------------------------------------------

    @staticmethod
    def _claim(claims: dict, name: str) -> Any:
        """A claim by name, or by dotted path (``realm_access.roles``) when no claim has
        the literal name."""
        if not name:
            return None
        if name in claims:
            return claims[name]
        value: Any = claims
        for part in name.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    def level_of(self, claims: dict) -> int:
        roles: list[str] = []
        for name in (self.roles_claim, self.roles_array_claim):
            value = self._claim(claims, name)
            if isinstance(value, str):
                roles.append(value)
            elif isinstance(value, list):
                roles.extend(v for v in value if isinstance(v, str))
        return max((self.role_levels.get(r, PUBLIC) for r in roles), default=PUBLIC)


def writes_allowed(request: Request[Any, Any]) -> bool:
    """Whether the caller may write: for a route whose one POST carries reads and
    writes alike (the key/value and lock batches), checked once the body is parsed."""
    return getattr(request.ctx, "auth_level", ADMIN) >= READ_WRITE

"""JWT authentication and role checks (docs/wire-contract.md §2) against real broker processes.

One broker per configuration, shared by the tests of this module:

* ``hs_broker``: HS256 with JWT_ISSUER and JWT_AUDIENCE set (roles, failures, producerSub);
* ``rs_pem_broker``: RS256 with a PEM public key (RS256/384/512, algorithm confusion);
* ``jwks_broker``: RS256 with keys from a JWKS served by a local HTTP server (kid lookup,
  rotation on unknown kid, fetch failure -> 500);
* ``auto_broker``: ``auto`` with an HMAC secret and an Ed25519 PEM key (EdDSA, HS256);
* the shared ``broker`` of conftest (auth off).

Tokens are minted with PyJWT; keys are generated with ``cryptography`` per test session.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import RSAAlgorithm

from broker.http.auth import JWKS_REFRESH_COOLDOWN_S

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cret-for-tests-" + "x" * 32
ISSUER = "queen-tests"
AUDIENCE = "queen-broker"


# -- keys and tokens -------------------------------------------------------------------------

def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(private) -> str:
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def token(key=SECRET, alg="HS256", *, sub: str | None = "user-1", role: str | None = None,
          roles: list[str] | None = None, iss: str | None = ISSUER, aud: str | None = AUDIENCE,
          exp_in: float | None = 300, kid: str | None = None, **claims) -> str:
    now = int(time.time())
    payload: dict = {"iat": now, **claims}
    for name, value in (("sub", sub), ("role", role), ("roles", roles), ("iss", iss),
                        ("aud", aud)):
        if value is not None:
            payload[name] = value
    if exp_in is not None:
        payload["exp"] = now + int(exp_in)
    headers = {"kid": kid} if kid else None
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


# Made when the module is imported, at collection, which can be many minutes before these
# tests run in a long suite on a loaded machine: a day's lifetime, not the default 5 minutes.
DAY = 24 * 3600
RO, RW, ADMIN = (token(role="read-only", exp_in=DAY),
                 token(role="read-write", sub="writer-7", exp_in=DAY),
                 token(role="admin", sub="root", exp_in=DAY))


def qname() -> str:
    return f"test-auth-{uuid.uuid4().hex[:10]}"


def push_body(queue: str, *items: dict) -> dict:
    return {"items": [{"queue": queue, "partition": "Default", **item} for item in items]}


def pop_all(client: httpx.Client, queue: str, headers: dict) -> dict:
    r = client.get(f"/api/v1/pop/queue/{queue}", params={"batch": 10, "wait": "false"},
                   headers=headers)
    assert r.status_code in (200, 204), (r.status_code, r.text)
    return r.json() if r.status_code == 200 else {"messages": []}


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hs_broker(module_broker_factory):
    return module_broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="HS256", JWT_SECRET=SECRET,
                          JWT_ISSUER=ISSUER, JWT_AUDIENCE=AUDIENCE)


@pytest.fixture
def hs(hs_broker):
    with httpx.Client(base_url=hs_broker.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def rsa_keys():
    return {"pem": rsa_key(), "k1": rsa_key(), "k2": rsa_key(), "k3": rsa_key(),
            "other": rsa_key()}


@pytest.fixture(scope="module")
def rs_pem_broker(module_broker_factory, rsa_keys):
    return module_broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="RS256",
                          JWT_PUBLIC_KEY=public_pem(rsa_keys["pem"]))


class JwksServer:
    """A JWKS endpoint on 127.0.0.1 whose key set (or failure) the test controls."""

    def __init__(self):
        self.keys: list[dict] = []
        self.fail = False
        self.hits = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # the name http.server calls
                server.hits += 1
                if server.fail:
                    self.send_response(503)
                    self.end_headers()
                    return
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, **keys) -> None:
        self.keys = []
        for kid, private in keys.items():
            jwk = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
            self.keys.append({**jwk, "kid": kid, "use": "sig"})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def jwks(rsa_keys):
    server = JwksServer()
    server.publish(k1=rsa_keys["k1"])
    yield server
    server.close()


@pytest.fixture(scope="module")
def jwks_broker(module_broker_factory, jwks):
    return module_broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="RS256", JWT_JWKS_URL=jwks.url)


@pytest.fixture(scope="module")
def ed_key():
    return ed25519.Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def auto_broker(module_broker_factory, ed_key):
    return module_broker_factory(JWT_ENABLED="true", JWT_ALGORITHM="auto", JWT_SECRET=SECRET,
                          JWT_PUBLIC_KEY=public_pem(ed_key), JWT_ROLES_CLAIM="scope",
                          JWT_ROLES_ARRAY_CLAIM="groups", JWT_ROLE_READ_WRITE="writer")


# -- auth off --------------------------------------------------------------------------------

def test_auth_off_everything_open_and_no_producer_sub(http):
    """JWT_ENABLED=false: no token needed anywhere, and a client-supplied producerSub is
    still not stored."""
    q = qname()
    assert http.get("/api/v1/resources/queues").status_code == 200
    r = http.post("/api/v1/push", json=push_body(q, {"payload": 1, "producerSub": "evil"}))
    assert r.status_code in (200, 201), r.text
    msgs = pop_all(http, q, {})["messages"]
    assert [m["producerSub"] for m in msgs] == [None]


# -- public paths, missing and malformed tokens ----------------------------------------------

def test_public_paths_and_preflight_need_no_token(hs):
    assert hs.get("/health").status_code == 200
    # The machines' checks: a load balancer or a kubelet has no token.
    assert hs.get("/health/live").json()["status"] == "live"
    assert hs.get("/health/ready").json()["status"] == "ready"
    for path in ("/metrics", "/metrics/prometheus"):
        assert hs.get(path).status_code not in (401, 403), path
    r = hs.options("/api/v1/push", headers={"Origin": "http://x",
                                            "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    # "/" is a skip path, matched exactly only
    assert hs.get("/").status_code not in (401, 403)
    assert hs.get("/api/v1/resources/queues").status_code == 401


def test_reference_identity_with_auth_on_is_401_and_says_why(hs):
    """With tokens required there is no browser session to describe: /auth/me is 401
    auth_required (the reference web dashboard then goes to /auth/login), and that page
    explains instead of redirecting back (no loop)."""
    me = hs.get("/auth/me")
    assert me.status_code == 401
    assert me.json() == {"error": "auth_required", "code": "auth_required"}
    login = hs.get("/auth/login", follow_redirects=False)
    assert login.status_code == 200 and "text/html" in login.headers["content-type"]
    assert "JWT_ENABLED" in login.text


@pytest.mark.parametrize("header", [None, "", "Bearer", "bearer"])
def test_missing_token_is_401(hs, header):
    headers = {} if header is None else {"Authorization": header}
    for method, path in (("GET", "/api/v1/resources/queues"), ("POST", "/api/v1/push"),
                         ("GET", "/api/v1/pop/queue/x"), ("DELETE", "/api/v1/resources/queues/x"),
                         ("GET", "/api/v1/no-such-route")):
        r = hs.request(method, path, headers=headers, json={"items": []})
        assert r.status_code == 401, (method, path, r.text)
        assert r.json() == {"error": "Authentication required"}


@pytest.mark.parametrize("scheme", ["Bearer ", "bearer ", "BEARER ", "bEaReR ", ""])
def test_bearer_prefix_is_case_insensitive_and_optional(hs, scheme):
    r = hs.get("/api/v1/resources/queues", headers={"Authorization": scheme + RO})
    assert r.status_code == 200, r.text


def test_bad_tokens_are_401_with_a_reason(hs):
    forged = token(key="not-the-secret-" + "y" * 32, role="admin")
    cases = {
        "signature": forged,
        "expired": token(role="admin", exp_in=-3600),
        "not yet valid": token(role="admin", nbf=int(time.time()) + 3600),
        "issuer": token(role="admin", iss="someone-else"),
        "no issuer": token(role="admin", iss=None),
        "audience": token(role="admin", aud="other-service"),
        "no audience": token(role="admin", aud=None),
        "malformed": "not.a.jwt",
        "garbage": "hello",
        "alg none": jwt.encode({"sub": "x", "role": "admin", "iss": ISSUER, "aud": AUDIENCE},
                               None, algorithm="none"),
        "tampered": RO.rsplit(".", 2)[0] + "." + jwt.utils.base64url_encode(json.dumps(
            {"sub": "x", "role": "admin", "iss": ISSUER, "aud": AUDIENCE}).encode()).decode()
        + "." + RO.rsplit(".", 1)[1],
    }
    errors = {}
    for name, tok in cases.items():
        r = hs.get("/api/v1/resources/queues", headers=auth(tok))
        assert r.status_code == 401, (name, r.text)
        errors[name] = r.json()["error"]
        assert errors[name] and errors[name] != "Authentication required", name
    assert "expired" in errors["expired"].lower()
    assert "signature" in errors["signature"].lower()
    assert "issuer" in errors["issuer"].lower()
    assert "audience" in errors["audience"].lower()


def test_clock_skew_is_tolerated(hs):
    """JWT_CLOCK_SKEW (default 30 s): a token expired 5 s ago or valid in 5 s still passes."""
    now = int(time.time())
    for tok in (token(role="read-only", exp_in=-5), token(role="read-only", nbf=now + 5)):
        assert hs.get("/api/v1/resources/queues", headers=auth(tok)).status_code == 200


# -- roles -----------------------------------------------------------------------------------

def test_read_only_can_read_but_not_write(hs):
    q = qname()
    assert hs.get("/api/v1/resources/queues", headers=auth(RO)).status_code == 200
    assert hs.get("/api/v1/resources/queues/x", headers=auth(RO)).status_code != 403
    denied = [
        ("POST", "/api/v1/push", push_body(q, {"payload": 1})),
        ("GET", f"/api/v1/pop/queue/{q}", None),
        ("GET", "/api/v1/pop", None),
        ("POST", "/api/v1/ack", {"transactionId": "t", "partitionId": str(uuid.uuid4())}),
        ("POST", "/api/v1/ack/batch", {"acknowledgments": []}),
        ("POST", "/api/v1/transaction", {"operations": []}),
        ("POST", "/api/v1/configure", {"queue": q}),
        ("POST", f"/api/v1/lease/{uuid.uuid4()}/extend", {}),
        ("POST", "/api/v1/consumer-groups/g/queues/q/seek", {}),
        ("DELETE", f"/api/v1/messages/{uuid.uuid4()}/t", None),
        ("POST", f"/api/v1/messages/{uuid.uuid4()}/t/retry", None),
        ("POST", "/api/v1/no-such-route", None),
        ("GET", "/api/v1/system/maintenance", None),
    ]
    for method, path, body in denied:
        r = hs.request(method, path, headers=auth(RO), json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert r.json() == {"error": "Insufficient permissions"}


def test_read_write_can_push_pop_ack_but_not_admin(hs):
    q = qname()
    r = hs.post("/api/v1/push", headers=auth(RW), json=push_body(q, {"payload": {"n": 1},
                                                                       "transactionId": "t1"}))
    assert r.status_code in (200, 201), r.text
    assert r.json()[0]["status"] == "queued"
    popped = pop_all(hs, q, auth(RW))
    (msg,) = popped["messages"]
    assert msg["data"] == {"n": 1}
    r = hs.post("/api/v1/ack", headers=auth(RW), json={
        "transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
        "leaseId": msg["leaseId"], "status": "completed"})
    assert r.status_code == 200 and r.json()[0]["success"] is True, r.text
    assert hs.get("/api/v1/resources/queues", headers=auth(RW)).status_code == 200

    for method, path, body in [
        ("DELETE", f"/api/v1/resources/queues/{q}", None),
        ("DELETE", f"/api/v1/resources/queues/{q}/", None),  # trailing slash: same rule
        ("DELETE", "/api/v1/consumer-groups/g", None),
        ("DELETE", "/api/v1/consumer-groups/g/queues/q", None),
        ("POST", "/api/v1/system/maintenance/pop", {"enabled": False}),
        ("POST", "/api/v1/system/maintenance", {"enabled": False}),
        ("GET", "/api/v1/system/shared-state", None),
        ("GET", "/api/v1/%73ystem/shared-state", None),  # percent-encoded: still ADMIN
        ("POST", "/api/v1/stats/refresh", None),
        ("GET", "/internal/anything", None),
        ("POST", "/api/v1/migration/start", None),
    ]:
        r = hs.request(method, path, headers=auth(RW), json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert r.json() == {"error": "Insufficient permissions"}


def test_admin_can_do_everything(hs):
    q = qname()
    r = hs.post("/api/v1/push", headers=auth(ADMIN), json=push_body(q, {"payload": 1}))
    assert r.status_code in (200, 201), r.text
    assert hs.get("/api/v1/resources/queues", headers=auth(ADMIN)).status_code == 200
    r = hs.post("/api/v1/system/maintenance/pop", headers=auth(ADMIN), json={"enabled": False})
    assert r.status_code == 200 and r.json()["popMaintenanceMode"] is False, r.text
    assert hs.get("/api/v1/system/shared-state", headers=auth(ADMIN)).status_code == 200
    r = hs.delete(f"/api/v1/resources/queues/{q}", headers=auth(ADMIN))
    assert r.status_code == 200, r.text


def test_roles_array_claim_and_unknown_roles(hs):
    q = qname()
    rw_by_array = token(roles=["something-else", "read-write"])
    r = hs.post("/api/v1/push", headers=auth(rw_by_array), json=push_body(q, {"payload": 1}))
    assert r.status_code in (200, 201), r.text
    admin_by_array = token(role="read-only", roles=["admin"])
    assert hs.get("/api/v1/system/shared-state",
                  headers=auth(admin_by_array)).status_code == 200
    for tok in (token(), token(role="superuser"), token(roles=["guest"]), token(role="Admin")):
        r = hs.get("/api/v1/resources/queues", headers=auth(tok))
        assert r.status_code == 403, r.text
        assert r.json() == {"error": "Insufficient permissions"}


# -- producerSub -----------------------------------------------------------------------------

def test_producer_sub_is_stamped_from_sub_and_client_value_ignored(hs):
    q = qname()
    r = hs.post("/api/v1/push", headers=auth(RW), json=push_body(
        q, {"payload": 1, "producerSub": "evil"}, {"payload": 2}))
    assert r.status_code in (200, 201), r.text
    r = hs.post("/api/v1/transaction", headers=auth(ADMIN), json={"operations": [
        {"type": "push", "items": [{"queue": q, "partition": "Default", "payload": 3,
                                    "producerSub": "evil"}]}]})
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    no_sub = token(role="read-write", sub=None)
    r = hs.post("/api/v1/push", headers=auth(no_sub), json=push_body(
        q, {"payload": 4, "producerSub": "evil"}))
    assert r.status_code in (200, 201), r.text
    msgs = pop_all(hs, q, auth(RW))["messages"]
    assert [(m["data"], m["producerSub"]) for m in msgs] == [
        (1, "writer-7"), (2, "writer-7"), (3, "root"), (4, None)]


# -- RS256 with a PEM public key -------------------------------------------------------------

def test_rs256_pem_accepts_rs256_384_512(rs_pem_broker, rsa_keys):
    with httpx.Client(base_url=rs_pem_broker.url, timeout=30) as c:
        for alg in ("RS256", "RS384", "RS512"):
            tok = token(rsa_keys["pem"], alg, role="read-only", iss=None, aud=None)
            r = c.get("/api/v1/resources/queues", headers=auth(tok))
            assert r.status_code == 200, (alg, r.text)
        q = qname()
        tok = token(rsa_keys["pem"], "RS512", role="read-write", sub="rsa-user")
        r = c.post("/api/v1/push", headers=auth(tok), json=push_body(q, {"payload": 1}))
        assert r.status_code in (200, 201), r.text
        assert [m["producerSub"] for m in pop_all(c, q, auth(tok))["messages"]] == ["rsa-user"]


def test_rs256_pem_rejects_other_keys_and_algorithms(rs_pem_broker, rsa_keys):
    pem = public_pem(rsa_keys["pem"])
    # HS256 keyed with the public key text (algorithm confusion) must not verify
    b64 = lambda obj: jwt.utils.base64url_encode(json.dumps(obj).encode()).decode()  # noqa: E731
    signing_input = (b64({"alg": "HS256", "typ": "JWT"}) + "."
                     + b64({"sub": "x", "role": "admin", "exp": int(time.time()) + 60}))
    sig = hmac.new(pem.encode(), signing_input.encode(), hashlib.sha256).digest()
    forged_hs = f"{signing_input}.{jwt.utils.base64url_encode(sig).decode()}"
    with httpx.Client(base_url=rs_pem_broker.url, timeout=30) as c:
        for tok in (token(rsa_keys["other"], "RS256", role="admin"), forged_hs,
                    token(SECRET, "HS256", role="admin")):
            r = c.get("/api/v1/resources/queues", headers=auth(tok))
            assert r.status_code == 401, r.text
        assert c.get("/api/v1/resources/queues").json() == {"error": "Authentication required"}


# -- RS256 via JWKS --------------------------------------------------------------------------

def test_jwks_kid_lookup_rotation_and_fetch_failure(jwks_broker, jwks, rsa_keys):
    k1, k2, k3 = rsa_keys["k1"], rsa_keys["k2"], rsa_keys["k3"]
    with httpx.Client(base_url=jwks_broker.url, timeout=30) as c:
        def status(tok):
            return c.get("/api/v1/resources/queues", headers=auth(tok)).status_code

        tok1 = token(k1, "RS256", kid="k1", role="read-only", iss=None, aud=None)
        assert status(tok1) == 200
        assert status(token(k1, "RS384", kid="k1", role="read-only")) == 200
        hits = jwks.hits
        assert hits >= 1
        for _ in range(3):  # cached: no fetch per request
            assert status(tok1) == 200
        assert jwks.hits == hits

        # right kid, wrong key -> bad signature; unknown kid -> 401
        r = c.get("/api/v1/resources/queues",
                  headers=auth(token(k2, "RS256", kid="k1", role="read-only")))
        assert r.status_code == 401 and "signature" in r.json()["error"].lower(), r.text
        tok2 = token(k2, "RS256", kid="k2", role="read-write", sub="jwks-user")
        time.sleep(JWKS_REFRESH_COOLDOWN_S + 0.2)
        r = c.get("/api/v1/resources/queues", headers=auth(tok2))
        assert r.status_code == 401 and "kid" in r.json()["error"].lower(), r.text
        assert jwks.hits == hits + 1  # the unknown kid triggered one refresh
        # a burst of unknown kids inside the cooldown does not hammer the endpoint
        for n in range(5):
            assert status(token(k3, "RS256", kid=f"junk{n}", role="admin")) == 401
        assert jwks.hits == hits + 1

        # rotation: the endpoint now serves k2 only; an unknown kid refreshes the set
        jwks.publish(k2=k2)
        time.sleep(JWKS_REFRESH_COOLDOWN_S + 0.2)
        q = qname()
        r = c.post("/api/v1/push", headers=auth(tok2), json=push_body(q, {"payload": 1}))
        assert r.status_code in (200, 201), r.text
        assert [m["producerSub"] for m in pop_all(c, q, auth(tok2))["messages"]] == ["jwks-user"]
        assert status(tok1) == 401  # k1 was rotated out

        # fetch failure: an unknown kid needs a refresh, which fails -> 500; cached keys work
        jwks.fail = True
        time.sleep(JWKS_REFRESH_COOLDOWN_S + 0.2)
        r = c.get("/api/v1/resources/queues",
                  headers=auth(token(k3, "RS256", kid="k3", role="read-only")))
        assert r.status_code == 500 and "jwks" in r.json()["error"].lower(), r.text
        assert status(tok2) == 200
        jwks.fail = False


# -- auto: HS256 + EdDSA, custom role claims -------------------------------------------------

def test_auto_picks_by_alg_hs256_and_eddsa(auto_broker, ed_key, rsa_keys):
    with httpx.Client(base_url=auto_broker.url, timeout=30) as c:
        q = qname()
        ed = token(ed_key, "EdDSA", scope="writer", sub="ed-user", iss=None, aud=None)
        hs = token(SECRET, "HS256", groups=["writer"], sub="hs-user", iss=None, aud=None)
        for tok in (ed, hs):
            r = c.post("/api/v1/push", headers=auth(tok), json=push_body(q, {"payload": 1}))
            assert r.status_code in (200, 201), r.text
        assert [m["producerSub"] for m in pop_all(c, q, auth(hs))["messages"]] == [
            "ed-user", "hs-user"]
        # the default claim names/values mean nothing here
        r = c.post("/api/v1/push", headers=auth(token(SECRET, role="read-write")),
                   json=push_body(q, {"payload": 1}))
        assert r.status_code == 403, r.text
        # RS256 is not configured (no RSA key): rejected with a reason
        r = c.get("/api/v1/resources/queues",
                  headers=auth(token(rsa_keys["other"], "RS256", scope="admin")))
        assert r.status_code == 401 and "RS256" in r.json()["error"], r.text
        other_ed = ed25519.Ed25519PrivateKey.generate()
        r = c.get("/api/v1/resources/queues",
                  headers=auth(token(other_ed, "EdDSA", scope="admin")))
        assert r.status_code == 401, r.text


# -- the official client ---------------------------------------------------------------------

async def test_official_client_with_bearer_token(hs_broker):
    from queen import Queen

    q = qname()
    client = Queen(hs_broker.url, bearer_token=token(role="read-write", sub="client-sub"))
    try:
        results = await client.queue(q).push([{"data": {"hello": "world"}}])
        assert [r["status"] for r in results] == ["queued"], results
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            msgs = await client.queue(q).batch(10).wait(False).pop()
        assert "Pop failed" not in out.getvalue(), out.getvalue()
        assert [(m["data"], m["producerSub"]) for m in msgs] == [({"hello": "world"},
                                                                   "client-sub")]
        res = await client.ack(msgs, True)
        assert res["success"] is True, res
    finally:
        with contextlib.redirect_stdout(io.StringIO()):
            await client.close()

"""Throw-away certificates for TLS tests (the mesh's, PostgreSQL's): a CA, certificates it
signed for localhost / 127.0.0.1, and a rogue CA with a certificate of its own
(cryptography's x509 builder)."""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, key, signer_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                signer_key.public_key()), False))


def _write(path: Path, cert: x509.Certificate, key=None) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))


def make_ca(directory: Path, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(name, _name(name), key, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(directory / name, cert)
    return key, cert


def issue(directory: Path, ca, name: str) -> dict[str, str]:
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(name, ca_cert.subject, key, ca_key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    _write(directory / name, cert, key)
    return {"cert": str(directory / f"{name}.crt"), "key": str(directory / f"{name}.key")}


def make_pki(directory: Path) -> dict[str, dict[str, str]]:
    """{"ca": path, "a"/"b": {cert, key} signed by it, "rogue": {cert, key} of another CA}."""
    directory.mkdir(parents=True, exist_ok=True)
    mesh_ca = make_ca(directory, "mesh-ca")
    rogue_ca = make_ca(directory, "rogue-ca")
    return {"ca": str(directory / "mesh-ca.crt"), "a": issue(directory, mesh_ca, "broker-a"),
            "b": issue(directory, mesh_ca, "broker-b"),
            "rogue": issue(directory, rogue_ca, "rogue")}


def tls_env(pki: dict, who: str) -> dict[str, str]:
    return {"QUEEN_MESH_TLS_CERT": pki[who]["cert"], "QUEEN_MESH_TLS_KEY": pki[who]["key"],
            "QUEEN_MESH_TLS_CA": pki["ca"]}

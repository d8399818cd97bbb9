"""TLS material for a data plane whose workers are not known in advance (Spark's executors).

A Spark runtime asked to encrypt (Spark's own encryption settings are on)
serves its Flight data plane over ``grpc+tls://`` with one self-signed
certificate of its own, made here on the driver and handed to the executors
with the token, in Spark's task closures::

    driver                                      executor Python worker
      self_signed_tls() -> TlsMaterial ──────>   FlightWorker(tls_cert_chain, tls_private_key)
      (certificate + key, one per runtime)       serves grpc+tls://<executor ip>:<port>
      clients: tls_root_certs = certificate,     clients: the same roots and name
               override_hostname = TLS_NAME

The executors' addresses are known only when their workers start, so the
certificate names no address: it is issued to :data:`TLS_NAME`, and every
client checks the peer's certificate against that name
(``override_hostname``) and this certificate as its only root. A peer must
hold the runtime's key to be trusted, as it must hold the token to be
answered. ``cryptography`` (a dependency of ``distfusion[spark]``) is
imported only when a certificate is made.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

__all__ = ["TLS_NAME", "TlsMaterial", "self_signed_tls"]

TLS_NAME = "distfusion-data-plane"
"""The name a runtime's self-signed certificate is issued to, checked by its clients."""


@dataclass(frozen=True)
class TlsMaterial:
    """A certificate, its private key (both PEM) and the name clients check.

    Attributes:
        cert_pem: the PEM certificate workers present; clients' only root.
        key_pem: the PEM private key of ``cert_pem`` (unencrypted).
        hostname: the name in the certificate, which clients verify instead of
            the address they connect to.
    """

    cert_pem: bytes
    key_pem: bytes
    hostname: str = TLS_NAME

    def __repr__(self) -> str:  # never print the key
        return f"TlsMaterial(hostname={self.hostname!r})"


def self_signed_tls(valid_days: int = 30, hostname: str = TLS_NAME) -> TlsMaterial:
    """A fresh self-signed certificate (ECDSA P-256, SHA-256) for ``hostname``.

    Made in ~20 ms. Valid from five minutes ago (clock skew between machines)
    for ``valid_days`` days: longer than a runtime lives.

    Raises:
        ImportError: ``cryptography`` is not installed; says what to install.
    """
    try:  # optional dependency
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:
        msg = (
            "an encrypted data plane needs the cryptography package: "
            "pip install 'distfusion[spark]' (or pip install cryptography)"
        )
        raise ImportError(msg) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return TlsMaterial(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        hostname,
    )

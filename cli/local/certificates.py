"""The local certificate authority of `rmq up --tls`: a CA, a server certificate, tls.properties.

Theory of operation. A local cluster needs a certificate its clients can check without any
setup beyond "trust this CA": :func:`ensure_local_tls` makes (once per data directory) a CA and
a server certificate it signs, for the cluster's host, ``127.0.0.1``, ``::1`` and
``localhost``, and writes the tls.properties every node is started with (RocketMQ's keys,
common/tls.py): permissive mode, so plain 4.x clients keep working, and ``tls.enable`` so the
brokers' own connections to the nameserver use TLS.

The CA survives restarts of the cluster (a client told to trust it keeps working); the server
certificate is made again when it no longer names the host or is about to expire. Keys are
ECDSA P-256 in PKCS#8 PEM (what Python's ssl, grpcio's BoringSSL and Java's Netty all read),
written owner-readable only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

import attrs

__all__ = ["LocalTls", "ensure_local_tls", "tls_dir"]

# how long the certificates are valid; the server one is renewed with less than a week left
CA_DAYS = 3650
SERVER_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=7)


@attrs.frozen
class LocalTls:
    """Where `rmq up --tls` keeps its files (all in ``<data-dir>/tls``)."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def properties(self) -> Path:
        """The tls.properties every node is started with (``--tls-config``)."""
        return self.directory / "tls.properties"


def tls_dir(data_dir: Path) -> LocalTls:
    return LocalTls((data_dir / "tls").absolute())


def _names(host: str) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) the server certificate names."""
    dns = ["localhost"]
    ips = ["127.0.0.1", "::1"]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host not in dns:
            dns.append(host)
    else:
        if host not in ips:
            ips.append(host)
    return dns, ips


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ensure_local_tls(data_dir: Path, host: str = "127.0.0.1") -> LocalTls:
    """The CA, server certificate and tls.properties of the cluster in ``data_dir``, made
    if missing (or, for the server certificate, stale); see the module docstring."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    files = tls_dir(data_dir)
    files.directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()

    if files.ca_cert.exists() and files.ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        loaded = serialization.load_pem_private_key(files.ca_key.read_bytes(), None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{files.ca_key}: not the EC key `rmq up --tls` makes")
        ca_key = loaded
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trio-rmq"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"trio-rmq local CA ({data_dir.name})"),
            ]
        )
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(files.ca_key, ca_key.private_bytes(pem, pkcs8, plain))
        files.ca_cert.write_bytes(ca_cert.public_bytes(pem))
        # a new CA invalidates any server certificate an older one signed
        files.server_cert.unlink(missing_ok=True)

    dns, ips = _names(host)
    if not _server_cert_fresh(files, ca_cert, dns, ips, now):
        key = ec.generate_private_key(ec.SECP256R1())
        alt = x509.SubjectAlternativeName(
            [
                *(x509.DNSName(d) for d in dns),
                *(x509.IPAddress(ipaddress.ip_address(i)) for i in ips),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(alt, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(files.server_key, key.private_bytes(pem, pkcs8, plain))
        files.server_cert.write_bytes(cert.public_bytes(pem))

    files.properties.write_text(
        "# written by `rmq up --tls` (RocketMQ's tls.properties keys; common/tls.py)\n"
        "tls.server.mode=permissive\n"
        f"tls.server.certPath={files.server_cert}\n"
        f"tls.server.keyPath={files.server_key}\n"
        "tls.enable=true\n"
        f"tls.client.trustCertPath={files.ca_cert}\n"
    )
    return files


def _server_cert_fresh(
    files: LocalTls,
    ca_cert: object,
    dns: list[str],
    ips: list[str],
    now: datetime.datetime,
) -> bool:
    """Whether the server certificate on disk was signed by ``ca_cert``, names every one of
    ``dns`` and ``ips`` and is not about to expire."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    if not (files.server_cert.exists() and files.server_key.exists()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    if not isinstance(ca_cert, x509.Certificate):
        return False
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    named_dns = set(alt.get_values_for_type(x509.DNSName))
    named_ips = {str(a) for a in alt.get_values_for_type(x509.IPAddress)}
    if not set(dns) <= named_dns or not {str(ipaddress.ip_address(i)) for i in ips} <= named_ips:
        return False
    return cert.not_valid_after_utc - now > RENEW_BEFORE

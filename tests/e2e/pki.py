"""Throw-away certificates for the end-to-end control plane and the webhook under test.

One CA signs the kube-apiserver's serving certificate and the webhook's serving certificate, so
the kubeconfig and the WebhookConfigurations' caBundle carry the same PEM. The service-account key
pair is separate (it signs tokens, not TLS). Everything is ECDSA P-256: fast to generate, accepted
by Go's crypto/tls and by kube-apiserver's --service-account-key-file.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=1)
# Backdated so a clock a little behind on the apiserver side never sees "not yet valid".
BACKDATE = datetime.timedelta(minutes=5)
LOOPBACK_NAMES = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1",)


@dataclass(frozen=True)
class IssuedPair:
    """A certificate and its key, in PEM, plus where they were written."""

    cert_pem: bytes
    key_pem: bytes
    cert_path: Path
    key_path: Path


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def _key_pem(key: PrivateKey) -> bytes:
    # RSA keys as PKCS#1 ("RSA PRIVATE KEY"): the form open-policy-agent's cert-controller parses back.
    form = serialization.PrivateFormat.TraditionalOpenSSL if isinstance(key, rsa.RSAPrivateKey) \
        else serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def _write(directory: Path, stem: str, cert: x509.Certificate, key: PrivateKey) -> IssuedPair:
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _key_pem(key)
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    key_path.chmod(0o600)
    return IssuedPair(cert_pem, key_pem, cert_path, key_path)


class CertificateAuthority:
    """A self-signed CA that issues loopback serving certificates."""

    def __init__(self, directory: Path, *, name: str = "topoguard-e2e-ca",
                 validity: datetime.timedelta = VALIDITY, dns_names: Sequence[str] = (), rsa_key: bool = False) -> None:
        """dns_names: SANs on the CA certificate itself (an operator's cert rotator that finds a CA in its
        Secret keeps it only if it verifies for the rotator's CA name); validity also bounds what it issues;
        rsa_key: an RSA CA key (that rotator parses the CA key as PKCS#1 RSA only)."""
        self._dir = directory
        self._key: PrivateKey = (rsa.generate_private_key(public_exponent=65537, key_size=2048) if rsa_key
                                 else ec.generate_private_key(ec.SECP256R1()))
        self._validity = validity
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + validity)
        )
        if dns_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        self._cert = (
            builder
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pair = _write(directory, "ca", self._cert, self._key)

    @property
    def cert_pem(self) -> bytes:
        return self.pair.cert_pem

    def issue_serving(self, stem: str, *, common_name: str, dns_names: Sequence[str] = ()) -> IssuedPair:
        """A server certificate valid for localhost and 127.0.0.1 (SANs; Go ignores the CN), plus dns_names
        (e.g. the in-cluster Service name an operator's own cert rotator checks for)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in (*LOOPBACK_NAMES, *dns_names)]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOOPBACK_IPS]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + self._validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        return _write(self._dir, stem, cert, key)


def write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The key pair kube-apiserver signs (private) and verifies (public) service-account tokens with."""
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(_key_pem(key))
    private.chmod(0o600)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public

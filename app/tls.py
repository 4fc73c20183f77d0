"""Serving certificates: load from files (reloaded when they change), or self-sign in memory.

Owns the server `ssl.SSLContext`: TLS 1.2 minimum (ECDHE + AEAD suites only), ALPN `http/1.1`
only (the apiserver's webhook client pins HTTP/1.1, kubernetes/kubernetes#82090; never offering h2 also keeps the HTTP/2
rapid-reset class, CVE-2023-44487, off the table), optional client-certificate verification.
Must not import app.metrics (import-linter "independence"): callers read `not_after` and export it.

Rotation without restart: cert-manager and kubelet-projected Secrets replace the files in place
(an atomic `..data` symlink swap). `CertificateFiles.reload_if_changed()` polls (mtime, inode, size)
and calls `load_cert_chain` again on the SAME live context. OpenSSL copies the certificate from the
SSL_CTX into each SSL object when a connection is created, so established connections keep the old
certificate and every new handshake uses the new one (approach suggested in tornadoweb/tornado#2895;
uvicorn accepts a ready context by setting `Config.ssl` after `Config.load()`, Kludex/uvicorn#806).
A half-written pair (cert and key from different generations) fails `load_cert_chain`; the old
certificate stays and the next poll retries.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger(__name__)

SELF_SIGNED_VALIDITY_DAYS = 365
DEFAULT_SERVICE_NAME = "topoguard"
DEFAULT_NAMESPACE = "topoguard"
SERVICE_NAME_ENV = "TOPOGUARD_SERVICE_NAME"
NAMESPACE_ENV = "TOPOGUARD_NAMESPACE"
# OpenSSL cipher string for TLS 1.2: ECDHE key exchange with AES-GCM or ChaCha20-Poly1305, for ECDSA
# and RSA certificates (research/perf-rel-sec.md S1; Mozilla's "intermediate" TLS 1.2 list minus DHE).
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL"


class TLSConfigError(ValueError):
    """The certificate, key or client CA cannot be used."""


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate (chain) and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes


def service_dns_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names the apiserver may use to reach the webhook Service (`<svc>.<ns>.svc` and friends)."""
    env = os.environ if environ is None else environ
    svc = env.get(SERVICE_NAME_ENV) or DEFAULT_SERVICE_NAME
    ns = env.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    return [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]


def generate_self_signed(
    dns_names: list[str] | None = None,
    *,
    ip_addresses: tuple[str, ...] = ("127.0.0.1", "::1"),
    validity_days: int = SELF_SIGNED_VALIDITY_DAYS,
    now: datetime.datetime | None = None,
) -> KeyPair:
    """A self-signed ECDSA P-256 serving certificate.

    ECDSA rather than RSA: a P-256 signature costs ~28 µs against ~380 µs for RSA-2048 per full
    handshake (research/perf-rel-sec.md A.6). SANs: localhost, the loopback IPs and the service
    names (`service_dns_names()` when `dns_names` is None).
    """
    names = ["localhost", *(service_dns_names() if dns_names is None else dns_names)]
    names = list(dict.fromkeys(names))  # dedupe, keep order
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)  # clock skew
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[1] if len(names) > 1 else names[0])])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=validity_days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def _leaf(cert_pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise TLSConfigError(f"not a PEM certificate: {e}") from e


def certificate_not_after(cert_pem: bytes) -> float:
    """The leaf certificate's notAfter as a Unix timestamp (the first certificate of a chain)."""
    return _leaf(cert_pem).not_valid_after_utc.timestamp()


def certificate_serial(cert_pem: bytes) -> str:
    """The leaf certificate's serial number, in hex (as `openssl x509 -serial` prints it)."""
    return f"{_leaf(cert_pem).serial_number:X}"


def new_server_context(*, client_ca: str | None = None) -> ssl.SSLContext:
    """An empty server context with topoguard's protocol policy (no certificate loaded yet)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # TLS 1.2: forward secrecy and AEAD only (no CBC, no RSA key exchange, no SHA-1 MACs).
    # set_ciphers() configures TLS 1.2 and below only; TLS 1.3's suites (all AEAD) stay as they are.
    ctx.set_ciphers(TLS12_CIPHERS)
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"client CA {client_ca}: {e}") from e
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@contextlib.contextmanager
def _pem_paths(pair: KeyPair) -> Iterator[tuple[str, str]]:
    """Paths `load_cert_chain` can read `pair` from (it takes no in-memory PEM).

    Anonymous memory files (memfd, Linux) where available: the private key never touches a disk and
    a read-only root filesystem is no obstacle. Elsewhere a private temporary directory, removed at once.
    """
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fds = [os.memfd_create("topoguard-tls.crt"), os.memfd_create("topoguard-tls.key")]
        try:
            for fd, data in zip(fds, (pair.cert_pem, pair.key_pem), strict=True):
                os.write(fd, data)
            yield (f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="topoguard-tls-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(pair.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(pair.key_pem)
        yield (str(cert), str(key))


def _load_pair(ctx: ssl.SSLContext, pair: KeyPair, *, source: str) -> None:
    """Load `pair` into `ctx`, first proving it on a scratch context.

    NB: a failed `load_cert_chain` on the live context could leave it with the new certificate and
    no usable key (OpenSSL drops a private key that does not match a newly set certificate), so the
    pair is validated on a throwaway context first, from the same bytes.
    """
    with _pem_paths(pair) as (cert, key):
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile=cert, keyfile=key)
            ctx.load_cert_chain(certfile=cert, keyfile=key)
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"{source}: {e}") from e


def self_signed_context(pair: KeyPair, *, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context serving `pair` (the PEMs never touch a disk where memfd exists)."""
    ctx = new_server_context(client_ca=client_ca)
    _load_pair(ctx, pair, source="self-signed certificate")
    return ctx


def _stamp(path: Path) -> tuple[int, int, int]:
    # stat() follows symlinks, so a kubelet `..data` swap changes the inode we see.
    st = path.stat()
    return (st.st_mtime_ns, st.st_ino, st.st_size)


class CertificateFiles:
    """A certificate + key on disk, served through one live SSLContext that follows file changes."""

    def __init__(self, cert: str | Path, key: str | Path, *, client_ca: str | None = None) -> None:
        self.cert_path = Path(cert)
        self.key_path = Path(key)
        self.context = new_server_context(client_ca=client_ca)
        self.reloads = 0
        self._stamps, pair = self._read()
        _load_pair(self.context, pair, source=self._source)
        self.not_after = certificate_not_after(pair.cert_pem)
        self.serial = certificate_serial(pair.cert_pem)

    @property
    def _source(self) -> str:
        return f"certificate {self.cert_path} / key {self.key_path}"

    def _read(self) -> tuple[tuple[tuple[int, int, int], tuple[int, int, int]], KeyPair]:
        try:
            stamps = (_stamp(self.cert_path), _stamp(self.key_path))
            pair = KeyPair(cert_pem=self.cert_path.read_bytes(), key_pem=self.key_path.read_bytes())
        except OSError as e:
            raise TLSConfigError(f"{self._source}: {e}") from e
        return stamps, pair

    def reload_if_changed(self) -> bool:
        """Load the files again if either changed since the last good load. True when reloaded.

        Never raises: a missing, unreadable or mismatched pair is logged and the current certificate
        stays; the stamps are recorded only after a good load, so the next poll retries.
        """
        try:
            stamps = (_stamp(self.cert_path), _stamp(self.key_path))
            if stamps == self._stamps:
                return False
            stamps, pair = self._read()
            not_after = certificate_not_after(pair.cert_pem)
            serial = certificate_serial(pair.cert_pem)
            _load_pair(self.context, pair, source=self._source)
        except (OSError, TLSConfigError) as e:
            log.warning("certificate reload failed, keeping the current certificate", extra={"error": str(e)})
            return False
        self._stamps = stamps
        self.not_after = not_after
        self.serial = serial
        self.reloads += 1
        log.info("certificate reloaded", extra={"cert": str(self.cert_path), "not_after": not_after,
                                                "serial": serial})
        return True

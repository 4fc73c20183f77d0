"""app.tls: self-signed certificates, the server context policy, and reload-on-change.

Handshakes here run in memory (ssl.MemoryBIO pairs): real OpenSSL, no sockets.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from app import tls


def handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, *, server_name: str = "localhost"
) -> ssl.SSLObject:
    """Run a TLS handshake between two contexts through memory BIOs; returns the client side."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=server_name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client), ("server", server)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return client
    raise AssertionError("handshake did not finish")


def trusting(pair: tls.KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pair.cert_pem.decode())


def peer_serial(client: ssl.SSLObject) -> int:
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def write_pair(directory: Path, pair: tls.KeyPair) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    return cert, key


@pytest.fixture(scope="module")
def pair() -> tls.KeyPair:
    # Module scope: generating keys is not what most tests here are about.
    return tls.generate_self_signed(["topoguard.ns.svc"])


@pytest.fixture(scope="module")
def other_pair() -> tls.KeyPair:
    return tls.generate_self_signed(["rotated.ns.svc"])  # another subject: both can sit in one trust store


def test_self_signed_is_ecdsa_p256_with_loopback_and_service_sans(pair: tls.KeyPair) -> None:
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost", "topoguard.ns.svc"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]


@pytest.mark.parametrize(
    "environ, want",
    [
        pytest.param({}, ["topoguard", "topoguard.topoguard", "topoguard.topoguard.svc",
                          "topoguard.topoguard.svc.cluster.local"], id="defaults name the topoguard service"),
        pytest.param({"TOPOGUARD_SERVICE_NAME": "tg", "TOPOGUARD_NAMESPACE": "infra"},
                     ["tg", "tg.infra", "tg.infra.svc", "tg.infra.svc.cluster.local"], id="env names the service"),
    ],
)
def test_service_dns_names(environ: dict[str, str], want: list[str]) -> None:
    assert tls.service_dns_names(environ) == want


def test_certificate_not_after_reads_the_leaf() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    pair = tls.generate_self_signed(["a"], validity_days=10, now=now)
    want = now - datetime.timedelta(minutes=5) + datetime.timedelta(days=10)
    assert tls.certificate_not_after(pair.cert_pem) == want.timestamp()


def test_certificate_not_after_rejects_garbage() -> None:
    with pytest.raises(tls.TLSConfigError, match="not a PEM certificate"):
        tls.certificate_not_after(b"hello")


def test_server_context_refuses_tls_1_1_and_offers_only_http_1_1(pair: tls.KeyPair) -> None:
    ctx = tls.self_signed_context(pair)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    client_ctx = trusting(pair)
    client_ctx.set_alpn_protocols(["h2", "http/1.1"])
    client = handshake(ctx, client_ctx)
    assert client.selected_alpn_protocol() == "http/1.1"


def test_server_context_offers_only_aead_suites_with_forward_secrecy_under_tls_1_2(pair: tls.KeyPair) -> None:
    suites = {c["name"]: c for c in tls.self_signed_context(pair).get_ciphers()}
    tls12 = [c for c in suites.values() if c["protocol"] == "TLSv1.2"]
    assert tls12, "TLS 1.2 must still be offered"
    assert all(c["aead"] and c["kea"] == "kx-ecdhe" for c in tls12), sorted(suites)
    assert {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
            "ECDHE-ECDSA-CHACHA20-POLY1305"} <= suites.keys()
    assert {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"} <= suites.keys()


def test_client_ca_requires_a_client_certificate(pair: tls.KeyPair, tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(pair.cert_pem)
    ctx = tls.self_signed_context(pair, client_ca=str(ca_file))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ssl.SSLError, match="PEER_DID_NOT_RETURN_A_CERTIFICATE"):
        handshake(ctx, trusting(pair))


def test_unreadable_client_ca_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(tls.TLSConfigError, match="client CA"):
        tls.new_server_context(client_ca=str(tmp_path / "missing.crt"))


def test_certificate_files_reload_new_pair_for_new_handshakes(
    pair: tls.KeyPair, other_pair: tls.KeyPair, tmp_path: Path
) -> None:
    cert, key = write_pair(tmp_path, pair)
    files = tls.CertificateFiles(cert, key)
    client_ctx = ssl.create_default_context(cadata=pair.cert_pem.decode() + other_pair.cert_pem.decode())
    first = peer_serial(handshake(files.context, client_ctx))
    assert files.reload_if_changed() is False  # nothing changed yet
    # Rotate the way kubelet does: new files, then an atomic rename over the old paths.
    staging = tmp_path / "staging"
    staging.mkdir()
    new_cert, new_key = write_pair(staging, other_pair)
    os.replace(new_key, key)
    os.replace(new_cert, cert)
    assert files.reload_if_changed() is True
    second = peer_serial(handshake(files.context, client_ctx))
    assert first == x509.load_pem_x509_certificate(pair.cert_pem).serial_number
    assert second == x509.load_pem_x509_certificate(other_pair.cert_pem).serial_number
    assert files.reloads == 1


def test_half_written_pair_keeps_serving_the_old_certificate(
    pair: tls.KeyPair, other_pair: tls.KeyPair, tmp_path: Path
) -> None:
    cert, key = write_pair(tmp_path, pair)
    files = tls.CertificateFiles(cert, key)
    cert.write_bytes(other_pair.cert_pem)  # the key still belongs to `pair`
    assert files.reload_if_changed() is False
    client = handshake(files.context, trusting(pair))
    assert peer_serial(client) == x509.load_pem_x509_certificate(pair.cert_pem).serial_number
    key.write_bytes(other_pair.key_pem)  # the writer finishes: the next poll picks the pair up
    assert files.reload_if_changed() is True
    assert peer_serial(handshake(files.context, trusting(other_pair))) == (
        x509.load_pem_x509_certificate(other_pair.cert_pem).serial_number
    )


@pytest.mark.parametrize(
    "cert_text, key_text, match",
    [
        pytest.param(None, "key", "No such file", id="missing certificate file is a config error"),
        pytest.param(b"not pem", b"not pem", "certificate", id="garbage files are a config error"),
    ],
)
def test_bad_certificate_files_are_config_errors(
    tmp_path: Path, cert_text: bytes | None, key_text: bytes | str, match: str
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    if cert_text is not None:
        cert.write_bytes(cert_text)
    key.write_bytes(key_text if isinstance(key_text, bytes) else key_text.encode())
    with pytest.raises(tls.TLSConfigError, match=match):
        tls.CertificateFiles(cert, key)


def test_deleted_files_keep_the_current_certificate(pair: tls.KeyPair, tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, pair)
    files = tls.CertificateFiles(cert, key)
    cert.unlink()
    assert files.reload_if_changed() is False
    assert peer_serial(handshake(files.context, trusting(pair))) == (
        x509.load_pem_x509_certificate(pair.cert_pem).serial_number
    )


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")
def test_loading_needs_no_writable_temp_dir(
    pair: tls.KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only root filesystem (the chart's default) must not stop the server from loading its key."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "does-not-exist"))
    client = handshake(tls.self_signed_context(pair), trusting(pair))
    assert peer_serial(client) == x509.load_pem_x509_certificate(pair.cert_pem).serial_number

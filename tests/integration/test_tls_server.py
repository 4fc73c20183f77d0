"""TLS of the real server: protocol floor, ALPN, client certificates, rotation without restart."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client.parser import text_string_to_metric_families

from app.cache.files import build_snapshot
from app.cache.store import StaticStore
from app.config import Settings
from app.http.app import create_app
from app.tls import CertificateFiles, KeyPair, generate_self_signed, self_signed_context
from tests.integration.conftest import RunningServer, client_context

ROTATION_WAIT_SECONDS = 20.0


def client_certificate(common_name: str) -> KeyPair:
    """A self-signed client certificate (extended key usage clientAuth), its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
    )


def tls_connect(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return ctx.wrap_socket(raw, server_hostname="localhost")
    except BaseException:
        raw.close()
        raise


def serial_of(pair: KeyPair) -> int:
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


def peer_serial(port: int, ctx: ssl.SSLContext) -> int:
    with tls_connect(port, ctx) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def ask_health(conn: ssl.SSLSocket) -> tuple[int, bool]:
    """GET /healthz on a kept-alive connection: (status, whether the answer says `Connection: close`)."""
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        chunk = conn.recv(4096)
        assert chunk, f"closed mid-answer: {answer!r}"
        answer += chunk
    head = answer.split(b"\r\n\r\n")[0].lower()
    return int(head.split()[1]), b"\r\nconnection: close" in head


@pytest.fixture(scope="module")
def server(serve: Callable[..., RunningServer]) -> RunningServer:
    return serve(create_app(Settings(), StaticStore(build_snapshot([]))))


def tls_1_1_client() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1_1 is deprecated: that is the point
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 only offers TLS 1.1 at security level 0
    return ctx


def memory_handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> str | None:
    """Handshake two contexts through memory BIOs; the negotiated protocol version."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out)
    srv = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    pending = [client, srv]
    for _ in range(20):
        for side in list(pending):
            try:
                side.do_handshake()
                pending.remove(side)
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if not pending:
            return client.version()
    raise AssertionError("handshake did not finish")


def test_tls_1_1_is_refused_by_the_server(server: RunningServer, server_pair: KeyPair, tmp_path: Path) -> None:
    # Control: the client really can speak TLS 1.1 to a server that allows it.
    permissive = self_signed_context(server_pair)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    assert memory_handshake(permissive, tls_1_1_client()) == "TLSv1.1"
    # Ours refuses it (a protocol_version alert, or the connection closed mid-handshake) ...
    with pytest.raises(ssl.SSLError) as refused:
        tls_connect(server.port, tls_1_1_client()).close()
    assert refused.value.reason in ("TLSV1_ALERT_PROTOCOL_VERSION", "UNEXPECTED_EOF_WHILE_READING")
    # ... and keeps serving TLS 1.2+.
    assert peer_serial(server.port, client_context(server_pair)) == serial_of(server_pair)


@pytest.mark.parametrize(
    "version", [pytest.param(ssl.TLSVersion.TLSv1_2, id="TLS 1.2 accepted"),
                pytest.param(ssl.TLSVersion.TLSv1_3, id="TLS 1.3 accepted")],
)
def test_tls_1_2_and_1_3_are_accepted(server: RunningServer, server_pair: KeyPair, version: ssl.TLSVersion) -> None:
    ctx = client_context(server_pair)
    ctx.minimum_version = ctx.maximum_version = version
    with tls_connect(server.port, ctx) as conn:
        assert conn.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]


def tls_1_2_client(server_pair: KeyPair, ciphers: str) -> ssl.SSLContext:
    ctx = client_context(server_pair)
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    return ctx


@pytest.mark.parametrize(
    "suite",
    [pytest.param("ECDHE-ECDSA-AES128-SHA", id="CBC with SHA-1"),
     pytest.param("ECDHE-ECDSA-AES256-SHA384", id="CBC with SHA-384"),
     pytest.param("ECDHE-ECDSA-AES128-SHA256", id="CBC with SHA-256")],
)
def test_tls_1_2_refuses_cbc_suites(server: RunningServer, server_pair: KeyPair, suite: str) -> None:
    # Control: the same client completes the handshake with a server that still allows the suite.
    permissive = self_signed_context(server_pair)
    permissive.set_ciphers("ALL")
    assert memory_handshake(permissive, tls_1_2_client(server_pair, suite)) == "TLSv1.2"
    with pytest.raises(ssl.SSLError) as refused:
        tls_connect(server.port, tls_1_2_client(server_pair, suite)).close()
    assert refused.value.reason in ("SSLV3_ALERT_HANDSHAKE_FAILURE", "NO_SHARED_CIPHER", "UNEXPECTED_EOF_WHILE_READING")


@pytest.mark.parametrize(
    "suite",
    [pytest.param("ECDHE-ECDSA-AES128-GCM-SHA256", id="AES-128-GCM"),
     pytest.param("ECDHE-ECDSA-AES256-GCM-SHA384", id="AES-256-GCM"),
     pytest.param("ECDHE-ECDSA-CHACHA20-POLY1305", id="ChaCha20-Poly1305")],
)
def test_tls_1_2_accepts_aead_suites(server: RunningServer, server_pair: KeyPair, suite: str) -> None:
    with tls_connect(server.port, tls_1_2_client(server_pair, suite)) as conn:
        cipher = conn.cipher()
        assert conn.version() == "TLSv1.2"
        assert cipher is not None and cipher[0] == suite


def test_tls_1_3_suites_are_unchanged(server: RunningServer, server_pair: KeyPair) -> None:
    ctx = client_context(server_pair)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with tls_connect(server.port, ctx) as conn:
        cipher = conn.cipher()
        assert cipher is not None and cipher[0] in {"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256",
                                                    "TLS_CHACHA20_POLY1305_SHA256"}


@pytest.mark.parametrize(
    "offered, want",
    [
        pytest.param(["h2", "http/1.1"], "http/1.1", id="h2 and http1.1 offered: http1.1 chosen"),
        pytest.param(["h2"], None, id="only h2 offered: no protocol chosen, never h2"),
    ],
)
def test_alpn_never_selects_h2(
    server: RunningServer, server_pair: KeyPair, offered: list[str], want: str | None
) -> None:
    ctx = client_context(server_pair)
    ctx.set_alpn_protocols(offered)
    with tls_connect(server.port, ctx) as conn:
        assert conn.selected_alpn_protocol() == want


def test_client_certificate_required_when_client_ca_is_set(
    serve: Callable[..., RunningServer], server_pair: KeyPair, tmp_path: Path
) -> None:
    client_pair = client_certificate("kube-apiserver")
    ca = tmp_path / "client-ca.crt"
    ca.write_bytes(client_pair.cert_pem)
    server = serve(create_app(Settings(), StaticStore(build_snapshot([]))),
                   self_signed_context(server_pair, client_ca=str(ca)))
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_bytes(client_pair.cert_pem)
    key.write_bytes(client_pair.key_pem)
    with_cert = client_context(server_pair)
    with_cert.load_cert_chain(str(cert), str(key))
    with httpx.Client(base_url=server.url, verify=with_cert) as c:
        assert c.get("/healthz").status_code == 200
    with pytest.raises(httpx.HTTPError), httpx.Client(base_url=server.url, verify=client_context(server_pair)) as c:
        c.get("/healthz")


def test_rotated_certificate_files_are_served_without_restart(
    serve: Callable[..., RunningServer], server_pair: KeyPair, tmp_path: Path
) -> None:
    first, second = generate_self_signed(["first.test.svc"]), generate_self_signed(["second.test.svc"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    files = CertificateFiles(cert, key)
    server = serve(create_app(Settings(), StaticStore(build_snapshot([])), certificates=files, cert_poll_seconds=0.05),
                   files.context)
    trust_both = ssl.create_default_context(cadata=first.cert_pem.decode() + second.cert_pem.decode())
    assert peer_serial(server.port, trust_both) == serial_of(first)
    idle = tls_connect(server.port, trust_both)  # handshaked with the first certificate, then left idle
    busy = tls_connect(server.port, trust_both)  # the same, but used all along (never idle for a second)
    assert ask_health(busy) == (200, False)
    # Rotate as kubelet does for a Secret volume: write elsewhere, then rename over the served paths.
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "tls.key").write_bytes(second.key_pem)
    (staging / "tls.crt").write_bytes(second.cert_pem)
    os.replace(staging / "tls.key", key)
    os.replace(staging / "tls.crt", cert)
    deadline = time.monotonic() + ROTATION_WAIT_SECONDS
    closing = False
    while peer_serial(server.port, trust_both) != serial_of(second):
        assert time.monotonic() < deadline, "the new certificate was never served"
        if not closing:
            status, closing = ask_health(busy)
            assert status == 200
        time.sleep(0.05)
    assert server.thread.is_alive()
    # The connections made with the first certificate are recycled, so clients handshake again: each is
    # closed by its next answer, the busy one as the one that was left idle meanwhile (never while idle).
    while not closing:
        assert time.monotonic() < deadline, "the busy connection was never recycled"
        status, closing = ask_health(busy)
        assert status == 200
        time.sleep(0.05)
    assert busy.recv(1) == b""
    assert ask_health(idle) == (200, True)
    assert idle.recv(1) == b""
    busy.close()
    idle.close()
    with httpx.Client(base_url=server.url, verify=trust_both) as c:
        metrics = c.get("/metrics").text
    not_after = x509.load_pem_x509_certificate(second.cert_pem).not_valid_after_utc.timestamp()
    exported = [
        sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
        if sample.name == "topoguard_tls_certificate_expiry_timestamp_seconds"
    ]
    assert exported == [not_after]
    # Connections are counted by the serial of the certificate they got: the first's before, the second's since.
    connections = {
        sample.labels["serial"]: sample.value for family in text_string_to_metric_families(metrics)
        for sample in family.samples if sample.name == "topoguard_tls_connections_total"
    }
    assert set(connections) == {f"{serial_of(first):X}", f"{serial_of(second):X}"}
    assert min(connections.values()) >= 2

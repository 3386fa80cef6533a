"""HTTPS with a certificate that is re-read when its files change, and start-up errors."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from test_hami_extender import World

from gpulab.cli import main
from gpulab.hami.server import CertReloader


def write_cert(directory: Path, serial: int) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hami-scheduler")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


def served_serial(port: int) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert tls.recv(100).startswith(b"HTTP/1.1 200")
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_https_serves_the_new_certificate_after_the_files_change(tmp_path: Path) -> None:
    cert_file, key_file = write_cert(tmp_path, serial=1001)
    reloader = CertReloader(cert_file, key_file)
    config = uvicorn.Config(
        World().app,
        log_level="warning",
        lifespan="off",
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
    )
    config.load()
    config.ssl = reloader.context  # as server.start does
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        assert served_serial(port) == 1001
        assert not reloader.check()  # unchanged files: nothing to do
        write_cert(tmp_path, serial=2002)
        assert reloader.check()
        assert served_serial(port) == 2002
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_port_in_use_is_one_line_naming_port_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        code = main(["extender", "--http-bind", f"127.0.0.1:{port}"])
    finally:
        holder.close()
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--http-bind" in err


def test_half_given_tls_flags_are_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extender", "--cert-file", "/nonexistent.crt"]) == 2
    assert "needs both --cert-file and --key-file" in capsys.readouterr().err

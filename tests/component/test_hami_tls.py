"""HTTPS with a certificate that is re-read when its files change, and start-up errors."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from test_hami_extender import World

from gpulab.cli import main
from gpulab.hami.server import CertReloader
from harness import pki


def write_cert(directory: Path) -> tuple[str, str, int]:
    """A fresh serving cert (random serial) over the same two files; returns its serial."""
    ca = pki.create_ca(directory)
    pair = pki.issue(ca, directory, "tls", "hami-scheduler", hosts=("localhost",))
    serial = x509.load_pem_x509_certificate(pair.cert.read_bytes()).serial_number
    return str(pair.cert), str(pair.key), serial


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
    cert_file, key_file, first = write_cert(tmp_path)
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
        assert served_serial(port) == first
        assert not reloader.check()  # unchanged files: nothing to do
        _, _, second = write_cert(tmp_path)
        assert reloader.check()
        assert served_serial(port) == second != first
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

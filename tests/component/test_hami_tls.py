"""`gpulab extender` start-up: HTTPS with a certificate re-read when its files change, and
flags as HAMi v2.10.0 spells them, each bad value one line."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from test_hami_extender import FIXTURES, World

from gpulab.cli import main
from gpulab.hami.server import CertReloader, listen
from gpulab.wait import wait_for
from harness import pki

CONFIG = f"--device-config-file={FIXTURES / 'device-config.yaml'}"


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
    sock = listen(("127.0.0.1", 0), "--http_bind")
    port = sock.getsockname()[1]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.01)
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
        code = main(["extender", CONFIG, f"--http_bind=127.0.0.1:{port}"])
    finally:
        holder.close()
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--http_bind" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cert_file=/nonexistent.crt"], "needs both --cert_file and --key_file"),
        (["--node-lock-timeout=300"], "--node-lock-timeout '300': missing unit"),
        (["--node-lock-retry-timeout=soon"], "--node-lock-retry-timeout 'soon': not a Go duration"),
        (["--gpu-scheduler-policy=topology"], "unknown --gpu-scheduler-policy 'topology'"),
        (["--node-scheduler-policy=pack"], "unknown --node-scheduler-policy 'pack'"),
        (["--node-label-selector=gpu"], "--node-label-selector 'gpu': expected key=value"),
        (["--metrics-bind-address=9395"], "--metrics-bind-address '9395': expected HOST:PORT"),
    ],
)
def test_bad_flag_values_are_one_line(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extender", CONFIG, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_a_missing_device_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extender", f"--device-config-file={tmp_path / 'none.yaml'}"]) == 2
    assert "--device-config-file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("nvidia:\n  defaultGPUNum: one\n")
    assert main(["extender", f"--device-config-file={bad}"]) == 2
    assert "nvidia.defaultGPUNum must be an integer" in capsys.readouterr().err

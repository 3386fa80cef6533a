"""harness/podrunner/forkserver.py against a real server process: a forked container is
the process an exec would have made (cmdline, environ, session, exit status, output), it
dies with the server, and what cannot be forked is exec'd."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulab.wait import wait_for
from harness.podrunner import runtime
from harness.podrunner.container import Plan
from harness.podrunner.forkserver import ForkServer, Request, forkable, same_startup

APP = textwrap.dedent(
    """
    import os, sys, time

    def main():
        print("argv", sys.argv[1:], "cwd", os.getcwd(), "mode", os.environ.get("MODE"), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        if os.environ.get("MODE") == "sleep":
            time.sleep(600)
        return int(os.environ.get("CODE", "0"))
    """
)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A console script as pip writes one, whose entry point is fakeapp:main."""
    (tmp_path / "fakeapp.py").write_text(APP)
    script = tmp_path / "bin" / "fakeapp"
    script.parent.mkdir()
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom fakeapp import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def spawner() -> Iterator[runtime.Spawner]:
    s = runtime.Spawner()
    yield s
    s.stop()


@pytest.fixture
def server(
    app: Path, socket_dir: Path, tmp_path: Path, spawner: runtime.Spawner
) -> Iterator[ForkServer]:
    env = {"PYTHONPATH": str(app.parent.parent), "PATH": "/usr/bin:/bin", "MARK": "cluster-x"}

    def launch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return spawner.spawn(lambda: runtime.launch(argv, env, tmp_path, out))

    fs = ForkServer(socket_dir / "f.sock", ["json"], env, app.parent, tmp_path / "fs.log", launch)
    fs.scripts = {os.path.realpath(app): "fakeapp:main"}
    fs.start()
    yield fs
    fs.stop()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _env(server: ForkServer, **extra: str) -> dict[str, str]:
    return {**server.env, "MARK": "pod-1", **extra}


def test_a_forked_container_looks_and_ends_like_an_exec_d_one(
    server: ForkServer, app: Path, tmp_path: Path
) -> None:
    proc = server.spawn(str(app), ["fakeapp", "--flag"], _env(server, MODE="sleep"), tmp_path)
    assert proc is not None
    pid = proc.pid
    want = [sys.executable, str(app), "--flag"]  # the script's #! interpreter first
    cmdline = wait_for(
        lambda: (
            (c := Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1])
            and c[1:2] == [os.fsencode(app)]
            and c
        ),
        10,
        "the child to take the container's command line",
        0.02,
    )
    assert [os.fsdecode(a) for a in cmdline] == want
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"MARK=pod-1" in environ and b"MODE=sleep" in environ
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "fakeapp"
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    os.killpg(pid, signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    assert b"to stderr" in proc.stderr.read()
    assert b"argv ['--flag'] cwd " + os.fsencode(tmp_path) in proc.stdout.read()


def test_the_exit_code_comes_back(server: ForkServer, app: Path, tmp_path: Path) -> None:
    proc = server.spawn(str(app), ["fakeapp"], _env(server, CODE="3"), tmp_path)
    assert proc is not None
    assert proc.wait(10) == 3


def test_runtime_start_forks_and_logs_in_the_cri_format(
    server: ForkServer, app: Path, tmp_path: Path, spawner: runtime.Spawner
) -> None:
    log = tmp_path / "logs" / "0.log"
    plan = Plan(argv=["fakeapp", "a"], env=_env(server))
    process = runtime.start(spawner, plan, str(app), log, tmp_path, {}, server)
    assert type(process.popen).__name__ == "ForkedProcess"
    assert process.popen.wait(10) == 0
    assert process.exit_code() == 0
    lines = log.read_text().splitlines()
    assert any(
        line.endswith(" stdout F argv ['a'] cwd " + str(tmp_path) + " mode None") for line in lines
    )
    assert any(" stderr F to stderr" in line for line in lines)


def test_children_die_with_the_server(server: ForkServer, app: Path, tmp_path: Path) -> None:
    proc = server.spawn(str(app), ["fakeapp"], _env(server, MODE="sleep"), tmp_path)
    assert proc is not None
    server.stop()
    assert proc.wait(10) == -signal.SIGKILL  # no status: the server is gone
    wait_for(lambda: not _running(proc.pid), 10, "the child to die with its server", 0.05)


def test_what_an_interpreter_reads_at_start_up_is_exec_d(
    server: ForkServer, app: Path, tmp_path: Path, spawner: runtime.Spawner
) -> None:
    other = _env(server, PYTHONPATH="/elsewhere")
    assert server.spawn(str(app), ["fakeapp"], other, tmp_path) is None
    assert server.spawn("/usr/bin/sleep", ["sleep", "1"], _env(server), tmp_path) is None
    plan = Plan(argv=["fakeapp"], env=_env(server, LD_PRELOAD=""))
    process = runtime.start(spawner, plan, str(app), tmp_path / "0.log", tmp_path, {}, server)
    assert isinstance(process.popen, subprocess.Popen)
    assert process.popen.wait(20) == 0


def test_a_bad_request_is_refused_and_the_server_keeps_serving(
    server: ForkServer, app: Path, tmp_path: Path
) -> None:
    first = server.spawn(str(app), ["fakeapp"], _env(server), tmp_path)
    assert first is not None and first.wait(10) == 0
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(server.socket_path))
    conn.sendall(b"\0\0\0\x05hello")  # no file descriptors with it
    assert conn.recv(100).startswith(b"error ")
    conn.close()
    again = server.spawn(str(app), ["fakeapp"], _env(server, CODE="4"), tmp_path)
    assert again is not None and again.wait(10) == 4


def test_startup_variables_decide() -> None:
    server = {"PYTHONUNBUFFERED": "1", "LD_LIBRARY_PATH": "/shim", "PATH": "/a"}
    assert same_startup({**server, "PATH": "/b", "HOME": "/h"}, server)
    assert not same_startup({**server, "LD_LIBRARY_PATH": "/other"}, server)
    assert not same_startup({**server, "PYTHONPATH": "/x"}, server)  # one side only
    assert not same_startup({**server, "LANG": "C"}, server)
    scripts = {os.path.realpath("/venv/bin/gpulab"): "gpulab.cli:main"}
    assert forkable("/venv/bin/gpulab", server, scripts, server) == "gpulab.cli:main"
    assert forkable("/venv/bin/other", server, scripts, server) is None


def test_a_request_round_trips() -> None:
    req = Request("m:f", ["x", "y"], {"A": "1"}, "/w", ["/py", "x", "y"])
    assert Request.decode(req.encode()) == req


def test_a_status_sent_with_the_pid_is_not_lost(
    socket_dir: Path, tmp_path: Path, app: Path
) -> None:
    """A child that exits before the runner reads its pid: both lines arrive together."""
    path = socket_dir / "fake.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def fake_server() -> None:
        conn, _ = listener.accept()
        with conn:
            header, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
            for fd in fds:
                os.close(fd)
            # the whole request is read first, as the real server does: closing on an
            # unread body made the client's sendall fail with EPIPE under load
            (size,) = struct.unpack("!I", header)
            while size > 0:
                size -= len(conn.recv(size))
            conn.sendall(b"4242\n7\n")

    def launch(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["sleep", "30"])  # alive, as the server must be

    fs = ForkServer(path, [], {}, app.parent, tmp_path / "fs.log", launch)
    fs.scripts = {os.path.realpath(app): "fakeapp:main"}
    fs.start()
    listener.bind(str(path))
    listener.listen(1)
    threading.Thread(target=fake_server, daemon=True).start()
    try:
        proc = fs.spawn(str(app), ["fakeapp"], {}, tmp_path)
        assert proc is not None and proc.pid == 4242
        assert proc.wait(10) == 7
    finally:
        fs.stop()
        listener.close()

"""A pre-loaded Python that forks the lab's containers (local backend; a lab convenience).

A ``gpulab:dev`` container runs one of this project's console scripts (``gpulab
<command>``, ``nvidia-smi``). A fresh interpreter spends most of a CPU-second importing the
Kubernetes client before the command does anything, and the pod runner starts hundreds of
such containers in a test run on a two-core machine. So the runner keeps one server per
image that lists ``preload`` modules (``harness/pod-images.yaml``): it imports them once
and forks a child per container, as multiprocessing's forkserver does. To everything
outside, the child is the process an exec would have made:

- its own session and process group, so ``kill(-pid)`` stops it and what it forked;
- its ``/proc/<pid>/cmdline`` and ``environ`` are the container's (``prctl(PR_SET_MM_MAP)``,
  unprivileged since Linux 3.18) and its ``comm`` the script's name, so ``ps`` names the
  component and `gpulab down` finds it by its environment like any other container;
- ``PR_SET_PDEATHSIG`` kills it with the server, which ``setpriv --pdeathsig`` kills with
  the runner;
- stdin, stdout and stderr are the runner's pipes, passed over the socket (SCM_RIGHTS);
- the server reaps it and writes its exit status back on the request's connection.

A container is forked only when nothing an interpreter reads at start-up differs
(:func:`forkable`): its command is one of the lab's console scripts in this venv, and the
``LD_*``, ``PYTHON*``, ``LC_*``, ``LANG`` and ``TZ`` variables equal the server's.
Anything else is exec'd as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import BinaryIO

from gpulab.wait import WaitTimeout, wait_for

_log = logging.getLogger("gpulab.podrunner")

DISTRIBUTION = "gpu-scheduling-lab"
# read once when an interpreter (or the dynamic loader) starts: a child forked from the
# server keeps the server's values, so a container asking for others is exec'd
STARTUP_PREFIXES = ("LD_", "PYTHON", "LC_")
STARTUP_NAMES = ("LANG", "TZ")
READY_SECONDS = 60.0
REQUEST_SECONDS = 30.0
_HEADER = struct.Struct("!I")
_STDIO = 3  # stdin, stdout, stderr


def console_scripts(bin_dir: Path) -> dict[str, str]:
    """The lab's console scripts in ``bin_dir``: path -> ``module:function``."""
    try:
        eps = distribution(DISTRIBUTION).entry_points
    except PackageNotFoundError:
        return {}
    return {
        os.path.realpath(bin_dir / ep.name): ep.value for ep in eps if ep.group == "console_scripts"
    }


def same_startup(env: Mapping[str, str], server_env: Mapping[str, str]) -> bool:
    """Whether a process started with ``env`` would start as the server did."""
    names = {k for k in (*env, *server_env) if k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES}
    return all(env.get(k) == server_env.get(k) for k in names)


def forkable(
    executable: str,
    env: Mapping[str, str],
    scripts: Mapping[str, str],
    server_env: Mapping[str, str],
) -> str | None:
    """The entry point (``module:function``) to run in a forked child, or None to exec.
    ``executable`` may be a link to a script (the image's ``nvidia-smi``)."""
    entry = scripts.get(os.path.realpath(executable))
    if entry is None or not same_startup(env, server_env):
        return None
    return entry


@dataclass(frozen=True)
class Request:
    """One container to fork: what exec would have been given."""

    entry: str  # module:function of the console script
    argv: list[str]  # as the script would see it in sys.argv
    env: dict[str, str]
    cwd: str
    cmdline: list[str]  # what /proc/<pid>/cmdline shows after an exec of the script

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def decode(cls, data: bytes) -> Request:
        return cls(**json.loads(data))


# --------------------------------------------------------------------------- client


class ForkedProcess:
    """What the runner uses of a ``subprocess.Popen``, for a child of the server."""

    def __init__(
        self, conn: socket.socket, reader: BinaryIO, pid: int, stdout: int, stderr: int
    ) -> None:
        self.pid = pid
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")
        self.returncode: int | None = None
        self._done = threading.Event()
        self._conn, self._reader = conn, reader
        threading.Thread(target=self._await_exit, name=f"forked-{pid}", daemon=True).start()

    def _await_exit(self) -> None:
        # the reader that read the pid: it may hold the status already, if the child
        # exited before the runner read its pid
        with self._conn, self._reader:
            line = self._reader.readline()
        # no status means the server died, and PR_SET_PDEATHSIG killed the child with it
        self.returncode = int(line) if line.strip() else -signal.SIGKILL
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The runner's side: starts the server and asks it for children."""

    def __init__(
        self,
        socket_path: Path,
        preload: Sequence[str],
        env: Mapping[str, str],
        bin_dir: Path,
        log: Path,
        launch: Callable[[list[str], dict[str, str], Path], subprocess.Popen[bytes]],
    ) -> None:
        self.socket_path = socket_path
        self.preload = list(preload)
        self.env = dict(env)
        self.scripts = console_scripts(bin_dir)
        self.log = log
        self._launch = launch
        self._server: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._broken = False

    def start(self) -> None:
        """Start the server (it takes about a second to import; the first spawn waits)."""
        with self._lock:
            self.socket_path.unlink(missing_ok=True)
            argv = [sys.executable, "-m", __name__, str(self.socket_path), *self.preload]
            self._server = self._launch(argv, self.env, self.log)

    def spawn(
        self, executable: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path
    ) -> ForkedProcess | None:
        """Fork a container, or None when it must be exec'd (not forkable, or no server)."""
        entry = forkable(executable, env, self.scripts, self.env)
        if entry is None or self._broken:
            return None
        request = Request(
            entry=entry,
            argv=[executable, *argv[1:]],
            env=dict(env),
            cwd=str(cwd),
            cmdline=[_interpreter(executable), executable, *argv[1:]],
        )
        try:
            return self._request(request)
        except ValueError as exc:  # this request refused (a failed fork): exec this one
            _log.warning("fork server: %s; starting %s with exec", exc, executable)
            return None
        except (OSError, WaitTimeout) as exc:
            _log.warning("fork server: %s; starting containers with exec instead", exc)
            self._broken = True
            return None

    def _request(self, request: Request) -> ForkedProcess:
        conn = self._connect()
        reader = conn.makefile("rb")
        pipes = [os.pipe(), os.pipe()]
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            body = request.encode()
            conn.settimeout(REQUEST_SECONDS)
            socket.send_fds(conn, [_HEADER.pack(len(body))], [stdin, pipes[0][1], pipes[1][1]])
            conn.sendall(body)
            reply = reader.readline().decode().strip()
            conn.settimeout(None)  # the exit status may take the container's lifetime
            if not reply.isdigit():
                raise ValueError(f"the server refused to fork: {reply or 'no reply'}")
        except (OSError, ValueError):
            reader.close()
            conn.close()
            for r, _w in pipes:
                os.close(r)
            raise
        finally:
            os.close(stdin)
            for _r, w in pipes:
                os.close(w)
        return ForkedProcess(conn, reader, int(reply), pipes[0][0], pipes[1][0])

    def _connect(self) -> socket.socket:
        """A connection to the server, once it has imported its modules and listens."""

        def attempt() -> socket.socket | None:
            with self._lock:
                server = self._server
            if server is None or server.poll() is not None:
                code = None if server is None else server.returncode
                raise OSError(f"the fork server is not running (exit {code}; see {self.log})")
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                return None
            return conn

        return wait_for(attempt, READY_SECONDS, f"the fork server at {self.socket_path}", 0.05)

    def stop(self) -> None:
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                self._server.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._server.wait(timeout=5)
            self.socket_path.unlink(missing_ok=True)


def _interpreter(script: str) -> str:
    """The ``#!`` interpreter of ``script``: an exec of it runs ``<interpreter> <script>``."""
    try:
        with open(script, "rb") as f:
            first = f.readline(512)
    except OSError:
        return sys.executable
    if not first.startswith(b"#!"):
        return sys.executable
    return first[2:].strip().split(b" ", 1)[0].decode() or sys.executable


# --------------------------------------------------------------------------- server

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14


class _MMMap(ctypes.Structure):
    """``struct prctl_mm_map`` (include/uapi/linux/prctl.h)."""

    _fields_ = [
        *(
            (name, ctypes.c_uint64)
            for name in (
                "start_code",
                "end_code",
                "start_data",
                "end_data",
                "start_brk",
                "brk",
                "start_stack",
                "arg_start",
                "arg_end",
                "env_start",
                "env_end",
            )
        ),
        ("auxv", ctypes.c_uint64),
        ("auxv_size", ctypes.c_uint32),
        ("exe_fd", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.sbrk.restype = ctypes.c_void_p
# the buffers /proc/<pid>/cmdline and environ are read from, alive as long as the child
_title: list[ctypes.Array[ctypes.c_char]] = []


def _retitle(cmdline: Sequence[str], env: Mapping[str, str]) -> bool:
    """Make ``/proc/self/cmdline`` and ``environ`` those of an exec'd ``cmdline`` with
    ``env``, and ``comm`` the script's name; False if the kernel refuses."""
    args = b"".join(os.fsencode(a) + b"\0" for a in cmdline)
    environ = b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())
    _title[:] = [
        ctypes.create_string_buffer(args, len(args)),
        ctypes.create_string_buffer(environ, len(environ)),
    ]
    with open("/proc/self/stat", "rb") as f:
        stat = f.read().rsplit(b")", 1)[1].split()
    field = lambda n: int(stat[n - 3])  # noqa: E731 - proc(5) numbers fields from 1
    mm = _MMMap(
        start_code=field(26),
        end_code=field(27),
        start_stack=field(28),
        start_data=field(45),
        end_data=field(46),
        start_brk=field(47),
        brk=_libc.sbrk(0),  # the kernel sets what it is given: give it the current break
        arg_start=ctypes.addressof(_title[0]),
        arg_end=ctypes.addressof(_title[0]) + len(args),
        env_start=ctypes.addressof(_title[1]),
        env_end=ctypes.addressof(_title[1]) + len(environ),
        exe_fd=0xFFFFFFFF,  # keep /proc/self/exe
    )
    _libc.prctl(_PR_SET_NAME, os.fsencode(Path(cmdline[1]).name)[:15], 0, 0, 0)
    return _libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) == 0


@dataclass
class _Child:
    """In a forked child: become the container, then run its entry point."""

    request: Request
    stdio: list[int]
    server: int

    def run(self) -> object:
        os.setsid()
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.server:  # the server died before the line above
            os._exit(128 + signal.SIGKILL)
        for target, fd in enumerate(self.stdio):
            os.dup2(fd, target)
        os.closerange(_STDIO, os.sysconf("SC_OPEN_MAX"))
        req = self.request
        os.chdir(req.cwd)
        os.environ.clear()
        os.environ.update(req.env)
        _retitle(req.cmdline, req.env)
        sys.argv = list(req.argv)
        sys.path[0] = str(Path(req.argv[0]).parent)  # as for a script run by path
        module, _, function = req.entry.partition(":")
        return getattr(importlib.import_module(module), function)()


def serve(socket_path: Path, preload: Sequence[str]) -> _Child:
    """Import ``preload``, then fork a child per request; returns only in a child."""
    for name in preload:
        importlib.import_module(name)
    # a collection in a child would write to every preloaded object's header, copying the
    # server's whole heap page by page; frozen objects are never collected (gc.freeze)
    gc.collect()
    gc.freeze()
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a fork copies one thread: locks another one held stay locked
        raise SystemExit(f"fork server: the preloaded modules started {threads - 1} threads")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    waiting: dict[int, socket.socket] = {}  # child pid -> where its exit status goes
    # taken here: a child asking os.getppid() after the server died would get its reaper
    server = os.getpid()
    print(f"fork server {os.getpid()}: imported {', '.join(preload)}; listening", flush=True)
    while True:
        readable, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            _reap(waiting)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        conn.settimeout(REQUEST_SECONDS)  # a client that stalls must not stall the others
        try:
            request, stdio = _receive(conn)
        except (OSError, ValueError, TypeError) as exc:
            _refuse(conn, f"bad request: {exc}")
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in stdio:
                os.close(fd)
            _refuse(conn, f"fork failed: {exc}")
            continue
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for other in (listener, conn, *waiting.values()):
                other.close()
            os.close(wake_r)
            os.close(wake_w)
            return _Child(request, stdio, server)
        for fd in stdio:
            os.close(fd)
        # if the runner went away, the child is reaped all the same
        with contextlib.suppress(OSError):
            conn.sendall(f"{pid}\n".encode())
        waiting[pid] = conn


def _refuse(conn: socket.socket, why: str) -> None:
    print(f"fork server: {why}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        conn.sendall(f"error {why}\n".encode())
    conn.close()


def _receive(conn: socket.socket) -> tuple[Request, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, _STDIO)
    if len(head) != _HEADER.size or len(fds) != _STDIO:
        for fd in fds:
            os.close(fd)
        raise ValueError("expected a length and three file descriptors")
    (size,) = _HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("the request ended early")
        body += chunk
    return Request.decode(body), list(fds)


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            conn.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    child = serve(Path(args[0]), args[1:])
    sys.exit(child.run())


if __name__ == "__main__":
    main()

"""The container runtime of the local backend: containers as host processes.

What containerd + runc are for kubelet, reduced to what a host process can be: each
container is a process in its own session that cannot outlive the pod runner (exec'd
with ``setpriv --pdeathsig KILL`` where util-linux has it, or forked by the image's fork
server when it runs one of the lab's console scripts: forkserver.py), its stdout and stderr
written in the CRI log format kubelet keeps under ``/var/log/pods`` (here
``<cluster>/logs/pods/<namespace>_<pod>_<uid>/<container>/<restartCount>.log``), which kwok
serves to ``kubectl logs``. Every process carries ``GPULAB_CLUSTER_DIR`` and
``GPULAB_POD_UID`` in its environment so `gpulab down` can find anything left behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import os
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpulab.wait import WaitTimeout, wait_for
from harness.podrunner.container import Plan
from harness.podrunner.forkserver import ForkedProcess, ForkServer

CLUSTER_ENV = "GPULAB_CLUSTER_DIR"
POD_UID_ENV = "GPULAB_POD_UID"
_SETPRIV = shutil.which("setpriv")


def cri_line(stream: str, line: bytes, now: dt.datetime | None = None) -> bytes:
    """One line of a CRI container log: ``<RFC3339Nano> <stream> F <text>``."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} {stream} F ".encode() + line.rstrip(b"\n") + b"\n"


class Spawner:
    """Starts every process from one long-lived thread: a parent-death signal fires when
    the thread that forked the process ends, and this one ends only with the runner."""

    def __init__(self) -> None:
        self._requests: queue.Queue[
            tuple[
                Callable[[], subprocess.Popen[bytes]],
                concurrent.futures.Future[subprocess.Popen[bytes]],
            ]
            | None
        ] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="spawner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._requests.get()) is not None:
            start, future = item
            try:
                future.set_result(start())
            except BaseException as exc:
                future.set_exception(exc)

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        future: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        self._requests.put((start, future))
        return future.result()

    def stop(self) -> None:
        self._requests.put(None)


@dataclass
class Process:
    """A running container process and the threads copying its output to the log."""

    popen: subprocess.Popen[bytes] | ForkedProcess
    log: Path
    started: dt.datetime
    _copiers: list[threading.Thread] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """The exit code once it has exited (128 + signal when killed), else None."""
        code = self.popen.poll()
        if code is None:
            return None
        for t in self._copiers:
            t.join(timeout=1)
        return 128 - code if code < 0 else code

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=max(grace, 0))
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.popen.wait()
        # anything the container forked dies with it, as with its cgroup
        self.signal_group(signal.SIGKILL)
        code = self.exit_code()
        return 137 if code is None else code


def launch(
    argv: list[str], env: dict[str, str], cwd: Path, output: int | IO[bytes] = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    """Exec ``argv`` in a session of its own, killed when the runner dies (call it on the
    :class:`Spawner`'s thread)."""
    if _SETPRIV:
        argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=output,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def _copy(stream: IO[bytes], name: str, sink: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            sink.write(cri_line(name, line))
            sink.flush()
    stream.close()


def start(
    spawner: Spawner,
    plan: Plan,
    executable: str,
    log: Path,
    cwd: Path,
    marker: dict[str, str],
    forker: ForkServer | None = None,
) -> Process:
    """Start a container process for ``plan`` (``executable`` resolves ``plan.argv[0]``):
    forked by ``forker`` when it can, else exec'd."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**plan.env, **marker}
    workdir = Path(plan.cwd) if plan.cwd else cwd
    workdir.mkdir(parents=True, exist_ok=True)
    proc = forker.spawn(executable, plan.argv, env, workdir) if forker else None
    if proc is None:
        proc = spawner.spawn(lambda: launch([executable, *plan.argv[1:]], env, workdir))
    sink = log.open("ab")
    lock = threading.Lock()
    started = dt.datetime.now(dt.UTC)
    copiers = []
    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        assert stream is not None
        t = threading.Thread(target=_copy, args=(stream, name, sink, lock), daemon=True)
        t.start()
        copiers.append(t)
    threading.Thread(target=_close_when_done, args=(copiers, sink), daemon=True).start()
    return Process(proc, log, started, copiers)


def _close_when_done(copiers: list[threading.Thread], sink: IO[bytes]) -> None:
    for t in copiers:
        t.join()
    sink.close()


def find_leftovers(cluster_dir: Path) -> list[int]:
    """Pids of processes started for pods of ``cluster_dir`` (read from their environment)."""
    marker = f"{CLUSTER_ENV}={cluster_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_leftovers(cluster_dir: Path, grace: float = 5.0) -> int:
    """Stop every process of the cluster's pods that is still running; returns how many."""
    pids = find_leftovers(cluster_dir)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not any(_alive(p) for p in pids), grace, "pod processes to exit", 0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

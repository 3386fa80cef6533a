"""The Docker engine the kind backend runs on: an engine that answers, or one the lab starts.

Where an engine already answers (Docker Desktop, a system dockerd), the lab uses it and
touches nothing. Where none answers and the user is root on Debian/Ubuntu (a workshop VM,
CI), the lab installs Debian's ``docker.io`` the way ``make`` installs chromium and starts
``dockerd`` itself:

- its data root is ``~/.cache/gpulab/docker``, so the images the lab builds (the offline
  kind node image takes minutes) survive like the other build caches;
- where this host's capability bounding set lacks a capability Docker grants privileged
  containers (some sandboxes drop CAP_SYS_RESOURCE), ``docker run --privileged`` - which
  kind needs - fails in runc with "unable to apply caps". Only there, the dockerd gets a
  default runtime ``gpulab-runc`` (``harness/runc-capfilter``) that drops exactly the
  missing capabilities from each container's OCI spec and then execs runc, and says so;
- ``gpulab down`` stops the dockerd it started once no lab kind cluster runs on it and
  no other `up` is using it (:func:`release`: each user holds a lease file while it
  builds or runs a cluster; starting and stopping happen under one lock, so two test
  workers or terminals never start two dockerds or stop one under the other).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gpulab.state import cache_dir, state_root
from harness.errors import HarnessError

Progress = Callable[[str], None]

WRAPPER = Path(__file__).resolve().parent / "runc-capfilter"
RUNTIME = "gpulab-runc"
SOCKET = "/var/run/docker.sock"
PACKAGES = ("docker.io",)


def engine_dir() -> Path:
    """Where the lab keeps the dockerd it started: pid, log, its copy of the wrapper."""
    return state_root() / "docker"


def data_root() -> Path:
    return cache_dir() / "docker"


def missing_capabilities(status: str | None = None, last_cap: int | None = None) -> list[int]:
    """Capability numbers the kernel knows (0..cap_last_cap) that this process's bounding
    set lacks: a privileged container cannot be granted them."""
    if status is None:
        status = Path("/proc/self/status").read_text()
    if last_cap is None:
        last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    line = next(x for x in status.splitlines() if x.startswith("CapBnd:"))
    bounding = int(line.split()[1], 16)
    return [bit for bit in range(last_cap + 1) if not (bounding >> bit) & 1]


def capability_names(bits: list[int]) -> list[str]:
    """Names for capability numbers, from the wrapper's table (one copy of it)."""
    loader = importlib.machinery.SourceFileLoader("runc_capfilter", str(WRAPPER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    table: tuple[str, ...] = module.CAPABILITIES
    return [table[bit] if bit < len(table) else f"capability {bit}" for bit in bits]


def _answers() -> bool:
    from harness.docker import engine_status

    return engine_status()[0]


def started_by_lab() -> int | None:
    """The pid of the dockerd the lab started, if it still runs."""
    try:
        pid = int((engine_dir() / "dockerd.pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    engine_dir().mkdir(parents=True, exist_ok=True)
    with (engine_dir() / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _lease(user: str) -> Path:
    return engine_dir() / "users" / user


def ensure_engine(progress: Progress, user: str) -> None:
    """A Docker engine that answers: the one there, else one the lab installs and starts.
    ``user`` (a cluster's name) holds a lease on it until :func:`release`."""
    with _locked():
        _lease(user).parent.mkdir(parents=True, exist_ok=True)
        _lease(user).touch()
        if not _answers():
            _start(progress)


def _start(progress: Progress) -> None:
    if os.geteuid() != 0:
        raise HarnessError(
            "no Docker engine answers; start Docker (or run as root on Debian/Ubuntu and "
            "the lab starts one), or use --backend local"
        )
    if shutil.which("dockerd") is None:
        install_packages(PACKAGES, progress, "the Docker engine for the kind backend")
    start_dockerd(progress)


def install_packages(packages: tuple[str, ...], progress: Progress, why: str) -> None:
    """apt-get install ``packages`` that are not installed yet (root on Debian/Ubuntu)."""
    absent = [p for p in packages if not _dpkg_installed(p)]
    if not absent:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HarnessError(
            f"{why} needs the packages {' '.join(absent)}: install them "
            f"(apt-get install {' '.join(absent)}) or use --backend local"
        )
    progress(f"installing {' '.join(absent)} ({why}, apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-qq", *absent]
    if subprocess.run(argv, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise HarnessError(f"apt-get install {' '.join(absent)} failed: {' '.join(tail)}")


def _dpkg_installed(package: str) -> bool:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0 and proc.stdout.endswith(" installed")


def dockerd_argv(wrapper: Path | None) -> list[str]:
    directory = engine_dir()
    argv = [
        "dockerd",
        "--host",
        f"unix://{SOCKET}",
        "--data-root",
        str(data_root()),
        "--pidfile",
        str(directory / "dockerd.pid"),
    ]
    if wrapper is not None:
        argv += ["--add-runtime", f"{RUNTIME}={wrapper}", "--default-runtime", RUNTIME]
    return argv


def start_dockerd(progress: Progress, timeout: float = 60) -> None:
    directory = engine_dir()
    directory.mkdir(parents=True, exist_ok=True)
    data_root().mkdir(parents=True, exist_ok=True)
    wrapper = None
    missing = missing_capabilities()
    if missing:
        # a copy: the dockerd may outlive this checkout
        wrapper = directory / WRAPPER.name
        shutil.copyfile(WRAPPER, wrapper)
        wrapper.chmod(0o755)
        progress(
            f"this host's capability bounding set lacks {', '.join(capability_names(missing))}: "
            f"privileged containers run through {RUNTIME}, which drops it (harness/runc-capfilter)"
        )
    log = directory / "dockerd.log"
    progress(f"starting dockerd for the kind backend (data in {data_root()}, log {log})")
    with log.open("ab") as out:
        proc = subprocess.Popen(
            dockerd_argv(wrapper),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while not _answers():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:]
            raise HarnessError(
                f"dockerd exited with status {proc.returncode}: {' '.join(tail)} (see {log})"
            )
        if time.monotonic() > deadline:
            raise HarnessError(f"dockerd did not answer within {timeout:.0f}s; see {log}")
        time.sleep(0.5)
    progress(f"dockerd is up (pid {proc.pid})")


def release(progress: Progress, user: str) -> None:
    """Give up ``user``'s lease; stop the dockerd the lab started once no lease is held and
    no container of a kind cluster is left."""
    with _locked():
        _lease(user).unlink(missing_ok=True)
        users = _lease(user).parent
        if users.is_dir() and any(users.iterdir()):
            return
        _stop_if_idle(progress)


def _stop_if_idle(progress: Progress) -> None:
    pid = started_by_lab()
    if pid is None:
        return
    from harness.docker import engine

    try:
        kind_nodes = engine().containers.list(all=True, filters={"label": "io.x-k8s.kind.cluster"})
    except HarnessError:
        kind_nodes = []
    if kind_nodes:
        return
    progress(f"stopping the dockerd the lab started (pid {pid})")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while started_by_lab() is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    (engine_dir() / "dockerd.pid").unlink(missing_ok=True)

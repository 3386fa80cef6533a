"""Choosing a backend: kind or k3d where a Docker engine answers, local everywhere else."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Protocol

from harness.errors import HarnessError
from harness.spec import ClusterSpec

BACKENDS = ("local", "kind", "k3d")


class Progress(Protocol):
    def __call__(self, message: str) -> None: ...


class Backend(Protocol):
    spec: ClusterSpec

    def up(self, progress: Progress) -> None: ...

    def down(self, progress: Progress) -> None: ...

    def running(self) -> bool: ...

    def ensure_addon(self, name: str, progress: Progress) -> None: ...


def docker_available() -> bool:
    """True when a Docker engine answers (`docker info`), not merely a client installed."""
    if shutil.which("docker") is None:
        return False
    try:
        proc = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def default_backend() -> str:
    """$GPULAB_BACKEND if set, else kind where a Docker engine answers, else local."""
    chosen = os.environ.get("GPULAB_BACKEND")
    if chosen:
        if chosen not in BACKENDS:
            raise HarnessError(f"GPULAB_BACKEND={chosen!r}: use one of {', '.join(BACKENDS)}")
        return chosen
    return "kind" if docker_available() else "local"


def get_backend(name: str, spec: ClusterSpec) -> Backend:
    if name == "local":
        from harness.local import LocalCluster

        return LocalCluster(spec)
    if name in ("kind", "k3d"):
        from harness.docker import DockerCluster

        return DockerCluster(name, spec)
    raise HarnessError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")

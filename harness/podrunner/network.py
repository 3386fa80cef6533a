"""The local backend's pod network: loopback addresses for pods and Services.

Linux routes all of 127.0.0.0/8 to the loopback interface, so any 127.x.y.z can be bound
without configuration. Each running cluster takes one block ``127.K.0.0/16``
(``acquire_block``; a file per block under the cache dir says which cluster holds it, so
clusters of several checkouts never share addresses):

    127.K.0.0  - 127.K.127.255   Services: ClusterIP 10.96.A.B is served at 127.K.A.B
                                 (the service CIDR is a /17, so A < 128)
    127.K.128.1 - 127.K.255.254  pod IPs, handed out by the pod runner

Pod IPs cannot go into Endpoints (the API server rejects loopback addresses there), so the
pod runner's service proxy (proxy.py) plays kube-proxy: it listens on each Service's
address and forwards to a Ready pod. Webhook configurations on the local backend call the
Service's address (harness/apply.py LocalTransform).
"""

from __future__ import annotations

import fcntl
import ipaddress
import threading
from pathlib import Path

from gpulab.state import cache_dir
from harness.errors import HarnessError

SERVICE_CIDR = "10.96.0.0/17"
_BLOCKS = range(20, 250)


def _registry() -> Path:
    path = cache_dir() / "loopback-blocks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def acquire_block(owner: Path) -> int:
    """A free ``K`` for ``127.K.0.0/16``, recorded as held by the cluster in ``owner``.

    A block whose owner directory has no running cluster (no ``cluster.json``) is stale
    and taken over; the cluster that already holds a block gets it back. Clusters
    starting at once (parallel test workers) take turns on the registry's lock file.
    """
    registry = _registry()
    with open(registry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        holders = {k: _holder(registry / str(k)) for k in _BLOCKS}
        for k, held_by in holders.items():
            if held_by == owner:
                return k
        for k, held_by in holders.items():
            if held_by is None or not (held_by / "cluster.json").exists():
                (registry / str(k)).write_text(str(owner))
                return k
    raise HarnessError(
        f"no free loopback block 127.K.0.0/16 for a new cluster (all of {_BLOCKS.start}.."
        f"{_BLOCKS.stop - 1} are held; see {registry}); stop a cluster with `gpulab down`"
    )


def _holder(entry: Path) -> Path | None:
    try:
        return Path(entry.read_text().strip())
    except FileNotFoundError:
        return None


def release_block(owner: Path) -> None:
    registry = _registry()
    with open(registry / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for entry in registry.glob("[0-9]*"):
            if _holder(entry) == owner:
                entry.unlink(missing_ok=True)


def service_address(block: int, cluster_ip: str) -> str | None:
    """Where the local backend serves a Service with ``cluster_ip`` (None if outside the
    service CIDR, e.g. headless)."""
    try:
        ip = ipaddress.ip_address(cluster_ip)
    except ValueError:
        return None
    if ip not in ipaddress.ip_network(SERVICE_CIDR):
        return None
    _, _, a, b = str(ip).split(".")
    return f"127.{block}.{a}.{b}"


def is_pod_address(block: int, ip: str | None) -> bool:
    if not ip:
        return False
    parts = ip.split(".")
    return len(parts) == 4 and parts[:2] == ["127", str(block)] and int(parts[2]) >= 128


class PodIPs:
    """Hands out pod IPs from ``127.K.128.0/17``; released IPs are reused last."""

    def __init__(self, block: int) -> None:
        self.block = block
        self._used: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()
        self._size = 128 * 256

    def _ip(self, n: int) -> str:
        return f"127.{self.block}.{128 + n // 256}.{n % 256}"

    def reserve(self, ip: str) -> None:
        """Mark an address already in use (pods found running when the runner starts)."""
        if is_pod_address(self.block, ip):
            _, _, c, d = ip.split(".")
            with self._lock:
                self._used.add((int(c) - 128) * 256 + int(d))

    def allocate(self) -> str:
        with self._lock:
            for _ in range(self._size):
                n = self._next
                self._next = (self._next + 1) % self._size
                if n % 256 in (0, 255) or n in self._used:
                    continue
                self._used.add(n)
                return self._ip(n)
        raise HarnessError(f"pod address block 127.{self.block}.128.0/17 is exhausted")

    def release(self, ip: str) -> None:
        if is_pod_address(self.block, ip):
            _, _, c, d = ip.split(".")
            with self._lock:
                self._used.discard((int(c) - 128) * 256 + int(d))

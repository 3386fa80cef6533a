"""The device plugin's main loop: discover GPUs, serve one plugin per resource, keep registered.

Mirrors NVIDIA k8s-device-plugin ``cmd/nvidia-device-plugin/main.go`` (``start``,
``startPlugins``, the restart loop on kubelet.sock re-creation) plus GFD's node labelling
and HAMi's node registration when an API server is reachable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.deviceplugin import nvml
from gpulab.deviceplugin.hami import HamiAllocator, HamiRegistrar
from gpulab.deviceplugin.health import CheckHealth, xid_filter
from gpulab.deviceplugin.labels import gfd_labels
from gpulab.deviceplugin.rm import build_resources
from gpulab.deviceplugin.server import KUBELET_SOCKET, HealthBoard, NvidiaDevicePlugin
from gpulab.hami.annotations import DEFAULT_SPLIT_COUNT
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

_LOOP_SECONDS = 0.2
_BACKOFF_MAX = 5.0


@dataclass(frozen=True)
class Options:
    node_name: str
    socket_dir: Path
    mig_strategy: str = "none"
    replicas: int = 1
    hami: bool = False
    hami_split_count: int = DEFAULT_SPLIT_COUNT
    health_recheck_seconds: float = 2.0


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


class _Registration:
    """Per-plugin registration state with exponential backoff (1 s → 5 s)."""

    def __init__(self) -> None:
        self.done = False
        self.next_try = 0.0
        self.delay = 0.0

    def reset(self) -> None:
        self.done, self.next_try, self.delay = False, 0.0, 0.0

    def failed(self, now: float) -> float:
        self.delay = min(max(self.delay * 2, 1.0), _BACKOFF_MAX)
        self.next_try = now + self.delay
        return self.delay


def label_node(api: client.ApiClient, node: str, labels: dict[str, str]) -> None:
    try:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": labels}})
    except ApiException as exc:
        _log.warning("could not label node %s: %s %s", node, exc.status, exc.reason)


def start(opts: Options, api: client.ApiClient | None, stop: threading.Event) -> None:
    """Run until ``stop`` is set. Raises NVMLInitError / ResourceError on bad input."""
    nvml.init()
    try:
        _run(opts, api, stop)
    finally:
        nvml.shutdown()


def _run(opts: Options, api: client.ApiClient | None, stop: threading.Event) -> None:
    gpus = nvml.read_inventory()
    resources = build_resources(gpus, opts.mig_strategy, opts.replicas)
    tracer = Tracer("device-plugin", api, instance=opts.node_name)
    node_ref = ObjectRef(kind="Node", name=opts.node_name)
    uuids = [g.uuid for g in gpus] + [m.uuid for g in gpus for m in g.migs]
    board = HealthBoard(uuids)
    peers = {g.index: g.nvlink_peers for g in gpus}
    tracer.step(
        "Start",
        node_ref,
        f"{len(gpus)} GPU(s) via NVML; resources: "
        + (", ".join(f"{r.name}={len(r.devices)}" for r in resources) or "none"),
        mig_strategy=opts.mig_strategy,
        replicas=opts.replicas,
    )
    if not resources:
        _log.info("No devices found. Waiting indefinitely.")

    registrar: HamiRegistrar | None = None
    allocator = None
    if api is not None:
        label_node(api, opts.node_name, gfd_labels(gpus, opts.mig_strategy, opts.replicas))
        if opts.hami:
            registrar = HamiRegistrar(
                api, opts.node_name, gpus, board.healthy, opts.hami_split_count, tracer
            )
            allocator = HamiAllocator(client.CoreV1Api(api), opts.node_name, tracer)

    def on_health(changed_uuids: list[str], healthy: bool, reason: str) -> None:
        changed = board.set(changed_uuids, healthy)
        if not changed:
            return
        state = "Healthy" if healthy else "Unhealthy"
        tracer.step(
            "CheckHealth",
            node_ref,
            f"{', '.join(changed)} {state}: {reason}",
            warning=not healthy,
            devices=changed,
            healthy=healthy,
            reason=reason,
        )
        if registrar is not None:
            registrar.poke()

    health = CheckHealth(gpus, on_health, xid_filter(os.environ), opts.health_recheck_seconds)
    plugins = [
        NvidiaDevicePlugin(r, opts.socket_dir, board, tracer, opts.node_name, peers, allocator)
        for r in resources
    ]
    registrations = {p.resource.name: _Registration() for p in plugins}
    kubelet = opts.socket_dir / KUBELET_SOCKET
    health.start()
    if registrar is not None:
        registrar.start()
    for p in plugins:
        p.Start()
    seen_kubelet = _identity(kubelet)
    try:
        while not stop.wait(_LOOP_SECONDS):
            current = _identity(kubelet)
            if current != seen_kubelet:
                seen_kubelet = current
                if current is not None:
                    # kubelet restarted (and wiped the socket dir): restart and re-register.
                    _log.info("%s re-created; restarting plugins", kubelet)
                    for p in plugins:
                        p.Stop()
                        p.Start()
                        registrations[p.resource.name].reset()
            for p in plugins:
                reg = registrations[p.resource.name]
                if not p.serving:
                    _log.info("socket %s gone; restarting %s", p.socket, p.resource.name)
                    p.Stop()
                    p.Start()
                    reg.reset()
                if not reg.done and time.monotonic() >= reg.next_try:
                    _register(p, reg)
    finally:
        health.stop()
        if registrar is not None:
            registrar.stop()
        for p in plugins:
            p.Stop()
        health.join(timeout=2)
        tracer.flush(timeout=2)


def _register(plugin: NvidiaDevicePlugin, reg: _Registration) -> None:
    try:
        plugin.Register()
    except (OSError, grpc.RpcError) as exc:
        delay = reg.failed(time.monotonic())
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        _log.warning(
            "could not register %s with kubelet at %s: %s; retrying in %.0fs",
            plugin.resource.name,
            plugin.socket_dir / KUBELET_SOCKET,
            detail,
            delay,
        )
        return
    reg.done = True

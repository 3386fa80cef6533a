"""The device plugin's main loop: load the config, discover GPUs, start one plugin per resource.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``cmd/nvidia-device-plugin/main.go``: ``start``
(restart the plugins when ``kubelet.sock`` is created again, on ``SIGHUP``, and 30 s after
a plugin failed to start; stop on ``SIGTERM``/``SIGINT``), ``startPlugins`` (load the
config file and flags, build the resources, ``Start`` each plugin with devices: Serve →
Register → health check) and ``stopPlugins``. Labelling the node with GFD's labels (a
separate daemon upstream, ``gpu-feature-discovery``) and HAMi's node registration run here
when an API server is reachable.

Deliberate difference: ``kubelet.sock`` is watched by polling its identity every 0.2 s
(upstream: an fsnotify Create event), which also catches a socket replaced between polls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.deviceplugin import nvml
from gpulab.deviceplugin.config import (
    Config,
    ConfigError,
    FlagOverrides,
    merge,
    parse,
)
from gpulab.deviceplugin.hami import (
    HamiAllocator,
    HamiRegistrar,
    MigContext,
    MigReconciler,
    NodeConfig,
    node_config,
    plugin_resource,
)
from gpulab.deviceplugin.hamimig import MigInstanceManager, gpu_profiles, supports_mig
from gpulab.deviceplugin.health import xid_filter
from gpulab.deviceplugin.labels import gfd_labels
from gpulab.deviceplugin.rm import MIG_MINORS_FILE, GPUInfo, build_resources, parse_mig_minors
from gpulab.deviceplugin.server import (
    KUBELET_SOCKET,
    Allocator,
    DefaultAllocator,
    DriverFiles,
    NvidiaDevicePlugin,
)
from gpulab.hami import annotations as ha
from gpulab.hami.cluster import ClusterError, KubeCluster
from gpulab.hami.config import NvidiaConfig, load_device_config
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

_LOOP_SECONDS = 0.2
RETRY_SECONDS = 30.0  # upstream: "Failed to start one or more plugins. Retrying in 30s..."


@dataclass(frozen=True)
class Options:
    node_name: str
    socket_dir: Path
    config_file: Path | None = None
    flags: FlagOverrides = field(default_factory=FlagOverrides)
    mig_minors: Path = Path(MIG_MINORS_FILE)
    hami: bool = False
    device_config_file: Path | None = None  # HAMi's device config (upstream --config-file)
    node_config_file: Path | None = None  # HAMi's config.json (upstream /config/config.json)


def load_config(opts: Options) -> Config:
    """Upstream ``loadConfig``: the file (if any), then the flags set explicitly."""
    config = Config()
    if opts.config_file is not None:
        try:
            text = opts.config_file.read_text()
        except OSError as exc:
            raise ConfigError(
                f"unable to load config: {opts.config_file}: {exc.strerror or exc}"
            ) from exc
        config = parse(text, str(opts.config_file))
    config = merge(config, opts.flags)
    if opts.hami and (config.mig_strategy != "none" or config.time_slicing.resources):
        raise ConfigError(
            "--hami shares whole GPUs itself: use it with no MIG strategy "
            "and no sharing.timeSlicing (HAMi's MIG mode is operatingmode: mig in its "
            "config.json)"
        )
    for key in config.ignored:
        _log.info("config: %s is not simulated by the lab; ignored", key)
    for warning in config.warnings:
        _log.warning("config: %s", warning)
    return config


def load_hami_config(opts: Options) -> NodeConfig:
    """HAMi's ``LoadNvidiaDevicePluginConfig``: the device config file, then this node's
    entry of config.json. No config.json: the defaults (upstream logs the error and runs
    with an empty operating mode)."""
    device = NvidiaConfig()
    if opts.device_config_file is not None:
        device = load_device_config(str(opts.device_config_file))
    path = opts.node_config_file
    if path is None or not path.is_file():
        _log.warning("HAMi node config %s not found: device config defaults", path)
        return node_config(device, "{}", opts.node_name, str(path))
    return node_config(device, path.read_text(), opts.node_name, str(path))


def _mig_caps(opts: Options, config: Config, gpus: list[GPUInfo]) -> dict[str, str]:
    if config.mig_strategy == "none" or not any(g.mig_enabled for g in gpus):
        return {}
    try:
        return parse_mig_minors(opts.mig_minors.read_text())
    except FileNotFoundError:
        return {}  # upstream: no mig-minors file, no MIG capability paths


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def label_node(api: client.ApiClient, node: str, labels: dict[str, str | None]) -> None:
    try:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": labels}})
    except ApiException as exc:
        _log.warning("could not label node %s: %s %s", node, exc.status, exc.reason)


class PluginManager:
    """``startPlugins``/``stopPlugins`` and what they share across restarts."""

    def __init__(self, opts: Options, api: client.ApiClient | None, tracer: Tracer) -> None:
        self.opts = opts
        self.api = api
        self.tracer = tracer
        self.plugins: list[NvidiaDevicePlugin] = []
        self.registrar: HamiRegistrar | None = None
        self.reconciler: MigReconciler | None = None  # HAMi MIG mode
        self._labels: dict[str, str] = {}
        self._node = ObjectRef(kind="Node", name=opts.node_name)

    def healthy(self, uuid: str) -> bool:
        return all(p.healthy(uuid) for p in self.plugins)

    def _poke(self) -> None:
        if self.registrar is not None:
            self.registrar.poke()

    def start_plugins(self) -> bool:
        """Start a plugin per resource with devices; False if one failed (retry later)."""
        config = load_config(self.opts)
        self.tracer.step(
            "loadConfig",
            self._node,
            f"{self.opts.config_file.name if self.opts.config_file else 'no --config-file'} "
            "+ flags: "
            f"migStrategy={config.mig_strategy}, "
            f"passDeviceSpecs={str(config.pass_device_specs).lower()}, "
            f"sharing={config.sharing_strategy}",
            config=config.to_json(),
        )
        gpus = nvml.read_inventory()
        hami = load_hami_config(self.opts) if self.opts.hami else None
        if hami is None:
            resources = build_resources(gpus, config, _mig_caps(self.opts, config, gpus))
        else:
            resources = [plugin_resource(gpus, hami)]
        self.tracer.step(
            "Start",
            self._node,
            f"{len(gpus)} GPU(s) via NVML; resources: "
            + (", ".join(f"{r.name}={len(r.devices)}" for r in resources) or "none"),
        )
        if hami is None:
            self._label(gpus, config)  # GFD's labels; HAMi's plugin writes none
        allocator: Allocator = DefaultAllocator(config, gpus, os.path.exists)
        if hami is not None and self.api is not None:
            core = client.CoreV1Api(self.api)
            mig = profiles = None
            if hami.operating_mode == ha.MODE_MIG:
                mig = self._start_mig(gpus, hami)
                allowed = hami.mig_profile_allowlist
                profiles = gpu_profiles(((g.index, g.uuid, g.name) for g in gpus), allowed)
            allocator = HamiAllocator(core, self.opts.node_name, self.tracer, hami, mig=mig)
            if self.registrar is None:
                self.registrar = HamiRegistrar(
                    self.api,
                    self.opts.node_name,
                    gpus,
                    self.healthy,
                    hami.device_split_count,
                    self.tracer,
                    mig_profiles=profiles,
                )
                self.registrar.start()
        xids = xid_filter(os.environ)
        self.plugins = [
            NvidiaDevicePlugin(
                r,
                gpus,
                config,
                self.opts.socket_dir,
                self.tracer,
                self.opts.node_name,
                xids,
                allocator,
                self._poke,
                DriverFiles.from_env(os.environ),
                health_by_gpu=hami is not None,
            )
            for r in resources
        ]
        if not self.plugins:
            _log.info("No devices found. Waiting indefinitely.")
        for p in self.plugins:
            try:
                p.Start()
            except (OSError, grpc.RpcError) as exc:
                detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                _log.warning("Failed to start plugin %s: %s", p.resource.name, detail)
                return False
        self._poke()
        return True

    def _start_mig(self, gpus: list[GPUInfo], hami: NodeConfig) -> MigContext:
        """HAMi MIG mode's part of ``Start``: reset the GPUs no pod holds, adopt the
        instances live pods hold, and reconcile every 5 s while the plugin runs."""
        assert self.api is not None
        context = MigContext(MigInstanceManager(), {g.uuid: g.index for g in gpus})
        cluster = KubeCluster(self.api)
        try:
            pods: list | None = cluster.list_pods_on_node(self.opts.node_name)
        except ClusterError as exc:
            _log.info("mig init: listing this node's pods failed: %s", exc)
            pods = None
        supported = supports_mig((g.name for g in gpus), hami.mig_profile_allowlist)
        reset = context.start(pods, supported)
        self.tracer.step(
            "ResetIdleGPUs",
            self._node,
            f"MIG mode: GPUs {', '.join(map(str, reset)) or 'none'} reset (MIG on, no "
            "instances); instances are created at Allocate where the scheduler reserved them",
            reset=reset,
        )
        self.reconciler = MigReconciler(context, cluster, self.opts.node_name)
        self.reconciler.start()
        return context

    def stop_plugins(self) -> None:
        for p in self.plugins:
            p.Stop()
        self.plugins = []
        if self.reconciler is not None:
            self.reconciler.stop()
            self.reconciler = None

    def stop(self) -> None:
        self.stop_plugins()
        if self.registrar is not None:
            self.registrar.stop()

    def _label(self, gpus: list[GPUInfo], config: Config) -> None:
        """GFD: set this config's labels and drop the ones an earlier config set."""
        if self.api is None:
            return
        labels = gfd_labels(gpus, config)
        stale: dict[str, str | None] = dict.fromkeys(set(self._labels) - set(labels))
        label_node(self.api, self.opts.node_name, {**stale, **labels})
        self._labels = labels


def start(
    opts: Options,
    api: client.ApiClient | None,
    stop: threading.Event,
    restart: threading.Event | None = None,
) -> None:
    """Run until ``stop`` is set; ``restart`` (SIGHUP) restarts the plugins.

    Raises NVMLInitError / ConfigError / ResourceError on bad input.
    """
    nvml.init()
    try:
        _run(opts, api, stop, restart or threading.Event())
    finally:
        nvml.shutdown()


def _run(
    opts: Options, api: client.ApiClient | None, stop: threading.Event, restart: threading.Event
) -> None:
    tracer = Tracer("device-plugin", api, instance=opts.node_name)
    manager = PluginManager(opts, api, tracer)
    kubelet = opts.socket_dir / KUBELET_SOCKET
    seen_kubelet = _identity(kubelet)
    try:
        retry_at = _restart(manager, None)
        while not stop.wait(_LOOP_SECONDS):
            why = _why_restart(kubelet, seen_kubelet, restart, retry_at)
            if why is None:
                continue
            _log.info("%s, restarting.", why)
            seen_kubelet = _identity(kubelet)
            restart.clear()
            retry_at = _restart(manager, why)
    finally:
        manager.stop()
        tracer.flush(timeout=2)


def _why_restart(
    kubelet: Path,
    seen: tuple[int, int] | None,
    restart: threading.Event,
    retry_at: float | None,
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    current = _identity(kubelet)
    if current is not None and current != seen:
        return f"inotify: {kubelet} created"
    if restart.is_set():
        return "Received SIGHUP"
    if retry_at is not None and now() >= retry_at:
        return "Retrying plugins that failed to start"
    return None


def _restart(manager: PluginManager, why: str | None) -> float | None:
    """Stop what runs, start again; the time to retry at if a plugin failed to start."""
    if why is not None:
        manager.stop_plugins()
    if manager.start_plugins():
        return None
    _log.info("Failed to start one or more plugins. Retrying in %.0fs...", RETRY_SECONDS)
    return time.monotonic() + RETRY_SECONDS

"""Addon ``device-plugin``: for every GPU node, the NVIDIA device plugin reading that node's
GPUs through the NVML shim, and the node agent playing kubelet's device manager for it, on
a per-node device-plugins directory (what ``/var/lib/kubelet/device-plugins`` is on a real
node). On kind the DaemonSet in ``manifests/device-plugin/`` does the same.

Per-node settings follow upstream's per-node config model: each spec node's
``devicePlugin:`` settings become a named config in the ConfigMap
``nvidia-device-plugin-configs`` (upstream's config file format), the node gets the label
``nvidia.com/device-plugin.config=<name>``, and ``gpulab config-manager --oneshot`` (the
DaemonSet's init container) links the selected config into place before the plugin starts
with ``--config-file``. The ConfigMap's files are written where kubelet would mount them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from gpulab.deviceplugin.config import Config, hami_config, render, time_slicing
from gpulab.deviceplugin.configmanager import NODE_LABEL
from gpulab.deviceplugin.rm import build_resources, parse_mig_minors
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu import render as fakegpu_render
from gpulab.fakegpu.nvml import shim_env
from gpulab.hami.annotations import DEFAULT_SPLIT_COUNT
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS, Transform, apply, load_documents
from harness.errors import HarnessError
from harness.spec import DevicePluginConfig, NodeSpec

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
GPULAB = [sys.executable, "-m", "gpulab"]
NAMESPACE = "gpulab-system"
CONFIGMAP = "nvidia-device-plugin-configs"
DEFAULT_CONFIG = "default"
ADVERTISE_TIMEOUT = 90.0


def fake_gpu_root(cluster_dir: Path) -> Path:
    """Where this cluster's simulated GPUs keep their config and faults."""
    return cluster_dir / "fake-gpu"


def socket_dir(cluster_dir: Path, node: str) -> Path:
    return cluster_dir / "nodes" / node / "device-plugins"


def config_dirs(cluster_dir: Path, node: str) -> tuple[Path, Path]:
    """(the ConfigMap as kubelet mounts it, the selected config) for one node."""
    base = cluster_dir / "nodes" / node
    return base / "available-configs", base / "config" / "config.yaml"


# ---------------------------------------------------------------- pure


def config_name(settings: DevicePluginConfig) -> str:
    """The named config a node's ``devicePlugin:`` settings select (HAMi: flag, not config)."""
    if settings.hami:
        return DEFAULT_CONFIG
    parts = []
    if settings.mig_strategy != "none":
        parts.append(f"mig-{settings.mig_strategy}")
    if settings.replicas > 1:
        parts.append(f"time-slicing-{settings.replicas}")
    return "-".join(parts) or DEFAULT_CONFIG


def plugin_config(settings: DevicePluginConfig) -> Config:
    """What the device plugin runs with on such a node (its config file, or HAMi mode)."""
    if settings.hami:
        return hami_config(DEFAULT_SPLIT_COUNT)
    return Config(mig_strategy=settings.mig_strategy, time_slicing=time_slicing(settings.replicas))


def named_configs(nodes: Iterable[NodeSpec]) -> dict[str, str]:
    """The configs ConfigMap's data: the shipped named configs (manifests/device-plugin)
    plus one for every other combination of settings the nodes ask for."""
    shipped = next(
        d
        for d in load_documents([MANIFESTS / "device-plugin"])
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == CONFIGMAP
    )
    out = dict(shipped.get("data") or {})
    for node in nodes:
        name = config_name(node.device_plugin)
        if node.profile and name not in out:
            out[name] = render(plugin_config(node.device_plugin))
    return dict(sorted(out.items()))


def with_node_configs(transform: Transform, nodes: list[NodeSpec]) -> Transform:
    """Apply the configs ConfigMap with the spec's configs added (see named_configs)."""

    def apply_one(doc: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == CONFIGMAP:
            doc = {**doc, "data": named_configs(nodes)}
        return transform(doc)

    return apply_one


def expected_resources(node: NodeSpec) -> dict[str, int]:
    """What the node should advertise once its plugin has registered: the device plugin's
    own resource builder over what NVML will report for the node's profile (pure)."""
    if not node.profile:
        return {}
    profile = profiles.load(node.profile)
    resources = build_resources(
        inventory.gpu_infos(profile, node.name),
        plugin_config(node.device_plugin),
        parse_mig_minors(fakegpu_render.mig_minors(profile)),
    )
    return {r.name: len(r.devices) for r in resources}


# ---------------------------------------------------------------- processes


def start(cluster: LocalCluster, progress: Progress) -> None:
    """Start plugin + node agent per GPU node and wait until nodes advertise the devices."""
    root = fake_gpu_root(cluster.dir)
    gpu_nodes = [n for n in cluster.spec.nodes if n.profile]
    api = cluster.api()
    transform = with_node_configs(
        cluster.apply_transform(dry_run_workloads=True), list(cluster.spec.nodes)
    )
    apply(api, [MANIFESTS / "device-plugin"], progress, transform)
    core = client.CoreV1Api(api)
    data = named_configs(cluster.spec.nodes)
    for node in gpu_nodes:
        core.patch_node(
            node.name, {"metadata": {"labels": {NODE_LABEL: config_name(node.device_plugin)}}}
        )
        srcdir, _ = config_dirs(cluster.dir, node.name)
        srcdir.mkdir(parents=True, exist_ok=True)
        for name, text in data.items():
            (srcdir / name).write_text(text)
    _select_configs(cluster, gpu_nodes)
    for node in gpu_nodes:
        sockets = socket_dir(cluster.dir, node.name)
        sockets.mkdir(parents=True, exist_ok=True)
        _, selected = config_dirs(cluster.dir, node.name)
        cluster.start_process(
            f"node-agent-{node.name}",
            [*GPULAB, "node-agent", "--node-name", node.name, "--socket-dir", str(sockets),
             "--kubeconfig", str(cluster.kubeconfig)],
        )  # fmt: skip
        cluster.start_process(
            f"device-plugin-{node.name}",
            [*GPULAB, "device-plugin", "--node-name", node.name, "--socket-dir", str(sockets),
             "--config-file", str(selected), "--kubeconfig", str(cluster.kubeconfig),
             *(["--hami"] if node.device_plugin.hami else [])],
            env=shim_env(node.name, node.profile, root),
        )  # fmt: skip
    progress(f"started a device plugin and node agent on {len(gpu_nodes)} GPU nodes")
    _wait_advertised(cluster, gpu_nodes, progress)


def _select_configs(cluster: LocalCluster, nodes: list[NodeSpec]) -> None:
    """The DaemonSet's init container on every node, in parallel."""
    procs = []
    for node in nodes:
        srcdir, dst = config_dirs(cluster.dir, node.name)
        argv = [*GPULAB, "config-manager", "--oneshot", "--node-name", node.name,
                "--config-file-srcdir", str(srcdir), "--config-file-dst", str(dst),
                "--fallback-strategies", "named,empty",
                "--kubeconfig", str(cluster.kubeconfig)]  # fmt: skip
        out = subprocess.PIPE
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True)
        procs.append((node, proc))
    for node, proc in procs:
        output, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise HarnessError(f"config-manager on {node.name} failed: {output.strip()}")


def _wait_advertised(cluster: LocalCluster, nodes: list[NodeSpec], progress: Progress) -> None:
    core = client.CoreV1Api(cluster.api())
    pending = {n.name: expected_resources(n) for n in nodes}

    def advertised() -> bool:
        cluster.check_alive()
        for name, resources in list(pending.items()):
            alloc = core.read_node(name).status.allocatable or {}
            if all(alloc.get(r) == str(v) for r, v in resources.items()):
                del pending[name]
        return not pending

    try:
        wait_for(advertised, ADVERTISE_TIMEOUT, "the nodes to advertise their GPUs")
    except WaitTimeout:
        name = next(iter(pending))
        raise HarnessError(
            f"node {name} does not advertise {pending[name]} after {ADVERTISE_TIMEOUT:g}s; "
            f"see {cluster.dir / 'logs' / f'device-plugin-{name}.log'} and "
            f"node-agent-{name}.log"
        ) from None
    progress(f"device plugins registered: {len(nodes)} nodes advertise their GPUs")

"""Addon ``device-plugin``: for every GPU node, the NVIDIA device plugin reading that
node's GPUs through the NVML shim, and the node agent playing kubelet's device manager for
it, on a per-node device-plugins directory (what ``/var/lib/kubelet/device-plugins`` is on
a real node). On kind the DaemonSet in ``manifests/device-plugin/`` does the same.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kubernetes import client

from gpulab.fakegpu import profiles
from gpulab.fakegpu.nvml import shim_env
from gpulab.hami.annotations import DEFAULT_SPLIT_COUNT
from harness.apply import MANIFESTS, apply
from harness.errors import HarnessError
from harness.spec import NodeSpec

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
GPULAB = [sys.executable, "-m", "gpulab"]


def fake_gpu_root(cluster_dir: Path) -> Path:
    """Where this cluster's simulated GPUs keep their config and faults."""
    return cluster_dir / "fake-gpu"


def socket_dir(cluster_dir: Path, node: str) -> Path:
    return cluster_dir / "nodes" / node / "device-plugins"


def expected_resources(node: NodeSpec) -> dict[str, int]:
    """What the node should advertise once its plugin has registered (pure)."""
    profile = profiles.load(node.profile) if node.profile else None
    if profile is None:
        return {}
    cfg = node.device_plugin
    if cfg.mig_strategy == "mixed":
        counts: dict[str, int] = {}
        for gpu in profile.gpus:
            if gpu.mig_enabled:
                for mig in gpu.mig_instances:
                    name = f"nvidia.com/mig-{mig.name}"
                    counts[name] = counts.get(name, 0) + cfg.replicas
            else:
                counts["nvidia.com/gpu"] = counts.get("nvidia.com/gpu", 0) + cfg.replicas
        return counts
    if cfg.mig_strategy == "single":
        # every MIG device counts as one nvidia.com/gpu (the plugin insists on one layout)
        total = sum(len(g.mig_instances) or 1 for g in profile.gpus)
        return {"nvidia.com/gpu": total * cfg.replicas}
    # HAMi mode advertises its split count of shares per GPU (gpulab device-plugin --hami)
    shares = DEFAULT_SPLIT_COUNT if cfg.hami and cfg.replicas == 1 else cfg.replicas
    return {"nvidia.com/gpu": len(profile.gpus) * shares}


def start(cluster: LocalCluster, progress: Progress) -> None:
    """Start plugin + node agent per GPU node and wait until nodes advertise the devices."""
    root = fake_gpu_root(cluster.dir)
    gpu_nodes = [n for n in cluster.spec.nodes if n.profile]
    for node in gpu_nodes:
        sockets = socket_dir(cluster.dir, node.name)
        sockets.mkdir(parents=True, exist_ok=True)
        cfg = node.device_plugin
        cluster.start_process(
            f"node-agent-{node.name}",
            [
                *GPULAB,
                "node-agent",
                "--node-name",
                node.name,
                "--socket-dir",
                str(sockets),
                "--kubeconfig",
                str(cluster.kubeconfig),
            ],
        )
        cluster.start_process(
            f"device-plugin-{node.name}",
            [
                *GPULAB,
                "device-plugin",
                "--node-name",
                node.name,
                "--socket-dir",
                str(sockets),
                "--mig-strategy",
                cfg.mig_strategy,
                "--replicas",
                str(cfg.replicas),
                "--kubeconfig",
                str(cluster.kubeconfig),
                *(["--hami"] if cfg.hami else []),
            ],
            env=shim_env(node.name, node.profile, root),
        )
    progress(f"started a device plugin and node agent on {len(gpu_nodes)} GPU nodes")
    apply(
        cluster.api(),
        [MANIFESTS / "device-plugin"],
        progress,
        cluster.apply_transform(dry_run_workloads=True),
    )
    _wait_advertised(cluster, gpu_nodes, progress)


def _wait_advertised(cluster: LocalCluster, nodes: list[NodeSpec], progress: Progress) -> None:
    core = client.CoreV1Api(cluster.api())
    want = {n.name: expected_resources(n) for n in nodes}
    deadline = time.monotonic() + 90
    pending = dict(want)
    while pending and time.monotonic() < deadline:
        cluster.check_alive()
        for name, resources in list(pending.items()):
            alloc = core.read_node(name).status.allocatable or {}
            if all(alloc.get(r) == str(v) for r, v in resources.items()):
                del pending[name]
        if pending:
            time.sleep(0.2)
    if pending:
        name = next(iter(pending))
        raise HarnessError(
            f"node {name} does not advertise {pending[name]} after 90s; see "
            f"{cluster.dir / 'logs' / f'device-plugin-{name}.log'} and node-agent-{name}.log"
        )
    progress(f"device plugins registered: {len(nodes)} nodes advertise their GPUs")

"""Addon ``scheduling``: the scheduling-framework chapter's components as host processes:
gpulab-scheduler (gpulab/framework + gpulab/schedulerplugins), the PodGroup controller
and a topology updater per GPU node.

On kind these are the Deployments and the DaemonSet in ``manifests/scheduling/``. Here:
- every GPU node gets a kubelet configuration with the Topology Manager's
  ``single-numa-node`` policy (and the static CPU and memory managers) and a machine
  file (its NUMA nodes: the GPU profile's NUMA layout, the node's CPUs and memory split
  evenly) in its kubelet root ``<state>/nodes/<node>/`` - the node agent enforces them,
  the topology updater publishes them; node agents already running are restarted, as a
  kubelet must be to change these settings;
- gpulab-scheduler reads the ConfigMap's KubeSchedulerConfiguration
  (``clientConnection.kubeconfig`` pointed at the cluster) and serves /healthz on a free
  loopback port;
- the CRDs (PodGroup, NodeResourceTopology) are applied first, so informers find them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes import client

from gpulab.kueue.api import quantity
from gpulab.nodeagent.topology import (
    KUBELET_CONFIG,
    MACHINE_INFO,
    SINGLE_NUMA_NODE,
    KubeletConfig,
    MachineInfo,
)
from gpulab.wait import wait_for
from harness.addons.device_plugin import GPULAB
from harness.apply import MANIFESTS, apply, load_documents
from harness.errors import HarnessError
from harness.local import ProcessRecord, pid_alive
from harness.ports import free_port

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
SCHEDULER = "gpulab-scheduler"
CONTROLLER = "podgroup-controller"
UPDATER = "topology-updater"
# what the chapter's GPU nodes run with (kubelet flags --topology-manager-policy ...)
KUBELET = KubeletConfig(
    topology_manager_policy=SINGLE_NUMA_NODE,
    topology_manager_scope="container",
    cpu_manager_policy="static",
    memory_manager_policy="Static",
)
MANIFEST_DIR = MANIFESTS / "scheduling"


def kubelet_root(cluster: LocalCluster, node: str) -> Path:
    """The node's /var/lib/kubelet (device-plugins/ is in it)."""
    return cluster.dir / "nodes" / node


def start(cluster: LocalCluster, progress: Progress) -> None:
    apply(cluster.api(), [MANIFEST_DIR], progress, cluster.apply_transform(dry_run_workloads=True))
    gpu_nodes = [n for n in cluster.spec.nodes if n.profile]
    running = {r.name for r in cluster.processes()}
    for node in gpu_nodes:
        root = kubelet_root(cluster, node.name)
        root.mkdir(parents=True, exist_ok=True)
        (root / KUBELET_CONFIG).write_text(KUBELET.to_yaml())
        machine = MachineInfo.of(
            node.name, node.profile, int(quantity(node.cpu)), int(quantity(node.memory))
        )
        (root / MACHINE_INFO).write_text(machine.to_yaml())
        if f"node-agent-{node.name}" in running:  # a kubelet reads its config at start
            cluster.restart_process(f"node-agent-{node.name}")
    port = free_port()
    start_scheduler(cluster, port)
    cluster.start_process(
        CONTROLLER, [*GPULAB, "podgroup-controller", "--kubeconfig", str(cluster.kubeconfig)]
    )
    for node in gpu_nodes:
        root = kubelet_root(cluster, node.name)
        cluster.start_process(
            f"{UPDATER}-{node.name}",
            [
                *GPULAB,
                "topology-updater",
                "--node-name",
                node.name,
                "--kubelet-config-uri",
                f"file://{root / KUBELET_CONFIG}",
                "--machine-info",
                str(root / MACHINE_INFO),
                "--kubeconfig",
                str(cluster.kubeconfig),
            ],
        )
    wait_for_topologies(cluster, [n.name for n in gpu_nodes])
    progress(
        f"scheduling: {SCHEDULER} (healthz on 127.0.0.1:{port}), {CONTROLLER} and "
        f"{len(gpu_nodes)} topology updaters running; GPU nodes on {SINGLE_NUMA_NODE}"
    )


def wait_for_topologies(cluster: LocalCluster, nodes: list[str]) -> None:
    custom = client.CustomObjectsApi(cluster.api())

    def published() -> bool:
        cluster.check_alive()
        items = custom.list_cluster_custom_object(
            "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
        )["items"]
        return set(nodes) <= {i["metadata"]["name"] for i in items}

    wait_for(published, 60, f"NodeResourceTopologies of {', '.join(nodes)}")


def scheduler_config(cluster: LocalCluster) -> dict[str, Any]:
    """manifests/scheduling's KubeSchedulerConfiguration, pointed at this cluster."""
    configmap = next(
        d
        for d in load_documents([MANIFEST_DIR / "scheduler-config.yaml"])
        if d["kind"] == "ConfigMap"
    )
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig)}
    return config


def start_scheduler(cluster: LocalCluster, port: int) -> ProcessRecord:
    """Start gpulab-scheduler; return once /healthz answers (its informers synced)."""
    path = cluster.dir / f"{SCHEDULER}-config.yaml"
    path.write_text(yaml.safe_dump(scheduler_config(cluster), sort_keys=False))
    record = cluster.start_process(
        SCHEDULER,
        [*GPULAB, "scheduler", "--config", str(path), "--healthz-bind", f"127.0.0.1:{port}"],
        ports=[port],
    )
    cluster.wait_http(f"http://127.0.0.1:{port}/healthz", SCHEDULER, tls=False)
    return record


def restart_scheduler(cluster: LocalCluster) -> ProcessRecord:
    """Start gpulab-scheduler again on its port after it was stopped or killed."""
    record = process(cluster, SCHEDULER)
    if pid_alive(record.pid, record.exe):
        raise HarnessError(f"{SCHEDULER} still runs (pid {record.pid}); stop it first")
    return start_scheduler(cluster, record.ports[0])


def process(cluster: LocalCluster, name: str) -> ProcessRecord:
    for record in cluster.processes():
        if record.name == name:
            return record
    raise HarnessError(f"cluster {cluster.spec.name} runs no {name} (addon scheduling not started)")

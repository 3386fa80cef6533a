"""Addon ``scheduling``: the scheduling-framework chapter's components from
``manifests/scheduling/`` on every backend: gpulab-scheduler (gpulab/framework +
gpulab/schedulerplugins) and the PodGroup controller as Deployments, a topology updater
per GPU node as a DaemonSet (it publishes NodeResourceTopology objects from the node's
kubelet configuration and machine file under /var/lib/kubelet).

The GPU nodes' kubelets run with the spec's ``kubelet:`` settings (the chapter's specs:
the Topology Manager's ``single-numa-node`` policy with the static CPU and memory
managers); on the local backend the node agent enforces them (harness/local.py writes
them before it starts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client

from gpulab.wait import WaitTimeout, wait_for
from harness.addons import device_plugin
from harness.apply import MANIFESTS, load_documents
from harness.backends import SYSTEM_NAMESPACE, Backend, pod_ready
from harness.errors import HarnessError

Progress = Callable[[str], None]
SCHEDULER = "gpulab-scheduler"  # the Deployments' and DaemonSet's app.kubernetes.io/name
CONTROLLER = "podgroup-controller"
UPDATER = "topology-updater"
MANIFEST_DIR = MANIFESTS / "scheduling"
TIMEOUT = 120.0


def profile_config() -> dict[str, Any]:
    """The KubeSchedulerConfiguration gpulab-scheduler runs with (its ConfigMap's)."""
    configmap = next(
        d
        for d in load_documents([MANIFEST_DIR / "scheduler-config.yaml"])
        if d["kind"] == "ConfigMap"
    )
    return dict(yaml.safe_load(configmap["data"]["config.yaml"]))


def deploy(backend: Backend, progress: Progress) -> None:
    backend.apply([MANIFEST_DIR], progress)


def wait(backend: Backend, progress: Progress) -> None:
    # the topology updaters' DaemonSet runs where nvidia.com/gpu.present=true: not on the
    # nodes whose GPUs HAMi's device plugin registers (labelled gpu=on instead)
    wait_ready(backend, [n.name for n in device_plugin.plugin_nodes(backend)], progress)


def wait_ready(backend: Backend, nodes: list[str], progress: Progress) -> None:
    """Until the scheduler and controller are Ready and every GPU node's topology is
    published (the scheduler's NodeResourceTopologyMatch reads those)."""
    custom = client.CustomObjectsApi(backend.api())

    def published() -> bool:
        items = custom.list_cluster_custom_object(
            "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
        )["items"]
        return set(nodes) <= {i["metadata"]["name"] for i in items}

    def ready() -> bool:
        return (
            all(
                any(pod_ready(p) for p in backend.component_pods(name))
                for name in (SCHEDULER, CONTROLLER)
            )
            and published()
        )

    try:
        wait_for(ready, TIMEOUT, "the scheduling chapter's components", 0.25)
    except WaitTimeout:
        raise HarnessError(
            f"{SCHEDULER}, {CONTROLLER} or the topology updaters are not ready after "
            f"{TIMEOUT:g}s; see `gpulab kubectl -n {SYSTEM_NAMESPACE} get pods` and their logs"
        ) from None
    progress(
        f"scheduling: {SCHEDULER} and {CONTROLLER} Ready, {len(nodes)} NodeResourceTopologies "
        "published"
    )

"""``gpulab topology-updater``: keep one node's NodeResourceTopology current.

    gpulab topology-updater --node-name N --kubelet-config-uri file:///.../config.yaml \\
        --machine-info /.../machine.yaml [--sleep-interval 60s] [--kubeconfig K]

Mirrors node-feature-discovery v0.19.0 ``nfd-topology-updater`` (``Run``: on every
kubelet state change and every ``-sleep-interval`` scan the node's pods, aggregate the
zones, create or update the NodeResourceTopology named after the node;
``-kubelet-config-uri`` gives the topology manager policy and scope).

Lab differences: the kubelet "state change" is a change of the node's pods (a watch on
``spec.nodeName=<node>``, through gpulab.informer) instead of inotify on
/var/lib/kubelet; the machine's NUMA layout comes from ``--machine-info`` (a lab file
standing for sysfs, written with the node's kubelet configuration by the harness); only
``file://`` configuration URIs; no owner reference. Without a machine file (kind,
where no harness writes one) ``--profile`` and the Node's capacity describe it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.framework.resources import quantity
from gpulab.informer import PODS, Handlers, Informer, ListWatch
from gpulab.nodeagent import topology
from gpulab.topologyupdater.aggregate import aggregate, node_resource_topology
from gpulab.trace import ObjectRef, Tracer
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger(__name__)

COMPONENT = "topology-updater"
GROUP, VERSION, PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
Obj = Mapping[str, Any]


class TopologyUpdater:
    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        config_path: Path,
        machine_path: Path,
        sleep_interval: float,
        tracer: Tracer,
        profile: str | None = None,
    ) -> None:
        self.node = node
        self.config_path = config_path
        self.machine_path = machine_path
        self.profile = profile
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.tracer = tracer
        self.queue = WorkQueue()
        self.pods = Informer(
            ListWatch(api, PODS, field_selector=f"spec.nodeName={node}"),
            Handlers(self._changed, lambda _o, _n: self._changed(_n), self._changed),
            resync=sleep_interval or None,
            name="informer-pods",
        )
        self._published: dict[str, Any] | None = None

    def _changed(self, _pod: Obj) -> None:
        self.queue.add(self.node)

    def desired(self) -> dict[str, Any]:
        """The NodeResourceTopology this node should have now (re-reading the kubelet
        configuration and the machine, as nfd does on every interval)."""
        machine = topology.MachineInfo.load(self.machine_path) or self._machine_from_node()
        config = topology.KubeletConfig.load(self.config_path)
        return node_resource_topology(self.node, config, aggregate(machine, self.pods.store.list()))

    def _machine_from_node(self) -> topology.MachineInfo:
        """No machine file (kind): the profile's GPUs and the Node's CPUs and memory."""
        if self.profile is None:
            raise FileNotFoundError(f"--machine-info {self.machine_path} does not exist")
        capacity = self.core.read_node(self.node).status.capacity or {}
        return topology.MachineInfo.of(
            self.node,
            self.profile,
            int(quantity(capacity.get("cpu", "0"))),
            int(quantity(capacity.get("memory", "0"))),
        )

    def Reconcile(self, _key: str) -> float | None:
        nrt = self.desired()
        if nrt == self._published:
            return None
        try:
            current = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, self.node)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, nrt)
        else:
            body = {
                **nrt,
                "metadata": {
                    **nrt["metadata"],
                    "resourceVersion": current["metadata"]["resourceVersion"],
                },
            }
            self.custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, self.node, body)
        self._published = nrt
        summary = "; ".join(
            f"{z['name']}: "
            + ", ".join(f"{r['name']} {r['available']}/{r['allocatable']}" for r in z["resources"])
            for z in nrt["zones"]
        )
        ref = ObjectRef("NodeResourceTopology", self.node, api_version=f"{GROUP}/{VERSION}")
        self.tracer.step(
            "UpdateNodeResourceTopology",
            ref,
            f"available/allocatable {summary}",
            zones=nrt["zones"],
        )
        return None

    def run(self, stop: threading.Event) -> None:
        self.pods.start()
        self.pods.wait_for_sync(60)
        self.queue.add(self.node)
        worker = threading.Thread(
            target=run_worker, args=(self.queue, self.Reconcile, COMPONENT), daemon=True
        )
        worker.start()
        stop.wait()
        self.queue.shutdown()
        self.pods.stop()


def parse_duration(value: str) -> float:
    """Go-style durations the nfd flags take: 60s, 1m, 1h, 500ms, 0."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "h", "m", "s"):
        if value.endswith(suffix) and value[: -len(suffix)].replace(".", "", 1).isdigit():
            return float(value[: -len(suffix)]) * units[suffix]
    if value == "0":
        return 0.0
    raise ValueError(f"{value!r} is not a duration like 60s, 1m or 1h")


def config_path_of(uri: str) -> Path:
    if not uri.startswith("file://"):
        raise ValueError(f"--kubelet-config-uri {uri!r}: only file:// URIs are supported here")
    return Path(uri.removeprefix("file://"))

"""Demo `numa`: NodeResourceTopology - a pod lands where one NUMA node holds it all.

    topology updater: kubelet config + machine + pods' allocations -> NRT zones
    gpulab-scheduler: Filter (NodeResourceTopologyMatch: one NUMA zone per container)
                      -> Score (LeastAllocated over the zones) -> Bind
    node agent (kubelet's Topology Manager, single-numa-node): Admit on that NUMA node
                      -> Allocate its GPUs -> the updater publishes what is left

The GPU nodes run kubelet's single-numa-node policy. A Guaranteed pod asking for 4 GPUs,
12 CPUs and 16Gi fits every GPU node by count, but one NUMA node holds it only on
gpu-a100 (gpu-t4-*: 2 GPUs per NUMA node; gpu-h100: 8 CPUs per NUMA node). The Filter
table per node and zone is drawn with the plugin's own functions from the NRT objects,
next to the scheduler's verdict recorded on the pod. The topology updater then publishes
the zone as taken (the plugin's informer cache gets it). A smaller pod (2 GPUs, 4 CPUs)
fits a NUMA zone on several nodes: the plugin's Score reads each node's zones and scores
them (LeastAllocated), and the scheduler adds the plugins' scores. Without the plugin,
the default scheduler sends the big pod to a T4 node, and the kubelet side rejects it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.table import Table

from demos.common import (
    DemoFailed,
    LiveTrace,
    chapter,
    console,
    ensure_cluster,
    fresh_namespace,
    ok,
    say,
)
from gpulab import trace
from gpulab.fakegpu import profiles
from gpulab.framework.objects import GPU, make_pod, manifest
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT
from gpulab.framework.predicates import fits_request
from gpulab.framework.resources import GUARANTEED, pod_request
from gpulab.framework.snapshot import new_snapshot
from gpulab.nodeagent import policy, topology
from gpulab.schedulerplugins.noderesourcetopology.filter import FilterInfo, filter_numa
from gpulab.schedulerplugins.noderesourcetopology.numaresources import (
    create_numa_node_list,
    topology_manager_of,
)
from gpulab.wait import wait_for

NAMESPACE = "demo-numa"
SPEC = "scheduling"
SCHEDULER = "gpulab-scheduler"
NRT = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
WANT = {GPU: 4, "cpu": 12, "memory": "16Gi"}
SMALL = {GPU: 2, "cpu": 4, "memory": "8Gi"}  # one NUMA zone holds it on several nodes

Obj = dict[str, Any]


def numa_pod(name: str, want: Obj = WANT, **kw: Any) -> Obj:
    return make_pod(name, NAMESPACE, requests=want, limits=want, **kw)


@dataclasses.dataclass
class NumaTrace(LiveTrace):
    """The namespace's story, plus the topology updaters' NodeResourceTopology updates
    (cluster-scoped objects: their Events are in "default")."""

    def _wanted(self, ev: trace.TraceEvent, namespace: str) -> bool:
        if namespace == "default" and ev.regarding.startswith("NodeResourceTopology "):
            return ev.time >= self._since - dt.timedelta(seconds=2)
        return super()._wanted(ev, namespace)


def nrts(api: client.ApiClient) -> dict[str, Obj]:
    items = client.CustomObjectsApi(api).list_cluster_custom_object(*NRT)["items"]
    return {i["metadata"]["name"]: i for i in items}


def zones_table(objs: dict[str, Obj], title: str) -> None:
    table = Table(title=title)
    for col in ("node", "zone", "nvidia.com/gpu", "cpu", "memory (GiB)"):
        table.add_column(col)
    for node, obj in sorted(objs.items()):
        for zone in obj["zones"]:
            res = {r["name"]: r for r in zone["resources"]}

            def cell(name: str, scale: int = 1, res: dict = res) -> str:
                r = res.get(name)
                if r is None:
                    return "-"
                return f"{int(r['available']) // scale}/{int(r['allocatable']) // scale}"

            table.add_row(node, zone["name"], cell(GPU), cell("cpu"), cell("memory", 2**30))
    console.print(table)
    console.print("  [dim]available/allocatable, as the topology updaters publish them[/dim]")


def filter_table(api: client.ApiClient, pod: Obj, objs: dict[str, Obj]) -> dict[str, str]:
    """The Filter per node and NUMA zone, computed with the plugin's functions; returns
    NodeResourceTopologyMatch's predicted verdict for the nodes NodeResourcesFit passes
    ("passed" or the reason), as the scheduler records it."""
    pod = {**pod, "status": {"qosClass": GUARANTEED}}
    table = Table(title="Filter for 4 GPUs + 12 CPUs + 16Gi (Guaranteed), per node and zone")
    for col in (
        "node",
        "NodeResourcesFit",
        "zone node-0",
        "zone node-1",
        "NodeResourceTopologyMatch",
    ):
        table.add_column(col)
    verdicts = {}
    core = client.CoreV1Api(api)
    nodes = api.sanitize_for_serialization(core.list_node())["items"]
    pods = api.sanitize_for_serialization(core.list_pod_for_all_namespaces())["items"]
    for info in new_snapshot(nodes, pods):
        name = info.name
        fit = fits_request(pod_request(pod), info)
        fit_text = ", ".join(m.reason for m in fit) or "fits"
        nrt = objs.get(name)
        zone = {0: "-", 1: "-"}
        verdict, passed = "no NRT: passes", True
        if nrt is not None:
            finfo = FilterInfo(
                info, topology_manager_of(nrt), create_numa_node_list(nrt["zones"]), GUARANTEED
            )
            status, chosen = filter_numa(pod, finfo)
            for numa_id, why in finfo.trace.get("main", {}).items():
                short = why.replace("nvidia.com/gpu", "gpu").replace(" available < ", " < ")
                zone[numa_id] = "[green]fits[/green]" if why == "fits" else f"[red]{short}[/red]"
            passed = status.is_success()
            verdict = f"fits on node-{chosen['main']}" if passed else status.message
        if not fit:
            verdicts[name] = "passed" if passed else verdict
        table.add_row(name, fit_text, zone[0], zone[1], verdict)
    console.print(table)
    return verdicts


def run(args: argparse.Namespace) -> int:
    if args.spec == "default":
        args = argparse.Namespace(**{**vars(args), "spec": SPEC})
    api, _ = ensure_cluster(args, addons=("scheduling",))
    core = client.CoreV1Api(api)
    chapter(
        "Scheduling framework - NodeResourceTopology (NUMA)",
        "Each GPU node's kubelet runs the Topology Manager's single-numa-node policy: a\n"
        "container gets its GPUs, CPUs and memory from one NUMA node or the pod is rejected.\n"
        "Topology updaters publish every node's NUMA zones (NodeResourceTopology); the\n"
        "NodeResourceTopologyMatch plugin filters and scores nodes by those zones.",
    )
    fresh_namespace(api, NAMESPACE)
    with NumaTrace(api, NAMESPACE, also=("default",)) as live:
        console.rule("the zones the scheduler sees")
        before = wait_for(lambda: nrts(api) if len(nrts(api)) >= 4 else None, 30, "4 NRTs")
        zones_table(before, "NodeResourceTopology zones before")

        console.rule("a pod that needs one NUMA node")
        predicted = filter_table(api, numa_pod("train"), before)
        say("create train (schedulerName gpulab-scheduler)")
        client.CoreV1Api(api).create_namespaced_pod(
            NAMESPACE, manifest(numa_pod("train", scheduler=SCHEDULER))
        )
        pod = wait_for(
            lambda: (p := core.read_namespaced_pod("train", NAMESPACE)).spec.node_name and p,
            30,
            "train bound",
        )
        node = pod.spec.node_name
        result = json.loads(pod.metadata.annotations[FILTER_RESULT])
        actual = {n: r.get("NodeResourceTopologyMatch", "-") for n, r in result.items()}
        console.print(f"  the scheduler's NodeResourceTopologyMatch verdicts: {actual}")
        recorded = {n: v for n, v in actual.items() if v != "-"}
        if recorded != predicted:
            raise DemoFailed(f"the table predicted {predicted}, the scheduler found {recorded}")
        ok(f"train bound to {node}, the only node with one NUMA node holding it all")

        record = wait_for(
            lambda: (
                (p := core.read_namespaced_pod("train", NAMESPACE).metadata.annotations)
                and policy.annotation_key("main") in p
                and p
            ),
            30,
            "the node agent's Allocate",
        )
        devices = json.loads(record[policy.annotation_key("main")])["devices"][GPU]
        assignment = topology.decode({"metadata": {"annotations": record}})["main"]
        gpus = {
            profiles.gpu_uuid(node, g.index): g for g in profiles.load("a100-sxm4-40gb-x8").gpus
        }
        table = Table(
            title=f"Allocate on {node}: the Topology Manager chose NUMA {assignment.numa}"
        )
        for col in ("GPU UUID", "index", "NUMA"):
            table.add_column(col)
        for d in devices:
            table.add_row(d, str(gpus[d].index), str(gpus[d].numa_node))
        console.print(table)
        if {gpus[d].numa_node for d in devices} != {assignment.numa}:
            raise DemoFailed(f"GPUs {devices} are not all on NUMA node {assignment.numa}")
        ok(f"4 GPUs and {assignment.cpus} exclusive CPUs from NUMA node {assignment.numa}")
        wait_for(
            lambda: any(
                r["name"] == GPU and r["available"] == "0"
                for z in nrts(api)[node]["zones"]
                if z["name"] == f"node-{assignment.numa}"
                for r in z["resources"]
            ),
            30,
            "the updater to publish the zone as taken",
        )
        live.expect({"UpdateNodeResourceTopology"})  # its line before the table
        zones_table({node: nrts(api)[node]}, f"{node} after: node-{assignment.numa} is taken")

        console.rule("a pod that several NUMA zones hold: Score")
        say("create small: 2 GPUs + 4 CPUs + 8Gi (Guaranteed); one zone holds it on several nodes")
        core.create_namespaced_pod(
            NAMESPACE, manifest(numa_pod("small", SMALL, scheduler=SCHEDULER))
        )
        small = wait_for(
            lambda: (p := core.read_namespaced_pod("small", NAMESPACE)).spec.node_name and p,
            30,
            "small bound",
        )
        scored = json.loads(small.metadata.annotations[FILTER_RESULT])
        fits = sorted(n for n, r in scored.items() if all(v == "passed" for v in r.values()))
        if len(fits) < 2:
            raise DemoFailed(f"small should fit several nodes, it fits {fits}")
        live.expect({"Score"})
        ok(
            f"small fits {len(fits)} nodes ({', '.join(fits)}); NodeResourceTopologyMatch "
            f"scored each from its NRT zones, the scheduler added the plugins' scores: "
            f"bound to {small.spec.node_name}"
        )
        core.delete_namespaced_pod("small", NAMESPACE, grace_period_seconds=0)  # frees its GPUs
        wait_for(
            lambda: (
                "small" not in {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
            ),
            30,
            "small gone",
        )

        console.rule("the same pod without the plugin")
        say("the default scheduler counts GPUs per node only: pin the pod to gpu-t4-0")
        client.CoreV1Api(api).create_namespaced_pod(
            NAMESPACE,
            manifest(numa_pod("misplaced", node_selector={"kubernetes.io/hostname": "gpu-t4-0"})),
        )
        failed = wait_for(
            lambda: (
                (p := core.read_namespaced_pod("misplaced", NAMESPACE)).status.phase == "Failed"
                and p
            ),
            30,
            "the node agent to reject misplaced",
        )
        if failed.status.reason != "TopologyAffinityError":
            raise DemoFailed(f"misplaced failed with {failed.status.reason}, not TopologyAffinity")
        ok(f"kubelet side: {failed.status.reason}: {failed.status.message}")
        live.expect({"Filter", "Bind", "Allocate"})
        say(f"done; deleting the pods of {NAMESPACE} so the other demos find free GPUs")
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    diagram = getattr(args, "diagram", None)
    if diagram:
        live.write_diagram(Path(diagram))
    return 0

"""Demo `device-plugin`: NVIDIA k8s-device-plugin's call chain, live.

    main → Serve → Register → ListAndWatch  (kubelet learns the devices: node capacity)
    pod bound → GetPreferredAllocation → Allocate  (NVIDIA_VISIBLE_DEVICES=<uuids>)
    Xid 79 → ListAndWatch (one Unhealthy) → allocatable drops → clear → recovers
    MIG mixed: nvidia.com/mig-<g>g.<mem>gb resources and MIG UUIDs

Every step is read back from the Events the device plugin and the node agent (kubelet's
device manager on a kwok node) write as they execute it.
"""

from __future__ import annotations

import argparse
import json

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
from gpulab.fakegpu import faults, profiles
from gpulab.wait import wait_for
from harness.addons.device_plugin import fake_gpu_root
from harness.local import LocalCluster

NAMESPACE = "demo-device-plugin"
NODE, MIG_NODE = "gpu-a100", "gpu-a100-mig"
BROKEN_GPU = 7


def _pod(name: str, node: str, resources: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            containers=[
                client.V1Container(
                    name="cuda",
                    image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    command=["nvidia-smi", "-L"],
                    resources=client.V1ResourceRequirements(limits=resources),
                )
            ],
        ),
    )


def _allocation(core: client.CoreV1Api, name: str) -> dict | None:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    raw = (pod.metadata.annotations or {}).get("gpulab.io/allocate-cuda")
    return json.loads(raw) if raw else None


def _allocatable(core: client.CoreV1Api, node: str, resource: str) -> int:
    return int((core.read_node(node).status.allocatable or {}).get(resource, "0"))


def run(args: argparse.Namespace) -> int:
    api, spec = ensure_cluster(args, addons=("device-plugin",))
    core = client.CoreV1Api(api)
    if {NODE, MIG_NODE} - {n.name for n in spec.nodes}:
        raise DemoFailed(f"this demo needs nodes {NODE} and {MIG_NODE} (the default spec)")
    local = LocalCluster(spec)
    chapter(
        "Chapter 1 - the NVIDIA device plugin",
        "kubelet knows nothing about GPUs. A device plugin reads them through NVML, registers\n"
        "with kubelet over gRPC and streams the device list (ListAndWatch); kubelet advertises\n"
        "them as node capacity and, when a pod is bound, asks the plugin to Allocate some.",
    )
    fresh_namespace(api, NAMESPACE)
    profile = profiles.load("a100-sxm4-40gb-x8")
    by_uuid = {profiles.gpu_uuid(NODE, g.index): g for g in profile.gpus}

    with LiveTrace(api, NAMESPACE, also=("default",), nodes=(NODE, MIG_NODE)) as live:
        if local.running():  # the local backend; on kind the DaemonSet registered at `up`
            say(f"restart the device plugin on {NODE} (as a DaemonSet rollout would)")
            local.restart_process(f"device-plugin-{NODE}")
            live.expect({"Serve", "Register", "ListAndWatch", "GetCapacity"})
        gpus = _allocatable(core, NODE, "nvidia.com/gpu")
        if gpus != len(profile.gpus):
            raise DemoFailed(f"{NODE} advertises {gpus} GPUs, the profile has {len(profile.gpus)}")
        ok(f"{NODE} advertises nvidia.com/gpu: {gpus} — one per GPU NVML reports")

        say("create a pod asking for nvidia.com/gpu: 2 on gpu-a100")
        core.create_namespaced_pod(NAMESPACE, _pod("pair", NODE, {"nvidia.com/gpu": "2"}))
        alloc = wait_for(lambda: _allocation(core, "pair"), 60, "the Allocate response")
        live.expect({"Allocate"})
        uuids = alloc["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
        numa = {by_uuid[u].numa_node for u in uuids}
        table = Table(title="Allocate response for pod pair (what the container runtime gets)")
        table.add_column("GPU UUID")
        table.add_column("index")
        table.add_column("NUMA")
        for u in uuids:
            table.add_row(u, str(by_uuid[u].index), str(by_uuid[u].numa_node))
        console.print(table)
        if len(uuids) != 2 or len(numa) != 1:
            raise DemoFailed(f"expected 2 GPUs on one NUMA node, got {uuids} (NUMA {numa})")
        ok(f"NVIDIA_VISIBLE_DEVICES={alloc['envs']['NVIDIA_VISIBLE_DEVICES']} (one NUMA node)")

        if local.running():
            _xid_and_recovery(core, local, len(profile.gpus))
        else:  # the shim's fault files live in the kind node containers
            say("fault injection runs on the local backend only; skipping Xid 79")

        say(f"MIG mixed on {MIG_NODE}: one resource per MIG profile")
        alloc_mig = core.read_node(MIG_NODE).status.allocatable
        mig_resources = {k: v for k, v in alloc_mig.items() if k.startswith("nvidia.com/mig-")}
        if not mig_resources:
            raise DemoFailed(f"{MIG_NODE} advertises no nvidia.com/mig-* resources")
        for resource, count in sorted(mig_resources.items()):
            console.print(f"    {resource}: {count}")
        core.create_namespaced_pod(
            NAMESPACE, _pod("mig", MIG_NODE, {"nvidia.com/mig-1g.10gb": "1"})
        )
        alloc = wait_for(lambda: _allocation(core, "mig"), 60, "the MIG Allocate response")
        mig_uuid = alloc["envs"]["NVIDIA_VISIBLE_DEVICES"]
        if not mig_uuid.startswith("MIG-"):
            raise DemoFailed(f"a MIG pod got {mig_uuid}, not a MIG device UUID")
        ok(f"pod mig got MIG device {mig_uuid}")
    diagram = getattr(args, "diagram", None)
    if diagram:
        from pathlib import Path

        live.write_diagram(Path(diagram))
    return 0


def _xid_and_recovery(core: client.CoreV1Api, local: LocalCluster, gpus: int) -> None:
    """Xid 79 on one GPU → ListAndWatch marks it Unhealthy → allocatable drops; clear."""
    node_dir = fake_gpu_root(local.dir) / NODE
    say(f"inject Xid 79 (GPU has fallen off the bus) on {NODE} GPU {BROKEN_GPU}")
    faults.inject_xid(node_dir, BROKEN_GPU, faults.XID_FALLEN_OFF_BUS)
    try:
        wait_for(
            lambda: _allocatable(core, NODE, "nvidia.com/gpu") == gpus - 1,
            30,
            "allocatable to drop by one",
        )
        ok(f"ListAndWatch re-sent the list with GPU {BROKEN_GPU} Unhealthy: allocatable 7")
    finally:
        say("clear the fault (the GPU is back)")
        faults.clear(node_dir)
    wait_for(
        lambda: _allocatable(core, NODE, "nvidia.com/gpu") == gpus,
        30,
        "allocatable to recover",
    )
    ok("the health check saw it healthy again: allocatable back to 8")

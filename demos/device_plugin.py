"""Demo `device-plugin`: NVIDIA k8s-device-plugin v0.20.0's call chain, live.

    main → startPlugins → Serve → Register → (kubelet) GetDevicePluginOptions → ListAndWatch
    pod bound → GetPreferredAllocation → Allocate  (NVIDIA_VISIBLE_DEVICES=<uuids>)
    Xid 79 → CheckHealth → ListAndWatch (one Unhealthy) → allocatable drops; stays down
    until the plugin restarts
    MIG mixed: the plugin restarted on the MIG node advertises nvidia.com/mig-<g>g.<mem>gb
    resources; a pod asking for two 1g.10gb slices gets two MIG UUIDs

Every step is read back from the Events the device plugin and the node agent (kubelet's
device manager on a kwok node) write as they execute it. On kind the real kubelet calls
the plugin, and each GPU pod's container shows what it got: its NVIDIA_VISIBLE_DEVICES and
`nvidia-smi -L` run inside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import time
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client
from rich.table import Table

from demos.common import (
    DemoFailed,
    LiveTrace,
    chapter,
    console,
    ensure_backend,
    fresh_namespace,
    ok,
    say,
)
from gpulab.dashboard import chain
from gpulab.fakegpu import faults, profiles
from gpulab.nodeagent.policy import annotation_key
from gpulab.wait import WaitTimeout, wait_for
from harness.addons.device_plugin import COMPONENT
from harness.backends import Backend

NAMESPACE = "demo-device-plugin"
# gpu-h100: 8 GPUs on two NUMA nodes, one NVLink between every pair (so PCIe/NUMA decides),
# and its two lowest device IDs sit on different NUMA nodes: without GetPreferredAllocation
# kubelet's fallback would hand out a pair that crosses the socket link.
NODE, MIG_NODE = "gpu-h100", "gpu-a100-mig"
BROKEN_GPU = 7
GPU = "nvidia.com/gpu"
MIG_SLICE = "nvidia.com/mig-1g.10gb"


def _pod(name: str, node: str, resources: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace=NAMESPACE),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            containers=[
                client.V1Container(
                    name="cuda",
                    image="nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    # a real kubelet runs it (kind): list the GPUs, then hold them
                    command=["sh", "-c", "nvidia-smi -L; exec sleep infinity"],
                    resources=client.V1ResourceRequirements(limits=resources),
                )
            ],
        ),
    )


def _allocation(backend: Backend, name: str) -> dict[str, str]:
    """The envs Allocate gave pod ``name``'s container (harness: Backend.allocation)."""
    return wait_for(
        lambda: backend.allocation(NAMESPACE, name, "cuda"), 60, f"pod {name}'s Allocate response"
    )


def _inside(backend: Backend, name: str) -> None:
    """Where the container really runs (kind): what `nvidia-smi -L` shows inside it."""
    if not backend.runs_containers:
        return
    console.print(f"    nvidia-smi -L in pod {name}:")
    for line in backend.exec(NAMESPACE, name, "cuda", ["nvidia-smi", "-L"]).splitlines():
        console.print(f"      {line}")


def _allocatable(core: client.CoreV1Api, node: str, resource: str = GPU) -> int:
    return int((core.read_node(node).status.allocatable or {}).get(resource, "0"))


def _seen_since(
    live: LiveTrace, since: dt.datetime, step: str, note: str = "", node: str = NODE
) -> bool:
    """Has the device plugin reported ``step`` about ``node`` (its note containing ``note``)?"""
    return any(
        ev.component == "device-plugin"
        and ev.step == step
        and ev.regarding == f"Node {node}"
        and note in ev.note
        and ev.time >= since
        for ev in list(live.seen)
    )


def _restart_plugin(
    core: client.CoreV1Api,
    backend: Backend,
    live: LiveTrace,
    devices: Mapping[str, int],
    node: str = NODE,
) -> None:
    """Delete ``node``'s plugin pod (the DaemonSet makes a new one) and wait for *its*
    registration, its ``devices`` (resource -> count) listed and advertised, and its
    health check."""
    since = dt.datetime.now(dt.UTC)
    pod = backend.restart(COMPONENT, node)
    ok(f"the DaemonSet started pod {pod.metadata.name} on {node}")
    # The old plugin's ListAndWatch ended with its pod (kubelet: allocatable 0); only the
    # new plugin's Register and ListAndWatch bring the GPUs back. (Its own Events: the
    # node agent's repeated Register is one Event series, written back only now and then,
    # as client-go aggregates them.)
    for resource, count in devices.items():
        # each resource is a plugin of its own: its whole start-up in the trace, so the
        # story is printed at once and no line of it arrives after the rest
        wait_for(
            lambda r=resource: _seen_since(live, since, "ListAndWatch", f"{r}: ", node),
            60,
            f"the new plugin on {node} to list its {resource}",
        )
        wait_for(
            lambda r=resource, n=count: _allocatable(core, node, r) == n,
            30,
            f"{node} to advertise {count} {resource} again",
        )
        # Its health check starts after Register: an Xid from before then would never
        # reach it.
        wait_for(
            lambda r=resource: _seen_since(live, since, "CheckHealth", f"{r}: watching", node),
            30,
            f"the new plugin's health check of {resource} on {node}",
        )
    live.expect({"loadConfig", "Start", "Serve", "Register", "GetDevicePluginOptions"})


def run(args: argparse.Namespace) -> int:
    backend, spec = ensure_backend(args, addons=("device-plugin",))
    api = backend.api()
    core = client.CoreV1Api(api)
    if {NODE, MIG_NODE} - {n.name for n in spec.nodes}:
        raise DemoFailed(f"this demo needs nodes {NODE} and {MIG_NODE} (the default spec)")
    chapter(
        "Chapter 1 - the NVIDIA device plugin (k8s-device-plugin v0.20.0, kubelet v1.36.3)",
        "kubelet knows nothing about GPUs. A device plugin reads them through NVML, registers\n"
        "with kubelet over gRPC and streams the device list (ListAndWatch); kubelet advertises\n"
        "them as node capacity and, when a pod is bound, asks the plugin to Allocate some.",
    )
    fresh_namespace(api, NAMESPACE)
    profile = profiles.load(next(n.profile for n in spec.nodes if n.name == NODE) or "")
    gpus = len(profile.gpus)
    by_uuid = {profiles.gpu_uuid(NODE, g.index): g for g in profile.gpus}

    with LiveTrace(api, NAMESPACE, also=("default",), nodes=(NODE,)) as live:
        say(f"restart the device plugin on {NODE} (as a DaemonSet rollout would)")
        _restart_plugin(core, backend, live, {GPU: gpus})
        ok(f"{NODE} advertises {GPU}: {gpus} — one per GPU NVML reports")

        _numa_pair(core, backend, live, by_uuid)
        _xid_and_recovery(core, backend, live, gpus)
    # a trace of its own: the MIG node's lines would crowd the scenes above
    with LiveTrace(api, NAMESPACE, also=("default",), nodes=(MIG_NODE,)) as mig:
        _mig(core, backend, mig)
    diagram = getattr(args, "diagram", None)
    if diagram:
        Path(diagram).write_text(chain.sequence_diagram(live.seen + mig.seen))
        say(f"sequence diagram of this run written to {diagram}")
    return 0


def _numa_pair(core: client.CoreV1Api, backend: Backend, live: LiveTrace, by_uuid: dict) -> None:
    say(f"create a pod asking for {GPU}: 2 on {NODE}")
    core.create_namespaced_pod(NAMESPACE, _pod("pair", NODE, {GPU: "2"}))
    envs = _allocation(backend, "pair")
    live.expect({"GetPreferredAllocation", "Allocate"})
    naive = sorted(by_uuid)[:2]
    uuids = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    table = Table(title="Allocate response for pod pair (what the container runtime gets)")
    for column in ("GPU UUID", "index", "NUMA"):
        table.add_column(column)
    for u in uuids:
        table.add_row(u, str(by_uuid[u].index), str(by_uuid[u].numa_node))
    console.print(table)
    numa = {by_uuid[u].numa_node for u in uuids}
    if len(uuids) != 2 or len(numa) != 1:
        raise DemoFailed(f"expected 2 GPUs on one NUMA node, got {uuids} (NUMA {numa})")
    ok(f"NVIDIA_VISIBLE_DEVICES={envs['NVIDIA_VISIBLE_DEVICES']} (one NUMA node)")
    console.print(
        "    [yellow](the chapter differs)[/yellow] Allocate checks only that the IDs are "
        "known (kubelet offers healthy ones only), and sends no /dev/nvidia* Devices or "
        "driver Mounts unless passDeviceSpecs / volume-mounts are set: the NVIDIA Container "
        "Toolkit adds both from NVIDIA_VISIBLE_DEVICES"
    )
    _inside(backend, "pair")
    console.print(
        f"    without GetPreferredAllocation kubelet would have taken GPUs "
        f"{', '.join(str(by_uuid[u].index) for u in naive)} (NUMA "
        f"{', '.join(str(by_uuid[u].numa_node) for u in naive)}); go-gpuallocator's "
        "best-effort policy scores pairs by NVLinks, then by PCIe path"
    )
    if not backend.runs_containers:
        console.print(
            f"    (lab) kubelet keeps this in its checkpoint file; the node agent records it "
            f"in the pod annotation {annotation_key('cuda')}"
        )


def _next_second() -> None:
    """Start the next scene in a new second: the narrator orders one object's steps within
    a second by the call chain (gpulab.narrate), so a second round of the node's chain
    (an Xid right after the restart) in that second would be told as late."""
    now = time.time()
    time.sleep(math.ceil(now) - now + 0.05)


def _xid_and_recovery(core: client.CoreV1Api, backend: Backend, live: LiveTrace, gpus: int) -> None:
    """Xid 79 → Unhealthy for good → clear (the fake driver only) → restart → healthy."""
    _next_second()
    say(f"inject Xid 79 (GPU has fallen off the bus) on {NODE} GPU {BROKEN_GPU}")
    backend.inject_fault(NODE, BROKEN_GPU, faults.XID_FALLEN_OFF_BUS)
    wait_for(lambda: _allocatable(core, NODE) == gpus - 1, 30, "allocatable to drop by one")
    live.expect({"CheckHealth"})
    ok(f"CheckHealth saw the Xid; ListAndWatch re-sent the list with GPU {BROKEN_GPU} "
       f"Unhealthy: allocatable {gpus - 1}, capacity still {gpus}")  # fmt: skip
    console.print(
        "    v0.20.0 watches one device per GPU (health.go parentToDeviceMap): on a "
        "time-sliced node only one replica of the GPU goes Unhealthy; releases after "
        "v0.20.0 mark all of them (NVIDIA/k8s-device-plugin#1930)"
    )

    say("clear the fault in the simulated driver (lab convenience: `gpulab fake-gpu clear`)")
    backend.clear_faults(NODE)
    try:
        wait_for(lambda: _allocatable(core, NODE) == gpus, 3, "a recovery that must not come")
    except WaitTimeout:
        ok(
            f"still {gpus - 1}: NVML has no 'healthy again' event, and upstream's ListAndWatch "
            "has no way back from Unhealthy"
        )
    else:
        raise DemoFailed("the plugin marked a GPU Healthy again without a restart")

    say("restart the plugin (what an operator does after a GPU reset: delete its pod)")
    _restart_plugin(core, backend, live, {GPU: gpus})
    ok(
        f"allocatable back to {gpus}: the new plugin registered a fresh NVML event set, and "
        "NVML does not replay past events to it"
    )


def _mig_resources(core: client.CoreV1Api) -> dict[str, int]:
    """MIG_NODE's nvidia.com/mig-* resources and their capacity."""
    capacity = core.read_node(MIG_NODE).status.capacity or {}
    return {k: int(v) for k, v in capacity.items() if k.startswith("nvidia.com/mig-")}


def _mig(core: client.CoreV1Api, backend: Backend, live: LiveTrace) -> None:
    say(f"MIG mixed on {MIG_NODE}: restart its plugin, one resource per MIG profile")
    mig_resources = _mig_resources(core)
    if not mig_resources:
        raise DemoFailed(f"{MIG_NODE} advertises no nvidia.com/mig-* resources")
    _restart_plugin(core, backend, live, mig_resources, MIG_NODE)
    ok(f"{MIG_NODE} advertises " + ", ".join(f"{r}: {n}" for r, n in sorted(mig_resources.items())))
    _next_second()
    say(f"create a pod asking for {MIG_SLICE}: 2 on {MIG_NODE}")
    core.create_namespaced_pod(NAMESPACE, _pod("mig", MIG_NODE, {MIG_SLICE: "2"}))
    visible = _allocation(backend, "mig")["NVIDIA_VISIBLE_DEVICES"].split(",")
    live.expect({"Allocate"})
    if len(visible) != 2 or not all(u.startswith("MIG-") for u in visible):
        raise DemoFailed(f"a pod asking for two MIG slices got {visible}")
    ok(f"pod mig got two MIG devices: {', '.join(visible)}")
    _inside(backend, "mig")

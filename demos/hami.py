"""Demo `hami`: vGPU sharing with HAMi's scheduler extender.

A pod asking for ``nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30``
goes: API server → the extender's mutating webhook (schedulerName ``hami-scheduler``) →
the second kube-scheduler ``hami-scheduler`` → extender ``/filter`` (one node, one card,
recorded on the pod) → extender ``/bind`` (node lock, allocation annotations, Binding) →
the node agent (kubelet's device manager) calls the device plugin's Allocate, which reads
the annotations, sets the hami-core envs and marks ``hami.io/bind-phase=success``.

Shown for three pods sharing one GPU (binpack), three pods on three GPUs (spread), and a
pod no GPU can hold (Pending with the extender's reasons); then the extender's /healthz,
/readyz and metrics.
"""

from __future__ import annotations

import argparse
import json
import ssl
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
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
from gpulab.hami import annotations as ha
from gpulab.hami.commands import explain_rows
from gpulab.hami.scheduler import FILTER_RESULT
from gpulab.hami.score import BINPACK, GPU_POLICY_ANNOTATION, SPREAD
from gpulab.nodeagent.policy import ANNOTATION_PREFIX
from gpulab.wait import wait_for
from harness.addons.hami import EXTENDER
from harness.local import LocalCluster
from harness.spec import ClusterSpec

NAMESPACE = "demo-hami"
IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
SPEC = "hami"  # the default cluster's device plugins do not register GPUs for HAMi
MIB = 2**20

Obj = dict[str, Any]


def vgpu_pod(name: str, mem: int, cores: int, gpu_policy: str | None = None) -> Obj:
    """A pod with one container asking for one vGPU of ``mem`` MiB and ``cores`` %."""
    annotations = {GPU_POLICY_ANNOTATION: gpu_policy} if gpu_policy else {}
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}
    if cores:
        limits["nvidia.com/gpucores"] = str(cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": IMAGE,
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": limits},
                }
            ]
        },
    }


def read_pod(api: client.ApiClient, ns: str, name: str) -> Obj:
    core = client.CoreV1Api(api)
    return api.sanitize_for_serialization(core.read_namespaced_pod(name, ns))


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("annotations") or {})


def allocated(pod: Mapping[str, Any]) -> bool:
    """Bound and allocated: the device plugin marked ``hami.io/bind-phase=success``."""
    return bool(pod.get("spec", {}).get("nodeName")) and (
        annotations(pod).get(ha.BIND_PHASE) == ha.BIND_SUCCESS
    )


def placement(pod: Mapping[str, Any]) -> tuple[str, list[ha.ContainerDevice]]:
    """(node, the GPU shares of every container) as the extender recorded them."""
    annos = annotations(pod)
    devices = ha.decode_pod_devices(annos.get(ha.DEVICES_ALLOCATED, ""))
    return pod["spec"]["nodeName"], [d for ctr in devices for d in ctr]


def wait_allocated(api: client.ApiClient, ns: str, name: str, timeout: float = 60) -> Obj:
    return wait_for(
        lambda: (p := read_pod(api, ns, name)) and allocated(p) and p,
        timeout,
        f"pod {ns}/{name} to be bound and allocated ({ha.BIND_PHASE}={ha.BIND_SUCCESS})",
    )


def gpu_usage(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(node, GPU UUID) → (shares, MiB, cores %) summed over the allocations of the pods
    that hold GPUs (bound, not finished), as the extender counts them."""
    sums: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in pods:
        finished = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if finished or not pod["spec"].get("nodeName"):
            continue
        if not annotations(pod).get(ha.DEVICES_ALLOCATED):
            continue
        node, devices = placement(pod)
        for d in devices:
            s = sums[(node, d.uuid)]
            s[0], s[1], s[2] = s[0] + 1, s[1] + d.usedmem, s[2] + d.usedcores
    return {k: (v[0], v[1], v[2]) for k, v in sums.items()}


def registered_gpus(api: client.ApiClient) -> dict[tuple[str, str], ha.NodeDevice]:
    """(node, GPU UUID) → the card as the device plugin registered it for HAMi."""
    gpus = {}
    for node in client.CoreV1Api(api).list_node().items:
        value = (node.metadata.annotations or {}).get(ha.NODE_REGISTER)
        for d in ha.decode_node_devices(value) if value else []:
            gpus[(node.metadata.name, d.id)] = d
    return gpus


def failed_scheduling(api: client.ApiClient, ns: str, name: str) -> str | None:
    """kube-scheduler's latest FailedScheduling message for the pod, if any."""
    events = client.CoreV1Api(api).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    )
    latest = max(events.items, key=lambda e: e.last_timestamp or e.event_time, default=None)
    return latest.message if latest else None


def extender_urls(spec: ClusterSpec) -> tuple[str, str, Path] | None:
    """(routes URL, metrics URL, CA file) of the local extender process; None elsewhere."""
    local = LocalCluster(spec)
    rec = next((p for p in local.processes() if p.name == EXTENDER), None)
    if rec is None:
        return None
    return (
        f"https://127.0.0.1:{rec.ports[0]}",
        f"http://127.0.0.1:{rec.ports[1]}",
        local.pki / "ca.crt",
    )


# ------------------------------------------------------------------------- narration


def _explain(pod: Obj) -> None:
    record = json.loads(annotations(pod)[FILTER_RESULT])
    name = pod["metadata"]["name"]
    table = Table(
        title=f"Filter for {name}: nodes {record['nodePolicy']}, GPUs {record['gpuPolicy']}"
    )
    for col in ("node", "fit", "reason", "score", "GPUs"):
        table.add_column(col)
    for row in explain_rows(record):
        table.add_row(*row, style="bold green" if row[0].startswith("★") else None)
    console.print(table)


def _allocation(pod: Obj) -> None:
    name = pod["metadata"]["name"]
    annos = annotations(pod)
    node, devices = placement(pod)
    grants = ", ".join(f"{d.uuid} {d.usedmem}MiB {d.usedcores}%" for d in devices)
    say(f"Bind: {name} → {node}; {ha.DEVICES_ALLOCATED}: {grants}")
    for key, value in sorted(annos.items()):
        if key.startswith(ANNOTATION_PREFIX):
            envs = json.loads(value).get("envs", {})
            shown = ", ".join(f"{k}={v}" for k, v in sorted(envs.items()))
            say(f"Allocate ({key.removeprefix(ANNOTATION_PREFIX)}): {shown}")


def _scene(api: client.ApiClient, policy: str, names: list[str]) -> list[Obj]:
    core = client.CoreV1Api(api)
    pods = []
    for name in names:
        say(f"create {name}: nvidia.com/gpu 1, gpumem 3000 MiB, gpucores 30 %, GPUs {policy}")
        created = core.create_namespaced_pod(NAMESPACE, vgpu_pod(name, 3000, 30, policy))
        if created.spec.scheduler_name != "hami-scheduler":
            raise DemoFailed(f"the webhook did not send {name} to hami-scheduler")
        pod = wait_allocated(api, NAMESPACE, name)
        _explain(pod)
        _allocation(pod)
        pods.append(pod)
    return pods


def _health_and_metrics(api: client.ApiClient, spec: ClusterSpec, gpu: tuple[str, str]) -> None:
    urls = extender_urls(spec)
    if urls is None:
        say("the extender runs in the hami-scheduler pod here: kubectl port-forward to see it")
        return
    routes, metrics, ca = urls
    with httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=5) as http:
        for path in ("/healthz", "/readyz"):
            r = http.get(routes + path)
            if r.status_code != 200:
                raise DemoFailed(f"extender {path}: HTTP {r.status_code} {r.text}")
            ok(f"GET {routes}{path} → {r.status_code} {r.text.strip()[:60]}")
    text = httpx.get(metrics + "/metrics", timeout=5).text
    node, uuid = gpu
    lines = [
        line
        for line in text.splitlines()
        if line.startswith(("hami_scheduler_filter_total", "hami_scheduler_bind_total"))
        or (line.startswith("GPUDeviceMemoryAllocated{") and uuid in line)
        or (line.startswith("GPUDeviceSharedNum{") and uuid in line)
    ]
    for line in lines:
        console.print(f"  [dim]{line}[/dim]")
    mem = next((float(x.rsplit(" ", 1)[1]) for x in lines if "MemoryAllocated" in x), None)
    # the extender's books against what the pods' annotations say is on that GPU
    pods = api.sanitize_for_serialization(client.CoreV1Api(api).list_pod_for_all_namespaces())
    want = gpu_usage(pods["items"])[gpu][1]
    if mem != want * MIB:
        raise DemoFailed(f"metrics show {mem} bytes allocated on {uuid}; the pods hold {want} MiB")
    ok(f"metrics: {want} MiB allocated on {node}'s {uuid}, as the pods' annotations say")


def run(args: argparse.Namespace) -> int:
    if args.spec == "default":
        args = argparse.Namespace(**{**vars(args), "spec": SPEC})
    api, spec = ensure_cluster(args, addons=("hami",))
    chapter(
        "HAMi - sharing GPUs by memory and cores",
        "GPU nodes register their cards in hami.io/node-nvidia-register; the extender's\n"
        "webhook sends vGPU pods to kube-scheduler 'hami-scheduler', which asks the\n"
        "extender to Filter (one node, one card) and Bind; the device plugin's Allocate\n"
        "turns the pod's annotations into NVIDIA_VISIBLE_DEVICES and hami-core limits.",
    )
    gpus = registered_gpus(api)
    if not gpus:
        raise DemoFailed(f"no node has {ha.NODE_REGISTER}: start the device plugins with hami")
    say(f"{len(gpus)} GPUs registered for HAMi on {len({n for n, _ in gpus})} nodes")
    fresh_namespace(api, NAMESPACE)
    nodes = tuple(sorted({n for n, _ in gpus}))
    with LiveTrace(api, NAMESPACE, also=("default",), nodes=nodes) as live:
        console.rule("binpack: three pods, one GPU")
        packed = _scene(api, BINPACK, ["binpack-1", "binpack-2", "binpack-3"])
        console.rule("spread: three pods, three GPUs")
        spread = _scene(api, SPREAD, ["spread-1", "spread-2", "spread-3"])
        console.rule("a pod no GPU can hold")
        say("create too-big: gpumem 50000 MiB (more than any card has)")
        client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, vgpu_pod("too-big", 50000, 10))
        reason = wait_for(
            lambda: failed_scheduling(api, NAMESPACE, "too-big"), 60, "FailedScheduling of too-big"
        )
        pending = read_pod(api, NAMESPACE, "too-big")
        _explain(pending)
        live.expect({"Webhook", "Filter", "LockNode", "Bind", "Scheduled", "Allocate"})
    diagram = getattr(args, "diagram", None)
    if diagram:
        live.write_diagram(Path(diagram))

    console.rule("[bold]outcome")
    where = {placement(p)[0] for p in packed}, {placement(p)[1][0].uuid for p in packed}
    if len(where[0]) != 1 or len(where[1]) != 1:
        raise DemoFailed(f"binpack pods are spread over nodes {where[0]} and GPUs {where[1]}")
    node, uuid = next(iter(where[0])), next(iter(where[1]))
    ok(f"binpack: binpack-1..3 share {node}'s GPU {uuid} (3 x 3000 MiB, 3 x 30 %)")
    cards = {placement(p)[1][0].uuid for p in spread}
    if len(cards) != 3:
        raise DemoFailed(f"spread pods landed on {len(cards)} GPUs, expected 3: {cards}")
    ok(f"spread: spread-1..3 on three different GPUs {sorted(cards)}")
    if pending["status"].get("phase") != "Pending" or pending["spec"].get("nodeName"):
        raise DemoFailed("too-big was placed although no GPU has 50000 MiB")
    if "CardInsufficientMemory" not in reason:
        raise DemoFailed(
            f"too-big's FailedScheduling does not give the extender's reason: {reason}"
        )
    ok(f"too-big stays Pending: {reason.split('. ')[0]}")
    _health_and_metrics(api, spec, (node, uuid))
    return 0

"""Demo `hami`: vGPU sharing with HAMi's scheduler extender (as HAMi v2.10.0).

A pod asking for ``nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30``
goes: API server → the extender's mutating webhook (schedulerName ``hami-scheduler``) →
the second kube-scheduler ``hami-scheduler`` → extender ``/filter`` (one node, one card;
Filter writes the choice on the pod: ``hami.io/vgpu-node`` and both
``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated``:
``FilteringSucceed``) → extender ``/bind`` (takes the node lock ``hami.io/mutex.lock``,
writes ``hami.io/bind-phase=allocating`` and ``hami.io/bind-time``, creates the Binding:
``BindingSucceed``) → the node agent (kubelet's device manager) calls the device plugin's
Allocate, which reads the annotations, sets the hami-core envs, marks
``hami.io/bind-phase=success`` and only then releases the node lock. The lock's life is
narrated from the node's annotation.

Shown for three pods sharing one GPU (binpack), three pods on three GPUs (spread); a pod
whose own ``nvidia-smi`` shows its GPU as 3000 MiB (HAMi-core's memory limit, which the NVML
shim applies as HAMi-core's hook does); a pod with ``nvidia.com/priority`` (kube-scheduler
leaves it to the extender); HAMi's MIG mode on ``gpu-a100-mig`` (a 1g.5gb and a 3g.20gb
instance of one A100, reserved by Filter and created through NVML by the device plugin at
Allocate); a pod no GPU can hold (Pending with the extender's reasons, one aggregated
Warning); then the extender's /healthz, /readyz and metrics.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
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
    ensure_backend,
    fresh_namespace,
    ok,
    print_trace,
    say,
)
from gpulab import narrate, trace
from gpulab.hami import annotations as ha
from gpulab.hami.commands import explain_rows
from gpulab.hami.device import ALLOCATE_MODE
from gpulab.hami.filter import FILTER_RESULT
from gpulab.hami.score import BINPACK, GPU_POLICY_ANNOTATION, SPREAD
from gpulab.informer import NODES, ListWatch, follow
from gpulab.wait import wait_for
from harness.addons import hami as hami_addon
from harness.backends import SYSTEM_NAMESPACE, Backend, pod_ready

NAMESPACE = "demo-hami"
IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
LAB_IMAGE = "gpulab:dev"  # runs on every backend (the local pod runner runs it as a process)
PRIORITY = "nvidia.com/priority"
MIG_NODE = "gpu-a100-mig"  # HAMi's MIG mode (operatingmode mig in its config.json)
SPEC = "hami"  # the default cluster's device plugins do not register GPUs for HAMi
MIB = 2**20
# after the smi pod's nvidia-smi (fake-gpu/README.md, "HAMi-core")
SMI_LABEL = (
    "    (lab) used stays 0MiB: HAMi-core counts only what the container's own CUDA calls "
    "allocate, and no CUDA runs here; CUDA_DEVICE_SM_LIMIT throttles the container's kernel "
    "launches in HAMi-core's CUDA hooks and has no nvidia-smi face"
)

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


def smi_pod(name: str, mem: int, cores: int) -> Obj:
    """A vGPU pod of the lab's image whose container runs ``nvidia-smi`` over the NVML
    shim and exits: its log is what the container sees of its GPU. ``gpulab fake-gpu run``
    stands in for kubelet handing Allocate's response to the container where no kubelet
    runs it (the local backend); under a real kubelet it runs nvidia-smi at once."""
    pod = vgpu_pod(name, mem, cores)
    ctr = pod["spec"]["containers"][0]
    ctr["image"] = LAB_IMAGE
    ctr["command"] = ["gpulab", "fake-gpu", "run", "--container", ctr["name"], "--", "nvidia-smi"]
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def mig_pod(name: str, mem: int) -> Obj:
    """A vGPU pod for HAMi's MIG mode (``nvidia.com/vgpu-mode: mig``), GPUs binpacked."""
    pod = vgpu_pod(name, mem, 0, BINPACK)
    pod["metadata"]["annotations"][ALLOCATE_MODE] = ha.MODE_MIG
    return pod


def node_smi_pod(node: str) -> Obj:
    """``nvidia-smi -L`` on ``node`` itself (a debug pod with the node's fake driver
    mounted, as an admin would run one): every GPU and MIG device the driver has."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"smi-{node}"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "smi",
                    "image": LAB_IMAGE,
                    "command": ["nvidia-smi", "-L"],
                    "env": [
                        {"name": "FAKE_GPU_CONFIG", "value": f"/var/lib/fake-gpu/{node}/config"}
                    ],
                    "volumeMounts": [
                        {"name": "fake-gpu", "mountPath": "/var/lib/fake-gpu", "readOnly": True}
                    ],
                }
            ],
            "volumes": [
                {"name": "fake-gpu", "hostPath": {"path": "/var/lib/fake-gpu", "type": "Directory"}}
            ],
        },
    }


def smi_migs(listing: str) -> dict[str, list[tuple[str, str]]]:
    """``nvidia-smi -L`` → GPU UUID → its MIG devices (profile, MIG UUID)."""
    out: dict[str, list[tuple[str, str]]] = {}
    gpu = ""
    for line in listing.splitlines():
        if m := re.match(r"GPU \d+: .* \(UUID: (\S+)\)", line):
            gpu = m.group(1)
            out[gpu] = []
        elif m := re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (\S+)\)", line):
            out[gpu].append((m.group(1), m.group(2)))
    return out


def let_pods_read_themselves(api: client.ApiClient, ns: str) -> None:
    """RBAC for `gpulab fake-gpu run` on the local backend: the namespace's default
    ServiceAccount may get pods (to read its own container's Allocate record)."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = "read-own-allocation"
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
        },
    )


def smi_total_mib(log: str) -> list[int]:
    """The total of each GPU in nvidia-smi's table ("    0MiB / 3000MiB "), not of the
    MIG devices listed below it."""
    gpus = log.split("MIG devices:")[0]
    return [int(m) for m in re.findall(r"\d+MiB / (\d+)MiB", gpus)]


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


# ------------------------------------------------------------------------- narration


class LockWatch:
    """Follows ``hami.io/mutex.lock`` as the nodes carry it: taken by Bind, released by the
    device plugin after Allocate. Keeps (time, node, pod, taken?) for the outcome checks;
    the story itself is told by the extender's LockNode and the plugin's ReleaseNodeLock."""

    def __init__(self, api: client.ApiClient, nodes: tuple[str, ...]) -> None:
        self.api, self.nodes = api, nodes
        self.seen: list[tuple[float, str, str, bool]] = []
        self._stop = threading.Event()
        self._held: dict[str, str] = {}

    def __enter__(self) -> LockWatch:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        for delta in follow(ListWatch(self.api, NODES), self._stop):
            name = delta.obj.get("metadata", {}).get("name", "")
            if name not in self.nodes:
                continue
            value = (delta.obj["metadata"].get("annotations") or {}).get(ha.NODE_LOCK)
            before = self._held.get(name)
            if value == before:
                continue
            if before is not None:
                pod = before.split(",", 1)[-1].replace(",", "/")
                self.seen.append((time.monotonic(), name, pod, False))
            if value is not None:
                pod = value.split(",", 1)[-1].replace(",", "/")
                self.seen.append((time.monotonic(), name, pod, True))
                self._held[name] = value
            else:
                self._held.pop(name, None)

    def lifecycle(self, pod: str) -> tuple[bool, bool]:
        """(taken, released) for ``namespace/name``."""
        events = [taken for _, _, p, taken in self.seen if p == pod]
        return True in events, False in events


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


def allocation_lines(pod: Mapping[str, Any]) -> list[str]:
    """Who wrote what on the pod, in call-chain order: Filter the choice, Bind the phase
    and time (Allocate's envs are in the device plugin's Allocate line)."""
    annos = annotations(pod)
    node, devices = placement(pod)
    grants = ", ".join(f"{d.uuid} {d.usedmem}MiB {d.usedcores}%" for d in devices)
    lines = [
        f"Filter wrote {ha.ASSIGNED_NODE}={node}, {ha.DEVICES_TO_ALLOCATE} and "
        f"{ha.DEVICES_ALLOCATED}: {grants}",
        f"Bind wrote {ha.BIND_PHASE}={ha.BIND_ALLOCATING} and {ha.BIND_TIME}="
        f"{annos.get(ha.BIND_TIME, '?')}, then bound the pod to {node}",
    ]
    return lines


def _scene(api: client.ApiClient, policy: str, names: list[str], locks: LockWatch) -> list[Obj]:
    core = client.CoreV1Api(api)
    pods = []
    for name in names:
        say(f"create {name}: nvidia.com/gpu 1, gpumem 3000 MiB, gpucores 30 %, GPUs {policy}")
        created = core.create_namespaced_pod(NAMESPACE, vgpu_pod(name, 3000, 30, policy))
        if created.spec.scheduler_name != "hami-scheduler":
            raise DemoFailed(f"the webhook did not send {name} to hami-scheduler")
        pod = wait_allocated(api, NAMESPACE, name)
        wait_for(
            lambda name=name: locks.lifecycle(f"{NAMESPACE}/{name}") == (True, True),
            20,
            f"{ha.NODE_LOCK} of {name} to be taken at Bind and released after Allocate",
        )
        _explain(pod)
        for line in allocation_lines(pod):
            say(line)
        pods.append(pod)
    return pods


def _smi_scene(api: client.ApiClient, backend: Backend) -> str:
    """A pod asking for 3000 MiB runs nvidia-smi: HAMi-core's limit is its GPU's memory."""
    core = client.CoreV1Api(api)
    let_pods_read_themselves(api, NAMESPACE)
    say(f"create smi: {LAB_IMAGE}, gpumem 3000 MiB, gpucores 30 %; its container runs nvidia-smi")
    core.create_namespaced_pod(NAMESPACE, smi_pod("smi", 3000, 30))
    if not backend.runs_containers:
        console.print(
            "    (lab) no kubelet starts this container on a kwok node: `gpulab fake-gpu run` "
            "waits for the node agent's record of its Allocate response and runs nvidia-smi "
            "with those variables, as kubelet and the container runtime would"
        )
    pod = wait_for(
        lambda: (
            (p := read_pod(api, NAMESPACE, "smi"))
            and p["status"].get("phase") in ("Succeeded", "Failed")
            and p
        ),
        90,
        "pod smi's nvidia-smi to finish",
    )
    log = core.read_namespaced_pod_log(
        "smi", NAMESPACE, container="cuda", _preload_content=False
    ).data.decode()
    if pod["status"]["phase"] != "Succeeded":
        raise DemoFailed(f"pod smi failed: {log[-500:]}")
    for line in allocation_lines(pod):
        say(line)
    console.print("    kubectl logs smi (nvidia-smi inside the container):")
    for line in log.splitlines():
        console.print(f"      [dim]{line}[/dim]")
    console.print(SMI_LABEL)
    return log


def _priority_scene(api: client.ApiClient) -> Obj:
    """nvidia.com/priority: the webhook turns it into CUDA_TASK_PRIORITY; kube-scheduler
    ignores it (managedResources, ignoredByScheduler), so the pod schedules."""
    say(f"create prio: gpumem 2000 MiB, gpucores 20 %, {PRIORITY}: 1 (HAMi-core's task priority)")
    pod = vgpu_pod("prio", 2000, 20)
    pod["spec"]["containers"][0]["resources"]["limits"][PRIORITY] = "1"
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, pod)
    placed = wait_allocated(api, NAMESPACE, "prio")
    env = {e["name"]: e.get("value") for e in placed["spec"]["containers"][0].get("env") or []}
    say(
        f"the webhook added CUDA_TASK_PRIORITY={env.get('CUDA_TASK_PRIORITY')}; "
        f"kube-scheduler left {PRIORITY} to the extender (no node advertises it)"
    )
    for line in allocation_lines(placed):
        say(line)
    return placed


def _finished_log(api: client.ApiClient, name: str, container: str) -> tuple[Obj, str]:
    """Wait for a pod whose container runs once, then its log."""
    pod = wait_for(
        lambda: (
            (p := read_pod(api, NAMESPACE, name))
            and p["status"].get("phase") in ("Succeeded", "Failed")
            and p
        ),
        90,
        f"pod {name} to finish",
    )
    log = (
        client.CoreV1Api(api)
        .read_namespaced_pod_log(name, NAMESPACE, container=container, _preload_content=False)
        .data.decode()
    )
    if pod["status"]["phase"] != "Succeeded":
        raise DemoFailed(f"pod {name} failed: {log[-500:]}")
    return pod, log


def _mig_scene(api: client.ApiClient, backend: Backend) -> tuple[list[Obj], str]:
    """HAMi's MIG mode: the extender reserves a MIG profile and placement per share, the
    device plugin cuts the GPU at Allocate; two pods on a 1g and a 3g slice of one A100."""
    node = client.CoreV1Api(api).read_node(MIG_NODE)
    cards = ha.decode_node_devices((node.metadata.annotations or {})[ha.NODE_REGISTER])
    first = cards[0]
    say(
        f"{MIG_NODE} registers its GPUs in mode {first.mode} with the MIG profiles the device "
        "config allows for their model, sizes and placements read from NVML:"
    )
    for prof in first.mig_profiles:
        starts = ",".join(str(a) for a, _ in prof.placements)
        console.print(
            f"    {prof.name:<8} {prof.memory_mb:>6} MiB  {prof.core:>3} % SMs  "
            f"starts {starts} (size {prof.placements[0][1]})"
        )
    pods = []
    for name, mem in (("mig-1g", 3000), ("mig-3g", 15000)):
        say(f"create {name}: gpumem {mem} MiB, {ALLOCATE_MODE}: mig, GPUs binpack")
        client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, mig_pod(name, mem))
        pod = wait_allocated(api, NAMESPACE, name)
        (reserved,) = ha.decode_mig_allocations(annotations(pod)[ha.MIG_ALLOCATIONS])
        say(
            f"Filter reserved {reserved.profile} at placement {reserved.start} (size "
            f"{reserved.size}) on {reserved.gpu_uuid} ({ha.MIG_ALLOCATIONS}); Allocate "
            f"created it: {reserved.mig_uuid} (GPU instance {reserved.gpu_instance_id})"
        )
        envs = wait_for(lambda n=name: backend.allocation(NAMESPACE, n, "cuda"), 30, "Allocate")
        say(f"Allocate ({name}): NVIDIA_VISIBLE_DEVICES={envs.get('NVIDIA_VISIBLE_DEVICES')}")
        pods.append(pod)
    say(f"nvidia-smi -L on {MIG_NODE} (a debug pod with the node's driver mounted):")
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, node_smi_pod(MIG_NODE))
    _, listing = _finished_log(api, f"smi-{MIG_NODE}", "smi")
    gpu, shown = placement(pods[0])[1][0].uuid, False  # both pods are on this GPU
    for line in listing.splitlines():
        if line.startswith("GPU "):
            shown = f"(UUID: {gpu})" in line
        if shown:
            console.print(f"      [dim]{line}[/dim]")
    return pods, listing


def _startup(api: client.ApiClient, pod: str) -> None:
    """The extender's start-up (HAMi's ``start()``), as it recorded each step: Events on
    its own pod, written when it started (before this demo)."""
    events = client.CoreV1Api(api).list_namespaced_event(
        SYSTEM_NAMESPACE, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}"
    )
    recorded = [trace.to_trace_event(api.sanitize_for_serialization(e)) for e in events.items]
    steps = sorted(
        (ev for ev in recorded if ev.component == hami_addon.COMPONENT), key=lambda ev: ev.time
    )
    if not steps:
        say(
            "the extender's start-up Events are gone (kube-apiserver keeps Events an hour): "
            f"`gpulab down --spec {SPEC}` and run the demo again to see them"
        )
        return
    say(f"the extender's start-up, as it recorded it (Events on pod {pod}):")
    print_trace([narrate.Told(ev) for ev in steps])


def _scheduler_pod(backend: Backend) -> str:
    """The hami-scheduler pod as the Deployment runs it: kube-scheduler + extender."""
    pods = [p for p in backend.component_pods(hami_addon.COMPONENT) if pod_ready(p)]
    if not pods:
        raise DemoFailed("no Ready hami-scheduler pod in gpulab-system")
    pod = pods[0]
    containers = ", ".join(
        f"{c.name} ({'Running' if c.state.running else 'not running'})"
        for c in pod.status.container_statuses or []
    )
    say(
        f"pod {SYSTEM_NAMESPACE}/{pod.metadata.name} on {pod.spec.node_name} "
        f"(IP {pod.status.pod_ip}): {containers}"
    )
    return str(pod.metadata.name)


def _mig_outcome(pods: list[Obj], listing: str) -> None:
    reserved = [ha.decode_mig_allocations(annotations(p)[ha.MIG_ALLOCATIONS])[0] for p in pods]
    gpus = {r.gpu_uuid for r in reserved}
    if {placement(p)[0] for p in pods} != {MIG_NODE} or len(gpus) != 1:
        raise DemoFailed(f"MIG pods are not on one GPU of {MIG_NODE}: {reserved}")
    if [r.profile for r in reserved] != ["1g.5gb", "3g.20gb"]:
        raise DemoFailed(f"MIG pods got profiles {[r.profile for r in reserved]}")
    (gpu,) = gpus
    seen = smi_migs(listing).get(gpu, [])
    for r in reserved:
        if (r.profile, r.mig_uuid) not in seen:
            raise DemoFailed(f"{MIG_NODE}'s nvidia-smi -L does not list {r.mig_uuid}: {seen}")
    ok(
        f"MIG: mig-1g on a 1g.5gb and mig-3g on a 3g.20gb instance of {MIG_NODE}'s {gpu}, "
        "created through NVML where the extender reserved them"
    )


def _health_and_metrics(backend: Backend, api: client.ApiClient, gpu: tuple[str, str]) -> None:
    ext = hami_addon.extender(backend)
    if ext is None:
        say("the extender runs in the hami-scheduler pod: kubectl port-forward to see it")
        return
    say(f"the extender through its Service hami-scheduler: {ext.routes}, metrics {ext.metrics}")
    with httpx.Client(verify=ext.ca, timeout=5) as http:
        for path in ("/healthz", "/readyz"):
            r = http.get(ext.routes + path)
            if r.status_code != 200:
                raise DemoFailed(f"extender {path}: HTTP {r.status_code} {r.text}")
            ok(f"GET {ext.routes}{path} → {r.status_code} {r.text.strip()[:60]}")
    text = httpx.get(ext.metrics + "/metrics", timeout=5).text
    node, uuid = gpu
    lines = [
        line
        for line in text.splitlines()
        if line.startswith("gpulab_extender_requests_total")
        or (line.startswith("hami_gpu_memory_allocated_bytes{") and uuid in line)
        or (line.startswith("hami_gpu_shared_count{") and uuid in line)
    ]
    for line in lines:
        console.print(f"  [dim]{line}[/dim]")
    mem = next(
        (
            float(x.rsplit(" ", 1)[1])
            for x in lines
            if x.startswith("hami_gpu_memory_allocated_bytes{")
        ),
        None,
    )
    # the extender's books against what the pods' annotations say is on that GPU
    pods = api.sanitize_for_serialization(client.CoreV1Api(api).list_pod_for_all_namespaces())
    want = gpu_usage(pods["items"])[gpu][1]
    if mem != want * MIB:
        raise DemoFailed(f"metrics show {mem} bytes allocated on {uuid}; the pods hold {want} MiB")
    ok(f"metrics: {want} MiB allocated on {node}'s {uuid}, as the pods' annotations say")


def run(args: argparse.Namespace) -> int:
    if args.spec == "default":
        args = argparse.Namespace(**{**vars(args), "spec": SPEC})
    backend, _ = ensure_backend(args, addons=("hami",))
    api = backend.api()
    chapter(
        "HAMi (v2.10.0) - sharing GPUs by memory and cores",
        "GPU nodes register their cards in hami.io/node-nvidia-register; the extender's\n"
        "webhook sends vGPU pods to kube-scheduler 'hami-scheduler', which asks the\n"
        "extender to Filter (one node, one card, written on the pod) and Bind. Bind takes\n"
        "the node lock hami.io/mutex.lock and marks the pod allocating; the device plugin's\n"
        "Allocate turns the pod's annotations into NVIDIA_VISIBLE_DEVICES and hami-core\n"
        "limits (in MIG mode: creates the reserved MIG instance), then releases the lock.",
    )
    _startup(api, _scheduler_pod(backend))
    gpus = registered_gpus(api)
    if not gpus:
        raise DemoFailed(f"no node has {ha.NODE_REGISTER}: start the device plugins with hami")
    say(f"{len(gpus)} GPUs registered for HAMi on {len({n for n, _ in gpus})} nodes")
    fresh_namespace(api, NAMESPACE)
    nodes = tuple(sorted({n for n, _ in gpus}))
    with (
        LiveTrace(api, NAMESPACE, also=("default",), nodes=nodes) as live,
        LockWatch(api, nodes) as locks,
    ):
        console.rule("binpack: three pods, one GPU")
        packed = _scene(api, BINPACK, ["binpack-1", "binpack-2", "binpack-3"], locks)
        console.rule("spread: three pods, three GPUs")
        spread = _scene(api, SPREAD, ["spread-1", "spread-2", "spread-3"], locks)
        console.rule("HAMi-core: what the container sees")
        smi_log = _smi_scene(api, backend)
        console.rule("nvidia.com/priority")
        prio = _priority_scene(api)
        console.rule("MIG mode: one A100 cut into a 1g and a 3g instance")
        mig_pods, listing = _mig_scene(api, backend)
        console.rule("a pod no GPU can hold")
        say("create too-big: gpumem 50000 MiB (more than any card has)")
        client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, vgpu_pod("too-big", 50000, 10))
        reason = wait_for(
            lambda: failed_scheduling(api, NAMESPACE, "too-big"), 60, "FailedScheduling of too-big"
        )
        pending = read_pod(api, NAMESPACE, "too-big")
        _explain(pending)
        live.expect(
            {
                "Webhook",
                "Filter",
                "FilteringSucceed",
                "LockNode",
                "Bind",
                "BindingSucceed",
                "Scheduled",
                "Allocate",
                "ReleaseNodeLock",
                "FilteringFailed",
            }
        )
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
    if smi_total_mib(smi_log) != [3000]:
        raise DemoFailed(f"nvidia-smi in pod smi shows totals {smi_total_mib(smi_log)}, not 3000")
    ok("smi: its own nvidia-smi shows one GPU of 3000MiB (HAMi-core's memory limit)")
    env = {e["name"]: e.get("value") for e in prio["spec"]["containers"][0].get("env") or []}
    if not prio["spec"].get("nodeName") or env.get("CUDA_TASK_PRIORITY") != "1":
        raise DemoFailed(f"prio: node {prio['spec'].get('nodeName')}, env {env}")
    ok(f"prio ({PRIORITY}: 1) scheduled to {placement(prio)[0]} with CUDA_TASK_PRIORITY=1")
    _mig_outcome(mig_pods, listing)
    if pending["status"].get("phase") != "Pending" or pending["spec"].get("nodeName"):
        raise DemoFailed("too-big was placed although no GPU has 50000 MiB")
    if "CardInsufficientMemory" not in reason:
        raise DemoFailed(
            f"too-big's FailedScheduling does not give the extender's reason: {reason}"
        )
    ok(f"too-big stays Pending: {reason.split('. ')[0]}")
    ok(
        f"{ha.NODE_LOCK}: taken at Bind and released after Allocate for each pod "
        f"({sum(1 for *_, taken in locks.seen if taken)} takes, "
        f"{sum(1 for *_, taken in locks.seen if not taken)} releases)"
    )
    _health_and_metrics(backend, api, (node, uuid))
    return 0

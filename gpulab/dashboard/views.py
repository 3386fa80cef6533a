"""What each panel of the dashboard shows, computed from API objects. Pure: no I/O.

Inputs are objects as the API server serves them (dicts); outputs are JSON-ready dicts
the page renders as they are. Every format read here is the upstream one, of the releases
the chapters pin (NVIDIA k8s-device-plugin v0.20.0, Project-HAMi/HAMi v2.10.0,
kubernetes-sigs/kueue v0.19.2, scheduler-plugins v0.35.4, volcano-sh/volcano v1.15.1; the
GPU Operator's ClusterPolicy ``nvidia.com/v1`` as DESIGN.md section 6 has it):

- Node ``status.capacity`` / ``allocatable`` (``nvidia.com/gpu``, ``nvidia.com/mig-*``) and
  the GFD labels ``nvidia.com/gpu.product`` / ``.count`` / ``.memory`` / ``.replicas``
  (NVIDIA k8s-device-plugin ``internal/lm``);
- HAMi's ``hami.io/node-nvidia-register`` (node) and ``hami.io/vgpu-devices-allocated``,
  ``hami.io/vgpu-node``, ``hami.io/bind-phase`` (pod), read with the shared
  :mod:`gpulab.hami.annotations`;
- the device plugin's Allocate response as the node agent records it on the pod
  (``gpulab.io/allocate-<container>``: devices per resource, envs);
- kube-scheduler's ``FailedScheduling`` Event and ``PodScheduled`` condition; the HAMi
  extender's per-node filter record (the data `gpulab explain pod` prints);
- Kueue ``kueue.x-k8s.io/v1beta2`` ClusterQueue / LocalQueue / Workload status; Volcano
  ``scheduling.volcano.sh/v1beta1`` Queue / PodGroup; Coscheduling
  ``scheduling.x-k8s.io/v1alpha1`` PodGroup; GPU Operator ``nvidia.com/v1`` ClusterPolicy
  ``status.state`` and the operand DaemonSets it owns.

Lab convenience, named: a node without HAMi's registration gets its GPU identities
(UUIDs, MIG instances) from its fake-gpu profile (label ``gpulab.io/gpu-profile``), i.e.
what NVML reports on that node; a real cluster would read them from DCGM or NVML.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpulab.fakegpu import profiles
from gpulab.hami import annotations as ha
from gpulab.hami.commands import FILTER_RESULT, explain_rows
from gpulab.nodeagent.policy import ANNOTATION_PREFIX

Obj = Mapping[str, Any]

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
PROFILE_LABEL = "gpulab.io/gpu-profile"
REPLICA_SEPARATOR = "::"
# Coscheduling marks its pods with a label, Volcano with an annotation.
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
TERMINAL = ("Succeeded", "Failed")
# GPU and MIG UUIDs in an Event note ("GPU-<uuid>, MIG-<uuid> Unhealthy: Xid 79")
_UUID = re.compile(r"\b(?:GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}\b")


def meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def key(obj: Obj) -> str:
    m = meta(obj)
    return f"{m['namespace']}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


# --------------------------------------------------------------------------- GPUs


@dataclass
class Mig:
    uuid: str
    profile: str
    mem: int
    pod: str | None = None


@dataclass
class Card:
    """One physical GPU as the dashboard shows it."""

    index: int
    uuid: str  # "" when nothing names it (GFD labels only)
    product: str
    mem: int  # MiB
    numa: int | None = None
    healthy: bool = True
    health_note: str = ""
    split: int = 0  # HAMi: how many containers may share it (0: not registered)
    cores: int = 100
    migs: list[Mig] = field(default_factory=list)
    slices: list[dict[str, Any]] = field(default_factory=list)  # HAMi shares
    whole: list[str] = field(default_factory=list)  # pods holding it (or a replica)
    replicas: int = 1

    def view(self) -> dict[str, Any]:
        used = sum(s["mem"] for s in self.slices)
        return {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "mem": self.mem,
            "numa": self.numa,
            "healthy": self.healthy,
            "healthNote": self.health_note,
            "split": self.split,
            "cores": self.cores,
            "slices": self.slices,
            "usedMem": used,
            "usedCores": sum(s["cores"] for s in self.slices),
            "whole": self.whole,
            "replicas": self.replicas,
            "mig": [
                {"uuid": m.uuid, "profile": m.profile, "mem": m.mem, "pod": m.pod}
                for m in self.migs
            ],
        }


@lru_cache(maxsize=64)
def _profile(name: str) -> profiles.Profile | None:
    try:
        return profiles.load(name)
    except profiles.ProfileError:
        return None


def _profile_cards(node_name: str, profile: profiles.Profile) -> list[Card]:
    return [
        Card(
            index=g.index,
            uuid=profiles.gpu_uuid(node_name, g.index),
            product=g.model.name,
            mem=g.model.memory_mib,
            numa=g.numa_node,
            migs=[
                Mig(profiles.mig_uuid(node_name, g.index, j), m.name, m.memory_mib)
                for j, m in enumerate(g.mig_instances)
            ],
        )
        for g in profile.gpus
    ]


def cards(node: Obj) -> tuple[list[Card], str]:
    """The node's GPUs and where they were read: ``hami`` (the registration annotation),
    ``nvml`` (the node's fake-gpu profile) or ``labels`` (GFD's count and product)."""
    m = meta(node)
    name = str(m.get("name"))
    labels = m.get("labels") or {}
    profile = _profile(labels[PROFILE_LABEL]) if labels.get(PROFILE_LABEL) else None
    from_nvml = _profile_cards(name, profile) if profile else []
    registered = (m.get("annotations") or {}).get(ha.NODE_REGISTER)
    if registered:
        try:
            devices = ha.decode_node_devices(registered)
        except ha.AnnotationError:
            devices = []
        if devices:
            migs = {c.uuid: c.migs for c in from_nvml}
            return [
                Card(
                    index=d.index,
                    uuid=d.id,
                    product=d.type,
                    mem=d.devmem,
                    numa=d.numa,
                    healthy=d.health,
                    health_note="" if d.health else f"health false in {ha.NODE_REGISTER}",
                    split=d.count,
                    cores=d.devcore,
                    migs=list(migs.get(d.id, [])),
                )
                for d in sorted(devices, key=lambda d: d.index)
            ], "hami"
    if from_nvml:
        return from_nvml, "nvml"
    replicas = max(1, _int(labels.get("nvidia.com/gpu.replicas"), 1))
    count = _int(labels.get("nvidia.com/gpu.count")) or _int(capacity(node).get(GPU)) // replicas
    product = str(labels.get("nvidia.com/gpu.product", "GPU"))
    mem = _int(labels.get("nvidia.com/gpu.memory"))
    return [Card(index=i, uuid="", product=product, mem=mem) for i in range(count)], "labels"


def capacity(node: Obj) -> Mapping[str, Any]:
    return (node.get("status") or {}).get("capacity") or {}


def allocatable(node: Obj) -> Mapping[str, Any]:
    return (node.get("status") or {}).get("allocatable") or {}


def node_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unhealthy_devices(events: Iterable[Obj]) -> dict[str, str]:
    """UUID -> note, for the GPUs the node's device plugin reported Unhealthy since it last
    started (upstream marks a device unhealthy until the plugin restarts).

    ``events`` are the device plugin's Events about the node (core/v1 dicts): a
    ``CheckHealth`` Warning names the devices in its note; ``Start`` is a (re)start. A
    Normal ``CheckHealth`` naming devices as Healthy clears them.
    """
    ordered = sorted(events, key=_first_time)
    unhealthy: dict[str, str] = {}
    for ev in ordered:
        reason = ev.get("reason")
        if reason == "Start":
            unhealthy.clear()
        elif reason == "CheckHealth":
            note = str(ev.get("message") or "")
            ids = {u.split(REPLICA_SEPARATOR)[0] for u in _UUID.findall(note)}
            for uuid in ids:
                if ev.get("type") == "Warning":
                    unhealthy[uuid] = note
                elif "Healthy" in note:
                    unhealthy.pop(uuid, None)
    return unhealthy


def _first_time(ev: Obj) -> str:
    # The first occurrence: a series keeps the first note (client-go aggregation).
    return str(ev.get("eventTime") or ev.get("firstTimestamp") or meta(ev).get("creationTimestamp"))


def allocate_records(pod: Obj) -> dict[str, dict[str, list[str]]]:
    """container -> resource -> device IDs, from the node agent's Allocate records."""
    out = {}
    for k, value in (meta(pod).get("annotations") or {}).items():
        if k.startswith(ANNOTATION_PREFIX):
            try:
                devices = json.loads(value).get("devices") or {}
            except (ValueError, AttributeError):
                continue
            out[k.removeprefix(ANNOTATION_PREFIX)] = {r: list(ids) for r, ids in devices.items()}
    return out


def hami_shares(pod: Obj) -> list[ha.ContainerDevice]:
    value = (meta(pod).get("annotations") or {}).get(ha.DEVICES_ALLOCATED)
    if not value:
        return []
    try:
        return [d for ctr in ha.decode_pod_devices(value) for d in ctr]
    except ha.AnnotationError:
        return []


def node_view(node: Obj, pods: Iterable[Obj], health_events: Iterable[Obj] = ()) -> dict[str, Any]:
    """One node: its GPUs with slices, MIG instances, replicas in use, holders, health."""
    name = str(meta(node).get("name"))
    labels = meta(node).get("labels") or {}
    gpus, source = cards(node)
    replicas = max(1, _int(labels.get("nvidia.com/gpu.replicas"), 1))
    by_uuid = {c.uuid: c for c in gpus if c.uuid}
    by_mig = {m.uuid: m for c in gpus for m in c.migs}
    for c in gpus:
        c.replicas = replicas
    reported = unhealthy_devices(health_events)
    for uuid, note in reported.items():
        if uuid in by_uuid:
            by_uuid[uuid].healthy = False
            by_uuid[uuid].health_note = note
    for pod in sorted(pods, key=key):
        if is_terminal(pod):
            continue
        who = key(pod)
        phase = (meta(pod).get("annotations") or {}).get(ha.BIND_PHASE, "")
        for share in hami_shares(pod):
            card = by_uuid.get(share.uuid)
            if card is not None:
                card.slices.append(
                    {"pod": who, "mem": share.usedmem, "cores": share.usedcores, "phase": phase}
                )
        for devices in allocate_records(pod).values():
            for resource, ids in devices.items():
                if source == "hami" and resource == GPU:
                    continue  # HAMi's shares above say who holds what
                for device in ids:
                    uuid = device.split(REPLICA_SEPARATOR)[0]
                    if uuid in by_mig:
                        by_mig[uuid].pod = who
                    elif resource == GPU and uuid in by_uuid and who not in by_uuid[uuid].whole:
                        by_uuid[uuid].whole.append(who)
    resources = {
        r: [_int(capacity(node).get(r)), _int(allocatable(node).get(r))]
        for r in sorted(capacity(node))
        if r == GPU or r.startswith(MIG_PREFIX)
    }
    cap, alloc = resources.get(GPU, [0, 0])
    known = sum(1 for c in gpus if not c.healthy and not c.migs)
    unknown = max(0, (cap - alloc) // replicas - known) if source != "hami" else 0
    return {
        "name": name,
        "ready": node_ready(node),
        "source": source,
        "resources": resources,
        "replicas": replicas,
        "gpus": [c.view() for c in gpus],
        "unhealthyUnidentified": unknown,
    }


# --------------------------------------------------------------------------- pending pods


def unscheduled(pod: Obj) -> bool:
    """Pending and not bound: what the pending panel lists."""
    status = pod.get("status") or {}
    return (
        status.get("phase", "Pending") == "Pending"
        and not (pod.get("spec") or {}).get("nodeName")
        and not meta(pod).get("deletionTimestamp")
    )


def _condition(pod: Obj, kind: str) -> Mapping[str, Any]:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def _event_time(ev: Obj) -> str:
    series = ev.get("series") or {}
    return str(
        series.get("lastObservedTime")
        or ev.get("lastTimestamp")
        or ev.get("eventTime")
        or ev.get("firstTimestamp")
        or ""
    )


def latest(events: Iterable[Obj]) -> Obj | None:
    return max(events, key=_event_time, default=None)


def filter_record(pod: Obj) -> dict[str, Any] | None:
    raw = (meta(pod).get("annotations") or {}).get(FILTER_RESULT)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def pending_view(pod: Obj, failed: Obj | None) -> dict[str, Any]:
    """One pending pod: who should schedule it and why it is not placed yet."""
    spec = pod.get("spec") or {}
    cond = _condition(pod, "PodScheduled")
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    if gates:
        reason, message = "SchedulingGated", f"scheduling gates: {', '.join(map(str, gates))}"
    elif failed is not None:
        reason, message = "FailedScheduling", str(failed.get("message") or failed.get("note"))
    elif cond.get("status") == "False":
        reason, message = str(cond.get("reason")), str(cond.get("message") or "")
    else:
        reason, message = "", "waiting for the scheduler"
    return {
        "key": key(pod),
        "scheduler": spec.get("schedulerName", "default-scheduler"),
        "reason": reason,
        "message": message,
        "since": meta(pod).get("creationTimestamp"),
        "explained": filter_record(pod) is not None,
    }


# "0/5 nodes are available: 1 Insufficient cpu, 4 node(s) didn't match .... preemption: ..."
_AVAILABLE = re.compile(r"^\d+/(\d+) nodes are available: (.*)$")


def scheduler_reasons(message: str) -> list[tuple[str, int]]:
    """kube-scheduler's FailedScheduling summary as (reason, nodes), largest first."""
    # the summary ends at the first sentence (then DRA's and preemption's notes follow)
    first = message.split(" preemption:", 1)[0].split(". ", 1)[0].strip()
    match = _AVAILABLE.match(first)
    if not match:
        return []
    out = []
    for part in match.group(2).rstrip(".").split(", "):
        count, _, reason = part.strip().partition(" ")
        if count.isdigit() and reason:
            out.append((reason.strip().rstrip("."), int(count)))
    return sorted(out, key=lambda r: (-r[1], r[0]))


def explain_view(pod: Obj, events: Sequence[Obj]) -> dict[str, Any]:
    """The click-through of a pending pod: the extender's per-node table (the rows `gpulab
    explain pod` prints), kube-scheduler's per-reason node counts, and its Events."""
    failed = latest(e for e in events if e.get("reason") == "FailedScheduling")
    record = filter_record(pod)
    rows = explain_rows(record) if record else []
    return {
        **pending_view(pod, failed),
        "filter": {
            "nodePolicy": record.get("nodePolicy"),
            "gpuPolicy": record.get("gpuPolicy"),
            "chosen": record.get("chosen"),
            "rows": [list(r) for r in rows],
        }
        if record
        else None,
        "reasons": [list(r) for r in scheduler_reasons(str((failed or {}).get("message") or ""))],
        "events": [
            {
                "time": _event_time(e),
                "reason": e.get("reason"),
                "from": e.get("reportingComponent") or (e.get("source") or {}).get("component"),
                "message": e.get("message"),
                "warning": e.get("type") == "Warning",
            }
            for e in sorted(events, key=_event_time)[-20:]
        ],
    }


# --------------------------------------------------------------------------- Kueue


def _conditions(obj: Obj) -> dict[str, Mapping[str, Any]]:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(obj: Obj, kind: str) -> bool:
    return _conditions(obj).get(kind, {}).get("status") == "True"


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity ("4", "500m", "16Gi") as a number."""
    text = str(value if value is not None else "0").strip()
    suffixes = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
    }
    for suffix, factor in suffixes.items():
        if text.endswith(suffix):
            try:
                return float(text[: -len(suffix)]) * factor
            except ValueError:
                return 0.0
    try:
        return float(text)
    except ValueError:
        return 0.0


def _usage(cq: Obj) -> dict[tuple[str, str], tuple[float, float]]:
    """(flavor, resource) -> (total, borrowed) from status.flavorsUsage."""
    out = {}
    for flavor in (cq.get("status") or {}).get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            out[(flavor.get("name"), r.get("name"))] = (
                parse_quantity(r.get("total")),
                parse_quantity(r.get("borrowed")),
            )
    return out


def _quotas(cq: Obj) -> dict[tuple[str, str], Mapping[str, Any]]:
    out = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                out[(flavor.get("name"), r.get("name"))] = r
    return out


def cohort(cq: Obj) -> str | None:
    spec = cq.get("spec") or {}
    return spec.get("cohortName") or spec.get("cohort")


def cluster_queue_view(
    cq: Obj, peers: Sequence[Obj], workloads: Sequence[Obj], local_queues: Sequence[Obj]
) -> dict[str, Any]:
    """A ClusterQueue: per flavor and resource, usage against nominal quota, what it
    borrows, and what it lends: the part of its unused nominal quota that the other
    ClusterQueues of its cohort borrow (derived here; Kueue keeps it in its cache, not in
    the status). ``peers`` are the other ClusterQueues; ``workloads`` those whose
    LocalQueue points at this ClusterQueue."""
    name = str(meta(cq).get("name"))
    mine = cohort(cq)
    others = [p for p in peers if mine and cohort(p) == mine and meta(p).get("name") != name]
    borrowed_by_others: dict[tuple[str, str], float] = {}
    for p in others:
        for fr, (_total, borrowed) in _usage(p).items():
            borrowed_by_others[fr] = borrowed_by_others.get(fr, 0) + borrowed
    usage = _usage(cq)
    rows = []
    for fr, quota in _quotas(cq).items():
        nominal = parse_quantity(quota.get("nominalQuota"))
        total, borrowed = usage.get(fr, (0.0, 0.0))
        unused = max(0.0, nominal - total)
        lending_limit = quota.get("lendingLimit")
        lendable = unused if lending_limit is None else min(unused, parse_quantity(lending_limit))
        rows.append(
            {
                "flavor": fr[0],
                "resource": fr[1],
                "nominal": nominal,
                "usage": total,
                "borrowed": borrowed,
                "lent": min(lendable, borrowed_by_others.get(fr, 0.0)),
                "borrowingLimit": None
                if quota.get("borrowingLimit") is None
                else parse_quantity(quota.get("borrowingLimit")),
            }
        )
    status = cq.get("status") or {}
    pending = [
        {"key": key(w), "message": _conditions(w).get("QuotaReserved", {}).get("message", "")}
        for w in sorted(workloads, key=key)
        if not _true(w, "QuotaReserved") and not _true(w, "Finished")
    ]
    return {
        "name": name,
        "cohort": mine,
        "rows": rows,
        "pendingWorkloads": status.get("pendingWorkloads", len(pending)),
        "admittedWorkloads": status.get("admittedWorkloads", 0),
        "pending": pending[:20],
        "localQueues": sorted(key(q) for q in local_queues),
    }


def local_queue_target(lq: Obj) -> str:
    return str((lq.get("spec") or {}).get("clusterQueue", ""))


def workload_queue(wl: Obj) -> str:
    """The Workload's LocalQueue as ``namespace/name``."""
    return f"{meta(wl).get('namespace')}/{(wl.get('spec') or {}).get('queueName', '')}"


# --------------------------------------------------------------------------- gangs, Volcano


def pod_gpus(pod: Obj) -> int:
    """Whole GPUs (or vGPUs) a pod asks for: the sum over its app containers' limits."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += _int((res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU))
    return total


def pod_groups(pod: Obj) -> list[str]:
    """The gang keys a pod belongs to: ``coscheduling/<ns>/<pg>``, ``volcano/<ns>/<pg>``."""
    m = meta(pod)
    ns = m.get("namespace")
    out = []
    cos = (m.get("labels") or {}).get(COSCHEDULING_LABEL)
    if cos:
        out.append(f"coscheduling/{ns}/{cos}")
    vol = (m.get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION)
    if vol:
        out.append(f"volcano/{ns}/{vol}")
    return out


def podgroup_view(flavor: str, pg: Obj, pods: Iterable[Obj]) -> dict[str, Any]:
    """A gang: bound members against minMember, its phase, its queue (Volcano)."""
    spec = pg.get("spec") or {}
    members = [p for p in pods if not is_terminal(p)]
    bound = sum(1 for p in members if (p.get("spec") or {}).get("nodeName"))
    return {
        "key": f"{flavor}/{key(pg)}",
        "flavor": flavor,
        "name": key(pg),
        "minMember": _int(spec.get("minMember"), 1),
        "bound": bound,
        "members": len(members),
        "phase": (pg.get("status") or {}).get("phase", ""),
        "queue": spec.get("queue"),
    }


def volcano_queue_view(
    queue: Obj, queues: Sequence[Obj], gpus_by_queue: Mapping[str, int], cluster_gpus: int
) -> dict[str, Any]:
    """A Volcano Queue: its deserved share (weight over the sum of weights) against the
    share of the cluster's GPUs its bound pods hold."""
    name = str(meta(queue).get("name"))
    weight = _int((queue.get("spec") or {}).get("weight"), 1)
    total_weight = sum(_int((q.get("spec") or {}).get("weight"), 1) for q in queues) or 1
    used = gpus_by_queue.get(name, 0)
    status = queue.get("status") or {}
    return {
        "name": name,
        "weight": weight,
        "deserved": weight / total_weight,
        "gpus": used,
        "share": used / cluster_gpus if cluster_gpus else 0.0,
        "state": status.get("state", ""),
        "running": status.get("running", 0),
        "pending": status.get("pending", 0),
        "inqueue": status.get("inqueue", 0),
    }


# --------------------------------------------------------------------------- GPU Operator


def owned_by(obj: Obj, kind: str, name: str | None = None) -> bool:
    return any(
        r.get("kind") == kind and (name is None or r.get("name") == name)
        for r in meta(obj).get("ownerReferences") or []
    )


def _pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def cluster_policy_view(
    policy: Obj, daemonsets: Sequence[Obj], pods: Sequence[Obj], nodes: Sequence[str]
) -> dict[str, Any]:
    """A ClusterPolicy: its state, and per operand state (the DaemonSets it owns) whether
    its pod on each GPU node is ready (``ready``), running but not ready (``waiting``),
    or absent (``-``)."""
    name = str(meta(policy).get("name"))
    owned = sorted(
        (d for d in daemonsets if owned_by(d, "ClusterPolicy", name)), key=lambda d: key(d)
    )
    states = []
    for ds in owned:
        ds_name = meta(ds).get("name")
        on_node = {
            (p.get("spec") or {}).get("nodeName"): p
            for p in pods
            if meta(p).get("namespace") == meta(ds).get("namespace")
            and owned_by(p, "DaemonSet", ds_name)
        }
        cells = {}
        for node in nodes:
            pod = on_node.get(node)
            cells[node] = "-" if pod is None else "ready" if _pod_ready(pod) else "waiting"
        status = ds.get("status") or {}
        states.append(
            {
                "name": ds_name,
                "ready": status.get("numberReady", 0),
                "desired": status.get("desiredNumberScheduled", 0),
                "nodes": cells,
            }
        )
    return {
        "name": name,
        "state": (policy.get("status") or {}).get("state", ""),
        "nodes": list(nodes),
        "states": states,
    }

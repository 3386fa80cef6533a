"""Pod and Node objects as the API server serves them (plain dicts), built in one line.

For the unit tests, the demos and the e2e tests of the scheduling chapters (cf.
kubernetes ``pkg/scheduler/testing/wrappers.go``: ``st.MakePod().Req(...).Obj()``).
A pod made here is also a valid manifest to create through the API.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    scheduler: str | None = None,
    node_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    affinity: Mapping[str, Any] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    priority: int | None = None,
    phase: str | None = None,
    uid: str | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] = (),
) -> Obj:
    """A pod with one container ``main`` asking ``requests``/``limits`` (or the
    ``containers`` given). Extended resources given only as requests are also set as
    limits, as the API server requires."""
    resources: Obj = {}
    if requests:
        resources["requests"] = {k: str(v) for k, v in requests.items()}
    lim = {k: str(v) for k, v in (limits or {}).items()}
    for k, v in (requests or {}).items():
        if "/" in k and k not in lim:
            lim[k] = str(v)
    if lim:
        resources["limits"] = lim
    spec: Obj = {
        "containers": list(containers)
        if containers is not None
        else [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
        "terminationGracePeriodSeconds": 0,
    }
    if init_containers:
        spec["initContainers"] = list(init_containers)
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if affinity:
        spec["affinity"] = dict(affinity)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if priority is not None:
        spec["priority"] = priority
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase:
        pod["status"] = {"phase": phase}
    return pod


def manifest(pod: Mapping[str, Any]) -> Obj:
    """The pod as something to create: no uid, status or spec.priority (admission sets
    the priority from priorityClassName)."""
    meta = {k: v for k, v in pod["metadata"].items() if k != "uid"}
    spec = {k: v for k, v in pod["spec"].items() if k != "priority"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def make_node(
    name: str,
    *,
    allocatable: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    unschedulable: bool = False,
) -> Obj:
    """A node with ``allocatable`` (default 32 cpu, 128Gi, 110 pods) as capacity too."""
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    alloc.update({k: str(v) for k, v in (allocatable or {}).items()})
    spec: Obj = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": spec,
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }


def preferred_affinity(*weighted: tuple[int, Sequence[Mapping[str, Any]]]) -> Obj:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": w, "preference": {"matchExpressions": list(exprs)}}
                for w, exprs in weighted
            ]
        }
    }

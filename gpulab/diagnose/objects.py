"""The recorded object set `gpulab diagnose` decides from: plain API objects, no I/O.

The reader (``reader.py``) fills an :class:`ObjectSet` from a live cluster; the chain
(``chain.py``) walks it. ``--save FILE`` writes the set as JSON, which is what the unit
tests' fixtures are (``tests/fixtures/diagnose/*.json``, captured from real clusters).

Objects are dicts as the API server serves them (``kubectl get -o json``). Events are the
core/v1 view (``message``, ``reason``, ``involvedObject``, ``reportingComponent``), which
also shows events.k8s.io/v1 Events (note → message, regarding → involvedObject).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpulab.gpuoperator import api as gpuoperator

Obj = dict[str, Any]

KINDS = ("pod", "workload", "clusterqueue", "podgroup", "node")


@dataclass(frozen=True)
class Target:
    """What to diagnose: ``kind`` one of KINDS, ``namespace`` empty for cluster-scoped."""

    kind: str
    name: str
    namespace: str = ""

    @property
    def ref(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name}"
            if self.namespace
            else (f"{self.kind} {self.name}")
        )


@dataclass
class ObjectSet:
    """Everything one diagnosis reads. Lists hold whole objects; ``probes`` holds what the
    reader found when it tried each webhook URL (``url -> "ok"`` or the error)."""

    target: Target
    pods: list[Obj] = field(default_factory=list)  # the namespace's, plus system pods
    nodes: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    namespaces: list[Obj] = field(default_factory=list)
    jobs: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)
    mutating_webhooks: list[Obj] = field(default_factory=list)
    validating_webhooks: list[Obj] = field(default_factory=list)
    leases: list[Obj] = field(default_factory=list)
    configmaps: list[Obj] = field(default_factory=list)
    # Kueue (kueue.x-k8s.io/v1beta2)
    workloads: list[Obj] = field(default_factory=list)
    local_queues: list[Obj] = field(default_factory=list)
    cluster_queues: list[Obj] = field(default_factory=list)
    resource_flavors: list[Obj] = field(default_factory=list)
    # Volcano (scheduling.volcano.sh/v1beta1; vcjobs batch.volcano.sh/v1alpha1) and
    # Coscheduling (scheduling.x-k8s.io/v1alpha1)
    volcano_podgroups: list[Obj] = field(default_factory=list)
    volcano_queues: list[Obj] = field(default_factory=list)
    volcano_jobs: list[Obj] = field(default_factory=list)  # batch.volcano.sh/v1alpha1 Jobs
    coscheduling_podgroups: list[Obj] = field(default_factory=list)
    # GPU Operator (nvidia.com/v1): the ClusterPolicy names the MIG manager's custom config
    cluster_policies: list[Obj] = field(default_factory=list)
    probes: dict[str, str] = field(default_factory=dict)
    # API groups the cluster serves (a chapter not installed is not a broken link)
    installed: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ObjectSet:
        raw = json.loads(text)
        raw["target"] = Target(**raw["target"])
        return cls(**raw)

    @classmethod
    def load(cls, path: Path) -> ObjectSet:
        return cls.from_json(path.read_text())


# ---------------------------------------------------------------- small readers


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name", ""))


def ns_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace") or "")


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def find(objs: Iterable[Obj], name: str, namespace: str = "") -> Obj | None:
    return next(
        (o for o in objs if name_of(o) == name and (not namespace or ns_of(o) == namespace)),
        None,
    )


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in status(obj).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def owners(obj: Mapping[str, Any], kind: str) -> list[str]:
    return [
        str(r.get("name")) for r in meta(obj).get("ownerReferences") or [] if r.get("kind") == kind
    ]


def events_about(events: Iterable[Obj], kind: str, name: str, namespace: str = "") -> list[Obj]:
    """Events regarding one object, oldest first."""
    out = []
    for e in events:
        inv = e.get("involvedObject") or e.get("regarding") or {}
        if inv.get("kind") == kind and inv.get("name") == name:
            if namespace and (inv.get("namespace") or "") not in ("", namespace):
                continue
            out.append(e)
    return sorted(out, key=event_time)


def event_time(e: Mapping[str, Any]) -> str:
    series = e.get("series") or {}
    return str(
        series.get("lastObservedTime")
        or e.get("lastTimestamp")
        or e.get("eventTime")
        or e.get("firstTimestamp")
        or meta(e).get("creationTimestamp")
        or ""
    )


def reporter(e: Mapping[str, Any]) -> str:
    return str(
        e.get("reportingComponent")
        or e.get("reportingController")
        or (e.get("source") or {}).get("component")
        or ""
    )


def message(e: Mapping[str, Any]) -> str:
    return str(e.get("message") or e.get("note") or "")


def custom_mig_config(policies: Iterable[Obj]) -> str:
    """The ConfigMap the GPU Operator's ClusterPolicy (the singleton) names in
    ``spec.migManager.config.name`` for the MIG manager (gpu-operator v26.7.0: mounted
    and named by CONFIG_FILE, so mig-manager builds no ``<node>-mig-config``), or ""."""
    policy = gpuoperator.singleton(list(policies))
    if policy is None:
        return ""
    mig = gpuoperator.component(gpuoperator.spec_of(policy), "migManager")
    name, custom = gpuoperator.configmap_name(
        mig.get("config"), gpuoperator.MIG_PARTED_DEFAULT_CONFIGMAP
    )
    return name if custom else ""

"""Running Volcano without a cluster: the lab's scheduler configuration (read from its
manifest), a fake scheduler cache, one-call session runs, and a fake API for the
controllers."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from gpulab.framework.objects import make_node
from gpulab.volcano.scheduler import conf, snapshot
from gpulab.volcano.scheduler.actions import ACTIONS
from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.framework import close_session, open_session
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.plugins import PLUGINS

Obj = dict[str, Any]

SCHEDULER_MANIFEST = Path(__file__).resolve().parents[2] / "manifests/volcano/scheduler.yaml"


def lab_conf() -> str:
    """The scheduler configuration the lab deploys, read from its ConfigMap in
    manifests/volcano/scheduler.yaml (proportion in the first tier, so that its
    Reclaimable - only queues over their deserved share - joins gang's and
    conformance's)."""
    for doc in yaml.safe_load_all(SCHEDULER_MANIFEST.read_text()):
        if doc and doc.get("kind") == "ConfigMap":
            return str(doc["data"]["volcano-scheduler.conf"])
    raise LookupError(f"no ConfigMap in {SCHEDULER_MANIFEST}")


LAB_CONF = lab_conf()


@dataclass
class FakeCache:
    binds: list[tuple[str, str]] = field(default_factory=list)
    evictions: list[tuple[str, str]] = field(default_factory=list)
    job_updates: dict[str, tuple[Obj, bool]] = field(default_factory=dict)
    queue_updates: dict[str, Mapping[str, str]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def add_bind_task(self, task: TaskInfo) -> None:
        self.binds.append((task.name, task.node_name))

    def evict(self, task: TaskInfo, reason: str) -> None:
        self.evictions.append((task.name, reason))

    def update_job_status(self, job: JobInfo, update_pg: bool) -> None:
        self.job_updates[job.name] = (job.pod_group or {}, update_pg)

    def update_queue_status(self, queue: QueueInfo, allocated: Mapping[str, str]) -> None:
        self.queue_updates[queue.name] = dict(allocated)

    def record_pod_group_event(self, job: JobInfo, warning: bool, reason: str, msg: str) -> None:
        self.events.append((job.name, reason, msg))

    def condition(self, job: str, ctype: str) -> Obj | None:
        pg = self.job_updates[job][0]
        for c in pg.get("status", {}).get("conditions") or []:
            if c["type"] == ctype:
                return c
        return None

    def phase(self, job: str) -> str:
        return self.job_updates[job][0]["status"]["phase"]


def gpu_nodes(count: int, gpus: int = 8, prefix: str = "gpu") -> list[Obj]:
    nodes = []
    for i in range(count):
        node = make_node(f"{prefix}-{i}", allocatable={"nvidia.com/gpu": gpus})
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        nodes.append(node)
    return nodes


def run(
    pods: Iterable[Obj],
    podgroups: Iterable[Obj],
    nodes: Iterable[Obj],
    queues: Iterable[Obj],
    conf_text: str = LAB_CONF,
    actions: Iterable[str] | None = None,
) -> tuple[Session, FakeCache]:
    """One full cycle: OpenSession, the configured actions, CloseSession."""
    cfg = conf.unmarshal_scheduler_conf(conf_text, ACTIONS, PLUGINS)
    info = snapshot.build(list(pods), list(podgroups), list(nodes), list(queues))
    cache = FakeCache()
    ssn = open_session(cache, info, cfg)
    for name in actions if actions is not None else cfg.actions:
        ACTIONS[name]().execute(ssn)
    close_session(ssn)
    return ssn, cache


# -- the API as the controllers call it -------------------------------------------------------


class Model:
    """What the generated client returns for a read: attributes, like a V1ConfigMap."""

    def __init__(self, body: Obj) -> None:
        meta = body.get("metadata") or {}
        self.metadata = SimpleNamespace(
            name=meta.get("name"), annotations=meta.get("annotations"), labels=meta.get("labels")
        )
        self.data = body.get("data")
        if body.get("stringData"):
            self.data = {
                k: base64.b64encode(v.encode()).decode() for k, v in body["stringData"].items()
            }
        self.string_data = None


class FakeApi:
    """The typed clients (CoreV1Api, NetworkingV1Api, AppsV1Api, CustomObjectsApi) as far
    as the controllers use them: objects by (kind, name), every call and patch recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.calls: list[tuple[str, str]] = []
        self.patches: list[Any] = []
        self.rv = 100
        self.core = self.networking = self  # the plugins' Clients

    def __getattr__(self, method: str) -> Any:
        verb, _, kind = method.partition("_namespaced_")
        if not kind:
            raise AttributeError(method)

        def call(*args: Any, **_kw: Any) -> Any:
            name = ""
            if verb in ("read", "delete", "replace", "patch"):
                name = args[0] if kind != "custom_object" else args[4]
            self.calls.append((method, name))
            if verb == "create":
                body = args[-1]
                name = body["metadata"]["name"]
                self.objects[(kind, name)] = body
                return body if kind in ("pod", "custom_object") else Model(body)
            if verb == "read":
                if (kind, name) not in self.objects:
                    raise ApiException(status=404)
                return Model(self.objects[(kind, name)])
            if verb == "delete":
                self.objects.pop((kind, name), None)
            if verb == "patch":
                self.patches.append(args[-1])
            if verb == "replace" and kind.startswith("custom_object"):
                self.rv += 1
                body = json.loads(json.dumps(args[-1]))
                body["metadata"]["resourceVersion"] = str(self.rv)
                return body
            return None

        return call

    def sanitize_for_serialization(self, obj: Any) -> Any:
        return obj

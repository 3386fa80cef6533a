"""A pod's status from its containers' states (pure; cf. kubelet ``kubelet_pods.go``
``generateAPIPodStatus``, ``getPhase``, and ``status/generate.go`` for the conditions)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerStatus:
    """What the runner knows about one container (kubelet's ``ContainerStatus``)."""

    name: str
    image: str
    init: bool = False
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""

    @property
    def running(self) -> bool:
        return "running" in self.state

    @property
    def terminated(self) -> Obj | None:
        return self.state.get("terminated")

    @property
    def succeeded(self) -> bool:
        term = self.terminated
        return term is not None and term.get("exitCode") == 0

    def to_api(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def phase(
    restart_policy: str, init: Sequence[ContainerStatus], app: Sequence[ContainerStatus]
) -> str:
    """kubelet's ``getPhase``."""
    for c in init:
        if c.succeeded:
            continue
        term = c.terminated or c.last_state.get("terminated")
        if restart_policy == "Never" and term is not None and term.get("exitCode") != 0:
            return "Failed"
        return "Pending"
    running = waiting = stopped = succeeded = failed = 0
    for c in app:
        if c.running:
            running += 1
        elif c.terminated is not None:
            stopped += 1
            if c.succeeded:
                succeeded += 1
            else:
                failed += 1
        elif c.last_state.get("terminated") is not None:
            stopped += 1  # waiting to restart after it ran
            if c.last_state["terminated"].get("exitCode") == 0:
                succeeded += 1
            else:
                failed += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if restart_policy == "Always":
            return "Running"
        if restart_policy == "OnFailure":
            return "Succeeded" if stopped == succeeded else "Running"
        return "Failed" if failed else "Succeeded"
    return "Pending"


def _condition(
    existing: Mapping[str, Obj], type_: str, ok: bool, reason: str = "", message: str = ""
) -> Obj:
    status = "True" if ok else "False"
    before = existing.get(type_)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status and before.get("lastTransitionTime")
        else now_rfc3339()
    )
    cond: Obj = {
        "type": type_,
        "status": status,
        "lastTransitionTime": since,
        "lastProbeTime": None,
    }
    if not ok and reason:
        cond["reason"] = reason
        cond["message"] = message
    return cond


def pod_status(
    pod: Mapping[str, Any],
    init: Sequence[ContainerStatus],
    app: Sequence[ContainerStatus],
    pod_ip: str | None,
    host_ip: str,
    start_time: str,
    sandbox_ready: bool,
) -> Obj:
    """The whole ``status`` the runner writes (replacing the lists it holds)."""
    spec = pod.get("spec") or {}
    old = pod.get("status") or {}
    existing = {c["type"]: c for c in old.get("conditions") or []}
    restart = spec.get("restartPolicy", "Always")
    initialized = all(c.succeeded for c in init)
    not_ready = [c.name for c in app if not c.ready]
    incomplete = [c.name for c in init if not c.succeeded]
    pod_phase = phase(restart, init, app)
    ready_reason = "PodCompleted" if pod_phase in ("Succeeded", "Failed") else "ContainersNotReady"
    conditions = [
        _condition(existing, "PodReadyToStartContainers", sandbox_ready),
        _condition(
            existing,
            "Initialized",
            initialized,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(incomplete)}]",
        ),
        _condition(
            existing,
            "Ready",
            initialized and not not_ready,
            ready_reason,
            f"containers with unready status: [{' '.join(not_ready)}]",
        ),
        _condition(
            existing,
            "ContainersReady",
            initialized and not not_ready,
            ready_reason,
            f"containers with unready status: [{' '.join(not_ready)}]",
        ),
    ]
    if "PodScheduled" in existing:
        conditions.append(existing["PodScheduled"])
    status: Obj = {
        "phase": pod_phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [c.to_api() for c in app],
    }
    if init:
        status["initContainerStatuses"] = [c.to_api() for c in init]
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status

"""The call chain as caller -> callee, drawn as a Mermaid sequence diagram. Pure.

The trace (``gpulab/trace.py``, README "The trace") records each call-chain step as an
Event on the object concerned, reported by the component that executed the step. A
sequence diagram wants lanes that call each other: kube-scheduler -> HAMi extender
(``Filter``, ``Bind``), kube-apiserver -> extender (``Webhook``), kubelet -> device plugin
(``Allocate``). :data:`RULES` says, per (reporting lane, step), who called whom. Where
both sides report a call, the side serving it reports first (as it handles it) and is
drawn as the call; the caller reports the answer, drawn as the reply (dashed). A step
not in the table is drawn on its reporter's lane as a self-call, so an unknown component
still shows up. Adjacent repeats of a call (a scheduler retrying a pod) become one arrow
with a count.

Lanes are fixed and ordered (:data:`LANES`) so diagrams of different runs line up.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpulab.trace import TraceEvent

LANES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "hami-extender",
    "gpulab-scheduler",
    "volcano",
    "kueue",
    "gpu-operator",
    "kubelet",
    "device-plugin",
    "NVML",
)

# The Event's reporter (TraceEvent.component: reportingController without "gpulab.io/",
# or the source component of a core/v1 Event) -> lane.
REPORTERS = {
    "default-scheduler": "kube-scheduler",
    "hami-scheduler": "hami-extender",  # the HAMi scheduler process: extender + webhook
    "node-agent": "kubelet",  # the lab's stand-in for kubelet's device manager
    "pod-runner": "kubelet",  # the lab's kubelet for its own pods
    "kueue-controller": "kueue",
    "kueue-admission": "kueue",
    # kube-controller-manager's controllers report under their own names
    "node-controller": "kube-controller-manager",
    "job-controller": "kube-controller-manager",
    "replicaset-controller": "kube-controller-manager",
    "deployment-controller": "kube-controller-manager",
    "daemonset-controller": "kube-controller-manager",
    "endpoint-slice-controller": "kube-controller-manager",
}
# Reasons kube-scheduler itself records (a profile reports under its schedulerName, which
# may be "hami-scheduler" too); schedulers of their own keep their lane.
SCHEDULER_REASONS = frozenset({"Scheduled", "FailedScheduling", "Preempted"})
OWN_SCHEDULERS = frozenset({"gpulab-scheduler", "volcano"})

API = "kube-apiserver"
SELF = "@"  # the reporter's own lane

# (reporting lane, step) -> (caller, callee, reply)
RULES: dict[tuple[str, str], tuple[str, str, bool]] = {
    # kube-scheduler: a bind decision is a Binding written to the API server
    ("kube-scheduler", "Scheduled"): ("kube-scheduler", API, False),
    ("kube-scheduler", "Preempted"): ("kube-scheduler", API, False),
    # HAMi: the API server calls the webhook, kube-scheduler the extender's routes
    ("hami-extender", "Webhook"): (API, "hami-extender", False),
    ("hami-extender", "Filter"): ("kube-scheduler", "hami-extender", False),
    ("hami-extender", "FilteringSucceed"): ("kube-scheduler", "hami-extender", True),
    ("hami-extender", "FilteringFailed"): ("kube-scheduler", "hami-extender", True),
    ("hami-extender", "Bind"): ("kube-scheduler", "hami-extender", False),
    ("hami-extender", "BindingSucceed"): ("kube-scheduler", "hami-extender", True),
    ("hami-extender", "BindingFailed"): ("kube-scheduler", "hami-extender", True),
    ("hami-extender", "LockNode"): ("hami-extender", API, False),
    ("hami-extender", "ReleaseNodeLock"): ("hami-extender", API, False),
    ("hami-extender", "RegisterNode"): (API, "hami-extender", False),
    ("hami-extender", "NodeCleanUp"): ("hami-extender", API, False),
    # kubelet device manager <-> device plugin (kubelet device-plugin API v1beta1)
    ("device-plugin", "Start"): ("device-plugin", "NVML", False),
    ("device-plugin", "CheckHealth"): ("device-plugin", "NVML", False),
    # (the side serving a call reports it as it handles it; the caller reports the answer)
    ("kubelet", "Register"): ("device-plugin", "kubelet", False),
    ("device-plugin", "Register"): ("device-plugin", "kubelet", True),
    ("device-plugin", "ListAndWatch"): ("kubelet", "device-plugin", True),  # a stream reply
    ("kubelet", "GetCapacity"): ("kubelet", API, False),
    ("device-plugin", "GetPreferredAllocation"): ("kubelet", "device-plugin", False),
    ("device-plugin", "Allocate"): ("kubelet", "device-plugin", False),
    ("kubelet", "Allocate"): ("kubelet", "device-plugin", True),
    ("device-plugin", "PreStartContainer"): ("kubelet", "device-plugin", False),
    ("device-plugin", "RegisterInAnnotation"): ("device-plugin", API, False),
    # Kueue: the controllers are woken by watches and write back through the API server
    # (step names as gpulab/kueue traces them, after kubernetes-sigs/kueue v0.19.2)
    ("kueue", "Reconcile"): (API, "kueue", False),
    ("kueue", "handleJobWithNoWorkload"): ("kueue", API, False),
    ("kueue", "requeueAndUpdate"): ("kueue", API, False),
    ("kueue", "admit"): ("kueue", API, False),
    ("kueue", "startJob"): ("kueue", API, False),
    ("kueue", "stopJob"): ("kueue", API, False),
    ("kueue", "IssuePreemptions"): ("kueue", API, False),
    ("kueue", "Evict"): ("kueue", API, False),
    ("kueue", "SyncAdmittedCondition"): ("kueue", API, False),
    ("kueue", "generatePodsReadyCondition"): ("kueue", API, False),
    ("kueue", "waitForPodsReadyIfNeeded"): ("kueue", SELF, False),
    ("kueue", "FinishWorkload"): ("kueue", API, False),
    ("kube-controller-manager", "SuccessfulCreate"): ("kube-controller-manager", API, False),
    ("kube-controller-manager", "SuccessfulDelete"): ("kube-controller-manager", API, False),
    ("kube-controller-manager", "Completed"): ("kube-controller-manager", API, False),
    # kubelet runs the containers the scheduler bound to its node
    ("kubelet", "Started"): ("kubelet", SELF, False),
    ("kubelet", "Killing"): ("kubelet", SELF, False),
    # GPU Operator: ClusterPolicy Reconcile applies each state's operands
    ("gpu-operator", "Reconcile"): (API, "gpu-operator", False),
}


@dataclass(frozen=True)
class Call:
    """One arrow: ``caller`` called ``callee`` (or, for a reply, ``callee`` answered)."""

    time: dt.datetime
    caller: str
    callee: str
    step: str
    regarding: str
    note: str
    warning: bool
    reply: bool
    count: int = 1
    id: str = ""  # the Event's uid: a repeat of the Event replaces its earlier call

    def json(self) -> dict[str, Any]:
        out = asdict(self)
        out["time"] = self.time.isoformat()
        out["line"] = mermaid_line(self)
        out["namespace"] = namespace_of(self.regarding)
        return out


def lane(component: str, step: str) -> str:
    """The lane of an Event's reporter."""
    if step in SCHEDULER_REASONS and component not in OWN_SCHEDULERS:
        return "kube-scheduler"
    return REPORTERS.get(component, component)


def call(ev: TraceEvent, event_id: str = "") -> Call:
    reporter = lane(ev.component, ev.step)
    caller, callee, reply = RULES.get((reporter, ev.step), (SELF, SELF, False))
    return Call(
        time=ev.time,
        caller=reporter if caller == SELF else caller,
        callee=reporter if callee == SELF else callee,
        step=ev.step,
        regarding=ev.regarding,
        note=ev.note,
        warning=ev.warning,
        reply=reply,
        count=ev.count,
        id=event_id,
    )


def calls(events: Iterable[TraceEvent]) -> list[Call]:
    """Every Event as a call, in time order, repeats collapsed."""
    return collapse(sorted((call(ev) for ev in events), key=lambda c: c.time))


def merge(prev: Call, new: Call) -> Call | None:
    """One call for a run of the same call (a scheduler retrying a pod): the newer one,
    counting both; None when they differ."""
    same = (prev.caller, prev.callee, prev.step, prev.regarding, prev.warning, prev.reply) == (
        new.caller,
        new.callee,
        new.step,
        new.regarding,
        new.warning,
        new.reply,
    )
    if not same or new.time < prev.time or (new.id and prev.id == new.id):
        return None
    return replace(new, count=prev.count + new.count)


def collapse(items: Iterable[Call]) -> list[Call]:
    """Adjacent repeats of a call merged into one (see :func:`merge`)."""
    out: list[Call] = []
    for c in items:
        merged = merge(out[-1], c) if out else None
        if merged is None:
            out.append(c)
        else:
            out[-1] = merged
    return out


def namespace_of(regarding: str) -> str:
    """ "Pod ns/name" -> "ns"; cluster-scoped objects -> ""."""
    _kind, _, name = regarding.partition(" ")
    return name.split("/", 1)[0] if "/" in name else ""


def participant(name: str) -> str:
    """A Mermaid participant id for a lane (ids may not hold '-', '/', ':' or spaces)."""
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _text(value: str, limit: int) -> str:
    # ';' ends a Mermaid statement and '#' starts an entity code
    clean = value.replace("\n", " ").replace(";", ",").replace("#", "")
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def mermaid_line(c: Call) -> str:
    """The call as one Mermaid sequenceDiagram statement."""
    arrow = "-x" if c.warning else "-->>" if c.reply else "->>"
    src, dst = (c.callee, c.caller) if c.reply else (c.caller, c.callee)
    times = f" (x{c.count})" if c.count > 1 else ""
    what = _text(f"{c.step}{times} {c.regarding}: {c.note}", 110)
    return f"    {participant(src)}{arrow}{participant(dst)}: {what}"


def lanes_of(items: Sequence[Call]) -> list[str]:
    """The lanes the calls use, in :data:`LANES` order, unknown ones after."""
    used = {c.caller for c in items} | {c.callee for c in items}
    return [x for x in LANES if x in used] + sorted(used - set(LANES))


def mermaid(items: Sequence[Call]) -> str:
    """A Mermaid sequenceDiagram (without the Markdown fence)."""
    lines = ["sequenceDiagram"]
    lines += [f"    participant {participant(x)} as {x}" for x in lanes_of(items)]
    lines += [mermaid_line(c) for c in items]
    return "\n".join(lines) + "\n"


def markdown(items: Sequence[Call]) -> str:
    """The calls as a Markdown Mermaid block."""
    return f"```mermaid\n{mermaid(items)}```\n"


def sequence_diagram(events: Iterable[TraceEvent]) -> str:
    """A run's trace as a Markdown Mermaid block (what `gpulab demo ... --diagram` writes)."""
    return markdown(calls(events))

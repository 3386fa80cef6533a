"""Demo `coscheduling`: gang scheduling with scheduler-plugins' Coscheduling, live.

    pod Pop (QueueSort: Coscheduling.Less) -> PreFilter (enough siblings?) -> Filter ->
    Score -> Reserve (assume) -> Permit (Wait until minMember are here) ||
    WaitOnPermit -> Bind (all at once) | timeout / PostFilter -> Unreserve -> all rejected

1. A PodGroup of 4 workers x 2 GPUs on two 4-GPU nodes, one of them half taken: three
   workers fit and wait at Permit, holding their GPUs - each with
   ``status.nominatedNodeName`` set (kube-scheduler 1.36's NominatedNodeNameForExpectation:
   ``kubectl get pod -o wide`` shows it) - and the group's timeout rejects all three
   together - nothing bound, nothing allocated, the nominations cleared. The rejected
   workers wait in unschedulablePods for an event Coscheduling registered (Pod/Add,
   PodGroup Add/Update): a node label change is not one, and the ``QueueingHint`` steps
   say so. Free the node: the deleted pod is an AssignedPodDelete that
   NodeResourcesFit's hint answers with Queue, and all four bind at once.
2. The gang deadlock of the chapter's last paragraph: two jobs that each fit alone but
   not together. Without gang scheduling the default scheduler binds half of each (both
   wait forever); with Coscheduling the queue sort takes one group whole and Permit
   keeps the other from holding anything, so one finishes and then the other runs.

Every step is read back from the Events gpulab-scheduler writes as it executes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

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
from gpulab import informer, trace
from gpulab.framework.objects import GPU, make_pod, manifest
from gpulab.schedulerplugins import apis
from gpulab.wait import WaitTimeout, wait_for
from harness.backends import SYSTEM_NAMESPACE, Backend

NAMESPACE = "demo-coscheduling"
SPEC = "scheduling"
SCHEDULER = "gpulab-scheduler"
T4 = {"gpulab.io/gpu-profile": "t4-x4"}
TIMEOUT = 5  # the groups' scheduleTimeoutSeconds
UNRELATED = ("cpu-only", "demo.gpulab.io/unrelated")  # the node and label of step 1's event

Obj = dict[str, Any]


def worker(group: str, i: int, scheduler: str = SCHEDULER) -> Obj:
    return make_pod(
        f"{group}-{i}",
        NAMESPACE,
        requests={GPU: 2},
        scheduler=scheduler,
        node_selector=T4,
        labels={apis.POD_GROUP_LABEL: group},
    )


def create(api: client.ApiClient, pod: Obj) -> None:
    client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, manifest(pod))


def create_group(api: client.ApiClient, name: str, members: int) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        NAMESPACE,
        apis.PODGROUPS.plural,
        apis.pod_group(name, NAMESPACE, members, schedule_timeout_seconds=TIMEOUT),
    )


def bound(api: client.ApiClient, prefix: str = "") -> dict[str, str]:
    """Pod name -> node, for the bound pods whose name starts with ``prefix``."""
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE).items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.spec.node_name and p.metadata.name.startswith(prefix)
    }


def notes(api: client.ApiClient, reason: str) -> dict[str, list[str]]:
    """Event messages by pod for ``reason`` in the demo namespace."""
    out: dict[str, list[str]] = {}
    for e in client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items:
        if e.reason == reason and e.involved_object.kind == "Pod":
            out.setdefault(e.involved_object.name, []).append(e.message or "")
    return out


def waiting_at_permit(api: client.ApiClient, names: list[str]) -> list[str]:
    permits = notes(api, "Permit")
    return [n for n in names if any("Coscheduling: Wait" in m for m in permits.get(n, []))]


class Nominations:
    """Every value of ``status.nominatedNodeName`` each pod of the namespace had, in
    order, from a pod watch for the whole demo (a moment's read could miss a clear that
    is quickly followed by the next nomination)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.history: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        lw = informer.ListWatch(api, informer.PODS, namespace=NAMESPACE)
        handlers = informer.Handlers(on_add=self._seen, on_update=lambda _old, new: self._seen(new))
        self._informer = informer.Informer(lw, handlers, name="demo-nominations")

    def __enter__(self) -> Nominations:
        self._informer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._informer.stop()

    def _seen(self, pod: Obj) -> None:
        value = (pod.get("status") or {}).get("nominatedNodeName") or ""
        with self._lock:
            seen = self.history.setdefault(pod["metadata"]["name"], [""])
            if seen[-1] != value:
                seen.append(value)

    def of(self, name: str) -> list[str]:
        with self._lock:
            return list(self.history.get(name, [""]))


def hints(api: client.ApiClient, event: str) -> dict[str, list[str]]:
    """QueueingHint notes by pod about ``event`` (a ClusterEvent label)."""
    return {
        pod: found
        for pod, msgs in notes(api, "QueueingHint").items()
        if (found := [m for m in msgs if m.startswith(f"{event}:")])
    }


def told(live: LiveTrace, step: str, pods: list[str], text: str = "") -> None:
    """Wait until the trace has ``step`` (with ``text`` in its note) for each of ``pods``:
    the scheduler posts its Events in the background, and a tick must not precede the
    steps it sums up."""
    wait_for(
        lambda: all(
            any(
                ev.step == step and ev.regarding == f"Pod {NAMESPACE}/{pod}" and text in ev.note
                for ev in list(live.seen)
            )
            for pod in pods
        ),
        30,
        f"{step} of {', '.join(pods)} in the trace",
    )


# a PodGroup change requeueing a pod Coscheduling rejected, as the QueueingHint steps say it
PODGROUP_EVENT = (
    f"{apis.PODGROUPS.plural}.{apis.PODGROUPS.version}.{apis.GROUP}Update: Coscheduling says Queue"
)
SETTLE = 10  # seconds a freed gang takes to bind when a freeing event woke one of its pods


def wake_if_stuck(api: client.ApiClient, group: str) -> None:
    """Wait for ``group``'s four workers to bind now that their GPUs are free. If every
    one of them was last rejected by Coscheduling (its Permit timeout, a rejection in
    Unreserve or PostFilter), a pod's deletion is no event Coscheduling registered: they
    would sit in unschedulablePods until podMaxInUnschedulablePodsDuration (5 min). A
    PodGroup update is one, so the demo says so and makes one (upstream behaves the same)."""
    try:
        wait_for(lambda: len(bound(api, group)) == 4, SETTLE, f"{group}'s workers bound")
        return
    except WaitTimeout:
        pass
    say(
        f"no worker of {group} moved: Coscheduling rejected them all last, and a pod's "
        "deletion is no event it registered (they would wait up to 5 min, "
        f"podMaxInUnschedulablePodsDuration). A PodGroup update is: annotate PodGroup {group}"
    )
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        NAMESPACE,
        apis.PODGROUPS.plural,
        group,
        {"metadata": {"annotations": {"demo.gpulab.io/nudge": str(time.time())}}},
    )
    wait_for(lambda: len(bound(api, group)) == 4, 60, f"{group}'s workers bound")


def clear(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(NAMESPACE).items, 60, "the pods to go")


def group_phase(api: client.ApiClient, name: str) -> str:
    pg = client.CustomObjectsApi(api).get_namespaced_custom_object(
        apis.GROUP, apis.VERSION, NAMESPACE, apis.PODGROUPS.plural, name
    )
    return str((pg.get("status") or {}).get("phase") or "-")


def all_or_nothing(api: client.ApiClient, nominations: Nominations, live: SchedulerTrace) -> None:
    console.rule("1. four workers, room for three")
    say("pod blocker (default-scheduler) takes 2 of gpu-t4-0's 4 GPUs: 6 free, 8 needed")
    create(
        api,
        make_pod(
            "blocker",
            NAMESPACE,
            requests={GPU: 2},
            node_selector={"kubernetes.io/hostname": "gpu-t4-0"},
        ),
    )
    wait_for(lambda: "blocker" in bound(api), 30, "blocker bound")
    say(f"PodGroup train: minMember 4, scheduleTimeoutSeconds {TIMEOUT}; 4 workers x 2 GPUs")
    create_group(api, "train", 4)
    names = [f"train-{i}" for i in range(4)]
    for i in range(4):
        create(api, worker("train", i))
    wait_for(lambda: len(waiting_at_permit(api, names)) >= 3, 30, "3 workers waiting at Permit")
    told(live, "Permit", waiting_at_permit(api, names), "Wait")
    ok("3 workers passed Filter and Reserve and wait at Permit, holding 6 GPUs; nothing bound")
    say(
        "(the chapter gives Coscheduling a Filter and a Reserve that reserves for the group: "
        "v0.35's has no Filter and its Reserve does nothing - the Filter lines are the other "
        "plugins', Reserve is the scheduler's assume; Permit holds the group)"
    )
    if bound(api, "train"):
        raise DemoFailed(f"workers bound before the group was complete: {bound(api, 'train')}")
    waiting = waiting_at_permit(api, names)
    nominated = wait_for(
        lambda: (
            all(nominations.of(n)[-1] for n in waiting)
            and {n: nominations.of(n)[-1] for n in waiting}
        ),
        30,
        "the waiting workers' nominatedNodeName",
    )
    ok(
        "each waiting worker has status.nominatedNodeName (kubectl get pod -o wide: "
        "NOMINATED NODE): " + ", ".join(f"{n} -> {node}" for n, node in sorted(nominated.items()))
    )
    say(f"the 4th fits nowhere; after {TIMEOUT}s the group times out at Permit")

    def all_rejected() -> bool:
        failed = notes(api, "FailedScheduling")
        return all(
            any("timeout" in m or "Unreserve" in m for m in failed.get(n, []))
            for n in waiting_at_permit(api, names)
        )

    wait_for(all_rejected, 30, "the waiting workers to be rejected together")
    allocated = [n for n in notes(api, "Allocate") if n.startswith("train")]
    if bound(api, "train") or allocated:
        raise DemoFailed("a worker was bound or allocated GPUs although the group timed out")
    told(live, "WaitOnPermit", waiting, "Coscheduling")
    ok("all waiting workers rejected together (Unreserve): no pod bound, no GPU allocated")
    cleared = wait_for(
        lambda: all("" in nominations.of(n)[1:] for n in waiting) and waiting,
        30,
        "the rejected workers' nominatedNodeName to be cleared",
    )
    ok(f"the rejection cleared nominatedNodeName of {', '.join(sorted(cleared))}")

    node, label = UNRELATED
    say(
        f"an unrelated event: label node {node} (NodeUpdateNodeLabel). The rejected workers "
        "wait in unschedulablePods for what Coscheduling registered (Pod/Add, PodGroup "
        "Add/Update) - no 1-10 s backoff loop"
    )
    say(
        "(the QueueingHint steps are a lab convenience, gpulab trace Events: kube-scheduler "
        "logs this decision only at -v=5)"
    )
    live.hints = ("NodeUpdateNodeLabel",)
    core = client.CoreV1Api(api)
    core.patch_node(node, {"metadata": {"labels": {label: "yes"}}})
    try:
        skipped = wait_for(
            lambda: {
                pod: msgs
                for pod, msgs in hints(api, "NodeUpdateNodeLabel").items()
                if pod.startswith("train") and any("Coscheduling" in m for m in msgs)
            },
            30,
            "a QueueingHint step about the label change on a rejected worker",
        )
    finally:
        core.patch_node(node, {"metadata": {"labels": {label: None}}})
    for pod, msgs in skipped.items():
        if any("moved to" in m for m in msgs):
            raise DemoFailed(f"the label change requeued {pod}: {msgs}")
    pod, msgs = min(skipped.items(), key=lambda kv: ("stays in" not in kv[1][0], kv[0]))
    ok(f"QueueingHint for {pod}: {msgs[0]}")

    say(
        "delete blocker: now the whole group fits. Its deletion is an AssignedPodDelete: "
        "NodeResourcesFit's hint says Queue for a worker it rejected (if one is), whose "
        "Permit then activates its siblings (ForceActivate)"
    )
    live.hints = ("AssignedPodDelete", "ForceActivate", PODGROUP_EVENT)
    client.CoreV1Api(api).delete_namespaced_pod("blocker", NAMESPACE, grace_period_seconds=0)
    wake_if_stuck(api, "train")

    def scheduled_times() -> list[Any]:
        return [
            e.event_time or e.last_timestamp
            for e in client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items
            if e.reason == "Scheduled" and e.involved_object.name.startswith("train")
        ]

    # the scheduler posts its Events in the background: wait for all four
    times = wait_for(lambda: len(t := scheduled_times()) == 4 and t, 30, "4 Scheduled Events")
    spread = (max(times) - min(times)).total_seconds()
    placement = bound(api, "train")
    told(live, "Bind", sorted(placement))
    ok(f"all 4 workers bound within {spread:.1f}s of each other: {placement}")
    wait_for(lambda: group_phase(api, "train") == "Running", 30, "PodGroup train Running")
    ok("the PodGroup controller reports phase Running")
    say("delete train's pods for the next story (its PodGroup goes back to Pending)")
    clear(api)


def deadlock(api: client.ApiClient, live: SchedulerTrace) -> str:
    """The two-gang story; returns the gang bound last (it stays bound)."""
    console.rule("2. two gangs that fit only one at a time")
    live.hints = (PODGROUP_EVENT,)  # only a nudge of a stuck gang's PodGroup
    say("jobs x and y, 4 workers x 2 GPUs each, submitted interleaved, to the default scheduler")
    for i in range(4):
        create(api, worker("x", i, "default-scheduler"))
        create(api, worker("y", i, "default-scheduler"))
    wait_for(lambda: len(bound(api)) == 4, 30, "the default scheduler to fill both nodes")
    held = bound(api)
    x, y = (sum(1 for n in held if n.startswith(g)) for g in ("x", "y"))
    if (x, y) != (2, 2):
        raise DemoFailed(f"expected the default scheduler to split the nodes 2+2, got {x}+{y}")
    told(live, "Scheduled", sorted(held))
    ok(f"deadlock: x holds {x} of 4 workers, y {y} of 4 - neither can ever start")
    say("delete x and y (the default scheduler hands each freed GPU to a waiting worker)")
    clear(api)

    say("the same two jobs as PodGroups a and b for gpulab-scheduler, still interleaved")
    create_group(api, "a", 4)
    time.sleep(1)  # creation times have 1 s resolution; Coscheduling.Less sorts by them
    create_group(api, "b", 4)
    for i in range(4):
        create(api, worker("a", i))
        create(api, worker("b", i))
    # Queue sort (Coscheduling.Less) orders a's workers first, but a worker tried before
    # its siblings exist fails PreFilter and its whole group backs off: then b goes first.
    # Either way one gang binds whole and the other holds nothing.
    first = wait_for(
        lambda: next((g for g in ("a", "b") if len(bound(api, g)) == 4), None),
        60,
        "one gang bound whole",
    )
    second = "b" if first == "a" else "a"
    failed = notes(api, "FailedScheduling")
    if bound(api, second) or not any(n.startswith(f"{second}-") for n in failed):
        raise DemoFailed(f"gang {second} should wait whole: bound {bound(api, second)}")
    told(live, "Bind", [f"{first}-{i}" for i in range(4)])
    ok(f"gang {first} bound whole, gang {second} holds nothing (its workers wait together)")
    say(f"gang {first} finishes (its pods are deleted)")
    # all four in one request: a gang freed a pod at a time can let the other gang's
    # first members wait at Permit and time out after the last freeing event, and a group
    # Coscheduling rejected waits for an event it registered (Pod/Add, PodGroup
    # Add/Update) - up to podMaxInUnschedulablePodsDuration (5 min) if none comes
    client.CoreV1Api(api).delete_collection_namespaced_pod(
        NAMESPACE, label_selector=f"{apis.POD_GROUP_LABEL}={first}", grace_period_seconds=0
    )
    wake_if_stuck(api, second)
    told(live, "Bind", [f"{second}-{i}" for i in range(4)])
    ok(f"gang {second} bound whole once {first} was gone: one after the other, never half-half")
    return second


def summary(api: client.ApiClient) -> None:
    table = Table(title="PodGroups (as the PodGroup controller reports them)")
    for col in ("PodGroup", "phase", "minMember", "running"):
        table.add_column(col)
    groups = client.CustomObjectsApi(api).list_namespaced_custom_object(
        apis.GROUP, apis.VERSION, NAMESPACE, apis.PODGROUPS.plural
    )["items"]
    for pg in groups:
        status = pg.get("status") or {}
        table.add_row(
            pg["metadata"]["name"],
            str(status.get("phase", "-")),
            str(apis.min_member(pg)),
            str(status.get("running", 0)),
        )
    console.print(table)


@dataclasses.dataclass
class SchedulerTrace(LiveTrace):
    """The namespace's story, plus gpulab-scheduler's start-up steps (Events on its own
    pod in gpulab-system: each plugin's New, the informers' sync). QueueingHint steps are
    shown only for the cluster events a scene is about (``hints``): the scheduler records
    one for every event and every waiting pod, a wall that buries the story."""

    hints: tuple[str, ...] = ()  # the ClusterEvent labels whose QueueingHint steps to show
    stale: frozenset[str] = frozenset()  # the scheduler pod restarted (a cold one just started)

    def _wanted(self, ev: trace.TraceEvent, namespace: str) -> bool:
        if ev.step == "QueueingHint" and not ev.note.startswith(self.hints or ("-",)):
            return False
        if ev.regarding in {f"Pod {SYSTEM_NAMESPACE}/{pod}" for pod in self.stale}:
            return False
        if namespace == SYSTEM_NAMESPACE:
            return (
                ev.component == SCHEDULER
                and ev.regarding.startswith(f"Pod {SYSTEM_NAMESPACE}/{SCHEDULER}-")
                and ev.time >= self._since - dt.timedelta(seconds=2)
            )
        return super()._wanted(ev, namespace)


def restart_scheduler(backend: Backend, live: SchedulerTrace) -> None:
    say(
        f"restart {SCHEDULER} (kubectl rollout restart) to see it start: each plugin's New "
        "(Coscheduling takes its PodGroup informer from framework.Handle), then the "
        "informers sync before the first pod is scheduled"
    )
    backend.restart(SCHEDULER)
    live.expect({"New", "WaitForCacheSync"}, timeout=30)
    ok(f"{SCHEDULER} runs: informers synced, Coscheduling's PodGroup informer among them")


def run(args: argparse.Namespace) -> int:
    if args.spec == "default":
        args = argparse.Namespace(**{**vars(args), "spec": SPEC})
    backend, _ = ensure_backend(args, addons=("scheduling",))
    api = backend.api()
    chapter(
        "Scheduling framework - Coscheduling (gang scheduling)",
        "gpulab-scheduler is kube-scheduler's framework with scheduler-plugins' Coscheduling:\n"
        "pods labelled scheduling.x-k8s.io/pod-group wait at Permit until minMember of their\n"
        "PodGroup got that far, then bind together - or are all rejected when the group's\n"
        "timeout passes, so no job holds half the GPUs it needs.",
    )
    fresh_namespace(api, NAMESPACE)
    stale = frozenset(p.metadata.name for p in backend.component_pods(SCHEDULER))
    with (
        SchedulerTrace(api, NAMESPACE, also=(SYSTEM_NAMESPACE,), stale=stale) as live,
        Nominations(api) as nominations,
    ):
        restart_scheduler(backend, live)
        all_or_nothing(api, nominations, live)
        last = deadlock(api, live)
        live.expect(
            {"PreFilter", "Filter", "Reserve", "Permit", "WaitOnPermit", "Bind", "QueueingHint"}
        )
        wait_for(lambda: group_phase(api, last) == "Running", 30, f"PodGroup {last} Running")
        summary(api)
        say(f"done; deleting the pods of {NAMESPACE} so the other demos find free GPUs")
        clear(api)
    diagram = getattr(args, "diagram", None)
    if diagram:
        live.write_diagram(Path(diagram))
    return 0

"""Demo `volcano`: queues share the GPUs by weight; a gang binds whole; reclaim.

Volcano's call chain, read back as it happens: the controller manager and vc-scheduler
are restarted first, so their start (informers synced, controllers run; the scheduler
loading its actions and plugins) is on screen. Then every second vc-scheduler opens a
session (``OpenSession``: the snapshot; ``OnSessionOpen``: gang's JobInfo per PodGroup,
proportion's deserved share per queue), runs its actions (``enqueue`` lets a PodGroup
into its queue; ``allocate`` runs the ``predicates`` per node and ``nodeorder``'s scores,
then commits a gang's Statement only when the whole gang fits; ``backfill`` places
BestEffort tasks; ``reclaim`` evicts from a queue over its share) and closes it
(``CloseSession``: PodGroup status and queue allocations written back). The session
lines come from the scheduler pod's log; the Job and PodGroup Events from the job
controller and the scheduler.

Story, on 16 GPUs (two 8-GPU nodes): team-a (weight 1) fills them with an elastic job;
team-b (weight 3) submits a 4-task gang that waits Inqueue until all 4 fit; reclaim takes
team-b's share back from team-a (team-a's job restarts, as its PodEvicted policy says);
the gang binds in one session; the shares end 1:3; a job larger than team-c's queue
capability stays Pending with the gang message; a BestEffort task (no requests), which
allocate skips, is placed by backfill.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from rich.markup import escape
from rich.table import Table

from demos.common import (
    NARRATION,
    DemoFailed,
    chapter,
    console,
    ensure_cluster,
    fresh_namespace,
    ok,
    say,
)
from gpulab import informer, trace
from gpulab.volcano import apis
from gpulab.volcano import objects as vo
from gpulab.volcano.client import VolcanoClient, condition, gpus, phase
from gpulab.wait import wait_for
from harness.backends import pod_ready

TEAM_A, TEAM_B, TEAM_C = "demo-volcano-a", "demo-volcano-b", "demo-volcano-c"
QUEUE_A, QUEUE_B, QUEUE_C = "demo-team-a", "demo-team-b", "demo-team-c"
SESSION_STEPS = ("OpenSession", "OnSessionOpen", "enqueue", "predicates", "nodeorder")
SESSION_STEPS += ("allocate", "backfill", "reclaim", "preempt", "CloseSession")
# the UID a vcjob's PodGroup name ends in (<job>-<uid>): its first 8 hex digits do
POD_GROUP_UID = re.compile(r"-([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
# the components' start-up lines: the controller manager's Run, the scheduler's loadSchedulerConf
START_STEPS = ("Run", "LoadSchedulerConf")
# the Deployments restarted so their start is on screen (label app=<name>, as upstream's)
VOLCANO_NS = "volcano-system"
CONTROLLERS, SCHEDULER = "volcano-controller", "volcano-scheduler"
RESTART_ON_EVICT = {"event": apis.POD_EVICTED_EVENT, "action": apis.RESTART_JOB}
# Each task's CPU and memory: small, so GPUs decide the story on every backend (a kind
# node has the host's few CPUs, not the spec's, and 4 pods of 1 CPU would not fit one)
SMALL = {"cpu": "250m", "memory": "256Mi"}

Obj = dict[str, Any]


def a_train() -> Obj:
    """team-a's elastic job: 8 x 2 GPUs, runs with 2, restarts when a pod is evicted."""
    return vo.vcjob(
        "a-train",
        [vo.task("worker", 8, gpus=2, seconds=3600, **SMALL)],
        queue=QUEUE_A,
        min_available=2,
        policies=[RESTART_ON_EVICT],
    )


def b_gang() -> Obj:
    """team-b's gang: 4 tasks x 3 GPUs, all or nothing."""
    return vo.vcjob("b-gang", [vo.task("worker", 4, gpus=3, seconds=3600, **SMALL)], queue=QUEUE_B)


def c_big() -> Obj:
    """team-c's job: 2 x 4 GPUs, more than the 4 GPUs team-c's queue may hold."""
    return vo.vcjob("c-big", [vo.task("worker", 2, gpus=4, seconds=3600, **SMALL)], queue=QUEUE_C)


def c_probe() -> Obj:
    """team-c's BestEffort job: one task without requests, which only backfill places."""
    job = vo.vcjob("c-probe", [vo.task("probe", 1, gpus=0, seconds=3600)], queue=QUEUE_C)
    for task in job["spec"]["tasks"]:
        for container in task["template"]["spec"]["containers"]:
            container.pop("resources", None)
    return job


# -- narration -----------------------------------------------------------------------------


# Events the session lines already tell (the scheduler's per-PodGroup decisions)
TOLD_BY_SESSION = ("Enqueue", "Allocate", "Reclaim", "Backfill", "Unschedulable", "Scheduled")


class Narrator:
    """Prints, while the story runs: the controller manager's and the scheduler's lines
    (from their pods' logs, from their start), each vcjob's phase changes, and the new Job
    / PodGroup Events not told already."""

    def __init__(self, api: client.ApiClient, namespaces: tuple[str, ...]) -> None:
        self.api = api
        self.namespaces = namespaces
        self.steps: list[tuple[str, str]] = []  # (step, message)
        self.events: list[trace.TraceEvent] = []
        self._stop = threading.Event()
        self._informers: list[informer.Informer] = []
        self._logs: list[Any] = []

    def __enter__(self) -> Narrator:
        for ns in self.namespaces:
            events = informer.Handlers(on_add=self._event)
            self._informers.append(informer.Informer(trace.events(self.api, ns), events).start())
            lw = informer.ListWatch(self.api, apis.JOBS, namespace=ns)
            self._informers.append(
                informer.Informer(lw, informer.Handlers(on_update=self._job)).start()
            )
        self.follow(CONTROLLERS, "vc-controller-manager")
        return self

    def follow(self, app: str, who: str) -> None:
        """Print ``app``'s lines from its pod's log, in a thread of their own."""
        threading.Thread(
            target=self._follow, args=(app, who), name=f"{app}-log", daemon=True
        ).start()

    def _job(self, old: Obj, new: Obj) -> None:
        before = ((old.get("status") or {}).get("state") or {}).get("phase")
        status = new.get("status") or {}
        now = (status.get("state") or {}).get("phase")
        if before == now or not now:
            return
        meta = new["metadata"]
        console.print(
            f"  [magenta]{'vcjob':<12}[/magenta] "
            f"[bold yellow]{before or '-'} -> {now}[/bold yellow]"
            f" {meta['namespace']}/{meta['name']} (running {status.get('running', 0)}, "
            f"retryCount {status.get('retryCount', 0)})"
        )

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for inf in self._informers:
            inf.stop()
        for log in self._logs:
            # shutdown, not only release_conn: a follower blocked reading the stream holds
            # the TLS socket, and closing it at interpreter exit would wait for that read
            with contextlib.suppress(Exception):
                log.shutdown()
                log.release_conn()

    def _event(self, obj: Obj) -> None:
        ev = trace.to_trace_event(obj)
        self.events.append(ev)
        if not ev.regarding.startswith(("Job ", "PodGroup ")) or ev.step in TOLD_BY_SESSION:
            return  # per-pod Events and the scheduler's decisions: the session lines tell them
        if NARRATION.verbose or not console.is_terminal:
            console.print("    " + trace.render_line(ev))
            return
        # a line whose head alone (a PodGroup's long name) is too wide is cut too
        console.print(
            "    " + trace.render_line(ev, width=console.width - 4),
            soft_wrap=False,
            no_wrap=True,
            overflow="ellipsis",
        )

    def _follow(self, app: str, who: str) -> None:
        """Print the component's call-chain lines from its pod's log, from its start."""
        core = client.CoreV1Api(self.api)
        pods = core.list_namespaced_pod(VOLCANO_NS, label_selector=f"app={app}").items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        if not live:
            return
        log = core.read_namespaced_pod_log(
            live[0].metadata.name, VOLCANO_NS, follow=True, _preload_content=False
        )
        self._logs.append(log)
        for line in _lines(log):
            if self._stop.is_set():
                return
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            step = rec.get("step")
            if rec.get("object") is not None or step not in (*SESSION_STEPS, *START_STEPS):
                continue
            message = str(rec.get("message", ""))
            if step not in (*START_STEPS, "OpenSession", "OnSessionOpen", "CloseSession") and (
                not any(ns in message for ns in self.namespaces)
            ):
                continue
            self.steps.append((step, message))
            colour = "bold cyan" if step in SESSION_STEPS[2:-1] else "bold blue"
            head = f"  [magenta]{who:<12}[/magenta] [{colour}]{step:<13}[/{colour}] "
            if not NARRATION.verbose:  # a PodGroup's name ends in its vcjob's UID: cut it
                message = POD_GROUP_UID.sub(r"-\1…", trace.compact(message))
                if console.is_terminal:
                    room = console.width - len(f"  {who:<12} {step:<13} ")
                    message = trace.fit(message, room)
            console.print(head + escape(message))

    def saw(self, step: str, text: str = "") -> bool:
        return any(s == step and text in m for s, m in self.steps)

    def closed(self, step: str, text: str) -> bool:
        """Whether the session that told ``step`` (with ``text``) has been closed on screen."""
        steps = list(self.steps)
        at = next((i for i, (s, m) in enumerate(steps) if s == step and text in m), None)
        return at is not None and any(s == "CloseSession" for s, _ in steps[at + 1 :])


def _lines(log: Any) -> Iterator[str]:
    pending = b""
    with contextlib.suppress(Exception):
        for chunk in log.stream(4096):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")


def _restart(api: client.ApiClient, app: str) -> None:
    """Delete the Deployment's pod and wait for its Ready replacement (kubectl rollout
    restart, in effect), so the component's start happens while the demo watches."""
    core = client.CoreV1Api(api)
    old = {
        p.metadata.uid
        for p in core.list_namespaced_pod(VOLCANO_NS, label_selector=f"app={app}").items
    }
    core.delete_collection_namespaced_pod(VOLCANO_NS, label_selector=f"app={app}")

    def ready() -> bool:
        pods = core.list_namespaced_pod(VOLCANO_NS, label_selector=f"app={app}").items
        return any(p.metadata.uid not in old and pod_ready(p) for p in pods)

    wait_for(ready, 90, f"a new Ready {app} pod")


# -- the story -----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    api, _spec = ensure_cluster(args, addons=("volcano",))
    vc = VolcanoClient(api)
    chapter(
        "Volcano - sessions, queues and gangs",
        "vc-scheduler runs one session per second: OpenSession -> enqueue -> allocate ->\n"
        "backfill -> reclaim -> CloseSession. Three queues share two 8-GPU nodes:\n"
        f"{QUEUE_A} (weight 1), {QUEUE_B} (weight 3), {QUEUE_C} (capability 4 GPUs).",
    )
    for ns in (TEAM_A, TEAM_B, TEAM_C):
        fresh_namespace(api, ns)
    _queues(vc)
    say(
        "restart the controller manager and vc-scheduler, to see them start: the controllers "
        "sync their Job, PodGroup and Queue informers; the scheduler loads its configuration"
    )
    for app in (CONTROLLERS, SCHEDULER):
        _restart(api, app)
    with Narrator(api, (TEAM_A, TEAM_B, TEAM_C)) as narrator:
        # one log after the other: the controllers' start, then the scheduler's
        wait_for(lambda: narrator.saw("Run"), 30, "the controller manager's Run line")
        narrator.follow(SCHEDULER, "vc-scheduler")
        wait_for(lambda: narrator.saw("LoadSchedulerConf"), 30, "the scheduler's first line")
        say(
            f"team-a submits a-train: 8 tasks x 2 GPUs, runs with 2 (minAvailable), queue {QUEUE_A}"
        )
        vc.create_job(TEAM_A, a_train())
        wait_for(lambda: vc.bound(TEAM_A, "a-train") == 8, 60, "a-train's 8 pods to be bound")
        wait_for(lambda: _allocated(vc, QUEUE_A) == 16, 30, f"{QUEUE_A} to account 16 GPUs")
        ok(f"team-b is idle, so {QUEUE_A} deserves (and holds) all 16 GPUs")

        say(f"team-b submits b-gang: a gang of 4 tasks x 3 GPUs in {QUEUE_B}")
        vc.create_job(TEAM_B, b_gang())
        seen = wait_for(
            lambda: _inqueue_unbound(vc),
            60,
            "b-gang's PodGroup to be Inqueue with its pods waiting",
        )
        ok(f"b-gang is Inqueue and none of its 4 pods is bound: {seen}")
        wait_for(lambda: vc.bound(TEAM_B, "b-gang") == 4, 90, "b-gang's 4 pods to be bound")
        wait_for(lambda: narrator.closed("allocate", "4 task(s)"), 20, "b-gang's session to close")
        ok("reclaim evicted team-a's tasks over its share; b-gang's 4 pods bound in one session")
        say(
            "(the chapter says gang checks resources in the predicate phase; v1.15.1's gang "
            "registers no predicate: it votes JobReady, and allocate commits the Statement)"
        )
        wait_for(
            lambda: (
                vc.job_phase(TEAM_A, "a-train") == apis.JOB_RUNNING
                and vc.bound(TEAM_A, "a-train") == 2
            ),
            90,
            "a-train to restart and run again with its share",
        )
        a, b = _allocated(vc, QUEUE_A), _allocated(vc, QUEUE_B)
        if (a, b) != (4, 12):
            raise DemoFailed(f"queues hold {a} and {b} GPUs; expected 4 and 12 (weights 1:3)")
        retries = (vc.job(TEAM_A, "a-train") or {})["status"].get("retryCount")
        ok(
            f"a-train restarted (retryCount {retries}, policy PodEvicted -> RestartJob); "
            f"shares now {a}:{b} GPUs = 1:3"
        )

        say(f"team-c submits c-big: 2 tasks x 4 GPUs, but {QUEUE_C} may hold 4 GPUs")
        vc.create_job(TEAM_C, c_big())
        pg = wait_for(lambda: _unschedulable(vc), 30, "c-big's PodGroup to report why it waits")
        if vc.job_phase(TEAM_C, "c-big") != apis.JOB_PENDING or phase(pg) != apis.PG_PENDING:
            raise DemoFailed("c-big should stay Pending")
        ok("c-big stays Pending: its PodGroup is never let into the queue")

        say(f"team-c submits c-probe: one task with no requests (BestEffort) in {QUEUE_C}")
        vc.create_job(TEAM_C, c_probe())
        wait_for(lambda: vc.bound(TEAM_C, "c-probe") == 1, 60, "c-probe's pod to be bound")
        wait_for(lambda: narrator.closed("backfill", "c-probe"), 20, "c-probe's session to close")
        ok("allocate skips a task without requests; backfill placed c-probe")
        _expect(narrator)
        _table(vc)
    diagram = getattr(args, "diagram", None)
    if diagram:
        Path(diagram).write_text(trace.sequence_diagram(narrator.events))
        say(f"sequence diagram of this run written to {diagram}")
    console.rule("[bold]outcome")
    ok("a gang is all or nothing: the Statement is committed only when JobReady")
    ok(
        "queues share by weight (proportion's deserved); "
        "reclaim takes back from an over-share queue"
    )
    ok("a job larger than its queue's capability stays Pending, with the gang message")
    ok("BestEffort tasks (no requests) are left to backfill")
    say(f"look around: gpulab kubectl --spec {args.spec} get queues,vcjob,podgroups -A")
    return 0


def _queues(vc: VolcanoClient) -> None:
    """The demo's queues, made afresh (a rerun deletes the old ones)."""
    for name in (QUEUE_A, QUEUE_B, QUEUE_C):
        vc.delete_queue(name)
        wait_for(lambda n=name: vc.queue(n) is None, 30, f"queue {name} to be deleted")
    vc.create_queue(vo.queue(QUEUE_A, 1))
    vc.create_queue(vo.queue(QUEUE_B, 3))
    vc.create_queue(vo.queue(QUEUE_C, 1, capability={"nvidia.com/gpu": 4}))
    for name in (QUEUE_A, QUEUE_B, QUEUE_C):
        wait_for(
            lambda n=name: (
                ((vc.queue(n) or {}).get("status") or {}).get("state") == apis.QUEUE_OPEN
            ),
            30,
            f"queue {name} to be Open",
        )
    ok(f"queues {QUEUE_A} (weight 1), {QUEUE_B} (weight 3), {QUEUE_C} (4 GPUs) are Open")


def _restarted(vc: VolcanoClient) -> bool:
    job = vc.job(TEAM_A, "a-train") or {}
    status = job.get("status") or {}
    return (
        int(status.get("retryCount") or 0) >= 1
        and (status.get("state") or {}).get("phase") == apis.JOB_RUNNING
        and vc.bound(TEAM_A, "a-train") == 2
        and _allocated(vc, QUEUE_A) == 4
    )


def _allocated(vc: VolcanoClient, queue: str) -> int:
    return gpus(((vc.queue(queue) or {}).get("status") or {}).get("allocated"))


def _inqueue_unbound(vc: VolcanoClient) -> str | None:
    pg = vc.pod_group(TEAM_B, "b-gang")
    pods = vc.pods(TEAM_B, "b-gang")
    if phase(pg) != apis.PG_INQUEUE or len(pods) != 4 or any(p.spec.node_name for p in pods):
        return None
    cond = condition(pg, apis.PG_UNSCHEDULABLE_TYPE)
    message = (cond or {}).get("message") or ""
    return message if message.startswith("4/4 tasks in gang unschedulable") else None


def _unschedulable(vc: VolcanoClient) -> Obj | None:
    pg = vc.pod_group(TEAM_C, "c-big")
    return pg if pg is not None and phase(pg) == apis.PG_PENDING and _gang_event(vc) else None


def _gang_event(vc: VolcanoClient) -> bool:
    """Both reasons on c-big's PodGroup: enqueue's quota message and the gang message."""
    events = client.CoreV1Api(vc.api).list_namespaced_event(TEAM_C).items
    wanted = ("queue resource quota insufficient", "tasks in gang unschedulable")
    found = {
        w: ev
        for ev in events
        for w in wanted
        if ev.involved_object.kind == "PodGroup" and w in (ev.message or "")
    }
    if len(found) < len(wanted):
        return False
    for w in wanted:  # why it waits: facts, not successes
        say(f"PodGroup Event {found[w].type} {found[w].reason}: {found[w].message}")
    return True


def _expect(narrator: Narrator) -> None:
    wanted = ("OpenSession", "OnSessionOpen", "enqueue", "predicates", "nodeorder", "allocate")
    wanted += ("backfill", "reclaim", "CloseSession")
    wait_for(
        lambda: all(any(s == w for s, _ in narrator.steps) for w in wanted),
        20,
        f"session steps {wanted} in the scheduler's trace",
    )


def _table(vc: VolcanoClient) -> None:
    table = Table(
        title="Queues (status.allocated; PodGroups by phase as vcctl queue get counts them)"
    )
    for col in ("queue", "weight", "state", "GPUs allocated", "Inqueue", "Pending", "Running"):
        table.add_column(col)
    groups = vc.pod_groups()
    for name in (QUEUE_A, QUEUE_B, QUEUE_C):
        q = vc.queue(name) or {}
        mine = [g for g in groups if (g.get("spec") or {}).get("queue") == name]
        count = lambda p, mine=mine: str(sum(1 for g in mine if phase(g) == p))  # noqa: E731
        table.add_row(
            name,
            str(q.get("spec", {}).get("weight")),
            str(q.get("status", {}).get("state")),
            str(gpus(q.get("status", {}).get("allocated"))),
            count(apis.PG_INQUEUE),
            count(apis.PG_PENDING),
            count(apis.PG_RUNNING),
        )
    console.print(table)

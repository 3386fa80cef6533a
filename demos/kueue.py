"""Demo `kueue`: two teams share GPU quota through a cohort.

Kueue's call chain, read back from the cluster's Events as it happens: the Job webhook
creates every queued Job suspended; the Job integration creates its Workload
(``Reconcile``); the scheduler finds the Workload's ClusterQueue (``FindClusterQueue``)
and reserves quota (``Admit``), and the Job integration unsuspends the Job with the
flavor's nodeSelector (``Unsuspend``). Over quota a Job waits suspended; an idle team's
quota is borrowed; a high-priority Job reclaims it by preemption (``Evict``); a finishing
Job (``Finish``) gives its quota to the next.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from demos.cluster import gpu_pod_spec
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
from gpulab import trace
from gpulab.kueue import api as kueue
from gpulab.kueue.model import condition
from gpulab.kueue.workload import workload_name_for_job
from gpulab.wait import wait_for

TEAM_A, TEAM_B = "demo-kueue-a", "demo-kueue-b"  # the teams' namespaces
CQ_A, CQ_B = "demo-kueue-team-a", "demo-kueue-team-b"
COHORT = "demo-kueue"
FLAVOR = "demo-kueue-gpu"
HIGH_PRIORITY = "demo-kueue-high"
GPU = "nvidia.com/gpu"
Obj = dict[str, Any]


# -- objects (the e2e tests build theirs with these too) ----------------------------------


def flavor(name: str) -> Obj:
    """A ResourceFlavor for the GPU nodes (their pods get this nodeSelector)."""
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {"nvidia.com/gpu.present": "true"}},
    }


def cluster_queue(
    name: str,
    namespace: str,
    quota: int | str,
    flavor_name: str,
    cohort: str | None = None,
    resource: str = GPU,
    **spec: Any,
) -> Obj:
    """A ClusterQueue with ``quota`` of ``resource`` for one namespace's queues."""
    body: Obj = {
        "apiVersion": kueue.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {
                    "coveredResources": [resource],
                    "flavors": [
                        {
                            "name": flavor_name,
                            "resources": [{"name": resource, "nominalQuota": quota}],
                        }
                    ],
                }
            ],
            **spec,
        },
    }
    if cohort:
        body["spec"]["cohortName"] = cohort
    return body


def local_queue(name: str, namespace: str, cq: str) -> Obj:
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cq},
    }


def queued_job(
    name: str, queue: str, gpus: int, seconds: int, priority_class: str | None = None
) -> client.V1Job:
    """A one-pod GPU Job for LocalQueue ``queue``; kwok completes its pod after ``seconds``."""
    spec = gpu_pod_spec(gpus, restart_policy="Never")
    spec.priority_class_name = priority_class
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(
            annotations={"pod-complete.stage.kwok.x-k8s.io/delay": f"{seconds}s"}
        ),
        spec=spec,
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={kueue.QUEUE_LABEL: queue}),
        spec=client.V1JobSpec(template=template, backoff_limit=0),
    )


def create(api: client.ApiClient, body: Obj) -> Obj:
    """Create a kueue.x-k8s.io object (cluster-scoped or namespaced)."""
    custom = client.CustomObjectsApi(api)
    version = body["apiVersion"].split("/")[1]
    plural = _plural(body["kind"])
    ns = body["metadata"].get("namespace")
    if ns:
        return custom.create_namespaced_custom_object(kueue.GROUP, version, ns, plural, body)
    return custom.create_cluster_custom_object(kueue.GROUP, version, plural, body)


def get(api: client.ApiClient, kind: str, name: str, namespace: str | None = None) -> Obj:
    custom = client.CustomObjectsApi(api)
    plural = _plural(kind)
    if namespace:
        return custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, plural, name
        )
    return custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)


def workload_of(api: client.ApiClient, namespace: str, job: str) -> Obj | None:
    """The Workload Kueue created for Job ``job`` (named after the Job's name and UID)."""
    uid = client.BatchV1Api(api).read_namespaced_job(job, namespace).metadata.uid
    try:
        return get(api, "Workload", workload_name_for_job(job, uid), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def reason(obj: Mapping[str, Any] | None, ctype: str, status: str = "True") -> str | None:
    """The reason of condition ``ctype`` if it has ``status``, else None."""
    cond = condition(obj or {}, ctype)
    return cond.get("reason") if cond and cond.get("status") == status else None


def suspended(api: client.ApiClient, namespace: str, job: str) -> bool:
    return bool(client.BatchV1Api(api).read_namespaced_job(job, namespace).spec.suspend)


def gpu_usage(cq: Mapping[str, Any]) -> int:
    """nvidia.com/gpu a ClusterQueue's admitted Workloads hold (its status)."""
    return sum(
        int(r["total"])
        for f in (cq.get("status") or {}).get("flavorsUsage") or []
        for r in f["resources"]
        if r["name"] == GPU
    )


class Watched:
    """The objects of one list/watch, followed in a background thread while in a
    ``with`` block; ``on_event(obj, objects)`` runs after every event with the object
    that changed and all of them (name -> object as the API server sent it), so no
    moment slips between two polls. The e2e tests and bench/kueue_admission.py measure
    with it."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        *args: Any,
        on_event: Callable[[Obj, dict[str, Obj]], None],
        **kwargs: Any,
    ) -> None:
        self.objects: dict[str, Obj] = {}
        self.events = 0
        self._list, self._args, self._kwargs, self._on_event = list_fn, args, kwargs, on_event
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self._list, *self._args, timeout_seconds=2, deserialize=False, **self._kwargs
            )
            try:
                for ev in stream:
                    obj = ev["object"]
                    if ev["type"] == "DELETED":
                        self.objects.pop(obj["metadata"]["name"], None)
                    elif ev["type"] in ("ADDED", "MODIFIED"):
                        self.objects[obj["metadata"]["name"]] = obj
                    self.events += 1
                    self._on_event(obj, self.objects)
                    if self._stop.is_set():
                        return
            except Exception:  # a blip in the watch: watch again (a fresh listing)
                self._stop.wait(0.2)


def _plural(kind: str) -> str:
    kinds = (kueue.RESOURCE_FLAVOR, kueue.CLUSTER_QUEUE, kueue.LOCAL_QUEUE, kueue.WORKLOAD)
    return {k: plural for k, plural, _namespaced in kinds}[kind]


# -- the demo ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    api, _spec = ensure_cluster(args, addons=("kueue",))
    chapter(
        "Kueue - queues and quota for GPU Jobs",
        "Two teams, each a LocalQueue on its own ClusterQueue with 4 nvidia.com/gpu, share\n"
        "one cohort. Kueue keeps queued Jobs suspended until their Workload is admitted.",
    )
    for ns in (TEAM_A, TEAM_B):
        fresh_namespace(api, ns)
    _setup(api)
    batch = client.BatchV1Api(api)
    with LiveTrace(api, TEAM_A) as live_a, LiveTrace(api, TEAM_B) as live_b:
        say("team-a submits a-1 (4 GPUs): within its own quota")
        batch.create_namespaced_job(TEAM_A, queued_job("a-1", "team-a", 4, 600))
        _wait_admitted(api, TEAM_A, "a-1")
        # Admission times have 1 s resolution; Kueue preempts the most recently admitted
        # Workload first, which must be a-2.
        time.sleep(1)
        say("team-a submits a-2 (4 GPUs): over its quota, but team-b's 4 GPUs are idle")
        batch.create_namespaced_job(TEAM_A, queued_job("a-2", "team-a", 4, 600))
        _wait_admitted(api, TEAM_A, "a-2")
        used = gpu_usage(get(api, "ClusterQueue", CQ_A))
        if used != 8:
            raise DemoFailed(f"ClusterQueue {CQ_A} uses {used} GPUs; expected 8 (4 borrowed)")
        ok(f"a-2 admitted by borrowing: ClusterQueue {CQ_A} uses 8 GPUs, its quota is 4")

        say("team-a submits a-3 (2 GPUs): the cohort is full")
        batch.create_namespaced_job(TEAM_A, queued_job("a-3", "team-a", 2, 600))
        why = wait_for(
            lambda: reason(workload_of(api, TEAM_A, "a-3"), kueue.QUOTA_RESERVED, "False"),
            30,
            "a-3's Workload to be evaluated",
        )
        if why != kueue.REASON_WAITING_FOR_QUOTA or not suspended(api, TEAM_A, "a-3"):
            raise DemoFailed(f"a-3 should wait suspended for quota; its Workload says {why}")
        wait_for(
            lambda: get(api, "ClusterQueue", CQ_A)["status"].get("pendingWorkloads") == 1,
            30,
            f"ClusterQueue {CQ_A} to count a-3 as pending",
        )
        ok(f"a-3 waits suspended: QuotaReserved=False, {why}; {CQ_A} has 1 pending Workload")

        say("team-b submits b-1 (4 GPUs, PriorityClass demo-kueue-high, runs 8 s)")
        batch.create_namespaced_job(
            TEAM_B, queued_job("b-1", "team-b", 4, 8, priority_class=HIGH_PRIORITY)
        )
        _wait_admitted(api, TEAM_B, "b-1")
        a2 = workload_of(api, TEAM_A, "a-2")
        preempted = reason(a2, kueue.PREEMPTED)
        if preempted != kueue.IN_COHORT_RECLAMATION or not suspended(api, TEAM_A, "a-2"):
            raise DemoFailed(f"a-2 should be preempted by b-1 and suspended; Preempted={preempted}")
        if not _admitted(api, TEAM_A, "a-1"):
            raise DemoFailed("a-1 (within team-a's own quota) should still run")
        ok("b-1 reclaimed team-b's quota: a-2 was preempted (InCohortReclamation), a-1 kept")

        say("b-1 finishes: its quota goes to the next Workload waiting in the cohort")
        done = wait_for(
            lambda: reason(workload_of(api, TEAM_B, "b-1"), kueue.FINISHED), 60, "b-1 to finish"
        )
        _wait_admitted(api, TEAM_A, "a-2")
        if not suspended(api, TEAM_A, "a-3"):
            raise DemoFailed("a-3 should still wait: the cohort is full again")
        ok(f"b-1 Finished ({done}); a-2 admitted again, a-3 still waits")
        _expect(
            live_a,
            live_b,
            {"Reconcile", "FindClusterQueue", "Admit", "Unsuspend", "Evict", "Finish"},
        )
    diagram = getattr(args, "diagram", None)
    if diagram:
        events = sorted(live_a.seen + live_b.seen, key=lambda ev: ev.time)
        Path(diagram).write_text(trace.sequence_diagram(events))
        say(f"sequence diagram of this run written to {diagram}")

    console.rule("[bold]outcome")
    ok("over quota: a Job waits suspended, its Workload says why (WaitingForQuota)")
    ok("idle quota in the cohort is borrowed; a higher-priority Job reclaims it (Evict)")
    ok("a finishing Job (Finish) admits the next one (Admit → Unsuspend)")
    say(f"look around: gpulab kubectl get clusterqueues,workloads -n {TEAM_A}")
    return 0


def _setup(api: client.ApiClient) -> None:
    """Cluster-scoped objects of the story, made afresh (a rerun deletes the old ones)."""
    custom = client.CustomObjectsApi(api)
    sched = client.SchedulingV1Api(api)
    for plural, name in (
        ("clusterqueues", CQ_A),
        ("clusterqueues", CQ_B),
        ("resourceflavors", FLAVOR),
    ):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)
    with contextlib.suppress(ApiException):
        sched.delete_priority_class(HIGH_PRIORITY)
    sched.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name=HIGH_PRIORITY), value=1000)
    )
    create(api, flavor(FLAVOR))
    # team-a borrows freely; team-b takes its quota back from lower-priority Workloads.
    create(api, cluster_queue(CQ_A, TEAM_A, 4, FLAVOR, cohort=COHORT))
    create(
        api,
        cluster_queue(
            CQ_B,
            TEAM_B,
            4,
            FLAVOR,
            cohort=COHORT,
            preemption={"reclaimWithinCohort": "LowerPriority"},
        ),
    )
    create(api, local_queue("team-a", TEAM_A, CQ_A))
    create(api, local_queue("team-b", TEAM_B, CQ_B))
    for cq in (CQ_A, CQ_B):
        wait_for(
            lambda cq=cq: reason(get(api, "ClusterQueue", cq), kueue.CQ_ACTIVE),
            30,
            f"ClusterQueue {cq} to be Active",
        )
    ok(f"ClusterQueues {CQ_A} and {CQ_B} (cohort {COHORT}, 4 GPUs each) are Active")


def _admitted(api: client.ApiClient, namespace: str, job: str) -> bool:
    wl = workload_of(api, namespace, job)
    return reason(wl, kueue.ADMITTED) is not None and not suspended(api, namespace, job)


def _wait_admitted(api: client.ApiClient, namespace: str, job: str) -> None:
    wait_for(lambda: _admitted(api, namespace, job), 60, f"Job {job} to be admitted and running")
    wl = workload_of(api, namespace, job) or {}
    cq = wl["status"]["admission"]["clusterQueue"]
    ok(f"{job} admitted in ClusterQueue {cq} and unsuspended")


def _expect(a: LiveTrace, b: LiveTrace, steps: set[str]) -> None:
    wait_for(
        lambda: steps <= {ev.step for ev in a.seen + b.seen},
        20,
        f"Events {sorted(steps - {ev.step for ev in a.seen + b.seen})} in the trace",
    )

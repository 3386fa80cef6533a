"""Demo `kueue`: two GPU teams share quota through a Cohort, with fair sharing.

Kueue's call chain (kubernetes-sigs/kueue v0.19.2), read back from the cluster's Events
as it happens: the Job webhook creates every queued Job suspended; the Job integration
creates its Workload (``handleJobWithNoWorkload``); the queue manager puts it in the
ClusterQueue its LocalQueue names (``AddOrUpdateWorkload``); a scheduling cycle takes
the heads, assigns flavors and reserves quota (``admit``), or says why not
(``requeueAndUpdate``) and parks the Workload until something frees quota; the Job
integration unsuspends the Job with the flavor's nodeSelector (``startJob``). With fair
sharing a team that has lent its quota takes it back (``IssuePreemptions``,
``stopJob``), and teams that both borrow end up with the same share; a finishing Job
(``FinishWorkload``) requeues the parked Workloads.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from kubernetes import client
from kubernetes.client.rest import ApiException
from rich.table import Table

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
from gpulab.informer import Handlers, Informer, ListWatch, Resource
from gpulab.kueue import api as kueue
from gpulab.kueue.model import condition, timestamp
from gpulab.kueue.workload import workload_name
from gpulab.wait import wait_for

TEAM_A, TEAM_B = "demo-kueue-a", "demo-kueue-b"  # the teams' namespaces
CQ_A, CQ_B, CQ_POOL = "demo-kueue-team-a", "demo-kueue-team-b", "demo-kueue-pool"
COHORT = "demo-kueue"
FLAVOR = "demo-kueue-gpu"
GPU = "nvidia.com/gpu"
Obj = dict[str, Any]
PLURALS = {kind: plural for kind, plural, _namespaced in kueue.KINDS}
# seed 000 §6.6 has WorkloadReconciler.Reconcile match the ClusterQueue and admit (docs/kueue.md)
CHAPTER_DIFFERS = (
    "    [yellow](the chapter differs)[/yellow] not Reconcile: the Workload controller's event "
    "handler queues the Workload in its LocalQueue's ClusterQueue (AddOrUpdateWorkload), a "
    "scheduling cycle admits it from a snapshot of the quota cache (assumeWorkload, admit), "
    "and the Job integration unsuspends the Job (startJob)"
)


# -- objects (the e2e tests and the benchmark build theirs with these too) -----------------


def flavor(name: str, node_labels: Mapping[str, str] | None = None) -> Obj:
    """A ResourceFlavor; by default for the GPU nodes (their pods get this nodeSelector)."""
    labels = {"nvidia.com/gpu.present": "true"} if node_labels is None else dict(node_labels)
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels} if labels else {},
    }


def cluster_queue(
    name: str,
    namespace: str | None,
    quota: int | str | Mapping[str, int | str],
    flavor_name: str,
    cohort: str | None = None,
    resource: str = GPU,
    **spec: Any,
) -> Obj:
    """A ClusterQueue with ``quota`` (one resource, or {resource: quota}) for one
    namespace's queues (None: for no namespace, a pure lender)."""
    quotas = quota if isinstance(quota, Mapping) else {resource: quota}
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}} if namespace else None
    body: Obj = {
        "apiVersion": kueue.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": list(quotas),
                    "flavors": [
                        {
                            "name": flavor_name,
                            "resources": [
                                {"name": r, "nominalQuota": q} for r, q in quotas.items()
                            ],
                        }
                    ],
                }
            ],
            **spec,
        },
    }
    if selector is not None:
        body["spec"]["namespaceSelector"] = selector
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
    spec = gpu_pod_spec(gpus, restart_policy="Never", seconds=seconds)
    labels = {kueue.QUEUE_LABEL: queue}
    if priority_class:
        labels[kueue.PRIORITY_CLASS_LABEL] = priority_class
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(
            annotations={"pod-complete.stage.kwok.x-k8s.io/delay": f"{seconds}s"}
        ),
        spec=spec,
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1JobSpec(template=template, backoff_limit=0),
    )


def create(api: client.ApiClient, body: Obj) -> Obj:
    """Create a kueue.x-k8s.io object (cluster-scoped or namespaced)."""
    custom = client.CustomObjectsApi(api)
    version = body["apiVersion"].split("/")[1]
    plural = PLURALS[body["kind"]]
    ns = body["metadata"].get("namespace")
    if ns:
        return custom.create_namespaced_custom_object(kueue.GROUP, version, ns, plural, body)
    return custom.create_cluster_custom_object(kueue.GROUP, version, plural, body)


def get(api: client.ApiClient, kind: str, name: str, namespace: str | None = None) -> Obj:
    custom = client.CustomObjectsApi(api)
    plural = PLURALS[kind]
    if namespace:
        return custom.get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, namespace, plural, name
        )
    return custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)


def delete_cluster_objects(api: client.ApiClient, *objects: tuple[str, str]) -> None:
    """Delete cluster-scoped kueue objects (kind, name) if they exist."""
    custom = client.CustomObjectsApi(api)
    for kind, name in objects:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(kueue.GROUP, kueue.VERSION, PLURALS[kind], name)


def workload_of(api: client.ApiClient, namespace: str, job: str) -> Obj | None:
    """The Workload Kueue created for Job ``job`` (named after the Job's name and UID)."""
    uid = client.BatchV1Api(api).read_namespaced_job(job, namespace).metadata.uid
    try:
        return get(api, "Workload", workload_name(job, uid, "Job", "batch"), namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def admitted_at(api: client.ApiClient, namespace: str, job: str) -> float | None:
    """When Job ``job``'s Workload was admitted (its Admitted condition), or None."""
    cond = condition(workload_of(api, namespace, job) or {}, "Admitted")
    if not cond or cond.get("status") != "True":
        return None
    return timestamp(cond["lastTransitionTime"])


def _next_admission_second(api: client.ApiClient, namespace: str, job: str) -> None:
    """Wait for ``job`` to be admitted, then for the clock to pass that second: admission
    times have 1 s resolution and preemption picks the newest admitted first, so the
    story stays the same on every run."""
    at = wait_for(lambda: admitted_at(api, namespace, job), 30, f"{job} to be admitted")
    wait_for(lambda: time.time() >= at + 1, 2, "the next second", interval=0.05)


def reason(obj: Mapping[str, Any] | None, ctype: str, status: str = "True") -> str | None:
    """The reason of condition ``ctype`` if it has ``status``, else None."""
    cond = condition(obj or {}, ctype)
    return cond.get("reason") if cond and cond.get("status") == status else None


def suspended(api: client.ApiClient, namespace: str, job: str) -> bool:
    return bool(client.BatchV1Api(api).read_namespaced_job(job, namespace).spec.suspend)


def gpu_usage(cq: Mapping[str, Any], resource: str = GPU) -> int:
    """``resource`` a ClusterQueue's admitted Workloads hold (its status)."""
    return sum(
        int(r["total"])
        for f in (cq.get("status") or {}).get("flavorsUsage") or []
        for r in f["resources"]
        if r["name"] == resource
    )


def kueue_resource(kind: str) -> Resource:
    plural = PLURALS[kind]
    namespaced = next(n for k, _p, n in kueue.KINDS if k == kind)
    return Resource(kueue.GROUP, kueue.VERSION, plural, kind, namespaced)


class Watched:
    """The objects of one list+watch (gpulab.informer), followed in a background thread
    while in a ``with`` block; ``on_event(obj, objects)`` runs after every change with
    the object that changed and all of them (name -> object), so no moment slips between
    two polls. The e2e tests and the benchmarks measure with it."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        namespace: str | None = None,
        on_event: Callable[[Obj, dict[str, Obj]], None] = lambda _o, _all: None,
        field_selector: str | None = None,
    ) -> None:
        self.events = 0
        self._on_event = on_event
        lw = ListWatch(api, resource, namespace, field_selector=field_selector)
        self._informer = Informer(
            lw,
            Handlers(
                on_add=self._seen, on_update=lambda _o, n: self._seen(n), on_delete=self._seen
            ),
        )

    @property
    def objects(self) -> dict[str, Obj]:
        return {o["metadata"]["name"]: o for o in self._informer.store.list()}

    def _seen(self, obj: Obj) -> None:
        self.events += 1
        self._on_event(obj, self.objects)

    def __enter__(self) -> Self:
        self._informer.start()
        wait_for(lambda: self._informer.has_synced(), 30, f"the listing of {self._informer.lw}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._informer.stop()


# -- the demo ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    api, _spec = ensure_cluster(args, addons=("kueue",))
    chapter(
        "Kueue - queues, quota and fair sharing for GPU Jobs",
        "Two teams, each a LocalQueue on a ClusterQueue with 4 nvidia.com/gpu, and a pool\n"
        "ClusterQueue lending 4 more, all in one Cohort; the controller runs with fair\n"
        "sharing on. Kueue keeps queued Jobs suspended until their Workload is admitted.",
    )
    for ns in (TEAM_A, TEAM_B):
        fresh_namespace(api, ns)
    _setup(api)
    batch = client.BatchV1Api(api)
    with LiveTrace(api, TEAM_A, whole=(TEAM_B,)) as live:
        say("team-a submits a-1 .. a-6 (2 GPUs each): its own 4, then the idle quota")
        for i in range(1, 7):
            batch.create_namespaced_job(TEAM_A, queued_job(f"a-{i}", "team-a", 2, 600))
            _next_admission_second(api, TEAM_A, f"a-{i}")
            if i == 1:
                live.expect({"AddOrUpdateWorkload", "admit", "startJob"})
                console.print(CHAPTER_DIFFERS)
        wait_for(lambda: _usage(api, CQ_A) == 12, 90, f"ClusterQueue {CQ_A} to hold 12 GPUs")
        ok(f"{CQ_A} holds 12 GPUs: its 4, and 8 borrowed from the pool and team-b")
        _shares(api, "team-a borrowed everything idle")

        say("team-b submits b-1 (2 GPUs, runs 20 s) and b-2 .. b-4 (2 GPUs each)")
        batch.create_namespaced_job(TEAM_B, queued_job("b-1", "team-b", 2, 20))
        for i in range(2, 5):
            batch.create_namespaced_job(TEAM_B, queued_job(f"b-{i}", "team-b", 2, 600))
        wait_for(
            lambda: _usage(api, CQ_A) == 6 and _usage(api, CQ_B) == 6,
            120,
            "both teams to hold 6 GPUs",
        )
        preempted = [
            n
            for n in (f"a-{i}" for i in range(1, 7))
            if reason(workload_of(api, TEAM_A, n), kueue.PREEMPTED)
        ]
        if len(preempted) != 3:
            raise DemoFailed(f"team-a should have lost 3 Workloads, lost {preempted}")
        ok(
            f"team-b took its quota back, then fair sharing split the pool: "
            f"{', '.join(preempted)} preempted"
        )
        _shares(api, "shares converged")
        a, b = _share(api, CQ_A), _share(api, CQ_B)
        if a != b or a == 0:
            raise DemoFailed(f"the weighted shares should be equal and above 0: {a} vs {b}")
        # b-2 .. b-4 were created in the same second: BestEffortFIFO does not say which
        # of them is left over (one that was parked retries after one still queued)
        waiting, why = wait_for(
            lambda: _waiting(api, TEAM_B, [f"b-{i}" for i in range(2, 5)]),
            30,
            "one of b-2 .. b-4 to say why it waits",
        )
        ok(f"{waiting} waits suspended: QuotaReserved=False, {why}")

        say("b-1 finishes: its quota goes back to the Cohort and the parked Workloads retry")
        done = wait_for(
            lambda: reason(workload_of(api, TEAM_B, "b-1"), kueue.FINISHED), 90, "b-1 to finish"
        )
        wait_for(lambda: not suspended(api, TEAM_B, waiting), 60, f"{waiting} to run")
        ok(f"b-1 Finished ({done}); {waiting} admitted in its place")
        steps = {
            "handleJobWithNoWorkload",
            "admit",
            "startJob",
            "requeueAndUpdate",
            "IssuePreemptions",
            "stopJob",
            "FinishWorkload",
        }
        live.expect(steps)
    diagram = getattr(args, "diagram", None)
    if diagram:
        live.write_diagram(Path(diagram))

    console.rule("[bold]outcome")
    ok("over quota a Job waits suspended; its Workload says why and is parked, not re-sorted")
    ok("idle quota in the Cohort is borrowed; its owner takes it back (IssuePreemptions)")
    ok("with fair sharing both borrowing teams end with the same weighted share")
    ok("a finishing Job (FinishWorkload) requeues the parked Workloads (admit, startJob)")
    say(f"look around: gpulab kubectl get clusterqueues,workloads -A; namespace {TEAM_A}")
    return 0


def _waiting(api: client.ApiClient, namespace: str, jobs: list[str]) -> tuple[str, str] | None:
    """The one Job of ``jobs`` whose Workload has QuotaReserved=False, and the reason."""
    found = [
        (job, why)
        for job in jobs
        if (why := reason(workload_of(api, namespace, job), kueue.QUOTA_RESERVED, "False"))
    ]
    return found[0] if len(found) == 1 else None


def _setup(api: client.ApiClient) -> None:
    """Cluster-scoped objects of the story, made afresh (a rerun deletes the old ones)."""
    delete_cluster_objects(
        api,
        ("ClusterQueue", CQ_A),
        ("ClusterQueue", CQ_B),
        ("ClusterQueue", CQ_POOL),
        ("Cohort", COHORT),
        ("ResourceFlavor", FLAVOR),
    )
    create(api, flavor(FLAVOR))
    create(
        api,
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "Cohort",
            "metadata": {"name": COHORT},
            "spec": {},
        },
    )
    # each team may take its own quota back from anyone borrowing it
    fair = {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
    create(api, cluster_queue(CQ_A, TEAM_A, 4, FLAVOR, cohort=COHORT, preemption=fair))
    create(api, cluster_queue(CQ_B, TEAM_B, 4, FLAVOR, cohort=COHORT, preemption=fair))
    create(api, cluster_queue(CQ_POOL, None, 4, FLAVOR, cohort=COHORT))
    create(api, local_queue("team-a", TEAM_A, CQ_A))
    create(api, local_queue("team-b", TEAM_B, CQ_B))
    for cq in (CQ_A, CQ_B, CQ_POOL):
        wait_for(
            lambda cq=cq: reason(get(api, "ClusterQueue", cq), kueue.CQ_ACTIVE),
            30,
            f"ClusterQueue {cq} to be Active",
        )
    ok(f"Cohort {COHORT}: {CQ_A}, {CQ_B} (4 GPUs each) and {CQ_POOL} (lends 4) are Active")


def _usage(api: client.ApiClient, cq: str) -> int:
    return gpu_usage(get(api, "ClusterQueue", cq))


def _share(api: client.ApiClient, cq: str) -> int:
    status = get(api, "ClusterQueue", cq).get("status") or {}
    return int((status.get("fairSharing") or {}).get("weightedShare", 0))


def _shares(api: client.ApiClient, title: str) -> None:
    table = Table(title=f"fair sharing: {title}")
    for col in ("ClusterQueue", "GPUs admitted", "borrowed", "weightedShare", "pending"):
        table.add_column(col)
    for cq in (CQ_A, CQ_B, CQ_POOL):
        obj = get(api, "ClusterQueue", cq)
        status = obj.get("status") or {}
        borrowed = sum(
            int(r["borrowed"])
            for f in status.get("flavorsUsage") or []
            for r in f["resources"]
            if r["name"] == GPU
        )
        table.add_row(
            cq,
            str(gpu_usage(obj)),
            str(borrowed),
            str(_share(api, cq)),
            str(status.get("pendingWorkloads", 0)),
        )
    console.print(table)

"""lab-queue-quota: four Kueue mistakes, one per team queue (kueue.x-k8s.io/v1beta2).

    job-a  LocalQueue team-a -> ClusterQueue cq-a, whose flavor ``spot-gpu`` does not
           exist: the ClusterQueue is inactive (Active=False, FlavorNotFound)
    job-b  LocalQueue team-b names ClusterQueue cq-b, which does not exist
    job-c2 ClusterQueue cq-c's quota was cut from 4 to 1 GPU while job-c1 (2 GPUs) ran:
           job-c1 keeps its quota (Kueue never evicts for a quota change), job-c2 waits
    job-d  has no kueue.x-k8s.io/queue-name label: Kueue ignores it, it runs outside every
           quota of the namespace

A suspended Job may also be relabelled to another LocalQueue (``kubectl label job ...
kueue.x-k8s.io/queue-name=... --overwrite``): Kueue moves its Workload there
(jobframework ``handleQueueNameChange``), and ``check`` counts the Job as fixed once that
Workload is admitted, whichever queue admitted it.

Everything lives in namespace ``lab-queue-quota``; the GPUs are gpu-q's (ResourceFlavor
``lab-gpu`` selects the node by its lab-pool label).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.kueue import api as kueue
from gpulab.kueue.workload import workload_name
from gpulab.wait import wait_for
from harness.labs import POOL_LABEL, SPEC, Case, CaseState, Namespace, Progress

NAME = "queue-quota"
NS = "lab-queue-quota"
GPU = "nvidia.com/gpu"
FLAVOR, MISSING_FLAVOR = "lab-gpu", "spot-gpu"
CQ_A, CQ_B, CQ_C = "lab-cq-a", "lab-cq-b", "lab-cq-c"
JOBS = {  # job -> (case, LocalQueue or None, GPUs)
    "job-a": ("missing-flavor", "team-a", 1),
    "job-b": ("missing-clusterqueue", "team-b", 1),
    "job-c1": ("", "team-c", 2),
    "job-c2": ("quota-changed", "team-c", 2),
    "job-d": ("unqueued", None, 1),
}
SYMPTOMS = {
    "missing-flavor": "job-a stays suspended",
    "missing-clusterqueue": "job-b stays suspended",
    "quota-changed": "job-c2 stays suspended although team-c's quota 'was just set'",
    "unqueued": "job-d runs at once, whatever the team's quota",
}
RELABEL = (
    f"`kubectl -n {NS} label job {{job}} {kueue.QUEUE_LABEL}=<queue> --overwrite`: the "
    "suspended Job's Workload follows its label to that LocalQueue"
)
FIXES = {
    "missing-flavor": f"create ResourceFlavor {MISSING_FLAVOR} (nodeLabels "
    f"{POOL_LABEL}: {NAME}), or edit {CQ_A} to use the existing flavor {FLAVOR}, or move "
    f"job-a to a LocalQueue whose ClusterQueue works and has room: " + RELABEL.format(job="job-a"),
    "missing-clusterqueue": f"create ClusterQueue {CQ_B} (a LocalQueue's clusterQueue cannot "
    f"change), e.g. flavor {FLAVOR} with nominalQuota 1 nvidia.com/gpu, or move job-b to a "
    "LocalQueue whose ClusterQueue works and has room: " + RELABEL.format(job="job-b"),
    "quota-changed": f"raise {CQ_C}'s nominalQuota back to 4 (`kubectl patch clusterqueue "
    f'{CQ_C} --type json -p \'[{{"op":"replace","path":"/spec/resourceGroups/0/flavors'
    '/0/resources/0/nominalQuota","value":4}]\'`), or let job-c1 finish',
    "unqueued": f"delete job-d and create it again with label {kueue.QUEUE_LABEL}=team-a "
    "(Kueue suspends a Job only at creation; a running Job's queue-name cannot change)",
}


def flavor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {POOL_LABEL: NAME}},
    }


def cluster_queue(name: str, flavor_name: str, quota: int) -> dict[str, Any]:
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": flavor_name, "resources": [{"name": GPU, "nominalQuota": quota}]}
                    ],
                }
            ],
        },
    }


def local_queue(name: str, cq: str) -> dict[str, Any]:
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterQueue": cq},
    }


def job(name: str, queue: str | None, gpus: int) -> dict[str, Any]:
    """A one-pod GPU Job that runs for a day (kwok keeps its pod Running)."""
    labels = {kueue.QUEUE_LABEL: queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                # lab convenience: kwok completes a Job's pod after this delay (default 1 s)
                "metadata": {"annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": "24h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {POOL_LABEL: NAME} if not queue else {},
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"limits": {GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def _create(api: client.ApiClient, body: dict[str, Any]) -> None:
    if body["apiVersion"] == "batch/v1":
        client.BatchV1Api(api).create_namespaced_job(NS, body)
        return
    custom = client.CustomObjectsApi(api)
    plural = body["kind"].lower() + "s"
    ns = body["metadata"].get("namespace")
    if ns:
        custom.create_namespaced_custom_object(kueue.GROUP, kueue.VERSION, ns, plural, body)
    else:
        custom.create_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, body)


def workload_of(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        uid = client.BatchV1Api(api).read_namespaced_job(name, NS).metadata.uid
        return client.CustomObjectsApi(api).get_namespaced_custom_object(
            kueue.GROUP, kueue.VERSION, NS, "workloads", workload_name(name, uid, "Job", "batch")
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def admitted(wl: dict[str, Any] | None) -> bool:
    conditions = (wl or {}).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions)


class QueueQuotaLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = "four teams' Jobs and Kueue: three wait for ever, one ignores the queue"
    hints = (
        f"`gpulab diagnose workload {NS}/<workload>` (`kubectl -n {NS} get workloads`) walks "
        "LocalQueue -> ClusterQueue -> flavors -> the Workload's conditions",
        "`kubectl get clusterqueues -o wide` and `kubectl describe clusterqueue NAME`: the "
        "Active condition says why a ClusterQueue takes nothing",
        "`kubectl -n lab-queue-quota get localqueues`: which ClusterQueue does each name?",
        "a ClusterQueue's status.flavorsUsage against spec nominalQuota: admitted Workloads "
        "keep their quota after a change",
        "`kubectl -n lab-queue-quota get jobs -L kueue.x-k8s.io/queue-name`: a Job without "
        "the label is none of Kueue's business",
    )

    def start(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        self.stop(backend, progress)
        Namespace(NS).create(api, NAME)
        for body in (
            flavor(FLAVOR),
            cluster_queue(CQ_A, MISSING_FLAVOR, 2),
            cluster_queue(CQ_C, FLAVOR, 4),
            local_queue("team-a", CQ_A),
            local_queue("team-b", CQ_B),
            local_queue("team-c", CQ_C),
        ):
            _create(api, body)
        _create(api, job("job-c1", "team-c", 2))
        wait_for(lambda: admitted(workload_of(api, "job-c1")), 60, "job-c1 to be admitted", 0.5)
        custom = client.CustomObjectsApi(api)
        custom.patch_cluster_custom_object(
            kueue.GROUP, kueue.VERSION, "clusterqueues", CQ_C, _quota_patch(1)
        )
        for name, (_case, queue, gpus) in JOBS.items():
            if name != "job-c1":
                _create(api, job(name, queue, gpus))
        wait_for(
            lambda: all(workload_of(api, n) is not None for n in ("job-a", "job-b", "job-c2")),
            60,
            "Kueue to create the Workloads",
            0.5,
        )
        progress(f"lab {NAME}: Jobs job-a, job-b, job-c1, job-c2, job-d in {NS}")

    def cases(self, api: client.ApiClient) -> list[Case]:
        out = []
        for name, (case, _queue, _gpus) in JOBS.items():
            if not case:
                continue
            if case == "unqueued":
                pods = client.CoreV1Api(api).list_namespaced_pod(
                    NS, label_selector=f"job-name={name}"
                )
                ref = f"{NS}/{pods.items[0].metadata.name}" if pods.items else f"{NS}/{name}"
                out.append(Case(case, SYMPTOMS[case], ("pod", ref), "kueue", FIXES[case]))
                continue
            wl = workload_of(api, name)
            ref = f"{NS}/{(wl or {}).get('metadata', {}).get('name', name)}"
            out.append(Case(case, SYMPTOMS[case], ("workload", ref), "kueue", FIXES[case]))
        return out

    def check(self, api: client.ApiClient) -> list[CaseState]:
        out = []
        for name, (case, _queue, _gpus) in JOBS.items():
            if not case:
                continue
            wl = workload_of(api, name)
            if case == "unqueued":
                labelled = _labelled(api, name)
                ok = labelled and admitted(wl)
                detail = (
                    f"{name}: queued and admitted"
                    if ok
                    else f"{name}: {'not admitted yet' if labelled else 'runs without a queue'}"
                )
            else:
                ok = admitted(wl)
                detail = f"{name}: {'admitted' if ok else 'not admitted'}"
            out.append(CaseState(case, ok, detail))
        return out

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        Namespace(NS).delete(api)
        custom = client.CustomObjectsApi(api)
        for plural, name in (
            ("clusterqueues", CQ_A),
            ("clusterqueues", CQ_B),
            ("clusterqueues", CQ_C),
            ("resourceflavors", FLAVOR),
            ("resourceflavors", MISSING_FLAVOR),
        ):
            try:
                custom.delete_cluster_custom_object(kueue.GROUP, kueue.VERSION, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _quota_patch(gpus: int) -> dict[str, Any]:
    return {
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": FLAVOR, "resources": [{"name": GPU, "nominalQuota": gpus}]}
                    ],
                }
            ]
        }
    }


def _labelled(api: client.ApiClient, name: str) -> bool:
    try:
        j = client.BatchV1Api(api).read_namespaced_job(name, NS)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return bool((j.metadata.labels or {}).get(kueue.QUEUE_LABEL))


LAB = QueueQuotaLab()

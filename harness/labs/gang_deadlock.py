"""lab-gang-deadlock: two gangs under Coscheduling that each fit alone and hold half the
GPUs between them, waiting for each other.

Two training jobs, ``train-a`` and ``train-b``, each a PodGroup (scheduling.x-k8s.io/
v1alpha1) of 4 workers x 2 GPUs, on the lab's two 4-GPU T4 nodes: each job fits the 8 GPUs
alone, not both. Each job's ranks 0 and 1 run at a higher priority (PriorityClass
``lab-gang-launcher``, as launchers often do), both jobs were submitted while the
scheduler was down (an upgrade), and Coscheduling's queue sort orders by priority before
the PodGroup: ranks 0-1 of both jobs reserve the 8 GPUs and wait at Permit, ranks 2-3 fit
nowhere. The gpulab-scheduler profile keeps a gang waiting while at most half of it is
missing (``podGroupRejectPercentage: 50``), and the PodGroups ask to wait up to an hour
for their members (``scheduleTimeoutSeconds: 3600``): both gangs hold half of the GPUs for
an hour, nothing is bound.

The fix is the gang's timeout: a short ``scheduleTimeoutSeconds`` (or none: the plugin's
``permitWaitingTimeSeconds``, 10 s) lets a gang that cannot complete give back what it
holds, and the next attempt places one gang whole. A pod already waiting keeps the timer
it started with, so the scheduler is restarted after the change (its pod, not the
workers); deleting the workers is not a fix (a Job would make them again, and the same
order would deadlock again).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.schedulerplugins import apis
from gpulab.wait import wait_for
from harness.backends import SYSTEM_NAMESPACE
from harness.labs import POOL_LABEL, SPEC, Case, CaseState, Namespace, Progress

NAME = "gang-deadlock"
NS = "lab-gang-deadlock"
SCHEDULER = "gpulab-scheduler"
PRIORITY_CLASS = "lab-gang-launcher"
GANGS = ("train-a", "train-b")
WORKERS, GPUS_EACH, HIGH_RANKS = 4, 2, 2
TIMEOUT = 3600  # the PodGroups' scheduleTimeoutSeconds: the mistake
FIX = (
    f"`kubectl -n {NS} patch podgroup train-a --type merge -p "
    '\'{"spec":{"scheduleTimeoutSeconds":10}}\'` (and train-b), then restart the '
    f"scheduler so the waiting pods drop their old timers: `kubectl -n {SYSTEM_NAMESPACE} "
    f"rollout restart deploy/{SCHEDULER}`"
)


def worker(gang: str, rank: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "nodeSelector": {POOL_LABEL: NAME},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(GPUS_EACH)}},
            }
        ],
    }
    if rank < HIGH_RANKS:
        spec["priorityClassName"] = PRIORITY_CLASS
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{gang}-{rank}",
            "namespace": NS,
            "labels": {apis.POD_GROUP_LABEL: gang, "app": gang},
        },
        "spec": spec,
    }


class GangDeadlockLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = "two 4-worker gangs, 8 GPUs, nothing ever runs"
    hints = (
        f"`gpulab diagnose podgroup {NS}/train-a`: the coscheduling link counts members "
        "waiting at Permit and members that fit nowhere, for both gangs",
        f"`kubectl -n {NS} get events --field-selector reason=Permit`: which workers wait "
        "at Permit, holding their GPUs, and for how long?",
        "`kubectl get pods -o custom-columns=NAME:.metadata.name,PRIO:.spec.priority`: "
        "Coscheduling's QueueSort (Less) compares priority before the PodGroup",
        f"`kubectl -n {NS} get podgroups -o yaml`: how long does each gang wait at Permit "
        "for the rest of its members? A waiting pod keeps the timer it started with.",
    )

    def start(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        self.stop(backend, progress)
        Namespace(NS).create(api, NAME)
        client.SchedulingV1Api(api).create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name=PRIORITY_CLASS), value=1000)
        )
        custom = client.CustomObjectsApi(api)
        core = client.CoreV1Api(api)
        for gang in GANGS:
            custom.create_namespaced_custom_object(
                apis.GROUP,
                apis.VERSION,
                NS,
                "podgroups",
                apis.pod_group(gang, NS, WORKERS, schedule_timeout_seconds=TIMEOUT),
            )
        # both jobs are submitted while the scheduler is down (an upgrade, say): when it
        # comes back it sees all 8 workers at once and sorts them by priority
        apps = client.AppsV1Api(api)
        _scale(apps, 0)
        wait_for(lambda: not backend.component_pods(SCHEDULER), 60, f"{SCHEDULER} to stop", 0.5)
        for gang in GANGS:
            for rank in range(WORKERS):
                core.create_namespaced_pod(NS, worker(gang, rank))
        _scale(apps, 1)
        wait_for(lambda: _waiting_gangs(core) == set(GANGS), 90, "both gangs to wait at Permit", 1)
        progress(f"lab {NAME}: PodGroups train-a and train-b, 4 workers each, in {NS}")

    def cases(self, api: client.ApiClient) -> list[Case]:
        return [
            Case(
                "coscheduling",
                "train-a's and train-b's 8 workers stay Pending; no pod is bound to the "
                "lab's 8 GPUs, yet neither job starts",
                ("podgroup", f"{NS}/train-a"),
                "coscheduling",
                FIX,
            )
        ]

    def check(self, api: client.ApiClient) -> list[CaseState]:
        pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
        bound = {
            g: sum(1 for p in pods if p.metadata.labels.get("app") == g and p.spec.node_name)
            for g in GANGS
        }
        whole = [g for g, n in bound.items() if n == WORKERS]
        partial = [g for g, n in bound.items() if 0 < n < WORKERS]
        ok = bool(whole) and not partial
        detail = ", ".join(f"{g}: {n}/{WORKERS} bound" for g, n in bound.items())
        return [CaseState("coscheduling", ok, detail)]

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        Namespace(NS).delete(api)
        try:
            client.SchedulingV1Api(api).delete_priority_class(PRIORITY_CLASS)
        except ApiException as exc:
            if exc.status != 404:
                raise
        apps = client.AppsV1Api(api)
        if apps.read_namespaced_deployment_scale(SCHEDULER, SYSTEM_NAMESPACE).spec.replicas != 1:
            _scale(apps, 1)


def _waiting_gangs(core: client.CoreV1Api) -> set[str]:
    """Gangs with a member that reached Permit and waits there (its Permit Event)."""
    events = core.list_namespaced_event(NS, field_selector="reason=Permit").items
    return {e.involved_object.name.rsplit("-", 1)[0] for e in events if "Wait" in (e.message or "")}


def _scale(apps: client.AppsV1Api, replicas: int) -> None:
    apps.patch_namespaced_deployment_scale(
        SCHEDULER, SYSTEM_NAMESPACE, {"spec": {"replicas": replicas}}
    )


LAB = GangDeadlockLab()

"""lab-gang-deadlock-volcano: the Volcano half of lab-gang-deadlock. Two PyTorch jobs
that each fit the 8 GPUs alone hold half of them between them, and neither trains.

Volcano (v1.15.1, docs/volcano.md) does not deadlock the way Coscheduling does: its
``allocate`` action commits a gang's Statement only when ``JobReady`` (minAvailable tasks
placed) and discards it otherwise, so nothing of an incomplete gang is held between
sessions. What does get stuck is a gang smaller than the job: Volcano's gang is the
PodGroup's ``minMember`` (the vcjob's ``minAvailable``), and it guarantees exactly that.

Two vcjobs, ``train-a`` and ``train-b``, in queue ``lab-gang-deadlock``: each a PyTorch
job (job plugin ``pytorch``: one ``master`` and three ``worker`` tasks, so the plugin gives
every pod ``WORLD_SIZE=4`` and its ``RANK``, 0 to 3, in ``kubectl get pod -o yaml``), 2 GPUs
a pod, on the lab's two 4-GPU T4 nodes -
each job fits the 8 GPUs alone, not both. The team set ``minAvailable: 2`` ("to start
sooner", copied from an elastic example). Both jobs were submitted while the nodes were
cordoned (maintenance); once uncordoned, one session places master + 1 worker of each
job: each PodGroup is Running (condition Scheduled), 8/8 GPUs are held, 4 workers stay
Pending, and each job's 2 ranks wait in ``init_process_group`` for a world of 4 that
never comes. (The pods are pause containers: the ranks do not really wait, but their
env says what they would wait for.)

The fix is the gang: ``minAvailable: 4`` (= WORLD_SIZE) on both jobs. Volcano then sees
the truth - 2 of minMember 4 running, the rest unschedulable: PodGroup phase Unknown,
"2/4 tasks in gang unschedulable" - and upstream's answer to Unknown ("scheduler will
wait for related controller to recover it") is the job's policy: the team's template has
``{event: Unknown, action: RestartJob}``, which with minAvailable 2 never fired. The half
jobs restart; ``enqueue`` lets one gang in (its minResources, 8 GPUs, fill the queue's
capability: the cluster's 8) and the other's PodGroup stays Pending ("queue resource
quota insufficient") until the first is done. Deleting pods is not a fix: the job
controller recreates them (PodEvicted restarts the job) and the gangs are still half a
world each.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.volcano import apis
from gpulab.volcano import objects as vo
from gpulab.volcano.client import VolcanoClient
from gpulab.wait import wait_for
from harness.labs import POOL_LABEL, Case, CaseState, Namespace, Progress

NAME = "gang-deadlock-volcano"
NS = "lab-gang-deadlock-volcano"
SPEC = "labs-volcano"
QUEUE = "lab-gang-deadlock"
GANGS = ("train-a", "train-b")
WORKERS, GPUS_EACH = 3, 2  # + one master: WORLD_SIZE 4
WORLD = WORKERS + 1
MIN_AVAILABLE = 2  # the mistake: half of the world
TRAINING_SECONDS = 86400  # kwok completes a running job pod after this (its annotation)
PYTORCH = ["--master=master", "--worker=worker", "--port=23456"]
POLICIES = (
    {"event": apis.POD_EVICTED_EVENT, "action": apis.RESTART_JOB},
    {"event": apis.JOB_UNKNOWN_EVENT, "action": apis.RESTART_JOB},
)
FIX = (
    f"`kubectl -n {NS} patch vcjob train-a --type merge -p "
    f'\'{{"spec":{{"minAvailable":{WORLD}}}}}\'` (and train-b): the gang becomes the whole '
    "world; the PodGroups go Unknown and the jobs' Unknown policy restarts them, and "
    "enqueue lets one whole gang in at a time"
)


def job(name: str, min_available: int = MIN_AVAILABLE) -> dict[str, Any]:
    """A PyTorch vcjob: master x1 + worker x3, 2 GPUs a pod, on the lab's nodes."""
    tasks = [
        vo.task("master", 1, gpus=GPUS_EACH, seconds=TRAINING_SECONDS),
        vo.task(
            "worker",
            WORKERS,
            gpus=GPUS_EACH,
            seconds=TRAINING_SECONDS,
            min_available=max(0, min_available - 1),
        ),
    ]
    for t in tasks:
        t["template"]["spec"]["nodeSelector"] = {POOL_LABEL: NAME}
        t["template"]["spec"]["terminationGracePeriodSeconds"] = 0
    body = vo.vcjob(
        name, tasks, queue=QUEUE, min_available=min_available, policies=POLICIES, namespace=NS
    )
    body["spec"]["plugins"] = {"pytorch": list(PYTORCH)}
    return body


def lab_nodes(api: client.ApiClient) -> list[str]:
    nodes = client.CoreV1Api(api).list_node(label_selector=f"{POOL_LABEL}={NAME}").items
    return sorted(n.metadata.name for n in nodes)


def _cordon(api: client.ApiClient, on: bool) -> None:
    core = client.CoreV1Api(api)
    for node in lab_nodes(api):
        core.patch_node(node, {"spec": {"unschedulable": on or None}})


def members(pods: list[client.V1Pod], gang: str) -> list[client.V1Pod]:
    """The live pods of vcjob ``gang`` (its PodGroup is named ``<job>-<job uid>``)."""
    return [
        p
        for p in pods
        if (p.metadata.annotations or {}).get(apis.JOB_NAME_KEY) == gang
        and not p.metadata.deletion_timestamp
        and p.status.phase not in ("Succeeded", "Failed")
    ]


def running_count(pods: list[client.V1Pod], gang: str) -> int:
    return sum(1 for p in members(pods, gang) if p.spec.node_name and p.status.phase == "Running")


def _split(api: client.ApiClient) -> bool:
    """Both gangs half placed: PodGroups Running (written the session after the binds),
    2 running and 2 Pending members each, the Pending ones reported on by vc-scheduler
    (PodScheduled=False)."""
    groups = client.CustomObjectsApi(api).list_namespaced_custom_object(
        apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, NS, "podgroups"
    )["items"]
    if len(groups) != len(GANGS) or any(
        (g.get("status") or {}).get("phase") != apis.PG_RUNNING for g in groups
    ):
        return False
    pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
    for gang in GANGS:
        mine = members(pods, gang)
        pending = [p for p in mine if not p.spec.node_name]
        reported = [
            p
            for p in pending
            if any(
                c.type == "PodScheduled" and c.status == "False" for c in p.status.conditions or []
            )
        ]
        if running_count(pods, gang) != MIN_AVAILABLE or len(reported) != WORLD - MIN_AVAILABLE:
            return False
    return True


def podgroup_of(api: client.ApiClient, gang: str) -> str:
    """The name of vcjob ``gang``'s PodGroup (``<job>-<job uid>``, as upstream names it)."""
    vcjob = client.CustomObjectsApi(api).get_namespaced_custom_object(
        apis.BATCH_GROUP, apis.BATCH_VERSION, NS, "jobs", gang
    )
    return apis.pod_group_name(vcjob)


class GangDeadlockVolcanoLab:
    name = NAME
    namespace = NS
    spec = SPEC
    summary = "two PyTorch gangs under Volcano, 8 GPUs held, neither trains"
    hints = (
        f"`gpulab diagnose podgroup {NS}/<train-a's PodGroup> --cluster {SPEC}` (`kubectl "
        f"-n {NS} get podgroups`): Volcano says the gang is Running. How many pods does its "
        "gang (minMember) count, and how many ranks does the job's pytorch plugin put in "
        "its world (WORLD_SIZE)?",
        f"`kubectl -n {NS} get pod train-a-master-0 -o yaml`: the env the pytorch job plugin "
        f"gave the rank (WORLD_SIZE, RANK, MASTER_ADDR). Then `kubectl -n {NS} get vcjob "
        "train-a -o yaml`: spec.minAvailable and each task's replicas. Volcano's allocate "
        "commits a gang as soon as minAvailable tasks fit, and keeps placing the rest only "
        "while GPUs are free",
        f"`kubectl -n {NS} get podgroups` after raising minAvailable: what phase does Volcano "
        "give a gang with running members that cannot complete, and what does the job's "
        "policy list do on that event?",
        "a vcjob's spec is immutable but for minAvailable, task replicas and "
        "priorityClassName (its admission webhook): the fix is one of those",
    )

    def start(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        self.stop(backend, progress)
        Namespace(NS).create(api, NAME)
        vc = VolcanoClient(api)
        vc.create_queue(vo.queue(QUEUE))
        wait_for(
            lambda: ((vc.queue(QUEUE) or {}).get("status") or {}).get("state") == "Open",
            60,
            f"queue {QUEUE} to open",
            0.5,
        )
        # the jobs come in while the nodes are in maintenance (cordoned): when they are
        # back, one session sees every pod of both jobs at once
        _cordon(api, True)
        custom = client.CustomObjectsApi(api)
        try:
            for gang in GANGS:
                custom.create_namespaced_custom_object(
                    apis.BATCH_GROUP, apis.BATCH_VERSION, NS, "jobs", job(gang)
                )
            core = client.CoreV1Api(api)
            wait_for(
                lambda: all(
                    len(members(core.list_namespaced_pod(NS).items, g)) == WORLD for g in GANGS
                ),
                90,
                "both jobs' pods",
                0.5,
            )
        finally:
            _cordon(api, False)
        wait_for(lambda: _split(api), 90, "both gangs to run half of their world", 0.5)
        progress(
            f"lab {NAME}: vcjobs train-a and train-b (PyTorch, world size {WORLD}) in {NS}, "
            f"queue {QUEUE}"
        )

    def cases(self, api: client.ApiClient) -> list[Case]:
        return [
            Case(
                "volcano",
                "train-a and train-b are Running, 2 of 4 pods each; 4 pods Pending; all 8 "
                "GPUs are held and neither job trains",
                ("podgroup", f"{NS}/{podgroup_of(api, 'train-a')}"),
                "volcano",
                FIX,
            )
        ]

    def check(self, api: client.ApiClient) -> list[CaseState]:
        """Fixed: every job's gang is its whole world (minAvailable = WORLD_SIZE), one job
        runs whole, and no job holds GPUs with part of its world."""
        custom = client.CustomObjectsApi(api)
        pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
        gangs, notes = {}, []
        for gang in GANGS:
            try:
                vcjob = custom.get_namespaced_custom_object(
                    apis.BATCH_GROUP, apis.BATCH_VERSION, NS, "jobs", gang
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                notes.append(f"{gang}: no such vcjob")
                continue
            gangs[gang] = int(vcjob["spec"].get("minAvailable") or 0)
        small = [g for g, m in gangs.items() if m < WORLD]
        counts = {g: running_count(pods, g) for g in GANGS}
        whole = [g for g, n in counts.items() if n == WORLD]
        partial = [g for g, n in counts.items() if 0 < n < WORLD]
        ok = len(gangs) == len(GANGS) and not small and bool(whole) and not partial
        detail = ", ".join(
            f"{g}: {counts[g]}/{WORLD} running, minAvailable {gangs.get(g, '-')}" for g in GANGS
        )
        return [CaseState("volcano", ok, "; ".join([detail, *notes]))]

    def stop(self, backend: Any, progress: Progress) -> None:
        api = backend.api()
        _cordon(api, False)
        Namespace(NS).delete(api)
        vc = VolcanoClient(api)
        vc.delete_queue(QUEUE)
        wait_for(lambda: vc.queue(QUEUE) is None, 60, f"queue {QUEUE} to go", 0.5)


LAB = GangDeadlockVolcanoLab()

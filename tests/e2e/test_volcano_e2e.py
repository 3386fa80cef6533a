"""The Volcano chapter on its own local-backend cluster (harness/clusters/volcano-e2e.yaml:
four 8-GPU nodes), its three components running as pods (addon volcano).

Outcomes, measured continuously from watch events: no gang ever runs partially; queue
shares converge to the weights; reclaim evicts only from the over-share queue; upstream's
Deployment example scheduled through a PodGroup the PodGroup controller made; a PodPending
timeout that restarts no job whose pods started; bad input (admission messages for
vcjobs, queues and PodGroups, a Closed queue, a bad scheduler ConfigMap) and a scheduler
restart.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab import informer
from gpulab.volcano import apis
from gpulab.volcano import objects as vo
from gpulab.volcano.client import VolcanoClient, gpus
from gpulab.wait import wait_for

Obj = dict[str, Any]
GANG_BIND_WINDOW = 3.0  # seconds: one session binds a gang; its Bindings land within this
CONFIG_MAP = "volcano-scheduler-configmap"
SYSTEM = "volcano-system"


@pytest.fixture(scope="module")
def vcluster() -> Iterator[Cluster]:
    with running_cluster("volcano-e2e") as c:
        yield c


@pytest.fixture
def ns(vcluster: Cluster) -> Iterator[str]:
    """A fresh namespace; its vcjobs are deleted before its pods (else the job controller
    would create them again)."""
    with fresh_namespace(vcluster.api, "vc") as name:
        yield name
        client.CustomObjectsApi(vcluster.api).delete_collection_namespaced_custom_object(
            apis.BATCH_GROUP, apis.BATCH_VERSION, name, "jobs"
        )


@pytest.fixture
def vc(vcluster: Cluster) -> VolcanoClient:
    return VolcanoClient(vcluster.api)


@pytest.fixture
def queues(vc: VolcanoClient) -> Iterator[list[str]]:
    """Queues a test creates; deleted afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        vc.delete_queue(name)


def make_queue(vc: VolcanoClient, made: list[str], name: str, weight: int, **kw: Any) -> str:
    vc.delete_queue(name)
    wait_for(lambda: vc.queue(name) is None, 30, f"queue {name} to go")
    vc.create_queue(vo.queue(name, weight, **kw))
    made.append(name)
    wait_for(lambda: (vc.queue(name) or {}).get("status", {}).get("state") == "Open", 30, name)
    return name


@dataclass
class Binds:
    """Every pod's Binding seen from the pod watch: the time ``spec.nodeName`` appeared,
    each node a pod was ever bound to, and partial gangs with how long they lasted."""

    api: client.ApiClient
    namespace: str
    min_available: dict[str, int] = field(default_factory=dict)  # job -> gang size
    bound_at: dict[str, float] = field(default_factory=dict)  # pod uid -> time
    nodes: dict[str, set[str]] = field(default_factory=dict)  # pod name -> nodes
    ever: dict[str, set[str]] = field(default_factory=dict)  # job -> pods ever bound (uids)
    live: dict[str, set[str]] = field(default_factory=dict)  # job -> bound, running pod names
    partial_since: dict[str, float] = field(default_factory=dict)
    worst_partial: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _informer: informer.Informer | None = None

    def __enter__(self) -> Binds:
        lw = informer.ListWatch(self.api, informer.PODS, namespace=self.namespace)
        handlers = informer.Handlers(self._seen, lambda _o, n: self._seen(n), self._gone)
        self._informer = informer.Informer(lw, handlers).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._informer is not None
        self._informer.stop()

    def _seen(self, pod: Obj) -> None:
        meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
        job = (meta.get("labels") or {}).get(apis.JOB_NAME_KEY, "")
        live = (
            node
            and not meta.get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
        with self._lock:
            if node:
                self.bound_at.setdefault(meta["uid"], time.monotonic())
                self.nodes.setdefault(meta["name"], set()).add(node)
                self.ever.setdefault(job, set()).add(meta["uid"])
            members = self.live.setdefault(job, set())
            if live:
                members.add(meta["name"])
            else:
                members.discard(meta["name"])
            self._check(job)

    def _gone(self, pod: Obj) -> None:
        job = (pod["metadata"].get("labels") or {}).get(apis.JOB_NAME_KEY, "")
        with self._lock:
            self.live.setdefault(job, set()).discard(pod["metadata"]["name"])

    def _check(self, job: str) -> None:
        """A gang some but not all of whose pods were ever bound is partial."""
        want = self.min_available.get(job)
        if not want:
            return
        now = time.monotonic()
        if 0 < len(self.ever.get(job, ())) < want:
            self.partial_since.setdefault(job, now)
        elif job in self.partial_since:
            self.worst_partial = max(self.worst_partial, now - self.partial_since.pop(job))

    def still_partial(self) -> float:
        """How long the longest partial gang now lasts (0 if none)."""
        now = time.monotonic()
        with self._lock:
            return max((now - t for t in self.partial_since.values()), default=0.0)


def gang_job(name: str, queue: str, tasks: int, gpus_each: int, seconds: int) -> Obj:
    return vo.vcjob(name, [vo.task("w", tasks, gpus=gpus_each, seconds=seconds)], queue=queue)


def elastic_job(name: str, queue: str, replicas: int, seconds: int = 3600, **kw: Any) -> Obj:
    return vo.vcjob(
        name, [vo.task("w", replicas, gpus=1, seconds=seconds)], queue=queue, min_available=1, **kw
    )


# -- gangs ---------------------------------------------------------------------------------


def test_no_gang_ever_runs_partially(vcluster: Cluster, ns: str, vc: VolcanoClient, queues) -> None:
    """Six gangs of 4 x 4 GPUs (96 GPUs asked, 32 exist) in one queue: they take turns,
    each binding whole; a partially bound gang never lasts longer than one bind burst."""
    q = make_queue(vc, queues, f"{ns}-q", 1)
    names = [f"g{i}" for i in range(6)]
    with Binds(vcluster.api, ns, dict.fromkeys(names, 4)) as binds:
        for name in names:
            vc.create_job(ns, gang_job(name, q, 4, 4, seconds=4))

        def done() -> bool:
            assert binds.still_partial() < GANG_BIND_WINDOW, "a gang stayed partially bound"
            return all(vc.job_phase(ns, n) == apis.JOB_COMPLETED for n in names)

        wait_for(done, 180, "all six gangs to complete")
    assert binds.worst_partial < GANG_BIND_WINDOW
    # the positive control: all 24 pods ran, each bound exactly once
    assert len(binds.bound_at) == 24
    assert all(len(n) == 1 for n in binds.nodes.values())
    # each gang's Bindings came from one session: one Allocate decision of 4 tasks
    events = client.CoreV1Api(vcluster.api).list_namespaced_event(ns).items
    allocates = [
        e for e in events if e.reason == "Allocate" and e.involved_object.kind == "PodGroup"
    ]
    assert len(allocates) == 6
    assert all((e.message or "").startswith("4 task(s) -> ") for e in allocates)


def test_a_gang_that_cannot_fit_stays_pending_with_the_gang_message(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    q = make_queue(vc, queues, f"{ns}-q", 1)
    # 30 GPUs of 32: the queue lets it in, but a node holds one 6-GPU task: 4 of 5 fit
    vc.create_job(ns, gang_job("huge", q, 5, 6, seconds=60))
    vc.create_job(ns, gang_job("small", q, 2, 1, seconds=60))  # the positive control

    def message() -> str | None:
        pg = vc.pod_group(ns, "huge") or {}
        for c in pg.get("status", {}).get("conditions") or []:
            if c["type"] == "Unschedulable" and "tasks in gang unschedulable" in c["message"]:
                return c["message"]
        return None

    text = wait_for(message, 60, "the gang's Unschedulable condition")
    assert text.startswith("1/5 tasks in gang unschedulable: pod group is not ready")
    assert "Insufficient nvidia.com/gpu" in text
    wait_for(lambda: vc.bound(ns, "small") == 2, 60, "the small job to run")
    assert vc.bound(ns, "huge") == 0 and vc.job_phase(ns, "huge") == apis.JOB_PENDING


# -- queues --------------------------------------------------------------------------------


def test_queue_shares_converge_to_the_weights(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    """Two queues, weights 1:3, each asking for all 32 GPUs: 8 and 24.

    Both demands must be in one session: proportion's deserved share counts pending pods,
    and the job controller creates a job's pods only once enqueue admitted its PodGroup.
    A job seen alone takes every GPU, and reclaim does not take them back for the other
    (a job with minAvailable pods running is not starving), as upstream. So the nodes are
    cordoned until both jobs' 64 pods exist."""
    core = client.CoreV1Api(vcluster.api)
    nodes = [n.metadata.name for n in core.list_node().items]
    qa = make_queue(vc, queues, f"{ns}-a", 1)
    qb = make_queue(vc, queues, f"{ns}-b", 3)
    try:
        for node in nodes:
            core.patch_node(node, {"spec": {"unschedulable": True}})
        vc.create_job(ns, elastic_job("a", qa, 32))
        vc.create_job(ns, elastic_job("b", qb, 32))
        wait_for(lambda: len(vc.pods(ns, "a")) + len(vc.pods(ns, "b")) == 64, 60, "64 pods")
    finally:
        for node in nodes:
            core.patch_node(node, {"spec": {"unschedulable": False}})
    seen: list[tuple[float, tuple[int, int]]] = []

    def settled() -> tuple[int, int] | None:
        """The split once all 32 GPUs are bound and it held for 4 s."""
        now, split = time.monotonic(), (vc.bound(ns, "a"), vc.bound(ns, "b"))
        if not seen or seen[-1][1] != split:
            seen.append((now, split))
        since, last = seen[-1]
        return last if sum(last) == 32 and now - since >= 4 else None

    a, b = wait_for(settled, 120, "the cluster's 32 GPUs to be allocated and stay so")
    # proportion's deserved: 32 x 1/4 and 32 x 3/4; allocate stops a queue at its share
    assert (a, b) == (8, 24), [split for _t, split in seen]

    def status_agrees() -> bool:  # status.allocated is written at the end of a session
        return gpus(vc.queue(qa)["status"].get("allocated")) == a and (
            gpus(vc.queue(qb)["status"].get("allocated")) == b
        )

    wait_for(status_agrees, 10, "the queues' status.allocated to agree with the pods")


def test_reclaim_evicts_only_from_the_over_share_queue(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    """qa (weight 1) fills 24 GPUs, qc (weight 2) 8; qb (weight 3) brings a 4 x 4 gang.
    Deserved: qa 8, qb 16, qc 8 - only qa is over its share and gives back."""
    qa = make_queue(vc, queues, f"{ns}-a", 1)
    qb = make_queue(vc, queues, f"{ns}-b", 3)
    qc = make_queue(vc, queues, f"{ns}-c", 2)
    lost: list[str] = []
    with Binds(vcluster.api, ns) as binds:
        vc.create_job(ns, elastic_job("a", qa, 24))
        wait_for(lambda: vc.bound(ns, "a") == 24, 60, "qa's 24 pods to run")
        vc.create_job(ns, elastic_job("c", qc, 8))
        wait_for(lambda: vc.bound(ns, "c") == 8, 60, "qc's 8 pods to run")
        c_pods = {p.metadata.name for p in vc.pods(ns, "c")}
        vc.create_job(ns, gang_job("b", qb, 4, 4, seconds=3600))
        wait_for(lambda: vc.bound(ns, "b") == 4, 90, "qb's gang to be bound by reclaim")
        lost = sorted(c_pods - binds.live.get("c", set()))
    events = client.CoreV1Api(vcluster.api).list_namespaced_event(ns).items
    evicted = [
        e.involved_object.name
        for e in events
        if e.reason == "Evict" and e.involved_object.kind == "Pod"
    ]
    assert evicted and all(name.startswith("a-") for name in evicted), evicted
    assert not lost, f"qc lost {lost}"
    assert all(p.status.phase == "Running" for p in vc.pods(ns, "c"))
    wait_for(lambda: gpus(vc.queue(qa)["status"].get("allocated")) == 8, 30, "qa back to its share")


# -- bad input ----------------------------------------------------------------------------


def denied(vc: VolcanoClient, ns: str, job: Obj) -> str:
    with pytest.raises(ApiException) as exc:
        vc.create_job(ns, job)
    assert exc.value.status == 400
    return str(exc.value.body)


def test_invalid_vcjobs_are_denied_with_upstreams_messages(ns: str, vc: VolcanoClient) -> None:
    too_many = vo.vcjob("j", [vo.task("w", 2)], min_available=3)
    assert (
        'admission webhook \\"validatejob.volcano.sh\\" denied the request: '
        "job 'minAvailable' should not be greater than total replicas in tasks;"
    ) in denied(vc, ns, too_many)
    twice = vo.vcjob("j", [vo.task("w", 1), vo.task("w", 1)])
    assert "duplicated task name w;" in denied(vc, ns, twice)
    lost = vo.vcjob("j", [vo.task("w", 1)], queue="no-such-queue")
    assert (
        'unable to find job queue: queue.scheduling.volcano.sh \\"no-such-queue\\" not found;'
        in (denied(vc, ns, lost))
    )
    ok = vo.vcjob("j", [vo.task("w", 1)])  # defaults: queue default, minAvailable 1
    created = vc.create_job(ns, ok)
    assert created["spec"]["queue"] == "default" and created["spec"]["minAvailable"] == 1


def test_a_closed_queue_rejects_new_jobs(ns: str, vc: VolcanoClient, queues) -> None:
    q = make_queue(vc, queues, f"{ns}-q", 1)
    vc.operate_queue(q, apis.CLOSE_QUEUE)  # what `vcctl queue operate -a close` creates
    wait_for(lambda: vc.queue(q)["status"].get("state") == "Closed", 30, f"queue {q} to close")
    message = denied(vc, ns, vo.vcjob("j", [vo.task("w", 1)], queue=q))
    assert (
        f"can only submit job to queue with state `Open`, queue `{q}` status is `Closed`;"
        in message
    )
    vc.operate_queue(q, apis.OPEN_QUEUE)
    wait_for(lambda: vc.queue(q)["status"].get("state") == "Open", 30, f"queue {q} to open")
    vc.create_job(ns, vo.vcjob("j", [vo.task("w", 1)], queue=q))


def test_queues_and_pod_groups_are_admitted_as_upstream(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    """/queues/validate checks a queue's resources on CREATE; /podgroups/validate keeps
    PodGroups out of a queue that is not Open."""
    bad = vo.queue(f"{ns}-bad", capability={"nvidia.com/gpu": 4})
    bad["spec"]["deserved"] = {"nvidia.com/gpu": "8"}
    with pytest.raises(ApiException) as exc:
        vc.create_queue(bad)
    assert json.loads(exc.value.body)["message"] == (
        'admission webhook "validatequeue.volcano.sh" denied the request: '
        'requestBody.spec.deserved.nvidia.com/gpu: Invalid value: "8": '
        "deserved[nvidia.com/gpu]=8 must be <= capability[nvidia.com/gpu]=4"
    )
    q = make_queue(vc, queues, f"{ns}-q", 1)
    vc.operate_queue(q, apis.CLOSE_QUEUE)
    wait_for(lambda: vc.queue(q)["status"].get("state") == "Closed", 30, f"queue {q} to close")
    custom = client.CustomObjectsApi(vcluster.api)
    pg = vo.podgroup("pg", ns, queue=q)
    del pg["metadata"]["uid"]
    with pytest.raises(ApiException) as exc:
        custom.create_namespaced_custom_object(
            apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, ns, "podgroups", pg
        )
    assert json.loads(exc.value.body)["message"] == (
        'admission webhook "validatepodgroup.volcano.sh" denied the request: '
        f"can only submit PodGroup to queue with state `Open`, queue `{q}` status is `Closed`."
    )


def test_upstreams_deployment_example_is_scheduled(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    """example/deployment: a Deployment with schedulerName volcano in queue `test`. The
    PodGroup controller gives its pod podgroup-<ReplicaSet uid>; vc-scheduler binds it."""
    samples = Path(__file__).resolve().parents[2] / "manifests" / "volcano" / "samples"
    queue = yaml.safe_load((samples / "queue.yaml").read_text())
    deployment = yaml.safe_load((samples / "deployment.yaml").read_text())
    vc.delete_queue(queue["metadata"]["name"])
    wait_for(lambda: vc.queue("test") is None, 30, "queue test to go")
    vc.create_queue(queue)
    queues.append("test")
    wait_for(lambda: (vc.queue("test") or {}).get("status", {}).get("state") == "Open", 30, "test")
    apps = client.AppsV1Api(vcluster.api)
    apps.create_namespaced_deployment(ns, deployment)
    core = client.CoreV1Api(vcluster.api)
    custom = client.CustomObjectsApi(vcluster.api)

    def running() -> client.V1Pod | None:
        pods = core.list_namespaced_pod(ns, label_selector="app=nginx").items
        ok = [p for p in pods if p.spec.node_name and p.status.phase == "Running"]
        return ok[0] if ok else None

    def group_phase(name: str) -> str:
        pg = custom.get_namespaced_custom_object(
            apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, ns, "podgroups", name
        )
        assert pg["spec"]["queue"] == "test" and pg["spec"]["minMember"] == 1
        return str(pg["status"]["phase"])

    try:
        pod = wait_for(running, 60, "the Deployment's pod to be scheduled by volcano and run")
        (owner,) = pod.metadata.owner_references
        group = f"podgroup-{owner.uid}"
        assert pod.metadata.annotations[apis.KUBE_GROUP_NAME_ANNOTATION] == group
        assert pod.spec.scheduler_name == "volcano"
        # the scheduler writes Running at the close of the session after the bind
        wait_for(lambda: group_phase(group) == apis.PG_RUNNING, 30, "the PodGroup Running")
    finally:
        name = deployment["metadata"]["name"]
        apps.delete_namespaced_deployment(name, ns, propagation_policy="Foreground")
        wait_for(lambda: not apps.list_namespaced_deployment(ns).items, 60, "the Deployment to go")


def test_a_pending_timeout_restarts_no_job_whose_pods_started(
    vcluster: Cluster, ns: str, vc: VolcanoClient
) -> None:
    """{event: PodPending, action: RestartJob, timeout: 4s}: the pods start within the
    timeout, so the delayed restart is cancelled (CleanPodDelayActionsIfNeed)."""
    policy = {"event": "PodPending", "action": "RestartJob", "timeout": "4s"}
    vc.create_job(
        ns, vo.vcjob("patient", [vo.task("w", 2, gpus=1, seconds=3600)], policies=[policy])
    )
    wait_for(
        lambda: sum(p.status.phase == "Running" for p in vc.pods(ns, "patient")) == 2,
        60,
        "both pods to run",
    )
    events = client.CoreV1Api(vcluster.api).list_namespaced_event(ns).items
    assert any(
        e.reason == "ExecuteAction" and "Execute action RestartJob after 4s" in (e.message or "")
        for e in events
    ), "the delayed action was never set"
    time.sleep(6)  # past the timeout
    job = vc.job(ns, "patient") or {}
    assert job["status"].get("retryCount", 0) == 0, job["status"]
    assert job["status"]["state"]["phase"] == apis.JOB_RUNNING


def scheduler_pod(api: client.ApiClient) -> client.V1Pod:
    pods = client.CoreV1Api(api).list_namespaced_pod(SYSTEM, label_selector="app=volcano-scheduler")
    return next(p for p in pods.items if not p.metadata.deletion_timestamp)


def test_a_bad_configmap_is_reported_and_the_last_good_one_kept(
    vcluster: Cluster, ns: str, vc: VolcanoClient
) -> None:
    core = client.CoreV1Api(vcluster.api)
    cm = core.read_namespaced_config_map(CONFIG_MAP, SYSTEM)
    good = cm.data["volcano-scheduler.conf"]
    pod = scheduler_pod(vcluster.api).metadata.name
    bad = good.replace("backfill, reclaim", "backfill, reclame")
    core.patch_namespaced_config_map(CONFIG_MAP, SYSTEM, {"data": {"volcano-scheduler.conf": bad}})
    try:

        def warned() -> str | None:
            for e in core.list_namespaced_event(SYSTEM).items:
                if e.reason == "LoadSchedulerConf" and e.involved_object.name == pod:
                    return e.message
            return None

        # the kubelet (here the pod runner) refreshes configMap volumes within 30 s
        message = wait_for(warned, 90, "the scheduler to report the bad configuration")
        assert "failed to find Action 'reclame'" in message
        assert "keeping the previous configuration" in message
        # the positive control: it still schedules, with the configuration it had
        vc.create_job(ns, vo.vcjob("still", [vo.task("w", 1, gpus=1, seconds=60)]))
        wait_for(lambda: vc.bound(ns, "still") == 1, 30, "a job to be scheduled")
    finally:
        core.patch_namespaced_config_map(
            CONFIG_MAP, SYSTEM, {"data": {"volcano-scheduler.conf": good}}
        )


def test_a_scheduler_restart_binds_nothing_twice(
    vcluster: Cluster, ns: str, vc: VolcanoClient, queues
) -> None:
    """Kill vc-scheduler's process while 40 single-pod jobs and 4 gangs are scheduled; the
    pod runner restarts it (restartPolicy Always). Every pod is bound once, to one node."""
    q = make_queue(vc, queues, f"{ns}-q", 1)
    with Binds(vcluster.api, ns, {f"g{i}": 4 for i in range(4)}) as binds:
        for i in range(40):
            vc.create_job(
                ns, vo.vcjob(f"s{i}", [vo.task("w", 1, gpus=0, cpu="100m", seconds=3600)], queue=q)
            )
        for i in range(4):
            vc.create_job(ns, gang_job(f"g{i}", q, 4, 1, seconds=3600))
        wait_for(lambda: len(binds.bound_at) >= 10, 60, "some pods to be bound")
        pod = scheduler_pod(vcluster.api)
        restarts = pod.status.container_statuses[0].restart_count
        pid = int(pod.status.container_statuses[0].container_id.removeprefix("gpulab://"))
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: (
                scheduler_pod(vcluster.api).status.container_statuses[0].restart_count > restarts
            ),
            60,
            "the scheduler to be restarted",
        )
        wait_for(lambda: len(binds.bound_at) == 56, 120, "all 56 pods to be bound")
        assert binds.still_partial() < GANG_BIND_WINDOW
    assert all(len(nodes) == 1 for nodes in binds.nodes.values())
    core = client.CoreV1Api(vcluster.api)
    for p in core.list_namespaced_pod(ns).items:
        for c in p.status.conditions or []:
            assert c.reason != "SchedulerError", f"{p.metadata.name}: {c.message}"
    scheduled: dict[str, int] = {}
    for e in core.list_namespaced_event(ns).items:
        if e.reason == "Scheduled" and e.involved_object.kind == "Pod":
            times = e.series.count if e.series else (e.count or 1)
            scheduled[e.involved_object.name] = scheduled.get(e.involved_object.name, 0) + times
    assert scheduled and max(scheduled.values()) == 1

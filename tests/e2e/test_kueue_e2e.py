"""Kueue counterpart end to end: the session cluster (spec e2e, addon ``kueue``) with real
kube-apiserver (the release's CRDs with their CEL rules, the conversion and admission
webhooks through the local transform), controller-manager (Job pods), kube-scheduler and
kwok (Job pods complete after their ``pod-complete.stage.kwok.x-k8s.io/delay``); and a
HAMi cluster (spec kueue-hami-e2e) for vGPU Deployments queued by Kueue.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Cluster, fresh_namespace, running_cluster
from golden import assert_shape
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import hami as hami_demo
from demos import kueue as demo
from demos.cluster import gpu_pod_spec
from gpulab.hami.score import BINPACK
from gpulab.informer import PODS, Resource
from gpulab.kueue import api as kueue
from gpulab.kueue.model import condition
from gpulab.kueue.workload import is_finished
from gpulab.wait import wait_for
from harness import binaries
from harness.addons import kueue as addon
from harness.apply import MANIFESTS, apply, load_documents
from harness.errors import HarnessError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
SAMPLES = MANIFESTS / "kueue" / "samples"
WORKLOADS = demo.kueue_resource("Workload")
CLUSTER_QUEUES = demo.kueue_resource("ClusterQueue")
Obj = dict[str, Any]


def setup_queue(api: client.ApiClient, ns: str, gpus: int | str) -> str:
    """A flavor, a ClusterQueue with ``gpus`` for ``ns`` only, and LocalQueue user-queue."""
    cq = f"{ns}-cq"
    demo.create(api, demo.flavor(f"{ns}-gpu"))
    demo.create(api, demo.cluster_queue(cq, ns, gpus, f"{ns}-gpu"))
    demo.create(api, demo.local_queue("user-queue", ns, cq))
    return cq


def submit(api: client.ApiClient, ns: str, names: list[str], seconds: int) -> None:
    """Create one-GPU Jobs for user-queue, all at once (5 requests in flight)."""
    batch = client.BatchV1Api(api)
    with ThreadPoolExecutor(5) as pool:
        list(
            pool.map(
                lambda n: batch.create_namespaced_job(
                    ns, demo.queued_job(n, "user-queue", 1, seconds)
                ),
                names,
            )
        )


def reserved_gpus(workloads: dict[str, Obj]) -> int:
    """GPUs held by Workloads with a quota reservation that have not finished."""
    return sum(
        int(psa["resourceUsage"].get(demo.GPU, 0))
        for wl in workloads.values()
        if demo.reason(wl, kueue.QUOTA_RESERVED) and not is_finished(wl)
        for psa in wl["status"]["admission"]["podSetAssignments"]
    )


def active_pods(pods: dict[str, Obj]) -> int:
    return sum(
        1
        for p in pods.values()
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
        and not (p.get("spec") or {}).get("schedulingGates")
    )


class Peak(demo.Watched):
    """The highest ``measure`` of a watched set of objects, taken after every event."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        namespace: str | None,
        measure: Callable[[dict[str, Obj]], int],
        field_selector: str | None = None,
    ) -> None:
        self.peak = 0
        self._measure = measure
        super().__init__(api, resource, namespace, self._seen_all, field_selector)

    def _seen_all(self, _obj: Obj, objects: dict[str, Obj]) -> None:
        self.peak = max(self.peak, self._measure(objects))


def workloads(api: client.ApiClient, ns: str) -> list[Obj]:
    custom = client.CustomObjectsApi(api)
    return custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, ns, "workloads")[
        "items"
    ]


def all_finished(api: client.ApiClient, ns: str, count: int) -> list[Obj] | None:
    items = workloads(api, ns)
    return items if len(items) == count and all(is_finished(w) for w in items) else None


def admits(core: client.CoreV1Api, ns: str) -> Counter[str]:
    """``admit`` steps (quota reserved) in the trace, per Workload."""
    return Counter(
        e.involved_object.name
        for e in core.list_namespaced_event(ns).items
        if e.reason == "admit" and e.type == "Normal"
    )


def test_quota_is_never_exceeded_by_100_jobs_submitted_at_once(cluster, namespace) -> None:
    quota = 16  # of the e2e cluster's 20 nvidia.com/gpu: the quota, not the nodes, binds
    cq = setup_queue(cluster.api, namespace, quota)
    names = [f"job-{i:03d}" for i in range(100)]
    with (
        Peak(cluster.api, WORKLOADS, namespace, reserved_gpus) as reserved,
        Peak(cluster.api, PODS, namespace, active_pods) as pods,
        Peak(
            cluster.api,
            CLUSTER_QUEUES,
            None,
            lambda cqs: sum(demo.gpu_usage(c) for c in cqs.values()),
            field_selector=f"metadata.name={cq}",
        ) as usage,
    ):
        submit(cluster.api, namespace, names, seconds=1)
        done = wait_for(lambda: all_finished(cluster.api, namespace, 100), 180, "100 Workloads")
    # watched continuously: never more than the quota reserved, running, or reported
    assert reserved.peak == quota and usage.peak == quota
    assert 0 < pods.peak <= quota  # pods of finished Jobs complete while others start
    assert reserved.events > 300  # each Workload is created, admitted and finished
    assert {demo.reason(w, kueue.FINISHED) for w in done} == {kueue.FINISHED_SUCCEEDED}
    owners = Counter(w["metadata"]["ownerReferences"][0]["name"] for w in done)
    assert sorted(owners) == names and set(owners.values()) == {1}
    counts = admits(client.CoreV1Api(cluster.api), namespace)
    assert set(counts.values()) == {1} and len(counts) == 100  # never admitted twice
    jobs = client.BatchV1Api(cluster.api).list_namespaced_job(namespace).items
    assert all(j.status.succeeded == 1 and not j.spec.suspend for j in jobs)


def test_controller_restart_neither_double_admits_nor_loses_a_workload(cluster, namespace) -> None:
    """The controller's pod is deleted mid-run (4 Jobs running, 4 waiting); the
    Deployment's new pod rebuilds its state from the API server and finishes the rest."""
    quota = 4
    setup_queue(cluster.api, namespace, quota)
    core = client.CoreV1Api(cluster.api)
    names = [f"r-{i}" for i in range(8)]
    with (
        Peak(cluster.api, WORKLOADS, namespace, reserved_gpus) as reserved,
        Peak(cluster.api, PODS, namespace, active_pods) as pods,
    ):
        submit(cluster.api, namespace, names, seconds=3)
        wait_for(
            lambda: (
                len(workloads(cluster.api, namespace)) == len(names)
                and len(admits(core, namespace)) == quota
            ),
            60,
            f"{len(names)} Workloads, {quota} admitted",
        )
        # pods are created through the controller's webhooks: let those of the admitted
        # Jobs exist before it goes
        wait_for(lambda: len(core.list_namespaced_pod(namespace).items) == quota, 60, "their pods")
        [before] = cluster.backend.component_pods(addon.COMPONENT, namespace=addon.NAMESPACE)
        after = cluster.backend.restart(addon.COMPONENT, namespace=addon.NAMESPACE)
        assert after.metadata.uid != before.metadata.uid
        done = wait_for(lambda: all_finished(cluster.api, namespace, 8), 90, "8 Workloads")
    assert reserved.peak == quota and 0 < pods.peak <= quota
    assert sorted(w["metadata"]["ownerReferences"][0]["name"] for w in done) == names
    # every Workload was admitted exactly once, by one controller or the other
    counts = admits(core, namespace)
    assert sorted(counts) == sorted(w["metadata"]["name"] for w in done)
    assert set(counts.values()) == {1}


def _reserved(wl: Obj) -> bool:
    return demo.reason(wl, kueue.QUOTA_RESERVED) is not None


def test_v1beta1_objects_are_converted_by_the_webhook(cluster, namespace) -> None:
    name = f"{namespace}-v1beta1"
    body = demo.cluster_queue(name, namespace, 9, "default-flavor")
    body["apiVersion"] = f"{kueue.GROUP}/{kueue.OLD_VERSION}"
    body["spec"]["cohort"] = "legacy"
    demo.create(cluster.api, body)
    stored = demo.get(cluster.api, "ClusterQueue", name)
    assert stored["spec"]["cohortName"] == "legacy" and "cohort" not in stored["spec"]
    old = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(
        kueue.GROUP, kueue.OLD_VERSION, "clusterqueues", name
    )
    assert old["spec"]["cohort"] == "legacy" and "cohortName" not in old["spec"]
    demo.delete_cluster_objects(cluster.api, ("ClusterQueue", name))


@pytest.fixture
def samples_cleanup(cluster) -> Iterator[None]:
    """Kueue's published samples use cluster-wide names and namespace default."""
    yield
    batch = client.BatchV1Api(cluster.api)
    for job in batch.list_namespaced_job("default").items:
        if job.metadata.name.startswith("sample-job-"):
            batch.delete_namespaced_job(
                job.metadata.name, "default", propagation_policy="Background"
            )
    custom = client.CustomObjectsApi(cluster.api)
    for lq in ("user-queue",):
        try:
            custom.delete_namespaced_custom_object(
                kueue.GROUP, kueue.VERSION, "default", "localqueues", lq
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
    demo.delete_cluster_objects(
        cluster.api, ("ClusterQueue", "cluster-queue"), ("ResourceFlavor", "default-flavor")
    )


@pytest.mark.parametrize(
    "setup", ["single-clusterqueue-setup.yaml", "single-clusterqueue-setup-v1beta1.yaml"]
)
def test_kueues_own_samples_apply_unchanged_and_their_job_is_admitted(
    cluster, samples_cleanup, setup: str
) -> None:
    apply(cluster.api, [SAMPLES / setup], lambda _m: None)
    wait_for(
        lambda: demo.reason(demo.get(cluster.api, "ClusterQueue", "cluster-queue"), "Active"),
        30,
        "cluster-queue to be Active",
    )
    [job] = load_documents([SAMPLES / "sample-job.yaml"])
    created = client.BatchV1Api(cluster.api).create_namespaced_job("default", job)
    name = created.metadata.name
    assert created.spec.suspend is True  # the Job webhook suspended it
    wl = wait_for(
        lambda: (
            (w := demo.workload_of(cluster.api, "default", name))
            and demo.reason(w, kueue.ADMITTED)
            and w
        ),
        60,
        "the sample Job's Workload to be admitted",
    )
    [psa] = wl["status"]["admission"]["podSetAssignments"]
    assert psa["flavors"] == {"cpu": "default-flavor", "memory": "default-flavor"}
    assert psa["resourceUsage"] == {"cpu": "3", "memory": "600Mi"}
    wait_for(lambda: not demo.suspended(cluster.api, "default", name), 30, "the Job to run")


def test_gpu_cohort_sample_mixes_versions_and_borrows(cluster, namespace, tmp_path) -> None:
    docs = load_documents([SAMPLES / "gpu-cohort-setup.yaml"])
    for doc in docs:
        if doc["kind"] == "LocalQueue":
            doc["metadata"]["namespace"] = namespace
    path = tmp_path / "gpu-cohort.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    try:
        apply(cluster.api, [path], lambda _m: None)
        team_a = demo.get(cluster.api, "ClusterQueue", "team-a")
        assert team_a["spec"]["cohortName"] == "gpu-team"  # v1beta1 `cohort`, converted
        batch = client.BatchV1Api(cluster.api)
        for i in range(3):  # 3 x 2 GPUs: team-a's 4 and 2 borrowed from team-b
            batch.create_namespaced_job(
                namespace, demo.queued_job(f"a-{i}", "team-a-queue", 2, 600)
            )
        wait_for(
            lambda: demo.gpu_usage(demo.get(cluster.api, "ClusterQueue", "team-a")) == 6,
            60,
            "team-a to hold 6 GPUs",
        )
    finally:
        demo.delete_cluster_objects(
            cluster.api,
            ("ClusterQueue", "team-a"),
            ("ClusterQueue", "team-b"),
            ("ResourceFlavor", "a100"),
        )


def _in_namespace(name: str, ns: str, tmp_path: Path) -> Path:
    """A fixture's documents moved into namespace ``ns`` (a file for harness apply)."""
    docs = load_documents([FIXTURES / name])
    for doc in docs:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = ns
    out = tmp_path / name
    out.write_text(yaml.safe_dump_all(docs))
    return out


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "clusterqueue-negative-quota.yaml",
            r'vclusterqueue.kb.io" denied the request: spec.resourceGroups\[0\].flavors\[0\]'
            r'.resources\[0\].nominalQuota: Invalid value: "-1": '
            "must be greater than or equal to 0",
        ),
        ("clusterqueue-negative-quota-string.yaml", r"nominalQuota: Invalid value: \"-36Gi\""),
        (
            "clusterqueue-overlapping.yaml",
            r'coveredResources\[0\]: Duplicate value: "nvidia.com/gpu"',
        ),
        (
            "clusterqueue-admission-scope.yaml",
            r"admissionScope: admission fair sharing is not supported",
        ),
        ("workload-min-count.yaml", r"minCount: partial admission is not supported"),
    ],
)
def test_bad_objects_are_rejected_by_the_api_server(
    cluster, namespace, tmp_path, name: str, message: str
) -> None:
    path = _in_namespace(name, namespace, tmp_path)
    with pytest.raises(HarnessError, match=message):
        apply(cluster.api, [path], lambda _m: None)


def test_cluster_queue_with_an_unknown_flavor_is_inactive(cluster, namespace, tmp_path) -> None:
    path = _in_namespace("clusterqueue-unknown-flavor.yaml", namespace, tmp_path)
    apply(cluster.api, [path], lambda _m: None)
    active = wait_for(
        lambda: condition(demo.get(cluster.api, "ClusterQueue", "unknown-flavor-queue"), "Active"),
        30,
        "the Active condition",
    )
    assert (active["status"], active["reason"]) == ("False", kueue.CQ_REASON_FLAVOR_NOT_FOUND)
    assert "no-such-flavor" in active["message"]
    demo.delete_cluster_objects(cluster.api, ("ClusterQueue", "unknown-flavor-queue"))


def test_job_naming_a_missing_local_queue_stays_suspended(cluster, namespace, tmp_path) -> None:
    path = _in_namespace("job-missing-localqueue.yaml", namespace, tmp_path)
    apply(cluster.api, [path], lambda _m: None)
    wl = wait_for(
        lambda: (
            (w := demo.workload_of(cluster.api, namespace, "lost-job"))
            and demo.reason(w, kueue.QUOTA_RESERVED, "False")
            and w
        ),
        30,
        "the Workload's QuotaReserved condition",
    )
    reserved = condition(wl, kueue.QUOTA_RESERVED)
    assert reserved["reason"] == kueue.REASON_MISCONFIGURED  # UnadmittedWorkloadsObservability
    assert reserved["message"] == "LocalQueue no-such-queue is terminating or missing"
    assert demo.suspended(cluster.api, namespace, "lost-job")  # the webhook created it so
    assert client.CoreV1Api(cluster.api).list_namespaced_pod(namespace).items == []


def test_local_queue_in_a_namespace_the_cluster_queue_excludes(cluster, namespace) -> None:
    cq = setup_queue(cluster.api, namespace, 4)
    other = f"{namespace}-x"
    with fresh_namespace(cluster.api, other[:50]) as ns2:
        demo.create(cluster.api, demo.local_queue("user-queue", ns2, cq))
        client.BatchV1Api(cluster.api).create_namespaced_job(
            ns2, demo.queued_job("outsider", "user-queue", 1, 5)
        )
        wl = wait_for(
            lambda: (
                (w := demo.workload_of(cluster.api, ns2, "outsider"))
                and demo.reason(w, kueue.QUOTA_RESERVED, "False")
                and w
            ),
            30,
            "the outsider's Workload to be evaluated",
        )
        cond = condition(wl, kueue.QUOTA_RESERVED)
        assert (cond["reason"], cond["message"]) == (
            kueue.REASON_MISCONFIGURED,
            "workload namespace doesn't match ClusterQueue selector",
        )
        assert demo.suspended(cluster.api, ns2, "outsider")


def test_a_statefulset_is_one_pod_group_admitted_when_quota_grows(cluster, namespace) -> None:
    """StatefulSet integration: the pods of a queued StatefulSet join one pod group (one
    Workload counting every replica); over quota they wait gated, and raising the
    ClusterQueue's quota requeues the parked Workload (a quota change is one of the
    release's requeue triggers), which admits the whole group."""
    api = cluster.api
    cq = setup_queue(api, namespace, 1)
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": "trainer"}), spec=gpu_pod_spec(1)
    )
    sts = client.V1StatefulSet(
        metadata=client.V1ObjectMeta(name="trainer", labels={kueue.QUEUE_LABEL: "user-queue"}),
        spec=client.V1StatefulSetSpec(
            replicas=2,
            service_name="trainer",
            selector=client.V1LabelSelector(match_labels={"app": "trainer"}),
            template=template,
        ),
    )
    client.AppsV1Api(api).create_namespaced_stateful_set(namespace, sts)
    core = client.CoreV1Api(api)
    wl = wait_for(
        lambda: (
            (ws := workloads(api, namespace))
            and demo.reason(ws[0], kueue.QUOTA_RESERVED, "False")
            and ws[0]
        ),
        60,
        "the group's Workload to wait for quota",
    )
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [("main", 2)]
    [pod] = core.list_namespaced_pod(namespace).items  # OrderedReady: only trainer-0 yet
    assert pod.metadata.name == "trainer-0" and pod.spec.scheduling_gates
    assert pod.metadata.labels[kueue.POD_GROUP_NAME_LABEL] == wl["metadata"]["name"]
    assert pod.metadata.annotations[kueue.POD_GROUP_TOTAL_COUNT] == "2"

    queue = demo.get(api, "ClusterQueue", cq)
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 2
    client.CustomObjectsApi(api).replace_cluster_custom_object(
        kueue.GROUP, kueue.VERSION, "clusterqueues", cq, queue
    )

    def both_running() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(namespace).items
        up = [p for p in pods if p.spec.node_name and not p.spec.scheduling_gates]
        return pods if len(up) == 2 else None

    pods = wait_for(both_running, 90, "both replicas admitted and bound")
    assert {p.metadata.labels[kueue.POD_GROUP_NAME_LABEL] for p in pods} == {wl["metadata"]["name"]}
    [wl] = workloads(api, namespace)
    assert demo.reason(wl, kueue.ADMITTED)
    wait_for(
        lambda: demo.gpu_usage(demo.get(api, "ClusterQueue", cq)) == 2,
        10,
        f"{cq} to report 2 GPUs in use",  # status is written in batches of 1 s
    )
    # the StatefulSet would recreate the pods the namespace teardown deletes
    client.AppsV1Api(api).delete_namespaced_stateful_set(
        "trainer", namespace, propagation_policy="Orphan"
    )


def test_a_running_job_raised_above_its_admission_is_stopped_and_queued_again(
    cluster, namespace
) -> None:
    """ensureOneWorkload against the real API server: the admitted Job's pod carries the
    podset and queue labels; raising parallelism on the running Job stops it, restores
    its template (the API server allows it once the Job is suspended without a startTime
    and its pods are gone), deletes the old Workload and queues a new one for 3 pods,
    which a 2-GPU queue can never hold."""
    api = cluster.api
    cq = setup_queue(api, namespace, 2)
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    grow = demo.queued_job("grow", "user-queue", 1, 600)
    grow.spec.completions = 3  # one pod at a time: the pod count is parallelism capped by this
    batch.create_namespaced_job(namespace, grow)
    first = wait_for(
        lambda: (
            (w := demo.workload_of(api, namespace, "grow")) and demo.reason(w, "Admitted") and w
        ),
        60,
        "grow to be admitted",
    )
    pod = wait_for(
        lambda: next(
            iter(core.list_namespaced_pod(namespace, label_selector="job-name=grow").items), None
        ),
        60,
        "grow's pod",
    )
    labels = pod.metadata.labels
    assert (labels[kueue.PODSET_LABEL], labels[kueue.LOCAL_QUEUE_LABEL]) == ("main", "user-queue")
    assert labels[kueue.CLUSTER_QUEUE_LABEL] == cq
    batch.patch_namespaced_job("grow", namespace, {"spec": {"parallelism": 3}})
    second = wait_for(
        lambda: (
            (w := demo.workload_of(api, namespace, "grow"))
            and w["metadata"]["uid"] != first["metadata"]["uid"]
            and demo.reason(w, kueue.QUOTA_RESERVED, "False")
            and w
        ),
        60,
        "a new Workload for 3 pods to be evaluated",
    )
    assert second["spec"]["podSets"][0]["count"] == 3
    cond = condition(second, kueue.QUOTA_RESERVED)
    assert cond["reason"] == kueue.REASON_EXCEEDS_MAX_QUOTA, cond
    job = batch.read_namespaced_job("grow", namespace)
    assert job.spec.suspend is True
    assert kueue.PODSET_LABEL not in (job.spec.template.metadata.labels or {})
    assert not job.spec.template.spec.node_selector
    wait_for(
        lambda: demo.gpu_usage(demo.get(api, "ClusterQueue", cq)) == 0,
        30,
        "the old Workload's quota to be released",
    )


def test_kubectl_shows_the_release_printer_columns(cluster, namespace) -> None:
    cq = setup_queue(cluster.api, namespace, 4)
    submit(cluster.api, namespace, ["one"], seconds=600)
    wait_for(
        lambda: (
            demo.get(cluster.api, "ClusterQueue", cq).get("status", {}).get("admittedWorkloads")
            == 1
        ),
        60,
        "admitted count",
    )

    def kubectl(*argv: str) -> str:
        return subprocess.run(
            [str(binaries.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *argv],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    header, row = kubectl("get", "clusterqueue", cq, "-o", "wide").splitlines()[:2]
    assert re.split(r"\s{2,}", header) == [
        "NAME",
        "COHORT",
        "STRATEGY",
        "PENDING WORKLOADS",
        "ADMITTED WORKLOADS",
    ]
    assert row.split()[-3:] == ["BestEffortFIFO", "0", "1"]
    out = kubectl("get", "workloads", "-n", namespace)
    assert "RESERVED IN" in out and cq in out and "True" in out


def test_metrics_are_scraped_with_the_release_names(cluster, namespace) -> None:
    cq = setup_queue(cluster.api, namespace, 2)
    submit(cluster.api, namespace, ["m-1", "m-2", "m-3"], seconds=600)
    wait_for(
        lambda: (
            demo.get(cluster.api, "ClusterQueue", cq).get("status", {}).get("pendingWorkloads") == 1
        ),
        60,
        "2 admitted, 1 pending",
    )

    def sample(name: str, **labels: str) -> float | None:
        text = addon.metrics(cluster.backend)
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    role = {"replica_role": "standalone"}
    assert (
        wait_for(
            lambda: sample("kueue_admitted_workloads_total", cluster_queue=cq, **role),
            30,
            "admissions",
        )
        == 2
    )
    assert sample("kueue_quota_reserved_workloads_total", cluster_queue=cq, **role) == 2
    assert (
        wait_for(
            lambda: sample(
                "kueue_pending_workloads", cluster_queue=cq, status="inadmissible", **role
            ),
            30,
            "pending",
        )
        == 1
    )
    usage = sample(
        "kueue_cluster_queue_resource_usage", cluster_queue=cq, resource=demo.GPU, **role
    )
    assert usage == 2
    assert sample("kueue_admission_wait_time_seconds_count", cluster_queue=cq, **role) == 2
    assert (
        sample("kueue_admission_wait_time_seconds_bucket", cluster_queue=cq, le="+Inf", **role) == 2
    )
    assert (sample("kueue_admission_attempts_total", result="success", **role) or 0) >= 1
    unadmitted = {"reason": "NoReservation", "underlying_cause": kueue.REASON_WAITING_FOR_QUOTA}
    assert (
        wait_for(
            lambda: sample("kueue_unadmitted_workloads", cluster_queue=cq, **unadmitted, **role),
            30,
            "the unadmitted Workload counted",
        )
        == 1
    )


@pytest.fixture
def demo_namespaces(cluster) -> Iterator[None]:
    """The demo's namespaces are deleted afterwards: its Jobs would hold 12 GPUs."""
    yield
    core = client.CoreV1Api(cluster.api)
    for ns in (demo.TEAM_A, demo.TEAM_B):
        try:
            core.delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.mark.local_backend
def test_kueue_demo_passes_against_this_cluster(cluster, demo_namespaces, capsys) -> None:
    assert demo.run(argparse.Namespace(spec="e2e", backend="local")) == 0
    # seed 000 §6.6's steps in their order (tests/e2e/golden/kueue.yaml)
    assert_shape("kueue", capsys.readouterr().out)


# -- Kueue in front of HAMi -------------------------------------------------------------------


@pytest.fixture(scope="module")
def kueue_hami() -> Iterator[Cluster]:
    with running_cluster("kueue-hami-e2e") as c:
        yield c


def test_a_queued_vgpu_deployment_lands_on_shared_gpus(kueue_hami: Cluster) -> None:
    api = kueue_hami.api
    with fresh_namespace(api, "kueue-hami") as ns:
        demo.create(api, demo.flavor("shared-t4", {}))
        quota = {demo.GPU: 2, "nvidia.com/gpumem": 6000}
        demo.create(api, demo.cluster_queue(f"{ns}-cq", ns, quota, "shared-t4"))
        demo.create(api, demo.local_queue("inference", ns, f"{ns}-cq"))
        pod = hami_demo.vgpu_pod("x", 3000, 0, BINPACK)  # share a GPU (HAMi spreads by default)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "llm", "labels": {kueue.QUEUE_LABEL: "inference"}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "llm"}},
                "template": {
                    "metadata": {
                        "labels": {"app": "llm"},
                        "annotations": pod["metadata"]["annotations"],
                    },
                    "spec": pod["spec"],
                },
            },
        }
        client.AppsV1Api(api).create_namespaced_deployment(ns, deployment)
        core = client.CoreV1Api(api)

        def placed() -> list[Obj] | None:
            pods = api.sanitize_for_serialization(core.list_namespaced_pod(ns))["items"]
            ready = [p for p in pods if hami_demo.allocated(p)]
            return ready if len(ready) == 2 else None

        pods = wait_for(placed, 120, "both replicas admitted, bound and allocated")
        for p in pods:
            assert p["spec"]["schedulerName"] == "hami-scheduler"
            assert p["metadata"]["labels"][kueue.MANAGED_LABEL] == "true"
            assert not p["spec"].get("schedulingGates")  # Kueue removed its gate
        workloads_ = workloads(api, ns)
        assert len(workloads_) == 2 and all(demo.reason(w, kueue.ADMITTED) for w in workloads_)

        def usage() -> tuple[int, int]:
            cq = demo.get(api, "ClusterQueue", f"{ns}-cq")
            return demo.gpu_usage(cq), demo.gpu_usage(cq, "nvidia.com/gpumem")

        # the status is written in batches of 1 s
        wait_for(lambda: usage() == (2, 6000), 10, "the ClusterQueue to report 2 GPUs, 6000 MiB")
        shares = [hami_demo.placement(p) for p in pods]
        nodes = {node for node, _ in shares}
        uuids = {d.uuid for _, devs in shares for d in devs}
        assert len(nodes) == 1 and len(uuids) == 1  # both on one shared GPU
        # a third replica is over quota: it waits gated, its Workload says why
        client.AppsV1Api(api).patch_namespaced_deployment("llm", ns, {"spec": {"replicas": 3}})
        wait_for(
            lambda: (
                len(workloads(api, ns)) == 3
                and sum(
                    1 for w in workloads(api, ns) if demo.reason(w, kueue.QUOTA_RESERVED, "False")
                )
                == 1
            ),
            60,
            "the third replica's Workload to wait for quota",
        )
        gated = [
            p
            for p in core.list_namespaced_pod(ns).items
            if p.spec.scheduling_gates and not p.spec.node_name
        ]
        assert len(gated) == 1
        # the Deployment would recreate the pods the namespace teardown deletes
        client.AppsV1Api(api).delete_namespaced_deployment("llm", ns, propagation_policy="Orphan")
        for rs in client.AppsV1Api(api).list_namespaced_replica_set(ns).items:
            client.AppsV1Api(api).delete_namespaced_replica_set(
                rs.metadata.name, ns, propagation_policy="Orphan"
            )
        demo.delete_cluster_objects(
            api, ("ClusterQueue", f"{ns}-cq"), ("ResourceFlavor", "shared-t4")
        )

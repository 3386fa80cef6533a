"""The troubleshooting labs on the labs cluster (harness/clusters/labs.yaml): each lab's
broken state is diagnosed naming the right link, each documented fix (the solutions of
docs/workshop.md) makes `gpulab lab check` pass, and after the fix `gpulab diagnose`
finds no broken link on the objects it named before.

lab-mig runs on its own cluster: tests/e2e/test_lab_mig.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import Cluster, running_cluster
from kubernetes import client, watch
from labs_helpers import first_broken, progress, run_lab

from gpulab.kueue.api import QUEUE_LABEL
from gpulab.wait import wait_for
from harness.labs import HAMI_IGNORE, POOL_LABEL, load

pytestmark = pytest.mark.local_backend  # Xid injection and node-agent restarts


@pytest.fixture(scope="module")
def labs() -> Iterator[Cluster]:
    with running_cluster("labs") as c:
        yield c


def kubectl(labs: Cluster, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "gpulab", "kubectl", "--spec", "labs", *args],
        check=True,
        capture_output=True,
    )


def test_lab_unschedulable(labs: Cluster) -> None:
    from harness.labs import unschedulable as u

    def fix(api: client.ApiClient) -> None:
        ns = u.NS
        kubectl(
            labs, "-n", ns, "set", "resources", "deploy/big-trainer", "--limits=nvidia.com/gpu=4"
        )
        toleration = {"spec": {"template": {"spec": {"tolerations": [u.TAINT]}}}}
        kubectl(labs, "-n", ns, "patch", "deploy/h100-job", "-p", json.dumps(toleration))
        selector = {u.PRODUCT: u.A100, "gpulab.io/lab-pool": "unschedulable"}
        patch = {"spec": {"template": {"spec": {"nodeSelector": selector}}}}
        kubectl(labs, "-n", ns, "patch", "deploy/v100-job", "-p", json.dumps(patch))
        patch = {"spec": {"template": {"metadata": {"annotations": {u.HAMI_TYPE_KEY: "T4"}}}}}
        kubectl(labs, "-n", u.HAMI_NS, "patch", f"deploy/{u.HAMI_APP}", "-p", json.dumps(patch))
        labs.backend.clear_faults(u.XID_NODE)
        kubectl(
            labs, "-n", "gpulab-system", "delete", "pod", "-l",
            "app.kubernetes.io/name=gpulab-device-plugin",
            f"--field-selector=spec.nodeName={u.XID_NODE}",
        )  # fmt: skip

    run_lab(labs, "unschedulable", fix)


def test_lab_device_plugin(labs: Cluster) -> None:
    from harness.labs import device_plugin as d

    def fix(api: client.ApiClient) -> None:
        kubectl(labs, "label", "node", d.RENAMED, f"{d.CONFIG_LABEL}=default", "--overwrite")
        kubectl(
            labs, "-n", "gpulab-system", "delete", "pod", "-l",
            f"app.kubernetes.io/name={d.PLUGIN}", f"--field-selector=spec.nodeName={d.RENAMED}",
        )  # fmt: skip
        kubectl(labs, "label", "node", d.STOPPED, f"{d.PRESENT}=true")

    run_lab(labs, "device-plugin", fix)


def test_lab_device_plugin_capacity_goes_after_the_grace_period(labs: Cluster) -> None:
    """The lab's short grace period: capacity 4 / allocatable 0 first, then capacity 0 —
    and diagnose names the node link in both phases."""
    from harness.labs import device_plugin as d

    lab = load("device-plugin")
    lab.start(labs.backend, progress)
    try:
        core = client.CoreV1Api(labs.api)

        def gpus(node: str) -> tuple[str, str]:
            st = core.read_node(node).status
            return (st.capacity or {}).get("nvidia.com/gpu", "-"), (st.allocatable or {}).get(
                "nvidia.com/gpu", "-"
            )

        assert gpus(d.STOPPED) == ("4", "0")
        wait_for(lambda: gpus(d.STOPPED) == ("0", "0"), d.GRACE + 30, "capacity to drop", 0.5)
        for case in lab.cases(labs.api):
            link, answer = first_broken(labs.api, *case.target)
            assert link == "node", answer
    finally:
        lab.stop(labs.backend, progress)


def test_lab_gang_deadlock(labs: Cluster) -> None:
    from harness.labs import gang_deadlock as g

    def fix(api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        for gang in g.GANGS:
            custom.patch_namespaced_custom_object(
                "scheduling.x-k8s.io", "v1alpha1", g.NS, "podgroups", gang,
                {"spec": {"scheduleTimeoutSeconds": 10}},
            )  # fmt: skip
        kubectl(labs, "-n", "gpulab-system", "rollout", "restart", f"deploy/{g.SCHEDULER}")

    run_lab(labs, "gang-deadlock", fix)


def test_lab_gang_deadlock_holds_without_the_fix(labs: Cluster) -> None:
    """The deadlock is real, not slow: with no fix, nothing binds for longer than the
    plugin's own Permit timeout (10 s) plus a scheduling round, while the gangs stay
    waiting at Permit; the fix of the test above is the positive control."""
    from harness.labs import gang_deadlock as g

    lab = load("gang-deadlock")
    lab.start(labs.backend, progress)
    try:
        core = client.CoreV1Api(labs.api)
        bound = []
        for event in watch.Watch().stream(core.list_namespaced_pod, g.NS, timeout_seconds=18):
            if event["object"].spec.node_name:
                bound.append(event["object"].metadata.name)
                break
        assert not bound, f"bound without a fix: {bound}"
        link, answer = first_broken(labs.api, "podgroup", f"{g.NS}/train-b")
        assert link == "coscheduling" and "gang deadlock" in answer
    finally:
        lab.stop(labs.backend, progress)


@pytest.mark.parametrize("fix_b", ["create-clusterqueue", "relabel"])
def test_lab_queue_quota(labs: Cluster, fix_b: str) -> None:
    """Either fix of job-b is accepted: create the missing ClusterQueue, or relabel the
    suspended Job to a LocalQueue that works (its Workload follows the label)."""
    from harness.labs import queue_quota as q

    def fix(api: client.ApiClient) -> None:
        custom = client.CustomObjectsApi(api)
        kueue_api = ("kueue.x-k8s.io", "v1beta2", "clusterqueues")
        if fix_b == "relabel":
            # lab-cq-a on the existing flavor, with room for job-a, job-b and job-d
            custom.patch_cluster_custom_object(*kueue_api, q.CQ_A, q._quota_patch(3))
            kubectl(
                labs, "-n", q.NS, "label", "job", "job-b", f"{QUEUE_LABEL}=team-a", "--overwrite"
            )
        else:
            missing = q.flavor(q.MISSING_FLAVOR)
            custom.create_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "resourceflavors", missing
            )
            custom.create_cluster_custom_object(*kueue_api, q.cluster_queue(q.CQ_B, q.FLAVOR, 1))
        custom.patch_cluster_custom_object(*kueue_api, q.CQ_C, q._quota_patch(4))
        batch = client.BatchV1Api(api)
        batch.delete_namespaced_job("job-d", q.NS, propagation_policy="Foreground")
        wait_for(
            lambda: not batch.list_namespaced_job(q.NS, field_selector="metadata.name=job-d").items,
            60,
            "job-d to go",
            0.5,
        )
        batch.create_namespaced_job(q.NS, q.job("job-d", "team-a", 1))

    run_lab(labs, "queue-quota", fix)


def test_lab_cli_hints_and_unknown_lab() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpulab", "lab", "hint", "gang-deadlock", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.count("hint ") == len(load("gang-deadlock").hints)
    bad = subprocess.run(
        [sys.executable, "-m", "gpulab", "lab", "start", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "invalid choice: 'nope'" in bad.stderr


def test_no_false_alarm_on_the_chapters_demo_objects(labs: Cluster) -> None:
    """Demo objects of the chapters the labs cluster runs, created as the demos create
    them: the cluster demo's GPU pod, a Coscheduling gang (demos/coscheduling.py's
    workers), the NUMA demo's 4-GPU pod for gpulab-scheduler (demos/numa.py), Kueue's
    queues and a queued Job (demos/kueue.py). Once they run,
    `gpulab diagnose` names no broken link on any of them. (HAMi, Volcano and MIG demo
    objects are recorded fixtures: tests/unit/test_diagnose.py; the HAMi case of
    lab-unschedulable runs a HAMi pod here.)"""
    from demos import coscheduling, kueue, numa
    from demos.common import fresh_namespace
    from gpulab.framework.objects import GPU, make_pod, manifest
    from gpulab.schedulerplugins import apis

    api = labs.api
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for ns in (coscheduling.NAMESPACE, kueue.TEAM_A, numa.NAMESPACE):
        fresh_namespace(api, ns)
        core.patch_namespace(ns, {"metadata": {"labels": HAMI_IGNORE}})  # as lab namespaces
    custom.create_namespaced_custom_object(
        apis.GROUP, apis.VERSION, coscheduling.NAMESPACE, "podgroups",
        apis.pod_group("healthy", coscheduling.NAMESPACE, 2),
    )  # fmt: skip
    # on the labs' own nodes: the T4 profile is also the HAMi node's, whose device plugin
    # allocates only pods HAMi's extender bound
    for i in range(2):
        worker = coscheduling.worker("healthy", i)
        worker["spec"]["nodeSelector"] = {POOL_LABEL: "gang-deadlock"}
        core.create_namespaced_pod(coscheduling.NAMESPACE, worker)
    plain = make_pod(
        "gpu-pod",
        coscheduling.NAMESPACE,
        requests={GPU: 1},
        node_selector={POOL_LABEL: "unschedulable"},
    )
    core.create_namespaced_pod(coscheduling.NAMESPACE, plain)
    for body in (
        kueue.flavor(kueue.FLAVOR),
        kueue.cluster_queue(kueue.CQ_A, kueue.TEAM_A, 2, kueue.FLAVOR),
        kueue.local_queue("team-a", kueue.TEAM_A, kueue.CQ_A),
    ):
        kueue.create(api, body)
    client.BatchV1Api(api).create_namespaced_job(
        kueue.TEAM_A, kueue.queued_job("healthy", "team-a", 1, 3600)
    )
    train = numa.numa_pod(
        "train", scheduler=numa.SCHEDULER, node_selector={POOL_LABEL: "unschedulable"}
    )
    core.create_namespaced_pod(numa.NAMESPACE, manifest(train))
    try:

        def running() -> list[client.V1Pod]:
            pods = [
                p
                for ns in (coscheduling.NAMESPACE, kueue.TEAM_A, numa.NAMESPACE)
                for p in core.list_namespaced_pod(ns).items
            ]
            return pods if len(pods) == 5 and all(p.status.phase == "Running" for p in pods) else []

        pods = wait_for(running, 90, "the demo objects to run", 0.5)
        for p in pods:
            link, answer = first_broken(api, "pod", f"{p.metadata.namespace}/{p.metadata.name}")
            assert link is None, answer
        link, answer = first_broken(api, "podgroup", f"{coscheduling.NAMESPACE}/healthy")
        assert link is None, answer
        workloads = custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", kueue.TEAM_A, "workloads"
        )["items"]
        wl = workloads[0]["metadata"]["name"]
        assert first_broken(api, "workload", f"{kueue.TEAM_A}/{wl}")[0] is None
        assert first_broken(api, "clusterqueue", kueue.CQ_A)[0] is None
        for node in ("gpu-a100", "gpu-t4-0", "gpu-q"):
            assert first_broken(api, "node", node)[0] is None
    finally:
        for ns in (coscheduling.NAMESPACE, kueue.TEAM_A, numa.NAMESPACE):
            core.delete_namespace(ns)
        for plural, name in (("clusterqueues", kueue.CQ_A), ("resourceflavors", kueue.FLAVOR)):
            custom.delete_cluster_custom_object("kueue.x-k8s.io", "v1beta2", plural, name)

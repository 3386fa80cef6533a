"""Kueue counterpart end to end on the session cluster (spec e2e, addon ``kueue``): real
kube-apiserver (CRD validation, conversion and Job mutating webhooks through the local
transform), controller-manager (Job pods), kube-scheduler and kwok (Job pods complete
after their ``pod-complete.stage.kwok.x-k8s.io/delay``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import kueue as demo
from gpulab.kueue import api as kueue
from gpulab.kueue.model import condition
from gpulab.kueue.workload import is_finished
from gpulab.wait import wait_for
from harness import binaries
from harness.addons import kueue as addon
from harness.apply import apply, load_documents
from harness.errors import HarnessError
from harness.local import pid_alive

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
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
    )


class Peak(demo.Watched):
    """The highest ``measure`` of a watched set of objects, taken after every event."""

    def __init__(
        self,
        list_fn: Callable[..., Any],
        args: tuple[Any, ...],
        measure: Callable[[dict[str, Obj]], int],
        **kwargs: Any,
    ) -> None:
        self.peak = 0
        self._measure = measure
        super().__init__(list_fn, *args, on_event=self._seen, **kwargs)

    def _seen(self, _obj: Obj, objects: dict[str, Obj]) -> None:
        self.peak = max(self.peak, self._measure(objects))


def watch_workloads(api: client.ApiClient, ns: str) -> Peak:
    custom = client.CustomObjectsApi(api)
    args = (kueue.GROUP, kueue.VERSION, ns, "workloads")
    return Peak(custom.list_namespaced_custom_object, args, reserved_gpus)


def watch_pods(api: client.ApiClient, ns: str) -> Peak:
    return Peak(client.CoreV1Api(api).list_namespaced_pod, (ns,), active_pods)


def watch_cluster_queue(api: client.ApiClient, cq: str) -> Peak:
    return Peak(
        client.CustomObjectsApi(api).list_cluster_custom_object,
        (kueue.GROUP, kueue.VERSION, "clusterqueues"),
        lambda cqs: sum(demo.gpu_usage(c) for c in cqs.values()),
        field_selector=f"metadata.name={cq}",
    )


def workloads(api: client.ApiClient, ns: str) -> list[Obj]:
    custom = client.CustomObjectsApi(api)
    return custom.list_namespaced_custom_object(kueue.GROUP, kueue.VERSION, ns, "workloads")[
        "items"
    ]


def all_finished(api: client.ApiClient, ns: str, count: int) -> list[Obj] | None:
    items = workloads(api, ns)
    return items if len(items) == count and all(is_finished(w) for w in items) else None


def test_quota_is_never_exceeded_by_100_jobs_submitted_at_once(cluster, namespace) -> None:
    quota = 10
    cq = setup_queue(cluster.api, namespace, quota)
    names = [f"job-{i:03d}" for i in range(100)]
    with (
        watch_workloads(cluster.api, namespace) as reserved,
        watch_pods(cluster.api, namespace) as pods,
        watch_cluster_queue(cluster.api, cq) as usage,
    ):
        submit(cluster.api, namespace, names, seconds=1)
        done = wait_for(lambda: all_finished(cluster.api, namespace, 100), 150, "100 Workloads")
    # watched continuously: never more than the quota reserved, running, or reported
    assert reserved.peak == quota and usage.peak == quota
    assert 0 < pods.peak <= quota  # pods of finished Jobs complete while others start
    assert reserved.events > 300  # each Workload is created, admitted and finished
    assert {demo.reason(w, kueue.FINISHED) for w in done} == {kueue.FINISHED_SUCCEEDED}
    owners = Counter(w["metadata"]["ownerReferences"][0]["name"] for w in done)
    assert sorted(owners) == names and set(owners.values()) == {1}
    jobs = client.BatchV1Api(cluster.api).list_namespaced_job(namespace).items
    assert all(j.status.succeeded == 1 and not j.spec.suspend for j in jobs)


@pytest.mark.local_backend
def test_controller_restart_neither_double_admits_nor_loses_a_workload(cluster, namespace) -> None:
    quota = 4
    setup_queue(cluster.api, namespace, quota)
    core = client.CoreV1Api(cluster.api)
    names = [f"r-{i}" for i in range(8)]
    with (
        watch_workloads(cluster.api, namespace) as reserved,
        watch_pods(cluster.api, namespace) as pods,
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
        before = addon.controller(cluster.local)
        os.killpg(before.pid, signal.SIGKILL)  # mid-run: 4 Jobs running, 4 waiting
        wait_for(lambda: not pid_alive(before.pid, before.exe), 10, "the controller to die")
        pending = [w for w in workloads(cluster.api, namespace) if not _reserved(w)]
        assert len(pending) == len(names) - quota
        # the running Jobs complete while no controller watches
        batch = client.BatchV1Api(cluster.api)
        wait_for(
            lambda: (
                sum(bool(j.status.succeeded) for j in batch.list_namespaced_job(namespace).items)
                == quota
            ),
            60,
            "the admitted Jobs to complete",
        )
        after = addon.restart(cluster.local)
        assert after.pid != before.pid and after.ports == before.ports
        assert cluster.local.running()  # the dead record was replaced
        done = wait_for(lambda: all_finished(cluster.api, namespace, 8), 90, "8 Workloads")
    assert reserved.peak == quota and 0 < pods.peak <= quota
    assert sorted(w["metadata"]["ownerReferences"][0]["name"] for w in done) == names
    # every Workload was admitted exactly once, by one controller or the other
    counts = admits(core, namespace)
    assert sorted(counts) == sorted(w["metadata"]["name"] for w in done)
    assert set(counts.values()) == {1}


def admits(core: client.CoreV1Api, ns: str) -> Counter[str]:
    """Admit steps (quota reserved) in the trace, per Workload."""
    return Counter(
        e.involved_object.name
        for e in core.list_namespaced_event(ns).items
        if e.reason == "Admit" and e.type == "Normal"
    )


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
    "name", ["clusterqueue-negative-quota.yaml", "clusterqueue-negative-quota-string.yaml"]
)
def test_negative_quota_is_rejected_by_crd_validation(cluster, name: str) -> None:
    with pytest.raises(HarnessError, match=r"ClusterQueue .* was rejected .*nominalQuota"):
        apply(cluster.api, [FIXTURES / name], lambda _m: None)


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
    reserved = next(c for c in wl["status"]["conditions"] if c["type"] == kueue.QUOTA_RESERVED)
    assert reserved["reason"] == kueue.REASON_MISCONFIGURED
    assert reserved["message"] == "LocalQueue no-such-queue is terminating or missing"
    assert demo.suspended(cluster.api, namespace, "lost-job")  # the webhook created it so
    assert client.CoreV1Api(cluster.api).list_namespaced_pod(namespace).items == []


def test_kubectl_shows_counts_and_usage(cluster, namespace) -> None:
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

    header, row = kubectl("get", "clusterqueue", cq).splitlines()[:2]
    assert "PENDING WORKLOADS" in header and "ADMITTED WORKLOADS" in header and "USAGE" in header
    assert row.split()[-3:] == ["0", "1", "1"]
    out = kubectl("get", "workloads", "-n", namespace)
    assert "RESERVED IN" in out and cq in out and "True" in out


@pytest.fixture
def demo_namespaces(cluster) -> Iterator[None]:
    """The demo's namespaces are deleted afterwards: its Jobs would hold 8 GPUs."""
    yield
    core = client.CoreV1Api(cluster.api)
    for ns in (demo.TEAM_A, demo.TEAM_B):
        try:
            core.delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.mark.local_backend
def test_kueue_demo_passes_against_this_cluster(cluster, demo_namespaces) -> None:
    assert demo.run(argparse.Namespace(spec="e2e", backend="local")) == 0

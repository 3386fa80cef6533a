"""Kueue's visibility API and kueuectl end to end (spec kueue-visibility-e2e): pending
Workloads listed through kube-apiserver's aggregation layer in the order the scheduler
then admits them, and `kubectl kueue` list/stop/resume against the same cluster."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client

from demos import kueue as demo
from gpulab.kueue import api as kueue
from gpulab.kueue import kueuectl
from gpulab.wait import wait_for

SPEC = "kueue-visibility-e2e"
VIS = "/apis/visibility.kueue.x-k8s.io"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


def raw(api: client.ApiClient, path: str) -> Obj:
    """`kubectl get --raw path`: through kube-apiserver (the aggregator proxies it)."""
    resp = api.call_api(
        path,
        "GET",
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    return json.loads(resp.data)


def kubectl_kueue(c: Cluster, *argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kueuectl.main([*argv, "--kubeconfig", str(c.backend.kubeconfig)]) == 0
    return out.getvalue()


def workload_of(api: client.ApiClient, ns: str, job: str) -> Obj | None:
    items = client.CustomObjectsApi(api).list_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, ns, "workloads"
    )["items"]
    return next(
        (
            w
            for w in items
            if any(r["name"] == job for r in w["metadata"].get("ownerReferences", []))
        ),
        None,
    )


def test_pending_order_is_admission_order_and_kueuectl(cluster: Cluster) -> None:
    api = cluster.api
    wait_for(
        lambda: demo.reason(
            raw(
                api, "/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.visibility.kueue.x-k8s.io"
            ),
            "Available",
        ),
        60,
        "APIService v1beta2.visibility.kueue.x-k8s.io Available",
    )
    with fresh_namespace(api, "vis") as ns:
        cq = f"{ns}-cq"
        demo.create(api, demo.flavor(f"{ns}-gpu"))
        demo.create(api, demo.cluster_queue(cq, ns, 1, f"{ns}-gpu"))
        demo.create(api, demo.local_queue("user-queue", ns, cq))
        for name, value in (("high", 100), ("mid", 50)):
            demo.create(
                api,
                {
                    "apiVersion": kueue.API_VERSION,
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": f"{ns}-{name}"},
                    "value": value,
                },
            )
        batch = client.BatchV1Api(api)
        batch.create_namespaced_job(ns, demo.queued_job("blocker", "user-queue", 1, 600))
        wait_for(
            lambda: demo.reason(workload_of(api, ns, "blocker"), kueue.ADMITTED),
            30,
            "the blocker admitted",
        )
        # created in this order; the scheduler's order is priority, then creation
        for job, pc in (
            ("low-a", None),
            ("high", f"{ns}-high"),
            ("low-b", None),
            ("mid", f"{ns}-mid"),
        ):
            batch.create_namespaced_job(ns, demo.queued_job(job, "user-queue", 1, 2, pc))
        path = f"{VIS}/v1beta2/clusterqueues/{cq}/pendingworkloads"
        wait_for(lambda: len(raw(api, path)["items"]) == 4, 30, "4 pending Workloads listed")
        listed = raw(api, path)["items"]
        owners = [w["metadata"]["ownerReferences"][0]["name"] for w in listed]
        # the two low Jobs may share a creation second: then their UIDs decide, as upstream
        assert owners[:2] == ["high", "mid"] and sorted(owners[2:]) == ["low-a", "low-b"]
        wls = [demo.get(api, "Workload", w["metadata"]["name"], ns) for w in listed]
        assert wls == sorted(
            wls,
            key=lambda w: (
                -w["spec"].get("priority", 0),
                w["metadata"]["creationTimestamp"],
                w["metadata"]["uid"],
            ),
        )
        assert [w["positionInClusterQueue"] for w in listed] == [0, 1, 2, 3]
        assert [w["priority"] for w in listed] == [100, 50, 0, 0]
        lq = raw(
            api,
            f"{VIS}/v1beta1/namespaces/{ns}/localqueues/user-queue/pendingworkloads?offset=1&limit=2",
        )
        assert [w["metadata"]["name"] for w in lq["items"]] == [
            w["metadata"]["name"] for w in listed[1:3]
        ]
        assert [w["positionInLocalQueue"] for w in lq["items"]] == [1, 2]

        # kubectl kueue list: upstream's columns, positions from the same API
        table = kubectl_kueue(cluster, "list", "workload", "-n", ns, "--status", "pending")
        header, *rows = table.splitlines()
        assert header.split()[:3] == ["NAME", "JOB", "TYPE"] and "POSITION IN QUEUE" in header
        at = header.index("POSITION IN QUEUE")
        positions = {r.split()[0]: r[at:].split()[0] for r in rows}
        assert positions == {w["metadata"]["name"]: str(i) for i, w in enumerate(listed)}
        cqs = kubectl_kueue(cluster, "list", "clusterqueue")
        assert cqs.splitlines()[0].split() == [
            "NAME",
            "COHORT",
            "PENDING",
            "WORKLOADS",
            "ADMITTED",
            "WORKLOADS",
            "ACTIVE",
            "AGE",
        ]
        # the counts are the ClusterQueue's status, which the controller writes a moment
        # after the Workloads change
        wait_for(
            lambda: any(
                line.split()[:4] == [cq, "4", "1", "true"]
                for line in kubectl_kueue(cluster, "list", "clusterqueue").splitlines()
            ),
            30,
            "kubectl kueue list clusterqueue to show 4 pending, 1 admitted, active",
        )

        # stop/resume a Workload: spec.active, out of the list and back
        low_b = listed[3]["metadata"]["name"]
        out = kubectl_kueue(cluster, "stop", "workload", low_b, "-n", ns)
        assert out == f"workload.kueue.x-k8s.io/{low_b} stopped\n"
        wait_for(lambda: len(raw(api, path)["items"]) == 3, 30, "the stopped Workload unlisted")
        assert kubectl_kueue(cluster, "resume", "workload", low_b, "-n", ns).endswith("resumed\n")
        wait_for(lambda: len(raw(api, path)["items"]) == 4, 30, "the resumed Workload listed")
        # stop/resume the ClusterQueue: stopPolicy, ACTIVE false, then true
        kubectl_kueue(cluster, "stop", "clusterqueue", cq, "--keep-already-running")
        assert demo.get(api, "ClusterQueue", cq)["spec"]["stopPolicy"] == "Hold"
        wait_for(
            lambda: demo.reason(demo.get(api, "ClusterQueue", cq), "Active", "False"), 30, "CQ held"
        )
        kubectl_kueue(cluster, "resume", "clusterqueue", cq)
        wait_for(lambda: demo.reason(demo.get(api, "ClusterQueue", cq), "Active"), 30, "CQ active")
        listed_now = [w["metadata"]["name"] for w in raw(api, path)["items"]]
        assert listed_now == [w["metadata"]["name"] for w in listed]

        # free the quota: the Workloads are admitted one by one, in the listed order
        batch.delete_namespaced_job("blocker", ns, propagation_policy="Background")
        admitted: list[str] = []

        def next_admitted() -> bool:
            for w in listed:
                name = w["metadata"]["name"]
                wl = demo.get(api, "Workload", name, ns)
                if name not in admitted and demo.reason(wl, kueue.QUOTA_RESERVED):
                    admitted.append(name)
            return len(admitted) == len(listed)

        wait_for(next_admitted, 60, "every pending Workload admitted", interval=0.2)
        assert admitted == [w["metadata"]["name"] for w in listed]
        # the Jobs go first: their controller would create again the pods the namespace's
        # clean-up deletes
        batch.delete_collection_namespaced_job(ns, propagation_policy="Background")

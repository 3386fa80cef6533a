"""Volcano's PodGroup controller (pkg/controllers/podgroup) with a fake API: a plain pod,
a Deployment's or a StatefulSet's pod with ``schedulerName: volcano`` gets a PodGroup and
the group-name annotation; other pods are left alone; a ReplicaSet scaled to 0 loses its
PodGroup."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from volcano_helpers import FakeApi

from gpulab.framework.objects import make_pod
from gpulab.trace import Tracer
from gpulab.volcano import apis
from gpulab.volcano.controllers import podgroup as pgc

Obj = dict[str, Any]
NS = "web"


def deployment_pod(name: str = "deploy-with-volcano-5d4f-x2x", scheduler: str = "volcano") -> Obj:
    """A pod of upstream's example/deployment/deployment.yaml, as its ReplicaSet makes it."""
    pod = make_pod(name, NS, requests={"cpu": "300m"}, scheduler=scheduler)
    pod["metadata"].update(
        uid="pod-uid",
        labels={"app": "nginx"},
        annotations={pgc.QUEUE_NAME_ANNOTATION: "test"},
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "deploy-with-volcano-5d4f",
                "uid": "rs-uid",
                "controller": True,
            }
        ],
    )
    return pod


def test_a_deployments_pod_gets_its_replica_sets_pod_group() -> None:
    owners = {
        pgc.GROUP_MIN_MEMBER: "2",
        "volcano.sh/preemptable": "true",
        "deployment.kubernetes.io/revision": "1",
    }
    pg = pgc.build_pod_group(deployment_pod(), owners)
    assert pg["metadata"]["name"] == "podgroup-rs-uid"
    assert pg["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert pg["metadata"]["annotations"] == {"volcano.sh/preemptable": "true"}
    assert pg["spec"]["minMember"] == 2 and pg["spec"]["queue"] == "test"
    assert pg["spec"]["minResources"]["cpu"] == "600m"
    assert pg["spec"]["minResources"]["pods"] == "2"
    assert pg["status"] == {"phase": apis.PG_PENDING}
    assert pgc.build_pod_group(deployment_pod(), owners, inherit=False)["spec"]["minMember"] == 1


def test_a_bare_pod_owns_its_pod_group() -> None:
    pod = deployment_pod("bare")
    pod["metadata"]["ownerReferences"] = []
    pg = pgc.build_pod_group(pod, {})
    assert pg["metadata"]["name"] == "podgroup-pod-uid"
    (ref,) = pg["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("Pod", "bare", True)
    assert pgc.min_member({pgc.GROUP_MIN_MEMBER: "x"}) == 1
    assert pgc.min_member({pgc.GROUP_MIN_MEMBER: "-3"}) == 1


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def controller(api: FakeApi) -> Iterator[pgc.PodGroupController]:
    c = pgc.PodGroupController(
        client.ApiClient(), Tracer("vc-controller-manager", stream=io.StringIO())
    )
    c.core = c.apps = c.batch = c.custom = api  # type: ignore[assignment]
    api.objects[("replica_set", "deploy-with-volcano-5d4f")] = {
        "metadata": {"name": "deploy-with-volcano-5d4f", "annotations": {pgc.GROUP_MIN_MEMBER: "1"}}
    }
    yield c
    c.queue.shutdown()


def test_a_volcano_pod_without_a_group_gets_one_and_the_annotation(
    controller: pgc.PodGroupController, api: FakeApi
) -> None:
    pod = deployment_pod()
    controller.pods.store.apply("ADDED", pod)
    controller.reconcile(f"{NS}/{pod['metadata']['name']}")
    assert ("custom_object", "podgroup-rs-uid") in api.objects
    assert ("patch_namespaced_pod", pod["metadata"]["name"]) in api.calls
    patch = api.patches[-1]
    assert patch == {
        "metadata": {"annotations": {apis.KUBE_GROUP_NAME_ANNOTATION: "podgroup-rs-uid"}}
    }


@pytest.mark.parametrize("case", ["another scheduler", "already grouped"])
def test_other_pods_are_left_alone(
    controller: pgc.PodGroupController, api: FakeApi, case: str
) -> None:
    pod = deployment_pod(
        scheduler="default-scheduler" if case == "another scheduler" else "volcano"
    )
    if case == "already grouped":
        pod["metadata"]["annotations"][apis.KUBE_GROUP_NAME_ANNOTATION] = "mine"
    controller.pods.store.apply("ADDED", pod)
    controller.reconcile(f"{NS}/{pod['metadata']['name']}")
    assert api.calls == []


def test_a_replica_set_scaled_to_zero_loses_its_pod_group(
    controller: pgc.PodGroupController, api: FakeApi
) -> None:
    rs = {
        "kind": "ReplicaSet",
        "metadata": {"name": "deploy-with-volcano-5d4f", "namespace": NS, "uid": "rs-uid"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "nginx"}}},
    }
    controller.replicasets.store.apply("ADDED", rs)
    controller.reconcile(f"ReplicaSet:{NS}/deploy-with-volcano-5d4f")
    assert ("delete_namespaced_custom_object", "podgroup-rs-uid") in api.calls
    # scaled up again, its first pod without a group gets it
    rs["spec"]["replicas"] = 1
    controller.pods.store.apply("ADDED", deployment_pod())
    controller.reconcile(f"ReplicaSet:{NS}/deploy-with-volcano-5d4f")
    assert ("custom_object", "podgroup-rs-uid") in api.objects

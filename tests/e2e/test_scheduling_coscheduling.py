"""Coscheduling end to end (harness/clusters/scheduling-e2e.yaml): PodGroups bind whole or
not at all, checked continuously from a pod watch for every test; the gang deadlock of
two groups that each fit alone resolves; bad input gets a clear status; restarts of the
scheduler and of the API server never leave a partial gang.

The gangs use the two T4 nodes (4 GPUs each): a gang of 4 workers x 2 GPUs fills both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Cluster, fresh_namespace
from kubernetes import client
from kubernetes.client.rest import ApiException
from scheduling_helpers import (
    SCHEDULER,
    GangWatch,
    create_pod,
    events_about,
    wait_bound,
    wait_event,
)

from gpulab.framework.objects import GPU, make_pod
from gpulab.schedulerplugins import apis
from gpulab.wait import WaitTimeout, wait_for
from harness.backends import SYSTEM_NAMESPACE, pod_ready

T4 = {"gpulab.io/gpu-profile": "t4-x4"}
PLUGINS_ROLE = "gpulab-scheduler-plugins"  # manifests/scheduling/rbac.yaml
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(scheduling_e2e: Cluster) -> Cluster:
    return scheduling_e2e


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "gang") as name:
        yield name


def create_group(api: client.ApiClient, ns: str, name: str, members: int, **kw: Any) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        ns,
        apis.PODGROUPS.plural,
        apis.pod_group(name, ns, members, **kw),
    )


def worker(ns: str, group: str, i: int, scheduler: str = SCHEDULER) -> Obj:
    return make_pod(
        f"{group}-{i}",
        ns,
        requests={GPU: 2},
        scheduler=scheduler,
        node_selector=T4,
        labels={apis.POD_GROUP_LABEL: group},
    )


def blocker(api: client.ApiClient, ns: str) -> None:
    """2 of gpu-t4-0's GPUs taken by a pod of the default scheduler: 3 workers fit."""
    create_pod(
        api,
        make_pod(
            "blocker", ns, requests={GPU: 2}, node_selector={"kubernetes.io/hostname": "gpu-t4-0"}
        ),
    )
    wait_bound(api, ns, "blocker")


def permit_waits(api: client.ApiClient, ns: str, names: list[str]) -> set[str]:
    """The pods whose trace shows Coscheduling asked them to wait at Permit."""
    return {
        n
        for n in names
        if any("Coscheduling: Wait" in e["message"] for e in events_about(api, ns, n, "Permit"))
    }


def rejected(api: client.ApiClient, ns: str, names: list[str], why: tuple[str, ...]) -> set[str]:
    return {
        n
        for n in names
        if any(w in e["message"] for e in events_about(api, ns, n, "FailedScheduling") for w in why)
    }


def test_gang_waits_at_permit_times_out_whole_then_binds_whole(cluster: Cluster, ns: str) -> None:
    api = cluster.api
    blocker(api, ns)
    names = [f"train-{i}" for i in range(4)]
    with GangWatch(api, ns, {"train": 4}) as watch:
        create_group(api, ns, "train", 4, schedule_timeout_seconds=6)
        for i in range(4):
            create_pod(api, worker(ns, "train", i))
        # three fit and wait at Permit, holding their GPUs; the fourth fits nowhere
        wait_for(lambda: len(permit_waits(api, ns, names)) >= 3, 30, "3 workers waiting at Permit")
        assert watch.count("train") == 0
        # each waiting worker is nominated to its node (NominatedNodeNameForExpectation)
        waiting = permit_waits(api, ns, names)
        wait_for(
            lambda: all(watch.nominated.get(n, [""])[-1].startswith("gpu-t4-") for n in waiting),
            30,
            "the waiting workers' nominatedNodeName",
        )
        # after the group's 6 s timeout every waiting worker is rejected together
        wait_for(
            lambda: len(rejected(api, ns, names, ("timeout", "rejection in Unreserve"))) >= 3,
            30,
            "the waiting workers to be rejected after the timeout",
        )
        assert watch.count("train") == 0
        # ... and the rejection cleared each nomination (a later attempt may set it again)
        wait_for(
            lambda: all("" in watch.nominated[n][2:] for n in waiting),
            30,
            "the rejected workers' nominatedNodeName to be cleared",
        )
        # a node frees up: all four bind at once
        client.CoreV1Api(api).delete_namespaced_pod("blocker", ns, grace_period_seconds=0)
        wait_gang(api, ns, "train", lambda: watch.count("train") == 4)
        watch.assert_never_partial()
    pg = client.CustomObjectsApi(api).get_namespaced_custom_object(
        apis.GROUP, apis.VERSION, ns, apis.PODGROUPS.plural, "train"
    )
    assert pg["status"]["phase"] in ("Scheduling", "Running")
    wait_for(
        lambda: (
            client.CustomObjectsApi(api)
            .get_namespaced_custom_object(
                apis.GROUP, apis.VERSION, ns, apis.PODGROUPS.plural, "train"
            )["status"]
            .get("phase")
            == "Running"
        ),
        30,
        "PodGroup train Running",
    )


def test_two_gangs_that_fit_only_alone_do_not_deadlock(cluster: Cluster, ns: str) -> None:
    api = cluster.api
    core = client.CoreV1Api(api)
    # positive control: without gang scheduling the same pods deadlock - the default
    # scheduler binds whatever fits, each job gets half its workers, and the watch that
    # guards the real run below reports it
    with GangWatch(api, ns, {"x": 4, "y": 4}) as control:
        for i in range(4):
            for group in ("x", "y"):
                create_pod(api, worker(ns, group, i, scheduler="default-scheduler"))
        wait_for(
            lambda: control.count("x") + control.count("y") == 4,
            30,
            "the default scheduler to fill both T4 nodes",
        )
        assert (control.count("x"), control.count("y")) == (2, 2)
        wait_for(
            lambda: control.partial_spans("x") and control.partial_spans("y"),
            15,
            "the watch to flag both half-bound jobs",
        )
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 60, "the control pods to go")

    with GangWatch(api, ns, {"a": 4, "b": 4}) as watch:
        create_group(api, ns, "a", 4, schedule_timeout_seconds=30)
        create_group(api, ns, "b", 4, schedule_timeout_seconds=30)
        for i in range(4):  # interleaved, as two jobs submitted at the same time
            create_pod(api, worker(ns, "a", i))
            create_pod(api, worker(ns, "b", i))
        wait_for(
            lambda: {watch.count("a"), watch.count("b")} == {0, 4},
            60,
            "one gang bound whole, the other not at all",
        )
        first = "a" if watch.count("a") == 4 else "b"
        second = "b" if first == "a" else "a"
        with pytest.raises(WaitTimeout):  # the second must not get a single pod meanwhile
            wait_for(lambda: watch.count(second) > 0, 5, f"a pod of gang {second} bound")
        for i in range(4):
            core.delete_namespaced_pod(f"{first}-{i}", ns, grace_period_seconds=0)
        wait_gang(api, ns, second, lambda: watch.count(second) == 4)
        watch.assert_never_partial()


def wait_gang(api: client.ApiClient, ns: str, group: str, whole: Callable[[], bool]) -> None:
    """Wait for ``group`` to bind whole now that its GPUs are free. If every worker was last
    rejected by Coscheduling (its Permit timeout), a pod's deletion is no event Coscheduling
    registers, so upstream too leaves them in unschedulablePods until
    podMaxInUnschedulablePodsDuration (5 min). A PodGroup update is one
    (demos/coscheduling.py wake_if_stuck says so on screen)."""
    try:
        wait_for(whole, 20, f"gang {group} bound whole")
        return
    except WaitTimeout:
        pass
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        ns,
        apis.PODGROUPS.plural,
        group,
        {"metadata": {"annotations": {"test.gpulab.io/nudge": str(time.time())}}},
    )
    wait_for(whole, 60, f"gang {group} bound whole")


def test_bad_input_is_refused_or_reported_and_scheduling_goes_on(cluster: Cluster, ns: str) -> None:
    api = cluster.api
    for bad in (0, -1):
        with pytest.raises(ApiException) as err:
            create_group(api, ns, f"bad{bad + 1}", bad)
        assert err.value.status == 422
        assert "spec.minMember" in err.value.body and "greater than or equal to 1" in err.value.body
    orphan = make_pod("orphan", ns, scheduler=SCHEDULER, labels={apis.POD_GROUP_LABEL: "nope"})
    create_pod(api, orphan)
    event = wait_event(api, ns, "orphan", "FailedScheduling")
    assert event["message"] == "0/1 nodes are available: 1 PodGroup not found."
    # the scheduler keeps scheduling the others
    create_pod(api, make_pod("plain", ns, scheduler=SCHEDULER, requests={"cpu": "1"}))
    wait_bound(api, ns, "plain")
    # the group appears: its PodGroup Add event requeues the orphan, which binds
    create_group(api, ns, "nope", 1)
    wait_bound(api, ns, "orphan")
    # a group without minMember is every pod for itself: the controller says so
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        ns,
        apis.PODGROUPS.plural,
        {
            "apiVersion": apis.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": "unset", "namespace": ns},
            "spec": {},
        },
    )
    ev = wait_event(api, ns, "unset", "MinMemberNotSet")
    assert "set minMember >= 1" in ev["message"]


def test_restarts_of_the_scheduler_and_the_api_server_never_bind_a_partial_gang(
    cluster: Cluster, ns: str
) -> None:
    api = cluster.api
    local = cluster.local
    blocker(api, ns)
    names = [f"job-{i}" for i in range(4)]
    with GangWatch(api, ns, {"job": 4}) as watch:
        create_group(api, ns, "job", 4, schedule_timeout_seconds=60)
        for i in range(4):
            create_pod(api, worker(ns, "job", i))
        wait_for(lambda: len(permit_waits(api, ns, names)) >= 3, 30, "3 workers at Permit")
        # the scheduler dies with 3 pods waiting: nothing was bound, nothing may be
        local.restart(SCHEDULER)  # its pod deleted: the Deployment starts a new one
        local.restart_process("kube-apiserver")
        local.wait_http(f"{local.server}/readyz", "kube-apiserver")
        assert watch.count("job") == 0
        client.CoreV1Api(api).delete_namespaced_pod("blocker", ns, grace_period_seconds=0)
        wait_for(lambda: watch.count("job") == 4, 90, "all 4 workers bound after the restarts")
        watch.assert_never_partial()


def test_a_verb_cut_from_the_schedulers_role_is_a_403_and_a_pod_that_is_not_ready(
    cluster: Cluster,
) -> None:
    """RBAC of manifests/ is enforced on the local backend too: the scheduler pod talks as
    its ServiceAccount. Without `list` on PodGroups a new gpulab-scheduler pod logs the
    403 and stays not Ready (kube-scheduler waits for every cache); restoring the
    ClusterRole makes that same pod Ready."""
    api = cluster.api
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    rules = api.sanitize_for_serialization(rbac.read_cluster_role(PLUGINS_ROLE))["rules"]
    cut = [
        {**r, "verbs": [v for v in r["verbs"] if v != "list"]}
        if "podgroups" in r["resources"]
        else r
        for r in rules
    ]
    assert cut != rules
    old = {p.metadata.uid for p in cluster.backend.component_pods(SCHEDULER)}

    def new_pod() -> client.V1Pod | None:
        pods = cluster.backend.component_pods(SCHEDULER)
        return next((p for p in pods if p.metadata.uid not in old), None)

    def log_of(pod: client.V1Pod) -> str:
        try:
            return core.read_namespaced_pod_log(pod.metadata.name, SYSTEM_NAMESPACE) or ""
        except ApiException:  # no log file before the process starts
            return ""

    rbac.patch_cluster_role(PLUGINS_ROLE, {"rules": cut})
    try:
        for pod in cluster.backend.component_pods(SCHEDULER):
            core.delete_namespaced_pod(pod.metadata.name, SYSTEM_NAMESPACE)

        def waiting() -> client.V1Pod | None:
            pod = new_pod()
            log = log_of(pod) if pod else ""
            if "403 Forbidden" in log and "waiting for caches to sync: podgroups" in log:
                return pod
            return None

        pod = wait_for(waiting, 90, "the new scheduler pod to log the 403 and wait for caches")
        pod = core.read_namespaced_pod(pod.metadata.name, SYSTEM_NAMESPACE)
        assert pod.status.phase == "Running" and not pod_ready(pod)
        assert pod.status.container_statuses[0].restart_count == 0  # not ready, not crashing
    finally:
        rbac.patch_cluster_role(PLUGINS_ROLE, {"rules": rules})
    ready = wait_for(
        lambda: (p := new_pod()) and pod_ready(p) and p, 60, "the scheduler Ready again"
    )
    assert ready.metadata.uid == pod.metadata.uid  # the same pod recovered, no restart

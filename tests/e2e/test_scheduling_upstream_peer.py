"""Cross-check with upstream's own plugins: scheduler-plugins v0.35.4-devel's kube-scheduler
(built from its Go module on first use, then cached) runs next to gpulab-scheduler with
the same profile (Coscheduling + NodeResourceTopologyMatch), reading the same
NodeResourceTopology objects and PodGroups.

- NUMA: for each pod, the nodes upstream's Filter plugins pass (read through a
  recording extender, which then rejects them so upstream binds nothing) must be the ones
  gpulab-scheduler's pass; when none does, both FailedScheduling messages start alike.
  Pods gpulab-scheduler binds change the zones (the node agent allocates, the updaters
  publish), so later pods meet fuller zones.
- Coscheduling: a pod naming a PodGroup that does not exist gets the same Permit
  rejection from both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Cluster, fresh_namespace
from kubernetes import client
from scheduling_helpers import (
    RECORDED,
    SCHEDULER,
    RecordingExtender,
    create_pod,
    events_about,
    read_pod,
    start_peer_scheduler,
    wait_bound,
)

from gpulab.framework.objects import GPU, make_pod
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT
from gpulab.schedulerplugins import apis
from gpulab.wait import wait_for
from harness import binaries
from harness.addons.scheduling import profile_config

PEER = "upstream-scheduler-plugins"
GPU_NODES = ("gpu-a100", "gpu-h100", "gpu-t4-0", "gpu-t4-1")
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(scheduling_e2e: Cluster) -> Cluster:
    return scheduling_e2e


@pytest.fixture(scope="module")
def upstream(cluster: Cluster) -> Iterator[RecordingExtender]:
    binary = binaries.peer_binary(
        binaries.SCHEDULER_PLUGINS, "scheduler-plugins-kube-scheduler", print
    )
    ext = RecordingExtender()
    config = profile_config()  # gpulab-scheduler's own profile ...
    config["profiles"][0]["schedulerName"] = PEER  # ... under another name
    config["extenders"] = [
        {"urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": True, "weight": 1}
    ]
    # the cluster admin's identity: the plugins read PodGroups and NRTs
    start_peer_scheduler(cluster, PEER, binary, config, cluster.kubeconfig)
    yield ext
    cluster.local.stop_process(PEER, forget=True)  # the cluster lives on
    ext.server.shutdown()


def guaranteed(name: str, ns: str, gpus: int, cpus: int, **kw: Any) -> Obj:
    limits = {GPU: gpus, "cpu": cpus, "memory": "8Gi"}
    return make_pod(name, ns, requests=limits, limits=limits, **kw)


def two_containers(name: str, ns: str, **kw: Any) -> Obj:
    c = {"image": "x", "resources": {"requests": {GPU: "2"}, "limits": {GPU: "2"}}}
    return make_pod(name, ns, containers=[{"name": "a", **c}, {"name": "b", **c}], **kw)


def upstream_verdict(api: client.ApiClient, ext: RecordingExtender, pod: Obj) -> tuple[set, str]:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    create_pod(api, pod)

    def decided() -> tuple[set, str] | None:
        if f"{ns}/{name}" in ext.seen:
            return set(ext.seen[f"{ns}/{name}"]), ""
        for ev in events_about(api, ns, name, "FailedScheduling"):
            if RECORDED not in ev["message"]:
                return set(), ev["message"]
        return None

    verdict = wait_for(decided, 60, f"upstream's verdict on {name}")
    client.CoreV1Api(api).delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: read_pod(api, ns, name) is None, 30, f"{name} gone")
    return verdict


def our_verdict(api: client.ApiClient, pod: Obj) -> tuple[set, str]:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    create_pod(api, pod)

    def decided() -> tuple[set, str] | None:
        p = read_pod(api, ns, name)
        if p and p["spec"].get("nodeName"):
            result = json.loads(p["metadata"]["annotations"][FILTER_RESULT])
            return {n for n, r in result.items() if set(r.values()) == {"passed"}}, ""
        events = events_about(api, ns, name, "FailedScheduling")
        return (set(), events[-1]["message"]) if events else None

    return wait_for(decided, 60, f"gpulab-scheduler's verdict on {name}")


def nrt_version(api: client.ApiClient, node: str) -> str:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object(
        "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", node
    )
    return str(obj["metadata"]["resourceVersion"])


def settled(api: client.ApiClient, ns: str, name: str, before: dict[str, str]) -> None:
    """Wait until the pod is bound, the node agent allocated its GPUs and the node's
    topology updater published the zones without them (``before``: NRT versions from
    before the pod was created)."""
    node = wait_bound(api, ns, name)["spec"]["nodeName"]
    wait_for(
        lambda: any(
            k.startswith("gpulab.io/allocate-")
            for k in (read_pod(api, ns, name)["metadata"].get("annotations") or {})
        ),
        30,
        f"{name}'s GPUs allocated",
    )
    wait_for(lambda: nrt_version(api, node) != before[node], 30, f"{node}'s zones republished")


def test_numa_filter_agrees_with_upstream_node_resource_topology_match(
    cluster: Cluster, upstream: RecordingExtender
) -> None:
    api = cluster.api
    with fresh_namespace(api, "peer") as ns:
        steps = [  # each bound by gpulab-scheduler after the comparison (if it fits)
            ("g1", lambda n, s: guaranteed(n, ns, 4, 12, scheduler=s)),  # a100 NUMA 0
            ("g2", lambda n, s: guaranteed(n, ns, 4, 12, scheduler=s)),  # a100 NUMA 1
            ("split", lambda n, s: two_containers(n, ns, scheduler=s)),  # 2+2 on two zones
            (
                "burstable3",
                lambda n, s: make_pod(n, ns, requests={GPU: 3, "cpu": "12"}, scheduler=s),
            ),  # h100: pool CPUs
            ("g3", lambda n, s: guaranteed(n, ns, 4, 12, scheduler=s)),  # fits nowhere now
        ]
        seen: dict[str, set] = {}
        for name, build in steps:
            theirs, their_msg = upstream_verdict(api, upstream, build(f"u-{name}", PEER))
            before = {n: nrt_version(api, n) for n in GPU_NODES}
            ours, our_msg = our_verdict(api, build(name, SCHEDULER))
            assert theirs == ours, f"{name}: upstream {sorted(theirs)}, ours {sorted(ours)}"
            if not ours:
                fit_error = our_msg.removesuffix(" can not find pod group")
                assert their_msg.startswith(fit_error), (their_msg, our_msg)
            else:
                settled(api, ns, name, before)
            seen[name] = ours
        assert seen["g1"] == {"gpu-a100"} and seen["g2"] == {"gpu-a100"}
        assert "gpu-t4-0" in seen["split"] and not seen["g3"]


def test_a_missing_podgroup_is_rejected_at_permit_by_both(
    cluster: Cluster, upstream: RecordingExtender
) -> None:
    api = cluster.api
    upstream.fail = False  # let upstream get past Filter to Permit
    try:
        with fresh_namespace(api, "peer-pg") as ns:
            messages = []
            for name, scheduler in (("theirs", PEER), ("ours", SCHEDULER)):
                create_pod(
                    api,
                    make_pod(
                        name, ns, scheduler=scheduler, labels={apis.POD_GROUP_LABEL: "missing"}
                    ),
                )
                ev = wait_for(
                    lambda n=name: (
                        (evs := events_about(api, ns, n, "FailedScheduling")) and evs[-1]
                    ),
                    60,
                    f"FailedScheduling of {name}",
                )
                messages.append(ev["message"])
            assert messages[0] == messages[1] == "0/1 nodes are available: 1 PodGroup not found."
    finally:
        upstream.fail = True

"""Cross-check: gpulab-scheduler finds the same feasible nodes as the real kube-scheduler
v1.36.3, on the same cluster, for a mixed set of pods that use neither Coscheduling nor a
NUMA constraint (no pod group; each fits one NUMA zone wherever it fits the node, so
NodeResourceTopologyMatch agrees with NodeResourcesFit).

The real scheduler's feasible set is read the one way it reveals it: a second
kube-scheduler (profile ``crosscheck-scheduler``) with a scheduler extender - an HTTP
server in this test - that receives exactly the nodes that passed kube-scheduler's Filter
plugins (ExtenderArgs.NodeNames) and records them, failing them all so nothing binds.
gpulab-scheduler's set comes from the filter-result it writes on the pods it binds. When
no node fits, both schedulers' FailedScheduling messages must agree ("0/5 nodes are
available: ..."; then each appends what its PostFilter plugins say - kube-scheduler's
preemption, gpulab-scheduler's Coscheduling "can not find pod group").
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
    delete_pods,
    events_about,
    read_pod,
    start_peer_scheduler,
    wait_bound,
)

from gpulab.framework.objects import GPU, make_pod
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT
from gpulab.wait import wait_for
from harness import binaries

PEER = "crosscheck-scheduler"
OUR_POST_FILTER = " can not find pod group"  # Coscheduling's PostFilter, for a pod of no group
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(scheduling_e2e: Cluster) -> Cluster:
    return scheduling_e2e


@pytest.fixture(scope="module")
def extender(cluster: Cluster) -> Iterator[RecordingExtender]:
    """The recording extender and the real kube-scheduler that calls it."""
    ext = RecordingExtender()
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": PEER}],
        "extenders": [
            {"urlPrefix": ext.url, "filterVerb": "filter", "nodeCacheCapable": True, "weight": 1}
        ],
    }
    kubeconfig = cluster.local.dir / "scheduler.kubeconfig"
    start_peer_scheduler(cluster, PEER, binaries.binary("kube-scheduler"), config, kubeconfig)
    yield ext
    cluster.local.stop_process(PEER, forget=True)  # the cluster lives on
    ext.server.shutdown()


@pytest.fixture(scope="module")
def varied_nodes(cluster: Cluster) -> Iterator[None]:
    """Taints, a cordon and labels to give the filters something to do; undone after."""
    core = client.CoreV1Api(cluster.api)
    patches = {
        "gpu-t4-1": {
            "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}
        },
        "cpu-only": {"spec": {"unschedulable": True}},
        "gpu-a100": {"metadata": {"labels": {"gpulab.io/cpus": "64"}}},
        "gpu-h100": {"metadata": {"labels": {"gpulab.io/cpus": "16", "tier": "gold"}}},
    }
    for node, body in patches.items():
        core.patch_node(node, body)
    yield
    core.patch_node("gpu-t4-1", {"spec": {"taints": None}})
    core.patch_node("cpu-only", {"spec": {"unschedulable": None}})
    for node in ("gpu-a100", "gpu-h100"):
        core.patch_node(node, {"metadata": {"labels": {"gpulab.io/cpus": None, "tier": None}}})


def affinity(*exprs: Obj, fields: tuple[Obj, ...] = ()) -> Obj:
    term: Obj = {}
    if exprs:
        term["matchExpressions"] = list(exprs)
    if fields:
        term["matchFields"] = list(fields)
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


T4 = {"gpulab.io/gpu-profile": "t4-x4"}
TOLERATE_ML = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
CASES: dict[str, dict[str, Any]] = {
    "gpu-1": {"requests": {GPU: 1}},
    "gpu-2-on-t4": {"requests": {GPU: 2}, "node_selector": T4},
    "gpu-2-on-t4-tolerating": {
        "requests": {GPU: 2},
        "node_selector": T4,
        "tolerations": TOLERATE_ML,
    },
    "not-on-a100": {
        "requests": {GPU: 1},
        "affinity": affinity(
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a100"]}
        ),
    },
    "more-than-32-cpus": {
        "requests": {"cpu": "1"},
        "affinity": affinity({"key": "gpulab.io/cpus", "operator": "Gt", "values": ["32"]}),
    },
    "gold-tier-exists": {"affinity": affinity({"key": "tier", "operator": "Exists"})},
    "big-cpu": {"requests": {"cpu": "40"}},
    "huge-memory": {"requests": {"memory": "300Gi"}},
    "tolerates-cordon": {
        "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    },
    "pinned-by-field": {
        "requests": {GPU: 1},
        "affinity": affinity(
            fields=({"key": "metadata.name", "operator": "In", "values": ["gpu-h100"]},)
        ),
    },
    "three-gpus-and-cpus": {"requests": {GPU: 3, "cpu": "20"}},
    "init-container-cpu": {
        "init_containers": [
            {"name": "init", "image": "x", "resources": {"requests": {"cpu": "50"}}}
        ],
        "requests": {"cpu": "1"},
    },
    # no node fits these: the FailedScheduling messages must agree
    "sixteen-gpus": {"requests": {GPU: 16}},
    "no-such-label": {"node_selector": {"gpulab.io/nope": "x"}},
    "gpu-3-on-t4-untolerated": {"requests": {GPU: 3}, "node_selector": T4},
}


def peer_verdict(
    api: client.ApiClient, ext: RecordingExtender, ns: str, name: str, spec: dict[str, Any]
) -> tuple[set[str], str]:
    """kube-scheduler's feasible nodes (via the extender) or its FailedScheduling message."""
    create_pod(api, make_pod(name, ns, scheduler=PEER, **spec))
    key = f"{ns}/{name}"

    def decided() -> tuple[set[str], str] | None:
        if key in ext.seen:
            return set(ext.seen[key]), ""
        for ev in events_about(api, ns, name, "FailedScheduling"):
            if RECORDED not in ev["message"]:
                return set(), ev["message"]
        return None

    return wait_for(decided, 30, f"kube-scheduler's verdict on {key}")


def gpulab_verdict(
    api: client.ApiClient, ns: str, name: str, spec: dict[str, Any]
) -> tuple[set[str], str]:
    create_pod(api, make_pod(name, ns, scheduler=SCHEDULER, **spec))

    def decided() -> tuple[set[str], str] | None:
        pod = read_pod(api, ns, name)
        if pod and pod["spec"].get("nodeName"):
            result = json.loads(pod["metadata"]["annotations"][FILTER_RESULT])
            return {n for n, r in result.items() if set(r.values()) == {"passed"}}, ""
        events = events_about(api, ns, name, "FailedScheduling")
        return (set(), events[-1]["message"]) if events else None

    return wait_for(decided, 30, f"gpulab-scheduler's verdict on {ns}/{name}")


def test_feasible_nodes_match_kube_scheduler(
    cluster: Cluster, extender: RecordingExtender, varied_nodes: None
) -> None:
    api = cluster.api
    mismatches = []
    with fresh_namespace(api, "crosscheck") as ns:
        # a pod the default scheduler binds first: 2 of gpu-t4-0's 4 GPUs are in use
        filler = make_pod(
            "filler", ns, requests={GPU: 2}, node_selector={"kubernetes.io/hostname": "gpu-t4-0"}
        )
        create_pod(api, filler)
        wait_bound(api, ns, "filler")
        verdicts: dict[str, set[str]] = {}
        for i, (case, spec) in enumerate(CASES.items()):
            kube_nodes, kube_msg = peer_verdict(api, extender, ns, f"k{i}-{case}", spec)
            client.CoreV1Api(api).delete_namespaced_pod(f"k{i}-{case}", ns, grace_period_seconds=0)
            wait_for(lambda n=f"k{i}-{case}": read_pod(api, ns, n) is None, 30, "peer pod gone")
            ours_nodes, ours_msg = gpulab_verdict(api, ns, f"g{i}-{case}", spec)
            client.CoreV1Api(api).delete_namespaced_pod(f"g{i}-{case}", ns, grace_period_seconds=0)
            wait_for(lambda n=f"g{i}-{case}": read_pod(api, ns, n) is None, 30, "our pod gone")
            if kube_nodes != ours_nodes:
                mismatches.append(
                    f"{case}: kube-scheduler {sorted(kube_nodes)}, "
                    f"gpulab-scheduler {sorted(ours_nodes)}"
                )
            verdicts[case] = kube_nodes
            fit_error = ours_msg.removesuffix(OUR_POST_FILTER)
            if not kube_nodes and not (ours_msg and kube_msg.startswith(fit_error)):
                mismatches.append(
                    f"{case}: kube-scheduler {kube_msg!r}, gpulab-scheduler {ours_msg!r}"
                )
        delete_pods(api, ns)
    assert not mismatches, "\n".join(mismatches)
    # the set exercised every filter: taint, cordon, selector, affinity, resources
    assert verdicts["not-on-a100"] == {"gpu-h100", "gpu-t4-0"}
    assert verdicts["gpu-2-on-t4-tolerating"] == {"gpu-t4-0", "gpu-t4-1"}
    assert verdicts["tolerates-cordon"] == {"cpu-only", "gpu-a100", "gpu-h100", "gpu-t4-0"}
    assert verdicts["three-gpus-and-cpus"] == {"gpu-a100"}
    assert verdicts["gpu-2-on-t4"] == {"gpu-t4-0"}
    assert [c for c, nodes in verdicts.items() if not nodes] == [
        "sixteen-gpus",
        "no-such-label",
        "gpu-3-on-t4-untolerated",
    ]

"""Cross-check: gpulab-scheduler finds the same feasible nodes as the real kube-scheduler
v1.36.3, on the same cluster, for a mixed set of pods that use neither Coscheduling nor a
NUMA constraint (no pod group; each fits one NUMA zone wherever it fits the node, so
NodeResourceTopologyMatch agrees with NodeResourcesFit) - and, where the scores decide,
picks the same node.

The real scheduler's feasible set is read the one way it reveals it: a second
kube-scheduler (profile ``crosscheck-scheduler``) with a scheduler extender - an HTTP
server in this test - that receives exactly the nodes that passed kube-scheduler's Filter
plugins (ExtenderArgs.NodeNames) and records them, failing them all so nothing binds.
gpulab-scheduler's set comes from the filter-result it writes on the pods it binds. When
no node fits, both schedulers' FailedScheduling messages must agree ("0/5 nodes are
available: ..."; then each appends what its PostFilter plugins say - kube-scheduler's
preemption, gpulab-scheduler's Coscheduling "can not find pod group").

The chosen node is read without binding anything, so every pod meets the same cluster:
kube-scheduler's through the extender's /bind (the extender records the node and refuses
the Binding); gpulab-scheduler's from ``status.nominatedNodeName`` of a pod waiting at
Permit for a sibling that never comes (a PodGroup of 2 whose other pod fits nowhere).
Those pods are Burstable, so NodeResourceTopologyMatch scores every node alike and both
profiles score with the default plugins - NodeResourcesFit, NodeResourcesBalancedAllocation,
PodTopologySpread (system defaults through a Service, and explicit constraints),
TaintToleration, NodeAffinity, ImageLocality. Only pods whose best total is unique in
gpulab-scheduler's Score step are compared (with an extender kube-scheduler breaks ties
at random); the cases are built so that each is unique, and the Score step names the
plugins that decided.
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
    wait_event,
)

from gpulab.framework.objects import GPU, make_pod
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT
from gpulab.schedulerplugins import apis
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
            {
                "urlPrefix": ext.url,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "weight": 1,
            }
        ],
    }
    kubeconfig = cluster.local.dir / "scheduler.kubeconfig"
    start_peer_scheduler(cluster, PEER, binaries.binary("kube-scheduler"), config, kubeconfig)
    yield ext
    cluster.local.stop_process(PEER, forget=True)  # the cluster lives on
    ext.server.shutdown()


@pytest.fixture
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


# -- the chosen node, where the scores decide ----------------------------------------------

ZONES = {
    "gpu-a100": "zone-a",
    "gpu-t4-0": "zone-a",
    "gpu-h100": "zone-b",
    "gpu-t4-1": "zone-b",
    "cpu-only": "zone-b",
}
ZONE = "topology.kubernetes.io/zone"
WEB = {"app": "web"}
FILLERS: dict[str, dict[str, Any]] = {  # bound by nodeName: the usage the scores read
    "cpu-heavy": {"node_name": "gpu-t4-0", "requests": {"cpu": "32"}},
    "memory-heavy": {"node_name": "gpu-t4-1", "requests": {"memory": "256Gi"}},
    "busy-cpu-only": {"node_name": "cpu-only", "requests": {"cpu": "32"}},
    "web-1": {"node_name": "gpu-a100", "labels": WEB, "requests": {"cpu": "100m"}},
    "web-2": {"node_name": "gpu-a100", "labels": WEB, "requests": {"cpu": "100m"}},
    "web-3": {"node_name": "gpu-h100", "labels": WEB, "requests": {"cpu": "100m"}},
}
A100_OR_CPU_ONLY = affinity(
    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a100", "cpu-only"]}
)
SCORED: dict[str, dict[str, Any]] = {
    # the two T4 nodes, one half full of cpu, one of memory: NodeResourcesFit nearly ties,
    # NodeResourcesBalancedAllocation prefers the node the pod evens out
    "cpu-hungry-on-t4": {"requests": {"cpu": "16", "memory": "8Gi"}, "node_selector": T4},
    "memory-hungry-on-t4": {"requests": {"cpu": "1", "memory": "128Gi"}, "node_selector": T4},
    # a web pod (the Service selects it): PodTopologySpread's system defaults outweigh
    # the free cpu that makes NodeResourcesFit prefer gpu-a100, which holds two web pods
    "web-spread": {"labels": WEB, "requests": {"cpu": "1"}, "affinity": A100_OR_CPU_ONLY},
    # explicit soft constraints: spread over zones, counting only the nodes the pod may
    # go to (nodeAffinityPolicy Honor): zone-a's gpu-a100 holds 2 web pods, zone-b's
    # gpu-h100 1 - and gpu-a100 has the more free cpu
    "web-by-zone": {
        "labels": WEB,
        "requests": {"cpu": "1"},
        "affinity": affinity(
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a100", "gpu-h100"]}
        ),
        "topology_spread": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": WEB},
            }
        ],
    },
    # plain least-allocated choices
    "gpu-2": {"requests": {GPU: 2, "cpu": "2"}},
    "cpu-8": {"requests": {"cpu": "8", "memory": "16Gi"}},
}


def scored_pod(name: str, ns: str, scheduler: str, spec: dict[str, Any], **extra: Any) -> Obj:
    spec = dict(spec)
    spread = spec.pop("topology_spread", None)
    labels = {**spec.pop("labels", {}), **extra.pop("labels", {})}
    pod = make_pod(name, ns, scheduler=scheduler, labels=labels or None, **spec, **extra)
    if spread:
        pod["spec"]["topologySpreadConstraints"] = spread
    return pod


def peer_choice(
    api: client.ApiClient, ext: RecordingExtender, ns: str, name: str, spec: Obj
) -> str:
    create_pod(api, scored_pod(name, ns, PEER, spec))
    node = wait_for(
        lambda: ext.chosen.get(f"{ns}/{name}"), 30, f"kube-scheduler's choice for {name}"
    )
    client.CoreV1Api(api).delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: read_pod(api, ns, name) is None, 30, f"{name} gone")
    return str(node)


def our_choice(api: client.ApiClient, ns: str, name: str, spec: Obj) -> tuple[str, str]:
    """gpulab-scheduler's node for the pod and its Score step, the pod waiting at Permit
    (nothing is bound)."""
    group = f"{name}-group"
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        apis.GROUP,
        apis.VERSION,
        ns,
        apis.PODGROUPS.plural,
        apis.pod_group(group, ns, 2, schedule_timeout_seconds=300),
    )
    member = {apis.POD_GROUP_LABEL: group}
    sibling = make_pod(
        f"{name}-never", ns, scheduler=SCHEDULER, labels=member, node_selector={"x": "nowhere"}
    )
    create_pod(api, sibling)
    create_pod(api, scored_pod(name, ns, SCHEDULER, spec, labels=member))
    node = wait_for(
        lambda: ((read_pod(api, ns, name) or {}).get("status") or {}).get("nominatedNodeName"),
        30,
        f"gpulab-scheduler's nominated node for {name}",
    )
    line = wait_event(api, ns, name, "Score")["message"]
    core = client.CoreV1Api(api)
    for pod in (name, sibling["metadata"]["name"]):
        core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        apis.GROUP, apis.VERSION, ns, apis.PODGROUPS.plural, group
    )
    wait_for(lambda: read_pod(api, ns, name) is None, 30, f"{name} gone")
    return str(node), line


def totals(score_line: str) -> dict[str, int]:
    """The node totals of a Score step: "a wins: a=478, b=473; against b: ..."."""
    head = score_line.split(" wins: ", 1)[1].split("; against ", 1)[0]
    return {n: int(v) for n, v in (item.split("=") for item in head.split(", "))}


def deciders(score_line: str) -> set[str]:
    """The plugins that scored the winner above the runner-up."""
    against = score_line.split("; against ", 1)[1].split(": ", 1)[1]
    out = set()
    for part in against.split(", "):
        plugin, mine, _, theirs = part.split(" ")
        if int(mine) > int(theirs):
            out.add(plugin)
    return out


@pytest.fixture
def zoned_nodes(cluster: Cluster) -> Iterator[None]:
    core = client.CoreV1Api(cluster.api)
    for node, zone in ZONES.items():
        core.patch_node(node, {"metadata": {"labels": {ZONE: zone}}})
    yield
    for node in ZONES:
        core.patch_node(node, {"metadata": {"labels": {ZONE: None}}})


def test_chosen_node_matches_kube_scheduler_where_scores_decide(
    cluster: Cluster, extender: RecordingExtender, zoned_nodes: None
) -> None:
    api = cluster.api
    core = client.CoreV1Api(api)
    extender.fail = False  # let kube-scheduler choose: its /bind records and refuses
    try:
        with fresh_namespace(api, "scores") as ns:
            for name, spec in FILLERS.items():
                create_pod(api, make_pod(name, ns, **spec))
            wait_for(
                lambda: all(
                    (read_pod(api, ns, n) or {}).get("status", {}).get("phase") == "Running"
                    for n in FILLERS
                ),
                60,
                "the fillers running",
            )
            service = client.V1Service(
                metadata=client.V1ObjectMeta(name="web"),
                spec=client.V1ServiceSpec(selector=WEB, ports=[client.V1ServicePort(port=80)]),
            )
            core.create_namespaced_service(ns, service)
            results: dict[str, tuple[str, str, str]] = {}
            for i, (case, spec) in enumerate(SCORED.items()):
                theirs = peer_choice(api, extender, ns, f"k{i}-{case}", spec)
                ours, line = our_choice(api, ns, f"g{i}-{case}", spec)
                results[case] = (theirs, ours, line)
            delete_pods(api, ns)
    finally:
        extender.fail = True
    lines = "\n".join(
        f"{c}: kube-scheduler {t}, gpulab-scheduler {o} ({ln})" for c, (t, o, ln) in results.items()
    )
    for case, (_, _, line) in results.items():
        best = max(totals(line).values())
        assert list(totals(line).values()).count(best) == 1, (
            f"{case}: a tie, not comparable\n{lines}"
        )
    assert all(theirs == ours for theirs, ours, _ in results.values()), lines
    # the scorers the lab added are what decided these
    assert "NodeResourcesBalancedAllocation" in deciders(results["cpu-hungry-on-t4"][2]), lines
    assert "NodeResourcesBalancedAllocation" in deciders(results["memory-hungry-on-t4"][2]), lines
    assert "PodTopologySpread" in deciders(results["web-spread"][2]), lines
    assert "NodeResourcesFit" not in deciders(results["web-spread"][2]), lines
    assert "PodTopologySpread" in deciders(results["web-by-zone"][2]), lines

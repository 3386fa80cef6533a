"""gpulab/diagnose/chain.py on recorded object sets: the fixtures are what `gpulab diagnose
--save` read from the labs cluster (harness/clusters/labs.yaml) in each lab's broken state
and after its fix; the synthetic sets below cover links no lab breaks on that cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpulab.diagnose.chain import BROKEN, OK, diagnose, selector_matches, webhook_answers
from gpulab.diagnose.commands import parse_target
from gpulab.diagnose.objects import ObjectSet, Target
from gpulab.errors import CLIError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "diagnose"


def load(name: str) -> ObjectSet:
    return ObjectSet.load(FIXTURES / f"{name}.json")


# (fixture, the first broken link, words its summary must hold)
BROKEN_CASES = [
    ("unschedulable-big-trainer", "filter", ["asks 16 nvidia.com/gpu", "has 8"]),
    ("unschedulable-h100-job", "filter", ["tainted", "gpu-h100", "dedicated"]),
    ("unschedulable-v100-job", "filter", ["Tesla-V100-SXM2-16GB is on no node", "Tesla-T4"]),
    ("unschedulable-a100-job", "node", ["8 GPU(s) of gpu-a100 are Unhealthy", "Xid"]),
    ("unschedulable-vgpu-job", "filter", ["use-gputype=A100 matches no GPU type"]),
    ("device-plugin-inference-grace", "node", ["nvidia.com/gpu.shared=8 instead", "lab-shared"]),
    ("device-plugin-inference", "node", ["instead of nvidia.com/gpu", "capacity 0"]),
    ("device-plugin-trainer-grace", "node", ["not running: capacity 4, allocatable 0"]),
    ("device-plugin-trainer", "node", ["not running: capacity 0"]),
    ("gang-deadlock-train-a", "coscheduling", ["gang deadlock", "train-b holds 2 waiting"]),
    ("queue-quota-missing-flavor", "kueue", ["inactive", "spot-gpu does not exist"]),
    ("queue-quota-missing-clusterqueue", "kueue", ["names ClusterQueue lab-cq-b", "not exist"]),
    ("queue-quota-quota-changed", "kueue", ["below what its admitted Workloads hold"]),
    ("queue-quota-unqueued", "kueue", ["no kueue.x-k8s.io/queue-name label", "unqueued"]),
    ("mig-node-config", "mig", ["all-1g-10gb names no config", "default-mig-parted-config"]),
    ("mig-inference-config", "node", ["offers no nvidia.com/mig-1g.10gb", "names no config"]),
    ("mig-inference-strategy", "node", ["MIG strategy is single", "(1g.10gb) as nvidia.com/gpu"]),
    ("mig-batch-not-paused", "node", ["is not the GPU Operator's", "did not pause it"]),
    # the Volcano demo's job larger than its queue (make demo-volcano)
    ("volcano-too-big", "volcano", ["needs 8 nvidia.com/gpu", "capability 4"]),
    # lab-gang-deadlock-volcano (its own cluster, labs-volcano): the PodGroup, a running rank
    (
        "gang-deadlock-volcano-train-a",
        "volcano",
        ["2 of a 4-rank world", "master 1 + worker 3", "train-b (2/4)", "Insufficient nvidia"],
    ),
    ("gang-deadlock-volcano-rank", "volcano", ["2 rank(s) hold their GPUs", "train-a (2/4)"]),
]
# Running pods of the lab's fixed states and of each chapter's demo, on the demo's own
# cluster: default (cluster, device plugin with MIG, Kueue), hami, volcano
HEALTHY = sorted(p.stem for p in FIXTURES.glob("healthy-*.json"))


@pytest.mark.parametrize(("fixture", "link", "words"), BROKEN_CASES)
def test_each_lab_case_names_its_link(fixture: str, link: str, words: list[str]) -> None:
    report = diagnose(load(fixture))
    first = report.broken
    assert first is not None, report.answer()
    assert first.name == link, report.answer()
    for w in words:
        assert w in first.summary, first.summary
    assert first.fix
    assert report.answer().startswith(f"first broken link: {link}: ")


def test_the_xid_case_fixes_by_restarting_that_nodes_plugin() -> None:
    first = diagnose(load("unschedulable-a100-job")).broken
    assert first is not None
    assert "delete pod gpulab-device-plugin-" in first.fix
    assert sum("Unhealthy GPU-" in e for e in first.evidence) == 8


def test_the_scheduler_link_is_not_blamed_for_the_nodes_fault() -> None:
    links = {link.name: link for link in diagnose(load("unschedulable-a100-job")).links}
    assert links["scheduler"].state == OK
    assert links["filter"].state == "blocked"


def test_a_plugin_out_of_its_daemonset_names_the_missing_node_label() -> None:
    first = diagnose(load("device-plugin-trainer")).broken
    assert first is not None
    assert "kubectl label node gpu-dp-1 nvidia.com/gpu.present=true" in first.fix


def test_every_chapters_demo_has_a_healthy_fixture() -> None:
    assert {
        "healthy-demo-cluster",
        "healthy-demo-device-plugin",
        "healthy-demo-hami",
        "healthy-demo-kueue-a",
        "healthy-volcano-gang-worker",
        "healthy-mig-inference",  # GPU Operator: a MIG device of the operator's plugin
    } <= set(HEALTHY)


@pytest.mark.parametrize("fixture", HEALTHY)
def test_a_healthy_pod_has_no_broken_link(fixture: str) -> None:
    report = diagnose(load(fixture))
    assert report.broken is None, report.answer()
    assert report.answer().startswith("no broken link")
    assert {link.name for link in report.links} >= {"scheduler", "filter", "node", "kubelet"}


def test_the_healthy_pod_turns_broken_when_its_node_loses_its_gpus() -> None:
    """The healthy fixture with the node's allocatable cut: the same pod, unbound, is then
    blocked on the node (a positive control for the no-false-alarm test)."""
    objs = load("healthy-a100-job")
    pod = next(p for p in objs.pods if p["metadata"]["name"] == objs.target.name)
    pod["spec"].pop("nodeName")
    pod["status"] = {"phase": "Pending"}
    node = next(n for n in objs.nodes if n["metadata"]["name"] == "gpu-a100")
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    for p in objs.pods:
        if p is not pod and p["spec"].get("nodeName") == "gpu-a100":
            p["spec"].pop("nodeName")
    first = diagnose(objs).broken
    assert first is not None and first.name == "node"


def test_json_report_shape() -> None:
    data = diagnose(load("queue-quota-missing-flavor")).to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["broken"] == "kueue"
    assert data["target"]["kind"] == "workload"
    assert {"name", "state", "summary", "evidence", "fix"} <= set(data["links"][0])


# ---------------------------------------------------------------- synthetic object sets


def _pod(name: str = "p", ns: str = "ns", **spec: object) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": name, "labels": {"app": "x"}},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def _node(name: str, gpus: int = 4, **labels: str) -> dict:
    cap = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {
            "capacity": cap,
            "allocatable": dict(cap),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _hook(name: str, client_config: dict, policy: str = "Ignore") -> dict:
    return {
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.example.com",
                "clientConfig": client_config,
                "failurePolicy": policy,
                "rules": [{"operations": ["CREATE"], "resources": ["pods"]}],
                "objectSelector": {
                    "matchExpressions": [
                        {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
                    ]
                },
            }
        ],
    }


def test_a_webhook_whose_url_does_not_answer_breaks_admission() -> None:
    url = "https://127.9.0.1:443/webhook"
    objs = ObjectSet(
        Target("pod", "p", "ns"),
        pods=[_pod()],
        nodes=[_node("n")],
        mutating_webhooks=[_hook("vgpu", {"url": url})],
        probes={url: "no answer (Connection refused)"},
    )
    first = diagnose(objs).broken
    assert first is not None and first.name == "admission"
    assert "does not answer" in first.summary and "Connection refused" in first.summary
    objs.probes[url] = "ok"
    assert diagnose(objs).links[0].state == OK


def test_a_service_webhook_answers_when_a_ready_pod_backs_it() -> None:
    svc = {
        "metadata": {"name": "hami-scheduler", "namespace": "sys"},
        "spec": {"selector": {"app": "hami"}},
    }
    backend = {
        "metadata": {"name": "hami-0", "namespace": "sys", "labels": {"app": "hami"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    objs = ObjectSet(Target("pod", "p", "ns"), pods=[backend], services=[svc])
    hook = {"clientConfig": {"service": {"name": "hami-scheduler", "namespace": "sys"}}}
    assert webhook_answers(objs, hook)[0] is False
    backend["status"]["conditions"][0]["status"] = "True"
    assert webhook_answers(objs, hook) == (True, "Service sys/hami-scheduler -> hami-0 (Ready)")
    objs.services = []
    assert webhook_answers(objs, hook) == (False, "Service sys/hami-scheduler does not exist")


def test_label_selectors() -> None:
    sel = {
        "matchLabels": {"a": "1"},
        "matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}],
    }
    assert selector_matches(sel, {"a": "1"})
    assert not selector_matches(sel, {"a": "1", "hami.io/webhook": "ignore"})
    assert not selector_matches(sel, {"a": "2"})
    assert selector_matches(None, {})


def test_a_scheduler_nobody_runs() -> None:
    objs = ObjectSet(
        Target("pod", "p", "ns"), pods=[_pod(schedulerName="my-sched")], nodes=[_node("n")]
    )
    first = diagnose(objs).broken
    assert first is not None and first.name == "scheduler"
    assert "no scheduler named my-sched" in first.summary


def test_hami_filter_table_with_a_gputype_that_matches_nothing() -> None:
    """The HAMi extender's per-node record (HAMi v2.10.0 reasons, the lab's
    gpulab.io/filter-result) when nvidia.com/use-gputype names no registered type."""
    pod = _pod(schedulerName="hami-scheduler")
    pod["metadata"]["annotations"] = {
        "nvidia.com/use-gputype": "H200",
        "gpulab.io/filter-result": json.dumps(
            {
                "chosen": None,
                "nodePolicy": "binpack",
                "gpuPolicy": "spread",
                "nodes": [
                    {"node": "t4", "fit": False, "reason": "4/4 CardTypeMismatch"},
                    {"node": "a100", "fit": False, "reason": "8/8 CardTypeMismatch"},
                ],
            }
        ),
    }
    register = json.dumps([{"id": "GPU-1", "type": "NVIDIA-Tesla T4", "count": 10}])
    t4 = _node("t4")
    t4["metadata"]["annotations"] = {"hami.io/node-nvidia-register": register}
    event = {
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns"},
        "reason": "FailedScheduling",
        "reportingComponent": "hami-scheduler",
        "message": "0/2 nodes are available: 2 node(s) didn't fit.",
        "lastTimestamp": "2026-12-01T00:00:00Z",
    }
    objs = ObjectSet(
        Target("pod", "p", "ns"), pods=[pod], nodes=[t4, _node("a100", 8)], events=[event]
    )
    first = diagnose(objs).broken
    assert first is not None and first.name == "filter"
    assert "nvidia.com/use-gputype=H200 matches no GPU type" in first.summary
    assert "NVIDIA-Tesla T4" in first.fix


def _mig_node(config: str, state: str) -> dict:
    return _node(
        "mig",
        **{"nvidia.com/mig.config": config, "nvidia.com/mig.config.state": state},
    )


MIG_CONFIGMAP = {
    "metadata": {"name": "default-mig-parted-config", "namespace": "gpu-operator"},
    "data": {"config.yaml": "version: v1\nmig-configs:\n  all-disabled: []\n  all-1g.10gb: []\n"},
}


@pytest.mark.parametrize(
    ("config", "state", "link_state", "words"),
    [
        ("all-2g.20gb", "failed", BROKEN, "names no config"),
        ("all-1g.10gb", "failed", BROKEN, "failed to apply"),
        ("all-1g.10gb", "pending", "waiting", "applying"),
        ("all-1g.10gb", "success", OK, "success"),
    ],
)
def test_mig_config_state(config: str, state: str, link_state: str, words: str) -> None:
    objs = ObjectSet(
        Target("node", "mig"), nodes=[_mig_node(config, state)], configmaps=[MIG_CONFIGMAP]
    )
    mig = next(link for link in diagnose(objs).links if link.name == "mig")
    assert mig.state == link_state
    assert words in mig.summary


def test_a_cordoned_node_and_a_missing_object() -> None:
    node = _node("n")
    node["spec"]["unschedulable"] = True
    objs = ObjectSet(Target("pod", "p", "ns"), pods=[_pod()], nodes=[node])
    assert diagnose(objs).broken.summary == "the nodes are cordoned"  # type: ignore[union-attr]
    missing = diagnose(ObjectSet(Target("pod", "nope", "ns")))
    assert missing.broken is not None and "does not exist" in missing.broken.summary


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    objs = load("gang-deadlock-train-a")
    path = tmp_path / "set.json"
    path.write_text(objs.to_json())
    again = ObjectSet.load(path)
    assert again == objs
    assert diagnose(copy.deepcopy(again)).to_dict() == diagnose(objs).to_dict()


@pytest.mark.parametrize(
    ("kind", "ref", "message"),
    [
        ("pod", "justaname", "pod wants NAMESPACE/NAME"),
        ("node", "ns/node", "node is cluster-scoped"),
    ],
)
def test_bad_refs(kind: str, ref: str, message: str) -> None:
    with pytest.raises(CLIError, match=message):
        parse_target(kind, ref)
    assert parse_target("workload", "a/b") == Target("workload", "b", "a")


def test_a_failed_mig_change_quotes_the_mig_managers_event() -> None:
    event = {
        "involvedObject": {"kind": "Node", "name": "mig"},
        "type": "Warning",
        "reason": "applyMigConfig",
        "reportingComponent": "gpulab.io/nvidia-mig-manager",
        "message": "GPU 0 cannot hold 8 x 1g.10gb",
        "eventTime": "2026-12-01T00:00:00Z",
    }
    objs = ObjectSet(
        Target("node", "mig"),
        nodes=[_mig_node("all-1g.10gb", "failed")],
        configmaps=[MIG_CONFIGMAP],
        events=[event],
    )
    mig = next(link for link in diagnose(objs).links if link.name == "mig")
    assert mig.state == BROKEN
    assert mig.summary.endswith("failed to apply all-1g.10gb: GPU 0 cannot hold 8 x 1g.10gb")


def test_a_bound_pod_quotes_gpulab_schedulers_filter_results() -> None:
    """gpulab-scheduler's DefaultBinder records node -> plugin -> Filter result on the pod
    (kube-scheduler-simulator's annotation); the filter link quotes the chosen node's."""
    objs = load("healthy-a100-job")
    pod = next(p for p in objs.pods if p["metadata"]["name"] == objs.target.name)
    results = {
        "gpu-a100": {"NodeResourceTopologyMatch": "passed", "NodeResourcesFit": "passed"},
        "gpu-h100": {"NodeResourceTopologyMatch": "cannot align container: 4 nvidia.com/gpu"},
    }
    pod["metadata"].setdefault("annotations", {})[
        "kube-scheduler-simulator.sigs.k8s.io/filter-result"
    ] = json.dumps(results)
    report = diagnose(objs)
    assert report.broken is None, report.answer()
    link = next(link for link in report.links if link.name == "filter")
    assert (
        "gpulab-scheduler Filter on gpu-a100: NodeResourceTopologyMatch: passed, "
        "NodeResourcesFit: passed" in link.evidence
    ), link.evidence


def test_a_mig_config_typo_suggests_the_closest_config() -> None:
    first = diagnose(load("mig-node-config")).broken
    assert first is not None and "did you mean all-1g.10gb?" in first.fix
    assert any("the closest: all-1g.10gb" in e for e in first.evidence), first.evidence


def test_the_mig_strategy_fix_names_the_product_label() -> None:
    first = diagnose(load("mig-inference-strategy")).broken
    assert first is not None
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb" in first.fix
    assert "spec.mig.strategy to mixed" in first.fix


def _mig_node_set(target: Target, strategy: str | None) -> ObjectSet:
    """lab-mig's node after its fix (all-1g.10gb under mixed: 32 x 1g.10gb, nvidia.com/gpu
    withdrawn but its capacity kept for kubelet's grace period), with ``strategy``."""
    objs = load("healthy-mig-inference")
    objs.target = target
    node = next(n for n in objs.nodes if n["metadata"]["name"] == "gpu-mig")
    node["status"]["capacity"]["nvidia.com/gpu"] = "32"
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    if strategy is None:
        node["metadata"]["labels"].pop("nvidia.com/mig.strategy")
    else:
        node["metadata"]["labels"]["nvidia.com/mig.strategy"] = strategy
    return objs


def test_a_partitioned_node_under_mixed_is_healthy_but_offers_no_whole_gpu() -> None:
    """No false alarm on the node for the withdrawn nvidia.com/gpu; a pod asking for a
    whole GPU there is told the GPUs are partitioned (not that a config renames them)."""
    assert diagnose(_mig_node_set(Target("node", "gpu-mig"), "mixed")).broken is None
    objs = _mig_node_set(Target("pod", "whole", "lab-mig"), "mixed")
    pod = _pod("whole", "lab-mig", nodeSelector={"gpulab.io/lab-pool": "mig"})
    res = pod["spec"]["containers"][0]["resources"]
    res["requests"] = dict(res["limits"])  # as the API server defaults them
    objs.pods.append(pod)
    first = diagnose(objs).broken
    assert first is not None and first.name == "node", first
    assert "every GPU of gpu-mig is partitioned by MIG layout all-1g.10gb" in first.summary
    assert "nvidia.com/mig-1g.10gb" in first.fix


def test_a_mig_profile_under_strategy_none() -> None:
    objs = _mig_node_set(Target("pod", "p", "lab-mig"), None)
    node = next(n for n in objs.nodes if n["metadata"]["name"] == "gpu-mig")
    node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "0"
    node["status"]["capacity"]["nvidia.com/mig-1g.10gb"] = "0"
    pod = _pod("p", "lab-mig", nodeSelector={"gpulab.io/lab-pool": "mig"})
    want = {"nvidia.com/mig-1g.10gb": "1"}
    pod["spec"]["containers"][0]["resources"] = {"limits": want, "requests": want}
    objs.pods.append(pod)
    first = diagnose(objs).broken
    assert first is not None and "MIG strategy is none" in first.summary, first


def test_a_plugin_the_mig_manager_does_not_pause_is_told_to_restart() -> None:
    first = diagnose(load("mig-batch-not-paused")).broken
    assert first is not None
    assert "kubectl -n gpulab-system delete pod gpulab-device-plugin-" in first.fix
    assert any("nvidia.com/device-plugin.config=mig-mixed" in e for e in first.evidence)


def test_the_operators_own_plugin_restarting_on_a_new_layout_is_waiting() -> None:
    """The same node and pod with the operator's plugin (managed-by gpu-operator) and GFD's
    labels not yet of the new layout (both are restarted after the change): the missing
    devices are not a fault yet."""
    objs = load("mig-batch-not-paused")
    node = next(n for n in objs.nodes if n["metadata"]["name"] == "gpu-mig-b")
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-40GB"
    for p in objs.pods:
        if p["metadata"]["name"].startswith("gpulab-device-plugin-"):
            p["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "gpu-operator"
    report = diagnose(objs)
    node = next(link for link in report.links if link.name == "node")
    assert node.state == "waiting", report.answer()
    assert "restarting on the all-1g.10gb layout" in node.summary


# ---------------------------------------------------------------- Volcano gangs


def _volcano_lab(fixture: str = "gang-deadlock-volcano-train-a") -> tuple[ObjectSet, dict, dict]:
    """lab-gang-deadlock-volcano's broken state: the set, train-a's PodGroup and vcjob."""
    objs = load(fixture)
    pg = next(p for p in objs.volcano_podgroups if p["metadata"]["name"].startswith("train-a-"))
    job = next(j for j in objs.volcano_jobs if j["metadata"]["name"] == "train-a")
    return objs, pg, job


def test_the_half_world_fix_names_the_minavailable_patch_and_the_policy() -> None:
    first = diagnose(load("gang-deadlock-volcano-train-a")).broken
    assert first is not None
    assert """patch vcjob train-a --type merge -p '{"spec":{"minAvailable":4}}'""" in first.fix
    assert "(and train-b)" in first.fix and "Unknown -> RestartJob" in first.fix
    assert any("plugin pytorch: world master 1 + worker 3 = 4" in e for e in first.evidence)


def test_a_half_world_without_an_unknown_policy_is_told_to_restart_the_job() -> None:
    objs, _pg, job = _volcano_lab()
    job["spec"]["policies"] = [{"event": "PodEvicted", "action": "RestartJob"}]
    first = diagnose(objs).broken
    assert first is not None and first.name == "volcano"
    assert "vcctl job suspend -N train-a" in first.fix


def test_an_elastic_job_without_a_fixed_world_is_not_a_half_gang() -> None:
    """The same shape (Running at minMember 2, 2 members Pending) without a job plugin
    that fixes the world - the Volcano demo's elastic a-train: the gang is what the job
    needs, Volcano is right."""
    objs, _pg, job = _volcano_lab()
    for j in objs.volcano_jobs:
        j["spec"].pop("plugins", None)
    links = {link.name: link for link in diagnose(objs).links}
    assert links["volcano"].state == OK
    assert job["spec"]["minAvailable"] == 2


@pytest.mark.parametrize(
    ("policy", "state"),
    [({"event": "Unknown", "action": "RestartJob"}, "waiting"), (None, BROKEN)],
)
def test_an_unknown_podgroup(policy: dict | None, state: str) -> None:
    """Phase Unknown: members run, the rest of minMember cannot be placed (the lab's
    jobs right after minAvailable went to 4). Volcano waits for the job's controller:
    with an Unknown policy that is in progress, without one nothing recovers it."""
    objs, pg, job = _volcano_lab()
    pg["spec"]["minMember"] = 4
    pg["status"]["phase"] = "Unknown"
    job["spec"]["minAvailable"] = 4
    job["spec"]["policies"] = [policy] if policy else []
    links = {link.name: link for link in diagnose(objs).links}
    link = links["volcano"]
    assert link.state == state, link.summary
    assert "is Unknown: 2 of minMember 4 run, 2 cannot be placed" in link.summary
    if policy is None:
        assert "{event: Unknown, action: RestartJob}" in link.fix


def test_the_gang_enqueue_keeps_out_is_waiting_its_turn() -> None:
    """After the fix: one job whole, the other's PodGroup Pending because its queue has no
    room (proportion's "queue resource quota insufficient"): waiting, not broken, and its
    pods are not blamed on the Filter (allocate never looked at them)."""
    objs = load("gang-deadlock-volcano-fixed-waiting")
    report = diagnose(objs)
    assert report.broken is None, report.answer()
    link = report.links[0]
    assert link.state == "waiting" and "waits in enqueue" in link.summary
    names = {link.name: link for link in report.links}
    assert names["pod train-a-master-0: filter"].state == "waiting"  # not tried yet
    assert "train-b-" in link.summary and "(4 running)" in link.summary
    pod = next(p for p in objs.pods if p["metadata"]["name"] == "train-a-worker-0")
    objs.target = Target("pod", "train-a-worker-0", pod["metadata"]["namespace"])
    links = {link.name: link for link in diagnose(objs).links}
    assert links["filter"].state == "waiting" and "enqueue" in links["filter"].summary


def test_a_gang_kept_out_while_a_half_gang_holds_the_queue_is_not_just_waiting() -> None:
    objs = load("gang-deadlock-volcano-fixed-waiting")
    winner = next(p for p in objs.volcano_podgroups if p["metadata"]["name"].startswith("train-b-"))
    group = winner["metadata"]["name"]
    for p in objs.pods:
        member = (p["metadata"].get("annotations") or {}).get("scheduling.k8s.io/group-name")
        if member == group and p["metadata"]["name"].endswith("-2"):
            p["spec"].pop("nodeName", None)
            p["status"] = {"phase": "Pending"}
    links = {link.name: link for link in diagnose(objs).links}
    assert links["volcano"].state != "waiting"


def test_a_gang_bound_in_the_last_session_is_not_blamed_for_its_inqueue_phase() -> None:
    """Upstream's getPodGroupPhase counts Bound and Running tasks, not Binding ones: the
    session that binds a gang leaves its PodGroup Inqueue, with a gang message from
    before the binds. Its bound members are healthy; a half world is still named."""
    objs, pg, _job = _volcano_lab()
    pg["status"]["phase"] = "Inqueue"
    assert diagnose(objs).broken.summary.startswith(f"gang {pg['metadata']['namespace']}/")
    assert "2 of a 4-rank world" in diagnose(objs).broken.summary
    for j in objs.volcano_jobs:
        j["spec"].pop("plugins", None)
    links = {link.name: link for link in diagnose(objs).links}
    assert links["volcano"].state == OK

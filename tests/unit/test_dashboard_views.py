"""The dashboard's panels computed from API objects in their upstream formats."""

from __future__ import annotations

import json
from typing import Any

from gpulab.dashboard import views
from gpulab.fakegpu.profiles import gpu_uuid, mig_uuid
from gpulab.hami import annotations as ha
from gpulab.hami.commands import FILTER_RESULT

Obj = dict[str, Any]


def node(name: str, labels: Obj | None = None, annotations: Obj | None = None, **res: str) -> Obj:
    capacity = {"cpu": "64", **{k.replace("nvidia_com_", "nvidia.com/"): v for k, v in res.items()}}
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(name: str, node_name: str | None = None, annotations: Obj | None = None, **kw: Any) -> Obj:
    spec: Obj = {"containers": [{"name": "cuda"}], **kw.pop("spec", {})}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}, **kw},
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def register(uuids: list[str], health: tuple[bool, ...] = ()) -> str:
    return ha.encode_node_devices(
        [
            ha.NodeDevice(u, i, 10, 15360, 100, "NVIDIA-Tesla T4", 0, (health or (True,) * 9)[i])
            for i, u in enumerate(uuids)
        ]
    )


UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def test_hami_slices_land_in_their_gpu_box_with_memory_and_cores() -> None:
    n = node("gpu-t4", annotations={ha.NODE_REGISTER: register(UUIDS)})
    shares = ha.encode_pod_devices([[ha.ContainerDevice(UUIDS[2], "NVIDIA", 3000, 30)]])
    pods = [
        pod("a", "gpu-t4", {ha.DEVICES_ALLOCATED: shares, ha.BIND_PHASE: "success"}),
        pod("b", "gpu-t4", {ha.DEVICES_ALLOCATED: shares, ha.BIND_PHASE: "allocating"}),
    ]
    view = views.node_view(n, pods)
    assert view["source"] == "hami"
    gpu = view["gpus"][2]
    assert gpu["uuid"] == UUIDS[2] and gpu["split"] == 10
    assert [(s["pod"], s["mem"], s["cores"], s["phase"]) for s in gpu["slices"]] == [
        ("ns/a", 3000, 30, "success"),
        ("ns/b", 3000, 30, "allocating"),
    ]
    assert (gpu["usedMem"], gpu["usedCores"]) == (6000, 60)
    assert all(not g["slices"] for i, g in enumerate(view["gpus"]) if i != 2)


def test_finished_pods_hold_nothing() -> None:
    n = node("gpu-t4", annotations={ha.NODE_REGISTER: register(UUIDS)})
    shares = ha.encode_pod_devices([[ha.ContainerDevice(UUIDS[0], "NVIDIA", 1000, 10)]])
    done = pod("done", "gpu-t4", {ha.DEVICES_ALLOCATED: shares})
    done["status"]["phase"] = "Succeeded"
    assert views.node_view(n, [done])["gpus"][0]["slices"] == []


def test_hami_health_false_turns_the_gpu_red() -> None:
    n = node("gpu-t4", annotations={ha.NODE_REGISTER: register(UUIDS, (True, False, True, True))})
    gpus = views.node_view(n, [])["gpus"]
    assert [g["healthy"] for g in gpus] == [True, False, True, True]


def health_event(reason: str, note: str, when: str, warning: bool = False) -> Obj:
    return {
        "metadata": {"name": f"{reason}.{when}", "namespace": "default"},
        "reason": reason,
        "message": note,
        "type": "Warning" if warning else "Normal",
        "eventTime": when,
        "reportingComponent": "gpulab.io/device-plugin",
        "involvedObject": {"kind": "Node", "name": "gpu-a100"},
    }


def test_an_xid_is_red_until_the_plugin_starts_again() -> None:
    n = node("gpu-a100", labels={views.PROFILE_LABEL: "a100-sxm4-40gb-x8"}, nvidia_com_gpu="8")
    sick = gpu_uuid("gpu-a100", 3)
    xid = health_event(
        "CheckHealth", f"nvidia.com/gpu: {sick} Unhealthy: Xid=79", "2026-01-01T00:00:01Z", True
    )
    gpus = views.node_view(n, [], [xid])["gpus"]
    assert [g["index"] for g in gpus if not g["healthy"]] == [3]
    assert "Xid=79" in gpus[3]["healthNote"]
    restarted = health_event("Start", "8 GPU(s) via NVML", "2026-01-01T00:00:09Z")
    assert all(g["healthy"] for g in views.node_view(n, [], [restarted, xid])["gpus"])


def test_unhealthy_gpus_the_events_do_not_name_are_counted_from_allocatable() -> None:
    n = node("gpu-a100", labels={views.PROFILE_LABEL: "a100-sxm4-40gb-x8"}, nvidia_com_gpu="8")
    n["status"]["allocatable"]["nvidia.com/gpu"] = "6"
    assert views.node_view(n, [])["unhealthyUnidentified"] == 2


def test_profile_gpus_show_mig_instances_whole_holders_and_replicas() -> None:
    mig = node("gpu-a100-mig", labels={views.PROFILE_LABEL: "a100-80gb-mig-x8"}, nvidia_com_gpu="4")
    migs = views.node_view(mig, [])["gpus"]
    with_mig = next(g for g in migs if g["mig"])
    first = with_mig["mig"][0]
    assert first["uuid"] == mig_uuid("gpu-a100-mig", with_mig["index"], 0)
    record = {"devices": {"nvidia.com/mig-x": [first["uuid"]]}, "envs": {}}
    held = views.node_view(
        mig, [pod("m", "gpu-a100-mig", {"gpulab.io/allocate-cuda": json.dumps(record)})]
    )
    assert next(g for g in held["gpus"] if g["mig"])["mig"][0]["pod"] == "ns/m"

    t4 = node(
        "gpu-t4", labels={views.PROFILE_LABEL: "t4-x4", "nvidia.com/gpu.replicas": "4"},
        nvidia_com_gpu="16",
    )  # fmt: skip
    u = gpu_uuid("gpu-t4", 1)
    shared = {"devices": {"nvidia.com/gpu": [f"{u}::0"]}, "envs": {}}
    whole = {"devices": {"nvidia.com/gpu": [f"{u}::3"]}, "envs": {}}
    view = views.node_view(
        t4,
        [
            pod("x", "gpu-t4", {"gpulab.io/allocate-cuda": json.dumps(shared)}),
            pod("y", "gpu-t4", {"gpulab.io/allocate-cuda": json.dumps(whole)}),
        ],
    )
    assert view["replicas"] == 4
    assert view["gpus"][1]["whole"] == ["ns/x", "ns/y"]


def test_without_uuids_gfd_labels_give_count_and_product() -> None:
    n = node(
        "real", labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-H100"},
        nvidia_com_gpu="2",
    )  # fmt: skip
    view = views.node_view(n, [])
    assert view["source"] == "labels"
    assert [(g["product"], g["uuid"]) for g in view["gpus"]] == [("NVIDIA-H100", "")] * 2


def test_pending_pod_reason_and_the_explain_table() -> None:
    record = {
        "time": "t",
        "nodePolicy": "binpack",
        "gpuPolicy": "spread",
        "chosen": None,
        "nodes": [
            {"node": "gpu-t4", "fit": False, "reason": "CardInsufficientMemory", "devices": []}
        ],
    }
    p = pod("big", annotations={FILTER_RESULT: json.dumps(record)})
    p["spec"]["schedulerName"] = "hami-scheduler"
    message = "0/3 nodes are available: 1 node(s) had untolerated taint, 2 CardInsufficientMemory. no new claims to deallocate, preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."  # noqa: E501
    failed = {
        "metadata": {"name": "big.1", "namespace": "ns"},
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "lastTimestamp": "2026-01-01T00:00:05Z",
    }
    assert views.unscheduled(p)
    view = views.pending_view(p, failed)
    assert (view["scheduler"], view["reason"]) == ("hami-scheduler", "FailedScheduling")
    assert view["explained"]
    x = views.explain_view(p, [failed])
    assert x["filter"]["rows"] == [["gpu-t4", "no", "CardInsufficientMemory", "", ""]]
    assert x["reasons"] == [
        ["CardInsufficientMemory", 2],
        ["node(s) had untolerated taint", 1],
    ]
    assert not views.unscheduled(pod("bound", "gpu-t4"))


def test_gated_pod_says_so() -> None:
    p = pod("gated", spec={"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]})
    assert views.pending_view(p, None)["reason"] == "SchedulingGated"


def cq(name: str, cohort: str, nominal: str, total: str, borrowed: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "a100",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": nominal}],
                        }
                    ],
                }
            ],
        },
        "status": {
            "pendingWorkloads": 1,
            "admittedWorkloads": 2,
            "flavorsUsage": [
                {
                    "name": "a100",
                    "resources": [{"name": "nvidia.com/gpu", "total": total, "borrowed": borrowed}],
                }
            ],
        },
    }


def test_cluster_queue_usage_borrowed_and_lent_in_a_cohort() -> None:
    a = cq("team-a", "ml", "4", "6", "2")  # uses 6 of its 4: borrows 2
    b = cq("team-b", "ml", "4", "1", "0")  # uses 1 of 4: lends what a borrows
    waiting = {
        "metadata": {"name": "wl", "namespace": "ns"},
        "spec": {"queueName": "lq"},
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "False", "message": "insufficient quota"}
            ]
        },
    }
    va = views.cluster_queue_view(a, [a, b], [waiting], [])
    vb = views.cluster_queue_view(b, [a, b], [], [])
    (ra,) = va["rows"]
    (rb,) = vb["rows"]
    assert (ra["nominal"], ra["usage"], ra["borrowed"], ra["lent"]) == (4, 6, 2, 0)
    assert (rb["usage"], rb["borrowed"], rb["lent"]) == (1, 0, 2)
    assert va["pending"] == [{"key": "ns/wl", "message": "insufficient quota"}]
    assert views.workload_queue(waiting) == "ns/lq"


def test_quantities() -> None:
    assert views.parse_quantity("500m") == 0.5
    assert views.parse_quantity("2Gi") == 2 * 2**30
    assert views.parse_quantity("8") == 8


def test_gangs_count_bound_members_against_min_member() -> None:
    pg = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 3}}
    members = [
        pod("w0", "n1", labels={views.COSCHEDULING_LABEL: "g"}),
        pod("w1", None, labels={views.COSCHEDULING_LABEL: "g"}),
    ]
    assert views.pod_groups(members[0]) == ["coscheduling/ns/g"]
    view = views.podgroup_view("coscheduling", pg, members)
    assert (view["bound"], view["minMember"], view["members"]) == (1, 3, 2)


def test_volcano_share_against_weight() -> None:
    q1 = {"metadata": {"name": "q1"}, "spec": {"weight": 3}}
    q2 = {"metadata": {"name": "q2"}, "spec": {"weight": 1}}
    view = views.volcano_queue_view(q1, [q1, q2], {"q1": 4}, 16)
    assert (view["deserved"], view["share"], view["gpus"]) == (0.75, 0.25, 4)


def test_cluster_policy_states_per_node() -> None:
    policy = {"metadata": {"name": "cluster-policy"}, "status": {"state": "notReady"}}
    owner = [{"kind": "ClusterPolicy", "name": "cluster-policy"}]
    ds = {
        "metadata": {"name": "nvidia-driver-daemonset", "namespace": "gpu-operator",
                     "ownerReferences": owner},
        "status": {"numberReady": 1, "desiredNumberScheduled": 2},
    }  # fmt: skip
    ready = pod(
        "drv-1", "n1", ownerReferences=[{"kind": "DaemonSet", "name": ds["metadata"]["name"]}]
    )
    ready["metadata"]["namespace"] = "gpu-operator"
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    view = views.cluster_policy_view(policy, [ds], [ready], ["n1", "n2"])
    assert view["state"] == "notReady"
    (state,) = view["states"]
    assert state["nodes"] == {"n1": "ready", "n2": "-"}
    assert (state["ready"], state["desired"]) == (1, 2)

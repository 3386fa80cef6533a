"""The device manager's pure decisions (gpulab.nodeagent.policy)."""

from __future__ import annotations

import pytest

from gpulab.nodeagent import policy
from gpulab.nodeagent.policy import AdmissionError, ContainerRecord


def pod(uid: str, phase: str = "Running", containers=(), init=(), annotations=None) -> dict:
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": annotations or {}},
        "spec": {"containers": list(containers), "initContainers": list(init)},
        "status": {"phase": phase},
    }


def container(name: str, limits: dict | None = None, requests: dict | None = None) -> dict:
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}


def held_by(uid: str, resource: str, ids: list[str], phase: str = "Running") -> dict:
    rec = ContainerRecord(devices={resource: ids}, envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)})
    return pod(uid, phase, annotations={policy.annotation_key("main"): rec.to_json()})


def test_needs_list_init_containers_first_and_only_registered_resources() -> None:
    p = pod(
        "p",
        containers=[
            container("app", {"nvidia.com/gpu": "2", "cpu": "1"}),
            container("sidecar", {"cpu": "1"}),
            container("mig", requests={"nvidia.com/mig-1g.10gb": 1}),
        ],
        init=[container("warmup", {"nvidia.com/gpu": "1"})],
    )
    needs = policy.container_needs(p, ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"])
    assert [(n.name, n.init, n.resources) for n in needs] == [
        ("warmup", True, {"nvidia.com/gpu": 1}),
        ("app", False, {"nvidia.com/gpu": 2}),
        ("mig", False, {"nvidia.com/mig-1g.10gb": 1}),
    ]
    assert policy.container_needs(p, ["example.com/fpga"]) == []


def test_devices_held_by_active_pods_are_not_free() -> None:
    records = policy.records_of(
        [
            held_by("a", "nvidia.com/gpu", ["G0", "G1"]),
            held_by("b", "nvidia.com/gpu", ["G2"], phase="Succeeded"),  # finished: freed
            held_by("c", "nvidia.com/mig-1g.10gb", ["M0"]),
            pod("d"),
        ]
    )
    assert set(records) == {"a", "c"}
    held = policy.in_use(records, "nvidia.com/gpu")
    assert held == {"G0", "G1"}
    assert policy.in_use(records, "nvidia.com/gpu", exclude="a") == set()
    assert policy.free_devices(["G0", "G1", "G2", "G3"], held) == ["G2", "G3"]


def test_not_enough_free_devices_is_kubelets_admission_error() -> None:
    with pytest.raises(AdmissionError, match="Requested: 3, Available: 2"):
        policy.devices_to_allocate("nvidia.com/gpu", 3, ["G0", "G1", "G2"], ["G1"])


def test_init_container_devices_are_reused_first() -> None:
    available, must = policy.devices_to_allocate(
        "nvidia.com/gpu", 1, ["G0", "G1", "G2"], [], reusable=["G2", "G0"]
    )
    assert available == ["G0", "G1", "G2"]
    assert must == ["G2"]


def test_a_preferred_allocation_outside_the_available_set_is_rejected() -> None:
    assert policy.check_preferred(["G1", "G0"], ["G0", "G1", "G2"], 2) == ["G1", "G0"]
    with pytest.raises(AdmissionError, match="not 2 device"):
        policy.check_preferred(["G1", "G9"], ["G0", "G1"], 2)
    with pytest.raises(AdmissionError):
        policy.check_preferred(["G1"], ["G0", "G1"], 2)


def test_capacity_counts_all_allocatable_counts_healthy() -> None:
    assert policy.capacity({"G0": True, "G1": False, "G2": True}) == (3, 2)
    assert policy.capacity({}) == (0, 0)


def test_records_round_trip_and_bad_annotations_are_ignored() -> None:
    rec = ContainerRecord(
        devices={"nvidia.com/gpu": ["G0"]},
        envs={"NVIDIA_VISIBLE_DEVICES": "G0"},
        device_specs=[
            {"containerPath": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"}
        ],
    )
    assert ContainerRecord.from_json(rec.to_json()) == rec
    p = pod(
        "p",
        annotations={
            policy.annotation_key("a"): rec.to_json(),
            policy.annotation_key("b"): "{nope",
        },
    )
    assert list(policy.recorded(p)) == ["a"]

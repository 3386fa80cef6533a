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


def test_devices_held_by_active_pods_are_in_use() -> None:
    records = policy.records_of(
        [
            held_by("a", "nvidia.com/gpu", ["G0", "G1"]),
            held_by("b", "nvidia.com/gpu", ["G2"], phase="Succeeded"),  # finished: freed
            held_by("c", "nvidia.com/mig-1g.10gb", ["M0"]),
            pod("d"),
        ]
    )
    assert set(records) == {"a", "c"}
    assert policy.in_use(records, "nvidia.com/gpu") == {"G0", "G1"}
    assert policy.in_use(records, "nvidia.com/gpu", exclude="a") == set()


def state(healthy=(), unhealthy=(), stopped_at=None) -> policy.ResourceState:
    return policy.ResourceState(frozenset(healthy), frozenset(unhealthy), stopped_at)


def test_kubelets_admission_errors() -> None:
    with pytest.raises(AdmissionError, match="cannot allocate unregistered device"):
        policy.plan_allocation("nvidia.com/gpu", 1, None, [])
    with pytest.raises(AdmissionError, match="no healthy devices present"):
        policy.plan_allocation("nvidia.com/gpu", 1, state(unhealthy=["G0"]), [])
    with pytest.raises(AdmissionError, match="Requested: 3, Available: 2"):
        policy.plan_allocation("nvidia.com/gpu", 3, state(["G0", "G1", "G2"]), ["G1"])


def test_init_container_devices_are_reused_first() -> None:
    allocated, available, needed = policy.plan_allocation(
        "nvidia.com/gpu", 2, state(["G0", "G1", "G2"]), ["G2"], reusable=["G2"]
    )
    assert (allocated, available, needed) == (["G2"], ["G0", "G1"], 1)
    assert policy.plan_allocation("nvidia.com/gpu", 1, state(["G0"]), [], ["G0"]) == (
        ["G0"], [], 0,
    )  # fmt: skip


def test_a_preferred_allocation_naming_unavailable_devices_falls_back() -> None:
    """devicesToAllocate takes the preferred devices that are available, then any."""
    assert policy.finish_allocation([], ["G0", "G1", "G2"], 2, ["G2", "G0"]) == ["G2", "G0"]
    assert policy.finish_allocation([], ["G0", "G1", "G2"], 2, ["G9", "G1"]) == ["G1", "G0"]
    assert policy.finish_allocation(["R"], ["G0", "G1"], 1, []) == ["R", "G0"]


def test_capacity_and_the_stop_grace_period() -> None:
    resources = {
        "nvidia.com/gpu": state(["G0", "G2"], ["G1"]),
        "nvidia.com/mig-1g.10gb": policy.mark_unhealthy(state(["M0", "M1"]), now=100.0),
    }
    cap, alloc, deleted = policy.get_capacity(resources, now=110.0, grace=300.0)
    assert cap == {"nvidia.com/gpu": 3, "nvidia.com/mig-1g.10gb": 2}
    assert alloc == {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 0}
    assert deleted == []
    assert policy.next_expiry(resources, now=110.0, grace=300.0) == pytest.approx(290.01)
    cap, alloc, deleted = policy.get_capacity(resources, now=401.0, grace=300.0)
    assert deleted == ["nvidia.com/mig-1g.10gb"] and "nvidia.com/mig-1g.10gb" not in cap
    assert policy.next_expiry({"g": state(["G0"])}, now=0.0) is None


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("example.com/fpga_x", True),
        ("gpu", False),  # no domain: a native resource
        ("kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("nvidia.com/", False),
        ("Nvidia.com/gpu", False),  # the prefix must be a DNS subdomain
        ("nvidia.com/-gpu", False),
        ("a/b/c", False),
        ("nvidia.com/gpu\n", False),  # found by the gRPC fuzz: "$" matched before the "\n"
        ("nvidia.com\n/gpu", False),
    ],
)
def test_is_extended_resource_name(name: str, ok: bool) -> None:
    assert policy.is_extended_resource_name(name) is ok


def test_registration_errors_are_kubelets_messages() -> None:
    assert policy.registration_error("v1beta1", "nvidia.com/gpu") is None
    assert policy.registration_error("v1alpha", "nvidia.com/gpu") == (
        'requested API version "v1alpha" is not supported by kubelet. Supported version is '
        '["v1beta1"]'
    )
    assert policy.registration_error("v1beta1", "gpu") == 'the ResourceName "gpu" is invalid'


def test_rpc_errors_read_as_go_prints_them() -> None:
    assert policy.rpc_error("UNKNOWN", "boom") == "rpc error: code = Unknown desc = boom"
    assert policy.rpc_error("INVALID_ARGUMENT", "x") == "rpc error: code = InvalidArgument desc = x"


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

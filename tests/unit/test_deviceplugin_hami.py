"""HAMi annotation codec (gpulab.hami.annotations) and the plugin's HAMi decisions."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.hami import (
    align_replicas,
    hami_allocation,
    node_devices,
    pending_pod,
    pop_next,
)
from gpulab.deviceplugin.rm import Device, GPUInfo
from gpulab.hami import annotations as ha

NODE = "n1"


def test_node_registration_is_hamis_json_device_list() -> None:
    gpus = [
        GPUInfo(0, "GPU-a", "NVIDIA A100-SXM4-40GB", 40960, (8, 0), 0, 1),
        GPUInfo(1, "GPU-b", "Tesla T4", 15360, (7, 5), 1, None),
    ]
    encoded = ha.encode_node_devices(node_devices(gpus, lambda u: u != "GPU-b", 10))
    assert json.loads(encoded) == [
        {"id": "GPU-a", "index": 0, "count": 10, "devmem": 40960, "devcore": 100,
         "type": "NVIDIA A100-SXM4-40GB", "numa": 1, "health": True, "mode": "hami-core"},
        {"id": "GPU-b", "index": 1, "count": 10, "devmem": 15360, "devcore": 100,
         "type": "NVIDIA-Tesla T4", "numa": 0, "health": False, "mode": "hami-core"},
    ]  # fmt: skip
    assert ha.decode_node_devices(encoded)[1].type == "NVIDIA-Tesla T4"


def test_decoding_hamis_omitempty_output() -> None:
    # HAMi omits zero values: index 0, numa 0, health false.
    (dev,) = ha.decode_node_devices('[{"id":"GPU-a","count":10,"devmem":1024,"type":"NVIDIA-x"}]')
    assert (dev.index, dev.numa, dev.health, dev.devcore) == (0, 0, False, 0)


@pytest.mark.parametrize(
    "bad", ["GPU-a,10,1024", "{}", '[{"count": 1}]', '[{"id":"x","count":"a"}]']
)
def test_bad_registrations_are_errors(bad: str) -> None:
    with pytest.raises(ha.AnnotationError):
        ha.decode_node_devices(bad)


def test_pod_devices_round_trip_in_hamis_format() -> None:
    value = "GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,2000,20:;;GPU-c,NVIDIA,1000,100:;"
    containers = ha.decode_pod_devices(value)
    assert [len(c) for c in containers] == [2, 0, 1]
    assert containers[0][1] == ha.ContainerDevice("GPU-b", "NVIDIA", 2000, 20)
    assert ha.encode_pod_devices(containers) == value


def test_malformed_container_devices_are_errors() -> None:
    with pytest.raises(ha.AnnotationError, match="needs UUID,type,mem,cores"):
        ha.decode_container_devices("GPU-a,NVIDIA,3000:")
    with pytest.raises(ha.AnnotationError, match="non-integer"):
        ha.decode_container_devices("GPU-a,NVIDIA,lots,30:")


def test_handshake_values() -> None:
    when = dt.datetime(2026, 1, 23, 4, 30, 4, 434037, tzinfo=dt.UTC)
    assert ha.handshake_reported(when) == "Reported 2026-01-23 04:30:04.434037 +0000 UTC"
    assert ha.handshake_requesting(when) == "Requesting_2026-01-23 04:30:04"
    assert ha.parse_handshake("Requesting_2026-01-23 04:30:04")[0] == "Requesting"
    state, stamp = ha.parse_handshake(ha.handshake_reported(when))
    assert state == "Reported" and stamp == when.replace(microsecond=0)


def test_node_lock_round_trip() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    value = ha.node_lock_value(when, "default", "p1")
    assert value == "2026-01-02T03:04:05Z,default,p1"
    assert ha.parse_node_lock(value) == (when, "default", "p1")
    with pytest.raises(ha.AnnotationError):
        ha.parse_node_lock("garbage")


def pod(name: str, phase: str = "allocating", node: str = NODE, bind_time: str = "100", **extra):
    annos = {ha.ASSIGNED_NODE: node, ha.BIND_TIME: bind_time, ha.BIND_PHASE: phase, **extra}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annos},
        "status": {"phase": "Pending"},
    }


def test_pending_pod_is_the_oldest_allocating_pod_for_this_node() -> None:
    pods = [
        pod("other-node", node="n2", bind_time="1"),
        pod("done", phase="success", bind_time="2"),
        pod("newer", bind_time="300"),
        pod("older", bind_time="200"),
    ]
    assert pending_pod(pods, NODE)["metadata"]["name"] == "older"
    assert pending_pod(pods[:2], NODE) is None


def test_success_pod_with_containers_left_is_still_pending() -> None:
    left = pod("half", phase="success", **{ha.DEVICES_TO_ALLOCATE: ";GPU-a,NVIDIA,1,1:;"})
    assert pending_pod([left], NODE) is not None


def test_pop_next_takes_containers_in_order() -> None:
    devs = ha.decode_pod_devices("GPU-a,NVIDIA,1,1:;GPU-b,NVIDIA,2,2:;")
    assert pop_next(devs)[0].uuid == "GPU-a"
    assert pop_next(devs)[0].uuid == "GPU-b"
    assert ha.encode_pod_devices(devs) == ";;"
    with pytest.raises(AllocationError, match="no pending"):
        pop_next(devs)


def test_hami_allocation_envs() -> None:
    ctr = ha.decode_container_devices("GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,2000,30:")
    alloc = hami_allocation(ctr, {"GPU-a": ("/dev/nvidia0",), "GPU-b": ("/dev/nvidia1",)})
    assert alloc.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    assert [d.host_path for d in alloc.devices][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    with pytest.raises(AllocationError, match="not on this node: GPU-z"):
        hami_allocation(ha.decode_container_devices("GPU-z,NVIDIA,1,1:"), {})


def test_preferred_replicas_follow_hamis_assignment() -> None:
    devices = {
        f"{u}::{n}": Device(f"{u}::{n}", u, g, (), 0, n)
        for g, u in enumerate(("GPU-a", "GPU-b"))
        for n in range(2)
    }
    ctr = ha.decode_container_devices("GPU-b,NVIDIA,1,1:GPU-a,NVIDIA,1,1:")
    assert align_replicas(ctr, ["GPU-a::1", "GPU-b::0", "GPU-b::1"], devices) == [
        "GPU-b::0",
        "GPU-a::1",
    ]
    assert align_replicas(ctr, ["GPU-b::0", "GPU-b::1"], devices) is None  # GPU-a is full

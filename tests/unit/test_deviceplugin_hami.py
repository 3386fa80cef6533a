"""HAMi annotation codec (gpulab.hami.annotations) and the plugin's HAMi registration and
pure Allocate helpers (gpulab.deviceplugin.hami), against HAMi v2.10.0."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.hami import (
    HamiRegistrar,
    align_replicas,
    hami_allocation,
    node_devices,
    pair_scores,
    pop_next,
    waiting_pod,
)
from gpulab.deviceplugin.rm import Device, GPUInfo
from gpulab.hami import annotations as ha
from gpulab.hami.fake import FakeCluster
from gpulab.trace import Tracer

NODE = "n1"
GPUS = [
    GPUInfo(0, "GPU-a", "NVIDIA A100-SXM4-40GB", 40960, (8, 0), 0, 1, nvlinks={1: 1}),
    GPUInfo(1, "GPU-b", "Tesla T4", 15360, (7, 5), 1, None),
]


def test_registration_is_v2_10_json_with_go_omitempty() -> None:
    encoded = ha.encode_node_devices(node_devices(GPUS, lambda u: u != "GPU-b", 10))
    assert encoded == (
        '[{"id":"GPU-a","count":10,"devmem":40960,"devcore":100,'
        '"type":"NVIDIA A100-SXM4-40GB","numa":1,"mode":"hami-core","health":true},'
        '{"id":"GPU-b","index":1,"count":10,"devmem":15360,"devcore":100,'
        '"type":"NVIDIA-Tesla T4","mode":"hami-core"}]'
    )
    back = ha.decode_node_devices(encoded)
    assert (back[0].index, back[1].numa, back[1].health) == (0, 0, False)


@pytest.mark.parametrize(
    "bad", ["GPU-a,10,1024,100,NVIDIA,0,true:", "{}", '[{"id":"x","count":"a"}]', "[1]"]
)
def test_bad_registrations_are_errors(bad: str) -> None:
    with pytest.raises(ha.AnnotationError):
        ha.decode_node_devices(bad)


def test_pair_scores_add_the_pcie_path_and_nvlinks() -> None:
    gpus = [
        GPUInfo(0, "GPU-0", "A100", 1, (8, 0), 0, 0, nvlinks={1: 1}),
        GPUInfo(1, "GPU-1", "A100", 1, (8, 0), 1, 0, nvlinks={0: 1}),
        GPUInfo(2, "GPU-2", "A100", 1, (8, 0), 2, 1),
    ]
    scores = pair_scores(gpus)
    assert scores["GPU-0"] == {"GPU-1": 120, "GPU-2": 10}
    assert ha.decode_pair_scores(ha.encode_pair_scores(scores)) == scores


def test_register_writes_only_the_registration_and_only_when_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fc = FakeCluster()
    fc.add_node({"metadata": {"name": NODE, "annotations": {}}})
    healthy = {"GPU-a": True, "GPU-b": True}
    reg = HamiRegistrar(None, NODE, GPUS, lambda u: healthy[u], 10, Tracer("dp"), cluster=fc)  # type: ignore[arg-type]
    assert reg.RegisterInAnnotation() is True
    assert reg.RegisterInAnnotation() is False  # unchanged: no write
    healthy["GPU-b"] = False
    assert reg.RegisterInAnnotation() is True
    annos = fc.nodes[NODE]["metadata"]["annotations"]
    assert set(annos) == {ha.NODE_REGISTER}  # v2.10 plugins no longer answer the handshake
    assert fc.calls.count("patch node") == 2
    monkeypatch.setenv("ENABLE_TOPOLOGY_SCORE", "true")
    topo = HamiRegistrar(None, NODE, GPUS, lambda u: True, 10, Tracer("dp"), cluster=fc)  # type: ignore[arg-type]
    topo.RegisterInAnnotation()
    assert (
        json.loads(fc.nodes[NODE]["metadata"]["annotations"][ha.NODE_PAIR_SCORE])[0]["uuid"]
        == "GPU-a"
    )


def test_pod_devices_keep_every_slot_init_first() -> None:
    value = ";GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,2000,20:;"
    slots = ha.decode_pod_devices(value)
    assert [len(c) for c in slots] == [0, 2, 0]  # the empty init slot and the tail after ';'
    assert slots[1][1] == ha.ContainerDevice("GPU-b", "NVIDIA", 2000, 20)
    assert ha.encode_pod_devices(slots) == value + ";"


def test_malformed_container_devices_are_errors() -> None:
    with pytest.raises(ha.AnnotationError, match="missing fields"):
        ha.decode_container_devices("GPU-a,NVIDIA,3000:")
    with pytest.raises(ha.AnnotationError, match="non-integer"):
        ha.decode_container_devices("GPU-a,NVIDIA,lots,30:")


def pod(name: str, phase: str = "allocating", node: str = NODE, **extra: str) -> dict[str, Any]:
    annos = {ha.ASSIGNED_NODE: node, ha.BIND_TIME: "100", ha.BIND_PHASE: phase, **extra}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annos},
        "status": {"phase": "Pending"},
    }


def test_waiting_pod_fallback() -> None:
    pods = [pod("other", node="n2"), pod("failed", phase="failed"), pod("mine")]
    assert waiting_pod(pods, NODE)["metadata"]["name"] == "mine"  # type: ignore[index]
    assert waiting_pod([pod("half", phase="success")], NODE) is not None
    done = pod("done")
    done["status"]["phase"] = "Succeeded"
    assert waiting_pod([done], NODE) is None


def test_pop_next_takes_the_init_slot_first() -> None:
    slots = ha.decode_pod_devices("GPU-a,NVIDIA,1,1:;GPU-b,NVIDIA,2,2:;")
    assert pop_next(slots, 1, 1) == (0, [ha.ContainerDevice("GPU-a", "NVIDIA", 1, 1)])
    assert pop_next(slots, 1, 1)[0] == 1
    assert ha.encode_pod_devices(slots) == ";;;"
    with pytest.raises(AllocationError, match="no pending device allocation found"):
        pop_next(slots, 1, 1)
    with pytest.raises(AllocationError, match="out of range"):
        pop_next(ha.decode_pod_devices(";;GPU-a,NVIDIA,1,1:;"), 0, 1)


def test_hami_allocation_envs() -> None:
    ctr = ha.decode_container_devices("GPU-a,NVIDIA,3000,30:GPU-b,NVIDIA,2000,30:")
    alloc = hami_allocation(ctr, {"GPU-a": ("/dev/nvidia0",), "GPU-b": ("/dev/nvidia1",)})
    assert alloc.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "2000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
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
    assert align_replicas(ctr, ["GPU-b::0", "GPU-b::1"], devices) is None

"""HAMi annotation codec (gpulab.hami.annotations) and the plugin's HAMi registration and
pure Allocate helpers (gpulab.deviceplugin.hami), against HAMi v2.10.0."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpulab.deviceplugin import main
from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.config import Config
from gpulab.deviceplugin.hami import (
    HamiRegistrar,
    NodeConfig,
    align_devices,
    hami_allocation,
    node_config,
    node_devices,
    pair_scores,
    physical_device_id,
    plugin_devices,
    plugin_resource,
    pop_next,
    select_preferred,
    waiting_pod,
)
from gpulab.deviceplugin.health import NO_INSTANCE, affected, xid_filter
from gpulab.deviceplugin.rm import GPUInfo, build_resources
from gpulab.deviceplugin.server import DefaultAllocator, NvidiaDevicePlugin
from gpulab.fakegpu import inventory, profiles
from gpulab.hami import annotations as ha
from gpulab.hami.config import ConfigError, NvidiaConfig
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


UUID_A = "GPU-1b4d6d4c-8a5e-5e0c-9f3d-2c1a0b9e8f7d"  # a GPU UUID: 5 dashes
UUID_B = "GPU-7f0e1d2c-3b4a-5968-8776-655443322110"
UUID_C = "GPU-00000000-1111-2222-3333-444444444444"


def test_hami_ids_are_uuid_dash_n_and_carry_no_numa_unless_enabled() -> None:
    """GetPluginDevices: <uuid>-<n>, not NVIDIA's time-slicing <uuid>::<n>, and the NUMA
    node only with enableNumaTopology (off by default in v2.10.0)."""
    gpus = inventory.gpu_infos(profiles.load("a100-sxm4-40gb-x8"), "n1")
    resource = plugin_resource(gpus, NodeConfig())
    assert resource.name == "nvidia.com/gpu" and len(resource.devices) == 8 * 10
    first = resource.devices[0]
    assert first.id == f"{gpus[0].uuid}-0" and resource.devices[9].id == f"{gpus[0].uuid}-9"
    assert "::" not in first.id and first.uuid == gpus[0].uuid
    assert {d.numa_node for d in resource.devices} == {None}
    numa = plugin_devices(gpus, 2, numa_topology=True)
    assert [d.numa_node for d in numa[::2]] == [g.numa_node for g in gpus] == [0] * 4 + [1] * 4
    # what NVIDIA's time-slicing would have advertised instead
    (shared,) = build_resources(gpus, Config())
    assert {d.id for d in shared.devices}.isdisjoint(d.id for d in resource.devices)


def test_node_config_overrides_the_device_config_for_this_node_only() -> None:
    device = NvidiaConfig(device_split_count=10, enable_numa_topology=False)
    text = json.dumps(
        {
            "nodeconfig": [
                {"name": "other", "operatingmode": "mig", "devicesplitcount": 2},
                {"name": "n1", "devicesplitcount": 4, "enablenumatopology": True,
                 "enablegetpreferredallocation": True, "operatingmode": ""},
            ]
        }
    )  # fmt: skip
    assert node_config(device, text, "n1", "cfg") == NodeConfig(
        operating_mode="hami-core",  # "" is not a value: mergo keeps the default
        device_split_count=4,
        enable_numa_topology=True,
        enable_get_preferred_allocation=True,
    )
    assert node_config(device, text, "other", "cfg").operating_mode == "mig"
    assert node_config(device, "{}", "n1", "cfg") == NodeConfig()
    for bad, message in (("[", "not a JSON object"), ('{"nodeconfig": [{"name": "n1", '
                         '"operatingmode": "mps"}]}', "'mps' is not simulated")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            node_config(device, bad, "n1", "cfg")


def test_physical_device_id_as_upstream() -> None:
    assert physical_device_id(f"{UUID_A}-7") == UUID_A
    assert physical_device_id(f"{UUID_A}::3") == UUID_A
    assert physical_device_id(UUID_A) == UUID_A  # 5 dashes: a GPU already
    assert physical_device_id("MIG-1-2-3-4-5-x") == "MIG-1-2-3-4-5-x"  # not a number


def test_preferred_ids_follow_hamis_assignment_with_must_include_counted() -> None:
    desired = ha.decode_container_devices(f"{UUID_B},NVIDIA,1,1:{UUID_A},NVIDIA,1,1:")
    available = [f"{UUID_A}-1", f"{UUID_B}-0", f"{UUID_B}-1"]
    assert select_preferred(available, [], desired, 2) == [f"{UUID_B}-0", f"{UUID_A}-1"]
    # kubelet must include B-1: it stands for HAMi's B share, so only A is added
    assert select_preferred(available, [f"{UUID_B}-1"], desired, 2) == [
        f"{UUID_B}-1",
        f"{UUID_A}-1",
    ]
    with pytest.raises(
        AllocationError, match=f"no available slice device found for annotated GPU {UUID_A}"
    ):
        select_preferred(available[1:], [], desired, 2)
    with pytest.raises(
        AllocationError, match="annotated devices 2 smaller than requested allocation size 3"
    ):
        select_preferred(available, [], desired, 3)
    # a must-include ID of a GPU HAMi did not assign leaves one too many
    with pytest.raises(AllocationError, match="selected 3 devices, want 2"):
        select_preferred(available, [f"{UUID_C}-0"], desired, 2)


def test_enablegetpreferredallocation_aligns_the_shares_with_kubelets_ids() -> None:
    ctr = ha.decode_container_devices(f"{UUID_A},NVIDIA,3000,30:")
    (aligned,) = align_devices(ctr, [f"{UUID_B}-4"])
    assert (aligned.uuid, aligned.usedmem, aligned.usedcores) == (UUID_B, 3000, 30)
    with pytest.raises(AllocationError, match="device number not matched"):
        align_devices(ctr, [])


def test_an_xid_takes_every_id_of_the_gpu_out_in_hami_mode() -> None:
    """HAMi's ListAndWatch marks the rm device (the GPU) and advertises its health on each
    of its <uuid>-<n> IDs: the GPU's 10 shares go, not one (NVIDIA's health.go alone would
    mark the one device it keeps per GPU)."""
    gpus = inventory.gpu_infos(profiles.load("t4-x4"), "n1")
    resource = plugin_resource(gpus, NodeConfig())
    plugin = NvidiaDevicePlugin(
        resource, gpus, Config(), Path("/nonexistent"), Tracer("device-plugin", None,
        stream=io.StringIO()), "n1", xid_filter({}), DefaultAllocator(Config(), gpus, bool),
        health_by_gpu=True,
    )  # fmt: skip
    hit = affected(resource.devices, gpus[1], NO_INSTANCE, NO_INSTANCE)
    assert len(hit) == 1  # what health.go hands over: one device per GPU
    plugin.mark_unhealthy(hit, "XidCriticalError: Xid=79")
    listed = plugin._device_list(plugin._health)
    down = {d.ID for d in listed if d.health == "Unhealthy"}
    assert down == {f"{gpus[1].uuid}-{n}" for n in range(10)}
    assert not plugin.healthy(gpus[1].uuid) and plugin.healthy(gpus[0].uuid)


class _FakePlugin:
    """NvidiaDevicePlugin's surface the manager uses (no gRPC, no kubelet)."""

    def __init__(self, resource: Any, *args: Any, **kw: Any) -> None:
        self.resource = resource

    def Start(self) -> None:
        pass

    def Stop(self) -> None:
        pass

    def healthy(self, uuid: str) -> bool:
        return True


class _FakeRegistrar:
    def __init__(self, *args: Any, **kw: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def poke(self) -> None:
        pass


@pytest.mark.parametrize("hami", [False, True])
def test_the_manager_writes_gfd_labels_only_outside_hami_mode(
    hami: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HAMi v2.10.0's device plugin writes no GFD label (no gpu.product, no
    gpu.sharing-strategy=time-slicing); k8s-device-plugin with GFD does. Two starts: a
    restart (a new kubelet.sock, SIGHUP) labels nothing in HAMi mode either."""
    patches: list[tuple[str, dict]] = []
    monkeypatch.setattr(main.nvml, "read_inventory", lambda: GPUS)
    monkeypatch.setattr(main, "NvidiaDevicePlugin", _FakePlugin)
    monkeypatch.setattr(main, "HamiRegistrar", _FakeRegistrar)
    monkeypatch.setattr(main, "HamiAllocator", lambda *args, **kw: object())
    monkeypatch.setattr(
        main, "label_node", lambda api, node, labels: patches.append((node, labels))
    )
    opts = main.Options(NODE, tmp_path, hami=hami)
    manager = main.PluginManager(opts, client.ApiClient(), Tracer("dp", None, stream=io.StringIO()))
    for _ in range(2):
        assert manager.start_plugins()
        manager.stop_plugins()
    manager.stop()
    if hami:
        assert patches == []
    else:
        assert len(patches) == 2 and patches[0][0] == NODE
        assert patches[0][1]["nvidia.com/gpu.sharing-strategy"] == "none"

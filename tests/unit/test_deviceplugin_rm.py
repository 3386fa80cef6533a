"""Resources from the NVML inventory (internal/rm device_map.go), pure."""

from __future__ import annotations

import pytest

from gpulab.deviceplugin.config import Config, parse, time_slicing
from gpulab.deviceplugin.rm import (
    GPU_RESOURCE,
    GPUInfo,
    MigInfo,
    ResourceError,
    build_resources,
    mig_profile_name,
    parse_mig_minors,
)
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu.render import mig_minors

NODE = "n1"


def gpus(profile: str) -> list[GPUInfo]:
    return inventory.gpu_infos(profiles.load(profile), NODE)


def caps(profile: str) -> dict[str, str]:
    return parse_mig_minors(mig_minors(profiles.load(profile)))


def counts(resources) -> dict[str, int]:
    return {r.name: len(r.devices) for r in resources}


def test_whole_gpus_by_uuid_with_their_device_node_and_numa() -> None:
    (res,) = build_resources(gpus("a100-sxm4-40gb-x8"), Config())
    assert res.name == GPU_RESOURCE and res.socket_name == "nvidia-gpu.sock"
    first = res.devices[0]
    assert first.id == profiles.gpu_uuid(NODE, 0)
    assert (first.paths, first.numa_node, first.index) == (("/dev/nvidia0",), 0, "0")


def test_strategy_none_advertises_mig_enabled_gpus_whole() -> None:
    assert counts(build_resources(gpus("a100-80gb-mig-x8"), Config())) == {GPU_RESOURCE: 8}


def test_mixed_gives_one_resource_per_profile_with_mig_capability_devices() -> None:
    resources = build_resources(
        gpus("a100-80gb-mig-x8"), Config(mig_strategy="mixed"), caps("a100-80gb-mig-x8")
    )
    assert counts(resources) == {
        "nvidia.com/mig-1g.10gb": 36,
        "nvidia.com/mig-2g.20gb": 4,
        "nvidia.com/mig-3g.40gb": 4,
    }
    three_g = next(r for r in resources if r.name == "nvidia.com/mig-3g.40gb").devices[0]
    # GPU 0, GPU instance 1, compute instance 0: the driver's mig-minors 12 and 13
    assert three_g.paths == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    )
    assert three_g.index == "0:0" and three_g.mig


def test_a_mig_device_without_its_capability_files_is_an_error() -> None:
    with pytest.raises(ResourceError, match="missing MIG capability path"):
        build_resources(gpus("a100-80gb-mig-x8"), Config(mig_strategy="mixed"), {})


def test_single_needs_one_mig_type_on_every_gpu() -> None:
    with pytest.raises(ResourceError, match="more than one MIG device type"):
        build_resources(
            gpus("a100-80gb-mig-x8"), Config(mig_strategy="single"), caps("a100-80gb-mig-x8")
        )
    uniform = [
        g if g.index >= 4 else GPUInfo(**{**g.__dict__, "mig_enabled": False, "migs": ()})
        for g in gpus("a100-80gb-mig-x8")
    ]
    with pytest.raises(ResourceError, match="same migEnabled value"):
        build_resources(uniform, Config(mig_strategy="single"), caps("a100-80gb-mig-x8"))
    only_7x1g = [g for g in uniform if g.index >= 4]
    resources = build_resources(only_7x1g, Config(mig_strategy="single"), caps("a100-80gb-mig-x8"))
    assert counts(resources) == {GPU_RESOURCE: 28}
    # no MIG-enabled GPU at all: whole GPUs, as upstream
    assert counts(build_resources(gpus("t4-x4"), Config(mig_strategy="single"))) == {
        GPU_RESOURCE: 4
    }


def test_time_slicing_replicates_each_device_under_its_annotated_id() -> None:
    (res,) = build_resources(gpus("t4-x4"), Config(time_slicing=time_slicing(3)))
    assert [d.id for d in res.devices[:3]] == [
        f"{profiles.gpu_uuid(NODE, 0)}::{n}" for n in range(3)
    ]
    assert len(res.devices) == 12 and {d.uuid for d in res.devices[:3]} == {
        profiles.gpu_uuid(NODE, 0)
    }


def test_rename_by_default_serves_a_shared_resource() -> None:
    config = parse(
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: 2}]}}"
    )
    (res,) = build_resources(gpus("t4-x1"), config)
    assert res.name == "nvidia.com/gpu.shared" and res.socket_name == "nvidia-gpu.shared.sock"


def test_time_slicing_a_mig_resource_leaves_the_others_alone() -> None:
    config = parse(
        "flags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: mig-3g.40gb, replicas: 2}]}}"
    )
    resources = build_resources(gpus("a100-80gb-mig-x8"), config, caps("a100-80gb-mig-x8"))
    assert counts(resources)["nvidia.com/mig-3g.40gb"] == 8
    assert counts(resources)["nvidia.com/mig-1g.10gb"] == 36


@pytest.mark.parametrize(
    ("slices", "mib", "total", "name"),
    [(1, 9728, 81920, "1g.10gb"), (7, 80384, 81920, "7g.80gb"), (1, 4864, 40960, "1g.5gb")],
)
def test_mig_profile_names_as_go_nvlib(slices: int, mib: int, total: int, name: str) -> None:
    assert mig_profile_name(slices, mib, total) == name


def test_mig_minors_file_parsing() -> None:
    text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nnonsense\n"
    assert parse_mig_minors(text) == {
        "/proc/driver/nvidia/capabilities/mig/config": "/dev/nvidia-caps/nvidia-cap1",
        "/proc/driver/nvidia/capabilities/mig/monitor": "/dev/nvidia-caps/nvidia-cap2",
        "/proc/driver/nvidia/capabilities/gpu0/mig/gi1/access": "/dev/nvidia-caps/nvidia-cap12",
        "/proc/driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access": "/dev/nvidia-caps/nvidia-cap13",
    }


def test_migs_carry_their_attributes() -> None:
    mig = gpus("a100-80gb-mig-x8")[0].migs[0]
    assert isinstance(mig, MigInfo) and mig.attributes["slices.gi"] == 3
